// SPDX-License-Identifier: GPL-2.0
//! The agent's `nvme_host` verb: the kernel's NVMe over Fabrics host
//! (`nvme-rdma`, driven by nvme-cli) on the agent's machine, with fio
//! writing and verifying the namespace of a target: the Rust target of
//! `samples/rdma_cm_rs_nvmet.rs` on the suite's machine (the same machine
//! in one VM, the other one across two).
//!
//!   nvme_host addr=IP:PORT nqn=NQN hostnqn=NQN hostid=UUID [queues=N]
//!             [kato=S] [reconnect_delay=S] [ctrl_loss_tmo=S]
//!             [rw=MODE] [bs=MIN-MAX] [iodepth=N] [numjobs=N] [size_mib=N]
//!             [runtime_s=N] [timeout_s=N]
//!
//! 1. The host's modules, those not loaded yet: RDMA_CM_RS_NVME_MODULES
//!    (tools/vm/run: the kernel build's NVMe modules in load order) up to
//!    and with nvme-rdma, which are nvme-core, nvme-fabrics, nvme-rdma and
//!    what they need, insmod'ed in that order.
//! 2. `nvme connect -t rdma -a IP -s PORT -n NQN --hostnqn --hostid
//!    --nr-io-queues N` (2 by default), with `--keep-alive-tmo`,
//!    `--reconnect-delay` and `--ctrl-loss-tmo` when asked.  The
//!    controller is the one of /sys/class/nvme whose `subsysnqn` is NQN
//!    and whose `address` has IP and PORT; the namespace's block device
//!    must appear within [`DEVICE_WAIT`].
//! 3. `ready ctrl=nvmeX cntlid=N dev=/dev/nvmeXnY bytes=B`, and fio on the
//!    device: direct I/O (libaio), `rw` (randrw) in blocks of `bs`
//!    (4k-64k) at queue depth `iodepth` (8), `numjobs` jobs (2) of
//!    `size_mib` MiB (8) side by side from offset 0, every block written
//!    checked by crc32c (fatal); with `runtime_s` time-based for that long
//!    (fio then writes and verifies its region in turn until the time is
//!    up).
//! 4. `nvme disconnect -n NQN`, whatever fio did; the controller must then
//!    be gone (within 10 s).
//!
//! Then `result ctrl= cntlid= dev= bytes= loaded=NAME,... fio_status=N
//! fio=HEX states=STATE@MS,... disconnect=N host_log=HEX`: the modules
//! it loaded, fio's exit status (-1 if it was killed) and its summary and
//! error lines, the controller's states (sysfs `state`) as they changed
//! while fio ran, in ms from `ready` (a reconnect shows as `resetting` and
//! `connecting`, then `live` again), whether the disconnect worked (0;
//! else 1 and `disconnect_out=HEX`), and the host kernel's lines about
//! the controller (`host_log=HEX`: its connect, errors, reconnects and
//! removal).  As with `run`, a line from the suite while fio runs (`stop`: its side
//! failed) kills fio (`stopped=1`), fio past `timeout_s` (120 by default)
//! is killed too (`timed_out=1`), and should the suite hang up, fio is
//! killed and the controller disconnected all the same.  Only `nvme`,
//! `fio` and `insmod` run, with arguments checked here.

use super::run::{kill, listen_to_suite, read_tail, Suite, POLL};
use super::Req;
use crate::payload::hex;
use anyhow::{bail, ensure, Context, Result};
use std::{
    fmt::Write as _,
    fs,
    io::Write,
    net::{SocketAddr, TcpStream},
    os::unix::{fs::FileTypeExt, process::CommandExt},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// The host's own module: the verb loads the list up to it.
const HOST_MODULE: &str = "nvme_rdma";
/// How long the namespace's block device may take to appear after
/// `nvme connect` returned.
const DEVICE_WAIT: Duration = Duration::from_secs(10);
/// How long the controller may take to go after `nvme disconnect`.
const GONE_WAIT: Duration = Duration::from_secs(10);
/// fio's output kept (its end), before its summary lines are picked.
const FIO_TAIL: usize = 64 << 10;
/// Bytes of fio's summary and error lines the result carries.
const FIO_LINES: usize = 2048;
/// Bytes of the host's kernel log lines the result carries.
const HOST_LOG: usize = 4096;
/// fio's `rw` modes the verb runs.
const RW_MODES: &[&str] = &["read", "write", "randread", "randwrite", "rw", "randrw"];

/// The request, checked.
#[derive(Debug, PartialEq, Eq)]
struct Options {
    addr: SocketAddr,
    nqn: String,
    hostnqn: String,
    hostid: String,
    queues: u32,
    kato_s: Option<u32>,
    reconnect_delay_s: Option<u32>,
    ctrl_loss_tmo_s: Option<u32>,
    rw: String,
    bs: String,
    iodepth: u32,
    numjobs: u32,
    size_mib: u32,
    runtime_s: Option<u32>,
    timeout: Duration,
}

/// A name of the request that becomes an argument: NQN and UUID
/// characters only, never an option.
fn word(req: &Req, key: &str) -> Result<String> {
    let v = req.get(key).with_context(|| format!("{key}="))?;
    ensure!(
        !v.is_empty()
            && !v.starts_with('-')
            && v.len() <= 223
            && v.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".:-_".contains(c)),
        "{key}={v:?}: not a name"
    );
    Ok(v.to_owned())
}

fn optional(req: &Req, key: &str) -> Result<Option<u32>> {
    req.get(key)
        .map(|v| v.parse().with_context(|| format!("{key}={v}")))
        .transpose()
}

/// A block size or range of fio's: `4k`, `4k-64k`.
fn block_sizes(v: &str) -> bool {
    let size = |s: &str| {
        let digits = s.trim_end_matches(['k', 'K', 'm', 'M']);
        !digits.is_empty()
            && digits.len() + 1 >= s.len()
            && digits.chars().all(|c| c.is_ascii_digit())
    };
    match v.split_once('-') {
        Some((a, b)) => size(a) && size(b),
        None => size(v),
    }
}

impl Options {
    fn parse(req: &Req) -> Result<Self> {
        let rw = req.get("rw").unwrap_or("randrw").to_owned();
        ensure!(
            RW_MODES.contains(&rw.as_str()),
            "rw={rw}: not one of {}",
            RW_MODES.join(", ")
        );
        let bs = req.get("bs").unwrap_or("4k-64k").to_owned();
        ensure!(block_sizes(&bs), "bs={bs}: not a block size or range");
        let o = Self {
            addr: req.addr()?,
            nqn: word(req, "nqn")?,
            hostnqn: word(req, "hostnqn")?,
            hostid: word(req, "hostid")?,
            queues: req.num("queues", 2)?,
            kato_s: optional(req, "kato")?,
            reconnect_delay_s: optional(req, "reconnect_delay")?,
            ctrl_loss_tmo_s: optional(req, "ctrl_loss_tmo")?,
            rw,
            bs,
            iodepth: req.num("iodepth", 8)?,
            numjobs: req.num("numjobs", 2)?,
            size_mib: req.num("size_mib", 8)?,
            runtime_s: optional(req, "runtime_s")?,
            timeout: Duration::from_secs(req.num("timeout_s", 120)?.into()),
        };
        ensure!(
            (1..=64).contains(&o.queues)
                && (1..=1024).contains(&o.iodepth)
                && (1..=16).contains(&o.numjobs)
                && o.size_mib > 0,
            "queues, iodepth, numjobs or size_mib out of range: {req:?}",
            req = req.kv
        );
        Ok(o)
    }

    /// `nvme connect`'s arguments.
    fn connect_args(&self) -> Vec<String> {
        let mut args = vec![
            "connect".to_owned(),
            "-t".into(),
            "rdma".into(),
            "-a".into(),
            self.addr.ip().to_string(),
            "-s".into(),
            self.addr.port().to_string(),
            "-n".into(),
            self.nqn.clone(),
            format!("--hostnqn={}", self.hostnqn),
            format!("--hostid={}", self.hostid),
            format!("--nr-io-queues={}", self.queues),
        ];
        let optional = [
            ("--keep-alive-tmo", self.kato_s),
            ("--reconnect-delay", self.reconnect_delay_s),
            ("--ctrl-loss-tmo", self.ctrl_loss_tmo_s),
        ];
        for (option, value) in optional {
            if let Some(v) = value {
                args.push(format!("{option}={v}"));
            }
        }
        args
    }

    /// fio's arguments for the block device `dev`.
    fn fio_args(&self, dev: &str) -> Vec<String> {
        let mut args = vec![
            "--name=nvme-host".to_owned(),
            format!("--filename={dev}"),
            "--direct=1".into(),
            "--ioengine=libaio".into(),
            format!("--rw={}", self.rw),
            format!("--bsrange={}", self.bs),
            format!("--iodepth={}", self.iodepth),
            format!("--numjobs={}", self.numjobs),
            format!("--size={}m", self.size_mib),
            format!("--offset_increment={}m", self.size_mib),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--verify_state_save=0".into(),
            "--group_reporting".into(),
            "--thread".into(),
        ];
        if let Some(s) = self.runtime_s {
            args.push("--time_based".into());
            args.push(format!("--runtime={s}s"));
        }
        args
    }
}

pub(super) fn nvme_host(req: &Req, out: &mut TcpStream) -> Result<String> {
    let o = Options::parse(req)?;
    let loaded = load_host_modules()?;
    let log_from = crate::kmsg::last_seq().unwrap_or(0);
    let (ok, said) = command("nvme", &o.connect_args())?;
    ensure!(ok, "nvme {}: {said}", o.connect_args().join(" "));
    // From here on the controller exists: it is disconnected whatever
    // happens next.
    let deadline = Instant::now() + DEVICE_WAIT;
    let (ctrl, ns) = loop {
        let ctrl = controller(&o.nqn, o.addr);
        let ns = ctrl.as_deref().and_then(namespace);
        if ns.is_some() || Instant::now() >= deadline {
            break (ctrl, ns);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (Some(ctrl), Some((dev, bytes))) = (ctrl.clone(), ns) else {
        let (_, disc) = disconnect(&o.nqn, ctrl.as_deref());
        bail!(
            "no block device of {} at {} {} s after nvme connect (controller {}); nvme disconnect: {disc}",
            o.nqn,
            o.addr,
            DEVICE_WAIT.as_secs(),
            ctrl.as_deref().unwrap_or("none")
        );
    };
    let cntlid = read_trimmed(&format!("/sys/class/nvme/{ctrl}/cntlid"));
    let fits = u64::from(o.numjobs) * (u64::from(o.size_mib) << 20) <= bytes;
    let ready = if fits {
        writeln!(
            out,
            "ready ctrl={ctrl} cntlid={cntlid} dev={dev} bytes={bytes}"
        )
        .context("ready")
    } else {
        Err(anyhow::anyhow!(
            "{} jobs of {} MiB do not fit the namespace's {bytes} bytes",
            o.numjobs,
            o.size_mib
        ))
    };
    let fio = ready.and_then(|()| fio(&o, &dev, &ctrl, out));
    let (disconnected, disc) = disconnect(&o.nqn, Some(&ctrl));
    let fio = fio?;
    let said = host_log(log_from, &ctrl);
    let loaded = if loaded.is_empty() {
        "-".to_owned()
    } else {
        loaded.join(",")
    };
    let mut r = format!(
        "ctrl={ctrl} cntlid={cntlid} dev={dev} bytes={bytes} loaded={loaded} fio_status={} fio={} states={} disconnect={} host_log={}",
        fio.status,
        hex(fio.lines.as_bytes()),
        fio.states,
        u8::from(!disconnected),
        hex(said.as_bytes())
    );
    if !disconnected {
        let _ = write!(r, " disconnect_out={}", hex(disc.as_bytes()));
    }
    match fio.ended {
        Ended::Exited => {}
        Ended::Stopped => r += " stopped=1",
        Ended::TimedOut => r += " timed_out=1",
    }
    Ok(r)
}

/// The module name of a `.ko` path: `drivers/nvme/host/nvme-rdma.ko` is
/// `nvme_rdma`.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.strip_suffix(".ko").unwrap_or(file).replace('-', "_")
}

/// The modules of `list` (paths in load order) up to and with the host's:
/// none if it is not there.
fn host_modules(list: &str) -> Vec<&str> {
    let mut modules = Vec::new();
    for m in list.split_whitespace() {
        modules.push(m);
        if module_name(m) == HOST_MODULE {
            return modules;
        }
    }
    Vec::new()
}

fn module_loaded(name: &str) -> bool {
    Path::new("/sys/module").join(name).exists()
}

/// Loads the host's modules not loaded yet; returns their names.  Suites
/// running at once on one machine each have an agent: one loads at a
/// time, under a lock file.
fn load_host_modules() -> Result<Vec<String>> {
    if module_loaded(HOST_MODULE) {
        return Ok(Vec::new());
    }
    let list = std::env::var("RDMA_CM_RS_NVME_MODULES").unwrap_or_default();
    let modules = host_modules(&list);
    ensure!(
        !modules.is_empty(),
        "no nvme-rdma in RDMA_CM_RS_NVME_MODULES ({list:?}): tools/vm/run lists the kernel's NVMe modules there"
    );
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/nvme-host-modules.lock")
        .context("the host modules' lock file")?;
    lock.lock().context("lock the host modules")?;
    let mut loaded = Vec::new();
    for m in modules {
        let name = module_name(m);
        if module_loaded(&name) {
            continue;
        }
        let (ok, said) = command("insmod", &[m.to_owned()])?;
        ensure!(ok, "insmod {m}: {said}");
        loaded.push(name);
    }
    Ok(loaded)
}

/// Runs `program` with `args` (bounded: 60 s); whether it succeeded, and
/// its status and output on one line.
fn command(program: &str, args: &[String]) -> Result<(bool, String)> {
    let out = Command::new("timeout")
        .arg("60")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {program}"))?;
    let said = format!(
        "{} {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok((out.status.success(), said.trim().replace('\n', " / ")))
}

fn read_trimmed(path: &str) -> String {
    fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Whether a controller's sysfs `address` (`traddr=IP,trsvcid=PORT,...`)
/// is `addr`.
fn address_is(address: &str, addr: SocketAddr) -> bool {
    let field = |key: &str| {
        address
            .split(',')
            .filter_map(|kv| kv.trim().split_once('='))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.to_owned())
    };
    field("traddr") == Some(addr.ip().to_string())
        && field("trsvcid") == Some(addr.port().to_string())
}

/// The controller (`nvmeX`) of subsystem `nqn` at `addr`.
fn controller(nqn: &str, addr: SocketAddr) -> Option<String> {
    fs::read_dir("/sys/class/nvme")
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|c| {
            read_trimmed(&format!("/sys/class/nvme/{c}/subsysnqn")) == nqn
                && address_is(&read_trimmed(&format!("/sys/class/nvme/{c}/address")), addr)
        })
}

/// The block device of `ctrl`'s namespace (`/dev/nvmeXnY`, without
/// multipath) and its size in bytes, once it is there.
fn namespace(ctrl: &str) -> Option<(String, u64)> {
    let dir = format!("/sys/class/nvme/{ctrl}");
    fs::read_dir(&dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let rest = name.strip_prefix(ctrl)?.strip_prefix('n')?;
        if rest.is_empty() || !rest.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        let dev = format!("/dev/{name}");
        if !fs::metadata(&dev).ok()?.file_type().is_block_device() {
            return None;
        }
        let sectors: u64 = read_trimmed(&format!("{dir}/{name}/size")).parse().ok()?;
        Some((dev, sectors * 512))
    })
}

/// The controller's state in sysfs (`gone` once it is not there).
fn state(ctrl: &str) -> String {
    let s = read_trimmed(&format!("/sys/class/nvme/{ctrl}/state"));
    if s.is_empty() {
        "gone".into()
    } else {
        s
    }
}

/// `nvme disconnect -n NQN`, then the controller `ctrl` gone: whether both
/// happened, and what the command said.
fn disconnect(nqn: &str, ctrl: Option<&str>) -> (bool, String) {
    let (ok, said) = match command("nvme", &["disconnect".into(), "-n".into(), nqn.into()]) {
        Ok(r) => r,
        Err(e) => return (false, format!("{e:#}")),
    };
    let Some(ctrl) = ctrl else {
        return (ok, said);
    };
    let deadline = Instant::now() + GONE_WAIT;
    while Path::new("/sys/class/nvme").join(ctrl).exists() {
        if Instant::now() >= deadline {
            return (
                false,
                format!("{said}; {ctrl} still there {} s later", GONE_WAIT.as_secs()),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (ok, said)
}

/// The controller's states as they changed: `live@0,connecting@5120,...`.
struct Timeline {
    last: String,
    text: String,
}

impl Timeline {
    fn new(first: String) -> Self {
        Self {
            text: format!("{first}@0"),
            last: first,
        }
    }

    fn see(&mut self, at: Duration, state: String) {
        if state != self.last {
            let _ = write!(self.text, ",{state}@{}", at.as_millis());
            self.last = state;
        }
    }
}

/// What the host's kernel said of controller `ctrl` (`nvme nvmeX: ...`)
/// after the record `from`: its connects, errors and reconnects; at most
/// [`HOST_LOG`] bytes, the first lines.
fn host_log(from: u64, ctrl: &str) -> String {
    let prefix = format!("nvme {ctrl}: ");
    let mut said = String::new();
    for r in crate::kmsg::records().unwrap_or_default() {
        if r.seq <= from || !r.text.starts_with(&prefix) {
            continue;
        }
        if said.len() + r.text.len() + 1 > HOST_LOG {
            break;
        }
        if !said.is_empty() {
            said.push('\n');
        }
        said.push_str(&r.text);
    }
    said
}

/// How fio's run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Exited,
    Stopped,
    TimedOut,
}

struct FioRun {
    status: i32,
    lines: String,
    states: String,
    ended: Ended,
}

/// fio on `dev`, watched: the suite's `stop`, the timeout, the
/// controller's state.
fn fio(o: &Options, dev: &str, ctrl: &str, out: &TcpStream) -> Result<FioRun> {
    let started = Instant::now();
    let (reader, writer) = std::io::pipe()?;
    let mut cmd = Command::new("fio");
    cmd.args(o.fio_args(dev))
        // A group of its own, as `run`'s tools.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer);
    let mut child = cmd.spawn().context("spawn fio")?;
    drop(cmd);
    let (tail_tx, tail_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tail_tx.send(read_tail(reader, FIO_TAIL)));
    let mut states = Timeline::new(state(ctrl));
    let (status, ended) = loop {
        if let Some(status) = child.try_wait()? {
            break (status.code().unwrap_or(-1), Ended::Exited);
        }
        if started.elapsed() >= o.timeout {
            kill(&mut child);
            child.wait()?;
            break (-1, Ended::TimedOut);
        }
        match listen_to_suite(out, POLL)? {
            Suite::Quiet => {}
            Suite::Stop => {
                kill(&mut child);
                child.wait()?;
                break (-1, Ended::Stopped);
            }
            Suite::Gone => {
                kill(&mut child);
                let _ = child.wait();
                bail!("the suite hung up while fio ran; killed it");
            }
        }
        states.see(started.elapsed(), state(ctrl));
    };
    let output = tail_rx
        .recv_timeout(Duration::from_secs(5))
        .context("fio's output did not end with it")??;
    Ok(FioRun {
        status,
        lines: summary(&output),
        states: states.text,
        ended,
    })
}

/// fio's lines that tell what happened: the job's `err=`, the group's
/// READ and WRITE lines, verify failures, fio's own errors; at most
/// [`FIO_LINES`] bytes of them.
fn summary(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let mut lines = String::new();
    for l in text.lines().map(str::trim) {
        let telling = ["err=", "READ:", "WRITE:", "verify", "fio:", "error"]
            .iter()
            .any(|w| l.contains(w));
        // fio's caution for any verifying job of several on one file: the
        // jobs' regions do not overlap here (`offset_increment`).
        if !telling || l.contains("multiple writers may overwrite blocks") {
            continue;
        }
        if lines.len() + l.len() + 1 > FIO_LINES {
            break;
        }
        if !lines.is_empty() {
            lines.push('\n');
        }
        lines.push_str(l);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(line: &str) -> Req {
        Req {
            kv: crate::agent::parse(line).1,
        }
    }

    const BASE: &str = "nvme_host addr=192.0.2.1:4420 nqn=nqn.2026-11.org.rdma-cm-rs:nvmet hostnqn=nqn.2014-08.org.nvmexpress:uuid:8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0002 hostid=8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0002";

    #[test]
    fn connects_with_the_requests_options() {
        let o = Options::parse(&req(&format!(
            "{BASE} queues=4 reconnect_delay=1 ctrl_loss_tmo=60 kato=5"
        )))
        .unwrap();
        assert_eq!(
            o.connect_args().join(" "),
            "connect -t rdma -a 192.0.2.1 -s 4420 -n nqn.2026-11.org.rdma-cm-rs:nvmet \
             --hostnqn=nqn.2014-08.org.nvmexpress:uuid:8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0002 \
             --hostid=8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0002 --nr-io-queues=4 \
             --keep-alive-tmo=5 --reconnect-delay=1 --ctrl-loss-tmo=60"
        );
        let v6 =
            Options::parse(&req(&BASE.replace("192.0.2.1:4420", "[2001:db8::1]:4420"))).unwrap();
        assert_eq!(v6.connect_args()[4], "2001:db8::1");
    }

    #[test]
    fn runs_fio_with_crc32c_verify() {
        let o = Options::parse(&req(BASE)).unwrap();
        assert_eq!(
            o.fio_args("/dev/nvme0n1").join(" "),
            "--name=nvme-host --filename=/dev/nvme0n1 --direct=1 --ioengine=libaio \
             --rw=randrw --bsrange=4k-64k --iodepth=8 --numjobs=2 --size=8m \
             --offset_increment=8m --verify=crc32c --verify_fatal=1 \
             --verify_state_save=0 --group_reporting --thread"
        );
        let timed = Options::parse(&req(&format!(
            "{BASE} rw=randwrite bs=4k iodepth=16 numjobs=1 size_mib=16 runtime_s=15"
        )))
        .unwrap();
        let args = timed.fio_args("/dev/nvme1n1").join(" ");
        assert!(args.contains("--rw=randwrite --bsrange=4k --iodepth=16 --numjobs=1 --size=16m"));
        assert!(args.ends_with("--time_based --runtime=15s"), "{args}");
    }

    #[test]
    fn refuses_what_would_be_options_or_other_modes() {
        for bad in [
            format!("{BASE} rw=trim"),
            format!("{BASE} bs=4k;reboot"),
            format!("{BASE} bs=-4k"),
            BASE.replace("nqn=nqn.2026", "nqn=--nqn.2026"),
            BASE.replace("hostid=8f6c", "hostid=8f/c"),
            format!("{BASE} numjobs=0"),
        ] {
            assert!(Options::parse(&req(&bad)).is_err(), "{bad}");
        }
        assert!(block_sizes("4k-64k") && block_sizes("512") && block_sizes("1M"));
        assert!(!block_sizes("k") && !block_sizes("4kk") && !block_sizes("4k-"));
    }

    #[test]
    fn loads_the_list_up_to_nvme_rdma() {
        let list = "/k/drivers/nvme/common/nvme-keyring.ko /k/drivers/nvme/host/nvme-core.ko \
                    /k/drivers/nvme/host/nvme-fabrics.ko /k/drivers/nvme/host/nvme-rdma.ko \
                    /k/drivers/nvme/target/nvmet.ko /k/drivers/block/brd.ko";
        let names: Vec<String> = host_modules(list).iter().map(|m| module_name(m)).collect();
        assert_eq!(
            names,
            ["nvme_keyring", "nvme_core", "nvme_fabrics", "nvme_rdma"]
        );
        assert!(host_modules("/k/drivers/block/brd.ko").is_empty());
    }

    #[test]
    fn finds_the_controller_by_its_address() {
        let a: SocketAddr = "192.0.2.1:4420".parse().unwrap();
        assert!(address_is(
            "traddr=192.0.2.1,trsvcid=4420,src_addr=192.0.2.2",
            a
        ));
        assert!(!address_is("traddr=192.0.2.1,trsvcid=4421", a));
        assert!(!address_is("traddr=192.0.2.10,trsvcid=4420", a));
    }

    #[test]
    fn tells_state_changes_and_fios_summary() {
        let mut t = Timeline::new("live".into());
        t.see(Duration::from_millis(10), "live".into());
        t.see(Duration::from_millis(5120), "resetting".into());
        t.see(Duration::from_millis(5140), "connecting".into());
        t.see(Duration::from_millis(9001), "live".into());
        assert_eq!(t.text, "live@0,resetting@5120,connecting@5140,live@9001");
        let out = b"fio: multiple writers may overwrite blocks that belong to other jobs. This can cause verification failures.\n\
                    nvme-host: (g=0): rw=randrw, bs=(R) 4096B-64.0KiB\n\
                    Starting 2 threads\n\
                    nvme-host: (groupid=0, jobs=2): err= 0: pid=311: Sun Nov 29\n\
                    \x20 read: IOPS=100, BW=1MiB/s\n\
                    \x20  READ: bw=1MiB/s, io=4MiB, run=1000-1000msec\n\
                    \x20 WRITE: bw=1MiB/s, io=4MiB, run=1000-1000msec\n";
        assert_eq!(
            summary(out),
            "nvme-host: (groupid=0, jobs=2): err= 0: pid=311: Sun Nov 29\n\
             READ: bw=1MiB/s, io=4MiB, run=1000-1000msec\n\
             WRITE: bw=1MiB/s, io=4MiB, run=1000-1000msec"
        );
    }
}
