// SPDX-License-Identifier: GPL-2.0

//! The QP of a UD id, which the layer creates itself.
//!
//! The CM refuses `rdma_join_multicast` on an id whose `qp` is set (a
//! kernel QP: it warns, and since 5.10 never attaches one), so a UD id's
//! QP is not handed to it.  The layer makes the QP as `rdma_create_qp`
//! would (`ib_create_qp` on the id's port, then INIT with the id's P_Key
//! index, port and Q_Key from `rdma_init_qp_attr`, RTR and RTS), as
//! librdmacm does for the QPs of user space, and names it in the SIDR
//! reply itself.  Otherwise the CM only reads a UD id's `qp` to move it to
//! the error state when an accept fails (the layer's shutdown does that)
//! and to show its number (nldev: `rdma res show cm_id` has none).

use super::locked::{to_result, LockedId};
use crate::rdma::{bindings, pd::Pd};
use core::ptr::NonNull;
use kernel::{prelude::*, sync::Arc};

impl LockedId<'_> {
    /// Creates the QP of this UD id from `attr` on `pd`, in RESET: the
    /// caller moves it to RTS ([`Self::init_ud_qp`]).
    ///
    /// # Safety
    ///
    /// `attr` must be attributes [`crate::rdma::verbs::Qp::prepare`] made
    /// for this id's device, with `pd` and CQs of that device that live
    /// while the QP does.
    pub(super) unsafe fn create_ud_qp(
        &self,
        pd: &Arc<Pd>,
        attr: &mut bindings::ib_qp_init_attr,
    ) -> Result<NonNull<bindings::ib_qp>> {
        attr.port_num = self.port_num();
        // The QP's resource-tracking name is the owner's, as the CM gives
        // the QPs of `rdma_create_qp` the id's (a static string of the
        // module, which outlives the QP).
        // SAFETY: The PD is live; `attr` is valid (safety requirements)
        // and copied by the call, which may sleep (process context).
        let raw = unsafe {
            bindings::ib_create_qp_kernel(pd.as_ptr(), attr, self.owner().name().as_char_ptr())
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        NonNull::new(raw).ok_or(ENOMEM)
    }

    /// Moves a new UD QP of this id to RTS, through INIT with the
    /// attributes the CM gives (`cma_init_ud_qp`'s steps).  `raw` is a QP
    /// [`Self::create_ud_qp`] just made, which nobody else modifies.
    pub(super) fn init_ud_qp(&self, raw: NonNull<bindings::ib_qp>) -> Result {
        // SAFETY: `ib_qp_attr` is a C struct of integers, pointers and
        // unions of such, for which all zeroes is a valid value (C's `{}`);
        // bindgen cannot derive that through the address vectors' unions.
        let mut attr: bindings::ib_qp_attr = unsafe { core::mem::zeroed() };
        let mut mask: core::ffi::c_int = 0;
        attr.qp_state = bindings::ib_qp_state_IB_QPS_INIT;
        // For a UD id it fills the P_Key index, the port and the Q_Key
        // (`cma_set_default_qkey`: the port space's, as `rdma_create_qp`).
        // SAFETY: The id is live and its handler mutex held (type
        // invariants), as ucma holds its mutex; both outputs are writable.
        to_result(unsafe { bindings::rdma_init_qp_attr(self.as_ptr(), &mut attr, &mut mask) })?;
        let modify = |attr: &mut bindings::ib_qp_attr, mask: u32| {
            // SAFETY: `raw` is live (just created by the caller) and
            // modified by nobody else; `attr` is valid for the call.
            to_result(unsafe { bindings::ib_modify_qp(raw.as_ptr(), attr, mask as i32) })
        };
        modify(&mut attr, mask as u32)?;
        attr.qp_state = bindings::ib_qp_state_IB_QPS_RTR;
        modify(&mut attr, bindings::ib_qp_attr_mask_IB_QP_STATE)?;
        attr.qp_state = bindings::ib_qp_state_IB_QPS_RTS;
        attr.sq_psn = 0;
        modify(
            &mut attr,
            bindings::ib_qp_attr_mask_IB_QP_STATE | bindings::ib_qp_attr_mask_IB_QP_SQ_PSN,
        )
    }
}
