// SPDX-License-Identifier: GPL-2.0
//! The agent's UD verbs: librdmacm over RDMA_PS_UDP, or RDMA_PS_IB with
//! `ps=ib` ([`crate::cm::ud`]), a SIDR server and a SIDR client with any
//! number of UD QPs.
//!
//!   udserve addr=A count=N accept=HEX [reject=1 rejdata=HEX] [echo=N] [ps=ib]
//!       Listens on a UD id (`ready` once it does); for each of N requests
//!       reports `reqK=` (the SIDR private data as received), then rejects
//!       it with `rejdata`, or makes a UD QP and accepts with `accept`
//!       (`qpK=`, `qkeyK=`: its QP number and Q_Key), receives `echo`
//!       datagrams (`lenK_I=`, `immK_I=` in hex or `-`, `srcK_I=` the
//!       sending QP, `hashK_I=` FNV-1a of the payload) and sends each back
//!       to its sender (the address handle from the work completion, the
//!       completion's source QP) with the same immediate data.
//!   udconnect addr=A data=HEX [qps=K] [msgs=N] [sizes=S,S,...] [replies=N] [ps=ib]
//!       Makes K UD QPs (each its own id, resolved to A); the first sends
//!       the SIDR request with `data` (`event=`, `status=`, `pdata=`; on
//!       ESTABLISHED also `rqp=`, `rqkey=` of the remote QP and `qpQ=` of
//!       each own QP).  Every QP then sends N datagrams of [`payload`] to
//!       the remote QP, sizes from `sizes` in turn, the even ones with the
//!       sender's QP number as immediate data (udaddy's way), the odd ones
//!       without; then receives `replies` (default N) datagrams each:
//!       `rQ_I=` payload, `riQ_I=` immediate data or `-`, `rsQ_I=` sender.

use super::{Req, T};
use crate::cm::{
    ud::{self, UdPortSpace, UdQp},
    Channel,
};
use crate::payload::{fnv64, hex, pattern};
use crate::report::EventType;
use anyhow::{Context, Result};
use std::{fmt::Write as _, io::Write, net::TcpStream, time::Duration};

/// What QP `qp` (0..) of `udconnect` sends as its datagram `msg` (0..),
/// `size` bytes: distinct for every QP and message.
pub fn payload(qp: usize, msg: usize, size: usize) -> Vec<u8> {
    pattern(size, (0x80 + qp * 16 + msg) as u8)
}

/// Whether `udconnect` sends datagram `msg` with immediate data.
pub fn with_imm(msg: usize) -> bool {
    msg.is_multiple_of(2)
}

/// Immediate data as reported: hex, `-` for none.
fn imm_word(imm: Option<u32>) -> String {
    imm.map_or("-".into(), |v| format!("{v:08x}"))
}

/// The port space `ps=` names: `udp` (the default) or `ib`.
fn port_space(req: &Req) -> Result<UdPortSpace> {
    match req.get("ps").unwrap_or("udp") {
        "udp" => Ok(UdPortSpace::Udp),
        "ib" => Ok(UdPortSpace::Ib),
        other => anyhow::bail!("ps={other}: udp or ib"),
    }
}

pub(super) fn udserve(req: &Req, out: &mut TcpStream) -> Result<String> {
    let ch = Channel::new()?;
    let _listener = ud::listen_ps(&ch, &req.addr()?, 128, port_space(req)?)?;
    writeln!(out, "ready")?;
    let mut report = String::new();
    // Accepted QPs live until the end: their peers may still send.
    let mut qps = Vec::new();
    for n in 0..req.num("count", 1)? {
        let mut ev = ch.expect(EventType::ConnectRequest, T)?;
        let _ = write!(report, "req{n}={} ", hex(&ev.private_data));
        let request = ev.take_request()?;
        if req.get("reject").is_some() {
            request.reject(&req.bytes("rejdata")?)?;
            continue;
        }
        let mut qp = UdQp::new(request)?;
        qp.accept(&req.bytes("accept")?)?;
        let _ = write!(report, "qp{n}={} qkey{n}={:08x} ", qp.qp_num(), qp.qkey()?);
        for i in 0..req.num("echo", 0)? {
            let d = qp
                .recv(T, true)
                .with_context(|| format!("datagram {i} of request {n}"))?;
            let _ = write!(
                report,
                "len{n}_{i}={} imm{n}_{i}={} src{n}_{i}={} hash{n}_{i}={:016x} ",
                d.data.len(),
                imm_word(d.imm),
                d.src_qp,
                fnv64(&d.data)
            );
            let peer = d.peer.context("no reply peer")?;
            qp.send(peer, &d.data, d.imm)
                .with_context(|| format!("echo {i} of request {n}"))?;
        }
        qps.push(qp);
    }
    Ok(report.trim_end().to_string())
}

pub(super) fn udconnect(req: &Req) -> Result<String> {
    let ch = Channel::new()?;
    let addr = req.addr()?;
    let ps = port_space(req)?;
    let mut qps = Vec::new();
    for _ in 0..req.num("qps", 1)?.max(1) {
        qps.push(UdQp::new(ud::resolve_ps(
            &ch,
            &addr,
            Duration::from_secs(5),
            ps,
        )?)?);
    }
    qps[0].start_connect(&req.bytes("data")?)?;
    let ev = ch.next(T)?;
    let mut report = format!(
        "event={} status={} pdata={}",
        ev.name(),
        ev.status,
        hex(&ev.private_data)
    );
    let Some(remote) = ev.ud.filter(|_| ev.event == EventType::Established) else {
        return Ok(report);
    };
    let _ = write!(report, " rqp={} rqkey={:08x}", remote.qp_num, remote.qkey);
    let mut peers = Vec::new();
    for (q, qp) in qps.iter_mut().enumerate() {
        let _ = write!(report, " qp{q}={}", qp.qp_num());
        peers.push(qp.add_peer(&remote)?);
    }
    let msgs = req.num("msgs", 0)? as usize;
    let sizes: Vec<usize> = req
        .get("sizes")
        .unwrap_or("100")
        .split(',')
        .map(|s| s.parse().context("sizes="))
        .collect::<Result<_>>()?;
    for (q, qp) in qps.iter_mut().enumerate() {
        for m in 0..msgs {
            let data = payload(q, m, sizes[m % sizes.len()]);
            let imm = with_imm(m).then(|| qp.qp_num());
            qp.send(peers[q], &data, imm)
                .with_context(|| format!("QP {q}, datagram {m}"))?;
        }
    }
    let replies = req.num("replies", msgs as u32)?;
    for (q, qp) in qps.iter_mut().enumerate() {
        for i in 0..replies {
            let d = qp
                .recv(T, false)
                .with_context(|| format!("QP {q}, reply {i}"))?;
            let _ = write!(
                report,
                " r{q}_{i}={} ri{q}_{i}={} rs{q}_{i}={}",
                hex(&d.data),
                imm_word(d.imm),
                d.src_qp
            );
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_differ_per_qp_and_message() {
        let a = payload(0, 1, 64);
        assert_eq!(a.len(), 64);
        assert_ne!(a, payload(1, 1, 64));
        assert_ne!(a, payload(0, 2, 64));
        assert!(with_imm(0) && !with_imm(1));
    }
}
