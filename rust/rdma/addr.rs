// SPDX-License-Identifier: GPL-2.0

//! Socket addresses for the RDMA CM.
//!
//! The CM takes `struct sockaddr *`; this module gives them a type
//! ([`SocketAddr`]), conversions from and to `core::net::SocketAddr` (whose
//! parser and text form it uses: `192.0.2.1:7471`, `[2001:db8::1]:7471`),
//! and the byte encoding shared by the kernel call sites and the ioctl ABI
//! (a `struct sockaddr_in`/`sockaddr_in6` followed by zeros, 128 bytes).
//! Text with separate host and service, as a ULP's configuration gives it,
//! goes through [`super::getaddrinfo`].

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
///
/// # Examples
///
/// ```
/// use kernel::rdma::SocketAddr;
///
/// let text = "[2001:db8::1]:7471";
/// let addr = SocketAddr::from(text.parse::<core::net::SocketAddr>().unwrap());
/// assert_eq!(addr.port(), 7471);
/// // The `sockaddr_in6` the CM takes, and back.
/// let bytes = addr.to_sockaddr();
/// assert_eq!(SocketAddr::from_sockaddr(&bytes.0), Ok(Some(addr)));
/// ```
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

    /// Whether this is a multicast group address (`224.0.0.0/4`,
    /// `ff00::/8`).
    pub fn is_multicast(&self) -> bool {
        match self {
            Self::V4 { ip, .. } => ip[0] & 0xf0 == 0xe0,
            Self::V6 { ip, .. } => ip[0] == 0xff,
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

    /// The loopback address of a family (`127.0.0.1`, `::1`).
    pub fn loopback(family: u16, port: u16) -> Result<Self> {
        match family {
            AF_INET => Ok(Self::V4 {
                ip: core::net::Ipv4Addr::LOCALHOST.octets(),
                port,
            }),
            AF_INET6 => Ok(Self::V6 {
                ip: core::net::Ipv6Addr::LOCALHOST.octets(),
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
}

impl From<core::net::SocketAddr> for SocketAddr {
    fn from(addr: core::net::SocketAddr) -> Self {
        match addr {
            core::net::SocketAddr::V4(a) => Self::V4 {
                ip: a.ip().octets(),
                port: a.port(),
            },
            core::net::SocketAddr::V6(a) => Self::V6 {
                ip: a.ip().octets(),
                port: a.port(),
                flowinfo: a.flowinfo(),
                scope_id: a.scope_id(),
            },
        }
    }
}

impl From<SocketAddr> for core::net::SocketAddr {
    fn from(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4 { ip, port } => (core::net::Ipv4Addr::from(ip), port).into(),
            SocketAddr::V6 {
                ip,
                port,
                flowinfo,
                scope_id,
            } => core::net::SocketAddrV6::new(ip.into(), port, flowinfo, scope_id).into(),
        }
    }
}

/// `192.0.2.1:7471`, `[2001:db8::1]:7471`, `[fe80::1%3]:7471` (RFC 5952).
impl kernel::fmt::Display for SocketAddr {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        core::fmt::Display::fmt(&core::net::SocketAddr::from(*self), f)
    }
}
