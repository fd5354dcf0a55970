// SPDX-License-Identifier: GPL-2.0

//! The target's controllers: the subsystem they belong to, Fabrics
//! Connect, the properties (CC, CSTS) and their state machine, keep-alive,
//! held asynchronous event requests, and the admin and discovery
//! commands.  Transport-free: a command comes in with its data (or a
//! buffer for the data it returns), and leaves as an [`Outcome`].

use super::ns::Namespace;
use super::rdma::SgBuffer;
use super::wire::{self, cns, feature, log, opcode, prop, status, Sqe};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::{
    new_mutex, new_spinlock,
    prelude::*,
    sync::{Arc, Mutex, SpinLock},
    time::{Delta, Instant, Monotonic},
};

/// CC fields.
const CC_EN: u32 = 1;
const CC_SHN_MASK: u32 = 3 << 14;
/// CSTS fields.
const CSTS_RDY: u32 = 1;
const CSTS_CFS: u32 = 1 << 1;
const CSTS_SHST_CMPLT: u32 = 2 << 2;
/// Asynchronous event requests a controller holds (ACL + 1).
const MAX_HELD_AERS: usize = 4;
/// Keep-alive timeout of a discovery controller connected with none
/// (`NVMET_DISC_KATO_MS`).
const DISCOVERY_KATO_MS: u32 = 120_000;
/// Largest controller id (`NVME_CNTLID_MAX`).
const CNTLID_MAX: u16 = 0xffef;
/// The error log's entries (`nvme_error_slot`, 64 bytes each).
const ERROR_LOG_LEN: usize = 64;

/// How a command ends.
pub(crate) enum Outcome {
    /// Completes now with `status` (`SCT << 8 | SC`, DNR) and `result`.
    Done { status: u16, result: u64 },
    /// Held (an asynchronous event request): no completion until teardown.
    Held,
    /// A Connect that bound the queue to `ctrl`; completes with success
    /// and the controller id.
    Connected { ctrl: Arc<Ctrl> },
}

impl Outcome {
    pub(crate) fn ok(result: u64) -> Self {
        Self::Done { status: 0, result }
    }

    pub(crate) fn fail(status: u16) -> Self {
        Self::Done { status, result: 0 }
    }
}

/// Which way a command moves data, and how much.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Transfer {
    None,
    /// Host to target.
    In(u32),
    /// Target to host.
    Out(u32),
}

/// A command's data as the transport has it.
pub(crate) enum Data<'a> {
    None,
    /// Host to target: `len` bytes at `offset` of a buffer.
    In(&'a SgBuffer, usize),
    /// Target to host: a buffer of the transfer's length to fill.
    Out(&'a mut SgBuffer),
}

/// What a controller can ask of a queue bound to it.
pub(crate) trait QueueHandle: Send + Sync {
    /// Disconnects the queue; called in process context, outside the
    /// layer's callbacks.
    fn disconnect(&self);
}

/// What the module's parameters fix.
#[derive(Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) port: u16,
    pub(crate) max_io_queues: u16,
    /// I/O queue entries (MQES + 1).
    pub(crate) io_queue_size: u16,
    /// In-capsule data bytes of an I/O command.
    pub(crate) inline_size: u32,
    /// Largest transfer, as a power of two of 4 KiB pages.
    pub(crate) mdts: u8,
}

/// The subsystem (one namespace, nsid 1) and its live controllers.
#[pin_data]
pub(crate) struct Subsystem {
    pub(crate) limits: Limits,
    /// The subsystem's NQN, as the port was configured.
    pub(crate) nqn: KVec<u8>,
    pub(crate) ns: Arc<Namespace>,
    serial: [u8; 20],
    #[pin]
    ctrls: Mutex<Ctrls>,
}

struct Ctrls {
    list: KVec<Arc<Ctrl>>,
    next_cntlid: u16,
}

/// A controller.
#[pin_data]
pub(crate) struct Ctrl {
    pub(crate) cntlid: u16,
    pub(crate) discovery: bool,
    hostnqn: KVec<u8>,
    hostid: [u8; 16],
    #[pin]
    state: Mutex<CtrlState>,
    /// CSTS.RDY, mirrored out of `state` (written under its lock) for the
    /// check every command makes, which then takes no lock shared by the
    /// controller's queues.
    ready: AtomicBool,
    #[pin]
    last_keep_alive: SpinLock<Instant<Monotonic>>,
}

struct CtrlState {
    cc: u32,
    csts: u32,
    kato_ms: u32,
    aen_mask: u32,
    /// Command ids of the held asynchronous event requests.
    aers: KVec<u16>,
    /// Queues bound to the controller (the admin queue first).
    queues: KVec<Arc<dyn QueueHandle>>,
    dead: bool,
}

/// A queue's side of a command: its id and size, its controller once
/// connected, and the address it was reached at (for the discovery log).
pub(crate) struct QueueCtx<'a> {
    pub(crate) qid: u16,
    pub(crate) ctrl: Option<&'a Arc<Ctrl>>,
    /// The local address's text and whether it is IPv6.
    pub(crate) traddr: &'a [u8],
    pub(crate) ipv6: bool,
}

impl Subsystem {
    pub(crate) fn new(
        limits: Limits,
        nqn: KVec<u8>,
        ns: Arc<Namespace>,
    ) -> impl PinInit<Self, Error> {
        let mut serial = [b' '; 20];
        // The serial shows the NGUID's first bytes, hex.
        for (i, b) in ns.nguid.iter().take(10).enumerate() {
            let hex = b"0123456789abcdef";
            serial[2 * i] = hex[usize::from(b >> 4)];
            serial[2 * i + 1] = hex[usize::from(b & 0xf)];
        }
        try_pin_init!(Self {
            limits,
            nqn,
            ns,
            serial,
            ctrls <- new_mutex!(Ctrls {
                list: KVec::new(),
                next_cntlid: 1,
            }),
        })
    }

    /// The controllers whose keep-alive timer expired, taken out of the
    /// subsystem.
    pub(crate) fn take_expired(&self) -> KVec<Arc<Ctrl>> {
        let mut expired = KVec::new();
        let mut ctrls = self.ctrls.lock();
        let mut i = 0;
        while i < ctrls.list.len() {
            if ctrls.list[i].keep_alive_expired() {
                // Without the memory to return it, it expires again at the
                // next sweep.
                if expired.reserve(1, GFP_KERNEL).is_err() {
                    break;
                }
                if let Ok(ctrl) = ctrls.list.remove(i) {
                    let _ = expired.push(ctrl, GFP_KERNEL);
                }
            } else {
                i += 1;
            }
        }
        expired
    }

    /// Takes `ctrl` out (its admin queue ended, or it failed).
    pub(crate) fn remove(&self, ctrl: &Arc<Ctrl>) {
        let mut ctrls = self.ctrls.lock();
        if let Some(i) = ctrls.list.iter().position(|c| Arc::ptr_eq(c, ctrl)) {
            let _ = ctrls.list.remove(i);
        }
    }

    /// Every controller, taken out (the module goes).
    pub(crate) fn take_all(&self) -> KVec<Arc<Ctrl>> {
        core::mem::take(&mut self.ctrls.lock().list)
    }

    fn find(&self, cntlid: u16) -> Option<Arc<Ctrl>> {
        self.ctrls
            .lock()
            .list
            .iter()
            .find(|c| c.cntlid == cntlid)
            .cloned()
    }

    /// Whether a controller `cntlid` exists (a connect request's check).
    pub(crate) fn has_ctrl(&self, cntlid: u16) -> bool {
        self.find(cntlid).is_some()
    }

    fn add_ctrl(
        &self,
        discovery: bool,
        hostnqn: &[u8],
        hostid: [u8; 16],
        kato_ms: u32,
    ) -> Result<Arc<Ctrl>> {
        let mut name = KVec::new();
        name.extend_from_slice(hostnqn, GFP_KERNEL)?;
        let mut ctrls = self.ctrls.lock();
        ctrls.list.reserve(1, GFP_KERNEL)?;
        let mut cntlid = ctrls.next_cntlid;
        for _ in 0..CNTLID_MAX {
            if !ctrls.list.iter().any(|c| c.cntlid == cntlid) {
                break;
            }
            cntlid = if cntlid >= CNTLID_MAX { 1 } else { cntlid + 1 };
        }
        if ctrls.list.iter().any(|c| c.cntlid == cntlid) {
            return Err(EBUSY);
        }
        ctrls.next_cntlid = if cntlid >= CNTLID_MAX { 1 } else { cntlid + 1 };
        let ctrl = Arc::pin_init(
            try_pin_init!(Ctrl {
                cntlid,
                discovery,
                hostnqn: name,
                hostid,
                state <- new_mutex!(CtrlState {
                    cc: 0,
                    csts: 0,
                    kato_ms,
                    aen_mask: 0,
                    aers: KVec::new(),
                    queues: KVec::new(),
                    dead: false,
                }),
                ready: AtomicBool::new(false),
                last_keep_alive <- new_spinlock!(Instant::now()),
            }),
            GFP_KERNEL,
        )?;
        ctrls.list.push(ctrl.clone(), GFP_KERNEL)?;
        Ok(ctrl)
    }

    fn cap(&self, ctrl: &Ctrl) -> u64 {
        let mqes = if ctrl.discovery {
            wire::ADMIN_QUEUE_SIZE
        } else {
            self.limits.io_queue_size
        };
        // MQES, CQR (contiguous queues), TO 7.5 s, CSS: NVM.
        u64::from(mqes - 1) | 1 << 16 | 15 << 24 | 1 << 37
    }

    /// Which way `sqe`'s data goes and how much of it there is: the checks
    /// that need no data (opcode, state, fields), done before any is moved.
    pub(crate) fn transfer(
        &self,
        q: &QueueCtx<'_>,
        sqe: &Sqe,
    ) -> core::result::Result<Transfer, u16> {
        let op = sqe.opcode();
        if op == opcode::FABRICS {
            return match (sqe.fctype(), q.ctrl) {
                (opcode::FCTYPE_CONNECT, None) => Ok(Transfer::In(wire::CONNECT_DATA_LEN as u32)),
                (opcode::FCTYPE_CONNECT, Some(_)) => Err(status::CMD_SEQ_ERROR | status::DNR),
                (opcode::FCTYPE_PROPERTY_GET | opcode::FCTYPE_PROPERTY_SET, Some(_))
                    if q.qid == 0 =>
                {
                    Ok(Transfer::None)
                }
                _ => Err(status::INVALID_OPCODE | status::DNR),
            };
        }
        // Nothing but Connect on a queue not connected yet.
        let Some(ctrl) = q.ctrl else {
            return Err(status::INVALID_OPCODE | status::DNR);
        };
        if !ctrl.ready.load(Ordering::Acquire) {
            return Err(status::CMD_SEQ_ERROR | status::DNR);
        }
        if q.qid != 0 {
            return super::io::transfer(self, sqe);
        }
        let discovery_ok = matches!(
            op,
            opcode::IDENTIFY
                | opcode::GET_LOG_PAGE
                | opcode::SET_FEATURES
                | opcode::GET_FEATURES
                | opcode::ASYNC_EVENT
                | opcode::KEEP_ALIVE
        );
        if ctrl.discovery && !discovery_ok {
            return Err(status::INVALID_OPCODE | status::DNR);
        }
        match op {
            opcode::IDENTIFY => Ok(Transfer::Out(wire::IDENTIFY_LEN as u32)),
            opcode::GET_LOG_PAGE => {
                // NUMD is 0-based: up to 2^32 dwords, 16 GiB.
                let numd = (sqe.cdw(11) & 0xffff) << 16 | sqe.cdw(10) >> 16;
                let len = (u64::from(numd) + 1) * 4;
                if len > 4096u64 << self.limits.mdts {
                    return Err(status::INVALID_FIELD | status::DNR);
                }
                Ok(Transfer::Out(len as u32))
            }
            opcode::GET_FEATURES if sqe.cdw(10) & 0xff == u32::from(feature::HOST_ID) => {
                Ok(Transfer::Out(16))
            }
            opcode::SET_FEATURES
            | opcode::GET_FEATURES
            | opcode::ASYNC_EVENT
            | opcode::KEEP_ALIVE
            | opcode::ABORT => Ok(Transfer::None),
            _ => Err(status::INVALID_OPCODE | status::DNR),
        }
    }

    /// Executes `sqe`, whose [`Self::transfer`] passed and whose data is
    /// `data`.
    pub(crate) fn execute(&self, q: &QueueCtx<'_>, sqe: &Sqe, data: Data<'_>) -> Outcome {
        if sqe.opcode() == opcode::FABRICS {
            return match q.ctrl {
                None => self.connect(q, sqe, data),
                Some(ctrl) => self.property(ctrl, sqe),
            };
        }
        let Some(ctrl) = q.ctrl else {
            return Outcome::fail(status::INVALID_OPCODE | status::DNR);
        };
        if q.qid != 0 {
            return super::io::execute(self, sqe, data);
        }
        match sqe.opcode() {
            opcode::IDENTIFY => self.identify(q, ctrl, sqe, data),
            opcode::GET_LOG_PAGE => self.get_log_page(q, ctrl, sqe, data),
            opcode::SET_FEATURES => ctrl.set_features(self, sqe),
            opcode::GET_FEATURES => ctrl.get_features(self, sqe, data),
            opcode::ASYNC_EVENT => ctrl.hold_aer(sqe.cid()),
            opcode::KEEP_ALIVE => ctrl.keep_alive(),
            // Not aborted.
            opcode::ABORT => Outcome::ok(1),
            _ => Outcome::fail(status::INVALID_OPCODE | status::DNR),
        }
    }

    fn connect(&self, q: &QueueCtx<'_>, sqe: &Sqe, data: Data<'_>) -> Outcome {
        let Data::In(buf, off) = data else {
            return Outcome::fail(status::SGL_INVALID_DATA | status::DNR);
        };
        let mut bytes = [0u8; wire::CONNECT_DATA_LEN];
        if buf.read(off, &mut bytes).is_err() {
            return Outcome::fail(status::SGL_INVALID_DATA | status::DNR);
        }
        let d = wire::ConnectData(&bytes);
        // The result of an invalid-parameter status: the field's offset,
        // in the command (0) or its data (1 << 16).
        let invalid = |attr: u64| Outcome::Done {
            status: status::CONNECT_INVALID_PARAM | status::DNR,
            result: attr,
        };
        let (recfmt, qid, sqsize, kato) = (
            sqe.u16_at(40),
            sqe.u16_at(42),
            sqe.u16_at(44),
            sqe.u32_at(48),
        );
        if recfmt != 0 {
            return Outcome::fail(status::CONNECT_FORMAT | status::DNR);
        }
        let discovery = d.subsysnqn() == wire::DISCOVERY_NQN;
        if !discovery && d.subsysnqn() != self.nqn.as_slice() {
            return invalid(1 << 16 | 256);
        }
        if qid != q.qid {
            return invalid(42);
        }
        if sqsize == 0 {
            return invalid(44);
        }
        if qid == 0 {
            if d.cntlid() != wire::CNTLID_DYNAMIC {
                return invalid(1 << 16 | 16);
            }
            if sqsize >= wire::ADMIN_QUEUE_SIZE {
                return invalid(44);
            }
            let kato_ms = match (discovery, kato) {
                (true, 0) => DISCOVERY_KATO_MS,
                // Whole seconds, rounded up, as nvmet keeps it.
                (_, ms) => ms.div_ceil(1000).saturating_mul(1000),
            };
            return match self.add_ctrl(discovery, d.hostnqn(), d.hostid(), kato_ms) {
                Ok(ctrl) => Outcome::Connected { ctrl },
                Err(_) => Outcome::fail(status::CONNECT_CTRL_BUSY | status::DNR),
            };
        }
        let Some(ctrl) = self.find(d.cntlid()) else {
            return invalid(1 << 16 | 16);
        };
        if ctrl.discovery || discovery || ctrl.hostnqn.as_slice() != d.hostnqn() {
            return invalid(1 << 16 | 16);
        }
        if qid > self.limits.max_io_queues {
            return invalid(42);
        }
        if sqsize >= self.limits.io_queue_size {
            return invalid(44);
        }
        Outcome::Connected { ctrl }
    }

    fn property(&self, ctrl: &Ctrl, sqe: &Sqe) -> Outcome {
        let wide = sqe.u8_at(40) & 1 != 0;
        let offset = sqe.u32_at(44);
        match (sqe.fctype(), wide, offset) {
            (opcode::FCTYPE_PROPERTY_GET, true, prop::CAP) => Outcome::ok(self.cap(ctrl)),
            (opcode::FCTYPE_PROPERTY_GET, false, prop::VS) => Outcome::ok(u64::from(wire::VERSION)),
            (opcode::FCTYPE_PROPERTY_GET, false, prop::CC) => {
                Outcome::ok(u64::from(ctrl.state.lock().cc))
            }
            (opcode::FCTYPE_PROPERTY_GET, false, prop::CSTS) => {
                Outcome::ok(u64::from(ctrl.state.lock().csts))
            }
            (opcode::FCTYPE_PROPERTY_SET, false, prop::CC) => {
                ctrl.set_cc(sqe.u64_at(48) as u32);
                Outcome::ok(0)
            }
            _ => Outcome::fail(status::INVALID_FIELD | status::DNR),
        }
    }

    fn identity(&self, ctrl: &Ctrl) -> wire::NsIdentity {
        let _ = ctrl;
        wire::NsIdentity {
            blocks: self.ns.blocks(),
            nguid: self.ns.nguid,
            eui64: self.ns.eui64,
            uuid: self.ns.uuid,
        }
    }

    fn identify(&self, _q: &QueueCtx<'_>, ctrl: &Ctrl, sqe: &Sqe, data: Data<'_>) -> Outcome {
        let Data::Out(buf) = data else {
            return Outcome::fail(status::SGL_INVALID_DATA | status::DNR);
        };
        let Ok(mut page) = KVec::from_elem(0u8, wire::IDENTIFY_LEN, GFP_KERNEL) else {
            return Outcome::fail(status::INTERNAL);
        };
        let (cns, csi, nsid) = (sqe.u8_at(40), sqe.u8_at(47), sqe.nsid());
        let status = match (ctrl.discovery, cns) {
            (_, cns::CTRL) => {
                let ioccsz = (wire::SQE_LEN as u32 + self.limits.inline_size) / 16;
                wire::identify_ctrl(
                    &mut page,
                    &wire::CtrlIdentity {
                        cntlid: ctrl.cntlid,
                        discovery: ctrl.discovery,
                        serial: &self.serial,
                        model: b"rdma-cm-rs NVMe-oF target (Rust)",
                        firmware: b"7.3",
                        subnqn: if ctrl.discovery {
                            wire::DISCOVERY_NQN
                        } else {
                            &self.nqn
                        },
                        mdts: self.limits.mdts,
                        maxcmd: self.limits.io_queue_size,
                        nn: 1,
                        ioccsz,
                    },
                );
                0
            }
            (true, _) => status::INVALID_FIELD | status::DNR,
            (false, cns::NS) => match nsid {
                1 => {
                    wire::identify_ns(&mut page, &self.identity(ctrl));
                    0
                }
                // Inactive: zeroes.
                0xffff_ffff => status::INVALID_NS | status::DNR,
                _ => 0,
            },
            (false, cns::NS_ACTIVE_LIST) if nsid < 0xffff_fffe => {
                wire::identify_active_list(&mut page, &[1], nsid);
                0
            }
            (false, cns::NS_ACTIVE_LIST) => status::INVALID_NS | status::DNR,
            (false, cns::NS_DESC_LIST) if nsid == 1 => {
                wire::identify_ns_descs(&mut page, &self.identity(ctrl));
                0
            }
            (false, cns::NS_CS_INDEP) if nsid == 1 => {
                wire::identify_ns_cs_indep(&mut page);
                0
            }
            (false, cns::NS_DESC_LIST | cns::NS_CS_INDEP) => status::INVALID_NS | status::DNR,
            // The NVM command set's namespace and controller structures:
            // no limits to report.
            (false, cns::CS_NS | cns::CS_CTRL) if csi == 0 => 0,
            _ => status::INVALID_FIELD | status::DNR,
        };
        if status != 0 {
            return Outcome::fail(status);
        }
        match buf.write(0, &page) {
            Ok(()) => Outcome::ok(0),
            Err(_) => Outcome::fail(status::INTERNAL),
        }
    }

    fn get_log_page(&self, q: &QueueCtx<'_>, ctrl: &Ctrl, sqe: &Sqe, data: Data<'_>) -> Outcome {
        let Data::Out(buf) = data else {
            return Outcome::fail(status::SGL_INVALID_DATA | status::DNR);
        };
        let lid = sqe.u8_at(40);
        let lpo = sqe.u64_at(48);
        let mut page = KVec::new();
        let built = match (ctrl.discovery, lid) {
            (true, log::DISCOVERY) => {
                let mut digits = [0u8; 5];
                let port = wire::decimal(self.limits.port, &mut digits);
                let entries = [
                    wire::DiscoveryEntry {
                        ipv6: q.ipv6,
                        subtype: 3,
                        portid: 1,
                        trsvcid: port,
                        subnqn: wire::DISCOVERY_NQN,
                        traddr: q.traddr,
                    },
                    wire::DiscoveryEntry {
                        ipv6: q.ipv6,
                        subtype: 2,
                        portid: 1,
                        trsvcid: port,
                        subnqn: &self.nqn,
                        traddr: q.traddr,
                    },
                ];
                let len = wire::DISCOVERY_ENTRY_LEN * (1 + entries.len());
                page.resize(len, 0u8, GFP_KERNEL)
                    .map(|()| wire::discovery_log(&mut page, 1, &entries))
            }
            (false, log::SUPPORTED) => page.resize(1024, 0u8, GFP_KERNEL).map(|()| {
                wire::supported_logs(
                    &mut page,
                    &[
                        log::SUPPORTED,
                        log::ERROR,
                        log::SMART,
                        log::FW_SLOT,
                        log::CHANGED_NS,
                    ],
                )
            }),
            (false, log::ERROR) => page.resize(ERROR_LOG_LEN, 0u8, GFP_KERNEL),
            (false, log::SMART | log::FW_SLOT) => page.resize(512, 0u8, GFP_KERNEL),
            (false, log::CHANGED_NS) => page.resize(4096, 0u8, GFP_KERNEL),
            _ => return Outcome::fail(status::INVALID_FIELD | status::DNR),
        };
        if built.is_err() {
            return Outcome::fail(status::INTERNAL);
        }
        // Dword-aligned offsets within the log (past it: nvmet's fix of an
        // out-of-bounds read).
        let Some(start) = usize::try_from(lpo)
            .ok()
            .filter(|&o| o % 4 == 0 && o <= page.len())
        else {
            return Outcome::fail(status::INVALID_FIELD | status::DNR);
        };
        let n = (page.len() - start).min(buf.len());
        // The buffer is zeroed: what the log does not fill stays zero.
        match buf.write(0, &page[start..start + n]) {
            Ok(()) => Outcome::ok(0),
            Err(_) => Outcome::fail(status::INTERNAL),
        }
    }
}

impl Ctrl {
    /// Binds `queue` to the controller (the admin queue first); `ENODEV`
    /// once it failed.
    pub(crate) fn attach(&self, queue: Arc<dyn QueueHandle>) -> Result {
        let mut state = self.state.lock();
        if state.dead {
            return Err(ENODEV);
        }
        state.queues.push(queue, GFP_KERNEL)?;
        Ok(())
    }

    /// Unbinds `queue`.
    pub(crate) fn detach(&self, queue: &dyn QueueHandle) {
        let mut state = self.state.lock();
        let at = state
            .queues
            .iter()
            .position(|q| core::ptr::addr_eq(core::ptr::from_ref::<dyn QueueHandle>(&**q), queue));
        if let Some(i) = at {
            state.queues.remove(i).ok();
        }
    }

    /// A fatal error (keep-alive expired, a failed transfer, the admin
    /// queue gone): CSTS.CFS, the held requests dropped, and every queue
    /// returned for the caller to disconnect; `None` if it had failed
    /// already.  CSTS.RDY stays, as nvmet's fatal error leaves it: the
    /// commands still arriving on queues not disconnected yet are served,
    /// not failed with Command Sequence Error and DNR, which the host
    /// would not retry after its reconnect.
    pub(crate) fn fail(&self) -> Option<KVec<Arc<dyn QueueHandle>>> {
        let mut state = self.state.lock();
        if state.dead {
            return None;
        }
        state.dead = true;
        state.csts |= CSTS_CFS;
        state.aers.clear();
        Some(core::mem::take(&mut state.queues))
    }

    fn keep_alive_expired(&self) -> bool {
        let kato_ms = self.state.lock().kato_ms;
        kato_ms != 0
            && self.last_keep_alive.lock().elapsed() > Delta::from_millis(i64::from(kato_ms))
    }

    fn touch(&self) {
        *self.last_keep_alive.lock() = Instant::now();
    }

    fn set_cc(&self, new: u32) {
        let mut st = self.state.lock();
        let was_ready = st.csts & CSTS_RDY != 0;
        self.update_cc(&mut st, new);
        let ready = st.csts & CSTS_RDY != 0;
        self.ready.store(ready, Ordering::Release);
        drop(st);
        // The keep-alive timer starts again when the controller becomes
        // ready, as nvmet re-arms it on enable.
        if ready && !was_ready {
            self.touch();
        }
    }

    /// The CC write's effect on CC and CSTS (`nvmet_update_cc`).
    fn update_cc(&self, st: &mut CtrlState, new: u32) {
        let old = st.cc;
        st.cc = new;
        if new & CC_EN != 0 && old & CC_EN == 0 {
            let iosqes = (new >> 16) & 0xf;
            let iocqes = (new >> 20) & 0xf;
            let (mps, ams, css) = ((new >> 7) & 0xf, (new >> 11) & 0x7, (new >> 4) & 0x7);
            let sizes_ok = self.discovery || (iosqes == 6 && iocqes == 4);
            if sizes_ok && mps == 0 && ams == 0 && css == 0 {
                st.csts |= CSTS_RDY;
            } else {
                st.csts |= CSTS_CFS;
            }
            return;
        }
        if new & CC_EN == 0 && old & CC_EN != 0 {
            st.csts &= !CSTS_RDY;
        }
        if new & CC_SHN_MASK != 0 && old & CC_SHN_MASK == 0 {
            st.cc &= !CC_EN;
            st.csts &= !CSTS_RDY;
            st.csts |= CSTS_SHST_CMPLT;
        }
        if new & CC_SHN_MASK == 0 && old & CC_SHN_MASK != 0 {
            st.csts &= !CSTS_SHST_CMPLT;
        }
    }

    fn supported_aens(&self) -> u32 {
        if self.discovery {
            1 << 31
        } else {
            1 << 8
        }
    }

    fn set_features(&self, subsys: &Subsystem, sqe: &Sqe) -> Outcome {
        let (fid, cdw11) = ((sqe.cdw(10) & 0xff) as u8, sqe.cdw(11));
        match fid {
            feature::NUM_QUEUES if !self.discovery => {
                if cdw11 & 0xffff == 0xffff || cdw11 >> 16 == 0xffff {
                    return Outcome::fail(status::INVALID_FIELD | status::DNR);
                }
                let granted = u64::from(subsys.limits.max_io_queues - 1);
                Outcome::ok(granted | granted << 16)
            }
            feature::KATO => {
                self.state.lock().kato_ms = cdw11.div_ceil(1000).saturating_mul(1000);
                self.touch();
                Outcome::ok(0)
            }
            feature::ASYNC_EVENT => {
                if cdw11 & !self.supported_aens() != 0 {
                    return Outcome::fail(status::INVALID_FIELD | status::DNR);
                }
                self.state.lock().aen_mask = cdw11;
                Outcome::ok(0)
            }
            feature::HOST_ID => Outcome::fail(status::CMD_SEQ_ERROR | status::DNR),
            _ => Outcome::fail(status::INVALID_FIELD | status::DNR),
        }
    }

    fn get_features(&self, subsys: &Subsystem, sqe: &Sqe, data: Data<'_>) -> Outcome {
        let (fid, cdw11) = ((sqe.cdw(10) & 0xff) as u8, sqe.cdw(11));
        match fid {
            feature::NUM_QUEUES if !self.discovery => {
                let granted = u64::from(subsys.limits.max_io_queues - 1);
                Outcome::ok(granted | granted << 16)
            }
            feature::KATO => Outcome::ok(u64::from(self.state.lock().kato_ms)),
            feature::ASYNC_EVENT => Outcome::ok(u64::from(self.state.lock().aen_mask)),
            feature::VOLATILE_WC if !self.discovery => Outcome::ok(1),
            feature::HOST_ID if cdw11 & 1 != 0 => match data {
                Data::Out(buf) => match buf.write(0, &self.hostid) {
                    Ok(()) => Outcome::ok(0),
                    Err(_) => Outcome::fail(status::INTERNAL),
                },
                _ => Outcome::fail(status::SGL_INVALID_DATA | status::DNR),
            },
            _ => Outcome::fail(status::INVALID_FIELD | status::DNR),
        }
    }

    fn hold_aer(&self, cid: u16) -> Outcome {
        let mut st = self.state.lock();
        if st.aers.len() >= MAX_HELD_AERS {
            return Outcome::fail(status::ASYNC_LIMIT | status::DNR);
        }
        match st.aers.push(cid, GFP_KERNEL) {
            Ok(()) => Outcome::Held,
            Err(_) => Outcome::fail(status::INTERNAL),
        }
    }

    fn keep_alive(&self) -> Outcome {
        if self.state.lock().kato_ms == 0 {
            return Outcome::fail(status::KA_TIMEOUT_INVALID);
        }
        self.touch();
        Outcome::ok(0)
    }
}
