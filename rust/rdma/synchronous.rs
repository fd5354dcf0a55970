// SPDX-License-Identifier: GPL-2.0

//! Synchronous operation: the event that ends a blocking call.
//!
//! `rdma_create_id(3)` without an event channel: "calls that result in an
//! event will block until the operation completes", and the event then
//! stays available on the id.  An [`EventWaiter`] is the id's side of that
//! bargain: the CM level records every event of an id whose handler has
//! one ([`super::cm::Handler::waiter`]), and the blocking calls of
//! [`super::cm::CmId`] (`resolve_addr_sync` and the others) wait on it.
//!
//! The rules, which the char device exposes unchanged:
//!
//! * One blocking call per id at a time: another fails with `EBUSY`.
//! * A call interrupted by a signal (`ERESTARTSYS`) or by its wait limit
//!   (`ETIMEDOUT`) leaves its operation in flight.  Repeating the same
//!   call waits for that operation's event without starting it again (so
//!   a restarted system call resumes); any other blocking call fails with
//!   `EBUSY` until then.
//! * A call that an event ended returns that event, a failure's included
//!   ([`SyncOutcome`]: the event and what it means); the event stays
//!   readable ([`EventWaiter::last`]) until the next call ends.  A call no
//!   event ended fails with its errno.
//! * A DISCONNECTED event is kept once it came: a disconnect after it
//!   returns at once with it, and a connect or accept in flight ends with
//!   `ECONNRESET`.  DEVICE_REMOVAL ends every wait with `ENODEV`.
//! * A REJECTED, UNREACHABLE or CONNECT_ERROR that came while no connect
//!   or accept was in flight (a request whose peer gave up before it was
//!   accepted) is kept for the next connect or accept, which returns it at
//!   once without starting anything: the event is not lost, and the CM is
//!   not asked to answer a request that is gone.
//! * [`EventWaiter::cancel`] (the owner is going away) ends every wait with
//!   `ECANCELED`, now and later.
//!
//! This module knows events, not ids: the CM level above it uses it.

use super::{
    conn_param::{ConnParam, PrivateData},
    event::{Event, EventType},
};
use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{CondVar, CondVarTimeoutResult, Mutex},
    time::{msecs_to_jiffies, Delta},
};

/// The operations that end with an event.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SyncOp {
    /// `rdma_resolve_addr`: ADDR_RESOLVED or ADDR_ERROR.
    ResolveAddr,
    /// `rdma_resolve_route`: ROUTE_RESOLVED or ROUTE_ERROR.
    ResolveRoute,
    /// `rdma_connect`: ESTABLISHED, or REJECTED, UNREACHABLE,
    /// CONNECT_ERROR, DISCONNECTED.
    Connect,
    /// `rdma_accept` (RC): ESTABLISHED, or CONNECT_ERROR, REJECTED,
    /// UNREACHABLE, DISCONNECTED.
    Accept,
    /// `rdma_disconnect`: DISCONNECTED.
    Disconnect,
    /// `rdma_join_multicast`: MULTICAST_JOIN or MULTICAST_ERROR.  One join
    /// at a time: a call that resumes an interrupted one gets that one's
    /// event, whatever group it names.
    JoinMulticast,
}

impl SyncOp {
    /// The event that means success.
    fn success(self) -> EventType {
        match self {
            Self::ResolveAddr => EventType::AddrResolved,
            Self::ResolveRoute => EventType::RouteResolved,
            Self::Connect | Self::Accept => EventType::Established,
            Self::Disconnect => EventType::Disconnected,
            Self::JoinMulticast => EventType::MulticastJoin,
        }
    }

    /// Whether `kind` ends this operation.
    fn ends_with(self, kind: EventType) -> bool {
        kind == self.success()
            || match self {
                Self::ResolveAddr => kind == EventType::AddrError,
                Self::ResolveRoute => kind == EventType::RouteError,
                Self::Connect | Self::Accept => matches!(
                    kind,
                    EventType::Rejected
                        | EventType::Unreachable
                        | EventType::ConnectError
                        | EventType::Disconnected
                ),
                Self::JoinMulticast => kind == EventType::MulticastError,
                Self::Disconnect => false,
            }
    }
}

/// The remote QP a SIDR reply named (UD ids).
#[derive(Clone, Copy)]
pub struct UdReply {
    /// The remote QP number.
    pub qp_num: u32,
    /// Its Q_Key.
    pub qkey: u32,
    /// The reply's private data.
    pub data: PrivateData,
}

/// What an event carries besides its type and status.
#[derive(Clone, Copy)]
enum Params {
    None,
    Conn(ConnParam),
    Ud(UdReply),
}

/// A copy of an event, kept past its callback.
#[derive(Clone, Copy)]
pub struct OwnedEvent {
    kind: EventType,
    status: i32,
    params: Params,
}

impl OwnedEvent {
    /// Copies what `event` carries (its private data included).
    pub fn copy(event: &Event<'_>) -> Self {
        let params = if let Some(p) = event.conn_param() {
            Params::Conn(p.to_owned())
        } else if let Some(ud) = event.ud_param() {
            Params::Ud(UdReply {
                qp_num: ud.qp_num(),
                qkey: ud.qkey(),
                // At most 136 bytes (a SIDR reply): always fits.
                data: PrivateData::new(ud.private_data()).unwrap_or_default(),
            })
        } else {
            Params::None
        };
        Self {
            kind: event.kind(),
            status: event.status(),
            params,
        }
    }

    /// The event's type.
    pub fn kind(&self) -> EventType {
        self.kind
    }

    /// The raw status (see [`Event::status`]).
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The connection parameters an RC connection event carried.
    pub fn conn_param(&self) -> Option<&ConnParam> {
        match &self.params {
            Params::Conn(p) => Some(p),
            _ => None,
        }
    }

    /// What a SIDR reply carried, on a UD id.
    pub fn ud_reply(&self) -> Option<&UdReply> {
        match &self.params {
            Params::Ud(ud) => Some(ud),
            _ => None,
        }
    }

    /// `Ok` if the event is `op`'s success with status 0; else the errno
    /// the status gives (a reject reason is `ECONNREFUSED`), or for a
    /// failure reported with status 0 the one its type implies.
    fn result_for(&self, op: SyncOp) -> Result {
        let status = self.status;
        if status < 0 {
            return Err(Error::from_errno(status));
        }
        match self.kind {
            EventType::Rejected => Err(ECONNREFUSED),
            kind if kind == op.success() && status == 0 => Ok(()),
            EventType::Disconnected => Err(ECONNRESET),
            EventType::Unreachable | EventType::AddrError | EventType::RouteError => {
                Err(EHOSTUNREACH)
            }
            _ => Err(ECONNABORTED),
        }
    }
}

/// A blocking call an event ended: the event, and what it means for the
/// operation (a REJECTED event is `ECONNREFUSED`, with the reason in its
/// status and the peer's private data in its parameters).
#[derive(Clone, Copy)]
pub struct SyncOutcome {
    event: OwnedEvent,
    result: Result,
}

impl SyncOutcome {
    /// The event that ended the call.
    pub fn event(&self) -> &OwnedEvent {
        &self.event
    }

    /// `Ok` if the operation succeeded, else the errno the event gives.
    pub fn result(&self) -> Result {
        self.result
    }

    /// The event if the operation succeeded, else the errno.
    pub fn into_event(self) -> Result<OwnedEvent> {
        self.result.map(|()| self.event)
    }
}

/// The result of a blocking call: `Err` when no event ended it (it could
/// not start, was interrupted, timed out, or the device or the id went).
pub type SyncResult = Result<SyncOutcome>;

struct WaiterState {
    /// The operation started and not yet ended by its event.
    in_flight: Option<SyncOp>,
    /// A task is waiting for it.
    waiting: bool,
    /// The event that ended `in_flight`, not yet returned.
    outcome: Option<OwnedEvent>,
    /// The DISCONNECTED event, once it came.
    disconnected: Option<OwnedEvent>,
    /// A connection's failure that came while no connect or accept was in
    /// flight, kept for the next of them.
    unclaimed_failure: Option<OwnedEvent>,
    /// DEVICE_REMOVAL came.
    removed: bool,
    /// The owner is going away.
    cancelled: bool,
    /// The event that ended the last call.
    last: Option<OwnedEvent>,
}

/// Where the events of a synchronous id wait for its blocking calls.
#[pin_data]
pub struct EventWaiter {
    #[pin]
    state: Mutex<WaiterState>,
    #[pin]
    changed: CondVar,
}

/// What [`EventWaiter::begin`] decided.
pub(crate) enum Begin {
    /// Start the operation, then wait.
    Start,
    /// The same operation is in flight already (an earlier call was
    /// interrupted): wait for its event.
    Resume,
    /// The event that ends the operation came before the call: do not
    /// start it; the wait returns that event at once.
    Ended,
}

impl EventWaiter {
    /// A waiter with nothing in flight.
    pub fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            state <- new_mutex!(WaiterState {
                in_flight: None,
                waiting: false,
                outcome: None,
                disconnected: None,
                unclaimed_failure: None,
                removed: false,
                cancelled: false,
                last: None,
            }),
            changed <- new_condvar!("rdma_cm_rs sync"),
        })
    }

    /// Records an event of the id (called by the CM level after the
    /// handler, with the id's handler mutex held).
    pub(crate) fn record(&self, event: &Event<'_>) {
        let kind = event.kind();
        let mut st = self.state.lock();
        match kind {
            EventType::DeviceRemoval => st.removed = true,
            EventType::Disconnected => st.disconnected = Some(OwnedEvent::copy(event)),
            _ => {}
        }
        match st.in_flight {
            Some(op) if op.ends_with(kind) => {
                if st.outcome.is_none() {
                    st.outcome = Some(OwnedEvent::copy(event));
                }
            }
            _ if matches!(
                kind,
                EventType::Rejected | EventType::Unreachable | EventType::ConnectError
            ) =>
            {
                st.unclaimed_failure = Some(OwnedEvent::copy(event));
            }
            _ => {}
        }
        self.changed.notify_all();
    }

    /// Ends every wait with `ECANCELED`, now and later.
    pub fn cancel(&self) {
        self.state.lock().cancelled = true;
        self.changed.notify_all();
    }

    /// The event that ended the last blocking call, if any ended with one.
    pub fn last(&self) -> Option<OwnedEvent> {
        self.state.lock().last
    }

    /// Claims the id for a blocking call of `op`.
    pub(crate) fn begin(&self, op: SyncOp) -> Result<Begin> {
        let mut st = self.state.lock();
        if st.cancelled {
            return Err(ECANCELED);
        }
        if st.waiting {
            return Err(EBUSY);
        }
        match st.in_flight {
            Some(o) if o == op => {
                st.waiting = true;
                Ok(Begin::Resume)
            }
            Some(_) => Err(EBUSY),
            None => {
                if st.removed {
                    return Err(ENODEV);
                }
                st.in_flight = Some(op);
                st.waiting = true;
                st.outcome = None;
                match op {
                    // A disconnect after the peer's: its event is here
                    // already, and the disconnect still goes to the CM.
                    SyncOp::Disconnect => st.outcome = st.disconnected,
                    SyncOp::Connect | SyncOp::Accept => {
                        if let Some(failure) = st.unclaimed_failure.take() {
                            st.outcome = Some(failure);
                            return Ok(Begin::Ended);
                        }
                    }
                    SyncOp::ResolveAddr | SyncOp::ResolveRoute | SyncOp::JoinMulticast => {}
                }
                Ok(Begin::Start)
            }
        }
    }

    /// The operation [`Self::begin`] claimed failed to start: no event
    /// will end it.
    pub(crate) fn abort(&self) {
        let mut st = self.state.lock();
        st.in_flight = None;
        st.waiting = false;
        st.outcome = None;
    }

    /// Waits for the event that ends the claimed operation, at most `limit`
    /// (`None`: until it comes; the CM's own timers end every operation).
    pub(crate) fn wait(&self, op: SyncOp, limit: Option<Delta>) -> SyncResult {
        let mut st = self.state.lock();
        let jiffies = limit.map(|d| {
            let ms = d.as_millis_ceil().clamp(1, i64::from(u32::MAX / 2));
            msecs_to_jiffies(ms as u32)
        });
        let mut left = jiffies;
        let ended = loop {
            if let Some(event) = st.outcome.take() {
                st.in_flight = None;
                st.last = Some(event);
                break Ok(event);
            }
            if st.cancelled {
                break Err(ECANCELED);
            }
            if st.removed {
                st.in_flight = None;
                break Err(ENODEV);
            }
            match left {
                None => {
                    if self.changed.wait_interruptible(&mut st) {
                        break Err(ERESTARTSYS);
                    }
                }
                Some(0) => break Err(ETIMEDOUT),
                Some(j) => match self.changed.wait_interruptible_timeout(&mut st, j) {
                    CondVarTimeoutResult::Timeout => left = Some(0),
                    CondVarTimeoutResult::Signal { .. } => break Err(ERESTARTSYS),
                    CondVarTimeoutResult::Woken { jiffies } => left = Some(jiffies),
                },
            }
        };
        st.waiting = false;
        drop(st);
        ended.map(|event| SyncOutcome {
            result: event.result_for(op),
            event,
        })
    }
}
