// SPDX-License-Identifier: GPL-2.0
//! A small safe layer over the real librdmacm (bindgen's bindings, module
//! [`ffi`]): event channels with timeouts, ids, and connections with a QP,
//! registered buffers and pre-posted receives.  The librdmacm side of
//! every test.

pub mod addrinfo;
mod ffi;
mod regions;
pub mod ud;

use crate::backoff::Backoff;
use crate::diag;
use crate::report::EventType;
use anyhow::{anyhow, bail, ensure, Context, Result};
use ffi::*;
use std::{
    marker::PhantomData,
    net::SocketAddr,
    ptr,
    time::{Duration, Instant},
};

/// Largest message, matching the module's receive buffers.
pub const MSG: usize = 4096;
/// Receives kept posted.
const DEPTH: usize = 16;
/// Sends one connection may have in flight ([`Conn::send_stream`]); the
/// module's window (`RDMA_CM_RS_SEND_WINDOW`).
pub const SEND_WINDOW: usize = 16;

/// The error of a call that failed with `errno` set, or an honest word
/// that it left errno alone.  Callers clear errno first ([`clear_errno`]):
/// a provider may fail without setting it (libsiw refuses a queue mapping
/// that way), and a stale value, such as the EAGAIN of the non-blocking
/// event channel's last read, would name a cause that is not one.
fn errno(what: &str) -> anyhow::Error {
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(0) {
        anyhow!("{what}: failed without setting errno (VERBS_LOG_FILE=/dev/stderr VERBS_LOG_LEVEL=3 shows the provider's reason)")
    } else {
        anyhow!("{what}: {e}")
    }
}

/// Sets errno to 0 before a verbs call (see [`errno`]).
fn clear_errno() {
    // SAFETY: __errno_location returns the calling thread's errno, which is
    // always valid to write.
    unsafe { *libc::__errno_location() = 0 };
}

fn check(r: i32, what: &str) -> Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(errno(what))
    }
}

/// `struct sockaddr_storage` for a std address.
fn sockaddr(addr: &SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: All-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in fits in sockaddr_storage.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast(), sin) };
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_in6 fits in sockaddr_storage.
            unsafe { ptr::write(ptr::addr_of_mut!(ss).cast(), sin6) };
        }
    }
    ss
}

/// librdmacm's `enum rdma_cm_event_type`, by name: bindgen makes it plain
/// constants (a Rust enum read from C memory would be undefined behaviour
/// for a value the header does not list); one it does not list stays a
/// number ([`EventType::Unknown`]).
fn event_type(e: rdma_cm_event_type::Type) -> EventType {
    use rdma_cm_event_type::*;
    match e {
        RDMA_CM_EVENT_ADDR_RESOLVED => EventType::AddrResolved,
        RDMA_CM_EVENT_ADDR_ERROR => EventType::AddrError,
        RDMA_CM_EVENT_ROUTE_RESOLVED => EventType::RouteResolved,
        RDMA_CM_EVENT_ROUTE_ERROR => EventType::RouteError,
        RDMA_CM_EVENT_CONNECT_REQUEST => EventType::ConnectRequest,
        RDMA_CM_EVENT_CONNECT_RESPONSE => EventType::ConnectResponse,
        RDMA_CM_EVENT_CONNECT_ERROR => EventType::ConnectError,
        RDMA_CM_EVENT_UNREACHABLE => EventType::Unreachable,
        RDMA_CM_EVENT_REJECTED => EventType::Rejected,
        RDMA_CM_EVENT_ESTABLISHED => EventType::Established,
        RDMA_CM_EVENT_DISCONNECTED => EventType::Disconnected,
        RDMA_CM_EVENT_DEVICE_REMOVAL => EventType::DeviceRemoval,
        RDMA_CM_EVENT_MULTICAST_JOIN => EventType::MulticastJoin,
        RDMA_CM_EVENT_MULTICAST_ERROR => EventType::MulticastError,
        RDMA_CM_EVENT_ADDR_CHANGE => EventType::AddrChange,
        RDMA_CM_EVENT_TIMEWAIT_EXIT => EventType::TimewaitExit,
        other => EventType::from(other),
    }
}

/// Which id an event is for, to tell connections apart: its identity only,
/// nothing to reach the id with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdKey(usize);

/// An id of `'ch`'s channel, destroyed on drop (listeners, ids being
/// resolved; a [`Conn`] owns one).  The borrow keeps the channel alive
/// until the id is gone, as `rdma_destroy_event_channel` requires.
#[derive(Debug)]
pub struct Id<'ch> {
    raw: *mut rdma_cm_id,
    _channel: PhantomData<&'ch Channel>,
}

impl Id<'_> {
    /// What this id's events carry as [`CmEvent::id`].
    pub fn key(&self) -> IdKey {
        IdKey(self.raw as usize)
    }
}

impl Drop for Id<'_> {
    fn drop(&mut self) {
        // SAFETY: `raw` is a live id that we own and destroy once.  Its QP, if
        // it has one, is destroyed first (a `Conn` does so before its `Id`
        // field drops); every event of it was acknowledged by
        // `Channel::next`, so rdma_destroy_id does not wait; its channel is
        // still open (`'ch`).
        unsafe { rdma_destroy_id(self.raw) };
    }
}

/// The new id of a connection request, neither accepted nor rejected yet:
/// [`ConnRequest::reject`] rejects it, [`Conn::new`] adopts it (to accept),
/// dropping it destroys it (the kernel then rejects the request).
#[derive(Debug)]
pub struct ConnRequest<'ch>(Id<'ch>);

impl<'ch> ConnRequest<'ch> {
    /// Rejects the request (librdmacm sends reason 28, consumer defined)
    /// and destroys its id.
    pub fn reject(self, data: &[u8]) -> Result<()> {
        // SAFETY: `self.0.raw` is the live id of a connection request, not
        // answered yet (`self` is consumed); librdmacm reads at most
        // `data.len()` bytes of `data`, during the call only.
        let r = unsafe { rdma_reject(self.0.raw, data.as_ptr().cast(), data.len() as u8) };
        check(r, "rdma_reject")
    }
}

impl<'ch> From<ConnRequest<'ch>> for Id<'ch> {
    fn from(r: ConnRequest<'ch>) -> Self {
        r.0
    }
}

/// An event copied out of librdmacm and acknowledged.
#[derive(Debug)]
pub struct CmEvent<'ch> {
    pub event: EventType,
    pub status: i32,
    /// The id the event is for (a request's new id for CONNECT_REQUEST).
    pub id: IdKey,
    /// CONNECT_REQUEST: the new id, owned by the event until taken.
    request: Option<ConnRequest<'ch>>,
    pub private_data: Vec<u8>,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub flow_control: u8,
    pub srq: u8,
    pub qp_num: u32,
    /// A UD id's ESTABLISHED (the SIDR reply): the remote QP and the path
    /// to it.  The connection fields above are meaningless on UD ids (their
    /// bytes are `param.ud`'s).
    pub ud: Option<ud::Remote>,
}

impl<'ch> CmEvent<'ch> {
    pub fn name(&self) -> &'static str {
        self.event.name()
    }

    /// `Ok` if this is a `want` event, else an error naming both.
    pub fn must_be(&self, want: EventType) -> Result<()> {
        if self.event != want {
            bail!(
                "expected {} but got {} (status {})",
                want.name(),
                self.name(),
                self.status
            );
        }
        Ok(())
    }

    /// A CONNECT_REQUEST's new id, to accept or reject.  Left in the event,
    /// it is destroyed with it (unless the event is kept).
    pub fn take_request(&mut self) -> Result<ConnRequest<'ch>> {
        self.request
            .take()
            .with_context(|| format!("{} event without a new id", self.name()))
    }

    /// The event as one line for people (`ids` names the id on this side).
    pub fn line(&self, who: &str, ids: &str) -> String {
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
        crate::report::event_line(who, self.event, ids, self.status, &c)
    }
}

/// An event channel (non-blocking, polled with a timeout).  Its ids borrow
/// it, so it is destroyed after them.
pub struct Channel {
    raw: *mut rdma_event_channel,
}

impl Channel {
    pub fn new() -> Result<Self> {
        // SAFETY: rdma_create_event_channel takes nothing; it returns NULL
        // (errno set) on failure, checked below.
        let raw = unsafe { rdma_create_event_channel() };
        if raw.is_null() {
            return Err(errno("rdma_create_event_channel"));
        }
        // SAFETY: `raw` is the live channel just made; `fd` is its open file
        // descriptor, whose status flags fcntl reads and sets.
        unsafe {
            let fd = (*raw).fd;
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
        Ok(Self { raw })
    }

    fn create_id(&self) -> Result<Id<'_>> {
        self.create_id_ps(rdma_port_space::RDMA_PS_TCP)
    }

    /// An id of port space `ps` (RDMA_PS_UDP makes a UD id).
    fn create_id_ps(&self, ps: rdma_port_space::Type) -> Result<Id<'_>> {
        let mut id = ptr::null_mut();
        // SAFETY: `self.raw` is a live channel; rdma_create_id stores the new
        // id in `id` on success (0), and takes a NULL context.
        let r = unsafe { rdma_create_id(self.raw, &mut id, ptr::null_mut(), ps) };
        check(r, "rdma_create_id")?;
        Ok(Id {
            raw: id,
            _channel: PhantomData,
        })
    }

    /// An id of port space `ps` with QP type UD on this channel, made the
    /// way librdmacm's public API allows for RDMA_PS_IB (whose ids
    /// `rdma_create_id` makes RC): `rdma_create_ep` with an `rdma_addrinfo`
    /// naming port space and QP type, which makes a synchronous id and
    /// binds it to `addr` (`passive`) or resolves address and route to
    /// `addr`; then `rdma_migrate_id` moves it onto this channel.
    fn create_ep_ud(
        &self,
        ps: rdma_port_space::Type,
        addr: &SocketAddr,
        passive: bool,
    ) -> Result<Id<'_>> {
        /// `RAI_PASSIVE` of `<rdma/rdma_cma.h>`.
        const RAI_PASSIVE: i32 = 1;
        let mut ss = sockaddr(addr);
        let len = match addr {
            SocketAddr::V4(_) => std::mem::size_of::<libc::sockaddr_in>(),
            SocketAddr::V6(_) => std::mem::size_of::<libc::sockaddr_in6>(),
        } as socklen_t;
        // SAFETY: All-zero is a valid `rdma_addrinfo` (null pointers, zero
        // lengths).
        let mut ai: rdma_addrinfo = unsafe { std::mem::zeroed() };
        ai.ai_family = i32::from(ss.ss_family);
        ai.ai_qp_type = ibv_qp_type::IBV_QPT_UD as i32;
        ai.ai_port_space = ps as i32;
        if passive {
            ai.ai_flags = RAI_PASSIVE;
            ai.ai_src_addr = ptr::addr_of_mut!(ss).cast();
            ai.ai_src_len = len;
        } else {
            ai.ai_dst_addr = ptr::addr_of_mut!(ss).cast();
            ai.ai_dst_len = len;
        }
        let mut id = ptr::null_mut();
        // SAFETY: `ai` names one address, `ss`, of length `len`, both live
        // across the call; no PD and no QP attributes (NULL): no QP is
        // made.  rdma_create_ep stores the new id in `id` on success (0).
        let r = unsafe { rdma_create_ep(&mut id, &mut ai, ptr::null_mut(), ptr::null_mut()) };
        check(r, "rdma_create_ep")?;
        let id = Id {
            raw: id,
            _channel: PhantomData,
        };
        // SAFETY: `id.raw` is the live synchronous id just made, with no
        // event outstanding; `self.raw` is a live channel, which outlives
        // the id (`'ch`).
        let r = unsafe { rdma_migrate_id(id.raw, self.raw) };
        check(r, "rdma_migrate_id")?;
        Ok(id)
    }

    /// The next event, or an error after `timeout`.
    pub fn next(&self, timeout: Duration) -> Result<CmEvent<'_>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(ev) = self.try_next() {
                return Ok(ev);
            }
            let now = Instant::now();
            if now >= deadline {
                bail!("no CM event within {timeout:?}");
            }
            let mut pfd = libc::pollfd {
                // SAFETY: `self.raw` is a live channel.
                fd: unsafe { (*self.raw).fd },
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = (deadline - now).as_millis().min(1000) as i32;
            // SAFETY: `pfd` is one valid pollfd, and nfds is 1.
            unsafe { libc::poll(&mut pfd, 1, ms.max(1)) };
        }
    }

    /// The event queued now, if any; never waits.
    pub fn try_next(&self) -> Option<CmEvent<'_>> {
        let mut ev = ptr::null_mut();
        // SAFETY: `self.raw` is a live channel and `ev` an out pointer;
        // its fd is O_NONBLOCK, so without an event queued the call
        // fails with EAGAIN instead of blocking.
        if unsafe { rdma_get_cm_event(self.raw, &mut ev) } == 0 {
            // SAFETY: On success `ev` points to an event that librdmacm
            // zeroed and filled, valid until rdma_ack_cm_event below, for
            // a live id of ours.  `param.conn` is the member in use on RC
            // ids, `param.ud` on UD ids; both begin with the private data
            // pointer and length, which librdmacm sets for either: NULL
            // or `private_data_len` bytes that live until the ack.
            let out = unsafe {
                let e = &*ev;
                let conn = &e.param.conn;
                let len = usize::from(conn.private_data_len);
                let data = if conn.private_data.is_null() || len == 0 {
                    Vec::new()
                } else {
                    std::slice::from_raw_parts(conn.private_data.cast::<u8>(), len).to_vec()
                };
                let event = event_type(e.event);
                let ud = ((*e.id).qp_type == ibv_qp_type::IBV_QPT_UD
                    && event == EventType::Established)
                    .then(|| ud::Remote::from_event(&e.param.ud));
                // A request's `id` is a new id librdmacm made on this
                // channel for us to own; other events name ids we own.
                let request = (event == EventType::ConnectRequest && !e.id.is_null()).then(|| {
                    ConnRequest(Id {
                        raw: e.id,
                        _channel: PhantomData,
                    })
                });
                CmEvent {
                    event,
                    status: e.status,
                    id: IdKey(e.id as usize),
                    request,
                    private_data: data,
                    responder_resources: conn.responder_resources,
                    initiator_depth: conn.initiator_depth,
                    retry_count: conn.retry_count,
                    rnr_retry_count: conn.rnr_retry_count,
                    flow_control: conn.flow_control,
                    srq: conn.srq,
                    qp_num: conn.qp_num,
                    ud,
                }
            };
            // SAFETY: `ev` came from rdma_get_cm_event and is acknowledged
            // once; what we kept of it was copied (the id pointer stays
            // valid: ids outlive their events).
            unsafe { rdma_ack_cm_event(ev) };
            return Some(out);
        }
        None
    }

    /// The next event, which must be `want`.
    pub fn expect(&self, want: EventType, timeout: Duration) -> Result<CmEvent<'_>> {
        let ev = self.next(timeout)?;
        ev.must_be(want)?;
        Ok(ev)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: `self.raw` is live and destroyed once.  Its ids borrow the
        // channel, so all are destroyed by now, and `next` acknowledged
        // every event it returned.
        unsafe { rdma_destroy_event_channel(self.raw) };
    }
}

/// Registers a receive and a send buffer on `pd` for local access: the
/// (receive, send) MRs of a connection or a UD QP.  On failure neither is
/// left registered.
///
/// # Safety
///
/// `pd` must be live, and both buffers must neither move nor be freed
/// until their MRs are deregistered.
unsafe fn register_buffers(
    pd: *mut ibv_pd,
    recv: &mut [u8],
    send: &mut [u8],
) -> Result<(*mut ibv_mr, *mut ibv_mr)> {
    let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
    clear_errno();
    // SAFETY: By the safety requirements; NULL on failure, checked.
    let (recv_mr, send_mr) = unsafe {
        (
            ibv_reg_mr(pd, recv.as_mut_ptr().cast(), recv.len(), access),
            ibv_reg_mr(pd, send.as_mut_ptr().cast(), send.len(), access),
        )
    };
    if recv_mr.is_null() || send_mr.is_null() {
        let err = errno("ibv_reg_mr (is `ulimit -l` unlimited?)");
        for mr in [recv_mr, send_mr] {
            if !mr.is_null() {
                // SAFETY: Registered just above, used by nothing yet.
                unsafe { ibv_dereg_mr(mr) };
            }
        }
        return Err(err);
    }
    Ok((recv_mr, send_mr))
}

/// `rdma_bind_addr` + `rdma_listen`: the listening id.
pub fn listen<'ch>(ch: &'ch Channel, addr: &SocketAddr, backlog: i32) -> Result<Id<'ch>> {
    listen_id(ch.create_id()?, addr, backlog)
}

/// Binds `id` to `addr` and listens on it.
fn listen_id<'ch>(id: Id<'ch>, addr: &SocketAddr, backlog: i32) -> Result<Id<'ch>> {
    let mut ss = sockaddr(addr);
    // SAFETY: `id.raw` is a live id; `ss` holds a sockaddr_in or
    // sockaddr_in6 (its family gives the length), read during the call.
    let r = unsafe { rdma_bind_addr(id.raw, ptr::addr_of_mut!(ss).cast()) };
    check(r, "rdma_bind_addr")?;
    // SAFETY: `id.raw` is a live id, bound just above.
    let r = unsafe { rdma_listen(id.raw, backlog) };
    check(r, "rdma_listen")?;
    Ok(id)
}

/// `id`, bound already, listening.
fn listen_bound(id: Id<'_>, backlog: i32) -> Result<Id<'_>> {
    // SAFETY: `id.raw` is a live, bound id.
    let r = unsafe { rdma_listen(id.raw, backlog) };
    check(r, "rdma_listen")?;
    Ok(id)
}

/// Connection parameters as librdmacm takes them.
#[derive(Clone, Debug)]
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
            flow_control: 1,
        }
    }

    fn raw(&self) -> rdma_conn_param {
        rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        }
    }
}

/// A connection: the id, its own protection domain, completion queues
/// (one for sends, one for receives), an RC QP, registered buffers, and
/// [`DEPTH`] receives of [`MSG`] bytes posted.
pub struct Conn<'ch> {
    /// Dropped after `drop` below has freed what uses it.
    id: Id<'ch>,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    /// Both CQs' completion channel when the thread that made the
    /// connection waits by sleeping ([`set_notified_waits`]), else NULL.
    channel: *mut ibv_comp_channel,
    has_qp: bool,
    recv_buf: Box<[u8]>,
    send_buf: Box<[u8]>,
    recv_mr: *mut ibv_mr,
    send_mr: *mut ibv_mr,
    /// Regions for RDMA, with their MRs.
    regions: Vec<(Box<[u8]>, *mut ibv_mr)>,
    /// The region [`Conn::send_stream`] sends from, once made.
    stream_region: Option<usize>,
    /// Type 2 memory windows, with the remote key of their last binding.
    windows: Vec<(*mut ibv_mw, u32)>,
}

/// The RDMA operations [`Conn::rdma`] posts.
#[derive(Clone, Copy, Debug)]
pub enum RdmaOp {
    Read,
    Write,
}

impl<'ch> Conn<'ch> {
    /// Takes ownership of `id` (bound to a device: a resolved route from
    /// [`resolve`], or a [`ConnRequest`]), creates its QP and posts the
    /// receives.  On error the id is destroyed.
    pub fn new(id: impl Into<Id<'ch>>) -> Result<Self> {
        Self::with_recv_depth(id, DEPTH)
    }

    /// [`Conn::new`] with `depth` receives posted instead of [`DEPTH`]: a
    /// receiver that must never answer a window of sends with an RNR NAK
    /// (the CM sets the RNR timer to its longest, 655 ms).
    pub fn with_recv_depth(id: impl Into<Id<'ch>>, depth: usize) -> Result<Self> {
        let mut conn = Self {
            id: id.into(),
            pd: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            channel: ptr::null_mut(),
            has_qp: false,
            recv_buf: vec![0u8; MSG * depth].into_boxed_slice(),
            send_buf: vec![0u8; MSG].into_boxed_slice(),
            recv_mr: ptr::null_mut(),
            send_mr: ptr::null_mut(),
            regions: Vec::new(),
            windows: Vec::new(),
            stream_region: None,
        };
        // On error `conn` is dropped, which frees what was made.
        let id = conn.id.raw;
        // SAFETY: `id` is a live id; `verbs` is its device's context, NULL
        // while it is bound to none (checked).
        let verbs = unsafe { (*id).verbs };
        if verbs.is_null() {
            bail!("the id is not bound to an RDMA device");
        }
        clear_errno();
        // SAFETY: `verbs` is the open context of the device the id is bound
        // to (librdmacm keeps it open); NULL on failure, checked below.
        conn.pd = unsafe { ibv_alloc_pd(verbs) };
        if conn.pd.is_null() {
            return Err(errno("ibv_alloc_pd"));
        }
        if NOTIFIED_WAITS.get() {
            clear_errno();
            // SAFETY: As above; NULL on failure, checked.
            conn.channel = unsafe { ibv_create_comp_channel(verbs) };
            if conn.channel.is_null() {
                return Err(errno("ibv_create_comp_channel"));
            }
        }
        clear_errno();
        // SAFETY: As above; no CQ context, the completion channel if any
        // (live until the CQs are destroyed: `drop`), completion vector 0,
        // which every device has.
        let send_depth = SEND_WINDOW as i32 + 8;
        let channel = conn.channel;
        // SAFETY: As above.
        conn.send_cq = unsafe { ibv_create_cq(verbs, send_depth, ptr::null_mut(), channel, 0) };
        let depth = depth as i32;
        // SAFETY: As above.
        conn.recv_cq = unsafe { ibv_create_cq(verbs, depth, ptr::null_mut(), channel, 0) };
        if conn.send_cq.is_null() || conn.recv_cq.is_null() {
            return Err(errno("ibv_create_cq"));
        }
        // SAFETY: ibv_qp_init_attr is pointers, integers and enums whose
        // all-zero value is valid (NULL, 0); the fields used are set below.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = conn.send_cq;
        attr.recv_cq = conn.recv_cq;
        // The send window and an RDMA operation or two.
        attr.cap.max_send_wr = SEND_WINDOW as u32 + 4;
        attr.cap.max_recv_wr = depth as u32;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 1;
        clear_errno();
        // SAFETY: `id` is live and without a QP; the PD and CQs were made on
        // its device's context; `attr` is read (and its `cap` written)
        // during the call only.
        let r = unsafe { rdma_create_qp(id, conn.pd, &mut attr) };
        check(r, "rdma_create_qp")?;
        conn.has_qp = true;
        // SAFETY: `conn.pd` is live; both buffers are boxed slices, which
        // do not move, freed only after their MRs are deregistered (drop).
        (conn.recv_mr, conn.send_mr) =
            unsafe { register_buffers(conn.pd, &mut conn.recv_buf, &mut conn.send_buf) }?;
        for i in 0..depth as usize {
            conn.post_recv(i)?;
        }
        Ok(conn)
    }

    /// The QP number librdmacm gave the connection.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: The id is live and has the QP made in `new`, which lives
        // until drop.
        unsafe { (*(*self.id.raw).qp).qp_num }
    }

    /// What the device reported asynchronously since the last call, read
    /// without waiting: each event's name and, for a QP's, its number
    /// (`QP_FATAL qp 17`).  The context, and so its events, is shared by
    /// every connection of the process on the device: another
    /// connection's events show up here too, with their QP numbers.
    pub fn async_events(&self) -> Vec<String> {
        let mut events = Vec::new();
        // SAFETY: The id is bound to a device (it has a QP), so `verbs` is
        // the live context librdmacm opened for it; `async_fd` is a field
        // it set at open and never changes.
        let (ctx, fd) = unsafe {
            let ctx = (*self.id.raw).verbs;
            (ctx, (*ctx).async_fd)
        };
        // SAFETY: fcntl on an fd this process owns (the context's); with
        // O_NONBLOCK, ibv_get_async_event fails with EAGAIN instead of
        // waiting when no event is queued.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return vec![format!("async fd: {}", std::io::Error::last_os_error())];
            }
        }
        loop {
            // SAFETY: Integers and a union of a pointer and integers, valid
            // all-zero; output space.
            let mut ev: ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: `ctx` is live; `ev` is written on success only.
            if unsafe { ibv_get_async_event(ctx, &mut ev) } != 0 {
                break;
            }
            use ibv_event_type::*;
            let qp_event = matches!(
                ev.event_type,
                IBV_EVENT_QP_FATAL
                    | IBV_EVENT_QP_REQ_ERR
                    | IBV_EVENT_QP_ACCESS_ERR
                    | IBV_EVENT_COMM_EST
                    | IBV_EVENT_SQ_DRAINED
                    | IBV_EVENT_PATH_MIG
                    | IBV_EVENT_PATH_MIG_ERR
                    | IBV_EVENT_QP_LAST_WQE_REACHED
            );
            // SAFETY: ibv_event_type_str returns a static string for any
            // value; for a QP event `element.qp` is the QP, which the
            // unacknowledged event keeps from being destroyed.
            let line = unsafe {
                let name = std::ffi::CStr::from_ptr(ibv_event_type_str(ev.event_type));
                let name = name.to_string_lossy();
                if qp_event {
                    format!("{name} qp {}", (*ev.element.qp).qp_num)
                } else {
                    name.into_owned()
                }
            };
            events.push(line);
            // SAFETY: `ev` was returned by ibv_get_async_event and is
            // acknowledged once.
            unsafe { ibv_ack_async_event(&mut ev) };
        }
        events
    }

    /// What a connection that failed says about itself, for an error
    /// message: its QP's state as the device reports it, the events the
    /// device reported (`async_events`) and the CM events `ch` has
    /// queued, none of them waited for.
    pub fn failure_report(&self, ch: &Channel) -> String {
        let qp_num = self.qp_num();
        // SAFETY: The QP is live until drop.
        let state = match unsafe { query_qp((*self.id.raw).qp, ibv_qp_attr_mask::IBV_QP_STATE) } {
            Ok(attr) => format!("state {}", attr.qp_state),
            Err(e) => format!("{e}"),
        };
        let cm: Vec<String> = std::iter::from_fn(|| ch.try_next())
            .map(|ev| format!("{} status {}", ev.name(), ev.status))
            .collect();
        format!(
            "QP {qp_num} {state}; device events [{}]; CM events [{}]",
            self.async_events().join(", "),
            cm.join(", ")
        )
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let mut sge = ibv_sge {
            // The slot lies inside the registered receive region.
            addr: self.recv_buf[slot * MSG..].as_ptr() as u64,
            length: MSG as u32,
            // SAFETY: `recv_mr` is live (registered in `new`, deregistered in
            // drop).
            lkey: unsafe { (*self.recv_mr).lkey },
        };
        let mut wr = ibv_recv_wr {
            wr_id: slot as u64,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: The id's QP is live; ibv_post_recv reads `wr` and `sge`
        // during the call only.  The slot's memory stays registered and
        // allocated while the QP may write it: drop destroys the QP before
        // it deregisters and frees the buffer.
        let r = unsafe { ibv_post_recv((*self.id.raw).qp, &mut wr, &mut bad) };
        if r != 0 {
            bail!("ibv_post_recv: {}", std::io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    /// `rdma_connect`, then the answer (ESTABLISHED, REJECTED, ...).
    pub fn connect(
        &self,
        param: &Param,
        ch: &'ch Channel,
        timeout: Duration,
    ) -> Result<CmEvent<'ch>> {
        self.start_connect(param)?;
        ch.next(timeout)
    }

    /// `rdma_connect` alone: the answer comes on the id's channel.
    pub fn start_connect(&self, param: &Param) -> Result<()> {
        self.rdma_connect(param)
            .map_err(|e| anyhow!("rdma_connect: {e}"))
    }

    /// [`Self::start_connect`], `Ok(false)` when `rdma_connect` itself
    /// failed with `ECONNREFUSED` or `ECONNRESET`: over iWARP it makes the
    /// TCP connection inside the call, so a port nobody listens on (or a
    /// listener destroyed meanwhile) is refused there, with no event (IB's
    /// CM answers with REJECTED).
    pub fn start_connect_unless_refused(&self, param: &Param) -> Result<bool> {
        match self.rdma_connect(param) {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ECONNREFUSED | libc::ECONNRESET)
                ) =>
            {
                Ok(false)
            }
            Err(e) => bail!("rdma_connect: {e}"),
        }
    }

    fn rdma_connect(&self, param: &Param) -> std::io::Result<()> {
        let mut raw = param.raw();
        // SAFETY: The id is live, with a QP; librdmacm reads `raw` and the
        // private data it points to (owned by `param`) during the call only.
        // A wrong state (no resolved route) is an error return.
        let r = unsafe { rdma_connect(self.id.raw, &mut raw) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    pub fn accept(&self, param: &Param) -> Result<()> {
        let mut raw = param.raw();
        // SAFETY: The id is live, with a QP; librdmacm reads `raw` and the
        // private data it points to during the call only.  An id that is not
        // a request's gets an error return.
        let r = unsafe { rdma_accept(self.id.raw, &mut raw) };
        check(r, "rdma_accept")
    }

    /// Destroys the QP and keeps the id, sending nothing: to the peer this
    /// side vanished (its packets find no QP and are dropped, none is
    /// acknowledged), while the CM still holds the connection.
    pub fn vanish(&mut self) {
        if self.has_qp {
            // SAFETY: The id is live with the QP `new` made; nothing of
            // this side posts to it any more, and `drop` sees `has_qp`
            // false.
            unsafe { rdma_destroy_qp(self.id.raw) };
            self.has_qp = false;
        }
    }

    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: The id is live; in a state that cannot disconnect,
        // rdma_disconnect returns an error.
        let r = unsafe { rdma_disconnect(self.id.raw) };
        check(r, "rdma_disconnect")
    }

    fn poll(cq: *mut ibv_cq, timeout: Duration) -> Result<ibv_wc> {
        let wc = Self::poll_any(cq, timeout)?;
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            bail!("work completion status {}", wc.status);
        }
        Ok(wc)
    }

    /// The completion `cq` (one of ours, live) holds now, if any: one poll.
    fn poll_once(cq: *mut ibv_cq) -> Result<Option<ibv_wc>> {
        // SAFETY: ibv_wc is integers and a union of integers, valid
        // all-zero; it is output space.
        let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
        // SAFETY: `cq` is a live CQ of this connection; `wc` has room for
        // the one completion asked for.
        match unsafe { ibv_poll_cq(cq, 1, &mut wc) } {
            0 => Ok(None),
            1 => Ok(Some(wc)),
            _ => bail!("ibv_poll_cq failed"),
        }
    }

    /// The next completion of `cq` (one of ours, live), whatever its status.
    fn poll_any(cq: *mut ibv_cq, timeout: Duration) -> Result<ibv_wc> {
        let deadline = Instant::now() + timeout;
        // SAFETY: `cq` is live; its channel is set at its creation.
        let channel = unsafe { (*cq).channel };
        if !channel.is_null() {
            return Self::wait_notified(cq, channel, deadline, timeout);
        }
        let busy = BUSY_POLL.get();
        let mut backoff = Backoff::new();
        for polls in 0u64.. {
            if let Some(wc) = Self::poll_once(cq)? {
                return Ok(wc);
            }
            // A busy poll reads the clock every 64th time only: where the
            // clocksource is an emulated device (a VM's HPET), a read costs
            // more than the poll.
            if (!busy || polls % 64 == 63) && Instant::now() >= deadline {
                bail!("no completion within {timeout:?}");
            }
            if busy {
                std::thread::yield_now();
            } else {
                backoff.pause();
            }
        }
        unreachable!("an unbounded range")
    }

    /// The next completion of `cq` (live, made with the completion channel
    /// `channel`), sleeping until the channel reports one: polls; arms the
    /// CQ and polls again (a completion between the first poll and the
    /// arming is not reported); sleeps in `poll(2)` on the channel's
    /// descriptor; reads and acknowledges the event, which may be the
    /// other CQ's of the channel.
    fn wait_notified(
        cq: *mut ibv_cq,
        channel: *mut ibv_comp_channel,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<ibv_wc> {
        loop {
            if let Some(wc) = Self::poll_once(cq)? {
                return Ok(wc);
            }
            // SAFETY: `cq` is live; any completion, solicited or not.
            if unsafe { ibv_req_notify_cq(cq, 0) } != 0 {
                bail!("ibv_req_notify_cq failed");
            }
            if let Some(wc) = Self::poll_once(cq)? {
                return Ok(wc);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no completion within {timeout:?}");
            }
            let mut pfd = libc::pollfd {
                // SAFETY: `channel` is live while its CQs are.
                fd: unsafe { (*channel).fd },
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: `pfd` is one valid pollfd for the call's duration.
            match unsafe { libc::poll(&mut pfd, 1, ms) } {
                0 => continue,
                r if r < 0 => {
                    let e = std::io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    bail!("poll of the completion channel: {e}");
                }
                _ => {}
            }
            let mut ev_cq: *mut ibv_cq = ptr::null_mut();
            let mut ctx: *mut std::ffi::c_void = ptr::null_mut();
            // SAFETY: `channel` is live and readable (poll said so): the
            // call does not block; it writes the two pointers.
            if unsafe { ibv_get_cq_event(channel, &mut ev_cq, &mut ctx) } != 0 {
                bail!("ibv_get_cq_event: {}", std::io::Error::last_os_error());
            }
            // SAFETY: `ev_cq` is the channel's CQ the event was for, live
            // (ours); one event read, one acknowledged.
            unsafe { ibv_ack_cq_events(ev_cq, 1) };
        }
    }

    /// One `IBV_WR_SEND`, waited for.
    pub fn send(&mut self, data: &[u8]) -> Result<()> {
        self.post_send(data)?;
        self.send_succeeded()?;
        Ok(())
    }

    /// One `IBV_WR_SEND`, waited for, that the peer may answer by closing
    /// the connection the moment it has the message: returns the status of
    /// the completion, which may be one a close explains and which does
    /// not mean the message was lost (siw, see the last echo of
    /// `agent::serve`): LOC_QP_OP_ERR or WR_FLUSH_ERR.  Any other error
    /// status is an error.  `stop` is called between polls until it
    /// returns true, which it does once it saw the peer's close and moved
    /// the QP to the error state: on rxe the message's ACK may never come
    /// (a receiver that closes as soon as it has the message can make rxe
    /// drop it, testing.rst "Debugging rxe"), and the send then ends
    /// flushed.  Without a completion within 5 s (or 5 s after `stop`),
    /// an error with the QP's state.
    pub fn send_before_close(
        &mut self,
        data: &[u8],
        mut stop: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<u32> {
        self.post_send(data)?;
        let mut deadline = Instant::now() + Duration::from_secs(5);
        let mut stopped = false;
        let mut backoff = Backoff::new();
        loop {
            if let Some(wc) = Self::poll_once(self.send_cq)? {
                return match wc.status {
                    ibv_wc_status::IBV_WC_SUCCESS
                    | ibv_wc_status::IBV_WC_LOC_QP_OP_ERR
                    | ibv_wc_status::IBV_WC_WR_FLUSH_ERR => Ok(wc.status),
                    status => bail!("work completion status {status}"),
                };
            }
            if !stopped && stop(self)? {
                stopped = true;
                deadline = Instant::now() + Duration::from_secs(5);
            }
            ensure!(
                Instant::now() < deadline,
                "send completion: no completion within 5s{} (QP {}; {})",
                if stopped { " of the close" } else { "" },
                self.qp_num(),
                diag::rdma_state(Some(self.qp_num())).join("; ")
            );
            backoff.pause();
        }
    }

    /// Sends `data` and returns the next received message, reaping the
    /// send's completion only after it: a round trip that does not wait for
    /// the send's ACK before it waits for the answer.
    pub fn send_then_recv(&mut self, data: &[u8], timeout: Duration) -> Result<Vec<u8>> {
        self.send_then_recv_inv(data, timeout)
            .map(|(answer, _)| answer)
    }

    /// [`Self::send_then_recv`] of the first `len` bytes of region `i`
    /// (made with [`Self::add_region`]): a message larger than the send
    /// buffer's [`MSG`], such as an NVMe command capsule with 4 KiB of
    /// in-capsule data behind its 64 bytes.
    pub fn send_region_then_recv(
        &mut self,
        i: usize,
        len: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>> {
        let (buf, mr) = &self.regions[i];
        ensure!(
            len <= buf.len(),
            "{len} bytes are more than region {i}'s {}",
            buf.len()
        );
        let addr = buf.as_ptr() as u64;
        // SAFETY: The region's MR is live until drop.
        let lkey = unsafe { (**mr).lkey };
        // SAFETY: The range lies in region `i`, registered as `lkey` on this
        // connection's PD, allocated and registered while the QP lives;
        // `&mut self` keeps it unwritten until the send's completion is
        // reaped below.
        unsafe { self.post_send_raw(addr, len, lkey, 1) }?;
        let wc = Self::poll(self.recv_cq, timeout).context("receive completion")?;
        let answer = self.take_received(wc)?;
        self.send_succeeded()?;
        Ok(answer)
    }

    /// [`Self::send_then_recv`], with the remote key of ours the answer
    /// invalidated (a SEND_WITH_INV), if it did.
    pub fn send_then_recv_inv(
        &mut self,
        data: &[u8],
        timeout: Duration,
    ) -> Result<(Vec<u8>, Option<u32>)> {
        self.post_send(data)?;
        let wc = Self::poll(self.recv_cq, timeout).context("receive completion")?;
        // rxe writes the kernel's IB_WC_WITH_INVALIDATE (1 << 2) into a
        // user CQ's completion (rxe_resp.c, do_complete), which librxe
        // copies as it is: libibverbs' IBV_WC_IP_CSUM_OK, where it has
        // IBV_WC_WITH_INV at 1 << 3.  Either bit says the member below
        // holds the invalidated key (which the caller compares).
        let with_inv = ibv_wc_flags::IBV_WC_WITH_INV | ibv_wc_flags::IBV_WC_IP_CSUM_OK;
        // On rxe either flag says the member holds the invalidated key;
        // elsewhere IBV_WC_IP_CSUM_OK does not, and the caller's comparison
        // with its key rejects what it holds.
        let invalidated = if wc.wc_flags & with_inv != 0 {
            // SAFETY: A u32, valid for any bits, in a completion zeroed and
            // then filled by the provider.
            Some(unsafe { wc.__bindgen_anon_1.invalidated_rkey })
        } else {
            None
        };
        let answer = self.take_received(wc)?;
        self.send_succeeded()?;
        Ok((answer, invalidated))
    }

    /// The next completion of the send CQ, within 5 s, which must be a
    /// success.
    fn send_succeeded(&self) -> Result<()> {
        let wc = self.send_completion()?;
        if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
            bail!("send completion: work completion status {}", wc.status);
        }
        Ok(())
    }

    /// The next completion of the send CQ, within 5 s, whatever its status.
    /// Without one, the error carries what the devices say of this QP and
    /// their counters ([`diag::rdma_state`]): on rxe, a send whose receiver
    /// went to the error state before the ACK left is never acknowledged
    /// (testing.rst, "Debugging rxe").
    fn send_completion(&self) -> Result<ibv_wc> {
        Self::poll_any(self.send_cq, Duration::from_secs(5)).map_err(|e| {
            let qp_num = self.qp_num();
            anyhow!(
                "send completion: {e} (QP {qp_num}; {})",
                diag::rdma_state(Some(qp_num)).join("; ")
            )
        })
    }

    /// Posts `count` SENDs of the send buffer's first `len` bytes back to
    /// back (at most the send queue's `SEND_WINDOW + 4`), then reaps their
    /// completions, whatever their status, until all came back or `stop`
    /// says the connection ended: `stop` (called between polls) returns
    /// true once it moved the QP to the error state, after which the rest
    /// flush.  Returns how many completed successfully (a post refused
    /// once the connection ended stops the burst).  A peer that
    /// disconnects mid-burst leaves the rest retrying for ever on rxe (a
    /// retry count of 7 is unlimited there): hence `stop`.
    pub fn flood(
        &mut self,
        count: usize,
        len: usize,
        mut stop: impl FnMut(&Self) -> Result<bool>,
    ) -> Result<usize> {
        ensure!(
            count <= SEND_WINDOW + 4 && len <= MSG,
            "flood of {count} x {len} bytes is over the send queue"
        );
        // SAFETY: `send_mr` is live (registered in `new`, deregistered in
        // drop).
        let lkey = unsafe { (*self.send_mr).lkey };
        let addr = self.send_buf.as_ptr() as u64;
        // A post may fail once the connection has ended (siw refuses posts
        // to a QP in the error state): what was posted is reaped.
        let mut posted = 0;
        while posted < count {
            // SAFETY: The send buffer is registered as `lkey` and stays
            // allocated and registered while the QP lives; nothing writes
            // it until every completion is reaped below (`&mut self`).
            if unsafe { self.post_send_raw(addr, len, lkey, posted as u64) }.is_err() {
                break;
            }
            posted += 1;
        }
        ensure!(posted > 0, "flood: the first send could not be posted");
        let (mut reaped, mut ok, mut stopped) = (0, 0, false);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut backoff = Backoff::new();
        while reaped < posted {
            if let Some(wc) = Self::poll_once(self.send_cq)? {
                reaped += 1;
                ok += usize::from(wc.status == ibv_wc_status::IBV_WC_SUCCESS);
                continue;
            }
            if !stopped {
                stopped = stop(self)?;
            }
            ensure!(
                Instant::now() < deadline,
                "flood: {reaped} of {posted} completions within 20 s ({})",
                diag::rdma_state(Some(self.qp_num())).join("; ")
            );
            backoff.pause();
        }
        Ok(ok)
    }

    /// Copies `data` into the send buffer and posts it, signaled.
    fn post_send(&mut self, data: &[u8]) -> Result<()> {
        if data.len() > MSG {
            bail!("message of {} bytes is over {MSG}", data.len());
        }
        self.send_buf[..data.len()].copy_from_slice(data);
        // SAFETY: `send_mr` is live (registered in `new`, deregistered in
        // drop).
        let lkey = unsafe { (*self.send_mr).lkey };
        let addr = self.send_buf.as_ptr() as u64;
        // SAFETY: The send buffer is registered as `lkey` and stays allocated
        // and registered while the QP lives; the callers poll the completion
        // before they write the buffer again (`&mut self`).
        unsafe { self.post_send_raw(addr, data.len(), lkey, 1) }
    }

    /// Posts one signaled SEND of `len` bytes at `addr`.
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be registered as `lkey` on this connection's
    /// PD and stay allocated, registered and unwritten until the send's
    /// completion is polled.
    unsafe fn post_send_raw(&mut self, addr: u64, len: usize, lkey: u32, wr_id: u64) -> Result<()> {
        let mut sge = ibv_sge {
            addr,
            length: len as u32,
            lkey,
        };
        // SAFETY: ibv_send_wr is pointers, integers and unions of integers,
        // all valid all-zero; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = ptr::null_mut();
        // SAFETY: The id's QP is live; ibv_post_send reads `wr` and `sge`
        // during the call only; the data stays as the caller promised.
        let r = unsafe { ibv_post_send((*self.id.raw).qp, &mut wr, &mut bad) };
        if r != 0 {
            bail!("ibv_post_send: {}", std::io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    /// Sends `count` messages of `data`, up to `window` (at most
    /// [`SEND_WINDOW`]) in flight, each copied into a slot of a buffer
    /// registered at the first call (a region of this connection); returns
    /// once every one completed.
    pub fn send_stream(&mut self, data: &[u8], count: usize, window: usize) -> Result<()> {
        if data.len() > MSG || !(1..=SEND_WINDOW).contains(&window) {
            bail!("send_stream of {} bytes, window {window}", data.len());
        }
        let region = match self.stream_region {
            Some(r) => r,
            None => {
                let r = self.add_region(&vec![0u8; MSG * SEND_WINDOW], false, false)?;
                self.stream_region = Some(r);
                r
            }
        };
        // SAFETY: The region's MR is live until drop.
        let lkey = unsafe { (*self.regions[region].1).lkey };
        let (mut posted, mut completed) = (0usize, 0usize);
        while completed < count {
            if posted < count && posted - completed < window {
                let slot = posted % window;
                let buf = &mut self.regions[region].0[slot * MSG..slot * MSG + data.len()];
                buf.copy_from_slice(data);
                let addr = buf.as_ptr() as u64;
                // SAFETY: The slot lies in the registered region; it is
                // written again only `window` posts later, after this send's
                // completion was polled (sends complete in order).
                unsafe { self.post_send_raw(addr, data.len(), lkey, slot as u64) }?;
                posted += 1;
            } else {
                Self::poll(self.send_cq, Duration::from_secs(5))
                    .with_context(|| format!("completion of send {}", completed + 1))?;
                completed += 1;
            }
        }
        Ok(())
    }

    /// The next received message (its receive is posted again).
    pub fn recv(&mut self, timeout: Duration) -> Result<Vec<u8>> {
        let wc = Self::poll(self.recv_cq, timeout).context("receive completion")?;
        self.take_received(wc)
    }

    /// The message received by now, if any (one poll of the receive CQ);
    /// a receive completed in error is an error.
    pub fn try_recv(&mut self) -> Result<Option<Vec<u8>>> {
        match Self::poll_once(self.recv_cq)? {
            None => Ok(None),
            Some(wc) if wc.status == ibv_wc_status::IBV_WC_SUCCESS => {
                self.take_received(wc).map(Some)
            }
            Some(wc) => bail!("receive completion status {}", wc.status),
        }
    }

    /// The message of the receive completion `wc`, its receive posted again.
    fn take_received(&mut self, wc: ibv_wc) -> Result<Vec<u8>> {
        let slot = wc.wr_id as usize;
        let data = self.recv_buf[slot * MSG..slot * MSG + wc.byte_len as usize].to_vec();
        self.post_recv(slot)?;
        Ok(data)
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        // Users go before what they use: the memory windows (a bound type 2
        // window holds the QP and its region: rxe's `rxe_do_bind_mw` takes
        // both, and the QP's destruction would wait for it), the QP (made in
        // `new` when `has_qp`), then the MRs and CQs no QP uses any more,
        // then the PD nothing of which is left.  The id goes after this,
        // with the `id` field.
        // SAFETY: Each object is live and destroyed once, in that order;
        // NULL ones were never made.
        unsafe {
            for (mw, _) in self.windows.drain(..) {
                ibv_dealloc_mw(mw);
            }
            if self.has_qp {
                rdma_destroy_qp(self.id.raw);
            }
            for (_, mr) in self.regions.drain(..) {
                ibv_dereg_mr(mr);
            }
            for mr in [self.recv_mr, self.send_mr] {
                if !mr.is_null() {
                    ibv_dereg_mr(mr);
                }
            }
            for cq in [self.send_cq, self.recv_cq] {
                if !cq.is_null() {
                    ibv_destroy_cq(cq);
                }
            }
            // After its CQs, whose every event read was acknowledged.
            if !self.channel.is_null() {
                ibv_destroy_comp_channel(self.channel);
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
        }
    }
}

thread_local! {
    /// Whether this thread's completion waits spin (see [`set_busy_poll`]).
    static BUSY_POLL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether the connections this thread makes sleep in their waits
    /// (see [`set_notified_waits`]).
    static NOTIFIED_WAITS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `ibv_query_qp` of the attributes in `mask`.
///
/// # Safety
///
/// `qp` is a live QP.
unsafe fn query_qp(qp: *mut ibv_qp, mask: ibv_qp_attr_mask::Type) -> Result<ibv_qp_attr> {
    // SAFETY: Both are plain integers, structs and unions of them, valid
    // all-zero; they are output space.
    let (mut attr, mut init): (ibv_qp_attr, ibv_qp_init_attr) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: `qp` is live (the caller's promise); the call writes `attr`
    // and `init` only.
    match unsafe { ibv_query_qp(qp, &mut attr, mask as i32, &mut init) } {
        0 => Ok(attr),
        r => bail!("ibv_query_qp: {}", std::io::Error::from_raw_os_error(r)),
    }
}

/// Makes the calling thread's completion waits ([`Conn::send`],
/// [`Conn::recv`], [`Conn::rdma`]) poll the CQ in a loop that yields the
/// CPU between polls, as perftest does, instead of sleeping between polls
/// (the default, [`Backoff`]): the benchmark's librdmacm peers.
pub fn set_busy_poll(on: bool) {
    BUSY_POLL.set(on);
}

/// Makes the connections the calling thread makes from now on sleep in
/// their completion waits until the device notifies a completion (a
/// completion channel, `ibv_req_notify_cq`, `ibv_get_cq_event`), as the
/// module's ids without `RDMA_CM_RS_ID_BUSY_POLL` do: the benchmark's
/// librdmacm side with sleeping waits.
pub fn set_notified_waits(on: bool) {
    NOTIFIED_WAITS.set(on);
}

/// A new id on `ch` (no address yet), for callers that time each step.
pub fn create_id(ch: &Channel) -> Result<Id<'_>> {
    ch.create_id()
}

/// `rdma_resolve_addr` of `id` to `dst`, then its event, which must be
/// ADDR_RESOLVED.
pub fn resolve_addr(ch: &Channel, id: &Id<'_>, dst: &SocketAddr, timeout: Duration) -> Result<()> {
    start_resolve_addr(id, dst, timeout)?;
    ch.expect(EventType::AddrResolved, timeout)?;
    Ok(())
}

/// `rdma_resolve_addr` alone: its event comes on the id's channel.
pub fn start_resolve_addr(id: &Id<'_>, dst: &SocketAddr, timeout: Duration) -> Result<()> {
    let mut ss = sockaddr(dst);
    // SAFETY: `id.raw` is a live id; no source address (NULL); `ss` holds a
    // sockaddr_in or sockaddr_in6, read during the call only.
    let r = unsafe {
        rdma_resolve_addr(
            id.raw,
            ptr::null_mut(),
            ptr::addr_of_mut!(ss).cast(),
            timeout.as_millis() as i32,
        )
    };
    check(r, "rdma_resolve_addr")
}

/// `rdma_resolve_route` of `id` (its address resolved), then its event,
/// which must be ROUTE_RESOLVED.
pub fn resolve_route(ch: &Channel, id: &Id<'_>, timeout: Duration) -> Result<()> {
    start_resolve_route(id, timeout)?;
    ch.expect(EventType::RouteResolved, timeout)?;
    Ok(())
}

/// `rdma_resolve_route` alone: its event comes on the id's channel.
pub fn start_resolve_route(id: &Id<'_>, timeout: Duration) -> Result<()> {
    // SAFETY: `id.raw` is a live id; an id whose address is not resolved
    // gets an error return.
    let r = unsafe { rdma_resolve_route(id.raw, timeout.as_millis() as i32) };
    check(r, "rdma_resolve_route")
}

/// Client side up to a resolved route: returns the id (no QP yet).
pub fn resolve<'ch>(ch: &'ch Channel, dst: &SocketAddr, timeout: Duration) -> Result<Id<'ch>> {
    resolve_logged(ch, dst, timeout, &mut |_| {})
}

/// [`resolve`], handing each event to `log` as it comes.
pub fn resolve_logged<'ch>(
    ch: &'ch Channel,
    dst: &SocketAddr,
    timeout: Duration,
    log: &mut dyn FnMut(&CmEvent<'_>),
) -> Result<Id<'ch>> {
    resolve_id(ch, ch.create_id()?, dst, timeout, log)
}

/// Resolves `id`'s address and route to `dst` (`id` is destroyed on an
/// error).
fn resolve_id<'ch>(
    ch: &'ch Channel,
    id: Id<'ch>,
    dst: &SocketAddr,
    timeout: Duration,
    log: &mut dyn FnMut(&CmEvent<'_>),
) -> Result<Id<'ch>> {
    let mut ss = sockaddr(dst);
    let ms = timeout.as_millis() as i32;
    let mut expect = |want| -> Result<()> {
        let ev = ch.next(timeout)?;
        log(&ev);
        ev.must_be(want)?;
        Ok(())
    };
    // SAFETY: `id.raw` is a live id; no source address (NULL); `ss` holds a
    // sockaddr_in or sockaddr_in6, read during the call only.
    let r = unsafe { rdma_resolve_addr(id.raw, ptr::null_mut(), ptr::addr_of_mut!(ss).cast(), ms) };
    check(r, "rdma_resolve_addr")?;
    expect(EventType::AddrResolved)?;
    // SAFETY: `id.raw` is a live id, its address resolved.
    let r = unsafe { rdma_resolve_route(id.raw, ms) };
    check(r, "rdma_resolve_route")?;
    expect(EventType::RouteResolved)?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// librdmacm's event numbers are the kernel's, which the module's ABI
    /// and [`EventType::from`] use: one enum serves both sides.
    #[test]
    fn librdmacm_events_are_the_kernels() {
        for n in 0..32 {
            assert_eq!(event_type(n), EventType::from(n), "{n}");
        }
        assert_eq!(
            event_type(rdma_cm_event_type::RDMA_CM_EVENT_TIMEWAIT_EXIT).name(),
            "TIMEWAIT_EXIT"
        );
    }
}
