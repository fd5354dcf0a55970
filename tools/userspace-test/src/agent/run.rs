// SPDX-License-Identifier: GPL-2.0
//! The agent's `run` verb: one of the unmodified rdmacm-utils tools as the
//! peer of a scenario, on the agent's machine.
//!
//!   run tool=NAME args=HEX [wait_ms=N | ready=output] [timeout_s=N]
//!       NAME is `rping`, `ucmatose` or `udaddy` (nothing else runs);
//!       `args` is the hex of a space-separated argument string.  The tool
//!       runs with RLIMIT_MEMLOCK unlimited (its ibv_reg_mr pins memory),
//!       stdin empty, stdout and stderr into one pipe, line-buffered
//!       (`stdbuf -oL -eL` where there is one).  `ready` follows
//!       after `wait_ms` (default 1000; time for a server to listen), or
//!       with `ready=output` once the tool wrote its first output (the
//!       clients' "starting client", past loading their libraries and
//!       librdmacm's device setup, which the guest's 9p root makes slow
//!       under load), or as soon as the tool exits, whichever is first;
//!       then
//!       `result status=N out=HEX`: the exit status (-1 if a signal ended
//!       it, then also `signal=N`, or if it ran past `timeout_s`, default
//!       120, and was killed: `timed_out=1`) and the last
//!       [`OUTPUT_TAIL`] bytes of its combined output (for a tool killed,
//!       followed by where each of its threads stood: state, wait channel
//!       and kernel stack).  A line from the
//!       suite meanwhile (`stop`: its side failed) kills the tool, and the
//!       result follows with `stopped=1`; should the suite hang up instead,
//!       the tool is killed all the same.

use super::Req;
use anyhow::{bail, ensure, Context, Result};
use std::{
    fmt::Write as _,
    io::{ErrorKind, Read, Write},
    net::TcpStream,
    os::unix::process::{CommandExt, ExitStatusExt},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

/// The tools `run` starts: rdmacm-utils' RC, UD and multicast examples.
pub const TOOLS: &[&str] = &["rping", "ucmatose", "udaddy", "mckey"];

/// Bytes of the tool's output the result carries (its end: the summary
/// lines and the error messages are last).
pub const OUTPUT_TAIL: usize = 2048;

/// How often the agent looks at the tool and at the suite's connection.
pub(super) const POLL: Duration = Duration::from_millis(20);

pub(super) fn run(req: &Req, out: &mut TcpStream) -> Result<String> {
    let tool = req.get("tool").context("tool=")?;
    ensure!(
        TOOLS.contains(&tool),
        "tool {tool:?} is not one of {}",
        TOOLS.join(", ")
    );
    let args = String::from_utf8(req.bytes("args")?).context("args= is not UTF-8")?;
    let wait = Duration::from_millis(req.num("wait_ms", 1000)?.into());
    let on_output = match req.get("ready") {
        None => false,
        Some("output") => true,
        Some(other) => bail!("ready={other}: the one value is `output`"),
    };
    let timeout = Duration::from_secs(req.num("timeout_s", 120)?.into());

    let (reader, writer) = std::io::pipe()?;
    let mut cmd = line_buffered(tool);
    cmd.args(args.split_whitespace())
        // A group of its own: killing it takes whatever it started too.
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(writer.try_clone()?)
        .stderr(writer);
    // SAFETY: the closure runs in the forked child before exec and calls
    // only getrlimit and setrlimit, which are async-signal-safe; it
    // allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let unlimited = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            // Without CAP_SYS_RESOURCE (the agent run by hand as a user)
            // the hard limit stays: the soft one goes up to it, and the
            // tool's own error says if that is not enough.
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) != 0 {
                let mut limit = unlimited;
                if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) == 0 {
                    limit.rlim_cur = limit.rlim_max;
                    libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit);
                }
            }
            Ok(())
        });
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {tool} {args}"))?;
    // The command holds the pipe's write ends: closed here, so that the
    // reader sees the end of the output once the tool (and only it) is gone.
    drop(cmd);
    let (tail_tx, tail_rx) = std::sync::mpsc::channel();
    let spoke = Arc::new(AtomicBool::new(false));
    let reader = Noticed {
        inner: reader,
        spoke: spoke.clone(),
    };
    std::thread::spawn(move || tail_tx.send(read_tail(reader, OUTPUT_TAIL)));

    let waiting = || {
        if on_output {
            !spoke.load(Ordering::Relaxed) && started.elapsed() < timeout
        } else {
            started.elapsed() < wait
        }
    };
    while waiting() && child.try_wait()?.is_none() {
        std::thread::sleep(POLL);
    }
    if let Err(e) = writeln_ready(out) {
        kill(&mut child);
        return Err(e);
    }

    // `stood`: what the tool was doing when killed, told after its output.
    let (status, ended, stood) = loop {
        if let Some(status) = child.try_wait()? {
            break (status, Ended::Exited, String::new());
        }
        if started.elapsed() >= timeout {
            let (status, stood) = kill_telling(&mut child)?;
            break (status, Ended::TimedOut, stood);
        }
        match listen_to_suite(out, POLL)? {
            Suite::Quiet => {}
            Suite::Stop => {
                let (status, stood) = kill_telling(&mut child)?;
                break (status, Ended::Stopped, stood);
            }
            Suite::Gone => {
                kill(&mut child);
                let _ = child.wait();
                bail!("the suite hung up while {tool} ran; killed it");
            }
        }
    };
    // The pipe ends with the tool's group; bounded all the same, so that
    // something that escaped the group cannot hold the answer.
    let mut output = tail_rx
        .recv_timeout(Duration::from_secs(5))
        .context("the tool's output did not end with it")??;
    output.extend_from_slice(stood.as_bytes());
    Ok(report(status, ended, &output))
}

/// The tool's output pipe, telling once anything came through it.
struct Noticed<R> {
    inner: R,
    spoke: Arc<AtomicBool>,
}

impl<R: Read> Read for Noticed<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.spoke.store(true, Ordering::Relaxed);
        }
        Ok(n)
    }
}

/// The command for `tool`, line-buffered by coreutils' `stdbuf` where it
/// is on the PATH.  The tool's stdout is a pipe, so its stdio would hold
/// the lines in a buffer of 4 KiB that a kill (`stop`, the timeout)
/// discards: the very lines that say where a stuck tool stood.  `stdbuf`
/// execs the tool, which keeps the process (and its group) the same.
fn line_buffered(tool: &str) -> Command {
    let stdbuf = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join("stdbuf"))
            .find(|p| p.is_file())
    });
    match stdbuf {
        Some(stdbuf) => {
            let mut cmd = Command::new(stdbuf);
            cmd.args(["-oL", "-eL", tool]);
            cmd
        }
        None => Command::new(tool),
    }
}

/// Each thread of process `pid` as the kernel saw it just before the kill:
/// its state, where it sleeps (`wchan`) and its kernel stack (readable by
/// root only; left out otherwise).  A tool that printed nothing in all the
/// time the module waited was stuck before its first line, and this says
/// where.
fn where_it_stood(pid: u32) -> String {
    let mut told = String::from("--- where it stood when killed:\n");
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return told + "(gone)\n";
    };
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        // "TID (COMM) STATE ...": the name may hold spaces, the state
        // follows the last ')'.
        let stat = read("stat");
        let (name, state) = match (stat.find('('), stat.rfind(')')) {
            (Some(open), Some(close)) => (
                &stat[open + 1..close],
                stat[close + 1..].split_whitespace().next().unwrap_or("?"),
            ),
            _ => ("?", "?"),
        };
        let _ = writeln!(
            told,
            "thread {} ({name}) state {state} wchan {}",
            task.file_name().to_string_lossy(),
            read("wchan")
        );
        for frame in read("stack").lines() {
            let _ = writeln!(told, "  {frame}");
        }
    }
    told
}

/// Kills the tool and reaps it; returns its status and where it stood
/// just before.
fn kill_telling(child: &mut Child) -> Result<(ExitStatus, String)> {
    let stood = where_it_stood(child.id());
    kill(child);
    Ok((child.wait()?, stood))
}

/// How the tool's run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    Exited,
    TimedOut,
    Stopped,
}

fn writeln_ready(out: &mut TcpStream) -> Result<()> {
    writeln!(out, "ready")?;
    Ok(())
}

/// SIGKILLs the tool's process group.
pub(super) fn kill(child: &mut Child) {
    // The group is the child's pid (`process_group(0)`).  The child is not
    // reaped yet, so the id names no other group; the group may be empty
    // if everything in it exited, which is fine.
    // SAFETY: kill(2) with a negative pid sends a signal, nothing else.
    unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
}

/// The result line's fields.
fn report(status: ExitStatus, ended: Ended, output: &[u8]) -> String {
    let code = match (ended, status.code()) {
        (Ended::Exited, Some(code)) => code,
        _ => -1,
    };
    let mut r = format!("status={code} out={}", crate::payload::hex(output));
    match ended {
        Ended::TimedOut => r += " timed_out=1",
        Ended::Stopped => r += " stopped=1",
        Ended::Exited => {
            if let Some(signal) = status.signal() {
                r += &format!(" signal={signal}");
            }
        }
    }
    r
}

/// Reads `from` to its end, keeping the last `keep` bytes.
pub(super) fn read_tail(mut from: impl Read, keep: usize) -> Result<Vec<u8>> {
    let mut tail = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        tail.extend_from_slice(&buf[..n]);
        // Trimmed in batches, not per read: a chatty tool (rping -v with
        // 64 KiB pings) must not make this quadratic.
        if tail.len() > 4 * keep {
            tail.drain(..tail.len() - keep);
        }
    }
    if tail.len() > keep {
        tail.drain(..tail.len() - keep);
    }
    Ok(tail)
}

/// What the suite did while the tool ran.
pub(super) enum Suite {
    Quiet,
    /// It sent a line: stop the tool.
    Stop,
    /// It closed or reset the connection.
    Gone,
}

/// Waits up to `wait` for the suite to send something or hang up.
pub(super) fn listen_to_suite(mut stream: &TcpStream, wait: Duration) -> Result<Suite> {
    stream.set_read_timeout(Some(wait))?;
    // The request line is all the suite sent before (it waits for `ready`
    // first), so what comes now is read here, not by the request reader.
    // Read, not peeked: data left unread when the agent closes the
    // connection would turn its FIN into a reset that can discard the
    // result line before the suite reads it.
    let r = stream.read(&mut [0u8; 64]);
    stream.set_read_timeout(None)?;
    match r {
        Ok(0) => Ok(Suite::Gone),
        Ok(_) => Ok(Suite::Stop),
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
            ) =>
        {
            Ok(Suite::Quiet)
        }
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(Suite::Gone),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_only_the_rdmacm_utils_tools() {
        let agent = crate::agent::spawn_local().unwrap();
        let request = format!("run tool=sh args={}", crate::payload::hex(b"-c true"));
        let mut call = crate::agent::Call::start(&agent, &request).unwrap();
        let answer = call.line().unwrap();
        assert!(
            answer.starts_with("error tool \"sh\" is not one of rping"),
            "{answer}"
        );
    }

    /// GNU sed, like the tools, writes through stdio: into a pipe, its
    /// line reaches the reader before the kill only if line-buffered.
    #[test]
    fn a_tool_killed_has_written_its_lines() {
        let mut sed = line_buffered("sed")
            .args(["-n", "p"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = sed.stdin.take().unwrap();
        input.write_all(b"where it stood\n").unwrap();
        let output = sed.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(read_tail(output, OUTPUT_TAIL)));
        std::thread::sleep(Duration::from_millis(500));
        sed.kill().unwrap();
        sed.wait().unwrap();
        drop(input);
        let said = rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
        assert_eq!(said, b"where it stood\n");
    }

    #[test]
    fn tells_where_a_sleeping_tool_stood() {
        let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
        // Until it has exec'd and gone to sleep.
        let mut told = String::new();
        for _ in 0..100 {
            told = where_it_stood(sleeper.id());
            if told.contains("(sleep) state S") {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert!(
            told.starts_with("--- where it stood when killed:\n"),
            "{told}"
        );
        assert!(
            told.contains(&format!("thread {} (sleep) state S wchan ", sleeper.id())),
            "{told}"
        );
        assert!(where_it_stood(u32::MAX).ends_with("(gone)\n"));
    }

    #[test]
    fn notices_the_first_output_and_refuses_other_readiness() {
        let spoke = Arc::new(AtomicBool::new(false));
        let silent = Noticed {
            inner: &b""[..],
            spoke: spoke.clone(),
        };
        assert_eq!(read_tail(silent, OUTPUT_TAIL).unwrap(), b"");
        assert!(!spoke.load(Ordering::Relaxed));
        let said = Noticed {
            inner: &b"udaddy: starting client\n"[..],
            spoke: spoke.clone(),
        };
        read_tail(said, OUTPUT_TAIL).unwrap();
        assert!(spoke.load(Ordering::Relaxed));

        let agent = crate::agent::spawn_local().unwrap();
        let request = format!(
            "run tool=udaddy args={} ready=soon",
            crate::payload::hex(b"-b x")
        );
        let mut call = crate::agent::Call::start(&agent, &request).unwrap();
        let answer = call.line().unwrap();
        assert!(
            answer.starts_with("error ready=soon: the one value is `output`"),
            "{answer}"
        );
    }

    #[test]
    fn keeps_the_tail_of_the_output() {
        let data: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        assert_eq!(read_tail(&data[..], 2048).unwrap(), data[20_000 - 2048..]);
        assert_eq!(read_tail(&b"short"[..], 2048).unwrap(), b"short");
    }

    #[test]
    fn reports_status_signal_and_timeout() {
        let exited = ExitStatus::from_raw(3 << 8);
        assert_eq!(report(exited, Ended::Exited, b"hi"), "status=3 out=6869");
        let killed = ExitStatus::from_raw(libc::SIGKILL);
        assert_eq!(
            report(killed, Ended::Exited, b""),
            "status=-1 out=- signal=9"
        );
        assert_eq!(
            report(killed, Ended::TimedOut, b""),
            "status=-1 out=- timed_out=1"
        );
        assert_eq!(
            report(killed, Ended::Stopped, b""),
            "status=-1 out=- stopped=1"
        );
    }
}
