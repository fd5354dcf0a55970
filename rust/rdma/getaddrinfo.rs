// SPDX-License-Identifier: GPL-2.0

//! A kernel counterpart of `rdma_getaddrinfo(3)`, numeric only.
//!
//! The kernel has no resolver: host names, service names and IB ACM path
//! queries cannot exist here.  A node that is not a numeric IPv4/IPv6
//! address (as `core::net` parses them, an IPv6 one with an optional
//! decimal `%scope`) fails with `EOPNOTSUPP` (name resolution
//! unsupported), or with `EINVAL` under [`RAI_NUMERICHOST`], which says it
//! must be a number.  Routes are never resolved here,
//! so [`RAI_NOROUTE`] is accepted and has nothing to turn off.

use super::{
    addr::{SocketAddr, AF_IB, AF_INET, AF_INET6},
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
    /// [`RAI_PASSIVE`] for a passive answer, else 0 (the hints' without
    /// node and service).
    pub flags: u32,
    /// `AF_INET` or `AF_INET6` (the hints' without node and service).
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

/// A numeric host: IPv4 dotted quad, or IPv6 text with an optional decimal
/// `%scope` (what `inet_pton` and `if_nametoindex`-free `getaddrinfo`
/// take), parsed by `core::net`.
fn parse_node(node: &[u8], port: u16) -> Option<SocketAddr> {
    let text = core::str::from_utf8(node).ok()?;
    if let Ok(ip) = text.parse::<core::net::Ipv4Addr>() {
        return Some(SocketAddr::V4 {
            ip: ip.octets(),
            port,
        });
    }
    let (ip, scope_id) = match text.split_once('%') {
        Some((ip, scope)) if !scope.is_empty() && scope.bytes().all(|c| c.is_ascii_digit()) => {
            (ip, scope.parse::<u32>().ok()?)
        }
        Some(_) => return None,
        None => (text, 0),
    };
    let ip = ip.parse::<core::net::Ipv6Addr>().ok()?;
    Some(SocketAddr::V6 {
        ip: ip.octets(),
        port,
        flowinfo: 0,
        scope_id,
    })
}

/// Resolves numeric `node` and `service` under `hints`, as
/// `rdma_getaddrinfo(3)` does through the C library's `getaddrinfo`: a
/// passive answer has the node (the wildcard without one, IPv4 unless the
/// hints ask for IPv6) as its source and `RAI_PASSIVE` as its flags, an
/// active one the node (the loopback address without one, IPv6 unless the
/// hints ask for IPv4) as its destination and no flags; without node and
/// service the answer is the hints, without addresses.
///
/// # Examples
///
/// ```
/// use kernel::prelude::*;
/// use kernel::rdma::{
///     getaddrinfo::{getaddrinfo, Hints, RAI_PASSIVE},
///     SocketAddr,
/// };
///
/// // A ULP's configuration: the peer's address and service, as text.
/// let ai = getaddrinfo(Some(b"192.0.2.1"), Some(b"7471"), &Hints::default())?;
/// assert_eq!(ai.dst, Some(SocketAddr::V4 { ip: [192, 0, 2, 1], port: 7471 }));
/// // A listener's: every address.
/// let passive = Hints { flags: RAI_PASSIVE, ..Hints::default() };
/// let ai = getaddrinfo(None, Some(b"4420"), &passive)?;
/// assert!(ai.src.is_some_and(|a| a.is_any()));
/// // No resolver in the kernel.
/// assert_eq!(getaddrinfo(Some(b"example.org"), None, &Hints::default()), Err(EOPNOTSUPP));
/// # Ok::<(), Error>(())
/// ```
///
/// Errors: `EINVAL` for unknown flags, a malformed number, or a QP type
/// that does not fit the port space;
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
        Some(s) if !s.is_empty() && s.iter().all(u8::is_ascii_digit) => core::str::from_utf8(s)
            .ok()
            .and_then(|s| s.parse::<u16>().ok())
            .ok_or(EINVAL)?,
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
    if node.is_none() && service.is_none() {
        // Nothing to translate: the hints come back, with no address.
        return Ok(AddrInfo {
            flags: hints.flags,
            family: hints.family,
            qp_type,
            port_space,
            src: None,
            dst: None,
        });
    }
    // Without a family, the C library's first answer: its wildcards list
    // IPv4 first, its loopback addresses IPv6 first (RFC 6724's order).
    let or = |default| {
        if hints.family == 0 {
            default
        } else {
            hints.family
        }
    };
    let addr = match node {
        // Not a number: a name, which only a resolver could answer.
        Some(node) => parse_node(node, port).ok_or(if hints.flags & RAI_NUMERICHOST != 0 {
            EINVAL
        } else {
            EOPNOTSUPP
        })?,
        None if passive => SocketAddr::any(or(AF_INET), port)?,
        None => SocketAddr::loopback(or(AF_INET6), port)?,
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
        flags: if passive { RAI_PASSIVE } else { 0 },
        family: addr.family(),
        qp_type,
        port_space,
        src,
        dst,
    })
}
