// SPDX-License-Identifier: GPL-2.0
//! Fault scenarios run in the test VM (`tools/fault-test.sh`,
//! `tools/removal-test.sh`), each printing flat KTAP lines:
//!
//! * `ctl device-removal`: `rdma link delete` under a hundred established
//!   connections with events and messages nobody has read yet;
//! * `ctl peer-vm-killed`: the peer machine (two VMs) killed by the host
//!   while it sends to the module;
//! * `ctl fail-nth`: an allocation (or user copy) failure injected at each
//!   site, in turn, of create, listen, connect, accept, send and MR_REG,
//!   through `/proc/thread-self/fail-nth`.
//!
//! `fail-nth` counts the module's RDMA resources (`rdma res show`) before
//! and after: what the module made must be gone once its ids are.

use crate::report::*;
use crate::uapi::{self, Device, Param};
use crate::{module_expect, rdma_cmd, say};
use anyhow::{bail, ensure, Context, Result};
use std::{
    collections::BTreeMap,
    fs,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// The module's objects per kind, from the kernel's resource tracking
/// (kernel-owned objects are listed with the module's name as `comm`).
pub fn module_resources() -> Result<BTreeMap<&'static str, usize>> {
    let mut counts = BTreeMap::new();
    for kind in ["cm_id", "qp", "cq", "pd", "mr"] {
        let out = rdma_cmd(&["res", "show", kind])?;
        counts.insert(
            kind,
            out.lines().filter(|l| l.contains("[rdma_cm_rs]")).count(),
        );
    }
    Ok(counts)
}

/// Waits (bounded) until the module's resources are back at `base`: ids
/// are destroyed from a workqueue, a little after the ioctl returned.
pub fn expect_resources(base: &BTreeMap<&'static str, usize>, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = module_resources()?;
        if &now == base {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{what}: the module's resources are {now:?}, {base:?} before"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Reads events of `dev` until one of `kind` arrived for each of `count`
/// ids (other events are kept in `others`), within `limit`.
fn collect(
    dev: &Device,
    kind: EventType,
    count: usize,
    limit: Duration,
    others: &mut usize,
) -> Result<Vec<uapi::Event>> {
    let deadline = Instant::now() + limit;
    let mut got = Vec::new();
    while got.len() < count {
        ensure!(
            Instant::now() < deadline,
            "{} of {count} {} events in {limit:?}",
            got.len(),
            kind.name()
        );
        let e = match dev.get_event(1000) {
            Ok(e) => e,
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => continue,
            Err(e) => return Err(e).context("GET_EVENT"),
        };
        if e.event == kind {
            got.push(e);
        } else {
            *others += 1;
        }
    }
    Ok(got)
}

/// Device removal with the module's ids, QPs, CQs, PDs and regions on the
/// device: one connection with two regions and a completed RDMA WRITE, UD
/// ids (a listener, a SIDR pair with peers, datagrams unread), then
/// `connections` more, established but with their ESTABLISHED events unread
/// on the passive side and a message each not received.  `rdma link
/// delete` must complete within `bound`, every id must get DEVICE_REMOVAL
/// and be gone, and the device must serve again once re-added.  Run it in a process that never
/// opened librdmacm: rxe cannot take a device from under open user
/// contexts.
pub fn device_removal(addr: SocketAddr, connections: usize, bound: Duration) -> Result<()> {
    let server = Device::open()?;
    let client = Device::open()?;
    let listener = server.create_id(1)?;
    server.bind(listener, &addr).context("bind")?;
    server
        .listen(listener, (connections + 8) as u32)
        .context("listen")?;
    let conn = client.create_id(2)?;
    client
        .resolve_addr(conn, &addr, 2000)
        .context("resolve_addr")?;
    module_expect(&client, EventType::AddrResolved)?;
    client.resolve_route(conn, 2000).context("resolve_route")?;
    module_expect(&client, EventType::RouteResolved)?;
    client.connect(conn, &Param::with_data(b"removal"))?;
    let accepted = module_expect(&server, EventType::ConnectRequest)?.new_id;
    server.accept(accepted, None)?;
    module_expect(&server, EventType::Established)?;
    module_expect(&client, EventType::Established)?;
    // Every kind of device resource exists: QPs, CQs, PDs, regions, and a
    // completed RDMA WRITE proves the data path.
    let (sink, saddr, skey) =
        server.mr_reg(accepted, 4096, uapi::RDMA_CM_RS_ACCESS_REMOTE_WRITE)?;
    let (source, _, _) = client.mr_reg(conn, 4096, 0)?;
    client.mr_write(conn, source, 0, b"before removal")?;
    client.rdma(
        conn,
        uapi::RDMA_CM_RS_RDMA_WRITE,
        source,
        0,
        14,
        saddr,
        skey,
    )?;
    ensure!(server.mr_read(accepted, sink, 0, 14)? == b"before removal");

    // UD ids on the device as well: a UD listener, a SIDR client with its
    // peer (an address handle), the accepted id with a peer made from the
    // one datagram it read, and datagrams it never read.
    let ud_addr = SocketAddr::new(addr.ip(), addr.port() + 1);
    let (ps_udp, qpt_ud) = (uapi::RDMA_CM_RS_PS_UDP, uapi::RDMA_CM_RS_QPT_UD);
    let ud_listener = server.create_id_ps(4, ps_udp, qpt_ud)?;
    server.bind(ud_listener, &ud_addr).context("bind UD")?;
    server.listen(ud_listener, 4).context("listen UD")?;
    let ud_client = client.create_id_ps(5, ps_udp, qpt_ud)?;
    client.resolve_addr(ud_client, &ud_addr, 2000)?;
    module_expect(&client, EventType::AddrResolved)?;
    client.resolve_route(ud_client, 2000)?;
    module_expect(&client, EventType::RouteResolved)?;
    client.connect(ud_client, &Param::with_data(b"ud removal"))?;
    let ud_accepted = module_expect(&server, EventType::ConnectRequest)?.new_id;
    server.accept(ud_accepted, None)?;
    let ud_peer = module_expect(&client, EventType::Established)?.ud_peer;
    ensure!(ud_peer != 0, "the SIDR reply gave no peer");
    for n in 0..4u32 {
        client.ud_send(ud_client, ud_peer, b"datagram before removal", Some(n))?;
    }
    let first = server.ud_recv(ud_accepted, 64, 5000).context("UD_RECV")?;
    ensure!(first.peer != 0 && first.data == b"datagram before removal");

    // The crowd, every step pipelined over all its ids.
    let setup = Instant::now();
    let mut unrelated = 0;
    let mut clients = Vec::new();
    for i in 0..connections {
        let id = client.create_id(1000 + i as u64)?;
        client.resolve_addr(id, &addr, 5000)?;
        clients.push(id);
    }
    let step = Duration::from_secs(60);
    collect(
        &client,
        EventType::AddrResolved,
        connections,
        step,
        &mut unrelated,
    )?;
    for &id in &clients {
        client.resolve_route(id, 5000)?;
    }
    collect(
        &client,
        EventType::RouteResolved,
        connections,
        step,
        &mut unrelated,
    )?;
    for &id in &clients {
        client.connect(id, &Param::with_data(b"crowd"))?;
    }
    let mut servers = Vec::new();
    // An early connection may be established before the last request is
    // read: its ESTABLISHED is then read here, not left pending.
    let mut established_read = 0;
    let deadline = Instant::now() + step;
    while servers.len() < connections {
        ensure!(
            Instant::now() < deadline,
            "{} of {connections} requests",
            servers.len()
        );
        match server.get_event(1000) {
            Ok(e) if e.event == EventType::ConnectRequest => {
                server.accept(e.new_id, None)?;
                servers.push(e.new_id);
            }
            Ok(e) if e.event == EventType::Established && servers.contains(&e.id) => {
                established_read += 1;
            }
            Ok(e) => bail!("server: unexpected {}", e.line("module")),
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => {}
            Err(e) => return Err(e).context("GET_EVENT"),
        }
    }
    collect(
        &client,
        EventType::Established,
        connections,
        step,
        &mut unrelated,
    )?;
    ensure!(
        unrelated == 0,
        "{unrelated} unexpected events on the client"
    );
    for &id in &clients {
        client.send(id, b"never received")?;
    }
    let pending = connections;
    say(&format!(
        "module: {} connections established in {} ms; {} ESTABLISHED events and {pending} messages not read on the passive side",
        connections + 1,
        setup.elapsed().as_millis(),
        connections - established_read
    ));
    let during = module_resources()?;

    let device = uapi::device_name(&client.query(conn)?);
    let link = rdma_cmd(&["link", "show", &format!("{device}/1")])?;
    let netdev = link
        .split_whitespace()
        .skip_while(|w| *w != "netdev")
        .nth(1)
        .context("no netdev in `rdma link show`")?
        .to_string();
    let mut server_ids = vec![listener, accepted, ud_listener, ud_accepted];
    server_ids.extend(&servers);
    let mut client_ids = vec![conn, ud_client];
    client_ids.extend(&clients);
    // Both files are read while the removal runs, as a consumer would:
    // when the events arrive tells where the time goes.
    let start = Instant::now();
    let reader = |dev: &'static str, file: &Device, count: usize| {
        let mut others = 0;
        let events = collect(
            file,
            EventType::DeviceRemoval,
            count,
            Duration::from_secs(30),
            &mut others,
        )
        .with_context(|| format!("{dev} file"))?;
        Ok::<_, anyhow::Error>((events.len(), others, start.elapsed()))
    };
    let (deleted, server_seen, client_seen) = std::thread::scope(|s| {
        let server_reader = s.spawn(|| reader("server", &server, server_ids.len()));
        let client_reader = s.spawn(|| reader("client", &client, client_ids.len()));
        let deleted = rdma_cmd(&["link", "delete", &device]).map(|_| start.elapsed());
        let join = |h: std::thread::ScopedJoinHandle<'_, Result<(usize, usize, Duration)>>| {
            h.join().map_err(|_| anyhow::anyhow!("reader panicked"))?
        };
        let server_seen = join(server_reader);
        let client_seen = join(client_reader);
        Ok::<_, anyhow::Error>((deleted?, server_seen?, client_seen?))
    })?;
    let removals = server_seen.0 + client_seen.0;
    let others = server_seen.1 + client_seen.1;
    say(&format!(
        "module: rdma link delete returned after {} ms; the last DEVICE_REMOVAL read after {} ms (server file) and {} ms (client file)",
        deleted.as_millis(),
        server_seen.2.as_millis(),
        client_seen.2.as_millis()
    ));
    // Unregistration is queued: the device must actually go.
    while rdma_cmd(&["link", "show", &format!("{device}/1")]).is_ok() {
        ensure!(
            start.elapsed() < bound + Duration::from_secs(30),
            "{device} still there after {} s",
            (bound + Duration::from_secs(30)).as_secs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = start.elapsed();
    for (dev, ids) in [(&server, &server_ids), (&client, &client_ids)] {
        for &id in ids {
            match dev.query(id) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                other => bail!("id {id} after DEVICE_REMOVAL: {other:?}"),
            }
        }
    }
    let ids = server_ids.len() + client_ids.len();
    ensure!(
        removals == ids,
        "{removals} DEVICE_REMOVAL events for {ids} ids"
    );
    say(&format!(
        "module: {device} removed in {} ms with {} connections, a UD listener and a SIDR pair with peers and unread datagrams, {ids} ids and 2 regions on it ({during:?}); {removals} DEVICE_REMOVAL events, one per id, and {others} pending events before them",
        took.as_millis(),
        connections + 1
    ));
    drop(server);
    drop(client);
    // Back before judging the time: what runs after this test needs the
    // device whatever the verdict.
    rdma_cmd(&["link", "add", &device, "type", "rxe", "netdev", &netdev])?;
    ensure!(
        took < bound,
        "removal took {} ms, over the bound of {} ms",
        took.as_millis(),
        bound.as_millis()
    );
    // Back in service once an id binds to the address again.
    let probe = Device::open()?;
    let id = probe.create_id(3)?;
    let bind_to = SocketAddr::new(addr.ip(), 0);
    while probe.bind(id, &bind_to).is_err() {
        ensure!(
            start.elapsed() < Duration::from_secs(60),
            "{device} not usable again after re-adding it on {netdev}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    say(&format!("module: {device} added back on {netdev}"));
    Ok(())
}

// ---------------------------------------------------------------------------
// fail-nth

/// The fault-injection knobs: `fail-nth` alone decides (probability 0),
/// sleeping allocations and order 0 pages included, no report in dmesg.
fn enable_fault_injection(verbose: bool) -> Result<()> {
    // Verbose: the kernel logs each injected failure (no stack: that is 2).
    let v = if verbose { "1" } else { "0" };
    let knobs = [
        ("failslab/ignore-gfp-wait", "N"),
        ("failslab/verbose", v),
        ("fail_page_alloc/ignore-gfp-wait", "N"),
        ("fail_page_alloc/ignore-gfp-highmem", "N"),
        ("fail_page_alloc/min-order", "0"),
        ("fail_page_alloc/verbose", v),
        ("fail_usercopy/verbose", v),
    ];
    for (knob, value) in knobs {
        let path = format!("/sys/kernel/debug/{knob}");
        fs::write(&path, value).with_context(|| format!("write {value} to {path}"))?;
    }
    Ok(())
}

/// `/proc/thread-self/fail-nth`, opened once: opening it between setting
/// and reading it would pass fault points of its own.  Reading and writing
/// the open file passes none.
struct FailNth(fs::File);

impl FailNth {
    fn open() -> Result<Self> {
        Ok(Self(
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/proc/thread-self/fail-nth")
                .context("open /proc/thread-self/fail-nth")?,
        ))
    }

    /// The calling thread's `n`th fault point fails (0: none).  Writing
    /// copies from user space, a fault point: when switching off a count
    /// that has come down to 1, that copy is the failure (`EFAULT`), which
    /// leaves the count at 0 all the same.
    fn set(&self, n: usize) -> Result<()> {
        use std::os::unix::fs::FileExt;
        match self.0.write_at(n.to_string().as_bytes(), 0) {
            Err(e) if n == 0 && e.raw_os_error() == Some(libc::EFAULT) => Ok(()),
            r => r.map(drop).context("write fail-nth"),
        }
    }

    /// Whether the failure set up by [`FailNth::set`] was injected (the
    /// file reads 0 then); switches injection off either way.  The read's
    /// copy to user space is a fault point itself (`fail_usercopy`): if it
    /// is the one that fails (`EFAULT`), the call before passed fewer
    /// points, and nothing was injected into it.
    fn injected(&self) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 32];
        let read = self.0.read_at(&mut buf, 0);
        self.set(0)?;
        match read {
            Ok(n) => Ok(std::str::from_utf8(&buf[..n])?.trim() == "0"),
            Err(e) if e.raw_os_error() == Some(libc::EFAULT) => Ok(false),
            Err(e) => Err(e).context("read fail-nth"),
        }
    }
}

/// The operations faults are injected into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Op {
    Open,
    CreateId,
    Listen,
    Connect,
    Accept,
    Send,
    MrReg,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::Open,
        Op::CreateId,
        Op::Listen,
        Op::Connect,
        Op::Accept,
        Op::Send,
        Op::MrReg,
    ];
}

/// An established connection from a file of its own to the listener's
/// file (which holds the passive id).
struct Pair {
    client: Device,
    passive: u32,
    active: u32,
}

/// A listener on `addr` in a file of its own.
fn listener(addr: SocketAddr) -> Result<(Device, u32)> {
    let dev = Device::open()?;
    let id = dev.create_id(1)?;
    dev.bind(id, &addr).context("bind")?;
    dev.listen(id, 64).context("listen")?;
    Ok((dev, id))
}

/// An id of `dev` resolved to `addr`, ready to connect.
fn resolved(dev: &Device, addr: SocketAddr) -> Result<u32> {
    let id = dev.create_id(2)?;
    dev.resolve_addr(id, &addr, 2000)?;
    expect_event(dev, EventType::AddrResolved)?;
    dev.resolve_route(id, 2000)?;
    expect_event(dev, EventType::RouteResolved)?;
    Ok(id)
}

fn expect_event(dev: &Device, kind: EventType) -> Result<uapi::Event> {
    let e = dev
        .get_event(5000)
        .with_context(|| format!("waiting for {}", kind.name()))?;
    ensure!(
        e.event == kind,
        "expected {}, got {}",
        kind.name(),
        e.line("module")
    );
    Ok(e)
}

fn pair(listen: &(Device, u32), addr: SocketAddr) -> Result<Pair> {
    let client = Device::open()?;
    let active = resolved(&client, addr)?;
    client.connect(active, &Param::with_data(b"pair"))?;
    let passive = expect_event(&listen.0, EventType::ConnectRequest)?.new_id;
    listen.0.accept(passive, None)?;
    expect_event(&listen.0, EventType::Established)?;
    expect_event(&client, EventType::Established)?;
    Ok(Pair {
        client,
        passive,
        active,
    })
}

/// Destroys every id the listener's file got from requests (after a
/// connect that went through), leaving the listener.
fn drain_requests(listen: &(Device, u32)) -> Result<()> {
    loop {
        match listen.0.get_event(300) {
            Ok(e) if e.event == EventType::ConnectRequest => {
                let _ = listen.0.destroy(e.new_id);
            }
            Ok(e) if e.id != listen.1 && e.id != 0 => {
                let _ = listen.0.destroy(e.id);
            }
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ETIMEDOUT) => return Ok(()),
            Err(e) => return Err(e).context("GET_EVENT"),
        }
    }
}

/// One injection round of `op`: sets the state up, fails the `n`th fault
/// point of the call, checks what is left usable, tears it down.  Returns
/// whether a fault was injected and the call's result.
fn one_round(
    fail: &FailNth,
    op: Op,
    n: usize,
    addr: SocketAddr,
) -> Result<(bool, std::result::Result<(), i32>)> {
    let errno = |r: uapi::Result<()>| r.map_err(|e| e.raw_os_error().unwrap_or(-1));
    // A listener of the round's own: nothing of an earlier round (a late
    // REJECTED, a request) reaches this one.
    let listen = &match op {
        Op::Connect | Op::Accept | Op::Send | Op::MrReg => Some(listener(addr)?),
        _ => None,
    };
    let listen = || listen.as_ref().context("no listener");
    match op {
        Op::Open => {
            fail.set(n)?;
            let r = Device::open();
            let injected = fail.injected()?;
            if let Ok(dev) = &r {
                let id = dev.create_id(1)?;
                dev.destroy(id)?;
            }
            Ok((injected, errno(r.map(drop))))
        }
        Op::CreateId => {
            let dev = Device::open()?;
            fail.set(n)?;
            let r = dev.create_id(7);
            let injected = fail.injected()?;
            match r {
                Ok(id) => dev.destroy(id)?,
                // The file still works.
                Err(_) => {
                    let id = dev.create_id(8)?;
                    dev.destroy(id)?;
                }
            }
            Ok((injected, errno(r.map(drop))))
        }
        Op::Listen => {
            let dev = Device::open()?;
            let id = dev.create_id(1)?;
            let port = addr.port() + 1;
            dev.bind(id, &SocketAddr::new(addr.ip(), port))?;
            fail.set(n)?;
            let r = dev.listen(id, 8);
            let injected = fail.injected()?;
            if r.is_err() {
                // A failed listen leaves the id as it was: it listens now.
                dev.listen(id, 8).context("listen again after a failure")?;
            }
            dev.destroy(id)?;
            Ok((injected, errno(r)))
        }
        Op::Connect => {
            let dev = Device::open()?;
            let id = resolved(&dev, addr)?;
            fail.set(n)?;
            let r = dev.connect(id, &Param::with_data(b"fail-nth"));
            let injected = fail.injected()?;
            if r.is_ok() {
                // The request went out: the listener refuses it, and the
                // id learns that.
                let request = expect_event(&listen()?.0, EventType::ConnectRequest)?.new_id;
                listen()?.0.reject(request, 0, b"")?;
                expect_event(&dev, EventType::Rejected)?;
            }
            dev.destroy(id)?;
            drain_requests(listen()?)?;
            Ok((injected, errno(r)))
        }
        Op::Accept => {
            let dev = Device::open()?;
            let id = resolved(&dev, addr)?;
            dev.connect(id, &Param::with_data(b"fail-nth"))?;
            let request = expect_event(&listen()?.0, EventType::ConnectRequest)?.new_id;
            fail.set(n)?;
            let r = listen()?.0.accept(request, None);
            let injected = fail.injected()?;
            if r.is_ok() {
                expect_event(&dev, EventType::Established)?;
            } else {
                // The request is refused: by the CM itself if the failure
                // came after it took the request on (rdma_accept rejects
                // then, and a second reject is EINVAL), else by us.
                match listen()?.0.reject(request, 0, b"") {
                    Err(e) if e.raw_os_error() != Some(libc::EINVAL) => {
                        return Err(e).context("reject after a failed accept")
                    }
                    _ => {}
                }
                let e = dev.get_event(5000)?;
                ensure!(
                    e.event == EventType::Rejected,
                    "after a failed accept and a reject: {}",
                    e.line("module")
                );
            }
            listen()?.0.destroy(request)?;
            dev.destroy(id)?;
            drain_requests(listen()?)?;
            Ok((injected, errno(r)))
        }
        Op::Send | Op::MrReg => {
            let p = pair(listen()?, addr)?;
            let (injected, r) = if let Op::Send = op {
                fail.set(n)?;
                let r = p.client.send(p.active, b"fail-nth");
                let injected = fail.injected()?;
                // The connection still carries messages.
                p.client
                    .send(p.active, b"after")
                    .context("send after the injected failure")?;
                let mut got = Vec::new();
                let want = if r.is_ok() { 2 } else { 1 };
                while got.len() < want {
                    got.push(listen()?.0.recv(p.passive, 4096, 5000)?);
                }
                ensure!(
                    got.last().map(Vec::as_slice) == Some(&b"after"[..]),
                    "received {got:?}"
                );
                (injected, r)
            } else {
                fail.set(n)?;
                let r = p.client.mr_reg(p.active, 8192, 0);
                let injected = fail.injected()?;
                if let Ok((mr, _, _)) = r {
                    p.client.mr_dereg(p.active, mr)?;
                }
                let (mr, _, _) = p
                    .client
                    .mr_reg(p.active, 8192, 0)
                    .context("MR_REG after the injected failure")?;
                p.client.mr_dereg(p.active, mr)?;
                (injected, r.map(drop))
            };
            listen()?.0.destroy(p.passive)?;
            drop(p);
            drain_requests(listen()?)?;
            Ok((injected, errno(r)))
        }
    }
}

/// The outcome of an operation's injection rounds, once the round that
/// set up a failure at fault point `points + 1` saw none injected (the call
/// passed only `points` fault points) and returned `last`: the number of
/// fault points, or why the test failed.  An operation that reached no
/// fault point at all tested nothing (the call no longer reaches the
/// module's allocations, or `fail-nth` does not count this task): a
/// failure, not a pass with 0 fault points.
fn verdict(points: usize, last: std::result::Result<(), i32>) -> Result<usize> {
    match last {
        Err(e) => Err(anyhow::anyhow!(
            "failed with {} without an injected fault",
            crate::fuzz::errno_name(e)
        )),
        Ok(()) if points == 0 => Err(anyhow::anyhow!(
            "the operation reached no fault point: nothing was injected, nothing tested"
        )),
        Ok(()) => Ok(points),
    }
}

/// Every fault point of one operation in turn (n = 1, 2, ... until the
/// call passes none), from this thread (`fail-nth` is per task): the
/// number of fault points and the outcomes.
fn every_fault_point(
    op: Op,
    addr: SocketAddr,
    verbose: bool,
) -> (Result<usize>, BTreeMap<String, usize>) {
    let mut errnos: BTreeMap<String, usize> = BTreeMap::new();
    let fail = match FailNth::open() {
        Ok(fail) => fail,
        Err(e) => return (Err(e), errnos),
    };
    let mut outcome = Err(anyhow::anyhow!("more than 5000 fault points"));
    for n in 1..=5000 {
        if verbose {
            eprintln!("fail-nth: {op:?}: fault point {n}");
        }
        match one_round(&fail, op, n, addr) {
            Ok((false, r)) => {
                outcome = verdict(n - 1, r);
                break;
            }
            Ok((true, r)) => {
                let name = r.map_or_else(crate::fuzz::errno_name, |()| "success".into());
                *errnos.entry(name).or_default() += 1;
            }
            Err(e) => {
                outcome = Err(e.context(format!("fault point {n}")));
                break;
            }
        }
    }
    let _ = fail.set(0);
    (outcome, errnos)
}

/// Every fault point of each operation (`only`: of that one): the call
/// fails with an errno or succeeds, and the file, the id and the
/// connection stay usable.  `jobs` threads take the operations in turn,
/// each operation on ports of its own from `addr`'s (two each).  Prints
/// one KTAP line per operation, in order, and one for the resources;
/// `Ok(false)` if one failed.
pub fn fail_nth(
    addr: SocketAddr,
    first_ktap: usize,
    only: Option<Op>,
    jobs: usize,
    verbose: bool,
) -> Result<bool> {
    enable_fault_injection(verbose)?;
    let base = module_resources()?;
    // A failure injected into a driver's own allocation may leave it
    // unable to flush a QP (rxe's receive task stays disabled after an
    // ENOMEM in rxe_qp_from_attr under ACCEPT, design.rst): the module's
    // teardown then completes the requests itself and says so.  That line
    // is this test's doing: the dmesg gate accepts it, and only it, until
    // the resources are back below (the reclaims come before the ids go).
    // How many QPs it hits depends on the kernel, hence no bound.
    let window = ExpectWindow::begin("fail-nth", None, "requests the driver did not flush")?;
    let ops: Vec<(usize, Op)> = Op::ALL
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, op)| only.is_none_or(|o| o == op))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(BTreeMap::new());
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(index, op)) = ops.get(i) else {
                    break;
                };
                let port = addr.port() + 2 * index as u16;
                let start = Instant::now();
                let (outcome, errnos) =
                    every_fault_point(op, SocketAddr::new(addr.ip(), port), verbose);
                let ms = start.elapsed().as_millis();
                results
                    .lock()
                    .unwrap()
                    .insert(index, (op, outcome, errnos, ms));
            });
        }
    });
    let mut all_ok = true;
    let mut k = first_ktap;
    for (op, outcome, errnos, ms) in results.into_inner().unwrap().into_values() {
        let name = format!("fail-nth: {op:?}");
        match outcome {
            Ok(sites) => {
                println!("ok {k} - {name}: {sites} fault points, outcomes {errnos:?} ({ms} ms)")
            }
            Err(e) => {
                all_ok = false;
                println!("not ok {k} - {name}: {e:#} (outcomes so far {errnos:?})");
            }
        }
        k += 1;
    }
    match expect_resources(&base, "after every injected failure") {
        Ok(()) => println!("ok {k} - fail-nth: no module resource left on the device"),
        Err(e) => {
            all_ok = false;
            println!("not ok {k} - fail-nth: {e:#}");
        }
    }
    window.end()?;
    Ok(all_ok)
}

/// A window of the kernel log in which `tools/vm/dmesg-gate` accepts the
/// module's lines that contain `text` (one of its leak or teardown
/// messages) as this test's doing, at most `max` of them (`None`: no
/// bound); any other such line still fails the run, and so does a window
/// never ended.  Begun before the test provokes the line, ended once
/// everything that may print it is done; the drop ends it too.
pub(crate) struct ExpectWindow {
    tag: &'static str,
    ended: bool,
}

impl ExpectWindow {
    pub(crate) fn begin(tag: &'static str, max: Option<usize>, text: &str) -> Result<Self> {
        let max = max.map_or_else(|| "*".to_string(), |m| m.to_string());
        kmsg(&expect_begin_line(tag, &max, text))?;
        Ok(Self { tag, ended: false })
    }

    pub(crate) fn end(mut self) -> Result<()> {
        self.ended = true;
        kmsg(&expect_end_line(self.tag))
    }
}

impl Drop for ExpectWindow {
    fn drop(&mut self) {
        if !self.ended {
            if let Err(e) = kmsg(&expect_end_line(self.tag)) {
                eprintln!("{e:#}");
            }
        }
    }
}

/// The marker lines `tools/vm/dmesg-gate` reads.
fn expect_begin_line(tag: &str, max: &str, text: &str) -> String {
    format!("rdma-cm-rs-expect: begin {tag} {max} {text}")
}

fn expect_end_line(tag: &str) -> String {
    format!("rdma-cm-rs-expect: end {tag}")
}

/// Writes `line` to the kernel log (one record).
fn kmsg(line: &str) -> Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .context("open /dev/kmsg")?;
    f.write_all(format!("{line}\n").as_bytes())
        .with_context(|| format!("write to /dev/kmsg: {line}"))
}

// ---------------------------------------------------------------------------
// The peer machine killed mid-transfer (two VMs)

/// The agent of the peer VM connects to the module and sends every 20 ms;
/// once the module has received some, the host kills the peer VM
/// (`tools/vm/run`: the file named by `RDMA_CM_RS_KILL_PEER`).  Nothing
/// tells the module: a send of its own must fail within `bound` (the RC
/// transport's retries run out, or the module's wait for the completion
/// does), and disconnecting and destroying the id must not wait for the
/// dead machine.
/// Prints two KTAP lines into `results`.  The moment the host reports the
/// kill goes to the kernel log ([`PEER_VM_KILLED`]).
pub fn peer_vm_killed(
    local: SocketAddr,
    agent: SocketAddr,
    bound: Duration,
    results: &mut Flat,
) -> Result<()> {
    let kill_file = std::env::var("RDMA_CM_RS_KILL_PEER")
        .context("RDMA_CM_RS_KILL_PEER is not set: run in two VMs by tools/vm/run")?;
    let dev = Device::open()?;
    let l = dev.create_id(1)?;
    dev.bind(l, &local).context("bind")?;
    dev.listen(l, 4).context("listen")?;
    // The peer's retry count becomes the module's QP's (the REQ carries
    // it): librdmacm's usual 7, or 6 on a kernel without fix 0014, whose
    // rxe treats 7 as "retry for ever" (the IBTA gives that meaning only
    // to the RNR retry count) and would never fail a send to a dead
    // machine.
    let fixes = crate::kernel_fixes::Present::from_env();
    let retry = if fixes.has("0014") { 7 } else { 6 };
    if retry < 7 {
        println!(
            "# retry count 6, not 7: {}",
            fixes.lacking(&["0014"]).unwrap_or_default()
        );
    }
    let mut call = crate::agent::Call::start(&agent, &format!("hold addr={local} retry={retry}"))?;
    let r = expect_event(&dev, EventType::ConnectRequest)?;
    dev.accept(r.new_id, None)?;
    expect_event(&dev, EventType::Established)?;
    call.ready()?;
    for _ in 0..5 {
        dev.recv(r.new_id, 4096, 5000)
            .context("a message of the peer")?;
    }
    fs::write(&kill_file, b"").context("ask the host to kill the peer VM")?;
    let done = format!("{kill_file}.done");
    let asked = Instant::now();
    while !std::path::Path::new(&done).exists() {
        ensure!(
            asked.elapsed() < Duration::from_secs(30),
            "the host did not kill the peer VM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = Instant::now();
    // For what else watches the dead machine (the NVMe target's
    // keep-alive, `nvmet_target::host_killed_mid_io`): the kernel log's clock.
    let _ = kmsg(PEER_VM_KILLED);
    // Messages already in the module's receive queue are still read.
    while dev.recv(r.new_id, 4096, 0).is_ok() {}
    // A send to the dead machine: RC retries (`retry`, with the CM's ACK
    // timeout for RoCE) run out and the send completes with IB_WC_RETRY_EXC_ERR,
    // which the layer reports as EHOSTUNREACH.  The send may wait up to
    // the bound, past its default 5 s, so that the module's own timeout
    // (ETIMEDOUT) cannot pass for the transport's verdict.
    let wait_ms = u32::try_from(bound.as_millis()).unwrap_or(u32::MAX);
    let sent = dev.send_flags(r.new_id, b"to a dead machine", wait_ms, 0);
    let send_took = killed.elapsed();
    let mut result = |pass: bool, what: String| results.result(pass, &what);
    let retries_ran_out = sent
        .as_ref()
        .is_err_and(|e| e.raw_os_error() == Some(libc::EHOSTUNREACH));
    result(
        retries_ran_out && send_took < bound,
        format!(
            "peer VM killed mid-transfer: the module's next send failed with the transport's retries run out (EHOSTUNREACH: {}) after {} ms (bound {} ms)",
            sent.as_ref().map_or_else(|e| e.to_string(), |()| "it succeeded".into()),
            send_took.as_millis(),
            bound.as_millis()
        ),
    );
    // Disconnect and destroy do not wait for the dead machine: the CM
    // would retry its DREQ for about a minute (15 retries of the peer's
    // response timeout) before DISCONNECTED; destroying cancels that.
    let teardown = Instant::now();
    let d = dev.disconnect(r.new_id);
    let destroyed = dev.destroy(r.new_id);
    result(
        destroyed.is_ok() && teardown.elapsed() < Duration::from_secs(5),
        format!(
            "peer VM killed mid-transfer: disconnect ({}) and destroy ({}) took {} ms",
            d.as_ref().map_or_else(|e| e.to_string(), |()| "ok".into()),
            destroyed
                .as_ref()
                .map_or_else(|e| e.to_string(), |()| "ok".into()),
            teardown.elapsed().as_millis()
        ),
    );
    dev.destroy(l)?;
    // The agent's side died with its machine.
    drop(call);
    Ok(())
}

/// What `ctl peer-vm-killed` writes to the kernel log when the host has
/// killed the peer VM.
pub const PEER_VM_KILLED: &str = "rdma-cm-rs: the host killed the peer VM";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_that_reached_no_fault_point_fails() {
        let e = verdict(0, Ok(())).unwrap_err();
        assert!(format!("{e:#}").contains("reached no fault point"), "{e:#}");
    }

    #[test]
    fn an_operation_with_fault_points_passes_with_their_number() {
        assert_eq!(verdict(1, Ok(())).unwrap(), 1);
        assert_eq!(verdict(37, Ok(())).unwrap(), 37);
    }

    #[test]
    fn an_error_without_an_injected_fault_fails() {
        for points in [0, 5] {
            let e = verdict(points, Err(libc::ENOMEM)).unwrap_err();
            assert!(format!("{e:#}").contains("without an injected fault"));
        }
    }

    #[test]
    fn expect_markers_are_what_the_dmesg_gate_reads() {
        assert_eq!(
            expect_begin_line("fail-nth", "*", "requests the driver did not flush"),
            "rdma-cm-rs-expect: begin fail-nth * requests the driver did not flush"
        );
        assert_eq!(
            expect_end_line("fail-nth"),
            "rdma-cm-rs-expect: end fail-nth"
        );
    }
}
