// SPDX-License-Identifier: GPL-2.0
//! UD over RDMA_PS_UDP with librdmacm, the way rdma-core's `udaddy` does
//! it: an id of port space RDMA_PS_UDP with an `IBV_QPT_UD` QP (librdmacm
//! brings it to RTS with the port space's Q_Key), receives with room for
//! the 40-byte GRH in front of each datagram, SIDR through `rdma_connect`
//! (the ESTABLISHED event names the remote QP, its Q_Key and the address
//! handle attributes), and on the passive side `rdma_accept` with the QP
//! number and replies through an address handle made from the received
//! work completion.

use super::{
    check, clear_errno, errno, listen_bound, listen_id, register_buffers, resolve_id, Channel,
    Conn, Id,
};
use anyhow::{bail, Context, Result};
use std::{fmt, mem::size_of, net::SocketAddr, ptr, time::Duration};

use super::ffi::*;

/// The GRH a UD receive starts with (`struct ibv_grh`).
pub const GRH: usize = size_of::<ibv_grh>();
/// Largest datagram the buffers take: above any path MTU rxe offers.
pub const MAX_DATAGRAM: usize = 4096;
/// Receives kept posted.
const DEPTH: usize = 16;
/// A receive buffer: the GRH, then the payload.
const SLOT: usize = GRH + MAX_DATAGRAM;

/// The remote end a SIDR reply named: its QP number and Q_Key and the
/// address handle attributes of the path to it.
#[derive(Clone, Copy)]
pub struct Remote {
    pub qp_num: u32,
    pub qkey: u32,
    ah_attr: ibv_ah_attr,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("qp_num", &self.qp_num)
            .field("qkey", &self.qkey)
            .finish_non_exhaustive()
    }
}

impl Remote {
    /// From the `param.ud` of an ESTABLISHED event on a UD id.
    pub(super) fn from_event(p: &rdma_ud_param) -> Self {
        Self {
            qp_num: p.qp_num,
            qkey: p.qkey,
            ah_attr: p.ah_attr,
        }
    }
}

/// The port spaces a librdmacm UD id can have here: udaddy's RDMA_PS_UDP,
/// or RDMA_PS_IB with the UD QP type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdPortSpace {
    Udp,
    Ib,
}

/// A UD id of `ch` in port space `ps` listening on `addr`.
pub fn listen_ps<'ch>(
    ch: &'ch Channel,
    addr: &SocketAddr,
    backlog: i32,
    ps: UdPortSpace,
) -> Result<Id<'ch>> {
    match ps {
        UdPortSpace::Udp => listen_id(
            ch.create_id_ps(rdma_port_space::RDMA_PS_UDP)?,
            addr,
            backlog,
        ),
        UdPortSpace::Ib => {
            let id = ch.create_ep_ud(rdma_port_space::RDMA_PS_IB, addr, true)?;
            listen_bound(id, backlog)
        }
    }
}

/// A UD id of `ch` in port space `ps` with address and route resolved to
/// `dst` (no QP yet); RDMA_PS_IB ones within librdmacm's own 2 s bounds
/// (`Channel::create_ep_ud`).
pub fn resolve_ps<'ch>(
    ch: &'ch Channel,
    dst: &SocketAddr,
    timeout: Duration,
    ps: UdPortSpace,
) -> Result<Id<'ch>> {
    match ps {
        UdPortSpace::Udp => {
            let id = ch.create_id_ps(rdma_port_space::RDMA_PS_UDP)?;
            resolve_id(ch, id, dst, timeout, &mut |_| {})
        }
        UdPortSpace::Ib => ch.create_ep_ud(rdma_port_space::RDMA_PS_IB, dst, false),
    }
}

/// A peer of a [`UdQp`]: an index into its address handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerId(usize);

/// Where datagrams to one peer go: an address handle on the QP's PD, the
/// remote QP number and Q_Key; `gid` tells senders apart for the handles
/// made from received datagrams (with the QP number).
struct Peer {
    ah: *mut ibv_ah,
    qp_num: u32,
    qkey: u32,
    gid: Option<[u8; 16]>,
}

/// A datagram received.
#[derive(Clone, Debug)]
pub struct Datagram {
    /// The payload (the GRH left out).
    pub data: Vec<u8>,
    /// The immediate data, in host order, if it came with one.
    pub imm: Option<u32>,
    /// The sending QP, as the work completion names it.
    pub src_qp: u32,
    /// The sender as a peer to reply to, when asked for.
    pub peer: Option<PeerId>,
}

/// A UD QP on an id: its own PD, completion queues (one for sends, one
/// for receives), [`DEPTH`] receives of [`GRH`] + [`MAX_DATAGRAM`] bytes
/// posted, and the peers it sends to.
pub struct UdQp<'ch> {
    /// Dropped after `drop` below has freed what uses it.
    id: Id<'ch>,
    pd: *mut ibv_pd,
    send_cq: *mut ibv_cq,
    recv_cq: *mut ibv_cq,
    has_qp: bool,
    recv_buf: Box<[u8]>,
    send_buf: Box<[u8]>,
    recv_mr: *mut ibv_mr,
    send_mr: *mut ibv_mr,
    peers: Vec<Peer>,
}

impl<'ch> UdQp<'ch> {
    /// Makes the QP on `id` (a resolved UD id, or a UD request's new id)
    /// and posts the receives.
    pub fn new(id: impl Into<Id<'ch>>) -> Result<Self> {
        let id: Id<'ch> = id.into();
        // SAFETY: `id.raw` is a live id; its `verbs` is its device's context
        // once the address is resolved (or for a request's id).
        let verbs = unsafe { (*id.raw).verbs };
        if verbs.is_null() {
            bail!("the UD id has no device yet");
        }
        let mut qp = Self {
            id,
            pd: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            has_qp: false,
            recv_buf: vec![0; DEPTH * SLOT].into_boxed_slice(),
            send_buf: vec![0; MAX_DATAGRAM].into_boxed_slice(),
            recv_mr: ptr::null_mut(),
            send_mr: ptr::null_mut(),
            peers: Vec::new(),
        };
        // SAFETY: `verbs` is a live device context; each call returns NULL
        // on failure (checked), and what it returns is freed once in drop.
        clear_errno();
        unsafe {
            qp.pd = ibv_alloc_pd(verbs);
            if qp.pd.is_null() {
                return Err(errno("ibv_alloc_pd"));
            }
            qp.send_cq = ibv_create_cq(verbs, DEPTH as i32, ptr::null_mut(), ptr::null_mut(), 0);
            qp.recv_cq = ibv_create_cq(verbs, DEPTH as i32, ptr::null_mut(), ptr::null_mut(), 0);
        }
        if qp.send_cq.is_null() || qp.recv_cq.is_null() {
            return Err(errno("ibv_create_cq"));
        }
        // SAFETY: ibv_qp_init_attr is pointers, integers and enums whose
        // all-zero value is valid (NULL, 0); the fields used are set below.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = qp.send_cq;
        attr.recv_cq = qp.recv_cq;
        attr.cap.max_send_wr = DEPTH as u32;
        attr.cap.max_recv_wr = DEPTH as u32;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = ibv_qp_type::IBV_QPT_UD;
        attr.sq_sig_all = 1;
        clear_errno();
        // SAFETY: The id is live and without a QP; the PD and CQs were made
        // on its device's context; `attr` is read (and its `cap` written)
        // during the call only.  On a UD id librdmacm also moves the QP to
        // RTS with the port space's Q_Key.
        let r = unsafe { rdma_create_qp(qp.id.raw, qp.pd, &mut attr) };
        check(r, "rdma_create_qp (UD)")?;
        qp.has_qp = true;
        // SAFETY: `qp.pd` is live; both buffers are boxed slices, which
        // do not move, freed only after their MRs are deregistered (drop).
        (qp.recv_mr, qp.send_mr) =
            unsafe { register_buffers(qp.pd, &mut qp.recv_buf, &mut qp.send_buf) }?;
        for slot in 0..DEPTH {
            qp.post_recv(slot)?;
        }
        Ok(qp)
    }

    fn raw_qp(&self) -> *mut ibv_qp {
        // SAFETY: The id is live and has the QP made in `new` until drop.
        unsafe { (*self.id.raw).qp }
    }

    /// The QP's number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: The QP is live (made in `new`, destroyed in drop).
        unsafe { (*self.raw_qp()).qp_num }
    }

    /// The QP's Q_Key (`ibv_query_qp`), which librdmacm set from the port
    /// space: udaddy's server sends its replies with it.
    pub fn qkey(&self) -> Result<u32> {
        // SAFETY: The QP is live.
        let attr = unsafe { super::query_qp(self.raw_qp(), ibv_qp_attr_mask::IBV_QP_QKEY) }?;
        Ok(attr.qkey)
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let mut sge = ibv_sge {
            // The slot lies inside the registered receive region.
            addr: self.recv_buf[slot * SLOT..].as_ptr() as u64,
            length: SLOT as u32,
            // SAFETY: `recv_mr` is live (registered in `new`, deregistered in
            // drop).
            lkey: unsafe { (*self.recv_mr).lkey },
        };
        let mut wr = ibv_recv_wr {
            wr_id: slot as u64,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: The QP is live; ibv_post_recv reads `wr` and `sge` during
        // the call only.  The slot stays registered and allocated while the
        // QP may write it: drop destroys the QP first.
        let r = unsafe { ibv_post_recv(self.raw_qp(), &mut wr, &mut bad) };
        if r != 0 {
            bail!("ibv_post_recv: {}", std::io::Error::from_raw_os_error(r));
        }
        Ok(())
    }

    /// `rdma_connect` (the SIDR request) with `data` as private data: the
    /// answer (ESTABLISHED with [`super::CmEvent::ud`], UNREACHABLE, ...)
    /// comes on the id's channel.
    pub fn start_connect(&self, data: &[u8]) -> Result<()> {
        let mut param = conn_param(data, 0);
        // SAFETY: The id is live, with a QP; librdmacm reads `param` and the
        // private data it points to (borrowed from `data`) during the call
        // only.  A wrong state is an error return.
        let r = unsafe { rdma_connect(self.id.raw, &mut param) };
        check(r, "rdma_connect (SIDR)")
    }

    /// `rdma_accept` of a SIDR request with the QP number (as udaddy) and
    /// `data` as private data (the SIDR reply's).
    pub fn accept(&self, data: &[u8]) -> Result<()> {
        let mut param = conn_param(data, self.qp_num());
        // SAFETY: The id is a live request's, with a QP; librdmacm reads
        // `param` and the private data during the call only.
        let r = unsafe { rdma_accept(self.id.raw, &mut param) };
        check(r, "rdma_accept (SIDR)")
    }

    /// A peer to send to at `remote` (from a SIDR reply), with an address
    /// handle on this QP's PD.
    pub fn add_peer(&mut self, remote: &Remote) -> Result<PeerId> {
        let mut attr = remote.ah_attr;
        // SAFETY: `self.pd` is live; ibv_create_ah reads `attr` during the
        // call only; NULL on failure, checked.  The handle is destroyed in
        // drop, before the PD.
        let ah = unsafe { ibv_create_ah(self.pd, &mut attr) };
        if ah.is_null() {
            return Err(errno("ibv_create_ah"));
        }
        self.peers.push(Peer {
            ah,
            qp_num: remote.qp_num,
            qkey: remote.qkey,
            gid: None,
        });
        Ok(PeerId(self.peers.len() - 1))
    }

    /// One datagram to `peer`, as SEND_WITH_IMM when `imm` (host order)
    /// is given; waits for its completion.
    pub fn send(&mut self, peer: PeerId, data: &[u8], imm: Option<u32>) -> Result<()> {
        if data.len() > MAX_DATAGRAM {
            bail!("datagram of {} bytes is over {MAX_DATAGRAM}", data.len());
        }
        let p = self.peers.get(peer.0).context("no such peer")?;
        self.send_buf[..data.len()].copy_from_slice(data);
        let mut sge = ibv_sge {
            addr: self.send_buf.as_ptr() as u64,
            length: data.len() as u32,
            // SAFETY: `send_mr` is live (registered in `new`, deregistered in
            // drop).
            lkey: unsafe { (*self.send_mr).lkey },
        };
        // SAFETY: ibv_send_wr is pointers, integers and unions of integers,
        // all valid all-zero; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 1;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        match imm {
            Some(v) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
                wr.__bindgen_anon_1.imm_data = v.to_be();
            }
            None => wr.opcode = ibv_wr_opcode::IBV_WR_SEND,
        }
        wr.wr.ud.ah = p.ah;
        wr.wr.ud.remote_qpn = p.qp_num;
        wr.wr.ud.remote_qkey = p.qkey;
        let mut bad = ptr::null_mut();
        // SAFETY: The QP is live; ibv_post_send reads `wr` and `sge` during
        // the call only.  The data lies inside the registered send buffer,
        // which `&mut self` keeps untouched until the completion is polled
        // below; the address handle lives until drop.
        let r = unsafe { ibv_post_send(self.raw_qp(), &mut wr, &mut bad) };
        if r != 0 {
            bail!("ibv_post_send: {}", std::io::Error::from_raw_os_error(r));
        }
        Conn::poll(self.send_cq, Duration::from_secs(5)).context("UD send completion")?;
        Ok(())
    }

    /// The next datagram (its receive is posted again).  With `reply`, the
    /// sender becomes a peer (found again if it sent before), much as
    /// udaddy's server makes its reply handle: the address handle from the
    /// work completion and the GRH, and this QP's own Q_Key.  udaddy takes
    /// the QP number from the immediate data, where its clients put theirs;
    /// here it is the completion's source QP, since the immediate data of
    /// the suite's datagrams is any value.
    pub fn recv(&mut self, timeout: Duration, reply: bool) -> Result<Datagram> {
        let mut wc = Conn::poll(self.recv_cq, timeout).context("UD receive completion")?;
        let slot = wc.wr_id as usize;
        let len = wc.byte_len as usize;
        if !(GRH..=SLOT).contains(&len) {
            bail!("UD receive of {len} bytes (the GRH is {GRH})");
        }
        let base = slot * SLOT;
        let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM != 0;
        // SAFETY: With IBV_WC_WITH_IMM the union holds the immediate data.
        let imm = with_imm.then(|| u32::from_be(unsafe { wc.__bindgen_anon_1.imm_data }));
        let mut got = Datagram {
            data: self.recv_buf[base + GRH..base + len].to_vec(),
            imm,
            src_qp: wc.src_qp,
            peer: None,
        };
        if reply {
            let qp_num = wc.src_qp;
            // The sender's GID: the GRH's source, bytes 8..24.
            let gid: [u8; 16] = self.recv_buf[base + 8..base + 24]
                .try_into()
                .expect("16 bytes");
            let known = self
                .peers
                .iter()
                .position(|p| p.qp_num == qp_num && p.gid == Some(gid));
            let index = match known {
                Some(i) => i,
                None => {
                    let qkey = self.qkey()?;
                    // SAFETY: `self.id.raw` is live; its port_num is the port
                    // the QP is on.
                    let port = unsafe { (*self.id.raw).port_num };
                    // SAFETY: `self.pd` is live; `wc` is the completion just
                    // polled and the GRH the one its receive wrote, at the
                    // slot's start (not posted again yet); both are read
                    // during the call only.  NULL on failure, checked; the
                    // handle is destroyed in drop, before the PD.
                    let ah = unsafe {
                        ibv_create_ah_from_wc(
                            self.pd,
                            &mut wc,
                            self.recv_buf[base..].as_mut_ptr().cast(),
                            port,
                        )
                    };
                    if ah.is_null() {
                        return Err(errno("ibv_create_ah_from_wc"));
                    }
                    self.peers.push(Peer {
                        ah,
                        qp_num,
                        qkey,
                        gid: Some(gid),
                    });
                    self.peers.len() - 1
                }
            };
            got.peer = Some(PeerId(index));
        }
        self.post_recv(slot)?;
        Ok(got)
    }
}

/// Connection parameters of a UD connect or accept: private data and, for
/// an accept, the QP number.
fn conn_param(data: &[u8], qp_num: u32) -> rdma_conn_param {
    rdma_conn_param {
        private_data: if data.is_empty() {
            ptr::null()
        } else {
            data.as_ptr().cast()
        },
        private_data_len: data.len() as u8,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: 0,
        qp_num,
    }
}

impl Drop for UdQp<'_> {
    fn drop(&mut self) {
        // SAFETY: Each object is live and destroyed once, users before what
        // they use: the address handles and the QP (made in `new` when
        // `has_qp`), then the MRs and CQs no QP uses any more, then the PD
        // nothing of which is left.  NULL ones were never made.  The id
        // itself goes after this, with the `id` field.
        unsafe {
            for p in self.peers.drain(..) {
                ibv_destroy_ah(p.ah);
            }
            if self.has_qp {
                rdma_destroy_qp(self.id.raw);
            }
            for mr in [self.recv_mr, self.send_mr] {
                if !mr.is_null() {
                    ibv_dereg_mr(mr);
                }
            }
            for cq in [self.send_cq, self.recv_cq] {
                if !cq.is_null() {
                    ibv_destroy_cq(cq);
                }
            }
            if !self.pd.is_null() {
                ibv_dealloc_pd(self.pd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// udaddy's receive headroom is `sizeof(struct ibv_grh)`, the module's
    /// RDMA_CM_RS_GRH_SIZE.
    #[test]
    fn grh_is_40_bytes() {
        assert_eq!(GRH, 40);
        assert_eq!(GRH, crate::uapi::RDMA_CM_RS_GRH_SIZE as usize);
    }

    #[test]
    fn accept_parameters_carry_the_qp_number() {
        let p = conn_param(b"abc", 0x12);
        assert_eq!((p.private_data_len, p.qp_num), (3, 0x12));
        assert!(conn_param(&[], 0).private_data.is_null());
    }
}
