// SPDX-License-Identifier: GPL-2.0
//! The in-kernel consumer with no ioctl in its loop: the sample
//! `rdma_cm_rs_echo.ko` (it accepts inside its connection-request callback
//! and sends each message back from its completion handler, all on the
//! safe layer) as the side under test, passive, against the same echo
//! service in user space ([`peer::echo_server`]: librdmacm, one thread
//! busy-polling its event channel and CQs).  Both face the same
//! counterpart, a librdmacm client in the driving thread that
//! busy-polls: connection cycles timed per step, and round trips.  What
//! differs between the two sides is only the server's work: answering a
//! request, and turning a message around.  The sample busy-polls too
//! (`busy_poll=1`: a loop of each connection's own polls its CQ); the
//! `sample-sleeping` group measures it with its completions run by a
//! workqueue's worker, woken for each.

use super::conn::{self, ACTIVE};
use super::data::{self, Sizes, ThreadSetting};
use super::peer::{self, T};
use super::stats::{Cpu, Target};
use super::{Block, Steps};
use crate::cm::{self, Channel};
use crate::report::EventType;
use anyhow::{bail, ensure, Context, Result};
use std::{net::SocketAddr, time::Instant};

/// The group's name, the prefix of its blocks.
pub const NAME: &str = "echo service";

/// The sample's module name.
const MODULE: &str = "rdma_cm_rs_echo";

/// The sample loaded with its listener on a port, unloaded (which
/// destroys whatever connections are left) when dropped.
struct Loaded;

impl Loaded {
    fn insmod(port: u16, busy_poll: bool) -> Result<Self> {
        let params: &[&str] = if busy_poll { &["busy_poll=1"] } else { &[] };
        crate::sample_module::load_with(MODULE, port, params)?;
        Ok(Self)
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        if let Err(e) = crate::sample_module::unload(MODULE) {
            eprintln!("bench: {e:#}");
        }
    }
}

/// The sample serves at `addr` (it listens on every address at its port),
/// busy-polling or not.
pub fn kernel(addr: SocketAddr, cycles: usize, s: Sizes, busy_poll: bool) -> Result<Vec<Block>> {
    let _loaded = Loaded::insmod(addr.port(), busy_poll)?;
    client(addr, cycles, s)
}

/// The user-space echo service serves at `addr`.
pub fn user(addr: SocketAddr, cycles: usize, s: Sizes) -> Result<Vec<Block>> {
    let mut server = peer::echo_server(addr)?;
    let r = client(addr, cycles, s);
    let end = server.finish().context("the user-space echo server");
    let blocks = r?;
    end?;
    Ok(blocks)
}

/// The counterpart: `cycles` connections made and ended one after the
/// other, then one connection for the round trips.
fn client(dst: SocketAddr, cycles: usize, s: Sizes) -> Result<Vec<Block>> {
    let _busy = ThreadSetting::on(cm::set_busy_poll);
    let ch = Channel::new()?;
    let mut steps = Steps::new(&ACTIVE);
    let cpu = Cpu::start();
    for c in 0..cycles {
        let r = conn::user_cycle(&ch, dst, |ev| {
            ensure!(
                ev.private_data.starts_with(peer::ECHO_ACCEPT_DATA),
                "accepted with {:?}",
                ev.private_data
            );
            Ok(())
        });
        steps.add(&r.with_context(|| format!("cycle {}", c + 1))?);
    }
    let mut blocks = vec![steps.block(cycles, &cpu)];
    blocks[0].name = format!("{NAME}: connect");

    let mut conn = data::connected(&ch, dst)?;
    for size in [s.small, s.large] {
        // Every round trip's message differs from the one before it, so
        // that a stale buffer cannot pass for the echo.
        let mut v = Vec::with_capacity(s.round_trips);
        let cpu = Cpu::start();
        for i in 0..s.round_trips {
            let msg = vec![(i % 251) as u8; size];
            let t0 = Instant::now();
            let answer = conn
                .send_then_recv(&msg, T)
                .with_context(|| format!("round trip {} of {size} B", i + 1))?;
            v.push(t0.elapsed().as_secs_f64() * 1e6);
            if answer != msg {
                bail!("round trip {} of {size} B: the echo differs", i + 1);
            }
        }
        // The sample's target is its own (0.8x, of an earlier issue); the
        // driving thread is the counterpart here, whose CPU has none.
        let mut b = data::rtt_block(size, v, &cpu, Target::AtMost(0.8));
        b.cpu_target = Target::None;
        b.name = format!("{NAME}: {}", b.name);
        blocks.push(b);
    }
    conn.disconnect()?;
    ch.expect(EventType::Disconnected, T)?;
    Ok(blocks)
}
