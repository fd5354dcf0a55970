// SPDX-License-Identifier: GPL-2.0

//! Identifiers ([`CmId`]), their [`Handler`] and the C event trampoline
//! that calls it, connection requests ([`ConnectRequest`]), and an id's
//! destruction.

use super::{
    groups::Groups,
    locked::{to_result, IdState, LockedId},
    multicast,
    port_space::PortSpace,
    qp_slot::{destroy_id_qp, QpSlot},
};
use crate::rdma::{
    addr::SocketAddr,
    bindings,
    callback::{current_task, in_any_callback, CallbackMark},
    conn_param::ConnParam,
    deferred::DeferredDestroy,
    device::Transport,
    event::{Event, EventType},
    net::NetNs,
    owner::{CallbackTarget, Owner},
    synchronous::{Begin, EventWaiter, OwnedEvent, SyncOp, SyncResult},
    verbs::QpType,
};
use core::{
    marker::PhantomData,
    ptr::{self, NonNull},
    sync::atomic::{AtomicBool, AtomicPtr, Ordering},
};
use kernel::{
    ffi, new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::Delta,
    types::ForeignOwnable,
};

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
    /// The multicast groups joined (UD ids).
    #[pin]
    groups: Mutex<Groups>,
    handler: H,
    /// Counted on its owner while the C side may call into the module
    /// through this object (see [`CallbackTarget`]).
    target: CallbackTarget,
}

impl<H: Handler> IdInner<H> {
    fn new(
        owner: &Owner,
        raw: *mut bindings::rdma_cm_id,
        ps: PortSpace,
        qp_type: QpType,
        handler_task: *mut bindings::task_struct,
        request_param: Option<ConnParam>,
        handler: H,
    ) -> Result<Arc<Self>> {
        let target = CallbackTarget::new(owner)?;
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
                groups <- new_mutex!(Groups::new()),
                handler,
                target,
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
        let state = IdState {
            answered: &self.answered,
            iwarp_cm_holds_qp: &self.iwarp_cm_holds_qp,
            qp_slot: &self.qp,
            unlocked_call: &self.unlocked_call,
            groups: &self.groups,
        };
        // SAFETY: By the safety requirements `raw` is live (so non-null),
        // this object's (its port space and QP type are these), and its
        // handler mutex is held for `'a`; the state is this `CmId`'s.
        unsafe {
            LockedId::new(
                NonNull::new_unchecked(raw),
                self.ps,
                self.qp_type,
                self.request_param,
                Some(state),
                self.target.owner(),
            )
        }
    }
}

/// An owned RDMA CM identifier with the event handler `H`.
///
/// # Examples
///
/// A listener that accepts every request with a QP of the request's own
/// (the echo sample, `samples/rdma_cm_rs_echo.rs`, is the whole of it:
/// echoing, keeping the connections, ending them at unload):
///
/// ```
/// use kernel::prelude::*;
/// use kernel::rdma::{
///     getaddrinfo::{getaddrinfo, Hints, RAI_PASSIVE},
///     CmId, CompletionHandler, ConnectRequest, Cq, Event, Handler, LockedId, NetNs, Owner, Pd,
///     QpCaps, RecvBuffer, SendBuffer,
/// };
///
/// struct Completions;
///
/// impl CompletionHandler for Completions {
///     fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
///         // The buffer is the consumer's again: read it, post it again.
///         let _ = (buf, result);
///     }
///
///     fn send_done(&self, _buf: SendBuffer, _result: Result) {}
/// }
///
/// struct Listener;
///
/// impl Handler for Listener {
///     fn event(&self, _id: &LockedId<'_>, _event: &Event<'_>) {}
///
///     fn connect_request(&self, request: ConnectRequest<'_, Self>, _event: &Event<'_>) {
///         let Ok(id) = request.adopt(Listener) else {
///             return;
///         };
///         // The CM holds the new id's handler mutex: `with_lock` runs inside it.
///         let accepted = id.with_lock(|l| {
///             let dev = l.device()?;
///             let pd = Pd::alloc(l.owner(), &dev)?;
///             let caps = QpCaps {
///                 max_send_wr: 4,
///                 max_recv_wr: 4,
///                 ..QpCaps::default()
///             };
///             let cq = Cq::alloc(l.owner(), &dev, caps.cq_entries()?, Completions)?;
///             let qp = l.create_qp(&pd, &cq, caps)?;
///             qp.post_recv(RecvBuffer::new(&pd, 4096)?)?;
///             l.accept(Some(&l.request_accept_param()?))
///         });
///         // A real ULP keeps `id` where its teardown finds it; dropped here,
///         // inside the callback, its destruction is deferred.
///         let _ = (id, accepted);
///     }
/// }
///
/// fn listen(owner: &Owner) -> Result<CmId<Listener>> {
///     let passive = Hints { flags: RAI_PASSIVE, ..Hints::default() };
///     let ai = getaddrinfo(None, Some(b"7471"), &passive)?;
///     let listener = CmId::new(owner, Listener, &NetNs::init(), ai.port_space, ai.qp_type)?;
///     let addr = ai.src.ok_or(EINVAL)?;
///     listener.with_lock(|l| l.bind(&addr))?;
///     listener.listen(64)?;
///     Ok(listener)
/// }
/// ```
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
    /// Creates an id (`rdma_create_id`) of `owner` in `ns`, with port space
    /// `ps` and QP type `qp_type`.  `EINVAL` if the QP type does not fit the
    /// port space; `ENXIO` once the owner's [`ModuleOwner`] is dropping.
    /// The id takes its own reference on the namespace.
    ///
    /// [`ModuleOwner`]: crate::rdma::ModuleOwner
    pub fn new(
        owner: &Owner,
        handler: H,
        ns: &NetNs,
        ps: PortSpace,
        qp_type: QpType,
    ) -> Result<Self> {
        if !ps.carries(qp_type) {
            return Err(EINVAL);
        }
        let inner = IdInner::new(
            owner,
            ptr::null_mut(),
            ps,
            qp_type,
            ptr::null_mut(),
            None,
            handler,
        )?;
        let context = inner.clone().into_foreign();
        // The caller's name is the owner's, a static string of the module,
        // which outlives the id: the module stays while the id's target
        // counts.
        // SAFETY: `handler_trampoline::<H>` matches `rdma_cm_event_handler`
        // and reads `context` as the `Arc<IdInner<H>>` it is; `ns` is live
        // (the call takes its own reference); the name outlives the id.
        let raw = unsafe {
            bindings::__rdma_create_kernel_id(
                ns.as_ptr(),
                Some(handler_trampoline::<H>),
                context,
                ps as u32,
                qp_type as u32,
                owner.name().as_char_ptr(),
            )
        };
        if let Err(e) = kernel::error::from_err_ptr(raw) {
            // SAFETY: Creation failed, the CM holds no copy of `context`,
            // which `into_foreign` made above.
            drop(unsafe { Arc::<IdInner<H>>::from_foreign(context) });
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

    /// The owner the id was made for (for an adopted id, its listener's).
    pub fn owner(&self) -> &Owner {
        self.inner.target.owner()
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
    /// dropped, and a slot comes back as soon as the handler ran), and an
    /// iWARP driver may pass it to its TCP `listen()`.  0 asks for the CM's default:
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
    /// from inside any callback of the layer or `with_lock` (`EDEADLK`):
    /// on iWARP, `iw_cm_disconnect` waits until the reply to a pending
    /// connect has been handled, and that reply reaches this id's handler
    /// only once it can take the handler mutex.
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

    /// Leaves a multicast group the id joined
    /// ([`LockedId::join_multicast`]), `rdma_leave_multicast`, and
    /// detaches the id's QP from it: no datagram of the group reaches the
    /// QP after this returns, and no event of the join either (one still
    /// queued or running is waited for).  `ENOENT` if the id did not join
    /// the group, `EINVAL` on an RC id.
    ///
    /// Called without the id's handler mutex, since the wait is for a
    /// callback that takes it, so not from inside any callback of the
    /// layer or `with_lock` (`EDEADLK`).
    pub fn leave_multicast(&self, group: &SocketAddr) -> Result {
        if self.inner.qp_type != QpType::Ud {
            return Err(EINVAL);
        }
        if in_any_callback() {
            return Err(EDEADLK);
        }
        let _calls = self.inner.calls.lock();
        // A join made meanwhile from a callback of the id fails with EBUSY.
        let _unlocked = self.inner.unlocked_call.lock();
        // SAFETY: The id is live (type invariants), not destroyed while
        // `self` is borrowed, with these groups and QP slot; this task is
        // in no callback nor `with_lock` (so holds no handler mutex); the
        // other leaves of the id wait for `calls`.
        unsafe { multicast::leave(self.inner.raw(), &self.inner.groups, &self.inner.qp, group) }
    }
}

/// Synchronous operation (`rdma_create_id(3)` without an event channel):
/// each call starts an operation and blocks until the event that ends it,
/// which it returns with its meaning ([`crate::rdma::SyncOutcome`]); a call no event
/// ended fails with its errno ([`crate::rdma::synchronous`] has the rules: one call at a time,
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
        if let Some(raw_qp) = qp.shutdown() {
            // SAFETY: The id is live, of this QP type, its QP shut down;
            // nothing posts to it any more (`shutdown` took it), and no
            // callback hands it to the CM (the slot is `Dying`).
            match unsafe { destroy_id_qp(raw, inner.qp_type, raw_qp) } {
                Ok(()) => qp.reclaim(),
                // Still live: its events may still reach the object.
                Err(_) => core::mem::forget(qp),
            }
        }
    }
    // SAFETY: The id is live; `rdma_destroy_id` waits for a running
    // callback, and none starts after it.  Then the CM no longer uses
    // `context` (an `Arc<IdInner<H>>`'s `into_foreign`), whose reference
    // is released.
    unsafe {
        let context = (*raw).context;
        bindings::rdma_destroy_id(raw);
        drop(Arc::<IdInner<H>>::from_foreign(context));
    }
}

impl<H: Handler> Drop for CmId<H> {
    fn drop(&mut self) {
        if self.inner.in_own_handler() || in_any_callback() {
            // `rdma_destroy_id` from the id's own callback deadlocks; from
            // another id's callback it nests two handler mutexes of one
            // lock class; from a completion it may drain its own CQ.
            let victim: Arc<dyn DeferredDestroy> = self.inner.clone();
            let owner = self.inner.target.owner();
            if owner.defer(victim).is_err() {
                // No memory: destroying here could deadlock, so the id
                // leaks, loudly.  The C id keeps calling this module's
                // trampoline: the module must never go.
                pr_err!("cannot defer the destruction of a cm_id, leaking it\n");
                core::mem::forget(self.inner.clone());
                owner.pin_module();
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
    /// The listener's.
    owner: &'a Owner,
    _h: PhantomData<H>,
}

impl<'a, H: Handler> ConnectRequest<'a, H> {
    /// The new id, locked for the duration of the callback: reject or query
    /// it here.  Accepting needs the id's QP, which only an adopted id has.
    pub fn id(&self) -> LockedId<'_> {
        // No `CmId` yet: rejecting here ends the request (the id is
        // destroyed when the callback returns, unless adopted), a QP needs
        // a `CmId` (adopt the id first), and no call is made without the
        // handler mutex.
        // SAFETY: The CM passed the live new id, of these port space and QP
        // type, and holds its handler mutex during the callback, which
        // `self` does not outlive.
        unsafe {
            LockedId::new(
                self.raw,
                self.ps,
                self.qp_type,
                Some(self.request_param),
                None,
                self.owner,
            )
        }
    }

    /// Takes ownership of the new id with its own handler; the id has its
    /// listener's owner.  `ENXIO` once that owner's `ModuleOwner` is
    /// dropping (see [`CmId::new`]).
    pub fn adopt(self, handler: H) -> Result<CmId<H>> {
        // The CM holds this id's handler mutex until the listener's
        // callback returns: treat that as being in its handler.
        let inner = IdInner::new(
            self.owner,
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
        unsafe { (*self.raw.as_ptr()).context = inner.clone().into_foreign() };
        self.adopted.set(true);
        Ok(CmId { inner })
    }
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
    // `Arc<IdInner<H>>`'s `into_foreign` (the listener's, for a connection
    // request), whose reference the context keeps until the id's
    // destruction, which waits for this callback.
    let inner = unsafe { Arc::<IdInner<H>>::borrow((*raw_id).context) };
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
        if matches!(
            event.kind(),
            EventType::MulticastJoin | EventType::MulticastError
        ) {
            // The QP receives from a group before its handler hears of it.
            id.note_multicast_event(&event);
        }
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
        owner: inner.target.owner(),
        _h: PhantomData,
    };
    inner.handler.connect_request(request, &event);
    if adopted.get() {
        // SAFETY: `adopt` replaced the context with the new id's own, an
        // `Arc<IdInner<H>>`'s `into_foreign`, whose reference the context
        // keeps until the new id's destruction (not before this returns).
        let new_inner = unsafe { Arc::<IdInner<H>>::borrow((*raw_id).context) };
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
