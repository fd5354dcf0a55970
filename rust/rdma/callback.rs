// SPDX-License-Identifier: GPL-2.0

//! Which tasks are inside one of this layer's callbacks, and how many of
//! the module's objects the C side can call back into.
//!
//! Destroying an id from any callback of the layer is a deadlock or a
//! lockdep report waiting to happen: `rdma_destroy_id` takes the id's
//! handler mutex (the lock class the CM holds during every event), and a
//! QP's teardown drains completions that may be queued behind the running
//! one.  The CM's and the verbs' trampolines mark the running task here;
//! the CM level defers destructions and refuses to take another id's
//! handler mutex while the mark is set.

use super::bindings;
use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use kernel::prelude::*;

/// Tasks running a callback, each with [`COMPLETION`] set while the
/// callback is a completion handler's.  The table is small and fixed; when
/// it is full, [`UNLISTED`] counts the extra callbacks (and
/// [`UNLISTED_COMPLETIONS`] those that are completions) and every task is
/// treated as being in one until they return: nothing deadlocks, but
/// meanwhile every `CmId` drop is deferred, `with_lock` on an id outside
/// its own callback fails with `EDEADLK`, and so does a QP's destruction.
static TASKS: [AtomicUsize; 64] = [const { AtomicUsize::new(0) }; 64];
static UNLISTED: AtomicUsize = AtomicUsize::new(0);
static UNLISTED_COMPLETIONS: AtomicUsize = AtomicUsize::new(0);

/// The tag of a completion handler's entry in [`TASKS`] (a `task_struct`
/// is aligned: its address's low bit is free).
const COMPLETION: usize = 1;

/// Lists the current task in [`TASKS`] while it lives.
pub(crate) struct CallbackMark {
    slot: Option<usize>,
    completion: bool,
}

impl CallbackMark {
    /// Marks the current task as running a callback.
    pub(crate) fn enter() -> Self {
        Self::enter_as(false)
    }

    /// Marks the current task as running a completion handler: besides
    /// what every callback may not do, it may not destroy a QP (whose
    /// teardown may wait for another task's poll of a CQ, which may wait
    /// for the poll this handler runs in).
    pub(crate) fn enter_completion() -> Self {
        Self::enter_as(true)
    }

    fn enter_as(completion: bool) -> Self {
        let entry = current_task() as usize | if completion { COMPLETION } else { 0 };
        for (i, slot) in TASKS.iter().enumerate() {
            if slot
                .compare_exchange(0, entry, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Self {
                    slot: Some(i),
                    completion,
                };
            }
        }
        UNLISTED.fetch_add(1, Ordering::AcqRel);
        if completion {
            UNLISTED_COMPLETIONS.fetch_add(1, Ordering::AcqRel);
        }
        Self {
            slot: None,
            completion,
        }
    }
}

impl Drop for CallbackMark {
    fn drop(&mut self) {
        match self.slot {
            Some(i) => TASKS[i].store(0, Ordering::Release),
            None => {
                if self.completion {
                    UNLISTED_COMPLETIONS.fetch_sub(1, Ordering::AcqRel);
                }
                UNLISTED.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

/// Whether the current task may be inside one of this layer's callbacks.
pub(crate) fn in_any_callback() -> bool {
    if UNLISTED.load(Ordering::Acquire) != 0 {
        return true;
    }
    let me = current_task() as usize;
    TASKS
        .iter()
        .any(|slot| slot.load(Ordering::Acquire) & !COMPLETION == me)
}

/// Whether the current task may be inside a completion handler of this
/// layer (also when it runs another callback inside one, a nested
/// `with_lock`).
pub(crate) fn in_completion_handler() -> bool {
    if UNLISTED_COMPLETIONS.load(Ordering::Acquire) != 0 {
        return true;
    }
    let me = current_task() as usize | COMPLETION;
    TASKS.iter().any(|slot| slot.load(Ordering::Acquire) == me)
}

/// Objects alive that the C side can call into this module's code through;
/// see [`CallbackTarget`].
static TARGETS: AtomicUsize = AtomicUsize::new(0);

/// Held by every object whose address the C side keeps as the context of
/// a trampoline of this module (ids, CQs, QPs, SRQs, client and event
/// registrations), and by the workqueue of busy-polling loops, from its
/// creation to the end of its drop, after it was taken off the C side (or
/// its loops all returned).
///
/// The module's [`super::deferred::DestroyQueue`] waits for the count to
/// reach zero before the module's code goes.  Leaking such an object is
/// safe Rust (`mem::forget`, a reference cycle such as QP -> CQ -> handler
/// -> QP), and without the wait the C side would go on calling the
/// trampoline after the module was unloaded: with it, the unload waits
/// for good (and says why) instead.  That wait exists only while the
/// module holds a queue, so a target is made only then: without one (or
/// once its drop has begun) [`CallbackTarget::new`] fails, and with it the
/// construction of every object that holds one.
pub(crate) struct CallbackTarget(());

/// Set by the `DestroyQueue`'s drop before it waits for the count: no
/// target is made after it read the count (see [`CallbackTarget::new`]).
static CLOSED: AtomicBool = AtomicBool::new(true);

impl CallbackTarget {
    /// Counts one more object.  `ENXIO` unless a `DestroyQueue` is open,
    /// whose drop waits for this one.
    pub(crate) fn new() -> Result<Self> {
        // Counted before the check, the drop's store before its read of
        // the count (both `SeqCst`): either the drop sees this target and
        // waits for it, or this sees the queue closing and gives up.
        TARGETS.fetch_add(1, Ordering::SeqCst);
        if CLOSED.load(Ordering::SeqCst) || refused_for_a_test() {
            TARGETS.fetch_sub(1, Ordering::SeqCst);
            return Err(ENXIO);
        }
        Ok(Self(()))
    }
}

/// Opened by a new `DestroyQueue`, closed by its drop before it waits for
/// the targets.
pub(super) fn set_targets_open(open: bool) {
    CLOSED.store(!open, Ordering::SeqCst);
}

/// KUnit: makes [`CallbackTarget::new`] fail while it is set, as in a
/// module without a `DestroyQueue` (the module's own queue cannot be
/// closed under its running tests).
#[cfg(CONFIG_KUNIT)]
static REFUSE_FOR_TEST: AtomicBool = AtomicBool::new(false);

#[cfg(CONFIG_KUNIT)]
fn refused_for_a_test() -> bool {
    REFUSE_FOR_TEST.load(Ordering::SeqCst)
}

#[cfg(not(CONFIG_KUNIT))]
fn refused_for_a_test() -> bool {
    false
}

/// KUnit: runs `f` as if the module held no `DestroyQueue`.
#[cfg(CONFIG_KUNIT)]
pub(crate) fn without_destroy_queue<R>(f: impl FnOnce() -> R) -> R {
    REFUSE_FOR_TEST.store(true, Ordering::SeqCst);
    let r = f();
    REFUSE_FOR_TEST.store(false, Ordering::SeqCst);
    r
}

impl Drop for CallbackTarget {
    fn drop(&mut self) {
        TARGETS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How many [`CallbackTarget`]s are alive.
pub(crate) fn callback_targets() -> usize {
    TARGETS.load(Ordering::SeqCst)
}

/// The current task, as an identity to compare (never dereferenced).
pub(crate) fn current_task() -> *mut bindings::task_struct {
    // SAFETY: Reads `current`, valid in any context this layer runs in.
    unsafe { bindings::rdma_cm_rs_current_task() }
}
