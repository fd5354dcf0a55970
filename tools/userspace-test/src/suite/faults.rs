// SPDX-License-Identifier: GPL-2.0

//! Peers that die: librdmacm peers SIGKILLed at every stage, backlog
//! overflow bursts.

#[allow(unused_imports)]
use super::*;

/// A librdmacm peer process of this machine, killed with SIGKILL.
pub(super) struct KilledPeer {
    child: std::process::Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl KilledPeer {
    fn spawn(args: &[&str]) -> Result<Self> {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let out = child.stdout.take().context("peer stdout")?;
        Ok(Self {
            child,
            lines: io::BufRead::lines(io::BufReader::new(out)),
        })
    }

    /// Waits for the peer to print `line`.  Unbounded: a new process's
    /// start (libibverbs loads every provider) took 7 s under
    /// `make check`'s four passes, so the suite's bounds start once the
    /// peer said it is ready.  A peer that fails ends, and this with it.
    fn expect(&mut self, line: &str) -> Result<()> {
        for l in self.lines.by_ref() {
            if l? == line {
                return Ok(());
            }
        }
        bail!("the peer ended before printing {line:?}")
    }

    /// SIGKILLs the peer and waits for its end, within [`PEER_EXIT_BOUND`];
    /// returns the instant it ended, when its ids are gone.
    fn kill(mut self) -> Result<Instant> {
        self.child.kill()?;
        let killed = Instant::now();
        self.child.wait()?;
        let took = killed.elapsed();
        let line = format!("the killed peer took {} ms to end", took.as_millis());
        ensure!(took < PEER_EXIT_BOUND, "{line}");
        if took >= Duration::from_secs(1) {
            note(&line);
        }
        Ok(Instant::now())
    }
}

impl Drop for KilledPeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A diagnostic line in the KTAP output.
pub(super) fn note(line: &str) {
    println!("# {line}");
}

/// `err`, with what each of `calls` reported (within 30 s: the agent's
/// connections wait 20 s for an answer), for a failure whose other side is
/// the agent's.
pub(super) fn with_agents_reports(err: anyhow::Error, calls: Vec<Call>) -> anyhow::Error {
    let reports: Vec<String> = calls
        .into_iter()
        .enumerate()
        .map(|(i, mut call)| {
            let report = call
                .set_read_timeout(Duration::from_secs(30))
                .and_then(|()| call.result())
                .map(|r| format!("{r:?}"));
            match report {
                Ok(r) => format!("agent call {i}: {r}"),
                Err(e) => format!("agent call {i}: {e:#}"),
            }
        })
        .collect();
    err.context(reports.join("; "))
}

/// The module's SEND on `id`, waited for.  A send that got no completion
/// within the ioctl's 5 s (`ETIMEDOUT`: on rxe, a receiver that went to the
/// error state before rxe sent the ACK, testing.rst "Debugging rxe")
/// leaves the devices' view of every QP and rxe's counters in the output
/// ([`diag::rdma_state`]), with the module's QP number.
pub(super) fn send_or_show_qps(dev: &Device, id: u32, data: &[u8], what: &str) -> Result<()> {
    let Err(e) = dev.send(id, data) else {
        return Ok(());
    };
    if e.raw_os_error() == Some(libc::ETIMEDOUT) {
        let qp_num = dev.query(id).map(|q| q.qp_num).unwrap_or(0);
        note(&format!(
            "{what}: no send completion; the module's QP is {qp_num}"
        ));
        for line in diag::rdma_state(None) {
            note(&line);
        }
    }
    Err(e).context(what.to_string())
}

/// The bound within which the module must learn of a killed peer, from
/// the peer's end.
pub(super) const KILLED_PEER_BOUND: Duration = Duration::from_secs(10);

/// The bound on a killed peer's end.  Its ids go with it, and over iWARP
/// the end of one with a connect in flight waits for the connect's answer:
/// iw_cm's `destroy_cm_id` waits out a connect downcall, up to siw's 10 s
/// MPA reply timer (`MPAREQ_TIMEOUT`) should the module not answer.
const PEER_EXIT_BOUND: Duration = Duration::from_secs(20);

/// The next event of `id` among those in `want`, within the bound after
/// `since`; other ids' events are an error.
pub(super) fn event_of_within(
    dev: &Device,
    id: u32,
    want: &[EventType],
    since: Instant,
) -> Result<(EventType, Duration)> {
    loop {
        let left = KILLED_PEER_BOUND.saturating_sub(since.elapsed());
        ensure!(
            !left.is_zero(),
            "no event of id {id} within {KILLED_PEER_BOUND:?}"
        );
        let e = match dev.get_event(left.as_millis().max(1) as u32) {
            Ok(e) => e,
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => continue,
            Err(e) => return Err(e).context("GET_EVENT"),
        };
        if e.event == EventType::TimewaitExit {
            continue;
        }
        ensure!(e.id == id, "event of another id: {}", e.line("module"));
        if want.contains(&e.event) {
            return Ok((e.event, since.elapsed()));
        }
        bail!("unexpected {}", e.line("module"));
    }
}

/// The librdmacm peer, a process of its own, is SIGKILLed mid-transfer
/// (sending every 20 ms to the module), mid-connection as the active side
/// (its request not yet answered) and as the passive side (the module's
/// request not yet answered).  The process's end destroys its ids (the
/// kernel's ucma does on close): within [`KILLED_PEER_BOUND`] of that end
/// the module's id gets DISCONNECTED, REJECTED or an error event, its
/// calls fail with an errno, and destroying it and serving again work.
pub(super) fn librdmacm_peer_killed(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = listen(&dev, addr, 4, 0)?;
    let addr_arg = addr.to_string();

    // Mid-transfer.
    let spawned = Instant::now();
    let mut peer = KilledPeer::spawn(&["peer", "hold", &addr_arg])?;
    peer.expect("connecting")?;
    let ready = spawned.elapsed();
    let r = wait(&dev, EventType::ConnectRequest)?;
    note(&format!(
        "peer process ready after {} ms, its request {} ms later",
        ready.as_millis(),
        (spawned.elapsed() - ready).as_millis()
    ));
    dev.accept(r.new_id, None)?;
    wait(&dev, EventType::Established)?;
    peer.expect("established")?;
    for _ in 0..3 {
        dev.recv(r.new_id, 4096, 5000)
            .context("a message of the peer")?;
    }
    let ended = peer.kill()?;
    // Messages already sent may still be read; then the disconnect.
    while dev.recv(r.new_id, 4096, 100).is_ok() {
        ensure!(ended.elapsed() < KILLED_PEER_BOUND, "still receiving");
    }
    let (_, took) = event_of_within(&dev, r.new_id, &[EventType::Disconnected], ended)?;
    note(&format!(
        "killed mid-transfer: DISCONNECTED {} ms after its end",
        took.as_millis()
    ));
    expect_errno(
        "SEND after the peer died",
        dev.send(r.new_id, b"x"),
        libc::ENOTCONN,
    )?;
    dev.destroy(r.new_id)?;

    // Mid-connection, the peer active: its request waits for the module.
    let mut peer = KilledPeer::spawn(&["peer", "hold", &addr_arg])?;
    peer.expect("connecting")?;
    let r = wait(&dev, EventType::ConnectRequest)?;
    let ended = peer.kill()?;
    // The peer's end rejects the request (its CM id, destroyed in
    // REQ_SENT, sends a REJ): the module's id learns it by an event, and
    // an accept made meanwhile fails or is undone.  Over iWARP the peer's
    // end waits for its connect's answer, which comes only when siw's MPA
    // timer gives up (10 s) and closes the TCP connection: siw's accept
    // then finds the connection gone and fails (ECONNRESET), and no event
    // follows, since iw_cm never knew a connection.  An accept that comes
    // before siw has seen the close sees ESTABLISHED, then DISCONNECTED
    // (seen in one make check).
    let accepted = dev.accept(r.new_id, None);
    let answered = ended.elapsed();
    match &accepted {
        Err(e) if ctx.iwarp() => {
            ensure!(
                e.raw_os_error() == Some(libc::ECONNRESET),
                "ACCEPT of a request whose peer died: {e}, expected ECONNRESET"
            );
            no_event(&dev, 1000, "event after the failed ACCEPT")?;
            note(&format!(
                "killed with its request pending: accept {e} {} ms after its end, no event",
                answered.as_millis()
            ));
        }
        _ => {
            let want = [
                EventType::Rejected,
                EventType::ConnectError,
                EventType::Unreachable,
                EventType::Established,
                EventType::Disconnected,
            ];
            let (ev, took) = event_of_within(&dev, r.new_id, &want, ended)?;
            let (ev, took) = if ev == EventType::Established {
                event_of_within(&dev, r.new_id, &[EventType::Disconnected], ended)?
            } else {
                (ev, took)
            };
            note(&format!(
                "killed with its request pending: accept {}, then {} {} ms after its end",
                accepted
                    .as_ref()
                    .map_or_else(|e| e.to_string(), |()| "ok".into()),
                ev.name(),
                took.as_millis()
            ));
        }
    }
    dev.destroy(r.new_id)?;

    // Mid-connection, the peer passive: the module's request waits for it.
    let paddr = SocketAddr::new(ctx.local4, ctx.port());
    let mut peer = KilledPeer::spawn(&["peer", "hold-request", &paddr.to_string()])?;
    peer.expect("listening")?;
    let id = resolve(&dev, paddr)?;
    let param = Param::with_data(b"to a peer that dies");
    if dev.is_sync() {
        // A synchronous CONNECT blocks until the peer answers, which this
        // peer never does: past a short limit it returns with the connect
        // in flight, and the same call resumes it once the peer is dead.
        expect_errno(
            "CONNECT to a peer that holds the request",
            dev.sync_connect(id, &param, 300).0,
            libc::ETIMEDOUT,
        )?;
    } else {
        dev.connect(id, &param)?;
    }
    peer.expect("request")?;
    let ended = peer.kill()?;
    if dev.is_sync() {
        // Returns the event that ended the connect (read below).
        dev.connect(id, &param)?;
    }
    let (ev, took) = event_of_within(
        &dev,
        id,
        &[
            EventType::Rejected,
            EventType::ConnectError,
            EventType::Unreachable,
        ],
        ended,
    )?;
    note(&format!(
        "killed before answering the module's request: {} {} ms after its end",
        ev.name(),
        took.as_millis()
    ));
    dev.destroy(id)?;

    // The listener still serves.
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={addr} data=6f6b disc=peer"),
    )?;
    let r = wait(&dev, EventType::ConnectRequest)?;
    dev.accept(r.new_id, None)?;
    wait(&dev, EventType::Established)?;
    disconnect_and_wait(&dev, r.new_id)?;
    ensure!(field(&call.result()?, "event")? == "ESTABLISHED");
    dev.destroy(r.new_id)?;
    dev.destroy(l)?;
    Ok(())
}

/// Thirty-two connection requests at once at a listener with a backlog of
/// four that accepts nothing meanwhile: exactly four reach the file, the
/// other 28 peers are refused (REJECTED, or UNREACHABLE should the refusal
/// race the peer's own timeout), accepting the four works, and once they
/// are gone the file holds nothing but its listener.
pub(super) fn backlog_overflow_burst(ctx: &mut Ctx) -> Result<()> {
    const BACKLOG: u32 = 4;
    const BURST: u32 = 32;
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = listen(&dev, addr, BACKLOG, 0)?;
    let burst = burst_now(ctx, addr, BURST, 0x0b)?;
    // The four the backlog holds; then, while they wait, nothing else.
    let mut requests = Vec::new();
    for _ in 0..BACKLOG {
        requests.push(wait(&dev, EventType::ConnectRequest)?.new_id);
    }
    std::thread::sleep(Duration::from_secs(2));
    no_event(&dev, 0, "a request over the backlog")?;
    ensure!(
        dev.query(l)?.backlog == BACKLOG,
        "backlog in use {}",
        dev.query(l)?.backlog
    );
    // On iWARP the backlog is TCP's and siw's: a request over it is not
    // refused but waits, and may reach the listener once the module has
    // answered the four (siw takes a new connection over with one of the
    // listener's work elements, as many as the backlog; a connection whose
    // takeover found none waits in the accept queue until a later one's
    // takes it, often after the peer's 10 s MPA timer made it UNREACHABLE).
    // Such a late request is rejected and counted; it never comes while
    // the backlog is full (checked above).
    let iwarp = ctx.iwarp();
    let mut late = 0u32;
    // The next event, or `None` for a late request, rejected.
    let mut next_event = |what: &str| -> Result<Option<Event>> {
        let ev = dev
            .get_event(T)
            .with_context(|| format!("module: waiting for {what}"))?;
        if iwarp && ev.event == EventType::ConnectRequest && ev.id == l {
            // Its peer may have given up already: the reject may fail.
            let _ = dev.reject(ev.new_id, 0, b"");
            dev.destroy(ev.new_id)?;
            late += 1;
            return Ok(None);
        }
        Ok(Some(ev))
    };
    // The peers let go of every connection once all 32 have their answer,
    // which can be before the module's last ESTABLISHED is queued: an
    // earlier connection's DISCONNECTED may come first.
    for &r in &requests {
        dev.accept(r, None)?;
    }
    let (mut established, mut disconnected) = (0, 0);
    while established < BACKLOG {
        let Some(ev) = next_event("ESTABLISHED")? else {
            continue;
        };
        ensure!(requests.contains(&ev.id), "{} on id {}", ev.name(), ev.id);
        match ev.event {
            EventType::Established => established += 1,
            EventType::Disconnected => disconnected += 1,
            EventType::TimewaitExit => {}
            _ => bail!(
                "module: {} (status {}) on id {}",
                ev.name(),
                ev.status,
                ev.id
            ),
        }
    }
    let events = field(&burst.result()?, "events")?.to_string();
    let count = |name: &str| events.split(',').filter(|e| *e == name).count() as u32;
    ensure!(
        count("ESTABLISHED") == BACKLOG
            && count("REJECTED") + count("UNREACHABLE") == BURST - BACKLOG,
        "the peers saw {events}"
    );
    // The peers are gone (the agent dropped its ids): every accepted id
    // sees DISCONNECTED, and the backlog is free again.
    while disconnected < BACKLOG {
        let Some(ev) = next_event("DISCONNECTED")? else {
            continue;
        };
        match ev.event {
            EventType::Disconnected if requests.contains(&ev.id) => disconnected += 1,
            EventType::TimewaitExit => {}
            _ => bail!(
                "module: expected DISCONNECTED but got {}",
                ev.line("module")
            ),
        }
    }
    for r in &requests {
        dev.destroy(*r)?;
    }
    // A late request may still be on its way (iWARP): it is taken out of
    // the backlog when rejected.
    while dev.query(l)?.backlog != 0 {
        ensure!(iwarp, "backlog still in use");
        if let Some(ev) = next_event("a late request")? {
            bail!("module: {} while a late request was due", ev.line("module"));
        }
    }
    note(&format!(
        "burst of {BURST} at backlog {BACKLOG}: {} established, {} rejected, {} unreachable; {late} late request(s) rejected",
        count("ESTABLISHED"),
        count("REJECTED"),
        count("UNREACHABLE")
    ));
    for h in l + 1..l + 2 * BURST + 8 {
        expect_errno(
            "QUERY of a refused request's id",
            dev.query(h),
            libc::ENOENT,
        )?;
    }
    dev.destroy(l)?;
    Ok(())
}
