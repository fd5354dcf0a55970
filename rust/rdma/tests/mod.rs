// SPDX-License-Identifier: GPL-2.0

//! KUnit suites for the abstraction layer's validation rules.  They run when
//! the module is loaded (`kunit_module_notify`) and report KTAP to dmesg.

use kernel::{
    prelude::*,
    str::{CStrExt, CString},
};

/// Marks the running case skipped (KTAP `ok N case # SKIP reason`), for a
/// case that could not set up on the test bed's devices (`rxe0` at
/// 192.0.2.1, `siw0` at 203.0.113.1): counted apart from passes, and
/// `tools/check.sh` fails on it in its test VMs, which have both.
fn skip_without_devices(e: Error) {
    let owned = CString::try_from_fmt(fmt!("needs the test bed's rxe0 (and siw0): {e:?}"));
    let reason: &CStr = match &owned {
        Ok(reason) => reason,
        Err(_) => c"needs the test bed's rxe0 (and siw0)",
    };
    // SAFETY: Reads this task's own `kunit_test` pointer.
    let test = unsafe { kernel::bindings::kunit_get_current_test() };
    if test.is_null() {
        // No case runs in this task.
        return;
    }
    // What `kunit_mark_skipped` (a macro) does; the case goes on running
    // and the caller returns from it.
    // SAFETY: `test` is the case running in this task, live while it runs;
    // its status is set with `WRITE_ONCE` as the macro does, and `reason`,
    // a NUL-terminated string that outlives the call, is copied (`%s`)
    // into the comment buffer, bounded by its size.
    unsafe {
        (&raw mut (*test).status).write_volatile(kernel::bindings::kunit_status_KUNIT_SKIPPED);
        kernel::bindings::scnprintf(
            (&raw mut (*test).status_comment).cast(),
            kernel::bindings::KUNIT_STATUS_COMMENT_SIZE as usize,
            c"%s".as_char_ptr(),
            reason.as_char_ptr(),
        );
    }
}

/// Checks of a case made while it holds objects of a device, asserted
/// once they are gone.  A KUnit assertion ends the
/// case's thread where it stands, without running destructors: an id, a
/// QP or a PD left behind would keep its device, and `rdma link delete`
/// would wait for it for ever.  A case records instead, returns (which
/// drops what it holds), and asserts last that none failed.
struct Checks {
    failed: KVec<CString>,
    lost: bool,
}

impl Checks {
    fn new() -> Self {
        Self {
            failed: KVec::new(),
            lost: false,
        }
    }

    /// Records `what` as failed unless `ok`; returns `ok`.
    fn check(&mut self, what: &str, ok: bool) -> bool {
        if !ok {
            self.fail(fmt!("{what}"));
        }
        ok
    }

    /// Records `what` as failed unless `got == want`, with both; returns
    /// whether they were equal.
    fn eq<T: PartialEq + core::fmt::Debug>(&mut self, what: &str, got: T, want: T) -> bool {
        let ok = got == want;
        if !ok {
            self.fail(fmt!("{what}: {got:?}, expected {want:?}"));
        }
        ok
    }

    fn fail(&mut self, message: core::fmt::Arguments<'_>) {
        let recorded = CString::try_from_fmt(message)
            .ok()
            .is_some_and(|m| self.failed.push(m, GFP_KERNEL).is_ok());
        // Still a failure, without its words.
        self.lost |= !recorded;
    }

    /// Prints every failed check and returns how many there were, for the
    /// case to assert none (`assert_eq!(checks.failures(), 0)`): only the
    /// assertions of a `#[kunit_tests]` module's functions are KUnit's,
    /// one here would panic the kernel.
    fn failures(self) -> usize {
        for message in &self.failed {
            pr_err!("check failed: {}\n", &**message);
        }
        self.failed.len() + usize::from(self.lost)
    }
}

/// What `take` moves out of the state behind `lock`, handed back once the
/// lock is released.  An id a case keeps in the state its handlers share
/// must be dropped without that lock: the id's destruction waits for its
/// handler, which takes the lock.  (As a statement, `seen.lock().server.take();`
/// drops the id before the guard: lockdep reported the inversion when a
/// SIDR case failed on a loaded machine.)
fn take_out<T: Unpin, U>(lock: &kernel::sync::Mutex<T>, take: impl FnOnce(&mut T) -> U) -> U {
    let mut guard = lock.lock();
    let taken = take(&mut guard);
    drop(guard);
    taken
}

/// [`wait_until`] checking every 10 to 20 microseconds, for up to `limit`:
/// the caller acts while what it waits for is still under way.  Sleeping
/// (rather than spinning) lets the scheduler wake the caller on another
/// CPU than the work it watches.
fn wait_closely_until(limit: kernel::time::Delta, mut done: impl FnMut() -> bool) -> bool {
    let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        kernel::time::delay::fsleep(kernel::time::Delta::from_micros(10));
    }
    done()
}

/// Polls `done` every 10 ms for up to 5 s; whether it came true.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if done() {
            return true;
        }
        kernel::time::delay::fsleep(kernel::time::Delta::from_millis(10));
    }
    false
}

mod addr;
mod client;
mod conn_param;
mod cq;
mod fixture;
mod getaddrinfo;
mod ids;
mod multicast;
mod qp;
mod rdma;
mod regions;
mod srq;
mod synchronous_calls;
mod ud;
mod work;
