// SPDX-License-Identifier: GPL-2.0

//! How ids and files end: non-blocking files and poll, disconnects, close,
//! listeners destroyed with requests pending, access control.

#[allow(unused_imports)]
use super::*;

pub(super) fn nonblocking_and_poll(ctx: &mut Ctx) -> Result<()> {
    let nb = Device::open_nonblocking()?;
    expect_errno(
        "O_NONBLOCK, empty",
        nb.get_event(RDMA_CM_RS_TIMEOUT_INFINITE),
        libc::EAGAIN,
    )?;
    let dev = Device::open()?;
    expect_errno("timeout 0, empty", dev.get_event(0), libc::EAGAIN)?;
    let start = Instant::now();
    expect_errno("timeout 300 ms", dev.get_event(300), libc::ETIMEDOUT)?;
    let waited = start.elapsed();
    ensure!(
        waited >= Duration::from_millis(280) && waited < Duration::from_secs(3),
        "waited {waited:?}"
    );
    let poll = |ms: i32| {
        let mut p = libc::pollfd {
            fd: dev.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: One valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        (n, p.revents)
    };
    ensure!(poll(0) == (0, 0), "readable while empty");
    // An event makes the file readable.
    let id = dev.create_id(0)?;
    dev.resolve_addr(id, &SocketAddr::new(ctx.local4, 1), 2000)?;
    let (n, revents) = poll(5000);
    ensure!(
        n == 1 && revents & libc::POLLIN != 0,
        "poll {n} {revents:#x}"
    );
    // GET_EVENT copies out with no lock held, after dequeuing the event: a
    // copy that faults puts it back first.
    if !dev.is_sync() {
        expect_errno(
            "GET_EVENT into read-only memory",
            get_event_read_only(&dev),
            libc::EFAULT,
        )?;
        ensure!(poll(0).0 == 1, "not readable after a failed copy");
    }
    ensure!(dev.get_event(0)?.event == EventType::AddrResolved);
    ensure!(poll(0) == (0, 0), "readable after the event was read");
    Ok(())
}

/// GET_EVENT (timeout 0) with its argument in a read-only page: the
/// module reads it, and fails to write the event back.
pub(super) fn get_event_read_only(dev: &Device) -> io::Result<i32> {
    let page = 4096;
    // SAFETY: A fresh anonymous private mapping of one page.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let arg = rdma_cm_rs_get_event::default();
    // SAFETY: The page is writable, aligned and large enough.
    unsafe { p.cast::<rdma_cm_rs_get_event>().write(arg) };
    // SAFETY: The page is ours.
    let r = if unsafe { libc::mprotect(p, page, libc::PROT_READ) } != 0 {
        Err(io::Error::last_os_error())
    } else {
        dev.raw_ioctl(IOC_GET_EVENT, p as usize)
    };
    // SAFETY: Mapped above, referenced nowhere else.
    unsafe { libc::munmap(p, page) };
    r
}

/// The two disconnects the first scenarios do not make: the module ends a
/// connection it accepted, and librdmacm ends one the module made.
pub(super) fn disconnect_either_side(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    // The module accepted; the module disconnects.
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    listen(&dev, addr, 4, 0)?;
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={addr} data=00 disc=peer"),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    dev.accept(req.new_id, None)?;
    wait(&dev, EventType::Established)?;
    dev.disconnect(req.new_id)?;
    let d = wait(&dev, EventType::Disconnected)?;
    ensure!(d.id == req.new_id, "DISCONNECTED on id {}", d.id);
    let r = call.result()?;
    ensure!(field(&r, "disc")? == "DISCONNECTED", "peer: {r:?}");
    dev.destroy(req.new_id)?;
    // The module connected; librdmacm disconnects.
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(
        &ctx.agent,
        &format!("serve addr={addr} count=1 accept=- echo=1 disc=self"),
    )?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(b"x"))?;
    wait(&dev, EventType::Established)?;
    // One message first, so that the peer disconnects only now; not waited
    // for (see `echo_then_peer_disconnects`): the echo says it arrived.
    dev.send_nowait(id, b"bye")?;
    verify("module: echo", b"bye", &dev.recv(id, 4096, T)?)?;
    let d = wait(&dev, EventType::Disconnected)?;
    ensure!(d.id == id, "DISCONNECTED on id {}", d.id);
    // Completes the handshake (the DREP).
    dev.disconnect(id)?;
    let r = call.result()?;
    ensure!(field(&r, "disc0")? == "DISCONNECTED", "peer: {r:?}");
    Ok(())
}

/// AFONLY on an IPv6 wildcard listener: an IPv4 connection finds no
/// listener; without it, the same listener takes IPv4 connections.
pub(super) fn afonly_refuses_ipv4(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    for afonly in [1u64, 0] {
        let port = ctx.port();
        let l = dev.create_id(0)?;
        dev.set_option(l, rdma_cm_rs_option_RDMA_CM_RS_OPT_AFONLY, afonly)?;
        dev.bind(l, &SocketAddr::new("::".parse()?, port))?;
        dev.listen(l, 4)?;
        let v4 = SocketAddr::new(ctx.local4, port);
        let call = Call::start(&ctx.agent, &format!("connect addr={v4} data=0a"))?;
        // siw listens on a wildcard IPv6 address by listening on each IPv6
        // address of its netdev (siw_create_listen): no IPv4 connection
        // reaches such a listener, whatever AFONLY says.
        if afonly == 1 || ctx.iwarp() {
            let r = call.result()?;
            ensure!(
                ctx.refused(field(&r, "event")?),
                "AFONLY={afonly}: IPv4 connect: {r:?}"
            );
            expect_errno(
                &format!("AFONLY={afonly}: no request"),
                dev.get_event(0),
                libc::EAGAIN,
            )?;
        } else {
            let req = wait(&dev, EventType::ConnectRequest).context("AFONLY=0: IPv4 connect")?;
            ensure!(req.id == l, "request on id {}", req.id);
            dev.reject(req.new_id, 0, b"dual")?;
            let r = call.result()?;
            ensure!(field(&r, "event")? == "REJECTED", "AFONLY=0: peer: {r:?}");
            verify_padded(
                "AFONLY=0: reject data",
                b"dual",
                &unhex(field(&r, "pdata")?)?,
                148,
            )?;
        }
        dev.destroy(l)?;
    }
    Ok(())
}

pub(super) fn close_destroys_everything(ctx: &mut Ctx) -> Result<()> {
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    {
        let dev = Device::open()?;
        listen(&dev, addr, 4, 0)?;
        let call = Call::start(
            &ctx.agent,
            &format!("connect addr={addr} data=00 disc=peer"),
        )?;
        let req = wait(&dev, EventType::ConnectRequest)?;
        dev.accept(req.new_id, None)?;
        wait(&dev, EventType::Established)?;
        // And a connection of its own to a librdmacm listener.
        let peer_addr = SocketAddr::new(ctx.peer4, ctx.port());
        let mut server = Call::start(
            &ctx.agent,
            &format!("serve addr={peer_addr} count=1 accept=-"),
        )?;
        server.ready()?;
        let id = resolve(&dev, peer_addr)?;
        dev.connect(id, &Param::with_data(b"x"))?;
        wait(&dev, EventType::Established)?;
        drop(dev);
        // Closing the file disconnected both peers.
        let r = call.result()?;
        ensure!(
            field(&r, "disc")? == "DISCONNECTED",
            "passive side's peer: {r:?}"
        );
        let r = server.result()?;
        ensure!(
            field(&r, "disc0")? == "DISCONNECTED",
            "active side's peer: {r:?}"
        );
    }
    // The port is free again.
    let dev = Device::open()?;
    listen(&dev, addr, 4, 0).context("listening again after close")?;
    Ok(())
}

/// A UD id (RDMA_PS_UDP) has the datagram path only: SEND, RECV, MR_REG
/// and RDMA are refused with EOPNOTSUPP, before CONNECT and after it made
/// the UD QP; UD_SEND before CONNECT has no QP to send on (ENOTCONN).  An
/// RC id refuses UD_SEND and UD_RECV with EOPNOTSUPP.
pub(super) fn ud_id_has_no_rc_data_path(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    // Nobody listens there: what the lookup answers does not matter.
    let dst = SocketAddr::new(ctx.peer4, ctx.port());
    let id = resolve_ps(&dev, dst, RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD)?;
    rc_data_path_refused(&dev, id, "before CONNECT")?;
    expect_errno(
        "UD_SEND before CONNECT",
        dev.ud_send(id, 1, b"x", None),
        libc::ENOTCONN,
    )?;
    dev.connect(id, &Param::with_data(&pattern(180, 11)))
        .context("UD connect with 180 bytes (the SIDR REQ's limit)")?;
    ensure!(
        dev.query(id)?.qp_num != 0,
        "no UD QP after CONNECT: {:?}",
        dev.query(id)?
    );
    // The lookup's outcome (UNREACHABLE, ...) or nothing at all: drained,
    // whichever.
    let _ = dev.get_event(5000);
    rc_data_path_refused(&dev, id, "after CONNECT")?;
    dev.destroy(id)?;

    let rc = resolve(&dev, dst)?;
    expect_errno(
        "UD_SEND on an RC id",
        dev.ud_send(rc, 1, b"x", None),
        libc::EOPNOTSUPP,
    )?;
    expect_errno(
        "UD_RECV on an RC id",
        dev.ud_recv(rc, 4096, 0),
        libc::EOPNOTSUPP,
    )?;
    dev.destroy(rc)?;
    Ok(())
}

/// SEND, RECV, MR_REG and RDMA on UD id `id` fail with EOPNOTSUPP.
pub(super) fn rc_data_path_refused(dev: &Device, id: u32, when: &str) -> Result<()> {
    expect_errno(
        &format!("SEND on a UD id {when}"),
        dev.send(id, b"x"),
        libc::EOPNOTSUPP,
    )?;
    expect_errno(
        &format!("RECV on a UD id {when}"),
        dev.recv(id, 4096, 0),
        libc::EOPNOTSUPP,
    )?;
    expect_errno(
        &format!("MR_REG on a UD id {when}"),
        dev.mr_reg(id, 4096, REMOTE_RW),
        libc::EOPNOTSUPP,
    )?;
    expect_errno(
        &format!("RDMA on a UD id {when}"),
        dev.rdma(id, RDMA_CM_RS_RDMA_READ, 1, 0, 16, 0x1000, 1),
        libc::EOPNOTSUPP,
    )
}

/// A CONNECT the CM refuses (the route is not resolved yet) leaves nothing
/// behind: once the route is resolved, the same id connects and carries
/// messages.
pub(super) fn failed_connect_leaves_id_usable(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let (req_data, acc_data) = (pattern(56, 12), pattern(196, 13));
    let mut call = Call::start(
        &ctx.agent,
        &format!(
            "serve addr={addr} count=1 accept={} echo=1 disc=self",
            hex(&acc_data)
        ),
    )?;
    call.ready()?;
    let id = dev.create_id(1)?;
    dev.resolve_addr(id, &addr, 2000).context("resolve_addr")?;
    wait(&dev, EventType::AddrResolved)?;
    expect_errno(
        "connect before the route is resolved",
        dev.connect(id, &Param::with_data(&req_data)),
        libc::EINVAL,
    )?;
    dev.resolve_route(id, 2000).context("resolve_route")?;
    wait(&dev, EventType::RouteResolved)?;
    dev.connect(id, &Param::with_data(&req_data))
        .context("connect after a failed connect")?;
    let est = wait(&dev, EventType::Established)?;
    ensure!(est.id == id, "ESTABLISHED on id {}", est.id);
    verify(
        "module: ESTABLISHED private data",
        &acc_data,
        &est.private_data,
    )?;
    // A CONNECT on the connected id is refused and leaves its QP alone (the
    // failed attempt's cleanup used to destroy the live QP: the echo below
    // then never came back).
    let qp_num = dev.query(id)?.qp_num;
    expect_errno(
        "a second connect on a connected id",
        dev.connect(id, &Param::with_data(&req_data)),
        libc::EBUSY,
    )?;
    ensure!(
        dev.query(id)?.qp_num == qp_num,
        "the QP changed after a refused second connect"
    );
    echo_then_peer_disconnects(
        &dev,
        id,
        call,
        &req_data,
        b"connected at the second attempt",
    )
}

/// Polls `cond` every `every_ms` (0: as fast as it goes) until it holds or
/// `ms` ran out; `Ok(false)` then.
pub(super) fn poll_until(
    ms: u64,
    every_ms: u64,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<bool> {
    let deadline = Instant::now() + Duration::from_millis(ms);
    loop {
        if cond()? {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        if every_ms == 0 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(every_ms));
        }
    }
}

/// Fails if an event is queued, or comes within `ms`.
pub(super) fn no_event(dev: &Device, ms: u32, what: &str) -> Result<()> {
    match dev.get_event(ms) {
        Ok(ev) => bail!("{what}: {}", ev.line("module")),
        Err(e) if [libc::ETIMEDOUT, libc::EAGAIN].contains(&e.raw_os_error().unwrap_or(0)) => {
            Ok(())
        }
        Err(e) => Err(e).context(what.to_string()),
    }
}

/// DESTROY_ID of a listener with connection requests queued and never
/// fetched, while more requests arrive: its queued events go with it and
/// nothing names it after DESTROY_ID returned (nor the new ids of requests
/// that were on their way: the file has no other id, so no event at all);
/// every peer is refused; its handle is not given to a new id.
///
/// A request whose handler runs while the listener is being destroyed is
/// what can slip through, so each round aims the destruction into a burst
/// of requests; it hits such a handler in some rounds, not in all.
pub(super) fn destroy_listener_pending(ctx: &mut Ctx) -> Result<()> {
    const ROUNDS: u32 = 6;
    for round in 0..ROUNDS {
        destroy_listener_round(ctx, round).with_context(|| format!("round {round}"))?;
    }
    Ok(())
}

/// One round of [`destroy_listener_pending`], with a file of its own: once
/// `QUEUED` requests hold backlog slots, two agent threads send `BURST`
/// requests each, back to back, and the listener is destroyed as soon as
/// the second of them has its id, while the CM hands it the others (the
/// backlog has room for all).
pub(super) fn destroy_listener_round(ctx: &mut Ctx, round: u32) -> Result<()> {
    const QUEUED: u32 = 3;
    const BURSTS: u32 = 2;
    const BURST: u32 = 6;
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = listen(&dev, addr, QUEUED + BURSTS * BURST, 40 + u64::from(round))?;
    // Resolved, with their QPs, before anything is sent.
    let mut bursts = Vec::new();
    for b in 0..BURSTS {
        let mut burst = Call::start(
            &ctx.agent,
            &format!("burst addr={addr} count={BURST} data={:02x}", 0x80 + b),
        )?;
        burst.ready()?;
        bursts.push(burst);
    }
    let mut calls = Vec::new();
    for n in 0..QUEUED {
        calls.push(Call::start(
            &ctx.agent,
            &format!("connect addr={addr} data={n:02x} disc=none"),
        )?);
    }
    let backlog = || -> Result<u32> { Ok(dev.query(l)?.backlog) };
    ensure!(
        poll_until(T.into(), 10, || Ok(backlog()? >= QUEUED))?,
        "{} of {QUEUED} requests arrived",
        backlog()?
    );
    // The handle the burst's second request gets: handles count up.  (Were
    // they given otherwise, the wait below would just run out.)
    let second = (l + 1..l + 64)
        .find(|&h| errno_of(dev.query(h)) == Some(libc::ENOENT))
        .map_or(0, |h| h + 1);
    for burst in &mut bursts {
        burst.send("go")?;
    }
    // Once QUERY finds that id, its request was handed to the listener;
    // the other requests follow right behind.
    poll_until(3000, 0, || {
        Ok(errno_of(dev.query(second)) != Some(libc::ENOENT))
    })?;
    dev.destroy(l).context("destroy the listener")?;
    expect_errno(
        "QUERY of the destroyed listener",
        dev.query(l),
        libc::ENOENT,
    )?;
    expect_errno(
        "DESTROY_ID of the destroyed listener",
        dev.destroy(l),
        libc::ENOENT,
    )?;
    no_event(
        &dev,
        0,
        &format!("event after the listener {l} was destroyed"),
    )?;
    let fresh = [dev.create_id(0)?, dev.create_id(0)?, dev.create_id(0)?];
    ensure!(
        !fresh.contains(&l) && !fresh.contains(&0),
        "new ids {fresh:?}, destroyed listener {l}"
    );
    ensure!(
        fresh[0] != fresh[1] && fresh[1] != fresh[2] && fresh[0] != fresh[2],
        "new ids {fresh:?}"
    );
    // Every peer was refused: by the requests destroyed with their
    // listener, or by the CM when they found none.
    for (i, call) in calls.into_iter().enumerate() {
        let r = call.result().with_context(|| format!("peer {i}"))?;
        ensure!(ctx.refused(field(&r, "event")?), "peer {i}: {r:?}");
    }
    for (i, burst) in bursts.into_iter().enumerate() {
        let r = burst.result().with_context(|| format!("burst {i}"))?;
        let events: Vec<_> = field(&r, "events")?.split(',').collect();
        ensure!(
            events.len() == BURST as usize && events.iter().all(|e| ctx.refused(e)),
            "burst {i}: {r:?}"
        );
    }
    // Nothing came meanwhile, neither for the listener nor for the ids.
    no_event(&dev, 0, "event after the peers were refused")?;
    Ok(())
}

/// The access rules of `ioctl-abi.rst` ("Who may use the device"), each
/// tried from a process of its own through `ctl access`: opening takes
/// `CAP_NET_ADMIN` in the initial user namespace, checked by the module
/// whatever the node's mode; an open file keeps working in the hands of a
/// less privileged process.
pub(super) fn access_control(_ctx: &mut Ctx) -> Result<()> {
    const NODE: &str = "/dev/rdma_cm_rs";
    const NOBODY: &[&str] = &["--reuid", "65534", "--regid", "65534", "--clear-groups"];
    // A copy any user may run: the checkout's path may be closed to nobody.
    let exe = "/tmp/rdma-cm-rs-access-probe";
    std::fs::copy(std::env::current_exe()?, exe).context("copy the tool to /tmp")?;
    std::fs::set_permissions(exe, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let probe = |wrapper: &[&str], fd: Option<&str>| -> Result<(String, String)> {
        let mut argv: Vec<String> = wrapper.iter().map(|s| s.to_string()).collect();
        argv.extend([exe, "ctl", "access"].map(String::from));
        if let Some(fd) = fd {
            argv.extend(["--fd".to_string(), fd.to_string()]);
        }
        let cmd = match fd {
            // The shell opens the node as root; the wrapper inherits it.
            Some(fd) => format!("exec {fd}<>{NODE}; exec {}", argv.join(" ")),
            None => format!("exec {}", argv.join(" ")),
        };
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(key))
                .unwrap_or("-")
                .trim()
                .to_string()
        };
        ensure!(
            out.status.success(),
            "{cmd}: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((line("open:"), line("ioctl:")))
    };
    let expect = |what: &str, got: (String, String), open: &str, ioctl: &str| -> Result<()> {
        ensure!(
            got.0 == open && got.1 == ioctl,
            "{what}: open {} ioctl {}, expected open {open} ioctl {ioctl}",
            got.0,
            got.1
        );
        Ok(())
    };
    let with_mode = |mode: u32| {
        std::fs::set_permissions(NODE, std::os::unix::fs::PermissionsExt::from_mode(mode))
    };
    let setpriv = |extra: &[&'static str]| [&["setpriv"], extra].concat();

    expect("root", probe(&[], None)?, "ok", "ok")?;
    expect(
        "nobody, node 0600",
        probe(&setpriv(NOBODY), None)?,
        "EACCES",
        "-",
    )?;
    // The module's own check, with the file permissions out of the way.
    with_mode(0o666)?;
    let opened = probe(&setpriv(NOBODY), None);
    with_mode(0o600)?;
    expect("nobody, node 0666", opened?, "EPERM", "-")?;
    expect(
        "root without CAP_NET_ADMIN",
        probe(&setpriv(&["--bounding-set", "-net_admin"]), None)?,
        "EPERM",
        "-",
    )?;
    expect(
        "root of a user namespace (unshare -Ur)",
        probe(&["unshare", "-Ur"], None)?,
        "EPERM",
        "-",
    )?;
    expect(
        "root of a user and network namespace (unshare -Urn)",
        probe(&["unshare", "-Urn"], None)?,
        "EPERM",
        "-",
    )?;
    // Delegation: a file root opened, used by nobody.
    expect(
        "nobody with a file root opened",
        probe(&setpriv(NOBODY), Some("3"))?,
        "ok",
        "ok",
    )?;
    std::fs::remove_file(exe)?;
    Ok(())
}
