// SPDX-License-Identifier: GPL-2.0

//! DMA-mapped message buffers ([`RecvBuffer`], [`SendBuffer`]) and the
//! pages attached to them; posting a receive buffer to a QP or an SRQ.

use super::{credits::Credit, post_error::PostError};
use crate::rdma::{
    ah::{Datagram, UdDest},
    bindings,
    device::Device,
    pd::Pd,
    sg::SgBuffer,
};
use core::ptr;
use kernel::{prelude::*, sync::Arc};

/// The memory of a posted or postable buffer.
///
/// # Invariants
///
/// `data` is DMA-mapped at `dma` for `dev` in `direction` while the object
/// lives; `cqe` is the completion entry the QP reports it with.  `pages`
/// are the consumer's and reachable by no device; `mapped` pages are the
/// device's, and exist only while the buffer is posted (a buffer comes
/// back to the consumer through [`Buffer::handed_back`], which unmaps
/// them).
pub(super) struct Buffer {
    pub(super) cqe: bindings::ib_cqe,
    /// The PD whose local key `lkey` is (and, through it, the device).
    pub(super) pd: Arc<Pd>,
    /// Held from post to completion: the QP's count of requests in flight.
    pub(super) credit: Option<Credit>,
    /// A UD send's destination, held from post to completion.
    pub(super) dest: Option<UdDest>,
    /// Sends: the immediate data to carry (SEND_WITH_IMM).  Receives: what
    /// arrived with the last completion.
    pub(super) imm: Option<u32>,
    /// Sends: the peer's remote key to invalidate (SEND_WITH_INV).
    /// Receives: the key of ours the last completion invalidated.
    pub(super) invalidate: Option<u32>,
    /// Receives on a UD QP: the sender of the last completion.
    pub(super) datagram: Option<Datagram>,
    /// Receives: the QP the last completion arrived on.
    pub(super) qp_num: Option<u32>,
    /// Receives: posted on a UD QP, whose completions start with the GRH.
    pub(super) on_ud: bool,
    /// Sends: posted inline (`IB_SEND_INLINE`).
    pub(super) inline: bool,
    /// Sends: posted without asking for a completion of their own.
    pub(super) unsignaled: bool,
    dma: u64,
    direction: bindings::dma_data_direction,
    lkey: u32,
    /// Where the payload starts in `data` (after the GRH on UD receives).
    pub(super) offset: usize,
    pub(super) len: usize,
    pub(super) data: KVec<u8>,
    /// Pages attached by the consumer: sent after `data`'s bytes, or
    /// received into once `data` is full.
    pub(super) pages: Option<SgBuffer>,
    /// Receives: the bytes the last completion put into `pages`.
    pub(super) paged_len: usize,
    /// `pages` while the request is posted, with its gather list.
    pub(super) mapped: Option<MappedPages>,
}

// SAFETY: The device is only passed to the DMA API, which may be called
// from any thread; the data is owned.
unsafe impl Send for Buffer {}
// SAFETY: Shared references only read the data.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(
        pd: &Arc<Pd>,
        capacity: usize,
        direction: bindings::dma_data_direction,
    ) -> Result<KBox<Self>> {
        if capacity == 0 || capacity > u32::MAX as usize {
            return Err(EINVAL);
        }
        let mut data = KVec::with_capacity(capacity, GFP_KERNEL)?;
        data.resize(capacity, 0, GFP_KERNEL)?;
        let dev = pd.device();
        let mut dma = 0u64;
        // SAFETY: `data` is a live kmalloc'ed region of `capacity` bytes
        // (physically contiguous), unmapped in `drop`; `dev` is valid.
        kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_dma_map_single(
                dev.as_ptr(),
                data.as_mut_ptr().cast(),
                capacity,
                direction,
                &mut dma,
            )
        })?;
        // INVARIANT: Mapped just above.  If the box cannot be allocated,
        // the value is dropped, which unmaps.
        Ok(KBox::new(
            Self {
                cqe: bindings::ib_cqe { done: None },
                pd: pd.clone(),
                credit: None,
                dest: None,
                imm: None,
                invalidate: None,
                datagram: None,
                qp_num: None,
                on_ud: false,
                inline: false,
                unsignaled: false,
                dma,
                direction,
                lkey: pd.local_dma_lkey(),
                offset: 0,
                len: 0,
                data,
                pages: None,
                paged_len: 0,
                mapped: None,
            },
            GFP_KERNEL,
        )?)
    }

    /// Maps the attached pages, if any, for a request of at most `max_sge`
    /// entries whose first `head_len` bytes are the buffer's own (none for
    /// 0), and returns the request's list of entries, which the poster
    /// keeps across the post (the completion, which may run before the
    /// post returns, frees nothing of it): `EMSGSIZE` for more entries,
    /// the pages left attached on any failure.
    pub(super) fn map_pages(&mut self, head_len: usize, max_sge: u32) -> Result<Option<SgeList>> {
        let Some(pages) = self.pages.take() else {
            return Ok(None);
        };
        let head = (head_len > 0).then(|| self.sge(head_len));
        match MappedPages::map(pages, &self.pd, head, max_sge) {
            Ok((mapped, list)) => {
                self.mapped = Some(mapped);
                Ok(Some(list))
            }
            Err(PostError {
                error: e,
                value: pages,
            }) => {
                self.pages = Some(pages);
                Err(e)
            }
        }
    }

    /// Ends the device's access to the pages of a request that completed
    /// or was never posted: unmapped, they are the consumer's again.
    fn handed_back(mut self: KBox<Self>) -> KBox<Self> {
        if let Some(mapped) = self.mapped.take() {
            self.pages = Some(mapped.unmap());
        }
        self
    }

    /// A request's list of entries: `list` ([`Self::map_pages`]'s, with
    /// pages), or `single` (the buffer's own bytes, filled by the caller).
    /// Both are the poster's, alive across the post.
    pub(super) fn sg_list(
        single: &mut bindings::ib_sge,
        list: Option<&SgeList>,
    ) -> (*mut bindings::ib_sge, i32) {
        match list {
            // Drivers only read the list (`ib_sge *` for C's sake).
            Some(list) => (list.as_ptr().cast_mut(), list.len() as i32),
            None => (single, 1),
        }
    }

    fn dev(&self) -> &Device {
        self.pd.device()
    }

    /// Readies the buffer to be posted as a SEND holding `credit`: synced
    /// for the device, its completion entry calling `done`, `wr` filled
    /// (naming `sge`, filled too, or with pages `list`).
    pub(super) fn prepare_send(
        &mut self,
        credit: Credit,
        done: unsafe extern "C" fn(*mut bindings::ib_cq, *mut bindings::ib_wc),
        wr: &mut bindings::ib_send_wr,
        sge: &mut bindings::ib_sge,
        list: Option<&SgeList>,
    ) {
        self.credit = Some(credit);
        self.sync_for_device(self.len);
        self.cqe.done = Some(done);
        self.fill_send_wr(wr, sge, list);
    }

    /// Sends: fills `wr` with a SEND of the buffer's bytes as `sge`
    /// describes them (set here): its opcode (with immediate data or an
    /// invalidation) and, inline, the bytes' CPU address, which drivers
    /// copy from during the post (mlx5's `set_data_inl_seg`, rxe's
    /// `copy_inline_data_to_wqe`) rather than from their DMA address.
    /// `sge` and `list` (the entries with pages, [`Self::map_pages`]'s)
    /// must live across the post.
    pub(super) fn fill_send_wr(
        &self,
        wr: &mut bindings::ib_send_wr,
        sge: &mut bindings::ib_sge,
        list: Option<&SgeList>,
    ) {
        *sge = self.sge(self.len);
        // Never together with pages (`Qp::check_send`).
        if self.inline {
            sge.addr = self.data.as_ptr() as u64;
            wr.send_flags |= bindings::ib_send_flags_IB_SEND_INLINE;
        }
        (wr.sg_list, wr.num_sge) = Self::sg_list(sge, list);
        wr.opcode = match (self.imm, self.invalidate) {
            (Some(imm), _) => {
                wr.ex.imm_data = imm.to_be();
                bindings::ib_wr_opcode_IB_WR_SEND_WITH_IMM
            }
            (None, Some(rkey)) => {
                wr.ex.invalidate_rkey = rkey;
                bindings::ib_wr_opcode_IB_WR_SEND_WITH_INV
            }
            (None, None) => bindings::ib_wr_opcode_IB_WR_SEND,
        };
    }

    pub(super) fn sge(&self, len: usize) -> bindings::ib_sge {
        bindings::ib_sge {
            addr: self.dma,
            length: len as u32,
            lkey: self.lkey,
        }
    }

    /// Makes the first `len` bytes the device wrote visible to the CPU.
    pub(super) fn sync_for_cpu(&self, len: usize) {
        // SAFETY: Mapped by the type invariants; `len` is within it.
        unsafe {
            bindings::ib_dma_sync_single_for_cpu(
                self.dev().as_ptr(),
                self.dma,
                len.min(self.data.len()),
                self.direction,
            )
        };
    }

    /// Hands the first `len` bytes to the device.
    pub(super) fn sync_for_device(&self, len: usize) {
        // SAFETY: Mapped by the type invariants; `len` is within it.
        unsafe {
            bindings::ib_dma_sync_single_for_device(
                self.dev().as_ptr(),
                self.dma,
                len.min(self.data.len()),
                self.direction,
            )
        };
    }

    /// Recovers the buffer of a completed work request.
    ///
    /// # Safety
    ///
    /// `wc` must be the completion of a work request posted with a buffer
    /// leaked by `KBox::into_raw` in this module.
    pub(super) unsafe fn from_wc(wc: *mut bindings::ib_wc) -> KBox<Self> {
        // SAFETY: By the safety requirements `wr_cqe` is the `cqe` field of
        // a `Buffer`, its `cqe` field.
        unsafe {
            KBox::from_raw(kernel::container_of!(
                (*wc).__bindgen_anon_1.wr_cqe,
                Buffer,
                cqe
            ))
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: Mapped by the type invariants, unmapped once here.
        unsafe {
            bindings::ib_dma_unmap_single(
                self.dev().as_ptr(),
                self.dma,
                self.data.len(),
                self.direction,
            )
        };
    }
}

/// A request's list of entries with pages: the buffer's own bytes first,
/// if any, then the pages' DMA segments.
pub(super) type SgeList = KVec<bindings::ib_sge>;

/// Pages attached to a posted send or receive, mapped for the device.
///
/// # Invariants
///
/// `pages`' scatterlist is mapped (`ib_dma_map_sg`, both directions) for
/// `pd`'s device until the object is dropped or [`Self::unmap`]ped.
pub(super) struct MappedPages {
    pub(super) pages: SgBuffer,
    pd: Arc<Pd>,
}

impl MappedPages {
    /// Maps `pages` for `pd`'s device, and lists them behind `head` for a
    /// request of at most `max_sge` entries (`EMSGSIZE` for more, counted
    /// before mapping: as many as the scatterlist has), each segment of
    /// `pd`'s local DMA key.  On failure the pages come back unmapped.
    fn map(
        pages: SgBuffer,
        pd: &Arc<Pd>,
        head: Option<bindings::ib_sge>,
        max_sge: u32,
    ) -> Result<(Self, SgeList), PostError<SgBuffer>> {
        let (sgl, nents) = pages.sgl();
        let wanted = nents as usize + usize::from(head.is_some());
        if wanted > max_sge as usize {
            return Err(PostError::new(EMSGSIZE, pages));
        }
        let mut sges = match KVec::with_capacity(wanted, GFP_KERNEL) {
            Ok(sges) => sges,
            Err(e) => return Err(PostError::new(e.into(), pages)),
        };
        if let Some(head) = head {
            // Cannot fail: the capacity is there.
            let _ = sges.push(head, GFP_KERNEL);
        }
        // `ib_dma_map_sg` may be called in any context; `dev` is live (held
        // by `pd`).
        let dev = pd.device().as_ptr();
        // SAFETY: As above; `sgl` is the live scatterlist of `nents` entries
        // of pages the buffer owns, mapped by nothing (the consumer's).
        let mapped = unsafe {
            bindings::ib_dma_map_sg(
                dev,
                sgl,
                nents as i32,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
            )
        };
        if mapped <= 0 {
            return Err(PostError::new(ENOMEM, pages));
        }
        let first = sges.len();
        // `ib_dma_map_sg` merges entries, never adds any.
        let mapped = mapped.min(nents as i32);
        // SAFETY: `sgl`'s first `mapped` entries are DMA segments just
        // mapped; `sges` has room for `mapped` more entries after
        // `first`, which the call writes, and which then hold valid values.
        unsafe {
            bindings::rdma_cm_rs_sg_dma_sges(
                sgl,
                mapped,
                pd.local_dma_lkey(),
                sges.as_mut_ptr().add(first),
            );
            sges.inc_len(mapped as usize);
        }
        // INVARIANT: Mapped just above.
        Ok((
            Self {
                pages,
                pd: pd.clone(),
            },
            sges,
        ))
    }

    fn unmap_dma(&self) {
        let (sgl, nents) = self.pages.sgl();
        // SAFETY: Mapped for this device with these entries (type
        // invariants); called once, by `unmap` or the drop.
        unsafe {
            bindings::ib_dma_unmap_sg(
                self.pd.device().as_ptr(),
                sgl,
                nents as i32,
                bindings::dma_data_direction::DMA_BIDIRECTIONAL,
            )
        };
    }

    /// Unmaps the pages, which are then the CPU's again (the unmapping
    /// syncs what the device wrote for it).
    fn unmap(self) -> SgBuffer {
        self.unmap_dma();
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again: each field is
        // moved out once, here.
        unsafe {
            drop(ptr::read(&this.pd));
            ptr::read(&this.pages)
        }
    }
}

impl Drop for MappedPages {
    fn drop(&mut self) {
        self.unmap_dma();
    }
}

/// A receive buffer: DMA-mapped, owned by the consumer while not posted.
pub struct RecvBuffer(pub(super) KBox<Buffer>);

impl RecvBuffer {
    /// A buffer of `capacity` bytes for the PD.
    pub fn new(pd: &Arc<Pd>, capacity: usize) -> Result<Self> {
        Ok(Self(Buffer::new(
            pd,
            capacity,
            bindings::dma_data_direction::DMA_FROM_DEVICE,
        )?))
    }

    /// The buffer of a request that completed or was never posted.
    pub(super) fn back(inner: KBox<Buffer>) -> Self {
        Self(inner.handed_back())
    }

    /// Attaches `pages` to receive into once the buffer's own bytes are
    /// full (a scatter list: the buffer's capacity first, then the
    /// pages), returning the pages attached before.  A receive with pages
    /// takes one scatter entry for the buffer and one for each entry of
    /// the pages' scatterlist ([`SgBuffer::entries`]), within the QP's
    /// [`QpCaps::max_recv_sge`] (`EMSGSIZE` from the post otherwise); on
    /// an [`Srq`], within its [`SrqCaps::max_sge`] (`EMSGSIZE` otherwise).
    /// On a UD QP the datagram's global route header takes the buffer's
    /// first [`GRH_SIZE`] bytes, so the buffer needs that many at least
    /// (`EINVAL` from the post), and the payload fills the rest of the
    /// buffer, then the pages.  The pages are mapped for the device from
    /// the post to the completion, which hands them back attached, with
    /// what arrived in them ([`Self::paged_len`]).
    ///
    /// [`QpCaps::max_recv_sge`]: crate::rdma::QpCaps::max_recv_sge
    /// [`Srq`]: crate::rdma::Srq
    /// [`SrqCaps::max_sge`]: crate::rdma::SrqCaps::max_sge
    /// [`GRH_SIZE`]: crate::rdma::ah::GRH_SIZE
    pub fn attach_pages(&mut self, pages: SgBuffer) -> Option<SgBuffer> {
        self.0.paged_len = 0;
        self.0.pages.replace(pages)
    }

    /// Takes the attached pages off (a receive then fills only the
    /// buffer).
    pub fn detach_pages(&mut self) -> Option<SgBuffer> {
        self.0.paged_len = 0;
        self.0.pages.take()
    }

    /// The attached pages.
    pub fn pages(&self) -> Option<&SgBuffer> {
        self.0.pages.as_ref()
    }

    /// The bytes the last completion put into the attached pages, from
    /// their start: the message's bytes past [`Self::capacity`].
    pub fn paged_len(&self) -> usize {
        self.0.paged_len
    }

    /// The bytes the last completion delivered (on a UD QP, the payload
    /// after the global route header).
    pub fn data(&self) -> &[u8] {
        &self.0.data[self.0.offset..self.0.offset + self.0.len]
    }

    /// How much one receive can take (on a UD QP, [`GRH_SIZE`] of it is
    /// the global route header).
    ///
    /// [`GRH_SIZE`]: crate::rdma::ah::GRH_SIZE
    pub fn capacity(&self) -> usize {
        self.0.data.len()
    }

    /// The immediate data of the last completion (SEND_WITH_IMM), host order.
    pub fn imm(&self) -> Option<u32> {
        self.0.imm
    }

    /// The remote key of ours the peer invalidated with the message of the
    /// last completion (SEND_WITH_INV, `IB_WC_WITH_INVALIDATE`): the region
    /// it was registered for is no longer registered ([`Mr::is_registered`]
    /// says so, and it may be registered again).
    ///
    /// [`Mr::is_registered`]: crate::rdma::Mr::is_registered
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.0.invalidate
    }

    /// The sender of the last completion, on a UD QP.
    pub fn datagram(&self) -> Option<&Datagram> {
        self.0.datagram.as_ref()
    }

    /// The number of the QP the last completion arrived on: for a buffer
    /// posted to a [`Srq`], which of the QPs sharing it took the message
    /// (how a ULP finds the connection a request came from; a QP created
    /// where a destroyed one was waits until that one's completions were
    /// delivered).  `None` before any completion.
    ///
    /// [`Srq`]: crate::rdma::Srq
    pub fn qp_num(&self) -> Option<u32> {
        self.0.qp_num
    }
}

/// A send buffer: DMA-mapped, owned by the consumer while not posted.
pub struct SendBuffer(pub(super) KBox<Buffer>);

impl SendBuffer {
    /// A buffer of `capacity` bytes for the PD.
    pub fn new(pd: &Arc<Pd>, capacity: usize) -> Result<Self> {
        Ok(Self(Buffer::new(
            pd,
            capacity,
            bindings::dma_data_direction::DMA_TO_DEVICE,
        )?))
    }

    /// The buffer of a request that completed or was never posted.
    pub(super) fn back(inner: KBox<Buffer>) -> Self {
        Self(inner.handed_back())
    }

    /// Attaches `pages`, whose bytes are sent after the buffer's own (a
    /// gather list, as a ULP sends a header it built and data it did not
    /// copy), returning the pages attached before.  The message is then
    /// [`Self::data`] followed by all of the pages' [`SgBuffer::len`]
    /// bytes.  A send with pages takes one gather entry for the buffer's
    /// bytes (none if it has none) and one for each entry of the pages'
    /// scatterlist ([`SgBuffer::entries`]), within the QP's
    /// [`QpCaps::max_send_sge`] (`EMSGSIZE` from the post otherwise); not
    /// inline (`EINVAL`).  A datagram ([`Qp::post_send_ud`]) counts the
    /// pages in its size.  The pages are mapped for the device from the
    /// post to the completion, which hands them back attached.  On iWARP
    /// such a send is signaled even if [`Self::set_unsignaled`] asked
    /// otherwise: the device may send an unsignaled one from the pages, and
    /// TCP retransmit from them when a later request completes.
    ///
    /// [`QpCaps::max_send_sge`]: crate::rdma::QpCaps::max_send_sge
    /// [`Qp::post_send_ud`]: crate::rdma::Qp::post_send_ud
    pub fn attach_pages(&mut self, pages: SgBuffer) -> Option<SgBuffer> {
        self.0.pages.replace(pages)
    }

    /// Takes the attached pages off (a send then carries only the
    /// buffer's bytes).
    pub fn detach_pages(&mut self) -> Option<SgBuffer> {
        self.0.pages.take()
    }

    /// The attached pages.
    pub fn pages(&self) -> Option<&SgBuffer> {
        self.0.pages.as_ref()
    }

    /// The attached pages, to fill in before the buffer is posted.
    pub fn pages_mut(&mut self) -> Option<&mut SgBuffer> {
        self.0.pages.as_mut()
    }

    /// Replaces the contents; `EMSGSIZE` if `data` does not fit.
    pub fn fill(&mut self, data: &[u8]) -> Result {
        self.fill_with(data.len(), |dst| {
            dst.copy_from_slice(data);
            Ok(())
        })
    }

    /// Replaces the contents with `len` bytes that `write` puts in the
    /// slice it gets (from user memory, say, with no copy in between);
    /// `EMSGSIZE` if `len` does not fit.  If `write` fails, the buffer
    /// holds no contents.
    pub fn fill_with(&mut self, len: usize, write: impl FnOnce(&mut [u8]) -> Result) -> Result {
        if len > self.0.data.len() {
            return Err(EMSGSIZE);
        }
        self.0.len = 0;
        write(&mut self.0.data[..len])?;
        self.0.len = len;
        Ok(())
    }

    /// The bytes that will be sent.
    pub fn data(&self) -> &[u8] {
        &self.0.data[..self.0.len]
    }

    /// Immediate data to send with the contents (SEND_WITH_IMM, host
    /// order; sent big-endian), or none (SEND).  Not every device takes it
    /// on every QP type: a device that does not fails the post (`EINVAL`).
    pub fn set_imm(&mut self, imm: Option<u32>) {
        self.0.imm = imm;
    }

    /// Makes the send inline (`IB_SEND_INLINE`), or not again: the driver
    /// copies the bytes into the work request when it is posted, instead of
    /// the device reading them from the buffer later, which saves small
    /// messages a DMA read.  The post refuses more bytes than the QP's
    /// [`QpCaps::max_inline_data`] (`EMSGSIZE`).  The buffer still comes
    /// back with the send's completion.
    ///
    /// [`QpCaps::max_inline_data`]: crate::rdma::QpCaps::max_inline_data
    pub fn set_inline(&mut self, inline: bool) {
        self.0.inline = inline;
    }

    /// Posts the send unsignaled (selective signaling), or signaled again:
    /// a successful unsignaled send makes no completion of its own, which
    /// saves the device a completion entry and the CPU an interrupt and a
    /// poll.  Its buffer comes back all the same, with success, through
    /// [`CompletionHandler::send_done`] just before the completion of the
    /// next signaled request on the QP's send queue (a signaled send, or
    /// a memory work request posted alone: the send queue completes in
    /// order), or
    /// when the QP shuts down.  A failed one completes on its own, like
    /// any request.  So that a send queue full of unsignaled sends still
    /// ends in a completion, the layer signals a send itself when it
    /// leaves fewer than two of the queue's credits free
    /// ([`QpCaps::max_send_wr`]; two, the room of
    /// [`Qp::register_then_send`]).  RC only:
    /// [`Qp::post_send_ud`] refuses it (`EINVAL`).
    ///
    /// [`CompletionHandler::send_done`]: crate::rdma::CompletionHandler::send_done
    /// [`QpCaps::max_send_wr`]: crate::rdma::QpCaps::max_send_wr
    /// [`Qp::register_then_send`]: crate::rdma::Qp::register_then_send
    /// [`Qp::post_send_ud`]: crate::rdma::Qp::post_send_ud
    pub fn set_unsignaled(&mut self, unsignaled: bool) {
        self.0.unsignaled = unsignaled;
    }

    /// Makes the send a SEND_WITH_INV that invalidates the peer's remote
    /// key `rkey` (remote invalidation: the peer's registration ends when
    /// the message arrives, saving it a LOCAL_INV), or a plain SEND again.
    /// RC QPs only, and not together with immediate data (`EOPNOTSUPP`,
    /// `EINVAL` from the post).
    pub fn set_invalidate(&mut self, rkey: Option<u32>) {
        self.0.invalidate = rkey;
    }

    /// How much one send can carry.
    pub fn capacity(&self) -> usize {
        self.0.data.len()
    }
}
