// SPDX-License-Identifier: GPL-2.0

//! Communication identifiers (`struct rdma_cm_id`).
//!
//! C header: [`include/rdma/rdma_cm.h`](srctree/include/rdma/rdma_cm.h).
//!
//! # Ownership and locking
//!
//! * A [`CmId`] owns one `rdma_cm_id`.  Dropping it destroys the id: after
//!   the drop returns no callback runs any more.  There is no other way to
//!   destroy an id, so double destroy and use after destroy do not compile.
//! * Every call into the CM on an id but `rdma_listen` and `rdma_disconnect`
//!   runs with the id's `handler_mutex` held: inside the id's callback the
//!   CM holds it, and [`CmId::with_lock`] takes it (`rdma_lock_handler`)
//!   outside.  [`CmId::listen`] runs without it, as ucma calls it: on a
//!   wildcard listener's error path `rdma_listen` destroys the internal
//!   per-device listeners it made, taking their handler mutexes (one lock
//!   class with the id's).  [`CmId::disconnect`] too: on iWARP it waits for
//!   a pending connect's reply, which needs the mutex.  Outside callbacks,
//!   every call on an id, these included, is serialised by a mutex of the
//!   layer's own (`calls`).  The two calls without the handler mutex also
//!   hold a second one (`unlocked_call`), which the CM calls of the id's
//!   callbacks only try: while a disconnect or listen runs they fail with
//!   `EBUSY` (waiting could be for themselves), and while they run the
//!   disconnect waits (a connect that fails frees the CM's IB or iWARP id
//!   that `rdma_disconnect` uses).  So every CM call on an id is ordered
//!   against every other, whoever makes it.  Both hand out a [`LockedId`],
//!   the only type with CM operations on it.  This serialises the id's
//!   operations with each other and with its events ("the rdma_cm must be
//!   used single threaded", ucma.c), makes `rdma_accept`'s lockdep
//!   assertion hold by construction, and lets [`LockedId::connect`] use
//!   `rdma_connect_locked` everywhere.
//! * The handler gets `&LockedId`, never the owner: it cannot destroy its
//!   own id.  If a consumer drops a [`CmId`] from inside any of the layer's
//!   callbacks (the id's own: the deadlock `rdma_destroy_id` documents;
//!   another id's: two handler mutexes of one lock class; a completion: a
//!   QP drain behind the running completion), the destruction is deferred
//!   to the module's [`DestroyQueue`](super::DestroyQueue).  For the same
//!   reasons [`CmId::with_lock`] refuses (`EDEADLK`) to take an id's mutex inside
//!   another callback of the layer; inside the id's own callback it runs
//!   without taking the mutex the CM already holds.
//! * A connection request hands the listener's handler a [`ConnectRequest`]
//!   that owns the new id (the only id whose mutex the CM is known to hold:
//!   for a wildcard listener the CM holds one of its internal per-device
//!   listeners' mutexes, not the listener's).  [`ConnectRequest::adopt`]
//!   turns it into a [`CmId`] with its own handler; a request that is
//!   dropped unadopted makes the callback return non-zero, so the CM
//!   destroys the new id (take-once ownership: the id is destroyed by
//!   exactly one party).
//! * The id owns its QP ([`LockedId::create_qp`]: reliable connected on
//!   TCP ids, unreliable datagram on UDP ids).  Destruction first marks the
//!   id dying under its handler mutex, which waits for a running callback
//!   and makes every later `create_qp` fail, then shuts down (flushes) and
//!   destroys the QP without the mutex, then destroys the id.
//! * DEVICE_REMOVAL: the CM waits for every id on the device to be destroyed
//!   before the device goes.  Consumers drop their ids on that event (from
//!   the handler, which defers the destruction).

use super::{
    addr::{SockaddrBuf, SocketAddr},
    ah::{Ah, UdDest},
    bindings,
    blocking::{Begin, EventWaiter, OwnedEvent, SyncOp, SyncResult},
    callback::{
        current_task, in_any_callback, in_completion_handler, CallbackMark, CallbackTarget,
    },
    conn_param::{ConnParam, PrivateDataUse, MAX_RETRY_COUNT},
    deferred::{self, DeferredDestroy},
    device::{Device, Transport},
    event::{Event, EventType},
    net::NetNs,
    pd::Pd,
    verbs::{CommEstNotify, CompletionHandler, Cq, Qp, QpCaps, QpQueues, QpShutdown, QpType, Srq},
};
use core::{
    marker::PhantomData,
    ptr::{self, NonNull},
    sync::atomic::{AtomicBool, AtomicPtr, Ordering},
};
use kernel::{
    ffi, new_mutex,
    prelude::*,
    sync::{aref::ARef, Arc, Mutex, MutexGuard},
    time::Delta,
};

/// Port spaces (`enum rdma_ucm_port_space`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected.
    Tcp = bindings::rdma_ucm_port_space_RDMA_PS_TCP,
    /// `RDMA_PS_UDP`: unreliable datagram (SIDR).
    Udp = bindings::rdma_ucm_port_space_RDMA_PS_UDP,
    /// `RDMA_PS_IB`: any QP type, native IB services.
    Ib = bindings::rdma_ucm_port_space_RDMA_PS_IB,
    /// `RDMA_PS_IPOIB`.
    Ipoib = bindings::rdma_ucm_port_space_RDMA_PS_IPOIB,
}

impl PortSpace {
    /// The port space of a raw value.
    pub fn from_raw(raw: u32) -> Result<Self> {
        [Self::Tcp, Self::Udp, Self::Ib, Self::Ipoib]
            .into_iter()
            .find(|ps| *ps as u32 == raw)
            .ok_or(EINVAL)
    }
}

impl PortSpace {
    /// Whether the port space carries QPs of type `qp_type`
    /// (`rdma_create_id(3)`).
    pub fn carries(self, qp_type: QpType) -> bool {
        matches!(
            (self, qp_type),
            (PortSpace::Tcp, QpType::Rc)
                | (PortSpace::Udp, QpType::Ud)
                | (PortSpace::Ipoib, QpType::Ud)
                | (PortSpace::Ib, _)
        )
    }
}

/// The consumer of an id's events.
///
/// Callbacks run in process context with the id's `handler_mutex` held and
/// may sleep; they must not block on anything that waits for this id's
/// events.  Private data in the event is valid only during the callback.
pub trait Handler: Send + Sync + Sized + 'static {
    /// Any event except a connection request.
    fn event(&self, id: &LockedId<'_>, event: &Event<'_>);

    /// A connection request on a listener.  `request` owns the new id (whose
    /// `handler_mutex` is held): reject or query it through
    /// [`ConnectRequest::id`], or adopt it to keep it (and to give it the QP
    /// an accept needs); dropping it unadopted makes the CM destroy the new
    /// id (the peer's connect fails).
    fn connect_request(&self, request: ConnectRequest<'_, Self>, event: &Event<'_>) {
        // Dropping the request unadopted makes the CM destroy the new id.
        let _ = (request, event);
    }

    /// The waiter of an id driven synchronously (the `*_sync` calls of
    /// [`CmId`]): every event but a connection request is recorded there
    /// after [`Self::event`] returned.  `None` (the default) makes those
    /// calls fail with `EINVAL`.
    fn waiter(&self) -> Option<&EventWaiter> {
        None
    }
}

/// The QP an id owns.
enum QpSlot {
    /// None yet (or destroyed by [`LockedId::destroy_qp`]).
    Empty,
    /// The id's live QP.
    Live(Arc<dyn QpShutdown>),
    /// [`LockedId::destroy_qp`] is tearing the QP down: its teardown runs
    /// completion handlers in the caller's task, which may reach this id
    /// again (a nested `with_lock`), and must find neither a QP to destroy
    /// nor room for a new one, which `rdma_create_qp` would put in the
    /// id's `qp` over the one being destroyed.
    TearingDown,
    /// The id is being destroyed: no QP may be created any more.
    Dying,
}

/// State shared by the owner and the C side of one id.
///
/// # Invariants
///
/// Until [`destroy_now`] swaps it out, `raw` points to a live `rdma_cm_id`
/// of port space `ps` and QP type `qp_type` whose `context` is this object;
/// one strong reference to the enclosing `Arc` is owned by that `context`
/// pointer.  `qp` is changed only with the id's handler mutex held.
#[pin_data]
struct IdInner<H: Handler> {
    raw: AtomicPtr<bindings::rdma_cm_id>,
    ps: PortSpace,
    qp_type: QpType,
    /// The task running this id's callback, or null.
    handler_task: AtomicPtr<bindings::task_struct>,
    /// Accept parameters derived from the connection request, for ids
    /// created by one (`rdma_accept(3)` with no parameters).
    request_param: Option<ConnParam>,
    /// The request was answered (accepted or rejected): the CM leaves the
    /// id's state alone after a SIDR reply, so a second answer would reach
    /// it, fail, and put the QP in the error state on its way out.
    answered: AtomicBool,
    /// The iWARP CM holds a reference on the id's QP: from a connect or
    /// accept that succeeded until the connection's end or the connect's
    /// failure is reported (see [`LockedId::destroy_qp`]).  Written under
    /// the handler mutex.
    iwarp_cm_holds_qp: AtomicBool,
    #[pin]
    qp: Mutex<QpSlot>,
    /// Serialises the owner's calls on the id: `with_lock` (outside the
    /// id's callbacks), `listen` and `disconnect`.  Taken before the
    /// handler mutex.
    #[pin]
    calls: Mutex<()>,
    /// Held by the calls made without the handler mutex (`listen`,
    /// `disconnect`) for their duration, after `calls`.  A CM call under
    /// the handler mutex that may change what they use (the CM's IB or
    /// iWARP id, which a failed connect frees) only tries it: inside a
    /// callback it fails with `EBUSY` rather than wait, since on iWARP a
    /// disconnect waits for the very callback that would wait for it.
    #[pin]
    unlocked_call: Mutex<()>,
    handler: H,
    /// Counted while the C side may call into the module through this
    /// object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

impl<H: Handler> IdInner<H> {
    fn new(
        raw: *mut bindings::rdma_cm_id,
        ps: PortSpace,
        qp_type: QpType,
        handler_task: *mut bindings::task_struct,
        request_param: Option<ConnParam>,
        handler: H,
    ) -> Result<Arc<Self>> {
        let target = CallbackTarget::new()?;
        Arc::pin_init(
            pin_init!(Self {
                raw: AtomicPtr::new(raw),
                ps,
                qp_type,
                handler_task: AtomicPtr::new(handler_task),
                request_param,
                answered: AtomicBool::new(false),
                iwarp_cm_holds_qp: AtomicBool::new(false),
                qp <- new_mutex!(QpSlot::Empty),
                calls <- new_mutex!(()),
                unlocked_call <- new_mutex!(()),
                handler,
                _target: target,
            }),
            GFP_KERNEL,
        )
    }

    fn raw(&self) -> *mut bindings::rdma_cm_id {
        self.raw.load(Ordering::Acquire)
    }

    fn in_own_handler(&self) -> bool {
        self.handler_task.load(Ordering::Acquire) == current_task()
    }

    /// A locked view of the live id `raw`.
    ///
    /// # Safety
    ///
    /// `raw` must be this object's live id, whose handler mutex is held for
    /// `'a`.
    unsafe fn locked<'a>(&'a self, raw: *mut bindings::rdma_cm_id) -> LockedId<'a> {
        // INVARIANT: By the safety requirements.
        LockedId {
            // SAFETY: A live id is non-null.
            raw: unsafe { NonNull::new_unchecked(raw) },
            ps: self.ps,
            qp_type: self.qp_type,
            request_param: self.request_param,
            answered: Some(&self.answered),
            iwarp_cm_holds_qp: Some(&self.iwarp_cm_holds_qp),
            qp_slot: Some(&self.qp),
            unlocked_call: Some(&self.unlocked_call),
            _lock: PhantomData,
        }
    }
}

/// An owned RDMA CM identifier with the event handler `H`.
///
/// # Invariants
///
/// `inner.raw()` is a live id created by this module, not yet destroyed, and
/// owned by this object alone.
pub struct CmId<H: Handler> {
    inner: Arc<IdInner<H>>,
}

// SAFETY: The CM may be called on an id from any thread; every call is
// serialised by the id's handler mutex (see `CmId::with_lock`).
unsafe impl<H: Handler> Send for CmId<H> {}
// SAFETY: As above: `&CmId` gives access to `with_lock`, which serialises
// with the handler mutex, and to `listen` and `disconnect`, which hold
// `calls` and `unlocked_call` against the owner's and the callbacks' calls.
unsafe impl<H: Handler> Sync for CmId<H> {}

impl<H: Handler> CmId<H> {
    /// Creates an id (`rdma_create_id`) in `ns`, with port space `ps` and QP
    /// type `qp_type`.  `EINVAL` if the QP type does not fit the port space;
    /// `ENXIO` if the module holds no [`DestroyQueue`](super::DestroyQueue).
    /// The id takes its own reference on the namespace.
    pub fn new(handler: H, ns: &NetNs, ps: PortSpace, qp_type: QpType) -> Result<Self> {
        if !ps.carries(qp_type) {
            return Err(EINVAL);
        }
        if !deferred::available() {
            return Err(ENXIO);
        }
        let inner = IdInner::new(ptr::null_mut(), ps, qp_type, ptr::null_mut(), None, handler)?;
        let context = Arc::into_raw(inner.clone());
        // SAFETY: `handler_trampoline::<H>` matches `rdma_cm_event_handler`
        // and interprets `context` as the `IdInner<H>` it is.  `ns` is live,
        // and `__rdma_create_kernel_id` takes its own reference on it.
        let raw = unsafe {
            bindings::rdma_cm_rs_create_id(
                ns.as_ptr(),
                Some(handler_trampoline::<H>),
                context.cast_mut().cast(),
                ps as u32,
                qp_type as u32,
            )
        };
        if let Err(e) = kernel::error::from_err_ptr(raw) {
            // SAFETY: Creation failed, the CM holds no copy of `context`.
            drop(unsafe { Arc::from_raw(context) });
            return Err(e);
        }
        // INVARIANT: A fresh id has no device, so no event can have been
        // delivered before `raw` is published.
        inner.raw.store(raw, Ordering::Release);
        Ok(Self { inner })
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.handler
    }

    /// Runs `f` with the id's handler mutex held (`rdma_lock_handler`):
    /// the way to call CM operations from outside the id's callbacks.
    ///
    /// Called from inside this id's own callback (or, for an id just
    /// adopted, its listener's connect-request callback), where the CM
    /// already holds the mutex, `f` runs directly.  Called from inside any
    /// other callback of the layer it fails with `EDEADLK`: taking the
    /// mutex there could wait for a callback that waits for this one.
    pub fn with_lock<R>(&self, f: impl FnOnce(&LockedId<'_>) -> Result<R>) -> Result<R> {
        let raw = self.inner.raw();
        // SAFETY: By the type invariants `raw` is live; the mutex is held
        // either by this task's callback or by the lock taken below, for as
        // long as `locked` lives.
        let locked = unsafe { self.inner.locked(raw) };
        if self.inner.in_own_handler() {
            return f(&locked);
        }
        if in_any_callback() {
            return Err(EDEADLK);
        }
        let _calls = self.inner.calls.lock();
        // SAFETY: `raw` is live; the mutex is not held by this task (not in
        // its callback, nor in any other, nor in another `with_lock`).
        unsafe { bindings::rdma_lock_handler(raw) };
        // Inside `f` the task counts as in this id's callback: a nested
        // `with_lock` on this id runs directly, one on another id is
        // refused, and a `CmId` dropped there is destroyed later, exactly
        // as inside the CM's callbacks (the mutex is held the same way).
        // No callback of this id runs meanwhile: the marker is ours.
        self.inner
            .handler_task
            .store(current_task(), Ordering::Release);
        let mark = CallbackMark::enter();
        let result = f(&locked);
        drop(mark);
        self.inner
            .handler_task
            .store(ptr::null_mut(), Ordering::Release);
        // SAFETY: Taken just above.
        unsafe { bindings::rdma_unlock_handler(raw) };
        result
    }
}

impl<H: Handler> CmId<H> {
    /// Listens (`rdma_listen`); an unbound id listens on the wildcard.
    ///
    /// No CM bounds the connection requests delivered and not yet
    /// answered: a consumer that wants such a bound keeps its own.  The IB
    /// CM ignores `backlog`; the iWARP CM sizes the listener's pool of
    /// queued events with it (`iw_cm_listen`: a request arriving while
    /// that many of the listener's events wait for the CM's workqueue is
    /// dropped, and a slot comes back as soon as the handler ran), and siw
    /// passes it to its TCP `listen()`.  0 asks for the CM's default:
    /// `net.iw_cm.default_backlog` (256) on iWARP, as isert listens.  Above
    /// `i32::MAX`: `EINVAL`.
    /// Called without the id's handler mutex (see the module
    /// documentation), so not from inside any callback of the layer or
    /// `with_lock` (`EDEADLK`).
    pub fn listen(&self, backlog: u32) -> Result {
        let backlog = i32::try_from(backlog).map_err(|_| EINVAL)?;
        if in_any_callback() {
            return Err(EDEADLK);
        }
        let _calls = self.inner.calls.lock();
        let _unlocked = self.inner.unlocked_call.lock();
        // SAFETY: The id is live (type invariants); `rdma_listen` needs no
        // lock of the caller's and may take the handler mutexes of the
        // internal listeners it destroys on failure, none of which this
        // task holds.
        to_result(unsafe { bindings::rdma_listen(self.inner.raw(), backlog) })
    }

    /// Disconnects (`rdma_disconnect`): moves the QP to the error state and
    /// sends the CM's disconnect request or reply.
    ///
    /// Called without the id's handler mutex, as `ucma.c` calls it, so not
    /// from inside any callback of the layer or `with_lock` (`EDEADLK`).
    /// On iWARP, `iw_cm_disconnect` waits until the reply to a pending
    /// connect has been handled, and that reply reaches this id's handler
    /// (on the iWARP CM's one workqueue) only once it can take the handler
    /// mutex: holding it here deadlocked (the ioctl fuzzer, seed 1, on
    /// siw: DISCONNECT right after CONNECT never returned, and every later
    /// siw teardown hung behind it).
    ///
    /// `EOPNOTSUPP` on a UD id: it has no connection, and the CM would only
    /// move its QP to the error state (`cma_modify_qp_err`) and fail to send
    /// a disconnect request for the finished SIDR exchange; dropping the id
    /// is how a UD id ends.
    pub fn disconnect(&self) -> Result {
        if self.inner.qp_type == QpType::Ud {
            return Err(EOPNOTSUPP);
        }
        if in_any_callback() {
            return Err(EDEADLK);
        }
        let _calls = self.inner.calls.lock();
        // Ordered against the CM calls of the id's callbacks (a failed
        // connect frees the CM's IB or iWARP id, which `rdma_disconnect`
        // reads twice and then uses): those hold this while they run, and
        // give up with `EBUSY` if this is held.
        let _unlocked = self.inner.unlocked_call.lock();
        // On IB `rdma_disconnect` moves the QP to the error state under the
        // id's `qp_mutex` (`cma_modify_qp_err`); on iWARP `iw_cm_disconnect`
        // modifies the QP it read without a reference, which the iWARP CM
        // may have let go of meanwhile (a peer's CLOSE).  Neither races
        // with `LockedId::destroy_qp`, which holds `unlocked_call` too.  No
        // other call on the id changes its CM id meanwhile: the owner's
        // are serialised by `calls`, its callbacks' by `unlocked_call`.
        let raw = self.inner.raw();
        // SAFETY: The id is live (type invariants), not destroyed while
        // `self` is borrowed; the call needs no lock of the caller's.
        to_result(unsafe { bindings::rdma_disconnect(raw) })
    }
}

/// Synchronous operation (`rdma_create_id(3)` without an event channel):
/// each call starts an operation and blocks until the event that ends it,
/// which it returns with its meaning ([`super::blocking::SyncOutcome`]); a call no event
/// ended fails with its errno ([`super::blocking`] has the rules: one call at a time,
/// resumption after a signal or a timeout, DISCONNECTED kept, ENODEV on
/// device removal).
///
/// They need a handler with a waiter ([`Handler::waiter`], `EINVAL`
/// otherwise), which still sees every event first.  They sleep, so they
/// are for process context outside the layer's callbacks: a callback gets
/// a [`LockedId`], which has no blocking calls, and a call from inside any
/// callback of the layer or `with_lock` (another id's, reached through the
/// handler's own state) fails with `EDEADLK`, as the event it waits for
/// could be queued behind the running callback.  `limit` bounds the wait
/// (`None`: until the event comes; the CM's own timers end every
/// operation); past it the call fails with `ETIMEDOUT` and the operation
/// stays in flight.
impl<H: Handler> CmId<H> {
    /// The common form: claims the id for `op`, runs `start` (which must
    /// start `op`, e.g. under [`Self::with_lock`]; it is skipped when the
    /// call resumes an interrupted one) and waits for the event that ends
    /// `op`.  For consumers that do more than the operation itself when
    /// they start it (make a QP, record a state); the others use the named
    /// forms below.
    pub fn call_sync(
        &self,
        op: SyncOp,
        limit: Option<Delta>,
        start: impl FnOnce() -> Result,
    ) -> SyncResult {
        if in_any_callback() {
            return Err(EDEADLK);
        }
        let waiter = self.inner.handler.waiter().ok_or(EINVAL)?;
        if let Begin::Start = waiter.begin(op)? {
            if let Err(e) = start() {
                waiter.abort();
                return Err(e);
            }
        }
        waiter.wait(op, limit)
    }

    /// Resolves the address ([`LockedId::resolve_addr`]) and waits for
    /// ADDR_RESOLVED.
    pub fn resolve_addr_sync(
        &self,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout: Delta,
        limit: Option<Delta>,
    ) -> SyncResult {
        self.call_sync(SyncOp::ResolveAddr, limit, || {
            self.with_lock(|l| l.resolve_addr(src, dst, timeout))
        })
    }

    /// Resolves the route ([`LockedId::resolve_route`]) and waits for
    /// ROUTE_RESOLVED.
    pub fn resolve_route_sync(&self, timeout: Delta, limit: Option<Delta>) -> SyncResult {
        self.call_sync(SyncOp::ResolveRoute, limit, || {
            self.with_lock(|l| l.resolve_route(timeout))
        })
    }

    /// Connects ([`LockedId::connect`], the id's QP made first) and waits
    /// for ESTABLISHED.  On a UD id that is the SIDR reply, whose address
    /// vector lives only during the callback: the handler makes the
    /// destination there ([`LockedId::ud_dest`]).
    pub fn connect_sync(&self, param: &ConnParam, limit: Option<Delta>) -> SyncResult {
        self.call_sync(SyncOp::Connect, limit, || {
            self.with_lock(|l| l.connect(param))
        })
    }

    /// Accepts a connection request ([`LockedId::accept`], taking the
    /// handler mutex it needs) and waits for ESTABLISHED.  RC ids only
    /// (`EINVAL` on a UD id: a SIDR reply ends the exchange, there is
    /// nothing to wait for).
    pub fn accept_sync(&self, param: Option<&ConnParam>, limit: Option<Delta>) -> SyncResult {
        if self.inner.qp_type != QpType::Rc {
            return Err(EINVAL);
        }
        self.call_sync(SyncOp::Accept, limit, || {
            self.with_lock(|l| l.accept(param))
        })
    }

    /// Disconnects ([`Self::disconnect`]) and waits for DISCONNECTED, which
    /// returns at once if the peer disconnected first.
    pub fn disconnect_sync(&self, limit: Option<Delta>) -> SyncResult {
        self.call_sync(SyncOp::Disconnect, limit, || self.disconnect())
    }

    /// The event that ended the last blocking call, a failed one's too
    /// (librdmacm's `id->event`); `None` before any, or without a waiter.
    pub fn last_event(&self) -> Option<OwnedEvent> {
        self.inner.handler.waiter().and_then(EventWaiter::last)
    }
}

impl<H: Handler> DeferredDestroy for IdInner<H> {
    fn destroy(&self) {
        destroy_now(self);
    }
}

/// Marks the id dying, destroys its QP (if any) and the id, then drops the
/// C side's reference.  Never called inside a callback of the layer.
fn destroy_now<H: Handler>(inner: &IdInner<H>) {
    let raw = inner.raw.swap(ptr::null_mut(), Ordering::AcqRel);
    if raw.is_null() {
        return;
    }
    // SAFETY: `raw` is live (type invariants) and now unreachable from the
    // owner; the current task holds no handler mutex (not in a callback of
    // the layer, nor in `with_lock`: both defer destructions).
    unsafe { bindings::rdma_lock_handler(raw) };
    // A callback that was running has returned, and any later one sees the
    // id dying: no QP can appear after this, and none is handed to the CM
    // any more (`LockedId::connect` and `accept` want a live QP in the
    // slot, which they read under this mutex).
    let slot = core::mem::replace(&mut *inner.qp.lock(), QpSlot::Dying);
    // SAFETY: Taken above.
    unsafe { bindings::rdma_unlock_handler(raw) };
    // The QP goes without the handler mutex, as the kernel's ULPs destroy
    // theirs: `siw_destroy_qp` waits until every reference on the QP is
    // gone, and the iWARP CM drops its own (taken by the connect or the
    // accept) only when it handles the connection's CLOSE (or a failed
    // connect's reply, or the CM id's destruction below), after the
    // events queued before it on its one workqueue, whose upcalls
    // (`cma_iw_handler`) take this mutex.  Holding it here deadlocked: an
    // ESTABLISHED still queued when the id was destroyed waited for the
    // mutex, the destruction for the QP, and behind them every iWARP event,
    // every siw id's destruction (`iw_destroy_cm_id` flushes that queue)
    // and `rdma link delete siw0` (the fuzzer, seed 2).  The CM serialises
    // the destruction with its own uses of the QP by the id's `qp_mutex`
    // (`rdma_destroy_qp`, `cma_modify_qp_*`), and the drain waits only for
    // completions, whose callbacks never take the handler mutex.
    if let QpSlot::Live(qp) = slot {
        if qp.shutdown() {
            // SAFETY: The id is live, its QP shut down; nothing posts to
            // it any more (`shutdown` took it), and no callback hands it
            // to the CM (the slot is `Dying`).
            unsafe { bindings::rdma_destroy_qp(raw) };
            qp.reclaim();
        }
    }
    // SAFETY: The id is live; `rdma_destroy_id` waits for a running
    // callback, and none starts after it.  Then the CM no longer uses
    // `context`, whose reference is released.
    unsafe {
        let context = (*raw).context;
        bindings::rdma_destroy_id(raw);
        drop(Arc::from_raw(context.cast::<IdInner<H>>()));
    }
}

impl<H: Handler> Drop for CmId<H> {
    fn drop(&mut self) {
        if self.inner.in_own_handler() || in_any_callback() {
            // `rdma_destroy_id` from the id's own callback deadlocks; from
            // another id's callback it nests two handler mutexes of one
            // lock class; from a completion it may drain its own CQ.
            let victim: Arc<dyn DeferredDestroy> = self.inner.clone();
            if deferred::spawn(victim).is_err() {
                // No queue or no memory: destroying here could deadlock,
                // so the id leaks, loudly.  The C id keeps calling this
                // module's trampoline: the module must never go.
                pr_err!("cannot defer the destruction of a cm_id, leaking it\n");
                core::mem::forget(self.inner.clone());
                // SAFETY: Takes a reference on this module, which is live
                // (its code is running).
                unsafe { bindings::rdma_cm_rs_pin_module() };
            }
        } else {
            destroy_now(&self.inner);
        }
    }
}

/// A connection request: owns the new id until adopted.
///
/// # Invariants
///
/// `raw` is the new id of a CONNECT_REQUEST callback in progress, of port
/// space `ps` and QP type `qp_type`, whose handler mutex the CM holds;
/// `adopted` is the callback's flag.
pub struct ConnectRequest<'a, H: Handler> {
    raw: NonNull<bindings::rdma_cm_id>,
    ps: PortSpace,
    qp_type: QpType,
    adopted: &'a core::cell::Cell<bool>,
    request_param: ConnParam,
    _h: PhantomData<H>,
}

impl<'a, H: Handler> ConnectRequest<'a, H> {
    /// The new id, locked for the duration of the callback: reject or query
    /// it here.  Accepting needs the id's QP, which only an adopted id has.
    pub fn id(&self) -> LockedId<'_> {
        // INVARIANT: The CM holds the new id's handler mutex during the callback.
        LockedId {
            raw: self.raw,
            ps: self.ps,
            qp_type: self.qp_type,
            request_param: Some(self.request_param),
            // Rejecting here ends the request: the id is destroyed when the
            // callback returns, unless adopted.
            answered: None,
            // A QP needs an owner: adopt the id first.
            iwarp_cm_holds_qp: None,
            qp_slot: None,
            // No owner yet, so no call without the handler mutex.
            unlocked_call: None,
            _lock: PhantomData,
        }
    }

    /// Takes ownership of the new id with its own handler.  `ENXIO` if the
    /// module holds no [`DestroyQueue`](super::DestroyQueue) (see
    /// [`CmId::new`]).
    pub fn adopt(self, handler: H) -> Result<CmId<H>> {
        if !deferred::available() {
            return Err(ENXIO);
        }
        // The CM holds this id's handler mutex until the listener's
        // callback returns: treat that as being in its handler.
        let inner = IdInner::new(
            self.raw.as_ptr(),
            self.ps,
            self.qp_type,
            current_task(),
            Some(self.request_param),
            handler,
        )?;
        // SAFETY: The new id is live and its handler mutex is held, so no
        // event reads `context` concurrently.  INVARIANT: `context` now owns
        // one reference to `inner`.
        unsafe { (*self.raw.as_ptr()).context = Arc::into_raw(inner.clone()).cast_mut().cast() };
        self.adopted.set(true);
        Ok(CmId { inner })
    }
}

/// An id whose handler mutex is held: the CM operations live here.
///
/// # Invariants
///
/// `raw` is live, of port space `ps` and QP type `qp_type`, and its
/// `handler_mutex` is held for `'a`; `qp_slot` is its owner's QP slot.
pub struct LockedId<'a> {
    raw: NonNull<bindings::rdma_cm_id>,
    ps: PortSpace,
    qp_type: QpType,
    request_param: Option<ConnParam>,
    answered: Option<&'a AtomicBool>,
    iwarp_cm_holds_qp: Option<&'a AtomicBool>,
    qp_slot: Option<&'a Mutex<QpSlot>>,
    /// The owner's lock of the calls made without the handler mutex.
    unlocked_call: Option<&'a Mutex<()>>,
    _lock: PhantomData<&'a ()>,
}

fn to_result(ret: i32) -> Result {
    kernel::error::to_result(ret)
}

/// The longest address or route resolution a caller may ask for, as
/// librdmacm's tools bound it.
pub const MAX_RESOLVE_TIMEOUT: Delta = Delta::from_millis(60_000);

/// A resolution timeout in the CM's milliseconds: 1 ms to
/// [`MAX_RESOLVE_TIMEOUT`], else `EINVAL`.
fn resolve_timeout_ms(timeout: Delta) -> Result<usize> {
    let ms = timeout.as_millis();
    if ms < 1 || ms > MAX_RESOLVE_TIMEOUT.as_millis() {
        return Err(EINVAL);
    }
    usize::try_from(ms).map_err(|_| EINVAL)
}

impl<'a> LockedId<'a> {
    fn as_ptr(&self) -> *mut bindings::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// Excludes the owner's calls made without the handler mutex
    /// ([`CmId::disconnect`], [`CmId::listen`]) for as long as the guard
    /// lives: for a CM call that may change the id's CM state under them.
    /// `EBUSY` while one runs (inside `with_lock` none can: they take the
    /// owner's `calls` too).
    fn exclude_unlocked_calls(&self) -> Result<Option<MutexGuard<'a, ()>>> {
        match self.unlocked_call {
            None => Ok(None),
            Some(lock) => lock.try_lock().map(Some).ok_or(EBUSY),
        }
    }

    /// Reads a field of the id that C may write meanwhile (the address
    /// resolver fills `route`, the CM sets `device` and `port_num` when it
    /// binds): a volatile copy, as C's `READ_ONCE`, never a reference.
    fn read<T: Copy>(&self, field: impl FnOnce(*mut bindings::rdma_cm_id) -> *const T) -> T {
        // SAFETY: By the type invariants the id is live while `self` is;
        // `field` projects to one of its fields, which is plain data.
        unsafe { ptr::read_volatile(field(self.as_ptr())) }
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.ps
    }

    /// The QP type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The port the id is bound to, 0 if none.
    pub fn port_num(&self) -> u32 {
        // SAFETY: A field of the live id.
        self.read(|id| unsafe { &raw const (*id).port_num })
    }

    fn device_ptr(&self) -> *mut bindings::ib_device {
        // SAFETY: A field of the live id.
        self.read(|id| unsafe { &raw const (*id).device })
    }

    /// The number of the id's QP, if it has one.
    pub fn qp_num(&self) -> Option<u32> {
        match &*self.qp_slot?.lock() {
            QpSlot::Live(qp) => Some(qp.qp_num()),
            _ => None,
        }
    }

    /// The RDMA device the id is bound to: `ENODEV` if it is bound to none
    /// (or the device is going away).
    pub fn device(&self) -> Result<ARef<Device>> {
        // SAFETY: A bound id's device stays valid until the id is destroyed
        // (the CM holds it); the id is live.
        unsafe { Device::try_get(self.device_ptr()) }
    }

    /// The source address (`rdma_get_local_addr`), if set.
    pub fn src_addr(&self) -> Option<SocketAddr> {
        // SAFETY: A field of the live id.
        sockaddr_of(&self.read(|id| unsafe { &raw const (*id).route.addr.src_addr }))
    }

    /// The destination address (`rdma_get_peer_addr`), if set.
    ///
    /// Binding fills the destination's family with a wildcard address and
    /// port 0; that is reported as no destination.
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        // SAFETY: A field of the live id.
        let dst = self.read(|id| unsafe { &raw const (*id).route.addr.dst_addr });
        sockaddr_of(&dst).filter(|a| !(a.is_any() && a.port() == 0))
    }

    /// Binds to a local address (`rdma_bind_addr`); port 0 picks one.
    pub fn bind(&self, addr: &SocketAddr) -> Result {
        let _excluded = self.exclude_unlocked_calls()?;
        let mut buf = addr.to_sockaddr();
        // SAFETY: `buf` is a valid, aligned sockaddr for the call's
        // duration; the id is live.
        to_result(unsafe { bindings::rdma_bind_addr(self.as_ptr(), (&raw mut buf).cast()) })
    }

    /// Starts address resolution (`rdma_resolve_addr`); completes with
    /// ADDR_RESOLVED or ADDR_ERROR.  `timeout` must be 1 ms to 60 s.
    pub fn resolve_addr(
        &self,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout: Delta,
    ) -> Result {
        let timeout_ms = resolve_timeout_ms(timeout)?;
        let _excluded = self.exclude_unlocked_calls()?;
        if let Some(src) = src {
            if src.family() != dst.family() {
                return Err(EINVAL);
            }
        }
        let mut dst_buf = dst.to_sockaddr();
        let mut src_buf = src.map(SocketAddr::to_sockaddr).unwrap_or_default();
        let src_ptr: *mut bindings::sockaddr = if src.is_some() {
            (&raw mut src_buf).cast()
        } else {
            ptr::null_mut()
        };
        // SAFETY: Both buffers are valid sockaddrs for the call's duration
        // (the CM copies them); the id is live.
        to_result(unsafe {
            bindings::rdma_resolve_addr(
                self.as_ptr(),
                src_ptr,
                (&raw mut dst_buf).cast(),
                timeout_ms,
            )
        })
    }

    /// Starts route resolution (`rdma_resolve_route`); completes with
    /// ROUTE_RESOLVED or ROUTE_ERROR.  `timeout` must be 1 ms to 60 s.
    pub fn resolve_route(&self, timeout: Delta) -> Result {
        let timeout_ms = resolve_timeout_ms(timeout)?;
        let _excluded = self.exclude_unlocked_calls()?;
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_resolve_route(self.as_ptr(), timeout_ms) })
    }

    /// Checks `param` for `usage` against the bound device's limits.
    pub fn check_param(&self, param: &ConnParam, usage: PrivateDataUse) -> Result {
        let dev = self.device().map_err(|_| EINVAL)?;
        param.check(usage, &dev)
    }

    /// The transport of the bound device; `EINVAL` before the id has one.
    pub fn transport(&self) -> Result<Transport> {
        Ok(self.device().map_err(|_| EINVAL)?.transport())
    }

    /// Whether the id's own QP is live: the CM connects that one and no
    /// other (a QP number passed to it would be looked up device-wide by
    /// the iWARP CM, whoever owns that QP).
    fn has_live_qp(&self) -> bool {
        self.qp_slot
            .is_some_and(|slot| matches!(*slot.lock(), QpSlot::Live(_)))
    }

    /// Connects (`rdma_connect_locked`): after ROUTE_RESOLVED.  On a UD id
    /// this is the SIDR lookup of the remote QP (up to 180 bytes of private
    /// data), whose ESTABLISHED event [`Self::ud_dest`] turns into a
    /// destination; on an RC id a connection request (up to 56).  Either
    /// way for the id's QP, which must exist (`ENOTCONN` otherwise, see
    /// [`Self::create_qp`]).
    pub fn connect(&self, param: &ConnParam) -> Result {
        if !self.has_live_qp() {
            return Err(ENOTCONN);
        }
        let usage = match self.qp_type {
            QpType::Ud => PrivateDataUse::ConnectUd,
            QpType::Rc => PrivateDataUse::ConnectRc,
        };
        self.check_param(param, usage)?;
        let _excluded = self.exclude_unlocked_calls()?;
        let iwarp_rc = self.is_iwarp_rc()?;
        let mut raw = param.as_raw();
        // SAFETY: The handler mutex is held (type invariants), as
        // `rdma_connect_locked` requires; `raw` and the private data it
        // points into (inside `param`) live across the call, which copies
        // them.
        to_result(unsafe { bindings::rdma_connect_locked(self.as_ptr(), &mut raw) })?;
        self.note_iwarp_cm_holds_qp(iwarp_rc);
        Ok(())
    }

    /// Whether the id is an RC id on an iWARP device, whose CM takes a
    /// reference on the QP at a connect or accept (`EINVAL` if the id has
    /// no device yet: neither has a QP to connect).
    fn is_iwarp_rc(&self) -> Result<bool> {
        Ok(self.qp_type == QpType::Rc && self.transport()? == Transport::Iwarp)
    }

    /// After a connect or accept that succeeded on an iWARP RC id: the CM
    /// took a reference on the QP (`iw_cm_connect`, `iw_cm_accept`), which
    /// it drops before reporting the connection's end or the connect's
    /// failure.
    fn note_iwarp_cm_holds_qp(&self, iwarp_rc: bool) {
        if let (true, Some(holds)) = (iwarp_rc, self.iwarp_cm_holds_qp) {
            holds.store(true, Ordering::Release);
        }
    }

    /// The parameters `rdma_accept(3)` uses when given none: the request's
    /// values adjusted down to the local device.  The IB CM already reports
    /// a request from the receiver's side (its responder resources are the
    /// peer's initiator depth, `cm_format_req_event`), so they are used as
    /// they are.
    pub fn request_accept_param(&self) -> Result<ConnParam> {
        let req = self.request_param.ok_or(EINVAL)?;
        let dev = self.device().map_err(|_| EINVAL)?;
        let (req_rr, req_id) = req.rd_atom();
        let clamp = |v: u8, max: u32| u8::try_from(u32::from(v).min(max)).unwrap_or(u8::MAX);
        ConnParam::new()
            .responder_resources(clamp(req_rr, dev.max_qp_rd_atom()))
            .initiator_depth(clamp(req_id, dev.max_qp_init_rd_atom()))
            .flow_control(true)
            .rnr_retry_count(MAX_RETRY_COUNT)
    }

    /// Accepts a connection request (`rdma_accept`) with the id's QP, which
    /// must exist (`ENOTCONN`: adopt the request's id and create it first);
    /// `None` uses [`Self::request_accept_param`].  On a UD id this is the
    /// SIDR reply: it names the id's UD QP and its Q_Key, and carries up to
    /// 136 bytes of private data (the other parameters mean nothing to
    /// SIDR); no event follows on this side.
    ///
    /// `EINVAL` on an id no connection request made, or whose request was
    /// answered already: the CM would fail either, and move the id's QP to
    /// the error state on its way out.
    pub fn accept(&self, param: Option<&ConnParam>) -> Result {
        self.check_unanswered()?;
        let _excluded = self.exclude_unlocked_calls()?;
        if !self.has_live_qp() {
            return Err(ENOTCONN);
        }
        if self.qp_type == QpType::Ud {
            let param = param.copied().unwrap_or_default();
            param
                .data()
                .check(PrivateDataUse::AcceptUd, self.transport()?)?;
            let mut raw = param.as_raw();
            // A zero `qkey` answers with the port space's default Q_Key,
            // the one the QP was created with.
            // SAFETY: Handler mutex held (type invariants); `raw` outlives the call.
            to_result(unsafe { bindings::rdma_accept(self.as_ptr(), &mut raw) })?;
            self.mark_answered();
            return Ok(());
        }
        let defaults;
        let param = match param {
            Some(p) => p,
            None => {
                defaults = self.request_accept_param()?;
                &defaults
            }
        };
        self.check_param(param, PrivateDataUse::AcceptRc)?;
        let iwarp_rc = self.is_iwarp_rc()?;
        let mut raw = param.as_raw();
        // SAFETY: The handler mutex is held (type invariants), as
        // `rdma_accept` asserts; `raw` outlives the call.
        to_result(unsafe { bindings::rdma_accept(self.as_ptr(), &mut raw) })?;
        self.mark_answered();
        self.note_iwarp_cm_holds_qp(iwarp_rc);
        Ok(())
    }

    /// `EINVAL` unless the id was made by a connection request that was
    /// not answered yet (the answered flag is written under the handler
    /// mutex, which is held).
    fn check_unanswered(&self) -> Result {
        if self.request_param.is_none() || self.answered.is_some_and(|a| a.load(Ordering::Acquire))
        {
            return Err(EINVAL);
        }
        Ok(())
    }

    fn mark_answered(&self) {
        if let Some(answered) = self.answered {
            answered.store(true, Ordering::Release);
        }
    }

    /// Rejects a connection request (`rdma_reject`) with an IB CM reason
    /// (0 means consumer defined, 28) and up to 148 bytes of private data,
    /// 136 on a UD id (a SIDR reply carries the rejection, with no reason:
    /// the CM does not send it).  On iWARP up to 252 bytes travel in an MPA
    /// reply with the reject bit, and no reason (the peer sees
    /// `ECONNREFUSED`).  `EINVAL` as [`Self::accept`] when there is no
    /// request to answer.
    pub fn reject(&self, reason: u8, data: &[u8]) -> Result {
        self.check_unanswered()?;
        let _excluded = self.exclude_unlocked_calls()?;
        let usage = match self.qp_type {
            QpType::Rc => PrivateDataUse::Reject,
            QpType::Ud => PrivateDataUse::AcceptUd,
        };
        let limit = usage.limit(self.transport()?)?;
        if data.len() > limit {
            return Err(EINVAL);
        }
        let reason = if reason == 0 {
            bindings::ib_cm_rej_reason_IB_CM_REJ_CONSUMER_DEFINED as u8
        } else {
            reason
        };
        // SAFETY: `data` is readable for its length during the call; the id
        // is live and locked.
        to_result(unsafe {
            bindings::rdma_reject(
                self.as_ptr(),
                if data.is_empty() {
                    ptr::null()
                } else {
                    data.as_ptr().cast()
                },
                data.len() as u8,
                reason,
            )
        })?;
        self.mark_answered();
        Ok(())
    }

    /// The CM's text for a reject reason on this id's transport
    /// (`rdma_reject_msg`), e.g. for the status of a REJECTED event.
    /// `None` on an id bound to no device port (unbound, or a wildcard
    /// listener), where the transport, and so the text, is unknown.
    pub fn reject_msg(&self, reason: i32) -> Option<&'static CStr> {
        if self.device_ptr().is_null() || self.port_num() == 0 {
            return None;
        }
        // SAFETY: The id is live with a device and a port, which
        // `rdma_reject_msg` reads to pick the transport; it returns a static
        // string for any reason.
        Some(unsafe { CStr::from_char_ptr(bindings::rdma_reject_msg(self.as_ptr(), reason)) })
    }

    /// Sets the type of service (`rdma_set_service_type`), before connect/listen.
    pub fn set_tos(&self, tos: u8) {
        // SAFETY: The id is live.
        unsafe { bindings::rdma_set_service_type(self.as_ptr(), i32::from(tos)) };
    }

    /// `rdma_set_reuseaddr`: setting it is refused only on a listener,
    /// clearing it only on an id that is not idle (`cma.c`).
    pub fn set_reuseaddr(&self, on: bool) -> Result {
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_reuseaddr(self.as_ptr(), i32::from(on)) })
    }

    /// `rdma_set_afonly`: only while the id is idle or just bound.
    pub fn set_afonly(&self, on: bool) -> Result {
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_afonly(self.as_ptr(), i32::from(on)) })
    }

    /// `rdma_set_ack_timeout`: 4.096 us * 2^t, t in 0..=31 (0 disables the
    /// timer), RC ids only.  The CM stores any u8; devices reject > 31 later,
    /// so it is refused here.
    pub fn set_ack_timeout(&self, timeout: u8) -> Result {
        if timeout > 31 {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_ack_timeout(self.as_ptr(), timeout) })
    }

    /// `rdma_set_min_rnr_timer`: the 5-bit IB encoding, RC ids only
    /// (`EINVAL` otherwise: the CM checks the QP type with a `WARN_ON`,
    /// which must never be reachable from here).
    pub fn set_min_rnr_timer(&self, timer: u8) -> Result {
        if timer > 31 || self.qp_type != QpType::Rc {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_min_rnr_timer(self.as_ptr(), timer) })
    }

    /// The destination a SIDR lookup found: on the ESTABLISHED event of a
    /// UD id's [`Self::connect`], an address handle on `pd` (the PD of the
    /// id's QP) from the event's address vector, with the remote QP number
    /// and Q_Key the reply named.  Call it from the handler: the vector
    /// lives only as long as the event.  `EINVAL` for another event or a
    /// non-UD id, `EXDEV` for a PD of another device than the id's.
    pub fn ud_dest(&self, event: &Event<'_>, pd: &Arc<Pd>) -> Result<UdDest> {
        if self.qp_type != QpType::Ud || event.kind() != EventType::Established {
            return Err(EINVAL);
        }
        let ud = event.ud_param().ok_or(EINVAL)?;
        self.device()?.check_same(pd.device())?;
        let attr = &ud.raw.ah_attr;
        // SAFETY: `attr` is the address vector the CM filled for this
        // ESTABLISHED event (`cma_sidr_rep_handler`), whose source GID
        // reference the CM holds until the handler returns, which this call
        // (borrowing the event) does not outlive.
        let ah = unsafe { Ah::from_attr(pd, attr) }?;
        let routed = u32::from(attr.ah_flags) & bindings::ib_ah_flags_IB_AH_GRH != 0;
        // SAFETY: Any bytes are a valid GID.
        let dgid = unsafe { attr.grh.dgid.raw };
        let gid = routed.then_some(dgid);
        UdDest::new(ah, ud.qp_num(), ud.qkey(), gid)
    }

    /// Creates the id's QP (`rdma_create_qp`) on `pd`, completing on `cq`,
    /// of the id's QP type (a UD QP gets the port space's Q_Key and is
    /// ready to send and receive at once).
    ///
    /// The id owns the QP: its destruction drains and destroys it.  `EXDEV` if `pd` or
    /// `cq` is of another device than the id's, `ENOSPC` if `cq` has no
    /// room for `caps` and the drain, `EBUSY` if the id has a QP,
    /// `ESHUTDOWN` once the id is being destroyed, `EINVAL` on an id not
    /// adopted yet, `EPROTONOSUPPORT` for a UD id on an iWARP device (UD
    /// does not exist there).
    ///
    /// On the passive side of an iWARP connection (an id a request made)
    /// the QP holds its sends until the peer's first message arrived (see
    /// [`Qp::awaits_first_message`]): `rdma_connect(3)` requires the active
    /// side to send first there.
    pub fn create_qp<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        cq: &Arc<Cq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        self.create_qp_with_cqs(pd, cq, cq, caps)
    }

    /// As [`Self::create_qp`], with the QP's sends (and its memory work
    /// requests) completing on `send_cq` and its receives on `recv_cq`,
    /// each to its CQ's handler.  `ENOSPC` unless `send_cq` has room for
    /// [`QpCaps::send_cq_entries`] and `recv_cq` for
    /// [`QpCaps::recv_cq_entries`] (or, if they are one CQ, for
    /// [`QpCaps::cq_entries`]); the QP's asynchronous events go to the send
    /// CQ's handler.
    pub fn create_qp_with_cqs<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq<C>>,
        recv_cq: &Arc<Cq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        self.create_qp_inner(pd, send_cq, recv_cq, caps, None)
    }

    /// As [`Self::create_qp_with_cqs`], for an RC QP that takes its
    /// receives from `srq` (see [`Srq`]): its own receive queue is empty
    /// (`EINVAL` unless `caps.max_recv_wr` is 0, or for an SRQ of another
    /// PD; `EXDEV` of another device; `EOPNOTSUPP` on a UD id), and
    /// `recv_cq` takes the completions of the SRQ's receives this QP takes
    /// (`ENOSPC` unless it has room for all of the SRQ's, the first time a
    /// QP on `srq` receives on it).  The QP holds `srq`.
    pub fn create_qp_on_srq<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq<C>>,
        recv_cq: &Arc<Cq<C>>,
        srq: &Arc<Srq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        self.create_qp_inner(pd, send_cq, recv_cq, caps, Some(srq))
    }

    fn create_qp_inner<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq<C>>,
        recv_cq: &Arc<Cq<C>>,
        caps: QpCaps,
        srq: Option<&Arc<Srq<C>>>,
    ) -> Result<Arc<Qp<C>>> {
        let slot = self.qp_slot.ok_or(EINVAL)?;
        let dev = self.device()?;
        let iwarp = dev.transport() == Transport::Iwarp;
        if iwarp && self.qp_type == QpType::Ud {
            return Err(EPROTONOSUPPORT);
        }
        let mut slot = slot.lock();
        match *slot {
            QpSlot::Empty => {}
            QpSlot::Live(_) | QpSlot::TearingDown => return Err(EBUSY),
            QpSlot::Dying => return Err(ESHUTDOWN),
        }
        // COMM_EST is the IB CM's (an RC QP's first message before the
        // RTU): not for UD ids, whose IB CM id `rdma_connect` makes and may
        // destroy while the QP lives, nor iWARP, which has no RTU.  The id
        // outlives its QP: every path destroys the QP first (`destroy_now`,
        // `destroy_qp`, the failure below).  COMM_EST needs the QP in RTR,
        // which the CM moves it to only once the IB CM id exists; the CM
        // destroys that only with the id, or when a connect fails before.
        let comm_est = (!iwarp && self.qp_type == QpType::Rc).then(|| {
            // SAFETY: `notify_comm_est` only queues work; the id and its IB
            // CM id outlive every QP event (above).
            unsafe { CommEstNotify::new(notify_comm_est, self.as_ptr().cast()) }
        });
        let queues = QpQueues {
            send_cq,
            recv_cq,
            srq,
        };
        let (qp, mut attr) = Qp::prepare(&dev, pd, queues, caps, self.qp_type, comm_est)?;
        if iwarp && self.request_param.is_some() {
            qp.hold_sends_until_first_message();
        }
        // SAFETY: The id is live, locked and bound to `dev`, the device of
        // `pd` and of the CQs in `attr` (checked by `prepare`), which `qp`
        // keeps alive.
        to_result(unsafe { bindings::rdma_create_qp(self.as_ptr(), pd.as_ptr(), &mut attr) })?;
        // SAFETY: `rdma_create_qp` succeeded and set the id's `qp`; only
        // this slot's holder changes it.
        let raw = unsafe { (*self.as_ptr()).qp };
        let Some(raw) = NonNull::new(raw) else {
            return Err(EINVAL);
        };
        // SAFETY: `raw` was created from `attr`; the slot keeps `qp` until
        // the id's destruction or `destroy_qp` shuts it down and only then
        // destroys it (or it is destroyed below, never recorded).
        if let Err(e) = unsafe { qp.set_created(raw) } {
            // SAFETY: The id is live and locked; its QP was just created,
            // nothing was posted to it and nobody else knows it.
            unsafe { bindings::rdma_destroy_qp(self.as_ptr()) };
            return Err(e);
        }
        *slot = QpSlot::Live(qp.clone());
        Ok(qp)
    }

    /// Drains and destroys the id's QP (`rdma_destroy_qp`), e.g. after a
    /// connect or accept that failed: the id can get a new one once this
    /// returned.  `ENOENT` if it has none, `EINVAL` on an id not adopted
    /// yet.  The teardown runs the QP's flushed completions; a handler of
    /// a [`super::verbs::PollContext::Direct`] CQ runs in this task and
    /// may reach the id again (a nested [`CmId::with_lock`]): there a
    /// `create_qp` or a second `destroy_qp` fails with `EBUSY`.  From a
    /// completion handler that [`Cq::poll`] runs on one of the QP's CQs
    /// (inside `with_lock` or a callback of the id): `EDEADLK`, since the
    /// teardown waits until that poll returned.
    ///
    /// From any completion handler (a nested `with_lock` in a handler that
    /// [`Cq::poll`] or a teardown runs): `EDEADLK`, since the teardown may
    /// wait for another task's poll, which may wait for this one.  While
    /// a [`CmId::disconnect`] or [`CmId::listen`] of the id runs (from a
    /// callback): `EBUSY`, since the disconnect may use the QP.
    ///
    /// On iWARP, from a connect or accept that succeeded until the
    /// connection's `Disconnected` (or the connect's `Rejected`,
    /// `Unreachable` or `ConnectError`) was reported: `EBUSY`.  The
    /// iWARP CM holds the QP until then and the driver's destroy waits
    /// for that reference, which the CM drops in its event work, behind
    /// this id's pending events, whose upcalls need the handler mutex held
    /// here (from the id's own `Established` callback, the very work that
    /// would drop it).  Disconnect and destroy the QP once `Disconnected`
    /// came, or drop the id, whose teardown destroys the QP without the
    /// mutex.  After a `DeviceRemoval` the CM reports neither: only the
    /// id's drop destroys the QP.
    pub fn destroy_qp(&self) -> Result {
        let slot = self.qp_slot.ok_or(EINVAL)?;
        if in_completion_handler() {
            return Err(EDEADLK);
        }
        if self
            .iwarp_cm_holds_qp
            .is_some_and(|holds| holds.load(Ordering::Acquire))
        {
            return Err(EBUSY);
        }
        let _excluded = self.exclude_unlocked_calls()?;
        let qp = {
            let mut slot = slot.lock();
            let qp = match &*slot {
                QpSlot::Live(qp) => qp.clone(),
                QpSlot::TearingDown => return Err(EBUSY),
                QpSlot::Empty | QpSlot::Dying => return Err(ENOENT),
            };
            *slot = QpSlot::TearingDown;
            qp
        };
        if qp.shutdown() {
            // SAFETY: The id is live and locked; its QP is shut down and
            // nothing posts to it any more.  It is the QP `create_qp` made:
            // while the slot says `TearingDown`, no `create_qp` replaces
            // the id's `qp`, nested in this teardown's handlers or not.
            unsafe { bindings::rdma_destroy_qp(self.as_ptr()) };
            qp.reclaim();
        }
        // Only this call leaves `TearingDown`; the id's destruction, which
        // marks the slot `Dying`, waits for the handler mutex held here.
        *slot.lock() = QpSlot::Empty;
        Ok(())
    }
}

/// Tells the CM that a message arrived on the QP of `id` before its
/// establishment (`IB_EVENT_COMM_EST`): the IB CM then completes the
/// connection as if the RTU had come, which stops its REP retries and
/// reports ESTABLISHED.  Nothing on iWARP.
///
/// # Safety
///
/// `id` is a live `rdma_cm_id` with a QP.
unsafe fn notify_comm_est(id: *mut core::ffi::c_void) {
    // SAFETY: `id` is live; `rdma_notify` reads the id and the IB CM's
    // `cm_establish` allocates with GFP_ATOMIC and queues work under
    // spinlocks: callable in any context, as the QP event handlers of
    // nvmet and rtrs do.  An id already established gets EISCONN, ignored.
    let _ = unsafe { bindings::rdma_notify(id.cast(), bindings::ib_event_type_IB_EVENT_COMM_EST) };
}

fn sockaddr_of(storage: &bindings::__kernel_sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: `__kernel_sockaddr_storage` is 128 bytes, 8-aligned, like
    // `SockaddrBuf`; any bytes are a valid `SockaddrBuf`.
    let bytes = unsafe { &*core::ptr::from_ref(storage).cast::<SockaddrBuf>() };
    SocketAddr::from_sockaddr(&bytes.0).ok().flatten()
}

/// The C event handler: dispatches to `H` and implements take-once
/// ownership of connection requests.
///
/// # Safety
///
/// Called by the CM only, for ids created by [`CmId::new`] with `H` (or
/// adopted with `H`, or new ids of such a listener, which carry its
/// context), with the handler mutex of `raw_id` held.
unsafe extern "C" fn handler_trampoline<H: Handler>(
    raw_id: *mut bindings::rdma_cm_id,
    raw_event: *mut bindings::rdma_cm_event,
) -> ffi::c_int {
    // SAFETY: `raw_id` is live during the callback; its context is an
    // `IdInner<H>` (the listener's, for a connection request) kept alive by
    // the reference the context pointer owns.
    let inner = unsafe { &*(*raw_id).context.cast::<IdInner<H>>() };
    // SAFETY: `raw_id` is live; its QP type and port space are fixed when
    // it is made.
    let (raw_qp_type, raw_ps) = unsafe { ((*raw_id).qp_type, (*raw_id).ps) };
    // The id's own: a new id of a listener has the listener's, except on
    // iWARP, whose CM makes every new id RC in the TCP port space (refused
    // below when the listener is UD).
    let qp_type = QpType::from_raw(raw_qp_type).unwrap_or(inner.qp_type);
    let ps = PortSpace::from_raw(raw_ps).unwrap_or(inner.ps);
    // SAFETY: `raw_id` is live; its device, once bound, is held by the id
    // until it is destroyed, also while the device is being removed (its
    // DEVICE_REMOVAL event runs before the CM lets go).
    let transport = unsafe {
        let raw_dev = (*raw_id).device;
        (!raw_dev.is_null()).then(|| Transport::of_raw(raw_dev))
    };
    // SAFETY: `raw_event` is valid for the callback, which outlives `event`;
    // `qp_type` is the type of the id it was delivered to, `transport` that
    // of its device.
    let Some(event) = (unsafe { Event::from_raw(raw_event, qp_type == QpType::Ud, transport) })
    else {
        // A value 7.3 does not define: a newer CM than this layer knows.
        // Its meaning (and whether it carries a new id) is unknown, so it
        // is not passed on; returning 0 keeps the id, as for any event.
        // SAFETY: `raw_event` is valid for the callback.
        let raw_type = unsafe { (*raw_event).event };
        kernel::pr_warn_once!("CM event {raw_type} is unknown to this layer: dropped\n");
        return 0;
    };
    let _mark = CallbackMark::enter();
    if matches!(
        event.kind(),
        EventType::Disconnected
            | EventType::Rejected
            | EventType::Unreachable
            | EventType::ConnectError
    ) {
        // The iWARP CM dropped its reference on the QP before this upcall
        // (`cm_close_handler`, `cm_conn_rep_handler`).
        inner.iwarp_cm_holds_qp.store(false, Ordering::Release);
    }
    if event.kind() != EventType::ConnectRequest {
        // Events of one id are serialised by its handler mutex: nothing
        // else sets the marker meanwhile.
        inner.handler_task.store(current_task(), Ordering::Release);
        // SAFETY: The CM holds this id's handler mutex during the callback.
        let id = unsafe { inner.locked(raw_id) };
        inner.handler.event(&id, &event);
        // After the handler: what it derives from the event (a UD peer,
        // say) is in place when a blocking call wakes.
        if let Some(waiter) = inner.handler.waiter() {
            waiter.record(&event);
        }
        inner.handler_task.store(ptr::null_mut(), Ordering::Release);
        return 0;
    }
    if qp_type != inner.qp_type {
        // An iWARP connection (RC, TCP port space) reaching a UD listener:
        // the iWARP CM listens on the TCP port of a wildcard UDP listener
        // too.  Nothing a UD service can accept; non-zero makes the CM
        // destroy the new id and refuse the peer.
        return 1;
    }
    // A connection request: the listener's own mutex may not be held (a
    // wildcard listener's requests arrive under one of the CM's internal
    // per-device listeners), and requests from two devices may run at
    // once, so the listener's marker is left alone and no locked view of
    // the listener is made.
    let adopted = core::cell::Cell::new(false);
    let request_param = event.conn_param().map(|v| v.to_owned()).unwrap_or_default();
    let request = ConnectRequest {
        // SAFETY: The CM passes a live id.
        raw: unsafe { NonNull::new_unchecked(raw_id) },
        ps,
        qp_type,
        adopted: &adopted,
        request_param,
        _h: PhantomData,
    };
    inner.handler.connect_request(request, &event);
    if adopted.get() {
        // SAFETY: `adopt` replaced the context with the new id's own.
        let new_inner = unsafe { &*(*raw_id).context.cast::<IdInner<H>>() };
        // The callback is over: the new id's mutex is released on return.
        new_inner
            .handler_task
            .store(ptr::null_mut(), Ordering::Release);
        0
    } else {
        // Non-zero makes the CM destroy `raw_id`: nobody adopted it.
        1
    }
}
