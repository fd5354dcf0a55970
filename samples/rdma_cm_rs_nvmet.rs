// SPDX-License-Identifier: GPL-2.0

//! An NVMe over Fabrics RDMA target in safe Rust, on the layer's safe
//! abstractions alone: the kernel's unmodified `nvme-rdma` host and
//! `nvme-cli` discover it, connect to it and do I/O on its RAM namespace.
//!
//! `insmod rdma_cm_rs_nvmet.ko port=4420 ns_mib=64 nr_io_queues=4`
//! serves the subsystem `nqn.2026-11.org.rdma-cm-rs:nvmet` (namespace 1,
//! 512-byte blocks) and the discovery subsystem on every RDMA device's
//! addresses (the wildcard address: the CM makes a listener on each
//! device as it comes).  With configfs, `/sys/kernel/config/rdma_cm_rs_nvmet/`
//! sets the address and the subsystem's NQN.
//!
//! The pieces, each a file under `nvmet/`:
//! * [`wire`]: the wire formats (CM private data, capsules, Identify, logs);
//! * [`ns`]: the RAM namespace;
//! * [`ctrl`]: controllers, Fabrics, admin and discovery commands;
//! * [`io`]: the NVM command set;
//! * [`queue`]: the RDMA transport binding (queues, data, teardown);
//! * [`port`]: the listener, its address and the subsystem's NQN;
//! * `configfs`: the port's configfs directory.
//!
//! `Documentation/rdma_cm_rs/writing-a-ulp.rst` walks through it.

#![deny(unsafe_code)]

// The abstraction layer: compiled in (out of tree), or the kernel's own;
// see the store sample for why rustfmt skips it here.
#[cfg(not(CONFIG_RUST_INFINIBAND_ABSTRACTIONS))]
#[path = "../rust/rdma/mod.rs"]
#[allow(dead_code, unsafe_code)]
#[rustfmt::skip]
pub mod rdma;
#[cfg(CONFIG_RUST_INFINIBAND_ABSTRACTIONS)]
pub use kernel::rdma;

#[cfg(CONFIG_CONFIGFS_FS)]
#[path = "nvmet/configfs.rs"]
mod configfs;
#[path = "nvmet/ctrl.rs"]
mod ctrl;
#[path = "nvmet/io.rs"]
mod io;
#[path = "nvmet/ns.rs"]
mod ns;
#[path = "nvmet/port.rs"]
mod port;
#[path = "nvmet/queue.rs"]
mod queue;
#[path = "nvmet/wire.rs"]
mod wire;

use kernel::{prelude::*, sync::Arc};
use rdma::ModuleOwner;

module! {
    type: NvmetModule,
    name: "rdma_cm_rs_nvmet",
    authors: ["rdma-cm-rs developers"],
    description: "NVMe over Fabrics RDMA target on the safe Rust RDMA abstractions",
    license: "GPL",
    params: {
        port: u16 {
            default: 4420,
            description: "Port to listen on (RDMA_PS_TCP), every address",
        },
        ns_mib: u32 {
            default: 64,
            description: "Size of the RAM namespace in MiB (1..=1024)",
        },
        nr_io_queues: u16 {
            default: 4,
            description: "I/O queues a controller may have (1..=64)",
        },
        queue_size: u16 {
            default: 128,
            description: "Entries of an I/O queue (2..=256)",
        },
        inline_data_size: u32 {
            default: 4096,
            description: "In-capsule data of an I/O command in bytes (0..=16384)",
        },
    },
}

/// Largest transfer: 2^8 pages of 4 KiB, 1 MiB.
const MDTS: u8 = 8;

struct NvmetModule {
    /// First: no configuration change once the module goes.
    #[cfg(CONFIG_CONFIGFS_FS)]
    _configfs: Pin<KBox<kernel::configfs::Subsystem<configfs::Settings>>>,
    port: Arc<port::Port>,
    /// Last: waits for every object, queue and work item before the
    /// module's code goes.
    owner: ModuleOwner,
}

impl kernel::Module for NvmetModule {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let ns_mib = module_parameters::ns_mib.value();
        let nr_io_queues = module_parameters::nr_io_queues.value();
        let queue_size = module_parameters::queue_size.value();
        let inline_size = module_parameters::inline_data_size.value();
        if !(1..=1024).contains(&ns_mib)
            || !(1..=64).contains(&nr_io_queues)
            || !(2..=wire::MAX_QUEUE_SIZE).contains(&queue_size)
            || inline_size > 16384
        {
            pr_err!("a parameter is out of its range (modinfo rdma_cm_rs_nvmet)\n");
            return Err(EINVAL);
        }
        let owner = ModuleOwner::new::<Self>()?;
        // The namespace's identifiers come from the NQN it is made under.
        let namespace = Arc::new(
            ns::Namespace::new(u64::from(ns_mib) << 20, port::DEFAULT_NQN)?,
            GFP_KERNEL,
        )?;
        let limits = ctrl::Limits {
            port: module_parameters::port.value(),
            max_io_queues: nr_io_queues,
            io_queue_size: queue_size,
            inline_size,
            mdts: MDTS,
        };
        let port = Arc::pin_init(
            port::Port::new(owner.owner().clone(), limits, namespace),
            GFP_KERNEL,
        )?;
        port.enable()?;
        Ok(Self {
            #[cfg(CONFIG_CONFIGFS_FS)]
            _configfs: KBox::pin_init(configfs::subsystem(port.clone()), GFP_KERNEL)?,
            port,
            owner,
        })
    }
}

impl Drop for NvmetModule {
    fn drop(&mut self) {
        // The fields drop in order after this: configfs first, though a
        // file of it open holds the module.  Every queue disconnected and
        // destroyed; the owner's drop then waits for the work and objects
        // left.
        self.port.disable();
        let _ = &self.owner;
    }
}
