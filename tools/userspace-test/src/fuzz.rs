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
//! path, dup() and close() mid-sequence.
//!
//! Every operation is one trace line (`--trace FILE` writes them all,
//! `--replay FILE` runs such a file again).  The user-space oracle: each
//! command's errno must be one the ABI allows for it, a call the ABI must
//! refuse must fail, events must name ids the file was given and did not
//! destroy, and no call may take longer than `--hang-secs`.  On a finding
//! the seed, the last operations and the shortest failing prefix of the
//! trace (bisected by replay) are printed.  Kernel reports (the dmesg gate,
//! kmemleak) are the VM runner's job: a clean run exits 0.

use anyhow::{bail, Context, Result};
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    ffi::CString,
    fmt::Write as _,
    io::{BufRead, BufReader, BufWriter, Write},
    mem::size_of,
    net::Ipv4Addr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::report::{EV_CONNECT_RESPONSE, EV_DEVICE_REMOVAL};
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
}

const CMDS: [(Cmd, &str, u32); 21] = [
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
];

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
}

const EXPECTS: [(Expect, &str); 4] = [
    (Expect::Any, "any"),
    (Expect::Fail, "fail"),
    (Expect::Enotty, "enotty"),
    (Expect::Efault, "efault"),
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
    Open { nonblock: bool },
    Close,
    Dup,
    Ioctl(Cmd),
}

/// One operation: one trace line.  `v` holds the command's parameters
/// (see `build`), `raw` a command number that replaces the right one.
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
            name => Op::new(t, f, Act::Ioctl(Cmd::from_name(name)?)),
        };
        op.fd = fd;
        let rest: HashMap<&str, &str> = words.filter_map(|w| w.split_once('=')).collect();
        match op.act {
            Act::Open { .. } => {
                op.act = Act::Open {
                    nonblock: *rest.get("nb")? == "1",
                }
            }
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
            }
            _ => {}
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
    libc::EINTR,
    libc::EISCONN,
    libc::EALREADY,
    libc::ENODATA,
    libc::EPROTONOSUPPORT,
    libc::ECONNRESET,
    libc::ENOBUFS,
];

fn errno_ok(cmd: Cmd, e: i32) -> bool {
    ALLOWED.contains(&e) || (e == libc::EIO && cmd.may_eio())
}

/// `None` if the result is what the ABI allows, else why not.
fn judge(cmd: Cmd, expect: Expect, r: std::result::Result<(), i32>) -> Option<String> {
    match (expect, r) {
        (Expect::Enotty, Err(libc::ENOTTY)) | (Expect::Efault, Err(libc::EFAULT)) => None,
        (Expect::Enotty | Expect::Efault, r) => Some(format!(
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
        (_, Err(e)) if errno_ok(cmd, e) => None,
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
    findings: Mutex<Vec<String>>,
    /// Per thread: start of the running call (ms since `t0`, 0 = idle) and
    /// its trace line.
    busy: Vec<(AtomicU64, Mutex<String>)>,
    t0: Instant,
    files_opened: AtomicU64,
    /// Regions registered by any thread: RDMA targets (addr, rkey, len).
    regions: Mutex<Vec<(u64, u32, u32)>>,
    quiet: bool,
}

#[derive(Clone)]
struct OptionsLite {
    local: Ipv4Addr,
    port_base: u16,
    files: u32,
    keep_going: bool,
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
    fn log(&self, line: &str) {
        let mut t = self.trace.lock().unwrap();
        if let Some(f) = t.file.as_mut() {
            let _ = writeln!(f, "{line}");
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
        }
        let mut f = self.findings.lock().unwrap();
        f.push(what);
        if !self.opts.keep_going {
            self.stop.store(true, Ordering::SeqCst);
        }
    }
}

// ---------------------------------------------------------------------------
// Memory the hostile pointers point at.

struct Scratch {
    /// Two pages: read-write, then PROT_NONE.
    guard: usize,
    page: usize,
    /// The argument structure (16 KiB + slack, so a wrong size stays inside).
    arg: Vec<u64>,
    /// Data buffers of SEND/RECV/MR_WRITE/MR_READ (2 MiB, larger than any
    /// region, so a read the kernel bounds by the region stays inside).
    data: Vec<u8>,
}

const DATA_LEN: usize = 2 << 20;

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
    /// Gone without DESTROY_ID (device removal).
    Gone,
}

#[derive(Clone, Debug)]
struct IdRec {
    handle: u32,
    ud: bool,
    st: St,
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

struct Worker {
    t: u32,
    rng: Rng,
    files: Vec<FileRec>,
    sh: Arc<Shared>,
    mem: Scratch,
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
            rng: Rng::new(seed ^ (u64::from(t) + 1).wrapping_mul(0xa076_1d64_78bd_642f)),
            files: Vec::new(),
            sh,
            mem: Scratch::new()?,
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
        let mut op = self.gen_ioctl(f);
        op.fd = self.rng.below(nfds) as u32;
        if self.rng.pct(12) {
            self.mutate(&mut op);
        }
        op
    }

    fn gen_ioctl(&mut self, f: u32) -> Op {
        let t = self.t;
        let ids = self.files[f as usize].ids.clone();
        let live: Vec<usize> = (0..ids.len())
            .filter(|&i| !matches!(ids[i].st, St::Destroyed | St::Gone))
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
        // Ids with a next step count more.
        let weights: Vec<u64> = live
            .iter()
            .map(|&i| match ids[i].st {
                St::Down | St::Listening => 1,
                _ => 4,
            })
            .collect();
        let slot = live[self.rng.weighted(&weights)];
        let rec = ids[slot].clone();
        let id = IdRef::Slot(slot as u32);
        let ud = rec.ud;
        use Cmd::*;
        let choices: &[(Cmd, u64)] = match rec.st {
            St::Idle => &[
                (ResolveAddr, 55),
                (Bind, 25),
                (SetOption, 8),
                (Query, 4),
                (DestroyId, 4),
                (Connect, 2),
                (Listen, 2),
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
            ],
            St::AddrResolved => &[
                (ResolveRoute, 75),
                (Connect, 6),
                (SetOption, 5),
                (Query, 5),
                (DestroyId, 5),
                (Listen, 4),
            ],
            St::RouteResolved => &[(Connect, 85), (Query, 5), (DestroyId, 5), (Send, 5)],
            St::Connecting if ud => &[
                (Send, 55),
                (GetEvent, 20),
                (Recv, 5),
                (MrReg, 5),
                (Disconnect, 5),
                (DestroyId, 5),
                (Rdma, 5),
            ],
            St::Connecting => &[
                (GetEvent, 45),
                (Send, 20),
                (Recv, 10),
                (Disconnect, 10),
                (DestroyId, 10),
                (MrReg, 5),
            ],
            St::Connected if ud => &[
                (Send, 50),
                (Recv, 10),
                (MrReg, 10),
                (Rdma, 10),
                (Disconnect, 5),
                (DestroyId, 10),
                (Query, 5),
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
            ],
            St::Listening => &[
                (GetEvent, 70),
                (Query, 10),
                (DestroyId, 10),
                (SetOption, 10),
            ],
            St::Requested => &[
                (Accept, 55),
                (Reject, 25),
                (DestroyId, 10),
                (GetEvent, 5),
                (Query, 5),
            ],
            St::Down | St::Destroyed | St::Gone => &[
                (DestroyId, 45),
                (Disconnect, 10),
                (Send, 10),
                (Recv, 10),
                (GetEvent, 20),
                (Query, 5),
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
                v[1] = if self.rng.pct(85) { 0 } else { 1 }; // local / any
            }
            Cmd::ResolveAddr => {
                v[0] = self.port();
                v[1] = 0;
                v[2] = self.rng.range(100, 2000);
                v[3] = u64::from(self.rng.pct(15)); // a source address
            }
            Cmd::ResolveRoute => v[2] = self.rng.range(100, 2000),
            Cmd::Listen => v[0] = self.rng.range(1, 8),
            Cmd::Connect => {
                // The old module held UD connects to the RC limit (56):
                // most UD connects stay there.
                v[0] = if rec.ud && self.rng.pct(30) {
                    self.rng.range(0, 180)
                } else {
                    self.rng.range(0, 56)
                };
                v[1] = self.rng.range(0, 2);
                v[2] = self.rng.range(0, 2);
                v[3] = self.rng.range(0, 7);
                v[4] = self.rng.range(0, 7);
            }
            Cmd::Accept => {
                v[5] = u64::from(self.rng.pct(50)); // ACCEPT_REQUEST_PARAM
                v[0] = self.rng.range(0, 196);
                v[1] = self.rng.range(0, 2);
                v[2] = self.rng.range(0, 2);
                v[3] = self.rng.range(0, 7);
                v[4] = 7;
            }
            Cmd::Reject => {
                v[0] = self.rng.range(0, 148);
                v[1] = if self.rng.pct(50) {
                    0
                } else {
                    self.rng.below(40)
                };
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
        op
    }

    /// One hostile change to a plausible call.
    fn mutate(&mut self, op: &mut Op) {
        let Act::Ioctl(cmd) = op.act else { return };
        let right = cmd.number();
        let size = (right >> 16) & 0x3fff;
        match self.rng.below(12) {
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
                op.raw = Some((right & !(0x3fff << 16)) | (other << 16));
                op.expect = Expect::Enotty;
            }
            1 => {
                let dir = right >> 30;
                let other = (dir + 1 + self.rng.below(3) as u32) % 4;
                op.raw = Some((right & 0x3fff_ffff) | (other << 30));
                op.expect = Expect::Enotty;
            }
            2 => {
                let nr = self.rng.range(0x15, 0xff) as u32;
                op.raw = Some((right & !0xff) | nr);
                if self.rng.pct(30) {
                    // Another type, the right number.
                    op.raw = Some((right & !0xff00) | (0xd8 << 8));
                }
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
                        Cmd::Listen => {
                            op.v[0] = if self.rng.pct(50) {
                                0
                            } else {
                                1025 + self.rng.below(1 << 20)
                            }
                        }
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
            8 => {
                // A bad data buffer.
                if matches!(cmd, Cmd::Send | Cmd::Recv | Cmd::MrWrite | Cmd::MrRead) {
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
                    Cmd::Recv => op.v[0] = huge,
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
                // The RC data path on a UD id, whatever the state.
                let f = &self.files[op.f as usize];
                let uds: Vec<u32> = (0..f.ids.len() as u32)
                    .filter(|&n| f.ids[n as usize].ud && f.ids[n as usize].st != St::Destroyed)
                    .collect();
                if !uds.is_empty() {
                    let n = uds[self.rng.below(uds.len() as u64) as usize];
                    op.act = Act::Ioctl(Cmd::Send);
                    op.id = IdRef::Slot(n);
                    op.raw = None;
                    op.v = [
                        self.rng.range(1, 512),
                        0,
                        self.rng.range(1, 200),
                        0,
                        0,
                        0,
                        0,
                        0,
                    ];
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
                let r = self.ioctl_op(fd, cmd, op);
                self.sh.count(cmd, r);
                if let Some(why) = judge(cmd, op.expect, r) {
                    self.sh.finding(format!("{why} [{line}]"));
                }
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
        macro_rules! call {
            ($val:expr, $ty:ty) => {{
                let val: $ty = $val;
                let arg = place(mem, &val, p);
                let r = ioctl(fd, number, arg);
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
            Cmd::Info => call!(Default::default(), rdma_cm_rs_info).0,
            Cmd::CreateId => {
                let (r, out) = call!(
                    rdma_cm_rs_create_id {
                        context: v[0],
                        port_space: v[1] as u32,
                        qp_type: v[2] as u32,
                        id: if res != 0 { 7 } else { 0 },
                        reserved: (res >> 32) as u32,
                    },
                    rdma_cm_rs_create_id
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    if out.id == 0 {
                        self.sh.finding("CREATE_ID returned id 0".into());
                    }
                    self.files[op.f as usize].ids.push(IdRec {
                        handle: out.id,
                        ud: v[2] == u64::from(RDMA_CM_RS_QPT_UD),
                        st: St::Idle,
                    });
                }
                r
            }
            Cmd::DestroyId | Cmd::Disconnect => {
                let (r, _) = call!(
                    rdma_cm_rs_id_cmd {
                        id,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_id_cmd
                );
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
                    _ => rdma_cm_rs_sockaddr { bytes: [0; 128] },
                };
                let src = if v[3] != 0 {
                    sockaddr4(local, 0)
                } else {
                    rdma_cm_rs_sockaddr { bytes: [0; 128] }
                };
                let (r, _) = call!(
                    rdma_cm_rs_resolve_addr {
                        id,
                        timeout_ms: v[2] as u32,
                        src,
                        dst,
                    },
                    rdma_cm_rs_resolve_addr
                );
                if real && r.is_ok() {
                    self.set_state(op, St::AddrQuery);
                }
                r
            }
            Cmd::ResolveRoute => {
                let (r, _) = call!(
                    rdma_cm_rs_resolve_route {
                        id,
                        timeout_ms: v[2] as u32,
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
                }
                r
            }
            Cmd::Connect => {
                let (r, _) = call!(
                    rdma_cm_rs_connect {
                        id,
                        reserved: if res != 0 { res as u32 | 1 } else { 0 },
                        param: param(&v, res >> 32),
                    },
                    rdma_cm_rs_connect
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Connecting);
                }
                r
            }
            Cmd::Accept => {
                let (r, _) = call!(
                    rdma_cm_rs_accept {
                        id,
                        flags: (v[5] as u32) | if res != 0 { 0x80 } else { 0 },
                        param: param(&v, 0),
                    },
                    rdma_cm_rs_accept
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Connecting);
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
                q.reserved[(res % 4) as usize] = res;
                call!(q, rdma_cm_rs_query).0
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
                        reserved: res as u32 | (res >> 32) as u32,
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

    fn on_event(&mut self, f: usize, ev: &rdma_cm_rs_event) {
        let rec = &mut self.files[f];
        let Some(slot) = rec.slot_of(ev.id) else {
            self.sh.finding(format!(
                "GET_EVENT: event {} names id {} this file was never given",
                event_name(ev.event),
                ev.id
            ));
            return;
        };
        if rec.ids[slot].st == St::Destroyed {
            self.sh.finding(format!(
                "GET_EVENT: event {} for id {} after DESTROY_ID returned",
                event_name(ev.event),
                ev.id
            ));
            return;
        }
        let st = match ev.event {
            EV_ADDR_RESOLVED => St::AddrResolved,
            EV_ROUTE_RESOLVED => St::RouteResolved,
            EV_ESTABLISHED => St::Connected,
            EV_CONNECT_REQUEST => {
                let ud = rec.ids[slot].ud;
                if ev.new_id == 0 || rec.slot_of(ev.new_id).is_some() {
                    self.sh.finding(format!(
                        "GET_EVENT: CONNECT_REQUEST with new_id {} (zero or in use)",
                        ev.new_id
                    ));
                    return;
                }
                rec.ids.push(IdRec {
                    handle: ev.new_id,
                    ud,
                    st: St::Requested,
                });
                return;
            }
            EV_DEVICE_REMOVAL => St::Gone,
            EV_TIMEWAIT_EXIT | EV_CONNECT_RESPONSE => return,
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

fn run_once(
    o: &Options,
    script: Option<Vec<Vec<Op>>>,
    quiet: bool,
    trace_file: Option<&str>,
) -> Result<(Outcome, Arc<Shared>)> {
    let threads = script.as_ref().map_or(o.threads, |s| s.len() as u32);
    let sh = Arc::new(Shared {
        opts: OptionsLite {
            local: o.local,
            port_base: o.port_base,
            files: o.files,
            keep_going: o.keep_going,
        },
        stop: AtomicBool::new(false),
        trace: Mutex::new(TraceSink {
            file: match trace_file {
                Some(p) => Some(BufWriter::new(
                    std::fs::File::create(p).with_context(|| format!("create {p}"))?,
                )),
                None => None,
            },
            tail: VecDeque::new(),
            all: Vec::new(),
            all_complete: true,
        }),
        counts: Mutex::new(BTreeMap::new()),
        findings: Mutex::new(Vec::new()),
        busy: (0..threads)
            .map(|_| (AtomicU64::new(0), Mutex::new(String::new())))
            .collect(),
        t0: Instant::now(),
        files_opened: AtomicU64::new(0),
        regions: Mutex::new(Vec::new()),
        quiet,
    });
    let deadline = Instant::now() + Duration::from_secs(o.seconds);
    let per_thread = o.ops.map(|n| n.div_ceil(u64::from(threads)));
    let ops_done = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let mut script = script.map(|s| s.into_iter());
    for t in 0..threads {
        let mut w = Worker::new(t, o.seed, sh.clone())?;
        let ops = script.as_mut().map(|s| s.next().unwrap_or_default());
        let done = ops_done.clone();
        handles.push(std::thread::spawn(move || {
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
            w.close_all();
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
        "# fuzz: seed {} ({} s{}, {} threads, {} files each, {}:{}..{})",
        o.seed,
        o.seconds,
        o.ops
            .map_or(String::new(), |n| format!(", at most {n} ops")),
        o.threads,
        o.files,
        o.local,
        o.port_base,
        o.port_base + 11
    );
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
    let threads = script.as_ref().map_or(o.threads, |s| s.len() as u32);
    let (out, sh) = run_once(&o, script, false, o.trace.as_deref())?;
    summary(&sh, &out, threads);
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
        // The stuck call cannot be cancelled: no shrink, end the process.
        println!("# fuzz: a call hangs; not shrinking");
        std::io::stdout().flush()?;
        std::process::exit(3);
    }
    match out.all {
        Some(all) if !all.is_empty() => shrink(&o, &all)?,
        _ => println!("# fuzz: trace too long to keep in memory: not shrinking"),
    }
    bail!("fuzz: {} finding(s), seed {}", out.findings.len(), o.seed)
}

/// Bisects on the trace's length for the shortest prefix that still fails
/// when replayed (best effort: the kernel's timing is not replayed).
fn shrink(o: &Options, all: &[String]) -> Result<()> {
    let fails = |n: usize| -> Result<bool> {
        let script = script_of(&all[..n])?;
        let (out, _) = run_once(o, Some(script), true, None)?;
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
        for op in [
            op.clone(),
            Op::new(0, 0, Act::Open { nonblock: true }),
            Op::new(0, 5, Act::Close),
            Op::new(3, 1, Act::Dup),
            Op::new(0, 1, Act::Ioctl(Cmd::GetEvent)),
        ] {
            let l = op.line();
            assert_eq!(Op::parse(&l), Some(op), "{l}");
        }
        assert_eq!(IdRef::parse("#3"), Some(IdRef::Slot(3)));
        assert_eq!(IdRef::parse("4294967295"), Some(IdRef::Raw(u32::MAX)));
        assert!(Op::parse("t=0 f=0 fd=0 NOPE").is_none());
    }

    #[test]
    fn generation_is_deterministic_and_covers_the_abi() {
        // Without a device: generate from a model that pretends every call
        // succeeded in the plausible direction.
        let sh = |seed| {
            Arc::new(Shared {
                opts: OptionsLite {
                    local: Ipv4Addr::new(192, 0, 2, 1),
                    port_base: 7600,
                    files: 3,
                    keep_going: true,
                },
                stop: AtomicBool::new(false),
                trace: Mutex::new(TraceSink {
                    file: None,
                    tail: VecDeque::new(),
                    all: Vec::new(),
                    all_complete: true,
                }),
                counts: Mutex::new(BTreeMap::new()),
                findings: Mutex::new(Vec::new()),
                busy: vec![(AtomicU64::new(seed), Mutex::new(String::new()))],
                t0: Instant::now(),
                files_opened: AtomicU64::new(0),
                regions: Mutex::new(Vec::new()),
                quiet: true,
            })
        };
        let gen = |seed: u64| -> Vec<String> {
            let mut w = Worker::new(0, seed, sh(seed)).unwrap();
            let mut lines = Vec::new();
            for step in 0..5000u32 {
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
                                f.ids.push(IdRec {
                                    handle: step + 1,
                                    ud: op.v[2] == u64::from(RDMA_CM_RS_QPT_UD),
                                    st: St::Idle,
                                });
                                None
                            }
                            Cmd::Bind => Some(St::Bound),
                            Cmd::ResolveAddr => Some(St::AddrResolved),
                            Cmd::ResolveRoute => Some(St::RouteResolved),
                            Cmd::Connect => Some(St::Connected),
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
        for l in &a {
            assert_eq!(Op::parse(l).map(|o| o.line()).as_deref(), Some(l.as_str()));
        }
    }

    #[test]
    fn the_oracle_follows_the_abi() {
        assert!(judge(Cmd::CreateId, Expect::Any, Err(libc::EIO)).is_some());
        assert!(judge(Cmd::Send, Expect::Any, Err(libc::EIO)).is_none());
        assert!(judge(Cmd::Bind, Expect::Fail, Ok(())).is_some());
        assert!(judge(Cmd::Bind, Expect::Enotty, Err(libc::EINVAL)).is_some());
        assert!(judge(Cmd::Bind, Expect::Efault, Err(libc::EFAULT)).is_none());
        assert!(judge(Cmd::Query, Expect::Any, Err(libc::EPERM)).is_some());
        assert_eq!(errno_name(libc::ENOTTY), "ENOTTY");
    }
}
