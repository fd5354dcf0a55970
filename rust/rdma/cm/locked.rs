// SPDX-License-Identifier: GPL-2.0

//! [`LockedId`]: an id whose handler mutex is held, the only type with CM
//! operations, and the QP an id owns.

use super::{
    groups::Groups,
    port_space::PortSpace,
    qp_slot::{destroy_id_qp, QpSlot},
};
use crate::rdma::{
    addr::{SockaddrBuf, SocketAddr},
    ah::{Ah, UdDest},
    bindings,
    callback::in_completion_handler,
    conn_param::{ConnParam, PrivateDataUse, MAX_RETRY_COUNT},
    device::{Device, Transport},
    event::{Event, EventType},
    owner::Owner,
    pd::Pd,
    verbs::{CommEstNotify, CompletionHandler, Cq, Qp, QpCaps, QpQueues, QpShutdown, QpType, Srq},
};
use core::{
    marker::PhantomData,
    ptr::{self, NonNull},
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{
    prelude::*,
    sync::{aref::ARef, Arc, Mutex, MutexGuard},
    time::Delta,
};

/// An id whose handler mutex is held: the CM operations live here.
///
/// # Invariants
///
/// `raw` is live, of port space `ps` and QP type `qp_type`, and its
/// `handler_mutex` is held for `'a`; `state` is its [`super::CmId`]'s, if
/// it has one yet, and `owner` the owner of that id (or of the listener of
/// a connection request).
pub struct LockedId<'a> {
    raw: NonNull<bindings::rdma_cm_id>,
    ps: PortSpace,
    qp_type: QpType,
    request_param: Option<ConnParam>,
    state: Option<IdState<'a>>,
    owner: &'a Owner,
    _lock: PhantomData<&'a ()>,
}

/// What an owned id lends its [`LockedId`] besides the C id: the state its
/// operations keep (a connection request's id has no `CmId` yet).
#[derive(Clone, Copy)]
pub(super) struct IdState<'a> {
    pub(super) answered: &'a AtomicBool,
    pub(super) iwarp_cm_holds_qp: &'a AtomicBool,
    pub(super) qp_slot: &'a Mutex<QpSlot>,
    /// The `CmId`'s lock of the calls made without the handler mutex.
    pub(super) unlocked_call: &'a Mutex<()>,
    /// The multicast groups joined.
    pub(super) groups: &'a Mutex<Groups>,
}

impl<'a> LockedId<'a> {
    /// A locked view of `raw`.
    ///
    /// # Safety
    ///
    /// `raw` is a live id of port space `ps` and QP type `qp_type` whose
    /// handler mutex is held for `'a`; `state` is the state of its
    /// `CmId`, if it has one.
    pub(super) unsafe fn new(
        raw: NonNull<bindings::rdma_cm_id>,
        ps: PortSpace,
        qp_type: QpType,
        request_param: Option<ConnParam>,
        state: Option<IdState<'a>>,
        owner: &'a Owner,
    ) -> Self {
        // INVARIANT: By the safety requirements.
        Self {
            raw,
            ps,
            qp_type,
            request_param,
            state,
            owner,
            _lock: PhantomData,
        }
    }

    /// The owner of the id (for a connection request's new id, of its
    /// listener): what a handler makes the id's PD and CQs for.
    pub fn owner(&self) -> &'a Owner {
        self.owner
    }
}

pub(super) fn to_result(ret: i32) -> Result {
    kernel::error::to_result(ret)
}

/// The longest address or route resolution a caller may ask for, as
/// librdmacm's tools bound it.
pub const MAX_RESOLVE_TIMEOUT: Delta = Delta::from_millis(60_000);

/// A resolution timeout in the CM's milliseconds: 1 ms to
/// [`MAX_RESOLVE_TIMEOUT`], else `EINVAL`.
fn resolve_timeout_ms(timeout: Delta) -> Result<usize> {
    let ms = timeout.as_millis();
    if ms < 1 || ms > MAX_RESOLVE_TIMEOUT.as_millis() {
        return Err(EINVAL);
    }
    usize::try_from(ms).map_err(|_| EINVAL)
}

impl<'a> LockedId<'a> {
    pub(super) fn as_ptr(&self) -> *mut bindings::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// Excludes the owner's calls made without the handler mutex
    /// ([`CmId::disconnect`], [`CmId::listen`]) for as long as the guard
    /// lives: for a CM call that may change the id's CM state under them.
    /// `EBUSY` while one runs (inside `with_lock` none can: they take the
    /// owner's `calls` too).
    pub(super) fn exclude_unlocked_calls(&self) -> Result<Option<MutexGuard<'a, ()>>> {
        match self.state.map(|o| o.unlocked_call) {
            None => Ok(None),
            Some(lock) => lock.try_lock().map(Some).ok_or(EBUSY),
        }
    }

    /// Reads a field of the id that C may write meanwhile (the address
    /// resolver fills `route`, the CM sets `device` and `port_num` when it
    /// binds): a volatile copy, as C's `READ_ONCE`, never a reference.
    fn read<T: Copy>(&self, field: impl FnOnce(*mut bindings::rdma_cm_id) -> *const T) -> T {
        // SAFETY: By the type invariants the id is live while `self` is;
        // `field` projects to one of its fields, which is plain data.
        unsafe { ptr::read_volatile(field(self.as_ptr())) }
    }

    /// The port space.
    pub fn port_space(&self) -> PortSpace {
        self.ps
    }

    /// The QP type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// The port the id is bound to, 0 if none.
    pub fn port_num(&self) -> u32 {
        // SAFETY: A field of the live id.
        self.read(|id| unsafe { &raw const (*id).port_num })
    }

    fn device_ptr(&self) -> *mut bindings::ib_device {
        // SAFETY: A field of the live id.
        self.read(|id| unsafe { &raw const (*id).device })
    }

    /// The number of the id's QP, if it has one.
    pub fn qp_num(&self) -> Option<u32> {
        match &*self.state.map(|o| o.qp_slot)?.lock() {
            QpSlot::Live(qp) => Some(qp.qp_num()),
            _ => None,
        }
    }

    /// The RDMA device the id is bound to: `ENODEV` if it is bound to none
    /// (or the device is going away).
    pub fn device(&self) -> Result<ARef<Device>> {
        // SAFETY: A bound id's device stays valid until the id is destroyed
        // (the CM holds it); the id is live.
        unsafe { Device::try_get(self.device_ptr()) }
    }

    /// The source address (`rdma_get_local_addr`), if set.
    pub fn src_addr(&self) -> Option<SocketAddr> {
        // SAFETY: A field of the live id.
        sockaddr_of(&self.read(|id| unsafe { &raw const (*id).route.addr.src_addr }))
    }

    /// The destination address (`rdma_get_peer_addr`), if set.
    ///
    /// Binding fills the destination's family with a wildcard address and
    /// port 0; that is reported as no destination.
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        // SAFETY: A field of the live id.
        let dst = self.read(|id| unsafe { &raw const (*id).route.addr.dst_addr });
        sockaddr_of(&dst).filter(|a| !(a.is_any() && a.port() == 0))
    }

    /// Binds to a local address (`rdma_bind_addr`); port 0 picks one.
    pub fn bind(&self, addr: &SocketAddr) -> Result {
        let _excluded = self.exclude_unlocked_calls()?;
        let mut buf = addr.to_sockaddr();
        // SAFETY: `buf` is a valid, aligned sockaddr for the call's
        // duration; the id is live.
        to_result(unsafe { bindings::rdma_bind_addr(self.as_ptr(), (&raw mut buf).cast()) })
    }

    /// Starts address resolution (`rdma_resolve_addr`); completes with
    /// ADDR_RESOLVED or ADDR_ERROR.  `timeout` must be 1 ms to 60 s.
    pub fn resolve_addr(
        &self,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout: Delta,
    ) -> Result {
        let timeout_ms = resolve_timeout_ms(timeout)?;
        let _excluded = self.exclude_unlocked_calls()?;
        if let Some(src) = src {
            if src.family() != dst.family() {
                return Err(EINVAL);
            }
        }
        let mut dst_buf = dst.to_sockaddr();
        let mut src_buf = src.map(SocketAddr::to_sockaddr).unwrap_or_default();
        let src_ptr: *mut bindings::sockaddr = if src.is_some() {
            (&raw mut src_buf).cast()
        } else {
            ptr::null_mut()
        };
        // SAFETY: Both buffers are valid sockaddrs for the call's duration
        // (the CM copies them); the id is live.
        to_result(unsafe {
            bindings::rdma_resolve_addr(
                self.as_ptr(),
                src_ptr,
                (&raw mut dst_buf).cast(),
                timeout_ms,
            )
        })
    }

    /// Starts route resolution (`rdma_resolve_route`); completes with
    /// ROUTE_RESOLVED or ROUTE_ERROR.  `timeout` must be 1 ms to 60 s.
    pub fn resolve_route(&self, timeout: Delta) -> Result {
        let timeout_ms = resolve_timeout_ms(timeout)?;
        let _excluded = self.exclude_unlocked_calls()?;
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_resolve_route(self.as_ptr(), timeout_ms) })
    }

    /// Checks `param` for `usage` against the bound device's limits.
    pub fn check_param(&self, param: &ConnParam, usage: PrivateDataUse) -> Result {
        let dev = self.device().map_err(|_| EINVAL)?;
        param.check(usage, &dev)
    }

    /// The private data `usage` allows on the bound device
    /// ([`PrivateDataUse::limit_on`]); `EINVAL` before the id has one.
    fn private_data_limit(&self, usage: PrivateDataUse) -> Result<usize> {
        usage.limit_on(&*self.device().map_err(|_| EINVAL)?)
    }

    /// The transport of the bound device; `EINVAL` before the id has one.
    pub fn transport(&self) -> Result<Transport> {
        Ok(self.device().map_err(|_| EINVAL)?.transport())
    }

    /// The groups of an owned id (`None` for a request's id not adopted).
    pub(super) fn state_groups(&self) -> Option<&'a Mutex<Groups>> {
        self.state.map(|o| o.groups)
    }

    /// The id's live QP, if it has one.
    pub(super) fn live_qp(&self) -> Option<Arc<dyn QpShutdown>> {
        match &*self.state?.qp_slot.lock() {
            QpSlot::Live(qp) => Some(qp.clone()),
            _ => None,
        }
    }

    /// Whether the id's own QP is live: the CM connects that one and no
    /// other (a QP number passed to it would be looked up device-wide by
    /// the iWARP CM, whoever owns that QP).
    fn has_live_qp(&self) -> bool {
        self.state
            .map(|o| o.qp_slot)
            .is_some_and(|slot| matches!(*slot.lock(), QpSlot::Live(_)))
    }

    /// Connects (`rdma_connect_locked`): after ROUTE_RESOLVED.  On a UD id
    /// this is the SIDR lookup of the remote QP (up to 180 bytes of private
    /// data), whose ESTABLISHED event [`Self::ud_dest`] turns into a
    /// destination; on an RC id a connection request (up to 56).  Either
    /// way for the id's QP, which must exist (`ENOTCONN` otherwise, see
    /// [`Self::create_qp`]).
    pub fn connect(&self, param: &ConnParam) -> Result {
        if !self.has_live_qp() {
            return Err(ENOTCONN);
        }
        let usage = match self.qp_type {
            QpType::Ud => PrivateDataUse::ConnectUd,
            QpType::Rc => PrivateDataUse::ConnectRc,
        };
        self.check_param(param, usage)?;
        let _excluded = self.exclude_unlocked_calls()?;
        let iwarp_rc = self.is_iwarp_rc()?;
        let mut raw = param.as_raw();
        // SAFETY: The handler mutex is held (type invariants), as
        // `rdma_connect_locked` requires; `raw` and the private data it
        // points into (inside `param`) live across the call, which copies
        // them.
        to_result(unsafe { bindings::rdma_connect_locked(self.as_ptr(), &mut raw) })?;
        self.note_iwarp_cm_holds_qp(iwarp_rc);
        Ok(())
    }

    /// Whether the id is an RC id on an iWARP device, whose CM takes a
    /// reference on the QP at a connect or accept (`EINVAL` if the id has
    /// no device yet: neither has a QP to connect).
    fn is_iwarp_rc(&self) -> Result<bool> {
        Ok(self.qp_type == QpType::Rc && self.transport()? == Transport::Iwarp)
    }

    /// After a connect or accept that succeeded on an iWARP RC id: the CM
    /// took a reference on the QP (`iw_cm_connect`, `iw_cm_accept`), which
    /// it drops before reporting the connection's end or the connect's
    /// failure.
    fn note_iwarp_cm_holds_qp(&self, iwarp_rc: bool) {
        if let (true, Some(holds)) = (iwarp_rc, self.state.map(|o| o.iwarp_cm_holds_qp)) {
            holds.store(true, Ordering::Release);
        }
    }

    /// The parameters `rdma_accept(3)` uses when given none: the request's
    /// values adjusted down to the local device.  The IB CM already reports
    /// a request from the receiver's side (its responder resources are the
    /// peer's initiator depth, `cm_format_req_event`), so they are used as
    /// they are.
    pub fn request_accept_param(&self) -> Result<ConnParam> {
        let req = self.request_param.ok_or(EINVAL)?;
        let dev = self.device().map_err(|_| EINVAL)?;
        let (req_rr, req_id) = req.rd_atom();
        let clamp = |v: u8, max: u32| u8::try_from(u32::from(v).min(max)).unwrap_or(u8::MAX);
        ConnParam::new()
            .responder_resources(clamp(req_rr, dev.max_qp_rd_atom()))
            .initiator_depth(clamp(req_id, dev.max_qp_init_rd_atom()))
            .flow_control(true)
            .rnr_retry_count(MAX_RETRY_COUNT)
    }

    /// Accepts a connection request (`rdma_accept`) with the id's QP, which
    /// must exist (`ENOTCONN`: adopt the request's id and create it first);
    /// `None` uses [`Self::request_accept_param`].  On a UD id this is the
    /// SIDR reply: it names the id's UD QP and its Q_Key, and carries up to
    /// 136 bytes of private data (the other parameters mean nothing to
    /// SIDR); no event follows on this side.
    ///
    /// `EINVAL` on an id no connection request made, or whose request was
    /// answered already: the CM would fail either, and move the id's QP to
    /// the error state on its way out.
    pub fn accept(&self, param: Option<&ConnParam>) -> Result {
        self.check_unanswered()?;
        let _excluded = self.exclude_unlocked_calls()?;
        if !self.has_live_qp() {
            return Err(ENOTCONN);
        }
        if self.qp_type == QpType::Ud {
            let param = param.copied().unwrap_or_default();
            param
                .data()
                .check(self.private_data_limit(PrivateDataUse::AcceptUd)?)?;
            let mut raw = param.as_raw();
            // The layer's own QP, which the CM does not hold (see
            // `ud_qp`): the reply names it.
            raw.qp_num = self.live_qp().ok_or(ENOTCONN)?.qp_num();
            // A zero `qkey` answers with the port space's default Q_Key,
            // the one the QP was created with.
            // SAFETY: Handler mutex held (type invariants); `raw` outlives the call.
            to_result(unsafe { bindings::rdma_accept(self.as_ptr(), &mut raw) })?;
            self.mark_answered();
            return Ok(());
        }
        let defaults;
        let param = match param {
            Some(p) => p,
            None => {
                defaults = self.request_accept_param()?;
                &defaults
            }
        };
        self.check_param(param, PrivateDataUse::AcceptRc)?;
        let iwarp_rc = self.is_iwarp_rc()?;
        let mut raw = param.as_raw();
        // SAFETY: The handler mutex is held (type invariants), as
        // `rdma_accept` asserts; `raw` outlives the call.
        to_result(unsafe { bindings::rdma_accept(self.as_ptr(), &mut raw) })?;
        self.mark_answered();
        self.note_iwarp_cm_holds_qp(iwarp_rc);
        Ok(())
    }

    /// `EINVAL` unless the id was made by a connection request that was
    /// not answered yet (the answered flag is written under the handler
    /// mutex, which is held).
    fn check_unanswered(&self) -> Result {
        if self.request_param.is_none()
            || self
                .state
                .map(|o| o.answered)
                .is_some_and(|a| a.load(Ordering::Acquire))
        {
            return Err(EINVAL);
        }
        Ok(())
    }

    fn mark_answered(&self) {
        if let Some(answered) = self.state.map(|o| o.answered) {
            answered.store(true, Ordering::Release);
        }
    }

    /// Rejects a connection request (`rdma_reject`) with an IB CM reason
    /// (0 means consumer defined, 28) and up to 148 bytes of private data,
    /// 136 on a UD id (a SIDR reply carries the rejection, with no reason:
    /// the CM does not send it).  On iWARP up to 252 bytes
    /// ([`PrivateDataUse::limit_on`]) travel in an MPA
    /// reply with the reject bit, and no reason (the peer sees
    /// `ECONNREFUSED`).  `EINVAL` as [`Self::accept`] when there is no
    /// request to answer.
    pub fn reject(&self, reason: u8, data: &[u8]) -> Result {
        self.check_unanswered()?;
        let _excluded = self.exclude_unlocked_calls()?;
        let usage = match self.qp_type {
            QpType::Rc => PrivateDataUse::Reject,
            QpType::Ud => PrivateDataUse::AcceptUd,
        };
        let limit = self.private_data_limit(usage)?;
        if data.len() > limit {
            return Err(EINVAL);
        }
        let reason = if reason == 0 {
            bindings::ib_cm_rej_reason_IB_CM_REJ_CONSUMER_DEFINED as u8
        } else {
            reason
        };
        // SAFETY: `data` is readable for its length during the call; the id
        // is live and locked.
        to_result(unsafe {
            bindings::rdma_reject(
                self.as_ptr(),
                if data.is_empty() {
                    ptr::null()
                } else {
                    data.as_ptr().cast()
                },
                data.len() as u8,
                reason,
            )
        })?;
        self.mark_answered();
        Ok(())
    }

    /// The CM's text for a reject reason on this id's transport
    /// (`rdma_reject_msg`), e.g. for the status of a REJECTED event.
    /// `None` on an id bound to no device port (unbound, or a wildcard
    /// listener), where the transport, and so the text, is unknown.
    pub fn reject_msg(&self, reason: i32) -> Option<&'static CStr> {
        if self.device_ptr().is_null() || self.port_num() == 0 {
            return None;
        }
        // SAFETY: The id is live with a device and a port, which
        // `rdma_reject_msg` reads to pick the transport; it returns a static
        // string for any reason.
        Some(unsafe { CStr::from_char_ptr(bindings::rdma_reject_msg(self.as_ptr(), reason)) })
    }

    /// Sets the type of service (`rdma_set_service_type`), before connect/listen.
    pub fn set_tos(&self, tos: u8) {
        // SAFETY: The id is live.
        unsafe { bindings::rdma_set_service_type(self.as_ptr(), i32::from(tos)) };
    }

    /// `rdma_set_reuseaddr`: setting it is refused only on a listener,
    /// clearing it only on an id that is not idle (`cma.c`).
    pub fn set_reuseaddr(&self, on: bool) -> Result {
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_reuseaddr(self.as_ptr(), i32::from(on)) })
    }

    /// `rdma_set_afonly`: only while the id is idle or just bound.
    pub fn set_afonly(&self, on: bool) -> Result {
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_afonly(self.as_ptr(), i32::from(on)) })
    }

    /// `rdma_set_ack_timeout`: 4.096 us * 2^t, t in 0..=31 (0 disables the
    /// timer), RC ids only.  The CM stores any u8; devices reject > 31 later,
    /// so it is refused here.
    pub fn set_ack_timeout(&self, timeout: u8) -> Result {
        if timeout > 31 {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_ack_timeout(self.as_ptr(), timeout) })
    }

    /// `rdma_set_min_rnr_timer`: the 5-bit IB encoding, RC ids only
    /// (`EINVAL` otherwise: the CM checks the QP type with a `WARN_ON`,
    /// which must never be reachable from here).
    pub fn set_min_rnr_timer(&self, timer: u8) -> Result {
        if timer > 31 || self.qp_type != QpType::Rc {
            return Err(EINVAL);
        }
        // SAFETY: The id is live.
        to_result(unsafe { bindings::rdma_set_min_rnr_timer(self.as_ptr(), timer) })
    }

    /// The destination a SIDR lookup found: on the ESTABLISHED event of a
    /// UD id's [`Self::connect`], an address handle on `pd` (the PD of the
    /// id's QP) from the event's address vector, with the remote QP number
    /// and Q_Key the reply named.  Call it from the handler: the vector
    /// lives only as long as the event.  `EINVAL` for another event or a
    /// non-UD id, `EXDEV` for a PD of another device than the id's.
    pub fn ud_dest(&self, event: &Event<'_>, pd: &Arc<Pd>) -> Result<UdDest> {
        if self.qp_type != QpType::Ud || event.kind() != EventType::Established {
            return Err(EINVAL);
        }
        let ud = event.ud_param().ok_or(EINVAL)?;
        self.device()?.check_same(pd.device())?;
        let attr = &ud.raw.ah_attr;
        // SAFETY: `attr` is the address vector the CM filled for this
        // ESTABLISHED event (`cma_sidr_rep_handler`), whose source GID
        // reference the CM holds until the handler returns, which this call
        // (borrowing the event) does not outlive.
        let ah = unsafe { Ah::from_attr(pd, attr) }?;
        let routed = u32::from(attr.ah_flags) & bindings::ib_ah_flags_IB_AH_GRH != 0;
        // SAFETY: Any bytes are a valid GID.
        let dgid = unsafe { attr.grh.dgid.raw };
        let gid = routed.then_some(dgid);
        UdDest::new(ah, ud.qp_num(), ud.qkey(), gid)
    }

    /// Creates the id's QP on `pd`, completing on `cq`, of the id's QP
    /// type: through the CM (`rdma_create_qp`) on an RC id, by the layer on
    /// a UD id (see `ud_qp.rs`), which gets the port space's Q_Key, is
    /// ready to send and receive at once and is attached to the multicast
    /// groups the id joined.
    ///
    /// The id owns the QP: its destruction drains and destroys it.  `EXDEV` if `pd` or
    /// `cq` is of another device than the id's, `ENOSPC` if `cq` has no
    /// room for `caps` and the drain, `EBUSY` if the id has a QP,
    /// `ESHUTDOWN` once the id is being destroyed, `EINVAL` on an id not
    /// adopted yet, `EPROTONOSUPPORT` for a UD id on an iWARP device (UD
    /// does not exist there).
    ///
    /// On the passive side of an iWARP connection (an id a request made)
    /// the QP holds its sends until the peer's first message arrived (see
    /// [`Qp::awaits_first_message`]): `rdma_connect(3)` requires the active
    /// side to send first there.
    pub fn create_qp<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        cq: &Arc<Cq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        self.create_qp_with_cqs(pd, cq, cq, caps)
    }

    /// As [`Self::create_qp`], with the QP's sends (and its memory work
    /// requests) completing on `send_cq` and its receives on `recv_cq`,
    /// each to its CQ's handler.  `ENOSPC` unless `send_cq` has room for
    /// [`QpCaps::send_cq_entries`] and `recv_cq` for
    /// [`QpCaps::recv_cq_entries`] (or, if they are one CQ, for
    /// [`QpCaps::cq_entries`]); the QP's asynchronous events go to the send
    /// CQ's handler.
    pub fn create_qp_with_cqs<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq<C>>,
        recv_cq: &Arc<Cq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        self.create_qp_inner(pd, send_cq, recv_cq, caps, None)
    }

    /// As [`Self::create_qp_with_cqs`], for an RC QP that takes its
    /// receives from `srq` (see [`Srq`]): its own receive queue is empty
    /// (`EINVAL` unless `caps.max_recv_wr` is 0, or for an SRQ of another
    /// PD; `EXDEV` of another device; `EOPNOTSUPP` on a UD id), and
    /// `recv_cq` takes the completions of the SRQ's receives this QP takes
    /// (`ENOSPC` unless it has room for all of the SRQ's, the first time a
    /// QP on `srq` receives on it).  The QP holds `srq`.
    pub fn create_qp_on_srq<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq<C>>,
        recv_cq: &Arc<Cq<C>>,
        srq: &Arc<Srq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Qp<C>>> {
        self.create_qp_inner(pd, send_cq, recv_cq, caps, Some(srq))
    }

    fn create_qp_inner<C: CompletionHandler>(
        &self,
        pd: &Arc<Pd>,
        send_cq: &Arc<Cq<C>>,
        recv_cq: &Arc<Cq<C>>,
        caps: QpCaps,
        srq: Option<&Arc<Srq<C>>>,
    ) -> Result<Arc<Qp<C>>> {
        let slot = self.state.map(|o| o.qp_slot).ok_or(EINVAL)?;
        let dev = self.device()?;
        let iwarp = dev.transport() == Transport::Iwarp;
        if iwarp && self.qp_type == QpType::Ud {
            return Err(EPROTONOSUPPORT);
        }
        let mut slot = slot.lock();
        match *slot {
            QpSlot::Empty => {}
            QpSlot::Live(_) | QpSlot::TearingDown => return Err(EBUSY),
            QpSlot::Dying => return Err(ESHUTDOWN),
        }
        // COMM_EST is the IB CM's (an RC QP's first message before the
        // RTU): not for UD ids, whose IB CM id `rdma_connect` makes and may
        // destroy while the QP lives, nor iWARP, which has no RTU.  The id
        // outlives its QP: every path destroys the QP first (`destroy_now`,
        // `destroy_qp`, the failure below).  COMM_EST needs the QP in RTR,
        // which the CM moves it to only once the IB CM id exists; the CM
        // destroys that only with the id, or when a connect fails before.
        let comm_est = (!iwarp && self.qp_type == QpType::Rc).then(|| {
            // SAFETY: `notify_comm_est` only queues work; the id and its IB
            // CM id outlive every QP event (above).
            unsafe { CommEstNotify::new(notify_comm_est, self.as_ptr().cast()) }
        });
        let queues = QpQueues {
            send_cq,
            recv_cq,
            srq,
        };
        let (qp, mut attr) = Qp::prepare(&dev, pd, queues, caps, self.qp_type, comm_est)?;
        if iwarp && self.request_param.is_some() {
            qp.hold_sends_until_first_message();
        }
        let ud = self.qp_type == QpType::Ud;
        let raw = if ud {
            // SAFETY: `attr` was made for the id's device, that of `pd`
            // and of the CQs (checked by `prepare`), which `qp` keeps alive.
            unsafe { self.create_ud_qp(pd, &mut attr) }?
        } else {
            // SAFETY: The id is live, locked and bound to `dev`, the device
            // of `pd` and of the CQs in `attr` (checked by `prepare`), which
            // `qp` keeps alive.
            to_result(unsafe { bindings::rdma_create_qp(self.as_ptr(), pd.as_ptr(), &mut attr) })?;
            // SAFETY: `rdma_create_qp` succeeded and set the id's `qp`;
            // only this slot's holder changes it.
            let raw = unsafe { (*self.as_ptr()).qp };
            NonNull::new(raw).ok_or(EINVAL)?
        };
        let ready = if ud { self.init_ud_qp(raw) } else { Ok(()) };
        // SAFETY: `raw` was created from `attr`; the slot keeps `qp` until
        // the id's destruction or `destroy_qp` shuts it down and only then
        // destroys it (or it is destroyed below, never recorded).
        if let Err(e) = ready.and_then(|()| unsafe { qp.set_created(raw) }) {
            // SAFETY: The id is live and locked, of this QP type; its QP
            // was just created, nothing was posted to it and nobody else
            // knows it.  A QP that stays keeps `qp` for its events.
            if unsafe { destroy_id_qp(self.as_ptr(), self.qp_type, raw) }.is_err() {
                core::mem::forget(qp);
            }
            return Err(e);
        }
        *slot = QpSlot::Live(qp.clone());
        drop(slot);
        // A UD QP made after joins receives from the groups already joined.
        self.attach_joined_groups(&*qp);
        Ok(qp)
    }

    /// Drains and destroys the id's QP (`rdma_destroy_qp`), e.g. after a
    /// connect or accept that failed: the id can get a new one once this
    /// returned.  `ENOENT` if it has none, `EINVAL` on an id not adopted
    /// yet.  The teardown runs the QP's flushed completions; a handler of
    /// a [`crate::rdma::PollContext::Direct`] CQ runs in this task and
    /// may reach the id again (a nested [`CmId::with_lock`]): there a
    /// `create_qp` or a second `destroy_qp` fails with `EBUSY`.  From a
    /// completion handler that [`Cq::poll`] runs on one of the QP's CQs
    /// (inside `with_lock` or a callback of the id): `EDEADLK`, since the
    /// teardown waits until that poll returned.
    ///
    /// From any completion handler (a nested `with_lock` in a handler that
    /// [`Cq::poll`] or a teardown runs): `EDEADLK`, since the teardown may
    /// wait for another task's poll, which may wait for this one.  While
    /// a [`CmId::disconnect`] or [`CmId::listen`] of the id runs (from a
    /// callback): `EBUSY`, since the disconnect may use the QP.
    ///
    /// On iWARP, from a connect or accept that succeeded until the
    /// connection's `Disconnected` (or the connect's `Rejected`,
    /// `Unreachable` or `ConnectError`) was reported: `EBUSY`.  The
    /// iWARP CM holds the QP until then and the driver's destroy waits
    /// for that reference, which the CM drops in its event work, behind
    /// this id's pending events, whose upcalls need the handler mutex held
    /// here (from the id's own `Established` callback, the very work that
    /// would drop it).  Disconnect and destroy the QP once `Disconnected`
    /// came, or drop the id, whose teardown destroys the QP without the
    /// mutex.  After a `DeviceRemoval` the CM reports neither: only the
    /// id's drop destroys the QP.
    ///
    /// [`CmId::with_lock`]: crate::rdma::CmId::with_lock
    /// [`CmId::disconnect`]: crate::rdma::CmId::disconnect
    /// [`CmId::listen`]: crate::rdma::CmId::listen
    pub fn destroy_qp(&self) -> Result {
        let slot = self.state.map(|o| o.qp_slot).ok_or(EINVAL)?;
        if in_completion_handler() {
            return Err(EDEADLK);
        }
        if self
            .state
            .is_some_and(|o| o.iwarp_cm_holds_qp.load(Ordering::Acquire))
        {
            return Err(EBUSY);
        }
        let _excluded = self.exclude_unlocked_calls()?;
        let qp = {
            let mut slot = slot.lock();
            let qp = match &*slot {
                QpSlot::Live(qp) => qp.clone(),
                QpSlot::TearingDown => return Err(EBUSY),
                QpSlot::Empty | QpSlot::Dying => return Err(ENOENT),
            };
            *slot = QpSlot::TearingDown;
            qp
        };
        if let Some(raw) = qp.shutdown() {
            // While the slot says `TearingDown`, no `create_qp` (nested in
            // this teardown's handlers or not) replaces the QP.
            // SAFETY: The id is live and locked, of this QP type; `raw` is
            // its QP, shut down: nothing posts to it any more.
            match unsafe { destroy_id_qp(self.as_ptr(), self.qp_type, raw) } {
                Ok(()) => qp.reclaim(),
                // Still live: its events may still reach the object.
                Err(_) => core::mem::forget(qp),
            }
        }
        // Only this call leaves `TearingDown`; the id's destruction, which
        // marks the slot `Dying`, waits for the handler mutex held here.
        *slot.lock() = QpSlot::Empty;
        Ok(())
    }
}

/// Tells the CM that a message arrived on the QP of `id` before its
/// establishment (`IB_EVENT_COMM_EST`): the IB CM then completes the
/// connection as if the RTU had come, which stops its REP retries and
/// reports ESTABLISHED.  Nothing on iWARP.
///
/// # Safety
///
/// `id` is a live `rdma_cm_id` with a QP.
unsafe fn notify_comm_est(id: *mut core::ffi::c_void) {
    // SAFETY: `id` is live; `rdma_notify` reads the id and the IB CM's
    // `cm_establish` allocates with GFP_ATOMIC and queues work under
    // spinlocks: callable in any context, as the QP event handlers of
    // nvmet and rtrs do.  An id already established gets EISCONN, ignored.
    let _ = unsafe { bindings::rdma_notify(id.cast(), bindings::ib_event_type_IB_EVENT_COMM_EST) };
}

fn sockaddr_of(storage: &bindings::__kernel_sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: `__kernel_sockaddr_storage` is 128 bytes, 8-aligned, like
    // `SockaddrBuf`; any bytes are a valid `SockaddrBuf`.
    let bytes = unsafe { &*core::ptr::from_ref(storage).cast::<SockaddrBuf>() };
    SocketAddr::from_sockaddr(&bytes.0).ok().flatten()
}
