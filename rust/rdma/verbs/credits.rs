// SPDX-License-Identifier: GPL-2.0

//! A QP's accounting of its work requests: the room in its queues, the
//! requests posted and not yet completed, the order of its unsignaled
//! sends, R/W transfers parked after a failed post, SRQ membership.

use super::caps::QpCaps;
use crate::rdma::bindings;
use core::{
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicU32, Ordering},
};
use kernel::{
    new_condvar, new_spinlock,
    prelude::*,
    rbtree::{RBTree, RBTreeNode},
    sync::{Arc, CondVar, CondVarTimeoutResult, SpinLock},
    time::{delay::fsleep, msecs_to_jiffies, Delta, Instant, Monotonic},
};

/// A QP's work request queues, as its completions see them.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum WrQueue {
    Send,
    Recv,
    /// A transfer of the R/W API, on the send queue: its credit counts the
    /// slots of its requests, and it completes once, with its last one.
    Rw,
}

impl WrQueue {
    /// Whether requests of this queue complete on the send CQ.
    pub(super) fn on_send_cq(self) -> bool {
        self != Self::Recv
    }
}

/// The completion entry of a posted request, the `cqe` field of the
/// [`Buffer`] or [`Work`] the request owns, and the queue it was posted on
/// (whose CQ completes it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct PostedCqe(pub(super) NonNull<bindings::ib_cqe>, pub(super) WrQueue);

// SAFETY: Only an address here; whoever dereferences it owns the request.
unsafe impl Send for PostedCqe {}

/// Whether a request of the send queue asked for a completion of its own,
/// and if not, what it is: the completion of a later request gives it back
/// (see [`WorkLedger::give_back_unsignaled_before`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Signaling {
    Signaled,
    /// A SEND: its entry is the `cqe` of a [`Buffer`].
    UnsignaledSend,
    /// A registration chained before a SEND
    /// ([`Qp::register_then_send`]): its entry is the `cqe` of a [`Work`].
    UnsignaledWork,
}

/// Takes `entry` out of `posted`, a set: the last entry takes its place, so
/// that a completion moves one entry, not every request posted after it
/// (a cost `Documentation/rdma_cm_rs/benchmarks.rst` measured).
fn forget(posted: &mut KVec<PostedCqe>, entry: PostedCqe) {
    let Some(i) = posted.iter().position(|&p| p == entry) else {
        return;
    };
    if let Some(last) = posted.pop() {
        if let Some(slot) = posted.get_mut(i) {
            *slot = last;
        }
    }
}

/// A request of the send queue, in post order.
#[derive(Clone, Copy)]
pub(super) struct SendOrder {
    pub(super) cqe: PostedCqe,
    pub(super) signaling: Signaling,
}

/// Work requests a QP has in flight, bounded by its [`QpCaps`].
///
/// # Invariants
///
/// * `posted` holds the completion entry of every request posted on the QP
///   whose completion has not run yet (and of one being posted), in no
///   particular order (a completion's entry is replaced by the last), at most
///   one per credit taken (an R/W transfer's credit counts one slot or
///   more) and the shutdown's marker: its capacity, `max_send_wr +
///   max_recv_wr + rw_slots + 1`, is never exceeded.
/// * `send_order` holds, in post order, the entries of `posted` that are
///   on the send queue, until their completion (or that of a request
///   posted after an unsignaled one) takes them out; it is emptied before a
///   reclaim.  Its capacity, `max_send_wr + rw_slots + 1`, is never
///   exceeded.
#[pin_data]
pub(super) struct WorkLedger {
    send: AtomicU32,
    pub(super) recv: AtomicU32,
    /// Send-queue slots taken by transfers of the R/W API.
    rw: AtomicU32,
    pub(super) caps: QpCaps,
    #[pin]
    pub(super) posted: SpinLock<KVec<PostedCqe>>,
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
    pub(super) post_done: CondVar,
    /// Failed R/W transfers whose sink registration the peer may still
    /// write through (an iWARP READ's), with their error: their buffers
    /// go back only once the QP, and its registrations, are destroyed.
    /// At most one per R/W slot (each keeps its slots).
    #[pin]
    parked: SpinLock<KVec<(PostedCqe, i32)>>,
    /// The QP is destroyed: nothing needs parking any more.
    pub(super) destroyed: AtomicBool,
    /// Requests that reach the peer wait for the peer's first message
    /// (see [`Qp::hold_sends_until_first_message`]).
    pub(super) awaiting_first_message: AtomicBool,
    /// The credits of a [`Srq`], whose receives complete on the QPs
    /// attached to it, rather than of a QP.
    shared: bool,
    /// A QP's: its number, once created.
    pub(super) qp_num: AtomicU32,
    /// A [`Srq`]'s: the QPs attached to it, by the address of their
    /// `ib_qp`, which is how a completion names its QP.
    #[pin]
    members: SpinLock<RBTree<usize, SrqMember>>,
}

/// A QP attached to a [`Srq`], as the SRQ's completions find it.
struct SrqMember {
    qp_num: u32,
    /// The QP's credits, for its hold until the peer's first message.
    credits: Arc<WorkLedger>,
    /// The QP is shut down: its `ib_qp` may be freed, but its CQ may still
    /// hold its completions until its reclaim, which removes the entry.
    departing: bool,
}

impl WorkLedger {
    /// Credits for a QP of `caps`, or with `shared` for a [`Srq`] (whose
    /// `caps` have only receives).
    pub(super) fn new(caps: QpCaps, shared: bool) -> Result<Arc<Self>> {
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
    pub(super) fn received_on(&self, qp: *const bindings::ib_qp, arrived: bool) -> Option<u32> {
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
    pub(super) fn join(&self, key: usize, qp_num: u32, credits: Arc<WorkLedger>) -> Result {
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
    pub(super) fn depart(&self, key: usize, credits: &Arc<WorkLedger>) {
        let mut members = self.members.lock();
        if let Some(m) = members.get_mut(&key) {
            if Arc::ptr_eq(&m.credits, credits) {
                m.departing = true;
            }
        }
    }

    /// A [`Srq`]'s: forgets the QP of `credits` recorded at `key` (unless
    /// another QP took its place).
    pub(super) fn leave(&self, key: usize, credits: &Arc<WorkLedger>) {
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
    pub(super) fn wait_flushed(&self, timeout: Delta, poll: Option<&dyn Fn()>) {
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
    pub(super) fn pop_posted(&self) -> Option<PostedCqe> {
        self.posted.lock().pop()
    }

    /// Whether an R/W transfer is parked or still tracked.
    pub(super) fn holds_rw(&self) -> bool {
        let parked = !self.parked.lock().is_empty();
        parked || self.posted.lock().iter().any(|e| e.1 == WrQueue::Rw)
    }

    /// Records a request posted (being posted) on the send queue, after
    /// every earlier one.
    pub(super) fn push_send(&self, cqe: PostedCqe, signaling: Signaling) {
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
    pub(super) fn leaves_under_two_send_credits(&self) -> bool {
        self.send.load(Ordering::Acquire) >= self.caps.max_send_wr.saturating_sub(1)
    }

    /// Forgets the send queue's request `cqe` (its post failed).
    pub(super) fn remove_send(&self, cqe: PostedCqe) {
        let mut order = self.send_order.lock();
        if let Some(i) = order.iter().position(|s| s.cqe == cqe) {
            // In bounds: just found.
            let _ = order.remove(i);
        }
    }

    /// Whether an unsignaled request is in flight.
    pub(super) fn has_unsignaled(&self) -> bool {
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
    pub(super) fn take_done_before(&self, own: PostedCqe) -> Option<SendOrder> {
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

    /// Empties the send queue's order before a reclaim, which completes
    /// every request left as flushed.
    pub(super) fn clear_send_order(&self) {
        self.send_order.lock().clear();
    }

    /// Tracks a request being posted (a credit's, see [`Credit::track`], or
    /// the shutdown's marker); `false` if `posted` is full.
    pub(super) fn track(&self, entry: PostedCqe) -> bool {
        self.posted.lock().push_within_capacity(entry).is_ok()
    }

    /// Stops tracking a request (its completion ran, or its post failed);
    /// gone already if a reclaim took it.
    pub(super) fn untrack(&self, entry: PostedCqe) {
        let mut posted = self.posted.lock();
        forget(&mut posted, entry);
        if posted.is_empty() {
            self.flushed.notify_all();
        }
    }

    /// One request more on `queue`: `ENOSPC` when the QP has as many in
    /// flight as its caps allow.
    pub(super) fn take(self: &Arc<Self>, queue: WrQueue) -> Result<Credit> {
        self.take_n(queue, 1)
    }

    /// `slots` more on `queue` (an R/W transfer's requests): `ENOSPC` when
    /// they do not fit beside those in flight.
    pub(super) fn take_n(self: &Arc<Self>, queue: WrQueue, slots: u32) -> Result<Credit> {
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
    pub(super) fn finish_rw(&self, entry: PostedCqe, release: impl FnOnce()) {
        let mut posted = self.posted.lock();
        release();
        forget(&mut posted, entry);
        if posted.is_empty() {
            self.flushed.notify_all();
        }
    }

    /// Parks the failed R/W transfer `entry` (see `parked`) with `error`:
    /// runs `release` and stops tracking it, as [`Self::finish_rw`] does,
    /// and keeps it until [`Self::take_parked`].  `false` (nothing done)
    /// once the QP is destroyed: its registrations are gone.
    pub(super) fn park_rw(&self, entry: PostedCqe, error: Error, release: impl FnOnce()) -> bool {
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
    pub(super) fn take_parked(&self) -> Option<(PostedCqe, Error)> {
        self.parked
            .lock()
            .pop()
            .map(|(entry, errno)| (entry, Error::from_errno(errno)))
    }

    /// For a shutdown, before the QP's destruction: runs `release` for
    /// every R/W transfer still tracked, under the lock of the tracking.
    pub(super) fn release_rw(&self, mut release: impl FnMut(PostedCqe)) {
        let posted = self.posted.lock();
        for &entry in posted.iter().filter(|e| e.1 == WrQueue::Rw) {
            release(entry);
        }
    }
}

/// One request in flight; returned when dropped (at its completion, or when
/// its post failed).
pub(super) struct Credit {
    pub(super) credits: Arc<WorkLedger>,
    queue: WrQueue,
    /// Slots of `queue` taken (more than one for an R/W transfer).
    slots: u32,
    /// The completion entry of the request, tracked from before its post.
    pub(super) posted: Option<PostedCqe>,
}

impl Credit {
    /// Tracks the request whose completion entry is `cqe` (at a stable
    /// address, in the heap object the request owns) until this credit is
    /// dropped.  Called before the post: the completion may run before the
    /// post returns.
    pub(super) fn track(&mut self, cqe: NonNull<bindings::ib_cqe>) {
        let entry = PostedCqe(cqe, self.queue);
        // One entry per credit, within the capacity (type invariants of
        // `WorkLedger`): this cannot fail.  If it did, the request would
        // only be missing from a reclaim (a leak, never a double free).
        if self.credits.track(entry) {
            self.posted = Some(entry);
        } else {
            pr_err!("a posted request could not be tracked\n");
        }
    }
}

impl Credit {
    /// Stops tracking the request (its completion ran, or its post failed).
    pub(super) fn untrack(&mut self) {
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

/// How long a QP's shutdown waits for the driver to flush its outstanding
/// requests before it reclaims them after destroying the QP.
pub const FLUSH_TIMEOUT: Delta = Delta::from_millis(5000);

/// How long a QP's shutdown polls its [`PollContext::Direct`] CQs without
/// sleeping while it waits for the flush.
pub(super) const FLUSH_SPIN: Delta = Delta::from_millis(20);
