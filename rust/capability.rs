// SPDX-License-Identifier: GPL-2.0

//! Capability checks of the current task, which 7.3's `kernel::cred` lacks.
//!
//! Upstream this belongs beside `kernel::cred`; it is here, with the other
//! `unsafe` of the crate outside `rust/rdma/`, until then.

/// A capability a check may ask for (`include/uapi/linux/capability.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// `CAP_NET_ADMIN`: network configuration, which includes adding and
    /// deleting RDMA links (`rdma link add`).
    NetAdmin,
}

impl Capability {
    fn raw(self) -> kernel::ffi::c_int {
        match self {
            // The constant is 12: it fits.
            Self::NetAdmin => kernel::bindings::CAP_NET_ADMIN as kernel::ffi::c_int,
        }
    }
}

/// Whether the current task has `cap` in the initial user namespace: a user
/// namespace's root does not, whatever it holds in its own namespace.
///
/// Like `capable()`, a successful check marks the task as having used a
/// privilege (`PF_SUPERPRIV`) and may be audited.
pub fn capable_in_init_ns(cap: Capability) -> bool {
    // SAFETY: `capable()` checks the credentials of `current`, which are
    // valid for the whole call; it takes any capability number and returns
    // false for one the kernel does not know.  It may sleep (audit), and
    // this is called in process context only.
    unsafe { kernel::bindings::capable(cap.raw()) }
}
