// SPDX-License-Identifier: GPL-2.0
//! The storage sample `rdma_cm_rs_store.ko` (an SRQ per device, the R/W
//! API moving the client's buffers, a GET's answer chained behind its
//! WRITE) against the same protocol served from user space
//! ([`peer::store_server`]: librdmacm, RDMA READ and WRITE straight between
//! the client's buffer and a registered store, each waited for, then the
//! answer).  Both face the same counterpart: a librdmacm client that
//! busy-polls, PUTting and GETting one request at a time.  The sample
//! copies between its store and the transfer's pages; the user-space
//! server moves the bytes in place.  The sample's CQs are busy-polled
//! (`busy_poll=1`); the `store-sleeping` group measures it with its
//! completions run by a workqueue's worker, woken for each.

use super::data::{self, ThreadSetting};
use super::peer::{self, T};
use super::stats::{Cpu, Target};
use super::Block;
use crate::cm::{self, Channel};
use crate::report::EventType;
use crate::store::{call, request, MAX_IO, OP_GET, OP_PUT};
use anyhow::{ensure, Context, Result};
use std::{net::SocketAddr, time::Instant};

/// The group's name, the prefix of its blocks.
pub const NAME: &str = "store";

/// The store's size on both sides.
pub const SIZE: usize = 4 << 20;

/// The transfer sizes measured.
const SIZES: [usize; 2] = [4096, MAX_IO];

/// The sample serves at `addr` (every address at its port), its CQs
/// busy-polled (`busy_poll=1`) or polled from a workqueue.
pub fn kernel(addr: SocketAddr, ops: usize, busy_poll: bool) -> Result<Vec<Block>> {
    crate::store::with_sample(addr.port(), SIZE, busy_poll, || client(addr, ops))
}

/// The user-space store serves at `addr`.
pub fn user(addr: SocketAddr, ops: usize) -> Result<Vec<Block>> {
    let mut server = peer::store_server(addr, SIZE)?;
    let r = client(addr, ops);
    let end = server.finish().context("the user-space store server");
    let blocks = r?;
    end?;
    Ok(blocks)
}

/// The counterpart: one connection, `ops` PUTs then `ops` GETs of each
/// size, one at a time, each GET's bytes checked once.
fn client(dst: SocketAddr, ops: usize) -> Result<Vec<Block>> {
    let _busy = ThreadSetting::on(cm::set_busy_poll);
    let ch = Channel::new()?;
    let mut conn = data::connected(&ch, dst)?;
    let region = conn.add_region(&vec![0u8; MAX_IO], true, true)?;
    let (addr, rkey, _) = conn.region_key(region);
    let mut blocks = Vec::new();
    for size in SIZES {
        let data: Vec<u8> = (0..size).map(|i| (i * 13 + size) as u8).collect();
        conn.region_mut(region)[..size].copy_from_slice(&data);
        for (op, what) in [(OP_PUT, "PUT"), (OP_GET, "GET")] {
            let mut v = Vec::with_capacity(ops);
            let cpu = Cpu::start();
            for i in 0..ops {
                let offset = ((i * size) % (SIZE - size)) as u64;
                let req = request(op, size, offset, (addr, rkey), i as u32);
                let t0 = Instant::now();
                let status = call(&mut conn, &req, i as u32)?;
                v.push(t0.elapsed().as_secs_f64() * 1e6);
                ensure!(status == 0, "{what} {} of {size} B: status {status}", i + 1);
            }
            let c = cpu.per_op(ops);
            let mbs = (ops * size) as f64 / c.wall.as_secs_f64().max(1e-9) / 1e6;
            blocks.push(Block {
                name: format!("{NAME}: {what} {size} B"),
                ops,
                dists: vec![(String::new(), v)],
                dist_target: Target::AtMost(0.8),
                rate: Some((mbs, "MB/s", Target::AtLeast(1.0))),
                cpu: c,
                cpu_target: Target::None,
                counterpart_us: None,
            });
        }
        // The last GET brought back what the PUTs wrote there.
        ensure!(
            conn.region(region)[..size] == data[..],
            "GET of {size} B: the bytes differ from the PUT's"
        );
    }
    conn.disconnect()?;
    ch.expect(EventType::Disconnected, T)?;
    Ok(blocks)
}
