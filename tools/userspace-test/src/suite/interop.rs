// SPDX-License-Identifier: GPL-2.0
//! Interoperability with the unmodified rdmacm-utils tools (Debian's
//! rdma-core v44), RC roles: the module on one side, `rping` or `ucmatose`
//! on the other, started through the agent's `run` (so in VM B across two
//! VMs, listening on or connecting to `peer4` / `local4`).
//!
//! The protocols, from rdma-core's `librdmacm/examples`:
//!
//! * `rping.c`: see [`crate::rping`].  `rping -s` serves one client and
//!   exits 0 once it disconnects; its `-C` and `-V` act on the client only
//!   (the server loops until the disconnect); with `-v` it prints
//!   `server ping data: TEXT` for each ping it READ.  Its `-S` must hold
//!   the client's ping, and it takes at most 65535.
//! * `cmatose.c`: RDMA_PS_TCP.  The client, at ROUTE_RESOLVED, creates its
//!   QP, posts `-C` receives of `-S` bytes and connects with
//!   responder_resources = initiator_depth = 1, retry_count 5 and
//!   rnr_retry_count 0; TOS (`-t`) and the ACK timeout (`-a`) are set on
//!   its id at ADDR_RESOLVED.  The server posts its receives before
//!   `rdma_accept(id, NULL)` (`-a` is set on the new id before that; `-t`
//!   means nothing to a server).  Once all `-c` connections are
//!   established the server SENDs `-C` messages of `-S` bytes on each and
//!   waits for their completions and then for as many answers; the client
//!   waits for all its messages, then SENDs the answers from the very
//!   buffer its receives landed in (so they carry the last message it
//!   received) without waiting for their completions.  The server then
//!   disconnects every connection; each side ends at DISCONNECTED (the
//!   client answers the DREQ with `rdma_disconnect`).  Neither first SEND
//!   can race the receives: both sides post theirs before the connection
//!   exists (the module: RDMA_CM_RS_RECV_DEPTH receives from the QP's
//!   creation, reposted as they are read), hence `-C` <= 16 and `-S` <=
//!   4096 (RDMA_CM_RS_MAX_MESSAGE) here.

use super::{field, note, wait, Ctx, T};
use crate::agent::Call;
use crate::payload::{hex, pattern, unhex, verify};
use crate::rping;
use crate::uapi::*;
use anyhow::{bail, ensure, Context, Result};
use std::{
    collections::BTreeSet,
    net::SocketAddr,
    time::{Duration, Instant},
};

/// How long the agent lets a server tool run before `ready` (its default
/// too): it listens by then.
const READY_WAIT_MS: u32 = 1000;

/// These scenarios' bound of a tool's run (the agent's default is 120 s):
/// each run takes seconds, and a tool stuck waiting for the module should
/// fail the scenario soon.
const SCENARIO_TOOL_TIMEOUT_S: u32 = 60;

/// A tool the agent runs (its `run` verb).
pub struct ToolRun {
    call: Call,
    command: String,
    timeout_s: u32,
    ready: bool,
}

/// How a tool's run ended.
#[derive(Debug)]
pub struct ToolResult {
    pub command: String,
    /// The exit status; -1 if a signal ended it (stopped, timed out).
    pub status: i32,
    pub timed_out: bool,
    /// The last 2 KiB of its stdout and stderr.
    pub output: String,
}

/// Starts `tool` (rping, ucmatose, udaddy or mckey) with `args` (space-separated)
/// on the agent's machine; `ready` comes after `wait_ms` or once the tool
/// ended, and the agent kills it after `timeout_s`.
pub fn run_tool(
    ctx: &Ctx,
    tool: &str,
    args: &str,
    wait_ms: u32,
    timeout_s: u32,
) -> Result<ToolRun> {
    start_run(ctx, tool, args, &format!("wait_ms={wait_ms}"), timeout_s)
}

/// The agent's `run` request, `readiness` its `wait_ms=` or `ready=`.
fn start_run(
    ctx: &Ctx,
    tool: &str,
    args: &str,
    readiness: &str,
    timeout_s: u32,
) -> Result<ToolRun> {
    let request = format!(
        "run tool={tool} args={} {readiness} timeout_s={timeout_s}",
        hex(args.as_bytes())
    );
    Ok(ToolRun {
        call: Call::start(&ctx.agent, &request)?,
        command: format!("{tool} {args}"),
        timeout_s,
        ready: false,
    })
}

/// Starts `tool` with `args` on the agent's machine and waits until it has
/// run past its start: the agent's `ready` comes with the tool's first
/// output line (ucmatose and udaddy print "starting client" or "starting
/// server" once librdmacm found its devices), or its end.  Starting a tool
/// loads its libraries and providers over the guest's 9p root, which the
/// other VM under load made take more than 10 s (the kernel stack of a
/// udaddy killed then: `p9_client_open`); the module's own waits begin
/// after.  (rping prints nothing before its first ping: not for it.)
pub fn start_tool_past_startup(
    ctx: &Ctx,
    tool: &str,
    args: &str,
    timeout_s: u32,
) -> Result<ToolRun> {
    let mut run = start_run(ctx, tool, args, "ready=output", timeout_s)?;
    // The read's bound is the tool's own.
    run.call
        .set_read_timeout(Duration::from_secs(u64::from(timeout_s) + 30))?;
    run.ready()?;
    Ok(run)
}

impl ToolRun {
    /// Waits for the agent's `ready`: the tool has run `wait_ms` (a server
    /// listens by then), has printed its first line (`ready=output`), or
    /// has already ended.
    pub fn ready(&mut self) -> Result<()> {
        if !self.ready {
            self.call
                .ready()
                .with_context(|| format!("starting {}", self.command))?;
            self.ready = true;
        }
        Ok(())
    }

    /// Waits for the tool to end.
    pub fn result(mut self) -> Result<ToolResult> {
        self.ready()?;
        // The agent answers by the tool's timeout; the margin covers the
        // kill and the wire.
        self.call
            .set_read_timeout(Duration::from_secs(u64::from(self.timeout_s) + 30))?;
        let r = self
            .call
            .result()
            .with_context(|| format!("waiting for {}", self.command))?;
        Ok(ToolResult {
            command: self.command,
            status: field(&r, "status")?.parse().context("status=")?,
            timed_out: r.contains_key("timed_out"),
            output: String::from_utf8_lossy(&unhex(field(&r, "out")?)?).into_owned(),
        })
    }

    /// Kills the tool (the module's side failed) and returns what it said.
    pub fn stop(mut self) -> Result<ToolResult> {
        self.ready()?;
        self.call.send("stop")?;
        self.result()
    }

    /// Runs the module's side, `body`; if it fails, the tool is stopped
    /// and its output is added to the error, for the reader to see both
    /// sides.  Returns the tool with `body`'s value.
    pub fn alongside<R>(self, body: impl FnOnce() -> Result<R>) -> Result<(Self, R)> {
        match body() {
            Ok(r) => Ok((self, r)),
            Err(e) => {
                let said = match self.stop() {
                    Ok(r) => format!("{} said:\n{}", r.command, r.output),
                    Err(stop) => format!("and stopping the tool failed: {stop:#}"),
                };
                Err(e.context(said))
            }
        }
    }
}

impl ToolResult {
    /// Exit status 0, and each of `lines` a whole line of the output.
    pub fn succeeded_with(&self, lines: &[&str]) -> Result<()> {
        ensure!(
            self.status == 0 && !self.timed_out,
            "{}: {}; its output ends:\n{}",
            self.command,
            if self.timed_out {
                "killed at its timeout".to_string()
            } else {
                format!("exit status {}", self.status)
            },
            self.output
        );
        for line in lines {
            ensure!(
                self.has_line(line),
                "{}: no line {line:?} in its output:\n{}",
                self.command,
                self.output
            );
        }
        Ok(())
    }

    pub fn has_line(&self, line: &str) -> bool {
        self.output.lines().any(|l| l == line)
    }
}

/// The module's next event, TIMEWAIT_EXIT of earlier connections passed
/// over, within [`T`].
fn next_event(dev: &Device) -> Result<Event> {
    next_event_within(dev, T)
}

/// How long a module's server waits for the first request of a tool's
/// client once the client said it started ([`start_tool_past_startup`]).  It
/// still resolves address and route on a loaded machine (the other VM,
/// under TCG), and a CM request lost on the way is sent again only after
/// the request's timeout: 4.1 s for SIDR, 4.8 s for a REQ, 5.4 s with
/// ucmatose's `-a 18` (twice the packet lifetime the ACK timeout sets,
/// plus the response timeout).
pub const FIRST_REQUEST_WAIT_MS: u32 = 30_000;

pub(super) fn next_event_within(dev: &Device, ms: u32) -> Result<Event> {
    loop {
        let e = dev.get_event(ms).context("module: waiting for an event")?;
        if e.event != EventType::TimewaitExit {
            return Ok(e);
        }
    }
}

/// How long the module tries again while its connection requests are
/// rejected because the tool does not listen yet: rping's server says
/// nothing before its first ping, so its `ready` comes after a fixed wait,
/// and a loaded VM may take longer than that to start it (its libraries
/// come over 9p, see [`start_tool_past_startup`]).
const LISTEN_WAIT: Duration = Duration::from_secs(30);

/// Connects a new RC id to `addr` with `param` and returns it once
/// ESTABLISHED.  `prepare` runs on the id before it resolves (options:
/// TOS must be set before the route is).  A REJECTED with nobody
/// listening (over iWARP: `CONNECT` failing with `ECONNREFUSED`) is tried
/// again with a fresh id, for up to [`LISTEN_WAIT`].
fn connect_when_listening(
    dev: &Device,
    addr: SocketAddr,
    param: &Param,
    prepare: impl Fn(u32) -> Result<()>,
) -> Result<u32> {
    connect_when_listening_ps(dev, addr, RDMA_CM_RS_PS_TCP, param, prepare)
}

/// [`connect_when_listening`] with an id of port space `ps`.
fn connect_when_listening_ps(
    dev: &Device,
    addr: SocketAddr,
    ps: u32,
    param: &Param,
    prepare: impl Fn(u32) -> Result<()>,
) -> Result<u32> {
    let since = Instant::now();
    loop {
        let id = dev.create_id_ps(1, ps, RDMA_CM_RS_QPT_RC)?;
        prepare(id)?;
        dev.resolve_addr(id, &addr, 2000).context("resolve_addr")?;
        wait(dev, EventType::AddrResolved)?;
        dev.resolve_route(id, 2000).context("resolve_route")?;
        wait(dev, EventType::RouteResolved)?;
        match dev.connect(id, param) {
            // iWARP: TCP refused the connection inside rdma_connect.
            Err(e)
                if e.raw_os_error() == Some(libc::ECONNREFUSED)
                    && since.elapsed() < LISTEN_WAIT =>
            {
                dev.destroy(id)?;
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
            r => r.context("connect")?,
        }
        let e = next_event(dev)?;
        ensure!(e.id == id, "module: {} of another id", e.line("module"));
        match e.event {
            EventType::Established => return Ok(id),
            // The CM's rejection when nothing listens on the port.
            EventType::Rejected if since.elapsed() < LISTEN_WAIT => {
                dev.destroy(id)?;
                std::thread::sleep(Duration::from_millis(300));
            }
            _ => bail!("module: connecting to {addr}: {}", e.line("module")),
        }
    }
}

/// Waits until every id of `ids` got DISCONNECTED (in any order); with
/// `answer`, the module completes each peer-initiated disconnect at once
/// (the DREP the peer's `rdma_disconnect` waits for).
fn all_disconnected(dev: &Device, ids: &[u32], answer: bool) -> Result<()> {
    let mut left = ids.to_vec();
    while !left.is_empty() {
        let e = next_event(dev)?;
        ensure!(
            e.event == EventType::Disconnected && left.contains(&e.id),
            "module: {} while waiting for DISCONNECTED of {left:?}",
            e.line("module")
        );
        left.retain(|&id| id != e.id);
        if answer {
            dev.disconnect(e.id)?;
        }
    }
    Ok(())
}

/// After DISCONNECTED, nothing is left to read beyond what was counted: a
/// message the tool sent too many would still be queued.
fn nothing_more(dev: &Device, id: u32, counted: usize) -> Result<()> {
    if let Ok(m) = dev.recv(id, RDMA_CM_RS_MAX_MESSAGE as usize, 0) {
        bail!(
            "module: id {id}: a message of {} bytes beyond the {counted} expected",
            m.len()
        );
    }
    Ok(())
}

/// The rping runs: pings and their size.  The largest size is rping's
/// own limit (65536 is what rping refuses, see [`rping::RPING_MAX_SIZE`]).
const RPING_RUNS: &[(u32, u32)] = &[(10, 64), (3, rping::RPING_MAX_SIZE), (25, 1000)];

/// The module as rping's client against an unmodified `rping -s -V` (and
/// `-v` where its output fits what the agent returns): every ping READ by
/// the server and WRITTEN back is checked byte by byte on the module's
/// side, the server exits 0, and with `-v` it printed every ping's text.
/// The module as rping SERVER across the topologies: the sample
/// `rdma_cm_rs_rping.ko` (rping's protocol on the safe API alone, RDMA READ
/// and WRITE of the client's buffers), loaded here for the scenario,
/// against the unmodified `rping -c -V` on the agent's machine.  rping
/// must exit 0 and the sample must log the session's end after exactly
/// the pings the client made.
pub(super) fn rping_module_server(ctx: &mut Ctx) -> Result<()> {
    let port = ctx.port();
    crate::sample_module::with_loaded("rdma_cm_rs_rping", port, &[], || {
        for &(count, size) in &[(10u32, 64u32), (3, 60000)] {
            let args = format!("-c -a {} -p {port} -C {count} -S {size} -V", ctx.local4);
            let ended = format!("after {count} pings");
            let this_ending = |line: &str| {
                line.contains("rdma_cm_rs_rping: session ended") && line.ends_with(&ended)
            };
            // Earlier runs (of this pass or another) logged the same line.
            let before = dmesg_count(this_ending);
            let client = run_tool(ctx, "rping", &args, 0, SCENARIO_TOOL_TIMEOUT_S)?;
            client.result()?.succeeded_with(&[])?;
            let logged = poll_dmesg(|| dmesg_count(this_ending) > before);
            ensure!(logged, "the sample logged no session ending {ended:?}");
            note(&format!(
                "rping {args}: the sample served {count} pings of {size} bytes"
            ));
        }
        Ok(())
    })
}

/// The storage sample `rdma_cm_rs_store.ko` (an SRQ per device, the R/W
/// API, chained and unsignaled answers), loaded here for the scenario,
/// against the tool's librdmacm client on the agent's machine: four
/// connections at once, each PUTting and GETting 12 transfers of 1 byte
/// to 64 KiB at its own offsets of the store, every byte compared, and a
/// GET past the store's end refused with EINVAL.  The synchronous passes
/// load the sample with `busy_poll=1` (its pool's CQs polled by loops of
/// their own), the others without (polled from a workqueue): the sample
/// knows nothing of the tool's ids, the passes are where both of its poll
/// modes meet both transports and both topologies without another
/// scenario.
pub(super) fn store_module_server(ctx: &mut Ctx) -> Result<()> {
    const SIZE: usize = 4 << 20;
    const CONNS: usize = 4;
    let port = ctx.port();
    let busy_poll = crate::uapi::sync_mode();
    let dev = format!("{}0", ctx.transport.name());
    crate::store::with_sample(port, SIZE, busy_poll, || {
        let addr = SocketAddr::new(ctx.local4, port);
        let call = Call::start(
            &ctx.agent,
            &format!("store addr={addr} conns={CONNS} rounds=12 size={SIZE}"),
        )?;
        let r = call.result().context("the store client")?;
        note(&format!("store client against the sample: {r:?}"));
        // Through memory windows where the device has them (rxe): every
        // request of them answered with SEND_WITH_INV of its key, each
        // checked by the client.
        let invalidated: usize = field(&r, "invalidated")?.parse()?;
        let windows = ctx.transport.name() == "rxe";
        let expected = if windows {
            CONNS * 2 * crate::store::SIZE_COUNT
        } else {
            0
        };
        ensure!(
            invalidated == expected,
            "{dev}: the sample invalidated {invalidated} of the client's keys, expected {expected}"
        );
        // The connections take the device's completion vectors in turn:
        // as many vectors used as there are, up to CONNS.
        let StoreLog {
            vectors,
            used,
            cqs,
            polled,
        } = store_log(&dev, port)?;
        let want = if busy_poll {
            "busy-polled"
        } else {
            "workqueue"
        };
        ensure!(
            polled == want,
            "{dev}: the sample's CQs are {polled}, loaded for {want} ones"
        );
        ensure!(
            used.len() == vectors.min(CONNS),
            "{dev}: {CONNS} connections used vectors {used:?} of the device's {vectors}"
        );
        note(&format!(
            "{dev}: {CONNS} connections on vectors {used:?} of {vectors}, CQs {cqs:?} of the sample's pool of {polled} CQs"
        ));
        Ok(())
    })
}

/// The NVMe over Fabrics target sample `rdma_cm_rs_nvmet.ko`, loaded here
/// for the scenario, against the tool's bad-input host on the agent's
/// machine ([`crate::nvmet::bad_cm_requests`]): each malformed connect
/// request (record format 1, admin hsqsize 40 and 0, an I/O qid beyond the
/// four offered, hrqsize below hsqsize + 1, an I/O queue of no live
/// controller) REJECTED with its `nvme_rdma_cm_rej.sts`; 8 bytes of
/// private data INVALID_LEN on iWARP, where they arrive as sent, and
/// INVALID_HSQSIZE on RoCE, whose CM pads them to 56 with zeroes; a good
/// admin request accepted with crqsize = hsqsize + 1.  The sample unloads
/// afterwards (a queue or controller left would hold it), and the VM's
/// dmesg gate and kmemleak scan see what it did.
pub(super) fn nvmet_bad_cm_requests(ctx: &mut Ctx) -> Result<()> {
    let port = ctx.port();
    let iwarp = ctx.iwarp();
    crate::sample_module::with_loaded(crate::nvmet::MODULE, port, crate::nvmet::PARAMS, || {
        let addr = SocketAddr::new(ctx.local4, port);
        let call = Call::start(
            &ctx.agent,
            &format!("nvmet addr={addr} part=cm iwarp={}", u8::from(iwarp)),
        )?;
        let r = call.result().context("the NVMe host's CM requests")?;
        let cases: usize = field(&r, "cases")?.parse()?;
        ensure!(
            cases == crate::nvmet::CM_CASES,
            "{cases} CM request cases passed, expected {}: {r:?}",
            crate::nvmet::CM_CASES
        );
        note(&format!(
            "nvmet: {cases} CM request cases: {}",
            field(&r, "names")?
        ));
        Ok(())
    })
}

/// The NVMe over Fabrics target sample against the tool's bad-input host
/// ([`crate::nvmet::bad_capsules`]): malformed command capsules on the
/// admin queue and an I/O queue (commands before Connect and before
/// CC.EN, Connects with a wrong NQN or controller id, unknown opcodes and
/// fabrics types, FUSE and PSDT, SGL types and subtypes, transfer lengths
/// against the command's, MDTS, LBAs beyond the namespace, a wrong nsid,
/// in-capsule data where none may be or past the in-capsule size, a fifth
/// asynchronous event request, I/O opcodes on the admin queue) each
/// completed with its NVMe status while the queue keeps working; good
/// Writes (in the capsule and keyed) read back, on rxe once more through
/// a memory window whose key the response invalidates; then a Read to an
/// rkey the host never registered.  On rxe the target's RDMA WRITE fails
/// and it ends the controller (both queues DISCONNECTED, and it logs the
/// failure once); on siw the host's TERMINATE ends the I/O queue's
/// connection alone, which the target cannot tell from a disconnect (it
/// logs no controller failure), and the controller serves on.  Either way
/// a new controller connects afterwards.
pub(super) fn nvmet_bad_capsules(ctx: &mut Ctx) -> Result<()> {
    let port = ctx.port();
    let iwarp = ctx.iwarp();
    crate::sample_module::with_loaded(crate::nvmet::MODULE, port, crate::nvmet::PARAMS, || {
        let addr = SocketAddr::new(ctx.local4, port);
        // Earlier loads logged the same line.
        let ctrl_failed = |l: &str| {
            l.contains("rdma_cm_rs_nvmet: controller ")
                && l.ends_with(" failed: disconnecting its queues")
        };
        let failed_before = dmesg_count(ctrl_failed);
        let mut call = Call::start(
            &ctx.agent,
            &format!("nvmet addr={addr} part=capsules iwarp={}", u8::from(iwarp)),
        )?;
        call.set_read_timeout(Duration::from_secs(240))?;
        let r = call.result().context("the NVMe host's capsules")?;
        let cases: usize = field(&r, "cases")?.parse()?;
        let want = crate::nvmet::CAPSULE_CASES;
        ensure!(
            cases == want,
            "{cases} capsule cases passed, expected {want}: {r:?}"
        );
        // The controller failures the target logged: the bad rkey's on
        // RoCE, once (the other ends are the host's disconnects).
        let expected = usize::from(!iwarp);
        if expected > 0 {
            poll_dmesg(|| dmesg_count(ctrl_failed) >= failed_before + expected);
        }
        let failures = dmesg_count(ctrl_failed) - failed_before;
        ensure!(
            failures == expected,
            "the target logged {failures} controller failures, expected {expected}"
        );
        note(&format!(
            "nvmet: {cases} capsule cases (controller {}): {}",
            field(&r, "cntlid")?,
            field(&r, "names")?
        ));
        Ok(())
    })
}

/// What the storage sample's kernel log says of one device.
struct StoreLog {
    /// The device's completion vectors.
    vectors: usize,
    /// The vectors its connections' CQs are on.
    used: BTreeSet<usize>,
    /// The CQs of the sample's pool they used.
    cqs: BTreeSet<usize>,
    /// How the pool's CQs are polled: "busy-polled" or "workqueue".
    polled: String,
}

/// What the storage sample loaded for `port` (its lines of the kernel log
/// from its "listening" line on; loads are one at a time) says of `dev`.
fn store_log(dev: &str, port: u16) -> Result<StoreLog> {
    let lines = dmesg_lines()?;
    let listening = "rdma_cm_rs_store: store of ";
    let marker = format!(" listening on 0.0.0.0:{port}");
    let start = lines
        .iter()
        .rposition(|l| l.contains(listening) && l.ends_with(&marker))
        .context("the sample's listening line")?;
    let added = format!("rdma_cm_rs_store: {dev}: added: ");
    // "... a pool of <how> CQs of <n> entries over <v> completion vector(s)"
    let (vectors, polled) = lines[..start]
        .iter()
        .rev()
        .find_map(|l| {
            let rest = &l[l.find(&added)? + added.len()..];
            let count = rest.split(" over ").nth(1)?.split(' ').next()?;
            let polled = rest.split("a pool of ").nth(1)?.split(' ').next()?;
            Some((count.parse::<usize>().ok()?, polled.to_owned()))
        })
        .context("the sample's added line")?;
    let conn = format!("rdma_cm_rs_store: {dev}: connection of QP ");
    let (mut used, mut cqs) = (BTreeSet::new(), BTreeSet::new());
    for l in &lines[start..] {
        let Some(at) = l.find(&conn) else {
            continue;
        };
        // "<qp> on CQ <i> of <n> (vector <v>)"
        let rest = &l[at + conn.len()..];
        let cq = rest
            .split(" on CQ ")
            .nth(1)
            .and_then(|r| r.split(' ').next());
        let vector = rest
            .split("(vector ")
            .nth(1)
            .and_then(|r| r.strip_suffix(')'));
        let (Some(cq), Some(vector)) = (cq, vector) else {
            bail!("a connection line of the sample without its CQ: {l}");
        };
        cqs.insert(cq.parse()?);
        used.insert(vector.parse()?);
    }
    Ok(StoreLog {
        vectors,
        used,
        cqs,
        polled,
    })
}

/// The kernel log's lines.
fn dmesg_lines() -> Result<Vec<String>> {
    let out = std::process::Command::new("dmesg")
        .output()
        .context("dmesg")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// Whether a line of the kernel log satisfies `want` within 5 s.
/// The kernel log's lines that `want` matches.
fn dmesg_count(want: impl Fn(&str) -> bool) -> usize {
    dmesg_lines()
        .map(|lines| lines.iter().filter(|l| want(l)).count())
        .unwrap_or(0)
}

/// Polls for 5 s until `done`.
fn poll_dmesg(done: impl Fn() -> bool) -> bool {
    for _ in 0..50 {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

pub(super) fn rping_module_client(ctx: &mut Ctx) -> Result<()> {
    for &(count, size) in RPING_RUNS {
        rping_against_server(ctx, count, size)
            .with_context(|| format!("rping -C {count} -S {size}"))?;
    }
    Ok(())
}

fn rping_against_server(ctx: &mut Ctx, count: u32, size: u32) -> Result<()> {
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    // One `server ping data: ` line a ping: all within the 2 KiB of output
    // the agent returns for the small pings only.
    let verbose = size <= 64;
    let args = format!(
        "-s -a {} -p {} -C {count} -S {size} -V{}",
        addr.ip(),
        addr.port(),
        if verbose { " -v" } else { "" }
    );
    let mut server = run_tool(ctx, "rping", &args, READY_WAIT_MS, SCENARIO_TOOL_TIMEOUT_S)?;
    server.ready()?;
    let dev = Device::open()?;
    let (server, ()) = server.alongside(|| {
        // rping's own connection parameters: one RDMA READ in flight.
        let id = connect_when_listening(&dev, addr, &Param::with_data(&[]), |_| Ok(()))?;
        rping::ping(&dev, id, count, size, Duration::ZERO)?;
        dev.disconnect(id)?;
        wait(&dev, EventType::Disconnected)?;
        dev.destroy(id)?;
        Ok(())
    })?;
    let r = server.result()?;
    r.succeeded_with(&[])?;
    if verbose {
        for n in 0..count {
            let text = rping::ping_text(n, size as usize);
            // Printed with %s: up to the NUL.
            let line = format!(
                "server ping data: {}",
                String::from_utf8_lossy(&text[..text.len() - 1])
            );
            ensure!(
                r.has_line(&line),
                "rping -s did not print ping {n} as the module sent it ({line:?}); it said:\n{}",
                r.output
            );
        }
    }
    note(&format!(
        "rping {args}: {count} pings of {size} bytes READ and WRITTEN back, verified"
    ));
    Ok(())
}

/// One ucmatose run: its flags besides address and port, and what they
/// make of it (cmatose's defaults: 1 connection, 10 messages of 100 bytes).
struct Ucmatose {
    flags: &'static str,
    connections: usize,
    messages: usize,
    size: usize,
}

const fn ucmatose(
    flags: &'static str,
    connections: usize,
    messages: usize,
    size: usize,
) -> Ucmatose {
    Ucmatose {
        flags,
        connections,
        messages,
        size,
    }
}

/// The client's runs against the module's server.  The last three sizes
/// are the module's limits (RDMA_CM_RS_RECV_DEPTH messages in flight of
/// RDMA_CM_RS_MAX_MESSAGE bytes); `-t`/`-a` set TOS and the ACK timeout
/// on the client's id.
const UCMATOSE_CLIENT_RUNS: &[Ucmatose] = &[
    ucmatose("", 1, 10, 100),
    ucmatose("-c 4 -C 10 -S 1000", 4, 10, 1000),
    ucmatose("-C 16 -S 4096", 1, 16, 4096),
    ucmatose("-t 32", 1, 10, 100),
    ucmatose("-a 18", 1, 10, 100),
];

/// The module as ucmatose's server against an unmodified `ucmatose -s`:
/// the module accepts each request with the request's values (cmatose's
/// `rdma_accept(id, NULL)`), SENDs `-C` messages of `-S` bytes on each
/// connection, receives as many answers, each the module's message (the
/// client answers from its receive buffer), and disconnects; the client
/// exits 0 with `data transfers complete`.
pub(super) fn ucmatose_module_server(ctx: &mut Ctx) -> Result<()> {
    for run in UCMATOSE_CLIENT_RUNS {
        ucmatose_client_against_module(ctx, run, RDMA_CM_RS_PS_TCP)
            .with_context(|| format!("ucmatose -s ... {}", run.flags))?;
    }
    Ok(())
}

/// The module, listening in port space `ps`, against `ucmatose -s` (whose
/// `-P` in `run` must name the same port space).
fn ucmatose_client_against_module(ctx: &mut Ctx, run: &Ucmatose, ps: u32) -> Result<()> {
    let dev = Device::open()?;
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = dev.create_id_ps(0, ps, RDMA_CM_RS_QPT_RC)?;
    dev.bind(l, &addr).context("bind")?;
    dev.listen(l, 8).context("listen")?;
    let args = format!("-s {} -p {} {}", addr.ip(), addr.port(), run.flags);
    let args = args.trim_end();
    // The module listens already.
    let client = start_tool_past_startup(ctx, "ucmatose", args, SCENARIO_TOOL_TIMEOUT_S)?;
    let message = pattern(run.size, 0x63);
    let (client, ()) = client.alongside(|| {
        let mut conns = Vec::new();
        let mut requests = 0;
        while conns.len() < run.connections {
            let e = if requests == 0 {
                next_event_within(&dev, FIRST_REQUEST_WAIT_MS)
                    .context("module: the first request")?
            } else {
                next_event(&dev)?
            };
            match e.event {
                EventType::ConnectRequest if e.id == l => {
                    requests += 1;
                    // cmatose's conn_param, as the passive side sees it.
                    ensure!(
                        (
                            e.responder_resources,
                            e.initiator_depth,
                            e.retry_count,
                            e.rnr_retry_count
                        ) == (1, 1, 5, 0),
                        "module: not cmatose's request (1, 1, 5, 0): {}",
                        e.line("module")
                    );
                    port_space_is(&dev, e.new_id, ps)?;
                    dev.accept(e.new_id, None).context("accept")?;
                }
                EventType::Established => conns.push(e.id),
                _ => bail!("module: unexpected {}", e.line("module")),
            }
        }
        for &id in &conns {
            for i in 0..run.messages {
                dev.send(id, &message)
                    .with_context(|| format!("module: id {id}: SEND {i}"))?;
            }
        }
        for &id in &conns {
            for i in 0..run.messages {
                let answer = dev
                    .recv(id, RDMA_CM_RS_MAX_MESSAGE as usize, T)
                    .with_context(|| format!("module: id {id}: answer {i}"))?;
                verify(&format!("module: id {id}: answer {i}"), &message, &answer)?;
            }
        }
        for &id in &conns {
            dev.disconnect(id)?;
        }
        all_disconnected(&dev, &conns, false)?;
        for &id in &conns {
            nothing_more(&dev, id, run.messages)?;
            dev.destroy(id)?;
        }
        dev.destroy(l)?;
        Ok(())
    })?;
    client
        .result()?
        .succeeded_with(&["data transfers complete", "return status 0"])?;
    note(&format!(
        "ucmatose {args}: {} connection(s), {} messages of {} bytes each way",
        run.connections, run.messages, run.size
    ));
    Ok(())
}

/// The server's runs against the module's client, and the options the
/// module sets on its ids (SET_OPTION: TOS must be set before the route
/// is resolved, the ACK timeout before the QP is ready to send).  `-t`
/// means nothing to cmatose's server: TOS is the module's here.
const UCMATOSE_SERVER_RUNS: &[(Ucmatose, &[(u32, u64)])] = &[
    (ucmatose("", 1, 10, 100), &[]),
    (ucmatose("-c 4 -C 10 -S 1000", 4, 10, 1000), &[]),
    (ucmatose("-C 16 -S 4096", 1, 16, 4096), &[]),
    (
        ucmatose("-a 18", 1, 10, 100),
        &[
            (rdma_cm_rs_option_RDMA_CM_RS_OPT_TOS, 32),
            (rdma_cm_rs_option_RDMA_CM_RS_OPT_ACK_TIMEOUT, 18),
        ],
    ),
];

fn option_name(option: u32) -> &'static str {
    if option == rdma_cm_rs_option_RDMA_CM_RS_OPT_TOS {
        "TOS"
    } else if option == rdma_cm_rs_option_RDMA_CM_RS_OPT_ACK_TIMEOUT {
        "ACK timeout"
    } else {
        "option"
    }
}

/// The module as ucmatose's client against an unmodified `ucmatose -b`:
/// the module connects `-c` ids (with TOS and ACK timeout set by
/// SET_OPTION in one run), receives the server's `-C` messages of `-S`
/// bytes on each, answers as many, and sees the server's disconnect; the
/// server exits 0 with `data transfers complete` and `disconnected`.
pub(super) fn ucmatose_module_client(ctx: &mut Ctx) -> Result<()> {
    for (run, options) in UCMATOSE_SERVER_RUNS {
        module_client_against_ucmatose(ctx, run, options, RDMA_CM_RS_PS_TCP)
            .with_context(|| format!("ucmatose -b ... {}", run.flags))?;
    }
    Ok(())
}

/// The module's ids, of port space `ps`, against `ucmatose -b` (whose `-P`
/// in `run` must name the same port space).
fn module_client_against_ucmatose(
    ctx: &mut Ctx,
    run: &Ucmatose,
    options: &[(u32, u64)],
    ps: u32,
) -> Result<()> {
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let args = format!("-b {} -p {} {}", addr.ip(), addr.port(), run.flags);
    let args = args.trim_end();
    // "starting server" comes right before its listen; the module tries
    // again while its requests are rejected.
    let server = start_tool_past_startup(ctx, "ucmatose", args, SCENARIO_TOOL_TIMEOUT_S)?;
    let dev = Device::open()?;
    let (server, ()) = server.alongside(|| {
        let set_options = |id| -> Result<()> {
            for &(option, value) in options {
                dev.set_option(id, option, value)
                    .with_context(|| format!("SET_OPTION {} {value}", option_name(option)))?;
            }
            Ok(())
        };
        let mut conns = Vec::new();
        for _ in 0..run.connections {
            let id =
                connect_when_listening_ps(&dev, addr, ps, &Param::with_data(&[]), set_options)?;
            port_space_is(&dev, id, ps)?;
            conns.push(id);
        }
        for &(option, value) in options {
            if option == rdma_cm_rs_option_RDMA_CM_RS_OPT_TOS {
                for &id in &conns {
                    let q = dev.query(id)?;
                    ensure!(
                        u64::from(q.tos) == value && q.tos_set != 0,
                        "module: id {id}: tos {} (set: {})",
                        q.tos,
                        q.tos_set
                    );
                }
            }
        }
        // The server sends first, on every connection once all are up.
        for &id in &conns {
            for i in 0..run.messages {
                let m = dev
                    .recv(id, RDMA_CM_RS_MAX_MESSAGE as usize, T)
                    .with_context(|| format!("module: id {id}: message {i}"))?;
                ensure!(
                    m.len() == run.size,
                    "module: id {id}: message {i} of {} bytes, expected {}",
                    m.len(),
                    run.size
                );
            }
        }
        let answer = pattern(run.size, 0x64);
        for &id in &conns {
            for i in 0..run.messages {
                let what = format!("module: id {id}: answer {i}");
                if i + 1 < run.messages {
                    super::send_or_show_qps(&dev, id, &answer, &what)?;
                    continue;
                }
                // The last answer is not waited for: the server disconnects
                // and destroys its QP as soon as it has it, and rxe reports
                // a receive before it sends the ACK, so the ACK may never
                // come and the send retries into the void (with `-a 18`
                // for about 1 s a try, beyond the 5 s of a waited SEND).
                // The server's "data transfers complete" is what says it
                // arrived.
                dev.send_nowait(id, &answer).with_context(|| what.clone())?;
            }
        }
        // The server disconnects once it has every answer.
        all_disconnected(&dev, &conns, true)?;
        for &id in &conns {
            nothing_more(&dev, id, run.messages)?;
            dev.destroy(id)?;
        }
        Ok(())
    })?;
    server.result()?.succeeded_with(&[
        "data transfers complete",
        "disconnected",
        "return status 0",
    ])?;
    note(&format!(
        "ucmatose {args}: module client, {} connection(s), {} messages of {} bytes each way{}",
        run.connections,
        run.messages,
        run.size,
        options
            .iter()
            .map(|&(option, value)| format!(", {} {value}", option_name(option)))
            .collect::<String>()
    ));
    Ok(())
}

/// QUERY says `id` is of port space `ps`.
fn port_space_is(dev: &Device, id: u32, ps: u32) -> Result<()> {
    let q = dev.query(id)?;
    ensure!(
        q.port_space == ps,
        "module: id {id} of port space {:#x}, expected {ps:#x}",
        q.port_space
    );
    Ok(())
}

/// RDMA_PS_IB over RC (`ucmatose -P ib`): the CM's service ID is the IB
/// port space's (0x013F << 16 | port, `rdma_get_service_id`), the rest is
/// RDMA_PS_TCP's exchange.
const UCMATOSE_PS_IB_RUNS: &[Ucmatose] = &[
    ucmatose("-P ib", 1, 10, 100),
    ucmatose("-P ib -c 4 -C 10 -S 1000", 4, 10, 1000),
];

/// The module's RDMA_PS_IB RC listener against an unmodified `ucmatose -P
/// ib -s`: the requests reach it (a new id of port space RDMA_PS_IB), it
/// accepts with their values, the messages go both ways, the client exits
/// 0 with `data transfers complete`.
pub(super) fn ucmatose_ps_ib_module_server(ctx: &mut Ctx) -> Result<()> {
    for run in UCMATOSE_PS_IB_RUNS {
        ucmatose_client_against_module(ctx, run, RDMA_CM_RS_PS_IB)
            .with_context(|| format!("ucmatose -s ... {}", run.flags))?;
    }
    Ok(())
}

/// The module's RDMA_PS_IB RC ids against an unmodified `ucmatose -P ib
/// -b`: they connect, receive the server's messages, answer them and see
/// its disconnect; the server exits 0 with `data transfers complete`.
pub(super) fn ucmatose_ps_ib_module_client(ctx: &mut Ctx) -> Result<()> {
    for run in UCMATOSE_PS_IB_RUNS {
        module_client_against_ucmatose(ctx, run, &[], RDMA_CM_RS_PS_IB)
            .with_context(|| format!("ucmatose -b ... {}", run.flags))?;
    }
    Ok(())
}
