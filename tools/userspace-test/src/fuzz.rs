// SPDX-License-Identifier: GPL-2.0
//! `userspace-test fuzz`: a seeded, replayable ioctl fuzzer for
//! `/dev/rdma_cm_rs`.
//!
//! K threads, each with its own PRNG (seed and thread number), drive a few
//! open files of their own with weighted random sequences over every ioctl
//! of the ABI.  The generator tracks each file's ids and the state they are
//! probably in and mostly picks a plausible next step (create, resolve the
//! module's own address, wait for the event, resolve the route, connect;
//! listeners on a shared port range receive the connections of every
//! thread; send, receive and memory operations on connected ids), with a
//! minority of hostile choices: wrong command numbers, sizes and directions,
//! garbage in reserved fields, huge lengths, NULL, unmapped and PROT_NONE
//! pointers, ids of other files and destroyed ids, UD ids on the RC data
//! path and UD_SEND/UD_RECV on RC ids, a second CONNECT or ACCEPT on an id
//! that has its QP, dup() and close() mid-sequence.  Some ids bind to and
//! resolve the siw device's address (`--siw-addr`) instead of the local
//! (rxe) one.
//!
//! UD ids (`RDMA_PS_UDP`, UD QPs; some 40 % of the ids) go the whole way
//! too: UD listeners on the shared port range, UD ids resolving mostly
//! where one listens (this thread's or any thread's), CONNECT (the SIDR
//! lookup, up to 180 bytes of private data, sometimes more), ACCEPT and
//! REJECT of the SIDR request (up to 136), then UD_SEND to the peer
//! handles the model learnt (the ESTABLISHED event's `ud_peer`, every
//! UD_RECV's sender: the accepting side answers whoever sent) of small,
//! MTU-sized and oversized lengths (`max_datagram` as QUERY reported it),
//! with and without immediate data, and UD_RECV with big and small
//! buffers; hostile: unknown flags, immediate data without the flag,
//! lengths 0 and above 4096, unknown peers, bad buffers, reserved and
//! output fields with garbage.  Every datagram is sent from one pattern,
//! so UD_RECV's payload (the GRH stripped) is checked byte by byte.
//!
//! Besides, mid-sequence:
//!
//! * fork(): the child runs a short seeded sequence of ioctls on the
//!   inherited descriptors, prepared before the fork (after fork() in a
//!   threaded process the child makes only raw ioctl, write and _exit
//!   calls), sends each result and argument structure back through a pipe
//!   and `_exit`s; the parent waits for it (bounded), plays the results into
//!   its model and judges them with the same oracle.
//! * signals: a call that may sleep (GET_EVENT, SEND, RECV, MR_REG,
//!   MR_DEREG, RDMA, UD_SEND, UD_RECV) is sometimes armed: a signaller thread `pthread_kill`s
//!   the calling thread a seeded delay into the call, and again every 20 ms
//!   until it returns (a no-op handler without `SA_RESTART`; the signal is
//!   blocked in the thread outside that call).  GET_EVENT on a blocking file
//!   may then even wait for ever.
//!
//! and two actor threads with PRNGs of their own:
//!
//! * peers: up to `--peers` processes of this program (`fuzz-peer`, the
//!   real librdmacm) connect to the fuzzer's listeners on the local address
//!   (the rxe device, never siw), exchange messages when accepted, and are
//!   SIGKILLed at seeded times: right after the spawn, while connecting,
//!   while connected.
//! * link: `rdma link delete` and `rdma link add` of the siw device
//!   (`--siw-dev`, on the netdev it had at the start) at seeded times; the
//!   ids on it get DEVICE_REMOVAL.  The device is there again when the run
//!   ends.  The rxe device is never deleted: the peers hold user verbs
//!   contexts on it.
//!
//! Every operation, actor steps included, is one trace line (`--trace FILE`
//! writes them all, `--replay FILE` runs such a file again, each thread's
//! lines in order; a fork child's calls follow their fork as `#` comments
//! and are regenerated from the fork's seed).  The user-space oracle: each
//! command's errno must be one the ABI allows for it (`EINTR` only from a
//! call that sleeps and was signalled), a call the ABI must refuse must
//! fail, and where the ABI names the errno it must be that one (`x=einval`:
//! UD_SEND's flags, imm_data and length, UD_RECV's reserved field;
//! `x=eopnotsupp`: SEND, RECV, MR_*, RDMA and DISCONNECT on a UD id,
//! UD_SEND/UD_RECV on an RC id; `x=enotconn`: a UD id before its
//! CONNECT/ACCEPT or after its lookup failed; `x=emsgsize`: a datagram
//! above `max_datagram`; `ENOENT` too where the id may be gone).  Events
//! must name ids the file was given and did not destroy and that had no
//! DEVICE_REMOVAL (the id's last event), a UD ESTABLISHED must carry a
//! peer handle (or a status saying why not) and an RC one no UD fields;
//! QUERY must report the QP type the id was created with, and
//! `max_datagram`/`qkey` only on UD ids (`max_datagram` once it has its
//! QP, at most 4096); UD_RECV's length, flags, peer and payload must be
//! what was sent; no call may take longer than `--hang-secs`, and no fork
//! child, peer or `rdma` command may outlive its bound.  On a finding the seed, the last operations and the
//! shortest failing prefix of the trace (bisected by replay) are printed.
//! The summary counts every (command, result) pair and every kind of the
//! other operations.  Kernel reports (the dmesg gate, kmemleak) are the VM
//! runner's job: a clean run exits 0.

use anyhow::{bail, Context, Result};
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ffi::CString,
    fmt::Write as _,
    io::{BufRead, BufReader, BufWriter, Read, Write},
    mem::size_of,
    net::{Ipv4Addr, SocketAddr},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Condvar, Mutex,
    },
    time::{Duration, Instant},
};

use crate::cm;
use crate::uapi::*;

/// Options of one run.
pub struct Options {
    pub seed: u64,
    pub seconds: u64,
    pub ops: Option<u64>,
    pub threads: u32,
    pub files: u32,
    pub replay: Option<String>,
    pub trace: Option<String>,
    pub keep_going: bool,
    pub hang_secs: u64,
    pub shrink_secs: u64,
    pub local: Ipv4Addr,
    pub port_base: u16,
    /// Live librdmacm peer processes at most (0: no peer actor).
    pub peers: u32,
    /// Whether an actor deletes and re-adds the siw device.
    pub link: bool,
    /// The siw device's address (some ids bind and resolve there).
    pub siw_addr: Ipv4Addr,
    /// The siw device the link actor deletes and re-adds.
    pub siw_dev: String,
}

// ---------------------------------------------------------------------------
// The PRNG: splitmix64, small and reproducible everywhere.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with `pct` percent.
    pub fn pct(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }

    /// An index by weight.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let total: u64 = weights.iter().sum();
        let mut r = self.below(total.max(1));
        for (i, &w) in weights.iter().enumerate() {
            if r < w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }
}

// ---------------------------------------------------------------------------
// Commands and operations.

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cmd {
    Info,
    CreateId,
    DestroyId,
    Bind,
    ResolveAddr,
    ResolveRoute,
    Listen,
    Connect,
    Accept,
    Reject,
    Disconnect,
    SetOption,
    Query,
    GetEvent,
    Send,
    Recv,
    MrReg,
    MrDereg,
    MrWrite,
    MrRead,
    Rdma,
    UdSend,
    UdRecv,
}

const CMDS: [(Cmd, &str, u32); 23] = [
    (Cmd::Info, "INFO", IOC_INFO),
    (Cmd::CreateId, "CREATE_ID", IOC_CREATE_ID),
    (Cmd::DestroyId, "DESTROY_ID", IOC_DESTROY_ID),
    (Cmd::Bind, "BIND", IOC_BIND),
    (Cmd::ResolveAddr, "RESOLVE_ADDR", IOC_RESOLVE_ADDR),
    (Cmd::ResolveRoute, "RESOLVE_ROUTE", IOC_RESOLVE_ROUTE),
    (Cmd::Listen, "LISTEN", IOC_LISTEN),
    (Cmd::Connect, "CONNECT", IOC_CONNECT),
    (Cmd::Accept, "ACCEPT", IOC_ACCEPT),
    (Cmd::Reject, "REJECT", IOC_REJECT),
    (Cmd::Disconnect, "DISCONNECT", IOC_DISCONNECT),
    (Cmd::SetOption, "SET_OPTION", IOC_SET_OPTION),
    (Cmd::Query, "QUERY", IOC_QUERY),
    (Cmd::GetEvent, "GET_EVENT", IOC_GET_EVENT),
    (Cmd::Send, "SEND", IOC_SEND),
    (Cmd::Recv, "RECV", IOC_RECV),
    (Cmd::MrReg, "MR_REG", IOC_MR_REG),
    (Cmd::MrDereg, "MR_DEREG", IOC_MR_DEREG),
    (Cmd::MrWrite, "MR_WRITE", IOC_MR_WRITE),
    (Cmd::MrRead, "MR_READ", IOC_MR_READ),
    (Cmd::Rdma, "RDMA", IOC_RDMA),
    (Cmd::UdSend, "UD_SEND", IOC_UD_SEND),
    (Cmd::UdRecv, "UD_RECV", IOC_UD_RECV),
];

/// Every command number of the uapi (`uapi.rs`), those the generator does
/// not drive (`GET_REQUEST`) included: a "wrong" number the generator makes
/// must be none of them (seed 2 made GET_EVENT's `0xc148_d70d` into
/// `0xc148_d717`, GET_REQUEST, and wanted `ENOTTY` of it).  A test checks
/// the list against the header's `RDMA_CM_RS_IOC_*` lines.
const REAL_IOCTLS: [u32; 24] = [
    IOC_INFO,
    IOC_CREATE_ID,
    IOC_DESTROY_ID,
    IOC_BIND,
    IOC_RESOLVE_ADDR,
    IOC_RESOLVE_ROUTE,
    IOC_LISTEN,
    IOC_CONNECT,
    IOC_ACCEPT,
    IOC_REJECT,
    IOC_DISCONNECT,
    IOC_SET_OPTION,
    IOC_QUERY,
    IOC_GET_EVENT,
    IOC_SEND,
    IOC_RECV,
    IOC_MR_REG,
    IOC_MR_DEREG,
    IOC_MR_WRITE,
    IOC_MR_READ,
    IOC_RDMA,
    IOC_UD_SEND,
    IOC_UD_RECV,
    IOC_GET_REQUEST,
];

/// Whether `n` is a command of the ABI.
fn is_real_ioctl(n: u32) -> bool {
    REAL_IOCTLS.contains(&n)
}

impl Cmd {
    pub fn name(self) -> &'static str {
        CMDS[self as usize].1
    }
    pub fn number(self) -> u32 {
        CMDS[self as usize].2
    }
    fn from_name(s: &str) -> Option<Self> {
        CMDS.iter().find(|c| c.1 == s).map(|c| c.0)
    }
    /// Whether the CM or the data path may answer `EIO` (a plain
    /// bookkeeping command may not).
    fn may_eio(self) -> bool {
        !matches!(
            self,
            Cmd::Info
                | Cmd::CreateId
                | Cmd::DestroyId
                | Cmd::Query
                | Cmd::GetEvent
                | Cmd::SetOption
                | Cmd::MrWrite
                | Cmd::MrRead
        )
    }
    /// Whether the call may sleep interruptibly (`rust/ctl/wait.rs`): a
    /// signal ends the wait with `ERESTARTSYS`, `EINTR` in user space.
    fn may_block(self) -> bool {
        matches!(
            self,
            Cmd::GetEvent
                | Cmd::Send
                | Cmd::Recv
                | Cmd::MrReg
                | Cmd::MrDereg
                | Cmd::Rdma
                | Cmd::UdSend
                | Cmd::UdRecv
        )
    }
    /// The commands of an RC id's data path (messages, regions, RDMA) and
    /// DISCONNECT: a UD id refuses them with `EOPNOTSUPP` whatever its
    /// state.
    fn rc_only(self) -> bool {
        matches!(
            self,
            Cmd::Send
                | Cmd::Recv
                | Cmd::MrReg
                | Cmd::MrDereg
                | Cmd::MrWrite
                | Cmd::MrRead
                | Cmd::Rdma
                | Cmd::Disconnect
        )
    }
}

/// What the argument pointer of an ioctl is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ptr {
    Ok,
    Null,
    ProtNone,
    /// The structure starts 4 bytes before a PROT_NONE page.
    Straddle,
    /// A non-canonical address.
    Wild,
}

const PTRS: [(Ptr, &str); 5] = [
    (Ptr::Ok, "ok"),
    (Ptr::Null, "null"),
    (Ptr::ProtNone, "protnone"),
    (Ptr::Straddle, "straddle"),
    (Ptr::Wild, "wild"),
];

impl Ptr {
    fn name(self) -> &'static str {
        PTRS.iter().find(|p| p.0 == self).unwrap().1
    }
    fn from_name(s: &str) -> Option<Self> {
        PTRS.iter().find(|p| p.1 == s).map(|p| p.0)
    }
}

/// What the call must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Success or an errno the command may return.
    Any,
    /// An errno the command may return, not success.
    Fail,
    Enotty,
    Efault,
    /// `EINVAL` and nothing else: an argument the module checks before it
    /// looks the id up.
    Einval,
    /// `EOPNOTSUPP`: the data path of the other QP type (RC commands and
    /// DISCONNECT on a UD id, UD_SEND/UD_RECV on an RC id); or `ENOENT`,
    /// the id may be gone (a DEVICE_REMOVAL not read yet, a fork child's
    /// DESTROY_ID).
    Eopnotsupp,
    /// `ENOTCONN` (a UD id before CONNECT/ACCEPT, or after its lookup
    /// failed); or `ENOENT` as above.
    Enotconn,
    /// `EMSGSIZE` (a datagram above the id's `max_datagram`); or
    /// `ENOTCONN`/`ENOENT`: the id may have ended meanwhile.
    Emsgsize,
}

const EXPECTS: [(Expect, &str); 8] = [
    (Expect::Any, "any"),
    (Expect::Fail, "fail"),
    (Expect::Enotty, "enotty"),
    (Expect::Efault, "efault"),
    (Expect::Einval, "einval"),
    (Expect::Eopnotsupp, "eopnotsupp"),
    (Expect::Enotconn, "enotconn"),
    (Expect::Emsgsize, "emsgsize"),
];

impl Expect {
    fn name(self) -> &'static str {
        EXPECTS.iter().find(|p| p.0 == self).unwrap().1
    }
    fn from_name(s: &str) -> Option<Self> {
        EXPECTS.iter().find(|p| p.1 == s).map(|p| p.0)
    }
}

/// An id as the trace names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdRef {
    /// The n-th id this file learned (created or received).
    Slot(u32),
    /// The n-th id of another file of the thread.
    Other(u32, u32),
    Raw(u32),
}

impl IdRef {
    fn text(self) -> String {
        match self {
            IdRef::Slot(n) => format!("#{n}"),
            IdRef::Other(f, n) => format!("f{f}#{n}"),
            IdRef::Raw(v) => format!("{v}"),
        }
    }
    fn parse(s: &str) -> Option<Self> {
        if let Some(n) = s.strip_prefix('#') {
            return n.parse().ok().map(IdRef::Slot);
        }
        if let Some(rest) = s.strip_prefix('f') {
            let (f, n) = rest.split_once('#')?;
            return Some(IdRef::Other(f.parse().ok()?, n.parse().ok()?));
        }
        s.parse().ok().map(IdRef::Raw)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Open {
        nonblock: bool,
    },
    Close,
    Dup,
    Ioctl(Cmd),
    /// `fork()`: the child runs `v[1]` ioctls (generated from seed `v[0]`
    /// and the file's model) on the inherited descriptors and `_exit`s; the
    /// parent waits for it and judges its results.
    Fork,
    /// The peer actor: a librdmacm peer process in slot `f` is spawned
    /// (seed `v[2]`) or SIGKILLed, `v[0]` ms after the actor's previous
    /// step.
    Peer {
        kill: bool,
    },
    /// The link actor: `rdma link delete` or `add` of the siw device,
    /// `v[0]` ms after its previous step.
    Link {
        add: bool,
    },
}

/// One operation: one trace line.  `v` holds the command's parameters
/// (see `build`), `raw` a command number that replaces the right one,
/// `sig` the delay (ms) after which another thread signals the calling
/// thread during the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub t: u32,
    pub f: u32,
    pub fd: u32,
    pub act: Act,
    pub raw: Option<u32>,
    pub ptr: Ptr,
    pub id: IdRef,
    pub v: [u64; 8],
    pub expect: Expect,
    pub sig: Option<u32>,
}

impl Op {
    fn new(t: u32, f: u32, act: Act) -> Self {
        Self {
            t,
            f,
            fd: 0,
            act,
            raw: None,
            ptr: Ptr::Ok,
            id: IdRef::Raw(0),
            v: [0; 8],
            expect: Expect::Any,
            sig: None,
        }
    }

    pub fn line(&self) -> String {
        let mut s = format!("t={} f={} fd={} ", self.t, self.f, self.fd);
        match self.act {
            Act::Open { nonblock } => {
                let _ = write!(s, "open nb={}", u8::from(nonblock));
            }
            Act::Close => s.push_str("close"),
            Act::Dup => s.push_str("dup"),
            Act::Fork => {
                let _ = write!(s, "fork n={} s={:#x}", self.v[1], self.v[0]);
            }
            Act::Peer { kill: false } => {
                let _ = write!(s, "peer spawn s={:#x} after={}", self.v[2], self.v[0]);
            }
            Act::Peer { kill: true } => {
                let _ = write!(s, "peer kill after={}", self.v[0]);
            }
            Act::Link { add } => {
                let _ = write!(
                    s,
                    "link {} after={}",
                    if add { "add" } else { "delete" },
                    self.v[0]
                );
            }
            Act::Ioctl(c) => {
                let _ = write!(
                    s,
                    "{} cmd={} ptr={} id={} v={} x={}",
                    c.name(),
                    self.raw.map_or("-".into(), |r| format!("{r:#x}")),
                    self.ptr.name(),
                    self.id.text(),
                    self.v
                        .iter()
                        .map(|v| format!("{v:#x}"))
                        .collect::<Vec<_>>()
                        .join(","),
                    self.expect.name()
                );
                if let Some(ms) = self.sig {
                    let _ = write!(s, " sig={ms}");
                }
            }
        }
        s
    }

    pub fn parse(line: &str) -> Option<Self> {
        let mut words = line.split_whitespace();
        let mut kv = |key: &str| -> Option<String> {
            words
                .next()?
                .strip_prefix(key)?
                .strip_prefix('=')
                .map(str::to_string)
        };
        let t = kv("t")?.parse().ok()?;
        let f = kv("f")?.parse().ok()?;
        let fd = kv("fd")?.parse().ok()?;
        let verb = words.next()?;
        let mut op = match verb {
            "open" => Op::new(t, f, Act::Open { nonblock: false }),
            "close" => Op::new(t, f, Act::Close),
            "dup" => Op::new(t, f, Act::Dup),
            "fork" => Op::new(t, f, Act::Fork),
            "peer" => match words.next()? {
                "spawn" => Op::new(t, f, Act::Peer { kill: false }),
                "kill" => Op::new(t, f, Act::Peer { kill: true }),
                _ => return None,
            },
            "link" => match words.next()? {
                "delete" => Op::new(t, f, Act::Link { add: false }),
                "add" => Op::new(t, f, Act::Link { add: true }),
                _ => return None,
            },
            name => Op::new(t, f, Act::Ioctl(Cmd::from_name(name)?)),
        };
        op.fd = fd;
        let rest: HashMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        let num = |k: &str| rest.get(k).and_then(|v| parse_num(v));
        match op.act {
            Act::Open { .. } => {
                op.act = Act::Open {
                    nonblock: *rest.get("nb")? == "1",
                }
            }
            Act::Fork => {
                op.v[1] = num("n")?;
                op.v[0] = num("s")?;
            }
            Act::Peer { kill } => {
                op.v[0] = num("after")?;
                if !kill {
                    op.v[2] = num("s")?;
                }
            }
            Act::Link { .. } => op.v[0] = num("after")?,
            Act::Ioctl(_) => {
                let cmd = *rest.get("cmd")?;
                op.raw = if cmd == "-" {
                    None
                } else {
                    Some(parse_num(cmd)? as u32)
                };
                op.ptr = Ptr::from_name(rest.get("ptr")?)?;
                op.id = IdRef::parse(rest.get("id")?)?;
                let vs: Vec<u64> = rest
                    .get("v")?
                    .split(',')
                    .map(parse_num)
                    .collect::<Option<_>>()?;
                if vs.len() != 8 {
                    return None;
                }
                op.v.copy_from_slice(&vs);
                op.expect = Expect::from_name(rest.get("x")?)?;
                op.sig = match rest.get("sig") {
                    Some(v) => Some(parse_num(v)? as u32),
                    None => None,
                };
            }
            Act::Close | Act::Dup => {}
        }
        Some(op)
    }
}

fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

// ---------------------------------------------------------------------------
// The oracle.

/// Errnos any command may return: the ABI's own and what the CM passes up.
const ALLOWED: &[i32] = &[
    libc::EINVAL,
    libc::EFAULT,
    libc::ENOTTY,
    libc::ENOENT,
    libc::ENOTCONN,
    libc::EAGAIN,
    libc::ETIMEDOUT,
    libc::EOPNOTSUPP,
    libc::EBUSY,
    libc::EMSGSIZE,
    libc::ENOSPC,
    libc::EADDRINUSE,
    libc::EADDRNOTAVAIL,
    libc::ECONNREFUSED,
    libc::EACCES,
    libc::ECANCELED,
    libc::EHOSTUNREACH,
    libc::ENETUNREACH,
    libc::EXDEV,
    libc::ENODEV,
    libc::EMFILE,
    libc::ENOMEM,
    libc::EAFNOSUPPORT,
    libc::EISCONN,
    libc::EALREADY,
    libc::ENODATA,
    libc::EPROTONOSUPPORT,
    libc::ECONNRESET,
    libc::ENOBUFS,
];

/// `signalled`: another thread signalled the caller during the call, which
/// ends an interruptible wait with `EINTR` (the module's `ERESTARTSYS`, not
/// restarted: the handler has no `SA_RESTART`); nothing else may answer
/// `EINTR`.
fn errno_ok(cmd: Cmd, e: i32, signalled: bool) -> bool {
    ALLOWED.contains(&e)
        || (e == libc::EIO && cmd.may_eio())
        || (e == libc::EINTR && signalled && cmd.may_block())
}

/// `None` if the result is what the ABI allows, else why not.
fn judge(
    cmd: Cmd,
    expect: Expect,
    r: std::result::Result<(), i32>,
    signalled: bool,
) -> Option<String> {
    match (expect, r) {
        (Expect::Enotty, Err(libc::ENOTTY))
        | (Expect::Efault, Err(libc::EFAULT))
        | (Expect::Einval, Err(libc::EINVAL))
        | (Expect::Eopnotsupp, Err(libc::EOPNOTSUPP | libc::ENOENT))
        | (Expect::Enotconn, Err(libc::ENOTCONN | libc::ENOENT))
        | (Expect::Emsgsize, Err(libc::EMSGSIZE | libc::ENOTCONN | libc::ENOENT)) => None,
        (
            Expect::Enotty
            | Expect::Efault
            | Expect::Einval
            | Expect::Eopnotsupp
            | Expect::Enotconn
            | Expect::Emsgsize,
            r,
        ) => Some(format!(
            "{}: expected {}, got {}",
            cmd.name(),
            expect.name(),
            show_result(r)
        )),
        (Expect::Any, Ok(())) => None,
        (Expect::Fail, Ok(())) => Some(format!(
            "{}: succeeded where the ABI requires a failure",
            cmd.name()
        )),
        (_, Err(e)) if errno_ok(cmd, e, signalled) => None,
        (_, Err(e)) => Some(format!(
            "{}: errno {} is not allowed",
            cmd.name(),
            errno_name(e)
        )),
    }
}

fn show_result(r: std::result::Result<(), i32>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => errno_name(e),
    }
}

pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EXDEV => "EXDEV",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::ENODATA => "ENODATA",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::EISCONN => "EISCONN",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EALREADY => "EALREADY",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("errno{e}"),
    };
    name.into()
}

// ---------------------------------------------------------------------------
// Shared run state: trace, counters, findings, watchdog.

struct Shared {
    opts: OptionsLite,
    stop: AtomicBool,
    trace: Mutex<TraceSink>,
    counts: Mutex<BTreeMap<(Cmd, String), u64>>,
    /// Counts of the other kinds of operation and of what they led to.
    kinds: Mutex<BTreeMap<&'static str, u64>>,
    findings: Mutex<Vec<String>>,
    /// Per thread: start of the running call (ms since `t0`, 0 = idle) and
    /// its trace line.
    busy: Vec<(AtomicU64, Mutex<String>)>,
    t0: Instant,
    files_opened: AtomicU64,
    /// Regions registered by any thread: RDMA targets (addr, rkey, len).
    regions: Mutex<Vec<(u64, u32, u32)>>,
    /// Threads that generate ioctls and have not finished: the actors stop
    /// with the last of them.
    workers_left: AtomicU32,
    signals: Signaller,
    /// The live peer processes, for a run that ends on a hang.
    peer_pids: Mutex<Vec<u32>>,
    /// Ports of the last RC listeners on the local address (or any).
    listen_ports: Mutex<VecDeque<u16>>,
    /// Ports of the last UD listeners there: UD ids of every thread
    /// resolve them for their SIDR lookups.
    ud_listen_ports: Mutex<VecDeque<u16>>,
    quiet: bool,
    /// The blocked tasks were dumped (at the first HANG finding).
    hang_dumped: AtomicBool,
}

#[derive(Clone)]
struct OptionsLite {
    local: Ipv4Addr,
    port_base: u16,
    files: u32,
    keep_going: bool,
    siw_addr: Ipv4Addr,
    /// Peer processes at most (slots of the peer actor).
    peers: u32,
    /// The program the peers run (this one), if known.
    exe: Option<PathBuf>,
    /// The siw device and its netdev, if the link actor may use them.
    link: Option<(String, String)>,
    /// Bound of one actor step or fork child (below the hang watchdog).
    step: Duration,
}

impl OptionsLite {
    /// For the unit tests: no device needed.
    #[cfg(test)]
    fn test() -> Self {
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
        }
    }
}

const TAIL: usize = 50;
/// Lines kept in memory for the shrink.
const KEEP_LINES: usize = 400_000;

struct TraceSink {
    file: Option<BufWriter<std::fs::File>>,
    tail: VecDeque<String>,
    all: Vec<String>,
    all_complete: bool,
}

impl Shared {
    fn new(opts: OptionsLite, threads: u32, file: Option<BufWriter<std::fs::File>>) -> Self {
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

    fn kind(&self, k: &'static str) {
        *self.kinds.lock().unwrap().entry(k).or_default() += 1;
    }

    fn log(&self, line: &str) {
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

    fn count(&self, cmd: Cmd, r: std::result::Result<(), i32>) {
        *self
            .counts
            .lock()
            .unwrap()
            .entry((cmd, show_result(r)))
            .or_default() += 1;
    }

    fn finding(&self, what: String) {
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
fn blocked_tasks() -> String {
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

// ---------------------------------------------------------------------------
// Signals: another thread interrupts a blocking call.

/// The signal.  Its handler does nothing and is installed without
/// `SA_RESTART`, so an interrupted wait of the module (`ERESTARTSYS`) ends
/// the call with `EINTR`.  Every fuzzing thread keeps it blocked except
/// during the one call it is aimed at.
const SIG: libc::c_int = libc::SIGUSR1;
/// An armed signal is sent again this often until the call returns: the
/// first may land before the call sleeps.
const SIG_REPEAT: Duration = Duration::from_millis(20);

extern "C" fn on_signal(_: libc::c_int) {}

fn install_signal_handler() -> Result<()> {
    // SAFETY: a zeroed sigaction is valid; the handler is empty, so
    // async-signal-safe; no SA_RESTART, no SA_SIGINFO.
    let r = unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(SIG, &sa, std::ptr::null_mut())
    };
    if r != 0 {
        bail!("sigaction: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn sig_set() -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set, sigaddset adds a valid signal.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, SIG);
        set
    }
}

/// Blocks or unblocks [`SIG`] in the calling thread.
fn block_signal(block: bool) {
    let set = sig_set();
    let how = if block {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: a valid set; the old mask is not wanted.
    unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
}

/// Takes a signal that came after the call returned (blocked, pending).
fn drain_signal() {
    let set = sig_set();
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid set and timeout; no siginfo wanted.
    while unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) } == SIG {}
}

/// The thread that sends the signals: a call armed with `sig=MS` gets
/// [`SIG`] (`pthread_kill`) MS ms after it started, then every
/// [`SIG_REPEAT`] until it returns.
#[derive(Default)]
struct Signaller {
    st: Mutex<SigState>,
    cv: Condvar,
}

#[derive(Default)]
struct SigState {
    reqs: Vec<SigReq>,
    next: u64,
    done: bool,
}

struct SigReq {
    token: u64,
    thread: libc::pthread_t,
    due: Instant,
    sent: u32,
}

impl Signaller {
    /// Arms a signal for the calling thread.
    fn arm(&self, ms: u32) -> u64 {
        let mut st = self.st.lock().unwrap();
        st.next += 1;
        let token = st.next;
        st.reqs.push(SigReq {
            token,
            // SAFETY: no preconditions.
            thread: unsafe { libc::pthread_self() },
            due: Instant::now() + Duration::from_millis(ms.into()),
            sent: 0,
        });
        self.cv.notify_all();
        token
    }

    /// Disarms; returns how many signals were sent.  None is sent after
    /// this returns.
    fn disarm(&self, token: u64) -> u32 {
        let mut st = self.st.lock().unwrap();
        match st.reqs.iter().position(|r| r.token == token) {
            Some(i) => st.reqs.swap_remove(i).sent,
            None => 0,
        }
    }

    fn run(&self) {
        let mut st = self.st.lock().unwrap();
        while !st.done {
            let now = Instant::now();
            for r in st.reqs.iter_mut().filter(|r| r.due <= now) {
                // SAFETY: the thread is alive: it disarms (under this lock)
                // before it goes on, and it has the handler.
                unsafe { libc::pthread_kill(r.thread, SIG) };
                r.sent += 1;
                r.due = now + SIG_REPEAT;
            }
            let wait = st
                .reqs
                .iter()
                .map(|r| r.due.saturating_duration_since(now))
                .min()
                .unwrap_or(Duration::from_secs(1));
            st = self.cv.wait_timeout(st, wait).unwrap().0;
        }
    }

    fn finish(&self) {
        self.st.lock().unwrap().done = true;
        self.cv.notify_all();
    }
}

/// One ioctl; with `sig`, signalled by the signaller thread while in it.
fn live_ioctl(
    sh: &Shared,
    fd: i32,
    number: u32,
    arg: u64,
    sig: Option<u32>,
) -> std::result::Result<(), i32> {
    let Some(ms) = sig else {
        return ioctl(fd, number, arg);
    };
    sh.kind("signal: calls armed");
    let token = sh.signals.arm(ms);
    block_signal(false);
    let r = ioctl(fd, number, arg);
    block_signal(true);
    if sh.signals.disarm(token) > 0 {
        sh.kind("signal: sent during the call");
        drain_signal();
    }
    r
}

// ---------------------------------------------------------------------------
// fork() mid-sequence.

/// Bytes of an argument structure a fork child sends back (the largest
/// structures, CONNECT's and ACCEPT's, have 608).
const CHILD_OUT: usize = 640;
/// One result record of a fork child: the errno (0: success), then the
/// argument structure as the kernel left it.
const CHILD_REC: usize = 4 + CHILD_OUT;
/// A fork child's calls at most.
const CHILD_OPS: u64 = 6;
/// The result of a call that did not reach the kernel: captured for a fork
/// child, or the child ended before it.
const NOT_RUN: i32 = i32::MIN;

/// Where the ioctls of `Worker::ioctl_op` go.
enum Mode {
    Live,
    /// Preparing a fork child's calls: nothing reaches the kernel.
    Capture(Vec<Planned>),
    /// A fork child's results, in order, played into the model and judged.
    Feed(VecDeque<Option<(i32, Vec<u8>)>>),
}

/// A captured call: the argument buffer as placed.
struct Planned {
    fd: i32,
    number: u32,
    arg: u64,
    in_arg: bool,
    bytes: Vec<u64>,
}

/// One call of a fork child, prepared before fork(): plain data.
#[derive(Clone, Copy)]
struct ChildCall {
    fd: i32,
    number: u32,
    arg: u64,
    /// The argument is in the child's slab: send it back.
    back: bool,
}

/// The fork child.  After fork() in a threaded process only
/// async-signal-safe calls are allowed: ioctl, write and _exit, no
/// allocation, no lock, no path that could panic.
///
/// # Safety
///
/// `calls` holds `n` calls whose argument pointers are valid or
/// deliberately invalid; `out` has room for `n` records of [`CHILD_REC`].
unsafe fn child_main(calls: *const ChildCall, n: usize, out: *mut u8, wfd: i32) -> ! {
    for i in 0..n {
        let c = *calls.add(i);
        let r = libc::ioctl(c.fd, c.number as _, c.arg as usize);
        let e: i32 = if r < 0 { *libc::__errno_location() } else { 0 };
        let rec = out.add(i * CHILD_REC);
        std::ptr::write_unaligned(rec.cast::<i32>(), e);
        if c.back {
            std::ptr::copy_nonoverlapping(c.arg as *const u8, rec.add(4), CHILD_OUT);
        }
        let mut done = 0;
        while done < CHILD_REC {
            let w = libc::write(wfd, rec.add(done).cast(), CHILD_REC - done);
            if w > 0 {
                done += w as usize;
            } else if w < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            } else {
                libc::_exit(2);
            }
        }
    }
    libc::_exit(0)
}

// ---------------------------------------------------------------------------
// The actors: librdmacm peers that come and go, the siw device deleted and
// added back.

/// The ports a peer tries: the fuzzer's listener range.
const PEER_SPAN: u16 = 12;

/// A librdmacm peer process (`userspace-test fuzz-peer`).
struct PeerProc {
    child: Child,
    /// Its progress report: one letter a step (see [`peer`]).
    out: ChildStdout,
}

/// `rdma ARGS`, bounded: `Err(None)` when it ran out of time.
fn rdma_tool(args: &[&str], bound: Duration) -> std::result::Result<(), Option<String>> {
    let mut child = Command::new("rdma")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Some(format!("rdma: {e}")))?;
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                return Err(None);
            }
            Err(e) => return Err(Some(format!("wait for rdma: {e}"))),
        }
    };
    if status.success() {
        return Ok(());
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    Err(Some(format!("{status}: {}", err.trim())))
}

fn device_exists(dev: &str) -> bool {
    Path::new("/sys/class/infiniband").join(dev).exists()
}

/// The netdev of `dev`'s port 1, from `rdma link show`.
fn netdev_of(dev: &str) -> Option<String> {
    let out = Command::new("rdma")
        .args(["link", "show", &format!("{dev}/1")])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .skip_while(|w| *w != "netdev")
        .nth(1)
        .map(str::to_string)
}

/// The peer's progress, one letter a step on standard output.
fn mark(c: u8) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&[c]);
    let _ = out.flush();
}

/// `userspace-test fuzz-peer`: a librdmacm client of the fuzzer's listeners
/// until it is killed.  Attempts on a port of `addr`'s port ..+`span`
/// (mostly one of `prefer`, where the fuzzer listened last), until one was
/// established or 30 failed: resolve (`r`), create the QP and connect
/// (`c`); once established (`e`) send and receive some messages (`d` each),
/// then disconnect or just go.  `s` at the start, `x` for a failed attempt,
/// `q` at a normal end.  Only ever on `addr`'s IP, the rxe device: a
/// librdmacm context on siw would hold siw's removal up.
pub fn peer(addr: SocketAddr, span: u16, prefer: &[u16], seed: u64) -> Result<()> {
    let mut rng = Rng::new(seed);
    mark(b's');
    let mut failed = 0;
    while failed < 30 {
        let port = if !prefer.is_empty() && rng.pct(70) {
            prefer[rng.below(prefer.len() as u64) as usize]
        } else {
            addr.port()
                .wrapping_add(rng.below(u64::from(span.max(1))) as u16)
        };
        let addr = SocketAddr::new(addr.ip(), port);
        let ch = cm::Channel::new()?;
        let Ok(id) = cm::resolve(&ch, &addr, Duration::from_secs(2)) else {
            failed += 1;
            mark(b'x');
            std::thread::sleep(Duration::from_millis(rng.range(10, 300)));
            continue;
        };
        mark(b'r');
        let Ok(mut conn) = cm::Conn::new(id) else {
            failed += 1;
            mark(b'x');
            continue;
        };
        let data: Vec<u8> = (0..rng.range(0, 56)).map(|i| (i * 5 + 1) as u8).collect();
        let mut param = cm::Param::with_data(&data);
        param.responder_resources = rng.range(0, 2) as u8;
        param.initiator_depth = rng.range(0, 2) as u8;
        mark(b'c');
        match conn.connect(&param, &ch, Duration::from_secs(5)) {
            Ok(ev) if ev.event == EventType::Established => {}
            _ => {
                failed += 1;
                mark(b'x');
                drop(conn);
                std::thread::sleep(Duration::from_millis(rng.range(10, 200)));
                continue;
            }
        }
        mark(b'e');
        for round in 0..rng.range(1, 60) {
            if rng.pct(60) {
                let msg: Vec<u8> = (0..rng.range(1, 512)).map(|i| (i + round) as u8).collect();
                if conn.send(&msg).is_err() {
                    break;
                }
                mark(b'd');
            }
            if conn.recv(Duration::from_millis(rng.range(1, 100))).is_ok() {
                mark(b'd');
            }
            if ch
                .next(Duration::from_millis(1))
                .is_ok_and(|ev| ev.event == EventType::Disconnected)
            {
                break;
            }
        }
        if rng.pct(50) {
            let _ = conn.disconnect();
            let _ = ch.next(Duration::from_millis(500));
        }
        drop(conn);
        break;
    }
    mark(b'q');
    Ok(())
}

// ---------------------------------------------------------------------------
// Memory the hostile pointers point at.

struct Scratch {
    /// Two pages: read-write, then PROT_NONE.
    guard: usize,
    page: usize,
    /// The argument structure (16 KiB + slack, so a wrong size stays inside).
    arg: Vec<u64>,
    /// Data buffers of SEND/RECV/MR_WRITE/MR_READ/UD_RECV (2 MiB, larger
    /// than any region, so a read the kernel bounds by the region stays
    /// inside).
    data: Vec<u8>,
    /// What every UD_SEND of every thread sends from: [`ud_byte`], never
    /// written, so a datagram UD_RECV returns must be a prefix of it.
    ud_tx: Vec<u8>,
}

const DATA_LEN: usize = 2 << 20;

/// Byte `i` of every datagram the fuzzer sends.
fn ud_byte(i: usize) -> u8 {
    (i * 11 + 5) as u8
}

impl Scratch {
    fn new() -> Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: an anonymous private mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the second page of the mapping made above.
        if unsafe { libc::mprotect(p.cast::<u8>().add(page).cast(), page, libc::PROT_NONE) } != 0 {
            bail!("mprotect: {}", std::io::Error::last_os_error());
        }
        let mut data = vec![0u8; DATA_LEN];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        Ok(Self {
            guard: p as usize,
            page,
            arg: vec![0; 2304],
            data,
            ud_tx: (0..2 * RDMA_CM_RS_MAX_MESSAGE as usize)
                .map(ud_byte)
                .collect(),
        })
    }

    fn prot_none(&self) -> u64 {
        (self.guard + self.page) as u64
    }

    fn bad(&self, p: Ptr) -> u64 {
        match p {
            Ptr::Ok => self.data.as_ptr() as u64,
            Ptr::Null => 0,
            Ptr::ProtNone => self.prot_none(),
            Ptr::Straddle => self.prot_none() - 4,
            Ptr::Wild => 0xdead_0000_0000_0000,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.guard as *mut libc::c_void, 2 * self.page) };
    }
}

// ---------------------------------------------------------------------------
// What a thread believes about its files.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Idle,
    Bound,
    AddrQuery,
    AddrResolved,
    RouteQuery,
    RouteResolved,
    Connecting,
    Connected,
    Listening,
    Requested,
    Down,
    /// Destroyed by DESTROY_ID: no event may name it again.
    Destroyed,
    /// Gone without DESTROY_ID (its file closed).
    Gone,
    /// Got DEVICE_REMOVAL, the id's last event: the module destroyed it.
    Removed,
}

#[derive(Clone, Debug)]
struct IdRec {
    handle: u32,
    ud: bool,
    st: St,
    /// The port the id bound on the local address or any (0: none): RC
    /// listeners' for the peers, UD listeners' for the SIDR lookups.
    port: u16,
    /// UD: the peer handles the id gave (its ESTABLISHED event's, every
    /// UD_RECV's sender), in the order they came.
    peers: Vec<u32>,
    /// UD: `max_datagram` as QUERY reported it (0: not known yet).
    max_dg: u32,
    /// A CONNECT or ACCEPT of it succeeded: it has its QP until destroyed.
    /// (Not the state: an event read late, of a resolve before the
    /// CONNECT, moves the model's state back.)
    qp: bool,
    /// UD: its SIDR lookup failed (UNREACHABLE, REJECTED, CONNECT_ERROR
    /// after its CONNECT) or it was rejected: UD_SEND is `ENOTCONN` until
    /// a CONNECT succeeds (seed 2, 2026-11-28: a UD id looked up again
    /// after a REJECTED sent to its earlier peer, as the module allows).
    dead: bool,
}

impl IdRec {
    fn new(handle: u32, ud: bool, st: St) -> Self {
        Self {
            handle,
            ud,
            st,
            port: 0,
            peers: Vec::new(),
            max_dg: 0,
            qp: false,
            dead: false,
        }
    }
}

#[derive(Clone, Debug)]
struct MrRec {
    id: u32,
    handle: u32,
    len: u32,
    alive: bool,
}

#[derive(Default)]
struct FileRec {
    fds: Vec<i32>,
    nonblock: bool,
    ids: Vec<IdRec>,
    mrs: Vec<MrRec>,
    /// Close this file soon: it holds a UD id that was sent on.
    close_soon: bool,
}

impl FileRec {
    fn open(&self) -> bool {
        !self.fds.is_empty()
    }
    fn slot_of(&self, handle: u32) -> Option<usize> {
        self.ids.iter().position(|i| i.handle == handle)
    }
}

/// What a thread generates (a replay runs whatever its lines say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Ioctl,
    Peers,
    Link,
}

struct Worker {
    t: u32,
    role: Role,
    rng: Rng,
    files: Vec<FileRec>,
    sh: Arc<Shared>,
    mem: Scratch,
    mode: Mode,
    /// The peer actor's processes by slot.
    peers: Vec<Option<PeerProc>>,
    /// The peer actor's generator: the slots it filled, the last spawned.
    gen_peers: Vec<bool>,
    last_spawn: Option<u32>,
    /// The link actor deleted the device and did not add it back.
    link_deleted: bool,
    gen_link_deleted: bool,
    /// The actor's pause before its current step ran in full (the run is
    /// not ending).
    paused: bool,
    /// Generating a fork child's calls: all from the model as it is before
    /// the first of them runs, so no expectation may rest on an id's state
    /// (an earlier call of the child may change it).
    gen_child: bool,
}

fn sockaddr4(ip: Ipv4Addr, port: u16) -> rdma_cm_rs_sockaddr {
    sockaddr(&std::net::SocketAddr::from((ip, port)))
}

/// Writes `v` at the start of the argument buffer and returns the pointer
/// the ioctl gets.
fn place<T: Copy>(mem: &mut Scratch, v: &T, p: Ptr) -> u64 {
    assert!(size_of::<T>() <= mem.arg.len() * 8);
    // The tail past the structure is garbage: a longer size must not find
    // zeros there.
    for w in mem.arg.iter_mut() {
        *w = 0xa5a5_a5a5_a5a5_a5a5;
    }
    // SAFETY: `arg` holds at least size_of::<T>() bytes and is 8-aligned;
    // every T here is a plain-data uapi structure.
    unsafe { std::ptr::write(mem.arg.as_mut_ptr().cast::<T>(), *v) };
    match p {
        Ptr::Ok => mem.arg.as_ptr() as u64,
        Ptr::Straddle => {
            let dst = mem.prot_none() - 4;
            // SAFETY: the 4 bytes before the PROT_NONE page are ours.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    mem.arg.as_ptr().cast::<u8>(),
                    dst as *mut u8,
                    4.min(size_of::<T>()),
                )
            };
            dst
        }
        other => mem.bad(other),
    }
}

/// Reads back a structure the kernel wrote into the argument buffer.
fn fetch<T: Copy>(mem: &Scratch) -> T {
    // SAFETY: as in `place`.
    unsafe { std::ptr::read(mem.arg.as_ptr().cast::<T>()) }
}

fn ioctl(fd: i32, cmd: u32, arg: u64) -> std::result::Result<(), i32> {
    // SAFETY: the kernel validates `arg`; every pointer we pass points at
    // memory we own and sized for what the command may write, or is
    // deliberately invalid (EFAULT).
    let r = unsafe { libc::ioctl(fd, cmd as _, arg as usize) };
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(())
    }
}

// Parameter slots of `Op::v`.
const RESERVED: usize = 7;

impl Worker {
    fn new(t: u32, seed: u64, sh: Arc<Shared>) -> Result<Self> {
        Ok(Self {
            t,
            role: Role::Ioctl,
            rng: Rng::new(seed ^ (u64::from(t) + 1).wrapping_mul(0xa076_1d64_78bd_642f)),
            files: Vec::new(),
            sh,
            mem: Scratch::new()?,
            mode: Mode::Live,
            peers: Vec::new(),
            gen_peers: Vec::new(),
            last_spawn: None,
            link_deleted: false,
            gen_link_deleted: false,
            paused: true,
            gen_child: false,
        })
    }

    fn port(&mut self) -> u64 {
        u64::from(self.sh.opts.port_base) + self.rng.below(12)
    }

    // --- generation ----------------------------------------------------------

    fn open_files(&self) -> Vec<u32> {
        (0..self.files.len() as u32)
            .filter(|&f| self.files[f as usize].open())
            .collect()
    }

    fn gen(&mut self) -> Op {
        match self.role {
            Role::Ioctl => {}
            Role::Peers => return self.gen_peer(),
            Role::Link => return self.gen_link(),
        }
        let t = self.t;
        let open = self.open_files();
        let want = self.sh.opts.files as usize;
        if open.is_empty() || (open.len() < want && self.rng.pct(4)) {
            let nonblock = self.rng.pct(25);
            return Op::new(t, self.files.len() as u32, Act::Open { nonblock });
        }
        // A file holding a UD id that was sent on: close it (the teardown
        // of a UD id with traffic posted is the interesting part).
        if let Some(&f) = open.iter().find(|&&f| self.files[f as usize].close_soon) {
            if self.rng.pct(35) {
                let mut op = Op::new(t, f, Act::Close);
                op.fd = self.rng.below(self.files[f as usize].fds.len() as u64) as u32;
                return op;
            }
        }
        let f = open[self.rng.below(open.len() as u64) as usize];
        let nfds = self.files[f as usize].fds.len() as u64;
        let r = self.rng.below(1000);
        if r < 12 {
            let mut op = Op::new(t, f, Act::Close);
            op.fd = self.rng.below(nfds) as u32;
            return op;
        }
        if r < 20 && nfds < 3 {
            let mut op = Op::new(t, f, Act::Dup);
            op.fd = self.rng.below(nfds) as u32;
            return op;
        }
        if (20..24).contains(&r) {
            let mut op = Op::new(t, f, Act::Fork);
            op.v[0] = self.rng.next_u64();
            op.v[1] = self.rng.range(1, CHILD_OPS);
            return op;
        }
        let mut op = self.gen_ioctl(f);
        op.fd = self.rng.below(nfds) as u32;
        if self.rng.pct(12) {
            self.mutate(&mut op);
        }
        self.maybe_signal(&mut op);
        op
    }

    /// Some calls that may sleep get a signal from another thread while in
    /// them (and a wait long enough for it to land: on a blocking file
    /// GET_EVENT may even wait for ever).
    fn maybe_signal(&mut self, op: &mut Op) {
        let Act::Ioctl(cmd) = op.act else { return };
        if !cmd.may_block() || !self.rng.pct(6) {
            return;
        }
        let ms = match self.rng.below(10) {
            0..=2 => self.rng.range(0, 3),
            3..=7 => self.rng.range(4, 60),
            _ => self.rng.range(61, 150),
        };
        op.sig = Some(ms as u32);
        let infinite = u64::from(RDMA_CM_RS_TIMEOUT_INFINITE);
        match cmd {
            Cmd::GetEvent if !self.files[op.f as usize].nonblock && self.rng.pct(35) => {
                op.v[0] = infinite;
            }
            Cmd::GetEvent if op.v[0] != infinite => op.v[0] = op.v[0].max(ms + 30),
            Cmd::Recv | Cmd::UdRecv => op.v[2] = op.v[2].max(ms + 30),
            _ => {}
        }
    }

    /// The peer actor: spawns librdmacm peers into free slots and kills
    /// them at random times; now and then right after the spawn (before the
    /// peer got anywhere).
    fn gen_peer(&mut self) -> Op {
        let slots = self.sh.opts.peers.max(1) as usize;
        self.gen_peers.resize(slots, false);
        if let Some(s) = self.last_spawn.take() {
            if self.rng.pct(20) {
                let mut op = Op::new(self.t, s, Act::Peer { kill: true });
                op.v[0] = self.rng.range(0, 80);
                self.gen_peers[s as usize] = false;
                return op;
            }
        }
        let free: Vec<u32> = (0..slots as u32)
            .filter(|&s| !self.gen_peers[s as usize])
            .collect();
        let busy: Vec<u32> = (0..slots as u32)
            .filter(|&s| self.gen_peers[s as usize])
            .collect();
        if !free.is_empty() && (busy.is_empty() || self.rng.pct(50)) {
            let s = free[self.rng.below(free.len() as u64) as usize];
            let mut op = Op::new(self.t, s, Act::Peer { kill: false });
            op.v[0] = self.rng.range(100, 1200);
            op.v[2] = self.rng.next_u64();
            self.gen_peers[s as usize] = true;
            self.last_spawn = Some(s);
            return op;
        }
        let s = busy[self.rng.below(busy.len() as u64) as usize];
        let mut op = Op::new(self.t, s, Act::Peer { kill: true });
        op.v[0] = match self.rng.below(10) {
            0..=1 => self.rng.range(0, 100),
            2..=4 => self.rng.range(300, 2000),
            _ => self.rng.range(4000, 10_000),
        };
        self.gen_peers[s as usize] = false;
        op
    }

    /// The link actor: deletes the siw device, adds it back, and so on.
    fn gen_link(&mut self) -> Op {
        let add = self.gen_link_deleted;
        let mut op = Op::new(self.t, 0, Act::Link { add });
        op.v[0] = if add {
            self.rng.range(300, 3000)
        } else {
            self.rng.range(1500, 6000)
        };
        self.gen_link_deleted = !add;
        op
    }

    fn gen_ioctl(&mut self, f: u32) -> Op {
        let t = self.t;
        let ids = self.files[f as usize].ids.clone();
        let live: Vec<usize> = (0..ids.len())
            .filter(|&i| !matches!(ids[i].st, St::Destroyed | St::Gone | St::Removed))
            .collect();
        let r = self.rng.below(100);
        if r < 22 {
            return self.get_event(f);
        }
        if live.is_empty() || (r < 30 && live.len() < 16) {
            return self.create(f);
        }
        if r < 31 {
            return Op::new(t, f, Act::Ioctl(Cmd::Info));
        }
        // Ids with a next step count more; a request most (its peer, a
        // librdmacm process perhaps, waits for the answer).
        let weights: Vec<u64> = live
            .iter()
            .map(|&i| match ids[i].st {
                St::Down | St::Listening => 1,
                St::Requested => 12,
                // A UD id with a QP: its datagrams go both ways.
                St::Connected if ids[i].ud => 6,
                _ => 4,
            })
            .collect();
        let slot = live[self.rng.weighted(&weights)];
        let rec = ids[slot].clone();
        let id = IdRef::Slot(slot as u32);
        let ud = rec.ud;
        let peers = !rec.peers.is_empty();
        // A UD id of a thread without a UD listener listens itself, more
        // often than not: SIDR lookups need somebody to answer them.
        let ud_listen = ud
            && rec.st == St::Idle
            && !self
                .files
                .iter()
                .any(|f| f.open() && f.ids.iter().any(|i| i.ud && i.st == St::Listening));
        use Cmd::*;
        // UD_SEND/UD_RECV on RC ids and the RC data path on UD ids now and
        // then, whatever the state: EOPNOTSUPP.  A second CONNECT or ACCEPT
        // on an id that has its QP: refused.
        let choices: &[(Cmd, u64)] = match rec.st {
            St::Idle if ud_listen => &[
                (Bind, 60),
                (ResolveAddr, 25),
                (SetOption, 5),
                (Query, 4),
                (DestroyId, 4),
                (UdRecv, 2),
            ],
            St::Idle => &[
                (ResolveAddr, 55),
                (Bind, 25),
                (SetOption, 8),
                (Query, 4),
                (DestroyId, 4),
                (Connect, 2),
                (Listen, 2),
                (UdRecv, 1),
            ],
            St::Bound => &[
                (Listen, 70),
                (ResolveAddr, 10),
                (SetOption, 8),
                (Query, 6),
                (DestroyId, 6),
            ],
            St::AddrQuery | St::RouteQuery => &[
                (GetEvent, 55),
                (ResolveRoute, 10),
                (Connect, 8),
                (Query, 10),
                (DestroyId, 8),
                (Send, 9),
                (UdSend, 3),
                (UdRecv, 2),
            ],
            St::AddrResolved => &[
                (ResolveRoute, 75),
                (Connect, 6),
                (SetOption, 5),
                (Query, 5),
                (DestroyId, 5),
                (Listen, 4),
            ],
            St::RouteResolved => &[
                (Connect, 85),
                (Query, 5),
                (DestroyId, 5),
                (Send, 5),
                (UdSend, 2),
            ],
            // The SIDR lookup under way.
            St::Connecting if ud => &[
                (GetEvent, 40),
                (UdRecv, 15),
                (UdSend, 5),
                (Query, 6),
                (Send, 5),
                (MrReg, 3),
                (Rdma, 2),
                (Disconnect, 4),
                (DestroyId, 5),
                (Connect, 1),
            ],
            St::Connecting => &[
                (GetEvent, 45),
                (Send, 20),
                (Recv, 10),
                (Disconnect, 10),
                (DestroyId, 10),
                (MrReg, 5),
                (UdSend, 2),
            ],
            // Datagrams to the peers it knows, and the RC data path.
            St::Connected if ud && peers => &[
                (UdSend, 34),
                (UdRecv, 30),
                (Query, 6),
                (DestroyId, 3),
                (Send, 4),
                (Recv, 2),
                (MrReg, 2),
                (MrWrite, 1),
                (MrRead, 1),
                (MrDereg, 1),
                (Rdma, 2),
                (Disconnect, 3),
                (Connect, 1),
                (Accept, 1),
            ],
            // An accepted id: it learns its peers from what it receives.
            St::Connected if ud => &[
                (UdRecv, 50),
                (UdSend, 6),
                (Query, 8),
                (DestroyId, 3),
                (Send, 3),
                (Recv, 2),
                (MrReg, 2),
                (Rdma, 2),
                (Disconnect, 3),
                (Connect, 1),
                (Accept, 1),
            ],
            St::Connected => &[
                (Send, 25),
                (Recv, 20),
                (MrReg, 12),
                (MrWrite, 8),
                (MrRead, 8),
                (Rdma, 8),
                (MrDereg, 6),
                (Disconnect, 5),
                (Query, 4),
                (DestroyId, 3),
                (SetOption, 1),
                (UdSend, 2),
                (UdRecv, 2),
                (Connect, 1),
            ],
            St::Listening => &[
                (GetEvent, 70),
                (Query, 10),
                (DestroyId, 10),
                (SetOption, 10),
                (UdRecv, 2),
            ],
            St::Requested => &[
                (Accept, 55),
                (Reject, 25),
                (DestroyId, 10),
                (GetEvent, 5),
                (Query, 5),
                (UdSend, 2),
            ],
            St::Down | St::Destroyed | St::Gone | St::Removed => &[
                (DestroyId, 45),
                (Disconnect, 10),
                (Send, 10),
                (Recv, 10),
                (GetEvent, 20),
                (Query, 5),
                (UdSend, 5),
                (UdRecv, 5),
            ],
        };
        let weights: Vec<u64> = choices.iter().map(|c| c.1).collect();
        let cmd = choices[self.rng.weighted(&weights)].0;
        self.plausible(f, cmd, id, &rec)
    }

    fn create(&mut self, f: u32) -> Op {
        let mut op = Op::new(self.t, f, Act::Ioctl(Cmd::CreateId));
        op.v[0] = self.rng.next_u64(); // context
        let (ps, qpt) = match self.rng.below(100) {
            0..=54 => (RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_RC),
            55..=94 => (RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD),
            95 => (RDMA_CM_RS_PS_IB, RDMA_CM_RS_QPT_RC),
            96 => (RDMA_CM_RS_PS_IPOIB, RDMA_CM_RS_QPT_UD),
            97 => {
                op.expect = Expect::Fail;
                (RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_UD)
            }
            98 => {
                op.expect = Expect::Fail;
                (RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_RC)
            }
            _ => {
                op.expect = Expect::Fail;
                (self.rng.below(0x200) as u32 | 0x1000, RDMA_CM_RS_QPT_RC)
            }
        };
        op.v[1] = u64::from(ps);
        op.v[2] = u64::from(qpt);
        op
    }

    fn get_event(&mut self, f: u32) -> Op {
        let mut op = Op::new(self.t, f, Act::Ioctl(Cmd::GetEvent));
        op.v[0] = match self.rng.below(10) {
            0..=3 => 0,
            4..=7 => self.rng.range(1, 50),
            _ => self.rng.range(51, 200),
        };
        // An O_NONBLOCK file never waits, whatever the timeout says.
        if self.files[f as usize].nonblock && self.rng.pct(20) {
            op.v[0] = u64::from(RDMA_CM_RS_TIMEOUT_INFINITE);
        }
        op
    }

    fn timeout(&mut self) -> u64 {
        self.rng.range(1, 200)
    }

    fn plausible(&mut self, f: u32, cmd: Cmd, id: IdRef, rec: &IdRec) -> Op {
        let mut op = Op::new(self.t, f, Act::Ioctl(cmd));
        op.id = id;
        let v = &mut op.v;
        match cmd {
            Cmd::Bind => {
                v[0] = self.port();
                // The local address (rxe), any, or the siw device's (where
                // a UD id gets nowhere: iWARP has no UD).
                v[1] = match (rec.ud, self.rng.below(100)) {
                    (_, 0..=69) => 0,
                    (_, 70..=84) | (true, 85..=94) => 1,
                    _ => 2,
                };
            }
            Cmd::ResolveAddr => {
                v[0] = self.port();
                if rec.ud {
                    // Mostly where a UD listener is, so that the SIDR
                    // lookup finds one.
                    if let Some(port) = self.ud_listener_port() {
                        v[0] = u64::from(port);
                    }
                }
                // The local address (rxe) or the siw device's.
                let siw = self.rng.pct(if rec.ud { 5 } else { 20 });
                v[1] = if siw { 5 } else { 0 };
                v[2] = self.rng.range(100, 2000);
                // A source address: none, the local one or the siw one
                // (which mostly matches the destination).
                v[3] = match (siw, self.rng.below(100)) {
                    (_, 0..=79) => 0,
                    (true, 80..=94) | (false, 95..) => 2,
                    _ => 1,
                };
            }
            Cmd::ResolveRoute => v[2] = self.rng.range(100, 2000),
            // 0 too: it takes the largest backlog.
            Cmd::Listen => v[0] = self.rng.range(0, 8),
            Cmd::Connect => {
                // A UD id's SIDR request carries up to 180 bytes, an RC
                // REQ 56.
                v[0] = if rec.ud {
                    match self.rng.below(100) {
                        0..=59 => self.rng.range(0, 56),
                        60..=94 => self.rng.range(57, 180),
                        _ => self.rng.range(181, 256),
                    }
                } else {
                    self.rng.range(0, 56)
                };
                v[1] = self.rng.range(0, 2);
                v[2] = self.rng.range(0, 2);
                v[3] = self.rng.range(0, 7);
                v[4] = self.rng.range(0, 7);
                // A second CONNECT on an id with its QP, or more private
                // data than a SIDR request carries.
                if v[0] > 180 || rec.qp {
                    op.expect = Expect::Fail;
                }
            }
            Cmd::Accept => {
                v[5] = u64::from(self.rng.pct(50)); // ACCEPT_REQUEST_PARAM
                                                    // A SIDR reply carries up to 136 bytes, an RC REP 196.
                v[0] = if rec.ud && self.rng.pct(90) {
                    self.rng.range(0, 136)
                } else {
                    self.rng.range(0, 196)
                };
                v[1] = self.rng.range(0, 2);
                v[2] = self.rng.range(0, 2);
                v[3] = self.rng.range(0, 7);
                v[4] = 7;
                // Not a request (any more), or a SIDR reply's private data
                // over the limit (ignored with ACCEPT_REQUEST_PARAM).
                if rec.qp || (rec.ud && v[5] == 0 && v[0] > 136) {
                    op.expect = Expect::Fail;
                }
            }
            Cmd::Reject => {
                v[0] = if rec.ud && self.rng.pct(90) {
                    self.rng.range(0, 136)
                } else {
                    self.rng.range(0, 148)
                };
                v[1] = if self.rng.pct(50) {
                    0
                } else {
                    self.rng.below(40)
                };
                if rec.ud && v[0] > 136 {
                    op.expect = Expect::Fail;
                }
            }
            Cmd::SetOption => {
                v[0] = self.rng.range(1, 5);
                v[1] = match v[0] {
                    1 => self.rng.below(256),
                    2 | 3 => self.rng.below(2),
                    _ => self.rng.below(32),
                };
            }
            Cmd::Send => {
                v[0] = if self.rng.pct(70) {
                    self.rng.range(1, 256)
                } else {
                    self.rng.range(1, 4096)
                };
                v[2] = self.rng.range(1, 200);
                // RDMA_CM_RS_SEND_NOWAIT: posted, not waited for.
                v[5] = u64::from(self.rng.pct(30));
            }
            Cmd::Recv => {
                v[0] = if self.rng.pct(85) {
                    4096
                } else {
                    self.rng.range(0, 4200)
                };
                v[2] = self.rng.range(0, 150);
            }
            Cmd::MrReg => {
                v[0] = match self.rng.below(10) {
                    0..=6 => self.rng.range(1, 8192),
                    7..=8 => self.rng.range(8193, 128 << 10),
                    _ => 1 << 20,
                };
                v[1] = self.rng.range(0, 3);
                v[2] = self.rng.range(1, 200);
            }
            Cmd::MrDereg | Cmd::MrWrite | Cmd::MrRead | Cmd::Rdma => {
                let file = &self.files[f as usize];
                let mrs: Vec<&MrRec> = file
                    .mrs
                    .iter()
                    .filter(|m| m.alive && m.id == rec.handle)
                    .collect();
                let (mr, len) = if mrs.is_empty() {
                    (1000 + self.rng.range(1, 9), 4096)
                } else {
                    let m = mrs[self.rng.below(mrs.len() as u64) as usize];
                    let index = file
                        .mrs
                        .iter()
                        .position(|x| x.handle == m.handle && x.id == m.id)
                        .unwrap();
                    (index as u64, u64::from(m.len))
                };
                v[0] = mr;
                let off = self.rng.below(len);
                let n = self.rng.range(1, (len - off).min(8192));
                v[3] = off;
                v[4] = n;
                v[2] = self.timeout();
                if cmd == Cmd::Rdma {
                    v[1] = self.rng.range(1, 2);
                    let regions = self.sh.regions.lock().unwrap();
                    if !regions.is_empty() && self.rng.pct(80) {
                        let (addr, rkey, rlen) =
                            regions[self.rng.below(regions.len() as u64) as usize];
                        let roff = self.rng.below(u64::from(rlen));
                        v[5] = addr + roff;
                        v[6] = u64::from(rkey);
                        v[4] = self.rng.range(1, (u64::from(rlen) - roff).min(n));
                    } else {
                        v[5] = self.rng.next_u64() & 0xffff_ffff_f000;
                        v[6] = self.rng.below(1 << 32);
                    }
                }
            }
            Cmd::UdSend => {
                // Small, up to the path MTU, exactly it, above it (but
                // within the ABI's 4096: EMSGSIZE), above 4096 (EINVAL).
                let max = match rec.max_dg {
                    0 => 1024,
                    m => u64::from(m).min(4096),
                };
                v[0] = match self.rng.below(100) {
                    0..=44 => self.rng.range(1, 64.min(max)),
                    45..=69 => self.rng.range(1, max),
                    70..=79 => max,
                    80..=92 if max < 4096 => self.rng.range(max + 1, 4096),
                    93.. => self.rng.range(4097, 8192),
                    _ => max,
                };
                // A peer the id has, mostly; else a guess (1: the SIDR
                // reply's, perhaps not read yet) or one it cannot have.
                v[1] = if !rec.peers.is_empty() && self.rng.pct(92) {
                    u64::from(rec.peers[self.rng.below(rec.peers.len() as u64) as usize])
                } else if self.rng.pct(50) {
                    1
                } else {
                    [0, 65, 0x8000_0000, u64::from(u32::MAX)][self.rng.below(4) as usize]
                };
                v[2] = if self.rng.pct(10) {
                    0 // the default, 5 s
                } else {
                    self.rng.range(1, 200)
                };
                // With immediate data (0 included) or without.
                if self.rng.pct(30) {
                    v[3] = u64::from(RDMA_CM_RS_UD_WITH_IMM);
                    v[4] = if self.rng.pct(20) {
                        0
                    } else {
                        self.rng.below(1 << 32)
                    };
                }
                // Close the file soon after: the teardown of a UD id with
                // datagrams in flight.
                v[5] = u64::from(self.rng.pct(6));
            }
            Cmd::UdRecv => {
                v[0] = match self.rng.below(100) {
                    0..=84 => 4096,
                    // Smaller than most datagrams: EMSGSIZE, it stays.
                    85..=94 => self.rng.range(1, 64),
                    _ => self.rng.range(0, 4200),
                };
                v[2] = self.rng.range(0, 150);
                // Garbage in the output fields: ignored.
                if self.rng.pct(10) {
                    v[3] = self.rng.next_u64() | 1;
                }
            }
            Cmd::Query
            | Cmd::DestroyId
            | Cmd::Disconnect
            | Cmd::GetEvent
            | Cmd::Info
            | Cmd::CreateId => {}
        }
        if cmd == Cmd::GetEvent {
            return self.get_event(f);
        }
        if op.expect == Expect::Any {
            op.expect = self.expect_of(cmd, rec, &op.v);
        }
        op
    }

    /// What the module must answer to a plausible `cmd` on `rec` with
    /// parameters `v`, as far as the QP type and the model's state tell.
    fn expect_of(&self, cmd: Cmd, rec: &IdRec, v: &[u64; 8]) -> Expect {
        let gone = matches!(rec.st, St::Destroyed | St::Removed);
        // Before CONNECT/ACCEPT there is no QP; a fork child's calls come
        // from the model before any of them ran: one may connect first.
        let no_qp = !self.gen_child && !rec.qp;
        match cmd {
            // Checked before the id is looked up.
            Cmd::UdSend if v[0] == 0 || v[0] > u64::from(RDMA_CM_RS_MAX_MESSAGE) => Expect::Einval,
            c if c.rc_only() && rec.ud => Expect::Eopnotsupp,
            Cmd::UdSend | Cmd::UdRecv if !rec.ud => Expect::Eopnotsupp,
            _ if gone => Expect::Fail,
            // Without its QP, or after its lookup failed (REJECTED,
            // UNREACHABLE, CONNECT_ERROR) or a REJECT; UD_RECV still
            // returns what came before.
            Cmd::UdSend if no_qp || rec.dead => Expect::Enotconn,
            Cmd::UdRecv if no_qp => Expect::Enotconn,
            Cmd::UdSend if v[1] == 0 || v[1] > u64::from(RDMA_CM_RS_MAX_UD_PEERS) => Expect::Fail,
            Cmd::UdSend
                if rec.qp
                    && rec.max_dg != 0
                    && v[0] > u64::from(rec.max_dg)
                    && rec.peers.contains(&(v[1] as u32)) =>
            {
                Expect::Emsgsize
            }
            _ => Expect::Any,
        }
    }

    /// A port where a UD listener is, on the local address or any: this
    /// thread's own mostly, else one any thread had lately (`None`: any
    /// port will do).
    fn ud_listener_port(&mut self) -> Option<u16> {
        let own: Vec<u16> = self
            .files
            .iter()
            .filter(|f| f.open())
            .flat_map(|f| f.ids.iter())
            .filter(|i| i.ud && i.st == St::Listening && i.port != 0)
            .map(|i| i.port)
            .collect();
        if !own.is_empty() && self.rng.pct(60) {
            return Some(own[self.rng.below(own.len() as u64) as usize]);
        }
        let any: Vec<u16> = self
            .sh
            .ud_listen_ports
            .lock()
            .unwrap()
            .iter()
            .copied()
            .collect();
        if !any.is_empty() && self.rng.pct(50) {
            return Some(any[self.rng.below(any.len() as u64) as usize]);
        }
        None
    }

    /// A changed command number for `right` (of size `size`): `kind` 0
    /// another size, 1 another direction, 2 another number or type.  It
    /// may still be a real one (another command's number): the caller
    /// draws again then.
    fn wrong_number(&mut self, right: u32, size: u32, kind: u64) -> u32 {
        match kind {
            0 => {
                // Another size: another, unknown command.
                let other = loop {
                    let s = match self.rng.below(3) {
                        0 => size + 8,
                        1 => size.saturating_sub(8),
                        _ => self.rng.below(0x4000) as u32,
                    };
                    if s != size {
                        break s;
                    }
                };
                (right & !(0x3fff << 16)) | (other << 16)
            }
            1 => {
                let dir = right >> 30;
                let other = (dir + 1 + self.rng.below(3) as u32) % 4;
                (right & 0x3fff_ffff) | (other << 30)
            }
            _ => {
                let nr = self.rng.range(0x17, 0xff) as u32;
                if self.rng.pct(30) {
                    // Another type, the right number.
                    (right & !0xff00) | (0xd8 << 8)
                } else {
                    (right & !0xff) | nr
                }
            }
        }
    }

    /// One hostile change to a plausible call.
    fn mutate(&mut self, op: &mut Op) {
        let Act::Ioctl(cmd) = op.act else { return };
        let right = cmd.number();
        let size = (right >> 16) & 0x3fff;
        // An exact errno expected of the plausible call may not survive the
        // change: each case below says what it expects.
        if matches!(
            op.expect,
            Expect::Einval | Expect::Eopnotsupp | Expect::Enotconn | Expect::Emsgsize
        ) {
            op.expect = Expect::Any;
        }
        match self.rng.below(12) {
            kind @ 0..=2 => {
                // A wrong number: never one of the ABI's (another command
                // would answer it), drawn again until it is none.  The
                // draws are those of the first try when it is wrong, so a
                // seed's sequence changes only where it made a real one.
                let raw = loop {
                    let raw = self.wrong_number(right, size, kind);
                    if !is_real_ioctl(raw) {
                        break raw;
                    }
                };
                op.raw = Some(raw);
                op.expect = Expect::Enotty;
            }
            3 => {
                op.ptr = Ptr::Null;
                op.expect = Expect::Efault;
            }
            4 => {
                op.ptr = Ptr::ProtNone;
                op.expect = Expect::Efault;
            }
            5 => {
                op.ptr = Ptr::Straddle;
                op.expect = Expect::Efault;
            }
            6 => {
                op.ptr = Ptr::Wild;
                op.expect = Expect::Efault;
            }
            7 if cmd == Cmd::UdSend => {
                // UD_SEND has no reserved field: unknown flags, or
                // immediate data without the flag.
                if self.rng.pct(60) {
                    op.v[3] |= [2, 0x80, 0x8000_0000, self.rng.below(1 << 32) | 2]
                        [self.rng.below(4) as usize];
                } else {
                    op.v[3] = 0;
                    op.v[4] = 1 + self.rng.below(u64::from(u32::MAX));
                }
                op.expect = Expect::Einval;
            }
            7 if cmd == Cmd::UdRecv => {
                // Checked before anything else.
                op.v[RESERVED] = 1 + self.rng.below(u64::from(u32::MAX));
                op.expect = Expect::Einval;
            }
            7 => {
                // Garbage in a reserved field (or a field that must be 0).
                if matches!(
                    cmd,
                    Cmd::ResolveAddr | Cmd::ResolveRoute | Cmd::Listen | Cmd::SetOption
                ) {
                    // No reserved field: a bad sockaddr/timeout/backlog/option.
                    match cmd {
                        Cmd::ResolveAddr => op.v[1] = self.rng.range(2, 4),
                        Cmd::ResolveRoute => {
                            op.v[2] = if self.rng.pct(50) {
                                0
                            } else {
                                60_001 + self.rng.below(1 << 20)
                            }
                        }
                        // Backlog 0 takes the largest: only above it fails.
                        Cmd::Listen => op.v[0] = 1025 + self.rng.below(1 << 20),
                        _ => {
                            if self.rng.pct(50) {
                                op.v[0] = 6 + self.rng.below(100);
                            } else {
                                op.v[1] = 1 << 40;
                            }
                        }
                    }
                    op.expect = Expect::Fail;
                } else if cmd != Cmd::Info {
                    op.v[RESERVED] = 1 + self.rng.below(u64::MAX - 1);
                    op.expect = Expect::Fail;
                }
            }
            8 if cmd == Cmd::UdSend => {
                // A bad buffer to send from (never the one 16 bytes before
                // PROT_NONE: every datagram that leaves is UD_SEND's
                // pattern).
                op.v[6] = [1, 2, 4][self.rng.below(3) as usize];
                op.expect = Expect::Fail;
            }
            8 => {
                // A bad data buffer.
                if matches!(
                    cmd,
                    Cmd::Send | Cmd::Recv | Cmd::MrWrite | Cmd::MrRead | Cmd::UdRecv
                ) {
                    op.v[6] = 1 + self.rng.below(4); // Ptr index
                                                     // 3 straddles a PROT_NONE page 16 bytes in: a shorter
                                                     // copy may succeed.
                    if (cmd == Cmd::Send || cmd == Cmd::MrWrite) && op.v[6] != 3 {
                        op.expect = Expect::Fail;
                    }
                }
            }
            9 => {
                // Huge and overflowing lengths.
                let huge = [u64::from(u32::MAX), 0x8000_0000, (1 << 20) + 1, 0xffff_ff00]
                    [self.rng.below(4) as usize];
                match cmd {
                    Cmd::Send => {
                        op.v[0] = match self.rng.below(5) {
                            0 => 0,
                            1 => 4097,
                            _ => huge,
                        };
                        op.expect = Expect::Fail;
                    }
                    Cmd::Recv | Cmd::UdRecv => op.v[0] = huge,
                    Cmd::UdSend => {
                        // Checked before the id: whatever the id is.
                        op.v[0] = match self.rng.below(5) {
                            0 => 0,
                            1 => u64::from(RDMA_CM_RS_MAX_MESSAGE) + 1,
                            _ => huge,
                        };
                        op.expect = Expect::Einval;
                    }
                    Cmd::MrReg => {
                        op.v[0] = if self.rng.pct(20) { 0 } else { huge };
                        op.expect = Expect::Fail;
                    }
                    Cmd::MrWrite | Cmd::MrRead | Cmd::Rdma => {
                        op.v[3] = huge;
                        op.v[4] = 0x200;
                        if self.rng.pct(30) {
                            op.v[4] = 0;
                        }
                        if cmd == Cmd::Rdma && self.rng.pct(40) {
                            op.v[3] = 0;
                            op.v[4] = 16;
                            op.v[5] = u64::MAX - 4;
                        }
                        op.expect = Expect::Fail;
                    }
                    Cmd::Connect | Cmd::Accept | Cmd::Reject => {
                        op.v[0] = 257 + self.rng.below(0xffff - 257);
                        op.v[5] = 0;
                        op.expect = Expect::Fail;
                    }
                    _ => {}
                }
            }
            10 if !matches!(cmd, Cmd::Info | Cmd::CreateId | Cmd::GetEvent) => {
                // Somebody else's id, a stale one or garbage.
                let others: Vec<(u32, u32)> = self
                    .files
                    .iter()
                    .enumerate()
                    .filter(|(g, _)| *g as u32 != op.f)
                    .flat_map(|(g, r)| (0..r.ids.len() as u32).map(move |n| (g as u32, n)))
                    .collect();
                let destroyed: Vec<u32> = self.files[op.f as usize]
                    .ids
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.st == St::Destroyed)
                    .map(|(n, _)| n as u32)
                    .collect();
                match self.rng.below(3) {
                    0 if !others.is_empty() => {
                        let (g, n) = others[self.rng.below(others.len() as u64) as usize];
                        op.id = IdRef::Other(g, n);
                    }
                    1 if !destroyed.is_empty() && cmd != Cmd::CreateId => {
                        op.id =
                            IdRef::Slot(destroyed[self.rng.below(destroyed.len() as u64) as usize]);
                        // The handle is never reused: the call must fail.
                        op.expect = Expect::Fail;
                    }
                    _ => {
                        op.id = IdRef::Raw(
                            [0, u32::MAX, 0x8000_0000, self.rng.next_u64() as u32]
                                [self.rng.below(4) as usize],
                        );
                    }
                }
            }
            _ => {
                // The RC data path (SEND mostly) on a UD id, or datagrams
                // on an RC id, whatever the state: EOPNOTSUPP.
                let ud = self.rng.pct(70);
                let f = &self.files[op.f as usize];
                let ids: Vec<u32> = (0..f.ids.len() as u32)
                    .filter(|&n| {
                        let i = &f.ids[n as usize];
                        i.ud == ud && !matches!(i.st, St::Destroyed | St::Gone)
                    })
                    .collect();
                if !ids.is_empty() {
                    let n = ids[self.rng.below(ids.len() as u64) as usize];
                    let rec = f.ids[n as usize].clone();
                    let cmd = if ud {
                        [
                            Cmd::Send,
                            Cmd::Send,
                            Cmd::Send,
                            Cmd::Recv,
                            Cmd::MrReg,
                            Cmd::MrRead,
                            Cmd::Rdma,
                            Cmd::Disconnect,
                        ][self.rng.below(8) as usize]
                    } else if self.rng.pct(50) {
                        Cmd::UdSend
                    } else {
                        Cmd::UdRecv
                    };
                    let new = self.plausible(op.f, cmd, IdRef::Slot(n), &rec);
                    op.act = new.act;
                    op.id = new.id;
                    op.raw = None;
                    op.ptr = Ptr::Ok;
                    op.v = new.v;
                    op.expect = new.expect;
                }
            }
        }
    }

    // --- execution -----------------------------------------------------------

    fn resolve_id(&self, op: &Op) -> u32 {
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

    fn resolve_mr(&self, op: &Op) -> u32 {
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
    fn exec(&mut self, op: &Op) {
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
    fn reap(&mut self, mut p: PeerProc) {
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
                _ => {}
            }
        }
        let phase = seen.iter().rev().find(|c| b"srcexq".contains(c));
        self.sh.kind(match (exited, phase) {
            (true, _) => "peer: ended by itself",
            (false, None) => "peer: killed while starting",
            (false, Some(b'c')) => "peer: killed while connecting",
            (false, Some(b'e')) => "peer: killed while connected",
            (false, Some(b'q')) => "peer: killed while ending",
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
    fn link_add(&mut self, what: &'static str) {
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

    fn ioctl_op(&mut self, fd: i32, cmd: Cmd, op: &Op) -> std::result::Result<(), i32> {
        let number = op.raw.unwrap_or(cmd.number());
        let id = self.resolve_id(op);
        let mr = self.resolve_mr(op);
        let v = op.v;
        let res = v[RESERVED];
        let local = self.sh.opts.local;
        let siw = self.sh.opts.siw_addr;
        let pattern = |n: usize, seed: u64| -> Vec<u8> {
            (0..n).map(|i| (seed as usize + i * 13) as u8).collect()
        };
        let data_ptr = |mem: &Scratch| match v[6] {
            0 => mem.data.as_ptr() as u64,
            1 => 0,
            2 => mem.prot_none(),
            3 => mem.prot_none() - 16,
            _ => 0xdead_0000_0000_0000,
        };
        let param = |v: &[u64; 8], reserved: u64| {
            let mut p = rdma_cm_rs_conn_param {
                private_data_len: v[0] as u16,
                responder_resources: v[1] as u8,
                initiator_depth: v[2] as u8,
                retry_count: v[3] as u8,
                rnr_retry_count: v[4] as u8,
                reserved: reserved as u32,
                ..Default::default()
            };
            let n = (v[0] as usize).min(p.private_data.len());
            p.private_data[..n].copy_from_slice(&pattern(n, v[0]));
            p
        };
        let p = op.ptr;
        let mem = &mut self.mem;
        // The call goes to the kernel, into a fork child's plan, or comes
        // from a fork child's results.
        macro_rules! call {
            ($val:expr, $ty:ty) => {{
                let val: $ty = $val;
                let arg = place(mem, &val, p);
                let r = match &mut self.mode {
                    Mode::Live => live_ioctl(&self.sh, fd, number, arg, op.sig),
                    Mode::Capture(plan) => {
                        plan.push(Planned {
                            fd,
                            number,
                            arg,
                            in_arg: p == Ptr::Ok,
                            bytes: mem.arg.clone(),
                        });
                        Err(NOT_RUN)
                    }
                    Mode::Feed(results) => match results.pop_front().flatten() {
                        Some((e, out)) => {
                            if p == Ptr::Ok {
                                // SAFETY: `arg` holds more than CHILD_OUT bytes.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        out.as_ptr(),
                                        mem.arg.as_mut_ptr().cast::<u8>(),
                                        out.len().min(CHILD_OUT),
                                    )
                                };
                            }
                            if e == 0 {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        }
                        None => Err(NOT_RUN),
                    },
                };
                (
                    r,
                    if p == Ptr::Ok {
                        Some(fetch::<$ty>(mem))
                    } else {
                        None
                    },
                )
            }};
        }
        // Only a correct command on a good pointer tells us anything about
        // state; the rest is judged and forgotten.
        let real = op.raw.is_none() && p == Ptr::Ok;
        match cmd {
            Cmd::Info => {
                let (r, out) = call!(Default::default(), rdma_cm_rs_info);
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    if out.max_ud_peers != RDMA_CM_RS_MAX_UD_PEERS
                        || out.max_message != RDMA_CM_RS_MAX_MESSAGE
                    {
                        self.sh.finding(format!(
                            "INFO: max_ud_peers {} max_message {} (the header says {} and {})",
                            out.max_ud_peers,
                            out.max_message,
                            RDMA_CM_RS_MAX_UD_PEERS,
                            RDMA_CM_RS_MAX_MESSAGE
                        ));
                    }
                }
                r
            }
            Cmd::CreateId => {
                let (r, out) = call!(
                    rdma_cm_rs_create_id {
                        context: v[0],
                        port_space: v[1] as u32,
                        qp_type: v[2] as u32,
                        id: if res != 0 { 7 } else { 0 },
                        // Unknown flags, or busy-polling by the context's
                        // low bit; never synchronous: a synchronous id would
                        // block the actor in its calls (the suite tests
                        // those).
                        flags: if res != 0 {
                            (res >> 32) as u32 | 0x8000_0000
                        } else {
                            (v[0] as u32 & 1) * RDMA_CM_RS_ID_BUSY_POLL
                        },
                    },
                    rdma_cm_rs_create_id
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    if out.id == 0 {
                        self.sh.finding("CREATE_ID returned id 0".into());
                    }
                    self.files[op.f as usize].ids.push(IdRec::new(
                        out.id,
                        v[2] == u64::from(RDMA_CM_RS_QPT_UD),
                        St::Idle,
                    ));
                }
                r
            }
            Cmd::DestroyId | Cmd::Disconnect => {
                let reserved = res as u32 | (res >> 32) as u32;
                let r = if cmd == Cmd::DestroyId {
                    call!(rdma_cm_rs_id_cmd { id, reserved }, rdma_cm_rs_id_cmd).0
                } else {
                    call!(
                        rdma_cm_rs_disconnect {
                            id,
                            reserved,
                            ..Default::default()
                        },
                        rdma_cm_rs_disconnect
                    )
                    .0
                };
                if real && r.is_ok() {
                    let st = if cmd == Cmd::DestroyId {
                        St::Destroyed
                    } else {
                        St::Down
                    };
                    self.set_state(op, st);
                    if cmd == Cmd::DestroyId {
                        let f = &mut self.files[op.f as usize];
                        for m in f.mrs.iter_mut().filter(|m| m.id == id) {
                            m.alive = false;
                        }
                    }
                }
                r
            }
            Cmd::Bind => {
                let mut addr = match v[1] {
                    0 => sockaddr4(local, v[0] as u16),
                    2 => sockaddr4(siw, v[0] as u16),
                    _ => sockaddr4(Ipv4Addr::UNSPECIFIED, v[0] as u16),
                };
                if res & 1 != 0 {
                    addr.bytes[9] = 1; // sin_zero
                }
                let (r, _) = call!(
                    rdma_cm_rs_bind {
                        id,
                        reserved: if res != 0 && res & 1 == 0 {
                            (res >> 1) as u32 | 1
                        } else {
                            0
                        },
                        addr,
                    },
                    rdma_cm_rs_bind
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Bound);
                    if v[1] == 2 {
                        self.sh.kind("siw: ids bound to its address");
                    } else if let IdRef::Slot(n) = op.id {
                        if let Some(i) = self.files[op.f as usize].ids.get_mut(n as usize) {
                            i.port = v[0] as u16;
                        }
                    }
                }
                r
            }
            Cmd::ResolveAddr => {
                let dst = match v[1] {
                    0 => sockaddr4(local, v[0] as u16),
                    2 => {
                        let mut a = sockaddr4(local, v[0] as u16);
                        a.bytes[0] = 42; // unknown family
                        a
                    }
                    3 => {
                        let mut a = sockaddr4(local, v[0] as u16);
                        a.bytes[100] = 1; // past the structure
                        a
                    }
                    5 => sockaddr4(siw, v[0] as u16),
                    _ => rdma_cm_rs_sockaddr { bytes: [0; 128] },
                };
                let src = match v[3] {
                    0 => rdma_cm_rs_sockaddr { bytes: [0; 128] },
                    2 => sockaddr4(siw, 0),
                    _ => sockaddr4(local, 0),
                };
                let (r, _) = call!(
                    rdma_cm_rs_resolve_addr {
                        id,
                        timeout_ms: v[2] as u32,
                        src,
                        dst,
                        ..Default::default()
                    },
                    rdma_cm_rs_resolve_addr
                );
                if real && r.is_ok() {
                    self.set_state(op, St::AddrQuery);
                    if v[1] == 5 {
                        self.sh.kind("siw: ids resolving its address");
                    }
                }
                r
            }
            Cmd::ResolveRoute => {
                let (r, _) = call!(
                    rdma_cm_rs_resolve_route {
                        id,
                        timeout_ms: v[2] as u32,
                        ..Default::default()
                    },
                    rdma_cm_rs_resolve_route
                );
                if real && r.is_ok() {
                    self.set_state(op, St::RouteQuery);
                }
                r
            }
            Cmd::Listen => {
                let (r, _) = call!(
                    rdma_cm_rs_listen {
                        id,
                        backlog: v[0] as u32,
                    },
                    rdma_cm_rs_listen
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Listening);
                    // An RC listener the peers can reach: they try it
                    // first; a UD one, every thread's UD ids.
                    let (port, ud) = match op.id {
                        IdRef::Slot(n) => self.files[op.f as usize]
                            .ids
                            .get(n as usize)
                            .map_or((0, false), |i| (i.port, i.ud)),
                        _ => (0, false),
                    };
                    if port != 0 {
                        let mut ports = if ud {
                            self.sh.ud_listen_ports.lock().unwrap()
                        } else {
                            self.sh.listen_ports.lock().unwrap()
                        };
                        if ports.len() == 6 {
                            ports.pop_front();
                        }
                        ports.push_back(port);
                    }
                }
                r
            }
            Cmd::Connect => {
                let (r, _) = call!(
                    rdma_cm_rs_connect {
                        id,
                        reserved: if res != 0 { res as u32 | 1 } else { 0 },
                        param: param(&v, res >> 32),
                        ..Default::default()
                    },
                    rdma_cm_rs_connect
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Connecting);
                    if let Some(i) = self.rec_of(op) {
                        i.qp = true;
                        // A UD id whose lookup failed may look up again: a
                        // connect the module took makes its state CONNECT,
                        // and its peers from before take sends again.
                        i.dead = false;
                    }
                }
                r
            }
            Cmd::Accept => {
                let (r, _) = call!(
                    rdma_cm_rs_accept {
                        id,
                        flags: (v[5] as u32) | if res != 0 { 0x80 } else { 0 },
                        param: param(&v, 0),
                        ..Default::default()
                    },
                    rdma_cm_rs_accept
                );
                if real && r.is_ok() {
                    // A SIDR reply: no event follows, the UD QP is there.
                    let ud = self.rec_of(op).is_some_and(|i| {
                        i.qp = true;
                        i.ud
                    });
                    if ud {
                        self.sh.kind("ud: SIDR requests accepted");
                    }
                    self.set_state(op, if ud { St::Connected } else { St::Connecting });
                }
                r
            }
            Cmd::Reject => {
                let mut rj = rdma_cm_rs_reject {
                    id,
                    reason: v[1] as u8,
                    reserved: [if res != 0 { res as u8 | 1 } else { 0 }],
                    private_data_len: v[0] as u16,
                    ..Default::default()
                };
                let n = (v[0] as usize).min(rj.private_data.len());
                rj.private_data[..n].copy_from_slice(&pattern(n, v[0]));
                let (r, _) = call!(rj, rdma_cm_rs_reject);
                if real && r.is_ok() {
                    self.set_state(op, St::Down);
                    if let Some(i) = self.rec_of(op) {
                        i.dead = true;
                    }
                }
                r
            }
            Cmd::SetOption => {
                call!(
                    rdma_cm_rs_set_option {
                        id,
                        option: v[0] as u32,
                        value: v[1],
                    },
                    rdma_cm_rs_set_option
                )
                .0
            }
            Cmd::Query => {
                let mut q = rdma_cm_rs_query {
                    id,
                    ..Default::default()
                };
                q.reserved[(res % 3) as usize] = res;
                let (r, out) = call!(q, rdma_cm_rs_query);
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    self.on_query(op, &out);
                }
                r
            }
            Cmd::GetEvent => {
                let (r, out) = call!(
                    rdma_cm_rs_get_event {
                        timeout_ms: v[0] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                        ..Default::default()
                    },
                    rdma_cm_rs_get_event
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    self.on_event(op.f as usize, &out.event);
                }
                r
            }
            Cmd::Send => {
                let len = v[0] as usize;
                let buf = data_ptr(mem);
                let (r, _) = call!(
                    rdma_cm_rs_send {
                        id,
                        len: len as u32,
                        buf,
                        timeout_ms: v[2] as u32,
                        // An unknown flag where other commands have a
                        // non-zero reserved field.
                        flags: (v[5] as u32 & RDMA_CM_RS_SEND_NOWAIT)
                            | if res != 0 { 0x80 } else { 0 },
                    },
                    rdma_cm_rs_send
                );
                // A UD id that connected and got as far as a send: close
                // its file soon.
                let f = &mut self.files[op.f as usize];
                if let IdRef::Slot(n) = op.id {
                    if f.ids.get(n as usize).is_some_and(|i| {
                        i.ud && matches!(i.st, St::Connecting | St::Connected | St::Down)
                    }) {
                        f.close_soon = true;
                    }
                }
                r
            }
            Cmd::Recv => {
                // The buffer is 2 MiB: a message (<= 4096 bytes) always fits
                // whatever `len` claims.
                let buf = data_ptr(mem);
                call!(
                    rdma_cm_rs_recv {
                        id,
                        len: v[0] as u32,
                        buf,
                        timeout_ms: v[2] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_recv
                )
                .0
            }
            Cmd::UdSend => {
                let buf = match v[6] {
                    0 => mem.ud_tx.as_ptr() as u64,
                    _ => data_ptr(mem),
                };
                let (r, _) = call!(
                    rdma_cm_rs_ud_send {
                        id,
                        peer: v[1] as u32,
                        buf,
                        len: v[0] as u32,
                        flags: v[3] as u32,
                        imm_data: v[4] as u32,
                        timeout_ms: v[2] as u32,
                    },
                    rdma_cm_rs_ud_send
                );
                // Some sends close their file soon after (`v[5]`).
                let f = &mut self.files[op.f as usize];
                if let IdRef::Slot(n) = op.id {
                    if v[5] != 0
                        && f.ids.get(n as usize).is_some_and(|i| {
                            i.ud && matches!(i.st, St::Connecting | St::Connected | St::Down)
                        })
                    {
                        f.close_soon = true;
                    }
                }
                r
            }
            Cmd::UdRecv => {
                // Into the 2 MiB buffer, like RECV: a datagram always fits
                // whatever `len` claims.
                let buf = data_ptr(mem);
                let mut c = rdma_cm_rs_ud_recv {
                    id,
                    len: v[0] as u32,
                    buf,
                    timeout_ms: v[2] as u32,
                    reserved: res as u32 | (res >> 32) as u32,
                    ..Default::default()
                };
                if v[3] != 0 {
                    // Outputs only: their input values mean nothing.
                    c.flags = v[3] as u32;
                    c.imm_data = (v[3] >> 32) as u32;
                    c.peer = v[3] as u32 ^ 0x5a5a_5a5a;
                    c.src_qp = (v[3] >> 8) as u32;
                    c.src.bytes[..8].copy_from_slice(&v[3].to_ne_bytes());
                }
                let live = matches!(self.mode, Mode::Live);
                let (r, out) = call!(c, rdma_cm_rs_ud_recv);
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    // Every datagram in the VM is a UD_SEND of this
                    // program: a prefix of `ud_byte`, the GRH stripped.
                    let n = (out.len as usize).min(mem.data.len());
                    let bad = (live && v[6] == 0)
                        .then(|| (0..n).find(|&i| mem.data[i] != ud_byte(i)))
                        .flatten();
                    self.on_datagram(op, &out, bad);
                }
                r
            }
            Cmd::MrReg => {
                let (r, out) = call!(
                    rdma_cm_rs_mr_reg {
                        id,
                        access: v[1] as u32,
                        length: v[0] as u32,
                        timeout_ms: v[2] as u32,
                        reserved: [res, 0],
                        ..Default::default()
                    },
                    rdma_cm_rs_mr_reg
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    self.files[op.f as usize].mrs.push(MrRec {
                        id,
                        handle: out.mr,
                        len: v[0] as u32,
                        alive: true,
                    });
                    if v[1] != 0 {
                        let mut regions = self.sh.regions.lock().unwrap();
                        if regions.len() > 256 {
                            regions.remove(0);
                        }
                        regions.push((out.addr, out.rkey, v[0] as u32));
                    }
                }
                r
            }
            Cmd::MrDereg => {
                let (r, _) = call!(
                    rdma_cm_rs_mr_cmd {
                        id,
                        mr,
                        timeout_ms: v[2] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_mr_cmd
                );
                if real && r.is_ok() {
                    for m in self.files[op.f as usize].mrs.iter_mut() {
                        if m.id == id && m.handle == mr {
                            m.alive = false;
                        }
                    }
                }
                r
            }
            Cmd::MrWrite | Cmd::MrRead => {
                let buf = data_ptr(mem);
                // mr_copy has no reserved field: garbage goes into the
                // length instead (past any region).
                let len = if res != 0 {
                    (1 << 20) + 1 + (res as u32 & 0xffff)
                } else {
                    v[4] as u32
                };
                // A read longer than the scratch buffer could only succeed
                // past the region: never let the kernel write beyond it.
                let len = if cmd == Cmd::MrRead && v[6] == 0 && len as usize > DATA_LEN {
                    (DATA_LEN as u32) + 1
                } else {
                    len
                };
                call!(
                    rdma_cm_rs_mr_copy {
                        id,
                        mr,
                        offset: v[3] as u32,
                        len,
                        buf,
                    },
                    rdma_cm_rs_mr_copy
                )
                .0
            }
            Cmd::Rdma => {
                call!(
                    rdma_cm_rs_rdma {
                        id,
                        opcode: v[1] as u32,
                        mr,
                        offset: v[3] as u32,
                        len: v[4] as u32,
                        rkey: v[6] as u32,
                        remote_addr: v[5],
                        timeout_ms: v[2] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_rdma
                )
                .0
            }
        }
    }

    fn set_state(&mut self, op: &Op, st: St) {
        if let IdRef::Slot(n) = op.id {
            if let Some(i) = self.files[op.f as usize].ids.get_mut(n as usize) {
                i.st = st;
            }
        }
    }

    /// `op` on one of its own file's ids when it names another file's id
    /// or a raw handle that is also one of this file's: handles are the
    /// file's own, counted from 1 in every file, so the module takes it
    /// for this file's id and the model must follow (seed 2, 2026-11-28:
    /// a CONNECT on another file's id connected this file's UD id of the
    /// same handle, whose UD_RECV the model then expected to be
    /// `ENOTCONN`).
    fn as_own_id(&self, op: &Op) -> Option<Op> {
        if matches!(op.id, IdRef::Slot(_)) {
            return None;
        }
        let handle = self.resolve_id(op);
        let n = self.files.get(op.f as usize)?.slot_of(handle)?;
        Some(Op {
            id: IdRef::Slot(n as u32),
            ..op.clone()
        })
    }

    /// The model of the id `op` names in its own file.
    fn rec_of(&mut self, op: &Op) -> Option<&mut IdRec> {
        let IdRef::Slot(n) = op.id else { return None };
        self.files.get_mut(op.f as usize)?.ids.get_mut(n as usize)
    }

    /// A QUERY's answer: the QP type as created; `max_datagram` and `qkey`
    /// only on a UD id, `max_datagram` (learnt for UD_SEND's sizes) once
    /// it has its QP, and never above the ABI's message size.
    fn on_query(&mut self, op: &Op, q: &rdma_cm_rs_query) {
        let line = op.line();
        let Some(i) = self.rec_of(op) else { return };
        let qpt = if i.ud {
            RDMA_CM_RS_QPT_UD
        } else {
            RDMA_CM_RS_QPT_RC
        };
        let why = if q.qp_type != qpt {
            Some(format!("qp_type {} (created {qpt})", q.qp_type))
        } else if !i.ud && (q.max_datagram != 0 || q.qkey != 0) {
            Some(format!(
                "an RC id with max_datagram {} qkey {:#x}",
                q.max_datagram, q.qkey
            ))
        } else if q.max_datagram > RDMA_CM_RS_MAX_MESSAGE {
            Some(format!("max_datagram {}", q.max_datagram))
        } else if i.ud && i.qp && q.max_datagram == 0 {
            Some("a UD id with its QP and max_datagram 0".into())
        } else {
            None
        };
        if q.max_datagram != 0 {
            i.max_dg = q.max_datagram;
        }
        if let Some(why) = why {
            self.sh.finding(format!("QUERY: {why} [{line}]"));
        }
    }

    /// A datagram UD_RECV returned (`bad`: the first byte that is not what
    /// was sent): judged, and its sender's peer handle kept.
    fn on_datagram(&mut self, op: &Op, d: &rdma_cm_rs_ud_recv, bad: Option<usize>) {
        let line = op.line();
        let cap = op.v[0].min(u64::from(u32::MAX)) as u32;
        let why = if d.len == 0 || d.len > cap || d.len > RDMA_CM_RS_MAX_MESSAGE {
            Some(format!("length {} (buffer {cap})", d.len))
        } else if d.peer > RDMA_CM_RS_MAX_UD_PEERS {
            Some(format!("peer {}", d.peer))
        } else if d.flags & !RDMA_CM_RS_UD_WITH_IMM != 0 || (d.flags == 0 && d.imm_data != 0) {
            Some(format!("flags {:#x} imm_data {:#x}", d.flags, d.imm_data))
        } else {
            bad.map(|b| format!("{} bytes, byte {b} is not what was sent", d.len))
        };
        if let Some(why) = why {
            self.sh.finding(format!("UD_RECV: {why} [{line}]"));
        }
        if d.flags != 0 {
            self.sh.kind("ud: datagrams received with imm_data");
        }
        if d.peer == 0 {
            return;
        }
        let sh = self.sh.clone();
        if let Some(i) = self.rec_of(op) {
            if !i.peers.contains(&d.peer) {
                i.peers.push(d.peer);
                sh.kind("ud: peers learnt from UD_RECV");
            }
        }
    }

    fn on_event(&mut self, f: usize, ev: &rdma_cm_rs_event) {
        let kind = EventType::from(ev.event);
        let rec = &mut self.files[f];
        let Some(slot) = rec.slot_of(ev.id) else {
            self.sh.finding(format!(
                "GET_EVENT: event {} names id {} this file was never given",
                kind.name(),
                ev.id
            ));
            return;
        };
        if rec.ids[slot].st == St::Destroyed {
            self.sh.finding(format!(
                "GET_EVENT: event {} for id {} after DESTROY_ID returned",
                kind.name(),
                ev.id
            ));
            return;
        }
        if rec.ids[slot].st == St::Removed {
            self.sh.finding(format!(
                "GET_EVENT: event {} for id {} after its DEVICE_REMOVAL (the id's last)",
                kind.name(),
                ev.id
            ));
            return;
        }
        if rec.ids[slot].ud {
            match kind {
                EventType::Unreachable => self.sh.kind("ud: SIDR lookups UNREACHABLE"),
                EventType::Rejected => self.sh.kind("ud: SIDR lookups REJECTED"),
                _ => {}
            }
            // The module's state is DISCONNECT until a CONNECT succeeds.
            if rec.ids[slot].qp
                && matches!(
                    kind,
                    EventType::Unreachable | EventType::Rejected | EventType::ConnectError
                )
            {
                rec.ids[slot].dead = true;
            }
        }
        let st = match kind {
            EventType::AddrResolved => St::AddrResolved,
            EventType::RouteResolved => St::RouteResolved,
            EventType::Established => {
                // UD: the SIDR reply, with the peer's handle unless the
                // status says why there is none; RC: no UD fields.
                let i = &mut rec.ids[slot];
                let ok = if i.ud {
                    if ev.status == 0 {
                        (1..=RDMA_CM_RS_MAX_UD_PEERS).contains(&ev.ud_peer)
                    } else {
                        ev.ud_peer == 0
                    }
                } else {
                    ev.ud_peer == 0 && ev.ud_qp_num == 0 && ev.ud_qkey == 0
                };
                if !ok {
                    self.sh.finding(format!(
                        "GET_EVENT: ESTABLISHED of {} id {}: status {} ud_peer {} ud_qp_num {:#x}",
                        if i.ud { "UD" } else { "RC" },
                        ev.id,
                        ev.status,
                        ev.ud_peer,
                        ev.ud_qp_num
                    ));
                }
                if i.ud && ev.ud_peer != 0 && !i.peers.contains(&ev.ud_peer) {
                    i.peers.push(ev.ud_peer);
                }
                if i.ud {
                    self.sh.kind("ud: SIDR lookups ESTABLISHED");
                }
                St::Connected
            }
            EventType::ConnectRequest => {
                let ud = rec.ids[slot].ud;
                if ev.new_id == 0 || rec.slot_of(ev.new_id).is_some() {
                    self.sh.finding(format!(
                        "GET_EVENT: CONNECT_REQUEST with new_id {} (zero or in use)",
                        ev.new_id
                    ));
                    return;
                }
                rec.ids.push(IdRec::new(ev.new_id, ud, St::Requested));
                return;
            }
            EventType::DeviceRemoval => {
                self.sh.kind("siw: DEVICE_REMOVAL events");
                for m in rec.mrs.iter_mut().filter(|m| m.id == ev.id) {
                    m.alive = false;
                }
                St::Removed
            }
            // ADDR_CHANGE leaves the id as it was (so does the module).
            EventType::TimewaitExit | EventType::ConnectResponse | EventType::AddrChange => return,
            _ => St::Down,
        };
        rec.ids[slot].st = st;
    }

    fn close_all(&mut self) {
        for f in 0..self.files.len() {
            while self.files[f].open() {
                let op = Op::new(self.t, f as u32, Act::Close);
                self.exec(&op);
            }
        }
    }

    /// The end of a thread: its files closed, its peers killed, the siw
    /// device back if it deleted it.
    fn finish(&mut self) {
        self.close_all();
        for slot in 0..self.peers.len() {
            if let Some(p) = self.peers[slot].take() {
                self.reap(p);
            }
        }
        if self.link_deleted {
            self.link_add("link: added back at the end");
            if let Some((dev, _)) = &self.sh.opts.link {
                if !device_exists(dev) {
                    self.sh
                        .finding(format!("{dev} is missing at the end of the run"));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Running.

/// The outcome of one run.
struct Outcome {
    ops: u64,
    secs: f64,
    findings: Vec<String>,
    tail: Vec<String>,
    all: Option<Vec<String>>,
    hang: bool,
}

/// What a run found out about its surroundings once (not per replay).
struct Env {
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

fn run_once(
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
fn script_of(lines: &[String]) -> Result<Vec<Vec<Op>>> {
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

fn summary(sh: &Shared, out: &Outcome, threads: u32) {
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
    let env = Env::probe(&o);
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
    let (out, sh) = run_once(&o, &env, script, false, o.trace.as_deref())?;
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
        Some(all) if !all.is_empty() => shrink(&o, &env, &all)?,
        _ => println!("# fuzz: trace too long to keep in memory: not shrinking"),
    }
    bail!("fuzz: {} finding(s), seed {}", out.findings.len(), o.seed)
}

/// Bisects on the trace's length for the shortest prefix that still fails
/// when replayed (best effort: the kernel's timing is not replayed).
fn shrink(o: &Options, env: &Env, all: &[String]) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_tasks_reads_proc() {
        // Nothing of this test process is in D state; the dump is one
        // comment line or more, and never fails.
        let dump = blocked_tasks();
        assert!(!dump.is_empty());
        assert!(dump.lines().all(|l| l.starts_with('#')), "{dump}");
    }

    #[test]
    fn real_ioctls_are_the_headers_commands() {
        // Every `#define RDMA_CM_RS_IOC_X _IO..(MAGIC, nr, struct ...)` of
        // the header is in the list, and nothing else: a command added to
        // the ABI must be added there, or the generator may "mutate" into it.
        let header = include_str!("../../../rust/uapi/rdma_cm_rs.h");
        let mut nrs: Vec<u32> = header
            .lines()
            .filter(|l| l.starts_with("#define RDMA_CM_RS_IOC_") && l.contains("_IO"))
            .map(|l| {
                let args = l.split_once('(').unwrap().1;
                let nr = args.split(',').nth(1).unwrap().trim();
                u32::from_str_radix(nr.trim_start_matches("0x"), 16).unwrap()
            })
            .collect();
        nrs.sort_unstable();
        let mut ours: Vec<u32> = REAL_IOCTLS.iter().map(|n| n & 0xff).collect();
        ours.sort_unstable();
        assert_eq!(nrs, ours);
        for (c, _, n) in CMDS {
            assert!(is_real_ioctl(n), "{}", c.name());
        }
    }

    #[test]
    fn wrong_command_numbers_are_never_real() {
        // The old generator made one real number in some 4,000 mutations of
        // GET_EVENT (another nr in 0x17..=0xff kept GET_EVENT's direction
        // and size: 0x17 is GET_REQUEST, 328 bytes too): seed 2 stopped on
        // `GET_EVENT: expected enotty, got ENOENT` for `cmd=0xc148d717`.
        let sh = || {
            let mut sh = Shared::new(OptionsLite::test(), 1, None);
            sh.quiet = true;
            Arc::new(sh)
        };
        let mut wrong = 0u32;
        for seed in 0..40u64 {
            let mut w = Worker::new(0, seed, sh()).unwrap();
            w.files.push(FileRec {
                fds: vec![100],
                ..Default::default()
            });
            for &(cmd, name, right) in &CMDS {
                for _ in 0..600 {
                    let mut op = Op::new(0, 0, Act::Ioctl(cmd));
                    w.mutate(&mut op);
                    let Some(raw) = op.raw else { continue };
                    wrong += 1;
                    assert_ne!(raw, right, "{name} seed {seed}");
                    assert!(
                        !is_real_ioctl(raw),
                        "{name} seed {seed}: {raw:#x} is a real command"
                    );
                    assert_eq!(op.expect, Expect::Enotty);
                }
            }
        }
        // A quarter of the mutations change the number.
        assert!(wrong > 40 * 23 * 600 / 5, "{wrong}");
    }

    #[test]
    fn prng_is_deterministic() {
        let a: Vec<u64> = {
            let mut r = Rng::new(42);
            (0..100).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(42);
        let b: Vec<u64> = (0..100).map(|_| r.next_u64()).collect();
        assert_eq!(a, b);
        // splitmix64's first output for seed 0.
        assert_eq!(Rng::new(0).next_u64(), 0xe220_a839_7b1d_cdaf);
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let x = r.range(3, 9);
            assert!((3..=9).contains(&x));
        }
        let mut r = Rng::new(7);
        let mut hits = [0u32; 3];
        for _ in 0..3000 {
            hits[r.weighted(&[1, 0, 9])] += 1;
        }
        assert_eq!(hits[1], 0);
        assert!(hits[2] > hits[0] * 5);
    }

    #[test]
    fn trace_lines_round_trip() {
        let mut op = Op::new(1, 2, Act::Ioctl(Cmd::Connect));
        op.fd = 1;
        op.raw = Some(0x4110_d707);
        op.ptr = Ptr::Straddle;
        op.id = IdRef::Other(3, 4);
        op.v = [56, 1, 1, 7, 7, 0, u64::MAX, 0x1234];
        op.expect = Expect::Enotty;
        let mut signalled = Op::new(0, 1, Act::Ioctl(Cmd::GetEvent));
        signalled.v[0] = u64::from(RDMA_CM_RS_TIMEOUT_INFINITE);
        signalled.sig = Some(42);
        let mut fork = Op::new(2, 1, Act::Fork);
        fork.v[0] = u64::MAX - 5;
        fork.v[1] = 4;
        let mut spawn = Op::new(3, 2, Act::Peer { kill: false });
        spawn.v[0] = 250;
        spawn.v[2] = 0xfeed;
        let mut kill = Op::new(3, 2, Act::Peer { kill: true });
        kill.v[0] = 17;
        let mut delete = Op::new(4, 0, Act::Link { add: false });
        delete.v[0] = 3000;
        let mut add = Op::new(4, 0, Act::Link { add: true });
        add.v[0] = 300;
        let mut ud_send = Op::new(0, 2, Act::Ioctl(Cmd::UdSend));
        ud_send.id = IdRef::Slot(7);
        ud_send.v = [1024, 3, 0, 1, 0xdead_beef, 1, 0, 0];
        ud_send.expect = Expect::Emsgsize;
        ud_send.sig = Some(3);
        let mut ud_recv = Op::new(1, 0, Act::Ioctl(Cmd::UdRecv));
        ud_recv.v = [4096, 0, 150, u64::MAX, 0, 0, 2, 9];
        ud_recv.expect = Expect::Einval;
        let mut others = Vec::new();
        for x in [Expect::Eopnotsupp, Expect::Enotconn] {
            let mut o = Op::new(2, 1, Act::Ioctl(Cmd::Send));
            o.expect = x;
            others.push(o);
        }
        for op in [
            ud_send,
            ud_recv,
            others[0].clone(),
            others[1].clone(),
            op.clone(),
            Op::new(0, 0, Act::Open { nonblock: true }),
            Op::new(0, 5, Act::Close),
            Op::new(3, 1, Act::Dup),
            Op::new(0, 1, Act::Ioctl(Cmd::GetEvent)),
            signalled,
            fork,
            spawn,
            kill,
            delete,
            add,
        ] {
            let l = op.line();
            assert_eq!(Op::parse(&l), Some(op), "{l}");
        }
        assert_eq!(IdRef::parse("#3"), Some(IdRef::Slot(3)));
        assert_eq!(IdRef::parse("4294967295"), Some(IdRef::Raw(u32::MAX)));
        assert!(Op::parse("t=0 f=0 fd=0 NOPE").is_none());
        assert!(Op::parse("t=0 f=0 fd=0 peer wave after=1").is_none());
        assert!(Op::parse("t=0 f=0 fd=0 fork n=3").is_none());
        // Lines without `sig=` (older traces) are not signalled.
        let l = "t=0 f=1 fd=0 QUERY cmd=- ptr=ok id=#0 v=0,0,0,0,0,0,0,0 x=any";
        assert_eq!(Op::parse(l).map(|o| o.sig), Some(None));
        let l = "t=2 f=0 fd=1 UD_SEND cmd=- ptr=ok id=#4 v=0x400,0x1,0x64,0x1,0x2a,0x0,0x0,0x0 x=emsgsize";
        let op = Op::parse(l).unwrap();
        assert_eq!(op.act, Act::Ioctl(Cmd::UdSend));
        assert_eq!(op.line(), l);
        assert!(Op::parse(&l.replace("x=emsgsize", "x=enomem")).is_none());
    }

    #[test]
    fn generation_is_deterministic_and_covers_the_abi() {
        // Without a device: generate from a model that pretends every call
        // succeeded in the plausible direction.
        let sh = || {
            let mut sh = Shared::new(OptionsLite::test(), 1, None);
            sh.quiet = true;
            Arc::new(sh)
        };
        let gen = |seed: u64| -> Vec<String> {
            let mut w = Worker::new(0, seed, sh()).unwrap();
            let mut lines = Vec::new();
            for step in 0..8000u32 {
                let op = w.gen();
                lines.push(op.line());
                // Model the outcome without a kernel.
                match op.act {
                    Act::Open { nonblock } => {
                        while w.files.len() <= op.f as usize {
                            w.files.push(FileRec::default());
                        }
                        w.files[op.f as usize] = FileRec {
                            fds: vec![100],
                            nonblock,
                            ..Default::default()
                        };
                    }
                    Act::Close => {
                        w.files[op.f as usize].fds.clear();
                        w.files[op.f as usize].close_soon = false;
                    }
                    Act::Dup => w.files[op.f as usize].fds.push(101),
                    Act::Ioctl(c) if op.raw.is_none() && op.expect == Expect::Any => {
                        let f = &mut w.files[op.f as usize];
                        let n = match op.id {
                            IdRef::Slot(n) => n as usize,
                            _ => usize::MAX,
                        };
                        let next = match c {
                            Cmd::CreateId => {
                                f.ids.push(IdRec::new(
                                    step + 1,
                                    op.v[2] == u64::from(RDMA_CM_RS_QPT_UD),
                                    St::Idle,
                                ));
                                None
                            }
                            Cmd::Bind => Some(St::Bound),
                            Cmd::ResolveAddr => Some(St::AddrResolved),
                            Cmd::ResolveRoute => Some(St::RouteResolved),
                            Cmd::Connect => {
                                // A UD id's SIDR reply: its peer, and a
                                // QUERY's max_datagram.
                                if let Some(i) = f.ids.get_mut(n) {
                                    i.qp = true;
                                    if i.ud {
                                        i.peers = vec![1];
                                        i.max_dg = 1024;
                                    }
                                }
                                Some(St::Connected)
                            }
                            Cmd::Listen => Some(St::Listening),
                            Cmd::DestroyId => Some(St::Destroyed),
                            Cmd::Send => {
                                if f.ids.get(n).is_some_and(|i| i.ud) {
                                    f.close_soon = true;
                                }
                                None
                            }
                            _ => None,
                        };
                        if let (Some(st), Some(i)) = (next, f.ids.get_mut(n)) {
                            i.st = st;
                        }
                    }
                    _ => {}
                }
            }
            lines
        };
        let a = gen(5);
        assert_eq!(a, gen(5));
        assert_ne!(a, gen(6));
        let text = a.join("\n");
        for (_, name, _) in CMDS {
            if ["ACCEPT", "REJECT"].contains(&name) {
                continue; // need a CONNECT_REQUEST from a kernel
            }
            assert!(
                text.contains(&format!(" {name} ")),
                "{name} never generated"
            );
        }
        // The UD sequence the old module's WARNING needed: a send on a
        // connected UD id, then the close of its file.
        assert!(text.contains(" close"));
        // Datagrams: to a peer the id has, of every size class, with and
        // without immediate data; and the errnos the ABI fixes for them.
        let ops: Vec<Op> = a.iter().map(|l| Op::parse(l).unwrap()).collect();
        let ud_sends: Vec<&Op> = ops
            .iter()
            .filter(|o| o.act == Act::Ioctl(Cmd::UdSend) && o.raw.is_none())
            .collect();
        assert!(ud_sends.len() >= 50, "{} UD_SENDs", ud_sends.len());
        for (what, hit) in [
            ("to peer 1", ud_sends.iter().any(|o| o.v[1] == 1)),
            ("MTU-sized", ud_sends.iter().any(|o| o.v[0] == 1024)),
            ("with imm", ud_sends.iter().any(|o| o.v[3] == 1)),
            ("small", ud_sends.iter().any(|o| o.v[0] <= 64)),
        ] {
            assert!(hit, "no UD_SEND {what}");
        }
        for x in [
            Expect::Einval,
            Expect::Eopnotsupp,
            Expect::Enotconn,
            Expect::Emsgsize,
            Expect::Fail,
        ] {
            assert!(
                ud_sends.iter().any(|o| o.expect == x),
                "no UD_SEND expecting {}",
                x.name()
            );
        }
        for (cmd, x) in [
            (Cmd::UdRecv, Expect::Eopnotsupp),
            (Cmd::UdRecv, Expect::Einval),
            (Cmd::Send, Expect::Eopnotsupp),
            (Cmd::Disconnect, Expect::Eopnotsupp),
            (Cmd::MrReg, Expect::Eopnotsupp),
        ] {
            assert!(
                ops.iter()
                    .any(|o| o.act == Act::Ioctl(cmd) && o.expect == x),
                "no {} expecting {}",
                cmd.name(),
                x.name()
            );
        }
        // fork mid-sequence, and signals in calls that sleep (some of them
        // GET_EVENT waiting for ever on a blocking file).
        let ops: Vec<Op> = a.iter().map(|l| Op::parse(l).unwrap()).collect();
        let forks = ops.iter().filter(|o| o.act == Act::Fork).count();
        assert!(forks >= 5, "{forks} forks");
        let signalled: Vec<&Op> = ops.iter().filter(|o| o.sig.is_some()).collect();
        assert!(signalled.len() >= 20, "{} signalled calls", signalled.len());
        for o in &signalled {
            assert!(
                matches!(o.act, Act::Ioctl(c) if c.may_block()),
                "{}",
                o.line()
            );
        }
        assert!(signalled.iter().any(|o| o.act == Act::Ioctl(Cmd::GetEvent)
            && o.v[0] == u64::from(RDMA_CM_RS_TIMEOUT_INFINITE)));
        assert!(signalled.iter().any(|o| o.act == Act::Ioctl(Cmd::Recv)));
        // Ids bound to and resolving the siw device's address.
        assert!(ops
            .iter()
            .any(|o| o.act == Act::Ioctl(Cmd::Bind) && o.raw.is_none() && o.v[1] == 2));
        assert!(ops
            .iter()
            .any(|o| o.act == Act::Ioctl(Cmd::ResolveAddr) && o.raw.is_none() && o.v[1] == 5));
        for l in &a {
            assert_eq!(Op::parse(l).map(|o| o.line()).as_deref(), Some(l.as_str()));
        }
        // The actors: peers spawned and killed (some right after the
        // spawn, some much later), the link deleted and added in turn.
        let actor = |role: Role, seed: u64| -> Vec<Op> {
            let mut w = Worker::new(3, seed, sh()).unwrap();
            w.role = role;
            (0..300).map(|_| w.gen()).collect()
        };
        let peers = actor(Role::Peers, 5);
        assert_eq!(
            peers.iter().map(Op::line).collect::<Vec<_>>(),
            actor(Role::Peers, 5)
                .iter()
                .map(Op::line)
                .collect::<Vec<_>>()
        );
        let mut live = [false; 3];
        let (mut early, mut late) = (0, 0);
        for o in &peers {
            let Act::Peer { kill } = o.act else {
                panic!("{}", o.line())
            };
            let slot = o.f as usize;
            assert!(slot < 3 && live[slot] == kill, "{}", o.line());
            live[slot] = !kill;
            if !kill {
                assert_ne!(o.v[2], 0, "{}", o.line());
            } else if o.v[0] < 100 {
                early += 1;
            } else if o.v[0] >= 3000 {
                late += 1;
            }
        }
        assert!(
            early >= 10 && late >= 10,
            "kills: {early} early, {late} late"
        );
        let link = actor(Role::Link, 5);
        for (i, o) in link.iter().enumerate() {
            assert_eq!(o.act, Act::Link { add: i % 2 == 1 }, "{}", o.line());
        }
        for o in peers.iter().chain(&link) {
            assert_eq!(Op::parse(&o.line()).as_ref(), Some(o));
        }
    }

    #[test]
    fn another_files_id_of_the_same_handle_is_this_files() {
        let mut sh = Shared::new(OptionsLite::test(), 1, None);
        sh.quiet = true;
        let mut w = Worker::new(0, 1, Arc::new(sh)).unwrap();
        for handles in [[1, 2], [1, 3]] {
            w.files.push(FileRec {
                fds: vec![100],
                ids: handles
                    .iter()
                    .map(|&h| IdRec::new(h, true, St::Idle))
                    .collect(),
                ..Default::default()
            });
        }
        let mut op = Op::new(0, 0, Act::Ioctl(Cmd::Connect));
        // File 1's second id is handle 3, which file 0 does not have.
        op.id = IdRef::Other(1, 1);
        assert!(w.as_own_id(&op).is_none());
        // File 1's first id is handle 1: in file 0, its first id.
        op.id = IdRef::Other(1, 0);
        assert_eq!(w.as_own_id(&op).map(|o| o.id), Some(IdRef::Slot(0)));
        op.id = IdRef::Raw(2);
        assert_eq!(w.as_own_id(&op).map(|o| o.id), Some(IdRef::Slot(1)));
        op.id = IdRef::Raw(7);
        assert!(w.as_own_id(&op).is_none());
        op.id = IdRef::Slot(1);
        assert!(w.as_own_id(&op).is_none());
    }

    #[test]
    fn the_oracle_follows_the_abi() {
        assert!(judge(Cmd::CreateId, Expect::Any, Err(libc::EIO), false).is_some());
        assert!(judge(Cmd::Send, Expect::Any, Err(libc::EIO), false).is_none());
        assert!(judge(Cmd::Bind, Expect::Fail, Ok(()), false).is_some());
        assert!(judge(Cmd::Bind, Expect::Enotty, Err(libc::EINVAL), false).is_some());
        assert!(judge(Cmd::Bind, Expect::Efault, Err(libc::EFAULT), false).is_none());
        assert!(judge(Cmd::Query, Expect::Any, Err(libc::EPERM), false).is_some());
        // EINTR: only a call that sleeps, and only when it was signalled.
        for cmd in [
            Cmd::GetEvent,
            Cmd::Recv,
            Cmd::Send,
            Cmd::MrReg,
            Cmd::MrDereg,
            Cmd::Rdma,
        ] {
            assert!(judge(cmd, Expect::Any, Err(libc::EINTR), true).is_none());
            assert!(judge(cmd, Expect::Fail, Err(libc::EINTR), true).is_none());
            assert!(judge(cmd, Expect::Any, Err(libc::EINTR), false).is_some());
        }
        assert!(judge(Cmd::Query, Expect::Any, Err(libc::EINTR), true).is_some());
        for cmd in [Cmd::UdSend, Cmd::UdRecv] {
            assert!(judge(cmd, Expect::Any, Err(libc::EINTR), true).is_none());
            assert!(judge(cmd, Expect::Any, Err(libc::EINTR), false).is_some());
        }
        // The exact errnos: the one named (ENOENT too where the id may be
        // gone), never success, never another.
        let ok = |x, e| judge(Cmd::UdSend, x, Err(e), false).is_none();
        assert!(ok(Expect::Einval, libc::EINVAL));
        assert!(!ok(Expect::Einval, libc::ENOENT));
        assert!(ok(Expect::Eopnotsupp, libc::EOPNOTSUPP));
        assert!(ok(Expect::Eopnotsupp, libc::ENOENT));
        assert!(!ok(Expect::Eopnotsupp, libc::ENOTCONN));
        assert!(ok(Expect::Enotconn, libc::ENOTCONN));
        assert!(!ok(Expect::Enotconn, libc::EINVAL));
        assert!(ok(Expect::Emsgsize, libc::EMSGSIZE));
        assert!(ok(Expect::Emsgsize, libc::ENOTCONN));
        assert!(!ok(Expect::Emsgsize, libc::EINVAL));
        for x in [
            Expect::Einval,
            Expect::Eopnotsupp,
            Expect::Enotconn,
            Expect::Emsgsize,
        ] {
            assert!(judge(Cmd::UdRecv, x, Ok(()), false).is_some());
            assert!(judge(Cmd::UdRecv, x, Err(libc::EINTR), true).is_some());
        }
        assert!(Cmd::Disconnect.rc_only() && !Cmd::UdSend.rc_only());
        assert_eq!(Cmd::from_name("UD_RECV"), Some(Cmd::UdRecv));
        assert_eq!(Cmd::UdSend.number(), IOC_UD_SEND);
        // ERESTARTSYS must never reach user space.
        assert!(judge(Cmd::GetEvent, Expect::Any, Err(512), true).is_some());
        assert_eq!(errno_name(libc::ENOTTY), "ENOTTY");
    }

    #[test]
    fn a_signal_interrupts_only_the_call_it_is_aimed_at() {
        // A pipe read with nothing to read sleeps like GET_EVENT: the
        // signaller's SIG ends it with EINTR, and nothing is left pending.
        install_signal_handler().unwrap();
        let sh = Arc::new(Shared::new(OptionsLite::test(), 1, None));
        let s2 = sh.clone();
        let signaller = std::thread::spawn(move || s2.signals.run());
        let t = std::thread::spawn(move || {
            block_signal(true);
            let mut p = [0i32; 2];
            // SAFETY: room for two descriptors.
            assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
            let token = sh.signals.arm(5);
            block_signal(false);
            let mut b = [0u8; 1];
            let start = Instant::now();
            // SAFETY: a one-byte read into `b`.
            let r = unsafe { libc::read(p[0], b.as_mut_ptr().cast(), 1) };
            let e = std::io::Error::last_os_error().raw_os_error();
            block_signal(true);
            assert!(sh.signals.disarm(token) >= 1);
            drain_signal();
            assert_eq!((r, e), (-1, Some(libc::EINTR)));
            assert!(start.elapsed() < Duration::from_secs(5));
            // SAFETY: our descriptors.
            unsafe {
                libc::close(p[0]);
                libc::close(p[1]);
            }
            sh.signals.finish();
        });
        t.join().unwrap();
        signaller.join().unwrap();
    }
}
