// SPDX-License-Identifier: GPL-2.0

//! A storage-target-style server on the safe RDMA abstractions: a RAM-backed
//! store that clients write and read with RDMA, in safe Rust only.
//!
//! `insmod rdma_cm_rs_store.ko port=7176 size=4194304`.
//!
//! The protocol (big-endian).  A client SENDs a 32-byte request:
//!
//! ```text
//! u8 op        1 PUT (the client's buffer into the store), 2 GET (back)
//! u8 flags     bit 0: answer with SEND_WITH_INV of `rkey`
//! u16 zero
//! u32 len      1..=MAX_IO bytes
//! u64 offset   in the store
//! u64 addr     the client's buffer, under
//! u32 rkey     its remote key
//! u32 id       echoed in the answer
//! ```
//!
//! and gets an 8-byte answer SENT back: `u32 id, i32 status` (0, or a
//! negative errno).  For a PUT the server RDMA READs the client's buffer,
//! copies it into the store, then answers; for a GET it copies the store's
//! bytes out and RDMA WRITEs them to the client's buffer with the answer
//! chained behind in the same post, so the client sees the answer only
//! after the bytes.
//!
//! What a real target is made of, each from the layer:
//! * one PD and one shared receive queue per device, from an IB client
//!   ([`rdma::client`]): requests of every connection on a device land in
//!   its SRQ, and [`RecvBuffer::qp_num`] says which connection;
//! * a pool of CQs per device ([`CqPool`]): connections take the device's
//!   completion vectors in turn, each on the CQ of its vector with the
//!   most room (a CQ is made when none has room), so that completions are
//!   spread over the device's vectors (and the CPUs they interrupt);
//! * the R/W API ([`Qp::rdma_rw`], [`Qp::rdma_rw_then_send`]) moving
//!   [`SgBuffer`]s of pages directly from and to the client's buffers,
//!   registering READ sinks itself on iWARP;
//! * answers posted unsignaled (selective signaling): their buffers come
//!   back with the next signaled completion of the connection;
//! * SEND_WITH_INV where the client asked for it.
//!
//! With `busy_poll=1` the pool's CQs are busy-polled
//! ([`CqPool::busy_polled`]): each has a loop of its own that runs the
//! handler the moment a completion is there, instead of a workqueue's
//! worker woken by the device.

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

use core::sync::atomic::{AtomicU64, Ordering};
use kernel::{
    new_mutex,
    prelude::*,
    str::BStr,
    sync::{aref::ARef, Arc, Mutex},
};
use rdma::{
    addr::AF_INET, BusyPoller, Client, ClientRegistration, CmId, CompletionHandler, ConnectRequest,
    CqPool, Device, Event, EventType, Handler, LockedId, ModuleOwner, NetNs, Owner, Pd,
    PollContext, PortSpace, PostError, Qp, QpCaps, QpType, RecvBuffer, RemoteRegion, RwDone, RwOp,
    SendBuffer, SgBuffer, SocketAddr, Srq,
};

module! {
    type: StoreModule,
    name: "rdma_cm_rs_store",
    authors: ["rdma-cm-rs developers"],
    description: "RAM-backed RDMA storage server on the safe Rust RDMA abstractions",
    license: "GPL",
    params: {
        port: u16 {
            default: 7176,
            description: "Port to listen on (RDMA_PS_TCP)",
        },
        size: u32 {
            default: 4194304,
            description: "Bytes of the store (1..=67108864)",
        },
        busy_poll: bool {
            default: false,
            description: "Busy-poll the CQs (a loop each) instead of a workqueue",
        },
    },
}

/// A request's size.
const REQUEST_LEN: usize = 32;
/// An answer's size.
const ANSWER_LEN: usize = 8;
/// The largest PUT or GET.
pub const MAX_IO: u32 = 64 * 1024;
/// Requests posted to each device's SRQ.
const SRQ_DEPTH: u32 = 64;
/// Requests in flight on one connection (its R/W transfers and answers).
const QUEUE_DEPTH: u32 = 16;
/// Connections a device's CQs are sized for, shared over up to
/// [`MAX_CQS`] vectors: each CQ of the pool has room for its share (the
/// pool makes another CQ when one is full; a device of more vectors gets
/// more CQs, each of this size).
const MAX_CONNS: u32 = 32;
/// The vectors [`MAX_CONNS`] is shared over when sizing a CQ.
const MAX_CQS: u32 = 4;

const OP_PUT: u8 = 1;
const OP_GET: u8 = 2;
const FLAG_INVALIDATE: u8 = 1;

/// A parsed request.
#[derive(Clone, Copy)]
struct Request {
    op: u8,
    invalidate: bool,
    len: u32,
    offset: u64,
    remote: RemoteRegion,
    id: u32,
}

fn be32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

impl Request {
    /// The request in `data`; `Err` with the id to answer (0 if unreadable)
    /// for a malformed one.
    fn parse(data: &[u8]) -> core::result::Result<Self, u32> {
        if data.len() != REQUEST_LEN {
            return Err(0);
        }
        let id = be32(&data[28..]);
        let flags = data[1];
        let req = Self {
            op: data[0],
            invalidate: flags & FLAG_INVALIDATE != 0,
            len: be32(&data[4..]),
            offset: be64(&data[8..]),
            remote: RemoteRegion {
                addr: be64(&data[16..]),
                rkey: be32(&data[24..]),
                len: be32(&data[4..]),
            },
            id,
        };
        let known = matches!(req.op, OP_PUT | OP_GET) && flags & !FLAG_INVALIDATE == 0;
        if !known || data[2] != 0 || data[3] != 0 || req.len == 0 || req.len > MAX_IO {
            return Err(id);
        }
        Ok(req)
    }
}

/// The RAM the clients write and read.
#[pin_data]
struct Store {
    #[pin]
    bytes: Mutex<SgBuffer>,
    size: usize,
}

impl Store {
    /// `EINVAL` unless `len` bytes at `offset` lie in the store.
    fn check(&self, offset: u64, len: u32) -> Result<usize> {
        let offset = usize::try_from(offset).map_err(|_| EINVAL)?;
        match offset.checked_add(len as usize) {
            Some(end) if end <= self.size => Ok(offset),
            _ => Err(EINVAL),
        }
    }

    /// Copies between the store at `offset` and `buf` (into the store with
    /// `put`), a page at a time.
    fn copy(&self, offset: usize, buf: &mut SgBuffer, put: bool) -> Result {
        let mut chunk = KVec::new();
        chunk.resize(kernel::page::PAGE_SIZE.min(buf.len()), 0u8, GFP_KERNEL)?;
        let mut bytes = self.bytes.lock();
        let mut done = 0;
        while done < buf.len() {
            let n = chunk.len().min(buf.len() - done);
            if put {
                buf.read(done, &mut chunk[..n])?;
                bytes.write(offset + done, &chunk[..n])?;
            } else {
                bytes.read(offset + done, &mut chunk[..n])?;
                buf.write(done, &chunk[..n])?;
            }
            done += n;
        }
        Ok(())
    }
}

/// A PUT whose READ is in flight, by its transfer's tag.
struct Pending {
    qp_num: u32,
    req: Request,
}

/// What a device's CQ handler reaches: the device's SRQ, its connections'
/// QPs by number, and the store.
#[pin_data]
struct DeviceShared {
    store: Arc<Store>,
    srq: Arc<Srq<StoreHandler>>,
    pd: Arc<Pd>,
    #[pin]
    conns: Mutex<Conns>,
    #[pin]
    pending: Mutex<KVec<(u64, Pending)>>,
    next_tag: AtomicU64,
}

/// The QPs of a device's open connections, by QP number.  A connection's
/// entry goes when it ends, which breaks the QP -> CQ -> handler -> QP
/// cycle; all go when the device is removed, after which none is added.
struct Conns {
    qps: KVec<(u32, Arc<Qp<StoreHandler>>)>,
    removed: bool,
}

impl DeviceShared {
    fn qp(&self, qp_num: u32) -> Option<Arc<Qp<StoreHandler>>> {
        let conns = self.conns.lock();
        conns
            .qps
            .iter()
            .find(|(n, _)| *n == qp_num)
            .map(|(_, qp)| qp.clone())
    }

    /// An answer to `id` with `status`, invalidating `rkey` if asked.
    fn answer(&self, id: u32, status: Result, invalidate: Option<u32>) -> Result<SendBuffer> {
        let mut buf = SendBuffer::new(&self.pd, ANSWER_LEN)?;
        let status = match status {
            Ok(()) => 0i32,
            Err(e) => e.to_errno(),
        };
        let mut bytes = [0u8; ANSWER_LEN];
        bytes[..4].copy_from_slice(&id.to_be_bytes());
        bytes[4..].copy_from_slice(&status.to_be_bytes());
        buf.fill(&bytes)?;
        buf.set_invalidate(invalidate);
        // Selective signaling: the buffer comes back with the connection's
        // next signaled completion.
        buf.set_unsignaled(true);
        Ok(buf)
    }

    /// Answers on `qp`; a failure ends nothing (the client times out).
    fn send_answer(&self, qp: &Qp<StoreHandler>, id: u32, status: Result, inv: Option<u32>) {
        match self.answer(id, status, inv) {
            Ok(buf) => {
                if let Err(PostError { error: e, .. }) = qp.post_send(buf) {
                    pr_warn!("answer to request {} not sent: {:?}\n", id, e);
                }
            }
            Err(e) => pr_warn!("answer to request {} not made: {:?}\n", id, e),
        }
    }

    /// Serves one request that arrived on `qp`.
    fn serve(&self, qp: &Qp<StoreHandler>, req: Request) {
        let inv = req.invalidate.then_some(req.remote.rkey);
        let served = (|| -> Result {
            let offset = self.store.check(req.offset, req.len)?;
            let mut buf = SgBuffer::new(req.len as usize)?;
            let tag = self.next_tag.fetch_add(1, Ordering::Relaxed);
            match req.op {
                OP_PUT => {
                    self.pending.lock().push(
                        (
                            tag,
                            Pending {
                                qp_num: qp.qp_num(),
                                req,
                            },
                        ),
                        GFP_KERNEL,
                    )?;
                    if let Err(PostError { error: e, .. }) =
                        qp.rdma_rw(RwOp::Read, buf, req.remote, tag)
                    {
                        self.take_pending(tag);
                        return Err(e);
                    }
                    Ok(())
                }
                _ => {
                    self.store.copy(offset, &mut buf, false)?;
                    let answer = self.answer(req.id, Ok(()), inv)?;
                    qp.rdma_rw_then_send(RwOp::Write, buf, req.remote, tag, answer)
                        .map_err(Error::from)
                }
            }
        })();
        if let Err(e) = served {
            self.send_answer(qp, req.id, Err(e), None);
        }
    }

    fn take_pending(&self, tag: u64) -> Option<Pending> {
        let mut pending = self.pending.lock();
        let i = pending.iter().position(|(t, _)| *t == tag)?;
        pending.remove(i).ok().map(|(_, p)| p)
    }
}

/// The completion handler of a device's CQs.
#[derive(Clone)]
struct StoreHandler(Arc<DeviceShared>);

impl CompletionHandler for StoreHandler {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        let shared = &self.0;
        let parsed = result.ok().map(|_| Request::parse(buf.data()));
        let qp = buf.qp_num().and_then(|n| shared.qp(n));
        // The buffer goes back to the SRQ before the request is served.
        let buf = match shared.srq.post_recv(buf) {
            Ok(()) => None,
            Err(PostError {
                error: e,
                value: buf,
            }) => {
                pr_warn!("SRQ repost failed: {:?}\n", e);
                Some(buf)
            }
        };
        drop(buf);
        let (Some(qp), Some(parsed)) = (qp, parsed) else {
            return;
        };
        match parsed {
            Ok(req) => shared.serve(&qp, req),
            Err(id) => shared.send_answer(&qp, id, Err(EINVAL), None),
        }
    }

    fn send_done(&self, _buf: SendBuffer, _result: Result) {}

    fn rw_done(&self, mut done: RwDone, result: Result) {
        let shared = &self.0;
        // A GET's answer went with its WRITE; only PUTs are pending.
        let Some(pending) = shared.take_pending(done.tag) else {
            return;
        };
        let Some(qp) = shared.qp(pending.qp_num) else {
            return;
        };
        let req = pending.req;
        let stored = result.and_then(|()| {
            let offset = shared.store.check(req.offset, req.len)?;
            shared.store.copy(offset, &mut done.buf, true)
        });
        let inv = req.invalidate.then_some(req.remote.rkey);
        shared.send_answer(&qp, req.id, stored, if stored.is_ok() { inv } else { None });
    }
}

/// What the sample keeps on each device.
struct StoreDevice {
    cqs: Arc<CqPool<StoreHandler>>,
    shared: Arc<DeviceShared>,
}

/// The sample's IB client: a PD, an SRQ and a pool of CQs on each device.
struct StoreDevices {
    store: Arc<Store>,
    /// With `busy_poll`: the loops of every device's CQs.
    poller: Option<Arc<BusyPoller>>,
    /// What the PDs and CQ pools are made for.
    owner: Owner,
}

rdma::client::rdma_client_slot!(StoreDevices);

impl Client for StoreDevices {
    type DeviceData = StoreDevice;
    const NAME: &'static CStr = c"rdma_cm_rs_store";
    fn add(&self, dev: &ARef<Device>) -> Result<StoreDevice> {
        let pd = Pd::alloc(&self.owner, dev)?;
        let srq = Srq::new(&pd, SRQ_DEPTH)?;
        let (shared_srq, shared_pd) = (srq.clone(), pd.clone());
        let shared = Arc::pin_init(
            pin_init!(DeviceShared {
                store: self.store.clone(),
                srq: shared_srq,
                pd: shared_pd,
                conns <- new_mutex!(Conns {
                    qps: KVec::new(),
                    removed: false,
                }),
                pending <- new_mutex!(KVec::new()),
                next_tag: AtomicU64::new(0),
            }),
            GFP_KERNEL,
        )?;
        // Each CQ has room for the SRQ (reserved once on every CQ its QPs
        // receive on) and for its share of the device's connections.
        let vectors = dev.num_comp_vectors().clamp(1, MAX_CQS);
        let per_conn = conn_caps(dev).send_cq_entries()?;
        let entries = SRQ_DEPTH + MAX_CONNS.div_ceil(vectors) * per_conn;
        let handler = StoreHandler(shared.clone());
        let cqs = match &self.poller {
            Some(poller) => CqPool::busy_polled(&self.owner, dev, entries, poller, handler)?,
            None => CqPool::new(&self.owner, dev, entries, PollContext::Workqueue, handler)?,
        };
        for _ in 0..SRQ_DEPTH {
            srq.post_recv(RecvBuffer::new(&pd, REQUEST_LEN)?)
                .map_err(Error::from)?;
        }
        pr_info!(
            "{}: added: one PD, an SRQ of {} requests and a pool of {} CQs of {} entries over {} completion vector(s)\n",
            BStr::from_bytes(dev.name().as_bytes()),
            SRQ_DEPTH,
            if self.poller.is_some() {
                "busy-polled"
            } else {
                "workqueue"
            },
            entries,
            dev.num_comp_vectors()
        );
        Ok(StoreDevice { cqs, shared })
    }

    fn remove(&self, dev: &Device, data: Arc<StoreDevice>) {
        // The CM tells the connections of the removal only after this
        // (clients go in the reverse order of their registration), and
        // their handlers then find no device data: the table lets go of
        // the QPs here, and takes none after, or the cycle QP -> CQ ->
        // handler -> table -> QP would hold the device for good.  The ids
        // destroy the QPs when DEVICE_REMOVAL ends them.
        let conns = {
            let mut conns = data.shared.conns.lock();
            conns.removed = true;
            core::mem::take(&mut conns.qps)
        };
        pr_info!(
            "{}: removed, {} connection(s) open\n",
            BStr::from_bytes(dev.name().as_bytes()),
            conns.len()
        );
        drop((conns, data));
    }
}

/// A connection's QP sizes on `dev`.
fn conn_caps(dev: &Device) -> QpCaps {
    QpCaps {
        max_send_wr: QUEUE_DEPTH,
        max_recv_wr: 0,
        max_inline_data: 0,
        max_send_sge: dev.caps().max_send_sge.min(16),
        // Its receives come from the device's SRQ.
        max_recv_sge: 0,
        max_rdma_ctxs: QUEUE_DEPTH,
    }
}

/// State shared by the listener and every connection.
#[pin_data]
struct Service {
    /// Open connections; one removes itself when it ends.
    #[pin]
    ids: Mutex<KVec<Arc<CmId<StoreCm>>>>,
    #[pin]
    devices: ClientRegistration<StoreDevices>,
}

/// The CM handler of the listener and of every connection.
struct StoreCm {
    service: Arc<Service>,
}

impl StoreCm {
    /// Makes the connection's QP on its device's SRQ, records it and
    /// accepts.
    fn accept(id: &LockedId<'_>, service: &Service) -> Result {
        let dev = id.device()?;
        let device = service.devices.device_data(&dev).ok_or(ENODEV)?;
        let shared = &device.shared;
        let caps = conn_caps(&dev);
        // The next vector's CQ with room; the first QP on a CQ needs room
        // for the SRQ's receives too, which the pool finds by trying.
        let (index, vector, qp) =
            device
                .cqs
                .with_cq(caps.send_cq_entries()?, None, |index, cq| {
                    let qp = id.create_qp_on_srq(&shared.pd, cq, cq, &shared.srq, caps)?;
                    Ok((index, cq.comp_vector(), qp))
                })?;
        pr_info!(
            "{}: connection of QP {} on CQ {} of {} (vector {})\n",
            BStr::from_bytes(dev.name().as_bytes()),
            qp.qp_num(),
            index,
            device.cqs.len(),
            vector
        );
        {
            let mut conns = shared.conns.lock();
            // The device went meanwhile: the id's DEVICE_REMOVAL ends it.
            if conns.removed {
                return Err(ENODEV);
            }
            conns.qps.push((qp.qp_num(), qp.clone()), GFP_KERNEL)?;
        }
        // The request's read depths (the client asks for them), clamped
        // to the device.
        let accepted = id.accept(None);
        if accepted.is_err() {
            forget_qp(service, &dev, qp.qp_num());
        }
        accepted
    }
}

/// Drops the QP numbered `qp_num` of `dev` from its device's connections.
fn forget_qp(service: &Service, dev: &Device, qp_num: u32) {
    if let Some(device) = service.devices.device_data(dev) {
        let mut conns = device.shared.conns.lock();
        if let Some(i) = conns.qps.iter().position(|(n, _)| *n == qp_num) {
            let _ = conns.qps.remove(i);
        }
    }
}

/// Ends a connection: its QP leaves its device's table (breaking the
/// cycle), then the id goes (destroyed now, or deferred inside its own
/// callback).
fn end(service: &Service, id: Arc<CmId<StoreCm>>) {
    let _ = id.with_lock(|l| {
        if let (Ok(dev), Some(qp_num)) = (l.device(), l.qp_num()) {
            forget_qp(service, &dev, qp_num);
        }
        Ok(())
    });
    drop(id);
}

impl Handler for StoreCm {
    fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
        match event.kind() {
            EventType::Disconnected
            | EventType::DeviceRemoval
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected => {
                if let (Ok(dev), Some(qp_num)) = (id.device(), id.qp_num()) {
                    forget_qp(&self.service, &dev, qp_num);
                }
                let conn = {
                    let mut ids = self.service.ids.lock();
                    let at = ids.iter().position(|c| core::ptr::eq(c.handler(), self));
                    at.and_then(|i| ids.remove(i).ok())
                };
                drop(conn);
            }
            _ => {}
        }
    }

    fn connect_request(&self, request: ConnectRequest<'_, Self>, _event: &Event<'_>) {
        let handler = StoreCm {
            service: self.service.clone(),
        };
        let Ok(id) = request.adopt(handler) else {
            return;
        };
        let Ok(id) = Arc::new(id, GFP_KERNEL) else {
            return;
        };
        if self.service.ids.lock().reserve(1, GFP_KERNEL).is_err() {
            return;
        }
        match id.with_lock(|l| StoreCm::accept(l, &self.service)) {
            Ok(()) => {
                if self
                    .service
                    .ids
                    .lock()
                    .push(id.clone(), GFP_KERNEL)
                    .is_err()
                {
                    end(&self.service, id);
                }
            }
            Err(e) => pr_err!("accept failed: {:?}\n", e),
        }
    }
}

struct StoreModule {
    service: Arc<Service>,
    listener: Option<CmId<StoreCm>>,
    /// Last: drops after every id, running their deferred destructions and
    /// waiting for every object before the module's code goes.
    _owner: ModuleOwner,
}

impl kernel::Module for StoreModule {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let size = module_parameters::size.value() as usize;
        if size == 0 || size > 64 << 20 {
            pr_err!("size must be 1..=67108864\n");
            return Err(EINVAL);
        }
        let owner = ModuleOwner::new::<Self>()?;
        let bytes = SgBuffer::new(size)?;
        let poller = if module_parameters::busy_poll.value() {
            Some(Arc::new(BusyPoller::new(&owner)?, GFP_KERNEL)?)
        } else {
            None
        };
        let store = Arc::pin_init(
            pin_init!(Store {
                bytes <- new_mutex!(bytes),
                size,
            }),
            GFP_KERNEL,
        )?;
        let devices = ClientRegistration::new(
            &owner,
            StoreDevices {
                store,
                poller,
                owner: owner.owner().clone(),
            },
        );
        let service = Arc::pin_init(
            try_pin_init!(Service {
                ids <- new_mutex!(KVec::new()),
                devices <- devices,
            }),
            GFP_KERNEL,
        )?;
        let port = module_parameters::port.value();
        let listener = CmId::new(
            &owner,
            StoreCm {
                service: service.clone(),
            },
            &NetNs::init(),
            PortSpace::Tcp,
            QpType::Rc,
        )?;
        let addr = SocketAddr::any(AF_INET, port)?;
        listener.with_lock(|l| l.bind(&addr))?;
        listener.listen(64)?;
        pr_info!("store of {} bytes listening on {}\n", size, addr);
        Ok(Self {
            service,
            listener: Some(listener),
            _owner: owner,
        })
    }
}

impl Drop for StoreModule {
    fn drop(&mut self) {
        drop(self.listener.take());
        let ids = core::mem::take(&mut *self.service.ids.lock());
        for id in ids {
            end(&self.service, id);
        }
    }
}
