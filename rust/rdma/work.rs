// SPDX-License-Identifier: GPL-2.0

//! Work a module runs in process context on its owner's queue:
//! [`Owner::spawn`] and [`Owner::spawn_after`].
//!
//! A ULP's callbacks may not sleep on the CM (`CmId::disconnect` and the
//! synchronous calls refuse inside them), and a timer of its own (a
//! keep-alive deadline) needs something that runs later.  The kernel's
//! `workqueue::system().try_spawn` runs the module's code with nothing
//! holding the module: this queue belongs to the owner, whose
//! [`ModuleOwner`](super::ModuleOwner) drop waits for every work item,
//! queued or running, and refuses new ones, before the module's code goes.

use super::owner::Owner;
use core::sync::atomic::{AtomicUsize, Ordering};
use kernel::{
    prelude::*,
    sync::Arc,
    time::{Delta, Instant, Monotonic},
    workqueue,
};

/// The longest delay [`Owner::spawn_after`] takes, in days.
pub const MAX_DELAY_DAYS: i64 = 365;

/// A closure to run once, behind a trait object (a `KBox<dyn FnOnce()>`
/// cannot be called).
trait RunOnce: Send {
    fn run_once(&mut self);
}

impl<F: FnOnce() + Send> RunOnce for Option<F> {
    fn run_once(&mut self) {
        if let Some(func) = self.take() {
            func();
        }
    }
}

/// A closure queued on an owner's work queue.
///
/// Not generic on purpose (see `DestroyWork`): one lockdep class.
#[pin_data]
struct SpawnWork {
    #[pin]
    work: workqueue::Work<SpawnWork>,
    func: KBox<dyn RunOnce>,
    /// Slept before `func` runs, until `deadline`.
    delay: Delta,
    deadline: Instant<Monotonic>,
    owner: Owner,
    pending: Arc<AtomicUsize>,
}

kernel::impl_has_work! {
    impl HasWork<Self> for SpawnWork { self.work }
}

impl workqueue::WorkItem for SpawnWork {
    type Pointer = Pin<KBox<Self>>;

    fn run(mut this: Pin<KBox<Self>>) {
        let pending = this.pending.clone();
        let closing = !this.delay.is_zero() && this.owner.sleep_until(this.deadline);
        if !closing {
            this.as_mut().project().func.run_once();
        }
        // Everything the closure held (and the owner handle) goes before
        // the count: the owner's drop waits for it.
        drop(this);
        pending.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Owner {
    /// Runs `func` in process context, outside every callback of the
    /// layer, on the owner's work queue (unbound: it may sleep, take the
    /// CM's blocking calls, drop ids and QPs).  `ENXIO` once the owner's
    /// [`ModuleOwner`](super::ModuleOwner) has begun to drop (its drop
    /// waits for the work queued before), `ENOMEM` without memory for the
    /// work item; `func` is dropped unrun on either.
    ///
    /// # Examples
    ///
    /// ```
    /// use kernel::prelude::*;
    /// use kernel::rdma::Owner;
    ///
    /// fn later(owner: &Owner) -> Result {
    ///     owner.spawn(|| pr_info!("in process context\n"))
    /// }
    /// ```
    pub fn spawn(&self, func: impl FnOnce() + Send + 'static) -> Result {
        self.spawn_after(Delta::ZERO, func)
    }

    /// [`Self::spawn`] after `delay`, counted from the call (slept by the
    /// work item in one wait, which the owner's drop cuts short: `func` is
    /// then dropped unrun).  For timers a ULP rearms itself (a keep-alive
    /// sweep): the unload does not wait for one that is sleeping.
    ///
    /// A negative `delay` is none; one above [`MAX_DELAY_DAYS`] days is
    /// refused (`EINVAL`).
    pub fn spawn_after(&self, delay: Delta, func: impl FnOnce() + Send + 'static) -> Result {
        if self.is_closed() {
            return Err(ENXIO);
        }
        let delay = if delay.is_negative() {
            Delta::ZERO
        } else {
            delay
        };
        if delay > Delta::from_secs(MAX_DELAY_DAYS * 86_400) {
            return Err(EINVAL);
        }
        let func: KBox<dyn RunOnce> = KBox::new(Some(func), GFP_KERNEL)?;
        let queue = self.work_queue();
        let deadline = Instant::now() + delay;
        let work = KBox::pin_init(
            pin_init!(SpawnWork {
                work <- kernel::new_work!("rdma_cm_rs::spawn"),
                func,
                delay,
                deadline,
                owner: self.clone(),
                pending: queue.pending().clone(),
            }),
            GFP_KERNEL,
        )?;
        queue.enqueue(work).map_err(|_| ENXIO)
    }
}
