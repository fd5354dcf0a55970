// SPDX-License-Identifier: GPL-2.0

//! A UD QP's multicast attachments (`ib_attach_mcast`, `ib_detach_mcast`):
//! the groups whose datagrams the device delivers to the QP.
//!
//! The QP keeps the list of its attachments and detaches what is left
//! when it is shut down: `ib_attach_mcast` counts on the QP, and
//! `ib_destroy_qp` refuses (`EBUSY`) a QP that is still attached, which
//! would leave it, and its CQs and PD, alive for good.

use super::{
    attachment::{Attachment, MAX_ATTACHMENTS},
    completion::CompletionHandler,
    qp::Qp,
    QpType,
};
use crate::rdma::bindings;
use core::ptr::NonNull;
use kernel::prelude::*;

impl<C: CompletionHandler> Qp<C> {
    /// Attaches the QP to a multicast group: the device delivers the
    /// group's datagrams to it.  UD QPs only (`EINVAL`); attaching twice to
    /// one group is `EEXIST`, beyond [`MAX_ATTACHMENTS`] `ENOSPC`, and
    /// once the QP is shut down `ESHUTDOWN`.  Sleeps.
    pub(crate) fn attach_multicast(&self, group: Attachment) -> Result {
        if self.qp_type() != QpType::Ud {
            return Err(EINVAL);
        }
        let mut attached = self.multicast.lock();
        if attached.contains(&group) {
            return Err(EEXIST);
        }
        if attached.len() >= MAX_ATTACHMENTS {
            return Err(ENOSPC);
        }
        attached.reserve(1, GFP_KERNEL)?;
        // Under `raw`'s lock: a shutdown takes the QP either before (then
        // nothing is attached) or after (then it finds the entry below).
        let raw = self.raw.lock();
        let qp = raw.ok_or(ESHUTDOWN)?;
        let mut gid = group.gid();
        // SAFETY: The QP is live while `raw` holds it (type invariants),
        // and `raw`'s lock is held; `gid` is readable for the call, which
        // copies it (`ib_attach_mcast` checks that the GID is multicast).
        kernel::error::to_result(unsafe {
            bindings::ib_attach_mcast(qp.as_ptr(), &mut gid, group.mlid)
        })?;
        // Reserved above: never allocates.
        attached.push_within_capacity(group).map_err(|_| ENOMEM)?;
        Ok(())
    }

    /// Detaches the QP from a group it was attached to (`ENOENT`
    /// otherwise, also after the shutdown, which detached it).  Sleeps.
    pub(crate) fn detach_multicast(&self, group: Attachment) -> Result {
        let mut attached = self.multicast.lock();
        let index = attached.iter().position(|a| *a == group).ok_or(ENOENT)?;
        let raw = self.raw.lock();
        let qp = raw.ok_or(ENOENT)?;
        Self::detach_raw(qp, group)?;
        attached.remove(index).map_err(|_| EINVAL)?;
        Ok(())
    }

    /// Detaches every group (at the shutdown, which took the QP from
    /// `raw`, so that no attachment can follow).
    pub(super) fn detach_all_multicast(&self, qp: NonNull<bindings::ib_qp>) {
        let mut attached = self.multicast.lock();
        for group in attached.drain_all() {
            // A driver that fails to detach keeps the QP counted: its
            // destruction then fails, and says so.
            if let Err(e) = Self::detach_raw(qp, group) {
                pr_err!("a QP could not leave a multicast group ({e:?})\n");
            }
        }
    }

    fn detach_raw(qp: NonNull<bindings::ib_qp>, group: Attachment) -> Result {
        let mut gid = group.gid();
        // SAFETY: The caller holds the live QP (from `raw`, or taken from
        // it by the shutdown, before its destruction); the QP was attached
        // to `gid` (the list's entry); `gid` is readable for the call.
        kernel::error::to_result(unsafe {
            bindings::ib_detach_mcast(qp.as_ptr(), &mut gid, group.mlid)
        })
    }
}
