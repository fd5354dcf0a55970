// SPDX-License-Identifier: GPL-2.0
//! A connection's memory for one-sided work: registered regions, type 2
//! memory windows bound over them, and RDMA READ/WRITE between them and
//! the peer's.

use super::ffi::*;
use super::{clear_errno, errno, Conn, RdmaOp};
use anyhow::{bail, ensure, Context, Result};
use std::{ptr, time::Duration};

impl Conn<'_> {
    /// Registers a region holding `data` with local write access and the
    /// remote access asked for; returns its index.
    pub fn add_region(
        &mut self,
        data: &[u8],
        remote_read: bool,
        remote_write: bool,
    ) -> Result<usize> {
        self.add_region_with(data, remote_read, remote_write, false)
    }

    /// [`Self::add_region`], with memory windows allowed to bind to it
    /// (`IBV_ACCESS_MW_BIND`) if `bindable`.
    pub fn add_region_with(
        &mut self,
        data: &[u8],
        remote_read: bool,
        remote_write: bool,
        bindable: bool,
    ) -> Result<usize> {
        let mut buf = data.to_vec().into_boxed_slice();
        let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if remote_read {
            access |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if remote_write {
            access |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if bindable {
            access |= ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        }
        clear_errno();
        // SAFETY: `self.pd` is live; `buf` is a heap allocation of the length
        // given, which moves into `regions` with the MR without moving its
        // bytes, and is freed only after the MR is deregistered (drop).  NULL
        // on failure, checked.
        let mr = unsafe { ibv_reg_mr(self.pd, buf.as_mut_ptr().cast(), buf.len(), access as i32) };
        if mr.is_null() {
            return Err(errno("ibv_reg_mr (is `ulimit -l` unlimited?)"));
        }
        self.regions.push((buf, mr));
        Ok(self.regions.len() - 1)
    }

    /// A type 2 memory window on the connection's PD, or `None` where the
    /// device has none (siw); returns its index.  Binding it to a region
    /// ([`Self::bind_window`]) needs the region made with `bindable`.
    pub fn add_window(&mut self) -> Result<Option<usize>> {
        clear_errno();
        // SAFETY: `self.pd` is live; NULL on failure, checked.
        let mw = unsafe { ibv_alloc_mw(self.pd, ibv_mw_type::IBV_MW_TYPE_2) };
        if mw.is_null() {
            let e = std::io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) {
                return Ok(None);
            }
            return Err(errno("ibv_alloc_mw"));
        }
        // SAFETY: Just allocated, live until drop.
        let rkey = unsafe { (*mw).rkey };
        self.windows.push((mw, rkey));
        Ok(Some(self.windows.len() - 1))
    }

    /// Binds window `w` over all of region `i` (`IBV_WR_BIND_MW`, remote
    /// read and write) under its next key, waits for the binding, and
    /// returns the key: what a peer then reaches the region with, until it
    /// invalidates the key (SEND_WITH_INV) or the window is bound again.
    pub fn bind_window(&mut self, w: usize, i: usize) -> Result<u32> {
        let (buf, mr) = &self.regions[i];
        let (mw, last) = self.windows[w];
        // SAFETY: A pure function of its argument.
        let rkey = unsafe { ibv_inc_rkey(last) };
        // SAFETY: ibv_send_wr is pointers, integers and unions of integers,
        // all valid all-zero; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 3;
        wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.__bindgen_anon_2.bind_mw.mw = mw;
        wr.__bindgen_anon_2.bind_mw.rkey = rkey;
        wr.__bindgen_anon_2.bind_mw.bind_info.mr = *mr;
        wr.__bindgen_anon_2.bind_mw.bind_info.addr = buf.as_ptr() as u64;
        wr.__bindgen_anon_2.bind_mw.bind_info.length = buf.len() as u64;
        wr.__bindgen_anon_2.bind_mw.bind_info.mw_access_flags =
            ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
                | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let mut bad = ptr::null_mut();
        // SAFETY: The id's QP is live; ibv_post_send reads `wr` during the
        // call only; the window and the region's MR are live objects of the
        // QP's PD, and stay so while the QP lives (drop).
        let r = unsafe { ibv_post_send((*self.id.raw).qp, &mut wr, &mut bad) };
        if r != 0 {
            bail!(
                "ibv_post_send (BIND_MW): {}",
                std::io::Error::from_raw_os_error(r)
            );
        }
        let wc = Self::poll(self.send_cq, Duration::from_secs(5)).context("BIND_MW completion")?;
        ensure!(
            wc.wr_id == 3,
            "completion {} while binding a window",
            wc.wr_id
        );
        // The next binding names the window by its current key: the
        // provider reads it from here (rxe's `rxe_bind_mw` refuses any
        // other), and only an `ibv_bind_mw` of a type 1 window updates it.
        // SAFETY: The window is live (drop); nothing else writes it.
        unsafe { (*mw).rkey = rkey };
        self.windows[w].1 = rkey;
        Ok(rkey)
    }

    /// What a peer needs to reach region `i`: (address, rkey, length).
    pub fn region_key(&self, i: usize) -> (u64, u32, u32) {
        let (buf, mr) = &self.regions[i];
        // SAFETY: The region's MR is live until drop.
        let rkey = unsafe { (**mr).rkey };
        (buf.as_ptr() as u64, rkey, buf.len() as u32)
    }

    /// Region `i`'s bytes (the peer may have written them).
    pub fn region(&self, i: usize) -> &[u8] {
        &self.regions[i].0
    }

    pub fn region_mut(&mut self, i: usize) -> &mut [u8] {
        &mut self.regions[i].0
    }

    /// One RDMA READ (into) or WRITE (from) region `i` at `offset`, waited
    /// for; returns the work completion status (0 = IBV_WC_SUCCESS).
    pub fn rdma(
        &mut self,
        op: RdmaOp,
        i: usize,
        offset: usize,
        len: u32,
        remote_addr: u64,
        rkey: u32,
    ) -> Result<u32> {
        let (buf, mr) = &self.regions[i];
        if offset + len as usize > buf.len() {
            bail!("{len} bytes at {offset} are outside region {i}");
        }
        let mut sge = ibv_sge {
            addr: buf[offset..].as_ptr() as u64,
            length: len,
            // SAFETY: The region's MR is live until drop.
            lkey: unsafe { (**mr).lkey },
        };
        // SAFETY: ibv_send_wr is pointers, integers and unions of integers,
        // all valid all-zero; the fields used are set below.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 2;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = match op {
            RdmaOp::Read => ibv_wr_opcode::IBV_WR_RDMA_READ,
            RdmaOp::Write => ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        };
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.wr.rdma.remote_addr = remote_addr;
        wr.wr.rdma.rkey = rkey;
        let mut bad = ptr::null_mut();
        // SAFETY: The id's QP is live; ibv_post_send reads `wr` and `sge`
        // during the call only.  The local range lies inside a registered
        // region (checked above), which `&mut self` keeps untouched until the
        // completion is polled below, and which stays allocated and
        // registered while the QP lives.  The remote side checks the remote
        // address and key (a bad one fails the work request).
        let r = unsafe { ibv_post_send((*self.id.raw).qp, &mut wr, &mut bad) };
        if r != 0 {
            bail!("ibv_post_send: {}", std::io::Error::from_raw_os_error(r));
        }
        let wc =
            Self::poll_any(self.send_cq, Duration::from_secs(10)).context("RDMA completion")?;
        Ok(wc.status)
    }
}
