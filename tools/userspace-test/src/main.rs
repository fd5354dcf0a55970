// SPDX-License-Identifier: GPL-2.0
//! userspace-test: drives `/dev/rdma_cm_rs` and acts as a real librdmacm
//! peer against it.
//!
//!   userspace-test ctl ...      the module, by hand (info, listen, connect, shell)
//!   userspace-test peer ...     a plain librdmacm client or server
//!   userspace-test suite        the KTAP scenarios (module + librdmacm peer)
//!   userspace-test agent        the librdmacm side of the suite, for another VM

mod agent;
mod cm;
mod suite;
mod uapi;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::{
    io::BufRead,
    net::{IpAddr, SocketAddr, TcpListener},
    time::Duration,
};
use uapi::{Device, Event, Param};

#[derive(Parser)]
#[command(version, about = "Drives /dev/rdma_cm_rs against real librdmacm peers")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Drive the module by hand.
    #[command(subcommand)]
    Ctl(Ctl),
    /// A plain librdmacm endpoint.
    #[command(subcommand)]
    Peer(Peer),
    /// Run the KTAP suite.
    Suite {
        /// Only scenarios whose name contains this.
        #[arg(long)]
        filter: Option<String>,
        /// The agent serving the librdmacm side (default: one in this process).
        #[arg(long)]
        peer: Option<String>,
    },
    /// Serve the librdmacm side of the suite.
    Agent {
        #[arg(long, default_value = "0.0.0.0:7999")]
        listen: String,
    },
}

#[derive(Subcommand)]
enum Ctl {
    /// ABI version and limits.
    Info,
    /// The module listens, accepts, answers one message a connection.
    Listen {
        addr: SocketAddr,
        #[arg(long, default_value_t = 8)]
        backlog: u32,
        /// Private data of the module's accept.
        #[arg(long, default_value = "")]
        accept_data: String,
        /// Sent back for each message received.
        #[arg(long, default_value = "")]
        reply: String,
        /// Connections to serve before exiting.
        #[arg(long, default_value_t = 1)]
        connections: u32,
    },
    /// The module connects, sends a message, prints the reply, disconnects.
    Connect {
        addr: SocketAddr,
        #[arg(long, default_value = "")]
        data: String,
        #[arg(long, default_value = "")]
        message: String,
    },
    /// Raw commands from standard input, one a line (see `help`).
    Shell,
}

#[derive(Subcommand)]
enum Peer {
    /// Connect, send a message, print the reply, disconnect.
    Client {
        addr: SocketAddr,
        #[arg(long, default_value = "")]
        data: String,
        #[arg(long, default_value = "")]
        message: String,
    },
    /// Accept connections and echo their messages.
    Server {
        addr: SocketAddr,
        #[arg(long, default_value = "")]
        accept_data: String,
        #[arg(long, default_value_t = 1)]
        connections: u32,
    },
}

const WAIT: u32 = 15_000;

fn show(data: &[u8]) -> String {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    let text: String = data[..end]
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        })
        .collect();
    format!("({})\"{}\"", data.len(), text)
}

fn print_event(who: &str, e: &Event) {
    let mut line = format!("{who}: event {} id={} status={}", e.name(), e.id, e.status);
    if e.new_id != 0 {
        line += &format!(" new_id={}", e.new_id);
    }
    if !e.private_data.is_empty() {
        line += &format!(
            " private_data{} rr={} id={} retry={} rnr={}",
            show(&e.private_data),
            e.responder_resources,
            e.initiator_depth,
            e.retry_count,
            e.rnr_retry_count
        );
    }
    println!("{line}");
}

fn next(dev: &Device, want: u32) -> Result<Event> {
    let e = dev
        .get_event(WAIT)
        .with_context(|| format!("waiting for {}", uapi::event_name(want)))?;
    print_event("module", &e);
    if e.event != want {
        bail!("expected {}", uapi::event_name(want));
    }
    Ok(e)
}

fn ctl_listen(
    addr: SocketAddr,
    backlog: u32,
    accept_data: &str,
    reply: &str,
    connections: u32,
) -> Result<()> {
    let dev = Device::open()?;
    let l = dev.create_id(1)?;
    dev.bind(l, &addr)?;
    dev.listen(l, backlog)?;
    println!("module: listening on {addr} (id {l}, backlog {backlog})");
    let mut done = 0;
    while done < connections {
        let e = dev.get_event(uapi::RDMA_CM_RS_TIMEOUT_INFINITE)?;
        print_event("module", &e);
        match e.event {
            uapi::EV_CONNECT_REQUEST => {
                let mut p = Param::with_data(accept_data.as_bytes());
                p.responder_resources = e.initiator_depth;
                p.initiator_depth = e.responder_resources;
                dev.accept(e.new_id, Some(&p))?;
                println!(
                    "module: accepted id {} with private_data{}",
                    e.new_id,
                    show(accept_data.as_bytes())
                );
            }
            uapi::EV_ESTABLISHED => {
                let msg = dev.recv(e.id, cm::MSG, WAIT)?;
                println!("module: message{}", show(&msg));
                if !reply.is_empty() {
                    dev.send(e.id, reply.as_bytes())?;
                    println!("module: replied{}", show(reply.as_bytes()));
                }
            }
            uapi::EV_DISCONNECTED => {
                dev.destroy(e.id)?;
                done += 1;
            }
            _ => {}
        }
    }
    Ok(())
}

fn ctl_connect(addr: SocketAddr, data: &str, message: &str) -> Result<()> {
    let dev = Device::open()?;
    let id = dev.create_id(1)?;
    dev.resolve_addr(id, &addr, 2000)?;
    next(&dev, uapi::EV_ADDR_RESOLVED)?;
    dev.resolve_route(id, 2000)?;
    next(&dev, uapi::EV_ROUTE_RESOLVED)?;
    dev.connect(id, &Param::with_data(data.as_bytes()))?;
    next(&dev, uapi::EV_ESTABLISHED)?;
    if !message.is_empty() {
        dev.send(id, message.as_bytes())?;
        let reply = dev.recv(id, cm::MSG, WAIT)?;
        println!("module: reply({})={}", reply.len(), show(&reply));
        if reply != message.as_bytes() {
            bail!("the reply differs from the message");
        }
    }
    dev.disconnect(id)?;
    next(&dev, uapi::EV_DISCONNECTED)?;
    Ok(())
}

fn ctl_shell() -> Result<()> {
    let dev = Device::open()?;
    let num = |w: Option<&str>| -> Result<u32> { Ok(w.context("missing number")?.parse()?) };
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let mut w = line.split_whitespace();
        let Some(cmd) = w.next() else { continue };
        let r: Result<String> = (|| {
            match cmd {
            "help" => Ok("create | bind ID ADDR | listen ID N | resolve-addr ID ADDR | resolve-route ID | \
                 connect ID [DATA] | accept ID [DATA|-] | reject ID REASON [DATA] | disconnect ID | \
                 destroy ID | set ID tos|reuseaddr|afonly|ack-timeout|min-rnr-timer V | query ID | \
                 event [MS] | send ID TEXT | recv ID [MS]"
                .into()),
            "create" => Ok(format!("id {}", dev.create_id(0)?)),
            "bind" => dev.bind(num(w.next())?, &w.next().context("address")?.parse()?).map(|()| "ok".into()).map_err(Into::into),
            "listen" => Ok(dev.listen(num(w.next())?, num(w.next())?).map(|()| "ok".to_string())?),
            "resolve-addr" => Ok(dev.resolve_addr(num(w.next())?, &w.next().context("address")?.parse()?, 2000).map(|()| "ok".to_string())?),
            "resolve-route" => Ok(dev.resolve_route(num(w.next())?, 2000).map(|()| "ok".to_string())?),
            "connect" => {
                let id = num(w.next())?;
                Ok(dev.connect(id, &Param::with_data(w.next().unwrap_or("").as_bytes())).map(|()| "ok".to_string())?)
            }
            "accept" => {
                let id = num(w.next())?;
                let p = match w.next() {
                    None | Some("-") => None,
                    Some(d) => Some(Param::with_data(d.as_bytes())),
                };
                Ok(dev.accept(id, p.as_ref()).map(|()| "ok".to_string())?)
            }
            "reject" => {
                let (id, reason) = (num(w.next())?, num(w.next())? as u8);
                Ok(dev.reject(id, reason, w.next().unwrap_or("").as_bytes()).map(|()| "ok".to_string())?)
            }
            "disconnect" => Ok(dev.disconnect(num(w.next())?).map(|()| "ok".to_string())?),
            "destroy" => Ok(dev.destroy(num(w.next())?).map(|()| "ok".to_string())?),
            "set" => {
                let id = num(w.next())?;
                let opt = match w.next().unwrap_or("") {
                    "tos" => uapi::rdma_cm_rs_option_RDMA_CM_RS_OPT_TOS,
                    "reuseaddr" => uapi::rdma_cm_rs_option_RDMA_CM_RS_OPT_REUSEADDR,
                    "afonly" => uapi::rdma_cm_rs_option_RDMA_CM_RS_OPT_AFONLY,
                    "ack-timeout" => uapi::rdma_cm_rs_option_RDMA_CM_RS_OPT_ACK_TIMEOUT,
                    "min-rnr-timer" => uapi::rdma_cm_rs_option_RDMA_CM_RS_OPT_MIN_RNR_TIMER,
                    o => bail!("unknown option {o}"),
                };
                Ok(dev.set_option(id, opt, u64::from(num(w.next())?)).map(|()| "ok".to_string())?)
            }
            "query" => {
                let q = dev.query(num(w.next())?)?;
                let dev_name: String = q.device.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect();
                Ok(format!(
                    "state {} qp_num {} port {} src {:?} dst {:?} device {dev_name:?} rr {} id {} tos {}",
                    q.state,
                    q.qp_num,
                    q.port_num,
                    uapi::parse_sockaddr(&q.src),
                    uapi::parse_sockaddr(&q.dst),
                    q.responder_resources,
                    q.initiator_depth,
                    q.tos
                ))
            }
            "event" => {
                let e = dev.get_event(w.next().map_or(Ok(WAIT), |v| v.parse())?)?;
                print_event("module", &e);
                Ok(String::new())
            }
            "send" => {
                let id = num(w.next())?;
                let text: Vec<&str> = w.collect();
                Ok(dev.send(id, text.join(" ").as_bytes()).map(|()| "ok".to_string())?)
            }
            "recv" => {
                let id = num(w.next())?;
                let ms = w.next().map_or(Ok(WAIT), |v| v.parse())?;
                Ok(format!("message{}", show(&dev.recv(id, cm::MSG, ms)?)))
            }
            _ => bail!("unknown command (try help)"),
        }
        })();
        match r {
            Ok(s) if s.is_empty() => {}
            Ok(s) => println!("{s}"),
            Err(e) => println!("error: {e:#}"),
        }
    }
    Ok(())
}

fn peer_client(addr: SocketAddr, data: &str, message: &str) -> Result<()> {
    let ch = cm::Channel::new()?;
    let id = cm::resolve(&ch, &addr, Duration::from_secs(5))?;
    let mut conn = cm::Conn::new(id)?;
    println!(
        "librdmacm: connecting to {addr} with private_data{}",
        show(data.as_bytes())
    );
    let ev = conn.connect(
        &cm::Param::with_data(data.as_bytes()),
        &ch,
        Duration::from_secs(15),
    )?;
    println!(
        "librdmacm: event {} status={} private_data{} rr={} id={}",
        ev.name(),
        ev.status,
        show(&ev.private_data),
        ev.responder_resources,
        ev.initiator_depth
    );
    if ev.event != uapi::EV_ESTABLISHED {
        bail!("not established");
    }
    if !message.is_empty() {
        conn.send(message.as_bytes())?;
        println!("librdmacm: sent{}", show(message.as_bytes()));
        let reply = conn.recv(Duration::from_secs(15))?;
        println!("librdmacm: received{}", show(&reply));
    }
    conn.disconnect()?;
    let ev = ch.expect(uapi::EV_DISCONNECTED, Duration::from_secs(15))?;
    println!("librdmacm: event {}", ev.name());
    Ok(())
}

fn peer_server(addr: SocketAddr, accept_data: &str, connections: u32) -> Result<()> {
    let ch = cm::Channel::new()?;
    let _l = cm::listen(&ch, &addr, 8)?;
    println!("librdmacm: listening on {addr}");
    for _ in 0..connections {
        let ev = ch.expect(uapi::EV_CONNECT_REQUEST, Duration::from_secs(3600))?;
        println!(
            "librdmacm: event {} private_data{}",
            ev.name(),
            show(&ev.private_data)
        );
        let mut conn = cm::Conn::new(ev.id)?;
        conn.accept(&cm::Param::with_data(accept_data.as_bytes()))?;
        println!(
            "librdmacm: event {}",
            ch.expect(uapi::EV_ESTABLISHED, Duration::from_secs(15))?
                .name()
        );
        if let Ok(msg) = conn.recv(Duration::from_secs(15)) {
            println!("librdmacm: received{}, echoing", show(&msg));
            conn.send(&msg)?;
        }
        println!(
            "librdmacm: event {}",
            ch.next(Duration::from_secs(60))?.name()
        );
    }
    Ok(())
}

fn env_ip(name: &str, default: &str) -> Result<IpAddr> {
    Ok(std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .parse()?)
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Ctl(Ctl::Info) => {
            let i = Device::open()?.info()?;
            println!(
                "abi {} max_private_data {} max_message {} max_ids {} recv_depth {}",
                i.abi_version, i.max_private_data, i.max_message, i.max_ids, i.recv_depth
            );
        }
        Cmd::Ctl(Ctl::Listen {
            addr,
            backlog,
            accept_data,
            reply,
            connections,
        }) => ctl_listen(addr, backlog, &accept_data, &reply, connections)?,
        Cmd::Ctl(Ctl::Connect {
            addr,
            data,
            message,
        }) => ctl_connect(addr, &data, &message)?,
        Cmd::Ctl(Ctl::Shell) => ctl_shell()?,
        Cmd::Peer(Peer::Client {
            addr,
            data,
            message,
        }) => peer_client(addr, &data, &message)?,
        Cmd::Peer(Peer::Server {
            addr,
            accept_data,
            connections,
        }) => peer_server(addr, &accept_data, connections)?,
        Cmd::Agent { listen } => {
            let l = TcpListener::bind(&listen)?;
            eprintln!("agent: serving on {}", l.local_addr()?);
            agent::serve_forever(l);
        }
        Cmd::Suite { filter, peer } => {
            let local4 = env_ip("RDMA_CM_RS_LOCAL_IP", "192.0.2.1")?;
            let local6 = env_ip("RDMA_CM_RS_LOCAL_IP6", "2001:db8::1")?;
            let peer4 = env_ip("RDMA_CM_RS_PEER_IP", &local4.to_string())?;
            let agent = match peer {
                Some(p) => p.parse().context("--peer")?,
                None => agent::spawn_local()?,
            };
            let mut ctx = suite::Ctx::new(local4, peer4, local6, agent);
            if !suite::run(&mut ctx, filter.as_deref()) {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
