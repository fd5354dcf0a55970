// SPDX-License-Identifier: GPL-2.0
//! rping's client (rdma-core `rping.c`, `rping_test_client`) on the module,
//! for `ctl rping` and the suite: the pings of one established connection.

use crate::payload;
use crate::uapi::{Device, RDMA_CM_RS_ACCESS_REMOTE_READ, RDMA_CM_RS_ACCESS_REMOTE_WRITE};
use anyhow::{ensure, Context, Result};
use std::time::Duration;

/// The sizes of a ping: room for `rdma-ping-%d: ` with any int and its
/// NUL, up to rping's buffer of 64 KiB (`RPING_BUFSIZE`, what the
/// rdma_cm_rs_rping sample takes at most).
pub const MIN_SIZE: u32 = 24;
pub const MAX_SIZE: u32 = 65536;

/// The largest ping an unmodified `rping -s` takes: its `-S` must hold the
/// client's ping, and it refuses 65536 (`RPING_BUFSIZE - 1` is its limit).
pub const RPING_MAX_SIZE: u32 = 65535;

/// How long the module waits for each go-ahead of the server.
const GO_AHEAD_MS: u32 = 15_000;

/// What ping `ping` of `size` bytes carries, as `rping -c` fills it:
/// `rdma-ping-N: `, then ASCII from `A` to `z` over and over, starting one
/// letter further each ping, and a NUL as the last byte.
pub fn ping_text(ping: u32, size: usize) -> Vec<u8> {
    const FIRST: u32 = b'A' as u32;
    const LETTERS: u32 = (b'z' - b'A' + 1) as u32;
    let mut text = format!("rdma-ping-{ping}: ").into_bytes();
    let mut c = FIRST + ping % LETTERS;
    while text.len() < size {
        text.push(c as u8);
        c = if c >= u32::from(b'z') { FIRST } else { c + 1 };
    }
    text.truncate(size);
    if let Some(last) = text.last_mut() {
        *last = 0;
    }
    text
}

/// Runs `count` pings of `size` bytes on the established RC connection
/// `id`: registers a source region (remote READ) and a sink region (remote
/// WRITE); per ping, fills the source with [`ping_text`], SENDs its advert
/// (rping's 16 bytes: address, rkey, length), waits for the go-ahead (the
/// server has READ it), SENDs the sink's advert, waits for the go-ahead
/// (the server has WRITTEN it back), and checks every byte of the sink
/// (rping's `-V`).  Deregisters both regions; the caller disconnects.
pub fn ping(dev: &Device, id: u32, count: u32, size: u32, interval: Duration) -> Result<()> {
    ensure!(
        (MIN_SIZE..=MAX_SIZE).contains(&size),
        "size must be {MIN_SIZE}..={MAX_SIZE}"
    );
    let (source, saddr, skey) = dev
        .mr_reg(id, size, RDMA_CM_RS_ACCESS_REMOTE_READ)
        .context("MR_REG source")?;
    let (sink, kaddr, kkey) = dev
        .mr_reg(id, size, RDMA_CM_RS_ACCESS_REMOTE_WRITE)
        .context("MR_REG sink")?;
    for n in 0..count {
        let text = ping_text(n, size as usize);
        dev.mr_write(id, source, 0, &text)?;
        dev.mr_write(id, sink, 0, &vec![0; size as usize])?;
        dev.send(id, &payload::advert(saddr, skey, size))
            .with_context(|| format!("ping {n}: send the source advert"))?;
        go_ahead(dev, id, n, "READ")?;
        dev.send(id, &payload::advert(kaddr, kkey, size))
            .with_context(|| format!("ping {n}: send the sink advert"))?;
        go_ahead(dev, id, n, "WRITE")?;
        let back = dev.mr_read(id, sink, 0, size as usize)?;
        payload::verify(&format!("ping {n}"), &text, &back)?;
        std::thread::sleep(interval);
    }
    dev.mr_dereg(id, source)?;
    dev.mr_dereg(id, sink)?;
    Ok(())
}

/// The server's go-ahead after its RDMA `op`: its 16-byte send buffer.
fn go_ahead(dev: &Device, id: u32, ping: u32, op: &str) -> Result<()> {
    let go = dev
        .recv(id, crate::cm::MSG, GO_AHEAD_MS)
        .with_context(|| format!("ping {ping}: the go-ahead after the RDMA {op}"))?;
    ensure!(
        go.len() == 16,
        "ping {ping}: a go-ahead of {} bytes after the RDMA {op}",
        go.len()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_are_rpings_text() {
        let p = ping_text(0, 32);
        assert_eq!(&p, b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        assert_eq!(&ping_text(1, 20), b"rdma-ping-1: BCDEFG\0");
        // The letters wrap from z to A, and so does the start.
        assert_eq!(&ping_text(57, 18), b"rdma-ping-57: zAB\0");
        assert_eq!(&ping_text(58, 18), b"rdma-ping-58: ABC\0");
        assert_eq!(ping_text(3, 65535).len(), 65535);
    }
}
