// SPDX-License-Identifier: GPL-2.0

//! Fork children: ioctls prepared before `fork()`, made with
//! async-signal-safe calls only.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// fork() mid-sequence.

/// Bytes of an argument structure a fork child sends back (the largest
/// structures, CONNECT's and ACCEPT's, have 608).
pub(super) const CHILD_OUT: usize = 640;
/// One result record of a fork child: the errno (0: success), then the
/// argument structure as the kernel left it.
pub(super) const CHILD_REC: usize = 4 + CHILD_OUT;
/// A fork child's calls at most.
pub(super) const CHILD_OPS: u64 = 6;
/// The result of a call that did not reach the kernel: captured for a fork
/// child, or the child ended before it.
pub(super) const NOT_RUN: i32 = i32::MIN;

/// Where the ioctls of `Worker::ioctl_op` go.
pub(super) enum Mode {
    Live,
    /// Preparing a fork child's calls: nothing reaches the kernel.
    Capture(Vec<Planned>),
    /// A fork child's results, in order, played into the model and judged.
    Feed(VecDeque<Option<(i32, Vec<u8>)>>),
}

/// A captured call: the argument buffer as placed.
pub(super) struct Planned {
    pub(super) fd: i32,
    pub(super) number: u32,
    pub(super) arg: u64,
    pub(super) in_arg: bool,
    pub(super) bytes: Vec<u64>,
}

/// One call of a fork child, prepared before fork(): plain data.
#[derive(Clone, Copy)]
pub(super) struct ChildCall {
    pub(super) fd: i32,
    pub(super) number: u32,
    pub(super) arg: u64,
    /// The argument is in the child's slab: send it back.
    pub(super) back: bool,
}

/// The fork child.  After fork() in a threaded process only
/// async-signal-safe calls are allowed: ioctl, write and _exit, no
/// allocation, no lock, no path that could panic.
///
/// # Safety
///
/// `calls` holds `n` calls whose argument pointers are valid or
/// deliberately invalid; `out` has room for `n` records of [`CHILD_REC`].
pub(super) unsafe fn child_main(calls: *const ChildCall, n: usize, out: *mut u8, wfd: i32) -> ! {
    for i in 0..n {
        let c = *calls.add(i);
        let r = libc::ioctl(c.fd, c.number as _, c.arg as usize);
        let e: i32 = if r < 0 { *libc::__errno_location() } else { 0 };
        let rec = out.add(i * CHILD_REC);
        std::ptr::write_unaligned(rec.cast::<i32>(), e);
        if c.back {
            std::ptr::copy_nonoverlapping(c.arg as *const u8, rec.add(4), CHILD_OUT);
        }
        let mut done = 0;
        while done < CHILD_REC {
            let w = libc::write(wfd, rec.add(done).cast(), CHILD_REC - done);
            if w > 0 {
                done += w as usize;
            } else if w < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            } else {
                libc::_exit(2);
            }
        }
    }
    libc::_exit(0)
}
