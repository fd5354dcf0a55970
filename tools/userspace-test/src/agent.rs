// SPDX-License-Identifier: GPL-2.0
//! The librdmacm peer as a service: one request line a TCP connection,
//! `key=value` words (bytes in hex), answered by `ready` where the peer
//! must be listening before the suite goes on, then one `result ...` or
//! `error ...` line.  The suite runs it in-process (one VM) or in the other
//! VM (two VMs) and drives both topologies with the same code.
//!
//! Requests:
//!   serve addr=A count=N accept=HEX [reject=1 rejdata=HEX] [echo=N] [disc=self]
//!         [rdma=LEN [rdmamode=full|victim]]   (see `rdma_peer`)
//!   connect addr=A data=HEX [rr= id= retry= rnr= fc=] [msg=HEX [bye=HEX]] [disc=self|peer|none]
//!         [vanish=1]   (`serve` too: the QP destroyed once established,
//!                      the id kept until the suite's DREQ)
//!   multi addr=A count=N      N connections, 8 requests in flight at a
//!                             time (then the suite sends "close")
//!   burst addr=A count=N data=HEX   (then the suite sends "go"; see `burst`)
//!   hold addr=A [retry=N]     connects (RC retry count N, 7 by default),
//!                             `ready` once established, then
//!                             sends every 20 ms until it fails or the
//!                             machine dies (see `hold`)
//!   udserve addr=A count=N accept=HEX [reject=1 rejdata=HEX] [echo=N] [ps=ib]
//!   udconnect addr=A data=HEX [qps=K] [msgs=N] [sizes=S,S,...] [replies=N] [ps=ib]
//!                             UD over RDMA_PS_UDP or RDMA_PS_IB (SIDR), see `ud`
//!   store addr=A conns=N rounds=N size=N
//!                             the store sample's client, see `store`
//!   nvmet addr=A part=cm|capsules iwarp=0|1
//!                             a host of the NVMe-oF target sample that
//!                             speaks the protocol badly, see `nvmet`
//!   run tool=NAME args=HEX [wait_ms=N | ready=output] [timeout_s=N]
//!                             an unmodified rdmacm-utils tool (rping,
//!                             ucmatose, udaddy) as the peer: `ready`
//!                             after wait_ms or its first output, then `status=` and the
//!                             tail of its output (the suite may send
//!                             "stop" meanwhile), see `run`
//!   nvme_host addr=A nqn=NQN hostnqn=NQN hostid=UUID [queues= kato=
//!             reconnect_delay= ctrl_loss_tmo=] [rw= bs= iodepth= numjobs=
//!             size_mib=] [runtime_s=N] [timeout_s=N]
//!                             the kernel's NVMe host (nvme-rdma, nvme-cli)
//!                             connected to a target at A: `ready` with its
//!                             block device, then fio with verify on it, then
//!                             `nvme disconnect` (the suite may send "stop"
//!                             meanwhile), see `nvme_host`
//!
//! A connect that `rdma_connect` itself refuses (iWARP's TCP connect to a
//! port nobody listens on, or reset by a listener going away) is reported
//! as the event `REFUSED_AT_CONNECT` in `connect` and `burst`.

pub mod nvme_host;
pub mod run;
pub mod ud;

/// The "event" of a connect refused by `rdma_connect` itself.
pub const REFUSED_AT_CONNECT: &str = "REFUSED_AT_CONNECT";

use crate::cm::{self, Channel, Conn, Param, RdmaOp};
use crate::payload::{advert, fnv64, hex, parse_advert, pattern, unhex};
use crate::report::EventType;
use anyhow::{anyhow, bail, Context, Result};
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead, BufReader, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

const T: Duration = Duration::from_secs(20);

/// Parses `word key=value ...`.
pub fn parse(line: &str) -> (String, BTreeMap<String, String>) {
    let mut words = line.split_whitespace();
    let verb = words.next().unwrap_or("").to_string();
    let kv = words
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    (verb, kv)
}

struct Req {
    kv: BTreeMap<String, String>,
}

impl Req {
    fn get(&self, k: &str) -> Option<&str> {
        self.kv.get(k).map(String::as_str)
    }
    fn addr(&self) -> Result<SocketAddr> {
        self.get("addr").context("addr=")?.parse().context("addr")
    }
    fn num(&self, k: &str, default: u32) -> Result<u32> {
        self.get(k)
            .map_or(Ok(default), |v| v.parse().context("number"))
    }
    fn bytes(&self, k: &str) -> Result<Vec<u8>> {
        self.get(k).map_or(Ok(Vec::new()), unhex)
    }
}

/// Serves requests on `listener` until the process ends.
pub fn serve_forever(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || {
            match handle(stream) {
                // The suite hung up (a scenario that failed early): not news.
                Err(e)
                    if e.downcast_ref::<std::io::Error>().map(std::io::Error::kind)
                        == Some(std::io::ErrorKind::BrokenPipe) => {}
                Err(e) => {
                    // One write, so that it cannot split a KTAP line.
                    let line = format!("# agent: {e:#}\n");
                    let _ = std::io::stderr().write_all(line.as_bytes());
                }
                Ok(()) => {}
            }
        });
    }
}

/// Starts an agent thread on 127.0.0.1 and returns its address.
pub fn spawn_local() -> Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let a = l.local_addr()?;
    std::thread::spawn(move || serve_forever(l));
    Ok(a)
}

fn handle(stream: TcpStream) -> Result<()> {
    let mut out = stream.try_clone()?;
    let mut input = BufReader::new(stream);
    let mut line = String::new();
    input.read_line(&mut line)?;
    let (verb, kv) = parse(&line);
    let req = Req { kv };
    let result = match verb.as_str() {
        "serve" => serve(&req, &mut out),
        "connect" => connect(&req),
        "multi" => multi(&req, &mut out, &mut input),
        "burst" => burst(&req, &mut out, &mut input),
        "hold" => hold(&req, &mut out),
        "udserve" => ud::udserve(&req, &mut out),
        "udconnect" => ud::udconnect(&req),
        "run" => run::run(&req, &mut out),
        "nvme_host" => nvme_host::nvme_host(&req, &mut out),
        "store" => crate::store::exercise(
            req.addr()?,
            req.num("conns", 1)? as usize,
            req.num("rounds", 1)? as usize,
            req.num("size", 0)?.into(),
        ),
        "nvmet" => match req.get("part") {
            Some("cm") => crate::nvmet::bad_cm_requests(req.addr()?, req.num("iwarp", 0)? != 0),
            Some("capsules") => crate::nvmet::bad_capsules(req.addr()?, req.num("iwarp", 0)? != 0),
            other => Err(anyhow!("nvmet: unknown part {other:?}")),
        },
        _ => Err(anyhow!("unknown request {verb:?}")),
    };
    match result {
        Ok(r) => writeln!(out, "result {r}")?,
        Err(e) => writeln!(out, "error {}", format!("{e:#}").replace('\n', " "))?,
    }
    linger(out, &mut input)
}

/// How long the agent waits for the suite to hang up after the answer.
const LINGER: Duration = Duration::from_secs(5);

/// Ends the answer with a FIN and reads whatever the suite still sends
/// until it hangs up (at most [`LINGER`]).  A line the suite sent meanwhile
/// (a `stop` crossing the tool's own exit) left unread at the close would
/// make the close a reset, which discards the answer if it still waits in
/// the send queue (Nagle holds a small segment while one is unacked): the
/// suite then reads "Connection reset by peer" instead of the result.
fn linger(out: TcpStream, input: &mut BufReader<TcpStream>) -> Result<()> {
    // The suite gone already (a failure on its side): nothing to keep.
    if out.shutdown(Shutdown::Write).is_err() {
        return Ok(());
    }
    input.get_ref().set_read_timeout(Some(LINGER))?;
    let mut rest = [0u8; 256];
    let until = std::time::Instant::now() + LINGER;
    while std::time::Instant::now() < until {
        match input.read(&mut rest) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    Ok(())
}

fn serve(req: &Req, out: &mut TcpStream) -> Result<String> {
    let ch = Channel::new()?;
    let _listener = cm::listen(&ch, &req.addr()?, 128)?;
    writeln!(out, "ready")?;
    let mut report = String::new();
    for n in 0..req.num("count", 1)? {
        let mut ev = ch.expect(EventType::ConnectRequest, T)?;
        let _ = write!(
            report,
            "req{n}={} rr{n}={} id{n}={} retry{n}={} rnr{n}={} fc{n}={} ",
            hex(&ev.private_data),
            ev.responder_resources,
            ev.initiator_depth,
            ev.retry_count,
            ev.rnr_retry_count,
            ev.flow_control
        );
        let request = ev.take_request()?;
        if req.get("reject").is_some() {
            request.reject(&req.bytes("rejdata")?)?;
            continue;
        }
        let mut conn = Conn::new(request)?;
        let mut param = Param::with_data(&req.bytes("accept")?);
        // The RNR retries of the *peer's* sends (IB CM: the REP's field).
        param.rnr_retry_count = req.num("rnr", 7)? as u8;
        param.flow_control = req.num("fc", 1)? as u8;
        conn.accept(&param)?;
        let est = ch.next(T)?;
        let exchange =
            req.get("rdma").is_some() || req.num("echo", 0)? > 0 || req.num("flood", 0)? > 0;
        if est.event == EventType::Disconnected && !exchange {
            // An active side that disconnects the moment it is established
            // may have its DREQ reach us before its RTU (lost, or late
            // under load): the IB CM then reports DISCONNECTED alone, a
            // valid sequence.
            let _ = write!(report, "est{n}=- disc{n}={} ", est.name());
            continue;
        }
        est.must_be(EventType::Established)?;
        let _ = write!(report, "est{n}={} ", hex(&est.private_data));
        if req.get("vanish").is_some() {
            let disc = vanish(&ch, &mut conn)?;
            let _ = write!(report, "disc{n}={disc} ");
            continue;
        }
        if let Some(len) = req.get("rdma") {
            let len = len.parse().context("rdma=")?;
            // `first=recv`: the active side's message comes first.  Over
            // iWARP the passive side may not send before it
            // (`rdma_connect(3)`): siw's active side reads the MPA reply
            // and then checks that nothing follows it, so a SEND of ours
            // that arrives before it processed the reply fails its connect
            // ("peer sent extra data": CONNECT_ERROR, -EINVAL).
            if req.get("first") == Some("recv") {
                let _ = write!(report, "first{n}={} ", hex(&conn.recv(T)?));
            }
            rdma_peer(&mut conn, len, req.get("rdmamode"), &mut report)?;
        }
        // `flood=N`: N SENDs of 4096 bytes back to back, which the suite
        // answers by disconnecting once the first arrived: the rest reach
        // a QP in the error state.  On its DISCONNECTED this side
        // disconnects too, flushing what still retries.
        let flood = req.num("flood", 0)? as usize;
        let mut disconnected = false;
        if flood > 0 {
            let ok = conn.flood(flood, cm::MSG, disconnect_on_close(&ch, &mut disconnected))?;
            let _ = write!(report, "flood{n}={ok}/{flood} ");
        }
        let echoes = req.num("echo", 0)?;
        for i in 0..echoes {
            let msg = conn.recv(T)?;
            if i == 0 {
                let _ = write!(report, "msg{n}={} ", hex(&msg));
            }
            if i + 1 < echoes {
                conn.send(&msg)?;
                continue;
            }
            // The suite may disconnect the moment it has read the last echo
            // (and checks what it read).  siw looks for the peer's close
            // after it has sent a message's last segment and before it
            // completes the send (`siw_qp_sq_proc_tx`): if the FIN came in
            // between, a delivered send completes with LOC_QP_OP_ERR.  rxe
            // may never send the echo's ACK (testing.rst, "Debugging rxe"):
            // the suite's DISCONNECTED then comes first, and this side's
            // disconnect flushes the echo.  Such a status is reported
            // (`lastecho`), and the connection must then end in
            // DISCONNECTED like any other.
            let status = conn
                .send_before_close(&msg, disconnect_on_close(&ch, &mut disconnected))
                .context("last echo")?;
            let _ = write!(report, "lastecho{n}={status} ");
        }
        if disconnected {
            let _ = write!(report, "disc{n}=DISCONNECTED ");
            continue;
        }
        if req.get("disc") == Some("self") {
            conn.disconnect()?;
        }
        let disc = ch.expect(EventType::Disconnected, T)?;
        let _ = write!(report, "disc{n}={} ", disc.name());
    }
    Ok(report.trim_end().to_string())
}

/// `vanish=1`: the QP goes as soon as the connection is established, the
/// id stays, so that the suite's sends get no acknowledgement and its QP
/// runs out of retries; the suite then destroys its id, whose DREQ ends
/// this side's connection (the event's name is returned).
fn vanish(ch: &Channel, conn: &mut Conn<'_>) -> Result<&'static str> {
    conn.vanish();
    Ok(ch
        .expect(EventType::Disconnected, Duration::from_secs(60))?
        .name())
}

/// The `stop` of [`Conn::flood`] and [`Conn::send_before_close`]: once the
/// suite's DISCONNECTED is queued on `ch`, this side disconnects too (its
/// QP to the error state, which flushes what still waits for an ACK) and
/// records it in `disconnected`.
fn disconnect_on_close<'a>(
    ch: &'a Channel,
    disconnected: &'a mut bool,
) -> impl FnMut(&Conn<'_>) -> Result<bool> + 'a {
    move |conn: &Conn<'_>| {
        let Some(ev) = ch.try_next() else {
            return Ok(false);
        };
        ev.must_be(EventType::Disconnected)?;
        *disconnected = true;
        conn.disconnect()?;
        Ok(true)
    }
}

/// Seeds of the buffers of the RDMA exchange, shared with the suite.
pub const SEED_PEER_REGION: u8 = 0x51;
pub const SEED_PEER_WRITES: u8 = 0x52;

/// The librdmacm side of the RDMA scenarios.  It registers a region of
/// `len` bytes ([`SEED_PEER_REGION`] pattern, remote read and write) and
/// SENDs its advertisement (rping's format).  `victim` stops there.  `full`
/// then waits for the module's advertisement (sent once the module has read
/// and written the peer's region), reports its own region (`region=`), RDMA
/// READs the module's region (`read=`, `read_status=`), RDMA WRITEs the
/// [`SEED_PEER_WRITES`] pattern into it (`write_status=`), SENDs `written`,
/// waits for `dereg` and tries one more WRITE with the now stale key
/// (`stale=`, the completion status).
fn rdma_peer(conn: &mut Conn, len: usize, mode: Option<&str>, report: &mut String) -> Result<()> {
    let region = conn.add_region(&pattern(len, SEED_PEER_REGION), true, true)?;
    let (addr, rkey, rlen) = conn.region_key(region);
    conn.send(&advert(addr, rkey, rlen))?;
    if mode == Some("victim") {
        return Ok(());
    }
    let (maddr, mkey, mlen) = parse_advert(&conn.recv(T)?)?;
    let _ = write!(report, "region={:016x} ", fnv64(conn.region(region)));
    let scratch = conn.add_region(&vec![0; mlen as usize], false, false)?;
    let st = conn.rdma(RdmaOp::Read, scratch, 0, mlen, maddr, mkey)?;
    let _ = write!(
        report,
        "read_status={st} read={:016x} ",
        fnv64(conn.region(scratch))
    );
    conn.region_mut(scratch)
        .copy_from_slice(&pattern(mlen as usize, SEED_PEER_WRITES));
    let st = conn.rdma(RdmaOp::Write, scratch, 0, mlen, maddr, mkey)?;
    let _ = write!(report, "write_status={st} ");
    conn.send(b"written")?;
    let m = conn.recv(T)?;
    if m != b"dereg" {
        bail!("expected \"dereg\", got {}", hex(&m));
    }
    let st = conn.rdma(RdmaOp::Write, scratch, 0, 16.min(mlen), maddr, mkey)?;
    let _ = write!(report, "stale={st} ");
    Ok(())
}

fn connect(req: &Req) -> Result<String> {
    let ch = Channel::new()?;
    let id = cm::resolve(&ch, &req.addr()?, Duration::from_secs(5))?;
    let mut conn = Conn::new(id)?;
    let mut param = Param::with_data(&req.bytes("data")?);
    param.responder_resources = req.num("rr", 1)? as u8;
    param.initiator_depth = req.num("id", 1)? as u8;
    param.retry_count = req.num("retry", 7)? as u8;
    param.rnr_retry_count = req.num("rnr", 7)? as u8;
    param.flow_control = req.num("fc", 1)? as u8;
    if !conn.start_connect_unless_refused(&param)? {
        return Ok(format!("event={REFUSED_AT_CONNECT}"));
    }
    let ev = ch.next(T)?;
    let mut report = format!(
        "event={} status={} pdata={} rr={} id={} fc={}",
        ev.name(),
        ev.status,
        hex(&ev.private_data),
        ev.responder_resources,
        ev.initiator_depth,
        ev.flow_control
    );
    if ev.event != EventType::Established {
        return Ok(report);
    }
    if req.get("vanish").is_some() {
        let disc = vanish(&ch, &mut conn)?;
        let _ = write!(report, " disc={disc}");
        return Ok(report);
    }
    // `flood=N`: N SENDs of 4096 bytes back to back, reaped until the
    // suite's disconnect (as `serve`'s).
    let flood = req.num("flood", 0)? as usize;
    if flood > 0 {
        let mut disconnected = false;
        let ok = conn.flood(flood, cm::MSG, disconnect_on_close(&ch, &mut disconnected))?;
        let _ = write!(report, " flood={ok}/{flood}");
        if disconnected {
            let _ = write!(report, " disc=DISCONNECTED");
            return Ok(report);
        }
    }
    let msg = req.bytes("msg")?;
    if !msg.is_empty() {
        // `delay=MS`: hold the first message back (the iWARP passive side
        // may not send before it).
        std::thread::sleep(Duration::from_millis(req.num("delay", 0)?.into()));
        conn.send(&msg)?;
        // A reply that never comes (the rxe stall of testing.rst's
        // "Debugging rxe" looked so from here): say what this side's QP,
        // device and CM saw.
        let reply = match conn.recv(T) {
            Ok(reply) => reply,
            Err(e) => bail!("the reply: {e:#} ({})", conn.failure_report(&ch)),
        };
        let _ = write!(report, " reply={}", hex(&reply));
        // `bye=HEX`: one more message, so that the side that sends last
        // (and disconnects once its send completed) is this one.
        if req.get("bye").is_some() {
            conn.send(&req.bytes("bye")?)?;
        }
    }
    match req.get("disc").unwrap_or("self") {
        "self" => {
            conn.disconnect()?;
            let d = ch.expect(EventType::Disconnected, T)?;
            let _ = write!(report, " disc={}", d.name());
        }
        "peer" => {
            let d = ch.expect(EventType::Disconnected, T)?;
            let _ = write!(report, " disc={}", d.name());
        }
        _ => {}
    }
    Ok(report)
}

fn multi(req: &Req, out: &mut TcpStream, input: &mut BufReader<TcpStream>) -> Result<String> {
    let ch = Channel::new()?;
    let addr = req.addr()?;
    let count = req.num("count", 1)? as usize;
    // Every id resolved and given its QP first: the channel then carries
    // the connections' events alone.
    let mut conns = Vec::new();
    for _ in 0..count {
        let id = cm::resolve(&ch, &addr, Duration::from_secs(5))?;
        conns.push(Conn::new(id)?);
    }
    // Then up to MULTI_IN_FLIGHT requests at a time, the next as one is
    // established: the connections overlap their round trips.
    let param = Param::with_data(b"multi");
    let (mut started, mut established) = (0, 0);
    while established < count {
        while started < count && started - established < MULTI_IN_FLIGHT {
            conns[started].start_connect(&param)?;
            started += 1;
        }
        let ev = ch.next(T)?;
        if ev.event != EventType::Established {
            bail!(
                "{established} of {count} connections established, then {} (status {})",
                ev.name(),
                ev.status
            );
        }
        established += 1;
    }
    writeln!(out, "ready established={}", conns.len())?;
    let mut line = String::new();
    input.read_line(&mut line)?;
    for c in &conns {
        c.disconnect()?;
    }
    let mut disconnected = 0;
    while disconnected < conns.len() {
        let ev = ch.next(T)?;
        if ev.event == EventType::Disconnected {
            disconnected += 1;
        }
    }
    drop(conns);
    Ok(format!("closed={disconnected}"))
}

/// Requests `multi` has in flight at once.  One at a time, the 100 of
/// `hundred_connections` took 44-50 s across two VMs; all at once would be
/// a burst, which `burst` tests on its own, and siw's and iw_cm's pools of
/// queued events are sized by the listener's backlog.
const MULTI_IN_FLIGHT: usize = 8;

/// `count` connection requests back to back, for a listener that is
/// destroyed while they arrive: every id is resolved and has its QP before
/// `ready`; on the suite's next line all connect at once, and the first
/// event of each is reported in order of arrival, `events=NAME,NAME,...`.
fn burst(req: &Req, out: &mut TcpStream, input: &mut BufReader<TcpStream>) -> Result<String> {
    let ch = Channel::new()?;
    let addr = req.addr()?;
    let param = Param::with_data(&req.bytes("data")?);
    let mut conns = Vec::new();
    for _ in 0..req.num("count", 1)? {
        let id = cm::resolve(&ch, &addr, Duration::from_secs(5))?;
        conns.push(Conn::new(id)?);
    }
    writeln!(out, "ready")?;
    let mut line = String::new();
    input.read_line(&mut line)?;
    let mut events = Vec::new();
    let mut pending = 0;
    for c in &conns {
        if c.start_connect_unless_refused(&param)? {
            pending += 1;
        } else {
            events.push(REFUSED_AT_CONNECT);
        }
    }
    for _ in 0..pending {
        events.push(ch.next(T)?.name());
    }
    drop(conns);
    Ok(format!("events={}", events.join(",")))
}

/// A connection that keeps sending, for a peer machine killed mid-transfer:
/// the suite kills this VM while it runs.
fn hold(req: &Req, out: &mut TcpStream) -> Result<String> {
    let ch = Channel::new()?;
    let id = cm::resolve(&ch, &req.addr()?, Duration::from_secs(5))?;
    let mut conn = Conn::new(id)?;
    let mut param = Param::with_data(b"hold");
    param.retry_count = req.num("retry", 7)? as u8;
    let ev = conn.connect(&param, &ch, T)?;
    ev.must_be(EventType::Established)?;
    writeln!(out, "ready")?;
    let mut sent = 0u64;
    while conn.send(format!("hold {sent}").as_bytes()).is_ok() {
        sent += 1;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(format!("sent={sent}"))
}

/// The suite's side of one request.
pub struct Call {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Call {
    pub fn start(agent: &SocketAddr, request: &str) -> Result<Self> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        // The peer VM may still be booting: retry the control connection.
        let stream = loop {
            match TcpStream::connect_timeout(agent, Duration::from_secs(2)) {
                Ok(s) => break s,
                Err(e) if std::time::Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e).context("agent"),
            }
        };
        stream.set_read_timeout(Some(Duration::from_secs(90)))?;
        let mut writer = stream.try_clone()?;
        writeln!(writer, "{request}")?;
        Ok(Self {
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// The next line from the agent.
    pub fn line(&mut self) -> Result<String> {
        let mut l = String::new();
        if self.reader.read_line(&mut l)? == 0 {
            bail!("agent closed the connection");
        }
        Ok(l.trim_end().to_string())
    }

    /// Waits for `ready`.
    pub fn ready(&mut self) -> Result<String> {
        let l = self.line()?;
        if !l.starts_with("ready") {
            bail!("agent: {l}");
        }
        Ok(l)
    }

    /// How long [`Call::line`] waits (90 s from [`Call::start`]), for
    /// requests that run longer (`run` with a larger `timeout_s`).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.writer.set_read_timeout(Some(timeout))?;
        Ok(())
    }

    pub fn send(&mut self, line: &str) -> Result<()> {
        writeln!(self.writer, "{line}")?;
        Ok(())
    }

    /// The final `result` fields.
    pub fn result(mut self) -> Result<BTreeMap<String, String>> {
        let l = self.line()?;
        match l.strip_prefix("result") {
            Some(rest) => Ok(parse(&format!("r {rest}")).1),
            None => bail!("agent: {l}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests() {
        let (verb, kv) = parse("connect addr=192.0.2.1:7471 data=6869\n");
        assert_eq!(verb, "connect");
        assert_eq!(kv["addr"], "192.0.2.1:7471");
        assert_eq!(unhex(&kv["data"]).unwrap(), b"hi");
    }
}
