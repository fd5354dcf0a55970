// SPDX-License-Identifier: GPL-2.0

//! Communication identifiers (`struct rdma_cm_id`).
//!
//! # Ownership and locking
//!
//! * A [`CmId`] owns one `rdma_cm_id`.  Dropping it destroys the id
//!   (`rdma_destroy_id`): after the drop returns no callback runs any more.
//!   There is no other way to destroy an id, so double destroy and use after
//!   destroy do not compile.
//! * Every call into the CM on an id runs with the id's `handler_mutex` held:
//!   inside a callback the CM holds it, and [`CmId::with_lock`] takes it
//!   (`rdma_lock_handler`) outside.  Both hand out a [`LockedId`], the only
//!   type with CM operations on it.  This serialises the id's operations
//!   with each other and with its events ("the rdma_cm must be used single
//!   threaded", ucma.c), makes `rdma_accept`'s lockdep assertion hold by
//!   construction, and lets [`LockedId::connect`] use `rdma_connect_locked`
//!   everywhere.
//! * The handler gets `&LockedId`, never the owner: it cannot destroy its own
//!   id.  If a consumer drops a [`CmId`] from inside any of this module's
//!   callbacks (the id's own: the deadlock `rdma_destroy_id` documents;
//!   another id's: two handler mutexes of one lock class; a completion: a
//!   QP drain behind the running completion), the destruction is deferred
//!   to a workqueue instead.  [`CmId::with_lock`] from inside the id's own
//!   callback runs without taking the mutex the CM already holds.
//! * A connection request hands the listener's handler a [`ConnectRequest`]
//!   that owns the new id.  [`ConnectRequest::adopt`] turns it into a
//!   [`CmId`] with its own handler; a request that is dropped unadopted makes
//!   the callback return non-zero, so the CM destroys the new id (take-once
//!   ownership: the id is destroyed by exactly one party).
//! * DEVICE_REMOVAL: the CM waits for every id on the device to be destroyed
//!   before the device goes.  Consumers drop their ids from process context
//!   on that event (e.g. [`CmId::destroy_deferred`]).

use super::{
    addr::{SockaddrBuf, SocketAddr},
    bindings,
    conn_param::{ConnParam, PrivateDataUse, MAX_RETRY_COUNT},
    event::{Event, EventType},
    verbs::{CompletionHandler, Cq, Pd, Qp, QpCaps, QpTeardown},
};
use core::{
    marker::PhantomData,
    ptr::{self, NonNull},
    sync::atomic::{AtomicPtr, AtomicUsize, Ordering},
};
use kernel::{
    ffi,
    prelude::*,
    sync::{Arc, SetOnce},
    time::Delta,
    workqueue,
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

/// QP types the CM can connect.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected.
    Rc = bindings::ib_qp_type_IB_QPT_RC,
    /// Unreliable datagram.
    Ud = bindings::ib_qp_type_IB_QPT_UD,
}

impl QpType {
    /// The QP type of a raw value.
    pub fn from_raw(raw: u32) -> Result<Self> {
        match raw {
            bindings::ib_qp_type_IB_QPT_RC => Ok(Self::Rc),
            bindings::ib_qp_type_IB_QPT_UD => Ok(Self::Ud),
            _ => Err(EINVAL),
        }
    }

    /// Whether `ps` can carry this QP type (`rdma_create_id(3)`).
    pub fn allowed_in(self, ps: PortSpace) -> bool {
        matches!(
            (ps, self),
            (PortSpace::Tcp, QpType::Rc)
                | (PortSpace::Udp, QpType::Ud)
                | (PortSpace::Ipoib, QpType::Ud)
                | (PortSpace::Ib, _)
        )
    }
}

/// A counted reference to a network namespace (`get_net`/`put_net`).
///
/// An id lives in the namespace it was created in: addresses are resolved
/// and bound among that namespace's interfaces.  Holding a `NetNs` lets a
/// consumer fix the namespace once, e.g. when a file is opened (as sockets
/// do), and create ids from any task later.
///
/// # Invariants
///
/// `raw` is a live namespace on which this object owns one reference.
pub struct NetNs {
    raw: NonNull<bindings::net>,
}

// SAFETY: A namespace reference may be used and dropped on any thread.
unsafe impl Send for NetNs {}
// SAFETY: `&NetNs` only reads the pointer.
unsafe impl Sync for NetNs {}

impl NetNs {
    /// The initial namespace (`init_net`).
    pub fn init() -> Self {
        // SAFETY: `init_net` is static; `get_net` takes a reference on it.
        let raw = unsafe { bindings::rdma_cm_rs_get_net(bindings::rdma_cm_rs_init_net()) };
        // INVARIANT: Referenced just above; `init_net` is never null.
        Self {
            // SAFETY: See above.
            raw: unsafe { NonNull::new_unchecked(raw) },
        }
    }

    /// The calling task's namespace.
    pub fn current() -> Self {
        // SAFETY: Takes a reference on the current task's namespace, which
        // every task in process context has.
        let raw = unsafe { bindings::rdma_cm_rs_get_current_net() };
        // INVARIANT: Referenced just above.
        Self {
            // SAFETY: A task's namespace is never null.
            raw: unsafe { NonNull::new_unchecked(raw) },
        }
    }

    /// Whether this is the initial namespace.
    pub fn is_init(&self) -> bool {
        // SAFETY: Returns the address of the static `init_net`.
        self.raw.as_ptr() == unsafe { bindings::rdma_cm_rs_init_net() }
    }

    fn as_ptr(&self) -> *mut bindings::net {
        self.raw.as_ptr()
    }
}

impl Clone for NetNs {
    fn clone(&self) -> Self {
        // SAFETY: The namespace is live (type invariants); one more reference.
        unsafe { bindings::rdma_cm_rs_get_net(self.raw.as_ptr()) };
        // INVARIANT: The new object owns the reference just taken.
        Self { raw: self.raw }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // SAFETY: Drops the reference this object owns.
        unsafe { bindings::rdma_cm_rs_put_net(self.raw.as_ptr()) };
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
    /// `handler_mutex` is held as well): adopt it to keep it, accept or
    /// reject it through [`ConnectRequest::id`]; dropping it unadopted makes
    /// the CM destroy the new id (the peer's connect fails).
    fn connect_request(
        &self,
        listener: &LockedId<'_>,
        request: ConnectRequest<'_, Self>,
        event: &Event<'_>,
    ) {
        // Dropping the request unadopted makes the CM destroy the new id.
        let _ = (listener, request, event);
    }
}

/// Destructions deferred to the workqueue and not finished yet.
static DEFERRED_DESTROYS: AtomicUsize = AtomicUsize::new(0);

/// Waits (up to `timeout_ms`) until every deferred destruction finished.
///
/// Module exit calls this so that no work item outlives the module's code.
pub fn wait_for_deferred_destroys(timeout_ms: u32) -> Result {
    for _ in 0..timeout_ms {
        if DEFERRED_DESTROYS.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        kernel::time::delay::fsleep(Delta::from_millis(1));
    }
    Err(ETIMEDOUT)
}

/// Tasks running one of this module's callbacks (CM events, completions).
///
/// Destroying an id from any such callback is a deadlock or a lockdep
/// report waiting to happen: `rdma_destroy_id` takes the id's handler mutex
/// (same lock class as the one the CM holds during an event) and a QP's
/// teardown drains completions that may be queued behind the running one.
/// [`CmId`]'s `Drop` therefore defers the destruction to a workqueue
/// whenever the current task is listed here.  The table is small and fixed;
/// if it is ever full, `CALLBACKS_UNLISTED` makes every drop defer until the
/// unlisted callbacks return, which is always safe.
static CALLBACK_TASKS: [AtomicPtr<bindings::task_struct>; 64] =
    [const { AtomicPtr::new(ptr::null_mut()) }; 64];
static CALLBACKS_UNLISTED: AtomicUsize = AtomicUsize::new(0);

/// Lists the current task in [`CALLBACK_TASKS`] while it lives.
pub(crate) struct CallbackMark(Option<usize>);

impl CallbackMark {
    /// Marks the current task as running a callback.
    pub(crate) fn enter() -> Self {
        let me = current_task();
        for (i, slot) in CALLBACK_TASKS.iter().enumerate() {
            if slot
                .compare_exchange(ptr::null_mut(), me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Self(Some(i));
            }
        }
        CALLBACKS_UNLISTED.fetch_add(1, Ordering::AcqRel);
        Self(None)
    }
}

impl Drop for CallbackMark {
    fn drop(&mut self) {
        match self.0 {
            Some(i) => CALLBACK_TASKS[i].store(ptr::null_mut(), Ordering::Release),
            None => {
                CALLBACKS_UNLISTED.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// Whether the current task may be inside one of this module's callbacks.
fn in_any_callback() -> bool {
    if CALLBACKS_UNLISTED.load(Ordering::Acquire) != 0 {
        return true;
    }
    let me = current_task();
    CALLBACK_TASKS
        .iter()
        .any(|slot| slot.load(Ordering::Acquire) == me)
}

fn current_task() -> *mut bindings::task_struct {
    // SAFETY: Always safe to call in process context.
    unsafe { bindings::rdma_cm_rs_current_task() }
}

/// State shared by the owner and the C side of one id.
///
/// # Invariants
///
/// Once [`IdInner::set_raw`] ran, `raw` points to a live `rdma_cm_id` whose
/// `context` is this object, until the id is destroyed; one strong reference
/// to the enclosing `Arc` is owned by that `context` pointer.
struct IdInner<H: Handler> {
    raw: AtomicPtr<bindings::rdma_cm_id>,
    /// The task running this id's callback, or null.
    handler_task: AtomicPtr<bindings::task_struct>,
    /// Accept parameters derived from the connection request, for ids
    /// created by one (`rdma_accept(3)` with no parameters).
    request_param: Option<ConnParam>,
    /// The id's QP, torn down before the id is destroyed.
    qp: QpSlot,
    handler: H,
}

type QpSlot = SetOnce<Arc<dyn QpTeardown>>;

impl<H: Handler> IdInner<H> {
    fn raw(&self) -> *mut bindings::rdma_cm_id {
        self.raw.load(Ordering::Acquire)
    }

    fn in_own_handler(&self) -> bool {
        self.handler_task.load(Ordering::Acquire) == current_task()
    }

    /// Marks the current task as running this id's callback.
    fn enter(&self) -> *mut bindings::task_struct {
        self.handler_task.swap(current_task(), Ordering::AcqRel)
    }

    fn leave(&self, previous: *mut bindings::task_struct) {
        self.handler_task.store(previous, Ordering::Release);
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
// SAFETY: As above: `&CmId` only gives access to `with_lock`, which serialises.
unsafe impl<H: Handler> Sync for CmId<H> {}

impl<H: Handler> CmId<H> {
    /// Creates an id (`rdma_create_id`) in `ns`, with port space `ps` and QP
    /// type `qp_type`.  `EINVAL` if the QP type does not fit the port space.
    /// The id takes its own reference on the namespace.
    pub fn new(handler: H, ns: &NetNs, ps: PortSpace, qp_type: QpType) -> Result<Self> {
        if !qp_type.allowed_in(ps) {
            return Err(EINVAL);
        }
        let inner = Arc::new(
            IdInner {
                raw: AtomicPtr::new(ptr::null_mut()),
                handler_task: AtomicPtr::new(ptr::null_mut()),
                request_param: None,
                qp: SetOnce::new(),
                handler,
            },
            GFP_KERNEL,
        )?;
        let context = Arc::into_raw(inner.clone());
        // SAFETY: `handler_trampoline::<H>` matches `rdma_cm_event_handler`
        // and interprets `context` as the `IdInner<H>` it is.  `ns` is live,
        // and the CM takes its own reference on it.
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
    /// already holds the mutex, `f` runs directly instead of deadlocking.
    pub fn with_lock<R>(&self, f: impl FnOnce(&LockedId<'_>) -> R) -> R {
        let raw = self.inner.raw();
        // INVARIANT: By the type invariants `raw` is live; the mutex is held
        // either by this task's callback or by the lock taken below.
        let locked = LockedId {
            // SAFETY: A live id is non-null.
            raw: unsafe { NonNull::new_unchecked(raw) },
            request_param: self.inner.request_param,
            qp_slot: Some(&self.inner.qp),
            _lock: PhantomData,
        };
        if self.inner.in_own_handler() {
            return f(&locked);
        }
        // SAFETY: `raw` is live.
        unsafe { bindings::rdma_lock_handler(raw) };
        let result = f(&locked);
        // SAFETY: Taken just above.
        unsafe { bindings::rdma_unlock_handler(raw) };
        result
    }

    /// Destroys the id from a workqueue: for contexts that must not block
    /// on the CM (callbacks of other ids, DEVICE_REMOVAL handling).
    pub fn destroy_deferred(self) -> Result {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again: the inner `Arc` moves out.
        let inner = unsafe { ptr::read(&this.inner) };
        spawn_destroy(inner)
    }
}

/// The queue of deferred destructions: unbound and for long work, since
/// `rdma_destroy_id` waits for the id's handlers and its device.  (7.3
/// deprecates `system_wq`, the queue `workqueue::system()` returns.)
fn destroy_queue() -> &'static workqueue::Queue {
    // SAFETY: `system_dfl_long_wq` is a C global, set up before any module
    // loads and never freed.
    unsafe { workqueue::Queue::from_raw(bindings::system_dfl_long_wq) }
}

/// An id whose destruction was deferred, with its handler type erased.
trait DeferredDestroy: Send + Sync {
    fn destroy(&self);
}

impl<H: Handler> DeferredDestroy for IdInner<H> {
    fn destroy(&self) {
        destroy_now(self);
    }
}

/// The work item of a deferred destruction.
///
/// Not generic on purpose: `new_work!` makes one lockdep class (a static
/// key and a name) per call site, and a generic call site would give every
/// monomorphization its own copy of the name for the one shared key, which
/// lockdep reports ("found a different class with the same key").  7.3's
/// `Queue::try_spawn` has exactly that problem across modules, so it is not
/// used.
#[pin_data]
struct DestroyWork {
    #[pin]
    work: workqueue::Work<DestroyWork>,
    id: Arc<dyn DeferredDestroy>,
}

kernel::impl_has_work! {
    impl HasWork<Self> for DestroyWork { self.work }
}

impl DestroyWork {
    fn new(id: Arc<dyn DeferredDestroy>) -> impl PinInit<Self> {
        pin_init!(Self {
            work <- kernel::new_work!("rdma_cm_rs::destroy_id"),
            id,
        })
    }
}

impl workqueue::WorkItem for DestroyWork {
    type Pointer = Pin<KBox<Self>>;

    fn run(this: Pin<KBox<Self>>) {
        this.id.destroy();
        drop(this);
        DEFERRED_DESTROYS.fetch_sub(1, Ordering::AcqRel);
    }
}

fn spawn_destroy<H: Handler>(inner: Arc<IdInner<H>>) -> Result {
    DEFERRED_DESTROYS.fetch_add(1, Ordering::AcqRel);
    let id: Arc<dyn DeferredDestroy> = inner.clone();
    match KBox::pin_init(DestroyWork::new(id), GFP_ATOMIC) {
        Ok(work) => {
            // A fresh box cannot be queued already: enqueueing cannot fail.
            destroy_queue().enqueue(work);
            Ok(())
        }
        Err(_) => {
            // No memory for the work item: destroy synchronously, which is
            // only wrong inside a callback (then the id leaks, loudly).
            DEFERRED_DESTROYS.fetch_sub(1, Ordering::AcqRel);
            if inner.in_own_handler() || in_any_callback() {
                pr_err!("rdma_cm_rs: cannot defer id destruction, leaking it\n");
                core::mem::forget(inner);
                return Err(ENOMEM);
            }
            destroy_now(&inner);
            Ok(())
        }
    }
}

/// Destroys the QP (if any) and the id, then drops the C side's reference.
fn destroy_now<H: Handler>(inner: &IdInner<H>) {
    let raw = inner.raw.swap(ptr::null_mut(), Ordering::AcqRel);
    if raw.is_null() {
        return;
    }
    // SAFETY: `raw` is live (type invariants) and now unreachable from the
    // owner; no CM call can be in progress on it since the owner is gone.
    unsafe {
        if let Some(qp) = inner.qp.as_ref() {
            qp.teardown(raw);
        }
        let context = (*raw).context;
        // Waits for a running callback, and none starts after.
        bindings::rdma_destroy_id(raw);
        // The CM no longer uses `context`: release its reference.
        drop(Arc::from_raw(context.cast::<IdInner<H>>()));
    }
}

impl<H: Handler> Drop for CmId<H> {
    fn drop(&mut self) {
        if self.inner.in_own_handler() || in_any_callback() {
            // `rdma_destroy_id` from the id's own callback deadlocks; from
            // another id's callback it nests two handler mutexes of one
            // lock class; from a completion it may drain its own CQ.
            let _ = spawn_destroy(self.inner.clone());
        } else {
            destroy_now(&self.inner);
        }
    }
}

/// A connection request: owns the new id until adopted.
///
/// # Invariants
///
/// `raw` is the new id of a CONNECT_REQUEST callback in progress, whose
/// handler mutex the CM holds; `adopted` is the callback's flag.
pub struct ConnectRequest<'a, H: Handler> {
    raw: NonNull<bindings::rdma_cm_id>,
    adopted: &'a core::cell::Cell<bool>,
    request_param: ConnParam,
    _h: PhantomData<H>,
}

impl<'a, H: Handler> ConnectRequest<'a, H> {
    /// The new id, locked for the duration of the callback: accept, reject
    /// or query it here.
    pub fn id(&self) -> LockedId<'_> {
        // INVARIANT: The CM holds the new id's handler mutex during the callback.
        LockedId {
            raw: self.raw,
            request_param: Some(self.request_param),
            // A QP needs an owner: adopt the id first.
            qp_slot: None,
            _lock: PhantomData,
        }
    }

    /// Takes ownership of the new id with its own handler.
    pub fn adopt(self, handler: H) -> Result<CmId<H>> {
        let inner = Arc::new(
            IdInner {
                raw: AtomicPtr::new(self.raw.as_ptr()),
                // The CM holds this id's handler mutex until the listener's
                // callback returns: treat that as being in its handler.
                handler_task: AtomicPtr::new(current_task()),
                request_param: Some(self.request_param),
                qp: SetOnce::new(),
                handler,
            },
            GFP_KERNEL,
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
/// `raw` is live and its `handler_mutex` is held for `'a`.
pub struct LockedId<'a> {
    raw: NonNull<bindings::rdma_cm_id>,
    request_param: Option<ConnParam>,
    qp_slot: Option<&'a QpSlot>,
    _lock: PhantomData<&'a ()>,
}

fn to_result(ret: i32) -> Result {
    kernel::error::to_result(ret)
}

/// Addresses a caller may resolve with, bounded like librdmacm's tools.
pub const MAX_RESOLVE_TIMEOUT_MS: u32 = 60_000;

impl LockedId<'_> {
    fn as_ptr(&self) -> *mut bindings::rdma_cm_id {
        self.raw.as_ptr()
    }

    fn id(&self) -> &bindings::rdma_cm_id {
        // SAFETY: By the type invariants the id is live while `self` is.
        unsafe { self.raw.as_ref() }
    }

    /// The port space.
    pub fn port_space(&self) -> u32 {
        self.id().ps
    }

    /// The QP type.
    pub fn qp_type(&self) -> u32 {
        self.id().qp_type
    }

    /// The port the id is bound to, 0 if none.
    pub fn port_num(&self) -> u32 {
        self.id().port_num
    }

    /// The number of the id's QP, if it has one.
    pub fn qp_num(&self) -> Option<u32> {
        let qp = self.id().qp;
        if qp.is_null() {
            None
        } else {
            // SAFETY: A non-null `qp` of a live id is a live QP.
            Some(unsafe { (*qp).qp_num })
        }
    }

    /// The name of the RDMA device the id is bound to, if any.
    pub fn device_name(&self, out: &mut [u8; 64]) -> bool {
        *out = [0; 64];
        let dev = self.id().device;
        if dev.is_null() {
            return false;
        }
        // SAFETY: A bound id's device is live while the id is; `name` is a
        // NUL-terminated array.
        let name = unsafe { CStr::from_char_ptr((*dev).name.as_ptr()) };
        let bytes = name.to_bytes();
        let n = bytes.len().min(out.len() - 1);
        out[..n].copy_from_slice(&bytes[..n]);
        true
    }

    /// The device's RDMA read limits: (`max_qp_rd_atom`, `max_qp_init_rd_atom`).
    pub fn device_rd_atom_limits(&self) -> Option<(u32, u32)> {
        let dev = self.id().device;
        if dev.is_null() {
            return None;
        }
        // SAFETY: As in `device_name`.
        let attrs = unsafe { &(*dev).attrs };
        Some((attrs.max_qp_rd_atom, attrs.max_qp_init_rd_atom))
    }

    /// The source address (`rdma_get_local_addr`), if set.
    pub fn src_addr(&self) -> Option<SocketAddr> {
        sockaddr_of(&self.id().route.addr.src_addr)
    }

    /// The destination address (`rdma_get_peer_addr`), if set.
    ///
    /// Binding fills the destination's family with a wildcard address and
    /// port 0; that is reported as no destination.
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        sockaddr_of(&self.id().route.addr.dst_addr).filter(|a| !(a.is_any() && a.port() == 0))
    }

    /// Binds to a local address (`rdma_bind_addr`); port 0 picks one.
    pub fn bind(&self, addr: &SocketAddr) -> Result {
        let mut buf = addr.to_sockaddr();
        // SAFETY: `buf` is a valid, aligned sockaddr for the call's duration.
        to_result(unsafe { bindings::rdma_bind_addr(self.as_ptr(), (&raw mut buf).cast()) })
    }

    /// Starts address resolution (`rdma_resolve_addr`); completes with
    /// ADDR_RESOLVED or ADDR_ERROR.  `timeout_ms` must be 1..=60000.
    pub fn resolve_addr(
        &self,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout_ms: u32,
    ) -> Result {
        if timeout_ms == 0 || timeout_ms > MAX_RESOLVE_TIMEOUT_MS {
            return Err(EINVAL);
        }
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
        // SAFETY: Both buffers are valid sockaddrs for the call's duration.
        to_result(unsafe {
            bindings::rdma_resolve_addr(
                self.as_ptr(),
                src_ptr,
                (&raw mut dst_buf).cast(),
                timeout_ms as usize,
            )
        })
    }

    /// Starts route resolution (`rdma_resolve_route`); completes with
    /// ROUTE_RESOLVED or ROUTE_ERROR.  `timeout_ms` must be 1..=60000.
    pub fn resolve_route(&self, timeout_ms: u32) -> Result {
        if timeout_ms == 0 || timeout_ms > MAX_RESOLVE_TIMEOUT_MS {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_resolve_route(self.as_ptr(), timeout_ms as usize) })
    }

    /// Listens (`rdma_listen`); an unbound id listens on the wildcard.
    ///
    /// The backlog is honoured by the CM only on iWARP: on IB/RoCE the
    /// consumer enforces its own.
    pub fn listen(&self, backlog: i32) -> Result {
        if backlog <= 0 {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_listen(self.as_ptr(), backlog) })
    }

    fn check_param(&self, param: &ConnParam, usage: PrivateDataUse) -> Result {
        let (rd, init) = self.device_rd_atom_limits().ok_or(EINVAL)?;
        param.check(usage, rd, init)
    }

    /// Connects (`rdma_connect_locked`): after ROUTE_RESOLVED.
    pub fn connect(&self, param: &ConnParam) -> Result {
        let usage = if self.qp_type() == bindings::ib_qp_type_IB_QPT_UD {
            PrivateDataUse::ConnectUd
        } else {
            PrivateDataUse::ConnectRc
        };
        self.check_param(param, usage)?;
        let mut raw = param.as_raw();
        // SAFETY: The handler mutex is held (type invariants), as
        // `rdma_connect_locked` requires; `raw` and the private data it
        // points into (inside `param`) live across the call.
        to_result(unsafe { bindings::rdma_connect_locked(self.as_ptr(), &mut raw) })
    }

    /// The parameters `rdma_accept(3)` uses when given none: the request's
    /// values adjusted down to the local device.  The IB CM already reports
    /// a request from the receiver's side (its responder resources are the
    /// peer's initiator depth, `cm_format_req_event`), so they are used as
    /// they are.
    pub fn request_accept_param(&self) -> Result<ConnParam> {
        let req = self.request_param.ok_or(EINVAL)?;
        let (rd, init) = self.device_rd_atom_limits().ok_or(EINVAL)?;
        let (req_rr, req_id) = req.rd_atom();
        ConnParam::new()
            .responder_resources(u8::try_from(u32::from(req_rr).min(rd)).unwrap_or(u8::MAX))
            .initiator_depth(u8::try_from(u32::from(req_id).min(init)).unwrap_or(u8::MAX))
            .flow_control(true)
            .rnr_retry_count(MAX_RETRY_COUNT)
    }

    /// Accepts a connection request (`rdma_accept`); `None` uses
    /// [`Self::request_accept_param`].
    pub fn accept(&self, param: Option<&ConnParam>) -> Result {
        let defaults;
        let param = match param {
            Some(p) => p,
            None => {
                defaults = self.request_accept_param()?;
                &defaults
            }
        };
        let usage = if self.qp_type() == bindings::ib_qp_type_IB_QPT_UD {
            PrivateDataUse::AcceptUd
        } else {
            PrivateDataUse::AcceptRc
        };
        self.check_param(param, usage)?;
        let mut raw = param.as_raw();
        // SAFETY: The handler mutex is held (type invariants), as
        // `rdma_accept` asserts; `raw` outlives the call.
        to_result(unsafe { bindings::rdma_accept(self.as_ptr(), &mut raw) })
    }

    /// Rejects a connection request (`rdma_reject`) with an IB CM reason
    /// (0 means consumer defined, 28) and up to 148 bytes of private data.
    pub fn reject(&self, reason: u8, data: &[u8]) -> Result {
        if data.len() > PrivateDataUse::Reject.limit() {
            return Err(EINVAL);
        }
        let reason = if reason == 0 {
            bindings::ib_cm_rej_reason_IB_CM_REJ_CONSUMER_DEFINED as u8
        } else {
            reason
        };
        // SAFETY: `data` is readable for its length during the call.
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
        })
    }

    /// The CM's text for a reject reason on this id's transport
    /// (`rdma_reject_msg`), e.g. for the status of a REJECTED event.
    pub fn reject_msg(&self, reason: i32) -> &'static CStr {
        // SAFETY: The id is live; `rdma_reject_msg` returns a static string
        // for any reason.
        unsafe { CStr::from_char_ptr(bindings::rdma_reject_msg(self.as_ptr(), reason)) }
    }

    /// Disconnects (`rdma_disconnect`).
    pub fn disconnect(&self) -> Result {
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_disconnect(self.as_ptr()) })
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

    /// `rdma_set_min_rnr_timer`: the 5-bit IB encoding, RC ids only.
    pub fn set_min_rnr_timer(&self, timer: u8) -> Result {
        if timer > 31 {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_min_rnr_timer(self.as_ptr(), timer) })
    }

    /// Creates the id's QP (`rdma_create_qp`) on `pd`, completing on `cq`.
    ///
    /// The id owns the QP: its destruction drains and destroys it.  `EBUSY`
    /// if the id has a QP, `EINVAL` on an id not adopted yet.
    pub fn create_qp<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        cq: &Arc<Cq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        let slot = self.qp_slot.ok_or(EINVAL)?;
        if slot.as_ref().is_some() {
            return Err(EBUSY);
        }
        let qp = Qp::create(self, pd, cq, caps)?;
        let teardown: Arc<dyn QpTeardown> = qp.clone();
        if !slot.populate(teardown) {
            // Unreachable under the handler mutex, which serialises creators.
            return Err(EBUSY);
        }
        Ok(qp)
    }

    /// The raw id, for the verbs in this crate (QP creation).
    pub(crate) fn raw(&self) -> *mut bindings::rdma_cm_id {
        self.as_ptr()
    }

    /// The id's device, if bound.
    pub(crate) fn device_ptr(&self) -> Option<*mut bindings::ib_device> {
        let dev = self.id().device;
        (!dev.is_null()).then_some(dev)
    }
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
/// Called by the CM only, for ids created by [`CmId::new`] with `H`, with
/// the id's handler mutex held.
unsafe extern "C" fn handler_trampoline<H: Handler>(
    raw_id: *mut bindings::rdma_cm_id,
    raw_event: *mut bindings::rdma_cm_event,
) -> ffi::c_int {
    // SAFETY: `raw_id` is live during the callback; its context is an
    // `IdInner<H>` (the listener's, for a connection request) kept alive by
    // the reference the context pointer owns.
    let (context, qp_type) = unsafe { ((*raw_id).context, (*raw_id).qp_type) };
    // SAFETY: See above.
    let inner = unsafe { &*context.cast::<IdInner<H>>() };
    // SAFETY: `raw_event` is valid for the callback, which outlives `event`.
    let Some(event) = (unsafe { Event::from_raw(raw_event, qp_type) }) else {
        return 0;
    };
    let previous = inner.enter();
    let _mark = CallbackMark::enter();
    let mut destroy_new_id = false;
    if event.kind() == EventType::ConnectRequest {
        let adopted = core::cell::Cell::new(false);
        let request_param = event.conn_param().map(|v| v.to_owned()).unwrap_or_default();
        let listener_raw = inner.raw();
        if let Some(listener_raw) = NonNull::new(listener_raw) {
            // INVARIANT: The CM holds the listener's handler mutex too during
            // a connection request.
            let listener = LockedId {
                raw: listener_raw,
                request_param: None,
                qp_slot: Some(&inner.qp),
                _lock: PhantomData,
            };
            let request = ConnectRequest {
                // SAFETY: `raw_id` is non-null: the CM passes a live id.
                raw: unsafe { NonNull::new_unchecked(raw_id) },
                adopted: &adopted,
                request_param,
                _h: PhantomData,
            };
            inner.handler.connect_request(&listener, request, &event);
        }
        if adopted.get() {
            // SAFETY: `adopt` replaced the context with the new id's own.
            let new_inner = unsafe { &*(*raw_id).context.cast::<IdInner<H>>() };
            // The callback is over: the new id's mutex is released on return.
            new_inner.leave(ptr::null_mut());
        } else {
            destroy_new_id = true;
        }
    } else {
        // INVARIANT: The CM holds this id's handler mutex during the callback.
        let id = LockedId {
            // SAFETY: The CM passes a live id.
            raw: unsafe { NonNull::new_unchecked(raw_id) },
            request_param: inner.request_param,
            qp_slot: Some(&inner.qp),
            _lock: PhantomData,
        };
        inner.handler.event(&id, &event);
    }
    inner.leave(previous);
    // Non-zero makes the CM destroy `raw_id`: only for a request nobody adopted.
    i32::from(destroy_new_id)
}
