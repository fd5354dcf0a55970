// SPDX-License-Identifier: GPL-2.0

//! The actors: librdmacm peers and the siw link.

#[allow(unused_imports)]
use super::*;

use super::capsule;

// ---------------------------------------------------------------------------
// The actors: librdmacm peers that come and go, the siw device deleted and
// added back.

/// The ports a peer tries: the fuzzer's listener range.
pub(super) const PEER_SPAN: u16 = 12;

/// A librdmacm peer process (`userspace-test fuzz-peer`).
pub(super) struct PeerProc {
    pub(super) child: Child,
    /// Its progress report: one letter a step (see [`peer`]).
    pub(super) out: ChildStdout,
}

/// `rdma ARGS`, bounded: `Err(None)` when it ran out of time.
pub(super) fn rdma_tool(args: &[&str], bound: Duration) -> std::result::Result<(), Option<String>> {
    let mut child = Command::new("rdma")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Some(format!("rdma: {e}")))?;
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                return Err(None);
            }
            Err(e) => return Err(Some(format!("wait for rdma: {e}"))),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    Err(Some(format!("{status}: {}", err.trim())))
}

pub(super) fn device_exists(dev: &str) -> bool {
    Path::new("/sys/class/infiniband").join(dev).exists()
}

/// The netdev of `dev`'s port 1, from `rdma link show`.
pub(super) fn netdev_of(dev: &str) -> Option<String> {
    let out = Command::new("rdma")
        .args(["link", "show", &format!("{dev}/1")])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "netdev")
        .nth(1)
        .map(str::to_string)
}

/// The peer's progress, one letter a step on standard output.
pub(super) fn mark(c: u8) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&[c]);
    let _ = out.flush();
}

/// `userspace-test fuzz-peer`: a librdmacm client of the fuzzer's listeners
/// until it is killed.  Attempts on a port of `addr`'s port ..+`span`
/// (mostly one of `prefer`, where the fuzzer listened last), until one was
/// established or 30 failed: resolve (`r`), create the QP and connect
/// (`c`); once established (`e`) send and receive some messages (`d` each),
/// then disconnect or just go.  `s` at the start, `x` for a failed attempt,
/// `q` at a normal end.  Only ever on `addr`'s IP, the rxe device: a
/// librdmacm context on siw would hold siw's removal up.  With `nvmet`,
/// half the peers run 1 to [`capsule::SESSIONS`] capsule sessions against
/// that target instead ([`capsule::session`], its own letters).
pub fn peer(
    addr: SocketAddr,
    span: u16,
    prefer: &[u16],
    seed: u64,
    nvmet: Option<SocketAddr>,
) -> Result<()> {
    let mut rng = Rng::new(seed);
    mark(b's');
    if let Some(target) = nvmet.filter(|_| rng.pct(capsule::CAPSULE_PCT)) {
        for _ in 0..rng.range(1, capsule::SESSIONS) {
            let _ = capsule::session(target, &mut rng);
        }
        mark(b'q');
        return Ok(());
    }
    let mut failed = 0;
    while failed < 30 {
        let port = if !prefer.is_empty() && rng.pct(70) {
            prefer[rng.below(prefer.len() as u64) as usize]
        } else {
            addr.port()
                .wrapping_add(rng.below(u64::from(span.max(1))) as u16)
        };
        let addr = SocketAddr::new(addr.ip(), port);
        let ch = cm::Channel::new()?;
        let Ok(id) = cm::resolve(&ch, &addr, Duration::from_secs(2)) else {
            failed += 1;
            mark(b'x');
            std::thread::sleep(Duration::from_millis(rng.range(10, 300)));
            continue;
        };
        mark(b'r');
        let Ok(mut conn) = cm::Conn::new(id) else {
            failed += 1;
            mark(b'x');
            continue;
        };
        let data: Vec<u8> = (0..rng.range(0, 56)).map(|i| (i * 5 + 1) as u8).collect();
        let mut param = cm::Param::with_data(&data);
        param.responder_resources = rng.range(0, 2) as u8;
        param.initiator_depth = rng.range(0, 2) as u8;
        mark(b'c');
        match conn.connect(&param, &ch, Duration::from_secs(5)) {
            Ok(ev) if ev.event == EventType::Established => {}
            _ => {
                failed += 1;
                mark(b'x');
                drop(conn);
                std::thread::sleep(Duration::from_millis(rng.range(10, 200)));
                continue;
            }
        }
        mark(b'e');
        for round in 0..rng.range(1, 60) {
            if rng.pct(60) {
                let msg: Vec<u8> = (0..rng.range(1, 512)).map(|i| (i + round) as u8).collect();
                if conn.send(&msg).is_err() {
                    break;
                }
                mark(b'd');
            }
            if conn.recv(Duration::from_millis(rng.range(1, 100))).is_ok() {
                mark(b'd');
            }
            if ch
                .next(Duration::from_millis(1))
                .is_ok_and(|ev| ev.event == EventType::Disconnected)
            {
                break;
            }
        }
        if rng.pct(50) {
            let _ = conn.disconnect();
            let _ = ch.next(Duration::from_millis(500));
        }
        drop(conn);
        break;
    }
    mark(b'q');
    Ok(())
}
