// SPDX-License-Identifier: GPL-2.0
//! What the wire between the two machines carries: the IP traffic class
//! of RoCE v2 packets, captured on the module's netdev (an `AF_PACKET`
//! socket), for `RDMA_OPTION_ID_TOS` (`rdma_set_option(3)`).  One machine
//! has no wire to look at: rxe hands a packet for its own address to its
//! receive path without the netdev.

use super::{note, resolve_with_option, wait, Ctx, T};
use crate::agent::Call;
use crate::payload::hex;
use crate::uapi::*;
use anyhow::{bail, ensure, Context, Result};
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

/// RoCE v2's UDP port.
const ROCE_V2_PORT: u16 = 4791;

/// A RoCE v2 packet seen on the wire: its source address, traffic class
/// (the IPv4 TOS byte) and the destination QP of its base transport
/// header.
#[derive(Clone, Copy, Debug)]
struct Seen {
    src: Ipv4Addr,
    tos: u8,
    dest_qp: u32,
}

/// Why the running kernel cannot run `name`, if it cannot: the capture
/// needs packet sockets (`CONFIG_PACKET`), which a user's own kernel may
/// lack (the test kernel has them).
pub(super) fn kernel_lacks_because(name: &str) -> Option<String> {
    if name != "tos_on_the_wire" {
        return None;
    }
    // SAFETY: Plain socket creation; the descriptor is closed at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, 0) };
    if fd >= 0 {
        // SAFETY: Ours, open.
        unsafe { libc::close(fd) };
        return None;
    }
    (std::io::Error::last_os_error().raw_os_error() == Some(libc::EAFNOSUPPORT)).then(|| {
        "needs packet sockets (CONFIG_PACKET) in the kernel, to capture the wire".to_string()
    })
}

/// The RoCE v2 packet in an IPv4 packet, if it is one.
fn parse(p: &[u8]) -> Option<Seen> {
    if p.len() < 20 || p[0] >> 4 != 4 || p[9] != 17 {
        return None;
    }
    let ihl = usize::from(p[0] & 0xf) * 4;
    // UDP header (8 bytes), then the BTH: its destination QP in bytes 5-7.
    let udp = p.get(ihl..ihl + 8)?;
    if u16::from_be_bytes([udp[2], udp[3]]) != ROCE_V2_PORT {
        return None;
    }
    let bth = p.get(ihl + 8..ihl + 20)?;
    Some(Seen {
        src: Ipv4Addr::new(p[12], p[13], p[14], p[15]),
        tos: p[1],
        dest_qp: u32::from_be_bytes([0, bth[5], bth[6], bth[7]]),
    })
}

/// Captures the packets of a netdev, both ways, until stopped.
struct Capture {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<Seen>>,
}

impl Capture {
    fn start(netdev: &str) -> Result<Self> {
        let name = std::ffi::CString::new(netdev)?;
        // SAFETY: A NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        ensure!(ifindex != 0, "no netdev {netdev}");
        // ETH_P_ALL: a socket of one protocol sees only what arrives, the
        // taps of every protocol what leaves too (`dev_queue_xmit_nit`).
        // What is not IPv4 fails `parse`.
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: Plain socket creation.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_DGRAM, i32::from(proto)) };
        ensure!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: A fresh descriptor of ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: All-zero is a valid sockaddr_ll.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto;
        sll.sll_ifindex = ifindex as i32;
        // SAFETY: `sll` is a valid sockaddr_ll for the call.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        ensure!(
            r == 0,
            "binding to {netdev}: {}",
            std::io::Error::last_os_error()
        );
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        // SAFETY: `tv` is a valid timeval for the call.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&raw const tv).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            )
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let mut buf = vec![0u8; 65536];
            while !stopped.load(Ordering::Acquire) {
                // SAFETY: `buf` is writable for its length.
                let n =
                    unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
                if n > 0 {
                    if let Some(s) = parse(&buf[..n as usize]) {
                        seen.push(s);
                    }
                }
            }
            seen
        });
        Ok(Self { stop, thread })
    }

    fn finish(self) -> Result<Vec<Seen>> {
        // What is still queued in the socket comes within its 100 ms.
        std::thread::sleep(Duration::from_millis(200));
        self.stop.store(true, Ordering::Release);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the capture thread panicked"))
    }
}

/// The traffic classes of the packets from `src` to QP `dest_qp`; at
/// least one packet must have been seen.
fn classes(seen: &[Seen], src: IpAddr, dest_qp: u32, what: &str) -> Result<Vec<u8>> {
    let IpAddr::V4(src) = src else {
        bail!("{what}: not an IPv4 address: {src}")
    };
    let mut tos: Vec<u8> = seen
        .iter()
        .filter(|s| s.src == src && s.dest_qp == dest_qp)
        .map(|s| s.tos)
        .collect();
    ensure!(
        !tos.is_empty(),
        "{what}: no RoCE packet from {src} to QP {dest_qp:#x} among the {} captured: {:x?}",
        seen.len(),
        seen.iter()
            .map(|s| (s.src, s.dest_qp, s.tos))
            .collect::<Vec<_>>()
    );
    tos.sort_unstable();
    tos.dedup();
    Ok(tos)
}

/// `RDMA_OPTION_ID_TOS` on the wire (two machines, rxe): a connection the
/// module makes with TOS 0x48 carries it in every packet of its QP, and,
/// since the IB CM builds the passive side's path from the REQ, in the
/// peer's packets too; a connection accepted by a listener with TOS 0x28
/// from a peer with none carries 0 both ways: on RoCE a listener's TOS
/// does not reach the ids it accepts (`cma_ib_new_conn_id` copies no TOS;
/// their path is the REQ's).  Control: the same capture reads 0 where
/// nothing set a TOS.
pub(super) fn tos_on_the_wire(ctx: &mut Ctx) -> Result<()> {
    let netdev = std::env::var("RDMA_CM_RS_NETDEV").context("RDMA_CM_RS_NETDEV")?;
    let dev = Device::open()?;
    let capture = Capture::start(&netdev)?;
    // The module connects with TOS 0x48 (DSCP AF21).
    let addr = SocketAddr::new(ctx.peer4, ctx.port());
    let mut call = Call::start(
        &ctx.agent,
        &format!("serve addr={addr} count=1 accept=00 echo=1 disc=self"),
    )?;
    call.ready()?;
    let id = resolve_with_option(&dev, addr, rdma_cm_rs_option_RDMA_CM_RS_OPT_TOS, 0x48)?;
    // 56 bytes: the CM pads a REQ's private data to that.
    let req_data = [0x7a; 56];
    dev.connect(id, &Param::with_data(&req_data))?;
    let est = wait(&dev, EventType::Established)?;
    let (peer_qp, own_qp) = (est.qp_num, dev.query(id)?.qp_num);
    super::conn::echo_then_peer_disconnects(&dev, id, call, &req_data, b"with TOS 0x48")?;
    dev.destroy(id)?;
    // The module accepts on a listener with TOS 0x28; the peer sets none.
    let addr = SocketAddr::new(ctx.local4, ctx.port());
    let l = dev.create_id(2)?;
    dev.set_option(l, rdma_cm_rs_option_RDMA_CM_RS_OPT_TOS, 0x28)?;
    dev.bind(l, &addr).context("bind")?;
    dev.listen(l, 4).context("listen")?;
    let msg = b"accepted";
    let call = Call::start(
        &ctx.agent,
        &format!("connect addr={addr} data=01 msg={} disc=self", hex(msg)),
    )?;
    let req = wait(&dev, EventType::ConnectRequest)?;
    let acc_peer_qp = req.qp_num;
    dev.accept(req.new_id, Some(&Param::with_data(b"ok")))?;
    wait(&dev, EventType::Established)?;
    let acc_own_qp = dev.query(req.new_id)?.qp_num;
    let got = dev.recv(req.new_id, 4096, T).context("module recv")?;
    ensure!(got == msg, "module: received {got:?}");
    dev.send_nowait(req.new_id, b"reply")?;
    wait(&dev, EventType::Disconnected)?;
    dev.disconnect(req.new_id)?;
    call.result()?;
    dev.destroy(req.new_id)?;
    dev.destroy(l)?;
    let seen = capture.finish()?;
    let out = classes(
        &seen,
        ctx.local4,
        peer_qp,
        "the module's connect (TOS 0x48)",
    )?;
    let back = classes(&seen, ctx.peer4, own_qp, "its peer's answers")?;
    let acc_out = classes(
        &seen,
        ctx.local4,
        acc_peer_qp,
        "the accepted id (listener TOS 0x28)",
    )?;
    let acc_back = classes(&seen, ctx.peer4, acc_own_qp, "its peer (no TOS)")?;
    note(&format!(
        "{} RoCE packets: connect 0x48 -> {out:x?}, back {back:x?}; accepted under 0x28 -> {acc_out:x?}, back {acc_back:x?}",
        seen.len()
    ));
    ensure!(
        out == [0x48],
        "the module's packets with TOS 0x48 set carried {out:x?}"
    );
    ensure!(
        back == [0x48],
        "the peer's packets of that connection carried {back:x?}"
    );
    ensure!(
        acc_out == [0],
        "the accepted id's packets carried {acc_out:x?}"
    );
    ensure!(acc_back == [0], "its peer's packets carried {acc_back:x?}");
    Ok(())
}
