// SPDX-License-Identifier: GPL-2.0

//! Protection domains (`struct ib_pd`).

use super::{
    bindings,
    device::Device,
    owner::{CallbackTarget, Owner},
};
use core::{
    ptr::NonNull,
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{
    prelude::*,
    sync::{aref::ARef, Arc},
    xarray::{AllocKind, XArray},
};

/// The remote key of a registration on a PD, which a peer may invalidate
/// with a SEND_WITH_INV (remote invalidation) arriving on any QP of the PD.
pub(crate) struct RemoteKey {
    invalidated: AtomicBool,
}

impl RemoteKey {
    /// Whether a peer invalidated the key (a receive completed with
    /// `IB_WC_WITH_INVALIDATE` naming it).
    pub(crate) fn is_invalidated(&self) -> bool {
        self.invalidated.load(Ordering::Acquire)
    }
}

/// A protection domain (`ib_alloc_pd`) on one device.
///
/// # Invariants
///
/// `raw` is a live PD allocated on `dev`, freed only by `drop` (before the
/// device reference goes).
#[pin_data(PinnedDrop)]
pub struct Pd {
    raw: NonNull<bindings::ib_pd>,
    dev: ARef<Device>,
    /// Counted on the owner of the PD and of what is made on it (SRQs,
    /// QPs): the resource tracking keeps the owner's name, a string of its
    /// module, for as long as the PD lives.
    target: CallbackTarget,
    /// The keys of the registrations on this PD a peer may invalidate, by
    /// remote key (unique on a device while registered).
    #[pin]
    remote_keys: XArray<Arc<RemoteKey>>,
}

// SAFETY: A PD may be used and freed from any thread.
unsafe impl Send for Pd {}
// SAFETY: `&Pd` only reads fields fixed at allocation.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a PD of `owner` on `dev`.
    pub fn alloc(owner: &Owner, dev: &Device) -> Result<Arc<Self>> {
        let target = CallbackTarget::new(owner)?;
        // SAFETY: `dev` is a valid device (its type invariants); the
        // caller's name is the owner's, a static string of the module,
        // which outlives the PD (its target keeps the module).
        let raw = unsafe { bindings::__ib_alloc_pd(dev.as_ptr(), 0, owner.name().as_char_ptr()) };
        let raw = kernel::error::from_err_ptr(raw)?;
        let Some(raw) = NonNull::new(raw) else {
            return Err(ENOMEM);
        };
        let dev: ARef<Device> = dev.into();
        // INVARIANT: `raw` is a PD just allocated on `dev`; on failure the
        // initialized fields are dropped, and `raw` is freed below.
        let pd = Arc::pin_init(
            pin_init!(Self {
                raw,
                dev,
                target,
                remote_keys <- XArray::new(AllocKind::Alloc),
            }),
            GFP_KERNEL,
        );
        pd.inspect_err(|_| {
            // SAFETY: Allocated above and owned by nothing else.
            unsafe { bindings::ib_dealloc_pd(raw.as_ptr()) };
        })
    }

    /// Records `rkey`, about to be registered, as one a peer may invalidate
    /// (a stale record of the same key, left by a region that went, is
    /// replaced).
    pub(crate) fn publish_key(&self, rkey: u32) -> Result<Arc<RemoteKey>> {
        let key = Arc::new(
            RemoteKey {
                invalidated: AtomicBool::new(false),
            },
            GFP_KERNEL,
        )?;
        let old = self
            .remote_keys
            .lock()
            .store(rkey as usize, key.clone(), GFP_KERNEL)?;
        drop(old);
        Ok(key)
    }

    /// Forgets `key` (registered as `rkey`), invalidated locally or gone,
    /// unless the record is another's by now.
    pub(crate) fn withdraw_key(&self, rkey: u32, key: &Arc<RemoteKey>) {
        let mut keys = self.remote_keys.lock();
        let ours = keys
            .get(rkey as usize)
            .is_some_and(|k| core::ptr::eq(&*k, &**key));
        let removed = if ours {
            keys.remove(rkey as usize)
        } else {
            None
        };
        drop(keys);
        drop(removed);
    }

    /// A peer invalidated `rkey` (a receive on a QP of this PD completed
    /// with `IB_WC_WITH_INVALIDATE`): marks the registration's key, which
    /// its region sees, and forgets it.
    pub(crate) fn invalidated_remotely(&self, rkey: u32) {
        let key = self.remote_keys.lock().remove(rkey as usize);
        if let Some(key) = key {
            key.invalidated.store(true, Ordering::Release);
        }
    }

    /// The owner of the PD, and of what is made on it.
    pub fn owner(&self) -> &Owner {
        self.target.owner()
    }

    /// The device the PD lives on.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The key that gives the device access to all of memory for local use.
    pub fn local_dma_lkey(&self) -> u32 {
        // SAFETY: The PD is live (type invariants); the field is fixed at
        // allocation.
        unsafe { (*self.raw.as_ptr()).local_dma_lkey }
    }

    pub(crate) fn as_ptr(&self) -> *mut bindings::ib_pd {
        self.raw.as_ptr()
    }
}

#[pinned_drop]
impl PinnedDrop for Pd {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: The PD is live and, by the type invariants, freed only
        // here; every object using it holds an `Arc<Pd>` and is gone.
        unsafe { bindings::ib_dealloc_pd(self.raw.as_ptr()) };
    }
}
