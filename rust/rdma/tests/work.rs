// SPDX-License-Identifier: GPL-2.0

//! KUnit: A module's own work (`Owner::spawn`, `Owner::spawn_after`): where
//! and when it runs, and what the `ModuleOwner`'s drop does with it.  No
//! device needed.

use super::fixture::{ms, owner, Nop};
use super::wait_until;
use kernel::prelude::*;

#[kunit_tests(rdma_cm_rs_work)]
mod work_tests {
    use super::{ms, owner, wait_until, Nop};
    use crate::rdma::{
        callback::{in_any_callback, CallbackMark},
        cm::{CmId, PortSpace},
        net::NetNs,
        QpType,
    };
    use core::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicUsize, Ordering};
    use kernel::{
        prelude::*,
        sync::Arc,
        time::{delay::fsleep, Delta, Instant, Monotonic},
        workqueue,
    };

    // A closure runs on a worker: it records what it saw, and the case
    // asserts once the closure and the owner are gone (a panic on the
    // worker would be the kernel's, and a KUnit assertion ends the case's
    // thread without dropping what it holds).

    /// Counts its drops: moved into a closure, it tells whether the
    /// closure was dropped, run or not.
    struct DropCount(Arc<AtomicUsize>);

    impl Drop for DropCount {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> Arc<AtomicUsize> {
        Arc::new(AtomicUsize::new(0), GFP_KERNEL).unwrap()
    }

    fn flag() -> Arc<AtomicBool> {
        Arc::new(AtomicBool::new(false), GFP_KERNEL).unwrap()
    }

    /// What a spawn returned, as an errno (0 for `Ok`), for a closure to
    /// record; `NOT_YET` before.
    fn errno(result: Result) -> i32 {
        result.map_or_else(Error::to_errno, |()| 0)
    }

    const NOT_YET: i32 = 1;

    fn result_slot() -> Arc<AtomicI32> {
        Arc::new(AtomicI32::new(NOT_YET), GFP_KERNEL).unwrap()
    }

    /// What the closure of
    /// [`spawn_runs_once_in_process_context_outside_callbacks`] saw.
    #[derive(Default)]
    struct Seen {
        /// The spawner went on (and let it go) before it ran: it was not
        /// run inline.
        released: AtomicBool,
        /// Its task was in no callback of the layer.
        outside_callbacks: AtomicBool,
        /// `Owner::flush` (refused inside callbacks) waited.
        flushed: AtomicBool,
        /// An id it made was destroyed by its drop there and then (inside
        /// a callback the destruction is deferred to the owner's queue).
        id_destroyed_at_once: AtomicBool,
        runs: AtomicUsize,
    }

    /// `spawn` from inside a callback (the `CallbackMark` the trampolines
    /// set, on the spawning task, where `Owner::flush` is refused with
    /// `EDEADLK`; no device needed) runs the closure once, in process
    /// context on another task, outside every callback: it may sleep,
    /// flush the owner's deferred destructions, and make and destroy an id
    /// synchronously.  It runs once even after the owner's drop (which
    /// finds nothing left to wait for).
    #[test]
    fn spawn_runs_once_in_process_context_outside_callbacks() {
        let module = owner();
        let owner = module.owner().clone();
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let go = flag();
        let (refused_in_callback, spawned, ran) = {
            let _mark = CallbackMark::enter();
            let refused_in_callback = owner.flush() == Err(EDEADLK);
            let spawned = {
                let (seen, go, handle) = (seen.clone(), go.clone(), owner.clone());
                owner.spawn(move || {
                    let owner = handle;
                    // What follows may sleep (the flush, the id's
                    // creation and destruction): in atomic context
                    // `might_sleep` would report it (the test kernel has
                    // CONFIG_DEBUG_ATOMIC_SLEEP).
                    let released = wait_until(|| go.load(Ordering::Acquire));
                    seen.released.store(released, Ordering::SeqCst);
                    seen.outside_callbacks
                        .store(!in_any_callback(), Ordering::SeqCst);
                    seen.flushed.store(owner.flush().is_ok(), Ordering::SeqCst);
                    let before = owner.callback_targets();
                    let id = CmId::new(&owner, Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc);
                    let made = id.is_ok() && owner.callback_targets() == before + 1;
                    drop(id);
                    seen.id_destroyed_at_once
                        .store(made && owner.callback_targets() == before, Ordering::SeqCst);
                    seen.runs.fetch_add(1, Ordering::SeqCst);
                })
            };
            go.store(true, Ordering::Release);
            // Still inside the "callback" while the closure runs.
            let ran = wait_until(|| seen.runs.load(Ordering::SeqCst) != 0);
            (refused_in_callback, spawned, ran)
        };
        fsleep(ms(50));
        let runs_before_drop = seen.runs.load(Ordering::SeqCst);
        drop(module);
        assert!(refused_in_callback);
        assert_eq!(spawned, Ok(()));
        assert!(ran);
        assert!(seen.released.load(Ordering::SeqCst));
        assert!(seen.outside_callbacks.load(Ordering::SeqCst));
        assert!(seen.flushed.load(Ordering::SeqCst));
        assert!(seen.id_destroyed_at_once.load(Ordering::SeqCst));
        assert_eq!(runs_before_drop, 1);
        assert_eq!(seen.runs.load(Ordering::SeqCst), 1);
    }

    /// `spawn_after(50 ms)` runs the closure once, not before 50 ms have
    /// passed since the call (measured by the closure itself), and soon
    /// after.
    #[test]
    fn spawn_after_runs_once_its_delay_has_passed() {
        let module = owner();
        let delay = ms(50);
        // The closure's time since the call, in nanoseconds; -1 before.
        let ran_after = Arc::new(AtomicI64::new(-1), GFP_KERNEL).unwrap();
        let runs = counter();
        let start = Instant::<Monotonic>::now();
        let spawned = {
            let (ran_after, runs) = (ran_after.clone(), runs.clone());
            module.spawn_after(delay, move || {
                ran_after.store(start.elapsed().as_nanos(), Ordering::SeqCst);
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        let ran = wait_until(|| runs.load(Ordering::SeqCst) != 0);
        drop(module);
        let elapsed = ran_after.load(Ordering::SeqCst);
        assert_eq!(spawned, Ok(()));
        assert!(ran);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(elapsed >= delay.as_nanos());
        // One wait until the deadline: late by a scheduling delay, not by
        // seconds.
        assert!(elapsed < Delta::from_secs(2).as_nanos());
    }

    /// Dropping the `ModuleOwner` while a `spawn_after(10 s)` sleeps out
    /// its delay returns at once (the drop wakes it, not 10 s later), and
    /// the closure was dropped unrun by then.
    #[test]
    fn dropping_the_owner_drops_sleeping_work_unrun() {
        let module = owner();
        let (runs, drops) = (counter(), counter());
        let spawned = {
            let (runs, guard) = (runs.clone(), DropCount(drops.clone()));
            module.spawn_after(Delta::from_secs(10), move || {
                let _kept = &guard;
                runs.fetch_add(1, Ordering::SeqCst);
            })
        };
        // The work item has begun sleeping.
        fsleep(ms(100));
        let drops_before = drops.load(Ordering::SeqCst);
        let start = Instant::<Monotonic>::now();
        drop(module);
        let took = start.elapsed();
        assert_eq!(spawned, Ok(()));
        assert_eq!(drops_before, 0);
        assert!(took.as_millis() < 500);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    }

    /// Once its `ModuleOwner` has begun to drop (here kept waiting by a
    /// running work item), an owner refuses `spawn` and `spawn_after` with
    /// `ENXIO`, dropping their closures unrun before returning; the drop
    /// waits for the running work item.
    #[test]
    fn spawn_is_refused_once_the_owner_is_dropping() {
        let module = owner();
        let owner = module.owner().clone();
        let (release, held_done) = (flag(), flag());
        let held = {
            let (release, held_done) = (release.clone(), held_done.clone());
            owner.spawn(move || {
                held_done.store(
                    wait_until(|| release.load(Ordering::Acquire)),
                    Ordering::SeqCst,
                );
            })
        };
        let dropped = flag();
        let unloading = dropped.clone();
        let dropping = workqueue::system().try_spawn(GFP_KERNEL, move || {
            drop(module);
            unloading.store(true, Ordering::Release);
        });
        let closed = wait_until(|| owner.is_closed());
        let (runs, drops) = (counter(), counter());
        let refused = [
            {
                let (runs, guard) = (runs.clone(), DropCount(drops.clone()));
                owner.spawn(move || {
                    let _kept = &guard;
                    runs.fetch_add(1, Ordering::SeqCst);
                })
            },
            {
                let (runs, guard) = (runs.clone(), DropCount(drops.clone()));
                owner.spawn_after(ms(1), move || {
                    let _kept = &guard;
                    runs.fetch_add(1, Ordering::SeqCst);
                })
            },
        ];
        let drops_on_return = drops.load(Ordering::SeqCst);
        // The drop waits for the held work item.
        fsleep(ms(100));
        let waited = !dropped.load(Ordering::Acquire);
        release.store(true, Ordering::Release);
        let unloaded = wait_until(|| dropped.load(Ordering::Acquire));
        assert_eq!(held, Ok(()));
        assert!(dropping.is_ok());
        assert!(closed);
        assert_eq!(refused, [Err(ENXIO), Err(ENXIO)]);
        assert_eq!(drops_on_return, 2);
        assert!(waited);
        assert!(unloaded);
        assert!(held_done.load(Ordering::SeqCst));
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }

    /// Work spawned by a spawned closure (before the owner closes) runs
    /// before the `ModuleOwner`'s drop returns, however long it takes
    /// after the drop began; what that work spawns once the owner is
    /// closing is refused (`ENXIO`) and dropped unrun.
    #[test]
    fn chained_work_runs_before_the_owner_drop_returns() {
        let module = owner();
        let owner = module.owner().clone();
        let chained = result_slot();
        let saw_closing = flag();
        let last = result_slot();
        let (second_runs, third_runs, third_drops) = (counter(), counter(), counter());
        let first = {
            let (handle, chained) = (owner.clone(), chained.clone());
            let (saw_closing, last) = (saw_closing.clone(), last.clone());
            let (second_runs, third_runs, third_drops) =
                (second_runs.clone(), third_runs.clone(), third_drops.clone());
            owner.spawn(move || {
                let owner = handle;
                let second = owner.clone().spawn(move || {
                    // Still running when the drop begins.
                    saw_closing.store(wait_until(|| owner.is_closed()), Ordering::SeqCst);
                    fsleep(ms(50));
                    let guard = DropCount(third_drops);
                    let third = owner.spawn(move || {
                        let _kept = &guard;
                        third_runs.fetch_add(1, Ordering::SeqCst);
                    });
                    last.store(errno(third), Ordering::SeqCst);
                    second_runs.fetch_add(1, Ordering::SeqCst);
                });
                chained.store(errno(second), Ordering::SeqCst);
            })
        };
        // The second closure is queued before the drop begins.
        let first_ran = wait_until(|| chained.load(Ordering::SeqCst) != NOT_YET);
        drop(module);
        // No waiting from here: the drop waited.
        assert_eq!(first, Ok(()));
        assert!(first_ran);
        assert_eq!(chained.load(Ordering::SeqCst), 0);
        assert_eq!(second_runs.load(Ordering::SeqCst), 1);
        assert!(saw_closing.load(Ordering::SeqCst));
        assert_eq!(last.load(Ordering::SeqCst), ENXIO.to_errno());
        assert_eq!(third_runs.load(Ordering::SeqCst), 0);
        assert_eq!(third_drops.load(Ordering::SeqCst), 1);
    }
}
