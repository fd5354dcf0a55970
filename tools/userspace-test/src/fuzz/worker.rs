// SPDX-License-Identifier: GPL-2.0

//! The model of each file's ids and regions, and the worker thread that
//! drives them.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// What a thread believes about its files.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum St {
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
pub(super) struct IdRec {
    pub(super) handle: u32,
    pub(super) ud: bool,
    pub(super) st: St,
    /// The port the id bound on the local address or any (0: none): RC
    /// listeners' for the peers, UD listeners' for the SIDR lookups.
    pub(super) port: u16,
    /// UD: the peer handles the id gave (its ESTABLISHED event's, every
    /// UD_RECV's sender), in the order they came.
    pub(super) peers: Vec<u32>,
    /// UD: `max_datagram` as QUERY reported it (0: not known yet).
    pub(super) max_dg: u32,
    /// A CONNECT or ACCEPT of it succeeded: it has its QP until destroyed.
    /// (Not the state: an event read late, of a resolve before the
    /// CONNECT, moves the model's state back.)
    pub(super) qp: bool,
    /// UD: its SIDR lookup failed (UNREACHABLE, REJECTED, CONNECT_ERROR
    /// after its CONNECT) or it was rejected: UD_SEND is `ENOTCONN` until
    /// a CONNECT succeeds (seed 2, 2026-11-28: a UD id looked up again
    /// after a REJECTED sent to its earlier peer, as the module allows).
    pub(super) dead: bool,
}

impl IdRec {
    pub(super) fn new(handle: u32, ud: bool, st: St) -> Self {
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
pub(super) struct MrRec {
    pub(super) id: u32,
    pub(super) handle: u32,
    pub(super) len: u32,
    pub(super) alive: bool,
}

#[derive(Default)]
pub(super) struct FileRec {
    pub(super) fds: Vec<i32>,
    pub(super) nonblock: bool,
    pub(super) ids: Vec<IdRec>,
    pub(super) mrs: Vec<MrRec>,
    /// Close this file soon: it holds a UD id that was sent on.
    pub(super) close_soon: bool,
}

impl FileRec {
    pub(super) fn open(&self) -> bool {
        !self.fds.is_empty()
    }
    pub(super) fn slot_of(&self, handle: u32) -> Option<usize> {
        self.ids.iter().position(|i| i.handle == handle)
    }
}

/// What a thread generates (a replay runs whatever its lines say).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    Ioctl,
    Peers,
    Link,
}

pub(super) struct Worker {
    pub(super) t: u32,
    pub(super) role: Role,
    pub(super) rng: Rng,
    pub(super) files: Vec<FileRec>,
    pub(super) sh: Arc<Shared>,
    pub(super) mem: Scratch,
    pub(super) mode: Mode,
    /// The peer actor's processes by slot.
    pub(super) peers: Vec<Option<PeerProc>>,
    /// The peer actor's generator: the slots it filled, the last spawned.
    pub(super) gen_peers: Vec<bool>,
    pub(super) last_spawn: Option<u32>,
    /// The link actor deleted the device and did not add it back.
    pub(super) link_deleted: bool,
    pub(super) gen_link_deleted: bool,
    /// The actor's pause before its current step ran in full (the run is
    /// not ending).
    pub(super) paused: bool,
    /// Generating a fork child's calls: all from the model as it is before
    /// the first of them runs, so no expectation may rest on an id's state
    /// (an earlier call of the child may change it).
    pub(super) gen_child: bool,
}

pub(super) fn sockaddr4(ip: Ipv4Addr, port: u16) -> rdma_cm_rs_sockaddr {
    sockaddr(&std::net::SocketAddr::from((ip, port)))
}

/// Writes `v` at the start of the argument buffer and returns the pointer
/// the ioctl gets.
pub(super) fn place<T: Copy>(mem: &mut Scratch, v: &T, p: Ptr) -> u64 {
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
pub(super) fn fetch<T: Copy>(mem: &Scratch) -> T {
    // SAFETY: as in `place`.
    unsafe { std::ptr::read(mem.arg.as_ptr().cast::<T>()) }
}

pub(super) fn ioctl(fd: i32, cmd: u32, arg: u64) -> std::result::Result<(), i32> {
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
pub(super) const RESERVED: usize = 7;

impl Worker {
    pub(super) fn new(t: u32, seed: u64, sh: Arc<Shared>) -> Result<Self> {
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

    pub(super) fn port(&mut self) -> u64 {
        u64::from(self.sh.opts.port_base) + self.rng.below(12)
    }

    // --- generation ----------------------------------------------------------

    pub(super) fn open_files(&self) -> Vec<u32> {
        (0..self.files.len() as u32)
            .filter(|&f| self.files[f as usize].open())
            .collect()
    }
}
