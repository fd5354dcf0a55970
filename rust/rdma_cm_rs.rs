// SPDX-License-Identifier: GPL-2.0

//! rdma_cm_rs: safe Rust abstractions over the kernel's RDMA connection
//! manager, and an in-kernel CM consumer driven from user space through
//! `/dev/rdma_cm_rs`.
//!
//! * `rdma`: the abstraction layer (all of the module's `unsafe` code, with
//!   `misc_poll` and `abi`).
//! * `ctl`: the char device, written against the safe API only.

pub mod abi;
mod ctl;
pub mod misc_poll;
pub mod rdma;

// The abstraction layer's KUnit suites, run at insmod.  Declared here, not in
// rust/rdma/, so that modules compiling the layer in (the samples) do not run
// them again.
#[cfg(CONFIG_KUNIT)]
#[path = "rdma/tests.rs"]
mod rdma_tests;

use kernel::prelude::*;

module! {
    type: RdmaCmRs,
    name: "rdma_cm_rs",
    authors: ["rdma-cm-rs developers"],
    description: "Safe Rust RDMA CM abstractions and a CM consumer char device",
    license: "GPL",
}

#[pin_data(PinnedDrop)]
struct RdmaCmRs {
    #[pin]
    ctl: misc_poll::PollMiscRegistration<ctl::Ctl>,
}

impl kernel::InPlaceModule for RdmaCmRs {
    fn init(_module: &'static ThisModule) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            ctl <- misc_poll::PollMiscRegistration::register(c"rdma_cm_rs"),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for RdmaCmRs {
    fn drop(self: Pin<&mut Self>) {
        // Files hold the module, so none is open; destructions they deferred
        // to the workqueue must finish before the module's code goes.
        if rdma::cm::wait_for_deferred_destroys(10_000).is_err() {
            pr_err!("deferred cm_id destructions still pending at unload\n");
        }
    }
}
