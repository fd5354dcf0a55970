// SPDX-License-Identifier: GPL-2.0

//! Verbs for the data path: completion queues, reliable connected and
//! unreliable datagram queue pairs, DMA-mapped message buffers, datagrams
//! to [`UdDest`]s, and the memory work requests (registration,
//! invalidation, RDMA READ/WRITE) over [`Mr`]s on reliable connected QPs.
//!
//! This level knows nothing of the connection manager: a [`Qp`] is
//! prepared here ([`Qp::prepare`]), created by whoever owns the QP's
//! connection (the CM's `rdma_create_qp`), recorded with
//! [`Qp::set_created`], and shut down ([`QpShutdown`]) before its owner
//! destroys it.
//!
//! # Ownership
//!
//! * A buffer is owned by the consumer until it is posted; posting moves it
//!   into the QP, and its completion hands it back to the
//!   [`CompletionHandler`] (also when the QP is flushed at teardown).  A
//!   buffer in flight can therefore be neither freed nor reused.
//! * Every object lives on one [`Device`] and holds a reference to it.  A
//!   QP is made of a PD and a CQ of its connection's device, and posts only
//!   buffers and regions of that device (`EXDEV` otherwise) and of its own
//!   PD (`EINVAL` otherwise), before any of it reaches the driver.  A
//!   buffer holds its PD: the local key it is posted with is the PD's.
//! * A UD send holds its destination's address handle until its
//!   completion; the address handle holds its PD.  A UD receive reserves
//!   the first [`GRH_SIZE`] bytes of its buffer for the global route
//!   header and reports the payload after it, with the sender
//!   ([`Datagram`]).  A QP takes only the work its type has: SENDs without
//!   a destination and memory work on RC QPs, datagrams on UD QPs
//!   (`EOPNOTSUPP` otherwise), and no datagram larger than the port's MTU
//!   (`EMSGSIZE`: rxe would report such a send as successful and emit
//!   nothing, as the IBTA allows).
//! * A QP keeps its PD and CQs alive; they are freed after it.  Its send
//!   and receive queues complete on one CQ or on two (a ULP that polls its
//!   receives apart from its sends); each CQ's handler gets its own
//!   queue's completions.  A QP takes no more work requests than its
//!   [`QpCaps`] (`ENOSPC`), counted from post to completion; it reserves
//!   room on its CQs for all of them plus a spare entry for each queue,
//!   and one spare slot in each queue (what `ib_drain_qp` needs).  No
//!   completion can be lost to a full CQ.
//! * A [`Srq`] shares its receive buffers among the RC QPs created on it
//!   (of its PD and handler type); each QP holds it, so it outlives them,
//!   and it reserves room for all its receives once on each CQ they
//!   complete on.  Its buffers are its own until a completion hands one to
//!   the handler of the QP that took it; those left at its destruction
//!   are freed then.
//! * Pages attached to a send or a receive ([`SendBuffer::attach_pages`])
//!   go with their buffer: mapped for the device from the post to the
//!   completion, and handed back unmapped and attached with it.
//! * A transfer of the R/W API ([`Qp::rdma_rw`]) owns its [`SgBuffer`]
//!   from post to completion, mapped for the QP's device meanwhile, and
//!   hands it back unmapped to [`CompletionHandler::rw_done`].
//! * A request the driver did not refuse by name is the driver's, even
//!   when the post failed (see [`Qp::rdma_rw`] and the design notes): it
//!   stays tracked and the QP goes to the error state.
//!
//! # Teardown
//!
//! A QP tracks every request it has posted until its completion ran.  Its
//! shutdown moves it to the error state, where the driver flushes every
//! outstanding request through the CQ, and waits for that, bounded by
//! [`FLUSH_TIMEOUT`]: unlike `ib_drain_qp`, which waits for good, and does
//! when a driver never flushes (rxe does not after a failed
//! `IB_QP_MAX_DEST_RD_ATOMIC` change has left its receive task disabled).
//! Requests still outstanding then are completed as flushed
//! ([`QpShutdown::reclaim`]) once the owner has destroyed the QP, so the
//! device can no longer reach their memory, and the CQ's poll work has
//! handed over whatever the driver had queued before.  Either way every
//! buffer and region comes back to the [`CompletionHandler`] exactly once.

use super::{
    ah::{Datagram, UdDest, GRH_SIZE},
    bindings,
    callback::{current_task, CallbackMark, CallbackTarget},
    device::{self, Device, Transport},
    mr::{Mr, MrAccess, Registration, RemoteRegion},
    pd::{Pd, RemoteKey},
    sg::{check_range, SgBuffer},
};
use core::{
    ptr::{self, NonNull},
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering},
};
use kernel::{
    new_condvar, new_mutex, new_spinlock,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{aref::ARef, Arc, CondVar, CondVarTimeoutResult, Mutex, SpinLock},
    time::{delay::fsleep, msecs_to_jiffies, Delta, Instant, Monotonic},
    types::Opaque,
};

/// The QP types this layer makes.
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
}

/// How long a QP's shutdown waits for the driver to flush its outstanding
/// requests before it reclaims them after destroying the QP.
pub const FLUSH_TIMEOUT: Delta = Delta::from_millis(5000);

/// How long a QP's shutdown polls its [`PollContext::Direct`] CQs without
/// sleeping while it waits for the flush.
const FLUSH_SPIN: Delta = Delta::from_millis(20);

/// The kinds of memory work requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkOp {
    /// `IB_WR_REG_MR`.
    Register,
    /// `IB_WR_LOCAL_INV`.
    Invalidate,
    /// `IB_WR_RDMA_READ`: peer memory into the local region.
    RdmaRead,
    /// `IB_WR_RDMA_WRITE`: the local region into peer memory.
    RdmaWrite,
}

/// A completed memory work request, handed to
/// [`CompletionHandler::work_done`].
pub struct WorkDone {
    /// What was posted.
    pub op: WorkOp,
    /// The consumer's tag from the post.
    pub tag: u64,
    /// The region the request named; dropping the last reference
    /// deregisters it.
    pub mr: Arc<Mr>,
}

/// The transfers of the generic RDMA READ/WRITE API ([`Qp::rdma_rw`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RwOp {
    /// RDMA READ: the peer's memory into the buffer.
    Read,
    /// RDMA WRITE: the buffer into the peer's memory.
    Write,
}

impl RwOp {
    fn direction(self) -> bindings::dma_data_direction {
        match self {
            Self::Read => bindings::dma_data_direction::DMA_FROM_DEVICE,
            Self::Write => bindings::dma_data_direction::DMA_TO_DEVICE,
        }
    }
}

/// A completed [`Qp::rdma_rw`] transfer, handed to
/// [`CompletionHandler::rw_done`].
pub struct RwDone {
    /// What was posted.
    pub op: RwOp,
    /// The consumer's tag from the post.
    pub tag: u64,
    /// The buffer, unmapped again: after a successful READ it holds the
    /// peer's bytes.  A failed iWARP READ's buffer comes back only once
    /// its QP is destroyed: the READ request gave the peer a key to write
    /// into it, which only the READ's success revokes.  On siw an iWARP
    /// READ's buffer comes back an RCU grace period after the key ended
    /// (after the READ's success, or the QP's destruction): a chunk of
    /// another QP's WRITE through the key that siw began placing before
    /// may still be copying until then.
    pub buf: SgBuffer,
}

/// Receives the buffers of completed work requests: of a QP's receives on
/// its receive CQ's handler, of its sends and memory work requests on its
/// send CQ's handler.
///
/// Runs in process context: on the CQ's workqueue, or for a
/// [`PollContext::Direct`] CQ in the task that polls it ([`Cq::poll`],
/// a [`super::poller::BusyPoller`] loop, a QP's teardown), under whatever
/// that task holds: a poller that holds a lock its handler takes
/// deadlocks.  Requests the driver never flushed are completed as flushed
/// by the task that destroys their QP (see the module's Teardown), which
/// may hold the id's handler mutex: both are callbacks of the layer, where
/// `CmId::with_lock` on another id refuses.  A CM id dropped here is
/// destroyed from a workqueue: its QP's shutdown could otherwise wait for
/// this very context.
pub trait CompletionHandler: Send + Sync + 'static {
    /// A receive completed: `Ok(len)` bytes arrived (into the buffer, and
    /// past its capacity into its attached pages), or the error (ECANCELED
    /// when the QP was flushed).
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>);
    /// A send completed.
    fn send_done(&self, buf: SendBuffer, result: Result);

    /// A memory work request (registration, invalidation, RDMA READ or
    /// WRITE) completed.  Errors: `EACCES` for a remote access error (bad
    /// key, range or permission at the peer), `EHOSTUNREACH` when the
    /// transport's retries ran out, `ECANCELED` when the QP was flushed,
    /// `EIO` otherwise.  The default logs failures other than flushes.
    fn work_done(&self, done: WorkDone, result: Result) {
        if let Err(e) = result {
            if e != ECANCELED {
                pr_warn!("{:?} (tag {}) failed: {:?}\n", done.op, done.tag, e);
            }
        }
    }

    /// A transfer of the R/W API ([`Qp::rdma_rw`]) completed, with the
    /// errors of [`Self::work_done`].  The default logs failures other
    /// than flushes and drops the buffer.
    fn rw_done(&self, done: RwDone, result: Result) {
        if let Err(e) = result {
            if e != ECANCELED {
                pr_warn!("R/W {:?} (tag {}) failed: {:?}\n", done.op, done.tag, e);
            }
        }
    }

    /// An asynchronous event of the QP numbered `qp_num` whose send queue
    /// completes on this handler's CQ.  Runs in the driver's context, which may be
    /// atomic (a softirq, or with the driver's locks held): it must not
    /// sleep, so it may not take a `Mutex`, post, or drop the last
    /// reference to a QP or CM id; a ULP that must act records the event
    /// and acts from process context.  Comes only while the QP exists.
    /// The default logs the errors ([`QpEvent::is_error`]).
    fn qp_event(&self, qp_num: u32, event: QpEvent) {
        if event.is_error() {
            pr_warn!("QP {}: {:?}\n", qp_num, event);
        }
    }
}

/// An asynchronous event of a QP (the QP's `enum ib_event_type`s): what the
/// device reports outside the completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpEvent {
    /// `IB_EVENT_QP_FATAL`: an error no completion could report moved the
    /// QP to the error state; its outstanding requests are flushed.
    Fatal,
    /// `IB_EVENT_QP_REQ_ERR`: the peer sent an invalid request (a transport
    /// error of the responder); the QP is in the error state.
    RequestError,
    /// `IB_EVENT_QP_ACCESS_ERR`: the peer's RDMA request violated a local
    /// region's key, range or rights and no receive could carry the error;
    /// the QP is in the error state.
    AccessError,
    /// `IB_EVENT_COMM_EST`: a message arrived before the connection's
    /// establishment reached the QP's owner (the IB CM's RTU lost or
    /// late).  A QP of a CM id has its CM told (`rdma_notify`) before the
    /// handler hears of it.
    CommEstablished,
    /// `IB_EVENT_SQ_DRAINED`: the send queue drained after a move to SQD.
    SendQueueDrained,
    /// `IB_EVENT_PATH_MIG`: the QP migrated to its alternate path.
    PathMigrated,
    /// `IB_EVENT_PATH_MIG_ERR`: migrating to the alternate path failed.
    PathMigrationError,
    /// `IB_EVENT_QP_LAST_WQE_REACHED`: the last request of a QP in error
    /// that takes its receives from a shared receive queue completed.
    LastWqeReached,
    /// Another event code a driver reported for the QP.
    Other(u32),
}

impl QpEvent {
    /// The event of a raw `ib_event_type`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            bindings::ib_event_type_IB_EVENT_QP_FATAL => Self::Fatal,
            bindings::ib_event_type_IB_EVENT_QP_REQ_ERR => Self::RequestError,
            bindings::ib_event_type_IB_EVENT_QP_ACCESS_ERR => Self::AccessError,
            bindings::ib_event_type_IB_EVENT_COMM_EST => Self::CommEstablished,
            bindings::ib_event_type_IB_EVENT_SQ_DRAINED => Self::SendQueueDrained,
            bindings::ib_event_type_IB_EVENT_PATH_MIG => Self::PathMigrated,
            bindings::ib_event_type_IB_EVENT_PATH_MIG_ERR => Self::PathMigrationError,
            bindings::ib_event_type_IB_EVENT_QP_LAST_WQE_REACHED => Self::LastWqeReached,
            other => Self::Other(other),
        }
    }

    /// Whether the event reports an error that moved the QP to the error
    /// state.
    pub fn is_error(&self) -> bool {
        matches!(self, Self::Fatal | Self::RequestError | Self::AccessError)
    }
}

/// What a QP's owner does when the QP reports [`QpEvent::CommEstablished`]
/// (the CM level passes it to `rdma_notify`), before the handler hears of
/// it.
///
/// # Invariants
///
/// `notify(context)` may be called in any context, atomic included, while
/// the QP this was given to ([`Qp::prepare`]) exists.
pub(crate) struct CommEstNotify {
    notify: unsafe fn(*mut core::ffi::c_void),
    context: *mut core::ffi::c_void,
}

// SAFETY: By the type invariants `notify(context)` may be called from any
// context, so from any thread.
unsafe impl Send for CommEstNotify {}
// SAFETY: As above; the value is only read.
unsafe impl Sync for CommEstNotify {}

impl CommEstNotify {
    /// # Safety
    ///
    /// Calling `notify(context)` must be sound in any context, atomic
    /// included, as long as a QP created with the returned value exists.
    pub(crate) unsafe fn new(
        notify: unsafe fn(*mut core::ffi::c_void),
        context: *mut core::ffi::c_void,
    ) -> Self {
        // INVARIANT: By the safety requirements.
        Self { notify, context }
    }
}

/// The handler of a CQ's completions.
///
/// # Safety
///
/// `cq` must be live, with a `Cq<C>` as its context, for `'a`.
unsafe fn handler_of<'a, C: CompletionHandler>(cq: *mut bindings::ib_cq) -> &'a C {
    // SAFETY: By the safety requirements.
    unsafe { &(*(*cq).cq_context.cast::<Cq<C>>()).handler }
}

/// Where a CQ's completions run its handler (`enum ib_poll_context`).
/// All three are process context, where a [`CompletionHandler`] may sleep;
/// the atomic one (`IB_POLL_SOFTIRQ`) is not offered (see the design
/// notes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollContext {
    /// `IB_POLL_WORKQUEUE`: `ib_comp_wq`, a per-CPU workqueue; the
    /// completions of a CQ run on the CPU its completion vector's
    /// interrupt (or, for software devices, the driver) queued them on.
    Workqueue,
    /// `IB_POLL_UNBOUND_WORKQUEUE`: `ib_comp_unbound_wq`, which runs them
    /// on any CPU, for handlers that work long.
    UnboundWorkqueue,
    /// `IB_POLL_DIRECT`: only the CQ's owner polls it, with [`Cq::poll`],
    /// and the handler runs in the poller's context.  The device never
    /// interrupts for it: a ULP that busy-polls, as a user-space one does,
    /// sees a completion the moment the driver writes it, without waking
    /// a worker.  A QP's teardown polls it too, until its requests are
    /// flushed.
    Direct,
}

impl PollContext {
    fn as_raw(self) -> bindings::ib_poll_context {
        match self {
            Self::Workqueue => bindings::ib_poll_context_IB_POLL_WORKQUEUE,
            Self::UnboundWorkqueue => bindings::ib_poll_context_IB_POLL_UNBOUND_WORKQUEUE,
            Self::Direct => bindings::ib_poll_context_IB_POLL_DIRECT,
        }
    }
}

/// A completion queue (`ib_alloc_cq`), polled from a workqueue or by its
/// owner ([`PollContext`]).
///
/// # Invariants
///
/// Once allocated, `raw` is a live CQ of `entries` entries on `dev`, polled
/// as `poll` says, whose `cq_context` is this object; `committed` is the
/// sum of the reservations of the QPs that complete on it, at most
/// `entries`.  A [`PollContext::Direct`] CQ is never armed (no
/// `ib_req_notify_cq`: the IB core warns of an unsolicited completion),
/// and its completions run only in the task that set `polling`, while it
/// is set (a poll, or a QP's reclaim).
pub struct Cq<C: CompletionHandler> {
    raw: AtomicPtr<bindings::ib_cq>,
    entries: u32,
    comp_vector: u32,
    poll: PollContext,
    /// [`PollContext::Direct`]: the task processing the CQ, or null.
    /// Completions run one at a time and in order, as from a workqueue:
    /// what a QP's ordering of its send queue relies on.
    polling: AtomicPtr<bindings::task_struct>,
    committed: AtomicU32,
    handler: C,
    dev: ARef<Device>,
    /// Counted while the C side may call into the module through this
    /// object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

// SAFETY: A CQ may be used and freed from any thread; `C` is `Send + Sync`.
unsafe impl<C: CompletionHandler> Send for Cq<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Cq<C> {}

impl<C: CompletionHandler> Cq<C> {
    /// Allocates a CQ of `entries` on `dev`, on completion vector 0, polled
    /// from [`PollContext::Workqueue`].
    pub fn alloc(dev: &Device, entries: u32, handler: C) -> Result<Arc<Self>> {
        Self::alloc_with(dev, entries, 0, PollContext::Workqueue, handler)
    }

    /// Allocates a CQ of `entries` on `dev`, bound to `comp_vector`
    /// (`EINVAL` unless below [`Device::num_comp_vectors`]) and polled from
    /// `poll`.
    pub fn alloc_with(
        dev: &Device,
        entries: u32,
        comp_vector: u32,
        poll: PollContext,
        handler: C,
    ) -> Result<Arc<Self>> {
        let nr_cqe = i32::try_from(entries).map_err(|_| EINVAL)?;
        if nr_cqe == 0 || comp_vector >= dev.num_comp_vectors() {
            return Err(EINVAL);
        }
        let vector = i32::try_from(comp_vector).map_err(|_| EINVAL)?;
        let cq = Arc::new(
            Self {
                raw: AtomicPtr::new(ptr::null_mut()),
                entries,
                comp_vector,
                poll,
                polling: AtomicPtr::new(ptr::null_mut()),
                committed: AtomicU32::new(0),
                handler,
                dev: dev.into(),
                _target: CallbackTarget::new()?,
            },
            GFP_KERNEL,
        )?;
        let context: *const Self = &*cq;
        // SAFETY: `dev` is valid; `context` outlives the CQ (freed in `drop`);
        // the vector is the device's (checked above).
        let raw = unsafe {
            bindings::rdma_cm_rs_alloc_cq(
                dev.as_ptr(),
                context.cast_mut().cast(),
                nr_cqe,
                vector,
                poll.as_raw(),
            )
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        // INVARIANT: Just allocated with this object as its context.
        cq.raw.store(raw, Ordering::Release);
        Ok(cq)
    }

    /// The handler.
    pub fn handler(&self) -> &C {
        &self.handler
    }

    /// The device the CQ lives on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The completion vector the CQ is bound to.
    pub fn comp_vector(&self) -> u32 {
        self.comp_vector
    }

    /// Where the CQ's completions run its handler.
    pub fn poll_context(&self) -> PollContext {
        self.poll
    }

    /// Entries not yet reserved by a QP.
    pub fn free_entries(&self) -> u32 {
        self.entries - self.committed.load(Ordering::Acquire)
    }

    /// Polls a [`PollContext::Direct`] CQ: runs the handler, in the
    /// caller's context, for at most `budget` completions, and returns how
    /// many ran.  Then, so that the caller may poll in a loop, gives the
    /// CPU away: to every other runnable task when nothing was found or
    /// the poll was refused (`yield`, a user-space poller's
    /// `sched_yield`: a software device makes completions in tasks of its
    /// own, which must not wait for the scheduler's tick), else if the
    /// scheduler asks for it.  Process context; the handler may sleep,
    /// and runs under no lock of the layer.
    ///
    /// `EINVAL` for a CQ polled from a workqueue, or a budget of 0;
    /// `EBUSY` while another poll of the CQ runs (another task's, or the
    /// one whose handler is calling): its completions reach the handler
    /// through that poll.
    pub fn poll(&self, budget: u32) -> Result<u32> {
        if self.poll != PollContext::Direct || budget == 0 {
            return Err(EINVAL);
        }
        let budget = i32::try_from(budget).unwrap_or(i32::MAX);
        let done = 'poll: {
            let Some(_polling) = DirectPoll::try_start(self) else {
                break 'poll Err(EBUSY);
            };
            // An `IB_POLL_DIRECT` CQ has no work item or softirq, and this
            // object is its only caller of `ib_process_cq_direct`, which
            // `_polling` makes one task at a time.
            // SAFETY: Live CQ (type invariants) processed by this task
            // alone; every entry's `done` is this layer's, which takes
            // ownership of its request; the budget is positive.
            let done = unsafe { bindings::ib_process_cq_direct(self.as_ptr(), budget) };
            // At most `budget`, never negative.
            Ok(u32::try_from(done).unwrap_or(0))
        };
        give_way(matches!(done, Ok(n) if n > 0));
        done
    }

    /// For a QP's teardown: processes a [`PollContext::Direct`] CQ until
    /// it is empty, unless another task is polling it (whose poll delivers
    /// what it finds).  Nothing for a CQ polled from a workqueue.
    /// Gives the CPU away as [`Self::poll`] does: the caller polls again.
    fn poll_for_teardown(&self) {
        if self.poll != PollContext::Direct {
            return;
        }
        let found = DirectPoll::try_start(self).is_some_and(|polling| polling.drain() > 0);
        give_way(found);
    }

    /// For a QP's reclaim: for a [`PollContext::Direct`] CQ, the right to
    /// process it, once every completion queued before has run (a poll
    /// found it empty); the reclaim completes the QP's leftovers under it,
    /// so that they too run one at a time with the CQ's others.  For a CQ
    /// polled from a workqueue, waits until its poll work is idle, and
    /// `None`.  Not from a completion handler, which the wait could be
    /// for: `LockedId::destroy_qp` refuses a task inside one, and a `CmId`
    /// dropped there is destroyed later, on the module's queue.
    fn quiesce(&self) -> Option<DirectPoll<'_, C>> {
        if self.poll != PollContext::Direct {
            // SAFETY: The CQ is live and polled from a workqueue, whose
            // poll work this waits for.
            unsafe { bindings::rdma_cm_rs_flush_cq_work(self.as_ptr()) };
            return None;
        }
        loop {
            if let Some(polling) = DirectPoll::try_start(self) {
                polling.drain();
                return Some(polling);
            }
            // Another task's poll is running handlers; it finishes its
            // budget and lets go.
            fsleep(Delta::from_micros(100));
        }
    }

    fn as_ptr(&self) -> *mut bindings::ib_cq {
        self.raw.load(Ordering::Acquire)
    }

    /// Reserves `n` entries for a QP; `ENOSPC` if the CQ could overflow.
    fn reserve(&self, n: u32) -> Result {
        self.committed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                c.checked_add(n).filter(|&t| t <= self.entries)
            })
            .map(|_| ())
            .map_err(|_| ENOSPC)
    }

    fn release(&self, n: u32) {
        self.committed.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The right to process a [`PollContext::Direct`] CQ, held by one task.
struct DirectPoll<'a, C: CompletionHandler>(&'a Cq<C>);

impl<'a, C: CompletionHandler> DirectPoll<'a, C> {
    fn try_start(cq: &'a Cq<C>) -> Option<Self> {
        cq.polling
            .compare_exchange(
                ptr::null_mut(),
                current_task(),
                Ordering::Acquire,
                Ordering::Relaxed,
            )
            .ok()
            .map(|_| Self(cq))
    }

    /// Processes the CQ until a batch finds it empty; how many completions
    /// ran.
    fn drain(&self) -> usize {
        const BATCH: i32 = 16;
        let mut total = 0;
        loop {
            // SAFETY: As in `Cq::poll`: a live `IB_POLL_DIRECT` CQ processed
            // by this task alone, whose entries' `done` are this layer's.
            let done = unsafe { bindings::ib_process_cq_direct(self.0.as_ptr(), BATCH) };
            // Between 0 and `BATCH`.
            total += usize::try_from(done).unwrap_or(0);
            if done < BATCH {
                return total;
            }
            // A CQ shared by busy QPs may keep this going.
            give_way(true);
        }
    }
}

/// After a poll of a [`PollContext::Direct`] CQ, before the caller polls
/// again: when it `found` nothing, every other runnable task of the CPU
/// runs first (`yield`, a user-space poller's `sched_yield`: a software
/// device makes completions in tasks of its own, which must not wait for
/// the scheduler's tick); otherwise the CPU goes only if the scheduler
/// asks for it.  Process context, no spinlock held.
fn give_way(found: bool) {
    if found {
        // SAFETY: Process context with no spinlock held (the function's
        // contract), where `cond_resched` may sleep.
        unsafe { bindings::rdma_cm_rs_cond_resched() };
    } else {
        // SAFETY: As above, for `yield`.
        unsafe { bindings::rdma_cm_rs_yield() };
    }
}

impl<C: CompletionHandler> Drop for DirectPoll<'_, C> {
    fn drop(&mut self) {
        self.0.polling.store(ptr::null_mut(), Ordering::Release);
    }
}

impl<C: CompletionHandler> Drop for Cq<C> {
    fn drop(&mut self) {
        let raw = self.as_ptr();
        if !raw.is_null() {
            // No poll runs: `ib_free_cq` cancels a workqueue CQ's poll
            // work, and a `Cq::poll` of a direct CQ (for which
            // `ib_free_cq` waits for nothing) borrows this object.
            // SAFETY: Live CQ whose QPs are gone (each QP holds the CQ
            // alive), polled by nothing.
            unsafe { bindings::ib_free_cq(raw) };
        }
    }
}

/// The memory of a posted or postable buffer.
///
/// # Invariants
///
/// `data` is DMA-mapped at `dma` for `dev` in `direction` while the object
/// lives; `cqe` is the completion entry the QP reports it with.  `pages`
/// are the consumer's and reachable by no device; `mapped` pages are the
/// device's, and exist only while the buffer is posted (a buffer comes
/// back to the consumer through [`Buffer::handed_back`], which unmaps
/// them).
#[repr(C)]
struct Buffer {
    cqe: bindings::ib_cqe,
    /// The PD whose local key `lkey` is (and, through it, the device).
    pd: Arc<Pd>,
    /// Held from post to completion: the QP's count of requests in flight.
    credit: Option<Credit>,
    /// A UD send's destination, held from post to completion.
    dest: Option<UdDest>,
    /// Sends: the immediate data to carry (SEND_WITH_IMM).  Receives: what
    /// arrived with the last completion.
    imm: Option<u32>,
    /// Sends: the peer's remote key to invalidate (SEND_WITH_INV).
    /// Receives: the key of ours the last completion invalidated.
    invalidate: Option<u32>,
    /// Receives on a UD QP: the sender of the last completion.
    datagram: Option<Datagram>,
    /// Receives: the QP the last completion arrived on.
    qp_num: Option<u32>,
    /// Receives: posted on a UD QP, whose completions start with the GRH.
    on_ud: bool,
    /// Sends: posted inline (`IB_SEND_INLINE`).
    inline: bool,
    /// Sends: posted without asking for a completion of their own.
    unsignaled: bool,
    dma: u64,
    direction: bindings::dma_data_direction,
    lkey: u32,
    /// Where the payload starts in `data` (after the GRH on UD receives).
    offset: usize,
    len: usize,
    data: KVec<u8>,
    /// Pages attached by the consumer: sent after `data`'s bytes, or
    /// received into once `data` is full.
    pages: Option<SgBuffer>,
    /// Receives: the bytes the last completion put into `pages`.
    paged_len: usize,
    /// `pages` while the request is posted, with its gather list.
    mapped: Option<MappedPages>,
}

// SAFETY: The device is only passed to the DMA API, which may be called
// from any thread; the data is owned.
unsafe impl Send for Buffer {}
// SAFETY: Shared references only read the data.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(
        pd: &Arc<Pd>,
        capacity: usize,
        direction: bindings::dma_data_direction,
    ) -> Result<KBox<Self>> {
        if capacity == 0 || capacity > u32::MAX as usize {
            return Err(EINVAL);
        }
        let mut data = KVec::with_capacity(capacity, GFP_KERNEL)?;
        data.resize(capacity, 0, GFP_KERNEL)?;
        let dev = pd.device();
        let mut dma = 0u64;
        // SAFETY: `data` is a live kmalloc'ed region of `capacity` bytes
        // (physically contiguous), unmapped in `drop`; `dev` is valid.
        kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_dma_map_single(
                dev.as_ptr(),
                data.as_mut_ptr().cast(),
                capacity,
                direction,
                &mut dma,
            )
        })?;
        // INVARIANT: Mapped just above.  If the box cannot be allocated,
        // the value is dropped, which unmaps.
        Ok(KBox::new(
            Self {
                cqe: bindings::ib_cqe { done: None },
                pd: pd.clone(),
                credit: None,
                dest: None,
                imm: None,
                invalidate: None,
                datagram: None,
                qp_num: None,
                on_ud: false,
                inline: false,
                unsignaled: false,
                dma,
                direction,
                lkey: pd.local_dma_lkey(),
                offset: 0,
                len: 0,
                data,
                pages: None,
                paged_len: 0,
                mapped: None,
            },
            GFP_KERNEL,
        )?)
    }

    /// Maps the attached pages, if any, for a request of at most `max_sge`
    /// entries whose first `head_len` bytes are the buffer's own (none for
    /// 0), and returns the request's list of entries, which the poster
    /// keeps across the post (the completion, which may run before the
    /// post returns, frees nothing of it): `EMSGSIZE` for more entries,
    /// the pages left attached on any failure.
    fn map_pages(&mut self, head_len: usize, max_sge: u32) -> Result<Option<SgeList>> {
        let Some(pages) = self.pages.take() else {
            return Ok(None);
        };
        let head = (head_len > 0).then(|| self.sge(head_len));
        match MappedPages::map(pages, &self.pd, head, max_sge) {
            Ok((mapped, list)) => {
                self.mapped = Some(mapped);
                Ok(Some(list))
            }
            Err((e, pages)) => {
                self.pages = Some(pages);
                Err(e)
            }
        }
    }

    /// Ends the device's access to the pages of a request that completed
    /// or was never posted: unmapped, they are the consumer's again.
    fn handed_back(mut self: KBox<Self>) -> KBox<Self> {
        if let Some(mapped) = self.mapped.take() {
            self.pages = Some(mapped.unmap());
        }
        self
    }

    /// A request's list of entries: `list` ([`Self::map_pages`]'s, with
    /// pages), or `single` (the buffer's own bytes, filled by the caller).
    /// Both are the poster's, alive across the post.
    fn sg_list(
        single: &mut bindings::ib_sge,
        list: Option<&SgeList>,
    ) -> (*mut bindings::ib_sge, i32) {
        match list {
            // Drivers only read the list (`ib_sge *` for C's sake).
            Some(list) => (list.as_ptr().cast_mut(), list.len() as i32),
            None => (single, 1),
        }
    }

    fn dev(&self) -> &Device {
        self.pd.device()
    }

    /// Readies the buffer to be posted as a SEND holding `credit`: synced
    /// for the device, its completion entry calling `done`, `wr` filled
    /// (naming `sge`, filled too, or with pages `list`).
    fn prepare_send(
        &mut self,
        credit: Credit,
        done: unsafe extern "C" fn(*mut bindings::ib_cq, *mut bindings::ib_wc),
        wr: &mut bindings::ib_send_wr,
        sge: &mut bindings::ib_sge,
        list: Option<&SgeList>,
    ) {
        self.credit = Some(credit);
        self.sync_for_device(self.len);
        self.cqe.done = Some(done);
        self.fill_send_wr(wr, sge, list);
    }

    /// Sends: fills `wr` with a SEND of the buffer's bytes as `sge`
    /// describes them (set here): its opcode (with immediate data or an
    /// invalidation) and, inline, the bytes' CPU address, which drivers
    /// copy from during the post (mlx5's `set_data_inl_seg`, rxe's
    /// `copy_inline_data_to_wqe`) rather than from their DMA address.
    /// `sge` and `list` (the entries with pages, [`Self::map_pages`]'s)
    /// must live across the post.
    fn fill_send_wr(
        &self,
        wr: &mut bindings::ib_send_wr,
        sge: &mut bindings::ib_sge,
        list: Option<&SgeList>,
    ) {
        *sge = self.sge(self.len);
        // Never together with pages (`Qp::check_send`).
        if self.inline {
            sge.addr = self.data.as_ptr() as u64;
            wr.send_flags |= bindings::ib_send_flags_IB_SEND_INLINE;
        }
        (wr.sg_list, wr.num_sge) = Self::sg_list(sge, list);
        wr.opcode = match (self.imm, self.invalidate) {
            (Some(imm), _) => {
                wr.ex.imm_data = imm.to_be();
                bindings::ib_wr_opcode_IB_WR_SEND_WITH_IMM
            }
            (None, Some(rkey)) => {
                wr.ex.invalidate_rkey = rkey;
                bindings::ib_wr_opcode_IB_WR_SEND_WITH_INV
            }
            (None, None) => bindings::ib_wr_opcode_IB_WR_SEND,
        };
    }

    fn sge(&self, len: usize) -> bindings::ib_sge {
        bindings::ib_sge {
            addr: self.dma,
            length: len as u32,
            lkey: self.lkey,
        }
    }

    /// Makes the first `len` bytes the device wrote visible to the CPU.
    fn sync_for_cpu(&self, len: usize) {
        // SAFETY: Mapped by the type invariants; `len` is within it.
        unsafe {
            bindings::rdma_cm_rs_dma_sync_for_cpu(
                self.dev().as_ptr(),
                self.dma,
                len.min(self.data.len()),
                self.direction,
            )
        };
    }

    /// Hands the first `len` bytes to the device.
    fn sync_for_device(&self, len: usize) {
        // SAFETY: Mapped by the type invariants; `len` is within it.
        unsafe {
            bindings::rdma_cm_rs_dma_sync_for_device(
                self.dev().as_ptr(),
                self.dma,
                len.min(self.data.len()),
                self.direction,
            )
        };
    }

    /// Recovers the buffer of a completed work request.
    ///
    /// # Safety
    ///
    /// `wc` must be the completion of a work request posted with a buffer
    /// leaked by `KBox::into_raw` in this module.
    unsafe fn from_wc(wc: *mut bindings::ib_wc) -> KBox<Self> {
        // SAFETY: By the safety requirements `wr_cqe` is the `cqe` field of
        // a `Buffer`, its first field (`repr(C)`).
        unsafe { KBox::from_raw((*wc).__bindgen_anon_1.wr_cqe.cast::<Buffer>()) }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: Mapped by the type invariants, unmapped once here.
        unsafe {
            bindings::rdma_cm_rs_dma_unmap_single(
                self.dev().as_ptr(),
                self.dma,
                self.data.len(),
                self.direction,
            )
        };
    }
}

/// A request's list of entries with pages: the buffer's own bytes first,
/// if any, then the pages' DMA segments.
type SgeList = KVec<bindings::ib_sge>;

/// Pages attached to a posted send or receive, mapped for the device.
///
/// # Invariants
///
/// `pages`' scatterlist is mapped (`ib_dma_map_sg`, both directions) for
/// `pd`'s device until the object is dropped or [`Self::unmap`]ped.
struct MappedPages {
    pages: SgBuffer,
    pd: Arc<Pd>,
}

impl MappedPages {
    /// Maps `pages` for `pd`'s device, and lists them behind `head` for a
    /// request of at most `max_sge` entries (`EMSGSIZE` for more, counted
    /// before mapping: as many as the scatterlist has), each segment of
    /// `pd`'s local DMA key.  On failure the pages come back unmapped.
    fn map(
        pages: SgBuffer,
        pd: &Arc<Pd>,
        head: Option<bindings::ib_sge>,
        max_sge: u32,
    ) -> core::result::Result<(Self, SgeList), (Error, SgBuffer)> {
        let (sgl, nents) = pages.sgl();
        let wanted = nents as usize + usize::from(head.is_some());
        if wanted > max_sge as usize {
            return Err((EMSGSIZE, pages));
        }
        let mut sges = match KVec::with_capacity(wanted, GFP_KERNEL) {
            Ok(sges) => sges,
            Err(e) => return Err((e.into(), pages)),
        };
        if let Some(head) = head {
            // Cannot fail: the capacity is there.
            let _ = sges.push(head, GFP_KERNEL);
        }
        // `ib_dma_map_sg` may be called in any context; `dev` is live (held
        // by `pd`).
        let dev = pd.device().as_ptr();
        // SAFETY: As above; `sgl` is the live scatterlist of `nents` entries
        // of pages the buffer owns, mapped by nothing (the consumer's).
        let mapped = unsafe { bindings::rdma_cm_rs_dma_map_sg(dev, sgl, nents) };
        if mapped <= 0 {
            return Err((ENOMEM, pages));
        }
        let first = sges.len();
        // `ib_dma_map_sg` merges entries, never adds any.
        let mapped = mapped.min(nents as i32);
        // SAFETY: `sgl`'s first `mapped` entries are DMA segments just
        // mapped; `sges` has room for `mapped` more entries after
        // `first`, which the call writes, and which then hold valid values.
        unsafe {
            bindings::rdma_cm_rs_sg_dma_sges(
                sgl,
                mapped,
                pd.local_dma_lkey(),
                sges.as_mut_ptr().add(first),
            );
            sges.inc_len(mapped as usize);
        }
        // INVARIANT: Mapped just above.
        Ok((
            Self {
                pages,
                pd: pd.clone(),
            },
            sges,
        ))
    }

    fn unmap_dma(&self) {
        let (sgl, nents) = self.pages.sgl();
        // SAFETY: Mapped for this device with these entries (type
        // invariants); called once, by `unmap` or the drop.
        unsafe { bindings::rdma_cm_rs_dma_unmap_sg(self.pd.device().as_ptr(), sgl, nents) };
    }

    /// Unmaps the pages, which are then the CPU's again (the unmapping
    /// syncs what the device wrote for it).
    fn unmap(self) -> SgBuffer {
        self.unmap_dma();
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again: each field is
        // moved out once, here.
        unsafe {
            drop(ptr::read(&this.pd));
            ptr::read(&this.pages)
        }
    }
}

impl Drop for MappedPages {
    fn drop(&mut self) {
        self.unmap_dma();
    }
}

/// A receive buffer: DMA-mapped, owned by the consumer while not posted.
pub struct RecvBuffer(KBox<Buffer>);

impl RecvBuffer {
    /// A buffer of `capacity` bytes for the PD.
    pub fn new(pd: &Arc<Pd>, capacity: usize) -> Result<Self> {
        Ok(Self(Buffer::new(
            pd,
            capacity,
            bindings::dma_data_direction::DMA_FROM_DEVICE,
        )?))
    }

    /// The buffer of a request that completed or was never posted.
    fn back(inner: KBox<Buffer>) -> Self {
        Self(inner.handed_back())
    }

    /// Attaches `pages` to receive into once the buffer's own bytes are
    /// full (a scatter list: the buffer's capacity first, then the
    /// pages), returning the pages attached before.  A receive with pages
    /// takes one scatter entry for the buffer and one for each entry of
    /// the pages' scatterlist ([`SgBuffer::entries`]), within the QP's
    /// [`QpCaps::max_recv_sge`] (`EMSGSIZE` from the post otherwise); on
    /// an [`Srq`], within its [`SrqCaps::max_sge`] (`EMSGSIZE` otherwise).
    /// On a UD QP the datagram's global route header takes the buffer's
    /// first [`GRH_SIZE`] bytes, so the buffer needs that many at least
    /// (`EINVAL` from the post), and the payload fills the rest of the
    /// buffer, then the pages.  The pages are mapped for the device from
    /// the post to the completion, which hands them back attached, with
    /// what arrived in them ([`Self::paged_len`]).
    pub fn attach_pages(&mut self, pages: SgBuffer) -> Option<SgBuffer> {
        self.0.paged_len = 0;
        self.0.pages.replace(pages)
    }

    /// Takes the attached pages off (a receive then fills only the
    /// buffer).
    pub fn detach_pages(&mut self) -> Option<SgBuffer> {
        self.0.paged_len = 0;
        self.0.pages.take()
    }

    /// The attached pages.
    pub fn pages(&self) -> Option<&SgBuffer> {
        self.0.pages.as_ref()
    }

    /// The bytes the last completion put into the attached pages, from
    /// their start: the message's bytes past [`Self::capacity`].
    pub fn paged_len(&self) -> usize {
        self.0.paged_len
    }

    /// The bytes the last completion delivered (on a UD QP, the payload
    /// after the global route header).
    pub fn data(&self) -> &[u8] {
        &self.0.data[self.0.offset..self.0.offset + self.0.len]
    }

    /// How much one receive can take (on a UD QP, [`GRH_SIZE`] of it is
    /// the global route header).
    pub fn capacity(&self) -> usize {
        self.0.data.len()
    }

    /// The immediate data of the last completion (SEND_WITH_IMM), host order.
    pub fn imm(&self) -> Option<u32> {
        self.0.imm
    }

    /// The remote key of ours the peer invalidated with the message of the
    /// last completion (SEND_WITH_INV, `IB_WC_WITH_INVALIDATE`): the region
    /// it was registered for is no longer registered ([`Mr::is_registered`]
    /// says so, and it may be registered again).
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.0.invalidate
    }

    /// The sender of the last completion, on a UD QP.
    pub fn datagram(&self) -> Option<&Datagram> {
        self.0.datagram.as_ref()
    }

    /// The number of the QP the last completion arrived on: for a buffer
    /// posted to a [`Srq`], which of the QPs sharing it took the message
    /// (how a ULP finds the connection a request came from; a QP created
    /// where a destroyed one was waits until that one's completions were
    /// delivered).  `None` before any completion.
    pub fn qp_num(&self) -> Option<u32> {
        self.0.qp_num
    }
}

/// A send buffer: DMA-mapped, owned by the consumer while not posted.
pub struct SendBuffer(KBox<Buffer>);

impl SendBuffer {
    /// A buffer of `capacity` bytes for the PD.
    pub fn new(pd: &Arc<Pd>, capacity: usize) -> Result<Self> {
        Ok(Self(Buffer::new(
            pd,
            capacity,
            bindings::dma_data_direction::DMA_TO_DEVICE,
        )?))
    }

    /// The buffer of a request that completed or was never posted.
    fn back(inner: KBox<Buffer>) -> Self {
        Self(inner.handed_back())
    }

    /// Attaches `pages`, whose bytes are sent after the buffer's own (a
    /// gather list, as a ULP sends a header it built and data it did not
    /// copy), returning the pages attached before.  The message is then
    /// [`Self::data`] followed by all of the pages' [`SgBuffer::len`]
    /// bytes.  A send with pages takes one gather entry for the buffer's
    /// bytes (none if it has none) and one for each entry of the pages'
    /// scatterlist ([`SgBuffer::entries`]), within the QP's
    /// [`QpCaps::max_send_sge`] (`EMSGSIZE` from the post otherwise); not
    /// inline (`EINVAL`).  A datagram ([`Qp::post_send_ud`]) counts the
    /// pages in its size.  The pages are mapped for the device from the
    /// post to the completion, which hands them back attached.  On iWARP
    /// such a send is signaled even if [`Self::set_unsignaled`] asked
    /// otherwise: siw sends an unsignaled one straight from the pages, and
    /// TCP may still retransmit from them when a later request completes.
    pub fn attach_pages(&mut self, pages: SgBuffer) -> Option<SgBuffer> {
        self.0.pages.replace(pages)
    }

    /// Takes the attached pages off (a send then carries only the
    /// buffer's bytes).
    pub fn detach_pages(&mut self) -> Option<SgBuffer> {
        self.0.pages.take()
    }

    /// The attached pages.
    pub fn pages(&self) -> Option<&SgBuffer> {
        self.0.pages.as_ref()
    }

    /// The attached pages, to fill in before the buffer is posted.
    pub fn pages_mut(&mut self) -> Option<&mut SgBuffer> {
        self.0.pages.as_mut()
    }

    /// Replaces the contents; `EMSGSIZE` if `data` does not fit.
    pub fn fill(&mut self, data: &[u8]) -> Result {
        if data.len() > self.0.data.len() {
            return Err(EMSGSIZE);
        }
        self.0.data[..data.len()].copy_from_slice(data);
        self.0.len = data.len();
        Ok(())
    }

    /// The bytes that will be sent.
    pub fn data(&self) -> &[u8] {
        &self.0.data[..self.0.len]
    }

    /// Immediate data to send with the contents (SEND_WITH_IMM, host
    /// order; sent big-endian), or none (SEND).  Not every device takes it
    /// on every QP type: siw refuses SEND_WITH_IMM (`EINVAL` at the post).
    pub fn set_imm(&mut self, imm: Option<u32>) {
        self.0.imm = imm;
    }

    /// Makes the send inline (`IB_SEND_INLINE`), or not again: the driver
    /// copies the bytes into the work request when it is posted, instead of
    /// the device reading them from the buffer later, which saves small
    /// messages a DMA read.  The post refuses more bytes than the QP's
    /// [`QpCaps::max_inline_data`] (`EMSGSIZE`).  The buffer still comes
    /// back with the send's completion.
    pub fn set_inline(&mut self, inline: bool) {
        self.0.inline = inline;
    }

    /// Posts the send unsignaled (selective signaling), or signaled again:
    /// a successful unsignaled send makes no completion of its own, which
    /// saves the device a completion entry and the CPU an interrupt and a
    /// poll.  Its buffer comes back all the same, with success, through
    /// [`CompletionHandler::send_done`] just before the completion of the
    /// next signaled request on the QP's send queue (a signaled send, or
    /// a memory work request posted alone: the send queue completes in
    /// order), or
    /// when the QP shuts down.  A failed one completes on its own, like
    /// any request.  So that a send queue full of unsignaled sends still
    /// ends in a completion, the layer signals a send itself when it
    /// leaves fewer than two of the queue's credits free
    /// ([`QpCaps::max_send_wr`]; two, the room of
    /// [`Qp::register_then_send`]).  RC only:
    /// [`Qp::post_send_ud`] refuses it (`EINVAL`).
    pub fn set_unsignaled(&mut self, unsignaled: bool) {
        self.0.unsignaled = unsignaled;
    }

    /// Makes the send a SEND_WITH_INV that invalidates the peer's remote
    /// key `rkey` (remote invalidation: the peer's registration ends when
    /// the message arrives, saving it a LOCAL_INV), or a plain SEND again.
    /// RC QPs only, and not together with immediate data (`EOPNOTSUPP`,
    /// `EINVAL` from the post).
    pub fn set_invalidate(&mut self, rkey: Option<u32>) {
        self.0.invalidate = rkey;
    }

    /// How much one send can carry.
    pub fn capacity(&self) -> usize {
        self.0.data.len()
    }
}

/// Sizes of a QP's queues: the work requests the consumer keeps in flight.
/// The layer adds a spare slot to each queue (what `ib_drain_qp` needs).
///
/// No port: a QP is made through its id (`rdma_create_qp`), on the port
/// the id resolved or bound to, and the R/W API's transfers use that port
/// too ([`Qp`] records it at creation).
#[derive(Clone, Copy, Default)]
pub struct QpCaps {
    /// Send work requests in flight.
    pub max_send_wr: u32,
    /// Receive work requests in flight.
    pub max_recv_wr: u32,
    /// The most bytes a send may carry inline ([`SendBuffer::set_inline`]);
    /// 0 for none.  A device refuses a QP that asks for more than it
    /// supports (the create fails, `EINVAL` from rxe).
    pub max_inline_data: u32,
    /// Scatter/gather entries one RDMA request of the R/W API
    /// ([`Qp::rdma_rw`]) may gather from or scatter to, at most the
    /// device's `max_send_sge` (the create fails otherwise); 0 means 1.
    /// More entries take fewer requests for a buffer of many pages.  A
    /// SEND takes one, or with pages attached
    /// ([`SendBuffer::attach_pages`]) one more for each of their entries.
    pub max_send_sge: u32,
    /// Scatter entries one receive may fill: one for the buffer, and one
    /// for each entry of the pages attached to it
    /// ([`RecvBuffer::attach_pages`]); at most the device's
    /// `max_recv_sge` (the create fails otherwise); 0 means 1.
    pub max_recv_sge: u32,
    /// Transfers of the R/W API in flight, in the core's contexts: the
    /// layer counts [`RW_SLOTS_PER_CTX`] send-queue slots for each (a
    /// registration, the RDMA request, an invalidation, as devices that
    /// register need), and the QP gets at least that many (the core's
    /// `rdma_rw_init_qp` adds one or three a context, the layer two), and
    /// on devices that register a pool of as many registrations.  A transfer takes the slots of the requests it posts
    /// (more than one for a buffer of more entries than `max_send_sge`).
    /// 0: no R/W API on the QP.
    pub max_rdma_ctxs: u32,
}

/// Send-queue slots the QP reserves for each of [`QpCaps::max_rdma_ctxs`].
pub const RW_SLOTS_PER_CTX: u32 = 3;

impl QpCaps {
    /// CQ entries a QP of these sizes needs on a CQ that takes both its
    /// queues' completions: every request in flight plus two spare ones
    /// (what `ib_drain_qp` needs).
    pub fn cq_entries(&self) -> Result<u32> {
        self.send_cq_entries()?
            .checked_add(self.recv_cq_entries()?)
            .ok_or(EINVAL)
    }

    /// CQ entries a QP of these sizes needs on a CQ of its send queue's
    /// completions alone (see [`Qp::prepare`]): every send, registration,
    /// invalidation and RDMA request in flight, every slot of the R/W API
    /// (a flushed queue completes each request, signaled or not), plus one
    /// spare.
    pub fn send_cq_entries(&self) -> Result<u32> {
        self.max_send_wr
            .checked_add(1)
            .and_then(|n| n.checked_add(self.rw_slots().ok()?))
            .ok_or(EINVAL)
    }

    /// Send-queue slots of the R/W API.
    fn rw_slots(&self) -> Result<u32> {
        self.max_rdma_ctxs
            .checked_mul(RW_SLOTS_PER_CTX)
            .ok_or(EINVAL)
    }

    /// CQ entries a QP of these sizes needs on a CQ of its receive queue's
    /// completions alone: every receive in flight plus one spare.
    pub fn recv_cq_entries(&self) -> Result<u32> {
        self.max_recv_wr.checked_add(1).ok_or(EINVAL)
    }
}

/// A QP's work request queues, as its completions see them.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WrQueue {
    Send,
    Recv,
    /// A transfer of the R/W API, on the send queue: its credit counts the
    /// slots of its requests, and it completes once, with its last one.
    Rw,
}

impl WrQueue {
    /// Whether requests of this queue complete on the send CQ.
    fn on_send_cq(self) -> bool {
        self != Self::Recv
    }
}

/// The completion entry of a posted request, the first field of the
/// [`Buffer`] or [`Work`] the request owns, and the queue it was posted on
/// (whose CQ completes it).
#[derive(Clone, Copy, PartialEq, Eq)]
struct PostedCqe(NonNull<bindings::ib_cqe>, WrQueue);

// SAFETY: Only an address here; whoever dereferences it owns the request.
unsafe impl Send for PostedCqe {}

/// Whether a request of the send queue asked for a completion of its own,
/// and if not, what it is: the completion of a later request gives it back
/// (see [`WrCredits::give_back_unsignaled_before`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Signaling {
    Signaled,
    /// A SEND: its entry is the `cqe` of a [`Buffer`].
    UnsignaledSend,
    /// A registration chained before a SEND
    /// ([`Qp::register_then_send`]): its entry is the `cqe` of a [`Work`].
    UnsignaledWork,
}

/// A request of the send queue, in post order.
#[derive(Clone, Copy)]
struct SendOrder {
    cqe: PostedCqe,
    signaling: Signaling,
}

/// Work requests a QP has in flight, bounded by its [`QpCaps`].
///
/// # Invariants
///
/// * `posted` holds the completion entry of every request posted on the QP
///   whose completion has not run yet (and of one being posted), at most
///   one per credit taken (an R/W transfer's credit counts one slot or
///   more) and the shutdown's marker: its capacity, `max_send_wr +
///   max_recv_wr + rw_slots + 1`, is never exceeded.
/// * `send_order` holds, in post order, the entries of `posted` that are
///   on the send queue, until their completion (or that of a request
///   posted after an unsignaled one) takes them out; it is emptied before a
///   reclaim.  Its capacity, `max_send_wr + rw_slots + 1`, is never
///   exceeded.
#[pin_data]
struct WrCredits {
    send: AtomicU32,
    recv: AtomicU32,
    /// Send-queue slots taken by transfers of the R/W API.
    rw: AtomicU32,
    caps: QpCaps,
    #[pin]
    posted: SpinLock<KVec<PostedCqe>>,
    /// The send queue's requests in post order, which is their completion
    /// order: an unsignaled send is done once a request after it is.
    #[pin]
    send_order: SpinLock<KVec<SendOrder>>,
    /// Notified when `posted` becomes empty.
    #[pin]
    flushed: CondVar,
    /// Notified, under `posted`'s lock, when a post of an R/W transfer
    /// returned (see [`RwWork`]'s `posting`).
    #[pin]
    post_done: CondVar,
    /// Failed R/W transfers whose sink registration the peer may still
    /// write through (an iWARP READ's), with their error: their buffers
    /// go back only once the QP, and its registrations, are destroyed.
    /// At most one per R/W slot (each keeps its slots).
    #[pin]
    parked: SpinLock<KVec<(PostedCqe, i32)>>,
    /// The QP is destroyed: nothing needs parking any more.
    destroyed: AtomicBool,
    /// Requests that reach the peer wait for the peer's first message
    /// (see [`Qp::hold_sends_until_first_message`]).
    awaiting_first_message: AtomicBool,
    /// The credits of a [`Srq`], whose receives complete on the QPs
    /// attached to it, rather than of a QP.
    shared: bool,
    /// A QP's: its number, once created.
    qp_num: AtomicU32,
    /// A [`Srq`]'s: the QPs attached to it, by the address of their
    /// `ib_qp`, which is how a completion names its QP.
    #[pin]
    members: SpinLock<RBTree<usize, SrqMember>>,
}

/// A QP attached to a [`Srq`], as the SRQ's completions find it.
struct SrqMember {
    qp_num: u32,
    /// The QP's credits, for its hold until the peer's first message.
    credits: Arc<WrCredits>,
    /// The QP is shut down: its `ib_qp` may be freed, but its CQ may still
    /// hold its completions until its reclaim, which removes the entry.
    departing: bool,
}

impl WrCredits {
    /// Credits for a QP of `caps`, or with `shared` for a [`Srq`] (whose
    /// `caps` have only receives).
    fn new(caps: QpCaps, shared: bool) -> Result<Arc<Self>> {
        let total = caps
            .max_send_wr
            .checked_add(caps.max_recv_wr)
            .and_then(|n| n.checked_add(caps.rw_slots().ok()?))
            .ok_or(EINVAL)?;
        // One more for the marker of a shutdown (`Qp::post_drain_marker`).
        let posted = KVec::with_capacity(total as usize + 1, GFP_KERNEL)?;
        let sends = caps.send_cq_entries()?;
        let send_order = KVec::with_capacity(sends as usize, GFP_KERNEL)?;
        let parked = KVec::with_capacity(caps.rw_slots()? as usize, GFP_KERNEL)?;
        Arc::pin_init(
            pin_init!(Self {
                send: AtomicU32::new(0),
                recv: AtomicU32::new(0),
                rw: AtomicU32::new(0),
                caps,
                posted <- new_spinlock!(posted),
                send_order <- new_spinlock!(send_order),
                flushed <- new_condvar!(),
                post_done <- new_condvar!(),
                parked <- new_spinlock!(parked),
                destroyed: AtomicBool::new(false),
                awaiting_first_message: AtomicBool::new(false),
                shared,
                qp_num: AtomicU32::new(0),
                members <- new_spinlock!(RBTree::new()),
            }),
            GFP_KERNEL,
        )
    }

    /// For a receive of these credits that completed on the QP whose
    /// `ib_qp` is at `qp` (with a message if `arrived`): that QP's number,
    /// and its requests held until the peer's first message may go (before
    /// the handler sees the message and answers it).  `qp` is only
    /// compared, never followed: the QP may be destroyed already (its
    /// reclaim delivers what its CQ held).  `None` for a [`Srq`]'s receive
    /// on a QP that left it.
    fn received_on(&self, qp: *const bindings::ib_qp, arrived: bool) -> Option<u32> {
        if !self.shared {
            if arrived {
                self.awaiting_first_message.store(false, Ordering::Release);
            }
            return Some(self.qp_num.load(Ordering::Acquire));
        }
        let members = self.members.lock();
        let member = members.get(&(qp as usize))?;
        if arrived {
            member
                .credits
                .awaiting_first_message
                .store(false, Ordering::Release);
        }
        Some(member.qp_num)
    }

    /// A [`Srq`]'s: records the QP numbered `qp_num`, whose `ib_qp` is at
    /// `key` and whose credits are `credits`, as attached.  A QP destroyed
    /// from that address may still have completions in its CQ, which must
    /// not be taken for the new one's: the new one waits until the old
    /// one's reclaim delivered them and left (at most [`FLUSH_TIMEOUT`],
    /// the most a reclaim's wait for the CQ can take; then it takes the
    /// place).  Sleeps; not in a completion of the old QP's CQ, which the
    /// layer defers QP creation out of anyway (ids are made in process
    /// context).
    fn join(&self, key: usize, qp_num: u32, credits: Arc<WrCredits>) -> Result {
        let member = SrqMember {
            qp_num,
            credits,
            departing: false,
        };
        let node = RBTreeNode::new(key, member, GFP_KERNEL)?;
        let start = Instant::<Monotonic>::now();
        loop {
            let mut members = self.members.lock();
            let busy = members.get(&key).is_some_and(|m| m.departing);
            if !busy || start.elapsed().as_millis() > FLUSH_TIMEOUT.as_millis() {
                let gone = members.insert(node);
                drop(members);
                drop(gone);
                return Ok(());
            }
            drop(members);
            fsleep(Delta::from_millis(1));
        }
    }

    /// A [`Srq`]'s: marks the QP of `credits` recorded at `key` as shut
    /// down (see [`SrqMember`]'s `departing`).
    fn depart(&self, key: usize, credits: &Arc<WrCredits>) {
        let mut members = self.members.lock();
        if let Some(m) = members.get_mut(&key) {
            if Arc::ptr_eq(&m.credits, credits) {
                m.departing = true;
            }
        }
    }

    /// A [`Srq`]'s: forgets the QP of `credits` recorded at `key` (unless
    /// another QP took its place).
    fn leave(&self, key: usize, credits: &Arc<WrCredits>) {
        let mut members = self.members.lock();
        let ours = members
            .get(&key)
            .is_some_and(|m| Arc::ptr_eq(&m.credits, credits));
        let left = if ours { members.remove(&key) } else { None };
        drop(members);
        drop(left);
    }

    /// Waits, at most `timeout`, until no request is outstanding.
    ///
    /// With `poll`, the QP has a CQ nothing else may process
    /// ([`PollContext::Direct`]): `poll` runs before each check, with no
    /// lock held.  For the first [`FLUSH_SPIN`] it polls again at once (a
    /// poll that finds nothing yields the CPU, to the driver's flushing
    /// among others), then waits a tick between checks: a driver flushes
    /// within microseconds, and a tick is 4 ms at HZ=250.
    fn wait_flushed(&self, timeout: Delta, poll: Option<&dyn Fn()>) {
        let start = Instant::<Monotonic>::now();
        loop {
            if let Some(poll) = poll {
                poll();
            }
            let mut posted = self.posted.lock();
            if posted.is_empty() {
                return;
            }
            let left = timeout.as_millis() - start.elapsed().as_millis();
            let Ok(left) = u32::try_from(left) else {
                return;
            };
            if left == 0 {
                return;
            }
            if poll.is_some() && start.elapsed().as_nanos() < FLUSH_SPIN.as_nanos() {
                continue;
            }
            let slice = if poll.is_some() { left.min(1) } else { left };
            let woken = self
                .flushed
                .wait_interruptible_timeout(&mut posted, msecs_to_jiffies(slice));
            if let CondVarTimeoutResult::Signal { .. } = woken {
                // A pending signal (the task is being killed, say) ends
                // every interruptible wait at once: poll instead.
                drop(posted);
                fsleep(Delta::from_millis(1));
            }
        }
    }

    /// Takes the entry of one outstanding request out of the tracking.
    fn pop_posted(&self) -> Option<PostedCqe> {
        self.posted.lock().pop()
    }

    /// Whether an R/W transfer is parked or still tracked.
    fn holds_rw(&self) -> bool {
        let parked = !self.parked.lock().is_empty();
        parked || self.posted.lock().iter().any(|e| e.1 == WrQueue::Rw)
    }

    /// Records a request posted (being posted) on the send queue, after
    /// every earlier one.
    fn push_send(&self, cqe: PostedCqe, signaling: Signaling) {
        // Within the capacity (type invariants): cannot fail.  If it did,
        // an unsignaled send would come back at the shutdown only.
        if self
            .send_order
            .lock()
            .push_within_capacity(SendOrder { cqe, signaling })
            .is_err()
        {
            pr_err!("a posted send could not be ordered\n");
        }
    }

    /// Whether fewer than two of the send queue's credits are free: the
    /// request posted then asks for a completion, which gives back every
    /// unsignaled one before it.  Two, not one: a registration chained
    /// with its SEND ([`Qp::register_then_send`]) needs two, and must not
    /// wait for ever behind unsignaled requests none of which completes.
    /// Credits are taken before the post's lock, so a post sees its own.
    fn leaves_under_two_send_credits(&self) -> bool {
        self.send.load(Ordering::Acquire) >= self.caps.max_send_wr.saturating_sub(1)
    }

    /// Forgets the send queue's request `cqe` (its post failed).
    fn remove_send(&self, cqe: PostedCqe) {
        let mut order = self.send_order.lock();
        if let Some(i) = order.iter().position(|s| s.cqe == cqe) {
            // In bounds: just found.
            let _ = order.remove(i);
        }
    }

    /// Whether an unsignaled request is in flight.
    fn has_unsignaled(&self) -> bool {
        self.send_order
            .lock()
            .iter()
            .any(|s| s.signaling != Signaling::Signaled)
    }

    /// For the completion of the send queue's request `own`: the next
    /// unsignaled request posted before it and what it is, taken out of the
    /// order (the caller now owns it), which is done: the send queue completes in order on
    /// IB and RoCE, and siw, which completes an RDMA READ only when its
    /// response arrives and so may complete later requests first, still
    /// completes sends in order.  `None` once no unsignaled send is ahead
    /// of `own`, which is then taken out too (a signaled request ahead of
    /// it stays: its own completion is still to come).  `None` also if
    /// `own` is not in the order (a reclaim emptied it).
    fn take_done_before(&self, own: PostedCqe) -> Option<SendOrder> {
        let mut order = self.send_order.lock();
        let i = order.iter().position(|s| s.cqe == own)?;
        match order[..i]
            .iter()
            .position(|s| s.signaling != Signaling::Signaled)
        {
            Some(j) => {
                // In bounds: found above.
                order.remove(j).ok()
            }
            None => {
                // In bounds: found above.
                let _ = order.remove(i);
                None
            }
        }
    }

    /// For a completion of the send queue's request `own`: gives back to
    /// `handler`, in post order and before the caller reports `own`, every
    /// unsignaled request posted before it, done with success.
    fn give_back_unsignaled_before<C: CompletionHandler>(&self, handler: &C, own: PostedCqe) {
        while let Some(done) = self.take_done_before(own) {
            // Taking it out of the order made this the request's only
            // owner: a successful unsignaled request has no completion of
            // its own, a failed one's would have taken it out of the order
            // first, and a reclaim empties the order before it completes
            // anything.  Its kind says which object leaked it, the entry
            // being that object's first field (`repr(C)`).
            match done.signaling {
                Signaling::UnsignaledSend => {
                    // SAFETY: By the above, the live `Buffer` that
                    // `post_send_to` or `register_then_send` leaked.
                    let buf = unsafe { KBox::from_raw(done.cqe.0.as_ptr().cast::<Buffer>()) };
                    send_completed(handler, buf, Ok(()));
                }
                Signaling::UnsignaledWork => {
                    // SAFETY: By the above, the live `Work` that
                    // `register_then_send` leaked.
                    let work = unsafe { KBox::from_raw(done.cqe.0.as_ptr().cast::<Work>()) };
                    work_completed(handler, work, Ok(()));
                }
                // Not taken: `take_done_before` skips them.
                Signaling::Signaled => {}
            }
        }
    }

    /// Empties the send queue's order before a reclaim, which completes
    /// every request left as flushed.
    fn clear_send_order(&self) {
        self.send_order.lock().clear();
    }

    /// Tracks a request being posted (a credit's, see [`Credit::track`], or
    /// the shutdown's marker); `false` if `posted` is full.
    fn track(&self, entry: PostedCqe) -> bool {
        self.posted.lock().push_within_capacity(entry).is_ok()
    }

    /// Stops tracking a request (its completion ran, or its post failed);
    /// gone already if a reclaim took it.
    fn untrack(&self, entry: PostedCqe) {
        let mut posted = self.posted.lock();
        if let Some(i) = posted.iter().position(|&p| p == entry) {
            // In bounds: just found.
            let _ = posted.remove(i);
        }
        if posted.is_empty() {
            self.flushed.notify_all();
        }
    }

    /// One request more on `queue`: `ENOSPC` when the QP has as many in
    /// flight as its caps allow.
    fn take(self: &Arc<Self>, queue: WrQueue) -> Result<Credit> {
        self.take_n(queue, 1)
    }

    /// `slots` more on `queue` (an R/W transfer's requests): `ENOSPC` when
    /// they do not fit beside those in flight.
    fn take_n(self: &Arc<Self>, queue: WrQueue, slots: u32) -> Result<Credit> {
        let (count, max) = match queue {
            WrQueue::Send => (&self.send, self.caps.max_send_wr),
            WrQueue::Recv => (&self.recv, self.caps.max_recv_wr),
            WrQueue::Rw => (&self.rw, self.caps.rw_slots()?),
        };
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                n.checked_add(slots).filter(|&t| t <= max)
            })
            .map_err(|_| ENOSPC)?;
        Ok(Credit {
            credits: self.clone(),
            queue,
            slots,
            posted: None,
        })
    }

    /// Completes the tracking of the R/W transfer `entry`: runs `release`
    /// (which frees the transfer's resources of the QP, once) and stops
    /// tracking it, both under the lock a shutdown releases the
    /// outstanding transfers under ([`Self::release_rw`]), so that the two
    /// never overlap and a transfer is never released after its QP is
    /// gone.
    fn finish_rw(&self, entry: PostedCqe, release: impl FnOnce()) {
        let mut posted = self.posted.lock();
        release();
        if let Some(i) = posted.iter().position(|&p| p == entry) {
            // In bounds: just found.
            let _ = posted.remove(i);
        }
        if posted.is_empty() {
            self.flushed.notify_all();
        }
    }

    /// Parks the failed R/W transfer `entry` (see `parked`) with `error`:
    /// runs `release` and stops tracking it, as [`Self::finish_rw`] does,
    /// and keeps it until [`Self::take_parked`].  `false` (nothing done)
    /// once the QP is destroyed: its registrations are gone.
    fn park_rw(&self, entry: PostedCqe, error: Error, release: impl FnOnce()) -> bool {
        if self.destroyed.load(Ordering::Acquire) {
            return false;
        }
        let mut parked = self.parked.lock();
        // One per slot of the R/W queue, each keeping its slots: within
        // the capacity.  Should it fail, the transfer is handed back now.
        if parked
            .push_within_capacity((entry, error.to_errno()))
            .is_err()
        {
            pr_err!("a failed R/W transfer could not be kept until its QP's destruction\n");
            return false;
        }
        drop(parked);
        self.finish_rw(entry, release);
        true
    }

    /// After the QP's destruction: one parked transfer and its error.
    fn take_parked(&self) -> Option<(PostedCqe, Error)> {
        self.parked
            .lock()
            .pop()
            .map(|(entry, errno)| (entry, Error::from_errno(errno)))
    }

    /// For a shutdown, before the QP's destruction: runs `release` for
    /// every R/W transfer still tracked, under the lock of the tracking.
    fn release_rw(&self, mut release: impl FnMut(PostedCqe)) {
        let posted = self.posted.lock();
        for &entry in posted.iter().filter(|e| e.1 == WrQueue::Rw) {
            release(entry);
        }
    }
}

/// One request in flight; returned when dropped (at its completion, or when
/// its post failed).
struct Credit {
    credits: Arc<WrCredits>,
    queue: WrQueue,
    /// Slots of `queue` taken (more than one for an R/W transfer).
    slots: u32,
    /// The completion entry of the request, tracked from before its post.
    posted: Option<PostedCqe>,
}

impl Credit {
    /// Tracks the request whose completion entry is `cqe` (at a stable
    /// address, in the heap object the request owns) until this credit is
    /// dropped.  Called before the post: the completion may run before the
    /// post returns.
    fn track(&mut self, cqe: NonNull<bindings::ib_cqe>) {
        let entry = PostedCqe(cqe, self.queue);
        // One entry per credit, within the capacity (type invariants of
        // `WrCredits`): this cannot fail.  If it did, the request would
        // only be missing from a reclaim (a leak, never a double free).
        if self.credits.track(entry) {
            self.posted = Some(entry);
        } else {
            pr_err!("a posted request could not be tracked\n");
        }
    }

    /// For the completion of this credit's send-queue request: gives back
    /// the unsignaled sends posted before it (see
    /// [`WrCredits::give_back_unsignaled_before`]).
    fn give_back_unsignaled_before<C: CompletionHandler>(&self, handler: &C) {
        if let Some(own) = self.posted {
            self.credits.give_back_unsignaled_before(handler, own);
        }
    }
}

impl Credit {
    /// Stops tracking the request (its completion ran, or its post failed).
    fn untrack(&mut self) {
        if let Some(entry) = self.posted.take() {
            self.credits.untrack(entry);
        }
    }
}

impl Drop for Credit {
    fn drop(&mut self) {
        self.untrack();
        let count = match self.queue {
            WrQueue::Send => &self.credits.send,
            WrQueue::Recv => &self.credits.recv,
            WrQueue::Rw => &self.credits.rw,
        };
        count.fetch_sub(self.slots, Ordering::AcqRel);
    }
}

/// Stops a QP on behalf of its owner, whatever its completion handler type.
pub(crate) trait QpShutdown: Send + Sync {
    /// Stops posts, moves the QP to the error state and waits, at most
    /// [`FLUSH_TIMEOUT`], until the driver has flushed every outstanding
    /// work request through the completion handler, handing buffers and
    /// regions back.  `true` if there was a live QP, which the caller must
    /// destroy next (and nobody else may use), then call
    /// [`QpShutdown::reclaim`].  Only the first call does anything.
    fn shutdown(&self) -> bool;
    /// After the caller destroyed the QP that [`QpShutdown::shutdown`]
    /// stopped: completes the requests the driver did not flush as flushed,
    /// once the CQ has delivered whatever the driver queued before the
    /// destruction.  Runs the completion handler in the caller's context.
    fn reclaim(&self);
    /// The QP's number.
    fn qp_num(&self) -> u32;
}

/// Where a QP's completions go and its receives come from (see
/// [`Qp::prepare`]).
pub(crate) struct QpQueues<'a, C: CompletionHandler> {
    /// The CQ of the send queue's completions (and of the QP's events).
    pub(crate) send_cq: &'a Arc<Cq<C>>,
    /// The CQ of the receives' completions (also of those from `srq`).
    pub(crate) recv_cq: &'a Arc<Cq<C>>,
    /// The shared receive queue the QP takes its receives from, if any.
    pub(crate) srq: Option<&'a Arc<Srq<C>>>,
}

/// A queue pair: reliable connected or unreliable datagram.
///
/// # Invariants
///
/// * `raw` holds the live QP from [`Qp::set_created`] until
///   [`QpShutdown::shutdown`] takes it; it was created on `pd` with
///   `send_cq` and `recv_cq` (which may be one CQ), of type `qp_type`.
/// * The object owns a reservation of `send_room` entries on `send_cq` and
///   of `recv_room` on `recv_cq`.
/// * With `srq`, the QP takes its receives from it (and has no receive
///   queue of its own), and the object holds one of the SRQ's attachments
///   of `recv_cq` ([`Srq::attach_cq`]).
#[pin_data(PinnedDrop)]
pub struct Qp<C: CompletionHandler> {
    #[pin]
    raw: Mutex<Option<NonNull<bindings::ib_qp>>>,
    qp_type: QpType,
    qp_num: AtomicU32,
    /// UD: the QP's Q_Key and port, read once created.
    qkey: AtomicU32,
    port_num: AtomicU32,
    send_room: u32,
    recv_room: u32,
    max_inline_data: u32,
    /// The entries one send, and one receive, may have.
    max_send_sge: u32,
    max_recv_sge: u32,
    credits: Arc<WrCredits>,
    pd: Arc<Pd>,
    send_cq: Arc<Cq<C>>,
    recv_cq: Arc<Cq<C>>,
    /// The owner's part in [`QpEvent::CommEstablished`].
    comm_est: Option<CommEstNotify>,
    /// The shared receive queue the QP takes its receives from.
    srq: Option<Arc<Srq<C>>>,
    /// With `srq`: the address of the `ib_qp` the SRQ knows the QP by (0
    /// until created).
    srq_key: AtomicUsize,
    /// RDMA WRITEs of R/W transfers posted signaled only for siw's sake
    /// (see [`Self::rdma_rw`]).
    signaled_writes: AtomicU64,
    /// Counted while the C side may call into the module through this
    /// object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

// SAFETY: Posting is serialised by `raw`'s mutex; the pointer is only used
// under it.
unsafe impl<C: CompletionHandler> Send for Qp<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Qp<C> {}

impl<C: CompletionHandler> Qp<C> {
    /// Checks that `pd` and the CQs live on `dev` (`EXDEV`) and that the
    /// CQs have room for `caps` and the spare entries (`ENOSPC`): one CQ
    /// for both queues needs [`QpCaps::cq_entries`], a send CQ apart
    /// [`QpCaps::send_cq_entries`] and a receive CQ apart
    /// [`QpCaps::recv_cq_entries`].  With `srq`, the QP takes its
    /// receives from it: an RC QP (`EOPNOTSUPP`) of the SRQ's PD
    /// (`EINVAL`, `EXDEV`) with no receives of its own in `caps`
    /// (`EINVAL`), whose receive CQ has room for the SRQ's
    /// ([`Srq::attach_cq`]).  Reserves that room, and returns a QP
    /// object not created yet with the attributes to create it with
    /// (`qp_type`, one SGE a request, one spare slot a queue, completions
    /// only for the requests that ask for one, and the
    /// object as the context of the QP's events, which go to `comm_est` and
    /// the send CQ's handler).  The QP created from them must be destroyed
    /// while the object lives ([`Qp::set_created`]).
    pub(crate) fn prepare(
        dev: &Device,
        pd: &Arc<Pd>,
        queues: QpQueues<'_, C>,
        caps: QpCaps,
        qp_type: QpType,
        comm_est: Option<CommEstNotify>,
    ) -> Result<(Arc<Self>, bindings::ib_qp_init_attr)> {
        let QpQueues {
            send_cq,
            recv_cq,
            srq,
        } = queues;
        dev.check_same(pd.device())?;
        dev.check_same(send_cq.device())?;
        dev.check_same(recv_cq.device())?;
        if let Some(srq) = srq {
            dev.check_same(srq.pd.device())?;
            if qp_type != QpType::Rc {
                return Err(EOPNOTSUPP);
            }
            if !Arc::ptr_eq(&srq.pd, pd) || caps.max_recv_wr != 0 || caps.max_recv_sge > 1 {
                return Err(EINVAL);
            }
        }
        // Each queue's room on its CQ; one CQ for both takes the sum,
        // `cq_entries`.  A QP on an SRQ has no receive queue of its own:
        // the SRQ reserves room for its receives on each CQ it completes
        // on, once.
        let send_room = caps.send_cq_entries()?;
        let recv_room = if srq.is_some() {
            0
        } else {
            caps.recv_cq_entries()?
        };
        let mut attr: bindings::ib_qp_init_attr = pin_init::zeroed();
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.qp_type = qp_type as u32;
        // Each request says whether it wants a completion: every one the
        // layer posts does, except the sends the caller made unsignaled.
        attr.sq_sig_type = bindings::ib_sig_type_IB_SIGNAL_REQ_WR;
        if qp_type != QpType::Rc && caps.max_rdma_ctxs != 0 {
            return Err(EINVAL);
        }
        // The core adds one slot per R/W context, or three on devices that
        // register for it (`rdma_rw_init_qp`, which would also cut the
        // queue down to the device's limit): the QP's own part makes it
        // three either way, and the whole must fit the device.
        let rw_extra = caps
            .max_rdma_ctxs
            .checked_mul(RW_SLOTS_PER_CTX - 1)
            .ok_or(EINVAL)?;
        attr.cap.max_send_wr = caps
            .max_send_wr
            .checked_add(1)
            .and_then(|n| n.checked_add(rw_extra))
            .ok_or(EINVAL)?;
        if caps.send_cq_entries()? > dev.caps().max_qp_wr {
            return Err(EINVAL);
        }
        attr.cap.max_send_sge = caps.max_send_sge.max(1);
        attr.cap.max_rdma_ctxs = caps.max_rdma_ctxs;
        attr.cap.max_inline_data = caps.max_inline_data;
        if let Some(srq) = srq {
            attr.srq = srq.as_ptr();
        } else {
            attr.cap.max_recv_wr = caps.max_recv_wr.checked_add(1).ok_or(EINVAL)?;
            attr.cap.max_recv_sge = caps.max_recv_sge.max(1);
        }
        let credits = WrCredits::new(caps, false)?;
        let target = CallbackTarget::new()?;
        send_cq.reserve(send_room)?;
        if let Err(e) = recv_cq.reserve(recv_room) {
            send_cq.release(send_room);
            return Err(e);
        }
        if let Some(srq) = srq {
            if let Err(e) = srq.attach_cq(recv_cq) {
                send_cq.release(send_room);
                recv_cq.release(recv_room);
                return Err(e);
            }
        }
        let release = || {
            send_cq.release(send_room);
            recv_cq.release(recv_room);
            if let Some(srq) = srq {
                srq.detach_cq(recv_cq);
            }
        };
        // INVARIANT: Not created yet; the reservations are owned from here.
        let qp = Arc::pin_init(
            pin_init!(Self {
                raw <- new_mutex!(None),
                qp_type,
                qp_num: AtomicU32::new(0),
                qkey: AtomicU32::new(0),
                port_num: AtomicU32::new(0),
                send_room,
                recv_room,
                max_inline_data: caps.max_inline_data,
                max_send_sge: caps.max_send_sge.max(1),
                max_recv_sge: caps.max_recv_sge.max(1),
                credits,
                pd: pd.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                comm_est,
                srq: srq.cloned(),
                srq_key: AtomicUsize::new(0),
                signaled_writes: AtomicU64::new(0),
                _target: target,
            }),
            GFP_KERNEL,
        );
        match qp {
            Ok(qp) => {
                attr.event_handler = Some(qp_event_callback::<C>);
                attr.qp_context = Arc::as_ptr(&qp).cast_mut().cast();
                Ok((qp, attr))
            }
            Err(e) => {
                release();
                Err(e)
            }
        }
    }

    /// Records the QP its owner created from [`Self::prepare`]'s attributes
    /// (on a UD QP, after reading its Q_Key and port: an error leaves it
    /// unrecorded).
    ///
    /// # Safety
    ///
    /// `raw` must be a live QP created from those attributes (on this
    /// object's PD and CQ, with this object as the context of its events),
    /// which its owner destroys only after [`QpShutdown::shutdown`]
    /// returned `true`, or at once if this fails (nothing was posted to it,
    /// nothing else knows it), and in either case while it still holds a
    /// reference to this object.
    pub(crate) unsafe fn set_created(&self, raw: NonNull<bindings::ib_qp>) -> Result {
        // SAFETY: `raw` is live by the safety requirements.
        let num = unsafe { (*raw.as_ptr()).qp_num };
        self.qp_num.store(num, Ordering::Release);
        self.credits.qp_num.store(num, Ordering::Release);
        // SAFETY: As above; the CM created it on the id's port, which the
        // R/W API needs, and nothing modifies it yet.
        let port = unsafe { (*raw.as_ptr()).port };
        self.port_num.store(port, Ordering::Release);
        if let Some(srq) = &self.srq {
            // Before anything can arrive: the CM moves the QP to RTR only
            // once its owner has it.
            let key = raw.as_ptr() as usize;
            srq.credits.join(key, num, self.credits.clone())?;
            self.srq_key.store(key, Ordering::Release);
        }
        if self.qp_type == QpType::Ud {
            let (mut qkey, mut port_num) = (0u32, 0u32);
            // SAFETY: `raw` is live; both outputs are writable for the call
            // (`ib_query_qp`, process context).
            kernel::error::to_result(unsafe {
                bindings::rdma_cm_rs_query_ud_qp(raw.as_ptr(), &mut qkey, &mut port_num)
            })?;
            self.qkey.store(qkey, Ordering::Release);
            self.port_num.store(port_num, Ordering::Release);
        }
        // INVARIANT: By the safety requirements.
        *self.raw.lock() = Some(raw);
        Ok(())
    }

    /// The QP's type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// UD QPs: the Q_Key datagrams to this QP must carry.
    pub fn qkey(&self) -> u32 {
        self.qkey.load(Ordering::Acquire)
    }

    /// UD QPs: the largest datagram a send may carry, the port's active
    /// MTU now (it follows the link's: rxe changes it with the netdev's);
    /// 0 on RC QPs or when the port cannot be queried.  Sleeps.
    pub fn max_datagram(&self) -> usize {
        if self.qp_type != QpType::Ud {
            return 0;
        }
        let port = self.port_num.load(Ordering::Acquire);
        self.device()
            .port_active_mtu(port)
            .map_or(0, |mtu| mtu as usize)
    }

    /// `EOPNOTSUPP` unless the QP is of type `want`.
    /// Makes the requests that reach the peer (SEND, RDMA READ and WRITE)
    /// fail with `EAGAIN` until a message from the peer completed a
    /// receive: the passive side of an iWARP connection must not send
    /// before the active side did (`rdma_connect(3)`; MPA, RFC 5044).
    /// Registrations and invalidations stay local and are not held.
    pub(crate) fn hold_sends_until_first_message(&self) {
        self.credits
            .awaiting_first_message
            .store(true, Ordering::Release);
    }

    /// Whether requests to the peer are held until its first message (the
    /// passive side of an iWARP connection before the first receive
    /// completed): [`Self::post_send`] and [`Self::rdma`] fail with `EAGAIN`
    /// meanwhile.  A peer's RDMA WRITE completes no receive and does not
    /// count.
    pub fn awaits_first_message(&self) -> bool {
        self.credits.awaiting_first_message.load(Ordering::Acquire)
    }

    fn check_peer_spoke(&self) -> Result {
        if self.awaits_first_message() {
            Err(EAGAIN)
        } else {
            Ok(())
        }
    }

    /// What a post that returned `ret` on `raw` (under the QP's lock)
    /// means for the chain of requests starting at `first`, the driver
    /// naming `refused` as the first it did not take: `Err` only when it
    /// took none of them, which the caller then owns again.  A driver may
    /// fail a post after taking the requests, without naming one (siw
    /// queues a READ, then fails to start it on a connection that
    /// negotiated no initiator depth), or after taking the first ones of a
    /// chain: those requests are the driver's, and it may reach their
    /// memory.  They stay tracked, the QP goes to the error state, where
    /// the driver flushes what it holds (what it never completes is
    /// reclaimed at the teardown), and the post reports success.
    fn post_outcome<T>(
        &self,
        raw: NonNull<bindings::ib_qp>,
        ret: i32,
        first: *const T,
        refused: *const T,
    ) -> Result {
        if ret == 0 {
            return Ok(());
        }
        if ptr::eq(first, refused) {
            return Err(Error::from_errno(ret));
        }
        pr_warn!(
            "QP {}: the driver failed a post ({}) after taking it; moving the QP to the error state\n",
            self.qp_num(),
            ret
        );
        // SAFETY: `raw` is live under the QP's lock, which the caller holds.
        let _ = unsafe { bindings::rdma_cm_rs_modify_qp_err(raw.as_ptr()) };
        Ok(())
    }

    /// What a SEND of `buf` on this RC QP needs: a buffer of its PD
    /// (`EXDEV`, `EINVAL`), one opcode (immediate data or an invalidation,
    /// not both: `EINVAL`), inline bytes within the QP's limit
    /// (`EMSGSIZE`).
    fn check_send(&self, buf: &SendBuffer) -> Result {
        self.check_pd(&buf.0.pd)?;
        Self::check_one_opcode(buf)?;
        self.check_inline(buf)
    }

    /// A SEND carries immediate data or an invalidation, not both
    /// (`EINVAL`).
    fn check_one_opcode(buf: &SendBuffer) -> Result {
        if buf.0.imm.is_some() && buf.0.invalidate.is_some() {
            return Err(EINVAL);
        }
        Ok(())
    }

    /// An inline send fits the QP's inline limit (`EMSGSIZE`) and has no
    /// pages, which the driver would not copy (`EINVAL`).
    fn check_inline(&self, buf: &SendBuffer) -> Result {
        if buf.0.inline && buf.0.pages.is_some() {
            return Err(EINVAL);
        }
        if buf.0.inline && buf.0.len > self.max_inline_data as usize {
            return Err(EMSGSIZE);
        }
        Ok(())
    }

    /// Whether the device may transmit an unsignaled request from its
    /// pages after a later request completed: on iWARP, where siw sends an
    /// unsignaled request of a page or more straight from its pages
    /// (`MSG_SPLICE_PAGES`), and TCP may retransmit from them after a later
    /// signaled request completed, which would hand them back to be
    /// rewritten too early.  A signaled request is copied.
    fn sends_unsignaled_from_pages(&self) -> bool {
        self.device().transport() == Transport::Iwarp
    }

    /// Whether a send of `len` bytes from its buffer, with pages (`list`)
    /// or not, must be signaled whatever its buffer asks
    /// ([`Self::sends_unsignaled_from_pages`]): one with pages, and one
    /// whose buffer is a page or more (siw's `SENDPAGE_THRESH`; a buffer
    /// above 8 KiB is not slab memory, which siw would copy, but pages of
    /// their own that it splices).  Its own completion then hands the
    /// memory back, once TCP has let go of it.
    fn signals_pages(&self, len: usize, list: Option<&SgeList>) -> bool {
        (list.is_some() || len >= kernel::page::PAGE_SIZE) && self.sends_unsignaled_from_pages()
    }

    fn check_type(&self, want: QpType) -> Result {
        if self.qp_type == want {
            Ok(())
        } else {
            Err(EOPNOTSUPP)
        }
    }

    /// A destination back to the sender of a datagram this QP received:
    /// an address handle on the QP's PD (made from the receive's
    /// completion and global route header; sleeps), the sender's QP number
    /// and this QP's Q_Key (a UD service answers with its own).  `EINVAL`
    /// if the buffer holds no datagram or is of another PD, `EXDEV` of
    /// another device.
    pub fn reply_dest(&self, buf: &RecvBuffer) -> Result<UdDest> {
        self.check_type(QpType::Ud)?;
        self.check_pd(&buf.0.pd)?;
        let datagram = buf.datagram().ok_or(EINVAL)?;
        // SAFETY: The port was read from this live UD QP (`set_created`):
        // a port of its device, the PD's.
        let ah = unsafe { datagram.reply_ah(&self.pd, self.port_num.load(Ordering::Acquire)) }?;
        UdDest::new(ah, datagram.src_qp(), self.qkey(), datagram.src_gid())
    }

    /// The PD's device.
    pub fn device(&self) -> &Device {
        self.pd.device()
    }

    /// The QP's PD: buffers and regions posted to it must be of this one.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// `EXDEV` for a PD of another device, `EINVAL` for another PD of the
    /// same device.
    fn check_pd(&self, pd: &Arc<Pd>) -> Result {
        self.device().check_same(pd.device())?;
        if Arc::ptr_eq(&self.pd, pd) {
            Ok(())
        } else {
            Err(EINVAL)
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num.load(Ordering::Acquire)
    }

    /// Posts one send-queue work request that `fill` completes from a
    /// zeroed one (returning the request to post, which may embed it) while
    /// the QP is locked.  Under the lock, the request's completion entry
    /// `cqe` is tracked through `credit` before the post, and untracked if
    /// the post fails: a shutdown (which takes the QP under that lock) can
    /// therefore never reclaim a request that was not posted.
    ///
    /// # Safety
    ///
    /// `cqe` and `credit` must point into one object leaked by the caller,
    /// live until the request's completion or, if this fails, until the
    /// caller recovers it; `cqe.done` must be set.  The request `fill`
    /// returns must be one of the QP's type, and what it points to must
    /// live across the call (an address handle it names until the
    /// request's completion).
    unsafe fn post_send_raw(
        &self,
        cqe: *mut bindings::ib_cqe,
        credit: *mut Credit,
        signaled: bool,
        fill: impl FnOnce(&mut bindings::ib_send_wr) -> *const bindings::ib_send_wr,
    ) -> Result {
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err(ENOTCONN);
        };
        // SAFETY: By the safety requirements; nothing else refers to the
        // credit, a field apart from `cqe`.
        let credit = unsafe { &mut *credit };
        // SAFETY: By the safety requirements, a live entry.
        let entry = PostedCqe(unsafe { NonNull::new_unchecked(cqe) }, WrQueue::Send);
        credit.track(entry.0);
        let signaled = signaled || self.credits.leaves_under_two_send_credits();
        // Only sends are posted unsignaled through here.
        self.credits.push_send(
            entry,
            if signaled {
                Signaling::Signaled
            } else {
                Signaling::UnsignaledSend
            },
        );
        let mut wr: bindings::ib_send_wr = pin_init::zeroed();
        wr.__bindgen_anon_1.wr_cqe = cqe;
        if signaled {
            wr.send_flags = bindings::ib_send_flags_IB_SEND_SIGNALED;
        }
        let wr = fill(&mut wr);
        // A request of the QP's type (on UD an `ib_ud_wr` naming a live
        // address handle), alive with what it points to across the call;
        // the driver copies it.  `raw` is live under the lock.
        let mut refused = ptr::null();
        // SAFETY: As above; `refused` is writable for the call.
        let posted = unsafe { bindings::rdma_cm_rs_post_send(raw.as_ptr(), wr, &mut refused) };
        let ret = self.post_outcome(raw, posted, wr, refused);
        if ret.is_err() {
            self.credits.remove_send(entry);
            credit.untrack();
        }
        ret
    }

    /// Posts, on the QP `shutdown` took and moved to the error state, a
    /// signaled zero-length RDMA WRITE (as `ib_drain_sq` does): the driver
    /// flushes it after every request before it, and its completion gives
    /// back the unsignaled sends that succeeded without one.  Uses the
    /// spare slot of the send queue and the spare entry of its CQ
    /// ([`Self::prepare`]).  If it cannot be posted, those sends come back
    /// at the reclaim, as flushed.
    fn post_drain_marker(&self, raw: NonNull<bindings::ib_qp>) {
        let mut cqe: bindings::ib_cqe = pin_init::zeroed();
        cqe.done = Some(marker_done::<C>);
        let Ok(marker) = KBox::new(
            DrainMarker {
                cqe,
                credits: self.credits.clone(),
            },
            GFP_KERNEL,
        ) else {
            return;
        };
        let leaked = KBox::into_raw(marker);
        // SAFETY: `leaked` is live until its completion or the failure below.
        let cqe = unsafe { &raw mut (*leaked).cqe };
        // SAFETY: `cqe` points into the live object.
        let entry = PostedCqe(unsafe { NonNull::new_unchecked(cqe) }, WrQueue::Send);
        if !self.credits.track(entry) {
            // SAFETY: Not posted: this is the only owner.
            drop(unsafe { KBox::from_raw(leaked) });
            return;
        }
        self.credits.push_send(entry, Signaling::Signaled);
        let mut wr: bindings::ib_send_wr = pin_init::zeroed();
        wr.__bindgen_anon_1.wr_cqe = cqe;
        wr.opcode = bindings::ib_wr_opcode_IB_WR_RDMA_WRITE;
        wr.send_flags = bindings::ib_send_flags_IB_SEND_SIGNALED;
        // `raw` is live (the caller took it from `self.raw` and destroys it
        // only after the wait for this completion); `wr` lives across the
        // call, moves no data (no SGE) and names the marker, whose `done`
        // is set; the driver copies it.
        let mut refused = ptr::null();
        // SAFETY: As above; `refused` is writable for the call.
        let ret = unsafe { bindings::rdma_cm_rs_post_send(raw.as_ptr(), &wr, &mut refused) };
        // Unless the driver refused the marker itself, it may hold it: the
        // QP is in the error state already.
        if ret != 0 && ptr::eq(refused, &wr) {
            self.credits.remove_send(entry);
            self.credits.untrack(entry);
            // SAFETY: The post failed: the QP does not own the marker.
            drop(unsafe { KBox::from_raw(leaked) });
        }
    }

    /// Posts a receive of the buffer's full capacity.  On failure the buffer
    /// comes back with the error: `EXDEV`/`EINVAL` for a buffer of another
    /// device or PD, `ENOSPC` with `max_recv_wr` receives in flight,
    /// `ENOTCONN` once the QP is shut down, `EOPNOTSUPP` on a QP that takes
    /// its receives from a [`Srq`] (post them there).
    pub fn post_recv(&self, buf: RecvBuffer) -> core::result::Result<(), (Error, RecvBuffer)> {
        if self.srq.is_some() {
            return Err((EOPNOTSUPP, buf));
        }
        if let Err(e) = self.check_pd(&buf.0.pd) {
            return Err((e, buf));
        }
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err((ENOTCONN, buf));
        };
        let on_ud = self.qp_type == QpType::Ud;
        // A datagram's global route header comes first in the scatter
        // list, and the completion reads it from the buffer: the buffer
        // holds all of it, and room for payload after it or in pages.
        if on_ud {
            let least = if buf.0.pages.is_some() {
                GRH_SIZE
            } else {
                GRH_SIZE + 1
            };
            if buf.0.data.len() < least {
                return Err((EINVAL, buf));
            }
        }
        // Tracked under the QP's lock, before the post (the completion may
        // run before it returns); a failure untracks it, still under the
        // lock: a shutdown never reclaims a receive that was not posted.
        post_recv_buffer::<C>(buf, &self.credits, on_ud, self.max_recv_sge, |wr| {
            let mut refused = ptr::null();
            // SAFETY: `raw` is live under the lock; the request and its SGE
            // live across the call; `refused` is writable for it.
            let ret = unsafe { bindings::rdma_cm_rs_post_recv(raw.as_ptr(), wr, &mut refused) };
            self.post_outcome(raw, ret, wr, refused)
        })
    }

    /// Posts a SEND (or SEND_WITH_IMM, see [`SendBuffer::set_imm`], or
    /// SEND_WITH_INV, see [`SendBuffer::set_invalidate`]) of the buffer's
    /// contents (signaled) on an RC QP.  On failure the buffer comes back
    /// with the error: `EINVAL` for both immediate data and an
    /// invalidation, `EOPNOTSUPP` on a UD QP (see
    /// [`Self::post_send_ud`]), `EXDEV`/`EINVAL` for a buffer of another
    /// device or PD, `ENOSPC` with `max_send_wr` requests in flight,
    /// `ENOTCONN` once the QP is shut down, `EAGAIN` on the passive side of
    /// an iWARP connection before the peer's first message
    /// ([`Self::awaits_first_message`]).
    pub fn post_send(&self, buf: SendBuffer) -> core::result::Result<(), (Error, SendBuffer)> {
        if let Err(e) = self
            .check_type(QpType::Rc)
            .and_then(|()| Self::check_one_opcode(&buf))
        {
            return Err((e, buf));
        }
        self.post_send_to(buf, None)
    }

    /// Posts one datagram (SEND or SEND_WITH_IMM, signaled) of the buffer's
    /// contents to `dest` on a UD QP; the request holds `dest` until its
    /// completion.  Errors as [`Self::post_send`], and `EOPNOTSUPP` on an
    /// RC QP, `EXDEV`/`EINVAL` for an address handle of another device or
    /// PD, `EMSGSIZE` above [`Self::max_datagram`] (the buffer's bytes and
    /// its attached pages together).
    pub fn post_send_ud(
        &self,
        buf: SendBuffer,
        dest: &UdDest,
    ) -> core::result::Result<(), (Error, SendBuffer)> {
        if let Err(e) = self
            .check_type(QpType::Ud)
            .and_then(|()| self.check_pd(dest.ah.pd()))
        {
            return Err((e, buf));
        }
        let paged = buf.0.pages.as_ref().map_or(0, SgBuffer::len);
        if buf.0.len.saturating_add(paged) > self.max_datagram() {
            return Err((EMSGSIZE, buf));
        }
        // A datagram invalidates nothing (SEND_WITH_INV is RC only).
        if buf.0.invalidate.is_some() {
            return Err((EOPNOTSUPP, buf));
        }
        // Selective signaling is for RC: the shutdown's marker, which
        // gives back unsignaled sends, is an RDMA WRITE.
        if buf.0.unsignaled {
            return Err((EINVAL, buf));
        }
        self.post_send_to(buf, Some(dest.clone()))
    }

    fn post_send_to(
        &self,
        buf: SendBuffer,
        dest: Option<UdDest>,
    ) -> core::result::Result<(), (Error, SendBuffer)> {
        if let Err(e) = self
            .check_pd(&buf.0.pd)
            .and_then(|()| self.check_peer_spoke())
            .and_then(|()| self.check_inline(&buf))
        {
            return Err((e, buf));
        }
        let credit = match self.credits.take(WrQueue::Send) {
            Ok(credit) => credit,
            Err(e) => return Err((e, buf)),
        };
        let mut inner = buf.0;
        let head_len = inner.len;
        let list = match inner.map_pages(head_len, self.max_send_sge) {
            Ok(list) => list,
            Err(e) => return Err((e, SendBuffer(inner))),
        };
        let mut sge = bindings::ib_sge::default();
        let mut send_wr: bindings::ib_send_wr = pin_init::zeroed();
        inner.prepare_send(
            credit,
            send_done::<C>,
            &mut send_wr,
            &mut sge,
            list.as_ref(),
        );
        let unsignaled = inner.unsignaled && !self.signals_pages(inner.len, list.as_ref());
        // The request keeps the address handle; a copy of its fields goes
        // into the work request.
        let ud = dest.as_ref().map(|d| (d.ah.as_ptr(), d.qp_num, d.qkey));
        inner.dest = dest;
        let leaked = KBox::into_raw(inner);
        // SAFETY: `leaked` is live until its completion or the failure
        // below; the credit, set above, is a field apart from the entry.
        let (cqe, credit) = unsafe {
            (
                &raw mut (*leaked).cqe,
                (*leaked)
                    .credit
                    .as_mut()
                    .map_or(ptr::null_mut(), ptr::from_mut),
            )
        };
        // The UD form of the request, filled in below on UD QPs.  The bytes
        // of an inline send are read through `sge` during the post, from
        // `leaked`'s data, which lives until the completion.
        let mut ud_wr: bindings::ib_ud_wr = pin_init::zeroed();
        // SAFETY: Both point into `leaked`, recovered below on failure; its
        // `done` is set.  The address handle `ud` names is held by the
        // request (`dest`) until its completion.
        let ret = unsafe {
            self.post_send_raw(cqe, credit, !unsignaled, |wr| {
                // The SEND's fields, on the entry and flags set already.
                wr.sg_list = send_wr.sg_list;
                wr.num_sge = send_wr.num_sge;
                wr.opcode = send_wr.opcode;
                wr.ex = send_wr.ex;
                wr.send_flags |= send_wr.send_flags;
                match ud {
                    Some((ah, remote_qpn, remote_qkey)) => {
                        ud_wr.wr = *wr;
                        ud_wr.ah = ah;
                        ud_wr.remote_qpn = remote_qpn;
                        ud_wr.remote_qkey = remote_qkey;
                        // The whole request: the driver reaches the UD
                        // fields from `wr` (`ud_wr()`, container_of).
                        (&raw const ud_wr).cast()
                    }
                    None => wr,
                }
            })
        };
        if let Err(e) = ret {
            // SAFETY: The post failed: the QP does not own the buffer.
            let mut inner = unsafe { KBox::from_raw(leaked) };
            inner.credit = None;
            inner.dest = None;
            return Err((e, SendBuffer::back(inner)));
        }
        Ok(())
    }

    fn post_work(
        &self,
        done: WorkDone,
        cpu_sync: Option<(usize, usize)>,
        fill: impl FnOnce(&mut bindings::ib_send_wr) -> *const bindings::ib_send_wr,
    ) -> Result {
        self.check_type(QpType::Rc)?;
        self.check_pd(done.mr.pd())?;
        let credit = self.credits.take(WrQueue::Send)?;
        let work = KBox::new(
            Work {
                cqe: bindings::ib_cqe {
                    done: Some(work_done::<C>),
                },
                cpu_sync,
                credit,
                done,
            },
            GFP_KERNEL,
        )?;
        let leaked = KBox::into_raw(work);
        // SAFETY: `leaked` is live until its completion or the failure
        // below; the credit is a field apart from the entry.
        let (cqe, credit) = unsafe { (&raw mut (*leaked).cqe, &raw mut (*leaked).credit) };
        // SAFETY: Both point into `leaked`, recovered below on failure; its
        // `done` is set.
        let ret = unsafe { self.post_send_raw(cqe, credit, true, fill) };
        if let Err(e) = ret {
            // SAFETY: The post failed: nothing else owns the work.
            drop(unsafe { KBox::from_raw(leaked) });
            return Err(e);
        }
        Ok(())
    }

    /// Registers `mr` with `access` (`IB_WR_REG_MR`, the flags chosen for
    /// the QP's transport: see [`MrAccess::to_raw`]) under a fresh key and
    /// returns what to advertise to the peer.
    ///
    /// The key is usable by the peer once the registration has executed;
    /// the send queue runs in order, so a SEND posted after this call that
    /// carries the region is safe to act on.  Completion (or failure) is
    /// reported to [`CompletionHandler::work_done`] with `tag`.  `EBUSY` if
    /// the region is registered already (or a registration of it is
    /// prepared), `EXDEV` if it lives on another device, `EINVAL` in
    /// another PD.
    pub fn register(&self, mr: &Arc<Mr>, access: MrAccess, tag: u64) -> Result<RemoteRegion> {
        // Dropped on failure, after the guard below: the key is withdrawn.
        let mut prepared = self.prepare_registration(mr, access)?;
        let mut reg = mr.registration();
        // Registered meanwhile: an invalidation posted before failed.
        if reg.is_valid() {
            return Err(EBUSY);
        }
        let mut wr_reg: bindings::ib_reg_wr = pin_init::zeroed();
        self.post_work(
            WorkDone {
                op: WorkOp::Register,
                tag,
                mr: mr.clone(),
            },
            None,
            |wr| {
                wr_reg.wr = *wr;
                prepared.fill_reg_wr(&mut wr_reg, self.device().transport());
                (&raw const wr_reg).cast()
            },
        )?;
        Ok(prepared.posted(&mut reg))
    }

    /// Prepares a registration of `mr` with `access` for
    /// [`Self::register_then_send`]: chooses its key and records it for
    /// the PD (a peer's remote invalidation of it is never missed), so
    /// that the SEND that advertises the region can be written before one
    /// post carries both.  Errors as [`Self::register`]: while the
    /// registration is prepared, another one of the region is refused
    /// (`EBUSY`), as are requests that use it (it is not registered yet).
    pub fn prepare_registration(
        &self,
        mr: &Arc<Mr>,
        access: MrAccess,
    ) -> Result<PreparedRegistration> {
        self.check_type(QpType::Rc)?;
        self.check_pd(mr.pd())?;
        let mut reg = mr.registration();
        if reg.is_valid() || reg.prepared {
            return Err(EBUSY);
        }
        // The last registration is over (invalidated locally or by the
        // peer) and its key forgotten; the new one is recorded before the
        // post, so a remote invalidation of it is never missed.
        reg.valid = false;
        reg.withdraw_remote(mr.pd());
        let (addr, lkey, rkey) = mr.map_for_registration(&mut reg)?;
        let key = mr.pd().publish_key(rkey)?;
        reg.prepared = true;
        Ok(PreparedRegistration {
            mr: mr.clone(),
            access,
            region: RemoteRegion {
                addr,
                rkey,
                len: mr.len() as u32,
            },
            lkey,
            key: Some(key),
        })
    }

    /// Posts the registration `prepared` (`IB_WR_REG_MR`) and, chained
    /// behind it in the same post, a SEND of `send` (which usually carries
    /// [`PreparedRegistration::region`]): one doorbell, and no completion
    /// of the registration's own, as nvme-rdma sends a command with the
    /// registration of its data.  The send queue runs in order, so the
    /// peer acting on the SEND finds the key valid.
    ///
    /// The registration is unsignaled: when the SEND's completion comes (or
    /// that of a later signaled request, if `send` is unsignaled),
    /// [`CompletionHandler::work_done`] reports the registration done with
    /// `tag`, before [`CompletionHandler::send_done`] hands `send` back.  A
    /// failed registration reports its error and flushes the SEND.  The
    /// region is registered (for whatever is posted next) once this
    /// returns `Ok`, which returns what `prepared` advertises.
    ///
    /// Errors as [`Self::post_send`] (two requests of `max_send_wr`:
    /// `ENOSPC` unless both fit, `EMSGSIZE` on a queue of one), `EINVAL`
    /// for a region of another PD, `EBUSY` if the region was registered
    /// meanwhile (an invalidation posted before the preparation failed);
    /// `send` comes back, and `prepared` with it unless the driver took
    /// the registration and refused only the SEND: then the QP is in the
    /// error state (as after any post the driver failed after taking
    /// requests) and the registration completes flushed.
    pub fn register_then_send(
        &self,
        mut prepared: PreparedRegistration,
        tag: u64,
        send: SendBuffer,
    ) -> core::result::Result<RemoteRegion, (Error, Option<PreparedRegistration>, SendBuffer)> {
        if let Err(e) = self
            .check_type(QpType::Rc)
            .and_then(|()| self.check_pd(prepared.mr.pd()))
            .and_then(|()| self.check_send(&send))
            .and_then(|()| self.check_peer_spoke())
        {
            return Err((e, Some(prepared), send));
        }
        if self.credits.caps.max_send_wr < 2 {
            return Err((EMSGSIZE, Some(prepared), send));
        }
        // The region's state changes with the post, under its lock (taken
        // before the QP's, as `register` does).
        let mr = prepared.mr.clone();
        let mut reg = mr.registration();
        if reg.is_valid() {
            drop(reg);
            return Err((EBUSY, Some(prepared), send));
        }
        let credits = self
            .credits
            .take(WrQueue::Send)
            .and_then(|reg| Ok((reg, self.credits.take(WrQueue::Send)?)));
        let (reg_credit, send_credit) = match credits {
            Ok(both) => both,
            Err(e) => {
                drop(reg);
                return Err((e, Some(prepared), send));
            }
        };
        let work = KBox::new(
            Work {
                cqe: bindings::ib_cqe {
                    done: Some(work_done::<C>),
                },
                cpu_sync: None,
                credit: reg_credit,
                done: WorkDone {
                    op: WorkOp::Register,
                    tag,
                    mr: prepared.mr.clone(),
                },
            },
            GFP_KERNEL,
        );
        let work = match work {
            Ok(work) => work,
            Err(e) => {
                drop(reg);
                return Err((e.into(), Some(prepared), send));
            }
        };
        let mut inner = send.0;
        let head_len = inner.len;
        let list = match inner.map_pages(head_len, self.max_send_sge) {
            Ok(list) => list,
            Err(e) => {
                drop(reg);
                return Err((e, Some(prepared), SendBuffer(inner)));
            }
        };
        let mut sge = bindings::ib_sge::default();
        let mut send_wr: bindings::ib_send_wr = pin_init::zeroed();
        inner.prepare_send(
            send_credit,
            send_done::<C>,
            &mut send_wr,
            &mut sge,
            list.as_ref(),
        );
        let unsignaled = inner.unsignaled && !self.signals_pages(inner.len, list.as_ref());

        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            drop((guard, reg));
            inner.credit = None;
            return Err((ENOTCONN, Some(prepared), SendBuffer::back(inner)));
        };
        let (work, inner) = (KBox::into_raw(work), KBox::into_raw(inner));
        // SAFETY: Both are live until their completion or the failure
        // below; each credit is a field apart from its entry.
        let (reg_cqe, send_cqe) = unsafe { (&raw mut (*work).cqe, &raw mut (*inner).cqe) };
        // SAFETY: As above; nothing else refers to the credits yet, and
        // the entries, fields of live objects, are not null.
        unsafe {
            (*work).credit.track(NonNull::new_unchecked(reg_cqe));
            if let Some(credit) = (*inner).credit.as_mut() {
                credit.track(NonNull::new_unchecked(send_cqe));
            }
        }
        // SAFETY: Both point into live objects: not null.
        let (reg_entry, send_entry) = unsafe {
            (
                PostedCqe(NonNull::new_unchecked(reg_cqe), WrQueue::Send),
                PostedCqe(NonNull::new_unchecked(send_cqe), WrQueue::Send),
            )
        };
        // The SEND, posted after the registration, completes after it and
        // gives it back; it is signaled if it leaves under two credits.
        let signaled = !unsignaled || self.credits.leaves_under_two_send_credits();
        self.credits.push_send(reg_entry, Signaling::UnsignaledWork);
        self.credits.push_send(
            send_entry,
            if signaled {
                Signaling::Signaled
            } else {
                Signaling::UnsignaledSend
            },
        );
        send_wr.__bindgen_anon_1.wr_cqe = send_cqe;
        if signaled {
            send_wr.send_flags |= bindings::ib_send_flags_IB_SEND_SIGNALED;
        }
        let mut wr_reg: bindings::ib_reg_wr = pin_init::zeroed();
        wr_reg.wr.__bindgen_anon_1.wr_cqe = reg_cqe;
        wr_reg.wr.next = &raw mut send_wr;
        prepared.fill_reg_wr(&mut wr_reg, self.device().transport());
        let first = &raw const wr_reg.wr;
        let mut refused = ptr::null();
        // `raw` is live under the lock; the chain (the registration of a
        // live MR of the QP's PD, then the SEND and the SGE it names) lives
        // across the call, each naming its entry, whose `done` is set; the
        // driver copies it.
        // SAFETY: As above; `refused` is writable for the call.
        let posted = unsafe { bindings::rdma_cm_rs_post_send(raw.as_ptr(), first, &mut refused) };
        let only_send_refused = posted != 0 && ptr::eq(refused, &raw const send_wr);
        if let Err(e) = self.post_outcome(raw, posted, first, refused) {
            self.credits.remove_send(reg_entry);
            self.credits.remove_send(send_entry);
            // SAFETY: The driver took neither: this is their only owner.
            let (work, mut inner) = unsafe { (KBox::from_raw(work), KBox::from_raw(inner)) };
            // The credits go and stop tracking the requests while the
            // QP's lock still keeps a shutdown's reclaim off them.
            drop(work);
            inner.credit = None;
            drop((guard, reg));
            return Err((e, Some(prepared), SendBuffer::back(inner)));
        }
        if only_send_refused {
            // The registration is the driver's (flushed now that the QP is
            // in the error state); the SEND, which it never had, is the
            // caller's again, not left to be given back as done.
            self.credits.remove_send(send_entry);
            // SAFETY: The driver refused it: this is its only owner.
            let mut inner = unsafe { KBox::from_raw(inner) };
            inner.credit = None;
            drop(guard);
            let _ = prepared.posted(&mut reg);
            drop(reg);
            return Err((Error::from_errno(posted), None, SendBuffer::back(inner)));
        }
        drop(guard);
        Ok(prepared.posted(&mut reg))
    }

    /// Invalidates the region's current registration (`IB_WR_LOCAL_INV`):
    /// once it has executed, the advertised key grants nothing.  `EINVAL` if
    /// the region is not registered.
    pub fn invalidate(&self, mr: &Arc<Mr>, tag: u64) -> Result {
        self.check_type(QpType::Rc)?;
        self.check_pd(mr.pd())?;
        let mut reg = mr.registration();
        if !reg.is_valid() {
            return Err(EINVAL);
        }
        let rkey = reg.rkey;
        self.post_work(
            WorkDone {
                op: WorkOp::Invalidate,
                tag,
                mr: mr.clone(),
            },
            None,
            |wr| {
                wr.opcode = bindings::ib_wr_opcode_IB_WR_LOCAL_INV;
                wr.ex.invalidate_rkey = rkey;
                wr
            },
        )?;
        reg.valid = false;
        reg.withdraw_remote(mr.pd());
        Ok(())
    }

    /// Posts an RDMA READ (`remote` into `mr` at `offset`) or WRITE (`mr` at
    /// `offset` into `remote`) of `remote.len` bytes.  The region must be
    /// registered (its local key is used; on iWARP the sink of a READ must
    /// be registered with remote write, which [`Self::register`] grants
    /// there).  `EINVAL` for a range outside the region or an operation
    /// that is not READ/WRITE, `EAGAIN` as [`Self::post_send`].
    pub fn rdma(
        &self,
        op: WorkOp,
        mr: &Arc<Mr>,
        offset: usize,
        remote: RemoteRegion,
        tag: u64,
    ) -> Result {
        let opcode = match op {
            WorkOp::RdmaRead => bindings::ib_wr_opcode_IB_WR_RDMA_READ,
            WorkOp::RdmaWrite => bindings::ib_wr_opcode_IB_WR_RDMA_WRITE,
            _ => return Err(EINVAL),
        };
        self.check_pd(mr.pd())?;
        self.check_peer_spoke()?;
        let len = remote.len as usize;
        check_range(offset, len, mr.len())?;
        remote
            .addr
            .checked_add(u64::from(remote.len))
            .ok_or(EINVAL)?;
        // Held across the post: an invalidation cannot slip in between
        // reading the key and posting the request that uses it.
        let reg = mr.registration();
        if !reg.is_valid() {
            return Err(EINVAL);
        }
        // The region's bytes as its registration maps them: contiguous in
        // its I/O virtual addresses, however its memory lies.
        let mut sge = bindings::ib_sge {
            addr: reg.iova + offset as u64,
            length: remote.len,
            lkey: reg.lkey,
        };
        // A READ lands in `len` bytes at `offset`: the CPU sees them once
        // it completed.  A WRITE's source was synced by `Mr::write`.
        let cpu_sync = (op == WorkOp::RdmaRead).then_some((offset, len));
        let mut rdma: bindings::ib_rdma_wr = pin_init::zeroed();
        self.post_work(
            WorkDone {
                op,
                tag,
                mr: mr.clone(),
            },
            cpu_sync,
            |wr| {
                rdma.wr = *wr;
                rdma.wr.opcode = opcode;
                rdma.wr.sg_list = &raw mut sge;
                rdma.wr.num_sge = 1;
                rdma.remote_addr = remote.addr;
                rdma.rkey = remote.rkey;
                (&raw const rdma).cast()
            },
        )
    }

    /// The generic RDMA READ/WRITE API (`rdma_rw_ctx_init`/`_post`): moves
    /// the whole of `buf` from (READ) or to (WRITE) the peer's `remote`
    /// region, of the same length, with as many RDMA requests as the
    /// buffer's pages and the QP's [`QpCaps::max_send_sge`] take, and on
    /// devices that need it (an iWARP READ's sink) a registration from the
    /// QP's pool before them and an invalidation after.  The QP owns the
    /// buffer, mapped for its device, until the transfer's one completion
    /// unmaps it and hands it to [`CompletionHandler::rw_done`] with
    /// `tag`.  On iWARP each of its RDMA WRITEs is signaled (the extra
    /// completions are the layer's, [`Self::signaled_rw_writes`] counts
    /// them): siw sends an unsignaled request straight from its pages and
    /// TCP may retransmit from them after the transfer came back, while a
    /// signaled one is copied.
    ///
    /// On failure the buffer comes back with the error: `EOPNOTSUPP` on a
    /// UD QP, `EINVAL` on a QP without [`QpCaps::max_rdma_ctxs`] or for a
    /// region of another length or beyond the address space, `EAGAIN` as
    /// [`Self::post_send`], `ENOSPC` when the transfer's requests (or the
    /// registrations of the pool) do not fit beside those in flight,
    /// `EMSGSIZE` when they could never fit, `ENOTCONN` once the QP is
    /// shut down.
    pub fn rdma_rw(
        &self,
        op: RwOp,
        buf: SgBuffer,
        remote: RemoteRegion,
        tag: u64,
    ) -> core::result::Result<(), (Error, SgBuffer)> {
        self.post_rw(op, buf, remote, tag, None)
            .map_err(|(e, buf, _)| (e, buf))
    }

    /// [`Self::rdma_rw`] followed, in the same post, by a SEND of `send`
    /// (with its immediate data or invalidation, inline if asked), which
    /// the peer sees only after the transfer: a target's WRITE of the
    /// data and its response, one doorbell and one completion.  The SEND
    /// is always signaled: its completion is the transfer's, and hands
    /// `send` back to [`CompletionHandler::send_done`] right after `buf`
    /// to [`CompletionHandler::rw_done`], with the same result (a failed
    /// transfer flushes the SEND).  Errors as [`Self::rdma_rw`] and
    /// [`Self::post_send`] (the send takes one of `max_send_wr`); both
    /// buffers come back (the send in the `Option`, which holds it).
    pub fn rdma_rw_then_send(
        &self,
        op: RwOp,
        buf: SgBuffer,
        remote: RemoteRegion,
        tag: u64,
        send: SendBuffer,
    ) -> core::result::Result<(), (Error, SgBuffer, Option<SendBuffer>)> {
        self.post_rw(op, buf, remote, tag, Some(send))
    }

    fn post_rw(
        &self,
        op: RwOp,
        buf: SgBuffer,
        remote: RemoteRegion,
        tag: u64,
        then: Option<SendBuffer>,
    ) -> core::result::Result<(), (Error, SgBuffer, Option<SendBuffer>)> {
        if let Err(e) = self
            .check_type(QpType::Rc)
            .and_then(|()| self.check_peer_spoke())
        {
            return Err((e, buf, then));
        }
        let fits = usize::try_from(remote.len).is_ok_and(|len| len == buf.len())
            && remote.addr.checked_add(u64::from(remote.len)).is_some();
        let slots = match self.credits.caps.rw_slots() {
            Ok(slots) if slots > 0 && fits => slots,
            _ => return Err((EINVAL, buf, then)),
        };
        let send_credit = match &then {
            None => None,
            Some(send) => match self
                .check_send(send)
                .and_then(|()| self.credits.take(WrQueue::Send))
            {
                Ok(credit) => Some(credit),
                Err(e) => return Err((e, buf, then)),
            },
        };
        let Ok(room) = KBox::<RwWork>::new_uninit(GFP_KERNEL) else {
            return Err((ENOMEM, buf, then));
        };
        // The SEND's list with pages, kept across the post.
        let (then, then_list) = match then {
            Some(mut send) => {
                let head_len = send.0.len;
                match send.0.map_pages(head_len, self.max_send_sge) {
                    Ok(list) => (Some(send), list),
                    Err(e) => return Err((e, buf, Some(send))),
                }
            }
            None => (None, None),
        };
        let mut cqe: bindings::ib_cqe = pin_init::zeroed();
        cqe.done = Some(rw_done::<C>);
        let exposes_sink = op == RwOp::Read && self.device().transport() == Transport::Iwarp;
        // INVARIANT: Released (nothing initialised) until the context is.
        let mut work = KBox::write(
            room,
            RwWork {
                cqe,
                ctx: Opaque::zeroed(),
                released: AtomicBool::new(true),
                posting: AtomicBool::new(false),
                exposes_sink,
                sink_waits_for_placements: exposes_sink
                    && self.device().places_after_deregistration(),
                qp: ptr::null_mut(),
                port: self.port_num.load(Ordering::Acquire),
                credit: None,
                send_credit,
                then_send: then.map(|send| {
                    send.0.sync_for_device(send.0.len);
                    send.0
                }),
                done: RwDone { op, tag, buf },
            },
        );
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err(work.refused(ENOTCONN));
        };
        let (sgl, nents) = work.done.buf.sgl();
        // `raw` is an RC QP on the CM id's port with `max_rdma_ctxs`; the
        // call maps `sgl`, the buffer's unmapped scatterlist, for its device.
        // SAFETY: `raw` is live under the lock; `ctx` is zeroed, owned and
        // at a stable address; `sgl` has `nents` entries.
        let wrs = unsafe {
            bindings::rdma_rw_ctx_init(
                work.ctx.get(),
                raw.as_ptr(),
                work.port,
                sgl,
                nents,
                0,
                remote.addr,
                remote.rkey,
                op.direction(),
            )
        };
        // The pool's registrations all in use: like the slots, retry once
        // a transfer completed.
        let wrs = match u32::try_from(wrs) {
            Ok(wrs) => wrs,
            Err(_) if wrs == -(bindings::EAGAIN as i32) => return Err(work.refused(ENOSPC)),
            Err(_) => return Err(work.refused(Error::from_errno(wrs))),
        };
        // INVARIANT: From here the context holds the mapping (and
        // registrations) on the live QP, until released.
        work.qp = raw.as_ptr();
        work.released.store(false, Ordering::Relaxed);
        let credit = match self.credits.take_n(WrQueue::Rw, wrs) {
            Ok(credit) => credit,
            Err(e) => {
                work.release();
                let e = if wrs > slots { EMSGSIZE } else { e };
                return Err(work.refused(e));
            }
        };
        work.credit = Some(credit);
        let leaked = KBox::into_raw(work);
        // SAFETY: `leaked` is live until its completion or the failure below.
        let cqe = unsafe { &raw mut (*leaked).cqe };
        // SAFETY: As above.
        let entry = PostedCqe(unsafe { NonNull::new_unchecked(cqe) }, WrQueue::Rw);
        // SAFETY: As above; the credit is a field apart from `cqe`.
        if let Some(credit) = unsafe { (*leaked).credit.as_mut() } {
            credit.track(entry.0);
        }
        // Its last request asks for the completion, which gives back the
        // unsignaled sends before it.
        self.credits.push_send(entry, Signaling::Signaled);
        // The requests live in the context: its completion, which may come
        // while the driver still walks their chain, waits until the post
        // returned before it frees them.
        // SAFETY: As above.
        let work = unsafe { &*leaked };
        work.posting.store(true, Ordering::Release);
        // A SEND after the transfer carries its completion instead.
        let mut send_sge = bindings::ib_sge::default();
        let mut send_wr: bindings::ib_send_wr = pin_init::zeroed();
        let chain = match &work.then_send {
            Some(send) => {
                send.fill_send_wr(&mut send_wr, &mut send_sge, then_list.as_ref());
                send_wr.__bindgen_anon_1.wr_cqe = cqe;
                send_wr.send_flags |= bindings::ib_send_flags_IB_SEND_SIGNALED;
                &raw mut send_wr
            }
            None => ptr::null_mut(),
        };
        let (mut first, mut refused) = (ptr::null(), ptr::null());
        // Every WRITE of the transfer signaled where the device would send
        // the unsignaled ones from the buffer's pages after the transfer
        // came back ([`Self::sends_unsignaled_from_pages`]); counted here.
        let mut signaled = 0u32;
        let signal_writes = if self.sends_unsignaled_from_pages() {
            &raw mut signaled
        } else {
            ptr::null_mut()
        };
        // `cqe` (its `done` set) lives until the completion, which does not
        // free it before `posting` is cleared; the core chains the requests
        // (then `chain`, alive across the call with the SGE it names).  The
        // WRITEs signaled for iWARP complete on the helper's static entry,
        // which ignores them; each has a slot's CQ entry reserved.
        // SAFETY: `raw` is live under the lock, the context initialised on
        // it just above, `cqe` as said; `signal_writes` is NULL or a live
        // counter; both outputs are writable.
        let ret = unsafe {
            bindings::rdma_cm_rs_rw_ctx_post(
                work.ctx.get(),
                raw.as_ptr(),
                work.port,
                cqe,
                chain,
                signal_writes,
                &mut first,
                &mut refused,
            )
        };
        {
            let _tracking = self.credits.posted.lock();
            work.posting.store(false, Ordering::Release);
            self.credits.post_done.notify_all();
        }
        if let Err(e) = self.post_outcome(raw, ret, first, refused) {
            self.credits.remove_send(entry);
            // SAFETY: The driver refused it: the QP does not own the
            // transfer.
            let mut work = unsafe { KBox::from_raw(leaked) };
            work.release();
            work.credit = None;
            return Err(work.refused(e));
        }
        self.signaled_writes
            .fetch_add(u64::from(signaled), Ordering::Relaxed);
        Ok(())
    }

    /// How many RDMA WRITEs of its R/W transfers the QP signaled only so
    /// that siw copies them (see [`Self::rdma_rw`]; 0 off iWARP).
    pub fn signaled_rw_writes(&self) -> u64 {
        self.signaled_writes.load(Ordering::Relaxed)
    }

    /// For a shutdown, before the owner destroys the QP: frees what the
    /// R/W transfers still outstanding hold of it (their registrations go
    /// back to its pool, their buffers are unmapped), which their
    /// completion can no longer do once it is gone.  Their buffers stay
    /// allocated until that completion, or the reclaim, hands them back.
    fn release_rw_transfers(&self) {
        self.credits.release_rw(|entry| {
            // A tracked entry of the R/W queue is the `cqe` of a live
            // `RwWork` (first field, `repr(C)`): it is freed only after its
            // completion stopped tracking it, under the lock held here.
            // SAFETY: By the above.
            let work = unsafe { &*entry.0.as_ptr().cast::<RwWork>() };
            work.release();
        });
    }
}

impl<C: CompletionHandler> QpShutdown for Qp<C> {
    fn shutdown(&self) -> bool {
        // Stop new posts first, outside of the wait for completions.
        let raw = self.raw.lock().take();
        let Some(raw) = raw else {
            return false;
        };
        if let Some(srq) = &self.srq {
            srq.credits
                .depart(self.srq_key.load(Ordering::Acquire), &self.credits);
        }
        // `ib_modify_qp` to the error state (refused from RESET, which the
        // CM never leaves a QP in) makes the driver flush every outstanding
        // request through the CQ's workqueue, and on iWARP drops the
        // connection.
        // SAFETY: The QP is live (type invariants); nothing posts to it.
        let moved = unsafe { bindings::rdma_cm_rs_modify_qp_err(raw.as_ptr()) };
        if moved == 0 {
            // The driver now flushes every outstanding request through the
            // CQ's workqueue, or for a `Direct` CQ into the CQ, which this
            // task then polls.  The caller is not a completion of this CQ
            // (the CM defers such destructions): the wait cannot be on
            // itself.  An unsignaled send that succeeded has no completion
            // to wait for: a marker behind it gives it back.
            if self.credits.has_unsignaled() {
                self.post_drain_marker(raw);
            }
            let poll_direct = || {
                self.send_cq.poll_for_teardown();
                self.recv_cq.poll_for_teardown();
            };
            let direct = self.send_cq.poll == PollContext::Direct
                || self.recv_cq.poll == PollContext::Direct;
            self.credits
                .wait_flushed(FLUSH_TIMEOUT, direct.then_some(&poll_direct as &dyn Fn()));
        }
        // What the driver did not flush is completed after the QP's
        // destruction, when an R/W transfer could no longer give its QP
        // back what it holds of it.
        self.release_rw_transfers();
        true
    }

    fn reclaim(&self) {
        // The registrations a failed transfer's sink had are gone with the
        // QP: its buffer may go back at once.
        self.credits.destroyed.store(true, Ordering::Release);
        // Completions the driver queued before the QP was destroyed reach
        // their handlers first, and a handler still running returns (its
        // request stopped being tracked just before it was called); none
        // comes after.  A direct CQ stays held until the leftovers are
        // done (one hold when both queues share it: a second would wait
        // for the first).
        let _send_hold = self.send_cq.quiesce();
        let _recv_hold = if Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            None
        } else {
            self.recv_cq.quiesce()
        };
        // Each request left is completed on its own below, an unsignaled
        // send that may have succeeded as flushed too: none gives back
        // another.
        self.credits.clear_send_order();
        if self.credits.holds_rw() {
            // The destruction deregistered the pool's registrations, among
            // them the keys of iWARP READ sinks the peer was given; a chunk
            // of a WRITE placed through one may still be copying.  Their
            // buffers go back below.
            self.device().wait_for_late_placements();
        }
        let mut reclaimed = 0u32;
        while let Some(entry) = self.credits.pop_posted() {
            let cqe = entry.0.as_ptr();
            // The CQ the request would have completed on.
            let cq = if entry.1.on_send_cq() {
                &self.send_cq
            } else {
                &self.recv_cq
            };
            let mut wc: bindings::ib_wc = pin_init::zeroed();
            wc.__bindgen_anon_1.wr_cqe = cqe;
            wc.status = bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR;
            // `cqe` is the first field of the `Buffer` or `Work` a request
            // posted on this QP owns (`track`, under the QP's lock, only for
            // a request that was posted), whose completion did not run (it
            // would have removed the entry) and never will: the owner
            // destroyed the QP (`rdma_destroy_qp` waits until rxe and siw
            // dropped its requests without completing them) and the CQ
            // holds nothing of it any more.  Popping the entry made this
            // the object's only owner.
            // SAFETY: By the above, `cqe` is live; its `done` was set before
            // the post.
            let done = unsafe { (*cqe).done };
            if let Some(done) = done {
                // SAFETY: As above: `done` takes ownership of the request's
                // object from `wc`, as for a flushed completion of the CQ of
                // its queue, which is live.
                unsafe { done(cq.as_ptr(), &mut wc) };
                reclaimed += 1;
            }
        }
        if reclaimed > 0 {
            pr_warn!(
                "QP {}: {} requests the driver did not flush in {} ms, completed as flushed after its destruction\n",
                self.qp_num(),
                reclaimed,
                FLUSH_TIMEOUT.as_millis()
            );
        }
        // Transfers kept back because the peer could still write into
        // their sink go back now, with the error they completed with.
        while let Some((entry, error)) = self.credits.take_parked() {
            // A parked entry is the `cqe` of a released `RwWork` that
            // `park_rw` took out of the tracking (its completion returned
            // without handing it over): nothing else owns it.
            // SAFETY: By the above, the live object `KBox::into_raw` leaked.
            let work = unsafe { KBox::from_raw(entry.0.as_ptr().cast::<RwWork>()) };
            hand_back_rw(self.send_cq.handler(), work, Err(error));
        }
        // Every completion of the QP ran: the SRQ may give its address to
        // a new QP.
        if let Some(srq) = &self.srq {
            srq.credits
                .leave(self.srq_key.swap(0, Ordering::AcqRel), &self.credits);
        }
    }

    fn qp_num(&self) -> u32 {
        Qp::qp_num(self)
    }
}

#[pinned_drop]
impl<C: CompletionHandler> PinnedDrop for Qp<C> {
    fn drop(self: Pin<&mut Self>) {
        // The QP itself is destroyed by its owner after `shutdown`; the CQ
        // room goes with this object.
        self.send_cq.release(self.send_room);
        self.recv_cq.release(self.recv_room);
        if let Some(srq) = &self.srq {
            let key = self.srq_key.load(Ordering::Acquire);
            if key != 0 {
                srq.credits.leave(key, &self.credits);
            }
            srq.detach_cq(&self.recv_cq);
        }
    }
}

/// A shared receive queue (`ib_create_srq`, basic): receive buffers posted
/// once for every RC QP attached to it, each message taking the next one
/// whichever QP it arrives on, so that a server sizes its receives by its
/// load rather than by its connections.
///
/// A QP is attached at its creation (`CmId::create_qp_on_srq`), and holds
/// the SRQ: the SRQ outlives every QP on it.  A receive completes on the
/// receive CQ of the QP that took it, to that CQ's handler (of the same
/// `C`, which the types make sure of), and [`RecvBuffer::qp_num`] names
/// the QP.  The SRQ reserves room for all its receives on each CQ its QPs
/// receive on, once however many QPs share that CQ: no CQ can overflow
/// with them.
///
/// A posted buffer is the SRQ's until its completion hands it to a
/// handler.  A QP's shutdown flushes only its own queue: the receives
/// still posted stay with the SRQ for the other QPs, and one that a QP had
/// begun to fill when it failed may never complete (rxe drops its copy):
/// that buffer, and its place among the SRQ's `max_wr`, stay taken until
/// the SRQ goes ([`Srq::posted`] counts it).  The SRQ's destruction,
/// after its last QP's, frees the buffers still posted without a
/// completion: nothing can reach them any more.
///
/// # Invariants
///
/// * Once set by the constructor (and whenever the object is
///   reachable), `raw` is a live SRQ on `pd`, of at least `max_wr`
///   receives of at least `max_sge` scatter entries each, whose events'
///   context is `sink`, until the object is dropped.
/// * `sink` is a live [`SrqEventSink`] leaked by the constructor, freed by
///   the drop only once the SRQ is destroyed (one whose destruction failed
///   keeps it, and the module's code with its count of callback targets).
/// * `credits` (shared) counts and tracks every buffer posted to it whose
///   completion has not run, at most `max_wr`, and records the QPs
///   created on it that still exist.
/// * `recv_cqs` holds each CQ that a QP on the SRQ receives on, with the
///   number of such QPs; the object owns a reservation of `max_wr` entries
///   on each.
#[pin_data(PinnedDrop)]
pub struct Srq<C: CompletionHandler> {
    raw: AtomicPtr<bindings::ib_srq>,
    max_wr: u32,
    max_sge: u32,
    credits: Arc<WrCredits>,
    pd: Arc<Pd>,
    #[pin]
    recv_cqs: Mutex<KVec<(Arc<Cq<C>>, u32)>>,
    /// The context of the SRQ's events.
    sink: NonNull<SrqEventSink>,
}

/// The context of an [`Srq`]'s events, apart from it: an SRQ whose
/// destruction failed stays registered with the driver, and keeps this
/// (and the module's code) while the `Srq` itself goes.
struct SrqEventSink {
    /// Who hears of the SRQ's events.
    events: Option<Arc<dyn SrqEvents>>,
    /// Counted while the C side may call into the module through this
    /// object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

/// What an [`Srq`] is made for ([`Srq::with_caps`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SrqCaps {
    /// Receives posted at once: `1..=` the device's `max_srq_wr`.
    pub max_wr: u32,
    /// Scatter entries one receive carries (its buffer, then each entry of
    /// its attached pages, [`RecvBuffer::attach_pages`]), at most the
    /// device's `max_srq_sge`; 0 means 1.
    pub max_sge: u32,
}

/// An asynchronous event of a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrqEvent {
    /// `IB_EVENT_SRQ_LIMIT_REACHED`: fewer receives are posted than the
    /// limit [`Srq::arm_limit`] armed (which it disarmed).
    LimitReached,
    /// `IB_EVENT_SRQ_ERR`: the SRQ failed; its QPs are in error.
    Error,
    /// Another event code a driver reported for the SRQ.
    Other(u32),
}

/// Hears a [`Srq`]'s events ([`Srq::with_events`]).
pub trait SrqEvents: Send + Sync {
    /// The event.  Runs in the driver's context, which may be atomic (rxe
    /// reports the limit from its responder, under the SRQ's lock): it
    /// must not sleep, take a `Mutex`, post or drop the SRQ; a ULP that
    /// refills records the event and refills from process context.
    fn srq_event(&self, event: SrqEvent);
}

// SAFETY: Drivers serialise posts to an SRQ themselves (rxe's producer
// lock, siw's SRQ lock), from any thread; the rest is immutable or locked.
unsafe impl<C: CompletionHandler> Send for Srq<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Srq<C> {}

impl<C: CompletionHandler> Srq<C> {
    /// Creates an SRQ for `max_wr` receives in flight on `pd`.  `EINVAL`
    /// for 0 or more than the device's `max_srq_wr`
    /// ([`super::device::DeviceCaps`]), `EOPNOTSUPP` on a device without
    /// SRQs.
    pub fn new(pd: &Arc<Pd>, max_wr: u32) -> Result<Arc<Self>> {
        Self::with_caps(pd, SrqCaps { max_wr, max_sge: 1 }, None)
    }

    /// [`Self::new`], the SRQ's events to `events`.
    pub fn with_events(pd: &Arc<Pd>, max_wr: u32, events: Arc<dyn SrqEvents>) -> Result<Arc<Self>> {
        Self::with_caps(pd, SrqCaps { max_wr, max_sge: 1 }, Some(events))
    }

    /// An SRQ of `caps`, its events to `events` if any: with `max_sge`
    /// above 1 its receives scatter into attached pages.  `EINVAL` for a
    /// depth as [`Self::new`] refuses, or more entries than the device's
    /// `max_srq_sge`.
    pub fn with_caps(
        pd: &Arc<Pd>,
        caps: SrqCaps,
        events: Option<Arc<dyn SrqEvents>>,
    ) -> Result<Arc<Self>> {
        let (max_wr, max_sge) = (caps.max_wr, caps.max_sge.max(1));
        let dev = pd.device().caps();
        if dev.max_srq == 0 {
            return Err(EOPNOTSUPP);
        }
        if max_wr == 0 || max_wr > dev.max_srq_wr || max_sge > dev.max_srq_sge {
            return Err(EINVAL);
        }
        let credits = WrCredits::new(
            QpCaps {
                max_recv_wr: max_wr,
                ..QpCaps::default()
            },
            true,
        )?;
        // The context of the SRQ's events first.
        let sink = KBox::new(
            SrqEventSink {
                events,
                _target: CallbackTarget::new()?,
            },
            GFP_KERNEL,
        )?;
        // Freed by the drop, or below if the object cannot be made.
        let sink = NonNull::from(KBox::leak(sink));
        let srq = Arc::pin_init(
            pin_init!(Self {
                raw: AtomicPtr::new(ptr::null_mut()),
                max_wr,
                max_sge,
                credits,
                pd: pd.clone(),
                recv_cqs <- new_mutex!(KVec::new()),
                sink,
            }),
            GFP_KERNEL,
        )
        .inspect_err(|_| {
            // SAFETY: Leaked above, never handed to C: this is its owner.
            drop(unsafe { KBox::from_raw(sink.as_ptr()) });
        })?;
        let context = sink.as_ptr();
        // SAFETY: `pd` is live (held); `ib_create_srq` sleeps, as this may;
        // `context` (the sink) outlives the SRQ (the drop frees it only once
        // the SRQ is destroyed), and `srq_event_callback` is its handler.
        let raw = unsafe {
            bindings::rdma_cm_rs_create_srq(
                pd.as_ptr(),
                max_wr,
                max_sge,
                Some(srq_event_callback),
                context.cast(),
            )
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        // INVARIANT: Just created on `pd` for `max_wr` receives of
        // `max_sge` entries (drivers round up, never down); nothing posted
        // or attached yet.
        srq.raw.store(raw, Ordering::Release);
        Ok(srq)
    }

    /// Arms the SRQ's limit (`ib_modify_srq`, `IB_SRQ_LIMIT`): once fewer
    /// than `limit` receives are posted, the device reports
    /// [`SrqEvent::LimitReached`] once, and the limit is disarmed until
    /// armed again.  `EINVAL` unless `limit` is within `1..=max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result {
        if limit == 0 || limit > self.max_wr {
            return Err(EINVAL);
        }
        // SAFETY: Live SRQ (type invariants); `ib_modify_srq` may sleep,
        // as this may.
        kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_arm_srq_limit(self.as_ptr(), limit)
        })
    }

    /// Posts a receive of the buffer's full capacity (and its attached
    /// pages), for whichever QP on the SRQ takes the next message.  On
    /// failure the buffer comes back with the error: `EXDEV`/`EINVAL` for a
    /// buffer of another device or PD, `ENOSPC` with `max_wr` receives
    /// posted, `EMSGSIZE` for more scatter entries than
    /// [`SrqCaps::max_sge`].
    pub fn post_recv(&self, buf: RecvBuffer) -> core::result::Result<(), (Error, RecvBuffer)> {
        if let Err(e) = self.pd.device().check_same(buf.0.pd.device()) {
            return Err((e, buf));
        }
        if !Arc::ptr_eq(&self.pd, &buf.0.pd) {
            return Err((EINVAL, buf));
        }
        // Within the entries the SRQ was made for (`rdma_cm_rs_create_srq`).
        post_recv_buffer::<C>(buf, &self.credits, false, self.max_sge, |wr| {
            let (srq, mut refused) = (self.as_ptr(), ptr::null());
            // SAFETY: Live SRQ (type invariants); the request and its SGE
            // live across the call; drivers serialise concurrent posts;
            // `refused` is writable for the call.
            let ret = unsafe { bindings::rdma_cm_rs_post_srq_recv(srq, wr, &mut refused) };
            // A buffer the driver may hold stays the SRQ's: its drop frees
            // it if no completion ever comes.
            if ret != 0 && ptr::eq(refused, wr) {
                Err(Error::from_errno(ret))
            } else {
                Ok(())
            }
        })
    }

    /// Receives the SRQ takes at once.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Receives posted whose completion has not reached a handler.
    pub fn posted(&self) -> u32 {
        self.credits.recv.load(Ordering::Acquire)
    }

    /// The SRQ's PD: its buffers and its QPs' must be of this one.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    fn as_ptr(&self) -> *mut bindings::ib_srq {
        self.raw.load(Ordering::Acquire)
    }

    /// For a QP created on the SRQ that receives on `cq`: room on `cq` for
    /// every receive of the SRQ (`ENOSPC`), reserved by the first such QP
    /// and released after the last ([`Self::detach_cq`]).
    fn attach_cq(&self, cq: &Arc<Cq<C>>) -> Result {
        let mut cqs = self.recv_cqs.lock();
        if let Some(entry) = cqs.iter_mut().find(|(c, _)| Arc::ptr_eq(c, cq)) {
            entry.1 += 1;
            return Ok(());
        }
        cqs.reserve(1, GFP_KERNEL)?;
        cq.reserve(self.max_wr)?;
        // INVARIANT: Reserved just above.  Cannot fail: room reserved.
        Ok(cqs.push((cq.clone(), 1), GFP_KERNEL)?)
    }

    /// Undoes one [`Self::attach_cq`] of `cq`.
    fn detach_cq(&self, cq: &Arc<Cq<C>>) {
        let mut cqs = self.recv_cqs.lock();
        let Some(i) = cqs.iter().position(|(c, _)| Arc::ptr_eq(c, cq)) else {
            return;
        };
        cqs[i].1 -= 1;
        if cqs[i].1 == 0 {
            // INVARIANT: The reservation goes with the entry.
            cq.release(self.max_wr);
            // In bounds: just found.
            let _ = cqs.remove(i);
        }
    }
}

#[pinned_drop]
impl<C: CompletionHandler> PinnedDrop for Srq<C> {
    fn drop(self: Pin<&mut Self>) {
        let raw = self.as_ptr();
        let sink = self.sink;
        // SAFETY: The sink the constructor leaked, which no SRQ names as
        // its events' context any more (none was created, or it was
        // destroyed): this is its owner.
        let free_sink = || drop(unsafe { KBox::from_raw(sink.as_ptr()) });
        if raw.is_null() {
            // Never created: nothing was posted.
            free_sink();
            return;
        }
        // Every QP on the SRQ is gone (each holds it), and dropped after
        // its reclaim delivered what its CQ held of it.
        // SAFETY: Live SRQ (type invariants) that no QP uses any more;
        // destroyed once, here, before the sink its events name goes.
        let ret = unsafe { bindings::rdma_cm_rs_destroy_srq(raw) };
        if ret != 0 {
            // The device may still reach the buffers: they stay allocated
            // and mapped for good.  The SRQ stays too, its events naming
            // this module's trampoline and the sink, which stays with its
            // count of callback targets (the module's `DestroyQueue` waits
            // for it at unload) and a reference on the module.
            pr_err!(
                "SRQ destruction failed ({}): {} receive buffers leaked\n",
                ret,
                self.posted()
            );
            // SAFETY: Takes a reference on this module, which is live (its
            // code is running).
            unsafe { bindings::rdma_cm_rs_pin_module() };
            // The SRQ still counts as a user of its PD (a failed
            // `ib_destroy_srq_user` leaves `pd->usecnt` alone), and
            // `ib_dealloc_pd` would free it under the SRQ: its reference
            // is leaked too.
            core::mem::forget(self.pd.clone());
            return;
        }
        while let Some(entry) = self.credits.pop_posted() {
            // `entry` is the `cqe` of a `Buffer` that `post_recv_buffer`
            // leaked, its first field (`repr(C)`), whose completion never
            // ran (it would have untracked it) and never will: the SRQ and
            // its QPs are destroyed and their CQs hold nothing of them.
            // Popping it made this its only owner.
            // SAFETY: By the above, the live object `KBox::into_raw` leaked.
            drop(unsafe { KBox::from_raw(entry.0.as_ptr().cast::<Buffer>()) });
        }
        free_sink();
    }
}

/// The `event_handler` of every SRQ of this layer.
///
/// # Safety
///
/// Called by the driver only, for an SRQ created by [`Srq::with_caps`]:
/// `context` is its [`SrqEventSink`], which outlives the SRQ (freed only
/// after its destruction succeeded), and no event comes after the
/// destruction.
unsafe extern "C" fn srq_event_callback(
    event: *mut bindings::ib_event,
    context: *mut core::ffi::c_void,
) {
    // SAFETY: `context` is the live sink (the safety requirements).
    let srq = unsafe { &*context.cast::<SrqEventSink>() };
    // SAFETY: The driver passes a valid event for the call.
    let event = match unsafe { (*event).event } {
        bindings::ib_event_type_IB_EVENT_SRQ_LIMIT_REACHED => SrqEvent::LimitReached,
        bindings::ib_event_type_IB_EVENT_SRQ_ERR => SrqEvent::Error,
        other => SrqEvent::Other(other),
    };
    match &srq.events {
        Some(events) => events.srq_event(event),
        None if event == SrqEvent::Error => pr_warn!("SRQ error\n"),
        None => {}
    }
}

/// The `event_handler` of every QP of this layer.
///
/// # Safety
///
/// Called by the IB core only, for a QP created from the attributes of
/// [`Qp::prepare`] for a `Qp<C>`: `context` is that object, which lives
/// until after the QP is destroyed (the safety requirements of
/// [`Qp::set_created`]), and no event comes after the destruction.
unsafe extern "C" fn qp_event_callback<C: CompletionHandler>(
    event: *mut bindings::ib_event,
    context: *mut core::ffi::c_void,
) {
    // SAFETY: `context` is the live `Qp<C>` (the function's safety
    // requirements).
    let qp = unsafe { &*context.cast::<Qp<C>>() };
    // SAFETY: The IB core passes a valid event for the call.
    let event = QpEvent::from_raw(unsafe { (*event).event });
    if event == QpEvent::CommEstablished {
        if let Some(n) = &qp.comm_est {
            // SAFETY: The QP exists (an event of it is being reported), so
            // by `CommEstNotify`'s invariants the call is sound here.
            unsafe { (n.notify)(n.context) };
        }
    }
    qp.send_cq.handler().qp_event(qp.qp_num(), event);
}

/// Posts `buf` as a receive of its full capacity and its pages (at most
/// `max_sge` entries, `EMSGSIZE` otherwise), counted and tracked by
/// `credits` (`ENOSPC` when they are all taken), with `post`, which hands
/// the request to the driver and fails only if the driver did not take it;
/// the buffer's completion runs [`recv_done`] on the CQ of `C` it
/// completes on.  On failure the buffer comes back with the error.
fn post_recv_buffer<C: CompletionHandler>(
    buf: RecvBuffer,
    credits: &Arc<WrCredits>,
    on_ud: bool,
    max_sge: u32,
    post: impl FnOnce(&bindings::ib_recv_wr) -> Result,
) -> core::result::Result<(), (Error, RecvBuffer)> {
    let credit = match credits.take(WrQueue::Recv) {
        Ok(credit) => credit,
        Err(e) => return Err((e, buf)),
    };
    let mut inner = buf.0;
    let capacity = inner.data.len();
    // Kept across the post.
    let list = match inner.map_pages(capacity, max_sge) {
        Ok(list) => list,
        Err(e) => return Err((e, RecvBuffer(inner))),
    };
    inner.credit = Some(credit);
    inner.on_ud = on_ud;
    // The CPU may have read the buffer since its last use: give it back to
    // the device before the device writes it.
    inner.sync_for_device(inner.data.len());
    inner.cqe.done = Some(recv_done::<C>);
    let mut sge = inner.sge(capacity);
    let (sg_list, num_sge) = Buffer::sg_list(&mut sge, list.as_ref());
    let leaked = KBox::into_raw(inner);
    // SAFETY: `leaked` is live until its completion or the failure below.
    let cqe = unsafe { &raw mut (*leaked).cqe };
    // Tracked before the post (the completion may run before it returns);
    // a failure below untracks it when the credit goes.
    // SAFETY: As above; the credit is a field apart from `cqe`.
    if let Some(credit) = unsafe { (*leaked).credit.as_mut() } {
        // SAFETY: `cqe` points into the live object.
        credit.track(unsafe { NonNull::new_unchecked(cqe) });
    }
    let mut wr: bindings::ib_recv_wr = pin_init::zeroed();
    wr.__bindgen_anon_1.wr_cqe = cqe;
    wr.sg_list = sg_list;
    wr.num_sge = num_sge;
    // The buffer stays allocated and mapped until its completion recovers it.
    if let Err(e) = post(&wr) {
        // SAFETY: The driver refused it: nothing else owns the buffer.
        let mut inner = unsafe { KBox::from_raw(leaked) };
        inner.credit = None;
        return Err((e, RecvBuffer::back(inner)));
    }
    Ok(())
}

/// A posted transfer of the R/W API ([`Qp::rdma_rw`]).
///
/// # Invariants
///
/// `cqe` is the completion entry of the transfer that owns this object.
/// Unless `released`, `ctx` was initialised (`rdma_rw_ctx_init`) on the QP
/// `qp` at `port` over the scatterlist of `done.buf`, which it holds
/// mapped (and, on devices that register, registrations of the QP's
/// pool); the QP is live until `released` is set.  While `posting`, the
/// driver may still read the requests inside `ctx`.
#[repr(C)]
struct RwWork {
    cqe: bindings::ib_cqe,
    ctx: Opaque<bindings::rdma_rw_ctx>,
    released: AtomicBool,
    posting: AtomicBool,
    /// An iWARP READ: its sink is registered for the peer to write, under
    /// a key the READ request hands over and only its success revokes.
    exposes_sink: bool,
    /// An iWARP READ on a device whose placements may outlive the key's
    /// invalidation ([`Device::places_after_deregistration`]): its sink
    /// goes back a grace period after the key ended.
    sink_waits_for_placements: bool,
    qp: *mut bindings::ib_qp,
    port: u32,
    /// Returned when the transfer is taken apart at its completion.
    credit: Option<Credit>,
    /// The SEND posted after the transfer, if any, and its send-queue
    /// credit.
    send_credit: Option<Credit>,
    then_send: Option<KBox<Buffer>>,
    done: RwDone,
}

impl RwWork {
    /// Ends the context's hold on its QP and on the buffer's mapping
    /// (`rdma_rw_ctx_destroy`: registrations back to the QP's pool, the
    /// buffer unmapped, which makes a READ's bytes visible to the CPU),
    /// once.  Called by the post that failed, under the QP's lock, or
    /// under the lock of the QP's tracking by the transfer's completion
    /// ([`WrCredits::finish_rw`]) or the QP's shutdown before the QP's
    /// destruction ([`WrCredits::release_rw`]), whichever comes first: the
    /// QP is live for each.
    fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let (sgl, nents) = self.done.buf.sgl();
        // SAFETY: Not released before (the swap), so by the type invariants
        // the context was initialised on the live `qp` at `port` over
        // `sgl` of `nents` entries in this direction; it is destroyed once.
        unsafe {
            bindings::rdma_rw_ctx_destroy(
                self.ctx.get(),
                self.qp,
                self.port,
                sgl,
                nents,
                self.done.op.direction(),
            )
        };
    }

    /// `error` with the buffers of a transfer that is released (or never
    /// held them), for a post that did not happen.
    fn refused(self: KBox<Self>, error: Error) -> (Error, SgBuffer, Option<SendBuffer>) {
        let work = KBox::into_inner(self);
        (error, work.done.buf, work.then_send.map(SendBuffer::back))
    }
}

/// # Safety
///
/// Called by the CQ for a transfer posted by [`Qp::rdma_rw`] on a QP whose
/// send CQ is a `Cq<C>` (or by a reclaim, as its flushed completion).
unsafe extern "C" fn rw_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: `wc` is valid during the callback.
    let own = unsafe { (*wc).__bindgen_anon_1.wr_cqe };
    // By the safety requirements `own` is the `cqe` of an `RwWork` leaked
    // by `KBox::into_raw`, its first field (`repr(C)`), whose completion
    // runs once.  A shutdown may reach it through the tracking until it
    // is untracked below: shared until then.
    // SAFETY: As above.
    let work = unsafe { &*own.cast::<RwWork>() };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    if let (Some(credit), Some(own)) = (&work.credit, NonNull::new(own)) {
        let credits = &credit.credits;
        {
            // The poster may be between the driver's post, whose walk of
            // the chain reads the context, and its return.
            let mut tracking = credits.posted.lock();
            while work.posting.load(Ordering::Acquire) {
                credits.post_done.wait(&mut tracking);
            }
        }
        credit.give_back_unsignaled_before(handler);
        let entry = PostedCqe(own, WrQueue::Rw);
        if let (true, Err(e)) = (work.exposes_sink, result) {
            // The peer holds a key to write into the sink, which only the
            // READ's success revokes: the buffer stays the QP's until its
            // destruction deregisters the key (`Qp::reclaim`).
            if credits.park_rw(entry, e, || work.release()) {
                return;
            }
        }
        credits.finish_rw(entry, || work.release());
        if work.sink_waits_for_placements {
            // The sink's key ended before this completion (the READ's
            // READ_WITH_INV, or for a failed READ not parked, the QP's
            // destruction), but a chunk of another QP's WRITE that passed
            // the key's check before may still be copying into the sink
            // (see `Device::places_after_deregistration`).  Process
            // context: the layer offers no softirq polling, and the
            // handler already slept on `post_done` above.
            device::wait_out_late_placements();
        }
    }
    // A transfer the reclaim completes was released by the shutdown.
    work.release();
    // Untracked: nothing else reaches the object now.
    // SAFETY: As above; the only owner.
    let work = unsafe { KBox::from_raw(own.cast::<RwWork>()) };
    hand_back_rw(handler, work, result);
}

/// Hands a released, untracked transfer's buffers to `handler`.
fn hand_back_rw<C: CompletionHandler>(handler: &C, mut work: KBox<RwWork>, result: Result) {
    work.credit = None;
    work.send_credit = None;
    let RwWork {
        done, then_send, ..
    } = KBox::into_inner(work);
    handler.rw_done(done, result);
    if let Some(send) = then_send {
        handler.send_done(SendBuffer::back(send), result);
    }
}

/// A work completion's status as a result.
fn wc_result(wc: &bindings::ib_wc) -> Result {
    match wc.status {
        bindings::ib_wc_status_IB_WC_SUCCESS => Ok(()),
        bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR => Err(ECANCELED),
        bindings::ib_wc_status_IB_WC_REM_ACCESS_ERR => Err(EACCES),
        bindings::ib_wc_status_IB_WC_RETRY_EXC_ERR
        | bindings::ib_wc_status_IB_WC_RNR_RETRY_EXC_ERR => Err(EHOSTUNREACH),
        _ => Err(EIO),
    }
}

/// # Safety
///
/// Called by the CQ for a receive posted by [`Qp::post_recv`] on a QP whose
/// CQ is a `Cq<C>`, or by [`Srq::post_recv`] on a `Srq<C>` (whose QPs'
/// receive CQs are `Cq<C>`s).
unsafe extern "C" fn recv_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: By the safety requirements.
    let mut buf = unsafe { Buffer::from_wc(wc) };
    let credit = buf.credit.take();
    // SAFETY: The CQ is live during its callback; its context is the `Cq<C>`.
    let handler = unsafe { handler_of::<C>(cq) };
    // SAFETY: `wc` is valid during the callback.
    let wc = unsafe { &*wc };
    // Nothing arrived on an error: no stale bytes or sender from an
    // earlier use.
    buf.len = 0;
    buf.offset = 0;
    buf.imm = None;
    buf.invalidate = None;
    buf.datagram = None;
    buf.qp_num = None;
    buf.paged_len = 0;
    let result = wc_result(wc).and_then(|()| {
        let total = (wc.byte_len as usize).min(buf.data.len());
        buf.sync_for_cpu(total);
        // Past the buffer, the pages (unmapped, and so synced for the CPU,
        // when the buffer is handed back).
        if let Some(mapped) = &buf.mapped {
            let paged = wc.byte_len as usize - total;
            buf.paged_len = paged.min(mapped.pages.len());
        }
        if wc.wc_flags & bindings::ib_wc_flags_IB_WC_WITH_IMM as i32 != 0 {
            // SAFETY: With IB_WC_WITH_IMM the device set `imm_data`.
            buf.imm = Some(u32::from_be(unsafe { wc.ex.imm_data }));
        }
        if wc.wc_flags & bindings::ib_wc_flags_IB_WC_WITH_INVALIDATE as i32 != 0 {
            // SAFETY: With IB_WC_WITH_INVALIDATE the device set
            // `invalidate_rkey` (host order, a key of this QP's PD that it
            // invalidated before completing the receive).
            let rkey = unsafe { wc.ex.invalidate_rkey };
            buf.pd.invalidated_remotely(rkey);
            buf.invalidate = Some(rkey);
        }
        if buf.on_ud {
            // A UD receive always starts with the GRH's 40 bytes, counted
            // in `byte_len` (IBTA 11.4.1.1): fewer is a device error.
            if total < GRH_SIZE {
                return Err(EIO);
            }
            buf.datagram = Some(Datagram::new(wc, &buf.data[..GRH_SIZE]));
            buf.offset = GRH_SIZE;
            buf.len = total - GRH_SIZE;
        } else {
            buf.len = total;
        }
        Ok(buf.len + buf.paged_len)
    });
    if let Some(credit) = credit {
        // On success the peer has spoken: held sends may go.
        buf.qp_num = credit.credits.received_on(wc.qp, result.is_ok());
    }
    handler.recv_done(RecvBuffer::back(buf), result);
}

/// # Safety
///
/// Called by the CQ for a send posted by [`Qp::post_send`] on a QP whose CQ
/// is a `Cq<C>`.
unsafe extern "C" fn send_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: By the safety requirements.
    let buf = unsafe { Buffer::from_wc(wc) };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    if let Some(credit) = &buf.credit {
        credit.give_back_unsignaled_before(handler);
    }
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    send_completed(handler, buf, result);
}

/// Hands a send that is done back to `handler`, with what it held of the QP
/// (its credit) and of the destination (the address handle) let go.
fn send_completed<C: CompletionHandler>(handler: &C, mut buf: KBox<Buffer>, result: Result) {
    buf.credit = None;
    buf.dest = None;
    handler.send_done(SendBuffer::back(buf), result);
}

/// The marker a shutdown posts after unsignaled sends: its completion, which
/// comes after theirs, gives back the ones that succeeded.
///
/// # Invariants
///
/// `cqe` is the completion entry of the work request that owns this object.
#[repr(C)]
struct DrainMarker {
    cqe: bindings::ib_cqe,
    credits: Arc<WrCredits>,
}

/// # Safety
///
/// Called by the CQ for the marker [`Qp::post_drain_marker`] posted on a QP
/// whose send CQ is a `Cq<C>` (or by a reclaim, as its flushed completion).
unsafe extern "C" fn marker_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: `wc` is valid during the callback.
    let own = unsafe { (*wc).__bindgen_anon_1.wr_cqe };
    // SAFETY: By the safety requirements `own` is the `cqe` of a
    // `DrainMarker` leaked by `KBox::into_raw`, its first field
    // (`repr(C)`); its completion runs once.
    let marker = unsafe { KBox::from_raw(own.cast::<DrainMarker>()) };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    if let Some(own) = NonNull::new(own) {
        let entry = PostedCqe(own, WrQueue::Send);
        marker.credits.give_back_unsignaled_before(handler, entry);
        marker.credits.untrack(entry);
    }
}

/// A registration of a region whose key is chosen, and recorded for its
/// PD, but which is not posted yet ([`Qp::prepare_registration`]): what
/// advertises it can be written before [`Qp::register_then_send`] posts
/// both.  While it lives, no other registration of the region can start;
/// dropped unposted, it withdraws its key and frees the region for the
/// next one.
pub struct PreparedRegistration {
    mr: Arc<Mr>,
    access: MrAccess,
    region: RemoteRegion,
    lkey: u32,
    /// The key as the PD records it; taken by the post.
    key: Option<Arc<RemoteKey>>,
}

impl PreparedRegistration {
    /// What the registration will let the peer reach: to advertise.
    pub fn region(&self) -> RemoteRegion {
        self.region
    }

    /// The region to be registered.
    pub fn mr(&self) -> &Arc<Mr> {
        &self.mr
    }

    /// The `IB_WR_REG_MR` fields of the registration on a QP of
    /// `transport` (the caller sets the entry, flags and chain).
    fn fill_reg_wr(&self, wr_reg: &mut bindings::ib_reg_wr, transport: Transport) {
        wr_reg.wr.opcode = bindings::ib_wr_opcode_IB_WR_REG_MR;
        wr_reg.mr = self.mr.as_ptr();
        wr_reg.key = self.region.rkey;
        wr_reg.access = self.access.to_raw(transport);
    }

    /// Records the posted registration in the region's state `reg` (its
    /// lock held since before the post), which takes the key over, and
    /// returns what it advertises.
    fn posted(&mut self, reg: &mut Registration) -> RemoteRegion {
        reg.valid = true;
        reg.prepared = false;
        reg.lkey = self.lkey;
        reg.rkey = self.region.rkey;
        reg.iova = self.region.addr;
        reg.remote = self.key.take();
        self.region
    }
}

impl Drop for PreparedRegistration {
    fn drop(&mut self) {
        // Posted: the registration owns the key now.
        if let Some(key) = self.key.take() {
            self.mr.pd().withdraw_key(self.region.rkey, &key);
            self.mr.registration().prepared = false;
        }
    }
}

/// A posted memory work request.
///
/// # Invariants
///
/// `cqe` is the completion entry of the work request that owns this object.
#[repr(C)]
struct Work {
    cqe: bindings::ib_cqe,
    /// The range of the region to sync for the CPU on success.
    cpu_sync: Option<(usize, usize)>,
    /// Returned when the work is taken apart at its completion.
    credit: Credit,
    done: WorkDone,
}

impl Work {
    /// Recovers the work of a completion.
    ///
    /// # Safety
    ///
    /// `wc` must complete a work request posted with a `Work` leaked by
    /// `KBox::into_raw` in this module.
    unsafe fn from_wc(wc: *mut bindings::ib_wc) -> KBox<Self> {
        // SAFETY: By the safety requirements `wr_cqe` is the `cqe` of a
        // `Work`, its first field (`repr(C)`).
        unsafe { KBox::from_raw((*wc).__bindgen_anon_1.wr_cqe.cast::<Work>()) }
    }
}

/// # Safety
///
/// Called by the CQ for a work request posted by [`Qp::post_work`] or
/// [`Qp::register_then_send`] on a QP whose CQ is a `Cq<C>`.
unsafe extern "C" fn work_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: By the safety requirements.
    let work = unsafe { Work::from_wc(wc) };
    // SAFETY: The CQ is live during its callback and its context is a `Cq<C>`.
    let handler = unsafe { handler_of::<C>(cq) };
    work.credit.give_back_unsignaled_before(handler);
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    work_completed(handler, work, result);
}

/// Hands memory work that is done back to `handler`, the region's state
/// following its result.
fn work_completed<C: CompletionHandler>(handler: &C, work: KBox<Work>, result: Result) {
    let Work { done, cpu_sync, .. } = KBox::into_inner(work);
    match (done.op, &result) {
        // The region is free again: a failed registration grants nothing.
        (WorkOp::Register, Err(_)) => done.mr.registration().valid = false,
        // A failed invalidation may leave the keys valid: refuse to
        // register again; dropping the region still revokes everything.
        (WorkOp::Invalidate, Err(_)) => done.mr.registration().valid = true,
        _ => {}
    }
    if let (Some((offset, len)), Ok(())) = (cpu_sync, &result) {
        done.mr.sync_for_cpu(offset, len);
    }
    handler.work_done(done, result);
}
