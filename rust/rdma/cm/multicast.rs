// SPDX-License-Identifier: GPL-2.0

//! Multicast groups of UD ids: joins (`rdma_join_multicast`), their
//! events, the id's QP attached to the groups it receives from, and leaves
//! (`rdma_leave_multicast`).
//!
//! An id keeps the groups it joined.  When a group's `MULTICAST_JOIN`
//! comes, before the handler runs, the layer attaches the id's QP to it
//! (a full member only: a send-only member receives nothing), as librdmacm
//! does for user space; a QP made later is attached to the groups joined
//! before.  The handler turns the event into a destination for sends to
//! the group ([`LockedId::multicast_dest`]).  A leave waits for a join
//! event still in flight, so it runs without the handler mutex, as a
//! disconnect does; the id's destruction leaves every group (the CM's
//! `_destroy_id`), its QP's shutdown detaches it from each.
//!
//! On RoCE the CM joins without an SA (`cma_iboe_join_multicast`: it
//! derives the MGID from the address, sends the IGMP report and makes the
//! event itself); on RoCE v2 it refuses IPv6 groups.

use super::{
    groups::{Group, Groups, JoinState, MAX_GROUPS},
    locked::LockedId,
    qp_slot::QpSlot,
};
use crate::rdma::{
    addr::SocketAddr,
    ah::{Ah, UdDest},
    bindings,
    device::Transport,
    event::{Event, EventType},
    pd::Pd,
    verbs::{Attachment, QpShutdown, QpType},
};
use kernel::{
    prelude::*,
    sync::{Arc, Mutex},
};

/// The token of a multicast event (the join's context).
fn token_of(event: &Event<'_>) -> Option<usize> {
    event
        .multicast_param()
        .map(|ud| ud.raw.private_data as usize)
}

/// Attaches `qp` to a joined group a full member receives from, recording
/// the outcome.
fn attach(qp: &dyn QpShutdown, group: &mut Group) {
    if group.state != JoinState::FullMember {
        return;
    }
    if let Some(at) = group.joined {
        group.attached = match qp.attach_multicast(at) {
            Err(e) if e == EEXIST => Ok(()),
            other => other,
        };
    }
}

impl LockedId<'_> {
    fn groups(&self) -> Result<&Mutex<Groups>> {
        self.state_groups().ok_or(EINVAL)
    }

    /// Joins a multicast group (`rdma_join_multicast`): after the id was
    /// bound to a local address or its address resolved (`EINVAL`
    /// before).  `MULTICAST_JOIN` follows (or `MULTICAST_ERROR`), with the
    /// group ([`Self::multicast_group`]) and what
    /// [`Self::multicast_dest`] makes into a destination.
    ///
    /// UD ids only, on devices with UD (`EINVAL` on an RC id or an id a
    /// request made and not adopted, `EPROTONOSUPPORT` on iWARP); a group
    /// address only (`EINVAL`); one join per group (`EADDRINUSE`: leave
    /// it first); at most [`MAX_GROUPS`] (`ENOSPC`).  `EOPNOTSUPP` for a
    /// group the device's protocol cannot join (IPv6 on RoCE v2), `EBUSY`
    /// while a leave or a listen of the id runs.
    pub fn join_multicast(&self, group: &SocketAddr, state: JoinState) -> Result {
        let groups = self.groups()?;
        if self.qp_type() != QpType::Ud || !group.is_multicast() {
            return Err(EINVAL);
        }
        // No device yet (neither bound nor resolved): the CM's EINVAL.
        if self.transport().map_err(|_| EINVAL)? == Transport::Iwarp {
            return Err(EPROTONOSUPPORT);
        }
        let _excluded = self.exclude_unlocked_calls()?;
        let mut g = groups.lock();
        if g.list.iter().any(|x| x.addr == *group) {
            return Err(EADDRINUSE);
        }
        if g.list.len() >= MAX_GROUPS {
            return Err(ENOSPC);
        }
        g.list.reserve(1, GFP_KERNEL)?;
        let token = g.next_token;
        g.next_token = g.next_token.wrapping_add(1).max(1);
        let mut buf = group.to_sockaddr();
        // The event cannot run before this returns: the handler mutex is
        // held.  The context is a number the CM only hands back.
        // SAFETY: The id is live and locked; `buf` is a valid sockaddr of
        // the group, copied by the call.  The id has no `qp` (a UD id's QP
        // is the layer's), which the CM refuses.
        let ret = unsafe {
            bindings::rdma_join_multicast(
                self.as_ptr(),
                (&raw mut buf).cast(),
                state.raw(),
                token as *mut core::ffi::c_void,
            )
        };
        // The CM's internal ENOTSUPP (IPv6 on RoCE v2) is no errno of user
        // space.
        if ret == -(bindings::ENOTSUPP as i32) || ret == -(bindings::ENOSYS as i32) {
            return Err(EOPNOTSUPP);
        }
        super::locked::to_result(ret)?;
        g.list
            .push_within_capacity(Group {
                addr: *group,
                state,
                token,
                joined: None,
                attached: Ok(()),
            })
            .map_err(|_| ENOMEM)
    }

    /// The group a `MULTICAST_JOIN` or `MULTICAST_ERROR` event of this id
    /// is for.
    pub fn multicast_group(&self, event: &Event<'_>) -> Option<SocketAddr> {
        let token = token_of(event)?;
        let mut g = self.state_groups()?.lock();
        g.by_token(token).map(|group| group.addr)
    }

    /// A destination for datagrams to the group of a `MULTICAST_JOIN`
    /// event: an address handle on `pd` (the PD of the id's QP) from the
    /// event's address vector, the all-ones QP number and the group's
    /// Q_Key.  Call it from the handler: the vector lives only as long as
    /// the event.  `EINVAL` for another event, `EXDEV` for a PD of another
    /// device than the id's; the error that attaching the id's QP to the
    /// group met, if it did.
    pub fn multicast_dest(&self, event: &Event<'_>, pd: &Arc<Pd>) -> Result<UdDest> {
        if event.kind() != EventType::MulticastJoin {
            return Err(EINVAL);
        }
        let ud = event.multicast_param().ok_or(EINVAL)?;
        let token = ud.raw.private_data as usize;
        self.groups()?
            .lock()
            .by_token(token)
            .ok_or(ENOENT)?
            .attached?;
        self.device()?.check_same(pd.device())?;
        let attr = &ud.raw.ah_attr;
        // The CM drops the vector's source GID reference only after the
        // handler returned (`cma_iboe_join_work_handler` on RoCE,
        // `cma_ib_mc_handler` on IB).
        // SAFETY: `attr` is this MULTICAST_JOIN's vector (`cma_make_mc_event`),
        // its reference held while the borrowed event lives.
        let ah = unsafe { Ah::from_attr(pd, attr) }?;
        // SAFETY: Any bytes are a valid GID.
        let mgid = unsafe { attr.grh.dgid.raw };
        UdDest::new(ah, ud.qp_num() & 0x00ff_ffff, ud.qkey(), Some(mgid))
    }

    /// Before the handler sees a multicast event: records the group the
    /// join reported and attaches the id's QP to it.
    pub(super) fn note_multicast_event(&self, event: &Event<'_>) {
        let (Some(token), Some(groups)) = (token_of(event), self.state_groups()) else {
            return;
        };
        let mut g = groups.lock();
        let Some(group) = g.by_token(token) else {
            return;
        };
        if event.kind() == EventType::MulticastError {
            // The group failed (on IB, after a join the SA reported): the
            // QP no longer receives from it.
            let (joined, full) = (group.joined.take(), group.state == JoinState::FullMember);
            if let (Some(at), true) = (joined, full) {
                if !g.still_attached(at, token) {
                    if let Some(qp) = self.live_qp() {
                        let _ = qp.detach_multicast(at);
                    }
                }
            }
            return;
        }
        let Some(ud) = event.multicast_param() else {
            return;
        };
        let attr = &ud.raw.ah_attr;
        // SAFETY: Any bytes are a valid GID.
        let mgid = unsafe { attr.grh.dgid.raw };
        let mlid = if attr.type_ == bindings::rdma_ah_attr_type_RDMA_AH_ATTR_TYPE_IB {
            // The member through a cast of the union, as `Event::conn_param`
            // does: the kernel's bindings make it a Rust union, a module's
            // a struct of `__BindgenUnionField`s; every member starts at
            // its start.
            // SAFETY: An IB address vector fills the union's `ib` member.
            unsafe { (*(&raw const attr.__bindgen_anon_1).cast::<bindings::ib_ah_attr>()).dlid }
        } else {
            // RoCE has no LIDs: the group is its MGID.
            0
        };
        group.joined = Some(Attachment { mgid, mlid });
        if let Some(qp) = self.live_qp() {
            attach(&*qp, group);
        }
    }

    /// Attaches a QP just made to the groups joined before it.
    pub(super) fn attach_joined_groups(&self, qp: &dyn QpShutdown) {
        if let Some(groups) = self.state_groups() {
            for group in groups.lock().list.iter_mut() {
                attach(qp, group);
            }
        }
    }
}

/// Leaves a group of the live UD id `raw` (`rdma_leave_multicast`), then
/// detaches its QP from it.  `ENOENT` if the id did not join it.
///
/// # Safety
///
/// `raw` must be a live id whose groups are `groups` and QP slot
/// `qp_slot`, not destroyed during the call, whose handler mutex this task
/// does not hold, with no other leave of it running.
pub(super) unsafe fn leave(
    raw: *mut bindings::rdma_cm_id,
    groups: &Mutex<Groups>,
    qp_slot: &Mutex<QpSlot>,
    group: &SocketAddr,
) -> Result {
    let token = groups
        .lock()
        .list
        .iter()
        .find(|g| g.addr == *group)
        .map(|g| g.token)
        .ok_or(ENOENT)?;
    let mut buf = group.to_sockaddr();
    // Without the groups' lock: the CM waits here for the group's join
    // event if it is running or queued (`cancel_work_sync`), whose
    // handling takes it.
    // SAFETY: `raw` is live; `buf` is a valid sockaddr of the group; the
    // handler mutex, which the join's event work takes, is not held by
    // this task (safety requirements).
    unsafe { bindings::rdma_leave_multicast(raw, (&raw mut buf).cast()) };
    let mut g = groups.lock();
    let index = g.list.iter().position(|x| x.token == token).ok_or(ENOENT)?;
    let left = g.list.remove(index).map_err(|_| EINVAL)?;
    // The group is left from here on, whatever the detach does.
    let Some(at) = left.joined.filter(|_| left.state == JoinState::FullMember) else {
        return Ok(());
    };
    if g.still_attached(at, token) {
        return Ok(());
    }
    let qp = match &*qp_slot.lock() {
        QpSlot::Live(qp) => Some(qp.clone()),
        _ => None,
    };
    if let Some(qp) = qp {
        // ENOENT: not attached (the QP was shut down, or made anew after a
        // failed attach).  Another failure leaves the attachment to the
        // QP's shutdown, which detaches what is left.
        match qp.detach_multicast(at) {
            Ok(()) => {}
            Err(e) if e == ENOENT => {}
            Err(e) => pr_warn!("a QP stays attached to a group it left ({e:?})\n"),
        }
    }
    Ok(())
}
