// SPDX-License-Identifier: GPL-2.0

//! Registered memory regions with remote keys (FRWR).
//!
//! Registration uses fast registration work requests (FRWR: `ib_alloc_mr`,
//! `ib_map_mr_sg`, then `IB_WR_REG_MR` on a QP's send queue), the method
//! every in-kernel ULP uses (nvme-rdma, NFS/RDMA, SMB Direct): it works on
//! IB, RoCE and iWARP alike and never hands out an all-of-memory key.  The
//! work requests themselves are posted by [`super::verbs::Qp`].
//!
//! # Ownership
//!
//! * An [`Mr`] owns a DMA-mapped buffer and an FRWR memory region over it,
//!   both on the device of the PD it was made on: a physically contiguous
//!   buffer of up to [`MAX_MR_LEN`] ([`Mr::new`]), or whole pages of an
//!   [`SgBuffer`], as many as the device's fast registration maps
//!   ([`Mr::from_pages`]).
//!   It is shared ([`Arc`]): every work request that names it
//!   (registration, invalidation, RDMA READ/WRITE) holds a reference until
//!   its completion, so neither the region nor its memory can be freed
//!   while the device may still use them.
//! * The last reference deregisters the region (`ib_dereg_mr`), after which
//!   its keys no longer grant any access, and only then unmaps and frees the
//!   memory.  A peer holding a stale remote key fails with a remote access
//!   error instead of touching freed memory.
//! * While registered with remote access the memory may change under the
//!   CPU at any time.  Rust code therefore never holds a reference into it:
//!   [`Mr::read`] and [`Mr::write`] copy through C, and the bytes of a copy
//!   that races with the peer may be torn (the protocol above decides when
//!   the contents are meaningful, as with any RDMA buffer).
//! * DMA syncs cover only the bytes a copy or a work request touches, in the
//!   direction of the transfer: with bounce buffers (swiotlb) a whole-region
//!   sync for the device would copy stale CPU bytes over what the peer
//!   wrote elsewhere in the region.
//! * Each registration gets a fresh key (`ib_update_fast_reg_key`), so a key
//!   from an earlier registration of the same region stops working once the
//!   region is invalidated.

use super::{
    bindings,
    device::{Device, Transport},
    pd::{Pd, RemoteKey},
    sg::SgBuffer,
};
use core::{alloc::Layout, mem::ManuallyDrop, ptr::NonNull};
use kernel::{
    alloc::{
        allocator::Kmalloc,
        flags::{__GFP_NOWARN, __GFP_ZERO},
        Allocator, NumaNode,
    },
    new_mutex,
    page::PAGE_SIZE,
    prelude::*,
    sync::{Arc, Mutex, MutexGuard},
};

fn buffer_layout(capacity: usize) -> Result<Layout> {
    Layout::from_size_align(capacity, PAGE_SIZE).map_err(|_| EINVAL)
}

/// The largest region one [`Mr`] covers: 1 MiB (256 pages of 4 KiB), well
/// within `kmalloc`'s contiguous limit and the fast registration lists of
/// the devices tested.
pub const MAX_MR_LEN: usize = 1 << 20;

/// Remote access a registration grants.  Local write access is always
/// granted: the verbs require it for remote write, and an RDMA READ writes
/// into its local region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MrAccess {
    /// The peer may RDMA READ the region.
    pub remote_read: bool,
    /// The peer may RDMA WRITE the region (on iWARP also granted to a
    /// [`Self::LOCAL`] registration, the sink of an RDMA READ: see
    /// [`Self::to_raw`]).
    pub remote_write: bool,
}

impl MrAccess {
    /// No remote access asked for: the local side of RDMA READ/WRITE.
    pub const LOCAL: Self = Self {
        remote_read: false,
        remote_write: false,
    };

    /// The access flags a registration on `transport` uses.  On iWARP the
    /// sink of an RDMA READ must allow remote write (the READ response is
    /// placed as a tagged write, RFC 5040), so a region registered for
    /// local use gets it there, as `rdma_rw.c` does for its READ sinks
    /// (so never advertise the key of a [`Self::LOCAL`] registration).
    pub fn to_raw(self, transport: Transport) -> i32 {
        let mut raw = bindings::ib_access_flags_IB_ACCESS_LOCAL_WRITE;
        if self.remote_read {
            raw |= bindings::ib_access_flags_IB_ACCESS_REMOTE_READ;
        }
        if self.remote_write || (self == Self::LOCAL && transport == Transport::Iwarp) {
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

use super::sg::check_range;

/// The registration state of a region, changed only under [`Mr::reg`].
pub(crate) struct Registration {
    /// A registration is posted and no invalidation after it: the send
    /// queue executes work requests in order, so this is the state the
    /// device will be in for anything posted next.
    pub(crate) valid: bool,
    /// A registration is prepared ([`super::verbs::PreparedRegistration`])
    /// and not posted yet: its keys are in the MR, and no other
    /// registration may start.
    pub(crate) prepared: bool,
    /// The key byte of the next registration.
    next_key: u8,
    /// The keys of the current registration, and the address its first
    /// byte has under them (a local request names the region's bytes by
    /// it, with `lkey`).
    pub(crate) lkey: u32,
    pub(crate) rkey: u32,
    pub(crate) iova: u64,
    /// The current registration's remote key as its PD records it, which
    /// a peer's remote invalidation marks.
    pub(crate) remote: Option<Arc<RemoteKey>>,
}

impl Registration {
    /// Whether the region is registered for anything posted next: a
    /// registration posted, and neither a local invalidation posted after
    /// it nor a remote one received.
    pub(crate) fn is_valid(&self) -> bool {
        self.valid && !self.remote.as_ref().is_some_and(|k| k.is_invalidated())
    }

    /// Has `pd` (the region's) forget the current key: invalidated locally,
    /// replaced by a new registration, or going with the region (a later
    /// region may be given the same key).
    pub(crate) fn withdraw_remote(&mut self, pd: &Pd) {
        if let Some(key) = self.remote.take() {
            pd.withdraw_key(self.rkey, &key);
        }
    }
}

/// The memory of a region.
enum Memory {
    /// `capacity` bytes allocated by `Kmalloc` (physically contiguous,
    /// page aligned), mapped at `dma`.
    Contiguous {
        data: NonNull<u8>,
        capacity: usize,
        dma: u64,
    },
    /// The pages of `buf`, whose scatterlist is mapped in `mapped` DMA
    /// segments; freed only after the MR is deregistered.
    Pages {
        buf: ManuallyDrop<SgBuffer>,
        mapped: u32,
    },
}

/// The allocations behind a region.
///
/// # Invariants
///
/// * `raw` is a live FRWR MR allocated on `pd`'s device, deregistered only
///   by `drop`; its keys and page list change only with [`Mr::reg`] locked.
/// * `memory` holds at least `len` bytes, DMA-mapped bidirectionally for
///   `pd`'s device while the object lives; no Rust reference to them
///   exists.
struct MrResources {
    raw: NonNull<bindings::ib_mr>,
    memory: Memory,
    len: usize,
    /// Dropped only once the MR is deregistered: a PD with a live MR must
    /// not be freed (nor its device released).
    pd: ManuallyDrop<Arc<Pd>>,
}

/// A memory region for fast registration, with its own buffer: see the
/// module documentation for who owns what.
#[pin_data(PinnedDrop)]
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
    /// region able to cover it, on `pd`'s device.  `EINVAL` for 0 or more
    /// than [`MAX_MR_LEN`]; `EOPNOTSUPP` if the device has no fast
    /// registration.
    pub fn new(pd: &Arc<Pd>, len: usize) -> Result<Arc<Self>> {
        check_range(0, len, MAX_MR_LEN)?;
        let dev = pd.device();
        if !dev.has_fast_registration() {
            return Err(EOPNOTSUPP);
        }
        let capacity = len.next_multiple_of(PAGE_SIZE);
        let pages = capacity / PAGE_SIZE;
        if pages > dev.max_fast_reg_page_list_len() as usize {
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
        // SAFETY: `data` is `capacity` freshly allocated bytes; the device
        // is valid while `pd` is.
        let mapped = kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_dma_map_single(
                dev.as_ptr(),
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
        // SAFETY: `pd` is live; `pages` is within the device's limit.
        let raw = unsafe {
            bindings::ib_alloc_mr(
                pd.as_ptr(),
                bindings::ib_mr_type_IB_MR_TYPE_MEM_REG,
                pages as u32,
            )
        };
        let raw = match kernel::error::from_err_ptr(raw) {
            Ok(raw) => raw,
            Err(e) => {
                // SAFETY: Mapped above, unmapped once, before the free.
                unsafe {
                    bindings::ib_dma_unmap_single(
                        dev.as_ptr(),
                        dma,
                        capacity,
                        bindings::dma_data_direction::DMA_BIDIRECTIONAL,
                    )
                };
                free(data);
                return Err(e);
            }
        };
        // INVARIANT: All allocated and mapped above.  If the allocation
        // below fails, `res` is dropped and frees all.
        let res = MrResources {
            // SAFETY: `from_err_ptr` returned a valid, non-null pointer.
            raw: unsafe { NonNull::new_unchecked(raw) },
            memory: Memory::Contiguous {
                data,
                capacity,
                dma,
            },
            len,
            pd: ManuallyDrop::new(pd.clone()),
        };
        Self::with_resources(res)
    }

    /// A region over the pages of `buf`, its length `buf.len()` (beyond
    /// [`MAX_MR_LEN`] where the device allows), on `pd`'s device: the
    /// buffer is the region's memory until the region goes.  `EINVAL` for
    /// more pages than the device's fast registration maps at once
    /// (`max_fast_reg_page_list_len`);
    /// `EOPNOTSUPP` if the device has no fast registration.
    pub fn from_pages(pd: &Arc<Pd>, buf: SgBuffer) -> Result<Arc<Self>> {
        let dev = pd.device();
        if !dev.has_fast_registration() {
            return Err(EOPNOTSUPP);
        }
        let pages = buf.len().div_ceil(PAGE_SIZE);
        if pages > dev.max_fast_reg_page_list_len() as usize {
            return Err(EINVAL);
        }
        let (sgl, nents) = buf.sgl();
        // SAFETY: `sgl` is the buffer's unmapped scatterlist of `nents`
        // entries over pages it owns; the device is valid while `pd` is.
        let mapped = unsafe {
            bindings::ib_dma_map_sg(
                dev.as_ptr(),
                sgl,
                nents as i32,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
            )
        };
        let Ok(mapped @ 1..) = u32::try_from(mapped) else {
            return Err(ENOMEM);
        };
        // SAFETY: `pd` is live; `pages` is within the device's limit.
        let raw = unsafe {
            bindings::ib_alloc_mr(
                pd.as_ptr(),
                bindings::ib_mr_type_IB_MR_TYPE_MEM_REG,
                pages as u32,
            )
        };
        let raw = match kernel::error::from_err_ptr(raw) {
            Ok(raw) => raw,
            Err(e) => {
                // SAFETY: Mapped above, unmapped once, before the buffer
                // goes.
                unsafe {
                    bindings::ib_dma_unmap_sg(
                        dev.as_ptr(),
                        sgl,
                        nents as i32,
                        bindings::dma_data_direction::DMA_BIDIRECTIONAL,
                    )
                };
                return Err(e);
            }
        };
        let len = buf.len();
        // INVARIANT: Allocated and mapped above.
        let res = MrResources {
            // SAFETY: `from_err_ptr` returned a valid, non-null pointer.
            raw: unsafe { NonNull::new_unchecked(raw) },
            memory: Memory::Pages {
                buf: ManuallyDrop::new(buf),
                mapped,
            },
            len,
            pd: ManuallyDrop::new(pd.clone()),
        };
        Self::with_resources(res)
    }

    fn with_resources(res: MrResources) -> Result<Arc<Self>> {
        let raw = res.raw.as_ptr();
        // SAFETY: A fresh MR: its keys are set and nothing changes them yet.
        let (lkey, rkey) = unsafe { ((*raw).lkey, (*raw).rkey) };
        Arc::pin_init(
            pin_init!(Self {
                res,
                reg <- new_mutex!(Registration {
                    valid: false,
                    prepared: false,
                    remote: None,
                    next_key: (rkey as u8).wrapping_add(1),
                    lkey,
                    rkey,
                    iova: 0,
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

    /// The device the region lives on.
    pub fn device(&self) -> &Device {
        self.res.pd.device()
    }

    /// The PD the region is in.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.res.pd
    }

    /// Whether a registration is posted and no invalidation after it.
    pub fn is_registered(&self) -> bool {
        self.reg.lock().is_valid()
    }

    /// `EINVAL` unless `len` bytes at `offset` (`len` not 0) lie within
    /// the region: what [`Self::read`] and [`Self::write`] check first.
    pub fn check_range(&self, offset: usize, len: usize) -> Result {
        check_range(offset, len, self.res.len)
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result {
        check_range(offset, out.len(), self.res.len)?;
        self.sync_for_cpu(offset, out.len());
        self.copy(offset, out.as_mut_ptr(), out.len(), false)
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result {
        check_range(offset, data.len(), self.res.len)?;
        // `copy` only reads `buf` when `to_region` is set.
        self.copy(offset, data.as_ptr().cast_mut(), data.len(), true)?;
        self.sync_for_device(offset, data.len());
        Ok(())
    }

    /// Copies `len` bytes between `buf` and the region at `offset` (into
    /// the region with `to_region`, reading `buf`; else writing it), in C,
    /// outside of any Rust reference to the region's memory.  The range
    /// lies within the region (the callers checked it).
    fn copy(&self, offset: usize, buf: *mut u8, len: usize, to_region: bool) -> Result {
        match &self.res.memory {
            Memory::Contiguous { data, .. } => {
                // SAFETY: The callers checked the range against the
                // allocation; `buf` has `len` bytes, writable unless
                // `to_region`.
                let at = unsafe { data.as_ptr().add(offset) };
                let (dst, src) = if to_region { (at, buf) } else { (buf, at) };
                // SAFETY: As above: both ranges are valid for `len` bytes.
                unsafe { bindings::memcpy(dst.cast(), src.cast(), len) };
                Ok(())
            }
            Memory::Pages { buf: pages, .. } => {
                let (sgl, nents) = pages.sgl();
                // SAFETY: The scatterlist of `nents` entries over the
                // buffer's live pages; `buf` as above; the copy maps each
                // page in turn.
                kernel::error::to_result(unsafe {
                    bindings::rdma_cm_rs_sg_copy(sgl, nents, buf.cast(), len, offset, to_region)
                })
            }
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut bindings::ib_mr {
        self.res.raw.as_ptr()
    }

    /// The registration state, locked.
    pub(crate) fn registration(&self) -> MutexGuard<'_, Registration> {
        self.reg.lock()
    }

    /// Maps the whole region into the MR's page list under a fresh key and
    /// returns (iova, lkey, rkey) of the registration to post.
    pub(crate) fn map_for_registration(&self, reg: &mut Registration) -> Result<(u64, u32, u32)> {
        let raw = self.as_ptr();
        // A request posted earlier (an invalidation, a failed registration)
        // may still be executing on the device: the page list it reads gets
        // the same single mapping of this buffer again, and the key byte is
        // only read when the next REG_MR is posted.
        // The caller holds `self.reg`: nothing else changes the MR's keys
        // or page list (type invariants).
        // SAFETY: As just said; the memory is mapped for the MR's device,
        // in `mapped` segments for pages.
        let mapped = unsafe {
            bindings::ib_update_fast_reg_key(raw, reg.next_key);
            kernel::error::to_result(match &self.res.memory {
                Memory::Contiguous { dma, .. } => {
                    bindings::rdma_cm_rs_map_mr(raw, *dma, self.res.len as u32)
                }
                Memory::Pages { buf, mapped } => {
                    bindings::rdma_cm_rs_map_mr_sg(raw, buf.sgl().0, *mapped)
                }
            })
        };
        reg.next_key = reg.next_key.wrapping_add(1);
        mapped?;
        // SAFETY: Mapped just above, under the lock.
        Ok(unsafe { ((*raw).iova, (*raw).lkey, (*raw).rkey) })
    }

    /// Makes what the device wrote to `len` bytes at `offset` visible to
    /// the CPU.
    pub(crate) fn sync_for_cpu(&self, offset: usize, len: usize) {
        self.sync(offset, len, true);
    }

    /// Makes what the CPU wrote to `len` bytes at `offset` visible to the
    /// device.
    pub(crate) fn sync_for_device(&self, offset: usize, len: usize) {
        self.sync(offset, len, false);
    }

    fn sync(&self, offset: usize, len: usize, for_cpu: bool) {
        let dev = self.device().as_ptr();
        let dir = bindings::dma_data_direction::DMA_BIDIRECTIONAL;
        match &self.res.memory {
            Memory::Contiguous { dma, .. } => {
                let at = dma + offset as u64;
                // SAFETY: Mapped by the type invariants; the range lies
                // within the mapping (callers checked it against `len`).
                unsafe {
                    if for_cpu {
                        bindings::ib_dma_sync_single_for_cpu(dev, at, len, dir)
                    } else {
                        bindings::ib_dma_sync_single_for_device(dev, at, len, dir)
                    }
                };
            }
            Memory::Pages { buf, mapped } => {
                // SAFETY: Mapped in `mapped` segments by the type
                // invariants; the helper syncs the part of them the range
                // covers.
                unsafe {
                    bindings::rdma_cm_rs_sync_sg_range(
                        dev,
                        buf.sgl().0,
                        *mapped,
                        offset,
                        len,
                        for_cpu,
                    )
                };
            }
        }
    }
}

#[pinned_drop]
impl PinnedDrop for Mr {
    fn drop(self: Pin<&mut Self>) {
        self.reg.lock().withdraw_remote(&self.res.pd);
    }
}

impl Drop for MrResources {
    fn drop(&mut self) {
        // Deregistration revokes every key before the memory goes: no work
        // request names this MR any more (each holds a reference).
        // SAFETY: Live MR, deregistered once, here.
        let ret = unsafe { bindings::ib_dereg_mr(self.raw.as_ptr()) };
        if ret != 0 {
            // The device may still reach the memory: leaking it, and the PD
            // and device reference the MR needs, is the only safe answer.
            pr_err!("ib_dereg_mr failed ({ret}), leaking the region\n");
            return;
        }
        // A peer's WRITE the driver began placing before the key went
        // invalid may still be copying into the memory.  Process context:
        // `ib_dereg_mr` has just slept too.
        self.pd.device().wait_for_ended_key_writes();
        let dev = self.pd.device().as_ptr();
        match &mut self.memory {
            Memory::Contiguous {
                data,
                capacity,
                dma,
            } => {
                // SAFETY: Mapped and allocated by the type invariants;
                // nothing can reach them after deregistration; the PD (and
                // so the device) is still held by `self.pd`.
                unsafe {
                    bindings::ib_dma_unmap_single(
                        dev,
                        *dma,
                        *capacity,
                        bindings::dma_data_direction::DMA_BIDIRECTIONAL,
                    );
                    Kmalloc::free(
                        *data,
                        Layout::from_size_align_unchecked(*capacity, PAGE_SIZE),
                    );
                }
            }
            Memory::Pages { buf, .. } => {
                let (sgl, nents) = buf.sgl();
                // SAFETY: As above; mapped from these `nents` entries, then
                // the buffer is freed once, here, unmapped.
                unsafe {
                    bindings::ib_dma_unmap_sg(
                        dev,
                        sgl,
                        nents as i32,
                        bindings::dma_data_direction::DMA_BIDIRECTIONAL,
                    );
                    ManuallyDrop::drop(buf);
                }
            }
        }
        // SAFETY: Dropped once, here, after the MR is gone; never used again.
        unsafe { ManuallyDrop::drop(&mut self.pd) };
    }
}
