// SPDX-License-Identifier: GPL-2.0
//! What people and parsers read: one line per CM event (the same for the
//! module and the librdmacm peer) and the suite's KTAP.

use crate::payload::show;
use std::{fmt::Write as _, io, time::Duration};

/// Defines [`EventType`] from one table: variant, number, name.
macro_rules! event_types {
    ($($variant:ident = $n:literal $name:literal,)*) => {
        /// The kernel's `enum rdma_cm_event_type`: the numbers of the
        /// module's ABI (`rdma_cm_rs_event.event`), and librdmacm's enum of
        /// the same name has the same values (`cm` maps it).  A number
        /// without a name here stays representable as [`EventType::Unknown`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum EventType {
            $($variant,)*
            /// A number this tool has no name for (printed `UNKNOWN`).
            Unknown(UnknownEvent),
        }

        impl EventType {
            /// The kernel's name without `RDMA_CM_EVENT_`, or `UNKNOWN`.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $name,)*
                    Self::Unknown(_) => "UNKNOWN",
                }
            }

            /// The number, as the ABI carries it.
            pub fn value(self) -> u32 {
                match self {
                    $(Self::$variant => $n,)*
                    Self::Unknown(u) => u.0,
                }
            }
        }

        impl From<u32> for EventType {
            fn from(n: u32) -> Self {
                match n {
                    $($n => Self::$variant,)*
                    _ => Self::Unknown(UnknownEvent(n)),
                }
            }
        }
    };
}

event_types! {
    AddrResolved = 0 "ADDR_RESOLVED",
    AddrError = 1 "ADDR_ERROR",
    RouteResolved = 2 "ROUTE_RESOLVED",
    RouteError = 3 "ROUTE_ERROR",
    ConnectRequest = 4 "CONNECT_REQUEST",
    ConnectResponse = 5 "CONNECT_RESPONSE",
    ConnectError = 6 "CONNECT_ERROR",
    Unreachable = 7 "UNREACHABLE",
    Rejected = 8 "REJECTED",
    Established = 9 "ESTABLISHED",
    Disconnected = 10 "DISCONNECTED",
    DeviceRemoval = 11 "DEVICE_REMOVAL",
    MulticastJoin = 12 "MULTICAST_JOIN",
    MulticastError = 13 "MULTICAST_ERROR",
    AddrChange = 14 "ADDR_CHANGE",
    TimewaitExit = 15 "TIMEWAIT_EXIT",
    AddrinfoResolved = 16 "ADDRINFO_RESOLVED",
    AddrinfoError = 17 "ADDRINFO_ERROR",
    User = 18 "USER",
    Internal = 19 "INTERNAL",
}

/// An event number without a name: only `EventType::from` makes one, so a
/// named number is never `Unknown`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnknownEvent(u32);

impl From<EventType> for u32 {
    fn from(e: EventType) -> u32 {
        e.value()
    }
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
pub fn status_text(event: EventType, status: i32) -> String {
    let meaning = if event == EventType::Rejected {
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
pub fn event_line(who: &str, event: EventType, ids: &str, status: i32, c: &ConnFields) -> String {
    let mut line = format!("{who}: event {}", event.name());
    if !ids.is_empty() {
        line.push(' ');
        line.push_str(ids);
    }
    line.push(' ');
    line.push_str(&status_text(event, status));
    // A request always has parameters; an ESTABLISHED that carries none
    // (the passive side's: the RTU has no parameters) does not show zeros.
    let with_param = event == EventType::ConnectRequest
        || (matches!(event, EventType::ConnectResponse | EventType::Established)
            && *c != ConnFields::default());
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
    if with_param || event == EventType::Rejected || !c.private_data.is_empty() {
        line.push(' ');
        line.push_str(&show("private_data", &c.private_data));
    }
    line
}

/// Results printed flat, `ok N - what` numbered in turn, without a plan
/// (the `ctl` parts of make check, whose plan tools/lib/ktap_tree.py
/// counts): steps of one part print into one numbering.
pub struct Flat {
    n: usize,
    /// Whether every result so far passed.
    pub ok: bool,
}

impl Default for Flat {
    fn default() -> Self {
        Self { n: 0, ok: true }
    }
}

impl Flat {
    /// A result left out: "ok N - WHAT # SKIP WHY".
    pub fn skip(&mut self, what: &str, why: &str) {
        self.n += 1;
        use io::Write as _;
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "ok {} - {what} # SKIP {why}", self.n);
        let _ = out.flush();
    }

    pub fn result(&mut self, pass: bool, what: &str) {
        self.n += 1;
        self.ok &= pass;
        use io::Write as _;
        let mut out = io::stdout().lock();
        let _ = writeln!(
            out,
            "{} {} - {what}",
            if pass { "ok" } else { "not ok" },
            self.n
        );
        let _ = out.flush();
    }
}

/// KTAP output: the plan, then one result a test, diagnostics (`# `) first.
pub struct Ktap<W: io::Write> {
    out: W,
    n: usize,
    pub failed: usize,
}

impl<W: io::Write> Ktap<W> {
    pub fn new(mut out: W, tests: usize) -> io::Result<Self> {
        writeln!(out, "KTAP version 1")?;
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

    /// The next test, not run: `ok N - name # SKIP why`.
    pub fn skip(&mut self, name: &str, why: &str) -> io::Result<()> {
        self.n += 1;
        let name = name.replace('#', "_");
        writeln!(self.out, "ok {} - {name} # SKIP {why}", self.n)?;
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
        use EventType::*;
        assert_eq!(ConnectRequest.name(), "CONNECT_REQUEST");
        assert_eq!(Established.name(), "ESTABLISHED");
        assert_eq!(Disconnected.name(), "DISCONNECTED");
        assert_eq!(TimewaitExit.name(), "TIMEWAIT_EXIT");
        assert_eq!(Unreachable.name(), "UNREACHABLE");
        assert_eq!(EventType::from(4), ConnectRequest);
        assert_eq!(EventType::from(15), TimewaitExit);
        assert_eq!(EventType::from(99).name(), "UNKNOWN");
        assert_eq!(EventType::from(20).name(), "UNKNOWN");
    }

    #[test]
    fn event_numbers_round_trip() {
        for n in 0..40 {
            let e = EventType::from(n);
            assert_eq!(u32::from(e), n);
            assert_eq!(matches!(e, EventType::Unknown(_)), n > 19, "{n}");
        }
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
            event_line("module", EventType::ConnectRequest, "id=1 new_id=2", 0, &c),
            "module: event CONNECT_REQUEST id=1 new_id=2 status=0 responder_resources=1 \
             initiator_depth=2 flow_control=0 retry_count=7 rnr_retry_count=7 srq=0 qp_num=0x0 \
             private_data(56)=\"hello\"+51*\\0"
        );
        assert_eq!(
            event_line(
                "librdmacm",
                EventType::Disconnected,
                "",
                0,
                &ConnFields::default()
            ),
            "librdmacm: event DISCONNECTED status=0"
        );
        assert_eq!(
            event_line(
                "module",
                EventType::Established,
                "id=2",
                0,
                &ConnFields::default()
            ),
            "module: event ESTABLISHED id=2 status=0"
        );
        let rej = ConnFields {
            private_data: vec![0xff],
            ..Default::default()
        };
        assert_eq!(
            event_line("module", EventType::Rejected, "id=3", 28, &rej),
            "module: event REJECTED id=3 status=28 (consumer defined) private_data(1)=hex:ff"
        );
        assert_eq!(
            status_text(EventType::AddrError, -110),
            "status=-110 (ETIMEDOUT)"
        );
        assert_eq!(status_text(EventType::AddrError, -9999), "status=-9999");
    }

    #[test]
    fn ktap_lines() {
        let mut k = Ktap::new(Vec::new(), 3).unwrap();
        k.result("first", Ok(()), Duration::from_millis(5)).unwrap();
        k.result("second#x", Err("bad\nworse".into()), Duration::ZERO)
            .unwrap();
        k.skip("third", "left out: why").unwrap();
        assert_eq!(k.failed, 1);
        let text = String::from_utf8(k.into_inner()).unwrap();
        assert_eq!(
            text,
            "KTAP version 1\n1..3\n# first: 5 ms\nok 1 - first\n# second_x: 0 ms\n\
             # bad\n# worse\nnot ok 2 - second_x\nok 3 - third # SKIP left out: why\n"
        );
    }
}
