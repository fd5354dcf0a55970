// SPDX-License-Identifier: GPL-2.0

//! Completion queues ([`Cq`]) and how they are processed ([`PollContext`]).

use super::completion::CompletionHandler;
use crate::rdma::{
    bindings,
    callback::current_task,
    device::Device,
    owner::{CallbackTarget, Owner},
};
use core::{
    ptr,
    sync::atomic::{AtomicPtr, AtomicU32, Ordering},
};
use kernel::{
    prelude::*,
    sync::{aref::ARef, Arc},
    time::{delay::fsleep, Delta},
};

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
    pub(super) poll: PollContext,
    /// [`PollContext::Direct`]: the task processing the CQ, or null.
    /// Completions run one at a time and in order, as from a workqueue:
    /// what a QP's ordering of its send queue relies on.
    polling: AtomicPtr<bindings::task_struct>,
    committed: AtomicU32,
    pub(super) handler: C,
    dev: ARef<Device>,
    /// Counted on its owner while the C side may call into the module
    /// through this object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

// SAFETY: A CQ may be used and freed from any thread; `C` is `Send + Sync`.
unsafe impl<C: CompletionHandler> Send for Cq<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Cq<C> {}

impl<C: CompletionHandler> Cq<C> {
    /// Allocates a CQ of `owner` of `entries` on `dev`, on completion
    /// vector 0, polled from [`PollContext::Workqueue`].
    pub fn alloc(owner: &Owner, dev: &Device, entries: u32, handler: C) -> Result<Arc<Self>> {
        Self::alloc_with(owner, dev, entries, 0, PollContext::Workqueue, handler)
    }

    /// Allocates a CQ of `owner` of `entries` on `dev`, bound to
    /// `comp_vector` (`EINVAL` unless below [`Device::num_comp_vectors`])
    /// and polled from `poll`.
    pub fn alloc_with(
        owner: &Owner,
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
                _target: CallbackTarget::new(owner)?,
            },
            GFP_KERNEL,
        )?;
        let context: *const Self = &*cq;
        // SAFETY: `dev` is valid; `context` outlives the CQ (freed in `drop`);
        // the vector is the device's (checked above); the caller's name is
        // the owner's, a static string of the module, which the CQ's target
        // keeps loaded.
        let raw = unsafe {
            bindings::__ib_alloc_cq(
                dev.as_ptr(),
                context.cast_mut().cast(),
                nr_cqe,
                vector,
                poll.as_raw(),
                owner.name().as_char_ptr(),
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
        yield_after_poll(matches!(done, Ok(n) if n > 0));
        done
    }

    /// For a QP's teardown: processes a [`PollContext::Direct`] CQ until
    /// it is empty, unless another task is polling it (whose poll delivers
    /// what it finds).  Nothing for a CQ polled from a workqueue.
    /// Gives the CPU away as [`Self::poll`] does: the caller polls again.
    pub(super) fn poll_for_teardown(&self) {
        if self.poll != PollContext::Direct {
            return;
        }
        let found = DirectPoll::try_start(self).is_some_and(|polling| polling.drain() > 0);
        yield_after_poll(found);
    }

    /// For a QP's reclaim: for a [`PollContext::Direct`] CQ, the right to
    /// process it, once every completion queued before has run (a poll
    /// found it empty); the reclaim completes the QP's leftovers under it,
    /// so that they too run one at a time with the CQ's others.  For a CQ
    /// polled from a workqueue, waits until its poll work is idle, and
    /// `None`.  Not from a completion handler, which the wait could be
    /// for: `LockedId::destroy_qp` refuses a task inside one, and a `CmId`
    /// dropped there is destroyed later, on the module's queue.
    pub(super) fn quiesce(&self) -> Option<DirectPoll<'_, C>> {
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

    pub(super) fn as_ptr(&self) -> *mut bindings::ib_cq {
        self.raw.load(Ordering::Acquire)
    }

    /// Reserves `n` entries for a QP; `ENOSPC` if the CQ could overflow.
    pub(super) fn reserve(&self, n: u32) -> Result {
        self.committed
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                c.checked_add(n).filter(|&t| t <= self.entries)
            })
            .map(|_| ())
            .map_err(|_| ENOSPC)
    }

    pub(super) fn release(&self, n: u32) {
        self.committed.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The right to process a [`PollContext::Direct`] CQ, held by one task.
pub(super) struct DirectPoll<'a, C: CompletionHandler>(&'a Cq<C>);

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
            yield_after_poll(true);
        }
    }
}

/// After a poll of a [`PollContext::Direct`] CQ, before the caller polls
/// again: when it `found` nothing, every other runnable task of the CPU
/// runs first (`yield`, a user-space poller's `sched_yield`: a software
/// device makes completions in tasks of its own, which must not wait for
/// the scheduler's tick); otherwise the CPU goes only if the scheduler
/// asks for it.  Process context, no spinlock held.
fn yield_after_poll(found: bool) {
    if found {
        // SAFETY: Process context with no spinlock held (the function's
        // contract), where `cond_resched` may sleep.
        unsafe { bindings::cond_resched() };
    } else {
        // SAFETY: As above, for `yield`.
        unsafe { bindings::yield_() };
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

/// The handler of a CQ's completions.
///
/// # Safety
///
/// `cq` must be live, with a `Cq<C>` as its context, for `'a`.
pub(super) unsafe fn handler_of<'a, C: CompletionHandler>(cq: *mut bindings::ib_cq) -> &'a C {
    // SAFETY: By the safety requirements.
    unsafe { &(*(*cq).cq_context.cast::<Cq<C>>()).handler }
}
