// SPDX-License-Identifier: GPL-2.0
//! Connection setup, sequential cycles, each step timed as `cmtime` times
//! them: the module through its ioctls (asynchronous ids with GET_EVENT, or
//! synchronous ids whose calls return with their event) and a plain
//! librdmacm id ([`crate::cm`], its event channel), active against a
//! listener of the counterpart, passive against its client.

use super::peer::{self, T};
use super::{Block, Steps};
use crate::cm::{self, Channel, Conn};
use crate::report::EventType;
use crate::uapi::{self, Device, Event, Param};
use anyhow::{anyhow, bail, Context, Result};
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

/// The steps of an active cycle.  The user side's `connect` includes
/// creating its PD, CQs, QP and buffers (`Conn::new`), which the module
/// does inside CONNECT.
pub const ACTIVE: [&str; 6] = [
    "create id",
    "resolve addr",
    "resolve route",
    "connect",
    "disconnect",
    "destroy",
];
/// The steps of a passive cycle: `request` runs from the counterpart's go
/// (it then resolves and connects) to the CONNECT_REQUEST; `accept` from
/// there to ESTABLISHED (the user side creating its QP on the way).
pub const PASSIVE: [&str; 4] = ["request", "accept", "disconnect", "destroy"];

/// Address and route resolution timeout of the module's ids, in ms.
const RESOLVE_MS: u32 = 5000;
/// Longest wait of a synchronous call and of GET_EVENT, in ms.
const WAIT_MS: u32 = 20_000;

/// The module's next event for `id` (events of other ids are skipped),
/// which must be `want`.
pub fn wait_for(dev: &Device, id: u32, want: EventType) -> Result<Event> {
    let deadline = Instant::now() + Duration::from_millis(WAIT_MS.into());
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("no {} for id {id} within {WAIT_MS} ms", want.name());
        }
        let ms = u32::try_from(left.as_millis()).unwrap_or(WAIT_MS).max(1);
        let ev = dev
            .get_event(ms)
            .map_err(|e| anyhow!("GET_EVENT waiting for {}: {e}", want.name()))?;
        if ev.id != id {
            continue;
        }
        if ev.event != want {
            bail!(
                "id {id}: expected {} but got {} (status {})",
                want.name(),
                ev.name(),
                ev.status
            );
        }
        return Ok(ev);
    }
}

/// A synchronous call's result, which must have returned `want`.
fn sync_ok(what: &str, r: (uapi::Result<()>, Option<Event>), want: EventType) -> Result<()> {
    match r {
        (Ok(()), Some(ev)) if ev.event == want => Ok(()),
        (res, ev) => bail!(
            "{what}: {res:?}, event {:?} instead of {}",
            ev.map(|e| (e.name(), e.status)),
            want.name()
        ),
    }
}

/// The module active: `cycles` connections to the counterpart listening on
/// `dst`, with asynchronous ids, or synchronous ones (`sync`).
pub fn kernel_active(dst: SocketAddr, cycles: usize, sync: bool) -> Result<Block> {
    let dev = Device::open_async().with_context(|| format!("open {}", uapi::DEVICE))?;
    let flags = if sync { uapi::RDMA_CM_RS_ID_SYNC } else { 0 };
    let p = Param::with_data(&[]);
    let mut steps = Steps::new(&ACTIVE);
    let cpu = super::stats::Cpu::start();
    for c in 0..cycles {
        let t0 = Instant::now();
        let id = dev
            .create_id_flags(
                c as u64,
                uapi::RDMA_CM_RS_PS_TCP,
                uapi::RDMA_CM_RS_QPT_RC,
                flags,
            )
            .context("CREATE_ID")?;
        let mut t = vec![t0, Instant::now()];
        let r = (|| -> Result<()> {
            if sync {
                sync_ok(
                    "RESOLVE_ADDR",
                    dev.sync_resolve_addr(id, &dst, RESOLVE_MS, WAIT_MS),
                    EventType::AddrResolved,
                )?;
                t.push(Instant::now());
                sync_ok(
                    "RESOLVE_ROUTE",
                    dev.sync_resolve_route(id, RESOLVE_MS, WAIT_MS),
                    EventType::RouteResolved,
                )?;
                t.push(Instant::now());
                sync_ok(
                    "CONNECT",
                    dev.sync_connect(id, &p, WAIT_MS),
                    EventType::Established,
                )?;
                t.push(Instant::now());
                sync_ok(
                    "DISCONNECT",
                    dev.sync_disconnect(id, WAIT_MS),
                    EventType::Disconnected,
                )?;
                t.push(Instant::now());
            } else {
                dev.resolve_addr(id, &dst, RESOLVE_MS)
                    .context("RESOLVE_ADDR")?;
                wait_for(&dev, id, EventType::AddrResolved)?;
                t.push(Instant::now());
                dev.resolve_route(id, RESOLVE_MS).context("RESOLVE_ROUTE")?;
                wait_for(&dev, id, EventType::RouteResolved)?;
                t.push(Instant::now());
                dev.connect(id, &p).context("CONNECT")?;
                wait_for(&dev, id, EventType::Established)?;
                t.push(Instant::now());
                dev.disconnect(id).context("DISCONNECT")?;
                wait_for(&dev, id, EventType::Disconnected)?;
                t.push(Instant::now());
            }
            Ok(())
        })();
        if let Err(e) = r {
            let _ = dev.destroy(id);
            return Err(e.context(format!("cycle {}", c + 1)));
        }
        dev.destroy(id).context("DESTROY_ID")?;
        t.push(Instant::now());
        steps.add(&t);
    }
    Ok(steps.block(cycles, &cpu))
}

/// The module passive: a listener on `addr`, the counterpart's client
/// connecting `cycles` times; the module accepts, then disconnects.
pub fn kernel_passive(addr: SocketAddr, cycles: usize) -> Result<Block> {
    let dev = Device::open_async().with_context(|| format!("open {}", uapi::DEVICE))?;
    let p = Param::with_data(&[]);
    let l = dev.create_id(0).context("CREATE_ID")?;
    dev.bind(l, &addr).context("BIND")?;
    dev.listen(l, 128).context("LISTEN")?;
    let mut client = peer::client(addr)?;
    let mut steps = Steps::new(&PASSIVE);
    let cpu = super::stats::Cpu::start();
    for c in 0..cycles {
        let r = (|| -> Result<Vec<Instant>> {
            client.go()?;
            let mut t = vec![Instant::now()];
            let req = wait_for(&dev, l, EventType::ConnectRequest)?;
            let id = req.new_id;
            t.push(Instant::now());
            let r = (|| -> Result<()> {
                dev.accept(id, Some(&p)).context("ACCEPT")?;
                wait_for(&dev, id, EventType::Established)?;
                t.push(Instant::now());
                dev.disconnect(id).context("DISCONNECT")?;
                wait_for(&dev, id, EventType::Disconnected)?;
                t.push(Instant::now());
                Ok(())
            })();
            if let Err(e) = r {
                let _ = dev.destroy(id);
                return Err(e);
            }
            dev.destroy(id).context("DESTROY_ID")?;
            t.push(Instant::now());
            client.done()?;
            Ok(t)
        })();
        match r {
            Ok(t) => steps.add(&t),
            Err(e) => {
                let _ = client.finish();
                return Err(e.context(format!("cycle {}", c + 1)));
            }
        }
    }
    let block = steps.block(cycles, &cpu);
    client.finish()?;
    Ok(block.with_counterpart(super::per_op_us(client.cpu(), cycles)))
}

/// librdmacm active, as [`kernel_active`].
pub fn user_active(dst: SocketAddr, cycles: usize) -> Result<Block> {
    let ch = Channel::new()?;
    let mut steps = Steps::new(&ACTIVE);
    let cpu = super::stats::Cpu::start();
    for c in 0..cycles {
        let r = user_cycle(&ch, dst, |_| Ok(()));
        steps.add(&r.with_context(|| format!("cycle {}", c + 1))?);
    }
    Ok(steps.block(cycles, &cpu))
}

/// One librdmacm connection to `dst`, made and ended: the instant before
/// each of the [`ACTIVE`] steps and after the last.  `established` checks
/// the ESTABLISHED event.
pub fn user_cycle(
    ch: &Channel,
    dst: SocketAddr,
    established: impl FnOnce(&cm::CmEvent<'_>) -> Result<()>,
) -> Result<Vec<Instant>> {
    let mut t = vec![Instant::now()];
    let id = cm::create_id(ch)?;
    t.push(Instant::now());
    cm::resolve_addr(ch, &id, &dst, T)?;
    t.push(Instant::now());
    cm::resolve_route(ch, &id, T)?;
    t.push(Instant::now());
    let conn = Conn::new(id)?;
    let ev = conn.connect(&cm::Param::with_data(&[]), ch, T)?;
    ev.must_be(EventType::Established)?;
    established(&ev)?;
    t.push(Instant::now());
    end_timed(conn, ch, &mut t)?;
    Ok(t)
}

/// The side's disconnect, awaited, then its destruction, each step's end
/// pushed on `t`.
fn end_timed(conn: Conn<'_>, ch: &Channel, t: &mut Vec<Instant>) -> Result<()> {
    conn.disconnect()?;
    ch.expect(EventType::Disconnected, T)?;
    t.push(Instant::now());
    drop(conn);
    t.push(Instant::now());
    Ok(())
}

/// librdmacm passive, as [`kernel_passive`].
pub fn user_passive(addr: SocketAddr, cycles: usize) -> Result<Block> {
    let ch = Channel::new()?;
    let p = cm::Param::with_data(&[]);
    let _listener = cm::listen(&ch, &addr, 128)?;
    let mut client = peer::client(addr)?;
    let mut steps = Steps::new(&PASSIVE);
    let cpu = super::stats::Cpu::start();
    for c in 0..cycles {
        let r = (|| -> Result<Vec<Instant>> {
            client.go()?;
            let mut t = vec![Instant::now()];
            let mut req = ch.expect(EventType::ConnectRequest, T)?;
            t.push(Instant::now());
            let conn = Conn::new(req.take_request()?)?;
            conn.accept(&p)?;
            ch.expect(EventType::Established, T)?;
            t.push(Instant::now());
            end_timed(conn, &ch, &mut t)?;
            client.done()?;
            Ok(t)
        })();
        match r {
            Ok(t) => steps.add(&t),
            Err(e) => {
                let _ = client.finish();
                return Err(e.context(format!("cycle {}", c + 1)));
            }
        }
    }
    let block = steps.block(cycles, &cpu);
    client.finish()?;
    Ok(block.with_counterpart(super::per_op_us(client.cpu(), cycles)))
}
