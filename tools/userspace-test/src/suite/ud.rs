// SPDX-License-Identifier: GPL-2.0
//! The UD scenarios: datagrams over RDMA_PS_UDP between the module and
//! librdmacm (the agent's `udserve` and `udconnect`, see `agent/ud.rs`),
//! and against rdma-core's `udaddy` (the agent's `run`).  SIDR both ways,
//! the private data limits of the SIDR request (180) and reply (136),
//! datagrams of every size with and without immediate data, several
//! senders on one id, refused requests, and destruction with datagrams on
//! their way.

use super::interop::{start_tool_past_startup, FIRST_REQUEST_WAIT_MS};
use super::{errno_of, expect_errno, field, no_event, note, resolve_ps, wait, Ctx, T};
use crate::agent::{
    ud::{payload, with_imm},
    Call,
};
use crate::payload::{fnv64, hex, pattern, unhex, verify};
use crate::uapi::*;
use crate::udaddy;
use anyhow::{bail, ensure, Context, Result};
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// The Q_Key of RDMA_PS_UDP ids, on both sides; RDMA_PS_IB UD ids have
/// it too (`cma_set_default_qkey` gives both port spaces RDMA_UDP_QKEY,
/// and the ABI has no other to accept with).
const UDP_QKEY: u32 = udaddy::UDP_QKEY;
/// Path MTUs InfiniBand (and RoCE) define: QUERY's max_datagram is one.
const IB_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];
/// What a UD_RECV buffer holds at most.
const BUF: usize = RDMA_CM_RS_MAX_MESSAGE as usize;

fn ud_listen(dev: &Device, addr: SocketAddr, context: u64) -> Result<u32> {
    ud_listen_ps(dev, addr, context, RDMA_CM_RS_PS_UDP)
}

/// A UD listener of port space `ps` on `addr`.
fn ud_listen_ps(dev: &Device, addr: SocketAddr, context: u64, ps: u32) -> Result<u32> {
    let id = dev.create_id_ps(context, ps, RDMA_CM_RS_QPT_UD)?;
    dev.bind(id, &addr).context("bind")?;
    dev.listen(id, 8).context("listen")?;
    Ok(id)
}

fn ud_resolve(dev: &Device, dst: SocketAddr) -> Result<u32> {
    resolve_ps(dev, dst, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)
}

/// QUERY of a UD id with its QP: the QP number, the UDP Q_Key and a path
/// MTU as max_datagram.
fn query_ud(dev: &Device, id: u32) -> Result<rdma_cm_rs_query> {
    let q = dev.query(id)?;
    ensure!(
        q.qp_num != 0 && q.qkey == UDP_QKEY && IB_MTUS.contains(&q.max_datagram),
        "module: QUERY of UD id {id}: qp_num={:#x} qkey={:#x} max_datagram={}",
        q.qp_num,
        q.qkey,
        q.max_datagram
    );
    Ok(q)
}

/// The module's ESTABLISHED of a SIDR reply on `id`: the remote QP with
/// the UDP Q_Key, and a peer handle in 1..=64.
fn expect_sidr_reply(dev: &Device, id: u32) -> Result<Event> {
    let est = wait(dev, EventType::Established)?;
    ensure!(
        est.id == id
            && est.ud_qp_num != 0
            && est.ud_qkey == UDP_QKEY
            && (1..=RDMA_CM_RS_MAX_UD_PEERS).contains(&est.ud_peer),
        "module: SIDR reply {}",
        est.line("module")
    );
    Ok(est)
}

/// What UD_RECV gave once a datagram was queued.
enum Queued {
    Datagram(Datagram),
    Errno(i32),
}

/// UD_RECV into `capacity` bytes, with timeout 0 (so that the buffer can
/// be refused as too small), tried until a datagram is queued or `T` ran
/// out.
fn first_queued(dev: &Device, id: u32, capacity: usize) -> Queued {
    let deadline = Instant::now() + Duration::from_millis(T.into());
    loop {
        match dev.ud_recv(id, capacity, 0) {
            Ok(d) => return Queued::Datagram(d),
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Queued::Errno(e.raw_os_error().unwrap_or(0)),
        }
    }
}

/// The module's datagram `what` must be `want`, with immediate data `imm`,
/// from `peer` (any non-zero handle if 0) and QP `src_qp` (any if 0), at
/// `src` (port 0).
#[allow(clippy::too_many_arguments)]
fn check_datagram(
    what: &str,
    d: &Datagram,
    want: &[u8],
    imm: Option<u32>,
    peer: u32,
    src_qp: u32,
    src: SocketAddr,
) -> Result<()> {
    verify(what, want, &d.data)?;
    ensure!(
        d.imm == imm,
        "{what}: immediate data {:?}, sent {imm:?}",
        d.imm
    );
    ensure!(
        d.peer != 0 && (peer == 0 || d.peer == peer),
        "{what}: peer handle {}, expected {peer}",
        d.peer
    );
    ensure!(
        src_qp == 0 || d.src_qp == src_qp,
        "{what}: source QP {:#x}, expected {src_qp:#x}",
        d.src_qp
    );
    let src = SocketAddr::new(src.ip(), 0);
    ensure!(
        d.src == Some(src),
        "{what}: source address {:?}, expected {src}",
        d.src
    );
    Ok(())
}

fn num(r: &BTreeMap<String, String>, k: &str) -> Result<u32> {
    field(r, k)?
        .parse()
        .with_context(|| format!("peer result {k}"))
}

/// How the agent reports immediate data.
fn imm_word(imm: Option<u32>) -> String {
    imm.map_or("-".into(), |v| format!("{v:08x}"))
}

/// The agent's words for a UD id of port space `ps`.
fn agent_ps(ps: u32) -> &'static str {
    if ps == RDMA_CM_RS_PS_IB {
        " ps=ib"
    } else {
        ""
    }
}

/// QUERY says `id` is of port space `ps`.
fn port_space_is(dev: &Device, id: u32, ps: u32) -> Result<()> {
    let q = dev.query(id)?;
    ensure!(
        q.port_space == ps,
        "module: UD id {id} of port space {:#x}, expected {ps:#x}",
        q.port_space
    );
    Ok(())
}

/// The module's UD id connects to a librdmacm UD server: the 181-byte
/// SIDR request is refused before anything is sent, the 180-byte one gets
/// there whole; the reply names the server's QP, the UDP Q_Key, a peer
/// handle and carries the 136 accepted bytes.  Datagrams of 1 byte to
/// max_datagram, with and without immediate data, go to the server, which
/// reports each and sends it back; the echo comes from the same QP and peer
/// handle.
pub(super) fn module_client_librdmacm_server(ctx: &mut Ctx) -> Result<()> {
    module_client_librdmacm_server_in(ctx, RDMA_CM_RS_PS_UDP)
}

/// [`module_client_librdmacm_server`] with RDMA_PS_IB UD ids on both
/// sides (librdmacm's made by `rdma_create_ep`, see `cm/ud.rs`): the same
/// SIDR exchange and limits (the CM's header is there for IP addresses in
/// every port space), the QUERY of the module's id says RDMA_PS_IB, and
/// the Q_Key both sides have and the SIDR reply names is the CM's
/// RDMA_UDP_QKEY.
pub(super) fn ps_ib_module_client_librdmacm_server(ctx: &mut Ctx) -> Result<()> {
    module_client_librdmacm_server_in(ctx, RDMA_CM_RS_PS_IB)
}

fn module_client_librdmacm_server_in(ctx: &mut Ctx, ps: u32) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let (req_data, acc_data) = (pattern(180, 0x21), pattern(136, 0x22));
    const DATAGRAMS: usize = 6;
    let mut call = Call::start(
        &ctx.agent,
        &format!(
            "udserve addr={addr} count=1 accept={} echo={DATAGRAMS}{}",
            hex(&acc_data),
            agent_ps(ps)
        ),
    )?;
    call.ready()?;
    let id = resolve_ps(&dev, addr, ps, RDMA_CM_RS_QPT_UD)?;
    port_space_is(&dev, id, ps)?;
    expect_errno(
        "UD connect with 181 bytes",
        dev.connect(id, &Param::with_data(&pattern(181, 0x20))),
        libc::EINVAL,
    )?;
    dev.connect(id, &Param::with_data(&req_data))
        .context("UD connect with 180 bytes")?;
    let est = expect_sidr_reply(&dev, id)?;
    verify(
        "module: SIDR reply private data",
        &acc_data,
        &est.private_data,
    )?;
    let q = query_ud(&dev, id)?;
    let max = q.max_datagram as usize;
    let sizes = [1, 2, 64, max / 2, max - 1, max];
    let mut sent = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let msg = pattern(n, 0x30 + i as u8);
        // Bytes that differ, to catch a swapped byte order.
        let imm = (i % 2 == 1).then_some(0xa1b2_c300 + i as u32);
        dev.ud_send(id, est.ud_peer, &msg, imm)
            .with_context(|| format!("UD_SEND of {n} bytes"))?;
        let d = dev
            .ud_recv(id, BUF, T)
            .with_context(|| format!("UD_RECV of the {n}-byte echo"))?;
        check_datagram(
            &format!("module: {n}-byte echo"),
            &d,
            &msg,
            imm,
            est.ud_peer,
            est.ud_qp_num,
            addr,
        )?;
        sent.push((msg, imm));
    }
    no_event(&dev, 200, "module: UD id after the exchange")?;
    dev.destroy(id)?;
    let r = call.result()?;
    // One request reached the server: the 180 bytes, whole.
    verify(
        "librdmacm: SIDR request private data",
        &req_data,
        &unhex(field(&r, "req0")?)?,
    )?;
    ensure!(
        num(&r, "qp0")? == est.ud_qp_num && field(&r, "qkey0")? == format!("{UDP_QKEY:08x}"),
        "librdmacm's QP and Q_Key {r:?}, the module's SIDR reply said {:#x}",
        est.ud_qp_num
    );
    for (i, (msg, imm)) in sent.iter().enumerate() {
        let got = (
            num(&r, &format!("len0_{i}"))? as usize,
            field(&r, &format!("imm0_{i}"))?,
            num(&r, &format!("src0_{i}"))?,
            field(&r, &format!("hash0_{i}"))?,
        );
        let want = (
            msg.len(),
            imm_word(*imm),
            q.qp_num,
            format!("{:016x}", fnv64(msg)),
        );
        ensure!(
            got == (want.0, want.1.as_str(), want.2, want.3.as_str()),
            "librdmacm: datagram {i} (length, immediate data, source QP, hash) {got:?}, sent {want:?}"
        );
    }
    Ok(())
}

/// librdmacm's UD id sends a 180-byte SIDR request to the module's UD
/// listener, which sees it whole; ACCEPT with 137 bytes is refused, with
/// 136 the reply carries them whole (and no event follows on the passive
/// side).  librdmacm's datagrams arrive with their immediate data (its QP
/// number) or without, from one peer handle, and the module's replies
/// through that handle arrive whole.
pub(super) fn librdmacm_client_module_listener(ctx: &mut Ctx) -> Result<()> {
    librdmacm_client_module_listener_in(ctx, RDMA_CM_RS_PS_UDP)
}

/// [`librdmacm_client_module_listener`] with RDMA_PS_IB UD ids on both
/// sides; first a RDMA_PS_UDP request to the same port does not reach the
/// RDMA_PS_IB listener (the port spaces' service IDs differ): the CM
/// answers it UNREACHABLE with status 1 (IB_SIDR_UNSUPPORTED: no listener
/// for the service ID, `cm_sidr_req_handler`) and the module sees nothing.
pub(super) fn ps_ib_librdmacm_client_module_listener(ctx: &mut Ctx) -> Result<()> {
    librdmacm_client_module_listener_in(ctx, RDMA_CM_RS_PS_IB)
}

fn librdmacm_client_module_listener_in(ctx: &mut Ctx, ps: u32) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = ud_listen_ps(&dev, addr, 21, ps)?;
    port_space_is(&dev, l, ps)?;
    if ps == RDMA_CM_RS_PS_IB {
        let r = Call::start(
            &ctx.agent,
            &format!("udconnect addr={addr} data={}", hex(b"udp space")),
        )?
        .result()?;
        ensure!(
            (field(&r, "event")?, field(&r, "status")?) == ("UNREACHABLE", "1"),
            "librdmacm's RDMA_PS_UDP request to a RDMA_PS_IB listener's port: {r:?}"
        );
        no_event(
            &dev,
            200,
            "module: RDMA_PS_IB listener after a RDMA_PS_UDP request",
        )?;
    }
    let (req_data, acc_data) = (pattern(180, 0x41), pattern(136, 0x42));
    // Within the smallest path MTU.
    let sizes = [1usize, 100, 256];
    const MSGS: usize = 4;
    let call = Call::start(
        &ctx.agent,
        &format!(
            "udconnect addr={addr} data={} msgs={MSGS} sizes=1,100,256{}",
            hex(&req_data),
            agent_ps(ps)
        ),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    ensure!(
        req.id == l && req.context == 21 && req.new_id != 0,
        "request: {}",
        req.line("module")
    );
    verify(
        "module: SIDR request private data",
        &req_data,
        &req.private_data,
    )?;
    let id = req.new_id;
    port_space_is(&dev, id, ps)?;
    expect_errno(
        "UD accept with 137 bytes",
        dev.accept(id, Some(&Param::with_data(&pattern(137, 0x43)))),
        libc::EINVAL,
    )?;
    dev.accept(id, Some(&Param::with_data(&acc_data)))
        .context("UD accept with 136 bytes")?;
    let q = query_ud(&dev, id)?;
    let mut peer = 0;
    let mut src_qp = 0;
    for m in 0..MSGS {
        let d = dev
            .ud_recv(id, BUF, T)
            .with_context(|| format!("UD_RECV {m}"))?;
        if m == 0 {
            (peer, src_qp) = (d.peer, d.src_qp);
        }
        let imm = with_imm(m).then_some(src_qp);
        check_datagram(
            &format!("module: datagram {m}"),
            &d,
            &payload(0, m, sizes[m % sizes.len()]),
            imm,
            peer,
            src_qp,
            SocketAddr::new(ctx.peer4, 0),
        )?;
    }
    no_event(&dev, 300, "module: passive UD side")?;
    let mut replies = Vec::new();
    for m in 0..MSGS {
        let reply = pattern(sizes[m % sizes.len()], 0x50 + m as u8);
        let imm = (m % 2 == 1).then_some(0x1020_3040 + m as u32);
        dev.ud_send(id, peer, &reply, imm)
            .with_context(|| format!("UD_SEND reply {m}"))?;
        replies.push((reply, imm));
    }
    let r = call.result()?;
    ensure!(field(&r, "event")? == "ESTABLISHED", "librdmacm: {r:?}");
    verify(
        "librdmacm: SIDR reply private data",
        &acc_data,
        &unhex(field(&r, "pdata")?)?,
    )?;
    ensure!(
        num(&r, "rqp")? == q.qp_num
            && field(&r, "rqkey")? == format!("{UDP_QKEY:08x}")
            && num(&r, "qp0")? == src_qp,
        "librdmacm: {r:?}; the module's QP {:#x}, the datagrams' source QP {src_qp:#x}",
        q.qp_num
    );
    for (m, (reply, imm)) in replies.iter().enumerate() {
        verify(
            &format!("librdmacm: reply {m}"),
            reply,
            &unhex(field(&r, &format!("r0_{m}"))?)?,
        )?;
        ensure!(
            field(&r, &format!("ri0_{m}"))? == imm_word(*imm)
                && num(&r, &format!("rs0_{m}"))? == q.qp_num,
            "librdmacm: reply {m}: {r:?}"
        );
    }
    dev.destroy(id)?;
    dev.destroy(l)?;
    Ok(())
}

/// Three librdmacm UD QPs (one SIDR request, the others use its answer)
/// send to one accepted module id: UD_RECV gives each sender its own peer
/// handle (distinct handles, distinct source QPs, the same handle for
/// every datagram of a QP), and a reply through each handle reaches that
/// QP and no other.  The accept uses the request's parameters (no
/// private data).
pub(super) fn several_peers_on_one_id(ctx: &mut Ctx) -> Result<()> {
    const QPS: usize = 3;
    const MSGS: usize = 3;
    let sizes = [64usize, 200, 1];
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = ud_listen(&dev, addr, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!(
            "udconnect addr={addr} data={} qps={QPS} msgs={MSGS} sizes=64,200,1",
            hex(b"peers")
        ),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    ensure!(req.id == l, "request on id {}", req.id);
    let id = req.new_id;
    dev.accept(id, None)
        .context("UD accept with the request's parameters")?;
    let q = query_ud(&dev, id)?;
    // The agent sends QP by QP, each datagram after the last completed.
    let mut senders: Vec<(u32, u32)> = Vec::new();
    for k in 0..QPS * MSGS {
        let (qp, m) = (k / MSGS, k % MSGS);
        let d = dev
            .ud_recv(id, BUF, T)
            .with_context(|| format!("UD_RECV {k}"))?;
        let imm = with_imm(m).then_some(d.src_qp);
        check_datagram(
            &format!("module: datagram {m} of QP {qp}"),
            &d,
            &payload(qp, m, sizes[m]),
            imm,
            0,
            0,
            SocketAddr::new(ctx.peer4, 0),
        )?;
        if m == 0 {
            ensure!(
                senders.iter().all(|&(p, s)| p != d.peer && s != d.src_qp),
                "module: QP {qp}'s first datagram: peer {} from QP {:#x}, earlier senders {senders:?}",
                d.peer,
                d.src_qp
            );
            senders.push((d.peer, d.src_qp));
        }
        ensure!(
            (d.peer, d.src_qp) == senders[qp],
            "module: datagram {m} of QP {qp}: peer {} from QP {:#x}, its first {:?}",
            d.peer,
            d.src_qp,
            senders[qp]
        );
    }
    for (qp, &(peer, src_qp)) in senders.iter().enumerate() {
        for m in 0..MSGS {
            let reply = format!("reply {m} to QP {src_qp:#x} ({qp})");
            dev.ud_send(id, peer, reply.as_bytes(), None)
                .with_context(|| format!("UD_SEND to peer {peer}"))?;
        }
    }
    let r = call.result()?;
    ensure!(field(&r, "event")? == "ESTABLISHED", "librdmacm: {r:?}");
    for (qp, &(_, src_qp)) in senders.iter().enumerate() {
        ensure!(
            num(&r, &format!("qp{qp}"))? == src_qp,
            "librdmacm: QP {qp} is {}, the module saw {src_qp:#x}",
            field(&r, &format!("qp{qp}"))?
        );
        for m in 0..MSGS {
            let want = format!("reply {m} to QP {src_qp:#x} ({qp})");
            verify(
                &format!("librdmacm: QP {qp}'s reply {m}"),
                want.as_bytes(),
                &unhex(field(&r, &format!("r{qp}_{m}"))?)?,
            )?;
            ensure!(
                num(&r, &format!("rs{qp}_{m}"))? == q.qp_num,
                "librdmacm: QP {qp}'s reply {m} from {}",
                field(&r, &format!("rs{qp}_{m}"))?
            );
        }
    }
    dev.destroy(id)?;
    dev.destroy(l)?;
    Ok(())
}

/// The datagram path's refusals: UD_RECV before CONNECT (ENOTCONN), a
/// datagram of max_datagram + 1 bytes (EMSGSIZE) or of none (EINVAL),
/// unknown peer handles (INFO's max_ud_peers is 64) and unknown flags
/// (EINVAL), an empty queue
/// (EAGAIN, ETIMEDOUT), a buffer too small (EMSGSIZE, the datagram kept
/// for the next UD_RECV); none of the refused datagrams reaches the peer.
pub(super) fn limits_and_bad_requests(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(
        &ctx.agent,
        &format!("udserve addr={addr} count=1 accept=- echo=2"),
    )?;
    call.ready()?;
    let id = ud_resolve(&dev, addr)?;
    expect_errno(
        "UD_RECV before CONNECT",
        dev.ud_recv(id, BUF, 0),
        libc::ENOTCONN,
    )?;
    dev.connect(id, &Param::with_data(b"limits"))?;
    let est = expect_sidr_reply(&dev, id)?;
    let max = query_ud(&dev, id)?.max_datagram as usize;
    expect_errno(
        "UD_SEND of max_datagram + 1 bytes",
        dev.ud_send(id, est.ud_peer, &vec![1; max + 1], None),
        libc::EMSGSIZE,
    )?;
    expect_errno(
        "UD_SEND of 0 bytes",
        dev.ud_send(id, est.ud_peer, &[], None),
        libc::EINVAL,
    )?;
    let peers = dev.info()?.max_ud_peers;
    ensure!(
        peers == RDMA_CM_RS_MAX_UD_PEERS,
        "INFO: max_ud_peers {peers}"
    );
    for peer in [0, est.ud_peer + 1, peers + 1] {
        expect_errno(
            &format!("UD_SEND to peer handle {peer}"),
            dev.ud_send(id, peer, b"x", None),
            libc::EINVAL,
        )?;
    }
    let data = [7u8; 8];
    let mut bad_flags = rdma_cm_rs_ud_send {
        id,
        peer: est.ud_peer,
        buf: data.as_ptr() as u64,
        len: data.len() as u32,
        flags: RDMA_CM_RS_UD_WITH_IMM << 1,
        imm_data: 0,
        timeout_ms: 5000,
    };
    expect_errno(
        "UD_SEND with an unknown flag",
        dev.raw_ioctl(IOC_UD_SEND, &mut bad_flags as *mut _ as usize),
        libc::EINVAL,
    )?;
    expect_errno("UD_RECV of nothing", dev.ud_recv(id, BUF, 0), libc::EAGAIN)?;
    expect_errno(
        "UD_RECV of nothing within 100 ms",
        dev.ud_recv(id, BUF, 100),
        libc::ETIMEDOUT,
    )?;
    // The server echoes: a buffer one byte short is refused until a
    // big enough one takes the datagram.
    let msg = pattern(100, 0x61);
    dev.ud_send(id, est.ud_peer, &msg, Some(0x0102_0304))?;
    match first_queued(&dev, id, msg.len() - 1) {
        Queued::Errno(libc::EMSGSIZE) => {}
        Queued::Errno(e) => bail!("UD_RECV into 99 bytes: errno {e}"),
        Queued::Datagram(d) => bail!("UD_RECV into 99 bytes returned {} bytes", d.data.len()),
    }
    expect_errno("UD_RECV into 1 byte", dev.ud_recv(id, 1, 0), libc::EMSGSIZE)?;
    let d = dev
        .ud_recv(id, msg.len(), 0)
        .context("UD_RECV into 100 bytes")?;
    check_datagram(
        "module: echo kept after EMSGSIZE",
        &d,
        &msg,
        Some(0x0102_0304),
        est.ud_peer,
        est.ud_qp_num,
        addr,
    )?;
    let big = pattern(max, 0x62);
    dev.ud_send(id, est.ud_peer, &big, None)?;
    let d = dev.ud_recv(id, max, T)?;
    check_datagram(
        "module: max_datagram echo",
        &d,
        &big,
        None,
        est.ud_peer,
        est.ud_qp_num,
        addr,
    )?;
    dev.destroy(id)?;
    let r = call.result()?;
    ensure!(
        (num(&r, "len0_0")?, num(&r, "len0_1")?) == (100, max as u32),
        "librdmacm received {r:?}: the refused datagrams must not be among them"
    );
    Ok(())
}

/// REJECT of a SIDR request: 137 bytes refused, 136 reach librdmacm whole
/// (its UD id sees UNREACHABLE, the CM's answer to a SIDR reject, or
/// REJECTED); then librdmacm rejects the module's request with 136 bytes,
/// which the module's event carries whole, and the failed id cannot send.
pub(super) fn reject_both_ways(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = ud_listen(&dev, addr, 0)?;
    let rej_data = pattern(136, 0x71);
    let call = Call::start(
        &ctx.agent,
        &format!("udconnect addr={addr} data={}", hex(b"reject me")),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    expect_errno(
        "UD reject with 137 bytes",
        dev.reject(req.new_id, 0, &pattern(137, 0x70)),
        libc::EINVAL,
    )?;
    dev.reject(req.new_id, 0, &rej_data)
        .context("UD reject with 136 bytes")?;
    let r = call.result()?;
    ensure!(
        ["UNREACHABLE", "REJECTED"].contains(&field(&r, "event")?),
        "librdmacm after the module's reject: {r:?}"
    );
    verify(
        "librdmacm: SIDR reject private data",
        &rej_data,
        &unhex(field(&r, "pdata")?)?,
    )?;
    no_event(&dev, 200, "module: after REJECT")?;
    dev.destroy(l)?;

    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let peer_rej = pattern(136, 0x72);
    let mut call = Call::start(
        &ctx.agent,
        &format!(
            "udserve addr={addr} count=1 reject=1 rejdata={}",
            hex(&peer_rej)
        ),
    )?;
    call.ready()?;
    let id = ud_resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(b"reject me too"))?;
    let ev = dev.get_event(T).context("module: SIDR answer")?;
    ensure!(
        ev.id == id && [EventType::Unreachable, EventType::Rejected].contains(&ev.event),
        "module: {} after librdmacm's reject",
        ev.line("module")
    );
    verify(
        "module: SIDR reject private data",
        &peer_rej,
        &ev.private_data,
    )?;
    expect_errno(
        "UD_SEND after the reject",
        dev.ud_send(id, 1, b"x", None),
        libc::ENOTCONN,
    )?;
    dev.destroy(id)?;
    let r = call.result()?;
    crate::payload::verify_padded(
        "librdmacm: SIDR request private data",
        b"reject me too",
        &unhex(field(&r, "req0")?)?,
        180,
    )?;
    Ok(())
}

/// DESTROY_ID of an accepted UD id holding datagrams librdmacm sent it
/// (unread) while another thread of the module's side keeps sending on it:
/// DESTROY_ID
/// returns, the sending thread's UD_SEND fails within the bound instead of
/// hanging, nothing names the id afterwards, librdmacm's sends complete,
/// and the port can be listened on again.
pub(super) fn destroy_with_datagrams_in_flight(ctx: &mut Ctx) -> Result<()> {
    const BOUND: Duration = Duration::from_secs(10);
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = ud_listen(&dev, addr, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!(
            "udconnect addr={addr} data={} msgs=150 sizes=200 replies=0",
            hex(b"flood")
        ),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    let id = req.new_id;
    dev.accept(id, None)?;
    let first = dev.ud_recv(id, BUF, T).context("first datagram")?;
    // The peer's flood ends before the id goes, and the module leaves what
    // arrived unread: rxe frees the packets still queued for a QP it moves
    // to the error state with interrupts off (`drain_req_pkts` under
    // `state_lock`), and page-pool packets (virtio-net, two VMs) then WARN
    // in `page_pool_put_unrefed_netmem` (seen across two VMs: a panic
    // under panic_on_warn).  The module's own datagrams are in flight.
    let r = call.result().context("librdmacm's 150 sends")?;
    ensure!(field(&r, "event")? == "ESTABLISHED", "librdmacm: {r:?}");
    std::thread::sleep(Duration::from_millis(300));
    let (sends, outcome) = std::thread::scope(|s| -> Result<_> {
        let sender = s.spawn(|| {
            let mut sent = 0u32;
            loop {
                match dev.ud_send(id, first.peer, &[0x33; 200], Some(sent)) {
                    Ok(()) => sent += 1,
                    Err(e) => return (sent, e, Instant::now()),
                }
            }
        });
        // The module's datagrams in flight when the id goes.
        std::thread::sleep(Duration::from_millis(30));
        let destroying = Instant::now();
        dev.destroy(id)
            .context("DESTROY_ID with datagrams in flight")?;
        let deadline = Instant::now() + BOUND;
        while !sender.is_finished() {
            ensure!(
                Instant::now() < deadline,
                "UD_SEND still running {BOUND:?} after DESTROY_ID"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let (sent, err, at) = sender.join().expect("sender thread");
        Ok((sent, (err, at.saturating_duration_since(destroying))))
    })?;
    let (err, after) = outcome;
    ensure!(
        err.raw_os_error() != Some(libc::ETIMEDOUT),
        "UD_SEND timed out around DESTROY_ID ({sends} sent): {err}"
    );
    ensure!(
        errno_of(dev.ud_recv(id, BUF, 0)).is_some_and(|e| e != libc::EAGAIN),
        "UD_RECV on the destroyed id"
    );
    no_event(&dev, 300, "module: after DESTROY_ID")?;
    dev.destroy(l)?;
    let again = ud_listen(&dev, addr, 0).context("listening again")?;
    dev.destroy(again)?;
    note(&format!(
        "module sent {sends} datagrams before DESTROY_ID; the last UD_SEND failed {after:?} after DESTROY_ID began: {err}"
    ));
    Ok(())
}

/// Runs `body` with a log of the module's side, which a failure carries.
fn logged<R>(body: impl FnOnce(&mut dyn FnMut(&str)) -> Result<R>) -> Result<R> {
    let mut lines = Vec::new();
    let r = body(&mut |l| lines.push(l.to_string()));
    r.map_err(|e| e.context(format!("the module's side:\n{}", lines.join("\n"))))
}

/// udaddy's bound here: each run takes seconds, and a udaddy stuck
/// waiting for the module should fail the scenario soon.
const UDADDY_TIMEOUT_S: u32 = 60;

/// The lines udaddy prints when every datagram went through (then it
/// exits with status 0).
const UDADDY_DONE: &[&str] = &["data transfers complete", "return status 0"];

/// The module as udaddy's UD server: `udaddy -s <module> -c 2` connects
/// twice to port 7174; the module accepts both SIDR requests, receives
/// udaddy's 10 datagrams of 100 bytes on each (immediate data: the sending
/// QP), and replies 10 to each through the peer handle UD_RECV reported;
/// udaddy exits 0.
pub(super) fn udaddy_module_server(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, udaddy::PORT);
    let mut lines = Vec::new();
    let l = udaddy::listen(&dev, addr, 2, &mut |l| lines.push(l.to_string()))?;
    // The module listens before udaddy starts: its client gives up on a
    // SIDR request nobody answers.
    let tool = start_tool_past_startup(
        ctx,
        "udaddy",
        &format!("-s {} -c 2", ctx.local4),
        UDADDY_TIMEOUT_S,
    )?;
    let (tool, clients) = tool.alongside(|| {
        logged(|log| {
            lines.iter().for_each(|l| log(l));
            udaddy::module_server(
                &dev,
                l,
                2,
                udaddy::COUNT,
                udaddy::SIZE,
                FIRST_REQUEST_WAIT_MS,
                log,
            )
        })
    })?;
    ensure!(
        clients.len() == 2 && clients[0] != clients[1],
        "udaddy's QPs {clients:?}"
    );
    tool.result()?.succeeded_with(UDADDY_DONE)
}

/// The module as udaddy's UD client against `udaddy -b <peer>`: SIDR to
/// port 7174, 10 datagrams of 100 bytes with the module's QP number as
/// immediate data, 10 replies from udaddy's QP through the SIDR peer
/// handle, each holding the GRH and the start of the module's datagram;
/// udaddy exits 0.
pub(super) fn udaddy_module_client(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    // "starting server" comes right before its listen; the module's SIDR
    // requests are tried again while nobody answers.
    let tool = start_tool_past_startup(
        ctx,
        "udaddy",
        &format!("-b {}", ctx.peer4),
        UDADDY_TIMEOUT_S,
    )?;
    let (tool, _) = tool.alongside(|| {
        logged(|log| {
            udaddy::module_client(
                &dev,
                SocketAddr::new(ctx.peer4, udaddy::PORT),
                udaddy::COUNT,
                udaddy::SIZE,
                // About 10 s from its "starting server" to its listen.
                20,
                log,
            )
        })
    })?;
    tool.result()?.succeeded_with(UDADDY_DONE)
}
