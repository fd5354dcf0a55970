// SPDX-License-Identifier: GPL-2.0
//! The multicast scenarios: UD ids of the module joining and leaving
//! groups (JOIN_MCAST, LEAVE_MCAST), the group as a peer of UD_SEND, and
//! datagrams both ways with rdma-core's unmodified `mckey` (the agent's
//! `run`): the module sends and `mckey` receives, `mckey -s` sends and
//! the module's ids receive, one of them joining and leaving meanwhile.

use super::faults::note;
use super::interop::start_tool_past_startup;
use super::{errno_of, expect_errno, wait, Ctx};
use crate::uapi::*;
use crate::udaddy::UDP_QKEY;
use anyhow::{ensure, Context, Result};
use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

/// The all-ones QP number of a group.
const GROUP_QPN: u32 = 0x00ff_ffff;
/// mckey's default message size, and the count the scenarios ask for.
const MCKEY_SIZE: usize = 100;
const MCKEY_COUNT: usize = 10;
/// What `mckey -s` is asked to send (see `module_receives_from_mckey`).
const MCKEY_SENDS: usize = 200;
const MCKEY_TIMEOUT_S: u32 = 40;

/// A group of the pass: each pass (transport, mode) its own, so that
/// passes running at once on one wire never hear each other.
fn group(ctx: &Ctx, n: u8) -> SocketAddr {
    let pass = match (ctx.transport, sync_mode()) {
        (crate::suite::Transport::Rxe, false) => 1,
        (crate::suite::Transport::Rxe, true) => 2,
        (_, false) => 3,
        (_, true) => 4,
    };
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(239, 35, pass, n)), 0)
}

/// A UD id bound to the module's address (port 0: any).
fn bound_ud(dev: &Device, ctx: &Ctx, context: u64) -> Result<u32> {
    let id = dev.create_id_ps(context, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
    dev.bind(id, &SocketAddr::new(ctx.local4, 0))
        .context("bind")?;
    Ok(id)
}

/// Joins and checks the MULTICAST_JOIN: the join's context, the all-ones
/// QP number, the UDP Q_Key and a peer handle.  Returns the handle.
fn join(dev: &Device, id: u32, g: &SocketAddr, flags: u32, context: u64) -> Result<u32> {
    dev.join_mcast(id, g, flags, context)
        .with_context(|| format!("module: JOIN_MCAST {g} on id {id}"))?;
    let ev = wait(dev, EventType::MulticastJoin)?;
    ensure!(
        ev.id == id
            && ev.status == 0
            && ev.context == context
            && ev.ud_qp_num == GROUP_QPN
            && ev.ud_qkey == UDP_QKEY
            && (1..=RDMA_CM_RS_MAX_UD_PEERS).contains(&ev.ud_peer),
        "module: join of {g}: {} (context {:#x}, want {context:#x})",
        ev.line("module"),
        ev.context
    );
    Ok(ev.ud_peer)
}

/// Joins, leaves, and the refusals: a group joined twice (EADDRINUSE),
/// a unicast address, an unknown flag, an RC id and an unbound UD id
/// (EINVAL), an IPv6 group on RoCE v2 (EOPNOTSUPP: the CM's refusal), a
/// group not joined (ENOENT), more than 56 groups (ENOSPC); 20 rounds of
/// join and leave of one group, which keeps its peer handle; a send-only
/// join; datagrams to a group (their completion); the id destroyed with
/// its groups joined.  On siw: EPROTONOSUPPORT (no UD on iWARP).
pub(super) fn join_leave_and_limits(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let g1 = group(ctx, 1);
    let id = dev.create_id_ps(1, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
    expect_errno(
        "JOIN_MCAST on an unbound id",
        dev.join_mcast(id, &g1, 0, 7),
        libc::EINVAL,
    )?;
    dev.bind(id, &SocketAddr::new(ctx.local4, 0))
        .context("bind")?;
    if ctx.transport != crate::suite::Transport::Rxe {
        return expect_errno(
            "JOIN_MCAST on iWARP",
            dev.join_mcast(id, &g1, 0, 7),
            libc::EPROTONOSUPPORT,
        );
    }
    let peer = join(&dev, id, &g1, 0, 0xA1)?;
    ensure!(dev.query(id)?.qp_num != 0, "module: JOIN_MCAST made no QP");
    expect_errno(
        "second JOIN_MCAST of a group",
        dev.join_mcast(id, &g1, 0, 2),
        libc::EADDRINUSE,
    )?;
    let unicast = SocketAddr::new(ctx.peer4, 0);
    expect_errno(
        "JOIN_MCAST of a unicast address",
        dev.join_mcast(id, &unicast, 0, 2),
        libc::EINVAL,
    )?;
    expect_errno(
        "JOIN_MCAST with flag 2",
        dev.join_mcast(id, &group(ctx, 2), 2, 2),
        libc::EINVAL,
    )?;
    expect_errno(
        "LEAVE_MCAST of a group not joined",
        dev.leave_mcast(id, &group(ctx, 2)),
        libc::ENOENT,
    )?;
    let rc = dev.create_id(3)?;
    dev.bind(rc, &SocketAddr::new(ctx.local4, 0))
        .context("bind rc")?;
    expect_errno(
        "JOIN_MCAST on an RC id",
        dev.join_mcast(rc, &g1, 0, 2),
        libc::EINVAL,
    )?;
    dev.destroy(rc)?;
    let v6 = dev.create_id_ps(4, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
    dev.bind(v6, &SocketAddr::new(ctx.local6, 0))
        .context("bind v6")?;
    let g6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::new(0xff0e, 0, 0, 0, 0, 0, 0x35, 1)), 0);
    expect_errno(
        "JOIN_MCAST of an IPv6 group on RoCE v2",
        dev.join_mcast(v6, &g6, 0, 2),
        libc::EOPNOTSUPP,
    )?;
    dev.destroy(v6)?;
    // Datagrams to the group complete (a full member's own QP may hear
    // them back: drained below).
    for i in 0..4u32 {
        dev.ud_send(id, peer, &[i as u8; MCKEY_SIZE], Some(i))
            .context("module: UD_SEND to the group")?;
    }
    dev.leave_mcast(id, &g1).context("LEAVE_MCAST")?;
    expect_errno("second LEAVE_MCAST", dev.leave_mcast(id, &g1), libc::ENOENT)?;
    for round in 0..20 {
        let again = join(&dev, id, &g1, 0, 0xB0 + round)?;
        ensure!(
            again == peer,
            "module: rejoin {round} got peer {again}, first {peer}"
        );
        dev.leave_mcast(id, &g1)
            .context("LEAVE_MCAST in the churn")?;
    }
    join(&dev, id, &group(ctx, 3), RDMA_CM_RS_JOIN_SENDONLY, 0xC3)?;
    // As many groups as a QP can be attached to: the send-only one and 55.
    for n in 0..55u8 {
        join(&dev, id, &group(ctx, 100 + n), 0, 0xD0)?;
    }
    expect_errno(
        "JOIN_MCAST of a 57th group",
        dev.join_mcast(id, &group(ctx, 99), 0, 2),
        libc::ENOSPC,
    )?;
    while errno_of(dev.ud_recv(id, 4096, 0)).is_none() {}
    // Destroyed with its groups joined: the CM leaves them, the QP is
    // detached before its destruction (kmemleak and the dmesg gate tell).
    dev.destroy(id)?;
    Ok(())
}

/// `mckey -m <group> -b <peer>` receives 10 datagrams the module sends to
/// the group as a send-only member: it exits 0 having received them.
/// mckey posts its receives before it joins, joins within a second of its
/// first line, then waits 3 s before it polls: the module sends 25, one
/// every 100 ms from 1.5 s after that line (a datagram before mckey's
/// join, or after its 10 receives are used, is dropped).
pub(super) fn mckey_receives_from_module(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let g = group(ctx, 10);
    let id = bound_ud(&dev, ctx, 1)?;
    let peer = join(&dev, id, &g, RDMA_CM_RS_JOIN_SENDONLY, 0x10)?;
    let tool = start_tool_past_startup(
        ctx,
        "mckey",
        &format!("-m {} -b {} -C {MCKEY_COUNT}", g.ip(), ctx.peer4),
        MCKEY_TIMEOUT_S,
    )?;
    let (tool, ()) = tool.alongside(|| {
        std::thread::sleep(Duration::from_millis(1500));
        for n in 0..25u32 {
            dev.ud_send(id, peer, &[n as u8; MCKEY_SIZE], Some(n))
                .context("module: UD_SEND to the group")?;
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    })?;
    tool.result()?
        .succeeded_with(&["data transfers complete", "return status 0"])?;
    dev.destroy(id)?;
    Ok(())
}

/// `mckey -m <group> -s -b <peer> -C 200` sends: two ids of the module
/// (full members) receive as many datagrams each, of 100 bytes with
/// mckey's QP number as immediate data, from the peer's address; a third
/// id joins and leaves the group 20 times meanwhile (its own file); a
/// send-only member receives nothing.  mckey posts its sends unsignaled
/// and at once leaves and destroys its QP, which flushes those not yet on
/// the wire: with 10 the module saw 0 to 7 arrive (make check runs), with
/// 200 some always leave first.  Each id keeps 16 receives posted: it
/// gets the first 16 that arrive, the rest are dropped (UD).
pub(super) fn module_receives_from_mckey(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let g = group(ctx, 20);
    let receivers = [bound_ud(&dev, ctx, 1)?, bound_ud(&dev, ctx, 2)?];
    for (i, id) in receivers.iter().enumerate() {
        join(&dev, *id, &g, 0, 0x20 + i as u64)?;
    }
    let silent = bound_ud(&dev, ctx, 3)?;
    join(&dev, silent, &g, RDMA_CM_RS_JOIN_SENDONLY, 0x23)?;
    let tool = start_tool_past_startup(
        ctx,
        "mckey",
        &format!("-m {} -s -b {} -C {MCKEY_SENDS}", g.ip(), ctx.peer4),
        MCKEY_TIMEOUT_S,
    )?;
    let local4 = ctx.local4;
    let churn = std::thread::spawn(move || -> Result<u32> {
        let dev = Device::open()?;
        let id = dev.create_id_ps(9, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
        dev.bind(id, &SocketAddr::new(local4, 0)).context("bind")?;
        let mut rounds = 0;
        for _ in 0..20 {
            join(&dev, id, &g, 0, 0x29)?;
            std::thread::sleep(Duration::from_millis(100));
            dev.leave_mcast(id, &g)
                .context("LEAVE_MCAST in the churn")?;
            rounds += 1;
        }
        dev.destroy(id)?;
        Ok(rounds)
    });
    // Nothing is read before mckey ended: each id then holds the first 16
    // datagrams that arrived (reading meanwhile would post receives again
    // under the burst, to one id before the other).
    let r = tool.result()?;
    r.succeeded_with(&["data transfers complete", "return status 0"])?;
    let mut got = Vec::new();
    for id in receivers {
        let mut datagrams = Vec::new();
        loop {
            match dev.ud_recv(id, 4096, 1000) {
                Ok(d) => datagrams.push(d),
                Err(e) if matches!(e.raw_os_error(), Some(libc::ETIMEDOUT | libc::EAGAIN)) => break,
                Err(e) => return Err(e).context("module: UD_RECV"),
            }
        }
        ensure!(
            (1..=RDMA_CM_RS_RECV_DEPTH as usize).contains(&datagrams.len()),
            "module: id {id} received {} datagrams with {} receives posted",
            datagrams.len(),
            RDMA_CM_RS_RECV_DEPTH
        );
        got.push(datagrams);
    }
    let rounds = churn
        .join()
        .map_err(|_| anyhow::anyhow!("the churn thread panicked"))??;
    ensure!(
        got[0].len() == got[1].len() && got[0].iter().zip(&got[1]).all(|(a, b)| a.imm == b.imm),
        "module: the two ids received {} and {} datagrams (imm {:?} and {:?})",
        got[0].len(),
        got[1].len(),
        got[0].iter().map(|d| d.imm).collect::<Vec<_>>(),
        got[1].iter().map(|d| d.imm).collect::<Vec<_>>()
    );
    let sender_qp = got[0][0].src_qp;
    for (datagrams, id) in got.iter().zip(receivers) {
        for d in datagrams {
            ensure!(
                d.data.len() == MCKEY_SIZE
                    && d.imm == Some(sender_qp)
                    && d.src_qp == sender_qp
                    && d.src.map(|a| a.ip()) == Some(ctx.peer4),
                "module: id {id}: datagram of {} bytes imm {:?} from QP {:#x} at {:?} (mckey's QP {sender_qp:#x} at {})",
                d.data.len(),
                d.imm,
                d.src_qp,
                d.src,
                ctx.peer4
            );
        }
    }
    expect_errno(
        "UD_RECV on a send-only member",
        dev.ud_recv(silent, 4096, 0),
        libc::EAGAIN,
    )?;
    note(&format!(
        "2 ids received {} of mckey's {MCKEY_SENDS} datagrams each from mckey's QP {sender_qp:#x}; a third joined and left {rounds} times meanwhile",
        got[0].len()
    ));
    for id in receivers.into_iter().chain([silent]) {
        dev.destroy(id)?;
    }
    Ok(())
}
