// SPDX-License-Identifier: GPL-2.0

//! Busy-polling loops over [`PollContext::Direct`] CQs, on a workqueue of
//! their own.
//!
//! A ULP that wants each completion the moment the device writes it, with
//! no interrupt and no worker to wake (what a user-space poller gets),
//! polls its CQ in a loop of its own.  The loop runs the module's code, so
//! the module must not go while one runs: every loop is a work item on the
//! workqueue of a [`BusyPoller`], whose drop stops them all and destroys
//! the queue (`destroy_workqueue`, which waits for them), as
//! the [`super::owner::ModuleOwner`] does for deferred destructions.  A
//! loop ends when its [`PollLoop`] is dropped, and then lets go of its CQ.
//!
//! A loop yields the CPU whenever a poll finds nothing ([`Cq::poll`]): it
//! costs a CPU only while no other task wants it, as a user-space poller
//! that calls `sched_yield`.

use super::{
    bindings,
    callback::{in_any_callback, CallbackMark},
    deferred::DeferredDestroy,
    owner::{CallbackTarget, Owner},
    verbs::{CompletionHandler, Cq, PollContext},
};
use core::{
    ptr::NonNull,
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
};
use kernel::{prelude::*, sync::Arc, workqueue};

/// Completions a loop takes from its CQ in one poll.
const LOOP_BUDGET: u32 = 16;

/// Loops of one poller at most: each holds one of its queue's active work
/// items for as long as it runs, and a loop past the queue's limit would
/// wait, unpolled, for another to end.  The queue has `WQ_MAX_ACTIVE`
/// (2048), shared out over the NUMA nodes by their CPUs: on one node every
/// admitted loop runs; on several, the loops started from one node's CPUs
/// get that node's share (1024 of each of two equal nodes), and a loop
/// past it waits until another ends.
pub const MAX_LOOPS: usize = 1024;

/// What a loop polls: a [`PollContext::Direct`] CQ of any handler type (the
/// loop's work item is not generic, see [`LoopWork`]).
trait Polled: Send + Sync {
    fn poll_once(&self);
}

impl<C: CompletionHandler> Polled for Cq<C> {
    fn poll_once(&self) {
        // `EBUSY`: another task polls it meanwhile, and delivers.
        let _ = self.poll(LOOP_BUDGET);
    }
}

/// The workqueue of a [`BusyPoller`].
///
/// # Invariants
///
/// `wq` is a live workqueue, allocated by [`BusyPoller::new`] with room for
/// `WQ_MAX_ACTIVE` active work items, and destroyed by
/// [`DeferredDestroy::destroy`] only, called once.
struct PollQueue {
    wq: NonNull<bindings::workqueue_struct>,
    /// Counted until the object goes, after [`DeferredDestroy::destroy`]
    /// waited for every loop (see [`CallbackTarget`]): a poller leaked,
    /// whose loops and queue then never end, keeps the module's unload
    /// waiting, its loops' last instructions included.
    target: CallbackTarget,
}

// SAFETY: A workqueue may be used and destroyed from any thread.
unsafe impl Send for PollQueue {}
// SAFETY: As above; enqueueing is thread-safe.
unsafe impl Sync for PollQueue {}

impl DeferredDestroy for PollQueue {
    /// Waits for every loop (each has been told to stop) and frees the
    /// queue.  Called once: by the [`BusyPoller`]'s drop, or for it by the
    /// deferred destruction it queued.
    fn destroy(&self) {
        // SAFETY: `wq` is live (type invariants), and this is the one call
        // that destroys it; `destroy_workqueue` drains it first, and every
        // loop returns, as each sees its poller stopping.
        unsafe { bindings::destroy_workqueue(self.wq.as_ptr()) };
    }
}

/// A module's busy-polling loops ([`BusyPoller::start`]).
///
/// Keep it for as long as the module has loops (its [`ModuleOwner`]'s drop
/// waits for it): dropped inside one of the layer's callbacks (where the
/// wait for the loops could be on the caller itself), the wait is deferred
/// to the owner's queue.
///
/// [`ModuleOwner`]: super::owner::ModuleOwner
pub struct BusyPoller {
    queue: Option<Arc<PollQueue>>,
    /// Set by the drop: every loop ends.
    stopping: Arc<AtomicBool>,
    /// Loops started and not yet ended, at most [`MAX_LOOPS`].
    loops: Arc<AtomicUsize>,
}

impl BusyPoller {
    /// Allocates the loops' workqueue, `<owner name>_poll`: unbound (a loop
    /// runs wherever the scheduler finds room), with room for the most
    /// active work items a queue may have.  An unbound queue shares them
    /// out over the NUMA nodes by their CPUs, so only on a single-node
    /// machine is every loop the poller admits sure to run at once.
    pub fn new(owner: &Owner) -> Result<Self> {
        let stopping = Arc::new(AtomicBool::new(false), GFP_KERNEL)?;
        let loops = Arc::new(AtomicUsize::new(0), GFP_KERNEL)?;
        let target = CallbackTarget::new(owner)?;
        // SAFETY: `alloc_workqueue_noprof` formats the name from its
        // arguments: `%s` takes the owner's name, a NUL-terminated string.
        let wq = unsafe {
            bindings::alloc_workqueue_noprof(
                c"%s_poll".as_char_ptr(),
                bindings::wq_flags_WQ_UNBOUND,
                bindings::wq_consts_WQ_MAX_ACTIVE as i32,
                owner.name().as_char_ptr(),
            )
        };
        let wq = NonNull::new(wq).ok_or(ENOMEM)?;
        // INVARIANT: Just allocated with room for every loop; only
        // `destroy` frees it.
        let queue = Arc::new(PollQueue { wq, target }, GFP_KERNEL).inspect_err(|_| {
            // SAFETY: Allocated above, never published.
            unsafe { bindings::destroy_workqueue(wq.as_ptr()) };
        })?;
        Ok(Self {
            queue: Some(queue),
            stopping,
            loops,
        })
    }

    /// Starts a loop that polls `cq` until the returned [`PollLoop`] (or
    /// this poller) is dropped; the loop holds the CQ until then.
    /// `EINVAL` unless the CQ is [`PollContext::Direct`] (another one is
    /// polled by its workqueue); `EBUSY` with [`MAX_LOOPS`] running.
    pub fn start<C: CompletionHandler>(&self, cq: &Arc<Cq<C>>) -> Result<PollLoop> {
        if cq.poll_context() != PollContext::Direct {
            return Err(EINVAL);
        }
        let queue = self.queue.as_ref().ok_or(EINVAL)?;
        self.loops
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_LOOPS).then_some(n + 1)
            })
            .map_err(|_| EBUSY)?;
        let made = self.loop_work(cq.clone());
        let (work, stop) = made.inspect_err(|_| {
            self.loops.fetch_sub(1, Ordering::AcqRel);
        })?;
        // SAFETY: The queue is live while `self` holds it: it is destroyed
        // only once the poller drops, which cannot happen during this
        // borrow.
        let wq = unsafe { workqueue::Queue::from_raw(queue.wq.as_ptr()) };
        // A fresh box cannot be queued already: enqueueing cannot fail.
        wq.enqueue(work);
        Ok(PollLoop { stop })
    }

    /// The work item of a loop over `cq`, and its stop flag.
    fn loop_work(&self, cq: Arc<dyn Polled>) -> Result<(Pin<KBox<LoopWork>>, Arc<AtomicBool>)> {
        let stop = Arc::new(AtomicBool::new(false), GFP_KERNEL)?;
        let loop_stop = stop.clone();
        let work = KBox::pin_init(
            pin_init!(LoopWork {
                work <- kernel::new_work!("rdma_cm_rs::poll_loop"),
                cq,
                stop: loop_stop,
                stopping: self.stopping.clone(),
                loops: self.loops.clone(),
            }),
            GFP_KERNEL,
        )?;
        Ok((work, stop))
    }
}

impl Drop for BusyPoller {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        let Some(queue) = self.queue.take() else {
            return;
        };
        if !in_any_callback() {
            queue.destroy();
            return;
        }
        // In a callback, maybe a completion one of the loops runs: the
        // wait for the loops goes to the module's queue of deferred
        // destructions.
        let owner = queue.target.owner().clone();
        if let Err(queue) = owner.defer(queue) {
            // No memory: the loops end (they see `stopping`), but nothing
            // would wait for them before the module went.  The workqueue
            // leaks, loudly, and the module stays.
            pr_err!("cannot defer the destruction of a poll workqueue, leaking it\n");
            core::mem::forget(queue);
            owner.pin_module();
        }
    }
}

/// A busy-polling loop ([`BusyPoller::start`]); dropping it ends the loop
/// after its current poll, without waiting.
pub struct PollLoop {
    stop: Arc<AtomicBool>,
}

impl Drop for PollLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The work item of one loop.
///
/// Not generic on purpose (see [`super::deferred`]'s work item): one
/// lockdep class for the loops of every handler type.
#[pin_data]
struct LoopWork {
    #[pin]
    work: workqueue::Work<LoopWork>,
    cq: Arc<dyn Polled>,
    stop: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    /// The poller's count of loops, which this one leaves when it ends.
    loops: Arc<AtomicUsize>,
}

kernel::impl_has_work! {
    impl HasWork<Self> for LoopWork { self.work }
}

impl workqueue::WorkItem for LoopWork {
    type Pointer = Pin<KBox<Self>>;

    fn run(this: Pin<KBox<Self>>) {
        // Each poll yields the CPU when it finds nothing, and reschedules
        // when asked otherwise: the loop never holds a CPU another task
        // wants.
        while !this.stop.load(Ordering::Acquire) && !this.stopping.load(Ordering::Acquire) {
            this.cq.poll_once();
        }
        this.loops.fetch_sub(1, Ordering::AcqRel);
        // The CQ may go with the box, and with it its handler and what that
        // holds: counted as a callback, so that an id dropped there is
        // destroyed from the deferred queue rather than on this worker.
        // (Not for the loop's whole life: the table of tasks in callbacks
        // is small.)
        let _mark = CallbackMark::enter();
        drop(this);
    }
}
