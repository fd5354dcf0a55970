// SPDX-License-Identifier: GPL-2.0

//! What a completion hands back to a [`CompletionHandler`]: the kinds of
//! work request and their outcomes, a QP's asynchronous events, and the C
//! callbacks of message buffers.

use super::buffer::{RecvBuffer, SendBuffer};
use crate::rdma::{bindings, mr::Mr, sg::SgBuffer};
use kernel::{prelude::*, sync::Arc};

/// The kinds of memory work requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkOp {
    /// `IB_WR_REG_MR`.
    Register,
    /// `IB_WR_LOCAL_INV`.
    Invalidate,
    /// `IB_WR_RDMA_READ`: peer memory into the local region.
    RdmaRead,
    /// `IB_WR_RDMA_WRITE`: the local region into peer memory.
    RdmaWrite,
}

/// A completed memory work request, handed to
/// [`CompletionHandler::work_done`].
pub struct WorkDone {
    /// What was posted.
    pub op: WorkOp,
    /// The consumer's tag from the post.
    pub tag: u64,
    /// The region the request named; dropping the last reference
    /// deregisters it.
    pub mr: Arc<Mr>,
}

/// The direction of an RDMA transfer: of the R/W API ([`Qp::rdma_rw`]) or
/// through one registered region ([`Qp::rdma`]).
///
/// [`Qp::rdma_rw`]: crate::rdma::Qp::rdma_rw
/// [`Qp::rdma`]: crate::rdma::Qp::rdma
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RwOp {
    /// RDMA READ: the peer's memory into the buffer.
    Read,
    /// RDMA WRITE: the buffer into the peer's memory.
    Write,
}

impl RwOp {
    pub(super) fn direction(self) -> bindings::dma_data_direction {
        match self {
            Self::Read => bindings::dma_data_direction::DMA_FROM_DEVICE,
            Self::Write => bindings::dma_data_direction::DMA_TO_DEVICE,
        }
    }
}

/// A completed [`Qp::rdma_rw`] transfer, handed to
/// [`CompletionHandler::rw_done`].
///
/// [`Qp::rdma_rw`]: crate::rdma::Qp::rdma_rw
pub struct RwDone {
    /// What was posted.
    pub op: RwOp,
    /// The consumer's tag from the post.
    pub tag: u64,
    /// The buffer, unmapped again: after a successful READ it holds the
    /// peer's bytes.  A failed iWARP READ's buffer comes back only once
    /// its QP is destroyed: the READ request gave the peer a key to write
    /// into it, which only the READ's success revokes.  On a device that
    /// places remote WRITEs after their key ended, the buffer comes back an
    /// RCU grace period after the key ended
    /// (`Documentation/rdma_cm_rs/design.rst`, "Driver behaviour").
    pub buf: SgBuffer,
}

/// Receives the buffers of completed work requests: of a QP's receives on
/// its receive CQ's handler, of its sends and memory work requests on its
/// send CQ's handler.
///
/// Runs in process context: on the CQ's workqueue, or for a
/// [`PollContext::Direct`] or [`PollContext::Notified`] CQ in the task that
/// polls it ([`Cq::poll`],
/// a [`crate::rdma::BusyPoller`] loop, a QP's teardown), under whatever
/// that task holds: a poller that holds a lock its handler takes
/// deadlocks.  Requests the driver never flushed are completed as flushed
/// by the task that destroys their QP (see the module's Teardown), which
/// may hold the id's handler mutex: both are callbacks of the layer, where
/// `CmId::with_lock` on another id refuses.  A CM id dropped here is
/// destroyed from a workqueue: its QP's shutdown could otherwise wait for
/// this very context.
///
/// [`PollContext::Direct`]: crate::rdma::PollContext::Direct
/// [`PollContext::Notified`]: crate::rdma::PollContext::Notified
/// [`Cq::poll`]: crate::rdma::Cq::poll
pub trait CompletionHandler: Send + Sync + 'static {
    /// A receive completed: `Ok(len)` bytes arrived (into the buffer, and
    /// past its capacity into its attached pages), or the error (ECANCELED
    /// when the QP was flushed).
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>);
    /// A send completed.
    fn send_done(&self, buf: SendBuffer, result: Result);

    /// A memory work request (registration, invalidation, RDMA READ or
    /// WRITE) completed.  Errors: `EACCES` for a remote access error (bad
    /// key, range or permission at the peer), `EHOSTUNREACH` when the
    /// transport's retries ran out, `ECANCELED` when the QP was flushed,
    /// `EIO` otherwise.  The default logs failures other than flushes.
    fn work_done(&self, done: WorkDone, result: Result) {
        if let Err(e) = result {
            if e != ECANCELED {
                pr_warn!("{:?} (tag {}) failed: {:?}\n", done.op, done.tag, e);
            }
        }
    }

    /// A transfer of the R/W API ([`Qp::rdma_rw`]) completed, with the
    /// errors of [`Self::work_done`].  The default logs failures other
    /// than flushes and drops the buffer.
    ///
    /// [`Qp::rdma_rw`]: crate::rdma::Qp::rdma_rw
    fn rw_done(&self, done: RwDone, result: Result) {
        if let Err(e) = result {
            if e != ECANCELED {
                pr_warn!("R/W {:?} (tag {}) failed: {:?}\n", done.op, done.tag, e);
            }
        }
    }

    /// An asynchronous event of the QP numbered `qp_num` whose send queue
    /// completes on this handler's CQ.  Runs in the driver's context, which may be
    /// atomic (a softirq, or with the driver's locks held): it must not
    /// sleep, so it may not take a `Mutex`, post, or drop the last
    /// reference to a QP or CM id; a ULP that must act records the event
    /// and acts from process context.  Comes only while the QP exists.
    /// The default logs the errors ([`QpEvent::is_error`]).
    fn qp_event(&self, qp_num: u32, event: QpEvent) {
        if event.is_error() {
            pr_warn!("QP {}: {:?}\n", qp_num, event);
        }
    }
}

/// An asynchronous event of a QP (the QP's `enum ib_event_type`s): what the
/// device reports outside the completions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpEvent {
    /// `IB_EVENT_QP_FATAL`: an error no completion could report moved the
    /// QP to the error state; its outstanding requests are flushed.
    Fatal,
    /// `IB_EVENT_QP_REQ_ERR`: the peer sent an invalid request (a transport
    /// error of the responder); the QP is in the error state.
    RequestError,
    /// `IB_EVENT_QP_ACCESS_ERR`: the peer's RDMA request violated a local
    /// region's key, range or rights and no receive could carry the error;
    /// the QP is in the error state.
    AccessError,
    /// `IB_EVENT_COMM_EST`: a message arrived before the connection's
    /// establishment reached the QP's owner (the IB CM's RTU lost or
    /// late).  A QP of a CM id has its CM told (`rdma_notify`) before the
    /// handler hears of it.
    CommEstablished,
    /// `IB_EVENT_SQ_DRAINED`: the send queue drained after a move to SQD.
    SendQueueDrained,
    /// `IB_EVENT_PATH_MIG`: the QP migrated to its alternate path.
    PathMigrated,
    /// `IB_EVENT_PATH_MIG_ERR`: migrating to the alternate path failed.
    PathMigrationError,
    /// `IB_EVENT_QP_LAST_WQE_REACHED`: the last request of a QP in error
    /// that takes its receives from a shared receive queue completed.
    LastWqeReached,
    /// Another event code a driver reported for the QP.
    Other(u32),
}

impl QpEvent {
    /// The event of a raw `ib_event_type`.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            bindings::ib_event_type_IB_EVENT_QP_FATAL => Self::Fatal,
            bindings::ib_event_type_IB_EVENT_QP_REQ_ERR => Self::RequestError,
            bindings::ib_event_type_IB_EVENT_QP_ACCESS_ERR => Self::AccessError,
            bindings::ib_event_type_IB_EVENT_COMM_EST => Self::CommEstablished,
            bindings::ib_event_type_IB_EVENT_SQ_DRAINED => Self::SendQueueDrained,
            bindings::ib_event_type_IB_EVENT_PATH_MIG => Self::PathMigrated,
            bindings::ib_event_type_IB_EVENT_PATH_MIG_ERR => Self::PathMigrationError,
            bindings::ib_event_type_IB_EVENT_QP_LAST_WQE_REACHED => Self::LastWqeReached,
            other => Self::Other(other),
        }
    }

    /// Whether the event reports an error that moved the QP to the error
    /// state.
    pub fn is_error(&self) -> bool {
        matches!(self, Self::Fatal | Self::RequestError | Self::AccessError)
    }
}

/// A work completion's status as a result.
pub(super) fn wc_result(wc: &bindings::ib_wc) -> Result {
    match wc.status {
        bindings::ib_wc_status_IB_WC_SUCCESS => Ok(()),
        bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR => Err(ECANCELED),
        bindings::ib_wc_status_IB_WC_REM_ACCESS_ERR => Err(EACCES),
        bindings::ib_wc_status_IB_WC_RETRY_EXC_ERR
        | bindings::ib_wc_status_IB_WC_RNR_RETRY_EXC_ERR => Err(EHOSTUNREACH),
        _ => Err(EIO),
    }
}
