// SPDX-License-Identifier: GPL-2.0
//! Synchronous ids (RDMA_CM_RS_ID_SYNC) beyond what `suite --sync` checks
//! by running the other scenarios on them: the ABI's refusals, events that
//! never reach the file's queue, signals, wait limits, and destruction
//! while a call blocks.

use super::{expect_errno, listen, verify, Ctx, T};
use crate::agent::Call;
use crate::payload::{hex, pattern};
use crate::uapi::*;
use anyhow::{bail, ensure, Context, Result};
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

extern "C" fn on_usr1(_: libc::c_int) {}

/// Installs an empty SIGUSR1 handler, with or without SA_RESTART.
pub(super) fn catch_usr1(restart: bool) -> Result<()> {
    // SAFETY: a zeroed sigaction is valid; the handler does nothing, so
    // it is async-signal-safe.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut())
    };
    ensure!(r == 0, "sigaction: {}", std::io::Error::last_os_error());
    Ok(())
}

/// Sends SIGUSR1 to a thread of this process.
pub(super) fn signal(thread: libc::pthread_t) -> Result<()> {
    // SAFETY: `thread` is a live thread of this process (its handle is
    // held by the caller's scope).
    let r = unsafe { libc::pthread_kill(thread, libc::SIGUSR1) };
    ensure!(r == 0, "pthread_kill: {r}");
    Ok(())
}

/// The ABI: the flag and the fields that must be zero, a synchronous id
/// refused on a non-blocking file (and its calls once the file became
/// one), GET_REQUEST only on synchronous listeners, events returned with
/// the call and never queued on the file, a failure's errno with its event
/// (REJECTED: ECONNREFUSED, the reason in the status).
pub fn sync_ids_return_events_with_the_call(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open_sync()?;
    expect_errno(
        "CREATE_ID with an unknown flag",
        dev.create_id_flags(0, RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_RC, 4),
        libc::EINVAL,
    )?;
    let nb = Device::open_nonblocking()?;
    expect_errno(
        "CREATE_ID synchronous on an O_NONBLOCK file",
        nb.create_id_flags(0, RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_RC, RDMA_CM_RS_ID_SYNC),
        libc::EINVAL,
    )?;
    // An asynchronous id: sync.timeout_ms must be 0, GET_REQUEST refused.
    let plain = Device::open_async()?;
    let a = plain.create_id(5)?;
    let (r, ev) = plain.sync_resolve_addr(a, &SocketAddr::new(ctx.peer4, 1), 2000, 5);
    expect_errno(
        "RESOLVE_ADDR with a wait limit on an asynchronous id",
        r,
        libc::EINVAL,
    )?;
    ensure!(ev.is_none(), "an asynchronous id wrote an event back");
    let al = listen(&plain, SocketAddr::new(ctx.local4, ctx.port()), 1, 0)?;
    expect_errno(
        "GET_REQUEST on an asynchronous listener",
        plain.get_request(al, 0),
        libc::EINVAL,
    )?;

    // Resolution returns ADDR_RESOLVED and ROUTE_RESOLVED with the call.
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let id = dev.create_id(9)?;
    expect_errno(
        "GET_REQUEST on a synchronous id that is no listener",
        dev.get_request(id, 0),
        libc::EINVAL,
    )?;
    let (r, ev) = dev.sync_resolve_addr(id, &addr, 2000, 0);
    r.context("synchronous RESOLVE_ADDR")?;
    let ev = ev.context("RESOLVE_ADDR returned no event")?;
    ensure!(
        ev.event == EventType::AddrResolved && ev.id == id && ev.context == 9 && ev.status == 0,
        "RESOLVE_ADDR returned {}",
        ev.line("module")
    );
    expect_errno(
        "GET_EVENT after a synchronous call",
        dev.get_event_ioctl(0),
        libc::EAGAIN,
    )?;

    // No listener there: CONNECT fails with ECONNREFUSED and returns the
    // REJECTED event.
    dev.resolve_route(id, 2000)?;
    let mut c = rdma_cm_rs_connect {
        id,
        param: Param::with_data(b"anyone?").to_abi(),
        ..Default::default()
    };
    let r = dev.raw_ioctl(IOC_CONNECT, &mut c as *mut _ as usize);
    expect_errno("synchronous CONNECT to no listener", r, libc::ECONNREFUSED)?;
    let ev = sync_event(&c.sync).context("the refused CONNECT returned no event")?;
    ensure!(
        ev.event == EventType::Rejected && ev.status > 0,
        "CONNECT returned {}",
        ev.line("module")
    );
    expect_errno(
        "GET_EVENT after the refused CONNECT",
        dev.get_event_ioctl(0),
        libc::EAGAIN,
    )?;

    // A synchronous listener: the request comes through GET_REQUEST with
    // its new (synchronous) id, ACCEPT returns ESTABLISHED.
    let laddr = SocketAddr::new(ctx.local4, ctx.port());
    let l = listen(&dev, laddr, 2, 11)?;
    let data = pattern(56, 0x51);
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={laddr} data={} disc=self", hex(&data)),
    )?;
    let req = dev.get_request(l, T)?;
    ensure!(
        req.event == EventType::ConnectRequest
            && req.id == l
            && req.context == 11
            && req.new_id != 0,
        "GET_REQUEST returned {}",
        req.line("module")
    );
    verify("GET_REQUEST private data", &data, &req.private_data)?;
    let mut a = rdma_cm_rs_accept {
        id: req.new_id,
        param: Param::with_data(b"welcome").to_abi(),
        ..Default::default()
    };
    dev.raw_ioctl(IOC_ACCEPT, &mut a as *mut _ as usize)
        .context("synchronous ACCEPT")?;
    let est = sync_event(&a.sync).context("ACCEPT returned no event")?;
    ensure!(
        est.event == EventType::Established && est.id == req.new_id,
        "ACCEPT returned {}",
        est.line("module")
    );
    // The peer disconnects (or the module's first DISCONNECT does): the
    // module keeps the DISCONNECTED, and every DISCONNECT returns it.
    for round in 0..2 {
        let mut d = rdma_cm_rs_disconnect {
            id: req.new_id,
            ..Default::default()
        };
        d.sync.timeout_ms = T;
        dev.raw_ioctl(IOC_DISCONNECT, &mut d as *mut _ as usize)
            .with_context(|| format!("DISCONNECT {round}"))?;
        let ev = sync_event(&d.sync).context("DISCONNECT returned no event")?;
        ensure!(
            ev.event == EventType::Disconnected,
            "DISCONNECT returned {}",
            ev.line("module")
        );
    }
    // The peer's disconnect completes once the module answered it.
    let r = call.result()?;
    ensure!(
        r.get("event").map(String::as_str) == Some("ESTABLISHED"),
        "peer: {r:?}"
    );
    expect_errno("GET_EVENT at the end", dev.get_event_ioctl(0), libc::EAGAIN)?;

    // The file made non-blocking afterwards: blocking calls are refused.
    let id2 = dev.create_id(0)?;
    // SAFETY: F_SETFL on our own descriptor.
    ensure!(unsafe { libc::fcntl(dev.fd(), libc::F_SETFL, libc::O_NONBLOCK) } == 0);
    let (r, _) = dev.sync_resolve_addr(id2, &addr, 2000, 0);
    expect_errno(
        "synchronous RESOLVE_ADDR on a non-blocking file",
        r,
        libc::EINVAL,
    )
}

/// A module listener on an asynchronous file, and a synchronous id of
/// `dev` resolved to it: the id's CONNECT blocks until the listener's side
/// answers, which the scenario decides.
fn blocked_connect_setup(ctx: &mut Ctx, dev: &Device) -> Result<(Device, u32)> {
    let srv = Device::open_async()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    listen(&srv, addr, 4, 0)?;
    let id = dev.create_id(0)?;
    dev.resolve_addr(id, &addr, 2000)?;
    dev.resolve_route(id, 2000)?;
    Ok((srv, id))
}

/// The listener's request (the blocked CONNECT's), answered by a reject.
fn connect_request(srv: &Device) -> Result<u32> {
    let req = srv.get_event(T)?;
    ensure!(
        req.event == EventType::ConnectRequest,
        "listener got {}",
        req.line("module")
    );
    Ok(req.new_id)
}

/// A signal interrupts a blocking call (EINTR without SA_RESTART); its
/// operation stays in flight: another blocking call is refused (EBUSY),
/// and the same call resumes: it returns the first CONNECT's outcome (the
/// listener saw one request).  With SA_RESTART the kernel restarts the
/// call, which resumes the same way.
pub fn sync_signal_interrupts_and_resumes(ctx: &mut Ctx) -> Result<()> {
    let dev = &Device::open_sync()?;
    for restart in [false, true] {
        catch_usr1(restart)?;
        let (srv, id) = blocked_connect_setup(ctx, dev)?;
        let param = &Param::with_data(b"sync");
        let (first, resumed) = std::thread::scope(|s| -> Result<_> {
            let (tx, rx) = std::sync::mpsc::channel();
            let h = s.spawn(move || {
                // SAFETY: pthread_self has no preconditions.
                let _ = tx.send(unsafe { libc::pthread_self() });
                let first = dev.sync_connect(id, param, 0);
                let resumed = match &first.0 {
                    Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                        let busy = dev.resolve_route(id, 100);
                        Some((busy, dev.sync_connect(id, param, 0)))
                    }
                    _ => None,
                };
                (first, resumed)
            });
            let thread = rx.recv()?;
            let new_id = connect_request(&srv)?;
            std::thread::sleep(Duration::from_millis(300));
            signal(thread)?;
            std::thread::sleep(Duration::from_millis(300));
            srv.reject(new_id, 0, b"later")?;
            h.join().map_err(|_| anyhow::anyhow!("the caller panicked"))
        })?;
        let (first_result, first_event) = first;
        let (result, event) = if restart {
            ensure!(resumed.is_none(), "SA_RESTART: the call returned EINTR");
            (first_result, first_event)
        } else {
            let e = first_result.as_ref().err().and_then(|e| e.raw_os_error());
            ensure!(
                e == Some(libc::EINTR),
                "no SA_RESTART: the call returned {first_result:?}"
            );
            ensure!(
                first_event.is_none(),
                "the interrupted call returned an event"
            );
            let Some((busy, (r, ev))) = resumed else {
                bail!("no resumed call");
            };
            expect_errno(
                "RESOLVE_ROUTE while CONNECT is in flight",
                busy,
                libc::EBUSY,
            )?;
            (r, ev)
        };
        expect_errno(
            &format!("restart={restart}: the resumed CONNECT"),
            result,
            libc::ECONNREFUSED,
        )?;
        let ev = event.context("the call got no event")?;
        ensure!(
            ev.event == EventType::Rejected && ev.private_data.starts_with(b"later"),
            "restart={restart}: {}",
            ev.line("module")
        );
        // One connect: the listener saw no second request.
        expect_errno("a second request", srv.get_event(200), libc::ETIMEDOUT)?;
    }
    Ok(())
}

/// A wait limit ends the call with ETIMEDOUT and no event; the repeated
/// call returns the operation's event.
pub fn sync_wait_limit_leaves_call_in_flight(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open_sync()?;
    let (srv, id) = blocked_connect_setup(ctx, &dev)?;
    let param = Param::with_data(b"sync");
    let start = Instant::now();
    let (r, ev) = dev.sync_connect(id, &param, 200);
    expect_errno("CONNECT past its 200 ms limit", r, libc::ETIMEDOUT)?;
    ensure!(ev.is_none(), "the timed-out call returned an event");
    let limited = start.elapsed();
    ensure!(
        limited < Duration::from_millis(1500),
        "the 200 ms limit took {limited:?}"
    );
    let new_id = connect_request(&srv)?;
    srv.reject(new_id, 0, b"no")?;
    let (r, ev) = dev.sync_connect(id, &param, T);
    expect_errno("the repeated CONNECT", r, libc::ECONNREFUSED)?;
    let ev = ev.context("the repeated call got no event")?;
    ensure!(ev.event == EventType::Rejected, "{}", ev.line("module"));
    super::note(&format!(
        "limit: ETIMEDOUT after {} ms, REJECTED after {} ms",
        limited.as_millis(),
        start.elapsed().as_millis()
    ));
    Ok(())
}

/// DESTROY_ID from another thread ends a blocking call (ECANCELED) and a
/// blocking GET_REQUEST; the ids are gone.
pub fn sync_destroy_while_a_call_blocks(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open_sync()?;
    let (srv, id) = blocked_connect_setup(ctx, &dev)?;
    let l = listen(&dev, SocketAddr::new(ctx.local4, ctx.port()), 1, 0)?;
    let param = Param::with_data(b"sync");
    let (call, request) = std::thread::scope(|s| -> Result<_> {
        let blocked = s.spawn(|| {
            let t = Instant::now();
            (dev.sync_connect(id, &param, 0), t.elapsed())
        });
        let waiting = s.spawn(|| {
            let t = Instant::now();
            (dev.get_request(l, RDMA_CM_RS_TIMEOUT_INFINITE), t.elapsed())
        });
        connect_request(&srv)?;
        std::thread::sleep(Duration::from_millis(300));
        dev.destroy(id).context("DESTROY_ID of the blocked id")?;
        dev.destroy(l)
            .context("DESTROY_ID of the waiting listener")?;
        let call = blocked.join().map_err(|_| anyhow::anyhow!("panicked"))?;
        let request = waiting.join().map_err(|_| anyhow::anyhow!("panicked"))?;
        Ok((call, request))
    })?;
    let ((r, ev), took) = call;
    expect_errno("the blocked CONNECT", r, libc::ECANCELED)?;
    ensure!(ev.is_none(), "the cancelled call returned an event");
    ensure!(
        took < Duration::from_millis(3000),
        "it ended after {took:?}"
    );
    let (r, took) = request;
    expect_errno("the waiting GET_REQUEST", r, libc::ECANCELED)?;
    ensure!(
        took < Duration::from_millis(3000),
        "it ended after {took:?}"
    );
    expect_errno("QUERY of the destroyed id", dev.query(id), libc::ENOENT)?;
    Ok(())
}
