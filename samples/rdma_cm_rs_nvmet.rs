// SPDX-License-Identifier: GPL-2.0

//! An NVMe over Fabrics RDMA target in safe Rust, on the layer's safe
//! abstractions alone: the kernel's unmodified `nvme-rdma` host and
//! `nvme-cli` discover it, connect to it and do I/O on its RAM namespace.
//!
//! `insmod rdma_cm_rs_nvmet.ko port=4420 ns_mib=64 nr_io_queues=4`
//! serves the subsystem `nqn.2026-11.org.rdma-cm-rs:nvmet` (namespace 1,
//! 512-byte blocks) and the discovery subsystem on every RDMA device's
//! addresses (the wildcard address: the CM makes a listener on each
//! device as it comes).
//!
//! The pieces, each a file under `nvmet/`:
//! * [`wire`]: the wire formats (CM private data, capsules, Identify, logs);
//! * [`ns`]: the RAM namespace;
//! * [`ctrl`]: controllers, Fabrics, admin and discovery commands;
//! * [`io`]: the NVM command set;
//! * [`queue`]: the RDMA transport binding (queues, data, teardown).
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

#[path = "nvmet/ctrl.rs"]
mod ctrl;
#[path = "nvmet/io.rs"]
mod io;
#[path = "nvmet/ns.rs"]
mod ns;
#[path = "nvmet/queue.rs"]
mod queue;
#[path = "nvmet/wire.rs"]
mod wire;

use kernel::{prelude::*, sync::Arc, time::Delta};
use rdma::{
    getaddrinfo::{getaddrinfo, Hints, RAI_PASSIVE},
    CmId, ModuleOwner, NetNs, PortSpace, QpType,
};

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

/// The subsystem's NQN.
const NQN: &[u8] = b"nqn.2026-11.org.rdma-cm-rs:nvmet";
/// Largest transfer: 2^8 pages of 4 KiB, 1 MiB.
const MDTS: u8 = 8;
/// How often the keep-alive timers are checked.
const SWEEP_MS: i64 = 1000;

struct NvmetModule {
    listener: Option<CmId<queue::NvmetCm>>,
    transport: Arc<queue::Transport>,
    /// Last: waits for every object, queue and work item before the
    /// module's code goes.
    owner: ModuleOwner,
}

/// Checks the keep-alive timers every [`SWEEP_MS`], failing the
/// controllers whose host went silent; stops when the module goes.
fn sweep(transport: Arc<queue::Transport>) {
    let expired = transport.subsys.take_expired();
    if !expired.is_empty() {
        transport.fail_ctrls(expired);
    }
    let owner = transport.owner.clone();
    let _ = owner.spawn_after(Delta::from_millis(SWEEP_MS), move || sweep(transport));
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
        let namespace = ns::Namespace::new(u64::from(ns_mib) << 20, NQN)?;
        let port = module_parameters::port.value();
        let subsys = Arc::pin_init(
            ctrl::Subsystem::new(
                ctrl::Config {
                    nqn: NQN,
                    port,
                    max_io_queues: nr_io_queues,
                    io_queue_size: queue_size,
                    inline_size,
                    mdts: MDTS,
                },
                namespace,
            ),
            GFP_KERNEL,
        )?;
        let transport = Arc::pin_init(
            queue::Transport::new(subsys, owner.owner().clone()),
            GFP_KERNEL,
        )?;
        let listener = CmId::new(
            &owner,
            queue::NvmetCm::Listener(transport.clone()),
            &NetNs::init(),
            PortSpace::Tcp,
            QpType::Rc,
        )?;
        // The passive address of the port, as rdma_getaddrinfo(3) gives it
        // to a server with no node: every address of every device.
        let mut service = [0u8; 5];
        let hints = Hints {
            flags: RAI_PASSIVE,
            ..Default::default()
        };
        let info = getaddrinfo(None, Some(wire::decimal(port, &mut service)), &hints)?;
        let addr = info.src.ok_or(EINVAL)?;
        listener.with_lock(|l| l.bind(&addr))?;
        listener.listen(128)?;
        let swept = transport.clone();
        owner.spawn(move || sweep(swept))?;
        pr_info!(
            "{} ({} MiB, {} I/O queues of {}) listening on {}\n",
            kernel::str::BStr::from_bytes(NQN),
            ns_mib,
            nr_io_queues,
            queue_size,
            addr
        );
        Ok(Self {
            listener: Some(listener),
            transport,
            owner,
        })
    }
}

impl Drop for NvmetModule {
    fn drop(&mut self) {
        // No new queue, then every queue disconnected and destroyed, as
        // nvmet-rdma's port removal does; the owner's drop then waits for
        // the work and objects left.
        drop(self.listener.take());
        self.transport.shut_down();
        let _ = &self.owner;
    }
}
