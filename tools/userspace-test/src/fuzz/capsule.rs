// SPDX-License-Identifier: GPL-2.0

//! The peers' capsule mode: a seeded NVMe over Fabrics host of the target
//! sample (`rdma_cm_rs_nvmet.ko`, which `fuzz --nvmet-port` loads for the
//! run) that speaks the protocol mostly wrong.
//!
//! A session: sometimes a connect request of random bytes and nothing else;
//! otherwise an admin queue, its Connect (now and then to a garbled NQN or
//! for a controller that does not exist), CC.EN most of the time, an I/O
//! queue of the controller (its qid and controller id now and then wrong),
//! then commands: known opcodes with random fields (LBAs at and past the
//! namespace's end, block counts up to MDTS and beyond, unknown CNS, logs,
//! features and properties), random opcodes, fabrics commands on I/O
//! queues, I/O commands on the admin queue; each with a data descriptor
//! drawn at random: none, keyed on the peer's memory (its key good or not,
//! the length within the region or past it, invalidation asked or not), in
//! the capsule (its offset and length at random, the bytes behind the
//! command as many or not), or 16 random bytes.  Now and then the command's
//! flags and dwords get random bytes.  The peer waits a random while for
//! each response and goes on without it (an AER, or a command of a
//! controller that failed, gets none); it ends disconnecting or just going,
//! and the fuzzer SIGKILLs some peers mid-session anyway.
//!
//! The oracle here: whatever comes back on a queue is a 16-byte completion
//! of that queue (`F` on standard output otherwise, which the fuzzer counts
//! as a finding).  The target's side is the kernel's: the dmesg gate and
//! kmemleak, and [`still_serves`] at the end of the run.

#[allow(unused_imports)]
use super::*;

use crate::cm::Channel;
use crate::nvmet::{
    self as host,
    wire::{self, opcode, prop, Sqe},
    Queue,
};
use anyhow::ensure;

/// The share of peers (in %) that are NVMe hosts.
pub(super) const CAPSULE_PCT: u64 = 50;
/// Sessions an NVMe peer runs, one after the other, at most.
pub(super) const SESSIONS: u64 = 4;

/// A session against the target at `dst`; progress on standard output:
/// `n` the session starts, `a` a queue accepted, `k` a completion read,
/// `F` a response that is not a completion of its queue.
pub(super) fn session(dst: SocketAddr, rng: &mut Rng) -> Result<()> {
    mark(b'n');
    let ch = Channel::new()?;
    let ch_io = Channel::new()?;
    if rng.pct(10) {
        let data: Vec<u8> = (0..rng.range(0, 60))
            .map(|_| rng.below(256) as u8)
            .collect();
        if let Ok((conn, _ev)) = host::open(&ch, dst, &data) {
            drop(conn);
        }
        return Ok(());
    }
    let mut admin = Queue::open(&ch, dst, 0, 0)?;
    mark(b'a');
    let connected = if rng.pct(85) {
        admin.connect_admin(host::NQN, wire::CNTLID_DYNAMIC)
    } else {
        let mut nqn = host::NQN.to_vec();
        let at = rng.below(nqn.len() as u64) as usize;
        nqn[at] ^= 1 + rng.below(255) as u8;
        admin.connect_admin(&nqn, rng.below(0x1_0000) as u16)
    };
    let cntlid = match connected {
        Ok(c) => {
            mark(b'k');
            (c.status == 0).then_some((c.result & 0xffff) as u16)
        }
        Err(_) => None,
    };
    if cntlid.is_some() && rng.pct(75) {
        let _ = admin.enable();
    }
    let mut io = None;
    if let Some(cntlid) = cntlid.filter(|_| rng.pct(60)) {
        let qid = rng.range(1, u64::from(host::NR_IO_QUEUES) + 2) as u16;
        if let Ok(mut q) = Queue::open(&ch_io, dst, qid, cntlid) {
            mark(b'a');
            let asked = if rng.pct(90) {
                cntlid
            } else {
                rng.below(0x1_0000) as u16
            };
            if q.connect_io(asked).is_ok() {
                mark(b'k');
            }
            io = Some(q);
        }
    }
    for _ in 0..rng.range(1, 30) {
        let q = match io.as_mut() {
            Some(q) if rng.pct(60) => q,
            _ => &mut admin,
        };
        let (sqe, behind) = capsule(rng, q);
        let (sqe, _cid) = q.with_cid(sqe);
        let mut msg = sqe.0.to_vec();
        msg.extend_from_slice(&behind);
        if q.conn.send(&msg).is_err() {
            break;
        }
        if let Ok(answer) = q.conn.recv(Duration::from_millis(rng.range(5, 200))) {
            // Not necessarily this command's: an earlier one answered late.
            let ok = answer.len() == wire::CQE_LEN
                && wire::parse_cqe(&answer).is_some_and(|(_, _, sq_id, _, _)| sq_id == q.qid);
            mark(if ok { b'k' } else { b'F' });
        }
        if q.disconnected() {
            break;
        }
    }
    if rng.pct(50) {
        if let Some(q) = &io {
            let _ = q.conn.disconnect();
        }
        let _ = admin.conn.disconnect();
    }
    Ok(())
}

/// A command for `q` and the bytes sent behind it.
fn capsule(rng: &mut Rng, q: &Queue<'_>) -> (Sqe, Vec<u8>) {
    let io_queue = q.qid != 0;
    let ns_blocks = host::NS_BLOCKS;
    let lba = |rng: &mut Rng| match rng.below(4) {
        0 => rng.below(ns_blocks),
        1 => ns_blocks - rng.range(1, 64),
        2 => ns_blocks + rng.below(64),
        _ => rng.next_u64(),
    };
    let nlb = |rng: &mut Rng| match rng.below(4) {
        0 => 1,
        1 => rng.range(1, 9),
        2 => rng.range(1, 2049),
        _ => rng.range(1, 0x1_0000),
    } as u32;
    let mut sqe = match rng.weighted(&[30, 25, 10, 10, 5, 10, 10]) {
        // I/O commands (on the admin queue too, now and then).
        0 if io_queue || rng.pct(20) => {
            let op = [
                opcode::READ,
                opcode::WRITE,
                opcode::WRITE_ZEROES,
                opcode::FLUSH,
            ][rng.below(4) as usize];
            let nsid = if rng.pct(90) {
                1
            } else {
                rng.next_u64() as u32
            };
            host::rw(op, nsid, lba(rng), nlb(rng))
        }
        0 | 1 => {
            let (cns, nsid) = (rng.below(12) as u8, rng.below(3) as u32);
            host::identify(cns, nsid)
        }
        2 => {
            let lid = [0, 1, 2, 3, 4, 0x70, rng.below(256) as u8][rng.below(7) as usize];
            let len = 4 * rng.range(1, 1025) as u32;
            host::get_log_page(lid, len, rng.below(8192) & !3)
        }
        3 => {
            let op = [opcode::GET_FEATURES, opcode::SET_FEATURES][rng.below(2) as usize];
            let mut sqe = Sqe::new(op, 0, 0);
            sqe.0[40] = [0x06, 0x07, 0x0b, 0x0f, 0x81, rng.below(256) as u8][rng.below(6) as usize];
            wire::put32(&mut sqe.0, 44, rng.next_u64() as u32);
            sqe
        }
        4 => {
            let op =
                [opcode::ASYNC_EVENT, opcode::KEEP_ALIVE, opcode::ABORT][rng.below(3) as usize];
            Sqe::new(op, 0, 0)
        }
        5 => {
            let offset = [
                prop::CAP,
                prop::VS,
                prop::CC,
                prop::CSTS,
                rng.below(0x40) as u32,
            ][rng.below(5) as usize];
            if rng.pct(50) {
                host::prop_get(offset, rng.pct(50))
            } else {
                host::prop_set(offset, rng.next_u64())
            }
        }
        _ => Sqe::new(rng.below(256) as u8, 0, rng.below(3) as u32),
    };
    let behind = descriptor(rng, q, &mut sqe);
    if rng.pct(10) {
        for _ in 0..rng.range(1, 4) {
            // The flags, the namespace id, a command dword.
            let at = [1, rng.range(4, 7), rng.range(40, 63)][rng.below(3) as usize] as usize;
            sqe.0[at] = rng.below(256) as u8;
        }
    }
    (sqe, behind)
}

/// Writes a data descriptor into `sqe`; returns the bytes to send behind
/// the command (in-capsule data).
fn descriptor(rng: &mut Rng, q: &Queue<'_>, sqe: &mut Sqe) -> Vec<u8> {
    let (addr, rkey) = q.key();
    let region = host::DATA_LEN as u64;
    match rng.weighted(&[15, 45, 25, 15]) {
        0 => Vec::new(),
        1 => {
            let len = match rng.below(4) {
                0 => 512,
                1 => rng.range(0, region + 1),
                2 => rng.range(region, 2 << 20),
                _ => 4096,
            } as u32;
            let key = if rng.pct(85) {
                rkey
            } else {
                rng.next_u64() as u32
            };
            let at = if rng.pct(90) { 0 } else { rng.below(region) };
            sqe.set_keyed(addr + at, len, key, rng.pct(15));
            Vec::new()
        }
        2 => {
            let len = match rng.below(3) {
                0 => 512,
                1 => rng.range(0, (cm::MSG - wire::SQE_LEN) as u64 + 1),
                _ => rng.range(0, 1 << 16),
            } as u32;
            let offset = if rng.pct(85) { 0 } else { rng.below(8192) };
            sqe.set_in_capsule(offset, len);
            let sent = if rng.pct(80) {
                len as usize
            } else {
                rng.below(4096) as usize
            };
            let sent = sent.min(cm::MSG - wire::SQE_LEN);
            (0..sent).map(|i| (i * 7 + 3) as u8).collect()
        }
        _ => {
            for b in &mut sqe.0[24..40] {
                *b = rng.below(256) as u8;
            }
            Vec::new()
        }
    }
}

/// The target at `dst` serves a good host after the run: an admin queue,
/// Connect, CC.EN (CSTS.RDY), and Identify Controller.
pub(super) fn still_serves(dst: SocketAddr) -> Result<()> {
    let ch = Channel::new()?;
    let mut admin = Queue::open(&ch, dst, 0, 0)?;
    let c = admin.connect_admin(host::NQN, wire::CNTLID_DYNAMIC)?;
    ensure!(c.status == 0, "admin Connect: status {:#06x}", c.status);
    admin.enable()?;
    let mut sqe = host::identify(wire::cns::CTRL, 0);
    admin.out_keyed(&mut sqe, wire::IDENTIFY_LEN as u32);
    let c = admin.call(sqe)?;
    ensure!(
        c.status == 0,
        "Identify Controller: status {:#06x}",
        c.status
    );
    admin.close()
}
