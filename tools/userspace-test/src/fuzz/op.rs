// SPDX-License-Identifier: GPL-2.0

//! Operations and the trace format: commands, pointers, expectations, ids,
//! actions, and one line per operation.

#[allow(unused_imports)]
use super::*;

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
    JoinMcast,
    LeaveMcast,
    SendRecv,
}

pub(super) const CMDS: [(Cmd, &str, u32); 26] = [
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
    (Cmd::JoinMcast, "JOIN_MCAST", IOC_JOIN_MCAST),
    (Cmd::LeaveMcast, "LEAVE_MCAST", IOC_LEAVE_MCAST),
    (Cmd::SendRecv, "SEND_RECV", IOC_SEND_RECV),
];

/// Every command number of the uapi (`uapi.rs`), those the generator does
/// not drive (`GET_REQUEST`, `GETADDRINFO`) included: a "wrong" number the generator makes
/// must be none of them (seed 2 made GET_EVENT's `0xc148_d70d` into
/// `0xc148_d717`, GET_REQUEST, and wanted `ENOTTY` of it).  A test checks
/// the list against the header's `RDMA_CM_RS_IOC_*` lines.
pub(super) const REAL_IOCTLS: [u32; 28] = [
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
    IOC_GETADDRINFO,
    IOC_JOIN_MCAST,
    IOC_LEAVE_MCAST,
    IOC_SEND_RECV,
];

/// JOIN_MCAST's `v[0]` for the local unicast address instead of a group.
pub(super) const MCAST_UNICAST: u64 = 100;
/// JOIN_MCAST's `v[0]` for an IPv6 group.
pub(super) const MCAST_IPV6: u64 = 200;

/// The group (or address) JOIN_MCAST and LEAVE_MCAST name by `v[0]`:
/// groups 0-4 are thread `t`'s own.
pub(super) fn mcast_group(t: u32, n: u64, local: std::net::Ipv4Addr) -> rdma_cm_rs_sockaddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let ip = match n {
        MCAST_UNICAST => IpAddr::V4(local),
        MCAST_IPV6 => IpAddr::V6(Ipv6Addr::new(0xff0e, 0, 0, 0, 0, 0x77, t as u16, 1)),
        n => IpAddr::V4(Ipv4Addr::new(239, 77, t as u8, n as u8)),
    };
    sockaddr(&SocketAddr::new(ip, 0))
}

/// Whether `n` is a command of the ABI.
pub(super) fn is_real_ioctl(n: u32) -> bool {
    REAL_IOCTLS.contains(&n)
}

impl Cmd {
    pub fn name(self) -> &'static str {
        CMDS[self as usize].1
    }
    pub fn number(self) -> u32 {
        CMDS[self as usize].2
    }
    pub(super) fn from_name(s: &str) -> Option<Self> {
        CMDS.iter().find(|c| c.1 == s).map(|c| c.0)
    }
    /// Whether the CM or the data path may answer `EIO` (a plain
    /// bookkeeping command may not).
    pub(super) fn may_eio(self) -> bool {
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
    pub(super) fn may_block(self) -> bool {
        matches!(
            self,
            Cmd::GetEvent
                | Cmd::Send
                | Cmd::Recv
                | Cmd::SendRecv
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
    pub(super) fn rc_only(self) -> bool {
        matches!(
            self,
            Cmd::Send
                | Cmd::Recv
                | Cmd::SendRecv
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

pub(super) const PTRS: [(Ptr, &str); 5] = [
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

pub(super) const EXPECTS: [(Expect, &str); 8] = [
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
    pub(super) fn name(self) -> &'static str {
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
    pub(super) fn parse(s: &str) -> Option<Self> {
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
    pub(super) fn new(t: u32, f: u32, act: Act) -> Self {
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

pub(super) fn parse_num(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}
