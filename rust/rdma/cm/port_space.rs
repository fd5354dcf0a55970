// SPDX-License-Identifier: GPL-2.0

//! Port spaces (`enum rdma_ucm_port_space`) and the QP types each carries.

use crate::rdma::{bindings, verbs::QpType};
use kernel::prelude::*;

/// Port spaces (`enum rdma_ucm_port_space`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u32)]
pub enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected.
    Tcp = bindings::rdma_ucm_port_space_RDMA_PS_TCP,
    /// `RDMA_PS_UDP`: unreliable datagram (SIDR).
    Udp = bindings::rdma_ucm_port_space_RDMA_PS_UDP,
    /// `RDMA_PS_IB`: any QP type, native IB services.
    Ib = bindings::rdma_ucm_port_space_RDMA_PS_IB,
    /// `RDMA_PS_IPOIB`.
    Ipoib = bindings::rdma_ucm_port_space_RDMA_PS_IPOIB,
}

impl PortSpace {
    /// The port space of a raw value.
    pub fn from_raw(raw: u32) -> Result<Self> {
        [Self::Tcp, Self::Udp, Self::Ib, Self::Ipoib]
            .into_iter()
            .find(|ps| *ps as u32 == raw)
            .ok_or(EINVAL)
    }
}

impl PortSpace {
    /// Whether the port space carries QPs of type `qp_type`
    /// (`rdma_create_id(3)`).
    pub fn carries(self, qp_type: QpType) -> bool {
        matches!(
            (self, qp_type),
            (PortSpace::Tcp, QpType::Rc)
                | (PortSpace::Udp, QpType::Ud)
                | (PortSpace::Ipoib, QpType::Ud)
                | (PortSpace::Ib, _)
        )
    }
}
