// SPDX-License-Identifier: GPL-2.0

//! Protection domains (`struct ib_pd`).

use super::{bindings, device::Device};
use core::ptr::NonNull;
use kernel::{
    prelude::*,
    sync::{aref::ARef, Arc},
};

/// A protection domain (`ib_alloc_pd`) on one device.
///
/// # Invariants
///
/// `raw` is a live PD allocated on `dev`, freed only by `drop` (before the
/// device reference goes).
pub struct Pd {
    raw: NonNull<bindings::ib_pd>,
    dev: ARef<Device>,
}

// SAFETY: A PD may be used and freed from any thread.
unsafe impl Send for Pd {}
// SAFETY: `&Pd` only reads fields fixed at allocation.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a PD on `dev`.
    pub fn alloc(dev: &Device) -> Result<Arc<Self>> {
        // SAFETY: `dev` is a valid device (its type invariants).
        let raw = unsafe { bindings::rdma_cm_rs_alloc_pd(dev.as_ptr(), 0) };
        let raw = kernel::error::from_err_ptr(raw)?;
        let Some(raw) = NonNull::new(raw) else {
            return Err(ENOMEM);
        };
        // INVARIANT: `raw` is a PD just allocated on `dev`.
        let pd = Self {
            raw,
            dev: dev.into(),
        };
        // On failure `pd` is dropped, which frees the PD.
        Ok(Arc::new(pd, GFP_KERNEL)?)
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

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: The PD is live and, by the type invariants, freed only
        // here; every object using it holds an `Arc<Pd>` and is gone.
        unsafe { bindings::rdma_cm_rs_dealloc_pd(self.raw.as_ptr()) };
    }
}
