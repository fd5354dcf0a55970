// SPDX-License-Identifier: GPL-2.0

//! The target's port: its address and subsystem NQN, and the listener and
//! subsystem serving them while it is enabled.
//!
//! The module enables it at load (the wildcard address, the default NQN);
//! the configfs directory (`configfs.rs`) disables it, changes its address
//! or NQN, and enables it again.  The namespace outlives the changes.

use crate::{ctrl, ns::Namespace, queue, rdma, wire};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::Delta,
};
use rdma::{
    getaddrinfo::{getaddrinfo, Hints, RAI_PASSIVE},
    CmId, NetNs, Owner, PortSpace, QpType,
};

/// The subsystem's NQN until one is configured.
pub(crate) const DEFAULT_NQN: &[u8] = b"nqn.2026-11.org.rdma-cm-rs:nvmet";
/// Longest NQN (NVMe base specification: 223 bytes of UTF-8).
#[cfg(CONFIG_CONFIGFS_FS)]
const NQN_MAX: usize = 223;
/// Longest address string (a host name or a numeric address).
#[cfg(CONFIG_CONFIGFS_FS)]
const TRADDR_MAX: usize = 255;
/// How often the keep-alive timers are checked.
const SWEEP_MS: i64 = 1000;

/// The listener and the subsystem of an enabled port.
struct Running {
    listener: CmId<queue::NvmetCm>,
    transport: Arc<queue::Transport>,
}

struct State {
    /// Empty: every address (the wildcard).
    traddr: KVec<u8>,
    nqn: KVec<u8>,
    running: Option<Running>,
}

/// The port.
#[pin_data]
pub(crate) struct Port {
    owner: Owner,
    limits: ctrl::Limits,
    ns: Arc<Namespace>,
    #[pin]
    state: Mutex<State>,
}

impl Port {
    pub(crate) fn new(
        owner: Owner,
        limits: ctrl::Limits,
        ns: Arc<Namespace>,
    ) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            owner,
            limits,
            ns,
            state <- new_mutex!(State {
                traddr: KVec::new(),
                nqn: owned(DEFAULT_NQN)?,
                running: None,
            }),
        })
    }

    /// Listens on the configured address for the configured subsystem;
    /// nothing if enabled already.
    pub(crate) fn enable(&self) -> Result {
        let mut st = self.state.lock();
        if st.running.is_some() {
            return Ok(());
        }
        let running = self.start(&st.traddr, &st.nqn)?;
        st.running = Some(running);
        Ok(())
    }

    /// Stops listening, and disconnects and destroys every queue; nothing
    /// if disabled.
    pub(crate) fn disable(&self) {
        let running = self.state.lock().running.take();
        if let Some(Running {
            listener,
            transport,
        }) = running
        {
            // No new queue, then every queue disconnected and destroyed,
            // as nvmet-rdma's port removal does.
            drop(listener);
            transport.shut_down();
        }
    }

    fn start(&self, traddr: &[u8], nqn: &[u8]) -> Result<Running> {
        let p = &self.limits;
        let subsys = Arc::pin_init(
            ctrl::Subsystem::new(*p, owned(nqn)?, self.ns.clone()),
            GFP_KERNEL,
        )?;
        let transport = Arc::pin_init(
            queue::Transport::new(subsys, self.owner.clone()),
            GFP_KERNEL,
        )?;
        let listener = CmId::new(
            &self.owner,
            queue::NvmetCm::Listener(transport.clone()),
            &NetNs::init(),
            PortSpace::Tcp,
            QpType::Rc,
        )?;
        // The passive address of the port, as rdma_getaddrinfo(3) gives it
        // to a server: of the node, or with none every address of every
        // device.
        let mut service = [0u8; 5];
        let hints = Hints {
            flags: RAI_PASSIVE,
            ..Default::default()
        };
        let node = (!traddr.is_empty()).then_some(traddr);
        let info = getaddrinfo(node, Some(wire::decimal(p.port, &mut service)), &hints)?;
        let addr = info.src.ok_or(EINVAL)?;
        listener.with_lock(|l| l.bind(&addr))?;
        listener.listen(128)?;
        let swept = transport.clone();
        self.owner.spawn(move || sweep(swept))?;
        pr_info!(
            "{} ({} MiB, {} I/O queues of {}) listening on {}\n",
            kernel::str::BStr::from_bytes(nqn),
            self.ns.size() >> 20,
            p.max_io_queues,
            p.io_queue_size,
            addr
        );
        Ok(Running {
            listener,
            transport,
        })
    }
}

/// What the configfs directory reads and sets.
#[cfg(CONFIG_CONFIGFS_FS)]
impl Port {
    pub(crate) fn enabled(&self) -> bool {
        self.state.lock().running.is_some()
    }

    /// Copies the address (empty: the wildcard) into `out`.
    pub(crate) fn traddr(&self, out: &mut [u8]) -> usize {
        copy_out(&self.state.lock().traddr, out)
    }

    /// Copies the subsystem's NQN into `out`.
    pub(crate) fn nqn(&self, out: &mut [u8]) -> usize {
        copy_out(&self.state.lock().nqn, out)
    }

    /// Sets the address: a numeric IPv4 or IPv6 address, a host name, or
    /// nothing (the wildcard).  `EBUSY` while enabled.
    pub(crate) fn set_traddr(&self, value: &[u8]) -> Result {
        if value.len() > TRADDR_MAX || !value.iter().all(u8::is_ascii_graphic) {
            return Err(EINVAL);
        }
        let mut st = self.state.lock();
        if st.running.is_some() {
            return Err(EBUSY);
        }
        st.traddr = owned(value)?;
        Ok(())
    }

    /// Sets the subsystem's NQN (`nqn.` then printable characters, not the
    /// discovery subsystem's).  `EBUSY` while enabled.
    pub(crate) fn set_nqn(&self, value: &[u8]) -> Result {
        if !value.starts_with(b"nqn.")
            || value.len() > NQN_MAX
            || !value.iter().all(u8::is_ascii_graphic)
            || value == wire::DISCOVERY_NQN
        {
            return Err(EINVAL);
        }
        let mut st = self.state.lock();
        if st.running.is_some() {
            return Err(EBUSY);
        }
        st.nqn = owned(value)?;
        Ok(())
    }
}

/// Checks the keep-alive timers every [`SWEEP_MS`], failing the
/// controllers whose host went silent; stops when the port is disabled
/// or the module goes.
fn sweep(transport: Arc<queue::Transport>) {
    if transport.is_shut_down() {
        return;
    }
    let expired = transport.subsys.take_expired();
    if !expired.is_empty() {
        transport.fail_ctrls(expired);
    }
    let owner = transport.owner.clone();
    let _ = owner.spawn_after(Delta::from_millis(SWEEP_MS), move || sweep(transport));
}

#[cfg(CONFIG_CONFIGFS_FS)]
fn copy_out(value: &[u8], out: &mut [u8]) -> usize {
    let n = value.len().min(out.len());
    out[..n].copy_from_slice(&value[..n]);
    n
}

/// A copy of `value` the port owns.
fn owned(value: &[u8]) -> Result<KVec<u8>> {
    let mut v = KVec::with_capacity(value.len(), GFP_KERNEL)?;
    v.extend_from_slice(value, GFP_KERNEL)?;
    Ok(v)
}
