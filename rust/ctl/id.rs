// SPDX-License-Identifier: GPL-2.0

//! One id of a file: its CM event handler and the state the ioctls share
//! with it.
//!
//! Lock order: an id's CM handler mutex, then its [`IdState`], then the
//! file's state.  A synchronous id's events are not queued on the file:
//! the layer's waiter ([`EventWaiter`]) hands each to the blocking call it
//! ends, and its listener's requests wait in the listener's own queue for
//! `GET_REQUEST`.  Ioctls take the handler mutex through `CmId::with_lock`
//! first; handlers already hold it.  Handlers queue events with the
//! [`IdState`] locked, so that an id marked `retired` (under that lock)
//! never queues another one.

use super::{conn::Conn, event_queue::EventQueue, CtlFile};
use crate::{
    abi,
    rdma::{
        conn_param::ConnParamView, CmId, ConnectRequest, Event, EventType, EventWaiter, Handler,
        LockedId, OwnedEvent, QpType, SocketAddr, Transport,
    },
};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::{
    new_condvar, new_mutex,
    prelude::*,
    sync::{Arc, CondVar, Mutex},
};

/// An id owned by a file.
pub(crate) type CtlId = CmId<IdEvents>;

/// A listener's backlog: requests delivered and not yet answered, which no
/// CM bounds (see [`crate::rdma::CmId::listen`]), so the file does, as
/// ucma does.
pub(crate) struct Backlog {
    limit: u32,
    /// Requests delivered and neither accepted, rejected nor destroyed.
    pending: AtomicU32,
}

impl Backlog {
    pub(crate) fn new(limit: u32) -> Result<Arc<Self>> {
        Ok(Arc::new(
            Self {
                limit,
                pending: AtomicU32::new(0),
            },
            GFP_KERNEL,
        )?)
    }

    fn try_acquire(&self) -> bool {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |p| {
                (p < self.limit).then_some(p + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    /// Requests holding a slot.
    pub(crate) fn pending(&self) -> u32 {
        self.pending.load(Ordering::Acquire)
    }
}

/// A slot of a listener's backlog, held by a request until it is accepted,
/// rejected or destroyed: released exactly once, by drop.
pub(crate) struct BacklogSlot(Arc<Backlog>);

impl Drop for BacklogSlot {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// What the ioctls and the handler share about an id.
pub(crate) struct IdState {
    /// `abi::state::*`, tracked from the calls made and the events seen.
    pub(crate) state: u32,
    /// The id's QP type: only RC ids have a data path.
    pub(crate) qp_type: QpType,
    /// The file let go of the id: its events are not queued any more.
    pub(crate) retired: bool,
    pub(crate) tos: Option<u8>,
    /// Listeners: the backlog.
    pub(crate) backlog: Option<Arc<Backlog>>,
    /// Ids made by a request: their listener's backlog slot.
    pub(crate) slot: Option<BacklogSlot>,
    /// The data path, once connecting or accepting created it.
    pub(crate) conn: Option<Arc<Conn>>,
    /// RDMA read depths: what was sent, then what the peer answered.
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    /// Synchronous listeners: connection requests not yet fetched, oldest
    /// first.  Its capacity is the backlog, reserved by LISTEN: a request
    /// holds a backlog slot from its arrival, so pushing never allocates.
    pub(crate) requests: EventQueue,
    /// Synchronous UD ids: the event as user space sees it of the last
    /// ESTABLISHED (the SIDR reply), with the peer handle made for it.
    pub(crate) ud_established: Option<abi::Event>,
    /// UD ids: the groups joined, with their joins' contexts.
    pub(crate) mcast: KVec<(SocketAddr, u64)>,
    /// Synchronous UD ids: the last multicast event as user space sees it.
    pub(crate) mcast_event: Option<abi::Event>,
    /// Synchronous UD ids: the group a JOIN_MCAST waits for, which a leave
    /// would cancel (the CM drops the join's event).
    pub(crate) joining: Option<SocketAddr>,
}

#[pin_data]
pub(crate) struct IdShared {
    #[pin]
    pub(crate) state: Mutex<IdState>,
    /// Created with `RDMA_CM_RS_ID_SYNC`.
    pub(crate) sync: bool,
    /// Created with `RDMA_CM_RS_ID_BUSY_POLL`: its connection's waiters
    /// poll its CQ.
    pub(crate) busy_poll: bool,
    /// A synchronous id's events, for its blocking calls.
    #[pin]
    pub(crate) waiter: EventWaiter,
    /// A synchronous listener's `requests` grew, or the id was retired.
    #[pin]
    pub(crate) requests_ready: CondVar,
}

impl IdShared {
    pub(crate) fn new(
        state: u32,
        qp_type: QpType,
        backlog_slot: Option<BacklogSlot>,
        sync: bool,
        busy_poll: bool,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                state <- new_mutex!(IdState {
                    state,
                    qp_type,
                    retired: false,
                    tos: None,
                    backlog: None,
                    slot: backlog_slot,
                    conn: None,
                    responder_resources: 0,
                    initiator_depth: 0,
                    requests: EventQueue::new(),
                    ud_established: None,
                    mcast: KVec::new(),
                    mcast_event: None,
                    joining: None,
                }),
                sync,
                busy_poll,
                waiter <- EventWaiter::new(),
                requests_ready <- new_condvar!("rdma_cm_rs requests"),
            }),
            GFP_KERNEL,
        )
    }

    /// The file let go of the id: nothing is queued any more, and its
    /// blocking calls end (`ECANCELED`).
    pub(crate) fn retire(&self) {
        self.state.lock().retired = true;
        self.waiter.cancel();
        self.requests_ready.notify_all();
    }
}

/// The CM event handler of a file's id.
pub(crate) struct IdEvents {
    pub(crate) file: Arc<CtlFile>,
    pub(crate) handle: u32,
    pub(crate) context: u64,
    pub(crate) shared: Arc<IdShared>,
}

/// Copies private data into the ABI form (at most its 256 bytes).
fn fill_private_data(out: &mut abi::ConnParam, data: &[u8]) {
    let n = data.len().min(out.private_data.len());
    out.private_data[..n].copy_from_slice(&data[..n]);
    out.private_data_len = n as u16;
}

/// Copies an event's connection parameters into the ABI form.
fn fill_conn_param(out: &mut abi::ConnParam, view: &ConnParamView<'_>) {
    fill_private_data(out, view.private_data());
    out.responder_resources = view.responder_resources();
    out.initiator_depth = view.initiator_depth();
    out.flow_control = u8::from(view.flow_control());
    out.retry_count = view.retry_count();
    out.rnr_retry_count = view.rnr_retry_count();
    out.srq = u8::from(view.srq());
    out.qp_num = view.qp_num();
}

impl IdEvents {
    /// The event a synchronous call returns, in the ABI's form.
    pub(crate) fn abi_owned_event(&self, event: &OwnedEvent) -> abi::Event {
        if event.kind() == EventType::Established {
            if let Some(ud) = self.shared.state.lock().ud_established {
                return ud;
            }
        }
        if matches!(
            event.kind(),
            EventType::MulticastJoin | EventType::MulticastError
        ) {
            if let Some(mc) = self.shared.state.lock().mcast_event {
                return mc;
            }
        }
        let mut out = self.event_header(event.kind(), event.status());
        if let Some(p) = event.conn_param() {
            fill_private_data(&mut out.param, p.data().as_slice());
            (out.param.responder_resources, out.param.initiator_depth) = p.rd_atom();
            out.param.flow_control = u8::from(p.has_flow_control());
            (out.param.retry_count, out.param.rnr_retry_count) = p.retry_counts();
            out.param.srq = u8::from(p.peer_srq());
            out.param.qp_num = p.peer_qp_num();
        }
        if let Some(ud) = event.ud_reply() {
            out.ud_qp_num = ud.qp_num;
            out.ud_qkey = ud.qkey;
            fill_private_data(&mut out.param, ud.data.as_slice());
        }
        out
    }

    /// An event of this id of type `kind`, nothing filled in beyond.
    fn event_header(&self, kind: EventType, status: i32) -> abi::Event {
        let mut out: abi::Event = pin_init::zeroed();
        out.context = self.context;
        out.id = self.handle;
        out.event = kind as u32;
        out.status = status;
        out
    }

    /// A group's event carries its join's context, and `MULTICAST_JOIN`
    /// the group as a peer.
    fn multicast_event(
        st: &mut IdState,
        id: &LockedId<'_>,
        event: &Event<'_>,
        out: &mut abi::Event,
    ) {
        if let Some(group) = id.multicast_group(event) {
            if let Some((_, context)) = st.mcast.iter().find(|(g, _)| *g == group) {
                out.context = *context;
            }
        }
        if event.kind() != EventType::MulticastJoin {
            return;
        }
        let dest = st
            .conn
            .clone()
            .ok_or(ENOTCONN)
            .and_then(|conn| Ok((id.multicast_dest(event, conn.pd())?, conn)));
        let peer = dest.and_then(|(dest, conn)| {
            out.ud_qp_num = dest.qp_num();
            out.ud_qkey = dest.qkey();
            conn.add_peer(dest)
        });
        match peer {
            Ok(handle) => out.ud_peer = handle,
            // The group cannot be used: user space sees why.
            Err(e) => {
                out.event = EventType::MulticastError as u32;
                out.status = e.to_errno();
            }
        }
    }

    fn abi_event(&self, event: &Event<'_>) -> abi::Event {
        let mut out = self.event_header(event.kind(), event.status());
        if let Some(param) = event.conn_param() {
            fill_conn_param(&mut out.param, &param);
        }
        if let Some(ud) = event.ud_param() {
            out.ud_qp_num = ud.qp_num();
            out.ud_qkey = ud.qkey();
            fill_private_data(&mut out.param, ud.private_data());
        }
        out
    }
}

impl Handler for IdEvents {
    fn waiter(&self) -> Option<&EventWaiter> {
        self.shared.sync.then_some(&self.shared.waiter)
    }

    fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
        let mut st = self.shared.state.lock();
        if st.retired {
            return;
        }
        let mut out = self.abi_event(event);
        if matches!(
            event.kind(),
            EventType::MulticastJoin | EventType::MulticastError
        ) {
            Self::multicast_event(&mut st, id, event, &mut out);
        }
        if event.kind() == EventType::Established && st.qp_type == QpType::Ud {
            // The SIDR reply: its address vector lives only as long as this
            // callback, so the address handle is made now.  Without one
            // user space learns why from the status, and has no peer.
            let peer = st
                .conn
                .clone()
                .ok_or(ENOTCONN)
                .and_then(|conn| conn.add_peer(id.ud_dest(event, conn.pd())?));
            match peer {
                Ok(handle) => out.ud_peer = handle,
                Err(e) => out.status = e.to_errno(),
            }
        }
        st.state = match event.kind() {
            EventType::AddrResolved => abi::state::ADDR_RESOLVED,
            EventType::AddrError => abi::state::ADDR_BOUND,
            EventType::RouteResolved => abi::state::ROUTE_RESOLVED,
            EventType::RouteError => abi::state::ADDR_RESOLVED,
            EventType::Established => abi::state::CONNECT,
            EventType::Disconnected
            | EventType::Rejected
            | EventType::Unreachable
            | EventType::ConnectError => abi::state::DISCONNECT,
            EventType::DeviceRemoval => abi::state::DEVICE_REMOVAL,
            _ => st.state,
        };
        if event.kind() == EventType::Established {
            if let Some(p) = event.conn_param() {
                // Over IB the active side learns the peer's answer here (the
                // passive side's ESTABLISHED carries none).  Over iWARP both
                // sides learn what the provider settled on, which can exceed
                // what was asked: siw raises an accepted IRD to the peer's
                // ORD (relaxed IRD negotiation).  The view gives this side's
                // values on both.
                if p.responder_resources() != 0 || p.initiator_depth() != 0 {
                    if event.transport() == Some(Transport::Iwarp) {
                        st.responder_resources = p.responder_resources();
                        st.initiator_depth = p.initiator_depth();
                    } else {
                        st.responder_resources =
                            st.responder_resources.min(p.responder_resources());
                        st.initiator_depth = st.initiator_depth.min(p.initiator_depth());
                    }
                }
            }
        }
        if self.shared.sync {
            // The layer's waiter hands the event to the blocking call it
            // ends; only a SIDR reply's peer handle is kept here for it.
            if event.kind() == EventType::Established && st.qp_type == QpType::Ud {
                st.ud_established = Some(out);
            }
            if matches!(
                event.kind(),
                EventType::MulticastJoin | EventType::MulticastError
            ) {
                st.mcast_event = Some(out);
            }
        } else {
            // Queued with the id's state locked: see the module documentation.
            self.file.push_event(out);
        }
        if event.kind() == EventType::DeviceRemoval {
            // The device waits for every id on it to be destroyed: drop the
            // file's reference now.  Dropped inside its own callback, the id
            // is destroyed from the workqueue.
            st.retired = true;
            drop(st);
            drop(self.file.detach(self.handle));
        }
    }

    fn connect_request(&self, request: ConnectRequest<'_, Self>, event: &Event<'_>) {
        // Held until the request's event is queued: a listener retired
        // meanwhile adopts no request (its destroy could not see it).
        let st = self.shared.state.lock();
        if st.retired {
            return;
        }
        let Some(backlog) = st.backlog.clone() else {
            return;
        };
        // Over the backlog: dropping the request makes the CM destroy the
        // new id and reject the peer.
        if !backlog.try_acquire() {
            return;
        }
        let slot = BacklogSlot(backlog);
        let sync = self.shared.sync;
        // Room for the event first: once the new id exists, its event
        // cannot be lost (the id would hold a backlog slot nobody knows).
        // A synchronous listener's queue has room for its whole backlog.
        if !sync && self.file.reserve_event().is_err() {
            return;
        }
        let mut out = self.abi_event(event);
        let file = &self.file;
        // The new id's own type (the layer hands over only requests of the
        // listener's type).
        let qp_type = request.id().qp_type();
        let inserted = file.insert(|handle| {
            let shared = IdShared::new(
                abi::state::CONNECT,
                qp_type,
                Some(slot),
                sync,
                self.shared.busy_poll,
            )?;
            let id = request.adopt(IdEvents {
                file: file.clone(),
                handle,
                context: self.context,
                shared,
            })?;
            Ok(Arc::new(id, GFP_KERNEL)?)
        });
        // On failure the request (and with it the slot) is dropped: the CM
        // destroys the new id.
        match (inserted, sync) {
            (Ok(handle), false) => {
                out.new_id = handle;
                file.push_reserved_event(out);
            }
            (Err(_), false) => file.unreserve_event(),
            (Ok(handle), true) => {
                out.new_id = handle;
                let mut st = st;
                // Within the capacity LISTEN reserved: does not allocate.
                if st.requests.push_within_capacity(out).is_ok() {
                    self.shared.requests_ready.notify_all();
                } else {
                    // Unreachable by the capacity rule; the id must not
                    // linger unknown to user space.
                    drop(st);
                    drop(file.detach(handle));
                }
            }
            (Err(_), true) => {}
        }
    }
}
