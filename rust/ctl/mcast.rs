// SPDX-License-Identifier: GPL-2.0

//! `JOIN_MCAST` and `LEAVE_MCAST`: multicast groups of a UD id.
//!
//! A join makes the id's UD QP (its data path, as `CONNECT` does) when it
//! has none, and records the join's context, which the group's events
//! carry in place of the id's; the `MULTICAST_JOIN` event turns the group
//! into a peer of the id (see `id.rs`).

use super::{addr_from_abi, conn::Conn, read_arg, require_zero, write_arg, CtlFile, CtlId};
use crate::{
    abi,
    rdma::{EventType, JoinState, LockedId, QpType, SocketAddr, SyncOp},
};
use kernel::prelude::*;

impl CtlFile {
    pub(super) fn join_mcast(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::JoinMcast = read_arg(arg)?;
        require_zero(&[c.flags & !abi::JOIN_SENDONLY])?;
        let group = addr_from_abi(&c.addr.bytes)?.ok_or(EINVAL)?;
        let state = if c.flags & abi::JOIN_SENDONLY != 0 {
            JoinState::SendOnlyFullMember
        } else {
            JoinState::FullMember
        };
        let id = self.get(c.id)?;
        let context = c.context;
        let shared = Self::shared(&id);
        if shared.sync {
            let mut st = shared.state.lock();
            // One blocking call at a time: the waiter refuses another.
            if st.joining.is_none() {
                st.joining = Some(group);
            }
        }
        let start = || id.with_lock(|l| Self::start_join(&id, l, &group, state, context));
        let (mut result, write_back) =
            Self::run(&id, SyncOp::JoinMulticast, &mut c.sync, nonblock, start);
        if shared.sync {
            // An interrupted or timed-out call leaves the join in flight,
            // for the call that resumes it.
            // A call refused for another's in flight leaves that one's.
            let in_flight = matches!(result, Err(e) if e == EINTR || e == ERESTARTSYS || e == ETIMEDOUT || e == EBUSY);
            let mut st = shared.state.lock();
            if !in_flight && st.joining == Some(group) {
                st.joining = None;
            }
        }
        // The group as a peer may have failed after the CM's join
        // succeeded: the event user space gets says so, and so does the
        // call.
        if write_back && c.sync.event.event == EventType::MulticastError as u32 {
            result = Err(Error::from_errno(c.sync.event.status.min(-1)));
        }
        if write_back {
            write_arg(arg, &c)?;
        }
        result
    }

    /// Joins under the handler mutex, which keeps the join's event from
    /// running before its context is recorded.
    fn start_join(
        id: &CtlId,
        l: &LockedId<'_>,
        group: &SocketAddr,
        state: JoinState,
        context: u64,
    ) -> Result {
        // Before any QP is made: neither bound nor resolved is the CM's
        // EINVAL.
        if l.qp_type() != QpType::Ud || l.device().is_err() {
            return Err(EINVAL);
        }
        let shared = Self::shared(id);
        let existing = {
            let mut st = shared.state.lock();
            if st.mcast.iter().any(|(g, _)| g == group) {
                return Err(EADDRINUSE);
            }
            if st.mcast.len() >= abi::MAX_MCAST_GROUPS {
                return Err(ENOSPC);
            }
            st.mcast.reserve(1, GFP_KERNEL)?;
            st.conn.clone()
        };
        let made = match existing {
            Some(_) => None,
            None => match Conn::setup(l, shared.busy_poll) {
                Ok(conn) => Some(conn),
                Err(e) => {
                    // ENOENT when setup failed before the QP existed.
                    let _ = l.destroy_qp();
                    return Err(e);
                }
            },
        };
        if let Err(e) = l.join_multicast(group, state) {
            if made.is_some() {
                let _ = l.destroy_qp();
            }
            return Err(e);
        }
        let mut st = shared.state.lock();
        if let Some(conn) = made {
            st.conn = Some(conn);
        }
        // Reserved above: never allocates.
        st.mcast
            .push_within_capacity((*group, context))
            .map_err(|_| ENOMEM)
    }

    pub(super) fn leave_mcast(&self, arg: usize) -> Result {
        let c: abi::LeaveMcast = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        let group = addr_from_abi(&c.addr.bytes)?.ok_or(EINVAL)?;
        let id = self.get(c.id)?;
        // A synchronous join of the group still waiting would wait for an
        // event the leave cancels.
        if Self::shared(&id).state.lock().joining == Some(group) {
            return Err(EBUSY);
        }
        // The leave waits for the group's join event if it is in flight,
        // whose handling needs the id's state: not held here.
        id.leave_multicast(&group)?;
        Self::shared(&id)
            .state
            .lock()
            .mcast
            .retain(|(g, _)| *g != group);
        Ok(())
    }
}
