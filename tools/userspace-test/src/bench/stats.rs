// SPDX-License-Identifier: GPL-2.0
//! The benchmark's numbers: per-repetition summaries, the CPU counters, and
//! the three output files (`results.json`, `table.md`, `plot.tsv`).

use anyhow::{Context, Result};
use std::{
    fmt::Write as _,
    path::Path,
    time::{Duration, Instant},
};

/// One repetition of one measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    pub median: f64,
    pub p99: f64,
    pub mean: f64,
    pub count: usize,
}

impl Sample {
    /// A distribution (any order); `None` when empty.
    pub fn of(values: &[f64]) -> Option<Self> {
        if values.is_empty() {
            return None;
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        Some(Self {
            median: percentile(&v, 50.0),
            p99: percentile(&v, 99.0),
            mean: v.iter().sum::<f64>() / v.len() as f64,
            count: v.len(),
        })
    }

    /// A single figure over `count` operations (a rate, a CPU time per
    /// operation): median, p99 and mean are that figure.
    pub fn value(x: f64, count: usize) -> Self {
        Self {
            median: x,
            p99: x,
            mean: x,
            count,
        }
    }
}

/// Nearest-rank percentile of sorted, non-empty `v`.
fn percentile(v: &[f64], p: f64) -> f64 {
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// What the issue asks of the ratio kernel / user-space.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    None,
    AtLeast(f64),
    AtMost(f64),
}

impl Target {
    fn text(self) -> String {
        match self {
            Self::None => "—".into(),
            Self::AtLeast(x) => format!(">= {x}x"),
            Self::AtMost(x) => format!("<= {x}x"),
        }
    }

    fn met(self, ratio: Option<f64>) -> &'static str {
        match (self, ratio) {
            (Self::None, _) => "—",
            (_, None) => "?",
            (Self::AtLeast(x), Some(r)) if r >= x => "yes",
            (Self::AtMost(x), Some(r)) if r <= x => "yes",
            _ => "no",
        }
    }
}

/// A distribution (median and p99 rows) or one figure a repetition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Latency,
    Value,
}

#[derive(Debug)]
pub struct Measurement {
    pub name: String,
    pub side: &'static str,
    pub role: &'static str,
    pub unit: &'static str,
    pub kind: Kind,
    /// For [`Kind::Latency`], the target of the median and p99 rows.
    pub target: Target,
    /// The user-space measurement this one is compared with, when not the
    /// one of the same name (the synchronous kernel ids).
    pub compare_with: Option<String>,
    /// (repetition, summary).
    pub reps: Vec<(usize, Sample)>,
}

/// Everything measured, in the order first measured.
#[derive(Default)]
pub struct Results {
    pub ms: Vec<Measurement>,
    pub failures: Vec<String>,
}

/// The fixed description of a measurement ([`Results::add`]).
pub struct Meta<'a> {
    pub name: &'a str,
    pub side: &'static str,
    pub role: &'static str,
    pub unit: &'static str,
    pub kind: Kind,
    pub target: Target,
    pub compare_with: Option<&'a str>,
}

impl Results {
    pub fn add(&mut self, m: Meta<'_>, rep: usize, s: Sample) {
        let found = self
            .ms
            .iter_mut()
            .find(|x| x.name == m.name && x.side == m.side);
        match found {
            Some(x) => x.reps.push((rep, s)),
            None => self.ms.push(Measurement {
                name: m.name.into(),
                side: m.side,
                role: m.role,
                unit: m.unit,
                kind: m.kind,
                target: m.target,
                compare_with: m.compare_with.map(str::to_string),
                reps: vec![(rep, s)],
            }),
        }
    }

    /// The median over the repetitions of a measurement's medians.
    pub fn median(&self, name: &str, side: &str) -> Option<f64> {
        let m = self.find(name, side)?;
        Spread::of(m.reps.iter().map(|(_, s)| s.median).collect()).map(|s| s.median)
    }

    fn find(&self, name: &str, side: &str) -> Option<&Measurement> {
        self.ms.iter().find(|x| x.name == name && x.side == side)
    }

    /// The table's rows: (metric, kernel, user, unit, target), `None` where
    /// a side has no repetition.
    fn rows(&self) -> Vec<Row<'_>> {
        let mut out = Vec::new();
        for k in self.ms.iter().filter(|m| m.side == "kernel") {
            let user = self.find(k.compare_with.as_deref().unwrap_or(&k.name), "user");
            push_rows(&mut out, k, Some(k), user);
        }
        // User-space measurements no kernel one is compared with.
        for u in self.ms.iter().filter(|m| m.side == "user") {
            let paired = self.ms.iter().any(|k| {
                k.side == "kernel" && k.compare_with.as_deref().unwrap_or(&k.name) == u.name
            });
            if !paired {
                push_rows(&mut out, u, None, Some(u));
            }
        }
        out
    }
}

struct Row<'a> {
    metric: String,
    unit: &'a str,
    target: Target,
    kernel: Option<Spread>,
    user: Option<Spread>,
}

/// A figure over the repetitions: the median of the repetitions' figures,
/// their minimum and maximum.
#[derive(Clone, Copy)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
    reps: usize,
}

impl Spread {
    fn of(values: Vec<f64>) -> Option<Self> {
        let s = Sample::of(&values)?;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        // The median of an even count: the mean of the middle two.
        let mut v = values;
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n.is_multiple_of(2) {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        } else {
            s.median
        };
        Some(Self {
            median,
            min,
            max,
            reps: n,
        })
    }

    fn text(self) -> String {
        if self.reps == 1 {
            fmt(self.median)
        } else {
            format!("{} ({}–{})", fmt(self.median), fmt(self.min), fmt(self.max))
        }
    }
}

fn push_rows<'a>(
    out: &mut Vec<Row<'a>>,
    m: &'a Measurement,
    kernel: Option<&'a Measurement>,
    user: Option<&'a Measurement>,
) {
    let spread = |m: Option<&Measurement>, f: fn(&Sample) -> f64| {
        m.and_then(|m| Spread::of(m.reps.iter().map(|(_, s)| f(s)).collect()))
    };
    match m.kind {
        Kind::Latency => {
            for (what, f) in [
                ("median", (|s: &Sample| s.median) as fn(&Sample) -> f64),
                ("p99", |s: &Sample| s.p99),
            ] {
                out.push(Row {
                    metric: format!("{} {what}", m.name),
                    unit: m.unit,
                    target: m.target,
                    kernel: spread(kernel, f),
                    user: spread(user, f),
                });
            }
        }
        Kind::Value => out.push(Row {
            metric: m.name.clone(),
            unit: m.unit,
            target: m.target,
            kernel: spread(kernel, |s| s.median),
            user: spread(user, |s| s.median),
        }),
    }
}

/// Three significant digits, no exponent.
fn fmt(x: f64) -> String {
    let a = x.abs();
    if a >= 100.0 || a == 0.0 {
        format!("{x:.0}")
    } else if a >= 10.0 {
        format!("{x:.1}")
    } else if a >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// What the run was, for the headers.
pub struct RunInfo {
    pub date: String,
    pub clocksource: String,
    pub coarse: bool,
    pub kernel: String,
    pub cpus: usize,
    pub reps: usize,
    pub cycles: usize,
    pub round_trips: usize,
    pub messages: usize,
    pub rdma_ops: usize,
    pub message_size: usize,
    pub region: usize,
    pub counterpart: String,
    pub notes: Vec<String>,
    /// The numbers of connections open at once of the scaling curve
    /// (empty: not run).
    pub scale_counts: Vec<usize>,
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A JSON number (JSON has no NaN or infinity).
fn json_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

pub fn json(info: &RunInfo, r: &Results) -> String {
    let mut o = String::from("{\n");
    let _ = writeln!(o, "  \"date\": {},", json_str(&info.date));
    let _ = writeln!(o, "  \"clocksource\": {},", json_str(&info.clocksource));
    let _ = writeln!(o, "  \"coarse_clock_allowed\": {},", info.coarse);
    let _ = writeln!(o, "  \"kernel_release\": {},", json_str(&info.kernel));
    let _ = writeln!(o, "  \"cpus\": {},", info.cpus);
    let _ = writeln!(o, "  \"reps\": {},", info.reps);
    let _ = writeln!(o, "  \"cycles\": {},", info.cycles);
    let _ = writeln!(o, "  \"round_trips\": {},", info.round_trips);
    let _ = writeln!(o, "  \"messages\": {},", info.messages);
    let _ = writeln!(o, "  \"message_size\": {},", info.message_size);
    let _ = writeln!(o, "  \"rdma_ops\": {},", info.rdma_ops);
    let _ = writeln!(o, "  \"rdma_region\": {},", info.region);
    let _ = writeln!(o, "  \"counterpart\": {},", json_str(&info.counterpart));
    let notes: Vec<_> = info.notes.iter().map(|n| json_str(n)).collect();
    let _ = writeln!(o, "  \"notes\": [{}],", notes.join(", "));
    let fails: Vec<_> = r.failures.iter().map(|n| json_str(n)).collect();
    let _ = writeln!(o, "  \"failures\": [{}],", fails.join(", "));
    o.push_str("  \"measurements\": [\n");
    for (i, m) in r.ms.iter().enumerate() {
        let reps: Vec<_> = m
            .reps
            .iter()
            .map(|(rep, s)| {
                format!(
                    "{{\"rep\": {rep}, \"median\": {}, \"p99\": {}, \"mean\": {}, \"count\": {}}}",
                    json_num(s.median),
                    json_num(s.p99),
                    json_num(s.mean),
                    s.count
                )
            })
            .collect();
        let _ = write!(
            o,
            "    {{\"name\": {}, \"side\": {}, \"role\": {}, \"unit\": {}, \"kind\": {}, \"reps\": [{}]}}",
            json_str(&m.name),
            json_str(m.side),
            json_str(m.role),
            json_str(m.unit),
            json_str(match m.kind {
                Kind::Latency => "distribution",
                Kind::Value => "value",
            }),
            reps.join(", ")
        );
        o.push_str(if i + 1 < r.ms.len() { ",\n" } else { "\n" });
    }
    o.push_str("  ]\n}\n");
    o
}

pub fn table(info: &RunInfo, r: &Results) -> String {
    let mut o = String::new();
    let clock = if info.coarse {
        format!(
            "clocksource {} (coarse: every time moves in jiffies, latencies below a few ms are not measurable; reported because of --allow-coarse-clock)",
            info.clocksource
        )
    } else {
        format!("clocksource {}", info.clocksource)
    };
    let _ = writeln!(
        o,
        "Benchmark of {}, kernel {}, {} CPUs, {clock}; {} reps, {} cycles, {} round trips, {} messages of {} B, {} RDMA ops of {} B.\n",
        info.date,
        info.kernel,
        info.cpus,
        info.reps,
        info.cycles,
        info.round_trips,
        info.messages,
        info.message_size,
        info.rdma_ops,
        info.region
    );
    let _ = writeln!(o, "Counterpart: {}.\n", info.counterpart);
    for n in &info.notes {
        let _ = writeln!(o, "- {n}");
    }
    if !info.notes.is_empty() {
        o.push('\n');
    }
    o.push_str("| metric | kernel | user-space | ratio kernel/user | target | met? |\n");
    o.push_str("| --- | ---: | ---: | ---: | --- | --- |\n");
    for row in r.rows() {
        let ratio = match (row.kernel, row.user) {
            (Some(k), Some(u)) if u.median != 0.0 => Some(k.median / u.median),
            _ => None,
        };
        let cell =
            |s: Option<Spread>| s.map_or("—".into(), |s| format!("{} {}", s.text(), row.unit));
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} |",
            row.metric,
            cell(row.kernel),
            cell(row.user),
            ratio.map_or("—".into(), |x| format!("{x:.2}")),
            row.target.text(),
            row.target.met(ratio)
        );
    }
    if !r.failures.is_empty() {
        o.push_str("\nFailed (not in the table):\n\n");
        for f in &r.failures {
            let _ = writeln!(o, "- {f}");
        }
    }
    o
}

/// At most three decimals, trailing zeros dropped (4000.25, 150).
fn plain(x: f64) -> String {
    let s = format!("{x:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s.is_empty() || s == "-" {
        "0".into()
    } else {
        s.into()
    }
}

pub fn plot(r: &Results) -> String {
    let mut o = String::from("metric\tkernel\tuser\tunit\n");
    for row in r.rows() {
        let v = |s: Option<Spread>| s.map_or("NaN".into(), |s| plain(s.median));
        let _ = writeln!(
            o,
            "{}\t{}\t{}\t{}",
            row.metric,
            v(row.kernel),
            v(row.user),
            row.unit
        );
    }
    o
}

/// The name of a measurement of the scaling curve at `n` connections.
pub fn scale_name(n: usize, what: &str) -> String {
    format!("{n} at once: {what}")
}

/// The scaling curve: per number of connections open at once, the median
/// setup time (ms) and guest memory per connection (KiB) of both sides.
pub fn scale_tsv(counts: &[usize], r: &Results) -> String {
    let mut o = String::from(
        "connections\tkernel setup ms\tuser setup ms\tkernel KiB/conn\tuser KiB/conn\n",
    );
    for &n in counts {
        let v = |what: &str, side: &str| {
            r.median(&scale_name(n, what), side)
                .map_or("NaN".into(), plain)
        };
        let _ = writeln!(
            o,
            "{n}\t{}\t{}\t{}\t{}",
            v("setup", "kernel"),
            v("setup", "user"),
            v("guest memory per connection", "kernel"),
            v("guest memory per connection", "user")
        );
    }
    o
}

pub fn write_all(dir: &Path, info: &RunInfo, r: &Results) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    for (name, text) in [
        ("results.json", json(info, r)),
        ("table.md", table(info, r)),
        ("plot.tsv", plot(r)),
        ("scale.tsv", scale_tsv(&info.scale_counts, r)),
    ] {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    }
    Ok(())
}

/// The calling thread's CPU time (user + system), from
/// `getrusage(RUSAGE_THREAD)`.
pub fn thread_cpu() -> Duration {
    let Some(ru) = thread_rusage() else {
        return Duration::ZERO;
    };
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The calling thread's context switches: (voluntary, involuntary).
pub fn thread_switches() -> (u64, u64) {
    thread_rusage().map_or((0, 0), |ru| (ru.ru_nvcsw as u64, ru.ru_nivcsw as u64))
}

fn thread_rusage() -> Option<libc::rusage> {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes one struct rusage to the pointer, which has
    // room for it; RUSAGE_THREAD is valid on Linux.
    let r = unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) };
    // SAFETY: getrusage succeeded, so it filled the whole struct.
    (r == 0).then(|| unsafe { ru.assume_init() })
}

/// The guest's busy time over all CPUs, from `/proc/stat`'s `cpu` line
/// (everything but idle and iowait; guest time is inside user time), in
/// USER_HZ ticks (10 ms).
pub fn guest_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    if f.len() < 8 {
        return None;
    }
    let busy = f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    Some(Duration::from_millis(busy * 10))
}

/// CPU counters at the start of a measured loop.
pub struct Cpu {
    thread: Duration,
    switches: (u64, u64),
    guest: Option<Duration>,
    wall: Instant,
}

/// CPU time per operation of a measured loop, in µs.
#[derive(Clone, Copy)]
pub struct CpuPerOp {
    pub thread_us: f64,
    pub guest_us: Option<f64>,
    pub wall: Duration,
    /// The driving thread's voluntary context switches per operation (its
    /// sleeps, and its yields that let another task run) and involuntary
    /// ones (preemptions).
    pub switches: (f64, f64),
}

impl Cpu {
    pub fn start() -> Self {
        Self {
            thread: thread_cpu(),
            switches: thread_switches(),
            guest: guest_busy(),
            wall: Instant::now(),
        }
    }

    pub fn per_op(&self, ops: usize) -> CpuPerOp {
        let n = ops.max(1) as f64;
        let thread = thread_cpu().saturating_sub(self.thread);
        let guest = match (self.guest, guest_busy()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        let (v, i) = thread_switches();
        CpuPerOp {
            switches: (
                v.saturating_sub(self.switches.0) as f64 / n,
                i.saturating_sub(self.switches.1) as f64 / n,
            ),
            thread_us: thread.as_secs_f64() * 1e6 / n,
            guest_us: guest.map(|g| g.as_secs_f64() * 1e6 / n),
            wall: self.wall.elapsed(),
        }
    }
}

/// The UTC date and time of `t`, ISO 8601.
pub fn utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Sample::of(&v).unwrap();
        assert_eq!(s.median, 50.0);
        assert_eq!(s.p99, 99.0);
        assert_eq!(s.mean, 50.5);
        assert_eq!(s.count, 100);
        let one = Sample::of(&[7.0]).unwrap();
        assert_eq!((one.median, one.p99), (7.0, 7.0));
        assert!(Sample::of(&[]).is_none());
    }

    #[test]
    fn dates_are_utc() {
        let t = std::time::UNIX_EPOCH + Duration::from_secs(1_795_599_730);
        assert_eq!(utc(t), "2026-11-25T09:42:10Z");
        assert_eq!(utc(std::time::UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn table_pairs_sides_and_judges_targets() {
        let mut r = Results::default();
        let meta = |side| Meta {
            name: "connect active: conn/s",
            side,
            role: "active",
            unit: "conn/s",
            kind: Kind::Value,
            target: Target::AtLeast(1.3),
            compare_with: None,
        };
        r.add(meta("kernel"), 1, Sample::value(200.0, 10));
        r.add(meta("kernel"), 2, Sample::value(100.0, 10));
        r.add(meta("user"), 1, Sample::value(100.0, 10));
        r.add(meta("user"), 2, Sample::value(100.0, 10));
        let info = RunInfo {
            date: "d".into(),
            clocksource: "tsc".into(),
            coarse: false,
            kernel: "k".into(),
            cpus: 2,
            reps: 2,
            cycles: 10,
            round_trips: 1,
            messages: 1,
            rdma_ops: 1,
            message_size: 4096,
            region: 1,
            counterpart: "c".into(),
            notes: vec![],
            scale_counts: vec![1, 10],
        };
        let t = table(&info, &r);
        assert!(
            t.contains("| connect active: conn/s | 150 (100–200) conn/s | 100 (100–100) conn/s | 1.50 | >= 1.3x | yes |"),
            "{t}"
        );
        let p = plot(&r);
        assert_eq!(
            p,
            "metric\tkernel\tuser\tunit\nconnect active: conn/s\t150\t100\tconn/s\n"
        );
        assert!(json(&info, &r).contains("\"side\": \"kernel\""));
        // The scaling curve: a row per count, NaN where a side has none.
        for (side, ms) in [("kernel", 5.0), ("user", 12.5)] {
            let name = scale_name(10, "setup");
            let m = Meta {
                name: &name,
                side,
                role: "active",
                unit: "ms",
                kind: Kind::Value,
                target: Target::None,
                compare_with: None,
            };
            r.add(m, 1, Sample::value(ms, 10));
        }
        assert_eq!(
            scale_tsv(&info.scale_counts, &r),
            "connections\tkernel setup ms\tuser setup ms\tkernel KiB/conn\tuser KiB/conn\n\
             1\tNaN\tNaN\tNaN\tNaN\n10\t5\t12.5\tNaN\tNaN\n"
        );
        assert_eq!(plain(4000.2500000000005), "4000.25");
        assert_eq!(plain(0.0), "0");
        assert_eq!(plain(4.98373955), "4.984");
    }
}
