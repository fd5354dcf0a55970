// SPDX-License-Identifier: GPL-2.0
//! `ctl shell`: one raw command a line, parsed here (no device needed), and
//! the address syntax every subcommand takes.

use crate::payload::parse_data;
use anyhow::{bail, Context, Result};
use std::net::{SocketAddr, ToSocketAddrs};

/// `192.0.2.1:7471` or `[2001:db8::1]:7471` (a scope as `[fe80::1%2]:1`).
pub fn parse_addr(s: &str) -> Result<SocketAddr> {
    s.parse()
        .with_context(|| format!("{s:?}: expected IPV4:PORT or [IPV6]:PORT"))
}

/// `HOST:PORT` with a name allowed (the suite's `--peer`).
pub fn resolve_host(s: &str) -> Result<SocketAddr> {
    if let Ok(a) = s.parse() {
        return Ok(a);
    }
    s.to_socket_addrs()
        .with_context(|| format!("{s:?}: expected HOST:PORT"))?
        .next()
        .with_context(|| format!("{s:?}: no address"))
}

pub const HELP: &str = "commands (one a line; DATA is text, hex:HEX or len:N):
  create tcp|udp|ib|ipoib rc|ud [CONTEXT]
  bind ID ADDR:PORT                listen ID BACKLOG
  resolve-addr ID ADDR:PORT [MS]   resolve-route ID [MS]
  connect ID [DATA]                accept ID [DATA|-]     (- = the request's values)
  reject ID REASON [DATA]          disconnect ID          destroy ID
  set ID tos|reuseaddr|afonly|ack-timeout|min-rnr-timer VALUE
  query ID                         info
  event [MS]                       (default 5000; 0 = do not wait)
  send ID TEXT...                  recv ID [MS]
  help                             quit";

/// Socket option names of `set`, with their `enum rdma_cm_rs_option` value.
pub const OPTIONS: [(&str, u32); 5] = [
    ("tos", 1),
    ("reuseaddr", 2),
    ("afonly", 3),
    ("ack-timeout", 4),
    ("min-rnr-timer", 5),
];

#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Help,
    Quit,
    Info,
    Create {
        port_space: u32,
        qp_type: u32,
        context: u64,
    },
    Bind {
        id: u32,
        addr: SocketAddr,
    },
    Listen {
        id: u32,
        backlog: u32,
    },
    ResolveAddr {
        id: u32,
        addr: SocketAddr,
        timeout_ms: u32,
    },
    ResolveRoute {
        id: u32,
        timeout_ms: u32,
    },
    Connect {
        id: u32,
        data: Vec<u8>,
    },
    /// `data: None` accepts with the request's values.
    Accept {
        id: u32,
        data: Option<Vec<u8>>,
    },
    Reject {
        id: u32,
        reason: u8,
        data: Vec<u8>,
    },
    Disconnect {
        id: u32,
    },
    Destroy {
        id: u32,
    },
    Set {
        id: u32,
        option: u32,
        value: u64,
    },
    Query {
        id: u32,
    },
    Event {
        timeout_ms: u32,
    },
    Send {
        id: u32,
        text: Vec<u8>,
    },
    Recv {
        id: u32,
        timeout_ms: u32,
    },
}

pub const DEFAULT_WAIT_MS: u32 = 5000;

fn num<T: std::str::FromStr>(w: Option<&str>, what: &str) -> Result<T>
where
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let w = w.with_context(|| format!("missing {what}"))?;
    w.parse().with_context(|| format!("{what}: {w:?}"))
}

fn opt_num(w: Option<&str>, what: &str, default: u32) -> Result<u32> {
    match w {
        None => Ok(default),
        w => num(w, what),
    }
}

/// Parses one line; `Ok(None)` for a blank line or a comment.
pub fn parse(line: &str) -> Result<Option<Command>> {
    let line = line.trim();
    // `send` keeps its text verbatim, spaces included.
    let mut w = line.split_whitespace();
    let Some(cmd) = w.next() else {
        return Ok(None);
    };
    if cmd.starts_with('#') {
        return Ok(None);
    }
    let id = |w: Option<&str>| num::<u32>(w, "ID");
    let c = match cmd {
        "help" | "?" => Command::Help,
        "quit" | "exit" => Command::Quit,
        "info" => Command::Info,
        "create" => {
            let port_space = match w.next().unwrap_or("tcp") {
                "tcp" => 0x0106,
                "udp" => 0x0111,
                "ib" => 0x013f,
                "ipoib" => 0x0002,
                o => bail!("port space {o:?}: tcp, udp, ib or ipoib"),
            };
            let qp_type = match w.next().unwrap_or("rc") {
                "rc" => 2,
                "ud" => 4,
                o => bail!("QP type {o:?}: rc or ud"),
            };
            let context = w.next().map_or(Ok(0), |c| num(Some(c), "CONTEXT"))?;
            Command::Create {
                port_space,
                qp_type,
                context,
            }
        }
        "bind" => Command::Bind {
            id: id(w.next())?,
            addr: parse_addr(w.next().context("missing ADDR:PORT")?)?,
        },
        "listen" => Command::Listen {
            id: id(w.next())?,
            backlog: num(w.next(), "BACKLOG")?,
        },
        "resolve-addr" => Command::ResolveAddr {
            id: id(w.next())?,
            addr: parse_addr(w.next().context("missing ADDR:PORT")?)?,
            timeout_ms: opt_num(w.next(), "MS", 2000)?,
        },
        "resolve-route" => Command::ResolveRoute {
            id: id(w.next())?,
            timeout_ms: opt_num(w.next(), "MS", 2000)?,
        },
        "connect" => Command::Connect {
            id: id(w.next())?,
            data: parse_data(w.next().unwrap_or(""))?,
        },
        "accept" => Command::Accept {
            id: id(w.next())?,
            data: match w.next() {
                None | Some("-") => None,
                Some(d) => Some(parse_data(d)?),
            },
        },
        "reject" => Command::Reject {
            id: id(w.next())?,
            reason: num(w.next(), "REASON")?,
            data: parse_data(w.next().unwrap_or(""))?,
        },
        "disconnect" => Command::Disconnect { id: id(w.next())? },
        "destroy" => Command::Destroy { id: id(w.next())? },
        "set" => {
            let i = id(w.next())?;
            let name = w.next().context("missing option")?;
            let option = OPTIONS
                .iter()
                .find(|(n, _)| *n == name)
                .map(|&(_, v)| v)
                .with_context(|| format!("option {name:?}"))?;
            Command::Set {
                id: i,
                option,
                value: num(w.next(), "VALUE")?,
            }
        }
        "query" => Command::Query { id: id(w.next())? },
        "event" => Command::Event {
            timeout_ms: opt_num(w.next(), "MS", DEFAULT_WAIT_MS)?,
        },
        "send" => {
            let i = id(w.next())?;
            // The rest of the line after the id, as typed.
            let rest = line
                .split_once(char::is_whitespace)
                .map(|(_, r)| r.trim_start())
                .and_then(|r| r.split_once(char::is_whitespace))
                .map_or("", |(_, t)| t.trim_start());
            if rest.is_empty() {
                bail!("missing TEXT");
            }
            Command::Send {
                id: i,
                text: rest.as_bytes().to_vec(),
            }
        }
        "recv" => Command::Recv {
            id: id(w.next())?,
            timeout_ms: opt_num(w.next(), "MS", DEFAULT_WAIT_MS)?,
        },
        o => bail!("unknown command {o:?} (try help)"),
    };
    Ok(Some(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            parse_addr("192.0.2.1:7471").unwrap(),
            SocketAddr::from(([192, 0, 2, 1], 7471))
        );
        let v6 = parse_addr("[2001:db8::1]:7471").unwrap();
        assert!(v6.is_ipv6());
        assert_eq!(v6.port(), 7471);
        assert!(parse_addr("2001:db8::1:7471").is_err());
        assert!(parse_addr("192.0.2.1").is_err());
        assert!(parse_addr("host:1").is_err());
        assert_eq!(resolve_host("127.0.0.1:7999").unwrap().port(), 7999);
        assert!(resolve_host("localhost:7999").unwrap().ip().is_loopback());
    }

    #[test]
    fn commands() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("  # note").unwrap(), None);
        assert_eq!(
            parse("create tcp rc 42").unwrap(),
            Some(Command::Create {
                port_space: 0x0106,
                qp_type: 2,
                context: 42
            })
        );
        assert_eq!(
            parse("create").unwrap(),
            Some(Command::Create {
                port_space: 0x0106,
                qp_type: 2,
                context: 0
            })
        );
        assert_eq!(
            parse("bind 1 [::1]:7471").unwrap(),
            Some(Command::Bind {
                id: 1,
                addr: "[::1]:7471".parse().unwrap()
            })
        );
        assert_eq!(
            parse("accept 2 -").unwrap(),
            Some(Command::Accept { id: 2, data: None })
        );
        assert_eq!(
            parse("accept 2 hex:0001").unwrap(),
            Some(Command::Accept {
                id: 2,
                data: Some(vec![0, 1])
            })
        );
        assert_eq!(
            parse("reject 2 28 no").unwrap(),
            Some(Command::Reject {
                id: 2,
                reason: 28,
                data: b"no".to_vec()
            })
        );
        assert_eq!(
            parse("set 3 ack-timeout 14").unwrap(),
            Some(Command::Set {
                id: 3,
                option: 4,
                value: 14
            })
        );
        assert_eq!(
            parse("send 3   hello  world ").unwrap(),
            Some(Command::Send {
                id: 3,
                text: b"hello  world".to_vec()
            })
        );
        assert_eq!(
            parse("event 0").unwrap(),
            Some(Command::Event { timeout_ms: 0 })
        );
        assert_eq!(
            parse("recv 4").unwrap(),
            Some(Command::Recv {
                id: 4,
                timeout_ms: DEFAULT_WAIT_MS
            })
        );
        for bad in [
            "frobnicate",
            "bind x 1.2.3.4:5",
            "bind 1",
            "set 1 nagle 1",
            "create sctp",
            "send 1",
            "reject 1 300",
            "listen 1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
