// SPDX-License-Identifier: GPL-2.0

//! A kernel counterpart of `rdma_getaddrinfo(3)`, numeric only.
//!
//! The kernel has no resolver: host names, service names and IB ACM path
//! queries cannot exist here.  A node that is not a numeric IPv4/IPv6
//! address fails with `EOPNOTSUPP` (name resolution unsupported), whether
//! or not [`RAI_NUMERICHOST`] is given; a malformed numeric address with
//! [`RAI_NUMERICHOST`] fails with `EINVAL`.  Routes are never resolved here,
//! so [`RAI_NOROUTE`] is accepted and has nothing to turn off.

use super::{
    addr::{parse_ipv4, parse_ipv6_scoped, parse_port, SocketAddr, AF_IB, AF_INET, AF_INET6},
    cm::PortSpace,
    verbs::QpType,
};
use kernel::prelude::*;

/// The result is for a passive (listening) endpoint: `node` is the local address.
pub const RAI_PASSIVE: u32 = 0x1;
/// `node` must be a numeric address.
pub const RAI_NUMERICHOST: u32 = 0x2;
/// Do not resolve a route.
pub const RAI_NOROUTE: u32 = 0x4;
/// Honour the family in the hints.
pub const RAI_FAMILY: u32 = 0x8;
const KNOWN_FLAGS: u32 = RAI_PASSIVE | RAI_NUMERICHOST | RAI_NOROUTE | RAI_FAMILY;

/// The caller's seed (`struct rdma_addrinfo *hints`).
#[derive(Clone, Copy, Default)]
pub struct Hints {
    /// `RAI_*` flags.
    pub flags: u32,
    /// 0 (any), `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// The QP type wanted, if any (RC by default).
    pub qp_type: Option<QpType>,
    /// The port space wanted, if any (derived from the QP type by default).
    pub port_space: Option<PortSpace>,
}

/// The answer (`struct rdma_addrinfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrInfo {
    /// The flags the answer was made with.
    pub flags: u32,
    /// `AF_INET` or `AF_INET6`.
    pub family: u16,
    /// QP type.
    pub qp_type: QpType,
    /// Port space.
    pub port_space: PortSpace,
    /// Source (local) address: the node for a passive answer.
    pub src: Option<SocketAddr>,
    /// Destination address: the node for an active answer.
    pub dst: Option<SocketAddr>,
}

fn looks_numeric(node: &[u8]) -> bool {
    !node.is_empty()
        && node
            .iter()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, b'.' | b':' | b'%'))
        && (node.contains(&b'.') || node.contains(&b':'))
}

fn parse_node(node: &[u8], port: u16) -> Result<SocketAddr> {
    if node.contains(&b':') {
        let (ip, scope_id) = parse_ipv6_scoped(node)?;
        Ok(SocketAddr::V6 {
            ip,
            port,
            flowinfo: 0,
            scope_id,
        })
    } else {
        Ok(SocketAddr::V4 {
            ip: parse_ipv4(node)?,
            port,
        })
    }
}

/// Resolves numeric `node` and `service` under `hints`.
///
/// Errors: `EINVAL` for unknown flags, a malformed number, no node on an
/// active request, or a QP type that does not fit the port space;
/// `EOPNOTSUPP` for a host or service name (no resolver in the kernel);
/// `EAFNOSUPPORT` when the family asked for is not the node's, or is
/// `AF_IB`.
pub fn getaddrinfo(node: Option<&[u8]>, service: Option<&[u8]>, hints: &Hints) -> Result<AddrInfo> {
    if hints.flags & !KNOWN_FLAGS != 0 {
        return Err(EINVAL);
    }
    match hints.family {
        0 | AF_INET | AF_INET6 => {}
        AF_IB => return Err(EAFNOSUPPORT),
        _ => return Err(EINVAL),
    }
    let port = match service {
        None => 0,
        Some(s) if !s.is_empty() && s.iter().all(u8::is_ascii_digit) => parse_port(s)?,
        Some(_) => return Err(EOPNOTSUPP),
    };
    let qp_type = hints.qp_type.unwrap_or(QpType::Rc);
    let port_space = hints.port_space.unwrap_or(match qp_type {
        QpType::Rc => PortSpace::Tcp,
        QpType::Ud => PortSpace::Udp,
    });
    if !port_space.carries(qp_type) {
        return Err(EINVAL);
    }
    let passive = hints.flags & RAI_PASSIVE != 0;
    let addr = match node {
        Some(node) => {
            if !looks_numeric(node) {
                return Err(if hints.flags & RAI_NUMERICHOST != 0 {
                    EINVAL
                } else {
                    EOPNOTSUPP
                });
            }
            parse_node(node, port)?
        }
        None if passive => SocketAddr::any(
            if hints.family == 0 {
                AF_INET
            } else {
                hints.family
            },
            port,
        )?,
        None => return Err(EINVAL),
    };
    if hints.family != 0 && addr.family() != hints.family {
        return Err(EAFNOSUPPORT);
    }
    let (src, dst) = if passive {
        (Some(addr), None)
    } else {
        (None, Some(addr))
    };
    Ok(AddrInfo {
        flags: hints.flags,
        family: addr.family(),
        qp_type,
        port_space,
        src,
        dst,
    })
}
