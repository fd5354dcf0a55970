// SPDX-License-Identifier: GPL-2.0
//! A host of the `rdma_cm_rs_nvmet` sample (the NVMe over Fabrics RDMA
//! target, `samples/rdma_cm_rs_nvmet.rs`) on librdmacm that speaks the
//! protocol badly on purpose: each malformed connect request must be
//! rejected with its `nvme_rdma_cm_rej` status, each malformed command
//! capsule must complete with its NVMe status while its queue keeps
//! working, and an rkey the host never registered must end the controller
//! (every queue of it disconnected) while the target serves the next one.
//!
//! The wire formats are the target's own `samples/nvmet/wire.rs`, compiled
//! here too (it is `core` only for that): the requests and capsules are
//! built with its encoders, the answers read with its parsers.  Where a
//! status is expected, it is `SCT << 8 | SC` with do-not-retry (0x4000),
//! as `wire::parse_cqe` returns it; `Documentation/rdma_cm_rs/nvmet-plan.md`
//! (§1) has the protocol and the statuses.

#[path = "../../../samples/nvmet/wire.rs"]
pub(crate) mod wire;

use crate::cm::{self, Channel, CmEvent, Conn, Param};
use crate::payload::pattern;
use crate::report::EventType;
use anyhow::{bail, ensure, Context, Result};
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};
use wire::{cm_status, opcode, prop, status, CmReq, Sqe};

/// The sample's module name.
pub const MODULE: &str = "rdma_cm_rs_nvmet";
/// The parameters the scenarios load it with (`port=` besides): what the
/// cases below expect of it.
pub const PARAMS: &[&str] = &[
    "ns_mib=16",
    "nr_io_queues=4",
    "queue_size=128",
    "inline_data_size=4096",
];
/// The namespace's size in blocks of 512 bytes (`ns_mib=16`).
pub(crate) const NS_BLOCKS: u64 = (16 << 20) >> wire::LBA_SHIFT;
/// I/O queues a controller may have (`nr_io_queues=4`).
pub(crate) const NR_IO_QUEUES: u16 = 4;
/// Entries of an I/O queue (`queue_size=128`): `hsqsize` 127 at most.
const IO_QUEUE_SIZE: u16 = 128;
/// In-capsule data of an I/O command (`inline_data_size=4096`).
const INLINE: usize = 4096;
/// Largest transfer: MDTS 8, 2^8 pages of 4 KiB.
const MDTS_BYTES: u64 = 1 << 20;
/// The subsystem's NQN.
pub(crate) const NQN: &[u8] = b"nqn.2026-11.org.rdma-cm-rs:nvmet";
const HOSTNQN: &[u8] = b"nqn.2014-08.org.nvmexpress:uuid:6f2bc5a2-8a53-4d8e-b1b4-7a1d0c2e9f31";
const HOSTID: [u8; 16] = *b"rdma-cm-rs-badin";
/// The keep-alive timeout the admin Connect asks for: longer than a
/// session, so that only a Keep Alive's status is at stake.
const KATO_MS: u32 = 60_000;
/// A queue's size as the Linux host asks for the admin queue: 32 receives
/// of responses, 32 commands (0-based 31).
const HRQSIZE: u16 = 32;
const HSQSIZE: u16 = 31;
/// CC: EN, I/O submission and completion queue entries of 2^6 and 2^4.
const CC_ENABLE: u64 = 0x46_0001;
const CSTS_RDY: u64 = 1;
const CSTS_CFS: u64 = 1 << 1;
/// The bytes of the keyed Write (blocks 16 to 23).
const KEYED_SEED: u8 = 0x57;
/// The registered memory of a queue: the Connect data the target READs at
/// its start, and what it WRITEs (Identify, logs, Reads) from [`OUT`].
pub(crate) const DATA_LEN: usize = 2 * OUT;
const OUT: usize = 4096;
const T: Duration = Duration::from_secs(10);
/// How long the target may take to tear a failed controller down.
const TEARDOWN: Duration = Duration::from_secs(20);
const DNR: u16 = status::DNR;

/// The cases that passed, by name, in order.
#[derive(Default)]
struct Tally(Vec<&'static str>);

impl Tally {
    fn pass(&mut self, case: &'static str) {
        self.0.push(case);
    }

    fn report(&self) -> String {
        format!("cases={} names={}", self.0.len(), self.0.join(","))
    }
}

/// The CM request cases of [`bad_cm_requests`]: their number.
pub const CM_CASES: usize = 8;

/// The connect request cases, each on a connection of its own: every
/// malformed request is REJECTED with its `nvme_rdma_cm_rej.sts`, a good
/// one is accepted with `crqsize` = hsqsize + 1.  `iwarp`: whether the
/// private data arrives as long as it was sent; the IB CM (RoCE) pads a
/// REQ's private data to 56 bytes with zeroes, so a short request arrives
/// there as one of record format 0 whose `hsqsize` is 0 (INVALID_HSQSIZE),
/// not as one too short (INVALID_LEN, iWARP only).
pub fn bad_cm_requests(dst: SocketAddr, iwarp: bool) -> Result<String> {
    let mut t = Tally::default();
    let admin = CmReq {
        qid: 0,
        hrqsize: HRQSIZE,
        hsqsize: HSQSIZE,
        cntlid: 0,
    };
    let io = CmReq {
        qid: 1,
        hrqsize: HRQSIZE,
        hsqsize: HSQSIZE,
        cntlid: 0x7777,
    };
    let rejects: [(&'static str, Vec<u8>, u16); 6] = [
        (
            "recfmt_1",
            admin.encode(1).to_vec(),
            cm_status::INVALID_RECFMT,
        ),
        (
            "admin_hsqsize_40",
            CmReq {
                hsqsize: 40,
                hrqsize: 41,
                ..admin
            }
            .encode(0)
            .to_vec(),
            cm_status::INVALID_HSQSIZE,
        ),
        (
            "admin_hsqsize_0",
            CmReq {
                hsqsize: 0,
                ..admin
            }
            .encode(0)
            .to_vec(),
            cm_status::INVALID_HSQSIZE,
        ),
        (
            "io_qid_beyond_offered",
            CmReq {
                qid: NR_IO_QUEUES * 2 + 1,
                ..io
            }
            .encode(0)
            .to_vec(),
            cm_status::INVALID_QID,
        ),
        (
            "hrqsize_below_hsqsize",
            CmReq {
                hrqsize: HSQSIZE,
                ..admin
            }
            .encode(0)
            .to_vec(),
            cm_status::INVALID_HRQSIZE,
        ),
        (
            "io_cntlid_of_no_controller",
            io.encode(0).to_vec(),
            cm_status::INVALID_CNTLID,
        ),
    ];
    let ch = Channel::new()?;
    for (case, data, want) in rejects {
        expect_rejected(&ch, dst, &data, want).with_context(|| format!("CM request {case}"))?;
        t.pass(case);
    }
    // 8 bytes: record format 0, qid 0, hrqsize 32, hsqsize 0 (padded or not).
    let short = &CmReq {
        hsqsize: 0,
        ..admin
    }
    .encode(0)[..8];
    if iwarp {
        expect_rejected(&ch, dst, short, cm_status::INVALID_LEN)
            .context("CM request of 8 bytes (iWARP: they arrive as 8)")?;
        t.pass("short_8_bytes_invalid_len");
    } else {
        expect_rejected(&ch, dst, short, cm_status::INVALID_HSQSIZE)
            .context("CM request of 8 bytes (RoCE: padded to 56 with zeroes, hsqsize 0)")?;
        t.pass("short_8_bytes_padded_hsqsize_0");
    }
    // A good one: accepted with the controller's receive queue size.
    let (conn, ev) = open(&ch, dst, &admin.encode(0))?;
    ev.must_be(EventType::Established)
        .context("a good admin queue request")?;
    let crqsize = rep_crqsize(&ev)?;
    ensure!(
        crqsize == HSQSIZE + 1,
        "a good admin queue request: accepted with crqsize {crqsize}, expected {}",
        HSQSIZE + 1
    );
    conn.disconnect()?;
    wait_for(&ch, EventType::Disconnected, T).context("the good request's disconnect")?;
    drop(conn);
    t.pass("good_admin_request_accepted");
    ensure!(t.0.len() == CM_CASES, "{} cases, not {CM_CASES}", t.0.len());
    Ok(t.report())
}

/// A connection to `dst` with `private` as its request's private data,
/// and the answer to its connect.
pub(crate) fn open<'ch>(
    ch: &'ch Channel,
    dst: SocketAddr,
    private: &[u8],
) -> Result<(Conn<'ch>, CmEvent<'ch>)> {
    let id = cm::resolve(ch, &dst, T)?;
    let conn = Conn::with_recv_depth(id, usize::from(HRQSIZE))?;
    let ev = conn.connect(&Param::with_data(private), ch, T)?;
    Ok((conn, ev))
}

/// A request of `private` must be REJECTED with status `want`.
fn expect_rejected(ch: &Channel, dst: SocketAddr, private: &[u8], want: u16) -> Result<()> {
    let (conn, ev) = open(ch, dst, private)?;
    ensure!(
        ev.event == EventType::Rejected,
        "{} (status {}) instead of REJECTED with nvme_rdma_cm_rej.sts {want}",
        ev.name(),
        ev.status
    );
    let pd = &ev.private_data;
    ensure!(
        pd.len() >= 4,
        "REJECTED with {} bytes of private data, not an nvme_rdma_cm_rej",
        pd.len()
    );
    let (recfmt, sts) = (wire::get16(pd, 0), wire::get16(pd, 2));
    ensure!(
        recfmt == 0 && sts == want,
        "REJECTED with recfmt {recfmt} sts {sts}, expected recfmt 0 sts {want}"
    );
    drop(conn);
    Ok(())
}

/// An accept's `nvme_rdma_cm_rep.crqsize`.
fn rep_crqsize(ev: &CmEvent<'_>) -> Result<u16> {
    let pd = &ev.private_data;
    ensure!(
        pd.len() >= 4 && wire::get16(pd, 0) == 0,
        "ESTABLISHED with private data {pd:02x?}, not an nvme_rdma_cm_rep"
    );
    Ok(wire::get16(pd, 2))
}

/// The next event of `ch` but TIMEWAIT_EXIT, which must be `want`.
fn wait_for(ch: &Channel, want: EventType, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = ch.next(left.max(Duration::from_millis(1)))?;
        if ev.event != EventType::TimewaitExit {
            return ev.must_be(want);
        }
    }
}

/// A completion's fields.
#[derive(Debug)]
pub(crate) struct Cqe {
    pub(crate) result: u64,
    pub(crate) status: u16,
}

/// One queue: a connection, its next command id, and registered memory the
/// target reads and writes ([`DATA_LEN`] bytes, remote read and write).
pub(crate) struct Queue<'ch> {
    ch: &'ch Channel,
    pub(crate) conn: Conn<'ch>,
    pub(crate) qid: u16,
    next_cid: u16,
    data: usize,
    /// A registered capsule larger than the send buffer, once made.
    capsule: Option<usize>,
    /// Whether the controller is enabled (CSTS.RDY): the admin queue's
    /// good command is then Keep Alive, before it Property Get VS.
    enabled: bool,
}

impl<'ch> Queue<'ch> {
    /// Connects queue `qid` (with the controller `cntlid` for an I/O
    /// queue): it must be accepted with crqsize = hsqsize + 1.
    pub(crate) fn open(ch: &'ch Channel, dst: SocketAddr, qid: u16, cntlid: u16) -> Result<Self> {
        let req = CmReq {
            qid,
            hrqsize: HRQSIZE,
            hsqsize: HSQSIZE,
            cntlid,
        };
        let (mut conn, ev) = open(ch, dst, &req.encode(0))?;
        if ev.event == EventType::Rejected && ev.private_data.len() >= 4 {
            bail!(
                "queue {qid}: REJECTED with nvme_rdma_cm_rej.sts {}",
                wire::get16(&ev.private_data, 2)
            );
        }
        ev.must_be(EventType::Established)
            .with_context(|| format!("queue {qid}"))?;
        let crqsize = rep_crqsize(&ev)?;
        ensure!(
            crqsize == HSQSIZE + 1,
            "queue {qid}: crqsize {crqsize}, expected {}",
            HSQSIZE + 1
        );
        let data = conn.add_region(&[0u8; DATA_LEN], true, true)?;
        Ok(Self {
            ch,
            conn,
            qid,
            next_cid: 1,
            data,
            capsule: None,
            enabled: false,
        })
    }

    /// The registered memory: (address, rkey).
    pub(crate) fn key(&self) -> (u64, u32) {
        let (addr, rkey, _) = self.conn.region_key(self.data);
        (addr, rkey)
    }

    /// Where the target's data lands, as a keyed descriptor of `len` bytes.
    pub(crate) fn out_keyed(&self, sqe: &mut Sqe, len: u32) {
        let (addr, rkey) = self.key();
        sqe.set_keyed(addr + OUT as u64, len, rkey, false);
    }

    /// `sqe` with the next command id.
    pub(crate) fn with_cid(&mut self, mut sqe: Sqe) -> (Sqe, u16) {
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        wire::put16(&mut sqe.0, 2, cid);
        (sqe, cid)
    }

    /// Sends `sqe` (a new command id) with `in_capsule` bytes behind it, and
    /// returns its completion, which must be for it.
    fn call_with(&mut self, sqe: Sqe, in_capsule: &[u8]) -> Result<Cqe> {
        let (sqe, cid) = self.with_cid(sqe);
        let mut msg = sqe.0.to_vec();
        msg.extend_from_slice(in_capsule);
        let answer = if msg.len() <= cm::MSG {
            self.conn.send_then_recv(&msg, T)?
        } else {
            let region = match self.capsule {
                Some(r) => r,
                None => {
                    let r = self
                        .conn
                        .add_region(&[0u8; wire::SQE_LEN + INLINE], false, false)?;
                    self.capsule = Some(r);
                    r
                }
            };
            ensure!(msg.len() <= wire::SQE_LEN + INLINE, "a capsule too large");
            self.conn.region_mut(region)[..msg.len()].copy_from_slice(&msg);
            self.conn.send_region_then_recv(region, msg.len(), T)?
        };
        self.completion(&answer, cid)
    }

    pub(crate) fn call(&mut self, sqe: Sqe) -> Result<Cqe> {
        self.call_with(sqe, &[])
    }

    /// The completion `answer`, which must be of command `cid` on this
    /// queue.
    fn completion(&self, answer: &[u8], cid: u16) -> Result<Cqe> {
        ensure!(
            answer.len() == wire::CQE_LEN,
            "a response of {} bytes",
            answer.len()
        );
        let (result, _sq_head, sq_id, got_cid, status) =
            wire::parse_cqe(answer).context("a response")?;
        ensure!(
            got_cid == cid && sq_id == self.qid,
            "the response to command {got_cid} of queue {sq_id}, expected {cid} of queue {}",
            self.qid
        );
        Ok(Cqe { result, status })
    }

    /// Sends `sqe` with `in_capsule` behind it: it must complete with
    /// `want`.
    fn expect_with(&mut self, sqe: Sqe, in_capsule: &[u8], want: u16) -> Result<Cqe> {
        let c = self.call_with(sqe, in_capsule)?;
        ensure!(
            c.status == want,
            "completed with status {:#06x} (result {:#x}), expected {want:#06x}",
            c.status,
            c.result
        );
        Ok(c)
    }

    fn expect(&mut self, sqe: Sqe, want: u16) -> Result<Cqe> {
        self.expect_with(sqe, &[], want)
    }

    /// Whether the target disconnected the queue (an event waiting says
    /// so; other events are dropped).
    pub(crate) fn disconnected(&self) -> bool {
        self.ch
            .next(Duration::from_millis(1))
            .is_ok_and(|ev| ev.event == EventType::Disconnected)
    }

    /// A good command completes with success: the queue still works.
    fn still_works(&mut self) -> Result<()> {
        if self.qid != 0 {
            let c = self.call(Sqe::new(opcode::FLUSH, 0, 1))?;
            ensure!(c.status == 0, "then a Flush: status {:#06x}", c.status);
        } else if self.enabled {
            let c = self.call(Sqe::new(opcode::KEEP_ALIVE, 0, 0))?;
            ensure!(c.status == 0, "then a Keep Alive: status {:#06x}", c.status);
        } else {
            let c = self.call(prop_get(prop::VS, false))?;
            ensure!(
                c.status == 0 && c.result == u64::from(wire::VERSION),
                "then a Property Get of VS: status {:#06x}, result {:#x}",
                c.status,
                c.result
            );
        }
        Ok(())
    }

    /// A case: `sqe` (with `in_capsule` behind it) completes with `want`,
    /// and the queue's next good command with success.
    fn case_with(
        &mut self,
        t: &mut Tally,
        case: &'static str,
        sqe: Sqe,
        in_capsule: &[u8],
        want: u16,
    ) -> Result<Cqe> {
        let c = self
            .expect_with(sqe, in_capsule, want)
            .and_then(|c| self.still_works().map(|()| c))
            .with_context(|| format!("queue {} case {case}", self.qid))?;
        t.pass(case);
        Ok(c)
    }

    fn case(&mut self, t: &mut Tally, case: &'static str, sqe: Sqe, want: u16) -> Result<Cqe> {
        self.case_with(t, case, sqe, &[], want)
    }

    /// The admin Connect, its data (for `subnqn`, asking for controller
    /// `cntlid`) READ by the target from the queue's memory (keyed, no
    /// invalidation).
    pub(crate) fn connect_admin(&mut self, subnqn: &[u8], cntlid: u16) -> Result<Cqe> {
        let data = wire::connect_data(&HOSTID, cntlid, subnqn, HOSTNQN);
        self.conn.region_mut(self.data)[..data.len()].copy_from_slice(&data);
        let mut sqe = connect(0, HSQSIZE, KATO_MS);
        let (addr, rkey) = self.key();
        sqe.set_keyed(addr, data.len() as u32, rkey, false);
        self.call(sqe)
    }

    /// An I/O queue's Connect, its data in the capsule.
    pub(crate) fn connect_io(&mut self, cntlid: u16) -> Result<Cqe> {
        let data = wire::connect_data(&HOSTID, cntlid, NQN, HOSTNQN);
        let mut sqe = connect(self.qid, HSQSIZE, 0);
        sqe.set_in_capsule(0, data.len() as u32);
        self.call_with(sqe, &data)
    }

    /// Enables the controller (CC.EN, with the entry sizes) and waits for
    /// CSTS.RDY.
    pub(crate) fn enable(&mut self) -> Result<()> {
        let c = self.call(prop_set(prop::CC, CC_ENABLE))?;
        ensure!(
            c.status == 0,
            "Property Set of CC: status {:#06x}",
            c.status
        );
        for _ in 0..50 {
            let c = self.call(prop_get(prop::CSTS, false))?;
            ensure!(
                c.status == 0 && c.result & CSTS_CFS == 0,
                "Property Get of CSTS: status {:#06x}, CSTS {:#x}",
                c.status,
                c.result
            );
            if c.result & CSTS_RDY != 0 {
                self.enabled = true;
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("CSTS.RDY not set 5 s after CC.EN")
    }

    /// Disconnects and waits for DISCONNECTED.
    pub(crate) fn close(self) -> Result<()> {
        self.conn.disconnect()?;
        wait_for(self.ch, EventType::Disconnected, T)
            .with_context(|| format!("queue {}: closing", self.qid))
    }
}

/// A fabrics command of type `fctype`.
fn fabrics(fctype: u8) -> Sqe {
    let mut sqe = Sqe::new(opcode::FABRICS, 0, 0);
    sqe.0[4] = fctype;
    sqe
}

/// Connect of queue `qid` with `sqsize` (0-based) and `kato` ms; the data
/// descriptor is the caller's.
fn connect(qid: u16, sqsize: u16, kato: u32) -> Sqe {
    let mut sqe = fabrics(opcode::FCTYPE_CONNECT);
    wire::put16(&mut sqe.0, 40, 0);
    wire::put16(&mut sqe.0, 42, qid);
    wire::put16(&mut sqe.0, 44, sqsize);
    wire::put32(&mut sqe.0, 48, kato);
    sqe
}

pub(crate) fn prop_get(offset: u32, wide: bool) -> Sqe {
    let mut sqe = fabrics(opcode::FCTYPE_PROPERTY_GET);
    sqe.0[40] = u8::from(wide);
    wire::put32(&mut sqe.0, 44, offset);
    sqe
}

pub(crate) fn prop_set(offset: u32, value: u64) -> Sqe {
    let mut sqe = fabrics(opcode::FCTYPE_PROPERTY_SET);
    wire::put32(&mut sqe.0, 44, offset);
    wire::put64(&mut sqe.0, 48, value);
    sqe
}

/// Identify of `cns` for namespace `nsid` (the data descriptor is the
/// caller's).
pub(crate) fn identify(cns: u8, nsid: u32) -> Sqe {
    let mut sqe = Sqe::new(opcode::IDENTIFY, 0, nsid);
    sqe.0[40] = cns;
    sqe
}

/// Get Log Page `lid` of `len` bytes (a multiple of 4) from `lpo`.
pub(crate) fn get_log_page(lid: u8, len: u32, lpo: u64) -> Sqe {
    let numd = len / 4 - 1;
    let mut sqe = Sqe::new(opcode::GET_LOG_PAGE, 0, 0xffff_ffff);
    wire::put32(&mut sqe.0, 40, u32::from(lid) | (numd & 0xffff) << 16);
    wire::put32(&mut sqe.0, 44, numd >> 16);
    wire::put64(&mut sqe.0, 48, lpo);
    sqe
}

/// A Read or Write (`op`) of `nlb` blocks (1-based) at `slba` of `nsid`.
pub(crate) fn rw(op: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
    let mut sqe = Sqe::new(op, 0, nsid);
    wire::put64(&mut sqe.0, 40, slba);
    wire::put16(&mut sqe.0, 48, (nlb - 1) as u16);
    sqe
}

/// The capsule cases: on fresh admin queues, commands before Connect and
/// Connects with a wrong NQN or controller id; on one controller, commands
/// before CC.EN, then every malformed admin capsule, then an I/O queue's;
/// then a Read to an rkey the host never registered, which must end the
/// controller (both its queues disconnected), after which a new
/// controller connects (see [`bad_rkey`] for what iWARP, `iwarp`, makes of
/// it).  Off iWARP the device (rxe) has memory windows, through which one
/// Read goes with SGL 0x4F (invalidate the key).
pub fn bad_capsules(dst: SocketAddr, iwarp: bool) -> Result<String> {
    let windows = !iwarp;
    let mut t = Tally::default();
    let ch = Channel::new()?;
    fresh_admin_queues(&ch, dst, &mut t)?;
    let ch_admin = Channel::new()?;
    let mut admin = Queue::open(&ch_admin, dst, 0, 0)?;
    let c = admin.connect_admin(NQN, wire::CNTLID_DYNAMIC)?;
    ensure!(c.status == 0, "admin Connect: status {:#06x}", c.status);
    let cntlid = (c.result & 0xffff) as u16;
    let mut sqe = identify(wire::cns::CTRL, 0);
    admin.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    admin.case(
        &mut t,
        "identify_before_cc_en",
        sqe,
        status::CMD_SEQ_ERROR | DNR,
    )?;
    // A CM request for an I/O queue of the live controller, one entry
    // deeper than the target's queues (MQES + 1): refused for its size,
    // the controller's checks passed.
    let too_deep = CmReq {
        qid: 1,
        hrqsize: IO_QUEUE_SIZE + 1,
        hsqsize: IO_QUEUE_SIZE,
        cntlid,
    };
    expect_rejected(&ch, dst, &too_deep.encode(0), cm_status::INVALID_HSQSIZE)
        .context("CM request io_hsqsize_beyond_mqes")?;
    t.pass("io_hsqsize_beyond_mqes");
    // An I/O queue of the controller, connected before it is enabled.
    let ch_io = Channel::new()?;
    let mut io = Queue::open(&ch_io, dst, 1, cntlid)?;
    let c = io.connect_io(0x7777)?;
    ensure!(
        c.status == status::CONNECT_INVALID_PARAM | DNR && c.result == 1 << 16 | 16,
        "I/O Connect for controller 0x7777: status {:#06x} result {:#x}, expected {:#06x} result 0x10010",
        c.status,
        c.result,
        status::CONNECT_INVALID_PARAM | DNR
    );
    t.pass("io_connect_wrong_cntlid");
    let c = io.connect_io(cntlid)?;
    ensure!(
        c.status == 0 && c.result & 0xffff == u64::from(cntlid),
        "I/O Connect: status {:#06x} result {:#x}",
        c.status,
        c.result
    );
    let (addr, rkey) = io.key();
    let mut sqe = rw(opcode::READ, 1, 0, 1);
    sqe.set_keyed(addr + OUT as u64, 512, rkey, false);
    io.expect(sqe, status::CMD_SEQ_ERROR | DNR)
        .context("a Read before CC.EN")?;
    t.pass("io_read_before_cc_en");
    admin.enable()?;
    admin_cases(&mut admin, cntlid, &mut t)?;
    io_cases(&mut io, windows, &mut t)?;
    bad_rkey(dst, admin, io, cntlid, iwarp, &mut t)?;
    // The target survived: a new controller connects and works.
    let ch_new = Channel::new()?;
    let mut again = Queue::open(&ch_new, dst, 0, 0)?;
    let c = again.connect_admin(NQN, wire::CNTLID_DYNAMIC)?;
    ensure!(
        c.status == 0,
        "a new controller after the bad rkey: Connect status {:#06x}",
        c.status
    );
    again.enable()?;
    again.still_works()?;
    again.close()?;
    t.pass("new_controller_after_bad_rkey");
    ensure!(
        t.0.len() == CAPSULE_CASES,
        "{} cases, not {CAPSULE_CASES}",
        t.0.len()
    );
    Ok(format!("{} cntlid={cntlid}", t.report()))
}

/// The number of cases [`bad_capsules`] passes: on RoCE with the Read
/// through a memory window, on iWARP with the controller's survival.
pub const CAPSULE_CASES: usize = 44;

/// Fresh admin queues: a command before Connect, a Connect to a wrong
/// NQN, an admin Connect asking for a given controller; after each, a
/// good Connect on the same queue.
fn fresh_admin_queues(ch: &Channel, dst: SocketAddr, t: &mut Tally) -> Result<()> {
    let mut q = Queue::open(ch, dst, 0, 0)?;
    q.expect(
        Sqe::new(opcode::KEEP_ALIVE, 0, 0),
        status::INVALID_OPCODE | DNR,
    )
    .context("a Keep Alive before Connect")?;
    let c = q.connect_admin(b"nqn.2026-11.org.rdma-cm-rs:nobody", wire::CNTLID_DYNAMIC)?;
    ensure!(
        c.status == status::CONNECT_INVALID_PARAM | DNR && c.result == 1 << 16 | 256,
        "Connect to a wrong NQN: status {:#06x} result {:#x}, expected {:#06x} result 0x10100",
        c.status,
        c.result,
        status::CONNECT_INVALID_PARAM | DNR
    );
    let c = q.connect_admin(NQN, wire::CNTLID_DYNAMIC)?;
    ensure!(
        c.status == 0,
        "a good Connect after the wrong NQN: status {:#06x}",
        c.status
    );
    q.close()?;
    t.pass("command_before_connect");
    t.pass("connect_wrong_nqn");
    let mut q = Queue::open(ch, dst, 0, 0)?;
    let c = q.connect_admin(NQN, 1)?;
    ensure!(
        c.status == status::CONNECT_INVALID_PARAM | DNR && c.result == 1 << 16 | 16,
        "admin Connect for controller 1: status {:#06x} result {:#x}, expected {:#06x} result 0x10010",
        c.status,
        c.result,
        status::CONNECT_INVALID_PARAM | DNR
    );
    let c = q.connect_admin(NQN, wire::CNTLID_DYNAMIC)?;
    ensure!(
        c.status == 0,
        "a good Connect after the wrong controller id: status {:#06x}",
        c.status
    );
    q.close()?;
    t.pass("admin_connect_cntlid_not_dynamic");
    Ok(())
}

/// The admin queue's cases, the controller enabled.
fn admin_cases(q: &mut Queue<'_>, cntlid: u16, t: &mut Tally) -> Result<()> {
    // Good ones first: Identify Controller and Namespace, WRITTEN by the
    // target into our memory.
    let mut sqe = identify(wire::cns::CTRL, 0);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    q.case(t, "identify_controller", sqe, 0)?;
    let id = &q.conn.region(q.data)[OUT..];
    let (got_cntlid, mdts, ioccsz) = (wire::get16(id, 78), id[77], wire::get32(id, 1792));
    ensure!(
        got_cntlid == cntlid
            && mdts == 8
            && ioccsz == (wire::SQE_LEN + INLINE) as u32 / 16
            && wire::nqn(&id[768..1024]) == NQN,
        "Identify Controller: cntlid {got_cntlid} mdts {mdts} ioccsz {ioccsz}"
    );
    let mut sqe = identify(wire::cns::NS, 1);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    q.case(t, "identify_namespace", sqe, 0)?;
    let nsze = wire::get64(&q.conn.region(q.data)[OUT..], 0);
    ensure!(
        nsze == NS_BLOCKS,
        "Identify Namespace: nsze {nsze}, expected {NS_BLOCKS}"
    );

    let invalid_opcode = status::INVALID_OPCODE | DNR;
    let invalid_field = status::INVALID_FIELD | DNR;
    q.case(
        t,
        "unknown_admin_opcode",
        Sqe::new(0x7e, 0, 0),
        invalid_opcode,
    )?;
    // Create I/O SQ: an opcode of PCIe controllers only (it is Write's on an
    // I/O queue).
    q.case(
        t,
        "create_sq_on_admin_queue",
        rw(opcode::WRITE, 1, 0, 1),
        invalid_opcode,
    )?;
    // A Read's capsule on the admin queue is a Get Log Page: of log 0
    // (slba 0), 4 bytes (NUMD 0), which the 512 bytes of the Read's
    // descriptor do not match.
    let mut sqe = rw(opcode::READ, 1, 0, 1);
    q.out_keyed(&mut sqe, 512);
    q.case(
        t,
        "read_on_admin_queue_is_get_log_page",
        sqe,
        status::SGL_INVALID_DATA | DNR,
    )?;
    q.case(t, "unknown_fctype", fabrics(0x10), invalid_opcode)?;
    q.case(
        t,
        "property_get_unknown_offset",
        prop_get(0x40, false),
        invalid_field,
    )?;
    q.case(
        t,
        "property_set_8_bytes",
        {
            let mut s = prop_set(prop::CC, CC_ENABLE);
            s.0[40] = 1;
            s
        },
        invalid_field,
    )?;
    let mut sqe = Sqe::new(opcode::KEEP_ALIVE, 0, 0);
    sqe.0[1] |= 0x1;
    q.case(t, "fused_first", sqe, invalid_field)?;
    let mut sqe = Sqe::new(opcode::KEEP_ALIVE, 0, 0);
    sqe.0[1] |= 0x2;
    q.case(t, "fused_second", sqe, invalid_field)?;
    let mut sqe = Sqe::new(opcode::KEEP_ALIVE, 0, 0);
    sqe.0[1] = 0;
    q.case(t, "psdt_00_prp", sqe, invalid_field)?;
    let mut sqe = identify(wire::cns::CTRL, 0);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    sqe.0[39] = 0x20;
    q.case(t, "sgl_segment_type", sqe, status::SGL_INVALID_TYPE | DNR)?;
    let mut sqe = identify(wire::cns::CTRL, 0);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    sqe.0[39] = 0x00;
    q.case(t, "sgl_data_block_address_subtype", sqe, invalid_field)?;
    let mut sqe = identify(wire::cns::CTRL, 0);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    sqe.0[39] = 0x4a;
    q.case(t, "sgl_keyed_unknown_subtype", sqe, invalid_field)?;
    let mut sqe = identify(wire::cns::CTRL, 0);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32 - 1);
    q.case(
        t,
        "identify_length_4095",
        sqe,
        status::SGL_INVALID_DATA | DNR,
    )?;
    let mut sqe = identify(0x42, 0);
    q.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    q.case(t, "identify_unknown_cns", sqe, invalid_field)?;
    let mut sqe = get_log_page(0x7a, 512, 0);
    q.out_keyed(&mut sqe, 512);
    q.case(t, "get_log_page_unknown_lid", sqe, invalid_field)?;
    // The error log is 64 bytes.
    let mut sqe = get_log_page(wire::log::ERROR, 64, 4096);
    q.out_keyed(&mut sqe, 64);
    q.case(t, "get_log_page_offset_past_end", sqe, invalid_field)?;
    let mut sqe = get_log_page(wire::log::ERROR, 64, 0);
    q.out_keyed(&mut sqe, 64);
    q.case(t, "get_log_page_error_log", sqe, 0)?;
    // Longer than MDTS: 2 MiB, and NUMD's largest, 2^32 dwords (whose
    // byte count overflowed 32 bits in the target: a Rust panic, found by
    // the fuzzer's capsule mode).
    let mut sqe = get_log_page(wire::log::ERROR, 4, 0);
    wire::put16(&mut sqe.0, 42, 0xffff);
    wire::put16(&mut sqe.0, 44, 0xffff);
    q.out_keyed(&mut sqe, 64);
    q.case(t, "get_log_page_numd_all_ones", sqe, invalid_field)?;
    let mut sqe = get_log_page(wire::log::ERROR, 2 << 20, 0);
    q.out_keyed(&mut sqe, 64);
    q.case(t, "get_log_page_beyond_mdts", sqe, invalid_field)?;
    // Four asynchronous event requests are held (no completion); the
    // fifth completes at once with ASYNC_LIMIT.
    for _ in 0..4 {
        let (sqe, _) = q.with_cid(Sqe::new(opcode::ASYNC_EVENT, 0, 0));
        q.conn
            .send(&sqe.0)
            .context("an asynchronous event request")?;
    }
    q.case(
        t,
        "fifth_async_event_request",
        Sqe::new(opcode::ASYNC_EVENT, 0, 0),
        status::ASYNC_LIMIT | DNR,
    )?;
    Ok(())
}

/// The I/O queue's cases, the controller enabled.
fn io_cases(q: &mut Queue<'_>, windows: bool, t: &mut Tally) -> Result<()> {
    let (addr, rkey) = q.key();
    let out = addr + OUT as u64;
    let keyed = |mut sqe: Sqe, len: u32| {
        sqe.set_keyed(out, len, rkey, false);
        sqe
    };
    // A keyed Read of 8 blocks at `slba` into our memory, compared with
    // `data`.
    let read_back = |q: &mut Queue<'_>,
                     t: &mut Tally,
                     case: &'static str,
                     slba: u64,
                     data: &[u8],
                     what: &str|
     -> Result<()> {
        q.conn.region_mut(q.data)[OUT..].fill(0);
        q.case(
            t,
            case,
            keyed(rw(opcode::READ, 1, slba, 8), INLINE as u32),
            0,
        )?;
        crate::payload::verify(what, data, &q.conn.region(q.data)[OUT..])
    };
    let lba_range = status::LBA_RANGE | DNR;
    let invalid_field = status::INVALID_FIELD | DNR;
    q.case(
        t,
        "read_beyond_namespace",
        keyed(rw(opcode::READ, 1, NS_BLOCKS, 1), 512),
        lba_range,
    )?;
    q.case(
        t,
        "read_across_namespace_end",
        keyed(rw(opcode::READ, 1, NS_BLOCKS - 1, 2), 1024),
        lba_range,
    )?;
    let nlb = (MDTS_BYTES >> wire::LBA_SHIFT) as u32 + 1;
    q.case(
        t,
        "read_beyond_mdts",
        keyed(rw(opcode::READ, 1, 0, nlb), nlb << wire::LBA_SHIFT),
        invalid_field,
    )?;
    let mut sqe = rw(opcode::READ, 1, 0, 1);
    sqe.set_in_capsule(0, 512);
    q.case_with(
        t,
        "read_with_in_capsule_data",
        sqe,
        &[0u8; 512],
        invalid_field,
    )?;
    let mut sqe = rw(opcode::WRITE, 1, 0, 1);
    sqe.set_in_capsule(2 * INLINE as u64, 512);
    q.case(
        t,
        "in_capsule_offset_past_inline_size",
        sqe,
        status::SGL_INVALID_OFFSET | DNR,
    )?;
    let mut sqe = rw(opcode::WRITE, 1, 0, 1);
    sqe.set_in_capsule(0, 1024);
    q.case_with(
        t,
        "write_length_not_nlb",
        sqe,
        &[0u8; 1024],
        status::SGL_INVALID_DATA | DNR,
    )?;
    q.case(
        t,
        "unknown_io_opcode",
        Sqe::new(0x7e, 0, 1),
        status::INVALID_OPCODE | DNR,
    )?;
    q.case(
        t,
        "read_wrong_nsid",
        keyed(rw(opcode::READ, 2, 0, 1), 512),
        status::INVALID_NS | DNR,
    )?;
    // A good Write of 4 KiB in the capsule, read back into our memory.
    let data = pattern(INLINE, 0x4e);
    let mut sqe = rw(opcode::WRITE, 1, 8, 8);
    sqe.set_in_capsule(0, INLINE as u32);
    q.case_with(t, "write_in_capsule_4k", sqe, &data, 0)?;
    read_back(
        q,
        t,
        "read_back_keyed_4k",
        8,
        &data,
        "the Read of the in-capsule Write",
    )?;
    // A good keyed Write: the target READs it from our memory.
    let data = pattern(INLINE, KEYED_SEED);
    q.conn.region_mut(q.data)[OUT..].copy_from_slice(&data);
    q.case(
        t,
        "write_keyed_4k",
        {
            let mut sqe = rw(opcode::WRITE, 1, 16, 8);
            sqe.set_keyed(out, INLINE as u32, rkey, false);
            sqe
        },
        0,
    )?;
    read_back(
        q,
        t,
        "read_back_keyed_write",
        16,
        &data,
        "the Read of the keyed Write",
    )?;
    if windows {
        read_through_window(q, &data).context("a Read through a memory window")?;
        t.pass("read_keyed_invalidate_window");
    }
    Ok(())
}

/// A Read of the keyed Write's blocks through a type 2 memory window over
/// a region of its own, SGL 0x4F: the response must come as SEND_WITH_INV
/// of the window's key, and the data be the Write's.
fn read_through_window(q: &mut Queue<'_>, data: &[u8]) -> Result<()> {
    let region = q.conn.add_region_with(&[0u8; INLINE], true, true, true)?;
    let window = q.conn.add_window()?.context("no memory window")?;
    let key = q.conn.bind_window(window, region)?;
    let (addr, _, _) = q.conn.region_key(region);
    let mut sqe = rw(opcode::READ, 1, 16, 8);
    sqe.set_keyed(addr, INLINE as u32, key, true);
    let (sqe, cid) = q.with_cid(sqe);
    let (answer, invalidated) = q.conn.send_then_recv_inv(&sqe.0, T)?;
    let c = q.completion(&answer, cid)?;
    ensure!(c.status == 0, "status {:#06x}", c.status);
    ensure!(
        invalidated == Some(key),
        "the response invalidated {invalidated:x?}, not the window's key {key:#x}"
    );
    crate::payload::verify("the Read through the window", data, q.conn.region(region))?;
    q.still_works()
}

/// A Read whose data goes to an rkey the host never registered.  Over RoCE
/// (`iwarp` false) the target's RDMA WRITE completes with a remote access
/// error, which is fatal to the controller (an RC QP in error cannot go
/// on): both of its queues get DISCONNECTED.  Over iWARP the host's RNIC
/// answers the bad STag with a TERMINATE and closes the connection, which
/// the target must take as it takes the host's disconnect (nvmet-rdma
/// alike), whether it sees the connection end first or its response,
/// chained after the WRITE, flushed (likely with a transfer this large):
/// that queue goes, the controller lives on, and a new I/O queue of it
/// reads the blocks of the keyed Write.  Either way no successful
/// completion comes for the Read.
fn bad_rkey(
    dst: SocketAddr,
    mut admin: Queue<'_>,
    mut io: Queue<'_>,
    cntlid: u16,
    iwarp: bool,
    t: &mut Tally,
) -> Result<()> {
    let (addr, rkey) = io.key();
    // Far beyond any index rxe or siw gives a key of this process.
    let bad = rkey ^ 0x8000_0000;
    // The largest transfer: the target is still writing it when the
    // host's refusal (on iWARP a TERMINATE) arrives, so the response
    // chained after the WRITE is flushed, not sent.
    let mut sqe = rw(opcode::READ, 1, 0, (MDTS_BYTES >> wire::LBA_SHIFT) as u32);
    sqe.set_keyed(addr + OUT as u64, MDTS_BYTES as u32, bad, false);
    let (sqe, cid) = io.with_cid(sqe);
    // The send may or may not complete well: the target's WRITE puts our
    // QP in the error state too (a remote access error at the responder).
    let sent = io.conn.send(&sqe.0);
    let io_ended = wait_for(io.ch, EventType::Disconnected, TEARDOWN)
        .context("the I/O queue after the bad rkey");
    let admin_ended = if iwarp {
        Ok(())
    } else {
        wait_for(admin.ch, EventType::Disconnected, TEARDOWN)
            .context("the admin queue after the bad rkey")
    };
    let answered = loop {
        match io.conn.try_recv() {
            Ok(Some(m)) => match io.completion(&m, cid) {
                Ok(c) if c.status == 0 => break Some(c),
                _ => continue,
            },
            _ => break None,
        }
    };
    if let Some(c) = answered {
        bail!("a Read to a bad rkey completed with success: {c:?}");
    }
    io_ended.with_context(|| format!("(the Read's send: {sent:?})"))?;
    admin_ended?;
    // Our DREP of the target's disconnect; then the queue goes.
    let _ = io.conn.disconnect();
    drop(io);
    if !iwarp {
        let _ = admin.conn.disconnect();
        drop(admin);
        t.pass("read_to_unregistered_rkey_ends_controller");
        return Ok(());
    }
    t.pass("read_to_unregistered_rkey_ends_io_queue");
    // The controller lives on: its admin queue works, and a new I/O queue
    // reads what the keyed Write wrote.
    let survived = || -> Result<()> {
        admin.still_works()?;
        let ch = Channel::new()?;
        let mut io = Queue::open(&ch, dst, 1, cntlid)?;
        let c = io.connect_io(cntlid)?;
        ensure!(c.status == 0, "I/O Connect: status {:#06x}", c.status);
        let (addr, rkey) = io.key();
        let mut sqe = rw(opcode::READ, 1, 16, 8);
        sqe.set_keyed(addr + OUT as u64, INLINE as u32, rkey, false);
        let c = io.call(sqe)?;
        ensure!(c.status == 0, "a Read: status {:#06x}", c.status);
        crate::payload::verify(
            "a Read of the keyed Write on a new I/O queue",
            &pattern(INLINE, KEYED_SEED),
            &io.conn.region(io.data)[OUT..],
        )?;
        io.close()?;
        admin.close()
    };
    survived().context("the controller after its I/O queue's TERMINATE")?;
    t.pass("controller_survives_io_queue_terminate");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the target reads of the capsules built here, by its own
    /// parsers.
    #[test]
    fn capsules_read_as_meant() {
        let sqe = get_log_page(wire::log::ERROR, 64, 4096);
        assert_eq!(sqe.u8_at(40), wire::log::ERROR);
        assert_eq!((sqe.cdw(11) & 0xffff) << 16 | sqe.cdw(10) >> 16, 15);
        assert_eq!(sqe.u64_at(48), 4096);
        let mut sqe = rw(opcode::READ, 1, NS_BLOCKS, 2049);
        sqe.set_keyed(0x1000, 2049 * 512, 0xabcd, false);
        assert_eq!(sqe.u16_at(48), 2048);
        assert_eq!(sqe.u64_at(40), NS_BLOCKS);
        assert_eq!(
            sqe.data_desc(),
            Ok(wire::DataDesc::Keyed {
                addr: 0x1000,
                len: 2049 * 512,
                key: 0xabcd,
                invalidate: false
            })
        );
        assert_eq!(sqe.check_flags(), Ok(()));
        let c = connect(1, 31, 0);
        assert_eq!((c.fctype(), c.u16_at(42), c.u16_at(44)), (1, 1, 31));
        let p = prop_get(prop::CSTS, false);
        assert_eq!((p.opcode(), p.fctype(), p.u32_at(44)), (0x7f, 4, 0x1c));
        let mut s = Sqe::new(opcode::KEEP_ALIVE, 0, 0);
        s.0[39] = 0x20;
        assert_eq!(s.data_desc(), Err(status::SGL_INVALID_TYPE | DNR));
    }

    /// The CM requests as the target parses them.
    #[test]
    fn cm_requests_parse_as_meant() {
        let req = CmReq {
            qid: 0,
            hrqsize: HRQSIZE,
            hsqsize: 0,
            cntlid: 0,
        };
        let b = req.encode(0);
        assert_eq!(CmReq::parse(&b[..8]), Err(cm_status::INVALID_LEN));
        let mut padded = [0u8; 56];
        padded[..8].copy_from_slice(&b[..8]);
        assert_eq!(CmReq::parse(&padded), Ok(req));
        assert_eq!(CmReq::parse(&req.encode(1)), Err(cm_status::INVALID_RECFMT));
    }
}
