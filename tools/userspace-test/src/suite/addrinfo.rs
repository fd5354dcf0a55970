// SPDX-License-Identifier: GPL-2.0

//! The module's numeric `rdma_getaddrinfo` (GETADDRINFO) beside
//! librdmacm's on the same node, service and hints: the same answer, or
//! both failing, except where the kernel has no resolver (names) and where
//! the C library takes a port above 65535 modulo 65536.

#[allow(unused_imports)]
use super::*;
use crate::cm::addrinfo::{self, AddrInfo, Query};
use std::mem::size_of;

/// What the module must do with a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// librdmacm's answer, or its failure.
    Same,
    /// This errno where librdmacm answers (a documented deviation).
    Refused(i32),
}

fn case<'a>(
    node: Option<&'a str>,
    service: Option<&'a str>,
    flags: u32,
    family: i32,
    qp_type: u32,
    port_space: u32,
) -> Query<'a> {
    Query {
        node,
        service,
        flags: flags as i32,
        family,
        qp_type: qp_type as i32,
        port_space: port_space as i32,
    }
}

/// The module's answer in librdmacm's terms: its addresses cut to the
/// length of their family's `sockaddr`, after checking that the rest of
/// the ABI's 128 bytes is zero.
fn kernel_answer(a: &rdma_cm_rs_getaddrinfo) -> Result<AddrInfo> {
    let cut = |s: &rdma_cm_rs_sockaddr| -> Result<Vec<u8>> {
        let len = match i32::from(u16::from_ne_bytes([s.bytes[0], s.bytes[1]])) {
            0 => 0,
            libc::AF_INET => size_of::<libc::sockaddr_in>(),
            libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
            f => bail!("family {f} in an answer"),
        };
        ensure!(
            s.bytes[len..].iter().all(|&b| b == 0),
            "bytes after the sockaddr"
        );
        Ok(s.bytes[..len].to_vec())
    };
    Ok(AddrInfo {
        flags: a.flags as i32,
        family: i32::from(a.family),
        qp_type: a.qp_type as i32,
        port_space: a.port_space as i32,
        src: cut(&a.src)?,
        dst: cut(&a.dst)?,
    })
}

pub(super) fn getaddrinfo_matches_librdmacm(_: &mut Ctx) -> Result<()> {
    let (v4, v6) = (libc::AF_INET, libc::AF_INET6);
    let (rc, ud) = (RDMA_CM_RS_QPT_RC, RDMA_CM_RS_QPT_UD);
    let (tcp, udp) = (RDMA_CM_RS_PS_TCP, RDMA_CM_RS_PS_UDP);
    let (passive, numeric, noroute, family) = (
        RDMA_CM_RS_RAI_PASSIVE,
        RDMA_CM_RS_RAI_NUMERICHOST,
        RDMA_CM_RS_RAI_NOROUTE,
        RDMA_CM_RS_RAI_FAMILY,
    );
    let cases = [
        (
            case(Some("192.0.2.1"), Some("7471"), 0, 0, 0, 0),
            Want::Same,
        ),
        (case(Some("192.0.2.1"), None, noroute, 0, 0, 0), Want::Same),
        (case(Some("2001:db8::1"), Some("1"), 0, 0, 0, 0), Want::Same),
        (
            case(Some("fe80::1%2"), Some("1"), numeric, 0, 0, 0),
            Want::Same,
        ),
        (
            case(Some("192.0.2.1"), Some("7471"), passive, 0, 0, 0),
            Want::Same,
        ),
        (case(None, Some("7471"), passive, v4, 0, 0), Want::Same),
        (case(None, Some("7471"), passive, v6, 0, 0), Want::Same),
        (case(None, Some("7471"), 0, v4, 0, 0), Want::Same),
        (case(None, Some("7471"), 0, v6, 0, 0), Want::Same),
        (case(Some("192.0.2.1"), Some("1"), 0, 0, ud, 0), Want::Same),
        (
            case(Some("192.0.2.1"), Some("1"), 0, 0, rc, tcp),
            Want::Same,
        ),
        (
            case(Some("192.0.2.1"), Some("1"), 0, 0, ud, udp),
            Want::Same,
        ),
        // Fail both: the family is not the node's, a QP type its port
        // space does not carry, a malformed number, a number for a name
        // under RAI_NUMERICHOST, a port out of range.
        (case(Some("192.0.2.1"), None, family, v6, 0, 0), Want::Same),
        (
            case(Some("192.0.2.1"), Some("1"), 0, 0, ud, tcp),
            Want::Same,
        ),
        (
            case(Some("192.0.2.999"), None, numeric, 0, 0, 0),
            Want::Same,
        ),
        (case(Some("localhost"), None, numeric, 0, 0, 0), Want::Same),
        // No family: the C library's first answer.
        (case(None, Some("7471"), passive, 0, 0, 0), Want::Same),
        (case(None, Some("7471"), 0, 0, 0, 0), Want::Same),
        // The kernel has no resolver.
        (
            case(Some("localhost"), Some("1"), 0, v4, 0, 0),
            Want::Refused(libc::EOPNOTSUPP),
        ),
        // The C library takes a port above 65535 modulo 65536.
        (
            case(Some("192.0.2.1"), Some("65536"), 0, 0, 0, 0),
            Want::Refused(libc::EINVAL),
        ),
    ];
    let dev = Device::open()?;
    for (q, want) in cases {
        let what = format!("{q:?}");
        let mut hints = rdma_cm_rs_getaddrinfo {
            flags: q.flags as u32,
            family: q.family as u16,
            qp_type: q.qp_type as u32,
            port_space: q.port_space as u32,
            ..Default::default()
        };
        hints.reserved = 0;
        let kernel = dev.getaddrinfo(q.node, q.service, hints);
        let library = addrinfo::getaddrinfo(&q);
        match (want, kernel, library) {
            (Want::Same, Ok(k), Ok(l)) => {
                let k = kernel_answer(&k).with_context(|| what.clone())?;
                ensure!(k == l, "{what}: the module answered {k:?}, librdmacm {l:?}");
            }
            (Want::Same, Err(_), Err(_)) => {}
            (Want::Same, k, l) => bail!("{what}: the module: {k:?}, librdmacm: {l:?}"),
            (Want::Refused(errno), k, l) => {
                ensure!(l.is_ok(), "{what}: librdmacm did not answer: {l:?}");
                expect_errno(&what, k, errno)?;
            }
        }
    }
    // The ABI's own checks: an unterminated text, a reserved field, a bad
    // pointer.
    let mut q = rdma_cm_rs_getaddrinfo::default();
    q.node.fill(b'1' as _);
    expect_errno(
        "a node without its NUL",
        dev.raw_ioctl(IOC_GETADDRINFO, &mut q as *mut _ as usize),
        libc::EINVAL,
    )?;
    let q = rdma_cm_rs_getaddrinfo {
        reserved: 1,
        ..Default::default()
    };
    expect_errno(
        "a reserved field",
        dev.getaddrinfo(Some("192.0.2.1"), None, q),
        libc::EINVAL,
    )?;
    expect_errno(
        "a bad pointer",
        dev.raw_ioctl(IOC_GETADDRINFO, 8),
        libc::EFAULT,
    )?;
    Ok(())
}
