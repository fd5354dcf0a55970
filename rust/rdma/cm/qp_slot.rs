// SPDX-License-Identifier: GPL-2.0

//! The QP an id owns ([`QpSlot`]) and its destruction, through the CM or
//! not, by the QP type.

use crate::rdma::{
    bindings,
    verbs::{QpShutdown, QpType},
};
use core::ptr::NonNull;
use kernel::{prelude::*, sync::Arc};

/// The QP an id owns.
pub(super) enum QpSlot {
    /// None yet (or destroyed by [`LockedId::destroy_qp`](super::LockedId::destroy_qp)).
    Empty,
    /// The id's live QP.
    Live(Arc<dyn QpShutdown>),
    /// [`LockedId::destroy_qp`](super::LockedId::destroy_qp) is tearing the
    /// QP down: its teardown runs completion handlers in the caller's
    /// task, which may reach this id
    /// again (a nested `with_lock`), and must find neither a QP to destroy
    /// nor room for a new one, which `rdma_create_qp` would put in the
    /// id's `qp` over the one being destroyed.
    TearingDown,
    /// The id is being destroyed: no QP may be created any more.
    Dying,
}

/// Destroys the QP of `id` that its shutdown returned: through the CM
/// (`rdma_destroy_qp`) for an RC id, whose QP the CM holds, directly for a
/// UD id, whose QP it does not know.  `EBUSY` if the QP stayed (a UD QP
/// a driver refused to destroy): its events may still come, so the
/// caller must keep the QP object for good, and not reclaim it.
///
/// # Safety
///
/// `id` must be a live id of QP type `qp_type` and `qp` its QP, shut down
/// ([`crate::rdma::verbs::QpShutdown::shutdown`] returned it): nothing
/// posts to it any more and nobody else destroys it.
pub(super) unsafe fn destroy_id_qp(
    id: *mut bindings::rdma_cm_id,
    qp_type: QpType,
    qp: NonNull<bindings::ib_qp>,
) -> Result {
    match qp_type {
        QpType::Rc => {
            // SAFETY: By the safety requirements; `rdma_destroy_qp` takes
            // the id's `qp_mutex` against the CM's own uses of the QP.
            unsafe { bindings::rdma_destroy_qp(id) };
            Ok(())
        }
        QpType::Ud => {
            // SAFETY: By the safety requirements; the shutdown detached
            // every multicast group, so the QP counts no user.
            let ret = unsafe { bindings::ib_destroy_qp_user(qp.as_ptr(), core::ptr::null_mut()) };
            if ret != 0 {
                // Kernel QPs do not fail to go but for a count of users
                // (an attachment a driver failed to drop).
                pr_err!("a UD QP could not be destroyed ({ret}): it is kept\n");
                return Err(EBUSY);
            }
            Ok(())
        }
    }
}
