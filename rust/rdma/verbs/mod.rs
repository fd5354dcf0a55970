// SPDX-License-Identifier: GPL-2.0

//! Verbs for the data path: completion queues, reliable connected and
//! unreliable datagram queue pairs, DMA-mapped message buffers, datagrams
//! to [`UdDest`]s, and the memory work requests (registration,
//! invalidation, RDMA READ/WRITE) over [`Mr`]s on reliable connected QPs.
//!
//! This level knows nothing of the connection manager: a [`Qp`] is
//! prepared here (`Qp::prepare`), created by whoever owns the QP's
//! connection (the CM's `rdma_create_qp`, or the CM level itself for a UD
//! id), recorded with `Qp::set_created`, attached to the multicast groups
//! its owner joins, and shut down (`QpShutdown`, which detaches it from
//! them) before its owner destroys it.
//!
//! # Ownership
//!
//! * A buffer is owned by the consumer until it is posted; posting moves it
//!   into the QP, and its completion hands it back to the
//!   [`CompletionHandler`] (also when the QP is flushed at teardown).  A
//!   buffer in flight can therefore be neither freed nor reused.
//! * Every object lives on one [`Device`] and holds a reference to it.  A
//!   QP is made of a PD and a CQ of its connection's device, and posts only
//!   buffers and regions of that device (`EXDEV` otherwise) and of its own
//!   PD (`EINVAL` otherwise), before any of it reaches the driver.  A
//!   buffer holds its PD: the local key it is posted with is the PD's.
//! * A UD send holds its destination's address handle until its
//!   completion; the address handle holds its PD.  A UD receive reserves
//!   the first [`GRH_SIZE`] bytes of its buffer for the global route
//!   header and reports the payload after it, with the sender
//!   ([`Datagram`]).  A QP takes only the work its type has: SENDs without
//!   a destination and memory work on RC QPs, datagrams on UD QPs
//!   (`EOPNOTSUPP` otherwise), and no datagram larger than the port's MTU
//!   (`EMSGSIZE`: a device may report such a send as successful and emit
//!   nothing, as the IBTA allows).
//! * A QP keeps its PD and CQs alive; they are freed after it.  Its send
//!   and receive queues complete on one CQ or on two (a ULP that polls its
//!   receives apart from its sends); each CQ's handler gets its own
//!   queue's completions.  A QP takes no more work requests than its
//!   [`QpCaps`] (`ENOSPC`), counted from post to completion; it reserves
//!   room on its CQs for all of them plus a spare entry for each queue,
//!   and one spare slot in each queue (what `ib_drain_qp` needs).  No
//!   completion can be lost to a full CQ.
//! * A [`Srq`] shares its receive buffers among the RC QPs created on it
//!   (of its PD and handler type); each QP holds it, so it outlives them,
//!   and it reserves room for all its receives once on each CQ they
//!   complete on.  Its buffers are its own until a completion hands one to
//!   the handler of the QP that took it; those left at its destruction
//!   are freed then.
//! * Pages attached to a send or a receive ([`SendBuffer::attach_pages`])
//!   go with their buffer: mapped for the device from the post to the
//!   completion, and handed back unmapped and attached with it.
//! * A transfer of the R/W API ([`Qp::rdma_rw`]) owns its [`SgBuffer`]
//!   from post to completion, mapped for the QP's device meanwhile, and
//!   hands it back unmapped to [`CompletionHandler::rw_done`].
//! * A request the driver did not refuse by name is the driver's, even
//!   when the post failed (see [`Qp::rdma_rw`] and the design notes): it
//!   stays tracked and the QP goes to the error state.
//!
//! # Teardown
//!
//! A QP tracks every request it has posted until its completion ran.  Its
//! shutdown moves it to the error state, where the driver flushes every
//! outstanding request through the CQ, and waits for that, bounded by
//! [`FLUSH_TIMEOUT`]: unlike `ib_drain_qp`, which waits for good, and does
//! when a driver never flushes (`design.rst`, "Driver behaviour").
//! Requests still outstanding then are completed as flushed
//! (`QpShutdown::reclaim`) once the owner has destroyed the QP, so the
//! device can no longer reach their memory, and the CQ's poll work has
//! handed over whatever the driver had queued before.  Either way every
//! buffer and region comes back to the [`CompletionHandler`] exactly once.
//!
//! [`Datagram`]: super::ah::Datagram
//! [`Device`]: super::device::Device
//! [`GRH_SIZE`]: super::ah::GRH_SIZE
//! [`Mr`]: super::mr::Mr
//! [`SgBuffer`]: super::sg::SgBuffer
//! [`UdDest`]: super::ah::UdDest

mod attachment;
mod buffer;
mod caps;
mod completion;
mod cq;
mod cq_wait;
mod credits;
mod drain;
mod mem;
mod multicast;
mod post_error;
mod qp;
mod request;
mod rw;
mod srq;

pub(crate) use self::{
    attachment::Attachment,
    qp::{CommEstNotify, QpQueues, QpShutdown},
};
pub use self::{
    attachment::MAX_ATTACHMENTS,
    buffer::{RecvBuffer, SendBuffer},
    caps::{QpCaps, QpType, RW_SLOTS_PER_CTX},
    completion::{CompletionHandler, QpEvent, RwDone, RwOp, WorkDone, WorkOp},
    cq::{Cq, PollContext},
    cq_wait::CqMark,
    credits::FLUSH_TIMEOUT,
    mem::PreparedRegistration,
    post_error::PostError,
    qp::Qp,
    srq::{Srq, SrqCaps, SrqEvent, SrqEvents},
};
