// SPDX-License-Identifier: GPL-2.0

//! The module that owns a set of the layer's objects: its name and
//! `THIS_MODULE`, the objects the C side can call into it through, and the
//! queue their deferred destructions run on.
//!
//! The C side calls back into the module that made an object (its event
//! or completion handler), so that module's code must stay until the
//! object is gone from the C side.  Each such object counts itself on its
//! [`Owner`]; the module keeps a [`ModuleOwner`], whose drop at unload
//! waits for them.  Nothing here is shared between owners: two modules
//! using the layer (or two owners in one module) are independent.

use super::{
    bindings,
    callback::in_any_callback,
    deferred::{defer_destroy, DeferredDestroy},
    queue::OwnerQueue,
};
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use kernel::{
    module::ModuleMetadata,
    new_condvar, new_mutex,
    prelude::*,
    str::CStr,
    sync::{Arc, CondVar, Mutex},
    time::{msecs_to_jiffies, Delta, Instant, Monotonic},
    ThisModule,
};

/// What a [`ModuleOwner`] and its [`Owner`] handles share.
#[pin_data]
struct OwnerState {
    name: &'static CStr,
    module: &'static ThisModule,
    /// Deferred destructions (unbound: they sleep in `rdma_destroy_id`).
    destroys: OwnerQueue,
    /// The module's own work ([`Owner::spawn`]), apart: a work item may
    /// drop an id, whose destruction a flush of `destroys` waits for.
    work: OwnerQueue,
    /// Objects alive that the C side can call into the module through
    /// ([`CallbackTarget`]).
    targets: AtomicUsize,
    /// Set by the [`ModuleOwner`]'s drop before it waits for `targets`: no
    /// target is made after it read the count.
    closed: AtomicBool,
    /// Where delayed work sleeps ([`Owner::spawn_after`]) until its time or
    /// the owner's close, which `closed` (set, then notified, under
    /// `sleepers`) says.
    #[pin]
    sleepers: Mutex<()>,
    #[pin]
    closing: CondVar,
}

/// A module's handle on its objects, given to the constructors of the
/// objects the C side calls back (ids, PDs, CQs, CQ pools, busy pollers,
/// client and event registrations); the objects made from those (a QP
/// from its id, an SRQ from its PD) take their parent's.  Clones are
/// cheap; a handler may keep one to make objects in its callbacks.
///
/// The name is what the RDMA core's resource tracking charges the objects
/// to (`rdma res show` lists it), and the queue of deferred destructions is
/// named after it.
#[derive(Clone)]
pub struct Owner {
    state: Arc<OwnerState>,
}

/// The [`Owner`] a module keeps in its state for as long as it may have
/// objects of the layer: make it first and make it the last field of the
/// module's state, so that it drops after them.
///
/// Its drop, at unload, refuses new objects (`ENXIO`), runs the
/// destructions deferred to its queue, and waits until no object the C
/// side can call into the module through is alive: a leaked one keeps the
/// unload waiting, with a message after 10 s and every minute after.
/// Leaking the `ModuleOwner` itself (`mem::forget`) leaves nothing to wait
/// at unload, as leaking any registration of the kernel crate does: keep it
/// in the module's state.
///
/// # Examples
///
/// ```
/// use kernel::prelude::*;
/// use kernel::rdma::ModuleOwner;
///
/// struct Ulp {
///     // Objects of the layer first; the owner drops last.
///     owner: ModuleOwner,
/// }
///
/// impl Ulp {
///     fn new<M: kernel::ModuleMetadata>() -> Result<Self> {
///         Ok(Self { owner: ModuleOwner::new::<M>()? })
///     }
/// }
/// ```
pub struct ModuleOwner {
    owner: Owner,
}

impl ModuleOwner {
    /// The owner of the objects module `M` makes (`LocalModule` in a
    /// module).  `ENOMEM` if its queue cannot be allocated.
    pub fn new<M: ModuleMetadata>() -> Result<Self> {
        let destroys = OwnerQueue::new(c"%s_destroy", M::NAME)?;
        let work = OwnerQueue::new(c"%s_work", M::NAME)?;
        let state = Arc::pin_init(
            pin_init!(OwnerState {
                name: M::NAME,
                module: kernel::module::this_module::<M>(),
                destroys,
                work,
                targets: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
                sleepers <- new_mutex!(()),
                closing <- new_condvar!("rdma_cm_rs::Owner::closing"),
            }),
            GFP_KERNEL,
        )?;
        Ok(Self {
            owner: Owner { state },
        })
    }

    /// The handle the module's objects are made with (also what `&self`
    /// dereferences to).
    pub fn owner(&self) -> &Owner {
        &self.owner
    }
}

impl core::ops::Deref for ModuleOwner {
    type Target = Owner;

    fn deref(&self) -> &Owner {
        &self.owner
    }
}

/// How long the drop waits for the module's objects to go before it says
/// it is waiting (and then it says so every minute).
const TARGETS_PATIENCE_MS: u32 = 10_000;

impl Drop for ModuleOwner {
    fn drop(&mut self) {
        let state = &self.owner.state;
        // No object the C side can call back is made from now on: the wait
        // below is for those that exist.
        state.closed.store(true, Ordering::SeqCst);
        // Delayed work asleep gives up now (it looks at `closed` under the
        // lock before it sleeps: no wakeup is lost).
        drop(state.sleepers.lock());
        state.closing.notify_all();
        // The module's work queued before (none is queued after): it may
        // defer destructions, which the flush below waits for.
        state.work.flush_until_idle();
        // A destruction that defers another one (dropping the last
        // reference to an id's owner) queues it here meanwhile, and the
        // flush waits for it too.
        state.destroys.flush_until_idle();
        // Then for every object the C side can still call into the module
        // through (a CQ or a loop may let go of the last one a little
        // later): one that never goes was leaked, and the module's code
        // must stay for it, so the unload waits, and says so.
        let (mut waited_ms, mut say_at_ms) = (0u32, TARGETS_PATIENCE_MS);
        while self.owner.callback_targets() != 0 {
            // Again every minute: the task wakes every 10 ms, which the
            // hung-task detector does not report.
            if waited_ms >= say_at_ms {
                say_at_ms = say_at_ms.saturating_add(60_000);
                pr_err!(
                    "{}: {} object(s) the RDMA core can call into the module through are still alive (leaked?): the unload waits for them\n",
                    state.name.to_str().unwrap_or("?"),
                    self.owner.callback_targets()
                );
            }
            kernel::time::delay::fsleep(kernel::time::Delta::from_millis(10));
            waited_ms = waited_ms.saturating_add(10);
            state.work.flush_until_idle();
            state.destroys.flush_until_idle();
        }
        state.work.close();
        state.destroys.close();
    }
}

impl Owner {
    /// The module's name, as given to `module!`.
    pub fn name(&self) -> &'static CStr {
        self.state.name
    }

    /// Waits until every destruction deferred so far has finished.
    /// `EDEADLK` inside a callback of the layer (or a deferred
    /// destruction): a queued destruction may wait for the mutex the caller
    /// holds, or for the worker the caller runs on.
    pub fn flush(&self) -> Result {
        if in_any_callback() {
            return Err(EDEADLK);
        }
        self.state.destroys.flush();
        Ok(())
    }

    /// Whether the [`ModuleOwner`] has begun to drop (objects are refused).
    pub fn is_closed(&self) -> bool {
        self.state.closed.load(Ordering::SeqCst)
    }

    /// How many objects the C side can call into the module through are
    /// alive.
    pub fn callback_targets(&self) -> usize {
        self.state.targets.load(Ordering::SeqCst)
    }

    /// Queues the destruction of `victim`; gives it back once the owner is
    /// gone or without memory for the work item.
    pub(crate) fn defer(
        &self,
        victim: Arc<dyn DeferredDestroy>,
    ) -> core::result::Result<(), Arc<dyn DeferredDestroy>> {
        defer_destroy(&self.state.destroys, victim)
    }

    /// Sleeps until `deadline` has passed (`false`), or until the owner
    /// begins to close (`true`, at once if it has), with one wakeup.
    pub(crate) fn sleep_until(&self, deadline: Instant<Monotonic>) -> bool {
        let state = &self.state;
        let mut guard = state.sleepers.lock();
        loop {
            if state.closed.load(Ordering::SeqCst) {
                return true;
            }
            let left = deadline - Instant::now();
            if left <= Delta::ZERO {
                return false;
            }
            let ms = u32::try_from(left.as_millis_ceil()).unwrap_or(u32::MAX);
            // Woken, timed out or (never for a worker) signalled: the loop
            // looks at the close and the clock again either way.
            let _ = state
                .closing
                .wait_interruptible_timeout(&mut guard, msecs_to_jiffies(ms));
        }
    }

    /// The queue of the module's own work ([`Owner::spawn`]).
    pub(crate) fn work_queue(&self) -> &OwnerQueue {
        &self.state.work
    }

    /// Keeps the module loaded for good: for a leak that leaves its code
    /// reachable from the C side.
    pub(crate) fn pin_module(&self) {
        // Every caller holds a `CallbackTarget` of this owner, so its
        // `ModuleOwner` has not returned from its drop.
        // SAFETY: The module is therefore live; `__module_get` takes a
        // reference on a live module (none for built-in code: null).
        unsafe { bindings::__module_get(self.state.module.as_ptr()) };
    }
}

/// Held by every object whose address the C side keeps as the context of
/// a trampoline (ids, CQs, QPs, SRQs, client and event registrations),
/// and by the workqueue of busy-polling loops, from its creation to the
/// end of its drop, after it was taken off the C side (or its loops all
/// returned).
///
/// The [`ModuleOwner`] waits for the count to reach zero before the
/// module's code goes.  Leaking such an object is safe Rust
/// (`mem::forget`, a reference cycle such as QP -> CQ -> handler -> QP),
/// and without the wait the C side would go on calling the trampoline
/// after the module was unloaded: with it, the unload waits for good (and
/// says why) instead.  That wait exists only until the owner's drop has
/// read the count, so a target is made only before: after,
/// [`CallbackTarget::new`] fails, and with it the construction of every
/// object that holds one.
pub(crate) struct CallbackTarget {
    owner: Owner,
}

impl CallbackTarget {
    /// Counts one more object of `owner`.  `ENXIO` once the owner's
    /// [`ModuleOwner`] has begun to drop.
    pub(crate) fn new(owner: &Owner) -> Result<Self> {
        let state = &owner.state;
        // Counted before the check, the drop's store before its read of
        // the count (both `SeqCst`): either the drop sees this target and
        // waits for it, or this sees the owner closing and gives up.
        state.targets.fetch_add(1, Ordering::SeqCst);
        if state.closed.load(Ordering::SeqCst) {
            state.targets.fetch_sub(1, Ordering::SeqCst);
            return Err(ENXIO);
        }
        Ok(Self {
            owner: owner.clone(),
        })
    }

    /// The owner this object is counted on.
    pub(crate) fn owner(&self) -> &Owner {
        &self.owner
    }
}

impl Drop for CallbackTarget {
    fn drop(&mut self) {
        self.owner.state.targets.fetch_sub(1, Ordering::SeqCst);
    }
}
