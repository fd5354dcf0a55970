// SPDX-License-Identifier: GPL-2.0
//! The counterpart both sides under test face: plain librdmacm code
//! ([`crate::cm`]) in a thread of this process, each thread with its own
//! event channel.  Three kinds: a listener that accepts every request (the
//! active connection tests), a client that makes one connection a `go`
//! (the passive ones), and a data server for one connection that sends the
//! advertisement of a region it registered, then echoes, sinks and
//! acknowledges messages (the data tests).  Every wait is bounded.

use crate::cm::{self, Channel, Conn, IdKey};
use crate::report::EventType;
use anyhow::{anyhow, bail, Context, Result};
use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

/// The counterpart's longest wait for a CM event.
pub const T: Duration = Duration::from_secs(20);
/// The data server's longest wait for the next message (the RDMA phase
/// sends none for a while).
const DATA_T: Duration = Duration::from_secs(180);

/// Message kinds of the data tests (their first byte).
pub const ECHO: u8 = b'E';
pub const SINK: u8 = b'S';
pub const ACK: u8 = b'A';
pub const QUIT: u8 = b'Q';

/// A running counterpart thread.
pub struct Peer {
    handle: Option<JoinHandle<Result<String>>>,
    stop: Arc<AtomicBool>,
    go: Option<mpsc::Sender<()>>,
    done: Option<mpsc::Receiver<std::result::Result<(), String>>>,
    /// The thread's CPU time in ns once it ended, [`CPU_UNKNOWN`] before.
    cpu_ns: Arc<AtomicU64>,
}

const CPU_UNKNOWN: u64 = u64::MAX;

impl Peer {
    fn spawn(
        what: &str,
        body: impl FnOnce(Ctx) -> Result<String> + Send + 'static,
        with_go: bool,
    ) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel();
        let ctx = Ctx {
            stop: stop.clone(),
            ready: ready_tx,
            go: go_rx,
            done: done_tx,
        };
        let cpu_ns = Arc::new(AtomicU64::new(CPU_UNKNOWN));
        let cpu_slot = cpu_ns.clone();
        let handle = std::thread::Builder::new()
            .name(format!("bench-{what}"))
            .spawn(move || {
                let r = body(ctx);
                let ns = u64::try_from(super::stats::thread_cpu().as_nanos()).unwrap_or(0);
                cpu_slot.store(ns, Ordering::Release);
                r
            })?;
        let mut peer = Self {
            handle: Some(handle),
            stop,
            go: with_go.then_some(go_tx),
            done: with_go.then_some(done_rx),
            cpu_ns,
        };
        match ready_rx.recv_timeout(T) {
            Ok(Ok(())) => Ok(peer),
            Ok(Err(e)) => {
                let _ = peer.finish();
                bail!("counterpart {what}: {e}")
            }
            Err(_) => {
                let r = peer.finish();
                Err(anyhow!("counterpart {what} not ready within {T:?}: {r:?}"))
            }
        }
    }

    /// Client counterparts: one connection, established and then
    /// disconnected by the side under test; returns once the counterpart
    /// saw DISCONNECTED and destroyed its side, or its error.
    pub fn go(&self) -> Result<()> {
        self.go
            .as_ref()
            .context("not a client")?
            .send(())
            .map_err(|_| anyhow!("the counterpart client ended"))
    }

    pub fn done(&self) -> Result<()> {
        let rx = self.done.as_ref().context("not a client")?;
        match rx.recv_timeout(T + T) {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => bail!("counterpart client: {e}"),
            Err(_) => bail!("counterpart client: no answer within {:?}", T + T),
        }
    }

    /// The CPU time the thread used over its life, once [`Peer::finish`]
    /// returned; `None` before, or if its body panicked.
    pub fn cpu(&self) -> Option<Duration> {
        match self.cpu_ns.load(Ordering::Acquire) {
            CPU_UNKNOWN => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// Stops the thread and returns its summary (or its error).
    pub fn finish(&mut self) -> Result<String> {
        self.stop.store(true, Ordering::Release);
        self.go = None;
        match self.handle.take() {
            Some(h) => h
                .join()
                .map_err(|_| anyhow!("counterpart thread panicked"))?,
            None => Ok(String::new()),
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}

/// What a counterpart thread gets.
struct Ctx {
    stop: Arc<AtomicBool>,
    ready: mpsc::Sender<std::result::Result<(), String>>,
    go: mpsc::Receiver<()>,
    done: mpsc::Sender<std::result::Result<(), String>>,
}

impl Ctx {
    /// Passes `r` on, telling the spawner of an error.
    fn check<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            let _ = self.ready.send(Err(format!("{e:#}")));
        }
        r
    }

    fn ready(&self) {
        let _ = self.ready.send(Ok(()));
    }
}

fn param() -> cm::Param {
    cm::Param::with_data(&[])
}

/// A counterpart's one connection: listens on `addr`, says it is ready,
/// makes the connection of the request with `conn_of` (which adds its
/// regions before the accept), accepts and waits for ESTABLISHED.  The
/// listener comes back with the connection and what `conn_of` made: the
/// caller holds it while it serves.
fn accept_one<'ch, R>(
    ctx: &Ctx,
    ch: &'ch Channel,
    addr: &SocketAddr,
    conn_of: impl FnOnce(cm::ConnRequest<'ch>) -> Result<(Conn<'ch>, R)>,
) -> Result<(cm::Id<'ch>, Conn<'ch>, R)> {
    let listener = ctx.check(cm::listen(ch, addr, 4))?;
    ctx.ready();
    let mut ev = ch.expect(EventType::ConnectRequest, T)?;
    let (conn, made) = conn_of(ev.take_request()?)?;
    conn.accept(&param())?;
    ch.expect(EventType::Established, T)?;
    Ok((listener, conn, made))
}

/// The counterpart listener's backlog: the most ucma takes
/// (`net.rdma_ucm.max_backlog`, 1024), so that a burst of a thousand
/// requests is not refused while it accepts the ones before.
const LISTEN_BACKLOG: i32 = 1024;

/// Accepts every request on `addr` and keeps each connection until its
/// DISCONNECTED, until stopped.
pub fn listener(addr: SocketAddr) -> Result<Peer> {
    Peer::spawn(
        "listener",
        move |ctx| {
            let ch = ctx.check(Channel::new())?;
            let _listener = ctx.check(cm::listen(&ch, &addr, LISTEN_BACKLOG))?;
            ctx.ready();
            let mut conns: HashMap<IdKey, Conn<'_>> = HashMap::new();
            let (mut accepted, mut disconnected) = (0usize, 0usize);
            while !ctx.stop.load(Ordering::Acquire) {
                // Only a timeout is an error of `next`.
                let Ok(mut ev) = ch.next(Duration::from_millis(100)) else {
                    continue;
                };
                match ev.event {
                    EventType::ConnectRequest => {
                        let conn = Conn::new(ev.take_request()?)?;
                        conn.accept(&param())?;
                        conns.insert(ev.id, conn);
                        accepted += 1;
                    }
                    EventType::Established => {}
                    EventType::Disconnected => {
                        conns.remove(&ev.id);
                        disconnected += 1;
                    }
                    _ => bail!("listener: unexpected {} (status {})", ev.name(), ev.status),
                }
            }
            Ok(format!("{accepted} accepted, {disconnected} disconnected"))
        },
        false,
    )
}

/// Connects to `dst` once a [`Peer::go`], waits for ESTABLISHED, then for
/// the side under test to disconnect, and destroys its side.
pub fn client(dst: SocketAddr) -> Result<Peer> {
    Peer::spawn(
        "client",
        move |ctx| {
            let ch = ctx.check(Channel::new())?;
            ctx.ready();
            let mut n = 0usize;
            // Ends when the sender is dropped (finish).
            while ctx.go.recv().is_ok() {
                let r = (|| -> Result<()> {
                    let id = cm::resolve(&ch, &dst, T)?;
                    let conn = Conn::new(id)?;
                    conn.connect(&param(), &ch, T)?
                        .must_be(EventType::Established)?;
                    ch.expect(EventType::Disconnected, T)?;
                    Ok(())
                })();
                n += 1;
                let _ = ctx
                    .done
                    .send(r.map_err(|e| format!("connection {n}: {e:#}")));
            }
            Ok(format!("{n} connections"))
        },
        true,
    )
}

/// One connection on `addr`: registers a region of `region` bytes (remote
/// read and write), SENDs its advertisement (address, rkey and length,
/// little-endian), then answers messages by their first byte: [`ECHO`]
/// sends the message back, [`SINK`] is counted, [`ACK`] is answered with
/// one byte, [`QUIT`] ends; then it waits for DISCONNECTED.  Busy-polls.
pub fn data_server(addr: SocketAddr, region: usize) -> Result<Peer> {
    Peer::spawn(
        "data-server",
        move |ctx| {
            cm::set_busy_poll(true);
            let ch = ctx.check(Channel::new())?;
            let (_listener, mut conn, r) = accept_one(&ctx, &ch, &addr, |request| {
                // Receives for a whole window of the sender and more: a
                // receiver out of receives answers with an RNR NAK, and the
                // sender waits the CM's RNR timer (655 ms) before it retries.
                let mut conn = Conn::with_recv_depth(request, 4 * cm::SEND_WINDOW)?;
                let r = conn.add_region(&vec![0u8; region], true, true)?;
                Ok((conn, r))
            })?;
            let (raddr, rkey, len) = conn.region_key(r);
            let mut adv = Vec::with_capacity(16);
            adv.extend_from_slice(&raddr.to_le_bytes());
            adv.extend_from_slice(&rkey.to_le_bytes());
            adv.extend_from_slice(&len.to_le_bytes());
            conn.send(&adv).context("advertisement")?;
            let (mut echoed, mut sunk) = (0usize, 0usize);
            loop {
                let m = recv(&mut conn, &ctx.stop)?;
                match m.first() {
                    Some(&ECHO) => {
                        conn.send(&m)?;
                        echoed += 1;
                    }
                    Some(&SINK) => sunk += 1,
                    Some(&ACK) => conn.send(&[ACK])?,
                    Some(&QUIT) => break,
                    _ => bail!("unexpected message of {} bytes", m.len()),
                }
            }
            ch.expect(EventType::Disconnected, T)?;
            Ok(format!("{echoed} echoed, {sunk} sunk"))
        },
        false,
    )
}

/// The storage sample's protocol (`samples/rdma_cm_rs_store.rs`) served
/// from user space on `addr`, one connection: a store of `size` bytes
/// registered once, each PUT an RDMA READ from the client's buffer into it
/// and each GET an RDMA WRITE from it, waited for, then the answer SENT;
/// until the client disconnects.  Busy-polls.
pub fn store_server(addr: SocketAddr, size: usize) -> Result<Peer> {
    Peer::spawn(
        "store-server",
        move |ctx| {
            cm::set_busy_poll(true);
            let ch = ctx.check(Channel::new())?;
            let (_listener, mut conn, store) = accept_one(&ctx, &ch, &addr, |request| {
                let mut conn = Conn::new(request)?;
                let store = conn.add_region(&vec![0u8; size], false, false)?;
                Ok((conn, store))
            })?;
            let mut served = 0usize;
            let start = std::time::Instant::now();
            loop {
                let m = match conn.recv(Duration::from_millis(200)) {
                    Ok(m) => m,
                    Err(e) => {
                        if ch
                            .try_next()
                            .is_some_and(|ev| ev.event == EventType::Disconnected)
                        {
                            break;
                        }
                        if ctx.stop.load(Ordering::Acquire) || start.elapsed() >= DATA_T {
                            return Err(e.context("no request"));
                        }
                        continue;
                    }
                };
                let (op, len, offset, raddr, rkey, id) = crate::store::parse_request(&m)
                    .ok_or_else(|| anyhow!("malformed request of {} bytes", m.len()))?;
                let inside = offset
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= size as u64);
                let status = if !inside {
                    -libc::EINVAL
                } else {
                    let rdma = if op == crate::store::OP_PUT {
                        cm::RdmaOp::Read
                    } else {
                        cm::RdmaOp::Write
                    };
                    let wc = conn.rdma(rdma, store, offset as usize, len as u32, raddr, rkey)?;
                    if wc == 0 {
                        0
                    } else {
                        -libc::EIO
                    }
                };
                conn.send(&crate::store::answer(id, status))?;
                served += 1;
            }
            Ok(format!("{served} requests served"))
        },
        false,
    )
}

/// The next message within [`DATA_T`], in short waits so that a stop (the
/// side under test failed) ends the wait early.  `Conn::recv` fails alike
/// on a timeout and on a completion in error: the last error is reported.
fn recv(conn: &mut Conn<'_>, stop: &AtomicBool) -> Result<Vec<u8>> {
    let start = std::time::Instant::now();
    loop {
        match conn.recv(Duration::from_millis(500)) {
            Ok(m) => return Ok(m),
            Err(e) if stop.load(Ordering::Acquire) => {
                return Err(e.context("stopped by the side under test"))
            }
            Err(e) if start.elapsed() >= DATA_T => return Err(e),
            Err(_) => {}
        }
    }
}

/// Decodes [`data_server`]'s advertisement: (address, rkey, length).
pub fn parse_advert(m: &[u8]) -> Result<(u64, u32, u32)> {
    if m.len() != 16 {
        bail!("advertisement of {} bytes, not 16", m.len());
    }
    let u64_at = |i: usize| u64::from_le_bytes(m[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(m[i..i + 4].try_into().expect("4 bytes"));
    Ok((u64_at(0), u32_at(8), u32_at(12)))
}

/// The echo service of the sample `rdma_cm_rs_echo.ko` in user space, the
/// same work with librdmacm: accepts every request on `addr` with the
/// sample's private data, sends every message received back, and
/// destroys a connection at its DISCONNECTED, until stopped.  One thread
/// that busy-polls its event channel and its connections' receive CQs.
pub fn echo_server(addr: SocketAddr) -> Result<Peer> {
    Peer::spawn(
        "echo-server",
        move |ctx| {
            cm::set_busy_poll(true);
            let ch = ctx.check(Channel::new())?;
            let _listener = ctx.check(cm::listen(&ch, &addr, LISTEN_BACKLOG))?;
            ctx.ready();
            let accept = cm::Param::with_data(ECHO_ACCEPT_DATA);
            let mut conns: HashMap<IdKey, Conn<'_>> = HashMap::new();
            let (mut accepted, mut echoed) = (0usize, 0usize);
            while !ctx.stop.load(Ordering::Acquire) {
                while let Some(mut ev) = ch.try_next() {
                    match ev.event {
                        EventType::ConnectRequest => {
                            let conn = Conn::new(ev.take_request()?)?;
                            conn.accept(&accept)?;
                            conns.insert(ev.id, conn);
                            accepted += 1;
                        }
                        EventType::Established => {}
                        EventType::Disconnected => {
                            conns.remove(&ev.id);
                        }
                        _ => bail!(
                            "echo server: unexpected {} (status {})",
                            ev.name(),
                            ev.status
                        ),
                    }
                }
                for conn in conns.values_mut() {
                    if let Some(m) = conn.try_recv()? {
                        conn.send(&m)?;
                        echoed += 1;
                    }
                }
                std::thread::yield_now();
            }
            Ok(format!("{accepted} accepted, {echoed} echoed"))
        },
        false,
    )
}

/// What the sample `rdma_cm_rs_echo.ko` accepts with (its `ACCEPT_DATA`).
pub const ECHO_ACCEPT_DATA: &[u8] = b"rdma_cm_rs_echo";
