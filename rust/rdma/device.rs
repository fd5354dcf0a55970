// SPDX-License-Identifier: GPL-2.0

//! RDMA devices (`struct ib_device`).
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h).
//!
//! A [`Device`] is only ever reached through an [`ARef<Device>`], which owns
//! one count of the device's `refcount` (`ib_device_try_get` to take the
//! first, `ib_device_put` to drop it).  Unregistration first removes the
//! device's clients (the CM sends DEVICE_REMOVAL and waits for the ids on it
//! to be destroyed), then waits in `disable_device` until that count drops
//! to zero, and only then frees the device.  Every object of this layer that
//! lives on a device (PD, CQ, QP, DMA buffers, regions) holds such a
//! reference: none can outlive its device, and objects of two devices are
//! told apart by comparing theirs ([`Device::same`]).

use super::bindings;
use core::ptr::{self, NonNull};
use kernel::{
    prelude::*,
    sync::aref::{ARef, AlwaysRefCounted},
    types::Opaque,
};

/// An RDMA device.
///
/// # Invariants
///
/// A `&Device` is a registered or unregistering `ib_device` on which the
/// holder of the reference (an [`ARef`]) owns one `refcount` count, so its
/// memory stays valid while the reference lives.
#[repr(transparent)]
pub struct Device(Opaque<bindings::ib_device>);

// SAFETY: `ib_device_put` may be called from any thread, and an owned count
// may move between threads.
unsafe impl Send for Device {}
// SAFETY: Shared access only reads fields the driver fixed at registration
// (attributes), or copies the name with volatile reads (a rename may
// rewrite it concurrently).
unsafe impl Sync for Device {}

// SAFETY: A counted reference keeps the device's memory valid
// (`disable_device` waits for the count before the device is freed).
unsafe impl AlwaysRefCounted for Device {
    fn inc_ref(&self) {
        // SAFETY: `&self` exists, so some holder owns a count: the count is
        // not zero and `refcount_inc` is valid on it.
        unsafe { bindings::refcount_inc(&raw mut (*self.as_ptr()).refcount) };
    }

    unsafe fn dec_ref(obj: NonNull<Self>) {
        // SAFETY: The caller owns one count, which `ib_device_put` drops.
        unsafe { bindings::ib_device_put(obj.as_ptr().cast()) };
    }
}

/// Waits out the placements of a driver that
/// [`Device::places_after_deregistration`] begun under a key that has
/// since ended: an RCU grace period, expedited (a normal one took a siw
/// READ of 4 KiB from a median of 4-8 ms to 20 ms in the test VM, as the
/// R/W API waits for one per iWARP READ; the expedited one left it there).
/// Process context only, outside any RCU read-side critical section.
pub(crate) fn ended_key_grace_period() {
    // SAFETY: The caller is in process context, outside any RCU read-side
    // critical section, which is all `synchronize_rcu_expedited` needs.
    unsafe { bindings::synchronize_rcu_expedited() };
}

/// How a device carries RDMA, which decides the connection manager's rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// InfiniBand or RoCE: the IB CM (fixed-size CM messages, SIDR for UD,
    /// padded private data).
    Ib,
    /// iWARP (an RNIC such as `siw`): the iWARP CM over TCP and MPA (exact
    /// private data lengths, IRD/ORD in the MPA v2 header, RC only, the
    /// active side sends first).
    Iwarp,
}

impl Transport {
    /// The transport of the device `raw`.
    ///
    /// # Safety
    ///
    /// `raw` must point to a valid `ib_device` for the duration of the call.
    pub(crate) unsafe fn of_raw(raw: *const bindings::ib_device) -> Self {
        // SAFETY: `raw` is valid (the function's safety requirements);
        // `node_type` is set before registration and never changes;
        // `rdma_node_get_transport` only maps the value.
        let transport = unsafe { bindings::rdma_node_get_transport((*raw).node_type.into()) };
        if transport == bindings::rdma_transport_type_RDMA_TRANSPORT_IWARP {
            Self::Iwarp
        } else {
            Self::Ib
        }
    }
}

/// What a device can do, read from its attributes (fixed by the driver
/// before registration) for a ULP to size its queues and pick its paths.
#[derive(Clone, Copy, Debug)]
pub struct DeviceCaps {
    /// `max_qp`: QPs the device offers.
    pub max_qp: u32,
    /// `max_qp_wr`: work requests one queue of a QP holds.
    pub max_qp_wr: u32,
    /// `max_send_sge`, `max_recv_sge`: scatter/gather entries a work
    /// request carries.
    pub max_send_sge: u32,
    /// See `max_send_sge`.
    pub max_recv_sge: u32,
    /// `max_cq`, `max_cqe`: CQs, and entries one CQ holds.
    pub max_cq: u32,
    /// See `max_cq`.
    pub max_cqe: u32,
    /// `max_mr`: memory regions.
    pub max_mr: u32,
    /// `max_mr_size`: bytes one region maps.
    pub max_mr_size: u64,
    /// `max_pd`: protection domains.
    pub max_pd: u32,
    /// `max_srq`, `max_srq_wr`: shared receive queues and their depth (0:
    /// none).
    pub max_srq: u32,
    /// See `max_srq`.
    pub max_srq_wr: u32,
    /// `max_srq_sge`: scatter entries one receive of an SRQ carries.
    pub max_srq_sge: u32,
    /// `max_fast_reg_page_list_len`: pages one fast registration maps.
    pub max_fast_reg_page_list_len: u32,
    /// `max_qp_rd_atom`, `max_qp_init_rd_atom`: RDMA READs a QP serves and
    /// issues at once.
    pub max_qp_rd_atom: u32,
    /// See `max_qp_rd_atom`.
    pub max_qp_init_rd_atom: u32,
    /// Fast registration work requests (`IB_DEVICE_MEM_MGT_EXTENSIONS`).
    pub fast_registration: bool,
    /// Regions with gaps between their pages (`IBK_SG_GAPS_REG`).
    pub sg_gaps_registration: bool,
    /// The transport of every port.
    pub transport: Transport,
}

/// What one port of a device speaks and which of the core's services it
/// has: its core capability flags (`RDMA_CORE_CAP_*`), fixed by the driver
/// before registration.  The methods are the `rdma_protocol_*` and
/// `rdma_cap_*` tests of `ib_verbs.h`, named after them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortCaps {
    flags: u32,
}

impl PortCaps {
    fn has(&self, flags: u32) -> bool {
        self.flags & flags != 0
    }

    /// InfiniBand (`rdma_protocol_ib`).
    pub fn protocol_ib(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_IB)
    }

    /// RoCE, v1 or v2 (`rdma_protocol_roce`).
    pub fn protocol_roce(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_ROCE | bindings::RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP)
    }

    /// RoCE v2, over UDP (`rdma_protocol_roce_udp_encap`).
    pub fn protocol_roce_udp_encap(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP)
    }

    /// RoCE v1, over Ethernet (`rdma_protocol_roce_eth_encap`).
    pub fn protocol_roce_eth_encap(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_ROCE)
    }

    /// InfiniBand or RoCE (`rdma_ib_or_roce`): the IB CM's transports.
    pub fn ib_or_roce(&self) -> bool {
        self.protocol_ib() || self.protocol_roce()
    }

    /// iWARP (`rdma_protocol_iwarp`).
    pub fn protocol_iwarp(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_IWARP)
    }

    /// Raw Ethernet packets (`rdma_protocol_raw_packet`).
    pub fn protocol_raw_packet(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_RAW_PACKET)
    }

    /// usNIC (`rdma_protocol_usnic`).
    pub fn protocol_usnic(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_PROT_USNIC)
    }

    /// Management datagrams (`rdma_cap_ib_mad`).
    pub fn cap_ib_mad(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_IB_MAD)
    }

    /// A subnet management interface, QP0 (`rdma_cap_ib_smi`).
    pub fn cap_ib_smi(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_IB_SMI)
    }

    /// The IB connection manager (`rdma_cap_ib_cm`).
    pub fn cap_ib_cm(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_IB_CM)
    }

    /// The iWARP connection manager (`rdma_cap_iw_cm`).
    pub fn cap_iw_cm(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_IW_CM)
    }

    /// Subnet administration, path records (`rdma_cap_ib_sa`).
    pub fn cap_ib_sa(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_IB_SA)
    }

    /// IB multicast, which needs the SA (`rdma_cap_ib_mcast`).
    pub fn cap_ib_mcast(&self) -> bool {
        self.cap_ib_sa()
    }

    /// `AF_IB` addresses (`rdma_cap_af_ib`).
    pub fn cap_af_ib(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_AF_IB)
    }

    /// Address handles from Ethernet addresses (`rdma_cap_eth_ah`).
    pub fn cap_eth_ah(&self) -> bool {
        self.has(bindings::RDMA_CORE_CAP_ETH_AH)
    }

    /// Every address handle needs a GRH (`rdma_is_grh_required`): always
    /// on RoCE, on IB where the port says so.
    pub fn grh_required(&self) -> bool {
        self.has(bindings::RDMA_CORE_PORT_IB_GRH_REQUIRED)
    }

    /// RDMA READ with invalidate (`rdma_cap_read_inv`): iWARP requires
    /// it, no other transport has it.
    pub fn cap_read_inv(&self) -> bool {
        self.protocol_iwarp()
    }
}

/// The name of a device, copied (a device can be renamed while in use).
#[derive(Clone, Copy)]
pub struct DeviceName {
    bytes: [u8; bindings::IB_DEVICE_NAME_MAX as usize],
    len: usize,
}

impl DeviceName {
    /// The name's bytes, without the terminating NUL.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Device {
    /// Takes a counted reference on `raw`; `ENODEV` once the count reached
    /// zero, i.e. once unregistration removed every client and waits for
    /// the last references (during DEVICE_REMOVAL it still succeeds, and
    /// the reference then holds the unregistration until it is dropped).
    ///
    /// # Safety
    ///
    /// `raw` must point to a device whose memory is valid for the call, e.g.
    /// the device of a live, bound `rdma_cm_id` (the CM holds the id's
    /// device until the id is destroyed).
    pub(crate) unsafe fn try_get(raw: *mut bindings::ib_device) -> Result<ARef<Self>> {
        let raw = NonNull::new(raw).ok_or(ENODEV)?;
        // SAFETY: `raw` is valid by the safety requirements;
        // `ib_device_try_get` increments a non-zero count only.
        if !unsafe { bindings::ib_device_try_get(raw.as_ptr()) } {
            return Err(ENODEV);
        }
        // SAFETY: The count taken above is owned by the new `ARef`;
        // `Device` is a transparent wrapper of `ib_device`.
        Ok(unsafe { ARef::from_raw(raw.cast()) })
    }

    /// Borrows `raw` for `'a`.
    ///
    /// # Safety
    ///
    /// `raw` must be a registered or unregistering device on which a count
    /// is held for `'a` (by the caller, or by the IB core around a client
    /// callback).
    pub(crate) unsafe fn from_raw<'a>(raw: *mut bindings::ib_device) -> &'a Self {
        // SAFETY: `Device` is a transparent wrapper of `ib_device`; the
        // count keeps the memory valid for `'a` (safety requirements).
        unsafe { &*raw.cast::<Self>() }
    }

    /// The raw device.
    pub(crate) fn as_ptr(&self) -> *mut bindings::ib_device {
        self.0.get()
    }

    fn attrs(&self) -> &bindings::ib_device_attr {
        // SAFETY: The device is valid (type invariants); drivers fill `attrs`
        // before registration and never change it afterwards.
        unsafe { &(*self.as_ptr()).attrs }
    }

    /// The device's index, unique among registered devices (assigned when
    /// it registers, with its name, and fixed until it is freed).
    pub fn index(&self) -> usize {
        // SAFETY: The device is valid (type invariants); `index` is written
        // once, in `assign_name` during registration, before any client or
        // CM id can see the device.
        unsafe { (*self.as_ptr()).index as usize }
    }

    /// Whether `self` and `other` are the same device.
    pub fn same(&self, other: &Device) -> bool {
        core::ptr::eq(self, other)
    }

    /// `EXDEV` unless `self` and `other` are the same device: objects of
    /// two devices never meet in one work request or QP.
    pub(crate) fn check_same(&self, other: &Device) -> Result {
        if self.same(other) {
            Ok(())
        } else {
            Err(EXDEV)
        }
    }

    /// A copy of the device's name (`rxe0`, `siw0`, ...).
    pub fn name(&self) -> DeviceName {
        let mut out = DeviceName {
            bytes: [0; bindings::IB_DEVICE_NAME_MAX as usize],
            len: 0,
        };
        // SAFETY: The device is valid; `name` is a fixed array inside it.
        let raw = unsafe { &raw const (*self.as_ptr()).name };
        for (i, dst) in out.bytes.iter_mut().enumerate() {
            // A rename (`ib_device_rename`) may be writing concurrently:
            // byte by byte, volatile, up to the first NUL seen, never past
            // the array.
            // SAFETY: `i` is within the array (same length as `out.bytes`).
            let src = unsafe { ptr::read_volatile(raw.cast::<u8>().add(i)) };
            if src == 0 {
                break;
            }
            *dst = src;
            out.len += 1;
        }
        out.len = out.len.min(out.bytes.len() - 1);
        out
    }

    /// Whether a remote WRITE the driver was placing when a region's
    /// `ib_dereg_mr` (or an invalidation) returned may still be copying
    /// into the region's memory: true of siw alone.  siw places a WRITE
    /// chunk by chunk in its socket's receive callback, each chunk after
    /// checking that the key is valid, and neither its deregistration nor
    /// its invalidation waits for a chunk under way (they clear the key's
    /// valid flag and return).  Each chunk's check and copy run in
    /// `siw_qp_llp_data_ready` under the socket's callback lock taken for
    /// reading (`read_lock`; `read_lock_bh` with the test kernel's patch
    /// 0001), that is with preemption or bottom halves disabled: an RCU
    /// read-side critical section.  A grace period after the key went
    /// invalid therefore waits for every chunk under way, and later chunks
    /// see the key invalid.  (The test kernel's patch 0009 also receives
    /// at the peer's close, with bottom halves disabled for this reason.)
    /// rxe's deregistration waits for its responders (`rxe_cleanup`), as
    /// the verbs expect of every driver.
    pub(crate) fn places_after_deregistration(&self) -> bool {
        self.is_siw()
    }

    /// Whether the driver sends MPA private data of
    /// [`MAX_PRIVATE_DATA_IWARP`](super::conn_param::MAX_PRIVATE_DATA_IWARP)
    /// bytes announcing none: siw, where the running kernel lacks the fix
    /// or the build could not tell (the cfg `siw_truncates_private_data`,
    /// set by the out-of-tree build).
    pub fn truncates_mpa_private_data(&self) -> bool {
        cfg!(siw_truncates_private_data) && self.is_siw()
    }

    fn is_siw(&self) -> bool {
        // SAFETY: The device is valid (type invariants); drivers set their
        // ops before registering and never change them.
        let driver = unsafe { (*self.as_ptr()).ops.driver_id };
        driver == bindings::rdma_driver_id_RDMA_DRIVER_SIW
    }

    /// On a device that [`Self::places_after_deregistration`], waits until
    /// no placement begun under a key that has since ended (deregistered
    /// or invalidated) can still be copying: [`ended_key_grace_period`].
    /// Returns at once on any other device.
    pub(crate) fn wait_for_ended_key_writes(&self) {
        if self.places_after_deregistration() {
            ended_key_grace_period();
        }
    }

    /// The device's transport.  An iWARP device is an RNIC
    /// (`RDMA_NODE_RNIC`): every port of it is iWARP.
    pub fn transport(&self) -> Transport {
        // SAFETY: The device is valid (type invariants).
        unsafe { Transport::of_raw(self.as_ptr()) }
    }

    /// The device's completion vectors (`num_comp_vectors`): a CQ can be
    /// bound to any of `0..num_comp_vectors()` ([`super::verbs::Cq::alloc_with`])
    /// to spread completion work over CPUs, as ULPs do with a CQ per queue.
    pub fn num_comp_vectors(&self) -> u32 {
        // SAFETY: The device is valid (type invariants); drivers set
        // `num_comp_vectors` before registering and never change it.
        let n = unsafe { (*self.as_ptr()).num_comp_vectors };
        u32::try_from(n).unwrap_or(0)
    }

    /// RDMA reads and atomics the device accepts per QP as a responder.
    pub fn max_qp_rd_atom(&self) -> u32 {
        self.attrs().max_qp_rd_atom
    }

    /// RDMA reads and atomics the device issues per QP as an initiator.
    pub fn max_qp_init_rd_atom(&self) -> u32 {
        self.attrs().max_qp_init_rd_atom
    }

    /// Whether the device supports fast registration (FRWR).
    pub fn has_fast_registration(&self) -> bool {
        // The flag enum is a `usize` to bindgen; the field a `u64`.
        let flag = bindings::ib_device_cap_flags_IB_DEVICE_MEM_MGT_EXTENSIONS as u64;
        self.attrs().device_cap_flags & flag != 0
    }

    /// The active MTU of `port` in bytes (`ib_query_port`): the largest
    /// datagram a UD QP on that port can send.  `EINVAL` for a port the
    /// device does not have.  Sleeps.
    pub fn port_active_mtu(&self, port: u32) -> Result<u32> {
        // SAFETY: The device is valid; `ib_query_port` checks the port
        // number and may sleep (callers are in process context).
        let mtu = unsafe { bindings::rdma_cm_rs_port_active_mtu(self.as_ptr(), port) };
        kernel::error::to_result(mtu)?;
        Ok(mtu as u32)
    }

    /// The device's port numbers (`rdma_start_port..=rdma_end_port`: 1 to
    /// the number of physical ports, 0 alone for a switch).
    pub fn ports(&self) -> core::ops::RangeInclusive<u32> {
        // SAFETY: The device is valid (type invariants); both inlines read
        // fields fixed at registration.
        unsafe { bindings::rdma_start_port(self.as_ptr())..=bindings::rdma_end_port(self.as_ptr()) }
    }

    /// The capabilities of `port`; `EINVAL` for a port the device does not
    /// have.
    pub fn port_caps(&self, port: u32) -> Result<PortCaps> {
        if !self.ports().contains(&port) {
            return Err(EINVAL);
        }
        // `port_data` is allocated for `rdma_start_port..=rdma_end_port`, its
        // immutable part set by `get_port_immutable`, both before
        // registration, and never changed.
        // SAFETY: The device is valid and `port` one of its ports (checked
        // above), so `port_data[port]` exists and is not written.
        let flags = unsafe {
            (*(*self.as_ptr()).port_data.add(port as usize))
                .immutable
                .core_cap_flags
        };
        Ok(PortCaps { flags })
    }

    /// For sizing [`super::verbs::QpCaps::max_rdma_ctxs`]: the contexts
    /// (registrations, where the device registers) the R/W API takes for
    /// a transfer of up to `max_pages` pages on `port`
    /// (`rdma_rw_mr_factor`); `EINVAL` for a port the device does not
    /// have, `EOPNOTSUPP` on a device that reports no fast-registration
    /// page list or no RDMA READ scatter entry (the C function divides by
    /// whichever of the two it uses).
    pub fn rw_mr_factor(&self, port: u32, max_pages: u32) -> Result<u32> {
        if !self.ports().contains(&port) {
            return Err(EINVAL);
        }
        let attrs = self.attrs();
        if attrs.max_fast_reg_page_list_len == 0 || attrs.max_sge_rd == 0 {
            return Err(EOPNOTSUPP);
        }
        // SAFETY: The device is valid and `port` one of its ports; the
        // function reads the port's protocol and fixed attributes, and
        // divides by the device's fast-registration page list length
        // (capped at 256) or its `max_sge_rd`, neither 0 (checked above).
        Ok(unsafe { bindings::rdma_rw_mr_factor(self.as_ptr(), port, max_pages) })
    }

    /// The longest page list one fast registration maps.
    pub fn max_fast_reg_page_list_len(&self) -> u32 {
        self.attrs().max_fast_reg_page_list_len
    }

    /// What the device can do (its attributes).
    pub fn caps(&self) -> DeviceCaps {
        let a = self.attrs();
        let kernel_flag = u64::from(bindings::ib_kernel_cap_flags_IBK_SG_GAPS_REG);
        DeviceCaps {
            max_qp: a.max_qp,
            max_qp_wr: a.max_qp_wr,
            max_send_sge: a.max_send_sge,
            max_recv_sge: a.max_recv_sge,
            max_cq: a.max_cq,
            max_cqe: a.max_cqe,
            max_mr: a.max_mr,
            max_mr_size: a.max_mr_size,
            max_pd: a.max_pd,
            max_srq: a.max_srq,
            max_srq_wr: a.max_srq_wr,
            max_srq_sge: a.max_srq_sge,
            max_fast_reg_page_list_len: self.max_fast_reg_page_list_len(),
            max_qp_rd_atom: self.max_qp_rd_atom(),
            max_qp_init_rd_atom: self.max_qp_init_rd_atom(),
            fast_registration: self.has_fast_registration(),
            sg_gaps_registration: a.kernel_cap_flags & kernel_flag != 0,
            transport: self.transport(),
        }
    }
}
