// SPDX-License-Identifier: GPL-2.0

//! Completion queues ([`Cq`]) and how they are processed ([`PollContext`]).

use super::{
    completion::CompletionHandler,
    cq_wait::{CqMark, CqWaiters},
};
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
    time::{delay::fsleep, Delta, Jiffies},
};

/// Where a CQ's completions run its handler (`enum ib_poll_context`, and
/// [`PollContext::Notified`], which the core does not poll).  All are
/// process context, where a [`CompletionHandler`] may sleep; the atomic
/// one (`IB_POLL_SOFTIRQ`) is not offered (see the design notes).
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
    /// Only the CQ's owner polls it, as a [`PollContext::Direct`] one, and
    /// a task that found nothing may sleep until the device notifies a
    /// completion ([`Cq::wait_since`]): the notification wakes that task
    /// itself, with no worker in between, as a user-space completion
    /// channel wakes its reader.  A `__ib_create_cq` CQ with the layer's
    /// completion handler, armed only by a waiter.
    Notified,
}

impl PollContext {
    /// The core's poll context; `None` for [`PollContext::Notified`], which
    /// the core does not poll.
    fn as_raw(self) -> Option<bindings::ib_poll_context> {
        match self {
            Self::Workqueue => Some(bindings::ib_poll_context_IB_POLL_WORKQUEUE),
            Self::UnboundWorkqueue => Some(bindings::ib_poll_context_IB_POLL_UNBOUND_WORKQUEUE),
            Self::Direct => Some(bindings::ib_poll_context_IB_POLL_DIRECT),
            Self::Notified => None,
        }
    }

    /// Whether only the CQ's owner polls it ([`Cq::poll`]).
    pub fn owner_polls(self) -> bool {
        matches!(self, Self::Direct | Self::Notified)
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
/// `ib_req_notify_cq`: the IB core warns of an unsolicited completion); a
/// [`PollContext::Notified`] one was made by `__ib_create_cq` with
/// `notified` as its completion handler, and is armed only by
/// [`Cq::wait_since`].  The completions of either run only in the task
/// that set `polling`, while it is set (a poll, or a QP's reclaim).
#[pin_data(PinnedDrop)]
pub struct Cq<C: CompletionHandler> {
    raw: AtomicPtr<bindings::ib_cq>,
    entries: u32,
    comp_vector: u32,
    pub(super) poll: PollContext,
    /// A CQ its owner polls: the task processing it, or null.
    /// Completions run one at a time and in order, as from a workqueue:
    /// what a QP's ordering of its send queue relies on.
    polling: AtomicPtr<bindings::task_struct>,
    committed: AtomicU32,
    pub(super) handler: C,
    /// [`PollContext::Notified`]: the tasks sleeping until it has news.
    #[pin]
    waiters: CqWaiters,
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
        let target = CallbackTarget::new(owner)?;
        let cq = Arc::pin_init(
            pin_init!(Self {
                raw: AtomicPtr::new(ptr::null_mut()),
                entries,
                comp_vector,
                poll,
                polling: AtomicPtr::new(ptr::null_mut()),
                committed: AtomicU32::new(0),
                handler,
                waiters <- CqWaiters::new(c"Cq::waiters", kernel::static_lock_class!()),
                dev: dev.into(),
                _target: target,
            }),
            GFP_KERNEL,
        )?;
        let context: *const Self = &*cq;
        let raw = match poll.as_raw() {
            // SAFETY: `dev` is valid; `context` outlives the CQ (freed in
            // `drop`); the vector is the device's (checked above); the
            // caller's name is the owner's, a static string of the module,
            // which the CQ's target keeps loaded.
            Some(raw_poll) => unsafe {
                bindings::__ib_alloc_cq(
                    dev.as_ptr(),
                    context.cast_mut().cast(),
                    nr_cqe,
                    vector,
                    raw_poll,
                    owner.name().as_char_ptr(),
                )
            },
            None => {
                let attr = bindings::ib_cq_init_attr {
                    cqe: entries,
                    comp_vector,
                    flags: 0,
                };
                // The driver calls `notified` with `context` for each
                // notification a `wait_since` asked for, until the CQ is
                // destroyed (`drop`), in any context (hard interrupt, or
                // under the driver's CQ lock): it only counts and wakes.
                // No event handler: the drivers check for none, and the
                // reservations keep the CQ from overflowing.
                // SAFETY: As above; `attr` is read during the call only.
                unsafe {
                    bindings::__ib_create_cq(
                        dev.as_ptr(),
                        Some(notified::<C>),
                        None,
                        context.cast_mut().cast(),
                        &attr,
                        owner.name().as_char_ptr(),
                    )
                }
            }
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

    /// Polls a CQ its owner polls ([`PollContext::owner_polls`]): runs the
    /// handler, in the caller's context, for at most `budget` completions,
    /// and returns how many ran.  Then, so that the caller may poll in a
    /// loop, gives the CPU away: to every other runnable task when nothing was found or
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
    ///
    /// A caller that sleeps next if it found nothing ([`Cq::wait_since`])
    /// polls with [`Cq::poll_once`].
    pub fn poll(&self, budget: u32) -> Result<u32> {
        let done = self.poll_once(budget);
        if done != Err(EINVAL) {
            yield_after_poll(matches!(done, Ok(n) if n > 0));
        }
        done
    }

    /// Polls as [`Cq::poll`] does, but keeps the CPU: for a caller that
    /// polls once on its way (to take back what completed before it posts
    /// more), not in a loop.
    pub fn poll_once(&self, budget: u32) -> Result<u32> {
        if !self.poll.owner_polls() || budget == 0 {
            return Err(EINVAL);
        }
        let budget = i32::try_from(budget).unwrap_or(i32::MAX);
        let Some(_polling) = DirectPoll::try_start(self) else {
            return Err(EBUSY);
        };
        // An `IB_POLL_DIRECT` CQ, and a `__ib_create_cq` one whose handler
        // only wakes waiters, has no work item or softirq polling it, and
        // this object is its only caller of `ib_process_cq_direct`, which
        // `_polling` makes one task at a time.
        // SAFETY: Live CQ (type invariants) processed by this task alone;
        // every entry's `done` is this layer's, which takes ownership of its
        // request; the budget is positive.
        let done = unsafe { bindings::ib_process_cq_direct(self.as_ptr(), budget) };
        // At most `budget`, never negative.
        Ok(u32::try_from(done).unwrap_or(0))
    }

    /// A [`PollContext::Notified`] CQ's mark, which a caller takes after
    /// its own poll, before it may [`wait`](Cq::wait_since).
    pub fn mark(&self) -> CqMark {
        self.waiters.mark()
    }

    /// Sleeps until a [`PollContext::Notified`] CQ has news after `mark`:
    /// the device notified a completion, or a poll of the CQ ended (which
    /// may have run what the caller waits for); at once if that happened
    /// since the mark.  While another task polls, the wait is for the end
    /// of its poll; otherwise it arms the CQ, and ends at once if a
    /// completion may have come unnotified.  Interruptible; at most
    /// `timeout` (`Jiffies::MAX`: without limit), rounded up to a tick.
    /// Then the caller polls again.
    ///
    /// The caller takes the mark after its own poll (whose end is news
    /// too) and before it checks what the poll changed.
    ///
    /// The jiffies left; `ETIMEDOUT`, `ERESTARTSYS` on a signal, `EINVAL`
    /// for a CQ of another poll context.  Process context, no lock held
    /// that the CQ's handler takes.
    pub fn wait_since(&self, mark: CqMark, timeout: Jiffies) -> Result<Jiffies> {
        if self.poll != PollContext::Notified {
            return Err(EINVAL);
        }
        self.waiters.wait_since(mark, timeout, || {
            // Arming while another task polls would report what that poll
            // has yet to take, again and again: its end wakes this one.
            if !self.polling.load(Ordering::Acquire).is_null() {
                return Ok(false);
            }
            let flags = bindings::ib_cq_notify_flags_IB_CQ_NEXT_COMP
                | bindings::ib_cq_notify_flags_IB_CQ_REPORT_MISSED_EVENTS;
            // SAFETY: Live CQ (type invariants) made by `__ib_create_cq`
            // with `notified` as its handler, which any number of arming
            // calls and notifications may run; exactly one of NEXT_COMP
            // and SOLICITED is given.
            let armed = unsafe { bindings::ib_req_notify_cq(self.as_ptr(), flags) };
            kernel::error::to_result(armed.min(0)).map(|()| armed > 0)
        })
    }

    /// For a QP's teardown: processes a CQ its owner polls until
    /// it is empty, unless another task is polling it (whose poll delivers
    /// what it finds).  Nothing for a CQ polled from a workqueue.
    /// Gives the CPU away as [`Self::poll`] does: the caller polls again.
    pub(super) fn poll_for_teardown(&self) {
        if !self.poll.owner_polls() {
            return;
        }
        let found = DirectPoll::try_start(self).is_some_and(|polling| polling.drain() > 0);
        yield_after_poll(found);
    }

    /// For a QP's reclaim: for a CQ its owner polls, the right to
    /// process it, once every completion queued before has run (a poll
    /// found it empty); the reclaim completes the QP's leftovers under it,
    /// so that they too run one at a time with the CQ's others.  For a CQ
    /// polled from a workqueue, waits until its poll work is idle, and
    /// `None`.  Not from a completion handler, which the wait could be
    /// for: `LockedId::destroy_qp` refuses a task inside one, and a `CmId`
    /// dropped there is destroyed later, on the module's queue.
    pub(super) fn quiesce(&self) -> Option<DirectPoll<'_, C>> {
        if !self.poll.owner_polls() {
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

/// The right to process a CQ its owner polls ([`PollContext::owner_polls`]),
/// held by one task.
pub(super) struct DirectPoll<'a, C: CompletionHandler> {
    cq: &'a Cq<C>,
}

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
            .map(|_| Self { cq })
    }

    /// Processes the CQ until a batch finds it empty; how many completions
    /// ran.
    fn drain(&self) -> usize {
        const BATCH: i32 = 16;
        let mut total = 0;
        loop {
            // SAFETY: As in `Cq::poll_once`: a live CQ its owner polls, processed
            // by this task alone, whose entries' `done` are this layer's.
            let done = unsafe { bindings::ib_process_cq_direct(self.cq.as_ptr(), BATCH) };
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

/// After a poll of a CQ its owner polls, before the caller polls
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
        self.cq.polling.store(ptr::null_mut(), Ordering::Release);
        // After letting go, so that a waiter woken here may poll at once:
        // it found this poll running (`EBUSY`, or `Cq::wait_since` did not
        // arm the CQ for it), and this poll may have run the completion it
        // waits for, or left some in the CQ.
        if self.cq.poll == PollContext::Notified {
            self.cq.waiters.wake();
        }
    }
}

/// The completion handler of a [`PollContext::Notified`] CQ: the driver
/// calls it once per arming, on the next completion; it wakes the waiters.
///
/// # Safety
///
/// `context` is the `cq_context` of a live CQ made by [`Cq::alloc_with`]
/// for a `Cq<C>`.
unsafe extern "C" fn notified<C: CompletionHandler>(
    _cq: *mut bindings::ib_cq,
    context: *mut core::ffi::c_void,
) {
    // The `Cq<C>` is freed after `ib_destroy_cq_user`, which runs once
    // every QP of the CQ is destroyed (each holds it): a driver notifies
    // only for completions its QPs post, and its QP's destruction waits for
    // those (rxe's `rxe_cleanup` of the QP, siw's wait for `qp_free`).
    // SAFETY: By the above and the safety requirements, `context` is the
    // live `Cq<C>` that owns the CQ.
    let cq = unsafe { &*context.cast::<Cq<C>>() };
    cq.waiters.wake();
}

#[pinned_drop]
impl<C: CompletionHandler> PinnedDrop for Cq<C> {
    fn drop(self: Pin<&mut Self>) {
        let raw = self.as_ptr();
        if raw.is_null() {
            return;
        }
        if self.poll == PollContext::Notified {
            // No waiter is left (each borrows this object), no QP uses the
            // CQ.  A kernel CQ's destruction failing is a driver bug, which
            // `ib_free_cq` warns of (and frees its context all the same):
            // the same here.
            // SAFETY: Live CQ of `__ib_create_cq` whose QPs are gone (each
            // holds the CQ alive), polled by nothing; no user data.
            let destroyed = unsafe { bindings::ib_destroy_cq_user(raw, ptr::null_mut()) };
            kernel::warn_on!(destroyed != 0);
            return;
        }
        // No poll runs: `ib_free_cq` cancels a workqueue CQ's poll work,
        // and a `Cq::poll` of a direct CQ (for which `ib_free_cq` waits
        // for nothing) borrows this object.
        // SAFETY: Live CQ of `__ib_alloc_cq` whose QPs are gone (each QP
        // holds the CQ alive), polled by nothing.
        unsafe { bindings::ib_free_cq(raw) };
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
