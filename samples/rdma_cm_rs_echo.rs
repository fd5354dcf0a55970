// SPDX-License-Identifier: GPL-2.0

//! An RC echo service on the safe RDMA CM abstractions: the example to read
//! first.
//!
//! `insmod rdma_cm_rs_echo.ko port=7500` listens on every address; each
//! connection is accepted inside the connection-request callback with the
//! private data `"rdma_cm_rs_echo"`, and every message received is sent
//! back.  Connections end when the peer disconnects; unloading the module
//! destroys whatever is left.
//!
//! With `busy_poll=1` each connection's CQ is polled by a loop of its own
//! (`PollContext::Direct` and a `BusyPoller`) instead of a workqueue's
//! worker woken by the device: an echo goes out without a wake-up, as
//! from a user-space server that busy-polls.
//!
//! The sample is safe Rust only: the `unsafe_code` lint is denied for the
//! whole crate except the abstraction layer it compiles in (`rust/rdma/`,
//! which holds all of the project's raw bindings), used through safe calls.

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
    sync::{Arc, Mutex, SetOnce},
};
use rdma::{
    addr::AF_INET, BusyPoller, CmId, CompletionHandler, ConnectRequest, Cq, Event, EventType,
    Handler, LockedId, ModuleOwner, NetNs, Pd, PollContext, PollLoop, PortSpace, PostError, Qp,
    QpCaps, QpType, RecvBuffer, SendBuffer, SocketAddr,
};

module! {
    type: EchoModule,
    name: "rdma_cm_rs_echo",
    authors: ["rdma-cm-rs developers"],
    description: "RC echo service on the safe Rust RDMA CM abstractions",
    license: "GPL",
    params: {
        port: u16 {
            default: 7500,
            description: "Port to listen on (RDMA_PS_TCP)",
        },
        busy_poll: bool {
            default: false,
            description: "Poll each connection's CQ in a loop instead of waking a worker",
        },
    },
}

/// Receives kept posted per connection, and sends in flight.
const DEPTH: usize = 8;
/// Largest message echoed.
const MESSAGE_SIZE: usize = 4096;
/// Private data of every accept.
const ACCEPT_DATA: &[u8] = b"rdma_cm_rs_echo";

/// State shared by the listener and every connection.
#[pin_data]
struct Service {
    /// Open connections; a connection removes itself when it ends.
    #[pin]
    conns: Mutex<KVec<Arc<CmId<Echo>>>>,
    /// With `busy_poll`: the connections' polling loops.
    poller: Option<BusyPoller>,
}

/// A connection's data path.
#[pin_data]
struct Link {
    /// The QP, until the connection ends: clearing it breaks the
    /// QP -> CQ -> handler -> QP reference cycle.
    #[pin]
    qp: Mutex<Option<Arc<Qp<LinkRef>>>>,
    /// Send buffers not in flight.
    #[pin]
    free_sends: Mutex<KVec<SendBuffer>>,
    /// With `busy_poll`: the loop polling the CQ, until the connection
    /// ends.
    #[pin]
    poll_loop: Mutex<Option<PollLoop>>,
}

/// The completion handler: a reference to the connection's [`Link`].
struct LinkRef(Arc<Link>);

impl CompletionHandler for LinkRef {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        if result.is_err() {
            // Flushed at teardown: the buffer is freed.
            return;
        }
        let Some(qp) = self.0.qp.lock().clone() else {
            return;
        };
        if let Some(mut send) = self.0.free_sends.lock().pop() {
            if send.fill(buf.data()).is_ok() {
                if let Err(PostError { value: send, .. }) = qp.post_send(send) {
                    let _ = self.0.free_sends.lock().push(send, GFP_KERNEL);
                }
            } else {
                let _ = self.0.free_sends.lock().push(send, GFP_KERNEL);
            }
        }
        // Recycle the receive; on a dead QP it is flushed and freed.
        let _ = qp.post_recv(buf);
    }

    fn send_done(&self, buf: SendBuffer, _result: Result) {
        let _ = self.0.free_sends.lock().push(buf, GFP_KERNEL);
    }
}

/// The handler of the listener and of every connection.
struct Echo {
    service: Arc<Service>,
    /// Connections only: the data path, set once accepted.
    link: SetOnce<Arc<Link>>,
}

impl Echo {
    fn new(service: Arc<Service>) -> Self {
        Self {
            service,
            link: SetOnce::new(),
        }
    }

    /// Builds the data path on a locked, adopted id and posts the receives.
    ///
    /// The link learns its QP last, after everything that can fail: until
    /// then there is no QP -> CQ -> link -> QP cycle to break on an error.
    fn build_link(id: &LockedId<'_>, service: &Service) -> Result<Arc<Link>> {
        let poller = service.poller.as_ref();
        let dev = id.device()?;
        let pd = Pd::alloc(id.owner(), &dev)?;
        let mut sends = KVec::with_capacity(DEPTH, GFP_KERNEL)?;
        for _ in 0..DEPTH {
            sends.push(SendBuffer::new(&pd, MESSAGE_SIZE)?, GFP_KERNEL)?;
        }
        let link = Arc::pin_init(
            pin_init!(Link {
                qp <- new_mutex!(None),
                free_sends <- new_mutex!(sends),
                poll_loop <- new_mutex!(None),
            }),
            GFP_KERNEL,
        )?;
        let caps = QpCaps {
            max_send_wr: DEPTH as u32,
            max_recv_wr: DEPTH as u32,
            max_inline_data: 0,
            ..QpCaps::default()
        };
        let poll = if poller.is_some() {
            PollContext::Direct
        } else {
            PollContext::Workqueue
        };
        let cq = Cq::alloc_with(
            id.owner(),
            &dev,
            caps.cq_entries()?,
            0,
            poll,
            LinkRef(link.clone()),
        )?;
        let qp = id.create_qp(&pd, &cq, caps)?;
        for _ in 0..DEPTH {
            qp.post_recv(RecvBuffer::new(&pd, MESSAGE_SIZE)?)
                .map_err(Error::from)?;
        }
        // The loop holds the CQ (and through its handler the link) until
        // `end` stops it.
        if let Some(poller) = poller {
            *link.poll_loop.lock() = Some(poller.start(&cq)?);
        }
        // Nothing arrives before the accept below: the link needs its QP
        // only from then on.
        *link.qp.lock() = Some(qp);
        Ok(link)
    }

    /// Accepts a request on its adopted id, echo-ready.
    fn accept(id: &LockedId<'_>, service: &Service) -> Result<Arc<Link>> {
        let param = id.request_accept_param()?.private_data(ACCEPT_DATA)?;
        let link = Self::build_link(id, service)?;
        if let Err(e) = id.accept(Some(&param)) {
            link.stop();
            return Err(e);
        }
        Ok(link)
    }
}

impl Link {
    /// Breaks the link's reference cycles: QP -> CQ -> handler -> link ->
    /// QP, and the polling loop's hold on the CQ.
    fn stop(&self) {
        self.qp.lock().take();
        self.poll_loop.lock().take();
    }
}

/// Ends a connection: breaks its reference cycle, then drops the id
/// (destroyed now, or from the workqueue when inside its own callback).
fn end(conn: Arc<CmId<Echo>>) {
    if let Some(link) = conn.handler().link.as_ref() {
        link.stop();
    }
    drop(conn);
}

impl Handler for Echo {
    fn event(&self, _id: &LockedId<'_>, event: &Event<'_>) {
        match event.kind() {
            EventType::Established => pr_info!("connection established\n"),
            EventType::Disconnected
            | EventType::DeviceRemoval
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected => {
                // Find this connection by its handler and end it.
                let conn = {
                    let mut conns = self.service.conns.lock();
                    let at = conns.iter().position(|c| core::ptr::eq(c.handler(), self));
                    match at {
                        Some(i) => conns.remove(i).ok(),
                        None => None,
                    }
                };
                if let Some(conn) = conn {
                    pr_info!(
                        "connection ended ({})\n",
                        event.kind().name().to_str().unwrap_or("?")
                    );
                    end(conn);
                }
            }
            _ => {}
        }
    }

    fn connect_request(&self, request: ConnectRequest<'_, Self>, _event: &Event<'_>) {
        // Everything that can fail before the link exists comes first:
        // once it does, only `end` may drop the id (it breaks the link's
        // reference cycle).
        let Ok(id) = request.adopt(Echo::new(self.service.clone())) else {
            return;
        };
        let Ok(id) = Arc::new(id, GFP_KERNEL) else {
            return;
        };
        // The CM holds the new id's handler mutex: `with_lock` runs inside it.
        match id.with_lock(|l| Echo::accept(l, &self.service)) {
            Ok(link) => {
                let _ = id.handler().link.populate(link);
                if let Err(e) = self.service.conns.lock().push(id.clone(), GFP_KERNEL) {
                    pr_err!("cannot track connection: {:?}\n", e);
                    end(id);
                }
            }
            Err(e) => pr_err!("accept failed: {:?}\n", e),
        }
    }
}

struct EchoModule {
    service: Arc<Service>,
    listener: Option<CmId<Echo>>,
    /// Last: drops after every id, running their deferred destructions and
    /// waiting for every object before the module's code goes.
    _owner: ModuleOwner,
}

impl kernel::Module for EchoModule {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let owner = ModuleOwner::new::<Self>()?;
        let poller = if module_parameters::busy_poll.value() {
            Some(BusyPoller::new(&owner)?)
        } else {
            None
        };
        let service = Arc::pin_init(
            pin_init!(Service {
                conns <- new_mutex!(KVec::new()),
                poller,
            }),
            GFP_KERNEL,
        )?;
        let port = module_parameters::port.value();
        let listener = CmId::new(
            &owner,
            Echo::new(service.clone()),
            &NetNs::init(),
            PortSpace::Tcp,
            QpType::Rc,
        )?;
        let addr = SocketAddr::any(AF_INET, port)?;
        listener.with_lock(|l| l.bind(&addr))?;
        listener.listen(64)?;
        pr_info!("listening on {}\n", addr);
        Ok(Self {
            service,
            listener: Some(listener),
            _owner: owner,
        })
    }
}

impl Drop for EchoModule {
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
