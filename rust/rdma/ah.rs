// SPDX-License-Identifier: GPL-2.0

//! Address handles (`struct ib_ah`) and the destinations of datagrams.
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h).
//!
//! An [`Ah`] is the path to one remote port, made on one PD (and so one
//! device) and holding it.  A UD send names a [`UdDest`]: an address handle
//! with the remote QP number and Q_Key.  There are two ways to get one,
//! both checked against the PD's device: the CM's answer to a SIDR lookup
//! (the CM layer builds it from the event's address vector), and a received
//! datagram ([`super::verbs::Qp::reply_dest`]), which is
//! how a UD service answers whoever sent.
//!
//! A posted UD send holds its destination, and so the address handle, until
//! its completion: the device never sends through a destroyed one.  Address
//! handles are made and destroyed in process context (they may sleep: on
//! RoCE the peer's MAC address is resolved).

use super::{bindings, device::Device, pd::Pd};
use core::{mem::ManuallyDrop, ptr::NonNull};
use kernel::{prelude::*, sync::Arc};

/// Size of the Global Route Header a UD receive leaves room for: the first
/// 40 bytes of every UD receive buffer hold it (or, on RoCE v2 over IPv4,
/// the IPv4 header in its last 20 bytes), whether or not one arrived.
pub const GRH_SIZE: usize = 40;

/// An address handle on one PD.
///
/// # Invariants
///
/// `raw` is a live kernel address handle created on `pd`, destroyed only by
/// `drop`; `pd` is dropped only after `raw` was destroyed.
pub struct Ah {
    raw: NonNull<bindings::ib_ah>,
    pd: ManuallyDrop<Arc<Pd>>,
}

// SAFETY: An address handle may be used and destroyed from any thread.
unsafe impl Send for Ah {}
// SAFETY: `&Ah` only hands the pointer to work requests, which the driver
// reads; nothing is mutated through it.
unsafe impl Sync for Ah {}

impl Ah {
    /// Creates an address handle from an address vector (`rdma_create_ah`,
    /// sleepable).  `EXDEV` if the vector's source GID belongs to another
    /// device than the PD's.
    ///
    /// # Safety
    ///
    /// `attr` must be a valid, initialised address vector whose source GID
    /// reference (if any) is held for the duration of the call.
    pub(crate) unsafe fn from_attr(
        pd: &Arc<Pd>,
        attr: &bindings::rdma_ah_attr,
    ) -> Result<Arc<Self>> {
        let sgid_attr = attr.grh.sgid_attr;
        if !sgid_attr.is_null() {
            // SAFETY: A held GID entry's device is valid while it is held
            // (safety requirements).
            let dev = unsafe { (*sgid_attr).device };
            if !core::ptr::eq(dev, pd.device().as_ptr()) {
                return Err(EXDEV);
            }
        }
        // `rdma_create_ah` works on a copy and checks the port against the
        // PD's device (`rdma_check_ah_attr`); it may sleep (process context).
        // SAFETY: The PD is live; `attr` is valid, its reference held (above).
        let raw = unsafe { bindings::rdma_cm_rs_create_ah(pd.as_ptr(), attr) };
        Self::adopt(pd, raw)
    }

    fn adopt(pd: &Arc<Pd>, raw: *mut bindings::ib_ah) -> Result<Arc<Self>> {
        let raw = kernel::error::from_err_ptr(raw)?;
        let Some(raw) = NonNull::new(raw) else {
            return Err(ENOMEM);
        };
        // INVARIANT: Just created on `pd`.  If the allocation below fails,
        // the value is dropped, which destroys the handle.
        Ok(Arc::new(
            Self {
                raw,
                pd: ManuallyDrop::new(pd.clone()),
            },
            GFP_KERNEL,
        )?)
    }

    /// The PD the handle was made on: a QP of another PD cannot use it.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// The device the handle lives on.
    pub fn device(&self) -> &Device {
        self.pd.device()
    }

    pub(crate) fn as_ptr(&self) -> *mut bindings::ib_ah {
        self.raw.as_ptr()
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // The last reference goes in process context (an ioctl, a CM
        // handler, the CQ's workqueue, a deferred destruction): it may sleep.
        // SAFETY: Live, destroyed only here (type invariants); no posted send uses it.
        let ret = unsafe {
            bindings::rdma_destroy_ah_user(
                self.raw.as_ptr(),
                bindings::rdma_destroy_ah_flags_RDMA_DESTROY_AH_SLEEPABLE,
                core::ptr::null_mut(),
            )
        };
        if ret == 0 {
            // SAFETY: Dropped once, here, after the handle is gone.
            unsafe { ManuallyDrop::drop(&mut self.pd) };
        } else {
            // Kernel address handles do not fail to go (`rdma_destroy_ah`
            // warns if one did).  If one did, it still counts in its PD:
            // keep the PD (a leak) rather than free it under the handle.
            pr_err!("an address handle could not be destroyed ({ret}): its PD is kept\n");
        }
    }
}

/// Where a datagram goes: an address handle, the remote QP number and the
/// remote Q_Key.
#[derive(Clone)]
pub struct UdDest {
    pub(crate) ah: Arc<Ah>,
    pub(crate) qp_num: u32,
    pub(crate) qkey: u32,
    gid: Option<[u8; 16]>,
}

impl UdDest {
    /// A destination through `ah`, whose remote GID (if routed globally)
    /// is `gid`.  QP numbers are 24 bits (`EINVAL` otherwise).
    pub(crate) fn new(ah: Arc<Ah>, qp_num: u32, qkey: u32, gid: Option<[u8; 16]>) -> Result<Self> {
        if qp_num > 0x00ff_ffff {
            return Err(EINVAL);
        }
        Ok(Self {
            ah,
            qp_num,
            qkey,
            gid,
        })
    }

    /// The remote port's GID, when the path has a global route header (on
    /// RoCE always; an IPv4-mapped address on RoCE v2 over IPv4): with
    /// the QP number, what tells two remote QPs apart.
    pub fn gid(&self) -> Option<[u8; 16]> {
        self.gid
    }

    /// The address handle.
    pub fn ah(&self) -> &Arc<Ah> {
        &self.ah
    }

    /// The remote QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The remote Q_Key.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }
}

/// The 40 bytes in front of a UD payload, aligned as `struct ib_grh`.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct GrhArea([u8; GRH_SIZE]);

/// What the device reported about a received datagram: the fields of its
/// work completion that describe the sender, and the 40 bytes in front of
/// the payload.
///
/// # Invariants
///
/// `wc` holds no pointer (`qp` and `wr_cqe` are null), only the fields
/// `Datagram::new` copies; the rest is zero.
#[derive(Clone, Copy)]
pub struct Datagram {
    wc: bindings::ib_wc,
    grh: GrhArea,
}

// SAFETY: The copy holds no pointer (type invariants): plain data.
unsafe impl Send for Datagram {}
// SAFETY: As above.
unsafe impl Sync for Datagram {}

impl Datagram {
    /// Copies what a successful UD receive completion reported about its
    /// sender: only the fields `ib_init_ah_attr_from_wc` and this type read
    /// (a driver need not write the others).
    pub(crate) fn new(from: &bindings::ib_wc, header: &[u8]) -> Self {
        let mut wc: bindings::ib_wc = pin_init::zeroed();
        wc.wc_flags = from.wc_flags;
        wc.network_hdr_type = from.network_hdr_type;
        wc.sl = from.sl;
        wc.slid = from.slid;
        wc.dlid_path_bits = from.dlid_path_bits;
        wc.vlan_id = from.vlan_id;
        wc.src_qp = from.src_qp;
        wc.ex = from.ex;
        let mut grh = GrhArea([0; GRH_SIZE]);
        let n = header.len().min(GRH_SIZE);
        grh.0[..n].copy_from_slice(&header[..n]);
        // INVARIANT: A zeroed completion with the sender's fields.
        Self { wc, grh }
    }

    fn has(&self, flag: u32) -> bool {
        self.wc.wc_flags & flag as i32 != 0
    }

    /// The sender's QP number.
    pub fn src_qp(&self) -> u32 {
        self.wc.src_qp & 0x00ff_ffff
    }

    /// The immediate data of a SEND_WITH_IMM, in host order.
    pub fn imm(&self) -> Option<u32> {
        if self.has(bindings::ib_wc_flags_IB_WC_WITH_IMM) {
            // SAFETY: With IB_WC_WITH_IMM the device set `imm_data`; any
            // bits are a valid `u32`.
            Some(u32::from_be(unsafe { self.wc.ex.imm_data }))
        } else {
            None
        }
    }

    /// Whether the area in front of the payload holds an IPv4 header (RoCE
    /// v2 over IPv4) rather than a GRH: as the device said, or else as the
    /// header's version says (as `ib_get_net_type_by_grh` decides).
    fn has_ipv4_header(&self) -> bool {
        if self.has(bindings::ib_wc_flags_IB_WC_WITH_NETWORK_HDR_TYPE) {
            return u32::from(self.wc.network_hdr_type)
                == bindings::rdma_network_type_RDMA_NETWORK_IPV4;
        }
        // SAFETY: The area is 40 readable bytes aligned as `union
        // rdma_network_hdr`, its size; the function only reads them.
        let version = unsafe { bindings::ib_get_rdma_header_version((&raw const self.grh).cast()) };
        version == 4
    }

    /// The sender's GID (an IPv4-mapped IPv6 address on RoCE v2 over
    /// IPv4), if a global route header arrived.
    pub fn src_gid(&self) -> Option<[u8; 16]> {
        if !self.has(bindings::ib_wc_flags_IB_WC_GRH) {
            return None;
        }
        let mut gid = [0u8; 16];
        if self.has_ipv4_header() {
            // An IPv4 header in the last 20 bytes: its source address is
            // at offset 12 (RFC 791).
            gid[10] = 0xff;
            gid[11] = 0xff;
            gid[12..].copy_from_slice(&self.grh.0[20 + 12..20 + 16]);
        } else {
            // The GRH's source GID, at offset 8 (IBTA 8.3.1).
            gid.copy_from_slice(&self.grh.0[8..24]);
        }
        Some(gid)
    }

    /// An address handle back to the sender, on `pd`, through `port_num`
    /// of its device (`ib_create_ah_from_wc`; sleeps).
    ///
    /// # Safety
    ///
    /// `port_num` must be a port of the PD's device: the function indexes
    /// the device's per-port data with it before any check.
    pub(crate) unsafe fn reply_ah(&self, pd: &Arc<Pd>, port_num: u32) -> Result<Arc<Ah>> {
        // `wc` holds the completion fields the function reads, `grh` the 40
        // bytes in front of the payload, aligned as `struct ib_grh`.
        // SAFETY: PD live, `port_num` its device's (requirements); both copied in.
        let raw = unsafe {
            bindings::ib_create_ah_from_wc(
                pd.as_ptr(),
                &self.wc,
                (&raw const self.grh).cast(),
                port_num,
            )
        };
        Ah::adopt(pd, raw)
    }
}
