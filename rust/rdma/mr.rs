// SPDX-License-Identifier: GPL-2.0

//! Registered memory regions with remote keys, and RDMA READ/WRITE.
//!
//! Registration uses fast registration work requests (FRWR: `ib_alloc_mr`,
//! `ib_map_mr_sg`, then `IB_WR_REG_MR` on the QP's send queue), the method
//! every in-kernel ULP uses (nvme-rdma, NFS/RDMA, SMB Direct): it works on
//! IB, RoCE and iWARP alike and never hands out an all-of-memory key.
//!
//! # Ownership
//!
//! * An [`Mr`] owns a physically contiguous, DMA-mapped buffer and an FRWR
//!   memory region over it.  It is shared ([`Arc`]): every work request that
//!   names it (registration, invalidation, RDMA READ/WRITE) holds a
//!   reference until its completion, so neither the region nor its memory
//!   can be freed while the device may still use them.
//! * The last reference deregisters the region (`ib_dereg_mr`), after which
//!   its keys no longer grant any access, and only then unmaps and frees the
//!   memory.  A peer holding a stale remote key fails with a remote access
//!   error instead of touching freed memory.
//! * While registered with remote access the memory may change under the
//!   CPU at any time.  Rust code therefore never holds a reference into it:
//!   [`Mr::read`] and [`Mr::write`] copy through C, and the bytes of a copy
//!   that races with the peer may be torn (the protocol above decides when
//!   the contents are meaningful, as with any RDMA buffer).
//! * Each registration gets a fresh key (`ib_update_fast_reg_key`), so a key
//!   from an earlier registration of the same region stops working once the
//!   region is invalidated.

use super::{
    bindings,
    verbs::{CompletionHandler, Pd, Qp},
};
use core::{alloc::Layout, ptr::NonNull};
use kernel::{
    alloc::{
        allocator::Kmalloc,
        flags::{__GFP_NOWARN, __GFP_ZERO},
        Allocator, NumaNode,
    },
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    sync::{Arc, Mutex},
};

fn buffer_layout(capacity: usize) -> Result<Layout> {
    Layout::from_size_align(capacity, PAGE_SIZE).map_err(|_| EINVAL)
}

/// The largest region one [`Mr`] covers: 1 MiB (256 pages of 4 KiB), well
/// within `kmalloc`'s contiguous limit and rxe's 512-page FRWR list.
pub const MAX_MR_LEN: usize = 1 << 20;

/// Remote access a registration grants.  Local write access is always
/// granted: the verbs require it for remote write, and an RDMA READ writes
/// into its local region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrAccess {
    /// The peer may RDMA READ the region.
    pub remote_read: bool,
    /// The peer may RDMA WRITE the region (iWARP also requires this of the
    /// local sink of an RDMA READ).
    pub remote_write: bool,
}

impl MrAccess {
    /// Only local access: for the local side of RDMA READ/WRITE on IB/RoCE.
    pub const LOCAL: Self = Self {
        remote_read: false,
        remote_write: false,
    };

    pub(crate) fn to_raw(self) -> i32 {
        let mut raw = bindings::ib_access_flags_IB_ACCESS_LOCAL_WRITE;
        if self.remote_read {
            raw |= bindings::ib_access_flags_IB_ACCESS_REMOTE_READ;
        }
        if self.remote_write {
            raw |= bindings::ib_access_flags_IB_ACCESS_REMOTE_WRITE;
        }
        raw as i32
    }
}

/// A peer's registered memory as it advertises it: address, remote key and
/// length.  Only a description: the peer decides whether it is still valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteRegion {
    /// The first byte's address in the peer's MR (its `iova`).
    pub addr: u64,
    /// The peer's remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u32,
}

impl RemoteRegion {
    /// The sub-region of `len` bytes at `offset`: `EINVAL` if it is empty or
    /// does not lie within `self`.
    pub fn slice(&self, offset: u64, len: u32) -> Result<Self> {
        let end = offset.checked_add(u64::from(len)).ok_or(EINVAL)?;
        if len == 0 || end > u64::from(self.len) {
            return Err(EINVAL);
        }
        Ok(Self {
            addr: self.addr.checked_add(offset).ok_or(EINVAL)?,
            rkey: self.rkey,
            len,
        })
    }
}

/// Checks that `len` bytes at `offset` lie within a region of `size` bytes
/// (and that `len` is not 0).
pub fn check_range(offset: usize, len: usize, size: usize) -> Result {
    match offset.checked_add(len) {
        Some(end) if len > 0 && end <= size => Ok(()),
        _ => Err(EINVAL),
    }
}

/// The registration state of a region, changed only under [`Mr::reg`].
struct Registration {
    /// A registration is posted and no invalidation after it: the send
    /// queue executes work requests in order, so this is the state the
    /// device will be in for anything posted next.
    valid: bool,
    /// The key byte of the next registration.
    next_key: u8,
    /// The keys of the current registration.
    lkey: u32,
    rkey: u32,
}

/// A memory region for fast registration, with its own buffer.
///
/// # Invariants
///
/// * `raw` is a live FRWR MR of `pd`, deregistered only by `drop`; its keys
///   and page list change only with `reg` locked.
/// * `data` points to `capacity` bytes allocated by `Kmalloc` (physically
///   contiguous, page aligned), DMA-mapped bidirectionally at `dma` for
///   `device` while the object lives; no Rust reference to them exists.
struct MrResources {
    raw: NonNull<bindings::ib_mr>,
    device: *mut bindings::ib_device,
    data: NonNull<u8>,
    capacity: usize,
    dma: u64,
    len: usize,
    _pd: Arc<Pd>,
}

/// A memory region for fast registration, with its own buffer: see the
/// module documentation for who owns what.
#[pin_data]
pub struct Mr {
    res: MrResources,
    /// Serialises registration, invalidation and the posts that use the
    /// current keys (lock order: this, then the QP's post lock).
    #[pin]
    reg: Mutex<Registration>,
}

// SAFETY: The MR and the DMA API may be used from any thread; the memory is
// only reached through C copies; the MR's keys change under `Mr::reg`.
unsafe impl Send for MrResources {}
// SAFETY: As above: shared use only copies bytes; key changes are locked.
unsafe impl Sync for MrResources {}

impl Mr {
    /// Allocates a zeroed, DMA-mapped buffer of `len` bytes and an FRWR
    /// region able to cover it.  `EINVAL` for 0 or more than
    /// [`MAX_MR_LEN`]; `EOPNOTSUPP` if the device has no fast registration.
    pub fn new(pd: &Arc<Pd>, len: usize) -> Result<Arc<Self>> {
        check_range(0, len, MAX_MR_LEN)?;
        let device = pd.device();
        // SAFETY: The PD keeps its device alive.
        let attrs = unsafe { &(*device).attrs };
        if attrs.device_cap_flags
            & bindings::ib_device_cap_flags_IB_DEVICE_MEM_MGT_EXTENSIONS as u64
            == 0
        {
            return Err(EOPNOTSUPP);
        }
        let capacity = len.next_multiple_of(PAGE_SIZE);
        let pages = capacity / PAGE_SIZE;
        if pages > attrs.max_fast_reg_page_list_len as usize {
            return Err(EINVAL);
        }
        // Power-of-two kmalloc sizes of a page or more are page aligned;
        // `capacity` is rounded to pages, so the region starts a page.
        let layout = buffer_layout(capacity)?;
        let data = Kmalloc::alloc(
            layout,
            GFP_KERNEL | __GFP_ZERO | __GFP_NOWARN,
            NumaNode::NO_NODE,
        )?;
        let data: NonNull<u8> = data.cast();
        let mut dma = 0u64;
        // SAFETY: `data` is `capacity` freshly allocated bytes.
        let mapped = kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_dma_map_single(
                device,
                data.as_ptr().cast(),
                capacity,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
                &mut dma,
            )
        });
        let free = |data: NonNull<u8>| {
            // SAFETY: Allocated above with this layout and not used after.
            unsafe { Kmalloc::free(data, layout) }
        };
        if let Err(e) = mapped {
            free(data);
            return Err(e);
        }
        // SAFETY: `pd` is live.
        let raw = unsafe { bindings::rdma_cm_rs_alloc_mr(pd.as_ptr(), pages as u32) };
        let raw = match kernel::error::from_err_ptr(raw) {
            Ok(raw) => raw,
            Err(e) => {
                // SAFETY: Mapped above, unmapped once.
                unsafe {
                    bindings::rdma_cm_rs_dma_unmap_single(
                        device,
                        dma,
                        capacity,
                        bindings::dma_data_direction::DMA_BIDIRECTIONAL,
                    )
                };
                free(data);
                return Err(e);
            }
        };
        // SAFETY: A fresh MR.
        let (lkey, rkey) = unsafe { ((*raw).lkey, (*raw).rkey) };
        // INVARIANT: All allocated and mapped above.  If the allocation
        // below fails, `res` is dropped with the initialiser and frees all.
        let res = MrResources {
            // SAFETY: `from_err_ptr` returned a valid, non-null pointer.
            raw: unsafe { NonNull::new_unchecked(raw) },
            device,
            data,
            capacity,
            dma,
            len,
            _pd: pd.clone(),
        };
        Arc::pin_init(
            pin_init!(Self {
                res,
                reg <- new_mutex!(Registration {
                    valid: false,
                    next_key: (rkey as u8).wrapping_add(1),
                    lkey,
                    rkey,
                }),
            }),
            GFP_KERNEL,
        )
    }

    /// The region's length in bytes.
    pub fn len(&self) -> usize {
        self.res.len
    }

    /// Whether the region is empty (never: kept for clippy's sake).
    pub fn is_empty(&self) -> bool {
        self.res.len == 0
    }

    /// Whether a registration is posted and no invalidation after it.
    pub fn is_registered(&self) -> bool {
        self.reg.lock().valid
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result {
        let res = &self.res;
        check_range(offset, out.len(), res.len)?;
        res.sync_for_cpu();
        // SAFETY: The range lies within the allocation (checked above);
        // `out` is writable; the copy happens in C, outside of any Rust
        // reference to the region.
        unsafe {
            bindings::rdma_cm_rs_copy(
                out.as_mut_ptr().cast(),
                res.data.as_ptr().add(offset).cast(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result {
        let res = &self.res;
        check_range(offset, data.len(), res.len)?;
        // SAFETY: As in `read`, in the other direction.
        unsafe {
            bindings::rdma_cm_rs_copy(
                res.data.as_ptr().add(offset).cast(),
                data.as_ptr().cast(),
                data.len(),
            )
        };
        res.sync_for_device();
        Ok(())
    }

    fn as_ptr(&self) -> *mut bindings::ib_mr {
        self.res.raw.as_ptr()
    }
}

impl MrResources {
    /// Makes what the device wrote visible to the CPU.
    fn sync_for_cpu(&self) {
        // SAFETY: Mapped by the type invariants.
        unsafe {
            bindings::rdma_cm_rs_dma_sync_for_cpu(
                self.device,
                self.dma,
                self.capacity,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
            )
        };
    }

    /// Makes what the CPU wrote visible to the device.
    fn sync_for_device(&self) {
        // SAFETY: Mapped by the type invariants.
        unsafe {
            bindings::rdma_cm_rs_dma_sync_for_device(
                self.device,
                self.dma,
                self.capacity,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
            )
        };
    }
}

impl Drop for MrResources {
    fn drop(&mut self) {
        // Deregistration revokes every key before the memory goes: no work
        // request names this MR any more (each holds a reference).
        // SAFETY: Live MR, deregistered once, here.
        let ret = unsafe { bindings::rdma_cm_rs_dereg_mr(self.raw.as_ptr()) };
        if ret != 0 {
            // The device may still reach the memory: leaking it is the only
            // safe answer.
            pr_err!("rdma_cm_rs: ib_dereg_mr failed ({ret}), leaking the region\n");
            return;
        }
        // SAFETY: Mapped and allocated by the type invariants; nothing can
        // reach them after deregistration.
        unsafe {
            bindings::rdma_cm_rs_dma_unmap_single(
                self.device,
                self.dma,
                self.capacity,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
            );
            Kmalloc::free(
                self.data,
                Layout::from_size_align_unchecked(self.capacity, PAGE_SIZE),
            );
        }
    }
}

/// The kinds of memory work requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkOp {
    /// `IB_WR_REG_MR`.
    Register,
    /// `IB_WR_LOCAL_INV`.
    Invalidate,
    /// `IB_WR_RDMA_READ`: peer memory into the local region.
    RdmaRead,
    /// `IB_WR_RDMA_WRITE`: the local region into peer memory.
    RdmaWrite,
}

/// A completed memory work request, handed to
/// [`CompletionHandler::work_done`].
pub struct WorkDone {
    /// What was posted.
    pub op: WorkOp,
    /// The consumer's tag from the post.
    pub tag: u64,
    /// The region the request named; dropping the last reference
    /// deregisters it.
    pub mr: Arc<Mr>,
}

/// A posted memory work request.
///
/// # Invariants
///
/// `cqe` is the completion entry of the work request that owns this object.
#[repr(C)]
pub(crate) struct Work {
    cqe: bindings::ib_cqe,
    done: WorkDone,
}

impl Work {
    /// Recovers the work of a completion.
    ///
    /// # Safety
    ///
    /// `wc` must complete a work request posted with a `Work` leaked by
    /// `KBox::into_raw` in this module.
    unsafe fn from_wc(wc: *mut bindings::ib_wc) -> KBox<Self> {
        // SAFETY: By the safety requirements `wr_cqe` is the `cqe` of a `Work`,
        // its first field.
        unsafe { KBox::from_raw((*wc).__bindgen_anon_1.wr_cqe.cast::<Work>()) }
    }
}

/// # Safety
///
/// Called by the CQ for a work request posted by the methods below on a QP
/// whose CQ is a `Cq<C>`.
unsafe extern "C" fn work_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = super::cm::CallbackMark::enter();
    // SAFETY: By the safety requirements.
    let work = unsafe { Work::from_wc(wc) };
    // SAFETY: `wc` is valid during the callback.
    let result = super::verbs::wc_result(unsafe { &*wc });
    let Work { done, .. } = KBox::into_inner(work);
    match (done.op, &result) {
        // The region is free again: a failed registration grants nothing.
        (WorkOp::Register, Err(_)) => done.mr.reg.lock().valid = false,
        // A failed invalidation may leave the keys valid: refuse to
        // register again; dropping the region still revokes everything.
        (WorkOp::Invalidate, Err(_)) => done.mr.reg.lock().valid = true,
        _ => {}
    }
    if matches!(done.op, WorkOp::RdmaRead) && result.is_ok() {
        done.mr.res.sync_for_cpu();
    }
    // SAFETY: The CQ is live during its callback and its context is a `Cq<C>`.
    let handler = unsafe { super::verbs::handler_of::<C>(cq) };
    handler.work_done(done, result);
}

impl<C: CompletionHandler> Qp<C> {
    fn post_work(
        &self,
        done: WorkDone,
        fill: impl FnOnce(&mut bindings::ib_send_wr) -> *const bindings::ib_send_wr,
    ) -> Result {
        let work = KBox::new(
            Work {
                cqe: bindings::ib_cqe {
                    done: Some(work_done::<C>),
                },
                done,
            },
            GFP_KERNEL,
        )?;
        let leaked = KBox::into_raw(work);
        let ret = self.post_send_raw(|wr| {
            // SAFETY: `leaked` is live until its completion or the failure below.
            wr.__bindgen_anon_1.wr_cqe = unsafe { &raw mut (*leaked).cqe };
            wr.send_flags = bindings::ib_send_flags_IB_SEND_SIGNALED;
            fill(wr)
        });
        if let Err(e) = ret {
            // SAFETY: The post failed: nothing else owns the work.
            drop(unsafe { KBox::from_raw(leaked) });
            return Err(e);
        }
        Ok(())
    }

    /// Registers `mr` with `access` (`IB_WR_REG_MR`) under a fresh key and
    /// returns what to advertise to the peer.
    ///
    /// The key is usable by the peer once the registration has executed;
    /// the send queue runs in order, so a SEND posted after this call that
    /// carries the region is safe to act on.  Completion (or failure) is
    /// reported to [`CompletionHandler::work_done`] with `tag`.  `EBUSY` if
    /// the region is registered already.
    pub fn register(&self, mr: &Arc<Mr>, access: MrAccess, tag: u64) -> Result<RemoteRegion> {
        let mut reg = mr.reg.lock();
        if reg.valid {
            return Err(EBUSY);
        }
        let res = &mr.res;
        // SAFETY: The region is free (no registration uses its keys) and
        // `reg` is locked, so nothing else changes or reads the MR's keys
        // and page list (type invariants).  The buffer is mapped for the
        // MR's device.
        let mapped = unsafe {
            bindings::rdma_cm_rs_update_fast_reg_key(mr.as_ptr(), reg.next_key);
            kernel::error::to_result(bindings::rdma_cm_rs_map_mr(
                mr.as_ptr(),
                res.dma,
                res.len as u32,
            ))
        };
        reg.next_key = reg.next_key.wrapping_add(1);
        mapped?;
        // SAFETY: Mapped just above, under the lock.
        let (addr, lkey, rkey) = unsafe {
            (
                (*mr.as_ptr()).iova,
                (*mr.as_ptr()).lkey,
                (*mr.as_ptr()).rkey,
            )
        };
        let mut wr_reg: bindings::ib_reg_wr = pin_init::zeroed();
        self.post_work(
            WorkDone {
                op: WorkOp::Register,
                tag,
                mr: mr.clone(),
            },
            |wr| {
                wr_reg.wr = *wr;
                wr_reg.wr.opcode = bindings::ib_wr_opcode_IB_WR_REG_MR;
                wr_reg.mr = mr.as_ptr();
                wr_reg.key = rkey;
                wr_reg.access = access.to_raw();
                &raw const wr_reg.wr
            },
        )?;
        reg.valid = true;
        reg.lkey = lkey;
        reg.rkey = rkey;
        Ok(RemoteRegion {
            addr,
            rkey,
            len: res.len as u32,
        })
    }

    /// Invalidates the region's current registration (`IB_WR_LOCAL_INV`):
    /// once it has executed, the advertised key grants nothing.  `EINVAL` if
    /// the region is not registered.
    pub fn invalidate(&self, mr: &Arc<Mr>, tag: u64) -> Result {
        let mut reg = mr.reg.lock();
        if !reg.valid {
            return Err(EINVAL);
        }
        let rkey = reg.rkey;
        self.post_work(
            WorkDone {
                op: WorkOp::Invalidate,
                tag,
                mr: mr.clone(),
            },
            |wr| {
                wr.opcode = bindings::ib_wr_opcode_IB_WR_LOCAL_INV;
                wr.ex.invalidate_rkey = rkey;
                wr
            },
        )?;
        reg.valid = false;
        Ok(())
    }

    /// Posts an RDMA READ (`remote` into `mr` at `offset`) or WRITE (`mr` at
    /// `offset` into `remote`) of `remote.len` bytes.  The region must be
    /// registered (its local key is used; on iWARP the sink of a READ must
    /// be registered with remote write).  `EINVAL` for a range outside the
    /// region or an operation that is not READ/WRITE.
    pub fn rdma(
        &self,
        op: WorkOp,
        mr: &Arc<Mr>,
        offset: usize,
        remote: RemoteRegion,
        tag: u64,
    ) -> Result {
        let opcode = match op {
            WorkOp::RdmaRead => bindings::ib_wr_opcode_IB_WR_RDMA_READ,
            WorkOp::RdmaWrite => bindings::ib_wr_opcode_IB_WR_RDMA_WRITE,
            _ => return Err(EINVAL),
        };
        check_range(offset, remote.len as usize, mr.res.len)?;
        remote
            .addr
            .checked_add(u64::from(remote.len))
            .ok_or(EINVAL)?;
        // Held across the post: an invalidation cannot slip in between
        // reading the key and posting the request that uses it.
        let reg = mr.reg.lock();
        if !reg.valid {
            return Err(EINVAL);
        }
        let mut sge = bindings::ib_sge {
            addr: mr.res.dma + offset as u64,
            length: remote.len,
            lkey: reg.lkey,
        };
        let mut rdma: bindings::ib_rdma_wr = pin_init::zeroed();
        self.post_work(
            WorkDone {
                op,
                tag,
                mr: mr.clone(),
            },
            |wr| {
                rdma.wr = *wr;
                rdma.wr.opcode = opcode;
                rdma.wr.sg_list = &raw mut sge;
                rdma.wr.num_sge = 1;
                rdma.remote_addr = remote.addr;
                rdma.rkey = remote.rkey;
                &raw const rdma.wr
            },
        )
    }
}
