// SPDX-License-Identifier: GPL-2.0
//! The port spaces besides RDMA_PS_TCP and RDMA_PS_UDP: RDMA_PS_IB (RC
//! here; its UD scenarios are in `ud.rs`, its ucmatose runs in
//! `interop.rs`) is a port space of its own on RoCE, and RDMA_PS_IPOIB is
//! refused on a device that is not InfiniBand (RoCE's rxe, iWARP's siw).
//!
//! The CM (drivers/infiniband/core/cma.c) keeps one port table per port
//! space (`cma_pernet_xa`), and on IB and RoCE a listener's service ID is
//! its port space shifted left 16 bits plus its port
//! (`rdma_get_service_id`): a request reaches only the listener of its own
//! port space, and the same port may be bound in each.  RDMA_PS_IPOIB
//! needs an IPoIB device: `cma_acquire_dev_by_src_ip` (and, on the passive
//! side, `cma_ib_acquire_dev`) refuses an id of that port space with
//! -EINVAL when the address's device type is not ARPHRD_INFINIBAND, before
//! any SA query for the IPoIB broadcast group's Q_Key
//! (`cma_set_default_qkey`) could be made.

use super::interop::{next_event_within, run_tool, start_tool_past_startup, FIRST_REQUEST_WAIT_MS};
use super::{expect_errno, field, no_event, wait, Ctx};
use crate::agent::Call;
use crate::uapi::*;
use anyhow::{ensure, Context, Result};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// IB_CM_REJ_INVALID_SERVICE_ID: the IB CM's answer to a REQ no listener
/// takes (`cm_req_handler`).
const REJ_INVALID_SERVICE_ID: &str = "8";

/// udaddy's run bound here: each ends within seconds.
const TOOL_TIMEOUT_S: u32 = 60;

/// An RC listener of port space `ps` on `addr`.
fn rc_listen(dev: &Device, addr: SocketAddr, ps: u32, context: u64) -> Result<u32> {
    let id = dev.create_id_ps(context, ps, RDMA_CM_RS_QPT_RC)?;
    dev.bind(id, &addr)
        .with_context(|| format!("bind in port space {ps:#x}"))?;
    dev.listen(id, 4).context("listen")?;
    Ok(id)
}

/// RDMA_PS_IB and RDMA_PS_TCP are separate port spaces: the module's
/// RDMA_PS_IB RC listener and its RDMA_PS_TCP one share a port (a second
/// RDMA_PS_IB bind of it is refused with EADDRINUSE); librdmacm's
/// RDMA_PS_TCP request reaches the RDMA_PS_TCP listener only (rejected,
/// the agent sees the module's reason 28), `ucmatose -P ib`'s reaches the
/// RDMA_PS_IB listener only (rejected: ucmatose ends with REJECTED); once
/// the RDMA_PS_TCP listener is gone, librdmacm's RDMA_PS_TCP request is
/// rejected by the CM (reason 8, invalid service ID) and the RDMA_PS_IB
/// listener on the port sees nothing.
///
/// On iWARP the CM's port tables are separate too (the RDMA_PS_TCP bind
/// succeeds), but the iWARP CM listens on the TCP port itself: the
/// RDMA_PS_TCP listen fails with EADDRINUSE, and the scenario ends there.
pub(super) fn port_spaces_are_separate(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l_ib = rc_listen(&dev, addr, RDMA_CM_RS_PS_IB, 1)?;
    let again = dev.create_id_ps(0, RDMA_CM_RS_PS_IB, RDMA_CM_RS_QPT_RC)?;
    expect_errno(
        "a second RDMA_PS_IB bind of the port",
        dev.bind(again, &addr),
        libc::EADDRINUSE,
    )?;
    dev.destroy(again)?;
    if ctx.iwarp() {
        let id = dev.create_id_ps(2, RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_RC)?;
        dev.bind(id, &addr).context("RDMA_PS_TCP bind")?;
        return expect_errno(
            "RDMA_PS_TCP listen on a RDMA_PS_IB listener's TCP port",
            dev.listen(id, 4),
            libc::EADDRINUSE,
        );
    }
    let l_tcp = rc_listen(&dev, addr, RDMA_CM_RS_PS_TCP, 2)?;

    // librdmacm's RDMA_PS_TCP request.
    let call = Call::start(&ctx.agent, &format!("connect addr={addr} data=01"))?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    ensure!(
        req.id == l_tcp && req.context == 2,
        "module: librdmacm's RDMA_PS_TCP request came as {}",
        req.line("module")
    );
    ensure!(
        dev.query(req.new_id)?.port_space == RDMA_CM_RS_PS_TCP,
        "module: the RDMA_PS_TCP request's id is not of RDMA_PS_TCP"
    );
    dev.reject(req.new_id, 0, b"tcp")?;
    let r = call.result()?;
    ensure!(
        (field(&r, "event")?, field(&r, "status")?) == ("REJECTED", "28"),
        "librdmacm's RDMA_PS_TCP request: {r:?}"
    );

    // ucmatose's RDMA_PS_IB request.
    let args = format!("-P ib -s {} -p {}", addr.ip(), addr.port());
    let tool = start_tool_past_startup(ctx, "ucmatose", &args, TOOL_TIMEOUT_S)?;
    let (tool, ()) = tool.alongside(|| {
        let req = next_event_within(&dev, FIRST_REQUEST_WAIT_MS)?;
        ensure!(
            req.event == EventType::ConnectRequest && req.id == l_ib && req.context == 1,
            "module: ucmatose -P ib's request came as {}",
            req.line("module")
        );
        ensure!(
            dev.query(req.new_id)?.port_space == RDMA_CM_RS_PS_IB,
            "module: the RDMA_PS_IB request's id is not of RDMA_PS_IB"
        );
        dev.reject(req.new_id, 0, b"ib")?;
        Ok(())
    })?;
    let r = tool.result()?;
    // The module's reason: 28, consumer defined.
    ensure!(
        r.status != 0
            && !r.timed_out
            && r.has_line("cmatose: event: RDMA_CM_EVENT_REJECTED, error: 28"),
        "ucmatose -P ib, rejected by the module's RDMA_PS_IB listener: status {}, output:\n{}",
        r.status,
        r.output
    );

    // Without the RDMA_PS_TCP listener: the CM rejects, the RDMA_PS_IB
    // listener sees nothing.
    dev.destroy(l_tcp)?;
    let r = Call::start(&ctx.agent, &format!("connect addr={addr} data=02"))?.result()?;
    ensure!(
        (field(&r, "event")?, field(&r, "status")?) == ("REJECTED", REJ_INVALID_SERVICE_ID),
        "librdmacm's RDMA_PS_TCP request to the RDMA_PS_IB listener's port: {r:?}"
    );
    no_event(
        &dev,
        300,
        "module: RDMA_PS_IB listener after a RDMA_PS_TCP request",
    )?;
    dev.destroy(l_ib)?;
    Ok(())
}

/// RDMA_PS_IPOIB off InfiniBand (RoCE, and iWARP alike): the module takes
/// a UD id of the port space (not an RC one: EINVAL), but the CM refuses
/// to give it the device:
/// BIND to the device's address fails with EINVAL, and address
/// resolution ends in ADDR_ERROR with status -EINVAL
/// (`cma_acquire_dev_by_src_ip`: the address's device is not
/// ARPHRD_INFINIBAND); a bind to the wildcard, which takes no device,
/// succeeds.  librdmacm gets the same answers: `udaddy -P ipoib`
/// as a client fails at ADDR_ERROR, as a server at its bind.
pub(super) fn ipoib_refused_off_infiniband(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    expect_errno(
        "RDMA_PS_IPOIB RC id",
        dev.create_id_ps(0, RDMA_CM_RS_PS_IPOIB, RDMA_CM_RS_QPT_RC),
        libc::EINVAL,
    )?;
    let id = dev.create_id_ps(0, RDMA_CM_RS_PS_IPOIB, RDMA_CM_RS_QPT_UD)?;
    expect_errno(
        "BIND of a RDMA_PS_IPOIB id to the RoCE device's address",
        dev.bind(id, &SocketAddr::new(ctx.local4, ctx.port())),
        libc::EINVAL,
    )?;
    dev.destroy(id)?;
    // The wildcard takes no device: the bind is the port's alone.
    let id = dev.create_id_ps(0, RDMA_CM_RS_PS_IPOIB, RDMA_CM_RS_QPT_UD)?;
    dev.bind(id, &SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0))
        .context("BIND of a RDMA_PS_IPOIB id to the wildcard")?;
    dev.destroy(id)?;
    let id = dev.create_id_ps(0, RDMA_CM_RS_PS_IPOIB, RDMA_CM_RS_QPT_UD)?;
    dev.resolve_addr(id, &SocketAddr::new(ctx.peer4, ctx.port()), 2000)
        .context("RESOLVE_ADDR")?;
    let e = wait(&dev, EventType::AddrError)?;
    ensure!(
        e.id == id && e.status == -libc::EINVAL,
        "module: {} (expected ADDR_ERROR, status -EINVAL)",
        e.line("module")
    );
    dev.destroy(id)?;

    let client = run_tool(
        ctx,
        "udaddy",
        &format!("-P ipoib -s {}", ctx.local4),
        0,
        TOOL_TIMEOUT_S,
    )?
    .result()?;
    ensure!(
        client.status != 0
            && !client.timed_out
            && client.has_line("udaddy: event: RDMA_CM_EVENT_ADDR_ERROR, error: -22")
            && client.has_line("return status -22"),
        "udaddy -P ipoib -s: status {}, output:\n{}",
        client.status,
        client.output
    );
    let server = run_tool(
        ctx,
        "udaddy",
        &format!("-P ipoib -b {}", ctx.peer4),
        0,
        TOOL_TIMEOUT_S,
    )?
    .result()?;
    ensure!(
        server.status != 0
            && !server.timed_out
            && server.has_line("udaddy: bind address failed: Invalid argument"),
        "udaddy -P ipoib -b: status {}, output:\n{}",
        server.status,
        server.output
    );
    Ok(())
}
