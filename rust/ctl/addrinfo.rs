// SPDX-License-Identifier: GPL-2.0

//! `GETADDRINFO`: the layer's `rdma_getaddrinfo` on text from user space,
//! as a kernel ULP calls it on the address and service its configuration
//! gives (`traddr`, `trsvcid`).

use super::{read_arg, require_zero, write_arg};
use crate::{
    abi,
    rdma::{
        addr::SOCKADDR_SIZE,
        getaddrinfo::{self, Hints},
        PortSpace, QpType, SocketAddr,
    },
};
use kernel::prelude::*;

// The ABI's hint flags are the layer's, passed through.
const _: () = assert!(
    abi::RAI_PASSIVE == getaddrinfo::RAI_PASSIVE
        && abi::RAI_NUMERICHOST == getaddrinfo::RAI_NUMERICHOST
        && abi::RAI_NOROUTE == getaddrinfo::RAI_NOROUTE
        && abi::RAI_FAMILY == getaddrinfo::RAI_FAMILY
);

/// The text before the NUL of `field`, `None` if empty; `EINVAL` if the
/// field holds no NUL.
fn text(field: &[u8]) -> Result<Option<&[u8]>> {
    let end = field.iter().position(|&c| c == 0).ok_or(EINVAL)?;
    Ok((end != 0).then(|| &field[..end]))
}

/// The ABI's bytes of `addr`: family 0 for none.
fn sockaddr_bytes(addr: Option<SocketAddr>) -> [u8; SOCKADDR_SIZE] {
    addr.map_or([0; SOCKADDR_SIZE], |a| a.to_sockaddr().0)
}

/// Answers `RDMA_CM_RS_IOC_GETADDRINFO` at `arg`.
pub(super) fn getaddrinfo(arg: usize) -> Result {
    let mut c: abi::GetAddrInfo = read_arg(arg)?;
    require_zero(&[u32::from(c.reserved)])?;
    let hints = Hints {
        flags: c.flags,
        family: c.family,
        qp_type: match c.qp_type {
            0 => None,
            raw => Some(QpType::from_raw(raw)?),
        },
        port_space: match c.port_space {
            0 => None,
            raw => Some(PortSpace::from_raw(raw)?),
        },
    };
    let answer = getaddrinfo::getaddrinfo(text(&c.node)?, text(&c.service)?, &hints)?;
    c.flags = answer.flags;
    c.family = answer.family;
    c.qp_type = answer.qp_type as u32;
    c.port_space = answer.port_space as u32;
    c.src.bytes = sockaddr_bytes(answer.src);
    c.dst.bytes = sockaddr_bytes(answer.dst);
    write_arg(arg, &c)
}
