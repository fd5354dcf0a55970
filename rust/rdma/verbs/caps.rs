// SPDX-License-Identifier: GPL-2.0

//! What a QP is made to hold: its type ([`QpType`]) and its capabilities
//! ([`QpCaps`]).

use crate::rdma::bindings;
use kernel::prelude::*;

/// The QP types this layer makes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum QpType {
    /// Reliable connected.
    Rc = bindings::ib_qp_type_IB_QPT_RC,
    /// Unreliable datagram.
    Ud = bindings::ib_qp_type_IB_QPT_UD,
}

impl QpType {
    /// The QP type of a raw value.
    pub fn from_raw(raw: u32) -> Result<Self> {
        match raw {
            bindings::ib_qp_type_IB_QPT_RC => Ok(Self::Rc),
            bindings::ib_qp_type_IB_QPT_UD => Ok(Self::Ud),
            _ => Err(EINVAL),
        }
    }
}

/// Sizes of a QP's queues: the work requests the consumer keeps in flight.
/// The layer adds a spare slot to each queue (what `ib_drain_qp` needs).
///
/// No port: a QP is made through its id (`rdma_create_qp`), on the port
/// the id resolved or bound to, and the R/W API's transfers use that port
/// too ([`Qp`] records it at creation).
///
/// [`Qp`]: crate::rdma::Qp
#[derive(Clone, Copy, Default)]
pub struct QpCaps {
    /// Send work requests in flight.
    pub max_send_wr: u32,
    /// Receive work requests in flight.
    pub max_recv_wr: u32,
    /// The most bytes a send may carry inline ([`SendBuffer::set_inline`]);
    /// 0 for none.  A device may refuse a QP that asks for more than it
    /// supports (the create fails, `EINVAL`).
    ///
    /// [`SendBuffer::set_inline`]: crate::rdma::SendBuffer::set_inline
    pub max_inline_data: u32,
    /// Scatter/gather entries one RDMA request of the R/W API
    /// ([`Qp::rdma_rw`]) may gather from or scatter to, at most the
    /// device's `max_send_sge` (the create fails otherwise); 0 means 1.
    /// More entries take fewer requests for a buffer of many pages.  A
    /// SEND takes one, or with pages attached
    /// ([`SendBuffer::attach_pages`]) one more for each of their entries.
    ///
    /// [`Qp::rdma_rw`]: crate::rdma::Qp::rdma_rw
    /// [`SendBuffer::attach_pages`]: crate::rdma::SendBuffer::attach_pages
    pub max_send_sge: u32,
    /// Scatter entries one receive may fill: one for the buffer, and one
    /// for each entry of the pages attached to it
    /// ([`RecvBuffer::attach_pages`]); at most the device's
    /// `max_recv_sge` (the create fails otherwise); 0 means 1.
    ///
    /// [`RecvBuffer::attach_pages`]: crate::rdma::RecvBuffer::attach_pages
    pub max_recv_sge: u32,
    /// Transfers of the R/W API in flight, in the core's contexts: the
    /// layer counts [`RW_SLOTS_PER_CTX`] send-queue slots for each (a
    /// registration, the RDMA request, an invalidation, as devices that
    /// register need), and the QP gets at least that many (the core's
    /// `rdma_rw_init_qp` adds one or three a context, the layer two), and
    /// on devices that register a pool of as many registrations.  A
    /// transfer takes the slots of the requests it posts
    /// (more than one for a buffer of more entries than `max_send_sge`).
    /// 0: no R/W API on the QP.
    pub max_rdma_ctxs: u32,
}

/// Send-queue slots the QP reserves for each of [`QpCaps::max_rdma_ctxs`].
pub const RW_SLOTS_PER_CTX: u32 = 3;

impl QpCaps {
    /// CQ entries a QP of these sizes needs on a CQ that takes both its
    /// queues' completions: every request in flight plus two spare ones
    /// (what `ib_drain_qp` needs).
    pub fn cq_entries(&self) -> Result<u32> {
        self.send_cq_entries()?
            .checked_add(self.recv_cq_entries()?)
            .ok_or(EINVAL)
    }

    /// CQ entries a QP of these sizes needs on a CQ of its send queue's
    /// completions alone (see `Qp::prepare`): every send, registration,
    /// invalidation and RDMA request in flight, every slot of the R/W API
    /// (a flushed queue completes each request, signaled or not), plus one
    /// spare.
    pub fn send_cq_entries(&self) -> Result<u32> {
        self.max_send_wr
            .checked_add(1)
            .and_then(|n| n.checked_add(self.rw_slots().ok()?))
            .ok_or(EINVAL)
    }

    /// Send-queue slots of the R/W API.
    pub(super) fn rw_slots(&self) -> Result<u32> {
        self.max_rdma_ctxs
            .checked_mul(RW_SLOTS_PER_CTX)
            .ok_or(EINVAL)
    }

    /// CQ entries a QP of these sizes needs on a CQ of its receive queue's
    /// completions alone: every receive in flight plus one spare.
    pub fn recv_cq_entries(&self) -> Result<u32> {
        self.max_recv_wr.checked_add(1).ok_or(EINVAL)
    }
}
