// SPDX-License-Identifier: GPL-2.0
//! The data path over one connection to the counterpart's data server
//! ([`super::peer::data_server`]): round trips (a message and its echo),
//! send throughput, RDMA WRITE and READ throughput.  The module moves at
//! most `max_message` bytes a SEND (INFO; 4096); a round trip is one
//! SEND_RECV, as the librdmacm side's is one post and its polls.  Both
//! sides send without waiting for each send's completion: the module with
//! `RDMA_CM_RS_SEND_NOWAIT` (up to `send_window`, 16, in flight), the
//! librdmacm side with up to as many posted; in a round trip neither waits
//! for the send's ACK before it waits for the answer.  The librdmacm side
//! busy-polls its CQs (as perftest does), and so does the module's, on a
//! busy-polling id (`RDMA_CM_RS_ID_BUSY_POLL`: its RECV, SEND and RDMA
//! poll the CQ in the caller's task for the first ms of a wait, then
//! sleep until the device notifies); the `data-sleeping` group measures
//! the module's waits that sleep at once.

use super::peer::{self, ACK, ECHO, QUIT, SINK, T};
use super::stats::Cpu;
use super::{Block, Target};
use crate::cm::{self, Channel, Conn, RdmaOp};
use crate::report::EventType;
use crate::uapi::{self, Device, Param};
use anyhow::{bail, Context, Result};
use std::{net::SocketAddr, time::Instant};

/// How much of each.
#[derive(Clone, Copy)]
pub struct Sizes {
    pub round_trips: usize,
    pub small: usize,
    pub large: usize,
    pub messages: usize,
    pub rdma_ops: usize,
}

/// Longest RECV wait of the module's side, in ms.
const RECV_MS: u32 = 10_000;

fn us(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e6
}

/// The targets of issue 16/16 for the round trips: level with the
/// busy-polling user side when the module busy-polls, within 1.5x of it
/// when its waits sleep; and the driving thread's CPU per operation at
/// most half the user side's on every row of the data group.
const RTT_TARGET_BUSY: Target = Target::AtMost(1.0);
const RTT_TARGET_SLEEPING: Target = Target::AtMost(1.5);
const CPU_TARGET: Target = Target::AtMost(0.5);

/// The blocks every side produces, named alike.
pub(super) fn rtt_block(size: usize, v: Vec<f64>, cpu: &Cpu, target: Target) -> Block {
    let n = v.len();
    Block {
        name: format!("round trip {size} B"),
        ops: n,
        dists: vec![(String::new(), v)],
        rate: None,
        dist_target: target,
        cpu: cpu.per_op(n),
        cpu_target: CPU_TARGET,
        counterpart_us: None,
    }
}

fn rate_block(name: String, ops: usize, bytes: usize, cpu: &Cpu) -> Block {
    let c = cpu.per_op(ops);
    let mbs = (ops * bytes) as f64 / c.wall.as_secs_f64().max(1e-9) / 1e6;
    Block {
        name,
        ops,
        dists: Vec::new(),
        rate: Some((mbs, "MB/s", Target::AtLeast(1.0))),
        dist_target: Target::None,
        cpu: c,
        cpu_target: CPU_TARGET,
        counterpart_us: None,
    }
}

pub fn send_name(size: usize) -> String {
    format!("send {size} B (window {})", cm::SEND_WINDOW)
}

pub fn rdma_name(op: &str, len: usize) -> String {
    format!("RDMA {op} {} KiB", len / 1024)
}

/// The module's side: connects to the data server at `dst`.
pub fn kernel(dst: SocketAddr, s: Sizes, busy_poll: bool) -> Result<Vec<Block>> {
    let dev = Device::open_async().with_context(|| format!("open {}", uapi::DEVICE))?;
    let flags = if busy_poll {
        uapi::RDMA_CM_RS_ID_BUSY_POLL
    } else {
        0
    };
    let id = dev
        .create_id_flags(0, uapi::RDMA_CM_RS_PS_TCP, uapi::RDMA_CM_RS_QPT_RC, flags)
        .context("CREATE_ID")?;
    dev.resolve_addr(id, &dst, 5000).context("RESOLVE_ADDR")?;
    super::conn::wait_for(&dev, id, EventType::AddrResolved)?;
    dev.resolve_route(id, 5000).context("RESOLVE_ROUTE")?;
    super::conn::wait_for(&dev, id, EventType::RouteResolved)?;
    dev.connect(id, &Param::with_data(&[])).context("CONNECT")?;
    super::conn::wait_for(&dev, id, EventType::Established)?;
    let adv = dev
        .recv(id, s.large, RECV_MS)
        .context("RECV of the advertisement")?;
    let (raddr, rkey, rlen) = peer::parse_advert(&adv)?;
    let mut out = Vec::new();
    for size in [s.small, s.large] {
        let msg = vec![ECHO; size];
        let mut v = Vec::with_capacity(s.round_trips);
        let cpu = Cpu::start();
        for i in 0..s.round_trips {
            let t0 = Instant::now();
            let r = dev
                .send_recv(id, &msg, size, RECV_MS)
                .with_context(|| format!("SEND_RECV of round trip {}", i + 1))?;
            v.push(us(t0));
            if r.len() != size {
                bail!("echo of {} bytes, not {size}", r.len());
            }
        }
        let target = if busy_poll {
            RTT_TARGET_BUSY
        } else {
            RTT_TARGET_SLEEPING
        };
        out.push(rtt_block(size, v, &cpu, target));
    }
    let msg = vec![SINK; s.large];
    let cpu = Cpu::start();
    for i in 0..s.messages {
        dev.send_nowait(id, &msg)
            .with_context(|| format!("SEND of message {}", i + 1))?;
    }
    // Answered once the peer received every message before it.
    dev.send_nowait(id, &[ACK])
        .context("SEND of the ack request")?;
    dev.recv(id, s.large, RECV_MS).context("RECV of the ack")?;
    out.push(rate_block(send_name(s.large), s.messages, s.large, &cpu));
    let len = rlen.min(uapi::RDMA_CM_RS_MAX_MR_LEN);
    let (mr, _, _) = dev.mr_reg(id, len, 0).context("MR_REG")?;
    for (op, name) in [
        (uapi::RDMA_CM_RS_RDMA_WRITE, "WRITE"),
        (uapi::RDMA_CM_RS_RDMA_READ, "READ"),
    ] {
        let cpu = Cpu::start();
        for i in 0..s.rdma_ops {
            dev.rdma(id, op, mr, 0, len, raddr, rkey)
                .with_context(|| format!("RDMA {name} {}", i + 1))?;
        }
        out.push(rate_block(
            rdma_name(name, len as usize),
            s.rdma_ops,
            len as usize,
            &cpu,
        ));
    }
    dev.mr_dereg(id, mr).context("MR_DEREG")?;
    dev.send(id, &[QUIT]).context("SEND of quit")?;
    dev.disconnect(id).context("DISCONNECT")?;
    super::conn::wait_for(&dev, id, EventType::Disconnected)?;
    dev.destroy(id).context("DESTROY_ID")?;
    Ok(out)
}

/// A thread-local setting of [`cm`] (`set` its setter: busy polling,
/// sleeping waits), on until dropped.
pub(super) struct ThreadSetting(fn(bool));

impl ThreadSetting {
    pub(super) fn on(set: fn(bool)) -> Self {
        set(true);
        Self(set)
    }
}

impl Drop for ThreadSetting {
    fn drop(&mut self) {
        (self.0)(false);
    }
}

/// A connection of the counterpart to `dst` on `ch`, ESTABLISHED: no
/// private data, one RDMA READ each way.
pub(super) fn connected(ch: &Channel, dst: SocketAddr) -> Result<Conn<'_>> {
    let id = cm::resolve(ch, &dst, T)?;
    let conn = Conn::new(id)?;
    conn.connect(&cm::Param::with_data(&[]), ch, T)?
        .must_be(EventType::Established)?;
    Ok(conn)
}

/// The librdmacm side, the same work as [`kernel`]: busy-polling its CQs,
/// or with `busy_poll` false sleeping until a completion is notified.
pub fn user(dst: SocketAddr, s: Sizes, busy_poll: bool) -> Result<Vec<Block>> {
    let _busy = busy_poll.then(|| ThreadSetting::on(cm::set_busy_poll));
    let ch = Channel::new()?;
    let mut conn = {
        let _sleeping = (!busy_poll).then(|| ThreadSetting::on(cm::set_notified_waits));
        connected(&ch, dst)?
    };
    let adv = conn.recv(T).context("the advertisement")?;
    let (raddr, rkey, rlen) = peer::parse_advert(&adv)?;
    let recv_t = std::time::Duration::from_millis(RECV_MS.into());
    let mut out = Vec::new();
    for size in [s.small, s.large] {
        let msg = vec![ECHO; size];
        let mut v = Vec::with_capacity(s.round_trips);
        let cpu = Cpu::start();
        for i in 0..s.round_trips {
            let t0 = Instant::now();
            let r = conn
                .send_then_recv(&msg, recv_t)
                .with_context(|| format!("round trip {}", i + 1))?;
            v.push(us(t0));
            if r.len() != size {
                bail!("echo of {} bytes, not {size}", r.len());
            }
        }
        out.push(rtt_block(size, v, &cpu, RTT_TARGET_BUSY));
    }
    let msg = vec![SINK; s.large];
    let cpu = Cpu::start();
    conn.send_stream(&msg, s.messages, cm::SEND_WINDOW)
        .context("the messages")?;
    conn.send(&[ACK]).context("send of the ack request")?;
    conn.recv(recv_t).context("the ack")?;
    out.push(rate_block(send_name(s.large), s.messages, s.large, &cpu));
    let len = rlen.min(uapi::RDMA_CM_RS_MAX_MR_LEN);
    let region = conn.add_region(&vec![0u8; len as usize], false, false)?;
    for (op, name) in [(RdmaOp::Write, "WRITE"), (RdmaOp::Read, "READ")] {
        let cpu = Cpu::start();
        for i in 0..s.rdma_ops {
            let st = conn
                .rdma(op, region, 0, len, raddr, rkey)
                .with_context(|| format!("RDMA {name} {}", i + 1))?;
            if st != 0 {
                bail!("RDMA {name} {}: work completion status {st}", i + 1);
            }
        }
        out.push(rate_block(
            rdma_name(name, len as usize),
            s.rdma_ops,
            len as usize,
            &cpu,
        ));
    }
    conn.send(&[QUIT]).context("send of quit")?;
    conn.disconnect()?;
    ch.expect(EventType::Disconnected, T)?;
    Ok(out)
}
