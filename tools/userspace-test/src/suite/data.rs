// SPDX-License-Identifier: GPL-2.0

//! The data path: messages of every size, sends under a disconnect, busy
//! polling, the send window, a message and its answer in one call.

#[allow(unused_imports)]
use super::*;

pub(super) fn messages_all_sizes(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let sizes = [1usize, 2, 64, 1000, 4095, 4096];
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(
        &ctx.agent,
        &format!(
            "serve addr={addr} count=1 accept=- echo={}",
            sizes.len() + 1
        ),
    )?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(b"sizes"))?;
    wait(&dev, EventType::Established)?;
    // An id that does not busy-poll sleeps in its waits, even in one of
    // 1 ms (`busy_poll_data_path` has the other side of this).
    let slept = sleeps_of_empty_recv(&dev, id, 1)?;
    ensure!(slept > 0, "the RECV of 1 ms never slept");
    for (i, &n) in sizes.iter().enumerate() {
        let msg = pattern(n, i as u8);
        dev.send(id, &msg).with_context(|| format!("send {n}"))?;
        let back = dev.recv(id, 4096, T).with_context(|| format!("recv {n}"))?;
        verify(&format!("{n}-byte message, echoed"), &msg, &back)?;
    }
    expect_errno("send 4097 bytes", dev.send(id, &[0; 4097]), libc::EINVAL)?;
    expect_errno("send 0 bytes", dev.send(id, &[]), libc::EINVAL)?;
    // A buffer too small keeps the message.
    dev.send(id, &[9; 100])?;
    let mut tries = 0;
    loop {
        match errno_of(dev.recv(id, 10, 0)) {
            Some(libc::EMSGSIZE) => break,
            Some(libc::EAGAIN) if tries < 100 => std::thread::sleep(Duration::from_millis(50)),
            other => bail!("small recv: {other:?}"),
        }
        tries += 1;
    }
    ensure!(dev.recv(id, 4096, T)? == [9; 100]);
    dev.disconnect(id)?;
    wait(&dev, EventType::Disconnected)?;
    let r = call.result()?;
    ensure!(field(&r, "disc0")? == "DISCONNECTED");
    // The peer's last echo may complete with LOC_QP_OP_ERR on siw only
    // (see `agent::serve`).  On RoCE it completes with our ACK, or, when
    // our disconnect made rxe drop that ACK (testing.rst, "Debugging
    // rxe"), flushed (WR_FLUSH_ERR, 5) by the peer's own disconnect.
    if !ctx.iwarp() {
        ensure!(
            ["0", "5"].contains(&field(&r, "lastecho0")?),
            "last echo's completion: {r:?}"
        );
    }
    Ok(())
}

/// SEND with `RDMA_CM_RS_SEND_NOWAIT`: a window of sends in flight, in
/// order, then a waited SEND; on RoCE also past the window (the call waits
/// for a slot) and the failure of a send nobody waited for, returned once
/// by the next SEND.
/// The module disconnects while the peer's burst of 20 SENDs of 4096 bytes
/// is on its way: the rest reach a QP in the error state, which drops them.
/// On rxe across two VMs such packets hold virtio-net's page pool pages,
/// which rxe returned with interrupts disabled (a lockdep warning:
/// `tools/kernel-patches/0008`).  Every send of the peer's completes
/// (delivered, or flushed once it saw DISCONNECTED and disconnected too),
/// and both ends see DISCONNECTED.
/// The peer serves (`serve addr=... SERVE_ARGS`) on a fresh port; the
/// module connects to it with `data` and sees ESTABLISHED.  The peer's
/// call and the module's id.
pub(super) fn connect_to_serving_peer(
    ctx: &mut Ctx,
    dev: &Device,
    serve_args: &str,
    data: &[u8],
) -> Result<(Call, u32)> {
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(&ctx.agent, &format!("serve addr={addr} {serve_args}"))?;
    call.ready()?;
    let id = resolve(dev, addr)?;
    dev.connect(id, &Param::with_data(data))?;
    wait(dev, EventType::Established)?;
    Ok((call, id))
}

pub(super) fn disconnect_under_incoming_sends(ctx: &mut Ctx) -> Result<()> {
    const BURST: usize = 20;
    let dev = Device::open()?;
    let (call, id) = connect_to_serving_peer(
        ctx,
        &dev,
        &format!("count=1 accept=- flood={BURST}"),
        b"flood",
    )?;
    let message = dev.recv(id, 4096, T).context("the burst's first message")?;
    ensure!(
        message.len() == 4096,
        "the burst's first message has {} bytes, not 4096",
        message.len()
    );
    dev.disconnect(id)?;
    wait(&dev, EventType::Disconnected)?;
    let report = call.result()?;
    let flood = field(&report, "flood0")?;
    let delivered: usize = flood
        .split('/')
        .next()
        .and_then(|n| n.parse().ok())
        .with_context(|| format!("flood0={flood}"))?;
    // Even the first may count as flushed: the module may read it and
    // disconnect before the device acknowledged it.
    ensure!(
        delivered <= BURST && flood.ends_with(&format!("/{BURST}")),
        "the peer's burst: {flood} delivered"
    );
    ensure!(
        field(&report, "disc0")? == "DISCONNECTED",
        "the peer's end: {report:?}"
    );
    dev.destroy(id)?;
    Ok(())
}

/// A RECV of `ms` with nothing arrived, which must time out: how many
/// times the calling thread slept in it (voluntary context switches; a
/// yield between polls or a preemption is not one).
fn sleeps_of_empty_recv(dev: &Device, id: u32, ms: u32) -> Result<u64> {
    let (before, _) = crate::bench::stats::thread_switches();
    expect_errno(
        &format!("RECV of {ms} ms, nothing arrived"),
        dev.recv(id, 4096, ms),
        libc::ETIMEDOUT,
    )?;
    let (after, _) = crate::bench::stats::thread_switches();
    Ok(after.saturating_sub(before))
}

/// Busy-polling ids (RDMA_CM_RS_ID_BUSY_POLL): a wait polls the
/// connection's CQ in the caller's task for its first millisecond, then
/// sleeps until the device notifies; seen in the calling thread's
/// voluntary context switches (its sleeps; a yield between polls is not
/// one).  A RECV with nothing arrived polls and fails: EAGAIN at once;
/// ETIMEDOUT after a limit of 1 ms without a sleep (on an id that does not
/// busy-poll, the same RECV sleeps); after one of 50 ms, having slept.
/// Then four data-path scenarios again on such ids, made by the module's
/// connect and by its listener (whose requests' ids busy-poll too),
/// through its sends, windows, RDMA and disconnects; on iWARP, the passive
/// side's first SEND once the peer's first message came, unread.
pub(super) fn busy_poll_data_path(ctx: &mut Ctx) -> Result<()> {
    let _busy = BusyPollIds::on();
    let dev = Device::open()?;
    // The whole REQ's private data, which IB pads to its 56 bytes.
    let req_data = pattern(56, 5);
    let (call, id) =
        connect_to_serving_peer(ctx, &dev, "count=1 accept=- echo=1 disc=self", &req_data)?;
    expect_errno(
        "RECV without waiting, nothing arrived",
        dev.recv(id, 4096, 0),
        libc::EAGAIN,
    )?;
    let slept = sleeps_of_empty_recv(&dev, id, 1)?;
    ensure!(
        slept == 0,
        "the RECV of 1 ms on a busy-polling id slept {slept} times: it polls for its first ms"
    );
    let start = Instant::now();
    let slept = sleeps_of_empty_recv(&dev, id, 50)?;
    ensure!(
        start.elapsed() >= Duration::from_millis(50),
        "the RECV of 50 ms gave up after {:?}",
        start.elapsed()
    );
    ensure!(
        slept > 0,
        "the RECV of 50 ms on a busy-polling id never slept: it sleeps after its first ms"
    );
    echo_then_peer_disconnects(&dev, id, call, &req_data, b"polled by the caller")?;
    // A listener's ids, the window's waits for buffers, the memory work's
    // waits, and the flush that ends a RECV; the other data-path
    // scenarios add no wait of their own (make check's time).
    let scenarios: [(&str, Test); 4] = [
        ("module_listens_librdmacm_connects", module_listens_v4),
        ("send_window_nowait", send_window_nowait),
        ("rdma_read_write_both_ways", rdma_read_write),
        (
            "disconnect_initiated_by_either_side",
            disconnect_either_side,
        ),
    ];
    for (name, scenario) in scenarios {
        scenario(ctx).with_context(|| format!("{name} on busy-polling ids"))?;
    }
    if ctx.iwarp() {
        passive_sends_once_the_first_message_came(ctx)
            .context("iWARP, passive, busy-polling: SEND after the peer's first message")?;
    }
    Ok(())
}

/// iWARP, the module passive on a busy-polling id: its sends wait for the
/// peer's first message (EAGAIN before), which only a poll of the CQ sees;
/// once it came, a SEND goes without a RECV first (the SEND polls before
/// it posts), and the message is still there to read.
pub(super) fn passive_sends_once_the_first_message_came(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let (listener, id, call) = iwarp_passive_connection(ctx, &dev, 500)?;
    // The peer sends 500 ms after its ESTABLISHED; nothing polls meanwhile.
    std::thread::sleep(Duration::from_millis(1500));
    dev.send(id, b"answer")
        .context("module SEND, the first message unread")?;
    verify(
        "module: the first message",
        IWARP_FIRST,
        &dev.recv(id, 4096, T).context("module recv")?,
    )?;
    iwarp_passive_answered(&dev, call)?;
    dev.destroy(id)?;
    dev.destroy(listener)?;
    Ok(())
}

pub(super) fn send_window_nowait(ctx: &mut Ctx) -> Result<()> {
    const WINDOW: usize = RDMA_CM_RS_SEND_WINDOW as usize;
    let dev = Device::open()?;
    // The peer echoes each message with a send it waits for, so once the
    // module's 16 receives hold unread echoes it stops reading: past the
    // window (which makes the module's call wait for a slot) at most its
    // 16 receives and the one it echoes more may be outstanding, or both
    // wait for ever.  iWARP has no RNR: there a SEND finding no receive
    // ends the connection, so no more than 16.
    let burst = if ctx.iwarp() { WINDOW } else { WINDOW + 8 };
    let rounds = 3;
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(
        &ctx.agent,
        &format!(
            "serve addr={addr} count=1 accept=- echo={}",
            burst * rounds + 1
        ),
    )?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(b"window"))?;
    wait(&dev, EventType::Established)?;
    let msg = |r: usize, i: usize| pattern(1 + (r * 997 + i * 131) % 4096, (r * 64 + i) as u8);
    for r in 0..rounds {
        for i in 0..burst {
            dev.send_nowait(id, &msg(r, i))
                .with_context(|| format!("NOWAIT send {i} of round {r}"))?;
        }
        for i in 0..burst {
            let back = dev
                .recv(id, 4096, T)
                .with_context(|| format!("echo {i} of round {r}"))?;
            verify(
                &format!("echo {i} of round {r}, in order"),
                &msg(r, i),
                &back,
            )?;
        }
    }
    dev.send(id, b"waited")?;
    verify("waited send's echo", b"waited", &dev.recv(id, 4096, T)?)?;
    expect_errno(
        "SEND with an unknown flag",
        dev.send_flags(id, b"x", 5000, 0x80),
        libc::EINVAL,
    )?;
    dev.disconnect(id)?;
    wait(&dev, EventType::Disconnected)?;
    call.result()?;
    dev.destroy(id)?;
    if ctx.iwarp() {
        return Ok(());
    }

    // A peer that reads nothing and lets our sends retry no RNR NAK
    // (`rnr=0`, the REP's field): its 16 receives take 16 messages, the
    // 17th fails (RNR_RETRY_EXC: EHOSTUNREACH) with nobody waiting.
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(
        &ctx.agent,
        &format!("serve addr={addr} count=1 accept=- rnr=0"),
    )?;
    call.ready()?;
    let id = resolve(&dev, addr)?;
    dev.connect(id, &Param::with_data(b"no rnr retry"))?;
    wait(&dev, EventType::Established)?;
    for i in 0..=WINDOW {
        dev.send_nowait(id, &[i as u8; 64])
            .with_context(|| format!("NOWAIT send {i}"))?;
    }
    // Either the failure came before this call (returned at once, nothing
    // sent) or this send is flushed behind it: the failure is the cause.
    expect_errno(
        "the SEND after a NOWAIT send failed",
        dev.send_flags(id, b"after", 10_000, 0),
        libc::EHOSTUNREACH,
    )?;
    // Returned once: the QP is in the error state, so a send now is
    // flushed.
    expect_errno(
        "the SEND after that",
        dev.send_flags(id, b"flushed", 10_000, 0),
        libc::ECANCELED,
    )?;
    dev.disconnect(id)?;
    wait(&dev, EventType::Disconnected)?;
    call.result()?;
    dev.destroy(id)?;
    Ok(())
}

/// SEND_RECV: a message and its answer in one call, for every size; the
/// fields that must be zero and the send's length (EINVAL, nothing sent);
/// a send buffer that faults (EFAULT, nothing sent); after the send, an
/// answer too long for the buffer (EMSGSIZE) or a buffer that faults
/// (EFAULT), each with `sent` 1 and the answer kept for the next call; a
/// signal under SA_RESTART ends the wait with EINTR: restarting the call
/// would send again.
pub(super) fn send_recv_in_one_call(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let sizes = [1usize, 64, 4095, 4096];
    // Echoed: the sizes, the two answers refused and then read, the last.
    let echoes = sizes.len() + 3;
    let (call, id) = connect_to_serving_peer(
        ctx,
        &dev,
        &format!("count=1 accept=- echo={echoes}"),
        b"send_recv",
    )?;
    for (i, &n) in sizes.iter().enumerate() {
        let msg = pattern(n, 0x40 + i as u8);
        let back = dev
            .send_recv(id, &msg, 4096, T)
            .with_context(|| format!("SEND_RECV of {n} bytes"))?;
        verify(&format!("{n}-byte message's answer"), &msg, &back)?;
    }
    let msg = pattern(100, 7);
    let mut back = [0u8; 4096];
    let good = rdma_cm_rs_send_recv {
        id,
        send_len: msg.len() as u32,
        send_buf: msg.as_ptr() as u64,
        recv_buf: back.as_mut_ptr() as u64,
        recv_len: back.len() as u32,
        timeout_ms: T,
        ..Default::default()
    };
    // What a refused call would send: its answer would come before the
    // next call's and fail that call's check.
    let stray = pattern(100, 0xee);
    let refusable = rdma_cm_rs_send_recv {
        send_buf: stray.as_ptr() as u64,
        ..good
    };
    let refused: [(&str, rdma_cm_rs_send_recv, i32); 6] = [
        (
            "sent not 0",
            rdma_cm_rs_send_recv {
                sent: 1,
                ..refusable
            },
            libc::EINVAL,
        ),
        (
            "reserved not 0",
            rdma_cm_rs_send_recv {
                reserved: 1,
                ..refusable
            },
            libc::EINVAL,
        ),
        (
            "send_len 0",
            rdma_cm_rs_send_recv {
                send_len: 0,
                ..refusable
            },
            libc::EINVAL,
        ),
        (
            "send_len 4097",
            rdma_cm_rs_send_recv {
                send_len: 4097,
                ..refusable
            },
            libc::EINVAL,
        ),
        (
            "unknown id",
            rdma_cm_rs_send_recv {
                id: 123_456,
                ..refusable
            },
            libc::ENOENT,
        ),
        (
            "send_buf faults",
            rdma_cm_rs_send_recv {
                send_buf: 8,
                ..refusable
            },
            libc::EFAULT,
        ),
    ];
    for (what, mut r, want) in refused {
        let sent_in = r.sent;
        expect_errno(what, dev.send_recv_raw(&mut r), want)?;
        // Refused before the send: the arguments are not written back.
        ensure!(r.sent == sent_in, "{what}: sent {}", r.sent);
    }
    // Nothing was sent: the next answer is this message's.
    let mut r = rdma_cm_rs_send_recv {
        recv_len: 10,
        ..good
    };
    expect_errno(
        "answer longer than recv_len",
        dev.send_recv_raw(&mut r),
        libc::EMSGSIZE,
    )?;
    ensure!(r.sent == 1, "EMSGSIZE: sent {}", r.sent);
    verify("the answer kept", &msg, &dev.recv(id, 4096, T)?)?;
    let mut r = rdma_cm_rs_send_recv {
        recv_buf: 8,
        ..good
    };
    expect_errno("recv_buf faults", dev.send_recv_raw(&mut r), libc::EFAULT)?;
    ensure!(r.sent == 1, "EFAULT after the send: sent {}", r.sent);
    verify("the answer kept", &msg, &dev.recv(id, 4096, T)?)?;
    let last = pattern(33, 9);
    verify(
        "the last answer",
        &last,
        &dev.send_recv(id, &last, 4096, T)?,
    )?;
    // The peer echoes no more: a signal ends the wait.
    super::sync::catch_usr1(true)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let res = std::thread::scope(|s| -> Result<_> {
        let h = s.spawn(|| {
            // SAFETY: pthread_self has no preconditions.
            let _ = tx.send(unsafe { libc::pthread_self() });
            dev.send_recv(id, b"unanswered", 4096, 5000)
        });
        let thread = rx.recv()?;
        std::thread::sleep(Duration::from_millis(500));
        super::sync::signal(thread)?;
        h.join().map_err(|_| anyhow::anyhow!("the caller panicked"))
    })?;
    match res {
        Err(e) if e.error.raw_os_error() == Some(libc::EINTR) && e.sent == 1 => {}
        other => bail!("SEND_RECV interrupted under SA_RESTART: {other:?}"),
    }
    dev.disconnect(id)?;
    wait(&dev, EventType::Disconnected)?;
    call.result()?;
    dev.destroy(id)?;
    Ok(())
}
