// SPDX-License-Identifier: GPL-2.0

//! Execution: operations, fork children, peers and the link.

#[allow(unused_imports)]
use super::*;

impl Worker {
    // --- execution -----------------------------------------------------------

    pub(super) fn resolve_id(&self, op: &Op) -> u32 {
        let slot = |f: u32, n: u32| {
            self.files
                .get(f as usize)
                .and_then(|r| r.ids.get(n as usize))
                .map_or(0xffff_fff0, |i| i.handle)
        };
        match op.id {
            IdRef::Slot(n) => slot(op.f, n),
            IdRef::Other(g, n) => slot(g, n),
            IdRef::Raw(v) => v,
        }
    }

    pub(super) fn resolve_mr(&self, op: &Op) -> u32 {
        let v = op.v[0];
        if v >= 1000 {
            return (v - 1000) as u32;
        }
        self.files[op.f as usize]
            .mrs
            .get(v as usize)
            .map_or(0xffff, |m| m.handle)
    }

    /// Runs one operation, judges it, updates the model.
    pub(super) fn exec(&mut self, op: &Op) {
        let line = op.line();
        self.sh.log(&line);
        // An actor's pause before its step is no call: not watched.
        self.paused = match op.act {
            Act::Peer { .. } | Act::Link { .. } => self.pause(op.v[0]),
            _ => true,
        };
        let t = self.t as usize;
        *self.sh.busy[t].1.lock().unwrap() = line.clone();
        self.sh.busy[t].0.store(
            self.sh.t0.elapsed().as_millis() as u64 + 1,
            Ordering::SeqCst,
        );
        self.exec_inner(op, &line);
        self.sh.busy[t].0.store(0, Ordering::SeqCst);
    }

    fn exec_inner(&mut self, op: &Op, line: &str) {
        let f = op.f as usize;
        match op.act {
            Act::Open { nonblock } => {
                while self.files.len() <= f {
                    self.files.push(FileRec::default());
                }
                if self.files[f].open() {
                    return;
                }
                let path = CString::new(DEVICE).unwrap();
                let flags =
                    libc::O_RDWR | libc::O_CLOEXEC | if nonblock { libc::O_NONBLOCK } else { 0 };
                // SAFETY: a valid C string.
                let fd = unsafe { libc::open(path.as_ptr(), flags) };
                if fd < 0 {
                    let e = std::io::Error::last_os_error();
                    self.sh.finding(format!("open {DEVICE}: {e} [{line}]"));
                    return;
                }
                self.sh.files_opened.fetch_add(1, Ordering::Relaxed);
                self.files[f] = FileRec {
                    fds: vec![fd],
                    nonblock,
                    ..Default::default()
                };
            }
            Act::Close => {
                let Some(rec) = self.files.get_mut(f) else {
                    return;
                };
                if rec.fds.is_empty() {
                    return;
                }
                let fd = rec.fds.remove(op.fd as usize % rec.fds.len());
                // SAFETY: our own descriptor, closed once.
                unsafe { libc::close(fd) };
                if rec.fds.is_empty() {
                    for i in rec.ids.iter_mut() {
                        if i.st != St::Destroyed {
                            i.st = St::Gone;
                        }
                    }
                    for m in rec.mrs.iter_mut() {
                        m.alive = false;
                    }
                    rec.close_soon = false;
                }
            }
            Act::Dup => {
                let Some(rec) = self.files.get_mut(f) else {
                    return;
                };
                if rec.fds.is_empty() {
                    return;
                }
                let fd = rec.fds[op.fd as usize % rec.fds.len()];
                // SAFETY: dup of our own descriptor.
                let new = unsafe { libc::dup(fd) };
                if new >= 0 {
                    rec.fds.push(new);
                }
            }
            Act::Ioctl(cmd) => {
                let Some(rec) = self.files.get(f) else { return };
                if rec.fds.is_empty() {
                    return;
                }
                let fd = rec.fds[op.fd as usize % rec.fds.len()];
                let own = self.as_own_id(op);
                let op = own.as_ref().unwrap_or(op);
                let r = self.ioctl_op(fd, cmd, op);
                if r == Err(NOT_RUN) {
                    return;
                }
                self.sh.count(cmd, r);
                let signalled = op.sig.is_some();
                if signalled && r == Err(libc::EINTR) {
                    self.sh.kind("signal: calls ended by EINTR");
                }
                if let Some(why) = judge(cmd, op.expect, r, signalled) {
                    self.sh.finding(format!("{why} [{line}]"));
                }
            }
            Act::Fork => self.fork(op),
            Act::Peer { kill } => {
                let slot = op.f as usize;
                if self.peers.len() <= slot {
                    self.peers.resize_with(slot + 1, || None);
                }
                if let Some(p) = self.peers[slot].take() {
                    self.reap(p);
                }
                if !kill && self.paused {
                    self.spawn_peer(slot, op.v[2]);
                }
            }
            Act::Link { add } => {
                if add {
                    self.link_add("link: added back");
                } else if self.paused {
                    self.link_delete();
                }
            }
        }
    }

    /// Sleeps `ms` ms (before an actor's step); false if cut short because
    /// the run is ending.
    fn pause(&self, ms: u64) -> bool {
        let end = Instant::now() + Duration::from_millis(ms);
        loop {
            let now = Instant::now();
            if now >= end {
                return true;
            }
            if self.sh.stop.load(Ordering::SeqCst)
                || self.sh.workers_left.load(Ordering::SeqCst) == 0
            {
                return false;
            }
            std::thread::sleep((end - now).min(Duration::from_millis(20)));
        }
    }

    /// `fork()`: the child runs a short sequence of ioctls, prepared before
    /// the fork, on the inherited descriptors of file `op.f` (and, through
    /// hostile ids, the others'), reports each result through a pipe and
    /// `_exit`s.  The parent waits for it (bounded), then plays the results
    /// into its model and judges them like its own.
    fn fork(&mut self, op: &Op) {
        let f = op.f as usize;
        if !self.files.get(f).is_some_and(FileRec::open) {
            return;
        }
        // The child's calls: from their own seed and the file's model now.
        let saved = std::mem::replace(&mut self.rng, Rng::new(op.v[0]));
        let mut calls = Vec::new();
        self.gen_child = true;
        for _ in 0..op.v[1].min(CHILD_OPS) {
            let mut c = self.gen_ioctl(op.f);
            c.fd = self.rng.below(self.files[f].fds.len() as u64) as u32;
            if self.rng.pct(12) {
                self.mutate(&mut c);
            }
            calls.push(c);
        }
        self.gen_child = false;
        self.rng = saved;
        for c in &calls {
            self.sh.log(&format!("#   fork child: {}", c.line()));
        }
        self.mode = Mode::Capture(Vec::new());
        for c in &calls {
            self.exec_inner(c, "");
        }
        let Mode::Capture(plan) = std::mem::replace(&mut self.mode, Mode::Live) else {
            unreachable!()
        };
        // Everything the child touches, made before fork().
        let words = self.mem.arg.len();
        let n = plan.len();
        let mut slab: Vec<u64> = Vec::with_capacity(n * words);
        for p in &plan {
            slab.extend_from_slice(&p.bytes);
        }
        let child_calls: Vec<ChildCall> = plan
            .iter()
            .enumerate()
            .map(|(i, p)| ChildCall {
                fd: p.fd,
                number: p.number,
                arg: if p.in_arg {
                    slab[i * words..].as_ptr() as u64
                } else {
                    p.arg
                },
                back: p.in_arg,
            })
            .collect();
        let mut out = vec![0u8; n * CHILD_REC];
        let mut pipe = [0i32; 2];
        // SAFETY: `pipe` has room for the two descriptors.
        if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            let e = std::io::Error::last_os_error();
            self.sh.finding(format!("pipe2 for a fork child: {e}"));
            return;
        }
        let [rfd, wfd] = pipe;
        // SAFETY: the child only runs `child_main` (async-signal-safe calls
        // on memory prepared above) and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: `child_calls` and `out` are as `child_main` needs.
            unsafe { child_main(child_calls.as_ptr(), n, out.as_mut_ptr(), wfd) };
        }
        // SAFETY: our write end, closed once.
        unsafe { libc::close(wfd) };
        if pid < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: our read end, closed once.
            unsafe { libc::close(rfd) };
            self.sh.finding(format!("fork: {e}"));
            return;
        }
        self.sh.kind("fork: children");
        let status = self.wait_child(pid);
        let mut got = 0;
        while got < out.len() {
            // SAFETY: reads into the unfilled rest of `out`.
            let r = unsafe { libc::read(rfd, out[got..].as_mut_ptr().cast(), out.len() - got) };
            if r <= 0 {
                break;
            }
            got += r as usize;
        }
        // SAFETY: our read end, closed once.
        unsafe { libc::close(rfd) };
        match status {
            Some(st) if libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0 => {}
            Some(st) => self.sh.finding(format!(
                "fork child ended with wait status {st:#x} [{}]",
                op.line()
            )),
            None => {}
        }
        let results: VecDeque<Option<(i32, Vec<u8>)>> = (0..n)
            .map(|i| {
                let rec = out.get(i * CHILD_REC..(i + 1) * CHILD_REC)?;
                if got < (i + 1) * CHILD_REC {
                    return None;
                }
                let e = i32::from_ne_bytes(rec[..4].try_into().unwrap());
                Some((e, rec[4..].to_vec()))
            })
            .collect();
        for _ in results.iter().flatten() {
            self.sh.kind("fork: ioctls in children");
        }
        self.mode = Mode::Feed(results);
        for c in &calls {
            self.exec_inner(c, &format!("fork child of {}: {}", op.line(), c.line()));
        }
        self.mode = Mode::Live;
    }

    /// Waits (bounded) for a fork child; SIGKILLs it when it overruns (every
    /// call it makes is short: that is a hang).  `None`: not reaped, or
    /// killed by us.
    fn wait_child(&self, pid: libc::pid_t) -> Option<i32> {
        let mut deadline = Instant::now() + self.sh.opts.step;
        let mut killed = false;
        loop {
            let mut st = 0;
            // SAFETY: our child; `st` receives its status.
            let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
            if r == pid {
                return (!killed).then_some(st);
            }
            if r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                return None;
            }
            if Instant::now() > deadline {
                if killed {
                    self.sh.finding(format!(
                        "HANG: fork child {pid} still there {} s after SIGKILL",
                        self.sh.opts.step.as_secs()
                    ));
                    return None;
                }
                self.sh.finding(format!(
                    "HANG: fork child {pid} still in its ioctls after {} s; killed",
                    self.sh.opts.step.as_secs()
                ));
                // SAFETY: our child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed = true;
                deadline = Instant::now() + self.sh.opts.step;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Starts a librdmacm peer of the fuzzer's listeners in `slot`.
    fn spawn_peer(&mut self, slot: usize, seed: u64) {
        let Some(exe) = self.sh.opts.exe.clone() else {
            return;
        };
        let addr = SocketAddr::from((self.sh.opts.local, self.sh.opts.port_base));
        // Where the latest listeners are (timing, not seed: the peers'
        // whole course is timing).
        let prefer: Vec<String> = self
            .sh
            .listen_ports
            .lock()
            .unwrap()
            .iter()
            .map(u16::to_string)
            .collect();
        let mut cmd = Command::new(exe);
        cmd.arg("fuzz-peer")
            .arg("--addr")
            .arg(addr.to_string())
            .arg("--span")
            .arg(PEER_SPAN.to_string())
            .arg("--seed")
            .arg(seed.to_string());
        if !prefer.is_empty() {
            cmd.arg("--prefer").arg(prefer.join(","));
        }
        if let Some(port) = self.sh.opts.nvmet_port {
            cmd.arg("--nvmet")
                .arg(SocketAddr::from((self.sh.opts.local, port)).to_string());
        }
        let spawned = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(mut child) => {
                let out = child.stdout.take().expect("piped");
                // SAFETY: our pipe; reads must not wait for a live peer.
                unsafe {
                    let fd = out.as_raw_fd();
                    let fl = libc::fcntl(fd, libc::F_GETFL);
                    libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
                }
                self.sh.kind("peer: spawned");
                self.sh.peer_pids.lock().unwrap().push(child.id());
                self.peers[slot] = Some(PeerProc { child, out });
            }
            Err(e) => self.sh.finding(format!("spawn of a librdmacm peer: {e}")),
        }
    }

    /// SIGKILLs a peer (unless it ended by itself), reaps it (bounded) and
    /// counts how far it got.
    pub(super) fn reap(&mut self, mut p: PeerProc) {
        let exited = matches!(p.child.try_wait(), Ok(Some(_)));
        if !exited {
            let _ = p.child.kill();
        }
        let deadline = Instant::now() + self.sh.opts.step;
        loop {
            match p.child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5))
                }
                Ok(None) => {
                    self.sh.finding(format!(
                        "HANG: librdmacm peer {} still there {} s after SIGKILL",
                        p.child.id(),
                        self.sh.opts.step.as_secs()
                    ));
                    return;
                }
            }
        }
        self.sh
            .peer_pids
            .lock()
            .unwrap()
            .retain(|&pid| pid != p.child.id());
        let mut seen = Vec::new();
        let _ = p.out.read_to_end(&mut seen);
        for &c in &seen {
            match c {
                b'e' => self.sh.kind("peer: connections established"),
                b'd' => self.sh.kind("peer: messages sent or received"),
                b'x' => self.sh.kind("peer: attempts failed (refused, unreachable)"),
                b'n' => self.sh.kind("peer: NVMe capsule sessions"),
                b'a' => self.sh.kind("peer: NVMe queues accepted"),
                b'k' => self.sh.kind("peer: NVMe completions read"),
                b'F' => self.sh.finding(format!(
                    "NVMe peer {}: a response that is not a 16-byte completion of its queue",
                    p.child.id()
                )),
                _ => {}
            }
        }
        let phase = seen.iter().rev().find(|c| b"srcexqn".contains(c));
        self.sh.kind(match (exited, phase) {
            (true, _) => "peer: ended by itself",
            (false, None) => "peer: killed while starting",
            (false, Some(b'c')) => "peer: killed while connecting",
            (false, Some(b'e')) => "peer: killed while connected",
            (false, Some(b'q')) => "peer: killed while ending",
            (false, Some(b'n')) => "peer: killed in an NVMe session",
            _ => "peer: killed before connecting",
        });
    }

    /// `rdma link delete` of the siw device (bounded); the module's ids on
    /// it get DEVICE_REMOVAL.
    fn link_delete(&mut self) {
        let Some((dev, _)) = self.sh.opts.link.clone() else {
            return;
        };
        let step = self.sh.opts.step;
        match rdma_tool(&["link", "delete", &dev], step) {
            Ok(()) => {
                self.link_deleted = true;
                self.sh.kind("link: deleted");
                let end = Instant::now() + step;
                while device_exists(&dev) {
                    if Instant::now() > end {
                        self.sh.finding(format!(
                            "{dev} still there {} s after `rdma link delete`",
                            step.as_secs()
                        ));
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Err(None) => self.sh.finding(format!(
                "HANG: `rdma link delete {dev}` still running after {} s",
                step.as_secs()
            )),
            Err(Some(e)) => {
                self.sh.kind("link: delete failed");
                if !self.sh.quiet {
                    eprintln!("fuzz: rdma link delete {dev}: {e}");
                }
            }
        }
    }

    /// `rdma link add` of the siw device, retried (bounded) while the old
    /// one is still going; nothing if it is there.
    pub(super) fn link_add(&mut self, what: &'static str) {
        let Some((dev, netdev)) = self.sh.opts.link.clone() else {
            return;
        };
        let step = self.sh.opts.step;
        let end = Instant::now() + step;
        loop {
            if device_exists(&dev) {
                self.link_deleted = false;
                return;
            }
            match rdma_tool(
                &["link", "add", &dev, "type", "siw", "netdev", &netdev],
                step,
            ) {
                Ok(()) => {
                    self.link_deleted = false;
                    self.sh.kind(what);
                    while !device_exists(&dev) && Instant::now() < end {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    return;
                }
                Err(None) => {
                    self.sh.finding(format!(
                        "HANG: `rdma link add {dev}` still running after {} s",
                        step.as_secs()
                    ));
                    return;
                }
                Err(Some(e)) if Instant::now() > end => {
                    self.sh
                        .finding(format!("{dev} cannot be added back on {netdev}: {e}"));
                    return;
                }
                Err(Some(_)) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
}
