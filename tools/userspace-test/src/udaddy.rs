// SPDX-License-Identifier: GPL-2.0
//! The module as either side of rdma-core's `udaddy` (librdmacm/examples/
//! udaddy.c, rdmacm-utils), for the suite and `ctl udaddy-server|client`.
//!
//! udaddy's exchange: the client resolves, posts `-C` receives of `-S` +
//! 40 bytes (the GRH), sends the SIDR request on port 7174 (udaddy has no
//! port option: its `-p` is the port space), makes an address handle from
//! the ESTABLISHED event and posts its `-C` datagrams of `-S` bytes at once
//! (unsignaled), each a SEND_WITH_IMM whose immediate data is its own QP
//! number; then it waits for `-C` receives.  The server accepts with its QP
//! number (Q_Key 0x01234567 from the port space), waits for all `-C`
//! datagrams, makes its reply address handle from the first completion and
//! takes the client's QP number from the immediate data, then sends `-C`
//! replies of `-S` bytes (SEND_WITH_IMM, its QP number), each the first
//! `-S` bytes of its receive buffer: the GRH of the last datagram received
//! and that datagram's start.  Both exit 0 when all went through.

use crate::payload::{pattern, verify};
use crate::report::EventType;
use crate::uapi::{Datagram, Device, Param, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD};
use anyhow::{bail, ensure, Context, Result};
use std::{net::SocketAddr, time::Duration};

/// udaddy's port (fixed in udaddy.c).
pub const PORT: u16 = 7174;
/// udaddy's defaults: `-C` messages of `-S` bytes.
pub const COUNT: u32 = 10;
pub const SIZE: u32 = 100;
/// The Q_Key the CM gives RDMA_PS_UDP ids (RDMA_UDP_QKEY).
pub const UDP_QKEY: u32 = 0x0123_4567;
/// The module keeps this many receives posted on a UD id, and udaddy's
/// client sends all its datagrams at once: more would be dropped.
pub const MAX_COUNT: u32 = crate::uapi::RDMA_CM_RS_RECV_DEPTH;

/// Seed of what the module sends.
const SEED: u8 = 0x5a;

/// Bounded waits after the first event.
const WAIT_MS: u32 = 15_000;

/// Waits (up to `ms`, or for ever) for the module's next event, which must
/// be `want`; hands it to `log`.
fn expect(
    dev: &Device,
    want: EventType,
    ms: u32,
    log: &mut dyn FnMut(&str),
) -> Result<crate::uapi::Event> {
    let e = dev
        .get_event(ms)
        .with_context(|| format!("module: waiting for {}", want.name()))?;
    log(&e.line("module"));
    ensure!(
        e.event == want,
        "module: expected {} but got {} (status {})",
        want.name(),
        e.name(),
        e.status
    );
    Ok(e)
}

/// Receives one datagram of `size` bytes on `id`.
fn recv_datagram(dev: &Device, id: u32, size: u32, what: &str) -> Result<Datagram> {
    let d = dev
        .ud_recv(id, crate::cm::ud::MAX_DATAGRAM, WAIT_MS)
        .with_context(|| format!("module: UD_RECV {what}"))?;
    ensure!(
        d.data.len() == size as usize,
        "module: {what} has {} bytes, udaddy sends {size}",
        d.data.len()
    );
    Ok(d)
}

/// The module's UD listener for udaddy's clients, on `addr` (udaddy's
/// port is [`PORT`]) with a backlog of `connections`: listening before
/// the client starts, which gives up at once on a SIDR request nobody
/// answers.  Returns the listener's id, for [`module_server`].
pub fn listen(
    dev: &Device,
    addr: SocketAddr,
    connections: u32,
    log: &mut dyn FnMut(&str),
) -> Result<u32> {
    let l = dev.create_id_ps(0, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
    dev.bind(l, &addr).context("bind")?;
    dev.listen(l, connections.max(1)).context("listen")?;
    log(&format!(
        "module: UD listener id={l} on {addr}, for {connections} udaddy client(s)"
    ));
    Ok(l)
}

/// The module as udaddy's server, for `udaddy -s ADDR [-c connections]
/// [-C count] [-S size]`, on `listener` (from [`listen`]): accepts
/// `connections` SIDR requests (no private data; udaddy's client sends
/// only once all are answered); then receives `count` datagrams of `size`
/// bytes on each accepted id (each with the sender's QP number as immediate
/// data, checked against the source QP UD_RECV reports, all from one peer
/// handle), and then sends each client `count` replies of `size` bytes
/// through that peer handle.  `first_wait_ms` bounds the wait for the first
/// request (people start the client by hand).  Destroys the listener and
/// the accepted ids; returns the clients' QP numbers.
pub fn module_server(
    dev: &Device,
    l: u32,
    connections: u32,
    count: u32,
    size: u32,
    first_wait_ms: u32,
    log: &mut dyn FnMut(&str),
) -> Result<Vec<u32>> {
    ensure!(
        count <= MAX_COUNT,
        "udaddy's client sends its {count} datagrams at once; the module keeps {MAX_COUNT} receives"
    );
    // (accepted id, its QP number)
    let mut accepted = Vec::new();
    for n in 0..connections {
        let ms = if n == 0 { first_wait_ms } else { WAIT_MS };
        let req = expect(dev, EventType::ConnectRequest, ms, log)?;
        ensure!(req.id == l && req.new_id != 0, "request: {req:?}");
        let id = req.new_id;
        // udaddy's client connects without private data and reads none.
        dev.accept(id, Some(&Param::with_data(&[])))
            .context("accept")?;
        let q = dev.query(id)?;
        log(&format!(
            "module: accept id={id} qp_num={:#x} qkey={:#x} max_datagram={}",
            q.qp_num, q.qkey, q.max_datagram
        ));
        ensure!(
            q.qkey == UDP_QKEY,
            "module: Q_Key {:#x}, udaddy's is {UDP_QKEY:#x}",
            q.qkey
        );
        accepted.push((id, q.qp_num));
    }
    // udaddy's server: every datagram first, then the replies.
    let mut senders = Vec::new();
    for &(id, _) in &accepted {
        let mut sender = (0, 0);
        for i in 0..count {
            let what = format!("datagram {i} on id {id}");
            let d = recv_datagram(dev, id, size, &what)?;
            ensure!(
                d.imm == Some(d.src_qp),
                "module: {what}: immediate data {:?}, udaddy sends its QP number {:#x}",
                d.imm,
                d.src_qp
            );
            ensure!(d.peer != 0, "module: {what} has no peer handle");
            if i == 0 {
                sender = (d.peer, d.src_qp);
            }
            ensure!(
                (d.peer, d.src_qp) == sender,
                "module: {what} from peer {} QP {:#x}, the first from peer {} QP {:#x}",
                d.peer,
                d.src_qp,
                sender.0,
                sender.1
            );
        }
        log(&format!(
            "module: id={id} received {count} datagrams of {size} bytes from QP {:#x} (peer {})",
            sender.1, sender.0
        ));
        senders.push(sender);
    }
    let reply = pattern(size as usize, SEED);
    for (&(id, qp_num), &(peer, _)) in accepted.iter().zip(&senders) {
        for i in 0..count {
            dev.ud_send(id, peer, &reply, Some(qp_num))
                .with_context(|| format!("module: UD_SEND reply {i} on id {id}"))?;
        }
        log(&format!(
            "module: id={id} sent {count} replies of {size} bytes to peer {peer}"
        ));
    }
    dev.destroy(l)?;
    for (id, _) in accepted {
        dev.destroy(id)?;
    }
    Ok(senders.into_iter().map(|(_, qp)| qp).collect())
}

/// The module as udaddy's client, for `udaddy -b ADDR [-C count] [-S
/// size]` (its server): resolves `addr`, sends the SIDR request (no private
/// data), checks the reply (Q_Key, peer handle), sends `count` datagrams of
/// `size` bytes with its own QP number as immediate data, and receives
/// `count` replies, which must come from the server's QP with its QP number
/// as immediate data, through the same peer handle, and hold the GRH and
/// the start of the module's datagram (what udaddy sends back).  Up to
/// `attempts` SIDR requests while the server is not listening yet.
/// Returns the server's QP number.
pub fn module_client(
    dev: &Device,
    addr: SocketAddr,
    count: u32,
    size: u32,
    attempts: u32,
    log: &mut dyn FnMut(&str),
) -> Result<u32> {
    ensure!(size >= 1, "udaddy's size must be at least 1");
    let mut attempt = 0;
    let (id, est) = loop {
        attempt += 1;
        let id = dev.create_id_ps(0, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
        dev.resolve_addr(id, &addr, 2000).context("resolve_addr")?;
        expect(dev, EventType::AddrResolved, WAIT_MS, log)?;
        dev.resolve_route(id, 2000).context("resolve_route")?;
        expect(dev, EventType::RouteResolved, WAIT_MS, log)?;
        dev.connect(id, &Param::with_data(&[]))
            .context("connect (SIDR)")?;
        let e = dev.get_event(WAIT_MS).context("module: SIDR reply")?;
        log(&e.line("module"));
        if e.event == EventType::Established {
            break (id, e);
        }
        dev.destroy(id)?;
        if attempt >= attempts {
            bail!(
                "module: SIDR request answered {} (status {}) {attempt} time(s)",
                e.name(),
                e.status
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    ensure!(est.id == id, "ESTABLISHED on id {}", est.id);
    ensure!(
        est.ud_qkey == UDP_QKEY && est.ud_qp_num != 0 && est.ud_peer != 0,
        "module: SIDR reply qp_num={:#x} qkey={:#x} peer={}",
        est.ud_qp_num,
        est.ud_qkey,
        est.ud_peer
    );
    let q = dev.query(id)?;
    ensure!(
        size <= q.max_datagram,
        "module: {size} bytes are over the path's {}",
        q.max_datagram
    );
    // The same bytes every time: udaddy replies with the start of the last
    // datagram it received.
    let msg = pattern(size as usize, SEED);
    for i in 0..count {
        dev.ud_send(id, est.ud_peer, &msg, Some(q.qp_num))
            .with_context(|| format!("module: UD_SEND {i}"))?;
    }
    log(&format!(
        "module: sent {count} datagrams of {size} bytes, immediate data {:#x} (own QP)",
        q.qp_num
    ));
    for i in 0..count {
        let d = recv_datagram(dev, id, size, &format!("reply {i}"))?;
        ensure!(
            (d.src_qp, d.peer, d.imm) == (est.ud_qp_num, est.ud_peer, Some(est.ud_qp_num)),
            "module: reply {i} from QP {:#x} peer {} imm {:?}; the server is QP {:#x} peer {}",
            d.src_qp,
            d.peer,
            d.imm,
            est.ud_qp_num,
            est.ud_peer
        );
        // udaddy sends its receive buffer: 40 bytes of GRH, then ours.
        let grh = crate::cm::ud::GRH;
        if d.data.len() > grh {
            verify(
                &format!("module: reply {i} after udaddy's GRH bytes"),
                &msg[..d.data.len() - grh],
                &d.data[grh..],
            )?;
        }
    }
    log(&format!(
        "module: received {count} replies of {size} bytes from QP {:#x}",
        est.ud_qp_num
    ));
    dev.destroy(id)?;
    Ok(est.ud_qp_num)
}
