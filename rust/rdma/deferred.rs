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

use super::{callback::CallbackMark, queue::OwnerQueue};
use core::sync::atomic::{AtomicUsize, Ordering};
use kernel::{prelude::*, sync::Arc, workqueue};

/// An object whose destruction may be deferred.
pub(crate) trait DeferredDestroy: Send + Sync {
    /// Destroys it; runs in process context outside every callback.
    fn destroy(&self);
}

/// Queues the destruction of `victim` on `queue`; gives it back once the
/// queue is closed or without memory for the work item.
pub(crate) fn defer_destroy(
    queue: &OwnerQueue,
    victim: Arc<dyn DeferredDestroy>,
) -> core::result::Result<(), Arc<dyn DeferredDestroy>> {
    let queued = victim.clone();
    let work = match KBox::pin_init(
        pin_init!(DestroyWork {
            work <- kernel::new_work!("rdma_cm_rs::deferred_destroy"),
            victim: queued,
            pending: queue.pending().clone(),
        }),
        GFP_KERNEL,
    ) {
        Ok(work) => work,
        Err(_) => return Err(victim),
    };
    queue.enqueue(work).map_err(|_| victim)
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
