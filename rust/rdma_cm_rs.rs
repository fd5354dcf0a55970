// SPDX-License-Identifier: GPL-2.0

//! rdma_cm_rs: safe Rust abstractions over the kernel's RDMA connection
//! manager, and an in-kernel CM consumer driven from user space through
//! `/dev/rdma_cm_rs`.
//!
//! * `rdma`: the abstraction layer over the RDMA stack (verbs, then the CM
//!   above them), compiled in from `rust/rdma/`.
//! * `misc_poll`: a misc device with `poll`, which 7.3's
//!   `kernel::miscdevice` lacks.
//! * `abi`: the char device's ABI, generated from `rust/uapi/rdma_cm_rs.h`.
//! * `capability`: capability checks, which 7.3's `kernel::cred` lacks.
//! * `ctl`: the char device, written against the safe APIs only.
//!
//! The `unsafe` code is in `rdma`, `misc_poll`, `capability` and `abi`; `ctl`
//! forbids it.

pub mod abi;
pub mod capability;
mod ctl;
pub mod misc_poll;
pub mod rdma;

// The abstraction layer's KUnit suites, run at insmod.  Declared here, not in
// rust/rdma/, so that modules compiling the layer in (the samples) do not run
// them again.
#[cfg(CONFIG_KUNIT)]
#[path = "rdma/tests/mod.rs"]
mod rdma_tests;

use kernel::prelude::*;

module! {
    type: RdmaCmRs,
    name: "rdma_cm_rs",
    authors: ["rdma-cm-rs developers"],
    description: "Safe Rust RDMA CM abstractions and a CM consumer char device",
    license: "GPL",
}

#[pin_data]
struct RdmaCmRs {
    #[pin]
    ctl: misc_poll::PollMiscRegistration<ctl::Ctl>,
    /// Dropped after the device (fields drop in declaration order): files
    /// hold the module, so none is open by then, and the owner's drop
    /// waits for what they made and the destructions they deferred before
    /// the module's code goes.  Made first, before any file can be opened.
    owner: rdma::ModuleOwner,
}

impl kernel::InPlaceModule for RdmaCmRs {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        let owner = rdma::ModuleOwner::new::<Self>();
        let files_owner = owner.as_ref().map(|o| o.owner().clone()).map_err(|e| *e);
        try_pin_init!(Self {
            ctl <- misc_poll::PollMiscRegistration::register(c"rdma_cm_rs", files_owner?),
            owner: owner?,
        })
    }
}
