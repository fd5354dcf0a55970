// SPDX-License-Identifier: GPL-2.0

//! A run: threads, replay, the summary, and shrinking a failing trace.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Running.

/// The outcome of one run.
pub(super) struct Outcome {
    ops: u64,
    secs: f64,
    findings: Vec<String>,
    tail: Vec<String>,
    all: Option<Vec<String>>,
    hang: bool,
}

/// What a run found out about its surroundings once (not per replay).
pub(super) struct Env {
    /// This program, for the peers.
    exe: Option<PathBuf>,
    /// The siw device and its netdev, when the link actor may use them.
    link: Option<(String, String)>,
}

impl Env {
    fn probe(o: &Options) -> Self {
        let exe = std::env::current_exe().ok();
        let link = if o.link && device_exists(&o.siw_dev) {
            netdev_of(&o.siw_dev).map(|n| (o.siw_dev.clone(), n))
        } else {
            None
        };
        Self { exe, link }
    }

    /// The roles of a generating run: the ioctl threads, then the actors.
    fn roles(&self, o: &Options) -> Vec<Role> {
        let mut roles = vec![Role::Ioctl; o.threads as usize];
        if o.peers > 0 && self.exe.is_some() {
            roles.push(Role::Peers);
        }
        if self.link.is_some() {
            roles.push(Role::Link);
        }
        roles
    }
}

pub(super) fn run_once(
    o: &Options,
    env: &Env,
    script: Option<Vec<Vec<Op>>>,
    quiet: bool,
    trace_file: Option<&str>,
) -> Result<(Outcome, Arc<Shared>)> {
    // Generating: the ioctl threads and the actors.  Replaying: a thread a
    // script, an actor if all its lines are actor steps.
    let roles: Vec<Role> = match &script {
        None => env.roles(o),
        Some(s) => s
            .iter()
            .map(|ops| {
                if !ops.is_empty()
                    && ops
                        .iter()
                        .all(|op| matches!(op.act, Act::Peer { .. } | Act::Link { .. }))
                {
                    Role::Peers
                } else {
                    Role::Ioctl
                }
            })
            .collect(),
    };
    let threads = roles.len() as u32;
    let workers = roles.iter().filter(|&&r| r == Role::Ioctl).count() as u32;
    let file = match trace_file {
        Some(p) => Some(BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("create {p}"))?,
        )),
        None => None,
    };
    let mut shared = Shared::new(
        OptionsLite {
            local: o.local,
            port_base: o.port_base,
            files: o.files,
            keep_going: o.keep_going,
            siw_addr: o.siw_addr,
            peers: o.peers,
            exe: env.exe.clone(),
            link: env.link.clone(),
            step: Duration::from_secs((o.hang_secs * 2 / 3).max(1)),
            nvmet_port: o.nvmet_port,
        },
        threads,
        file,
    );
    shared.quiet = quiet;
    shared.workers_left.store(workers, Ordering::SeqCst);
    let sh = Arc::new(shared);
    install_signal_handler()?;
    let signaller = {
        let sh = sh.clone();
        std::thread::spawn(move || sh.signals.run())
    };
    let deadline = Instant::now() + Duration::from_secs(o.seconds);
    let per_thread = o.ops.map(|n| n.div_ceil(u64::from(workers.max(1))));
    let ops_done = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let mut script = script.map(|s| s.into_iter());
    for (t, &role) in roles.iter().enumerate() {
        let mut w = Worker::new(t as u32, o.seed, sh.clone())?;
        w.role = role;
        let ops = script.as_mut().map(|s| s.next().unwrap_or_default());
        let done = ops_done.clone();
        handles.push(std::thread::spawn(move || {
            // The signal lands only inside the call it is aimed at.
            block_signal(true);
            let mut n = 0u64;
            match ops {
                Some(ops) => {
                    for op in ops {
                        if w.sh.stop.load(Ordering::SeqCst) {
                            break;
                        }
                        w.exec(&op);
                        n += 1;
                    }
                }
                None if role != Role::Ioctl => {
                    while !w.sh.stop.load(Ordering::SeqCst)
                        && Instant::now() < deadline
                        && w.sh.workers_left.load(Ordering::SeqCst) > 0
                    {
                        let op = w.gen();
                        w.exec(&op);
                        n += 1;
                    }
                }
                None => {
                    while !w.sh.stop.load(Ordering::SeqCst)
                        && Instant::now() < deadline
                        && per_thread.is_none_or(|m| n < m)
                    {
                        let op = w.gen();
                        w.exec(&op);
                        n += 1;
                    }
                }
            }
            if role == Role::Ioctl {
                w.sh.workers_left.fetch_sub(1, Ordering::SeqCst);
            }
            w.finish();
            done.fetch_add(n, Ordering::SeqCst);
        }));
    }
    // Watchdog: every call is bounded; one that runs past the bound is a
    // hang (the device's, since every timeout we pass is short).
    let hang_ms = o.hang_secs * 1000;
    let mut hang = false;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(100));
        let now = sh.t0.elapsed().as_millis() as u64 + 1;
        for (t, (start, line)) in sh.busy.iter().enumerate() {
            let s = start.load(Ordering::SeqCst);
            // A call may have started after `now` was read: no underflow.
            if s != 0 && now.saturating_sub(s) > hang_ms {
                let line = line.lock().unwrap().clone();
                sh.finding(format!(
                    "HANG: thread {t} has been in one call for more than {} s: [{line}]",
                    o.hang_secs
                ));
                hang = true;
            }
        }
        if hang {
            break;
        }
    }
    if !hang {
        for h in handles {
            let _ = h.join();
        }
        sh.signals.finish();
        let _ = signaller.join();
    }
    let secs = sh.t0.elapsed().as_secs_f64();
    let mut tr = sh.trace.lock().unwrap();
    if let Some(f) = tr.file.as_mut() {
        let _ = f.flush();
    }
    let outcome = Outcome {
        ops: sh.counts.lock().unwrap().values().sum(),
        secs,
        findings: sh.findings.lock().unwrap().clone(),
        tail: tr.tail.iter().cloned().collect(),
        all: tr.all_complete.then(|| std::mem::take(&mut tr.all)),
        hang,
    };
    drop(tr);
    Ok((outcome, sh))
}

/// Groups trace lines by thread, in order.
pub(super) fn script_of(lines: &[String]) -> Result<Vec<Vec<Op>>> {
    let mut by: BTreeMap<u32, Vec<Op>> = BTreeMap::new();
    for (n, l) in lines.iter().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let op = Op::parse(l).with_context(|| format!("trace line {}: {l}", n + 1))?;
        by.entry(op.t).or_default().push(op);
    }
    let max = by.keys().next_back().copied().unwrap_or(0);
    Ok((0..=max)
        .map(|t| by.remove(&t).unwrap_or_default())
        .collect())
}

pub(super) fn summary(sh: &Shared, out: &Outcome, threads: u32) {
    let counts = sh.counts.lock().unwrap();
    let mut per: BTreeMap<Cmd, Vec<(String, u64)>> = BTreeMap::new();
    for ((c, r), n) in counts.iter() {
        per.entry(*c).or_default().push((r.clone(), *n));
    }
    println!("# fuzz: per command (result=count)");
    for (c, rs) in &per {
        let total: u64 = rs.iter().map(|r| r.1).sum();
        let detail: Vec<String> = rs.iter().map(|(r, n)| format!("{r}={n}")).collect();
        println!("#   {:<14} {:>7}  {}", c.name(), total, detail.join(" "));
    }
    let untouched: Vec<&str> = CMDS
        .iter()
        .filter(|c| !per.contains_key(&c.0))
        .map(|c| c.1)
        .collect();
    if !untouched.is_empty() {
        println!("# fuzz: commands never issued: {}", untouched.join(" "));
    }
    println!("# fuzz: per kind (count)");
    for (k, n) in sh.kinds.lock().unwrap().iter() {
        println!("#   {k:<40} {n:>7}");
    }
    println!(
        "# fuzz: {} ops in {:.1} s ({:.0} ops/s), {} files opened, {} threads, {} distinct (command, result) pairs, {} findings",
        out.ops,
        out.secs,
        out.ops as f64 / out.secs.max(0.001),
        sh.files_opened.load(Ordering::Relaxed),
        threads,
        counts.len(),
        out.findings.len()
    );
}

pub fn run(o: Options) -> Result<()> {
    let Some(port) = o.nvmet_port else {
        return run_loaded(&o);
    };
    // The target for the run's NVMe peers; it must serve a good host after
    // them, and unload.
    crate::sample_module::with_loaded(crate::nvmet::MODULE, port, crate::nvmet::PARAMS, || {
        println!("# fuzz: NVMe target sample on {}:{port}", o.local);
        run_loaded(&o)?;
        capsule::still_serves(SocketAddr::from((o.local, port)))
            .context("fuzz: the NVMe target after the run")?;
        println!("# fuzz: the NVMe target serves a good host after the run");
        Ok(())
    })
}

fn run_loaded(o: &Options) -> Result<()> {
    println!(
        "# fuzz: seed {} ({} s{}, {} threads, {} files each, {}:{}..{}, siw ids on {})",
        o.seed,
        o.seconds,
        o.ops
            .map_or(String::new(), |n| format!(", at most {n} ops")),
        o.threads,
        o.files,
        o.local,
        o.port_base,
        o.port_base + 11,
        o.siw_addr
    );
    let env = Env::probe(o);
    if o.replay.is_none() {
        let peers = if o.peers > 0 && env.exe.is_some() {
            format!("up to {} librdmacm peers on {}", o.peers, o.local)
        } else {
            "no librdmacm peers".into()
        };
        let link = match &env.link {
            Some((dev, netdev)) => format!("{dev} deleted and re-added on {netdev}"),
            None if o.link => format!("no {} to delete (not found)", o.siw_dev),
            None => "no link actor".into(),
        };
        println!("# fuzz: actors: {peers}; {link}");
    }
    let script = match &o.replay {
        Some(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("open {p}"))?;
            let lines: Vec<String> = BufReader::new(f).lines().collect::<std::io::Result<_>>()?;
            let s = script_of(&lines)?;
            println!(
                "# fuzz: replaying {p}: {} ops, {} threads",
                s.iter().map(Vec::len).sum::<usize>(),
                s.len()
            );
            Some(s)
        }
        None => None,
    };
    let (out, sh) = run_once(o, &env, script, false, o.trace.as_deref())?;
    summary(&sh, &out, sh.busy.len() as u32);
    if out.findings.is_empty() {
        println!("# fuzz: clean, seed {}", o.seed);
        return Ok(());
    }
    println!("# fuzz: FAILED, seed {}", o.seed);
    for f in out.findings.iter().take(20) {
        println!("# finding: {f}");
    }
    println!("# fuzz: the last {} operations:", out.tail.len());
    for l in &out.tail {
        println!("#   {l}");
    }
    if out.hang {
        // The stuck call cannot be cancelled: no shrink, end the process
        // (and the peers).
        for &pid in sh.peer_pids.lock().unwrap().iter() {
            // SAFETY: our child, not reaped yet.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        println!("# fuzz: a call hangs; not shrinking");
        std::io::stdout().flush()?;
        std::process::exit(3);
    }
    match out.all {
        Some(all) if !all.is_empty() => shrink(o, &env, &all)?,
        _ => println!("# fuzz: trace too long to keep in memory: not shrinking"),
    }
    bail!("fuzz: {} finding(s), seed {}", out.findings.len(), o.seed)
}

/// Bisects on the trace's length for the shortest prefix that still fails
/// when replayed (best effort: the kernel's timing is not replayed).
pub(super) fn shrink(o: &Options, env: &Env, all: &[String]) -> Result<()> {
    let fails = |n: usize| -> Result<bool> {
        let script = script_of(&all[..n])?;
        let (out, _) = run_once(o, env, Some(script), true, None)?;
        if out.hang {
            std::process::exit(3);
        }
        Ok(!out.findings.is_empty())
    };
    println!(
        "# fuzz: shrinking {} operations by replaying prefixes",
        all.len()
    );
    if !fails(all.len())? {
        println!("# fuzz: the full trace does not fail again on replay: no shrink");
        return Ok(());
    }
    let (mut lo, mut hi) = (0usize, all.len());
    let mut rounds = 0;
    // Each replay takes about as long as the prefix took: bounded.
    let budget = Instant::now() + Duration::from_secs(o.shrink_secs);
    while hi - lo > 1 && rounds < 24 {
        if Instant::now() > budget {
            println!("# fuzz: shrink budget ({} s) spent", o.shrink_secs);
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if fails(mid)? {
            hi = mid;
        } else {
            lo = mid;
        }
        rounds += 1;
    }
    println!("# fuzz: shortest failing prefix: {hi} operations (replay it with --replay):");
    for l in &all[..hi] {
        println!("#   {l}");
    }
    Ok(())
}
