// SPDX-License-Identifier: GPL-2.0

//! Which tasks are inside one of the layer's callbacks.
//!
//! Destroying an id from any callback of the layer is a deadlock or a
//! lockdep report waiting to happen: `rdma_destroy_id` takes the id's
//! handler mutex (the lock class the CM holds during every event), and a
//! QP's teardown drains completions that may be queued behind the running
//! one.  The CM's and the verbs' trampolines mark the running task here;
//! the CM level defers destructions and refuses to take another id's
//! handler mutex while the mark is set.
//!
//! The table is kernel-wide on purpose, not per module: being inside a
//! callback is a fact about the task, and the CM's handler mutexes and the
//! CQs' polls it guards against are shared by every module using the
//! layer.  (Compiled into a module out of tree, each copy of the layer has
//! its own table, blind to the callbacks of another module's copy.)

use super::bindings;
use core::sync::atomic::{AtomicUsize, Ordering};

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

/// The current task, as an identity to compare (never dereferenced).
pub(crate) fn current_task() -> *mut bindings::task_struct {
    // SAFETY: Reads `current`, valid in any context this layer runs in.
    unsafe { bindings::get_current() }
}
