// SPDX-License-Identifier: GPL-2.0

//! The RAM-backed namespace: 512-byte blocks in chunks of pages, each
//! chunk locked on its own, copied to and from the transfers' buffers page
//! to page.

use super::rdma::SgBuffer;
use super::wire::LBA_SHIFT;
use kernel::{new_mutex, prelude::*, sync::Mutex};

/// Bytes of one chunk.
const CHUNK: usize = 1 << 20;

/// A namespace of RAM.
pub(crate) struct Namespace {
    chunks: KVec<Pin<KBox<Mutex<SgBuffer>>>>,
    size: u64,
    pub(crate) nguid: [u8; 16],
    pub(crate) eui64: [u8; 8],
    pub(crate) uuid: [u8; 16],
}

impl Namespace {
    /// `size` bytes (a multiple of [`CHUNK`], at least one), zeroed, with
    /// identifiers derived from `seed` (distinct per subsystem).
    pub(crate) fn new(size: u64, seed: &[u8]) -> Result<Self> {
        let count = usize::try_from(size).map_err(|_| EINVAL)? / CHUNK;
        if count == 0 || size % CHUNK as u64 != 0 {
            return Err(EINVAL);
        }
        let mut chunks = KVec::with_capacity(count, GFP_KERNEL)?;
        for _ in 0..count {
            chunks.push(
                KBox::pin_init(new_mutex!(SgBuffer::new(CHUNK)?), GFP_KERNEL)?,
                GFP_KERNEL,
            )?;
        }
        // FNV-1a over the seed, spread over the identifiers: stable for a
        // given NQN, distinct between NQNs (the host refuses a namespace
        // whose identifiers another subsystem's namespace has).
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        let mut next = || {
            for &b in seed {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
            hash = (hash ^ 0x5a).wrapping_mul(0x0100_0000_01b3);
            hash.to_le_bytes()
        };
        let (a, b, c, d) = (next(), next(), next(), next());
        let mut nguid = [0u8; 16];
        nguid[..8].copy_from_slice(&a);
        nguid[8..].copy_from_slice(&b);
        let mut uuid = [0u8; 16];
        uuid[..8].copy_from_slice(&c);
        uuid[8..].copy_from_slice(&d);
        // A version 4 (random) UUID's variant and version bits.
        uuid[6] = (uuid[6] & 0x0f) | 0x40;
        uuid[8] = (uuid[8] & 0x3f) | 0x80;
        Ok(Self {
            chunks,
            size,
            nguid,
            eui64: a,
            uuid,
        })
    }

    /// Size in bytes.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Size in blocks.
    pub(crate) fn blocks(&self) -> u64 {
        self.size >> LBA_SHIFT
    }

    /// Whether `nlb` blocks at `slba` lie inside.
    pub(crate) fn contains(&self, slba: u64, nlb: u64) -> bool {
        slba.checked_add(nlb)
            .is_some_and(|end| end <= self.blocks())
    }

    /// Runs `f` on each chunk piece of `len` bytes at block `slba`, with
    /// the chunk locked: `f(chunk, offset in it, bytes, bytes before)`.
    fn pieces(
        &self,
        slba: u64,
        len: usize,
        mut f: impl FnMut(&mut SgBuffer, usize, usize, usize) -> Result,
    ) -> Result {
        let mut at = slba
            .checked_mul(1 << LBA_SHIFT)
            .and_then(|at| usize::try_from(at).ok())
            .ok_or(EINVAL)?;
        let mut done = 0;
        while done < len {
            let chunk = self.chunks.get(at / CHUNK).ok_or(EINVAL)?;
            let off = at % CHUNK;
            let n = (CHUNK - off).min(len - done);
            f(&mut chunk.lock(), off, n, done)?;
            done += n;
            at += n;
        }
        Ok(())
    }

    /// Copies `len` bytes at block `slba` out into `buf`, from its start.
    pub(crate) fn read_into(&self, slba: u64, buf: &mut SgBuffer, len: usize) -> Result {
        self.pieces(slba, len, |chunk, off, n, done| {
            buf.copy_from(done, chunk, off, n)
        })
    }

    /// Copies `len` bytes of `src` (a receive's in-capsule data) from
    /// `src_off` into the namespace at block `slba`.
    pub(crate) fn write_from(
        &self,
        slba: u64,
        src: &SgBuffer,
        src_off: usize,
        len: usize,
    ) -> Result {
        self.pieces(slba, len, |chunk, off, n, done| {
            chunk.copy_from(off, src, src_off + done, n)
        })
    }

    /// Zeroes `nlb` blocks at `slba`.
    pub(crate) fn zero(&self, slba: u64, nlb: u64) -> Result {
        let len = usize::try_from(nlb << LBA_SHIFT).map_err(|_| EINVAL)?;
        self.pieces(slba, len, |chunk, off, n, _| chunk.zero(off, n))
    }
}
