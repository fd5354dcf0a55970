// SPDX-License-Identifier: GPL-2.0

//! Destructions deferred to a workqueue of the objects' owner.
//!
//! An id dropped inside one of the layer's callbacks cannot be destroyed
//! there (see [`super::callback`]); it is destroyed from a work item
//! instead.  The work item runs the layer's code, so the module must not
//! be unloaded while one is queued or running: the queue belongs to the
//! objects' [`super::owner::ModuleOwner`], whose drop waits for every
//! destruction, those queued meanwhile included, and destroys the queue
//! (`destroy_workqueue`), as nvmet-rdma does with its release work.  No
//! timeout, and nothing for a consumer to call by hand.

use super::{bindings, callback::CallbackMark};
use core::{
    ptr,
    sync::atomic::{AtomicPtr, AtomicUsize, Ordering},
};
use kernel::{prelude::*, str::CStr, sync::Arc, workqueue};

/// An object whose destruction may be deferred.
pub(crate) trait DeferredDestroy: Send + Sync {
    /// Destroys it; runs in process context outside every callback.
    fn destroy(&self);
}

/// An owner's queue of deferred destructions.
///
/// # Invariants
///
/// `queue` is the workqueue this object allocated until [`Self::close`]
/// (or the drop) destroys it, and null after.
pub(crate) struct DestroyQueue {
    queue: AtomicPtr<bindings::workqueue_struct>,
    /// Enqueuers and flushers between reading `queue` and using it: the
    /// queue is not destroyed under them.
    users: AtomicUsize,
    /// Destructions queued and not yet finished (a work item decrements
    /// it, so it is shared with them).
    pending: Arc<AtomicUsize>,
}

impl DestroyQueue {
    /// Allocates the queue, `<name>_destroy` (unbound: destructions sleep
    /// in `rdma_destroy_id`).
    pub(crate) fn new(name: &'static CStr) -> Result<Self> {
        let pending = Arc::new(AtomicUsize::new(0), GFP_KERNEL)?;
        // SAFETY: `alloc_workqueue_noprof` formats the name from its
        // arguments: `%s` takes `name`, a NUL-terminated string.
        let wq = unsafe {
            bindings::alloc_workqueue_noprof(
                c"%s_destroy".as_char_ptr(),
                bindings::wq_flags_WQ_UNBOUND,
                0,
                name.as_char_ptr(),
            )
        };
        if wq.is_null() {
            return Err(ENOMEM);
        }
        // INVARIANT: Just allocated.
        Ok(Self {
            queue: AtomicPtr::new(wq),
            users: AtomicUsize::new(0),
            pending,
        })
    }

    /// Runs `f` on the live queue, or returns `None` once it is closed.
    fn with_queue<R>(&self, f: impl FnOnce(*mut bindings::workqueue_struct) -> R) -> Option<R> {
        self.users.fetch_add(1, Ordering::SeqCst);
        let wq = self.queue.load(Ordering::SeqCst);
        let result = (!wq.is_null()).then(|| f(wq));
        self.users.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Waits until every destruction queued so far has finished; nothing
    /// to wait for once closed.  The caller is outside every callback.
    pub(crate) fn flush(&self) {
        self.with_queue(|wq| {
            // SAFETY: `wq` stays live while `users` counts this call (see
            // `close`); flushing may sleep, which the close's wait
            // tolerates.
            unsafe { bindings::__flush_workqueue(wq) }
        });
    }

    /// Flushes until no destruction is pending.
    ///
    /// Not `drain_workqueue`: while a drain runs, only the queue's own work
    /// items may queue more, and a destruction may also be deferred from
    /// elsewhere meanwhile (a busy-polling loop that drops the last
    /// reference to an id as it ends, while a poller's deferred
    /// destruction, which waits for that loop, runs here).  Such a
    /// destruction is counted before it is queued, and a flush waits for
    /// it.
    pub(crate) fn flush_until_idle(&self) {
        loop {
            self.flush();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
        }
    }

    /// Destroys the queue after the destructions queued on it.  Called
    /// once nothing can queue one any more (the owner's objects are gone);
    /// an enqueuer that read the queue before still finishes, and what it
    /// queued runs first.
    pub(crate) fn close(&self) {
        let wq = self.queue.swap(ptr::null_mut(), Ordering::SeqCst);
        if wq.is_null() {
            return;
        }
        while self.users.load(Ordering::SeqCst) != 0 {
            // An enqueue takes no time; a flush may take a while.
            kernel::time::delay::fsleep(kernel::time::Delta::from_millis(1));
        }
        // SAFETY: `wq` is the queue this object allocated, unpublished
        // above and used by nobody since `users` reached zero.
        // `destroy_workqueue` drains it before freeing, so the last work
        // item has returned.
        unsafe { bindings::destroy_workqueue(wq) };
    }

    /// Queues the destruction of `victim`; gives it back once the queue is
    /// closed or without memory for the work item.
    pub(crate) fn spawn(
        &self,
        victim: Arc<dyn DeferredDestroy>,
    ) -> core::result::Result<(), Arc<dyn DeferredDestroy>> {
        let queued = victim.clone();
        let work = match KBox::pin_init(
            pin_init!(DestroyWork {
                work <- kernel::new_work!("rdma_cm_rs::deferred_destroy"),
                victim: queued,
                pending: self.pending.clone(),
            }),
            GFP_KERNEL,
        ) {
            Ok(work) => work,
            Err(_) => return Err(victim),
        };
        let queued = self.with_queue(|wq| {
            // SAFETY: `wq` stays live while `users` counts this call (see
            // `close`).
            let queue = unsafe { workqueue::Queue::from_raw(wq) };
            self.pending.fetch_add(1, Ordering::SeqCst);
            // A fresh box cannot be queued already: enqueueing cannot fail.
            queue.enqueue(work);
        });
        queued.ok_or(victim)
    }
}

impl Drop for DestroyQueue {
    fn drop(&mut self) {
        // Only an owner that failed to be made gets here with a queue; a
        // made one's `ModuleOwner` closed it.
        self.close();
    }
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
    pending: Arc<AtomicUsize>,
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
        let pending = this.pending.clone();
        this.victim.destroy();
        // The victim itself goes inside the mark too: its last reference
        // may be this one, and its fields (an id's handler, and the ids
        // that owns) drop here.
        drop(this);
        // Counted out after the destruction and what it queued in turn
        // (counted in before this): the owner's drop waits for both.
        pending.fetch_sub(1, Ordering::SeqCst);
        drop(mark);
    }
}
