// SPDX-License-Identifier: GPL-2.0

//! Sleeping until a [`PollContext::Notified`] CQ has something to poll:
//! the tasks that wait for it, and what wakes them (the device's
//! completion notification, or another task's poll that ran completions).
//!
//! [`PollContext::Notified`]: super::PollContext::Notified

use crate::rdma::bindings;
use core::{
    marker::PhantomPinned,
    sync::atomic::{AtomicU32, Ordering},
};
use kernel::{
    prelude::*,
    sync::LockClassKey,
    task::{MAX_SCHEDULE_TIMEOUT, TASK_INTERRUPTIBLE},
    time::Jiffies,
    types::Opaque,
};

/// A point in the history of a notified CQ, taken before a poll:
/// [`Cq::wait_since`] returns at once if the CQ was notified, or another
/// task's poll ran completions, after it.
///
/// [`Cq::wait_since`]: super::Cq::wait_since
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CqMark(u32);

/// The tasks sleeping until a notified CQ has news.
///
/// # Invariants
///
/// `head` is an initialised wait queue head, pinned with this object.
#[pin_data]
pub(super) struct CqWaiters {
    #[pin]
    head: Opaque<bindings::wait_queue_head>,
    /// Counts what a waiter must not sleep through: the device's
    /// notifications and the polls that ran completions.
    news: AtomicU32,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: A wait queue head may be used from any thread; `news` is atomic.
unsafe impl Send for CqWaiters {}
// SAFETY: As above.
unsafe impl Sync for CqWaiters {}

impl CqWaiters {
    pub(super) fn new(name: &'static CStr, key: Pin<&'static LockClassKey>) -> impl PinInit<Self> {
        pin_init!(Self {
            // SAFETY: `slot` is valid while the closure runs; `name` and
            // `key` are static.
            head <- Opaque::ffi_init(|slot| unsafe {
                bindings::__init_waitqueue_head(slot, name.as_char_ptr(), key.as_ptr())
            }),
            news: AtomicU32::new(0),
            _pin: PhantomPinned,
        })
    }

    pub(super) fn mark(&self) -> CqMark {
        CqMark(self.news.load(Ordering::Acquire))
    }

    /// Counts news and wakes every waiter.  Any context: the device's
    /// notification may come with interrupts off.  Without a waiter (the
    /// end of every poll of a busy-polling loop) the queue's lock is not
    /// taken.
    pub(super) fn wake(&self) {
        self.news.fetch_add(1, Ordering::AcqRel);
        // SAFETY: `head` is initialised (type invariants).  `wq_has_sleeper`
        // puts a full barrier between the count above and its look at the
        // queue; a waiter joins the queue (`prepare_to_wait`, whose change
        // of the task's state is a full barrier) before it reads the count.
        // So a waiter that missed this news is on the queue, and is seen.
        if !unsafe { bindings::wq_has_sleeper(self.head.get()) } {
            return;
        }
        // SAFETY: `head` is initialised (type invariants); `__wake_up`
        // takes its lock with interrupts saved, as any context may.
        unsafe {
            bindings::__wake_up(
                self.head.get(),
                bindings::TASK_NORMAL,
                0,
                core::ptr::null_mut(),
            )
        };
    }

    /// Sleeps, interruptibly and at most `timeout` (at or above
    /// `MAX_SCHEDULE_TIMEOUT`: without limit), until news after `mark`.
    /// `arm` runs once this task is on the queue and news since `mark`
    /// were checked: it asks the device to notify the next completion,
    /// and returns `true` if one may already have come unnotified, which
    /// ends the wait at once.
    ///
    /// The jiffies left (`MAX_SCHEDULE_TIMEOUT` without limit) when there
    /// is news; `ETIMEDOUT` once the time ran out without any;
    /// `ERESTARTSYS` on a signal; `arm`'s error.
    pub(super) fn wait_since(
        &self,
        mark: CqMark,
        timeout: Jiffies,
        arm: impl FnOnce() -> Result<bool>,
    ) -> Result<Jiffies> {
        let timeout: kernel::ffi::c_long = timeout.try_into().unwrap_or(MAX_SCHEDULE_TIMEOUT);
        let entry = Opaque::<bindings::wait_queue_entry>::uninit();
        // SAFETY: `entry` is valid memory for a wait queue entry.
        unsafe { bindings::init_wait(entry.get()) };
        // On the queue and interruptible before the checks: a `wake` after
        // them makes the sleep below return at once.
        // SAFETY: `head` is initialised (type invariants), `entry` just
        // was; `finish_wait` below takes it off before it goes.
        unsafe { bindings::prepare_to_wait(self.head.get(), entry.get(), TASK_INTERRUPTIBLE) };
        let news_before = self.news.load(Ordering::Acquire) != mark.0;
        let ready = match news_before {
            true => Ok(true),
            false => arm(),
        };
        let left = match ready {
            Ok(false) => {
                // SAFETY: Process context (the caller's, that may sleep);
                // any timeout is valid.
                unsafe { bindings::schedule_timeout(timeout) }
            }
            _ => timeout,
        };
        // SAFETY: `entry` was put on `head` above.
        unsafe { bindings::finish_wait(self.head.get(), entry.get()) };
        ready?;
        if self.news.load(Ordering::Acquire) != mark.0 {
            return Ok(Jiffies::try_from(left).unwrap_or(0));
        }
        if kernel::current!().signal_pending() {
            return Err(ERESTARTSYS);
        }
        match left {
            0 => Err(ETIMEDOUT),
            // Woken without news: a spurious wake-up, or `arm` reported a
            // completion that may have come unnotified.
            left => Ok(Jiffies::try_from(left).unwrap_or(0)),
        }
    }
}
