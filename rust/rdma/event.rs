// SPDX-License-Identifier: GPL-2.0

//! CM events (`struct rdma_cm_event`).
//!
//! An [`Event`] borrows the C event for the duration of the callback only;
//! its parameter views borrow it in turn, so private data cannot be kept past
//! the callback by mistake.

use super::{
    bindings,
    conn_param::{ConnParamView, UdParamView},
    device::Transport,
};
use kernel::prelude::*;

/// `enum rdma_cm_event_type` of Linux 7.3, every value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum EventType {
    /// Address resolution (`resolve_addr`) completed.
    AddrResolved = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ADDR_RESOLVED,
    /// Address resolution failed.
    AddrError = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ADDR_ERROR,
    /// Route resolution (`resolve_route`) completed.
    RouteResolved = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_RESOLVED,
    /// Route resolution failed.
    RouteError = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ROUTE_ERROR,
    /// A connection request arrived on a listener.
    ConnectRequest = bindings::rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_REQUEST,
    /// The peer answered a connect on an id without a QP.
    ConnectResponse = bindings::rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_RESPONSE,
    /// Connection establishment failed.
    ConnectError = bindings::rdma_cm_event_type_RDMA_CM_EVENT_CONNECT_ERROR,
    /// The peer could not be reached.
    Unreachable = bindings::rdma_cm_event_type_RDMA_CM_EVENT_UNREACHABLE,
    /// The peer rejected the connection; the status is the reject reason.
    Rejected = bindings::rdma_cm_event_type_RDMA_CM_EVENT_REJECTED,
    /// The connection is established.
    Established = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ESTABLISHED,
    /// The connection was disconnected.
    Disconnected = bindings::rdma_cm_event_type_RDMA_CM_EVENT_DISCONNECTED,
    /// The device the id is bound to is going away: destroy the id soon.
    DeviceRemoval = bindings::rdma_cm_event_type_RDMA_CM_EVENT_DEVICE_REMOVAL,
    /// A multicast join completed.
    MulticastJoin = bindings::rdma_cm_event_type_RDMA_CM_EVENT_MULTICAST_JOIN,
    /// A multicast join failed.
    MulticastError = bindings::rdma_cm_event_type_RDMA_CM_EVENT_MULTICAST_ERROR,
    /// The local address changed.
    AddrChange = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ADDR_CHANGE,
    /// The QP left the timewait state.
    TimewaitExit = bindings::rdma_cm_event_type_RDMA_CM_EVENT_TIMEWAIT_EXIT,
    /// An IB service record query (`rdma_resolve_ib_service`) completed.
    /// This layer does not expose that query, so its ids never see it.
    AddrinfoResolved = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ADDRINFO_RESOLVED,
    /// An IB service record query failed (as for [`Self::AddrinfoResolved`]).
    AddrinfoError = bindings::rdma_cm_event_type_RDMA_CM_EVENT_ADDRINFO_ERROR,
    /// Never sent by the CM: `ucma`'s number for events user space injects.
    User = bindings::rdma_cm_event_type_RDMA_CM_EVENT_USER,
    /// Never sent by the CM: `ucma`'s number for its own internal events.
    Internal = bindings::rdma_cm_event_type_RDMA_CM_EVENT_INTERNAL,
}

impl EventType {
    /// Every event type, in numeric order.
    pub const ALL: [EventType; 20] = [
        Self::AddrResolved,
        Self::AddrError,
        Self::RouteResolved,
        Self::RouteError,
        Self::ConnectRequest,
        Self::ConnectResponse,
        Self::ConnectError,
        Self::Unreachable,
        Self::Rejected,
        Self::Established,
        Self::Disconnected,
        Self::DeviceRemoval,
        Self::MulticastJoin,
        Self::MulticastError,
        Self::AddrChange,
        Self::TimewaitExit,
        Self::AddrinfoResolved,
        Self::AddrinfoError,
        Self::User,
        Self::Internal,
    ];

    /// The type of a raw event number, if it is one 7.3 defines.
    pub fn from_raw(raw: u32) -> Option<Self> {
        Self::ALL.iter().copied().find(|t| *t as u32 == raw)
    }

    /// The CM's name for it (`rdma_event_msg`), e.g. `established`.  The
    /// CM of 7.3 names the last four types `unrecognized event`.
    pub fn name(self) -> &'static CStr {
        // SAFETY: `rdma_event_msg` accepts any value and returns a pointer to
        // a static NUL-terminated string.
        unsafe { CStr::from_char_ptr(bindings::rdma_event_msg(self as u32)) }
    }

    /// Whether the event carries `rdma_conn_param` (on RC ids).
    fn has_conn_param(self) -> bool {
        matches!(
            self,
            Self::ConnectRequest
                | Self::ConnectResponse
                | Self::Established
                | Self::Rejected
                | Self::ConnectError
                | Self::Unreachable
        )
    }
}

/// An event delivered to a [`super::cm::Handler`], valid for the callback.
pub struct Event<'a> {
    raw: &'a bindings::rdma_cm_event,
    kind: EventType,
    /// The id is a UD id: connection events carry `param.ud`.
    datagram: bool,
    /// The id's device, once it has one.
    transport: Option<Transport>,
}

impl<'a> Event<'a> {
    /// Wraps a C event; `None` for an event type 7.3 does not define (the
    /// caller decides what to do with it: nothing may be read from it).
    ///
    /// # Safety
    ///
    /// `raw` must point to a valid event for the duration of `'a`,
    /// `datagram` must tell whether the id it was delivered to is a UD id,
    /// and `transport` must be that of the id's device, if it has one.
    pub(crate) unsafe fn from_raw(
        raw: *const bindings::rdma_cm_event,
        datagram: bool,
        transport: Option<Transport>,
    ) -> Option<Self> {
        // SAFETY: By the function's safety requirements.
        let raw = unsafe { &*raw };
        Some(Self {
            kind: EventType::from_raw(raw.event)?,
            raw,
            datagram,
            transport,
        })
    }

    /// The event's type.
    pub fn kind(&self) -> EventType {
        self.kind
    }

    /// The transport of the id's device, once the id has one.
    pub fn transport(&self) -> Option<Transport> {
        self.transport
    }

    /// The raw status: 0, a negative errno, or for [`EventType::Rejected`]
    /// the (positive) IB CM reject reason.
    pub fn status(&self) -> i32 {
        self.raw.status
    }

    /// The status as a result: `Ok` for 0, the errno otherwise (a reject
    /// reason maps to `ECONNREFUSED`).
    pub fn result(&self) -> Result {
        match self.raw.status {
            0 => Ok(()),
            s if s < 0 => Err(Error::from_errno(s)),
            _ => Err(ECONNREFUSED),
        }
    }

    /// Connection parameters, for connection events on RC ids.
    ///
    /// The read depths are this side's on every transport: what it may
    /// accept (`responder_resources`) and issue (`initiator_depth`).  The
    /// IB CM reports requests and replies that way (`cm_format_req_event`,
    /// `cm_format_rep_event` swap the peer's fields); the iWARP CM does for
    /// a request, but reports `ESTABLISHED` the other way round
    /// (`cma_iw_handler` puts the provider's IRD in `initiator_depth`), so
    /// the view swaps those back.
    pub fn conn_param(&self) -> Option<ConnParamView<'a>> {
        if self.kind.has_conn_param() && !self.datagram {
            Some(ConnParamView {
                // The member through a cast of the union: the kernel's
                // bindings make `param` a Rust union, a module's (where
                // bindgen cannot prove it `Copy`) a struct of
                // `__BindgenUnionField`s; every member starts at its start.
                // SAFETY: For these event types on connected ids the CM fills
                // the `conn` member of the union.
                raw: unsafe { &*(&raw const self.raw.param).cast::<bindings::rdma_conn_param>() },
                depths_swapped: self.kind == EventType::Established
                    && self.transport == Some(Transport::Iwarp),
            })
        } else {
            None
        }
    }

    /// What a multicast event carries (`MULTICAST_JOIN`: the group's
    /// address vector, Q_Key and the all-ones QP number; the join's
    /// context either way, in `private_data`, with no length).
    pub(crate) fn multicast_param(&self) -> Option<UdParamView<'a>> {
        if matches!(
            self.kind,
            EventType::MulticastJoin | EventType::MulticastError
        ) {
            Some(UdParamView {
                // SAFETY: For multicast events the CM fills the `ud`
                // member of the union (`cma_make_mc_event`), cast as below.
                raw: unsafe { &*(&raw const self.raw.param).cast::<bindings::rdma_ud_param>() },
            })
        } else {
            None
        }
    }

    /// UD parameters, for SIDR events on UD ids.
    pub fn ud_param(&self) -> Option<UdParamView<'a>> {
        if self.kind.has_conn_param() && self.datagram {
            Some(UdParamView {
                // SAFETY: For these event types on UD ids the CM fills the
                // `ud` member of the union (cast as above).
                raw: unsafe { &*(&raw const self.raw.param).cast::<bindings::rdma_ud_param>() },
            })
        } else {
            None
        }
    }
}
