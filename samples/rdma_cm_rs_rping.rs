// SPDX-License-Identifier: GPL-2.0

//! An `rping` server on the safe RDMA CM abstractions: registered memory and
//! RDMA READ/WRITE in safe Rust only.
//!
//! It speaks the protocol of rdma-core's `rping` (and the kernel's old
//! krping), so an unmodified `rping -c -a ADDR -p 7174 -V` runs against it.
//! Per ping the client SENDs a 16-byte advertisement of its source buffer
//! (big-endian address, rkey, length); the server RDMA READs that buffer
//! into its own registered region and SENDs a go-ahead; the client SENDs an
//! advertisement of its sink buffer; the server RDMA WRITEs the string it
//! read (up to and including its NUL) there and SENDs another go-ahead.
//! With `-V` the client checks that both buffers match.
//!
//! `insmod rdma_cm_rs_rping.ko port=7174 size=65536`: `size` is the largest
//! ping accepted (rping's own limit is 64 KiB).
//!
//! Like every ULP it keeps one PD per device, not one per connection: an
//! IB client ([`rdma::client`]) makes it when a device appears and lets go
//! of it when the device goes, whether or not a session is open on it.

#![deny(unsafe_code)]

// The abstraction layer: compiled in (out of tree), or the kernel's own
// (`kernel::rdma`, in a kernel with RUST_INFINIBAND_ABSTRACTIONS).  rustfmt
// follows a `#[path]` even where the cfg drops the module (in tree, where
// there is no such file): it skips this one, and checks the layer through
// rust/rdma_cm_rs.rs instead.  (With the tool attribute rustc takes the
// layer's `#[macro_export]` macros for macro-expanded ones, which
// `crate::rdma_client_slot!` may not name: `rdma::client::` names it.)
#[cfg(not(CONFIG_RUST_INFINIBAND_ABSTRACTIONS))]
#[path = "../rust/rdma/mod.rs"]
#[allow(dead_code, unsafe_code)]
#[rustfmt::skip]
pub mod rdma;
#[cfg(CONFIG_RUST_INFINIBAND_ABSTRACTIONS)]
pub use kernel::rdma;

use kernel::{
    new_mutex,
    prelude::*,
    str::BStr,
    sync::{aref::ARef, Arc, Mutex, SetOnce},
};
use rdma::{
    addr::AF_INET, Client, ClientRegistration, CmId, CompletionHandler, ConnectRequest, Cq, Device,
    Event, EventType, Handler, LockedId, ModuleOwner, Mr, MrAccess, NetNs, Owner, Pd, PortSpace,
    PostError, Qp, QpCaps, QpType, RecvBuffer, RemoteRegion, RwOp, SendBuffer, SocketAddr,
    WorkDone, WorkOp,
};

module! {
    type: RpingModule,
    name: "rdma_cm_rs_rping",
    authors: ["rdma-cm-rs developers"],
    description: "rping server on the safe Rust RDMA CM abstractions",
    license: "GPL",
    params: {
        port: u16 {
            default: 7174,
            description: "Port to listen on (RDMA_PS_TCP); rping's default is 7174",
        },
        size: u32 {
            default: 65536,
            description: "Largest ping accepted, in bytes (1..=1048576)",
        },
    },
}

/// rping's advertisement: `{ __be64 buf; __be32 rkey; __be32 size; }`.
const ADVERT_LEN: usize = 16;
/// Receives kept posted per connection.
const RECV_DEPTH: usize = 4;

fn parse_advert(data: &[u8]) -> Option<RemoteRegion> {
    let data: &[u8; ADVERT_LEN] = data.try_into().ok()?;
    let mut addr = [0u8; 8];
    addr.copy_from_slice(&data[..8]);
    let mut rkey = [0u8; 4];
    rkey.copy_from_slice(&data[8..12]);
    let mut len = [0u8; 4];
    len.copy_from_slice(&data[12..]);
    Some(RemoteRegion {
        addr: u64::from_be_bytes(addr),
        rkey: u32::from_be_bytes(rkey),
        len: u32::from_be_bytes(len),
    })
}

/// Where a session is in rping's cycle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Step {
    /// Waiting for the source advertisement.
    AwaitSource,
    /// RDMA READ of the client's source buffer in flight.
    Reading,
    /// Waiting for the sink advertisement.
    AwaitSink,
    /// RDMA WRITE into the client's sink in flight.
    Writing,
    /// Something failed; the session waits for its disconnect.
    Failed,
}

struct SessionState {
    step: Step,
    /// The connection is established: posts may go to the send queue.
    established: bool,
    /// An advertisement that arrived before ESTABLISHED was handled.
    early: Option<RemoteRegion>,
    /// Bytes of the ping being handled (what was read).
    ping_len: u32,
    /// The go-ahead buffer while not in flight.
    go_ahead: Option<SendBuffer>,
    pings: u32,
}

/// One client's session: its QP, its region and rping's state machine.
#[pin_data]
struct Session {
    /// The QP, until the connection ends: clearing it breaks the
    /// QP -> CQ -> handler -> QP reference cycle.
    #[pin]
    qp: Mutex<Option<Arc<Qp<SessionRef>>>>,
    #[pin]
    state: Mutex<SessionState>,
    /// The region the pings are read into and written from.  The client
    /// never accesses it, so local access is all it needs on IB/RoCE.
    region: Arc<Mr>,
}

impl Session {
    fn qp(&self) -> Option<Arc<Qp<SessionRef>>> {
        self.qp.lock().clone()
    }

    fn fail(&self, st: &mut SessionState, why: &str, e: Error) {
        if st.step != Step::Failed {
            pr_err!(
                "session failed after {} pings: {}: {:?}\n",
                st.pings,
                why,
                e
            );
            st.step = Step::Failed;
        }
    }

    /// Acts on an advertisement; the state lock is held.
    fn advert(&self, st: &mut SessionState, remote: RemoteRegion) {
        let Some(qp) = self.qp() else { return };
        match st.step {
            Step::AwaitSource => {
                if remote.len == 0 || remote.len as usize > self.region.len() {
                    return self.fail(st, "ping size out of range", EMSGSIZE);
                }
                match qp.rdma(RwOp::Read, &self.region, 0, remote, 0) {
                    Ok(()) => {
                        st.step = Step::Reading;
                        st.ping_len = remote.len;
                    }
                    Err(e) => self.fail(st, "RDMA READ", e),
                }
            }
            Step::AwaitSink => {
                // rping writes back the string it read, NUL included.
                let mut ping = KVec::new();
                if let Err(e) = ping.resize(st.ping_len as usize, 0, GFP_KERNEL) {
                    return self.fail(st, "buffer", e.into());
                }
                if let Err(e) = self.region.read(0, &mut ping) {
                    return self.fail(st, "region", e);
                }
                let len = ping
                    .iter()
                    .position(|&b| b == 0)
                    .map_or(st.ping_len, |nul| nul as u32 + 1);
                let sink = match remote.slice(0, len) {
                    Ok(sink) => sink,
                    Err(e) => return self.fail(st, "sink too small", e),
                };
                match qp.rdma(RwOp::Write, &self.region, 0, sink, 0) {
                    Ok(()) => st.step = Step::Writing,
                    Err(e) => self.fail(st, "RDMA WRITE", e),
                }
            }
            _ => self.fail(st, "advertisement out of turn", EPROTO),
        }
    }

    /// SENDs the go-ahead (its contents do not matter, its size does).
    fn go_ahead(&self, st: &mut SessionState) {
        let (Some(qp), Some(buf)) = (self.qp(), st.go_ahead.take()) else {
            return self.fail(st, "go-ahead still in flight", EBUSY);
        };
        if let Err(PostError {
            error: e,
            value: buf,
        }) = qp.post_send(buf)
        {
            st.go_ahead = Some(buf);
            self.fail(st, "SEND", e);
        }
    }

    /// ESTABLISHED: register the region (FRWR, ordered before every RDMA
    /// request on the send queue) and handle an early advertisement.
    fn established(&self) {
        let mut st = self.state.lock();
        let Some(qp) = self.qp() else { return };
        if let Err(e) = qp.register(&self.region, MrAccess::LOCAL, 0) {
            return self.fail(&mut st, "registration", e);
        }
        st.established = true;
        if let Some(remote) = st.early.take() {
            self.advert(&mut st, remote);
        }
    }
}

/// The completion handler: a reference to the connection's [`Session`].
struct SessionRef(Arc<Session>);

impl CompletionHandler for SessionRef {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        if result.is_err() {
            // Flushed at teardown: the buffer is freed.
            return;
        }
        let session = &self.0;
        {
            let mut st = session.state.lock();
            match parse_advert(buf.data()) {
                None => session.fail(&mut st, "bogus advertisement", EPROTO),
                Some(remote) if !st.established => st.early = Some(remote),
                Some(remote) => session.advert(&mut st, remote),
            }
        }
        if let Some(qp) = session.qp() {
            // Recycle the receive; on a dead QP it is flushed and freed.
            let _ = qp.post_recv(buf);
        }
    }

    fn send_done(&self, buf: SendBuffer, result: Result) {
        let mut st = self.0.state.lock();
        st.go_ahead = Some(buf);
        match result {
            // A flush: the client disconnected once it had what it needed
            // (the last go-ahead arrives before its acknowledgement does).
            Err(e) if e == ECANCELED => {}
            Err(e) => self.0.fail(&mut st, "go-ahead", e),
            Ok(()) => {}
        }
    }

    fn work_done(&self, done: WorkDone, result: Result) {
        let session = &self.0;
        let mut st = session.state.lock();
        if let Err(e) = result {
            // Flushes at teardown are not news.
            if e != ECANCELED {
                session.fail(&mut st, "work request", e);
            }
            return;
        }
        match (done.op, st.step) {
            (WorkOp::Register, _) => {}
            (WorkOp::RdmaRead, Step::Reading) => {
                st.step = Step::AwaitSink;
                session.go_ahead(&mut st);
            }
            (WorkOp::RdmaWrite, Step::Writing) => {
                st.step = Step::AwaitSource;
                st.pings += 1;
                session.go_ahead(&mut st);
            }
            _ => session.fail(&mut st, "completion out of turn", EPROTO),
        }
    }
}

/// State shared by the listener and every connection.
#[pin_data]
struct Service {
    /// Open connections; a connection removes itself when it ends.
    #[pin]
    conns: Mutex<KVec<Arc<CmId<Rping>>>>,
    region_len: usize,
    /// The PD of each device.
    #[pin]
    devices: ClientRegistration<RpingDevices>,
}

/// What the sample keeps on each device: the PD of every session on it.
struct PerDevice {
    pd: Arc<Pd>,
}

/// The sample's IB client: a PD for each device, from its registration to
/// its removal.
struct RpingDevices {
    /// What the PDs are made for.
    owner: Owner,
}

rdma::client::rdma_client_slot!(RpingDevices);

impl Client for RpingDevices {
    type DeviceData = PerDevice;
    const NAME: &'static CStr = c"rdma_cm_rs_rping";
    fn add(&self, dev: &ARef<Device>) -> Result<PerDevice> {
        let pd = Pd::alloc(&self.owner, dev)?;
        pr_info!(
            "{}: added, one PD for its sessions\n",
            BStr::from_bytes(dev.name().as_bytes())
        );
        Ok(PerDevice { pd })
    }

    fn remove(&self, dev: &Device, data: Arc<PerDevice>) {
        // Sessions on the device hold the PD until the CM's DEVICE_REMOVAL
        // ends them, which comes after this (the CM registered first, and
        // the IB core removes clients last to first).
        pr_info!("{}: removed\n", BStr::from_bytes(dev.name().as_bytes()));
        drop(data);
    }
}

/// The handler of the listener and of every connection.
struct Rping {
    service: Arc<Service>,
    /// Connections only: the session, set once accepted.
    session: SetOnce<Arc<Session>>,
}

impl Rping {
    fn new(service: Arc<Service>) -> Self {
        Self {
            service,
            session: SetOnce::new(),
        }
    }

    /// Builds the session on a locked, adopted id and accepts it.
    fn accept(id: &LockedId<'_>, service: &Service) -> Result<Arc<Session>> {
        let dev = id.device()?;
        // `None` for a device that is just registering (the CM's client
        // comes before ours) or going: the request is rejected.
        let pd = service.devices.device_data(&dev).ok_or(ENODEV)?.pd.clone();
        let region = Mr::new(&pd, service.region_len)?;
        let mut go_ahead = SendBuffer::new(&pd, ADVERT_LEN)?;
        go_ahead.fill(&[0; ADVERT_LEN])?;
        let session = Arc::pin_init(
            pin_init!(Session {
                qp <- new_mutex!(None),
                state <- new_mutex!(SessionState {
                    step: Step::AwaitSource,
                    established: false,
                    early: None,
                    ping_len: 0,
                    go_ahead: Some(go_ahead),
                    pings: 0,
                }),
                region,
            }),
            GFP_KERNEL,
        )?;
        let caps = QpCaps {
            max_send_wr: 8,
            max_recv_wr: RECV_DEPTH as u32,
            max_inline_data: 0,
            ..QpCaps::default()
        };
        let cq = Cq::alloc(
            pd.owner(),
            &dev,
            caps.cq_entries()?,
            SessionRef(session.clone()),
        )?;
        let qp = id.create_qp(&pd, &cq, caps)?;
        *session.qp.lock() = Some(qp.clone());
        let accepted = (|| -> Result {
            for _ in 0..RECV_DEPTH {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(Error::from)?;
            }
            // The request's depths (rping asks for 1 and 1), clamped to the
            // device: `rdma_accept(3)` with no parameters.
            id.accept(None)
        })();
        if let Err(e) = accepted {
            session.qp.lock().take();
            return Err(e);
        }
        Ok(session)
    }
}

/// Ends a connection: breaks its reference cycle, then drops the id
/// (destroyed now, or from the workqueue when inside its own callback).
fn end(conn: Arc<CmId<Rping>>) {
    if let Some(session) = conn.handler().session.as_ref() {
        session.qp.lock().take();
    }
    drop(conn);
}

impl Handler for Rping {
    fn event(&self, _id: &LockedId<'_>, event: &Event<'_>) {
        match event.kind() {
            EventType::Established => {
                if let Some(session) = self.session.as_ref() {
                    session.established();
                }
            }
            EventType::Disconnected
            | EventType::DeviceRemoval
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected => {
                let conn = {
                    let mut conns = self.service.conns.lock();
                    let at = conns.iter().position(|c| core::ptr::eq(c.handler(), self));
                    match at {
                        Some(i) => conns.remove(i).ok(),
                        None => None,
                    }
                };
                if let Some(conn) = conn {
                    if let Some(session) = conn.handler().session.as_ref() {
                        let st = session.state.lock();
                        let outcome = if st.step == Step::Failed {
                            ", failed"
                        } else {
                            ""
                        };
                        pr_info!(
                            "session ended ({}) after {} pings{}\n",
                            event.kind().name().to_str().unwrap_or("?"),
                            st.pings,
                            outcome
                        );
                    }
                    end(conn);
                }
            }
            _ => {}
        }
    }

    fn connect_request(&self, request: ConnectRequest<'_, Self>, _event: &Event<'_>) {
        // Everything that can fail before the session exists comes first:
        // once it does, only `end` may drop the id (it breaks the session's
        // reference cycle).
        let Ok(id) = request.adopt(Rping::new(self.service.clone())) else {
            return;
        };
        let Ok(id) = Arc::new(id, GFP_KERNEL) else {
            return;
        };
        if let Err(e) = self.service.conns.lock().reserve(1, GFP_KERNEL) {
            pr_err!("cannot track connection: {:?}\n", e);
            return;
        }
        // The CM holds the new id's handler mutex: `with_lock` runs inside it.
        match id.with_lock(|l| Rping::accept(l, &self.service)) {
            Ok(session) => {
                let _ = id.handler().session.populate(session);
                // Room was reserved above; a connection ending meanwhile
                // only makes more.
                if let Err(e) = self.service.conns.lock().push(id.clone(), GFP_KERNEL) {
                    pr_err!("cannot track connection: {:?}\n", e);
                    end(id);
                }
            }
            Err(e) => pr_err!("accept failed: {:?}\n", e),
        }
    }
}

struct RpingModule {
    service: Arc<Service>,
    listener: Option<CmId<Rping>>,
    /// Last: drops after every id, running their deferred destructions and
    /// waiting for every object before the module's code goes.
    _owner: ModuleOwner,
}

impl kernel::Module for RpingModule {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let region_len = module_parameters::size.value() as usize;
        if region_len == 0 || region_len > rdma::mr::MAX_MR_LEN {
            pr_err!("size must be 1..={}\n", rdma::mr::MAX_MR_LEN);
            return Err(EINVAL);
        }
        let owner = ModuleOwner::new::<Self>()?;
        // The client before the listener: a device's PD is there before a
        // request on it can come.
        let devices = ClientRegistration::new(
            &owner,
            RpingDevices {
                owner: owner.owner().clone(),
            },
        );
        let service = Arc::pin_init(
            try_pin_init!(Service {
                conns <- new_mutex!(KVec::new()),
                region_len,
                devices <- devices,
            }),
            GFP_KERNEL,
        )?;
        let port = module_parameters::port.value();
        let listener = CmId::new(
            &owner,
            Rping::new(service.clone()),
            &NetNs::init(),
            PortSpace::Tcp,
            QpType::Rc,
        )?;
        let addr = SocketAddr::any(AF_INET, port)?;
        listener.with_lock(|l| l.bind(&addr))?;
        listener.listen(64)?;
        pr_info!(
            "rping server listening on {}, pings up to {} bytes\n",
            addr,
            region_len
        );
        Ok(Self {
            service,
            listener: Some(listener),
            _owner: owner,
        })
    }
}

impl Drop for RpingModule {
    fn drop(&mut self) {
        // No new connections, then end the open ones.
        drop(self.listener.take());
        let conns = core::mem::take(&mut *self.service.conns.lock());
        for conn in conns {
            end(conn);
        }
        // `_owner` drops next and waits for deferred destructions.
    }
}
