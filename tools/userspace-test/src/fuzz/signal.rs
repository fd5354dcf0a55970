// SPDX-License-Identifier: GPL-2.0

//! Signals: another thread interrupts a blocking call.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Signals: another thread interrupts a blocking call.

/// The signal.  Its handler does nothing and is installed without
/// `SA_RESTART`, so an interrupted wait of the module (`ERESTARTSYS`) ends
/// the call with `EINTR`.  Every fuzzing thread keeps it blocked except
/// during the one call it is aimed at.
pub(super) const SIG: libc::c_int = libc::SIGUSR1;
/// An armed signal is sent again this often until the call returns: the
/// first may land before the call sleeps.
pub(super) const SIG_REPEAT: Duration = Duration::from_millis(20);

pub(super) extern "C" fn on_signal(_: libc::c_int) {}

pub(super) fn install_signal_handler() -> Result<()> {
    // SAFETY: a zeroed sigaction is valid; the handler is empty, so
    // async-signal-safe; no SA_RESTART, no SA_SIGINFO.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(SIG, &sa, std::ptr::null_mut())
    };
    if r != 0 {
        bail!("sigaction: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

pub(super) fn sig_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set, sigaddset adds a valid signal.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, SIG);
        set
    }
}

/// Blocks or unblocks [`SIG`] in the calling thread.
pub(super) fn block_signal(block: bool) {
    let set = sig_set();
    let how = if block {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: a valid set; the old mask is not wanted.
    unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
}

/// Takes a signal that came after the call returned (blocked, pending).
pub(super) fn drain_signal() {
    let set = sig_set();
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid set and timeout; no siginfo wanted.
    while unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) } == SIG {}
}

/// The thread that sends the signals: a call armed with `sig=MS` gets
/// [`SIG`] (`pthread_kill`) MS ms after it started, then every
/// [`SIG_REPEAT`] until it returns.
#[derive(Default)]
pub(super) struct Signaller {
    st: Mutex<SigState>,
    cv: Condvar,
}

#[derive(Default)]
pub(super) struct SigState {
    reqs: Vec<SigReq>,
    next: u64,
    done: bool,
}

pub(super) struct SigReq {
    token: u64,
    thread: libc::pthread_t,
    due: Instant,
    sent: u32,
}

impl Signaller {
    /// Arms a signal for the calling thread.
    pub(super) fn arm(&self, ms: u32) -> u64 {
        let mut st = self.st.lock().unwrap();
        st.next += 1;
        let token = st.next;
        st.reqs.push(SigReq {
            token,
            // SAFETY: no preconditions.
            thread: unsafe { libc::pthread_self() },
            due: Instant::now() + Duration::from_millis(ms.into()),
            sent: 0,
        });
        self.cv.notify_all();
        token
    }

    /// Disarms; returns how many signals were sent.  None is sent after
    /// this returns.
    pub(super) fn disarm(&self, token: u64) -> u32 {
        let mut st = self.st.lock().unwrap();
        match st.reqs.iter().position(|r| r.token == token) {
            Some(i) => st.reqs.swap_remove(i).sent,
            None => 0,
        }
    }

    pub(super) fn run(&self) {
        let mut st = self.st.lock().unwrap();
        while !st.done {
            let now = Instant::now();
            for r in st.reqs.iter_mut().filter(|r| r.due <= now) {
                // SAFETY: the thread is alive: it disarms (under this lock)
                // before it goes on, and it has the handler.
                unsafe { libc::pthread_kill(r.thread, SIG) };
                r.sent += 1;
                r.due = now + SIG_REPEAT;
            }
            let wait = st
                .reqs
                .iter()
                .map(|r| r.due.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(1));
            st = self.cv.wait_timeout(st, wait).unwrap().0;
        }
    }

    pub(super) fn finish(&self) {
        self.st.lock().unwrap().done = true;
        self.cv.notify_all();
    }
}

/// One ioctl; with `sig`, signalled by the signaller thread while in it.
pub(super) fn live_ioctl(
    sh: &Shared,
    fd: i32,
    number: u32,
    arg: u64,
    sig: Option<u32>,
) -> std::result::Result<(), i32> {
    let Some(ms) = sig else {
        return ioctl(fd, number, arg);
    };
    sh.kind("signal: calls armed");
    let token = sh.signals.arm(ms);
    block_signal(false);
    let r = ioctl(fd, number, arg);
    block_signal(true);
    if sh.signals.disarm(token) > 0 {
        sh.kind("signal: sent during the call");
        drain_signal();
    }
    r
}
