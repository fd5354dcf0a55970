// SPDX-License-Identifier: GPL-2.0
//! The kernel log as records (`/dev/kmsg`): each with its level, sequence
//! number and timestamp, which `dmesg`'s text leaves to its options and
//! the kernel's configuration.  Timestamps are the kernel log's clock:
//! intervals between records are the kernel's own.

use anyhow::{Context, Result};
use std::{io::Read, os::unix::fs::OpenOptionsExt};

/// `KERN_WARNING`: a record at this level or below (more severe) is a
/// warning or an error.
pub const WARNING: u8 = 4;

/// One record of the kernel log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Its level, 0 (emergency) to 7 (debug).
    pub level: u8,
    pub seq: u64,
    /// When it was logged, in microseconds of the kernel log's clock.
    pub usec: u64,
    pub text: String,
}

/// Parses one record as `/dev/kmsg` gives it: `PRIO,SEQ,USEC,FLAGS;TEXT`
/// then dictionary lines (which start with a space).
fn parse(raw: &str) -> Option<Record> {
    let first = raw.lines().next()?;
    let (head, text) = first.split_once(';')?;
    let mut fields = head.split(',');
    let prio: u32 = fields.next()?.parse().ok()?;
    let seq = fields.next()?.parse().ok()?;
    let usec = fields.next()?.parse().ok()?;
    Some(Record {
        level: (prio & 7) as u8,
        seq,
        usec,
        text: text.to_owned(),
    })
}

/// The records the kernel still holds, oldest first.
pub fn records() -> Result<Vec<Record>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .context("open /dev/kmsg")?;
    let mut buf = vec![0u8; 16 << 10];
    let mut records = Vec::new();
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => records.extend(parse(&String::from_utf8_lossy(&buf[..n]))),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // Overwritten while read: the next read goes on from the
            // oldest record left.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("read /dev/kmsg"),
        }
    }
    Ok(records)
}

/// The sequence number of the newest record (0 for none).
pub fn last_seq() -> Result<u64> {
    Ok(records()?.last().map_or(0, |r| r.seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_records() {
        assert_eq!(
            parse("6,1234,5678901,-;rdma_cm_rs_nvmet: controller 1 failed: disconnecting its queues\n SUBSYSTEM=x\n"),
            Some(Record {
                level: 6,
                seq: 1234,
                usec: 5_678_901,
                text: "rdma_cm_rs_nvmet: controller 1 failed: disconnecting its queues".into(),
            })
        );
        // Facility 3 (daemon), level 4: a warning.
        assert_eq!(parse("28,7,8,c;x").map(|r| r.level), Some(WARNING));
        assert_eq!(parse("garbage"), None);
    }

    #[test]
    fn reads_the_log_where_it_may() {
        // Unprivileged, or where dmesg_restrict says no: an error, no panic.
        if let Ok(records) = records() {
            assert!(records.windows(2).all(|w| w[0].seq < w[1].seq));
        }
    }
}
