// SPDX-License-Identifier: GPL-2.0

//! Memory of whole pages, described by a scatterlist: what the generic
//! RDMA READ/WRITE API ([`super::verbs::Qp::rdma_rw`]) moves data from and
//! to, of any size and without one physically contiguous allocation, as a
//! storage target's I/O buffers are.
//!
//! An [`SgBuffer`] is not bound to a device: the R/W API maps it for the
//! QP's device when a transfer is posted and unmaps it at the transfer's
//! completion, while the QP owns it.  The consumer reads and writes it only
//! while it owns it, so the CPU never touches pages the device may be
//! reaching.

use super::bindings;
use core::ptr::NonNull;
use kernel::{
    page::{Page, PAGE_SIZE},
    prelude::*,
};

/// Checks that `len` bytes at `offset` lie within memory of `size` bytes
/// (and that `len` is not 0).
pub(crate) fn check_range(offset: usize, len: usize, size: usize) -> Result {
    match offset.checked_add(len) {
        Some(end) if len > 0 && end <= size => Ok(()),
        _ => Err(EINVAL),
    }
}

/// `len` bytes at `offset` of consecutive pages, page by page: the page's
/// index, the offset in it, the bytes there, and the bytes before them.
fn pieces(offset: usize, len: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
    let mut done = 0;
    core::iter::from_fn(move || {
        if done >= len {
            return None;
        }
        let at = offset + done;
        let in_page = at % PAGE_SIZE;
        let n = (PAGE_SIZE - in_page).min(len - done);
        let piece = (at / PAGE_SIZE, in_page, n, done);
        done += n;
        Some(piece)
    })
}

/// A new table over the first `len` bytes of `pages` (`EINVAL` for 0 or
/// more than they hold), which must outlive it.
fn table_over(pages: &[Page], len: usize) -> Result<NonNull<bindings::sg_table>> {
    if len == 0 || len > pages.len().saturating_mul(PAGE_SIZE) {
        return Err(EINVAL);
    }
    let count = len.div_ceil(PAGE_SIZE);
    let n = u32::try_from(count).map_err(|_| EINVAL)?;
    let mut raw = KVec::with_capacity(count, GFP_KERNEL)?;
    for page in &pages[..count] {
        raw.push(page.as_ptr(), GFP_KERNEL)?;
    }
    // SAFETY: `raw` holds `n` live pages (the caller keeps them with the
    // table); `len` fits in them; the function copies the array.
    let table = unsafe { bindings::rdma_cm_rs_sg_table_from_pages(raw.as_mut_ptr(), n, len) };
    NonNull::new(kernel::error::from_err_ptr(table)?).ok_or(ENOMEM)
}

/// Bytes of whole pages and the scatterlist describing them.
///
/// # Invariants
///
/// `table` is a kmalloc'ed `sg_table` from `sg_alloc_table_from_pages`
/// over the first `len` bytes of `pages` (in order; physically adjacent
/// pages may share an entry), owned by the object; `len` is at least 1 and
/// at most `pages.len() * PAGE_SIZE`.  While the consumer can reach the
/// object, no device can reach the pages: the layer maps them only while
/// it owns the buffer, and hands it back only once no registration a peer
/// knows covers them and no placement through one can still be copying
/// (see [`super::verbs::RwDone`] and
/// `super::device::Device::places_after_deregistration`).
pub struct SgBuffer {
    pages: KVec<Page>,
    len: usize,
    table: NonNull<bindings::sg_table>,
}

// SAFETY: The pages and the table are owned; shared references only read
// the bytes (the table's entries are written through `sgl` only by the
// layer's mapping, while it owns the buffer).
unsafe impl Send for SgBuffer {}
// SAFETY: As above.
unsafe impl Sync for SgBuffer {}

impl SgBuffer {
    /// `len` bytes of zeroed pages allocated for the purpose (`EINVAL` for
    /// 0).
    pub fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(EINVAL);
        }
        let count = len.div_ceil(PAGE_SIZE);
        let mut pages = KVec::with_capacity(count, GFP_KERNEL)?;
        for _ in 0..count {
            // `alloc_page` does not zero; the buffer's bytes must not be
            // another user's leftovers (a WRITE sends them).
            let page = Page::alloc_page(GFP_KERNEL | __GFP_ZERO)?;
            pages.push(page, GFP_KERNEL)?;
        }
        Self::from_pages(pages, len)
    }

    /// The caller's `pages`, of which the first `len` bytes are the buffer
    /// (`EINVAL` for 0 or more than the pages hold).  The pages are the
    /// buffer's until [`Self::into_pages`].
    pub fn from_pages(pages: KVec<Page>, len: usize) -> Result<Self> {
        let table = table_over(&pages, len)?;
        // INVARIANT: Built just above over the first `len` bytes.
        Ok(Self { pages, len, table })
    }

    /// Makes the buffer the first `len` bytes of its pages (`EINVAL` for 0
    /// or more than they hold), so that one allocation serves transfers of
    /// any length up to its pages': the R/W API moves exactly
    /// [`Self::len`] bytes.  The bytes keep their values; those past the
    /// old length are what the pages held.  On an error the buffer is
    /// unchanged.
    pub fn set_len(&mut self, len: usize) -> Result {
        if len == self.len {
            return Ok(());
        }
        let table = table_over(&self.pages, len)?;
        // SAFETY: The old table is owned and not mapped (type invariants:
        // `&mut self`); it is freed once, here, and replaced at once.
        unsafe { bindings::rdma_cm_rs_sg_table_free(self.table.as_ptr()) };
        // INVARIANT: The new table covers the first `len` bytes of `pages`.
        self.table = table;
        self.len = len;
        Ok(())
    }

    /// Gives the pages back (all of them, the ones past `len` included).
    pub fn into_pages(self) -> KVec<Page> {
        let mut this = core::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; the table is freed
        // once, here.
        unsafe { bindings::rdma_cm_rs_sg_table_free(this.table.as_ptr()) };
        core::mem::take(&mut this.pages)
    }

    /// The buffer's size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes its pages hold: the most [`Self::set_len`] takes.
    pub fn capacity(&self) -> usize {
        self.pages.len() * PAGE_SIZE
    }

    /// The entries of the buffer's scatterlist: one for each run of
    /// physically adjacent pages.  A send or receive with the buffer
    /// attached takes one gather or scatter entry for each.
    pub fn entries(&self) -> u32 {
        self.sgl().1
    }

    /// Never: a buffer has at least one byte.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copies `data` in at `offset` (`EINVAL` beyond the end).
    pub fn write(&mut self, offset: usize, data: &[u8]) -> Result {
        check_range(offset, data.len(), self.len)?;
        for (page, in_page, n, done) in pieces(offset, data.len()) {
            // SAFETY: `data[done..done + n]` is readable; `&mut self`
            // excludes every other access to the page, which no device can
            // reach either (type invariants).
            unsafe { self.pages[page].write_raw(data[done..].as_ptr(), in_page, n)? };
        }
        Ok(())
    }

    /// Copies `out.len()` bytes out from `offset` (`EINVAL` beyond the
    /// end).
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result {
        check_range(offset, out.len(), self.len)?;
        for (page, in_page, n, done) in pieces(offset, out.len()) {
            // SAFETY: `out[done..done + n]` is writable; nothing writes the
            // page meanwhile: writers need `&mut self`, and no device can
            // reach it (type invariants).
            unsafe { self.pages[page].read_raw(out[done..].as_mut_ptr(), in_page, n)? };
        }
        Ok(())
    }

    /// Copies `len` bytes of `src` from `src_offset` in at `offset`, page
    /// to page, with no bounce buffer (`EINVAL` beyond either end).
    pub fn copy_from(
        &mut self,
        offset: usize,
        src: &SgBuffer,
        src_offset: usize,
        len: usize,
    ) -> Result {
        check_range(offset, len, self.len)?;
        check_range(src_offset, len, src.len)?;
        let mut done = 0;
        while done < len {
            let (to, from) = (offset + done, src_offset + done);
            let n = (PAGE_SIZE - to % PAGE_SIZE)
                .min(PAGE_SIZE - from % PAGE_SIZE)
                .min(len - done);
            // SAFETY: `memcpy_page` maps both (owned, live) pages; `n` ends
            // at either page's end; `&mut self` excludes other access to the
            // destination, the source is only read (writers need `&mut`),
            // and no device reaches either (type invariants).
            unsafe {
                bindings::memcpy_page(
                    self.pages[to / PAGE_SIZE].as_ptr(),
                    to % PAGE_SIZE,
                    src.pages[from / PAGE_SIZE].as_ptr(),
                    from % PAGE_SIZE,
                    n,
                )
            };
            done += n;
        }
        Ok(())
    }

    /// Zeroes `len` bytes at `offset` (`EINVAL` beyond the end).
    pub fn zero(&mut self, offset: usize, len: usize) -> Result {
        check_range(offset, len, self.len)?;
        for (page, in_page, n, _) in pieces(offset, len) {
            // SAFETY: The range lies within the page; `&mut self` excludes
            // every other access to it, and no device can reach it (type
            // invariants).
            unsafe { self.pages[page].fill_zero_raw(in_page, n)? };
        }
        Ok(())
    }

    /// The scatterlist and its entry count, for the R/W API to map.
    pub(crate) fn sgl(&self) -> (*mut bindings::scatterlist, u32) {
        // SAFETY: The table is live (type invariants); only read.
        let table = unsafe { self.table.as_ref() };
        (table.sgl, table.orig_nents)
    }
}

impl Drop for SgBuffer {
    fn drop(&mut self) {
        // SAFETY: Owned and not mapped (type invariants); freed once, here.
        unsafe { bindings::rdma_cm_rs_sg_table_free(self.table.as_ptr()) };
    }
}
