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
//!   while connected.  With `--nvmet-port`, the run loads the NVMe over
//!   Fabrics target sample there, and half the peers are instead NVMe
//!   hosts of it that send seeded, mostly malformed capsules (`capsule.rs`);
//!   after the run the target must still serve a good host.
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
    /// The NVMe target sample's port: the run loads it there, and some
    /// peers run capsule sessions against it ([`capsule`]).
    pub nvmet_port: Option<u16>,
}

mod actors;
mod capsule;
mod child;
mod exec;
mod gen;
mod ioctl;
mod model;
mod op;
mod oracle;
mod rng;
mod run;
mod scratch;
mod shared;
mod signal;
#[cfg(test)]
mod tests;
mod worker;

pub use self::{actors::peer, oracle::errno_name, run::run};
#[allow(unused_imports)]
use self::{
    actors::*, child::*, exec::*, gen::*, ioctl::*, model::*, op::*, oracle::*, rng::*, run::*,
    scratch::*, shared::*, signal::*, worker::*,
};
