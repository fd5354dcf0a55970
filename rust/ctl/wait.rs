// SPDX-License-Identifier: GPL-2.0

//! Bounded, interruptible waits for the ioctls that block.

use crate::{
    abi,
    rdma::{CompletionHandler, Cq},
};
use kernel::{
    prelude::*,
    sync::{CondVar, CondVarTimeoutResult, Mutex, MutexGuard},
    time::{msecs_to_jiffies, Delta, Instant, Jiffies, Monotonic},
};

/// How long a caller is willing to wait.
#[derive(Clone, Copy)]
pub(crate) struct Wait {
    timeout_ms: u32,
    nonblock: bool,
}

impl Wait {
    /// `timeout_ms` 0 = do not wait, [`abi::TIMEOUT_INFINITE`] = no limit;
    /// `nonblock` (the file's `O_NONBLOCK`) never waits.
    pub(crate) fn new(timeout_ms: u32, nonblock: bool) -> Self {
        Self {
            timeout_ms,
            nonblock,
        }
    }
}

/// Waits on `cv` until `ready` holds for the guarded state.
///
/// `EAGAIN` when not ready and not allowed to wait, `ETIMEDOUT` when the
/// time ran out, `ERESTARTSYS` on a signal.
pub(crate) fn wait_for<T>(
    cv: &CondVar,
    guard: &mut MutexGuard<'_, T>,
    wait: Wait,
    ready: impl Fn(&T) -> bool,
) -> Result {
    if ready(guard) {
        return Ok(());
    }
    if wait.nonblock || wait.timeout_ms == 0 {
        return Err(EAGAIN);
    }
    if wait.timeout_ms == abi::TIMEOUT_INFINITE {
        while !ready(guard) {
            if cv.wait_interruptible(guard) {
                return Err(ERESTARTSYS);
            }
        }
        return Ok(());
    }
    let mut left = msecs_to_jiffies(wait.timeout_ms);
    loop {
        match cv.wait_interruptible_timeout(guard, left) {
            CondVarTimeoutResult::Timeout => {
                return if ready(guard) { Ok(()) } else { Err(ETIMEDOUT) };
            }
            CondVarTimeoutResult::Signal { .. } => return Err(ERESTARTSYS),
            CondVarTimeoutResult::Woken { jiffies } => {
                if ready(guard) {
                    return Ok(());
                }
                if jiffies == 0 {
                    return Err(ETIMEDOUT);
                }
                left = jiffies;
            }
        }
    }
}

/// How long [`wait_busy`] polls before it sleeps.
const SPIN: Delta = Delta::from_millis(1);

/// Waits until `ready` holds for the state `mutex` guards, on a
/// busy-polling connection ([`crate::rdma::PollContext::Notified`], its
/// waits polling first): polls the CQ without sleeping for up to
/// [`SPIN`], giving the CPU to every other runnable task between polls
/// ([`Cq::poll`]), then waits as [`wait_notified`] does.  The spin finds
/// an answer the moment the device writes it, without a wake-up; the
/// sleep after it keeps a long wait from taking CPU the device's own
/// tasks need (a yield does not let a task of a lower scheduling class
/// run), and notices the completion as soon as the device notifies it,
/// where polls between naps notice it a nap late.
///
/// Polls once before it gives up with `EAGAIN`; `ETIMEDOUT` and
/// `ERESTARTSYS` as [`wait_for`].  The guard comes back in every case.
pub(crate) fn wait_busy<'a, T, C: CompletionHandler>(
    mutex: &'a Mutex<T>,
    mut guard: MutexGuard<'a, T>,
    wait: Wait,
    cq: &Cq<C>,
    ready: impl Fn(&T) -> bool,
) -> (MutexGuard<'a, T>, Result) {
    let start = Instant::<Monotonic>::now();
    let mut polled = false;
    loop {
        if ready(&guard) {
            return (guard, Ok(()));
        }
        if polled {
            if wait.nonblock || wait.timeout_ms == 0 {
                return (guard, Err(EAGAIN));
            }
            if start.elapsed().as_nanos() >= SPIN.as_nanos() {
                break;
            }
            if kernel::current!().signal_pending() {
                return (guard, Err(ERESTARTSYS));
            }
        }
        drop(guard);
        // `EBUSY`: another caller polls, and its poll runs the handler that
        // changes what this one checks.
        let _ = cq.poll(POLL_BUDGET);
        polled = true;
        guard = mutex.lock();
    }
    let rest = if wait.timeout_ms == abi::TIMEOUT_INFINITE {
        wait
    } else {
        let spent = u32::try_from(start.elapsed().as_millis()).unwrap_or(u32::MAX);
        match wait.timeout_ms.checked_sub(spent) {
            Some(left) if left > 0 => Wait::new(left, false),
            // The time ran out while polling: the last poll decided.
            _ => return (guard, Err(ETIMEDOUT)),
        }
    };
    wait_notified(mutex, guard, rest, cq, ready)
}

/// Completions a waiter takes from its CQ in one poll.
pub(crate) const POLL_BUDGET: u32 = 16;

/// Waits until `ready` holds for the state `mutex` guards, on a connection
/// whose CQ only its callers process ([`crate::rdma::PollContext::Notified`]):
/// polls it, and when that changed nothing sleeps until the device
/// notifies a completion or another caller's poll ends.  One wake-up
/// between the device and the caller, where a CQ polled from a workqueue
/// takes two (its worker's, then the caller's).  The poll runs with the
/// lock released, since the handler it runs takes it.
///
/// Polls once before it gives up with `EAGAIN`; `ETIMEDOUT` and
/// `ERESTARTSYS` as [`wait_for`].  The guard comes back in every case.
pub(crate) fn wait_notified<'a, T, C: CompletionHandler>(
    mutex: &'a Mutex<T>,
    mut guard: MutexGuard<'a, T>,
    wait: Wait,
    cq: &Cq<C>,
    ready: impl Fn(&T) -> bool,
) -> (MutexGuard<'a, T>, Result) {
    let mut left: Jiffies = if wait.timeout_ms == abi::TIMEOUT_INFINITE {
        Jiffies::MAX
    } else {
        msecs_to_jiffies(wait.timeout_ms)
    };
    // Once the time ran out, one more poll decides.
    let mut timed_out = false;
    loop {
        if ready(&guard) {
            return (guard, Ok(()));
        }
        drop(guard);
        // `EBUSY`: another caller polls; the end of its poll is news.  It
        // keeps the CPU: the caller sleeps next if it found nothing.
        let _ = cq.poll_once(POLL_BUDGET);
        // After this caller's poll (whose end is news too) and before the
        // check: what changes after the check ends the sleep below.
        let mark = cq.mark();
        guard = mutex.lock();
        if ready(&guard) {
            return (guard, Ok(()));
        }
        if timed_out {
            return (guard, Err(ETIMEDOUT));
        }
        if wait.nonblock || wait.timeout_ms == 0 {
            return (guard, Err(EAGAIN));
        }
        drop(guard);
        let slept = cq.wait_since(mark, left);
        guard = mutex.lock();
        match slept {
            Ok(jiffies) => left = jiffies,
            Err(e) if e == ETIMEDOUT => timed_out = true,
            Err(e) => return (guard, Err(e)),
        }
    }
}
