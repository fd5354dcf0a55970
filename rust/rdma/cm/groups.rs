// SPDX-License-Identifier: GPL-2.0

//! The multicast groups an id joined ([`Groups`]), and how it joins one
//! ([`JoinState`]).

use crate::rdma::{
    addr::SocketAddr,
    bindings,
    verbs::{Attachment, MAX_ATTACHMENTS},
};
use kernel::prelude::*;

/// The most groups one id joins: as many as its QP can be attached to.
pub const MAX_GROUPS: usize = MAX_ATTACHMENTS;

/// How an id joins a group (`rdma_join_multicast`'s `join_state`; the two
/// states the CM offers on RoCE, as ucma offers them).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum JoinState {
    /// A full member: sends to the group and receives its datagrams.
    FullMember,
    /// A send-only full member: sends only.  On RoCE the CM sends no IGMP
    /// report for it, and the layer does not attach the QP.
    SendOnlyFullMember,
}

impl JoinState {
    pub(super) fn raw(self) -> u8 {
        // `join_state` is a bit mask of IBTA's JoinState bits
        // (`enum ib_sa_mc_join_states`).
        match self {
            Self::FullMember => 1 << bindings::ib_sa_mc_join_states_FULLMEMBER_JOIN,
            Self::SendOnlyFullMember => {
                1 << bindings::ib_sa_mc_join_states_SENDONLY_FULLMEMBER_JOIN
            }
        }
    }
}

/// A group an id joined.
pub(super) struct Group {
    pub(super) addr: SocketAddr,
    pub(super) state: JoinState,
    /// The join's context for the CM: it comes back in the group's
    /// events (never dereferenced: a number, not a pointer).
    pub(super) token: usize,
    /// The group as its `MULTICAST_JOIN` reported it, once it came.
    pub(super) joined: Option<Attachment>,
    /// The outcome of attaching the id's QP to the group (`Ok` when
    /// nothing is attached: no QP yet, a send-only member).
    pub(super) attached: Result,
}

/// The groups of one id.
pub(super) struct Groups {
    pub(super) list: KVec<Group>,
    pub(super) next_token: usize,
}

impl Groups {
    pub(super) fn new() -> Self {
        Self {
            list: KVec::new(),
            next_token: 1,
        }
    }

    pub(super) fn by_token(&mut self, token: usize) -> Option<&mut Group> {
        self.list.iter_mut().find(|g| g.token == token)
    }

    /// Whether a full member's group other than `token` holds the QP's
    /// attachment `at`: two addresses may map to one MGID (the same group
    /// with another port, or scope), which the QP is attached to once.
    pub(super) fn still_attached(&self, at: Attachment, token: usize) -> bool {
        self.list
            .iter()
            .any(|g| g.token != token && g.state == JoinState::FullMember && g.joined == Some(at))
    }
}
