// SPDX-License-Identifier: GPL-2.0

//! Connections: listening, connecting, private data, rejects, accept
//! parameters and their negotiation, iWARP's rules.

#[allow(unused_imports)]
use super::*;

pub(super) fn info_reports_abi(_: &mut Ctx) -> Result<()> {
    let i = Device::open()?.info()?;
    ensure!(
        i.abi_version == RDMA_CM_RS_ABI_VERSION,
        "abi_version {}",
        i.abi_version
    );
    ensure!(i.max_private_data == 256 && i.max_message == 4096 && i.recv_depth == 16);
    ensure!(i.send_window == 16, "send_window {}", i.send_window);
    ensure!(i.max_ids >= 200, "max_ids {}", i.max_ids);
    Ok(())
}

/// The module listens; librdmacm connects with 56 bytes (the RDMA_PS_TCP
/// maximum), the module accepts with 196, a message each way, the client
/// disconnects, both see DISCONNECTED.
pub(super) fn module_listens(ctx: &mut Ctx, local: IpAddr) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(local, ctx.port());
    let l = listen(&dev, addr, 8, 7)?;
    let (req_data, acc_data) = (pattern(56, 1), pattern(196, 2));
    let (msg, reply) = (
        b"ping from librdmacm".to_vec(),
        b"pong from the module".to_vec(),
    );
    let call = Call::start(
        &ctx.agent,
        &format!(
            "connect addr={addr} data={} msg={} disc=self",
            hex(&req_data),
            hex(&msg)
        ),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    ensure!(
        req.id == l && req.context == 7 && req.new_id != 0,
        "request: {req:?}"
    );
    // Exactly the 56 bytes sent, reported as 56.
    verify(
        "module: CONNECT_REQUEST private data",
        &req_data,
        &req.private_data,
    )?;
    dev.accept(req.new_id, Some(&Param::with_data(&acc_data)))?;
    let est = wait(&dev, EventType::Established)?;
    ensure!(est.id == req.new_id, "ESTABLISHED on id {}", est.id);
    let got = dev.recv(req.new_id, 4096, T).context("module recv")?;
    verify("module: received message", &msg, &got)?;
    // Not waited for: the peer disconnects once it has the reply, and on
    // rxe the reply's ACK may then never come (testing.rst, "Debugging
    // rxe": a receive completes before its ACK leaves); the peer's report
    // says it arrived.
    dev.send_nowait(req.new_id, &reply).context("module send")?;
    let disc = wait(&dev, EventType::Disconnected)?;
    ensure!(disc.id == req.new_id);
    // The passive side completes the handshake (the IB CM sends the DREP).
    dev.disconnect(req.new_id)?;
    let q = dev.query(req.new_id)?;
    ensure!(
        q.state == rdma_cm_rs_state_RDMA_CM_RS_DISCONNECT,
        "state {}",
        q.state
    );
    let r = call.result()?;
    ensure!(field(&r, "event")? == "ESTABLISHED", "peer: {r:?}");
    // Exactly the 196 bytes accepted (the REP's whole private data).
    verify(
        "librdmacm: ESTABLISHED private data",
        &acc_data,
        &unhex(field(&r, "pdata")?)?,
    )?;
    verify(
        "librdmacm: received reply",
        &reply,
        &unhex(field(&r, "reply")?)?,
    )?;
    ensure!(field(&r, "disc")? == "DISCONNECTED", "peer: {r:?}");
    Ok(())
}

pub(super) fn module_listens_v4(ctx: &mut Ctx) -> Result<()> {
    module_listens(ctx, ctx.local4)
}

pub(super) fn module_listens_v6(ctx: &mut Ctx) -> Result<()> {
    module_listens(ctx, ctx.local6)
}

/// librdmacm listens; the module connects with 56 bytes, the peer accepts
/// with 196, a message each way, the module disconnects.
pub(super) fn module_connects(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let (req_data, acc_data) = (pattern(56, 3), pattern(196, 4));
    let mut call = Call::start(
        &ctx.agent,
        &format!(
            "serve addr={addr} count=1 accept={} echo=1 disc=self",
            hex(&acc_data)
        ),
    )?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(&req_data))?;
    let est = wait(&dev, EventType::Established)?;
    verify(
        "module: ESTABLISHED private data",
        &acc_data,
        &est.private_data,
    )?;
    let q = dev.query(id)?;
    ensure!(
        q.qp_num != 0 && q.state == rdma_cm_rs_state_RDMA_CM_RS_CONNECT,
        "query: {q:?}"
    );
    ensure!(
        parse_sockaddr(&q.dst) == Some(addr),
        "dst {:?}",
        parse_sockaddr(&q.dst)
    );
    echo_then_peer_disconnects(&dev, id, call, &req_data, b"hello from the kernel")
}

/// The module sends `msg` and receives the peer's echo (`serve ... echo=1
/// disc=self`); the peer, which sent last, disconnects; its report must show
/// the request's `req_data`, the message and the disconnect.
///
/// The peer disconnects, not the module: rxe's responder reports a receive
/// before it sends the ACK, and drops the ACK if its QP went to the error
/// state in between (testing.rst, "Debugging rxe"), so a module
/// disconnecting at once could leave the peer's echo unacknowledged.  For
/// the same reason the module's own message is not waited for: the peer
/// echoes it and disconnects, which may come before rxe sent its ACK; the
/// echo says it arrived.
pub(super) fn echo_then_peer_disconnects(
    dev: &Device,
    id: u32,
    call: Call,
    req_data: &[u8],
    msg: &[u8],
) -> Result<()> {
    dev.send_nowait(id, msg).context("module send")?;
    let echo = match dev.recv(id, 4096, T) {
        Ok(echo) => echo,
        // What the peer saw of its echo (`lastecho`: the send's status)
        // tells a message lost at the receiver from one never sent.
        Err(e) => {
            let peer = call
                .result()
                .map_or_else(|e| format!("no report: {e:#}"), |r| format!("{r:?}"));
            return Err(e).context(format!("module recv (the peer: {peer})"));
        }
    };
    verify("module: received echo", msg, &echo)?;
    wait(dev, EventType::Disconnected)?;
    dev.disconnect(id)?;
    let r = call.result()?;
    verify(
        "librdmacm: CONNECT_REQUEST private data",
        req_data,
        &unhex(field(&r, "req0")?)?,
    )?;
    verify(
        "librdmacm: received message",
        msg,
        &unhex(field(&r, "msg0")?)?,
    )?;
    ensure!(field(&r, "disc0")? == "DISCONNECTED", "peer: {r:?}");
    Ok(())
}

/// The private data limits of the transport: connect, accept, reject.
/// IB/RoCE: the IB CM's REQ less the CMA header, REP, REJ; iWARP: MPA's
/// 256 less the MPA v2 header, for each, and one byte less on a siw
/// without kernel fix 0003, which the module then allows (it announced
/// none of 252 bytes).
pub(super) fn private_data_maxima(ctx: &Ctx) -> (usize, usize, usize) {
    if ctx.iwarp() {
        let max = if ctx.fixes.has("0003") { 252 } else { 251 };
        (max, max, max)
    } else {
        (56, 196, 148)
    }
}

pub(super) fn private_data_limits(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let (connect_max, accept_max, reject_max) = private_data_maxima(ctx);
    // Connect: one byte over the limit is refused before anything is sent;
    // the limit goes.
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(&ctx.agent, &format!("serve addr={addr} count=1 accept=-"))?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    expect_errno(
        &format!("connect with {} bytes", connect_max + 1),
        dev.connect(id, &Param::with_data(&vec![1; connect_max + 1])),
        libc::EINVAL,
    )?;
    let sent = pattern(connect_max, 1);
    dev.connect(id, &Param::with_data(&sent))
        .with_context(|| format!("connect with {connect_max} bytes"))?;
    wait(&dev, EventType::Established)?;
    dev.disconnect(id)?;
    wait(&dev, EventType::Disconnected)?;
    let r = call.result()?;
    // The limit arrives whole (IB pads nothing more at its limit).
    verify(
        "librdmacm: CONNECT_REQUEST private data",
        &sent,
        &unhex(field(&r, "req0")?)?,
    )?;
    // Accept and reject one over the limit refused, then the limit accepted.
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    listen(&dev, addr, 4, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={addr} data=00 disc=peer"),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    expect_errno(
        &format!("accept with {} bytes", accept_max + 1),
        dev.accept(
            req.new_id,
            Some(&Param::with_data(&vec![2; accept_max + 1])),
        ),
        libc::EINVAL,
    )?;
    expect_errno(
        &format!("reject with {} bytes", reject_max + 1),
        dev.reject(req.new_id, 0, &vec![3; reject_max + 1]),
        libc::EINVAL,
    )?;
    dev.accept(req.new_id, Some(&Param::with_data(&vec![2; accept_max])))?;
    wait(&dev, EventType::Established)?;
    disconnect_and_wait(&dev, req.new_id)?;
    let r = call.result()?;
    ensure!(unhex(field(&r, "pdata")?)? == vec![2; accept_max]);
    if ctx.iwarp() {
        // MPA carries exact lengths both ways (IB would pad these to 56
        // and 196): 100 bytes in, 10 bytes back.
        let call = Call::start(
            &ctx.agent,
            &format!(
                "connect addr={addr} data={} disc=peer",
                hex(&pattern(100, 4))
            ),
        )?;
        let req = wait(&dev, EventType::ConnectRequest)?;
        verify(
            "module: CONNECT_REQUEST private data",
            &pattern(100, 4),
            &req.private_data,
        )?;
        dev.accept(req.new_id, Some(&Param::with_data(&pattern(10, 5))))?;
        wait(&dev, EventType::Established)?;
        disconnect_and_wait(&dev, req.new_id)?;
        let r = call.result()?;
        verify(
            "librdmacm: ESTABLISHED private data",
            &pattern(10, 5),
            &unhex(field(&r, "pdata")?)?,
        )?;
    }
    Ok(())
}

/// UD does not exist on iWARP: a UDP id resolves to siw, but its QP (made
/// by CONNECT) is refused with EPROTONOSUPPORT, and the id stays usable.
pub(super) fn iwarp_ud_refused(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let dst = SocketAddr::new(ctx.peer4, ctx.port());
    let id = resolve_ps(&dev, dst, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
    expect_errno(
        "CONNECT of a UD id on siw",
        dev.connect(id, &Param::with_data(b"datagram")),
        libc::EPROTONOSUPPORT,
    )?;
    ensure!(dev.query(id)?.qp_num == 0, "a QP was left on the id");
    dev.destroy(id)?;
    Ok(())
}

/// `rdma_connect(3)`: over iWARP the active side sends first.  The module,
/// passive, cannot SEND (EAGAIN, nothing sent) until the peer's first
/// message arrived (held back 1 s here); then it answers.
pub(super) fn iwarp_active_side_sends_first(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let (_, id, call) = iwarp_passive_connection(ctx, &dev, 1000)?;
    verify(
        "module: the first message",
        IWARP_FIRST,
        &dev.recv(id, 4096, T).context("module recv")?,
    )?;
    dev.send(id, b"answer")
        .context("module SEND after the first message")?;
    iwarp_passive_answered(&dev, call)
}

/// The active side's first message in the iWARP scenarios.
pub(super) const IWARP_FIRST: &[u8] = b"first, from the active side";

/// iWARP, the module passive: a listener, the peer connecting to it and
/// sending [`IWARP_FIRST`] `delay_ms` after its ESTABLISHED, the request
/// accepted, and the module's SEND before that message refused with
/// EAGAIN (the active side sends first, rdma_connect(3)).  The listener,
/// the connection's id and the peer's call.
pub(super) fn iwarp_passive_connection(
    ctx: &mut Ctx,
    dev: &Device,
    delay_ms: u32,
) -> Result<(u32, u32, Call)> {
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let listener = listen(dev, addr, 4, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!(
            "connect addr={addr} data=00 msg={} delay={delay_ms} disc=self",
            hex(IWARP_FIRST)
        ),
    )?;
    let req = wait(dev, EventType::ConnectRequest)?;
    dev.accept(req.new_id, None)?;
    wait(dev, EventType::Established)?;
    expect_errno(
        "module SEND before the peer's first message",
        dev.send(req.new_id, b"too early"),
        libc::EAGAIN,
    )?;
    Ok((listener, req.new_id, call))
}

/// The end of [`iwarp_passive_connection`] once the module sent "answer":
/// the peer disconnects, having got the answer and nothing before it.
pub(super) fn iwarp_passive_answered(dev: &Device, call: Call) -> Result<()> {
    wait(dev, EventType::Disconnected)?;
    let r = call.result()?;
    ensure!(unhex(field(&r, "reply")?)? == b"answer", "peer: {r:?}");
    Ok(())
}

pub(super) fn reject_both_ways(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    // The module rejects: reason 0 means consumer defined (28).
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    listen(&dev, addr, 4, 0)?;
    let call = Call::start(&ctx.agent, &format!("connect addr={addr} data=01"))?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    let (_, _, reject_max) = private_data_maxima(ctx);
    let data = pattern(reject_max, 5);
    dev.reject(req.new_id, 0, &data)?;
    let r = call.result()?;
    ensure!(field(&r, "event")? == "REJECTED", "peer: {r:?}");
    // IB: the reason (consumer defined); iWARP carries none: the MPA reply
    // with the reject bit reaches the peer as ECONNRESET.
    let want_status = if ctx.iwarp() { "-104" } else { "28" };
    ensure!(
        field(&r, "status")? == want_status,
        "peer status {}, expected {want_status}",
        field(&r, "status")?
    );
    ensure!(
        unhex(field(&r, "pdata")?)? == data,
        "peer got {}",
        field(&r, "pdata")?
    );
    // The peer rejects the module.
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let data = pattern(reject_max, 6);
    let mut call = Call::start(
        &ctx.agent,
        &format!("serve addr={addr} count=1 reject=1 rejdata={}", hex(&data)),
    )?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(b"please"))?;
    let rej = wait(&dev, EventType::Rejected)?;
    let want_status = if ctx.iwarp() { -libc::ECONNRESET } else { 28 };
    ensure!(
        rej.status == want_status,
        "module saw status {}, expected {want_status}",
        rej.status
    );
    ensure!(
        rej.private_data == data,
        "module got {}",
        hex(&rej.private_data)
    );
    let r = call.result()?;
    if ctx.iwarp() {
        // MPA: exactly what was sent.
        verify(
            "librdmacm: CONNECT_REQUEST private data",
            b"please",
            &unhex(field(&r, "req0")?)?,
        )?;
    } else {
        // The IB CM pads REQ private data to 56 bytes.
        verify_padded(
            "librdmacm: CONNECT_REQUEST private data",
            b"please",
            &unhex(field(&r, "req0")?)?,
            56,
        )?;
    }
    Ok(())
}

pub(super) fn accept_with_request_param(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    listen(&dev, addr, 4, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={addr} data=00 rr=3 id=2 disc=peer"),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    // Events give the receiver's side: the peer's initiator depth is our
    // responder resources.
    ensure!(
        req.responder_resources == 2 && req.initiator_depth == 3,
        "request rr {} id {}",
        req.responder_resources,
        req.initiator_depth
    );
    dev.accept(req.new_id, None)?;
    wait(&dev, EventType::Established)?;
    // rdma_accept(3) with no parameters: the request's values.
    let q = dev.query(req.new_id)?;
    ensure!(
        q.responder_resources == 2 && q.initiator_depth == 3,
        "module negotiated rr {} id {}",
        q.responder_resources,
        q.initiator_depth
    );
    disconnect_and_wait(&dev, req.new_id)?;
    let r = call.result()?;
    ensure!(field(&r, "event")? == "ESTABLISHED");
    let (peer_rr, peer_id) = peer_reported_depths(ctx, (2, 3));
    ensure!(
        field(&r, "rr")? == peer_rr.to_string() && field(&r, "id")? == peer_id.to_string(),
        "peer saw {r:?}"
    );
    Ok(())
}

/// What a librdmacm active side's ESTABLISHED reports as (responder
/// resources, initiator depth) when the module settled on `module`: its
/// own side over IB (the IB CM swaps the REP's fields), but over iWARP the
/// module's, as the MPA reply carried them (`cma_iw_handler` puts the
/// provider's IRD in `initiator_depth`; the module's layer swaps its own
/// events back, librdmacm does not).
pub(super) fn peer_reported_depths(ctx: &Ctx, module: (u8, u8)) -> (u8, u8) {
    if ctx.iwarp() {
        module
    } else {
        (module.1, module.0)
    }
}

pub(super) fn conn_param_negotiation(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    listen(&dev, addr, 4, 0)?;
    // (client rr, id, retry, rnr; module accept rr, id).  Events report the
    // receiver's side: the client's initiator depth is the module's
    // responder resources and the other way round.
    for (rr, id, retry, rnr, arr, aid) in [
        (2u8, 3u8, 5u8, 6u8, 1u8, 2u8),
        (1, 1, 7, 7, 1, 1),
        (4, 2, 0, 0, 2, 4),
    ] {
        let call = Call::start(
            &ctx.agent,
            &format!(
                "connect addr={addr} data=00 rr={rr} id={id} retry={retry} rnr={rnr} disc=peer"
            ),
        )?;
        let req = wait(&dev, EventType::ConnectRequest)?;
        let seen = (
            req.responder_resources,
            req.initiator_depth,
            req.retry_count,
            req.rnr_retry_count,
        );
        // MPA carries no retry counts.
        let (want_retry, want_rnr) = if ctx.iwarp() { (0, 0) } else { (retry, rnr) };
        ensure!(
            seen == (id, rr, want_retry, want_rnr),
            "client rr {rr} id {id} retry {retry} rnr {rnr}: module saw rr {} id {} retry {} rnr {}",
            seen.0,
            seen.1,
            seen.2,
            seen.3
        );
        let mut p = Param::with_data(b"ok");
        p.responder_resources = arr;
        p.initiator_depth = aid;
        dev.accept(req.new_id, Some(&p))?;
        wait(&dev, EventType::Established)?;
        // siw negotiates in the MPA v2 header, relaxed: an IRD below the
        // peer's ORD is raised to it, an ORD above the peer's IRD lowered.
        let settled = if ctx.iwarp() {
            (arr.max(id), aid.min(rr))
        } else {
            (arr, aid)
        };
        let q = dev.query(req.new_id)?;
        ensure!(
            (q.responder_resources, q.initiator_depth) == settled,
            "module accepted rr {arr} id {aid}, QUERY says rr {} id {}",
            q.responder_resources,
            q.initiator_depth
        );
        disconnect_and_wait(&dev, req.new_id)?;
        dev.destroy(req.new_id)?;
        let r = call.result()?;
        let (peer_rr, peer_id) = peer_reported_depths(ctx, settled);
        ensure!(
            field(&r, "rr")? == peer_rr.to_string() && field(&r, "id")? == peer_id.to_string(),
            "module accepted rr {arr} id {aid}, peer saw {r:?}"
        );
    }
    // 3-bit retry counts: 8 is refused by the module before the CM.
    let id = resolve(&dev, SocketAddr::new(ctx.peer4, ctx.port()))?;
    let mut bad = Param::with_data(b"x");
    bad.retry_count = 8;
    expect_errno("retry_count 8", dev.connect(id, &bad), libc::EINVAL)?;
    bad.retry_count = 7;
    bad.rnr_retry_count = 8;
    expect_errno("rnr_retry_count 8", dev.connect(id, &bad), libc::EINVAL)?;
    Ok(())
}

/// How long the module leaves its receives full in
/// [`rnr_retry_count_takes_effect`].
const RNR_HOLD_MS: u64 = 1000;
/// The peer's burst: more SENDs than the module has receives (16).
const RNR_FLOOD: usize = 20;

/// `rnr_retry_count` reaches the wire, on `rdma_connect` and on
/// `rdma_accept`: as `rdma_connect(3)` and `rdma_accept(3)` say, it bounds
/// the RNR retries of the *remote peer's* sends (the IB CM carries it in
/// the REQ and the REP to the other side's QP).  The librdmacm peer sends
/// a burst of [`RNR_FLOOD`] messages; the module reads none for
/// [`RNR_HOLD_MS`], so its 16 receives fill and the 17th SEND meets RNR
/// NAKs.  With 0 that SEND fails at once (RNR retries exceeded), the
/// peer's QP goes to the error state and the module reads 16 messages;
/// with 7 (retry for ever) the peer's SENDs wait for the module to read,
/// and all 20 arrive.  The peer disconnects once its burst is over (all
/// its completions reaped: a disconnect of the module's could flush SENDs
/// whose ACK was still on its way), and the module reads what it holds
/// after that.  Had the value not reached the peer's QP, both
/// halves would behave alike: one of them fails.  On `rdma_accept` the
/// module also passes `retry_count` 0, which that call ignores.
pub(super) fn rnr_retry_count_takes_effect(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let mut seen = Vec::new();
    for rnr in [0u8, 7] {
        let mut p = Param::with_data(b"rnr");
        p.rnr_retry_count = rnr;
        // The module connects.
        let addr = SocketAddr::new(ctx.peer4, ctx.port());
        let mut call = Call::start(
            &ctx.agent,
            &format!("serve addr={addr} count=1 accept=00 flood={RNR_FLOOD} disc=self"),
        )?;
        call.ready()?;
        let id = resolve(&dev, addr)?;
        dev.connect(id, &p)?;
        wait(&dev, EventType::Established)?;
        let got = rnr_read_after_hold(&dev, id, rnr).context("rdma_connect")?;
        wait(&dev, EventType::Disconnected)?;
        // The destruction answers the peer's DREQ (its DREP).
        dev.destroy(id)?;
        let r = call.result()?;
        rnr_peer_sent(field(&r, "flood0")?, got).context("rdma_connect")?;
        seen.push(format!(
            "connect, rnr_retry_count {rnr}: {got} of {RNR_FLOOD}"
        ));
        // The module accepts.
        let addr = SocketAddr::new(ctx.local4, ctx.port());
        let listener = listen(&dev, addr, 4, 0)?;
        let call = Call::start(
            &ctx.agent,
            &format!("connect addr={addr} data=01 flood={RNR_FLOOD} disc=self"),
        )?;
        let req = wait(&dev, EventType::ConnectRequest)?;
        p.retry_count = 0;
        dev.accept(req.new_id, Some(&p))?;
        wait(&dev, EventType::Established)?;
        let got = rnr_read_after_hold(&dev, req.new_id, rnr).context("rdma_accept")?;
        wait(&dev, EventType::Disconnected)?;
        dev.destroy(req.new_id)?;
        let r = call.result()?;
        rnr_peer_sent(field(&r, "flood")?, got).context("rdma_accept")?;
        dev.destroy(listener)?;
        seen.push(format!(
            "accept, rnr_retry_count {rnr}: {got} of {RNR_FLOOD}"
        ));
    }
    note(&format!("messages the module read: {}", seen.join("; ")));
    Ok(())
}

/// Reads nothing for [`RNR_HOLD_MS`], then every message until none comes
/// for 1.5 s (the peer retries every RNR timer, 655 ms at most): 16 (its
/// receives) with `rnr` 0, all [`RNR_FLOOD`] with 7.
fn rnr_read_after_hold(dev: &Device, id: u32, rnr: u8) -> Result<usize> {
    std::thread::sleep(Duration::from_millis(RNR_HOLD_MS));
    let mut got = 0;
    while got < RNR_FLOOD && dev.recv(id, 4096, 1500).is_ok() {
        got += 1;
    }
    let want = if rnr == 0 { 16 } else { RNR_FLOOD };
    ensure!(
        got == want,
        "with rnr_retry_count {rnr} the module read {got} of the peer's {RNR_FLOOD} messages, expected {want}"
    );
    Ok(got)
}

/// The peer's `flood` report: as many SENDs completed as the module read.
fn rnr_peer_sent(flood: &str, got: usize) -> Result<()> {
    ensure!(
        flood == format!("{got}/{RNR_FLOOD}"),
        "the peer's SENDs: {flood} completed, the module read {got}"
    );
    Ok(())
}

/// How long a SEND to a peer that vanished takes to fail: the QP retries
/// `retry_count` times, each after the local ACK timeout (4.096 us x
/// 2^`ack_timeout`), then fails with RETRY_EXC_ERR.
fn retry_exhaustion(retry_count: u8, ack_timeout: u8) -> Duration {
    Duration::from_nanos((4096u64 << ack_timeout) * (u64::from(retry_count) + 1))
}

/// Sends until a SEND fails (the peer's QP may still be there for the
/// first) and returns how long the failing one took: post to completion.
fn time_to_retry_exhaustion(dev: &Device, id: u32) -> Result<Duration> {
    // The peer destroys its QP as soon as it is established.
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..5 {
        let start = Instant::now();
        match dev.send_flags(id, b"anybody there?", 30_000, 0) {
            Ok(()) => std::thread::sleep(Duration::from_millis(300)),
            Err(_) => return Ok(start.elapsed()),
        }
    }
    bail!("5 SENDs to a peer whose QP is gone completed")
}

/// `retry_count` (of `rdma_connect(3)`) and `RDMA_OPTION_ID_ACK_TIMEOUT`
/// (`rdma_set_option(3)`) take effect: against a peer whose QP vanished
/// (the agent's `vanish=1`: destroyed once established, its id kept, so
/// nothing answers and nothing disconnects), a SEND fails after
/// (retry_count + 1) ACK timeouts.  Connecting with retry counts 1 and 5
/// at ACK timeout 16 (268 ms), and 1 at 18 (1.07 s): each time within
/// 0.85x to 1.3x (+ 250 ms) of that, windows that do not overlap.
/// Accepting, the retry count is the requester's (the agent's 1), not the
/// one given to `rdma_accept` (7), as `rdma_accept(3)` says.
pub(super) fn retry_count_and_ack_timeout_take_effect(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let check = |what: &str, took: Duration, retry: u8, timeout: u8| -> Result<String> {
        let want = retry_exhaustion(retry, timeout);
        let (lo, hi) = (
            want.mul_f64(0.85),
            want.mul_f64(1.3) + Duration::from_millis(250),
        );
        ensure!(
            (lo..=hi).contains(&took),
            "{what}: retry_count {retry}, ACK timeout {timeout}: the SEND failed after {took:?}, expected {want:?} ({lo:?} to {hi:?})"
        );
        Ok(format!(
            "{what} {retry}/{timeout}: {} ms (expected {})",
            took.as_millis(),
            want.as_millis()
        ))
    };
    let mut seen = Vec::new();
    for (retry, timeout) in [(1u8, 16u8), (5, 16), (1, 18)] {
        let addr = SocketAddr::new(ctx.peer4, ctx.port());
        let mut call = Call::start(
            &ctx.agent,
            &format!("serve addr={addr} count=1 accept=00 vanish=1"),
        )?;
        call.ready()?;
        let id = resolve_with_option(
            &dev,
            addr,
            rdma_cm_rs_option_RDMA_CM_RS_OPT_ACK_TIMEOUT,
            timeout.into(),
        )?;
        let mut p = Param::with_data(b"retry");
        p.retry_count = retry;
        dev.connect(id, &p)?;
        wait(&dev, EventType::Established)?;
        let took = time_to_retry_exhaustion(&dev, id)?;
        dev.destroy(id)?;
        let r = call.result()?;
        ensure!(field(&r, "disc0")? == "DISCONNECTED", "the peer: {r:?}");
        seen.push(check("connect", took, retry, timeout)?);
    }
    // Accepting: the agent connects with retry_count 1.
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let listener = listen(&dev, addr, 4, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={addr} data=01 retry=1 vanish=1"),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    ensure!(
        req.retry_count == 1,
        "the request's retry_count {}",
        req.retry_count
    );
    dev.set_option(req.new_id, rdma_cm_rs_option_RDMA_CM_RS_OPT_ACK_TIMEOUT, 16)?;
    let mut p = Param::with_data(b"ignored");
    p.retry_count = 7;
    dev.accept(req.new_id, Some(&p))?;
    wait(&dev, EventType::Established)?;
    let took = time_to_retry_exhaustion(&dev, req.new_id)?;
    dev.destroy(req.new_id)?;
    let r = call.result()?;
    ensure!(field(&r, "disc")? == "DISCONNECTED", "the peer: {r:?}");
    dev.destroy(listener)?;
    seen.push(check(
        "accept (given 7, the requester's 1 applies)",
        took,
        1,
        16,
    )?);
    note(&seen.join("; "));
    Ok(())
}

/// `flow_control` (`rdma_connect(3)`, `rdma_accept(3)`: "exchanged with
/// the remote peer and not used to configure the QP") reaches the peer
/// both ways, each value: the module's connect in librdmacm's
/// CONNECT_REQUEST and librdmacm's accept in the module's ESTABLISHED;
/// librdmacm's connect in the module's CONNECT_REQUEST and the module's
/// accept in librdmacm's ESTABLISHED.  Only the IB CM carries it (the
/// REQ's and REP's end-to-end flow control bit); MPA has no such field:
/// on iWARP every event reports 0.
pub(super) fn flow_control_exchanged_both_ways(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let mut seen = Vec::new();
    let iwarp = ctx.iwarp();
    let carried = move |v: u8| if iwarp { 0 } else { v };
    for (ours, theirs) in [(0u8, 1u8), (1, 0)] {
        // The module connects with `ours`, librdmacm accepts with `theirs`.
        let addr = SocketAddr::new(ctx.peer4, ctx.port());
        let mut call = Call::start(
            &ctx.agent,
            &format!("serve addr={addr} count=1 accept=00 fc={theirs} disc=self"),
        )?;
        call.ready()?;
        let id = resolve(&dev, addr)?;
        let mut p = Param::with_data(b"fc");
        p.flow_control = ours;
        dev.connect(id, &p)?;
        let est = wait(&dev, EventType::Established)?;
        wait(&dev, EventType::Disconnected)?;
        dev.destroy(id)?;
        let r = call.result()?;
        ensure!(
            field(&r, "fc0")? == carried(ours).to_string() && est.flow_control == carried(theirs),
            "connect with {ours}: librdmacm's request said {}; its accept with {theirs}: the module's ESTABLISHED said {}",
            field(&r, "fc0")?,
            est.flow_control
        );
        // librdmacm connects with `ours`, the module accepts with `theirs`.
        let addr = SocketAddr::new(ctx.local4, ctx.port());
        let l = listen(&dev, addr, 4, 0)?;
        let call = Call::start(
            &ctx.agent,
            &format!("connect addr={addr} data=01 fc={ours} disc=self"),
        )?;
        let req = wait(&dev, EventType::ConnectRequest)?;
        let mut p = Param::with_data(b"fc");
        p.flow_control = theirs;
        dev.accept(req.new_id, Some(&p))?;
        wait(&dev, EventType::Established)?;
        wait(&dev, EventType::Disconnected)?;
        dev.disconnect(req.new_id)?;
        let r = call.result()?;
        dev.destroy(req.new_id)?;
        dev.destroy(l)?;
        ensure!(
            req.flow_control == carried(ours) && field(&r, "fc")? == carried(theirs).to_string(),
            "librdmacm's connect with {ours}: the module's request said {}; the module's accept with {theirs}: librdmacm's ESTABLISHED said {}",
            req.flow_control,
            field(&r, "fc")?
        );
        seen.push(format!("{ours}/{theirs}"));
    }
    note(&format!(
        "flow_control exchanged both ways: {}",
        seen.join(", ")
    ));
    Ok(())
}
