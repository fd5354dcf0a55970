// SPDX-License-Identifier: GPL-2.0
//! `userspace-test bench`: the in-kernel CM consumer (the module, driven
//! through `/dev/rdma_cm_rs`) against a user-space librdmacm peer doing the
//! same work, both facing the same librdmacm counterpart (threads of this
//! process, [`peer`]).  Run in the test VM with the module loaded.
//!
//! Per repetition, each with both sides (the kernel first in odd
//! repetitions, the user side first in even ones):
//!  - connection setup, sequential cycles ([`conn`]): active (asynchronous
//!    ids, and the module's synchronous ids), passive;
//!  - round trips of a small and the largest message, send throughput,
//!    RDMA WRITE and READ throughput ([`data`]);
//!  - the CPU time of the driving thread and of the whole guest per
//!    operation, for each of them.
//!
//! Writes `results.json`, `table.md` and `plot.tsv` ([`stats`]) into the
//! output directory; a progress line a step and repetition on stderr.

mod conn;
mod data;
mod peer;
mod sample;
mod scale;
pub mod stats;
mod store;

use anyhow::{bail, Context, Result};
use stats::{Cpu, CpuPerOp, Kind, Meta, Results, RunInfo, Sample, Target};
use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

/// What `bench` was asked.
#[derive(clap::Args)]
pub struct Options {
    /// Where the three files go (created).
    #[arg(long)]
    pub out_dir: PathBuf,
    /// 1 repetition, 50 cycles, 100 round trips, 10 RDMA operations.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions (default 3, --quick 1).
    #[arg(long)]
    pub reps: Option<usize>,
    /// Connection cycles a run (default 1000, --quick 50).
    #[arg(long)]
    pub cycles: Option<usize>,
    /// Round trips a message size (default 1000, --quick 100); twice
    /// as many messages for the send throughput.
    #[arg(long)]
    pub round_trips: Option<usize>,
    /// Messages of the send throughput (default twice the round trips):
    /// with few round trips, a profile of the sends alone.
    #[arg(long)]
    pub messages: Option<usize>,
    /// RDMA WRITEs and READs of the largest region a run (default 100,
    /// --quick 10).
    #[arg(long)]
    pub rdma_ops: Option<usize>,
    /// Report even on a jiffies clocksource (functional runs).
    #[arg(long)]
    pub allow_coarse_clock: bool,
    /// Only these groups, comma-separated: active, sync, passive, data,
    /// data-sleeping, sample, sample-sleeping, store, store-sleeping, scale.
    #[arg(long)]
    pub only: Option<String>,
    /// Only this side under test, kernel or user (profiling one of them;
    /// the table then has no ratios).
    #[arg(long, value_parser = ["kernel", "user"])]
    pub side: Option<String>,
}

const GROUPS: [&str; 10] = [
    "active",
    "sync",
    "passive",
    "data",
    "data-sleeping",
    "sample",
    "sample-sleeping",
    "store",
    "store-sleeping",
    "scale",
];

/// Ports of the benchmark: 9000-9099, a fresh one for every run of a side.
const PORT_BASE: u16 = 9000;
const PORTS: u16 = 100;

const CLOCKSOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

/// Largest RDMA region: the module's limit (`RDMA_CM_RS_MAX_MR_LEN`, the
/// 1 MiB the issue asks).
const REGION: usize = crate::uapi::RDMA_CM_RS_MAX_MR_LEN as usize;

/// What one run of one side measured.
#[derive(Clone)]
pub struct Block {
    pub name: String,
    pub ops: usize,
    /// (step, µs per operation); an empty step names the block itself.
    pub dists: Vec<(String, Vec<f64>)>,
    pub dist_target: Target,
    /// A figure over the whole run: (value, unit, target).
    pub rate: Option<(f64, &'static str, Target)>,
    pub cpu: CpuPerOp,
    /// The target of the driving thread's CPU per operation.
    pub cpu_target: Target,
    /// The CPU per operation of the counterpart's thread, µs (connection
    /// groups, where it sleeps between events): the share of the cycle
    /// that is the same for both sides.
    pub counterpart_us: Option<f64>,
}

/// Per-step times of connection cycles.
pub struct Steps {
    names: Vec<String>,
    v: Vec<Vec<f64>>,
}

impl Steps {
    fn new(names: &[&str]) -> Self {
        Self {
            names: names.iter().map(|s| s.to_string()).collect(),
            v: vec![Vec::new(); names.len()],
        }
    }

    /// One cycle: `t` holds the instant before the first step and after
    /// each.
    fn add(&mut self, t: &[Instant]) {
        for (i, v) in self.v.iter_mut().enumerate() {
            if let (Some(a), Some(b)) = (t.get(i), t.get(i + 1)) {
                v.push((*b - *a).as_secs_f64() * 1e6);
            }
        }
    }

    fn block(self, cycles: usize, cpu: &Cpu) -> Block {
        let c = cpu.per_op(cycles);
        Block {
            name: String::new(),
            ops: cycles,
            dists: self.names.into_iter().zip(self.v).collect(),
            dist_target: Target::None,
            rate: Some((
                cycles as f64 / c.wall.as_secs_f64().max(1e-9),
                "conn/s",
                Target::AtLeast(1.3),
            )),
            cpu: c,
            cpu_target: Target::None,
            counterpart_us: None,
        }
    }
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// Hands out the benchmark's ports in turn.
struct Ports(u16);

impl Ports {
    fn next(&mut self, ip: IpAddr) -> SocketAddr {
        let p = PORT_BASE + self.0 % PORTS;
        self.0 += 1;
        SocketAddr::new(ip, p)
    }
}

/// Where one side's run goes in the results.
struct Slot<'a> {
    side: &'static str,
    role: &'static str,
    rep: usize,
    reps: usize,
    /// For a variant of the module's side (its synchronous ids, its
    /// waits that sleep): the suffix its blocks' names carry; each is
    /// compared with the user-space block of the name without it.
    compare_suffix: Option<&'a str>,
}

fn unit_ops(b: &Block) -> &'static str {
    if b.rate.is_some_and(|r| r.1 == "conn/s") {
        "cycles"
    } else if b.rate.is_some() {
        "operations"
    } else {
        "round trips"
    }
}

/// Prints and files the failure of `what` in slot `s`.
fn record_failure(res: &mut Results, what: &str, s: &Slot<'_>, e: anyhow::Error) {
    let msg = format!("{what} {} rep {}/{}: {e:#}", s.side, s.rep, s.reps);
    eprintln!("bench: {msg}: FAILED");
    res.failures.push(msg);
}

/// Prints the progress line of `r` and files it.
fn record(res: &mut Results, what: &str, s: &Slot<'_>, r: Result<Vec<Block>>) {
    let blocks = match r {
        Ok(b) => b,
        Err(e) => return record_failure(res, what, s, e),
    };
    for b in blocks {
        let mut line = format!(
            "bench: {} {} rep {}/{}: {} {}",
            b.name,
            s.side,
            s.rep,
            s.reps,
            b.ops,
            unit_ops(&b)
        );
        let compare = |name: &str| {
            s.compare_suffix.and_then(|suffix| {
                let base = b.name.strip_suffix(suffix)?;
                Some(format!("{base}{}", &name[b.name.len()..]))
            })
        };
        for (step, v) in &b.dists {
            let name = if step.is_empty() {
                b.name.clone()
            } else {
                format!("{}: {step}", b.name)
            };
            let Some(sample) = Sample::of(v) else {
                continue;
            };
            if step.is_empty() {
                line += &format!(", median {:.0} us, p99 {:.0} us", sample.median, sample.p99);
            }
            res.add(
                Meta {
                    name: &name,
                    side: s.side,
                    role: s.role,
                    unit: "us",
                    kind: Kind::Latency,
                    target: b.dist_target,
                    compare_with: compare(&name).as_deref(),
                },
                s.rep,
                sample,
            );
        }
        if let Some((x, unit, target)) = b.rate {
            line += &format!(", {x:.1} {unit}");
            let name = format!("{}: {unit}", b.name);
            res.add(
                Meta {
                    name: &name,
                    side: s.side,
                    role: s.role,
                    unit,
                    kind: Kind::Value,
                    target,
                    compare_with: compare(&name).as_deref(),
                },
                s.rep,
                Sample::value(x, b.ops),
            );
        }
        let mut cpu = vec![(
            "CPU of the driving thread per op",
            Some(b.cpu.thread_us),
            b.cpu_target,
        )];
        cpu.push(("guest CPU busy per op", b.cpu.guest_us, Target::None));
        cpu.push((
            "CPU of the counterpart's thread per op",
            b.counterpart_us,
            Target::None,
        ));
        line += &format!(", thread CPU {:.0} us/op", b.cpu.thread_us);
        if let Some(g) = b.cpu.guest_us {
            line += &format!(", guest busy {g:.0} us/op");
        }
        if let Some(c) = b.counterpart_us {
            line += &format!(", counterpart CPU {c:.0} us/op");
        }
        line += &format!(
            ", context switches {:.2} voluntary, {:.2} involuntary per op",
            b.cpu.switches.0, b.cpu.switches.1
        );
        for (what, v, target) in cpu {
            let Some(v) = v else {
                continue;
            };
            let name = format!("{}: {what}", b.name);
            res.add(
                Meta {
                    name: &name,
                    side: s.side,
                    role: s.role,
                    unit: "us/op",
                    kind: Kind::Value,
                    target,
                    compare_with: compare(&name).as_deref(),
                },
                s.rep,
                Sample::value(v, b.ops),
            );
        }
        eprintln!("{line}");
    }
}

/// Files the figures of one side at one point of the scaling curve, with
/// the counterpart listener's CPU per connection.
fn record_scale(
    res: &mut Results,
    s: &Slot<'_>,
    r: Result<scale::Point>,
    counterpart_us: Option<f64>,
) {
    let p = match r {
        Ok(p) => p,
        Err(e) => return record_failure(res, "connections at once", s, e),
    };
    let secs = p.setup.as_secs_f64().max(1e-9);
    let mut figures = vec![
        ("setup", p.setup.as_secs_f64() * 1e3, "ms", Target::None),
        ("conn/s", p.n as f64 / secs, "conn/s", Target::AtLeast(1.3)),
        (
            "teardown",
            p.teardown.as_secs_f64() * 1e3,
            "ms",
            Target::None,
        ),
        (
            "CPU of the driving thread per connection",
            p.cpu.thread_us,
            "us/op",
            Target::None,
        ),
    ];
    if let Some(c) = counterpart_us {
        figures.push((
            "CPU of the counterpart's thread per connection",
            c,
            "us/op",
            Target::None,
        ));
    }
    if let Some(k) = p.kib_per_conn {
        figures.push(("guest memory per connection", k, "KiB", Target::None));
    }
    let mut line = format!("bench: {} at once {} rep {}/{}", p.n, s.side, s.rep, s.reps);
    for (what, x, unit, target) in figures {
        line += &format!(", {what} {x:.1} {unit}");
        res.add(
            Meta {
                name: &stats::scale_name(p.n, what),
                side: s.side,
                role: s.role,
                unit,
                kind: Kind::Value,
                target,
                compare_with: None,
            },
            s.rep,
            Sample::value(x, p.n),
        );
    }
    eprintln!("{line}");
}

/// Files the end of a counterpart thread: its error is a failure.  The
/// CPU time the thread used.
fn counterpart_end(
    res: &mut Results,
    what: &str,
    s: &Slot<'_>,
    mut p: peer::Peer,
) -> Option<Duration> {
    if let Err(e) = p.finish() {
        record_failure(res, what, s, e.context("counterpart"));
    }
    p.cpu()
}

/// CPU time `cpu` per operation over `ops` operations, µs.
fn per_op_us(cpu: Option<Duration>, ops: usize) -> Option<f64> {
    cpu.map(|d| d.as_secs_f64() * 1e6 / ops.max(1) as f64)
}

/// An active connection group: `run` against a listener counterpart on
/// `addr`, whose CPU per connection its block gets.
fn active_group(
    res: &mut Results,
    what: &str,
    s: &Slot<'_>,
    addr: SocketAddr,
    cycles: usize,
    run: impl FnOnce() -> Result<Block>,
) {
    match peer::listener(addr) {
        Ok(l) => {
            let r = run();
            let c = per_op_us(counterpart_end(res, what, s, l), cycles);
            record(res, what, s, r.map(|b| named(b.with_counterpart(c), what)));
        }
        Err(e) => record(res, what, s, Err(e)),
    }
}

impl Block {
    /// The block with the counterpart's CPU per operation, µs.
    pub(super) fn with_counterpart(self, counterpart_us: Option<f64>) -> Self {
        Self {
            counterpart_us,
            ..self
        }
    }
}

/// The suffix of the rows of the module's side with sleeping waits.
const WAITS_SLEEP: &str = " (waits sleep)";

/// `blocks`, each name with [`WAITS_SLEEP`].
fn with_waits_sleep(blocks: Vec<Block>) -> Vec<Block> {
    blocks
        .into_iter()
        .map(|mut b| {
            b.name += WAITS_SLEEP;
            b
        })
        .collect()
}

/// The suffix of the rows where both sides' waits sleep: the module's
/// (no `RDMA_CM_RS_ID_BUSY_POLL`) and librdmacm's (a completion channel).
const BOTH_SLEEP: &str = " (both sides' waits sleep)";

/// `blocks`, each name with [`BOTH_SLEEP`] and no target: a like-for-like
/// comparison beside the targets' rows, which compare with the
/// busy-polling librdmacm side.
fn both_sleep(blocks: &[Block]) -> Vec<Block> {
    blocks
        .iter()
        .map(|b| Block {
            name: format!("{}{BOTH_SLEEP}", b.name),
            dist_target: Target::None,
            rate: b.rate.map(|(x, unit, _)| (x, unit, Target::None)),
            cpu_target: Target::None,
            ..b.clone()
        })
        .collect()
}

fn named(mut b: Block, name: &str) -> Vec<Block> {
    b.name = name.into();
    vec![b]
}

pub fn run(o: Options) -> Result<()> {
    let clocksource = read_trim(CLOCKSOURCE).unwrap_or_else(|| "unknown".into());
    let coarse = matches!(clocksource.as_str(), "jiffies" | "refined-jiffies");
    if coarse && !o.allow_coarse_clock {
        bail!(
            "the clocksource is {clocksource}: every clock of this machine moves in jiffies \
             (4 ms steps at HZ=250), so no latency below that can be measured; boot a kernel \
             with a fine clocksource (tsc, hpet, acpi_pm), or pass --allow-coarse-clock for a \
             functional run"
        );
    }
    let groups: Vec<&str> = match &o.only {
        Some(s) => s.split(',').map(str::trim).collect(),
        None => GROUPS.to_vec(),
    };
    if let Some(g) = groups.iter().find(|g| !GROUPS.contains(g)) {
        bail!("--only {g}: not one of {}", GROUPS.join(","));
    }
    let want = |g: &str| groups.contains(&g);
    let reps = o.reps.unwrap_or(if o.quick { 1 } else { 3 }).max(1);
    let cycles = o.cycles.unwrap_or(if o.quick { 50 } else { 1000 }).max(1);
    let round_trips = o
        .round_trips
        .unwrap_or(if o.quick { 100 } else { 1000 })
        .max(1);
    let ip: IpAddr = match std::env::var("RDMA_CM_RS_LOCAL_IP") {
        Ok(v) if !v.is_empty() => v
            .parse()
            .with_context(|| format!("RDMA_CM_RS_LOCAL_IP={v:?}"))?,
        _ => [192, 0, 2, 1].into(),
    };
    let abi = crate::uapi::Device::open_async()
        .with_context(|| format!("open {} (is the module loaded?)", crate::uapi::DEVICE))?
        .info()
        .context("INFO")?;
    // The largest message both sides take: the module's max_message and
    // the librdmacm peer's buffers.
    let large = (abi.max_message as usize).min(crate::cm::MSG);
    let sizes = data::Sizes {
        round_trips,
        small: 64,
        large,
        messages: o.messages.unwrap_or(round_trips * 2).max(1),
        rdma_ops: o.rdma_ops.unwrap_or(if o.quick { 10 } else { 100 }).max(1),
    };
    let scale_counts: Vec<usize> = if !want("scale") {
        Vec::new()
    } else if o.quick {
        scale::QUICK_COUNTS.to_vec()
    } else {
        scale::COUNTS.to_vec()
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let info = RunInfo {
        date: stats::utc(std::time::SystemTime::now()),
        clocksource: clocksource.clone(),
        coarse,
        kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
        cpus,
        reps,
        cycles,
        round_trips,
        messages: sizes.messages,
        rdma_ops: sizes.rdma_ops,
        message_size: large,
        region: REGION,
        counterpart: "plain librdmacm code (the tool's cm layer) in threads of the bench process, \
                      one event channel each, busy-polling its CQs"
            .into(),
        notes: notes(large, &groups),
        scale_counts: scale_counts.clone(),
    };
    eprintln!(
        "bench: clocksource {clocksource}{}, {reps} reps, {cycles} cycles, {round_trips} round trips, \
         {} messages of {large} B, {} RDMA ops of {REGION} B, address {ip}, groups {}",
        if coarse { " (coarse, allowed)" } else { "" },
        sizes.messages,
        sizes.rdma_ops,
        groups.join(",")
    );
    let mut res = Results::default();
    let mut ports = Ports(0);
    for rep in 1..=reps {
        let order: [&'static str; 2] = if rep % 2 == 1 {
            ["kernel", "user"]
        } else {
            ["user", "kernel"]
        };
        let sides: Vec<&'static str> = order
            .into_iter()
            .filter(|s| o.side.as_deref().is_none_or(|want| want == *s))
            .collect();
        let slot = |side, role| Slot {
            side,
            role,
            rep,
            reps,
            compare_suffix: None,
        };
        if want("active") {
            for &side in &sides {
                let s = slot(side, "active");
                let addr = ports.next(ip);
                active_group(&mut res, "connect active", &s, addr, cycles, || {
                    if side == "kernel" {
                        conn::kernel_active(addr, cycles, false)
                    } else {
                        conn::user_active(addr, cycles)
                    }
                });
            }
        }
        if want("sync") {
            let what = "connect active (sync ids)";
            let s = Slot {
                compare_suffix: Some(" (sync ids)"),
                ..slot("kernel", "active")
            };
            let addr = ports.next(ip);
            active_group(&mut res, what, &s, addr, cycles, || {
                conn::kernel_active(addr, cycles, true)
            });
        }
        if want("passive") {
            for &side in &sides {
                let s = slot(side, "passive");
                let addr = ports.next(ip);
                let what = "connect passive";
                let r = if side == "kernel" {
                    conn::kernel_passive(addr, cycles)
                } else {
                    conn::user_passive(addr, cycles)
                };
                record(&mut res, what, &s, r.map(|b| named(b, what)));
            }
        }
        if want("data") {
            for &side in &sides {
                let s = slot(side, "active");
                let addr = ports.next(ip);
                let what = "data";
                match peer::data_server(addr, REGION) {
                    Ok(srv) => {
                        let r = if side == "kernel" {
                            data::kernel(addr, sizes, true)
                        } else {
                            data::user(addr, sizes, true)
                        };
                        record(&mut res, what, &s, r);
                        counterpart_end(&mut res, what, &s, srv);
                    }
                    Err(e) => record(&mut res, what, &s, Err(e)),
                }
            }
        }
        // The module's side with its waits sleeping (no
        // RDMA_CM_RS_ID_BUSY_POLL: until the device notifies a completion;
        // no busy_poll=1: the samples' CQs polled from a workqueue),
        // compared with the same user-space rows.
        let sleeping = |role| Slot {
            compare_suffix: Some(WAITS_SLEEP),
            ..slot("kernel", role)
        };
        let sleeping_wanted = |g| want(g) && o.side.as_deref() != Some("user");
        if sleeping_wanted("data-sleeping") {
            let s = sleeping("active");
            let addr = ports.next(ip);
            let what = "data (waits sleep)";
            match peer::data_server(addr, REGION) {
                Ok(srv) => {
                    match data::kernel(addr, sizes, false) {
                        Ok(blocks) => {
                            let both = both_sleep(&blocks);
                            record(&mut res, what, &s, Ok(with_waits_sleep(blocks)));
                            record(&mut res, what, &slot("kernel", "active"), Ok(both));
                        }
                        Err(e) => record(&mut res, what, &s, Err(e)),
                    }
                    counterpart_end(&mut res, what, &s, srv);
                }
                Err(e) => record(&mut res, what, &s, Err(e)),
            }
        }
        // librdmacm with sleeping waits too, for the rows of both.
        if want("data-sleeping") && o.side.as_deref() != Some("kernel") {
            let s = slot("user", "active");
            let addr = ports.next(ip);
            let what = "data (both sides' waits sleep)";
            match peer::data_server(addr, REGION) {
                Ok(srv) => {
                    let r = data::user(addr, sizes, false).map(|b| both_sleep(&b));
                    record(&mut res, what, &s, r);
                    counterpart_end(&mut res, what, &s, srv);
                }
                Err(e) => record(&mut res, what, &s, Err(e)),
            }
        }
        if want("sample") {
            for &side in &sides {
                let s = slot(side, "passive");
                let addr = ports.next(ip);
                let r = if side == "kernel" {
                    sample::kernel(addr, cycles, sizes, true)
                } else {
                    sample::user(addr, cycles, sizes)
                };
                record(&mut res, sample::NAME, &s, r);
            }
        }
        if want("store") {
            for &side in &sides {
                let s = slot(side, "passive");
                let addr = ports.next(ip);
                let r = if side == "kernel" {
                    store::kernel(addr, sizes.round_trips, true)
                } else {
                    store::user(addr, sizes.round_trips)
                };
                record(&mut res, store::NAME, &s, r);
            }
        }
        if sleeping_wanted("sample-sleeping") {
            let s = sleeping("passive");
            let addr = ports.next(ip);
            let r = sample::kernel(addr, cycles, sizes, false).map(with_waits_sleep);
            record(&mut res, "echo service (waits sleep)", &s, r);
        }
        if sleeping_wanted("store-sleeping") {
            let s = sleeping("passive");
            let addr = ports.next(ip);
            let r = store::kernel(addr, sizes.round_trips, false).map(with_waits_sleep);
            record(&mut res, "store (waits sleep)", &s, r);
        }
        for &n in &scale_counts {
            for &side in &sides {
                let s = slot(side, "active");
                let addr = ports.next(ip);
                match peer::listener(addr) {
                    Ok(l) => {
                        let r = if side == "kernel" {
                            crate::uapi::Device::open_async()
                                .with_context(|| format!("open {}", crate::uapi::DEVICE))
                                .and_then(|dev| {
                                    scale::repeated(scale::rounds(n), |mem| {
                                        scale::kernel(&dev, addr, n, mem)
                                    })
                                })
                        } else {
                            crate::cm::Channel::new().and_then(|ch| {
                                scale::repeated(scale::rounds(n), |mem| {
                                    scale::user(&ch, addr, n, mem)
                                })
                            })
                        };
                        let cpu = counterpart_end(&mut res, "connections at once", &s, l);
                        let c = per_op_us(cpu, n * scale::rounds(n));
                        record_scale(&mut res, &s, r, c);
                    }
                    Err(e) => record_scale(&mut res, &s, Err(e), None),
                }
            }
        }
    }
    stats::write_all(&o.out_dir, &info, &res)?;
    print!("{}", stats::table(&info, &res));
    eprintln!(
        "bench: wrote results.json, table.md, plot.tsv and scale.tsv in {}",
        o.out_dir.display()
    );
    if !res.failures.is_empty() {
        bail!(
            "{} measurement(s) failed (listed in table.md)",
            res.failures.len()
        );
    }
    Ok(())
}

/// How the figures were made, and what is not measured.
fn notes(large: usize, groups: &[&str]) -> Vec<String> {
    let mut n = vec![
        "connect: the user side's connect step includes creating its PD, CQs, QP and \
         buffers and posting 16 receives (Conn::new), which the module does inside CONNECT; \
         passive: request runs from the counterpart's go (it resolves and connects) to \
         CONNECT_REQUEST, accept from there to ESTABLISHED; the side under test disconnects"
            .to_string(),
        format!(
            "messages: the module's SEND/RECV carry at most {large} B (INFO max_message), so \
             send throughput uses {large} B messages (not the issue's 64 KiB), with a window of \
             {} on both sides (the module's RDMA_CM_RS_SEND_NOWAIT, send_window); a round trip \
             posts its send and waits for the answer, the send's completion reaped after it \
             (module: NOWAIT)",
            crate::cm::SEND_WINDOW
        ),
        format!(
            "RDMA: one {} KiB region (the module's RDMA_CM_RS_MAX_MR_LEN), one operation in flight",
            REGION / 1024
        ),
        "the librdmacm side under test and the counterpart busy-poll their CQs (yielding between \
         polls); so does the module's caller in the data group (a busy-polling id, \
         RDMA_CM_RS_ID_BUSY_POLL: its RECV, SEND and RDMA poll the connection's CQ in the \
         caller's task for the first ms of a wait, then sleep until the device notifies), \
         while in the rows marked (waits sleep) it polls the CQ and sleeps until the device \
         notifies a completion; in the rows marked (both sides' waits sleep) so does \
         the librdmacm side under test (a completion channel: ibv_req_notify_cq, poll(2), \
         ibv_get_cq_event), a comparison without a target; the connection groups' ids do not \
         busy-poll"
            .into(),
        "CPU: the driving thread's getrusage(RUSAGE_THREAD) per operation (the module's work in \
         its ioctls included, not its work items or interrupts); guest: /proc/stat busy time of \
         all CPUs per operation (10 ms ticks; the counterpart and rxe included); in the \
         connection groups and connections at once, the counterpart's thread's \
         getrusage(RUSAGE_THREAD) over its life per connection (it sleeps between events): \
         work on the cycle's path that is the same for both sides"
            .into(),
        format!(
            "connections at once (scale): the side under test starts each step on all n ids \
             before awaiting that step's events (active side only); setup runs from the first \
             CREATE_ID to the last ESTABLISHED, teardown from the first DISCONNECT to the last \
             destroy; a count below {} runs in rounds until that many connections were made \
             (setup and teardown: the rounds' medians; CPU: their mean); guest memory per \
             connection is the growth of MemTotal - MemAvailable over the first round's setup \
             divided by n, both ends and rxe included (the same counterpart for both sides)",
            scale::CONNECTIONS_A_POINT
        ),
        format!(
            "{}: the side under test is an echo service, passive, with no ioctl in its loop: \
             the sample rdma_cm_rs_echo.ko (accepts in its request callback, echoes from its \
             completion handler, run by a loop that busy-polls each connection's CQ, \
             busy_poll=1; in the rows marked (waits sleep) by the CQ's workqueue) against the same service in user space (librdmacm, one thread \
             busy-polling); the counterpart is the driving thread, a busy-polling librdmacm \
             client, so the CPU of the driving thread is the counterpart's (the guest's busy \
             time includes the server's)",
            sample::NAME
        ),
        format!(
            "{}: the side under test serves the storage sample's protocol, passive: the sample \
             rdma_cm_rs_store.ko (an SRQ and a pool of CQs per device, each PUT an R/W API READ \
             of the client's buffer into pages copied into the store, each GET copied out and \
             WRITTEN with its answer chained behind; its CQs busy-polled, busy_poll=1, in the \
             rows marked (waits sleep) polled from a workqueue) against the same protocol in \
             user space (librdmacm, a registered store, RDMA READ and WRITE straight between it \
             and the client's buffer, busy-polling); the counterpart, a busy-polling librdmacm \
             client, makes one request at a time",
            store::NAME
        ),
        "not measured: the passive side of connections at once".into(),
    ];
    if !groups.contains(&"sync") || !groups.contains(&"active") {
        n.push(format!("groups run: {}", groups.join(",")));
    }
    n
}
