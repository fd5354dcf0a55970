// SPDX-License-Identifier: GPL-2.0

//! Destructions deferred to a workqueue the module owns.
//!
//! An id dropped inside one of the layer's callbacks cannot be destroyed
//! there (see [`super::callback`]); it is destroyed from a work item
//! instead.  The work item runs the module's code, so the module must not
//! be unloaded while one is queued or running: the queue is owned by a
//! [`DestroyQueue`] that the module keeps for as long as it has ids, and
//! whose drop waits for every destruction, those queued meanwhile
//! included, and destroys the queue (`destroy_workqueue`), as nvmet-rdma
//! does with its release work.  No timeout, and nothing for a
//! consumer to call by hand.

use super::{
    bindings,
    callback::{callback_targets, in_any_callback, set_targets_open, CallbackMark},
};
use core::{
    ptr,
    sync::atomic::{AtomicPtr, AtomicUsize, Ordering},
};
use kernel::{prelude::*, sync::Arc, workqueue};

/// An object whose destruction may be deferred.
pub(crate) trait DeferredDestroy: Send + Sync {
    /// Destroys it; runs in process context outside every callback.
    fn destroy(&self);
}

/// The module's queue, while a [`DestroyQueue`] owns it.
static QUEUE: AtomicPtr<bindings::workqueue_struct> = AtomicPtr::new(ptr::null_mut());
/// Enqueuers between reading [`QUEUE`] and enqueueing: the queue is not
/// destroyed under them.
static ENQUEUERS: AtomicUsize = AtomicUsize::new(0);
/// Destructions queued and not yet finished.
static PENDING: AtomicUsize = AtomicUsize::new(0);

/// The module's queue of deferred destructions.
///
/// A module that makes objects the C side calls back (ids, CQs, SRQs,
/// client and event registrations, busy pollers) holds one for as long as
/// any can exist (make it the last field of the module's state, so it
/// drops after them): their constructors refuse (`ENXIO`) without it, and
/// once its drop has begun.  Its
/// drop also waits until no object the C side can call into the module
/// through is alive (see [`super::callback::CallbackTarget`]): a leaked
/// one keeps the unload waiting, with a message after 10 s and every
/// minute after.
///
/// # Invariants
///
/// While the object lives, [`QUEUE`] holds the workqueue it allocated.
pub struct DestroyQueue {
    _private: (),
}

impl DestroyQueue {
    /// Allocates the queue (unbound: destructions sleep in
    /// `rdma_destroy_id`).  `EBUSY` if the module has one already.
    pub fn new() -> Result<Self> {
        // SAFETY: Allocates a workqueue named after the module.
        let wq = unsafe { bindings::rdma_cm_rs_alloc_destroy_wq() };
        if wq.is_null() {
            return Err(ENOMEM);
        }
        if QUEUE
            .compare_exchange(ptr::null_mut(), wq, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            // SAFETY: Allocated above and never published.
            unsafe { bindings::rdma_cm_rs_destroy_wq(wq) };
            return Err(EBUSY);
        }
        set_targets_open(true);
        // INVARIANT: Published above.
        Ok(Self { _private: () })
    }

    /// Waits until every destruction queued so far has finished.
    /// `EDEADLK` inside a callback of the layer (or a deferred destruction),
    /// where a queued destruction may wait for the caller.
    pub fn flush(&self) -> Result {
        flush_deferred_destroys()
    }
}

/// How long the queue's drop waits for the module's objects to go before
/// it says it is waiting (and then it says so every minute).
const TARGETS_PATIENCE_MS: u32 = 10_000;

/// Flushes `wq` until no destruction is pending.
///
/// Not `drain_workqueue`: while a drain runs, only the queue's own work
/// items may queue more, and a destruction may also be deferred from
/// elsewhere meanwhile (a busy-polling loop that drops the last reference
/// to an id as it ends, while a poller's deferred destruction, which
/// waits for that loop, runs here).  Such a destruction is counted before
/// it is queued, and a flush waits for it.
fn flush_until_idle(wq: *mut bindings::workqueue_struct) {
    loop {
        // SAFETY: `wq` is the live queue of the `DestroyQueue` being
        // dropped (the caller's).
        unsafe { bindings::rdma_cm_rs_flush_wq(wq) };
        if PENDING.load(Ordering::SeqCst) == 0 {
            return;
        }
    }
}

impl Drop for DestroyQueue {
    fn drop(&mut self) {
        let wq = QUEUE.load(Ordering::SeqCst);
        // No object the C side can call back is made from now on: the wait
        // below is for those that exist.
        set_targets_open(false);
        // Still published: a destruction that defers another one (dropping
        // the last reference to an id's owner) queues it here, and the
        // flushes wait for it too.
        flush_until_idle(wq);
        // Then for every object the C side can still call into the module
        // through (a CQ or a loop may let go of the last one a little
        // later): one that never goes was leaked, and the module's code
        // must stay for it, so the unload waits, and says so.
        let (mut waited_ms, mut say_at_ms) = (0u32, TARGETS_PATIENCE_MS);
        while callback_targets() != 0 {
            // Again every minute: the task wakes every 10 ms, which the
            // hung-task detector does not report.
            if waited_ms >= say_at_ms {
                say_at_ms = say_at_ms.saturating_add(60_000);
                pr_err!(
                    "{} object(s) the RDMA core can call into this module through are still alive (leaked?): the unload waits for them\n",
                    callback_targets()
                );
            }
            kernel::time::delay::fsleep(kernel::time::Delta::from_millis(10));
            waited_ms = waited_ms.saturating_add(10);
            flush_until_idle(wq);
        }
        QUEUE.store(ptr::null_mut(), Ordering::SeqCst);
        // An enqueuer that read the queue before it was unpublished is
        // counted (it increments before reading): let it finish, then wait
        // for what it queued.
        while ENQUEUERS.load(Ordering::SeqCst) != 0 {
            // An enqueue takes no time; a flush may take a while.
            kernel::time::delay::fsleep(kernel::time::Delta::from_millis(1));
        }
        flush_until_idle(wq);
        // SAFETY: `wq` is the queue this object owned; nothing can reach it
        // any more, and nothing is pending on it.  `destroy_workqueue`
        // drains it before freeing, so the last work item has returned.
        unsafe { bindings::rdma_cm_rs_destroy_wq(wq) };
    }
}

/// Waits until every destruction queued so far has finished (for tests
/// and callers that do not own the [`DestroyQueue`]); nothing to wait for
/// without a queue.  `EDEADLK` inside a callback of the layer (or a
/// deferred destruction): a queued destruction may wait for the mutex the
/// caller holds, or for the worker the caller runs on.
pub fn flush_deferred_destroys() -> Result {
    if in_any_callback() {
        return Err(EDEADLK);
    }
    ENQUEUERS.fetch_add(1, Ordering::SeqCst);
    let wq = QUEUE.load(Ordering::SeqCst);
    if !wq.is_null() {
        // SAFETY: `wq` stays live until `ENQUEUERS` drops back (see
        // `DestroyQueue::drop`); flushing may sleep, which the drop's
        // wait tolerates.
        unsafe { bindings::rdma_cm_rs_flush_wq(wq) };
    }
    ENQUEUERS.fetch_sub(1, Ordering::SeqCst);
    Ok(())
}

/// Whether a [`DestroyQueue`] exists.
pub(crate) fn available() -> bool {
    !QUEUE.load(Ordering::SeqCst).is_null()
}

/// The work item of a deferred destruction.
///
/// Not generic on purpose: `new_work!` makes one lockdep class (a static
/// key and a name) per call site, and a generic call site would give every
/// monomorphization its own copy of the name for the one shared key, which
/// lockdep reports ("found a different class with the same key").
#[pin_data]
struct DestroyWork {
    #[pin]
    work: workqueue::Work<DestroyWork>,
    victim: Arc<dyn DeferredDestroy>,
}

kernel::impl_has_work! {
    impl HasWork<Self> for DestroyWork { self.work }
}

impl workqueue::WorkItem for DestroyWork {
    type Pointer = Pin<KBox<Self>>;

    fn run(this: Pin<KBox<Self>>) {
        // Counts as a callback: what the destruction drops (the handler, and
        // with it maybe the last reference to other ids) is deferred in turn
        // rather than flushing or destroying on this queue's own worker.
        let mark = CallbackMark::enter();
        this.victim.destroy();
        // The victim itself goes inside the mark too: its last reference
        // may be this one, and its fields (an id's handler, and the ids
        // that owns) drop here.
        drop(this);
        // Counted out after the destruction and what it queued in turn
        // (counted in before this): the queue's drop waits for both.
        PENDING.fetch_sub(1, Ordering::SeqCst);
        drop(mark);
    }
}

/// Queues the destruction of `victim`; gives it back if there is no queue
/// or no memory for the work item.
pub(crate) fn spawn(
    victim: Arc<dyn DeferredDestroy>,
) -> core::result::Result<(), Arc<dyn DeferredDestroy>> {
    let queued = victim.clone();
    let work = match KBox::pin_init(
        pin_init!(DestroyWork {
            work <- kernel::new_work!("rdma_cm_rs::deferred_destroy"),
            victim: queued,
        }),
        GFP_KERNEL,
    ) {
        Ok(work) => work,
        Err(_) => return Err(victim),
    };
    ENQUEUERS.fetch_add(1, Ordering::SeqCst);
    let wq = QUEUE.load(Ordering::SeqCst);
    let result = if wq.is_null() {
        Err(victim)
    } else {
        // SAFETY: `wq` stays live until `ENQUEUERS` drops back (see
        // `DestroyQueue::drop`).
        let queue = unsafe { workqueue::Queue::from_raw(wq) };
        PENDING.fetch_add(1, Ordering::SeqCst);
        // A fresh box cannot be queued already: enqueueing cannot fail.
        queue.enqueue(work);
        Ok(())
    };
    ENQUEUERS.fetch_sub(1, Ordering::SeqCst);
    result
}
