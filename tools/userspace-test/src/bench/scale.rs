// SPDX-License-Identifier: GPL-2.0
//! Many connections open at once: the side under test opens `n`
//! connections to the counterpart's listener concurrently (each step is
//! started on every id before the first of its events is awaited), keeps
//! them all open, then disconnects and destroys them all.  Per `n`: the
//! time until the last one was established, connections per second, the
//! teardown time, and the guest's memory in use per open connection.
//!
//! The memory figure is the growth of the guest's `MemTotal -
//! MemAvailable` from before the first id to when all `n` are established,
//! divided by `n`: it holds both ends of each connection (the counterpart's
//! ids, QPs and buffers as well as the side under test's) and what rxe
//! allocates for them, the same for both sides under test, so the
//! difference between the two sides is the difference of the side under
//! test alone.
//!
//! A count below [`CONNECTIONS_A_POINT`] is measured in rounds, one after
//! the other, until that many connections were made (1 at once: 100
//! rounds; 10 at once: 10): one connection's setup takes a few
//! milliseconds, where the scheduler's tick alone moves a single sample by
//! a fifth.  Its setup and teardown are the rounds' medians, its CPU the
//! rounds' mean, its memory the first round's.

use super::peer::T;
use super::stats::Cpu;
use crate::cm::{self, Channel, Conn, IdKey};
use crate::report::EventType;
use crate::uapi::{Device, Param};
use anyhow::{bail, Context, Result};
use std::{
    collections::HashSet,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// The numbers of connections open at once: 2000 the most the bench VM's
/// 2 GiB hold comfortably (both ends' and rxe's 230 KiB a connection).
pub const COUNTS: [usize; 5] = [1, 10, 100, 1000, 2000];
/// Those of a `--quick` run.
pub const QUICK_COUNTS: [usize; 3] = [1, 10, 50];

/// The connections a point of the curve makes, at least: the rounds of a
/// smaller count (see the module's doc).
pub const CONNECTIONS_A_POINT: usize = 100;

/// The rounds of `n` at once.
pub fn rounds(n: usize) -> usize {
    CONNECTIONS_A_POINT.div_ceil(n.max(1))
}

/// `rounds` rounds of `one` as one point: the median setup and teardown,
/// the mean CPU per connection, the first round's memory (`one(true)`:
/// only that round measures it, which waits for the memory to settle).
pub fn repeated(rounds: usize, mut one: impl FnMut(bool) -> Result<Point>) -> Result<Point> {
    let mut points = Vec::with_capacity(rounds.max(1));
    points.push(one(true)?);
    for _ in 1..rounds {
        points.push(one(false)?);
    }
    Ok(Point::combined(points))
}

/// Address and route resolution timeout of the module's ids, in ms.
const RESOLVE_MS: u32 = 5000;
/// Longest wait for the next event of a phase, in ms.
const EVENT_MS: u32 = 20_000;

/// What one side measured at one `n`.
pub struct Point {
    pub n: usize,
    /// From the first CREATE_ID to the last ESTABLISHED.
    pub setup: Duration,
    /// From the first DISCONNECT to the last DESTROY.
    pub teardown: Duration,
    /// Guest memory in use per open connection, KiB (`None` without
    /// `/proc/meminfo`).
    pub kib_per_conn: Option<f64>,
    pub cpu: super::stats::CpuPerOp,
}

impl Point {
    /// The point of `n` connections; `mem` is the guest's memory in use
    /// before the first id and once all were established.
    fn new(
        n: usize,
        setup: Duration,
        teardown: Duration,
        mem: (Option<u64>, Option<u64>),
        cpu: &Cpu,
    ) -> Self {
        let kib_per_conn = match mem {
            (Some(before), Some(after)) => Some(after.saturating_sub(before) as f64 / n as f64),
            _ => None,
        };
        Self {
            n,
            setup,
            teardown,
            kib_per_conn,
            cpu: cpu.per_op(n),
        }
    }

    /// The rounds of one count (at least one, the first measuring the
    /// memory) as one point.
    fn combined(mut points: Vec<Point>) -> Point {
        if points.len() == 1 {
            return points.remove(0);
        }
        let k = points.len() as f64;
        let median = |f: fn(&Point) -> Duration| {
            let mut v: Vec<Duration> = points.iter().map(f).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let mean = |f: fn(&Point) -> f64| points.iter().map(f).sum::<f64>() / k;
        let first = &points[0];
        Point {
            n: first.n,
            setup: median(|p| p.setup),
            teardown: median(|p| p.teardown),
            kib_per_conn: first.kib_per_conn,
            cpu: super::stats::CpuPerOp {
                thread_us: mean(|p| p.cpu.thread_us),
                guest_us: points
                    .iter()
                    .map(|p| p.cpu.guest_us)
                    .sum::<Option<f64>>()
                    .map(|g| g / k),
                wall: points.iter().map(|p| p.cpu.wall).sum(),
                switches: (mean(|p| p.cpu.switches.0), mean(|p| p.cpu.switches.1)),
            },
        }
    }
}

/// The guest's memory in use, KiB: `MemTotal - MemAvailable`.
fn mem_used_kib() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        m.lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some(field("MemTotal:")?.saturating_sub(field("MemAvailable:")?))
}

/// The guest's memory in use once the frees still under way settled (RCU
/// callbacks, rxe's and the CM's deferred cleanup of the run before): read
/// every 100 ms until two readings are within 64 KiB, for at most 3 s.
fn settled_mem_used_kib() -> Option<u64> {
    let mut last = mem_used_kib()?;
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(100));
        let now = mem_used_kib()?;
        if now.abs_diff(last) < 64 {
            return Some(now);
        }
        last = now;
    }
    Some(last)
}

/// The module's ids of one run, destroyed on drop (an error midway).
struct KernelIds<'d> {
    dev: &'d Device,
    ids: Vec<u32>,
}

impl Drop for KernelIds<'_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            let _ = self.dev.destroy(id);
        }
    }
}

/// Waits until every id of `ids` had its `want` event, reading events with
/// `next` (id, type, status); any other event of one of them is an error,
/// events of other ids and TIMEWAIT_EXIT (which follows an IB disconnection
/// whenever its timewait ends, in no phase) are skipped.
fn collect<K: Copy + Eq + core::hash::Hash + core::fmt::Debug>(
    ids: &[K],
    want: EventType,
    mut next: impl FnMut() -> Result<(K, EventType, i32)>,
) -> Result<()> {
    let mut left: HashSet<K> = ids.iter().copied().collect();
    while !left.is_empty() {
        let (id, event, status) = next().with_context(|| {
            format!(
                "{} of {} ids still without {}",
                left.len(),
                ids.len(),
                want.name()
            )
        })?;
        if !left.contains(&id) || event == EventType::TimewaitExit {
            continue;
        }
        if event != want {
            bail!(
                "id {id:?}: expected {} but got {} (status {status})",
                want.name(),
                event.name()
            );
        }
        left.remove(&id);
    }
    Ok(())
}

fn kernel_collect(dev: &Device, ids: &[u32], want: EventType) -> Result<()> {
    collect(ids, want, || {
        let ev = dev.get_event(EVENT_MS).context("GET_EVENT")?;
        Ok((ev.id, ev.event, ev.status))
    })
}

/// The module active: `n` connections at once to the counterpart
/// listening on `dst`, on `dev` (opened once for all the rounds of a
/// point, as a ULP opens its device once).
pub fn kernel(dev: &Device, dst: SocketAddr, n: usize, measure_mem: bool) -> Result<Point> {
    let p = Param::with_data(&[]);
    let before = measure_mem.then(settled_mem_used_kib).flatten();
    let cpu = Cpu::start();
    let t0 = Instant::now();
    let mut ids = KernelIds {
        dev,
        ids: Vec::with_capacity(n),
    };
    for i in 0..n {
        ids.ids.push(dev.create_id(i as u64).context("CREATE_ID")?);
    }
    for &id in &ids.ids {
        dev.resolve_addr(id, &dst, RESOLVE_MS)
            .context("RESOLVE_ADDR")?;
    }
    kernel_collect(dev, &ids.ids, EventType::AddrResolved)?;
    for &id in &ids.ids {
        dev.resolve_route(id, RESOLVE_MS).context("RESOLVE_ROUTE")?;
    }
    kernel_collect(dev, &ids.ids, EventType::RouteResolved)?;
    for &id in &ids.ids {
        dev.connect(id, &p).context("CONNECT")?;
    }
    kernel_collect(dev, &ids.ids, EventType::Established)?;
    let setup = t0.elapsed();
    let after = measure_mem.then(mem_used_kib).flatten();
    let t1 = Instant::now();
    for &id in &ids.ids {
        dev.disconnect(id).context("DISCONNECT")?;
    }
    kernel_collect(dev, &ids.ids, EventType::Disconnected)?;
    for id in ids.ids.drain(..) {
        dev.destroy(id).context("DESTROY_ID")?;
    }
    Ok(Point::new(n, setup, t1.elapsed(), (before, after), &cpu))
}

fn user_collect(ch: &Channel, keys: &[IdKey], want: EventType) -> Result<()> {
    collect(keys, want, || {
        let ev = ch.next(T)?;
        Ok((ev.id, ev.event, ev.status))
    })
}

/// librdmacm active, as [`kernel`], on the event channel `ch` (made once
/// for all the rounds of a point); each connection creates its QP once its
/// route is resolved (the module does so inside CONNECT).
pub fn user(ch: &Channel, dst: SocketAddr, n: usize, measure_mem: bool) -> Result<Point> {
    let p = cm::Param::with_data(&[]);
    let before = measure_mem.then(settled_mem_used_kib).flatten();
    let cpu = Cpu::start();
    let t0 = Instant::now();
    let mut ids = Vec::with_capacity(n);
    for _ in 0..n {
        ids.push(cm::create_id(ch)?);
    }
    let keys: Vec<IdKey> = ids.iter().map(|id| id.key()).collect();
    for id in &ids {
        cm::start_resolve_addr(id, &dst, T)?;
    }
    user_collect(ch, &keys, EventType::AddrResolved)?;
    for id in &ids {
        cm::start_resolve_route(id, T)?;
    }
    user_collect(ch, &keys, EventType::RouteResolved)?;
    let conns = ids.into_iter().map(Conn::new).collect::<Result<Vec<_>>>()?;
    for c in &conns {
        c.start_connect(&p)?;
    }
    user_collect(ch, &keys, EventType::Established)?;
    let setup = t0.elapsed();
    let after = measure_mem.then(mem_used_kib).flatten();
    let t1 = Instant::now();
    for c in &conns {
        c.disconnect()?;
    }
    user_collect(ch, &keys, EventType::Disconnected)?;
    drop(conns);
    Ok(Point::new(n, setup, t1.elapsed(), (before, after), &cpu))
}
