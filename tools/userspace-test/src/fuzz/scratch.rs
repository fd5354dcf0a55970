// SPDX-License-Identifier: GPL-2.0

//! Memory the hostile pointers point at.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// Memory the hostile pointers point at.

pub(super) struct Scratch {
    /// Two pages: read-write, then PROT_NONE.
    guard: usize,
    page: usize,
    /// The argument structure (16 KiB + slack, so a wrong size stays inside).
    pub(super) arg: Vec<u64>,
    /// Data buffers of SEND/RECV/MR_WRITE/MR_READ/UD_RECV (2 MiB, larger
    /// than any region, so a read the kernel bounds by the region stays
    /// inside).
    pub(super) data: Vec<u8>,
    /// What every UD_SEND of every thread sends from: [`ud_byte`], never
    /// written, so a datagram UD_RECV returns must be a prefix of it.
    pub(super) ud_tx: Vec<u8>,
}

pub(super) const DATA_LEN: usize = 2 << 20;

/// Byte `i` of every datagram the fuzzer sends.
pub(super) fn ud_byte(i: usize) -> u8 {
    (i * 11 + 5) as u8
}

impl Scratch {
    pub(super) fn new() -> Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        // SAFETY: an anonymous private mapping, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                2 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        // SAFETY: the second page of the mapping made above.
        if unsafe { libc::mprotect(p.cast::<u8>().add(page).cast(), page, libc::PROT_NONE) } != 0 {
            bail!("mprotect: {}", std::io::Error::last_os_error());
        }
        let mut data = vec![0u8; DATA_LEN];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 7 + 3) as u8;
        }
        Ok(Self {
            guard: p as usize,
            page,
            arg: vec![0; 2304],
            data,
            ud_tx: (0..2 * RDMA_CM_RS_MAX_MESSAGE as usize)
                .map(ud_byte)
                .collect(),
        })
    }

    pub(super) fn prot_none(&self) -> u64 {
        (self.guard + self.page) as u64
    }

    pub(super) fn bad(&self, p: Ptr) -> u64 {
        match p {
            Ptr::Ok => self.data.as_ptr() as u64,
            Ptr::Null => 0,
            Ptr::ProtNone => self.prot_none(),
            Ptr::Straddle => self.prot_none() - 4,
            Ptr::Wild => 0xdead_0000_0000_0000,
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.guard as *mut libc::c_void, 2 * self.page) };
    }
}
