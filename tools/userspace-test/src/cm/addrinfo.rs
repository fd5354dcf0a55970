// SPDX-License-Identifier: GPL-2.0
//! librdmacm's `rdma_getaddrinfo(3)`, for comparing the module's numeric
//! one (`RDMA_CM_RS_IOC_GETADDRINFO`) with it.

use super::ffi::*;
use std::{ffi::CString, ptr};

/// One answer, its addresses as the bytes of their `sockaddr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddrInfo {
    pub flags: i32,
    pub family: i32,
    pub qp_type: i32,
    pub port_space: i32,
    pub src: Vec<u8>,
    pub dst: Vec<u8>,
}

/// What a call asks: node and service text (`None`: NULL) and the hints.
#[derive(Clone, Debug, Default)]
pub struct Query<'a> {
    pub node: Option<&'a str>,
    pub service: Option<&'a str>,
    pub flags: i32,
    pub family: i32,
    pub qp_type: i32,
    pub port_space: i32,
}

/// The first answer of `rdma_getaddrinfo` for `q`, or its failure: the
/// `EAI_*` code it returned, or `errno` when it returned -1.
pub fn getaddrinfo(q: &Query<'_>) -> Result<AddrInfo, i32> {
    let text = |s: Option<&str>| s.map(|s| CString::new(s).expect("no NUL in test text"));
    let (node, service) = (text(q.node), text(q.service));
    let as_ptr = |s: &Option<CString>| s.as_ref().map_or(ptr::null(), |s| s.as_ptr());
    // SAFETY: All-zero is a valid `rdma_addrinfo` (null pointers, zero lengths).
    let mut hints: rdma_addrinfo = unsafe { std::mem::zeroed() };
    hints.ai_flags = q.flags;
    hints.ai_family = q.family;
    hints.ai_qp_type = q.qp_type;
    hints.ai_port_space = q.port_space;
    let mut res: *mut rdma_addrinfo = ptr::null_mut();
    // SAFETY: node and service are NUL-terminated or null, and live across
    // the call; hints is initialized; `res` receives a list this function
    // frees below.
    let ret = unsafe { rdma_getaddrinfo(as_ptr(&node), as_ptr(&service), &hints, &mut res) };
    if ret != 0 {
        return Err(if ret == -1 {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        } else {
            ret
        });
    }
    // SAFETY: On success `res` is a valid list whose first element holds
    // addresses of the lengths it gives (or null pointers with length 0).
    let answer = unsafe {
        let r = &*res;
        let bytes = |p: *mut sockaddr, len: socklen_t| {
            if p.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(p.cast::<u8>(), len as usize).to_vec()
            }
        };
        AddrInfo {
            flags: r.ai_flags,
            family: r.ai_family,
            qp_type: r.ai_qp_type,
            port_space: r.ai_port_space,
            src: bytes(r.ai_src_addr, r.ai_src_len),
            dst: bytes(r.ai_dst_addr, r.ai_dst_len),
        }
    };
    // SAFETY: `res` came from `rdma_getaddrinfo` and is freed once.
    unsafe { rdma_freeaddrinfo(res) };
    Ok(answer)
}
