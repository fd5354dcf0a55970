// SPDX-License-Identifier: GPL-2.0

//! A workqueue of an [`Owner`](super::Owner) whose work items are counted
//! until they finish, so that the owner's drop can wait for every one
//! (those queued while it waits included) before the module's code goes.

use super::bindings;
use core::{
    ptr,
    sync::atomic::{AtomicPtr, AtomicUsize, Ordering},
};
use kernel::{prelude::*, str::CStr, sync::Arc, workqueue};

/// An owner's counted workqueue, unbound (its work items may sleep).
///
/// # Invariants
///
/// `queue` is the workqueue this object allocated until [`Self::close`]
/// (or the drop) destroys it, and null after.
pub(crate) struct OwnerQueue {
    queue: AtomicPtr<bindings::workqueue_struct>,
    /// Enqueuers and flushers between reading `queue` and using it: the
    /// queue is not destroyed under them.
    users: AtomicUsize,
    /// Work items queued and not yet finished (each decrements it as it
    /// ends, so it is shared with them).
    pending: Arc<AtomicUsize>,
}

impl OwnerQueue {
    /// Allocates the queue, named `format` with `%s` replaced by `name`.
    pub(crate) fn new(format: &'static CStr, name: &'static CStr) -> Result<Self> {
        let pending = Arc::new(AtomicUsize::new(0), GFP_KERNEL)?;
        // SAFETY: `alloc_workqueue_noprof` formats the name from its
        // arguments: `format` is a NUL-terminated string with one `%s`,
        // which takes `name`, a NUL-terminated string.
        let wq = unsafe {
            bindings::alloc_workqueue_noprof(
                format.as_char_ptr(),
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

    /// The count a work item of this queue decrements when it has finished
    /// (after everything it dropped).
    pub(crate) fn pending(&self) -> &Arc<AtomicUsize> {
        &self.pending
    }

    /// Runs `f` on the live queue, or returns `None` once it is closed.
    fn with_queue<R>(&self, f: impl FnOnce(*mut bindings::workqueue_struct) -> R) -> Option<R> {
        self.users.fetch_add(1, Ordering::SeqCst);
        let wq = self.queue.load(Ordering::SeqCst);
        let result = (!wq.is_null()).then(|| f(wq));
        self.users.fetch_sub(1, Ordering::SeqCst);
        result
    }

    /// Waits until every work item queued so far has finished; nothing to
    /// wait for once closed.  The caller is outside every callback and
    /// is not a work item of this queue.
    pub(crate) fn flush(&self) {
        self.with_queue(|wq| {
            // SAFETY: `wq` stays live while `users` counts this call (see
            // `close`); flushing may sleep, which the close's wait
            // tolerates.
            unsafe { bindings::__flush_workqueue(wq) }
        });
    }

    /// Flushes until no work item is pending.
    ///
    /// Not `drain_workqueue`: while a drain runs, only the queue's own work
    /// items may queue more, and one may also be queued from elsewhere
    /// meanwhile (a busy-polling loop that drops the last reference to an
    /// id as it ends, while a poller's deferred destruction, which waits
    /// for that loop, runs here).  Such a work item is counted before it is
    /// queued, and a flush waits for it.
    pub(crate) fn flush_until_idle(&self) {
        loop {
            self.flush();
            if self.pending.load(Ordering::SeqCst) == 0 {
                return;
            }
        }
    }

    /// Destroys the queue after the work items queued on it.  Called once
    /// nothing can queue one any more; an enqueuer that read the queue
    /// before still finishes, and what it queued runs first.
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

    /// Queues `work`, counted in [`Self::pending`] (its `run` must count
    /// itself out as it ends); gives it back once the queue is closed.
    pub(crate) fn enqueue<W>(&self, work: Pin<KBox<W>>) -> core::result::Result<(), Pin<KBox<W>>>
    where
        W: workqueue::WorkItem<Pointer = Pin<KBox<W>>> + workqueue::HasWork<W> + Send + 'static,
    {
        let mut work = Some(work);
        self.with_queue(|wq| {
            // SAFETY: `wq` stays live while `users` counts this call (see
            // `close`).
            let queue = unsafe { workqueue::Queue::from_raw(wq) };
            self.pending.fetch_add(1, Ordering::SeqCst);
            if let Some(work) = work.take() {
                // A fresh box cannot be queued already: enqueueing cannot
                // fail.
                queue.enqueue(work);
            }
        });
        match work {
            None => Ok(()),
            Some(work) => Err(work),
        }
    }
}

impl Drop for OwnerQueue {
    fn drop(&mut self) {
        // Only an owner that failed to be made gets here with a queue; a
        // made one's `ModuleOwner` closed it.
        self.close();
    }
}
