// SPDX-License-Identifier: GPL-2.0

//! State the threads share: options, counters, findings, the trace, and
//! the kernel stacks of tasks in D state on a hang.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Shared run state: trace, counters, findings, watchdog.

pub(super) struct Shared {
    pub(super) opts: OptionsLite,
    pub(super) stop: AtomicBool,
    pub(super) trace: Mutex<TraceSink>,
    pub(super) counts: Mutex<BTreeMap<(Cmd, String), u64>>,
    /// Counts of the other kinds of operation and of what they led to.
    pub(super) kinds: Mutex<BTreeMap<&'static str, u64>>,
    pub(super) findings: Mutex<Vec<String>>,
    /// Per thread: start of the running call (ms since `t0`, 0 = idle) and
    /// its trace line.
    pub(super) busy: Vec<(AtomicU64, Mutex<String>)>,
    pub(super) t0: Instant,
    pub(super) files_opened: AtomicU64,
    /// Regions registered by any thread: RDMA targets (addr, rkey, len).
    pub(super) regions: Mutex<Vec<(u64, u32, u32)>>,
    /// Threads that generate ioctls and have not finished: the actors stop
    /// with the last of them.
    pub(super) workers_left: AtomicU32,
    pub(super) signals: Signaller,
    /// The live peer processes, for a run that ends on a hang.
    pub(super) peer_pids: Mutex<Vec<u32>>,
    /// Ports of the last RC listeners on the local address (or any).
    pub(super) listen_ports: Mutex<VecDeque<u16>>,
    /// Ports of the last UD listeners there: UD ids of every thread
    /// resolve them for their SIDR lookups.
    pub(super) ud_listen_ports: Mutex<VecDeque<u16>>,
    pub(super) quiet: bool,
    /// The blocked tasks were dumped (at the first HANG finding).
    hang_dumped: AtomicBool,
}

#[derive(Clone)]
pub(super) struct OptionsLite {
    pub(super) local: Ipv4Addr,
    pub(super) port_base: u16,
    pub(super) files: u32,
    pub(super) keep_going: bool,
    pub(super) siw_addr: Ipv4Addr,
    /// Peer processes at most (slots of the peer actor).
    pub(super) peers: u32,
    /// The program the peers run (this one), if known.
    pub(super) exe: Option<PathBuf>,
    /// The siw device and its netdev, if the link actor may use them.
    pub(super) link: Option<(String, String)>,
    /// Bound of one actor step or fork child (below the hang watchdog).
    pub(super) step: Duration,
    /// The NVMe target sample's port, when the run loaded it.
    pub(super) nvmet_port: Option<u16>,
}

impl OptionsLite {
    /// For the unit tests: no device needed.
    #[cfg(test)]
    pub(super) fn test() -> Self {
        Self {
            local: Ipv4Addr::new(192, 0, 2, 1),
            port_base: 7600,
            files: 3,
            keep_going: true,
            siw_addr: Ipv4Addr::new(203, 0, 113, 1),
            peers: 3,
            exe: None,
            link: None,
            step: Duration::from_secs(10),
            nvmet_port: None,
        }
    }
}

pub(super) const TAIL: usize = 50;
/// Lines kept in memory for the shrink.
pub(super) const KEEP_LINES: usize = 400_000;

pub(super) struct TraceSink {
    pub(super) file: Option<BufWriter<std::fs::File>>,
    pub(super) tail: VecDeque<String>,
    pub(super) all: Vec<String>,
    pub(super) all_complete: bool,
}

impl Shared {
    pub(super) fn new(
        opts: OptionsLite,
        threads: u32,
        file: Option<BufWriter<std::fs::File>>,
    ) -> Self {
        Self {
            opts,
            stop: AtomicBool::new(false),
            trace: Mutex::new(TraceSink {
                file,
                tail: VecDeque::new(),
                all: Vec::new(),
                all_complete: true,
            }),
            counts: Mutex::new(BTreeMap::new()),
            kinds: Mutex::new(BTreeMap::new()),
            findings: Mutex::new(Vec::new()),
            busy: (0..threads)
                .map(|_| (AtomicU64::new(0), Mutex::new(String::new())))
                .collect(),
            t0: Instant::now(),
            files_opened: AtomicU64::new(0),
            regions: Mutex::new(Vec::new()),
            workers_left: AtomicU32::new(0),
            signals: Signaller::default(),
            peer_pids: Mutex::new(Vec::new()),
            listen_ports: Mutex::new(VecDeque::new()),
            ud_listen_ports: Mutex::new(VecDeque::new()),
            quiet: false,
            hang_dumped: AtomicBool::new(false),
        }
    }

    pub(super) fn kind(&self, k: &'static str) {
        *self.kinds.lock().unwrap().entry(k).or_default() += 1;
    }

    pub(super) fn log(&self, line: &str) {
        let mut t = self.trace.lock().unwrap();
        if let Some(f) = t.file.as_mut() {
            // Line by line: a kernel panic loses nothing written before it.
            let _ = writeln!(f, "{line}");
            let _ = f.flush();
        }
        if t.tail.len() == TAIL {
            t.tail.pop_front();
        }
        t.tail.push_back(line.to_string());
        if t.all.len() < KEEP_LINES {
            t.all.push(line.to_string());
        } else {
            t.all_complete = false;
        }
    }

    pub(super) fn count(&self, cmd: Cmd, r: std::result::Result<(), i32>) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry((cmd, show_result(r)))
            .or_default() += 1;
    }

    pub(super) fn finding(&self, what: String) {
        if !self.quiet {
            eprintln!("fuzz: FINDING: {what}");
            if what.starts_with("HANG") && !self.hang_dumped.swap(true, Ordering::SeqCst) {
                // Where the stuck tasks wait, while they still do (the
                // run's end may free them, or leave them for the VM's
                // teardown): the kernel stacks of every task in D state.
                eprint!("{}", blocked_tasks());
            }
        }
        let mut f = self.findings.lock().unwrap();
        f.push(what);
        if !self.opts.keep_going {
            self.stop.store(true, Ordering::SeqCst);
        }
    }
}

/// Every task in uninterruptible sleep (state D) with its command, wait
/// channel and kernel stack (`/proc/PID/task/TID/stack`, root only), one
/// `#` comment a line: what a HANG waits for.  Empty without /proc.
pub(super) fn blocked_tasks() -> String {
    let mut out = String::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    let read = |p: &Path, f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
    for proc in procs.flatten() {
        let Ok(tasks) = std::fs::read_dir(proc.path().join("task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let p = task.path();
            let state = read(&p, "status")
                .lines()
                .find_map(|l| l.strip_prefix("State:").map(|s| s.trim().to_string()))
                .unwrap_or_default();
            if !state.starts_with('D') {
                continue;
            }
            let _ = writeln!(
                out,
                "# fuzz: blocked task {} ({}), waiting in {}:",
                task.file_name().to_string_lossy(),
                read(&p, "comm").trim(),
                read(&p, "wchan").trim()
            );
            for frame in read(&p, "stack").lines().take(24) {
                let _ = writeln!(out, "#   {frame}");
            }
        }
    }
    if out.is_empty() {
        out.push_str("# fuzz: no task in D state\n");
    }
    out
}
