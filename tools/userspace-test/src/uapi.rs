// SPDX-License-Identifier: GPL-2.0
//! `/dev/rdma_cm_rs` from user space: the structures generated from the C
//! header, the ioctl numbers, and a `Device` with one safe method a command.

#![allow(non_camel_case_types, non_upper_case_globals, dead_code)]

use crate::backoff::Backoff;
use std::{
    collections::{BTreeSet, VecDeque},
    fs::{File, OpenOptions},
    io,
    mem::size_of,
    net::SocketAddr,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
    time::{Duration, Instant},
};

include!(concat!(env!("OUT_DIR"), "/uapi.rs"));

pub const DEVICE: &str = "/dev/rdma_cm_rs";
const MAGIC: u32 = RDMA_CM_RS_IOCTL_MAGIC;
const IOC_WRITE: u32 = 1;
const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)` of `include/uapi/asm-generic/ioctl.h`.
pub const fn ioc(dir: u32, nr: u32, size: usize) -> u32 {
    (dir << 30) | ((size as u32) << 16) | (MAGIC << 8) | nr
}
const fn iow<T>(nr: u32) -> u32 {
    ioc(IOC_WRITE, nr, size_of::<T>())
}
const fn ior<T>(nr: u32) -> u32 {
    ioc(IOC_READ, nr, size_of::<T>())
}
const fn iowr<T>(nr: u32) -> u32 {
    ioc(IOC_READ | IOC_WRITE, nr, size_of::<T>())
}

pub const IOC_INFO: u32 = ior::<rdma_cm_rs_info>(0x00);
pub const IOC_CREATE_ID: u32 = iowr::<rdma_cm_rs_create_id>(0x01);
pub const IOC_DESTROY_ID: u32 = iow::<rdma_cm_rs_id_cmd>(0x02);
pub const IOC_BIND: u32 = iow::<rdma_cm_rs_bind>(0x03);
pub const IOC_RESOLVE_ADDR: u32 = iowr::<rdma_cm_rs_resolve_addr>(0x04);
pub const IOC_RESOLVE_ROUTE: u32 = iowr::<rdma_cm_rs_resolve_route>(0x05);
pub const IOC_LISTEN: u32 = iow::<rdma_cm_rs_listen>(0x06);
pub const IOC_CONNECT: u32 = iowr::<rdma_cm_rs_connect>(0x07);
pub const IOC_ACCEPT: u32 = iowr::<rdma_cm_rs_accept>(0x08);
pub const IOC_REJECT: u32 = iow::<rdma_cm_rs_reject>(0x09);
pub const IOC_DISCONNECT: u32 = iowr::<rdma_cm_rs_disconnect>(0x0a);
pub const IOC_SET_OPTION: u32 = iow::<rdma_cm_rs_set_option>(0x0b);
pub const IOC_QUERY: u32 = iowr::<rdma_cm_rs_query>(0x0c);
pub const IOC_GET_EVENT: u32 = iowr::<rdma_cm_rs_get_event>(0x0d);
pub const IOC_SEND: u32 = iow::<rdma_cm_rs_send>(0x0e);
pub const IOC_RECV: u32 = iowr::<rdma_cm_rs_recv>(0x0f);
pub const IOC_MR_REG: u32 = iowr::<rdma_cm_rs_mr_reg>(0x10);
pub const IOC_MR_DEREG: u32 = iow::<rdma_cm_rs_mr_cmd>(0x11);
pub const IOC_MR_WRITE: u32 = iow::<rdma_cm_rs_mr_copy>(0x12);
pub const IOC_MR_READ: u32 = iow::<rdma_cm_rs_mr_copy>(0x13);
pub const IOC_RDMA: u32 = iow::<rdma_cm_rs_rdma>(0x14);
pub const IOC_UD_SEND: u32 = iow::<rdma_cm_rs_ud_send>(0x15);
pub const IOC_UD_RECV: u32 = iowr::<rdma_cm_rs_ud_recv>(0x16);
pub const IOC_GET_REQUEST: u32 = iowr::<rdma_cm_rs_get_request>(0x17);
pub const IOC_GETADDRINFO: u32 = iowr::<rdma_cm_rs_getaddrinfo>(0x18);
pub const IOC_JOIN_MCAST: u32 = iowr::<rdma_cm_rs_join_mcast>(0x19);
pub const IOC_LEAVE_MCAST: u32 = iow::<rdma_cm_rs_leave_mcast>(0x1a);
pub const IOC_SEND_RECV: u32 = iowr::<rdma_cm_rs_send_recv>(0x1b);

/// Whether [`Device::open`] opens devices in synchronous mode (the suite's
/// `--sync`): see [`SyncStream`].
static SYNC_MODE: AtomicBool = AtomicBool::new(false);

/// Makes every later [`Device::open`] synchronous.
pub fn set_sync_mode(on: bool) {
    SYNC_MODE.store(on, Ordering::Release);
}

pub fn sync_mode() -> bool {
    SYNC_MODE.load(Ordering::Acquire)
}

/// Whether [`Device::create_id_ps`] makes busy-polling ids
/// (RDMA_CM_RS_ID_BUSY_POLL): see [`BusyPollIds`].
static BUSY_POLL_IDS: AtomicBool = AtomicBool::new(false);

/// While it lives, ids are created busy-polling: their connections' waits
/// poll the CQ in the caller's task.
pub struct BusyPollIds(());

impl BusyPollIds {
    pub fn on() -> Self {
        BUSY_POLL_IDS.store(true, Ordering::Release);
        Self(())
    }
}

impl Drop for BusyPollIds {
    fn drop(&mut self) {
        BUSY_POLL_IDS.store(false, Ordering::Release);
    }
}

pub use crate::report::EventType;

/// Names of `enum rdma_cm_rs_state` (QUERY).
pub fn state_name(s: u32) -> &'static str {
    const NAMES: [&str; 11] = [
        "IDLE",
        "ADDR_QUERY",
        "ADDR_RESOLVED",
        "ROUTE_QUERY",
        "ROUTE_RESOLVED",
        "CONNECT",
        "DISCONNECT",
        "ADDR_BOUND",
        "LISTEN",
        "DEVICE_REMOVAL",
        "DESTROYING",
    ];
    NAMES.get(s as usize).copied().unwrap_or("UNKNOWN")
}

/// The RDMA device name QUERY reported (empty while unbound).
pub fn device_name(q: &rdma_cm_rs_query) -> String {
    q.device
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect()
}

/// Encodes a socket address in the ABI's form: `sockaddr_in`/`sockaddr_in6`
/// in network byte order, zero-padded to 128 bytes.
pub fn sockaddr(addr: &SocketAddr) -> rdma_cm_rs_sockaddr {
    let mut out = rdma_cm_rs_sockaddr { bytes: [0; 128] };
    let b = &mut out.bytes;
    match addr {
        SocketAddr::V4(a) => {
            b[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            b[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&a.ip().octets());
            b[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    out
}

/// Decodes the ABI's address form; `None` for family 0.
pub fn parse_sockaddr(s: &rdma_cm_rs_sockaddr) -> Option<SocketAddr> {
    let b = &s.bytes;
    let port = u16::from_be_bytes([b[2], b[3]]);
    match i32::from(u16::from_ne_bytes([b[0], b[1]])) {
        libc::AF_INET => Some(SocketAddr::from(([b[4], b[5], b[6], b[7]], port))),
        libc::AF_INET6 => {
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            Some(SocketAddr::from((ip, port)))
        }
        _ => None,
    }
}

/// Connection parameters for CONNECT/ACCEPT.
#[derive(Clone, Debug, Default)]
pub struct Param {
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    /// Exchanged with the peer, not used by the QP (`rdma_connect(3)`).
    pub flow_control: u8,
}

impl Param {
    pub fn with_data(data: &[u8]) -> Self {
        Self {
            private_data: data.to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: 0,
        }
    }

    pub fn to_abi(&self) -> rdma_cm_rs_conn_param {
        let mut p = rdma_cm_rs_conn_param {
            private_data_len: self.private_data.len() as u16,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            flow_control: self.flow_control,
            ..Default::default()
        };
        let n = self.private_data.len().min(p.private_data.len());
        p.private_data[..n].copy_from_slice(&self.private_data[..n]);
        p
    }
}

/// A decoded event.
#[derive(Clone, Debug)]
pub struct Event {
    pub id: u32,
    pub event: EventType,
    pub status: i32,
    pub new_id: u32,
    pub context: u64,
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub flow_control: u8,
    pub srq: u8,
    pub qp_num: u32,
    /// UD ESTABLISHED (the SIDR reply): the remote QP, its Q_Key, and the
    /// peer handle UD_SEND takes; 0 otherwise.
    pub ud_qp_num: u32,
    pub ud_qkey: u32,
    pub ud_peer: u32,
}

impl Event {
    fn from_abi(e: &rdma_cm_rs_event) -> Self {
        let n = usize::from(e.param.private_data_len).min(e.param.private_data.len());
        Self {
            id: e.id,
            event: EventType::from(e.event),
            status: e.status,
            new_id: e.new_id,
            context: e.context,
            private_data: e.param.private_data[..n].to_vec(),
            responder_resources: e.param.responder_resources,
            initiator_depth: e.param.initiator_depth,
            retry_count: e.param.retry_count,
            rnr_retry_count: e.param.rnr_retry_count,
            flow_control: e.param.flow_control,
            srq: e.param.srq,
            qp_num: e.param.qp_num,
            ud_qp_num: e.ud_qp_num,
            ud_qkey: e.ud_qkey,
            ud_peer: e.ud_peer,
        }
    }

    /// The event as one line for people.
    pub fn line(&self, who: &str) -> String {
        let mut ids = if self.new_id != 0 {
            format!("id={} new_id={}", self.id, self.new_id)
        } else {
            format!("id={}", self.id)
        };
        if self.ud_qp_num != 0 || self.ud_peer != 0 {
            ids += &format!(
                " ud_qp_num={:#x} ud_qkey={:#x} ud_peer={}",
                self.ud_qp_num, self.ud_qkey, self.ud_peer
            );
        }
        let c = crate::report::ConnFields {
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: self.srq,
            qp_num: self.qp_num,
            private_data: self.private_data.clone(),
        };
        crate::report::event_line(who, self.event, &ids, self.status, &c)
    }

    pub fn name(&self) -> &'static str {
        self.event.name()
    }
}

/// A synchronous device's events, as the suite's scenarios read them.
///
/// A synchronous id's events never reach GET_EVENT: each comes back with
/// the blocking call it ended.  To drive every scenario unchanged in that
/// mode, a synchronous [`Device`] keeps what its blocking calls returned
/// here, and [`Device::get_event`] hands it out in order; a failure an
/// event reported (REJECTED, ADDR_ERROR, ...) is returned as that event,
/// as the asynchronous ioctl would have queued it.  What no call of the
/// scenario waits for comes the synchronous way too: connection requests
/// through GET_REQUEST on the device's listeners, and a peer's
/// disconnect, seen in QUERY's state, through a DISCONNECT that returns at
/// once with the DISCONNECTED event the module kept (a later DISCONNECT of
/// the scenario gets it again, and it is not handed out twice).
#[derive(Default)]
struct SyncStream {
    pending: VecDeque<Event>,
    listeners: Vec<u32>,
    /// Connected ids whose DISCONNECTED was not handed out yet.
    connected: BTreeSet<u32>,
    /// Ids whose DISCONNECTED was handed out.
    disconnected: BTreeSet<u32>,
}

/// A datagram UD_RECV returned.
#[derive(Clone, Debug)]
pub struct Datagram {
    /// The payload (the GRH stripped).
    pub data: Vec<u8>,
    /// The immediate data, in host order, when it was sent with one.
    pub imm: Option<u32>,
    /// The sender's peer handle (0: the id's table was full).
    pub peer: u32,
    pub src_qp: u32,
    /// The sender's address (port 0).
    pub src: Option<SocketAddr>,
}

/// The event a synchronous call wrote back, if one ended it.
pub fn sync_event(s: &rdma_cm_rs_sync) -> Option<Event> {
    (s.flags & RDMA_CM_RS_SYNC_EVENT != 0).then(|| Event::from_abi(&s.event))
}

/// An open `/dev/rdma_cm_rs`.
pub struct Device {
    file: File,
    /// Synchronous mode: ids are created with RDMA_CM_RS_ID_SYNC.
    sync: Option<Mutex<SyncStream>>,
}

pub type Result<T> = std::result::Result<T, io::Error>;

/// A failed SEND_RECV: the error, and whether the send half had been posted.
#[derive(Debug)]
pub struct SendRecvError {
    pub error: io::Error,
    pub sent: u32,
}

impl std::fmt::Display for SendRecvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (sent {})", self.error, self.sent)
    }
}

impl std::error::Error for SendRecvError {}

impl Device {
    /// Opens the device; synchronous when the suite runs with `--sync`.
    pub fn open() -> Result<Self> {
        let mut dev = Self::open_flags(0)?;
        if sync_mode() {
            dev.sync = Some(Mutex::default());
        }
        Ok(dev)
    }

    /// Opens the device in asynchronous mode, whatever the suite's mode.
    pub fn open_async() -> Result<Self> {
        Self::open_flags(0)
    }

    /// Opens the device in synchronous mode (see [`SyncStream`]).
    pub fn open_sync() -> Result<Self> {
        let mut dev = Self::open_flags(0)?;
        dev.sync = Some(Mutex::default());
        Ok(dev)
    }

    pub fn is_sync(&self) -> bool {
        self.sync.is_some()
    }

    pub fn open_nonblocking() -> Result<Self> {
        Self::open_flags(libc::O_NONBLOCK)
    }

    /// The device through a descriptor this process inherited open (the
    /// access rules: the open file carries the opener's rights).  Refuses a
    /// descriptor that is not open.
    pub fn from_inherited_fd(fd: i32) -> Result<Self> {
        // SAFETY: F_GETFD only reads the descriptor's flags; a bad one
        // returns -1 (EBADF).
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: The descriptor is open (checked above) and this process
        // hands it to nothing else: the caller named it to be owned here.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(Self { file, sync: None })
    }

    fn open_flags(flags: i32) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(flags)
            .open(DEVICE)?;
        Ok(Self { file, sync: None })
    }

    pub fn fd(&self) -> i32 {
        self.file.as_raw_fd()
    }

    /// Any ioctl with any argument: for the malformed-argument tests.
    pub fn raw_ioctl(&self, cmd: u32, arg: usize) -> Result<i32> {
        // SAFETY: The kernel validates `arg`; a bad pointer yields EFAULT.
        let r = unsafe { libc::ioctl(self.fd(), cmd as _, arg) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    fn call<T>(&self, cmd: u32, arg: &mut T) -> Result<()> {
        self.raw_ioctl(cmd, arg as *mut T as usize).map(|_| ())
    }

    pub fn info(&self) -> Result<rdma_cm_rs_info> {
        let mut i = rdma_cm_rs_info::default();
        self.call(IOC_INFO, &mut i)?;
        Ok(i)
    }

    pub fn create_id(&self, context: u64) -> Result<u32> {
        self.create_id_ps(context, RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_RC)
    }

    pub fn create_id_ps(&self, context: u64, ps: u32, qpt: u32) -> Result<u32> {
        let mut flags = 0;
        if self.is_sync() {
            flags |= RDMA_CM_RS_ID_SYNC;
        }
        if BUSY_POLL_IDS.load(Ordering::Acquire) {
            flags |= RDMA_CM_RS_ID_BUSY_POLL;
        }
        self.create_id_flags(context, ps, qpt, flags)
    }

    pub fn create_id_flags(&self, context: u64, ps: u32, qpt: u32, flags: u32) -> Result<u32> {
        let mut c = rdma_cm_rs_create_id {
            context,
            port_space: ps,
            qp_type: qpt,
            flags,
            ..Default::default()
        };
        self.call(IOC_CREATE_ID, &mut c)?;
        Ok(c.id)
    }

    pub fn destroy(&self, id: u32) -> Result<()> {
        self.call(IOC_DESTROY_ID, &mut rdma_cm_rs_id_cmd { id, reserved: 0 })
    }

    pub fn bind(&self, id: u32, addr: &SocketAddr) -> Result<()> {
        let mut b = rdma_cm_rs_bind {
            id,
            reserved: 0,
            addr: sockaddr(addr),
        };
        self.call(IOC_BIND, &mut b)
    }

    /// RESOLVE_ADDR; on a synchronous id it returns with its event (see
    /// [`Self::sync_resolve_addr`] for the raw form).
    pub fn resolve_addr(&self, id: u32, dst: &SocketAddr, timeout_ms: u32) -> Result<()> {
        let mut r = rdma_cm_rs_resolve_addr {
            id,
            timeout_ms,
            src: rdma_cm_rs_sockaddr { bytes: [0; 128] },
            dst: sockaddr(dst),
            ..Default::default()
        };
        self.blocking(IOC_RESOLVE_ADDR, &mut r, |r| &mut r.sync)
    }

    /// RESOLVE_ADDR on a synchronous id waiting at most `wait_ms` (0: until
    /// the event): the ioctl's result and the event it returned.
    pub fn sync_resolve_addr(
        &self,
        id: u32,
        dst: &SocketAddr,
        timeout_ms: u32,
        wait_ms: u32,
    ) -> (Result<()>, Option<Event>) {
        let mut r = rdma_cm_rs_resolve_addr {
            id,
            timeout_ms,
            dst: sockaddr(dst),
            ..Default::default()
        };
        r.sync.timeout_ms = wait_ms;
        let result = self.call(IOC_RESOLVE_ADDR, &mut r);
        (result, sync_event(&r.sync))
    }

    /// CONNECT on a synchronous id waiting at most `wait_ms` (0: until the
    /// event): the ioctl's result and the event it returned.
    pub fn sync_connect(&self, id: u32, p: &Param, wait_ms: u32) -> (Result<()>, Option<Event>) {
        let mut c = rdma_cm_rs_connect {
            id,
            param: p.to_abi(),
            ..Default::default()
        };
        c.sync.timeout_ms = wait_ms;
        let result = self.call(IOC_CONNECT, &mut c);
        (result, sync_event(&c.sync))
    }

    /// RESOLVE_ROUTE on a synchronous id waiting at most `wait_ms` (0: until
    /// the event): the ioctl's result and the event it returned.
    pub fn sync_resolve_route(
        &self,
        id: u32,
        timeout_ms: u32,
        wait_ms: u32,
    ) -> (Result<()>, Option<Event>) {
        let mut r = rdma_cm_rs_resolve_route {
            id,
            timeout_ms,
            ..Default::default()
        };
        r.sync.timeout_ms = wait_ms;
        let result = self.call(IOC_RESOLVE_ROUTE, &mut r);
        (result, sync_event(&r.sync))
    }

    /// DISCONNECT on a synchronous id waiting at most `wait_ms` (0: until
    /// the event): the ioctl's result and the event it returned.
    pub fn sync_disconnect(&self, id: u32, wait_ms: u32) -> (Result<()>, Option<Event>) {
        let mut d = rdma_cm_rs_disconnect {
            id,
            ..Default::default()
        };
        d.sync.timeout_ms = wait_ms;
        let result = self.call(IOC_DISCONNECT, &mut d);
        (result, sync_event(&d.sync))
    }

    pub fn resolve_route(&self, id: u32, timeout_ms: u32) -> Result<()> {
        let mut r = rdma_cm_rs_resolve_route {
            id,
            timeout_ms,
            ..Default::default()
        };
        self.blocking(IOC_RESOLVE_ROUTE, &mut r, |r| &mut r.sync)
    }

    pub fn listen(&self, id: u32, backlog: u32) -> Result<()> {
        self.call(IOC_LISTEN, &mut rdma_cm_rs_listen { id, backlog })?;
        if let Some(s) = &self.sync {
            s.lock().unwrap().listeners.push(id);
        }
        Ok(())
    }

    pub fn connect(&self, id: u32, p: &Param) -> Result<()> {
        let mut c = rdma_cm_rs_connect {
            id,
            reserved: 0,
            param: p.to_abi(),
            ..Default::default()
        };
        self.blocking(IOC_CONNECT, &mut c, |c| &mut c.sync)
    }

    /// A command that blocks on a synchronous id: its event goes to the
    /// [`SyncStream`], and a failure an event reported counts as success
    /// (the event tells), as on an asynchronous id.
    fn blocking<T>(
        &self,
        cmd: u32,
        arg: &mut T,
        sync: impl Fn(&mut T) -> &mut rdma_cm_rs_sync,
    ) -> Result<()> {
        let result = self.call(cmd, arg);
        let Some(stream) = &self.sync else {
            return result;
        };
        let Some(ev) = sync_event(sync(arg)) else {
            return result;
        };
        let mut st = stream.lock().unwrap();
        match ev.event {
            EventType::Established => {
                st.connected.insert(ev.id);
            }
            EventType::Disconnected => {
                st.connected.remove(&ev.id);
                if !st.disconnected.insert(ev.id) {
                    // Handed out already (a peer's disconnect).
                    return Ok(());
                }
            }
            _ => {}
        }
        st.pending.push_back(ev);
        Ok(())
    }

    /// JOIN_MCAST of `group` with `flags` (RDMA_CM_RS_JOIN_*); the
    /// group's events carry `context`.  On a synchronous id it returns
    /// with its event, kept for [`Self::get_event`].
    pub fn join_mcast(&self, id: u32, group: &SocketAddr, flags: u32, context: u64) -> Result<()> {
        let mut j = rdma_cm_rs_join_mcast {
            context,
            id,
            flags,
            addr: sockaddr(group),
            ..Default::default()
        };
        self.blocking(IOC_JOIN_MCAST, &mut j, |j| &mut j.sync)
    }

    /// LEAVE_MCAST of `group`.
    pub fn leave_mcast(&self, id: u32, group: &SocketAddr) -> Result<()> {
        let mut l = rdma_cm_rs_leave_mcast {
            id,
            reserved: 0,
            addr: sockaddr(group),
        };
        self.call(IOC_LEAVE_MCAST, &mut l)
    }

    /// `None` accepts with the request's values (ACCEPT_REQUEST_PARAM).
    pub fn accept(&self, id: u32, p: Option<&Param>) -> Result<()> {
        let mut a = rdma_cm_rs_accept {
            id,
            flags: if p.is_none() {
                RDMA_CM_RS_ACCEPT_REQUEST_PARAM
            } else {
                0
            },
            param: p.map(Param::to_abi).unwrap_or_default(),
            ..Default::default()
        };
        self.blocking(IOC_ACCEPT, &mut a, |a| &mut a.sync)
    }

    pub fn reject(&self, id: u32, reason: u8, data: &[u8]) -> Result<()> {
        let mut r = rdma_cm_rs_reject {
            id,
            reason,
            private_data_len: data.len() as u16,
            ..Default::default()
        };
        let n = data.len().min(r.private_data.len());
        r.private_data[..n].copy_from_slice(&data[..n]);
        self.call(IOC_REJECT, &mut r)
    }

    pub fn disconnect(&self, id: u32) -> Result<()> {
        let mut d = rdma_cm_rs_disconnect {
            id,
            ..Default::default()
        };
        self.blocking(IOC_DISCONNECT, &mut d, |d| &mut d.sync)
    }

    /// GET_REQUEST: the oldest connection request of a synchronous listener.
    pub fn get_request(&self, listener: u32, timeout_ms: u32) -> Result<Event> {
        let mut g = rdma_cm_rs_get_request {
            id: listener,
            timeout_ms,
            ..Default::default()
        };
        self.call(IOC_GET_REQUEST, &mut g)?;
        Ok(Event::from_abi(&g.event))
    }

    pub fn set_option(&self, id: u32, option: u32, value: u64) -> Result<()> {
        self.call(
            IOC_SET_OPTION,
            &mut rdma_cm_rs_set_option { id, option, value },
        )
    }

    /// GETADDRINFO of `node` and `service` (`None`: empty) under the
    /// hints in `q` (its text fields are overwritten).
    pub fn getaddrinfo(
        &self,
        node: Option<&str>,
        service: Option<&str>,
        mut q: rdma_cm_rs_getaddrinfo,
    ) -> Result<rdma_cm_rs_getaddrinfo> {
        let put = |dst: &mut [std::os::raw::c_char], s: Option<&str>| -> Result<()> {
            let s = s.unwrap_or("").as_bytes();
            if s.len() >= dst.len() {
                return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
            }
            dst.fill(0);
            for (d, b) in dst.iter_mut().zip(s) {
                *d = *b as std::os::raw::c_char;
            }
            Ok(())
        };
        put(&mut q.node, node)?;
        put(&mut q.service, service)?;
        self.call(IOC_GETADDRINFO, &mut q)?;
        Ok(q)
    }

    pub fn query(&self, id: u32) -> Result<rdma_cm_rs_query> {
        let mut q = rdma_cm_rs_query {
            id,
            ..Default::default()
        };
        self.call(IOC_QUERY, &mut q)?;
        Ok(q)
    }

    /// The next event: GET_EVENT, or on a synchronous device the next one
    /// of its [`SyncStream`].
    pub fn get_event(&self, timeout_ms: u32) -> Result<Event> {
        if self.sync.is_some() {
            return self.next_sync_event(timeout_ms);
        }
        self.get_event_ioctl(timeout_ms)
    }

    /// GET_EVENT itself, in any mode.
    pub fn get_event_ioctl(&self, timeout_ms: u32) -> Result<Event> {
        let mut g = rdma_cm_rs_get_event {
            timeout_ms,
            ..Default::default()
        };
        self.call(IOC_GET_EVENT, &mut g)?;
        Ok(Event::from_abi(&g.event))
    }

    fn next_sync_event(&self, timeout_ms: u32) -> Result<Event> {
        let stream = self.sync.as_ref().expect("a synchronous device");
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.into());
        let mut backoff = Backoff::new();
        loop {
            if let Some(ev) = stream.lock().unwrap().pending.pop_front() {
                return Ok(ev);
            }
            let (listeners, connected) = {
                let st = stream.lock().unwrap();
                (st.listeners.clone(), st.connected.clone())
            };
            for l in listeners {
                match self.get_request(l, 0) {
                    Ok(ev) => return Ok(ev),
                    Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {}
                    // Destroyed meanwhile.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        stream.lock().unwrap().listeners.retain(|x| *x != l);
                    }
                    Err(e) => return Err(e),
                }
            }
            for id in connected {
                match self.query(id) {
                    Ok(q) if q.state == rdma_cm_rs_state_RDMA_CM_RS_DISCONNECT => {
                        // The peer disconnected: the module kept its event.
                        self.disconnect(id)?;
                    }
                    Ok(_) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                        stream.lock().unwrap().connected.remove(&id);
                    }
                    Err(e) => return Err(e),
                }
            }
            if !stream.lock().unwrap().pending.is_empty() {
                continue;
            }
            if timeout_ms == 0 {
                return Err(io::Error::from_raw_os_error(libc::EAGAIN));
            }
            if Instant::now() >= deadline {
                return Err(io::Error::from_raw_os_error(libc::ETIMEDOUT));
            }
            backoff.pause();
        }
    }

    pub fn send(&self, id: u32, data: &[u8]) -> Result<()> {
        self.send_flags(id, data, 5000, 0)
    }

    /// SEND with `RDMA_CM_RS_SEND_NOWAIT`: returns once posted.
    pub fn send_nowait(&self, id: u32, data: &[u8]) -> Result<()> {
        self.send_flags(id, data, 5000, RDMA_CM_RS_SEND_NOWAIT)
    }

    pub fn send_flags(&self, id: u32, data: &[u8], timeout_ms: u32, flags: u32) -> Result<()> {
        let mut s = rdma_cm_rs_send {
            id,
            len: data.len() as u32,
            buf: data.as_ptr() as u64,
            timeout_ms,
            flags,
        };
        self.call(IOC_SEND, &mut s)
    }

    /// MR_REG: a region of `length` bytes with `access`
    /// (`RDMA_CM_RS_ACCESS_*`); returns (handle, addr, rkey).
    pub fn mr_reg(&self, id: u32, length: u32, access: u32) -> Result<(u32, u64, u32)> {
        let mut r = rdma_cm_rs_mr_reg {
            id,
            access,
            length,
            timeout_ms: 5000,
            ..Default::default()
        };
        self.call(IOC_MR_REG, &mut r)?;
        Ok((r.mr, r.addr, r.rkey))
    }

    pub fn mr_dereg(&self, id: u32, mr: u32) -> Result<()> {
        let mut c = rdma_cm_rs_mr_cmd {
            id,
            mr,
            timeout_ms: 5000,
            reserved: 0,
        };
        self.call(IOC_MR_DEREG, &mut c)
    }

    /// MR_WRITE: `data` into the region at `offset`.
    pub fn mr_write(&self, id: u32, mr: u32, offset: u32, data: &[u8]) -> Result<()> {
        let mut c = rdma_cm_rs_mr_copy {
            id,
            mr,
            offset,
            len: data.len() as u32,
            buf: data.as_ptr() as u64,
        };
        self.call(IOC_MR_WRITE, &mut c)
    }

    /// MR_READ: `len` bytes of the region at `offset`.
    pub fn mr_read(&self, id: u32, mr: u32, offset: u32, len: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; len];
        let mut c = rdma_cm_rs_mr_copy {
            id,
            mr,
            offset,
            len: len as u32,
            buf: buf.as_mut_ptr() as u64,
        };
        self.call(IOC_MR_READ, &mut c)?;
        Ok(buf)
    }

    /// RDMA: one READ or WRITE (`RDMA_CM_RS_RDMA_*`) of `len` bytes between
    /// the region at `offset` and the peer's `remote_addr`/`rkey`.
    #[allow(clippy::too_many_arguments)]
    pub fn rdma(
        &self,
        id: u32,
        opcode: u32,
        mr: u32,
        offset: u32,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<()> {
        let mut c = rdma_cm_rs_rdma {
            id,
            opcode,
            mr,
            offset,
            len,
            rkey,
            remote_addr,
            timeout_ms: 5000,
            reserved: 0,
        };
        self.call(IOC_RDMA, &mut c)
    }

    /// UD_SEND: one datagram to peer handle `peer`, with `imm` as immediate
    /// data (SEND_WITH_IMM) when given.
    pub fn ud_send(&self, id: u32, peer: u32, data: &[u8], imm: Option<u32>) -> Result<()> {
        let mut s = rdma_cm_rs_ud_send {
            id,
            peer,
            buf: data.as_ptr() as u64,
            len: data.len() as u32,
            flags: if imm.is_some() {
                RDMA_CM_RS_UD_WITH_IMM
            } else {
                0
            },
            imm_data: imm.unwrap_or(0),
            timeout_ms: 5000,
        };
        self.call(IOC_UD_SEND, &mut s)
    }

    /// UD_RECV: the oldest datagram, into a buffer of `capacity` bytes.
    pub fn ud_recv(&self, id: u32, capacity: usize, timeout_ms: u32) -> Result<Datagram> {
        let mut buf = vec![0u8; capacity];
        let mut r = rdma_cm_rs_ud_recv {
            id,
            len: capacity as u32,
            buf: buf.as_mut_ptr() as u64,
            timeout_ms,
            ..Default::default()
        };
        self.call(IOC_UD_RECV, &mut r)?;
        buf.truncate(r.len as usize);
        Ok(Datagram {
            data: buf,
            imm: (r.flags & RDMA_CM_RS_UD_WITH_IMM != 0).then_some(r.imm_data),
            peer: r.peer,
            src_qp: r.src_qp,
            src: parse_sockaddr(&r.src),
        })
    }

    pub fn recv(&self, id: u32, capacity: usize, timeout_ms: u32) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; capacity];
        let mut r = rdma_cm_rs_recv {
            id,
            len: capacity as u32,
            buf: buf.as_mut_ptr() as u64,
            timeout_ms,
            reserved: 0,
        };
        self.call(IOC_RECV, &mut r)?;
        buf.truncate(r.len as usize);
        Ok(buf)
    }

    /// SEND_RECV: `data` sent (NOWAIT) and the answer received in one call,
    /// each half waiting up to `timeout_ms`.  On an error, whether the send
    /// was posted (`sent`).
    pub fn send_recv(
        &self,
        id: u32,
        data: &[u8],
        capacity: usize,
        timeout_ms: u32,
    ) -> std::result::Result<Vec<u8>, SendRecvError> {
        let mut buf = vec![0u8; capacity];
        let mut r = rdma_cm_rs_send_recv {
            id,
            send_len: data.len() as u32,
            send_buf: data.as_ptr() as u64,
            recv_buf: buf.as_mut_ptr() as u64,
            recv_len: capacity as u32,
            timeout_ms,
            ..Default::default()
        };
        match self.call(IOC_SEND_RECV, &mut r) {
            Ok(()) => {
                buf.truncate(r.recv_len as usize);
                Ok(buf)
            }
            Err(error) => Err(SendRecvError {
                error,
                sent: r.sent,
            }),
        }
    }

    /// SEND_RECV with the arguments as given, pointers included: for the
    /// checks of bad input.  What the call wrote back (`sent`) is in `r`.
    pub fn send_recv_raw(&self, r: &mut rdma_cm_rs_send_recv) -> Result<()> {
        self.call(IOC_SEND_RECV, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::mem::{align_of, offset_of};

    /// Sizes and offsets as the header's rules give them (naturally aligned,
    /// explicit padding, identical for 32- and 64-bit user space), computed
    /// by hand from the C declarations.
    #[test]
    fn layouts_match_the_header() {
        assert_eq!(size_of::<rdma_cm_rs_sockaddr>(), 128);

        assert_eq!(size_of::<rdma_cm_rs_conn_param>(), 272);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, qp_num), 0);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, private_data_len), 4);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, responder_resources), 6);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, initiator_depth), 7);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, flow_control), 8);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, retry_count), 9);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, rnr_retry_count), 10);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, srq), 11);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, reserved), 12);
        assert_eq!(offset_of!(rdma_cm_rs_conn_param, private_data), 16);

        assert_eq!(size_of::<rdma_cm_rs_info>(), 64);
        assert_eq!(offset_of!(rdma_cm_rs_info, recv_depth), 16);
        assert_eq!(offset_of!(rdma_cm_rs_info, max_ud_peers), 20);
        assert_eq!(offset_of!(rdma_cm_rs_info, send_window), 24);
        assert_eq!(offset_of!(rdma_cm_rs_info, max_mcast_groups), 28);
        assert_eq!(offset_of!(rdma_cm_rs_info, reserved), 32);

        assert_eq!(size_of::<rdma_cm_rs_join_mcast>(), 472);
        assert_eq!(offset_of!(rdma_cm_rs_join_mcast, id), 8);
        assert_eq!(offset_of!(rdma_cm_rs_join_mcast, addr), 16);
        assert_eq!(offset_of!(rdma_cm_rs_join_mcast, sync), 144);
        assert_eq!(size_of::<rdma_cm_rs_leave_mcast>(), 136);
        assert_eq!(offset_of!(rdma_cm_rs_leave_mcast, addr), 8);

        assert_eq!(size_of::<rdma_cm_rs_create_id>(), 24);
        assert_eq!(offset_of!(rdma_cm_rs_create_id, port_space), 8);
        assert_eq!(offset_of!(rdma_cm_rs_create_id, id), 16);
        assert_eq!(offset_of!(rdma_cm_rs_create_id, flags), 20);

        assert_eq!(size_of::<rdma_cm_rs_sync>(), 328);
        assert_eq!(offset_of!(rdma_cm_rs_sync, flags), 4);
        assert_eq!(offset_of!(rdma_cm_rs_sync, event), 8);
        assert_eq!(size_of::<rdma_cm_rs_disconnect>(), 336);
        assert_eq!(offset_of!(rdma_cm_rs_disconnect, sync), 8);
        assert_eq!(size_of::<rdma_cm_rs_get_request>(), 328);
        assert_eq!(offset_of!(rdma_cm_rs_get_request, timeout_ms), 4);
        assert_eq!(offset_of!(rdma_cm_rs_get_request, event), 8);

        assert_eq!(size_of::<rdma_cm_rs_id_cmd>(), 8);
        assert_eq!(size_of::<rdma_cm_rs_bind>(), 136);
        assert_eq!(offset_of!(rdma_cm_rs_bind, addr), 8);
        assert_eq!(size_of::<rdma_cm_rs_resolve_addr>(), 592);
        assert_eq!(offset_of!(rdma_cm_rs_resolve_addr, src), 8);
        assert_eq!(offset_of!(rdma_cm_rs_resolve_addr, dst), 136);
        assert_eq!(offset_of!(rdma_cm_rs_resolve_addr, sync), 264);
        assert_eq!(size_of::<rdma_cm_rs_resolve_route>(), 336);
        assert_eq!(offset_of!(rdma_cm_rs_resolve_route, sync), 8);
        assert_eq!(size_of::<rdma_cm_rs_listen>(), 8);
        assert_eq!(size_of::<rdma_cm_rs_connect>(), 608);
        assert_eq!(offset_of!(rdma_cm_rs_connect, param), 8);
        assert_eq!(offset_of!(rdma_cm_rs_connect, sync), 280);
        assert_eq!(size_of::<rdma_cm_rs_accept>(), 608);
        assert_eq!(offset_of!(rdma_cm_rs_accept, flags), 4);
        assert_eq!(offset_of!(rdma_cm_rs_accept, param), 8);
        assert_eq!(offset_of!(rdma_cm_rs_accept, sync), 280);

        assert_eq!(size_of::<rdma_cm_rs_reject>(), 264);
        assert_eq!(offset_of!(rdma_cm_rs_reject, reason), 4);
        assert_eq!(offset_of!(rdma_cm_rs_reject, reserved), 5);
        assert_eq!(offset_of!(rdma_cm_rs_reject, private_data_len), 6);
        assert_eq!(offset_of!(rdma_cm_rs_reject, private_data), 8);

        assert_eq!(size_of::<rdma_cm_rs_mr_reg>(), 48);
        assert_eq!(offset_of!(rdma_cm_rs_mr_reg, addr), 16);
        assert_eq!(offset_of!(rdma_cm_rs_mr_reg, rkey), 24);
        assert_eq!(offset_of!(rdma_cm_rs_mr_reg, mr), 28);
        assert_eq!(size_of::<rdma_cm_rs_mr_cmd>(), 16);
        assert_eq!(size_of::<rdma_cm_rs_mr_copy>(), 24);
        assert_eq!(offset_of!(rdma_cm_rs_mr_copy, buf), 16);
        assert_eq!(size_of::<rdma_cm_rs_rdma>(), 40);
        assert_eq!(offset_of!(rdma_cm_rs_rdma, remote_addr), 24);
        assert_eq!(offset_of!(rdma_cm_rs_rdma, timeout_ms), 32);

        assert_eq!(size_of::<rdma_cm_rs_set_option>(), 16);
        assert_eq!(offset_of!(rdma_cm_rs_set_option, value), 8);

        assert_eq!(size_of::<rdma_cm_rs_query>(), 384);
        assert_eq!(offset_of!(rdma_cm_rs_query, qp_num), 16);
        assert_eq!(offset_of!(rdma_cm_rs_query, responder_resources), 24);
        assert_eq!(offset_of!(rdma_cm_rs_query, tos), 26);
        assert_eq!(offset_of!(rdma_cm_rs_query, tos_set), 27);
        assert_eq!(offset_of!(rdma_cm_rs_query, backlog), 28);
        assert_eq!(offset_of!(rdma_cm_rs_query, src), 32);
        assert_eq!(offset_of!(rdma_cm_rs_query, dst), 160);
        assert_eq!(offset_of!(rdma_cm_rs_query, device), 288);
        assert_eq!(offset_of!(rdma_cm_rs_query, max_datagram), 352);
        assert_eq!(offset_of!(rdma_cm_rs_query, qkey), 356);
        assert_eq!(offset_of!(rdma_cm_rs_query, reserved), 360);

        assert_eq!(size_of::<rdma_cm_rs_event>(), 320);
        assert_eq!(offset_of!(rdma_cm_rs_event, id), 8);
        assert_eq!(offset_of!(rdma_cm_rs_event, event), 12);
        assert_eq!(offset_of!(rdma_cm_rs_event, status), 16);
        assert_eq!(offset_of!(rdma_cm_rs_event, new_id), 20);
        assert_eq!(offset_of!(rdma_cm_rs_event, ud_qkey), 28);
        assert_eq!(offset_of!(rdma_cm_rs_event, param), 32);
        assert_eq!(offset_of!(rdma_cm_rs_event, ud_peer), 304);
        assert_eq!(offset_of!(rdma_cm_rs_event, reserved), 308);
        assert_eq!(size_of::<rdma_cm_rs_get_event>(), 328);
        assert_eq!(offset_of!(rdma_cm_rs_get_event, event), 8);

        assert_eq!(size_of::<rdma_cm_rs_send>(), 24);
        assert_eq!(offset_of!(rdma_cm_rs_send, buf), 8);
        assert_eq!(offset_of!(rdma_cm_rs_send, timeout_ms), 16);
        assert_eq!(offset_of!(rdma_cm_rs_send, flags), 20);
        assert_eq!(size_of::<rdma_cm_rs_recv>(), 24);
        assert_eq!(offset_of!(rdma_cm_rs_recv, len), 4);
        assert_eq!(offset_of!(rdma_cm_rs_recv, timeout_ms), 16);
        assert_eq!(size_of::<rdma_cm_rs_send_recv>(), 40);
        assert_eq!(offset_of!(rdma_cm_rs_send_recv, send_buf), 8);
        assert_eq!(offset_of!(rdma_cm_rs_send_recv, recv_buf), 16);
        assert_eq!(offset_of!(rdma_cm_rs_send_recv, recv_len), 24);
        assert_eq!(offset_of!(rdma_cm_rs_send_recv, timeout_ms), 28);
        assert_eq!(offset_of!(rdma_cm_rs_send_recv, sent), 32);
        assert_eq!(offset_of!(rdma_cm_rs_send_recv, reserved), 36);

        assert_eq!(size_of::<rdma_cm_rs_ud_send>(), 32);
        assert_eq!(offset_of!(rdma_cm_rs_ud_send, peer), 4);
        assert_eq!(offset_of!(rdma_cm_rs_ud_send, buf), 8);
        assert_eq!(offset_of!(rdma_cm_rs_ud_send, len), 16);
        assert_eq!(offset_of!(rdma_cm_rs_ud_send, flags), 20);
        assert_eq!(offset_of!(rdma_cm_rs_ud_send, imm_data), 24);
        assert_eq!(offset_of!(rdma_cm_rs_ud_send, timeout_ms), 28);
        assert_eq!(size_of::<rdma_cm_rs_ud_recv>(), 168);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, buf), 8);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, timeout_ms), 16);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, flags), 20);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, imm_data), 24);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, peer), 28);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, src_qp), 32);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, reserved), 36);
        assert_eq!(offset_of!(rdma_cm_rs_ud_recv, src), 40);

        // Every structure's size is a multiple of 8, so arrays and 32-bit
        // user space see the same layout.
        for (size, align) in [
            (
                size_of::<rdma_cm_rs_event>(),
                align_of::<rdma_cm_rs_event>(),
            ),
            (
                size_of::<rdma_cm_rs_query>(),
                align_of::<rdma_cm_rs_query>(),
            ),
            (size_of::<rdma_cm_rs_send>(), align_of::<rdma_cm_rs_send>()),
            (
                size_of::<rdma_cm_rs_ud_send>(),
                align_of::<rdma_cm_rs_ud_send>(),
            ),
            (
                size_of::<rdma_cm_rs_ud_recv>(),
                align_of::<rdma_cm_rs_ud_recv>(),
            ),
        ] {
            assert_eq!(size % 8, 0);
            assert_eq!(align, 8);
        }
    }

    #[test]
    fn constants_match_the_header() {
        assert_eq!(RDMA_CM_RS_ABI_VERSION, 7);
        assert_eq!(RDMA_CM_RS_ID_SYNC, 1);
        assert_eq!(RDMA_CM_RS_ID_BUSY_POLL, 2);
        assert_eq!(RDMA_CM_RS_SYNC_EVENT, 1);
        assert_eq!(RDMA_CM_RS_MAX_PRIVATE_DATA, 256);
        assert_eq!(RDMA_CM_RS_MAX_MESSAGE, 4096);
        assert_eq!(RDMA_CM_RS_RECV_DEPTH, 16);
        assert_eq!(RDMA_CM_RS_SEND_WINDOW, 16);
        assert_eq!(RDMA_CM_RS_SEND_NOWAIT, 1);
        assert_eq!(RDMA_CM_RS_TIMEOUT_INFINITE, u32::MAX);
        assert_eq!(RDMA_CM_RS_PS_TCP, 0x0106);
        assert_eq!(RDMA_CM_RS_QPT_RC, 2);
        assert_eq!(RDMA_CM_RS_ACCEPT_REQUEST_PARAM, 1);
        assert_eq!(RDMA_CM_RS_PS_UDP, 0x0111);
        assert_eq!(RDMA_CM_RS_QPT_UD, 4);
        assert_eq!(RDMA_CM_RS_GRH_SIZE, 40);
        assert_eq!(RDMA_CM_RS_MAX_UD_PEERS, 64);
        assert_eq!(RDMA_CM_RS_UD_WITH_IMM, 1);
        assert_eq!(RDMA_CM_RS_MAX_MCAST_GROUPS, 56);
        assert_eq!(RDMA_CM_RS_JOIN_SENDONLY, 1);
        assert_eq!(rdma_cm_rs_option_RDMA_CM_RS_OPT_MIN_RNR_TIMER, 5);
        assert_eq!(rdma_cm_rs_state_RDMA_CM_RS_DESTROYING, 10);
        for (name, value) in crate::shell::OPTIONS {
            assert!((1..=5).contains(&value), "{name}");
        }
    }

    #[test]
    fn ioctl_numbers_match_the_c_macros() {
        // _IOC(dir, 0xD7, nr, sizeof): dir 1 = _IOW, 2 = _IOR, 3 = _IOWR.
        assert_eq!(IOC_INFO, 0x8040_d700);
        assert_eq!(IOC_CREATE_ID, 0xc018_d701);
        assert_eq!(IOC_DESTROY_ID, 0x4008_d702);
        assert_eq!(IOC_BIND, 0x4088_d703);
        assert_eq!(IOC_RESOLVE_ADDR, 0xc250_d704);
        assert_eq!(IOC_RESOLVE_ROUTE, 0xc150_d705);
        assert_eq!(IOC_LISTEN, 0x4008_d706);
        assert_eq!(IOC_CONNECT, 0xc260_d707);
        assert_eq!(IOC_ACCEPT, 0xc260_d708);
        assert_eq!(IOC_REJECT, 0x4108_d709);
        assert_eq!(IOC_DISCONNECT, 0xc150_d70a);
        assert_eq!(IOC_SET_OPTION, 0x4010_d70b);
        assert_eq!(IOC_QUERY, 0xc180_d70c);
        assert_eq!(IOC_GET_EVENT, 0xc148_d70d);
        assert_eq!(IOC_SEND, 0x4018_d70e);
        assert_eq!(IOC_RECV, 0xc018_d70f);
        assert_eq!(IOC_MR_REG, 0xc030_d710);
        assert_eq!(IOC_MR_DEREG, 0x4010_d711);
        assert_eq!(IOC_MR_WRITE, 0x4018_d712);
        assert_eq!(IOC_MR_READ, 0x4018_d713);
        assert_eq!(IOC_RDMA, 0x4028_d714);
        assert_eq!(IOC_UD_SEND, 0x4020_d715);
        assert_eq!(IOC_UD_RECV, 0xc0a8_d716);
        assert_eq!(IOC_GET_REQUEST, 0xc148_d717);
        assert_eq!(IOC_GETADDRINFO, 0xc160_d718);
        // 472 = 0x1d8, 136 = 0x88.
        assert_eq!(IOC_JOIN_MCAST, 0xc1d8_d719);
        assert_eq!(IOC_LEAVE_MCAST, 0x4088_d71a);
        assert_eq!(IOC_SEND_RECV, 0xc028_d71b);
    }

    #[test]
    fn state_names_follow_the_enum() {
        assert_eq!(state_name(rdma_cm_rs_state_RDMA_CM_RS_IDLE), "IDLE");
        assert_eq!(state_name(rdma_cm_rs_state_RDMA_CM_RS_CONNECT), "CONNECT");
        assert_eq!(state_name(rdma_cm_rs_state_RDMA_CM_RS_LISTEN), "LISTEN");
        assert_eq!(
            state_name(rdma_cm_rs_state_RDMA_CM_RS_DESTROYING),
            "DESTROYING"
        );
        assert_eq!(state_name(11), "UNKNOWN");
    }

    #[test]
    fn event_lines_name_the_ids() {
        let e = Event {
            id: 1,
            event: EventType::ConnectRequest,
            status: 0,
            new_id: 2,
            context: 0,
            private_data: b"hello".to_vec(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: 1,
            srq: 0,
            qp_num: 0x11,
            ud_qp_num: 0,
            ud_qkey: 0,
            ud_peer: 0,
        };
        let l = e.line("module");
        assert!(
            l.starts_with("module: event CONNECT_REQUEST id=1 new_id=2 status=0 "),
            "{l}"
        );
        assert!(l.ends_with("qp_num=0x11 private_data(5)=\"hello\""), "{l}");
    }

    #[test]
    fn sockaddr_round_trips() {
        for text in ["192.0.2.1:7471", "[2001:db8::1]:1", "0.0.0.0:0"] {
            let a: SocketAddr = text.parse().unwrap();
            assert_eq!(parse_sockaddr(&sockaddr(&a)), Some(a));
        }
        let b = sockaddr(&"192.0.2.1:7471".parse().unwrap());
        assert_eq!(&b.bytes[..8], &[2, 0, 0x1d, 0x2f, 192, 0, 2, 1]);
        assert!(b.bytes[8..].iter().all(|&x| x == 0));
    }

    #[test]
    fn param_encodes_private_data() {
        let p = Param::with_data(b"abc").to_abi();
        assert_eq!(p.private_data_len, 3);
        assert_eq!(&p.private_data[..3], b"abc");
        assert_eq!(p.rnr_retry_count, 7);
    }
}
