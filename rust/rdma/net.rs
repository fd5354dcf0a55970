// SPDX-License-Identifier: GPL-2.0

//! Network namespaces (`struct net`), as the CM sees them.
//!
//! C header: [`include/net/net_namespace.h`](srctree/include/net/net_namespace.h).
//!
//! An id lives in the namespace it was created in: addresses are resolved
//! and bound among that namespace's interfaces.  Holding an
//! [`ARef<NetNs>`] lets a consumer fix the namespace once, e.g. when a file
//! is opened (as sockets do), and create ids from any task later.

use super::bindings;
use core::ptr::NonNull;
use kernel::{
    prelude::*,
    sync::aref::{ARef, AlwaysRefCounted},
    types::Opaque,
};

/// A network namespace.
///
/// # Invariants
///
/// A `&NetNs` is a live `struct net` on which its holder owns a reference.
#[repr(transparent)]
pub struct NetNs(Opaque<bindings::net>);

// SAFETY: `put_net` may be called from any thread.
unsafe impl Send for NetNs {}
// SAFETY: Shared access only compares addresses.
unsafe impl Sync for NetNs {}

// SAFETY: `get_net`/`put_net` count references; the last `put_net` frees
// the namespace (`__put_net`), not before.
unsafe impl AlwaysRefCounted for NetNs {
    fn inc_ref(&self) {
        // SAFETY: `&self` means a reference is held: the namespace is live.
        unsafe { bindings::get_net(self.as_ptr()) };
    }

    unsafe fn dec_ref(obj: NonNull<Self>) {
        // SAFETY: The caller owns one reference, which `put_net` drops.
        unsafe { bindings::put_net(obj.as_ptr().cast()) };
    }
}

impl NetNs {
    /// The initial namespace (`init_net`).
    pub fn init() -> ARef<Self> {
        // SAFETY: `init_net` is static and never freed; `get_net` takes a
        // reference on it, owned by the `ARef`.
        unsafe {
            let raw = bindings::get_net(&raw mut bindings::init_net);
            ARef::from_raw(NonNull::new_unchecked(raw.cast()))
        }
    }

    /// The calling task's namespace.  `ESRCH` for a task that has left its
    /// namespaces already (an exiting task running its last file
    /// releases, whose `nsproxy` is gone).
    pub fn current() -> Result<ARef<Self>> {
        // SAFETY: Reads the current task's own `nsproxy`, which only the
        // task itself changes, and takes a reference on its namespace.
        let raw = unsafe { bindings::rdma_cm_rs_get_current_net() };
        let raw = NonNull::new(raw).ok_or(ESRCH)?;
        // SAFETY: The reference taken above is owned by the `ARef`.
        Ok(unsafe { ARef::from_raw(raw.cast()) })
    }

    /// Whether this is the initial namespace.
    pub fn is_init(&self) -> bool {
        // The address of the static `init_net`.
        self.as_ptr() == &raw mut bindings::init_net
    }

    pub(crate) fn as_ptr(&self) -> *mut bindings::net {
        self.0.get()
    }
}
