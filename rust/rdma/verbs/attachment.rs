// SPDX-License-Identifier: GPL-2.0

//! [`Attachment`]: a multicast group as a QP is attached to it, and the
//! layer's bound on a QP's attachments.

use crate::rdma::bindings;

/// The most groups one QP is attached to: the layer's bound on what a
/// consumer makes the QP hold.  (The devices bound the QPs of one group:
/// rxe's `max_mcast_qp_attach`, 56, beyond which an attach fails with
/// `ENOMEM`.)
pub const MAX_ATTACHMENTS: usize = 56;

/// One group a QP is attached to: its MGID and MLID as the join reported
/// them (the MLID is 0 on RoCE).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attachment {
    pub(crate) mgid: [u8; 16],
    pub(crate) mlid: u16,
}

impl Attachment {
    pub(super) fn gid(&self) -> bindings::ib_gid {
        bindings::ib_gid { raw: self.mgid }
    }
}
