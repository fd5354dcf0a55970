// SPDX-License-Identifier: GPL-2.0
//! The client of the `rdma_cm_rs_store` sample on librdmacm: PUTs and GETs
//! of the sample's protocol (see `samples/rdma_cm_rs_store.rs`) from
//! several connections at once, every byte checked.

use crate::cm::{self, Channel, Conn, Param};
use crate::report::EventType;
use anyhow::{bail, ensure, Context, Result};
use std::{net::SocketAddr, time::Duration};

/// The sample's largest PUT or GET.
pub const MAX_IO: usize = 64 * 1024;
pub const OP_PUT: u8 = 1;
pub const OP_GET: u8 = 2;
/// A request's flag: answer with SEND_WITH_INV of the request's key.
pub const FLAG_INVALIDATE: u8 = 1;
const T: Duration = Duration::from_secs(10);

/// Transfer sizes, in turn: the smallest, unaligned, a page, a page and a
/// byte, the largest.
const SIZES: &[usize] = &[1, 100, 4096, 4097, 30000, MAX_IO];
/// How many sizes [`SIZES`] has.
pub const SIZE_COUNT: usize = SIZES.len();

/// The sample's module name.
pub const MODULE: &str = "rdma_cm_rs_store";

/// Runs `f` with the sample loaded on `port` ([`with_loaded`]) with a
/// store of `size` bytes, its CQs busy-polled (`busy_poll=1`) or polled
/// from a workqueue, then unloads it.
///
/// [`with_loaded`]: crate::sample_module::with_loaded
pub fn with_sample<R>(
    port: u16,
    size: usize,
    busy_poll: bool,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let size = format!("size={size}");
    let mut params = vec![size.as_str()];
    if busy_poll {
        params.push("busy_poll=1");
    }
    crate::sample_module::with_loaded(MODULE, port, &params, f)
}

/// A request of the sample's protocol.
pub fn request(op: u8, len: usize, offset: u64, buf: (u64, u32), id: u32) -> Vec<u8> {
    request_with(op, 0, len, offset, buf, id)
}

/// [`request`] with `flags` ([`FLAG_INVALIDATE`]).
pub fn request_with(
    op: u8,
    flags: u8,
    len: usize,
    offset: u64,
    buf: (u64, u32),
    id: u32,
) -> Vec<u8> {
    let mut r = Vec::with_capacity(32);
    r.push(op);
    r.push(flags);
    r.extend_from_slice(&[0, 0]);
    r.extend_from_slice(&(len as u32).to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&buf.0.to_be_bytes());
    r.extend_from_slice(&buf.1.to_be_bytes());
    r.extend_from_slice(&id.to_be_bytes());
    r
}

/// Sends `req` and returns the answer's status, checking its id.
pub fn call(conn: &mut Conn<'_>, req: &[u8], id: u32) -> Result<i32> {
    call_inv(conn, req, id).map(|(status, _)| status)
}

/// [`call`], with the key of ours the answer invalidated, if it did.
fn call_inv(conn: &mut Conn<'_>, req: &[u8], id: u32) -> Result<(i32, Option<u32>)> {
    let (answer, invalidated) = conn.send_then_recv_inv(req, T)?;
    ensure!(answer.len() == 8, "answer of {} bytes", answer.len());
    let got = u32::from_be_bytes(answer[..4].try_into()?);
    ensure!(got == id, "answer to request {got}, expected {id}");
    Ok((i32::from_be_bytes(answer[4..].try_into()?), invalidated))
}

/// One connection's work: `rounds` PUT-then-GET pairs of [`SIZES`] in
/// turn, in the store's `span` bytes from `base`, each GET compared with
/// its PUT; then a request past the store's end, which must fail with
/// EINVAL.  Returns the bytes moved and the keys the sample invalidated
/// (see [`through_windows`]).
fn one_connection(
    dst: SocketAddr,
    base: u64,
    span: u64,
    store: u64,
    rounds: usize,
) -> Result<(u64, u64)> {
    let ch = Channel::new()?;
    let id = cm::resolve(&ch, &dst, Duration::from_secs(5))?;
    let mut conn = Conn::new(id)?;
    // The server READs a PUT's bytes: one READ each way in flight.
    let param = Param::with_data(&[]);
    conn.connect(&param, &ch, T)?
        .must_be(EventType::Established)?;
    let region = conn.add_region_with(&vec![0u8; MAX_IO], true, true, true)?;
    let (addr, rkey, _) = conn.region_key(region);
    let mut moved = 0u64;
    for round in 0..rounds {
        let len = SIZES[round % SIZES.len()];
        let offset = base + (round as u64 * 7919) % (span - MAX_IO as u64);
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u64 * 31 + round as u64 * 7 + base) as u8)
            .collect();
        conn.region_mut(region)[..len].copy_from_slice(&data);
        let id = (round * 2) as u32;
        let status = call(
            &mut conn,
            &request(OP_PUT, len, offset, (addr, rkey), id),
            id,
        )?;
        ensure!(
            status == 0,
            "PUT of {len} bytes at {offset}: status {status}"
        );
        conn.region_mut(region).fill(0);
        let id = id + 1;
        let status = call(
            &mut conn,
            &request(OP_GET, len, offset, (addr, rkey), id),
            id,
        )?;
        ensure!(
            status == 0,
            "GET of {len} bytes at {offset}: status {status}"
        );
        if conn.region(region)[..len] != data[..] {
            let at = data
                .iter()
                .zip(conn.region(region))
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            bail!("GET of {len} bytes at {offset}: byte {at} differs from the PUT");
        }
        moved += 2 * len as u64;
    }
    let (through, invalidated) = through_windows(&mut conn, region, addr, base, span)?;
    moved += through;
    let past = request(OP_GET, 16, store - 8, (addr, rkey), 9999);
    let status = call(&mut conn, &past, 9999)?;
    ensure!(
        status == -libc::EINVAL,
        "GET past the store's end: status {status}, expected -EINVAL"
    );
    conn.disconnect()?;
    Ok((moved, invalidated))
}

/// Where the device has memory windows (rxe, not siw): a PUT and a GET of
/// each size through a type 2 window over the region, bound afresh under
/// a new key for each request, asking the sample to answer with
/// SEND_WITH_INV; each answer must say it invalidated that key, and the
/// GET return the PUT's bytes.  Returns the bytes moved and the keys
/// invalidated.
fn through_windows(
    conn: &mut Conn<'_>,
    region: usize,
    addr: u64,
    base: u64,
    span: u64,
) -> Result<(u64, u64)> {
    let Some(window) = conn.add_window()? else {
        return Ok((0, 0));
    };
    let (mut moved, mut invalidated) = (0, 0);
    for (n, &len) in SIZES.iter().enumerate() {
        let offset = base + (n as u64 * 4099) % (span - MAX_IO as u64);
        let data: Vec<u8> = (0..len)
            .map(|i| (i as u64 * 13 + n as u64) as u8 ^ 0x5a)
            .collect();
        conn.region_mut(region)[..len].copy_from_slice(&data);
        for op in [OP_PUT, OP_GET] {
            if op == OP_GET {
                conn.region_mut(region).fill(0);
            }
            let rkey = conn.bind_window(window, region)?;
            let id = 1000 + (n * 2) as u32 + u32::from(op == OP_GET);
            let req = request_with(op, FLAG_INVALIDATE, len, offset, (addr, rkey), id);
            let (status, invalidated_key) = call_inv(conn, &req, id)?;
            ensure!(
                status == 0,
                "op {op} of {len} bytes at {offset} through a window: status {status}"
            );
            ensure!(
                invalidated_key == Some(rkey),
                "op {op} through window key {rkey:#x}: the answer invalidated {invalidated_key:x?}"
            );
            invalidated += 1;
        }
        ensure!(
            conn.region(region)[..len] == data[..],
            "GET of {len} bytes at {offset} through a window differs from the PUT"
        );
        moved += 2 * len as u64;
    }
    Ok((moved, invalidated))
}

/// A request of the sample's protocol as a server reads it: (op, len,
/// offset, client address, rkey, id); `None` if malformed.
pub fn parse_request(m: &[u8]) -> Option<(u8, usize, u64, u64, u32, u32)> {
    if m.len() != 32 || m[1..4] != [0, 0, 0] {
        return None;
    }
    let u32_at = |i: usize| u32::from_be_bytes(m[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_be_bytes(m[i..i + 8].try_into().unwrap_or_default());
    let len = u32_at(4) as usize;
    if !matches!(m[0], OP_PUT | OP_GET) || len == 0 || len > MAX_IO {
        return None;
    }
    Some((m[0], len, u64_at(8), u64_at(16), u32_at(24), u32_at(28)))
}

/// An answer of the sample's protocol.
pub fn answer(id: u32, status: i32) -> Vec<u8> {
    let mut a = id.to_be_bytes().to_vec();
    a.extend_from_slice(&status.to_be_bytes());
    a
}

/// `conns` connections to the sample at `dst` at once, each with
/// `rounds` PUT/GET pairs in its own part of a store of `store` bytes.
pub fn exercise(dst: SocketAddr, conns: usize, rounds: usize, store: u64) -> Result<String> {
    ensure!(conns > 0 && rounds > 0, "no work");
    let span = store / conns as u64;
    ensure!(
        span > MAX_IO as u64,
        "store too small for {conns} connections"
    );
    let workers: Vec<_> = (0..conns)
        .map(|c| {
            let base = c as u64 * span;
            std::thread::spawn(move || one_connection(dst, base, span, store, rounds))
        })
        .collect();
    let (mut moved, mut invalidated) = (0, 0);
    for (c, w) in workers.into_iter().enumerate() {
        let r = w
            .join()
            .map_err(|_| anyhow::anyhow!("connection {c} panicked"))?;
        let (m, i) = r.with_context(|| format!("connection {c}"))?;
        moved += m;
        invalidated += i;
    }
    Ok(format!(
        "connections={conns} rounds={rounds} bytes={moved} invalidated={invalidated}"
    ))
}
