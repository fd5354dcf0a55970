// SPDX-License-Identifier: GPL-2.0
//! What people and parsers read: one line per CM event (the same for the
//! module and the librdmacm peer) and the suite's KTAP.

use crate::payload::show;
use std::{fmt::Write as _, io, time::Duration};

/// The kernel's `enum rdma_cm_event_type` (librdmacm's values too).
pub const EVENT_NAMES: [&str; 16] = [
    "ADDR_RESOLVED",
    "ADDR_ERROR",
    "ROUTE_RESOLVED",
    "ROUTE_ERROR",
    "CONNECT_REQUEST",
    "CONNECT_RESPONSE",
    "CONNECT_ERROR",
    "UNREACHABLE",
    "REJECTED",
    "ESTABLISHED",
    "DISCONNECTED",
    "DEVICE_REMOVAL",
    "MULTICAST_JOIN",
    "MULTICAST_ERROR",
    "ADDR_CHANGE",
    "TIMEWAIT_EXIT",
];
pub const EV_ADDR_RESOLVED: u32 = 0;
pub const EV_ADDR_ERROR: u32 = 1;
pub const EV_ROUTE_RESOLVED: u32 = 2;
pub const EV_CONNECT_REQUEST: u32 = 4;
pub const EV_CONNECT_RESPONSE: u32 = 5;
pub const EV_CONNECT_ERROR: u32 = 6;
pub const EV_UNREACHABLE: u32 = 7;
pub const EV_REJECTED: u32 = 8;
pub const EV_ESTABLISHED: u32 = 9;
pub const EV_DISCONNECTED: u32 = 10;
pub const EV_DEVICE_REMOVAL: u32 = 11;
pub const EV_TIMEWAIT_EXIT: u32 = 15;

pub fn event_name(e: u32) -> &'static str {
    EVENT_NAMES.get(e as usize).copied().unwrap_or("UNKNOWN")
}

/// The connection parameters an event carries, from either side.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnFields {
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
    pub private_data: Vec<u8>,
}

/// Names of the errnos CM events carry.
fn errno_name(e: i32) -> Option<&'static str> {
    Some(match e {
        libc::EINVAL => "EINVAL",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::ENODEV => "ENODEV",
        libc::ENOMEM => "ENOMEM",
        libc::ENODATA => "ENODATA",
        _ => return None,
    })
}

/// IB CM reject reasons (`enum ib_cm_rej_reason`) seen in practice.
fn reject_reason(r: i32) -> Option<&'static str> {
    Some(match r {
        1 => "no QP",
        3 => "no resources",
        4 => "timeout",
        8 => "invalid service id: no listener",
        28 => "consumer defined",
        _ => return None,
    })
}

/// `status=N` with what N means for this event.
pub fn status_text(event: u32, status: i32) -> String {
    let meaning = if event == EV_REJECTED {
        reject_reason(status)
    } else if status < 0 {
        errno_name(-status)
    } else {
        None
    };
    match meaning {
        Some(m) => format!("status={status} ({m})"),
        None => format!("status={status}"),
    }
}

/// One event, one line: `WHO: event NAME IDS status=N [params] [private_data]`.
/// `ids` is what names the id on that side (`id=1 new_id=2` for the module).
pub fn event_line(who: &str, event: u32, ids: &str, status: i32, c: &ConnFields) -> String {
    let mut line = format!("{who}: event {}", event_name(event));
    if !ids.is_empty() {
        line.push(' ');
        line.push_str(ids);
    }
    line.push(' ');
    line.push_str(&status_text(event, status));
    // A request always has parameters; an ESTABLISHED that carries none
    // (the passive side's: the RTU has no parameters) does not show zeros.
    let with_param = event == EV_CONNECT_REQUEST
        || (matches!(event, EV_CONNECT_RESPONSE | EV_ESTABLISHED) && *c != ConnFields::default());
    if with_param {
        let _ = write!(
            line,
            " responder_resources={} initiator_depth={} flow_control={} retry_count={} rnr_retry_count={} srq={} qp_num={:#x}",
            c.responder_resources,
            c.initiator_depth,
            c.flow_control,
            c.retry_count,
            c.rnr_retry_count,
            c.srq,
            c.qp_num
        );
    }
    if with_param || event == EV_REJECTED || !c.private_data.is_empty() {
        line.push(' ');
        line.push_str(&show("private_data", &c.private_data));
    }
    line
}

/// KTAP output: the plan, then one result a test, diagnostics (`# `) first.
pub struct Ktap<W: io::Write> {
    out: W,
    n: usize,
    pub failed: usize,
}

impl<W: io::Write> Ktap<W> {
    pub fn new(mut out: W, tests: usize) -> io::Result<Self> {
        writeln!(out, "TAP version 13")?;
        writeln!(out, "1..{tests}")?;
        out.flush()?;
        Ok(Self {
            out,
            n: 0,
            failed: 0,
        })
    }

    /// A diagnostic line (or several), each prefixed `# `.
    pub fn diag(&mut self, text: &str) -> io::Result<()> {
        for line in text.lines() {
            writeln!(self.out, "# {line}")?;
        }
        self.out.flush()
    }

    /// The result of the next test: a failure's lines become diagnostics.
    pub fn result(
        &mut self,
        name: &str,
        outcome: Result<(), String>,
        took: Duration,
    ) -> io::Result<()> {
        self.n += 1;
        // `#` would start a directive: keep it out of names.
        let name = name.replace('#', "_");
        self.diag(&format!("{name}: {} ms", took.as_millis()))?;
        match outcome {
            Ok(()) => writeln!(self.out, "ok {} - {name}", self.n)?,
            Err(e) => {
                self.failed += 1;
                self.diag(&e)?;
                writeln!(self.out, "not ok {} - {name}", self.n)?;
            }
        }
        self.out.flush()
    }

    #[cfg(test)]
    pub fn into_inner(self) -> W {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_are_the_kernels() {
        assert_eq!(event_name(EV_CONNECT_REQUEST), "CONNECT_REQUEST");
        assert_eq!(event_name(EV_ESTABLISHED), "ESTABLISHED");
        assert_eq!(event_name(EV_DISCONNECTED), "DISCONNECTED");
        assert_eq!(event_name(EV_TIMEWAIT_EXIT), "TIMEWAIT_EXIT");
        assert_eq!(event_name(EV_UNREACHABLE), "UNREACHABLE");
        assert_eq!(event_name(99), "UNKNOWN");
    }

    #[test]
    fn event_lines() {
        let mut c = ConnFields {
            responder_resources: 1,
            initiator_depth: 2,
            retry_count: 7,
            rnr_retry_count: 7,
            private_data: b"hello".to_vec(),
            ..Default::default()
        };
        c.private_data.resize(56, 0);
        assert_eq!(
            event_line("module", EV_CONNECT_REQUEST, "id=1 new_id=2", 0, &c),
            "module: event CONNECT_REQUEST id=1 new_id=2 status=0 responder_resources=1 \
             initiator_depth=2 flow_control=0 retry_count=7 rnr_retry_count=7 srq=0 qp_num=0x0 \
             private_data(56)=\"hello\"+51*\\0"
        );
        assert_eq!(
            event_line("librdmacm", EV_DISCONNECTED, "", 0, &ConnFields::default()),
            "librdmacm: event DISCONNECTED status=0"
        );
        assert_eq!(
            event_line("module", EV_ESTABLISHED, "id=2", 0, &ConnFields::default()),
            "module: event ESTABLISHED id=2 status=0"
        );
        let rej = ConnFields {
            private_data: vec![0xff],
            ..Default::default()
        };
        assert_eq!(
            event_line("module", EV_REJECTED, "id=3", 28, &rej),
            "module: event REJECTED id=3 status=28 (consumer defined) private_data(1)=hex:ff"
        );
        assert_eq!(status_text(EV_ADDR_ERROR, -110), "status=-110 (ETIMEDOUT)");
        assert_eq!(status_text(EV_ADDR_ERROR, -9999), "status=-9999");
    }

    #[test]
    fn ktap_lines() {
        let mut k = Ktap::new(Vec::new(), 2).unwrap();
        k.result("first", Ok(()), Duration::from_millis(5)).unwrap();
        k.result("second#x", Err("bad\nworse".into()), Duration::ZERO)
            .unwrap();
        assert_eq!(k.failed, 1);
        let text = String::from_utf8(k.into_inner()).unwrap();
        assert_eq!(
            text,
            "TAP version 13\n1..2\n# first: 5 ms\nok 1 - first\n# second_x: 0 ms\n\
             # bad\n# worse\nnot ok 2 - second_x\n"
        );
    }
}
