// SPDX-License-Identifier: GPL-2.0

//! Socket addresses for the RDMA CM.
//!
//! The CM takes `struct sockaddr *`; this module gives them a type
//! ([`SocketAddr`]), a text form (`192.0.2.1:7471`, `[2001:db8::1]:7471`) and
//! the byte encoding shared by the kernel call sites and the ioctl ABI (a
//! `struct sockaddr_in`/`sockaddr_in6` followed by zeros, 128 bytes).
//!
//! Name resolution does not exist in the kernel: only numeric hosts parse.

use kernel::prelude::*;

/// `AF_INET`.
pub const AF_INET: u16 = 2;
/// `AF_INET6`.
pub const AF_INET6: u16 = 10;
/// `AF_IB`: native InfiniBand addressing (not supported yet).
pub const AF_IB: u16 = 27;

/// Size of the address encoding (`struct __kernel_sockaddr_storage`).
pub const SOCKADDR_SIZE: usize = 128;
const SOCKADDR_IN_SIZE: usize = 16;
const SOCKADDR_IN6_SIZE: usize = 28;

/// An IPv4 or IPv6 socket address, in host representation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SocketAddr {
    /// IPv4.
    V4 {
        /// Address octets, most significant first.
        ip: [u8; 4],
        /// Port, host order.
        port: u16,
    },
    /// IPv6.
    V6 {
        /// Address octets, most significant first.
        ip: [u8; 16],
        /// Port, host order.
        port: u16,
        /// Flow information, host order.
        flowinfo: u32,
        /// Scope (interface index) for link-local addresses.
        scope_id: u32,
    },
}

/// A 128-byte, 8-aligned buffer holding a `struct sockaddr_*`.
///
/// The alignment makes a pointer to it a valid `struct sockaddr_storage *`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct SockaddrBuf(pub [u8; SOCKADDR_SIZE]);

impl Default for SockaddrBuf {
    fn default() -> Self {
        Self([0; SOCKADDR_SIZE])
    }
}

impl SocketAddr {
    /// The address of a RoCE GID (port 0): an IPv4-mapped GID is the IPv4
    /// address, as `rdma_gid2ip` has it; any other one an IPv6 address.
    pub fn from_gid(gid: &[u8; 16]) -> Self {
        if gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff {
            let mut ip = [0u8; 4];
            ip.copy_from_slice(&gid[12..]);
            Self::V4 { ip, port: 0 }
        } else {
            Self::V6 {
                ip: *gid,
                port: 0,
                flowinfo: 0,
                scope_id: 0,
            }
        }
    }

    /// The address family (`AF_INET` or `AF_INET6`).
    pub fn family(&self) -> u16 {
        match self {
            Self::V4 { .. } => AF_INET,
            Self::V6 { .. } => AF_INET6,
        }
    }

    /// The port, host order.
    pub fn port(&self) -> u16 {
        match *self {
            Self::V4 { port, .. } | Self::V6 { port, .. } => port,
        }
    }

    /// The same address with another port.
    pub fn with_port(mut self, new_port: u16) -> Self {
        match &mut self {
            Self::V4 { port, .. } | Self::V6 { port, .. } => *port = new_port,
        }
        self
    }

    /// Whether this is the wildcard address (`0.0.0.0` or `::`).
    pub fn is_any(&self) -> bool {
        match self {
            Self::V4 { ip, .. } => *ip == [0; 4],
            Self::V6 { ip, .. } => *ip == [0; 16],
        }
    }

    /// The wildcard address of a family.
    pub fn any(family: u16, port: u16) -> Result<Self> {
        match family {
            AF_INET => Ok(Self::V4 { ip: [0; 4], port }),
            AF_INET6 => Ok(Self::V6 {
                ip: [0; 16],
                port,
                flowinfo: 0,
                scope_id: 0,
            }),
            _ => Err(EAFNOSUPPORT),
        }
    }

    /// Encodes as `struct sockaddr_in` or `sockaddr_in6` followed by zeros.
    pub fn to_sockaddr(&self) -> SockaddrBuf {
        let mut buf = SockaddrBuf::default();
        let b = &mut buf.0;
        b[0..2].copy_from_slice(&self.family().to_ne_bytes());
        b[2..4].copy_from_slice(&self.port().to_be_bytes());
        match self {
            Self::V4 { ip, .. } => b[4..8].copy_from_slice(ip),
            Self::V6 {
                ip,
                flowinfo,
                scope_id,
                ..
            } => {
                b[4..8].copy_from_slice(&flowinfo.to_be_bytes());
                b[8..24].copy_from_slice(ip);
                b[24..28].copy_from_slice(&scope_id.to_ne_bytes());
            }
        }
        buf
    }

    /// Decodes the encoding of [`Self::to_sockaddr`].
    ///
    /// Returns `Ok(None)` for family 0 ("no address").  Fails with `EINVAL`
    /// when bytes past the structure, or `sin_zero`, are not zero, and with
    /// `EAFNOSUPPORT` for families other than `AF_INET` and `AF_INET6`.
    pub fn from_sockaddr(bytes: &[u8]) -> Result<Option<Self>> {
        if bytes.len() < 2 {
            return Err(EINVAL);
        }
        let family = u16::from_ne_bytes([bytes[0], bytes[1]]);
        let (addr, used) = match family {
            0 => {
                return if bytes.iter().all(|&b| b == 0) {
                    Ok(None)
                } else {
                    Err(EINVAL)
                };
            }
            AF_INET if bytes.len() >= SOCKADDR_IN_SIZE => {
                let mut ip = [0; 4];
                ip.copy_from_slice(&bytes[4..8]);
                (
                    Self::V4 {
                        ip,
                        port: u16::from_be_bytes([bytes[2], bytes[3]]),
                    },
                    SOCKADDR_IN_SIZE,
                )
            }
            AF_INET6 if bytes.len() >= SOCKADDR_IN6_SIZE => {
                let mut ip = [0; 16];
                ip.copy_from_slice(&bytes[8..24]);
                (
                    Self::V6 {
                        ip,
                        port: u16::from_be_bytes([bytes[2], bytes[3]]),
                        flowinfo: u32::from_be_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
                        scope_id: u32::from_ne_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]),
                    },
                    SOCKADDR_IN6_SIZE,
                )
            }
            AF_INET | AF_INET6 => return Err(EINVAL),
            _ => return Err(EAFNOSUPPORT),
        };
        // `sin_zero` of sockaddr_in lies inside `used`: it must be zero too.
        let tail_start = if family == AF_INET { 8 } else { used };
        if bytes[tail_start..].iter().any(|&b| b != 0) {
            return Err(EINVAL);
        }
        Ok(Some(addr))
    }

    /// Parses `a.b.c.d:port` or `[v6]:port`; the port is required.
    pub fn parse(text: &[u8]) -> Result<Self> {
        if let Some(rest) = text.strip_prefix(b"[") {
            let close = rest.iter().position(|&c| c == b']').ok_or(EINVAL)?;
            let (host, after) = rest.split_at(close);
            let port = after.strip_prefix(b"]:").ok_or(EINVAL)?;
            let (ip, scope_id) = parse_ipv6_scoped(host)?;
            return Ok(Self::V6 {
                ip,
                port: parse_port(port)?,
                flowinfo: 0,
                scope_id,
            });
        }
        let colon = text.iter().rposition(|&c| c == b':').ok_or(EINVAL)?;
        Ok(Self::V4 {
            ip: parse_ipv4(&text[..colon])?,
            port: parse_port(&text[colon + 1..])?,
        })
    }
}

impl kernel::fmt::Display for SocketAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::V4 { ip, port } => write!(f, "{}.{}.{}.{}:{}", ip[0], ip[1], ip[2], ip[3], port),
            Self::V6 { ip, port, .. } => {
                f.write_str("[")?;
                fmt_ipv6(f, ip)?;
                write!(f, "]:{port}")
            }
        }
    }
}

/// Writes an IPv6 address in RFC 5952 form (longest zero run as `::`).
fn fmt_ipv6(f: &mut core::fmt::Formatter<'_>, ip: &[u8; 16]) -> core::fmt::Result {
    let mut groups = [0u16; 8];
    for (i, g) in groups.iter_mut().enumerate() {
        *g = u16::from_be_bytes([ip[2 * i], ip[2 * i + 1]]);
    }
    // The longest run of at least two zero groups.
    let (mut best_start, mut best_len, mut i) = (8, 0, 0);
    while i < 8 {
        if groups[i] == 0 {
            let start = i;
            while i < 8 && groups[i] == 0 {
                i += 1;
            }
            if i - start > best_len && i - start >= 2 {
                best_start = start;
                best_len = i - start;
            }
        } else {
            i += 1;
        }
    }
    let mut i = 0;
    while i < 8 {
        if i == best_start {
            f.write_str("::")?;
            i += best_len;
            continue;
        }
        if i != 0 && i != best_start + best_len {
            f.write_str(":")?;
        }
        write!(f, "{:x}", groups[i])?;
        i += 1;
    }
    Ok(())
}

/// Parses a decimal port, 0..=65535.
pub fn parse_port(text: &[u8]) -> Result<u16> {
    parse_decimal(text, 65535).map(|v| v as u16)
}

fn parse_decimal(text: &[u8], max: u32) -> Result<u32> {
    if text.is_empty() || text.len() > 10 {
        return Err(EINVAL);
    }
    let mut value: u32 = 0;
    for &c in text {
        if !c.is_ascii_digit() {
            return Err(EINVAL);
        }
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u32::from(c - b'0')))
            .ok_or(EINVAL)?;
    }
    if value > max {
        return Err(EINVAL);
    }
    Ok(value)
}

/// Parses dotted-quad IPv4 (exactly four decimal octets).
pub fn parse_ipv4(text: &[u8]) -> Result<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut parts = text.split(|&c| c == b'.');
    for octet in out.iter_mut() {
        let part = parts.next().ok_or(EINVAL)?;
        if part.len() > 3 {
            return Err(EINVAL);
        }
        *octet = parse_decimal(part, 255)? as u8;
    }
    if parts.next().is_some() {
        return Err(EINVAL);
    }
    Ok(out)
}

/// Parses an IPv6 address with an optional numeric `%scope`.
pub fn parse_ipv6_scoped(text: &[u8]) -> Result<([u8; 16], u32)> {
    match text.iter().position(|&c| c == b'%') {
        Some(p) => Ok((
            parse_ipv6(&text[..p])?,
            parse_decimal(&text[p + 1..], u32::MAX)?,
        )),
        None => Ok((parse_ipv6(text)?, 0)),
    }
}

/// Parses RFC 4291 text form: hex groups, one `::`, an optional dotted-quad tail.
pub fn parse_ipv6(text: &[u8]) -> Result<[u8; 16]> {
    let mut head = [0u16; 8];
    let mut tail = [0u16; 8];
    let (mut nhead, mut ntail) = (0usize, 0usize);
    let (first, second) = match find_double_colon(text) {
        Some(p) => (&text[..p], Some(&text[p + 2..])),
        None => (text, None),
    };
    parse_groups(first, &mut head, &mut nhead, second.is_none())?;
    if let Some(second) = second {
        if find_double_colon(second).is_some() {
            return Err(EINVAL);
        }
        parse_groups(second, &mut tail, &mut ntail, true)?;
        if nhead + ntail > 7 {
            return Err(EINVAL);
        }
    } else if nhead != 8 {
        return Err(EINVAL);
    }
    let mut groups = [0u16; 8];
    groups[..nhead].copy_from_slice(&head[..nhead]);
    groups[8 - ntail..].copy_from_slice(&tail[..ntail]);
    let mut out = [0u8; 16];
    for (i, g) in groups.iter().enumerate() {
        out[2 * i..2 * i + 2].copy_from_slice(&g.to_be_bytes());
    }
    Ok(out)
}

fn find_double_colon(text: &[u8]) -> Option<usize> {
    text.windows(2).position(|w| w == b"::")
}

/// Parses `g:g:...` into `groups`; an IPv4 tail is allowed in the last part.
fn parse_groups(text: &[u8], groups: &mut [u16; 8], n: &mut usize, last: bool) -> Result {
    if text.is_empty() {
        return Ok(());
    }
    let count = text.split(|&c| c == b':').count();
    for (i, part) in text.split(|&c| c == b':').enumerate() {
        if last && i + 1 == count && part.contains(&b'.') {
            let v4 = parse_ipv4(part)?;
            for pair in v4.chunks(2) {
                *groups.get_mut(*n).ok_or(EINVAL)? = u16::from_be_bytes([pair[0], pair[1]]);
                *n += 1;
            }
            continue;
        }
        if part.is_empty() || part.len() > 4 {
            return Err(EINVAL);
        }
        let mut v: u16 = 0;
        for &c in part {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => return Err(EINVAL),
            };
            v = (v << 4) | u16::from(d);
        }
        *groups.get_mut(*n).ok_or(EINVAL)? = v;
        *n += 1;
    }
    Ok(())
}
