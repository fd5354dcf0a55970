// SPDX-License-Identifier: GPL-2.0
//! userspace-test: drives `/dev/rdma_cm_rs` and acts as a real librdmacm
//! peer against it.
//!
//!   userspace-test ctl ...      the module, by hand (info, listen, connect, shell)
//!   userspace-test peer ...     a plain librdmacm client or server
//!   userspace-test suite        the KTAP scenarios (module + librdmacm peer)
//!   userspace-test agent        the librdmacm side of the suite, for another VM
//!   userspace-test fuzz         a seeded, replayable ioctl fuzzer
//!   userspace-test bench        the module against librdmacm, measured

mod agent;
mod backoff;
mod bench;
mod cm;
mod diag;
mod faults;
mod fuzz;
mod kernel_fixes;
mod kmsg;
mod nvmet;
mod nvmet_target;
mod payload;
mod report;
mod rping;
mod sample_module;
mod shell;
mod store;
mod suite;
mod uapi;
mod udaddy;

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use payload::{parse_bytes, show, Bytes};
use report::*;
use std::{
    collections::HashMap,
    io::{BufRead, Write},
    net::{IpAddr, SocketAddr, TcpListener},
    time::Duration,
};
use uapi::{Device, Param};

#[derive(Parser)]
#[command(
    version,
    about = "Drives /dev/rdma_cm_rs against real librdmacm peers",
    after_help = "ADDR is IPV4:PORT or [IPV6]:PORT.  DATA and STR take text, hex:HEX or len:N."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Drive the module by hand.
    #[command(subcommand)]
    Ctl(Ctl),
    /// A plain librdmacm endpoint.
    #[command(subcommand)]
    Peer(Peer),
    /// Run the KTAP suite (module through ioctls, librdmacm through an agent).
    Suite {
        /// Only scenarios whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// The agent serving the librdmacm side, HOST:PORT (default: one in
        /// this process, on 127.0.0.1).
        #[arg(long)]
        peer: Option<String>,
        /// List the scenarios and exit.
        #[arg(long)]
        list: bool,
        /// Drive the module's ids in synchronous mode (RDMA_CM_RS_ID_SYNC).
        #[arg(long)]
        sync: bool,
        /// The device the scenarios run on: rxe0 (RoCE) at
        /// RDMA_CM_RS_LOCAL_IP(6), or siw0 (iWARP) at RDMA_CM_RS_SIW_IP(6).
        #[arg(long, value_enum, default_value_t = suite::Transport::Rxe)]
        transport: suite::Transport,
        /// Run only the scenarios this mode or transport leaves out, to see
        /// what they do there (make check never does).
        #[arg(long)]
        left_out: bool,
        /// Run only the scenarios that need the machine to themselves
        /// (they delete and re-add its RDMA device), which the other
        /// passes leave out; with --list, list them.
        #[arg(long)]
        alone: bool,
    },
    /// Serve the librdmacm side of the suite (in the peer VM).
    Agent {
        #[arg(long, default_value = "0.0.0.0:7999")]
        listen: String,
    },
    /// A seeded, replayable ioctl fuzzer over every command of the ABI.
    Fuzz {
        /// PRNG seed (default: from the clock; printed either way).
        #[arg(long)]
        seed: Option<u64>,
        /// Wall-clock bound of the run.
        #[arg(long, default_value_t = 45)]
        seconds: u64,
        /// Stop after this many operations (over all threads).
        #[arg(long)]
        ops: Option<u64>,
        #[arg(long, default_value_t = 3)]
        threads: u32,
        /// Open files a thread keeps.
        #[arg(long, default_value_t = 3)]
        files: u32,
        /// Run a trace file (from --trace) again instead of generating.
        #[arg(long)]
        replay: Option<String>,
        /// Write every operation to FILE, one line each.
        #[arg(long)]
        trace: Option<String>,
        /// Do not stop at the first finding.
        #[arg(long)]
        keep_going: bool,
        /// A call running longer than this is a hang.
        #[arg(long, default_value_t = 30)]
        hang_secs: u64,
        /// Time the shrink (replays of trace prefixes) may take; 0: none.
        #[arg(long, default_value_t = 120)]
        shrink_secs: u64,
        /// First of the 12 ports the fuzzer listens on and connects to.
        #[arg(long, default_value_t = 7600)]
        port_base: u16,
        /// librdmacm peer processes (on RDMA_CM_RS_LOCAL_IP, the rxe
        /// device) connecting to the fuzzer's listeners and SIGKILLed at
        /// random times, at most this many at once; 0: none.
        #[arg(long, default_value_t = 3)]
        peers: u32,
        /// Do not delete and re-add the siw device during the run.
        #[arg(long)]
        no_link: bool,
        /// The siw device the fuzzer deletes and re-adds (never rxe: the
        /// librdmacm peers hold user contexts on it).
        #[arg(long, default_value = "siw0")]
        siw_dev: String,
        /// The siw device's address: some ids bind and resolve there.
        #[arg(long, default_value = "203.0.113.1")]
        siw_addr: std::net::Ipv4Addr,
        /// Load the NVMe target sample on this port for the run: half the
        /// peers are then NVMe hosts of it, sending seeded capsules, most
        /// of them malformed.
        #[arg(long)]
        nvmet_port: Option<u16>,
    },
    /// Benchmark: the module (through /dev/rdma_cm_rs) against a
    /// librdmacm peer doing the same work, both facing the same librdmacm
    /// counterpart; writes results.json, table.md and plot.tsv.
    Bench(bench::Options),
    /// The fuzzer's librdmacm peer (started by `fuzz`, killed by it).
    #[command(hide = true)]
    FuzzPeer {
        /// Where to connect; its port is the first of the --span ports.
        #[arg(long)]
        addr: SocketAddr,
        /// Ports from that of --addr to try.
        #[arg(long, default_value_t = 1)]
        span: u16,
        /// Ports to try first (comma-separated).
        #[arg(long, value_delimiter = ',')]
        prefer: Vec<u16>,
        #[arg(long)]
        seed: u64,
        /// The NVMe target sample: some sessions speak NVMe/RDMA to it.
        #[arg(long)]
        nvmet: Option<SocketAddr>,
    },
}

#[derive(Subcommand)]
enum Ctl {
    /// ABI version and limits.
    Info,
    /// The module listens, accepts, answers one message a connection, and
    /// exits once every connection has disconnected.
    Listen {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 8)]
        backlog: u32,
        /// Private data of the module's accept.
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        accept_data: Bytes,
        /// Sent back for each message received.
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        reply: Bytes,
        /// Connections to serve before exiting.
        #[arg(long, default_value_t = 1)]
        connections: u32,
    },
    /// The module connects, sends a message, prints the reply, disconnects.
    Connect {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        /// Private data of the connect.
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        data: Bytes,
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        message: Bytes,
        /// Fail unless the reply is the message, byte for byte (an echo
        /// service).
        #[arg(long)]
        expect_echo: bool,
    },
    /// rping's client through the module: registered regions, adverts,
    /// the server's RDMA READ and WRITE, and a check of every ping (rping's
    /// `-V`).  Works against `rping -s` and the rdma_cm_rs_rping sample.
    Rping {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        /// Pings.
        #[arg(long, default_value_t = 10)]
        count: u32,
        /// Bytes a ping (rping's -S).
        #[arg(long, default_value_t = 64)]
        size: u32,
        /// Pause between pings (0: none).
        #[arg(long, default_value_t = 0)]
        interval_ms: u64,
    },
    /// Device removal with the module's ids and regions on the device:
    /// `rdma link delete` must finish (the module destroys its ids from a
    /// workqueue), every id gets DEVICE_REMOVAL and is gone, then the link
    /// is added back.  Run it in a process that never opened librdmacm:
    /// rxe cannot take a device from under open user contexts.
    DeviceRemoval {
        /// The module's address on the device, with a free port.
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        /// Established connections on the device besides the first.
        #[arg(long, default_value_t = 100)]
        connections: usize,
        /// The removal must be over (device gone, every id told) within
        /// this many milliseconds.
        #[arg(long, default_value_t = 10_000)]
        bound_ms: u64,
    },
    /// Two VMs: the peer VM's agent sends to the module, the host kills
    /// the peer VM, the module must notice within the bound; prints KTAP.
    PeerVmKilled {
        /// The module's address, with a free port.
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        /// The agent in the peer VM, HOST:PORT.
        #[arg(long)]
        peer: String,
        /// The module's send must fail within this many milliseconds.
        #[arg(long, default_value_t = 30_000)]
        bound_ms: u64,
        /// Also the NVMe target (rdma_cm_rs_nvmet.ko, loaded on this
        /// address's port) with the kernel's host in the peer VM doing
        /// I/O against it at this address when the VM dies: the target
        /// must fail the host's controller within its keep-alive timeout
        /// and 2 s, and unload.
        #[arg(long, value_parser = shell::parse_addr)]
        nvme_target: Option<SocketAddr>,
    },
    /// Allocation and user-copy failures injected at every fault point of
    /// open, create, listen, connect, accept, send and MR_REG in turn
    /// (`/proc/thread-self/fail-nth`); prints KTAP lines.  Needs debugfs
    /// and a kernel with FAILSLAB, FAIL_PAGE_ALLOC and
    /// FAULT_INJECTION_USERCOPY.
    FailNth {
        /// The module's address, with two free ports from this one.
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        /// Threads running operations at once (each its own).
        #[arg(long, default_value_t = 2)]
        jobs: usize,
        /// Only this operation.
        #[arg(long, value_enum)]
        only: Option<faults::Op>,
        /// Name each fault point on stderr before its round, and have the
        /// kernel log each injected failure (the fault injection's
        /// `verbose` 1: "FAULT_INJECTION: forcing a failure").
        #[arg(long)]
        verbose: bool,
    },
    /// Whether this process may use the device: opens it (or takes the
    /// open file descriptor FD it inherited), creates and destroys an id,
    /// and prints `open: ok|ERRNO` and `ioctl: ok|ERRNO`.  Exits 0 either
    /// way: the suite judges the lines.
    Access {
        #[arg(long)]
        fd: Option<i32>,
    },
    /// Raw commands from standard input, one a line (`help` lists them).
    Shell,
    /// The module as udaddy's server (UD, SIDR) on IP port 7174, for
    /// `udaddy -s IP [-c N] [-C COUNT] [-S SIZE]`: accepts each request,
    /// receives every datagram, replies as many to each client.
    UdaddyServer {
        ip: IpAddr,
        /// udaddy's -c.
        #[arg(long, default_value_t = 1)]
        connections: u32,
        /// udaddy's -C (at most the module's 16 posted receives).
        #[arg(long, default_value_t = udaddy::COUNT)]
        count: u32,
        /// udaddy's -S.
        #[arg(long, default_value_t = udaddy::SIZE)]
        size: u32,
    },
    /// The module as udaddy's client against `udaddy -b IP [-C COUNT] [-S
    /// SIZE]` (port 7174): SIDR, COUNT datagrams with its QP number as
    /// immediate data, COUNT replies checked.
    UdaddyClient {
        ip: IpAddr,
        #[arg(long, default_value_t = udaddy::COUNT)]
        count: u32,
        #[arg(long, default_value_t = udaddy::SIZE)]
        size: u32,
    },
}

#[derive(Subcommand)]
enum Peer {
    /// Connect, print `established`, then send a message every 20 ms until
    /// killed (a peer that dies mid-transfer).
    Hold {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
    },
    /// Listen, print `request` on the first connection request, then
    /// neither accept nor reject until killed (a peer that dies
    /// mid-connection).
    HoldRequest {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
    },
    /// Connect, send a message, print the reply, disconnect.
    Client {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        /// Private data of the connect.
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        data: Bytes,
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        message: Bytes,
    },
    /// Accept connections, answer one message each (echo, or --reply), and
    /// exit once every connection has disconnected.
    Server {
        #[arg(value_parser = shell::parse_addr)]
        addr: SocketAddr,
        #[arg(long, default_value_t = 8)]
        backlog: i32,
        /// Private data of the accept.
        #[arg(long, default_value = "", value_parser = parse_bytes)]
        accept_data: Bytes,
        /// Sent back for each message (default: the message itself).
        #[arg(long, value_parser = parse_bytes)]
        reply: Option<Bytes>,
        #[arg(long, default_value_t = 1)]
        connections: u32,
    },
}

fn ctl_access(fd: Option<i32>) {
    let errno = |e: &std::io::Error| e.raw_os_error().map_or(e.to_string(), fuzz::errno_name);
    let dev = match fd {
        Some(fd) => Device::from_inherited_fd(fd),
        None => Device::open(),
    };
    match dev {
        Err(e) => say(&format!("open: {}", errno(&e))),
        Ok(dev) => {
            say("open: ok");
            let r = dev
                .info()
                .and_then(|_| dev.create_id(0))
                .and_then(|id| dev.destroy(id));
            say(&format!(
                "ioctl: {}",
                r.map_or_else(|e| errno(&e), |()| "ok".to_string())
            ));
        }
    }
}

/// Bounded waits of the by-hand modes, for everything after the first
/// request (people take their time to start the other side).
const WAIT_MS: u32 = 15_000;
const WAIT: Duration = Duration::from_millis(WAIT_MS as u64);

pub(crate) fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The module's next event (printed), which must be `want`.
pub(crate) fn module_expect(dev: &Device, want: EventType) -> Result<uapi::Event> {
    let e = dev
        .get_event(WAIT_MS)
        .with_context(|| format!("module: waiting for {}", want.name()))?;
    say(&e.line("module"));
    if e.event != want {
        bail!("module: expected {}", want.name());
    }
    Ok(e)
}

fn ctl_listen(
    addr: SocketAddr,
    backlog: u32,
    accept_data: &[u8],
    reply: &[u8],
    connections: u32,
) -> Result<()> {
    let dev = Device::open()?;
    let l = dev.create_id(1)?;
    dev.bind(l, &addr).context("bind")?;
    dev.listen(l, backlog).context("listen")?;
    say(&format!(
        "module: listening on {addr} id={l} backlog={backlog}, for {connections} connection(s)"
    ));
    let mut done = 0;
    while done < connections {
        let e = dev.get_event(uapi::RDMA_CM_RS_TIMEOUT_INFINITE)?;
        say(&e.line("module"));
        match e.event {
            EventType::ConnectRequest => {
                // The request's values are the receiver's side already.
                let mut p = Param::with_data(accept_data);
                p.responder_resources = e.responder_resources;
                p.initiator_depth = e.initiator_depth;
                match dev.accept(e.new_id, Some(&p)) {
                    Ok(()) => say(&format!(
                        "module: accept id={} {}",
                        e.new_id,
                        show("private_data", accept_data)
                    )),
                    Err(err) => {
                        say(&format!("module: accept id={}: {err}", e.new_id));
                        let _ = dev.destroy(e.new_id);
                        done += 1;
                    }
                }
            }
            EventType::Established => match dev.recv(e.id, cm::MSG, WAIT_MS) {
                Ok(msg) => {
                    say(&format!(
                        "module: recv id={} {}",
                        e.id,
                        show("message", &msg)
                    ));
                    if !reply.is_empty() {
                        dev.send(e.id, reply).context("send")?;
                        say(&format!(
                            "module: send id={} {}",
                            e.id,
                            show("message", reply)
                        ));
                    }
                }
                Err(err) => say(&format!("module: recv id={}: {err}", e.id)),
            },
            EventType::Disconnected => {
                // Completes the peer's disconnect (the DREP), then frees the id.
                let _ = dev.disconnect(e.id);
                dev.destroy(e.id)?;
                done += 1;
            }
            EventType::Rejected | EventType::Unreachable | EventType::ConnectError if e.id != l => {
                dev.destroy(e.id)?;
                done += 1;
            }
            _ => {}
        }
    }
    dev.destroy(l)?;
    say(&format!(
        "module: {done} connection(s) served, listener destroyed"
    ));
    Ok(())
}

/// Creates an id on `dev` and connects it to `addr` with `data` as private
/// data; returns once it is ESTABLISHED.
fn module_connect(dev: &Device, addr: SocketAddr, data: &[u8]) -> Result<u32> {
    let id = dev.create_id(1)?;
    say(&format!("module: id={id} resolving {addr}"));
    dev.resolve_addr(id, &addr, 2000).context("resolve_addr")?;
    module_expect(dev, EventType::AddrResolved)?;
    dev.resolve_route(id, 2000).context("resolve_route")?;
    module_expect(dev, EventType::RouteResolved)?;
    dev.connect(id, &Param::with_data(data))
        .context("connect")?;
    say(&format!(
        "module: connect id={id} {}",
        show("private_data", data)
    ));
    module_expect(dev, EventType::Established)?;
    Ok(id)
}

fn ctl_connect(addr: SocketAddr, data: &[u8], message: &[u8], expect_echo: bool) -> Result<()> {
    let dev = Device::open()?;
    let id = module_connect(&dev, addr, data)?;
    if !message.is_empty() {
        dev.send(id, message).context("send")?;
        say(&format!(
            "module: send id={id} {}",
            show("message", message)
        ));
        let reply = dev.recv(id, cm::MSG, WAIT_MS).context("recv")?;
        say(&format!("module: {}", show("reply", &reply)));
        if expect_echo {
            ensure!(
                reply == message,
                "the reply is not the message: {} bytes, the first difference at byte {:?}",
                reply.len(),
                reply.iter().zip(message).position(|(a, b)| a != b)
            );
            say(&format!(
                "module: the reply is the message, {} bytes",
                reply.len()
            ));
        }
    }
    dev.disconnect(id).context("disconnect")?;
    say(&format!("module: disconnect id={id}"));
    module_expect(&dev, EventType::Disconnected)?;
    dev.destroy(id)?;
    Ok(())
}

/// rping's client on the module (see [`rping::ping`]): connects, pings,
/// disconnects.
fn ctl_rping(addr: SocketAddr, count: u32, size: u32, interval: Duration) -> Result<()> {
    ensure!(
        (rping::MIN_SIZE..=rping::MAX_SIZE).contains(&size),
        "size must be {}..={}",
        rping::MIN_SIZE,
        rping::MAX_SIZE
    );
    let dev = Device::open()?;
    let id = module_connect(&dev, addr, &[])?;
    rping::ping(&dev, id, count, size, interval)?;
    say(&format!(
        "module: rping {count} pings of {size} bytes verified"
    ));
    dev.disconnect(id).context("disconnect")?;
    module_expect(&dev, EventType::Disconnected)?;
    dev.destroy(id)?;
    Ok(())
}

/// Waits (bounded) until `dev` delivered DEVICE_REMOVAL for every id in
/// `ids`; other events (DISCONNECTED of the connection) are passed over.
pub(crate) fn rdma_cmd(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("timeout")
        .arg("30")
        .arg("rdma")
        .args(args)
        .output()
        .context("rdma")?;
    ensure!(
        out.status.success(),
        "rdma {}: {} {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ok_or_errno(r: uapi::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => format!("error: {e}"),
    }
}

fn run_shell_command(dev: &Device, c: shell::Command) -> Result<String> {
    use shell::Command as C;
    Ok(match c {
        C::Help => shell::HELP.into(),
        C::Quit => String::new(),
        C::Info => {
            let i = dev.info()?;
            format!(
                "abi_version={} max_private_data={} max_message={} max_ids={} recv_depth={} \
                 max_ud_peers={}",
                i.abi_version,
                i.max_private_data,
                i.max_message,
                i.max_ids,
                i.recv_depth,
                i.max_ud_peers
            )
        }
        C::Create {
            port_space,
            qp_type,
            context,
        } => format!("id={}", dev.create_id_ps(context, port_space, qp_type)?),
        C::Bind { id, addr } => ok_or_errno(dev.bind(id, &addr)),
        C::Listen { id, backlog } => ok_or_errno(dev.listen(id, backlog)),
        C::ResolveAddr {
            id,
            addr,
            timeout_ms,
        } => ok_or_errno(dev.resolve_addr(id, &addr, timeout_ms)),
        C::ResolveRoute { id, timeout_ms } => ok_or_errno(dev.resolve_route(id, timeout_ms)),
        C::Connect { id, data } => ok_or_errno(dev.connect(id, &Param::with_data(&data))),
        C::Accept { id, data } => {
            ok_or_errno(dev.accept(id, data.map(|d| Param::with_data(&d)).as_ref()))
        }
        C::Reject { id, reason, data } => ok_or_errno(dev.reject(id, reason, &data)),
        C::Disconnect { id } => ok_or_errno(dev.disconnect(id)),
        C::Destroy { id } => ok_or_errno(dev.destroy(id)),
        C::Set { id, option, value } => ok_or_errno(dev.set_option(id, option, value)),
        C::Query { id } => {
            let q = dev.query(id)?;
            let device = uapi::device_name(&q);
            let addr = |a| uapi::parse_sockaddr(a).map_or("-".into(), |a| a.to_string());
            format!(
                "id={id} state={} port_space={:#x} qp_type={} qp_num={:#x} port_num={} \
                 src={} dst={} device={device:?} responder_resources={} initiator_depth={} \
                 tos={}{} backlog={}{}",
                uapi::state_name(q.state),
                q.port_space,
                q.qp_type,
                q.qp_num,
                q.port_num,
                addr(&q.src),
                addr(&q.dst),
                q.responder_resources,
                q.initiator_depth,
                q.tos,
                if q.tos_set != 0 { " (set)" } else { "" },
                q.backlog,
                // UD ids with a QP.
                if q.max_datagram != 0 {
                    format!(" max_datagram={} qkey={:#x}", q.max_datagram, q.qkey)
                } else {
                    String::new()
                }
            )
        }
        C::Event { timeout_ms } => match dev.get_event(timeout_ms) {
            Ok(e) => e.line("module"),
            Err(e) => format!("error: {e}"),
        },
        C::Send { id, text } => match dev.send(id, &text) {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => format!(
                "error: {e}: over iWARP the active side sends first (rdma_connect(3)); \
                 this passive id may send once the peer's first message arrived"
            ),
            other => ok_or_errno(other),
        },
        C::Recv { id, timeout_ms } => match dev.recv(id, cm::MSG, timeout_ms) {
            Ok(m) => format!("module: recv id={id} {}", show("message", &m)),
            Err(e) => format!("error: {e}"),
        },
    })
}

fn ctl_shell() -> Result<()> {
    let dev = Device::open()?;
    let interactive = stdin_is_terminal();
    if interactive {
        say("ctl shell: one command a line; `help` lists them");
    }
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        match shell::parse(&line) {
            Ok(None) => {}
            Ok(Some(shell::Command::Quit)) => break,
            Ok(Some(c)) => match run_shell_command(&dev, c) {
                Ok(s) => say(&s),
                Err(e) => say(&format!("error: {e:#}")),
            },
            Err(e) => say(&format!("error: {e:#}")),
        }
    }
    Ok(())
}

fn stdin_is_terminal() -> bool {
    use std::io::IsTerminal;
    std::io::stdin().is_terminal()
}

fn peer_hold(addr: SocketAddr) -> Result<()> {
    let ch = cm::Channel::new()?;
    let id = cm::resolve(&ch, &addr, Duration::from_secs(5))?;
    let mut conn = cm::Conn::new(id)?;
    // Started, resolved, its QP made: what is left is the request.
    say("connecting");
    let ev = conn.connect(&cm::Param::with_data(b"hold"), &ch, WAIT)?;
    ensure!(
        ev.event == EventType::Established,
        "not established: {}",
        ev.name()
    );
    say("established");
    for n in 0u64.. {
        conn.send(format!("hold {n}").as_bytes())?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn peer_hold_request(addr: SocketAddr) -> Result<()> {
    let ch = cm::Channel::new()?;
    let _listener = cm::listen(&ch, &addr, 4)?;
    say("listening");
    // Neither accepted nor rejected: the request's id stays as it is.
    let _request = ch.expect(EventType::ConnectRequest, Duration::from_secs(60))?;
    say("request");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn peer_client(addr: SocketAddr, data: &[u8], message: &[u8]) -> Result<()> {
    let ch = cm::Channel::new()?;
    say(&format!("librdmacm: resolving {addr}"));
    let id = cm::resolve_logged(&ch, &addr, Duration::from_secs(5), &mut |e| {
        say(&e.line("librdmacm", ""))
    })?;
    let mut conn = cm::Conn::new(id)?;
    say(&format!(
        "librdmacm: connect qp_num={:#x} {}",
        conn.qp_num(),
        show("private_data", data)
    ));
    let ev = conn.connect(&cm::Param::with_data(data), &ch, WAIT)?;
    say(&ev.line("librdmacm", ""));
    if ev.event != EventType::Established {
        bail!("librdmacm: not established: {}", ev.name());
    }
    if !message.is_empty() {
        conn.send(message)?;
        say(&format!("librdmacm: send {}", show("message", message)));
        let reply = conn.recv(WAIT)?;
        say(&format!("librdmacm: recv {}", show("message", &reply)));
    }
    conn.disconnect()?;
    say("librdmacm: disconnect");
    let ev = ch.expect(EventType::Disconnected, WAIT)?;
    say(&ev.line("librdmacm", ""));
    Ok(())
}

fn peer_server(
    addr: SocketAddr,
    backlog: i32,
    accept_data: &[u8],
    reply: Option<&[u8]>,
    connections: u32,
) -> Result<()> {
    let ch = cm::Channel::new()?;
    let _listener = cm::listen(&ch, &addr, backlog)?;
    say(&format!(
        "librdmacm: listening on {addr} backlog={backlog}, for {connections} connection(s)"
    ));
    // Connections by their id, with a number for people.
    let mut conns: HashMap<cm::IdKey, (u32, cm::Conn)> = HashMap::new();
    let mut numbered = 0;
    let mut done = 0;
    while done < connections {
        // The first request may take as long as people need; then bounded.
        let mut ev = loop {
            match ch.next(Duration::from_secs(60)) {
                Ok(ev) => break ev,
                Err(_) if conns.is_empty() => continue,
                Err(e) => return Err(e),
            }
        };
        let key = ev.id;
        let label = conns
            .get(&key)
            .map_or(String::new(), |(n, _)| format!("conn={n}"));
        match ev.event {
            EventType::ConnectRequest => {
                numbered += 1;
                say(&ev.line("librdmacm", &format!("conn={numbered}")));
                let conn = cm::Conn::new(ev.take_request()?)?;
                let mut p = cm::Param::with_data(accept_data);
                p.responder_resources = ev.responder_resources;
                p.initiator_depth = ev.initiator_depth;
                conn.accept(&p)?;
                say(&format!(
                    "librdmacm: accept conn={numbered} qp_num={:#x} {}",
                    conn.qp_num(),
                    show("private_data", accept_data)
                ));
                conns.insert(key, (numbered, conn));
            }
            EventType::Established => {
                say(&ev.line("librdmacm", &label));
                if let Some((n, conn)) = conns.get_mut(&key) {
                    match conn.recv(WAIT) {
                        Ok(msg) => {
                            say(&format!(
                                "librdmacm: recv conn={n} {}",
                                show("message", &msg)
                            ));
                            let answer = reply.unwrap_or(&msg);
                            conn.send(answer)?;
                            say(&format!(
                                "librdmacm: send conn={n} {}",
                                show("message", answer)
                            ));
                        }
                        Err(e) => say(&format!("librdmacm: recv conn={n}: {e:#}")),
                    }
                }
            }
            EventType::Disconnected
            | EventType::Rejected
            | EventType::Unreachable
            | EventType::ConnectError => {
                say(&ev.line("librdmacm", &label));
                if let Some((_, conn)) = conns.remove(&key) {
                    let _ = conn.disconnect();
                    drop(conn);
                    done += 1;
                }
            }
            _ => say(&ev.line("librdmacm", &label)),
        }
    }
    say(&format!("librdmacm: {done} connection(s) served"));
    Ok(())
}

fn env_ip(name: &str, default: IpAddr) -> Result<IpAddr> {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v.parse().with_context(|| format!("{name}={v:?}")),
        _ => Ok(default),
    }
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Ctl(Ctl::Info) => {
            let i = Device::open()
                .with_context(|| format!("open {}", uapi::DEVICE))?
                .info()?;
            say(&format!(
                "module: abi_version={} max_private_data={} max_message={} max_ids={} \
                 recv_depth={} max_ud_peers={}",
                i.abi_version,
                i.max_private_data,
                i.max_message,
                i.max_ids,
                i.recv_depth,
                i.max_ud_peers
            ));
        }
        Cmd::Ctl(Ctl::Listen {
            addr,
            backlog,
            accept_data,
            reply,
            connections,
        }) => ctl_listen(addr, backlog, &accept_data, &reply, connections)?,
        Cmd::Ctl(Ctl::Connect {
            addr,
            data,
            message,
            expect_echo,
        }) => ctl_connect(addr, &data, &message, expect_echo)?,
        Cmd::Ctl(Ctl::Rping {
            addr,
            count,
            size,
            interval_ms,
        }) => ctl_rping(addr, count, size, Duration::from_millis(interval_ms))?,
        Cmd::Ctl(Ctl::DeviceRemoval {
            addr,
            connections,
            bound_ms,
        }) => faults::device_removal(addr, connections, Duration::from_millis(bound_ms))?,
        Cmd::Ctl(Ctl::PeerVmKilled {
            addr,
            peer,
            bound_ms,
            nvme_target,
        }) => {
            let agent = shell::resolve_host(&peer)?;
            let bound = Duration::from_millis(bound_ms);
            let kill = |results: &mut Flat| faults::peer_vm_killed(addr, agent, bound, results);
            let mut results = Flat::default();
            match nvme_target {
                None => kill(&mut results)?,
                Some(target) => match nvmet_target::lacking_fix(target) {
                    None => nvmet_target::host_killed_mid_io(target, agent, &mut results, kill)?,
                    Some(why) => {
                        kill(&mut results)?;
                        results.skip(
                            "NVMe host VM killed mid-I/O: the target failed its controller",
                            &why,
                        );
                        results.skip("NVMe host VM killed mid-I/O: the target unloaded", &why);
                    }
                },
            }
            if !results.ok {
                std::process::exit(1);
            }
        }
        Cmd::Ctl(Ctl::FailNth {
            addr,
            jobs,
            only,
            verbose,
        }) => {
            if !faults::fail_nth(addr, 1, only, jobs, verbose)? {
                std::process::exit(1);
            }
        }
        Cmd::Ctl(Ctl::Access { fd }) => ctl_access(fd),
        Cmd::Ctl(Ctl::Shell) => ctl_shell()?,
        Cmd::Ctl(Ctl::UdaddyServer {
            ip,
            connections,
            count,
            size,
        }) => {
            let dev = Device::open()?;
            let mut log = |l: &str| say(l);
            let listener = udaddy::listen(
                &dev,
                SocketAddr::new(ip, udaddy::PORT),
                connections,
                &mut log,
            )?;
            let clients = udaddy::module_server(
                &dev,
                listener,
                connections,
                count,
                size,
                uapi::RDMA_CM_RS_TIMEOUT_INFINITE,
                &mut log,
            )?;
            say(&format!(
                "module: udaddy server done, {} client(s)",
                clients.len()
            ));
        }
        Cmd::Ctl(Ctl::UdaddyClient { ip, count, size }) => {
            udaddy::module_client(
                &Device::open()?,
                SocketAddr::new(ip, udaddy::PORT),
                count,
                size,
                1,
                &mut |l| say(l),
            )?;
            say("module: udaddy client done");
        }
        Cmd::Peer(Peer::Hold { addr }) => peer_hold(addr)?,
        Cmd::Peer(Peer::HoldRequest { addr }) => peer_hold_request(addr)?,
        Cmd::Peer(Peer::Client {
            addr,
            data,
            message,
        }) => peer_client(addr, &data, &message)?,
        Cmd::Peer(Peer::Server {
            addr,
            backlog,
            accept_data,
            reply,
            connections,
        }) => peer_server(addr, backlog, &accept_data, reply.as_deref(), connections)?,
        Cmd::Agent { listen } => {
            let l = TcpListener::bind(&listen).with_context(|| format!("bind {listen}"))?;
            eprintln!("agent: serving on {}", l.local_addr()?);
            agent::serve_forever(l);
        }
        Cmd::Fuzz {
            seed,
            seconds,
            ops,
            threads,
            files,
            replay,
            trace,
            keep_going,
            hang_secs,
            shrink_secs,
            port_base,
            peers,
            no_link,
            siw_dev,
            siw_addr,
            nvmet_port,
        } => {
            let local = match env_ip("RDMA_CM_RS_LOCAL_IP", [192, 0, 2, 1].into())? {
                IpAddr::V4(a) => a,
                IpAddr::V6(a) => bail!("RDMA_CM_RS_LOCAL_IP must be IPv4, not {a}"),
            };
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
            fuzz::run(fuzz::Options {
                seed,
                seconds,
                ops,
                threads: threads.max(1),
                files: files.max(1),
                replay,
                trace,
                keep_going,
                hang_secs: hang_secs.max(1),
                shrink_secs,
                local,
                port_base,
                peers,
                link: !no_link,
                siw_addr,
                siw_dev,
                nvmet_port,
            })?;
        }
        Cmd::FuzzPeer {
            addr,
            span,
            prefer,
            seed,
            nvmet,
        } => fuzz::peer(addr, span, &prefer, seed, nvmet)?,
        Cmd::Bench(options) => bench::run(options)?,
        Cmd::Suite {
            filter,
            peer,
            list,
            sync,
            transport,
            left_out,
            alone,
        } => {
            uapi::set_sync_mode(sync);
            if list {
                for name in suite::names(alone) {
                    say(name);
                }
                return Ok(());
            }
            // Local and peer, IPv4 and IPv6: the variables tools/vm sets,
            // and the one-VM addresses.
            let ([l4, l6, p4, p6], default4, default6) = match transport {
                suite::Transport::Rxe => (
                    [
                        "RDMA_CM_RS_LOCAL_IP",
                        "RDMA_CM_RS_LOCAL_IP6",
                        "RDMA_CM_RS_PEER_IP",
                        "RDMA_CM_RS_PEER_IP6",
                    ],
                    "192.0.2.1",
                    "2001:db8::1",
                ),
                suite::Transport::Siw => (
                    [
                        "RDMA_CM_RS_SIW_IP",
                        "RDMA_CM_RS_SIW_IP6",
                        "RDMA_CM_RS_SIW_PEER_IP",
                        "RDMA_CM_RS_SIW_PEER_IP6",
                    ],
                    "203.0.113.1",
                    "2001:db8:1::1",
                ),
            };
            let local4 = env_ip(l4, default4.parse().expect("literal"))?;
            let local6 = env_ip(l6, default6.parse().expect("literal"))?;
            let peer4 = env_ip(p4, local4)?;
            let peer6 = env_ip(p6, local6)?;
            let agent = match peer {
                Some(p) => shell::resolve_host(&p).context("--peer")?,
                None => agent::spawn_local()?,
            };
            let mut ctx = suite::Ctx::new(transport, local4, peer4, local6, peer6, agent);
            if !suite::run(&mut ctx, filter.as_deref(), left_out, alone)? {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &str) -> Cmd {
        Cli::try_parse_from(std::iter::once("userspace-test").chain(args.split(' ')))
            .unwrap_or_else(|e| panic!("{args}: {e}"))
            .cmd
    }

    #[test]
    fn fuzz_command_lines() {
        match parse("fuzz --seed 3 --peers 0 --no-link --siw-dev siw1 --siw-addr 203.0.113.9") {
            Cmd::Fuzz {
                seed: Some(3),
                peers: 0,
                no_link: true,
                siw_dev,
                siw_addr,
                ..
            } => {
                assert_eq!(siw_dev, "siw1");
                assert_eq!(siw_addr, std::net::Ipv4Addr::new(203, 0, 113, 9));
            }
            _ => panic!("fuzz"),
        }
        match parse("fuzz") {
            Cmd::Fuzz {
                peers: 3,
                no_link: false,
                siw_dev,
                ..
            } => assert_eq!(siw_dev, "siw0"),
            _ => panic!("fuzz defaults"),
        }
        match parse("fuzz-peer --addr 192.0.2.1:7600 --span 12 --prefer 7603,7605 --seed 9") {
            Cmd::FuzzPeer {
                addr,
                span: 12,
                prefer,
                seed: 9,
                nvmet: None,
            } => {
                assert_eq!(addr, "192.0.2.1:7600".parse().unwrap());
                assert_eq!(prefer, [7603, 7605]);
            }
            _ => panic!("fuzz-peer"),
        }
        match parse("fuzz-peer --addr 192.0.2.1:7600 --seed 9 --nvmet 192.0.2.1:7620") {
            Cmd::FuzzPeer { nvmet: Some(t), .. } => {
                assert_eq!(t, "192.0.2.1:7620".parse().unwrap())
            }
            _ => panic!("fuzz-peer --nvmet"),
        }
    }

    #[test]
    fn the_cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn command_lines() {
        match parse("ctl listen 192.0.2.1:7471 --backlog 4 --accept-data hi --reply hex:0001 --connections 3") {
            Cmd::Ctl(Ctl::Listen {
                addr,
                backlog,
                accept_data,
                reply,
                connections,
            }) => {
                assert_eq!(addr, "192.0.2.1:7471".parse().unwrap());
                assert_eq!((backlog, connections), (4, 3));
                assert_eq!(&*accept_data, b"hi");
                assert_eq!(&*reply, [0, 1]);
            }
            _ => panic!("ctl listen"),
        }
        match parse("ctl connect [2001:db8::1]:7471 --data len:56 --message ping") {
            Cmd::Ctl(Ctl::Connect {
                addr,
                data,
                message,
                ..
            }) => {
                assert!(addr.is_ipv6());
                assert_eq!(data.len(), 56);
                assert_eq!(&*message, b"ping");
            }
            _ => panic!("ctl connect"),
        }
        match parse("peer server 0.0.0.0:7471 --accept-data welcome") {
            Cmd::Peer(Peer::Server {
                accept_data,
                reply,
                connections,
                ..
            }) => {
                assert_eq!(&*accept_data, b"welcome");
                assert_eq!((reply, connections), (None, 1));
            }
            _ => panic!("peer server"),
        }
        match parse("peer client 192.0.2.1:7471") {
            Cmd::Peer(Peer::Client { data, message, .. }) => {
                assert!(data.is_empty() && message.is_empty());
            }
            _ => panic!("peer client"),
        }
        match parse("suite --filter ipv6 --peer 192.0.2.2:7999 --transport siw --left-out") {
            Cmd::Suite {
                filter,
                peer,
                list,
                sync,
                transport,
                left_out,
                alone,
            } => {
                assert!(!sync && left_out && !alone);
                assert_eq!(filter.as_deref(), Some("ipv6"));
                assert_eq!(peer.as_deref(), Some("192.0.2.2:7999"));
                assert_eq!(transport, suite::Transport::Siw);
                assert!(!list);
            }
            _ => panic!("suite"),
        }
        assert!(matches!(
            parse("suite"),
            Cmd::Suite {
                transport: suite::Transport::Rxe,
                ..
            }
        ));
        assert!(matches!(
            parse("suite --alone --list"),
            Cmd::Suite {
                alone: true,
                list: true,
                ..
            }
        ));
        match parse("ctl peer-vm-killed 192.0.2.1:7695 --peer 192.0.2.2:7999 --nvme-target 198.51.100.1:4420") {
            Cmd::Ctl(Ctl::PeerVmKilled { nvme_target, .. }) => {
                assert_eq!(nvme_target, Some("198.51.100.1:4420".parse().unwrap()));
            }
            _ => panic!("ctl peer-vm-killed"),
        }
        assert!(matches!(parse("agent"), Cmd::Agent { .. }));
        assert!(matches!(
            parse("ctl udaddy-server 192.0.2.1 --connections 2"),
            Cmd::Ctl(Ctl::UdaddyServer {
                connections: 2,
                count: udaddy::COUNT,
                size: udaddy::SIZE,
                ..
            })
        ));
        assert!(matches!(
            parse("ctl udaddy-client 192.0.2.1 --count 3 --size 64"),
            Cmd::Ctl(Ctl::UdaddyClient {
                count: 3,
                size: 64,
                ..
            })
        ));
        assert!(matches!(
            parse("fuzz --seed 7 --seconds 5 --threads 2 --replay t.txt"),
            Cmd::Fuzz {
                seed: Some(7),
                seconds: 5,
                threads: 2,
                ..
            }
        ));
        assert!(Cli::try_parse_from(["u", "ctl", "connect", "192.0.2.1"]).is_err());
        assert!(Cli::try_parse_from(["u", "peer", "client", "x:1"]).is_err());
    }
}
