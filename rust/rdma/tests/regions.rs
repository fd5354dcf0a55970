// SPDX-License-Identifier: GPL-2.0

//! KUnit: Memory regions and page buffers.

use super::fixture::{nop_qp, owner, Nop};
use super::skip_without_devices;
use kernel::prelude::*;

#[kunit_tests(rdma_cm_rs_mr)]
mod mr_tests {
    use super::{nop_qp, owner, Nop};
    use crate::rdma::{
        addr::SocketAddr, bindings, cm::*, device::Transport, mr::*, net::NetNs, pd::Pd,
        sg::check_range, verbs::RwOp, QpType,
    };
    use kernel::prelude::*;

    /// A buffer of the caller's pages: the first `len` bytes of them (none
    /// and more than the pages hold refused), written and read across a
    /// page boundary, and the pages given back, all of them, with what was
    /// written: a buffer made again of them reads the same bytes.
    #[test]
    fn caller_pages_make_a_buffer_and_come_back() {
        use crate::rdma::sg::SgBuffer;
        use kernel::{alloc::flags::__GFP_ZERO, page::Page};
        let pages = || -> Result<KVec<Page>> {
            let mut pages = KVec::new();
            for _ in 0..4 {
                pages.push(Page::alloc_page(GFP_KERNEL | __GFP_ZERO)?, GFP_KERNEL)?;
            }
            Ok(pages)
        };
        let len = 2 * 4096 + 10;
        let none = SgBuffer::from_pages(pages().unwrap(), 0).err();
        let too_long = SgBuffer::from_pages(pages().unwrap(), 4 * 4096 + 1).err();
        let mut buf = SgBuffer::from_pages(pages().unwrap(), len).unwrap();
        let written = buf.write(4090, b"across pages");
        let past_end = buf.write(len - 1, b"ab").err();
        let mut read = [0u8; 12];
        let read_ok = buf.read(4090, &mut read);
        let entries = buf.entries();
        let back = buf.into_pages();
        let count = back.len();
        let again = SgBuffer::from_pages(back, len).unwrap();
        let mut reread = [0u8; 12];
        let reread_ok = again.read(4090, &mut reread);
        assert_eq!(none, Some(EINVAL));
        assert_eq!(too_long, Some(EINVAL));
        assert_eq!(written, Ok(()));
        assert_eq!(past_end, Some(EINVAL));
        assert_eq!(read_ok, Ok(()));
        assert_eq!(&read, b"across pages");
        assert!((1..=3).contains(&entries));
        assert_eq!(count, 4);
        assert_eq!(again.len(), len);
        assert_eq!(reread_ok, Ok(()));
        assert_eq!(&reread, b"across pages");
    }

    #[test]
    fn ranges_are_checked() {
        assert!(check_range(0, 1, 1).is_ok());
        assert!(check_range(0, 0, 1).is_err());
        assert!(check_range(1, 1, 1).is_err());
        assert!(check_range(4095, 1, 4096).is_ok());
        assert!(check_range(usize::MAX, 2, usize::MAX).is_err());
        assert!(check_range(0, MAX_MR_LEN, MAX_MR_LEN).is_ok());
    }

    #[test]
    fn remote_slices_stay_inside() {
        let r = RemoteRegion {
            addr: 0x1000,
            rkey: 7,
            len: 100,
        };
        let s = r.slice(10, 90).unwrap();
        assert_eq!((s.addr, s.rkey, s.len), (0x100a, 7, 90));
        assert!(r.slice(10, 91).is_err());
        assert!(r.slice(0, 0).is_err());
        assert!(r.slice(u64::MAX, 1).is_err());
        let top = RemoteRegion {
            addr: u64::MAX - 4,
            rkey: 1,
            len: 100,
        };
        assert!(top.slice(10, 1).is_err());
    }

    #[test]
    fn access_always_includes_local_write() {
        let local = bindings::ib_access_flags_IB_ACCESS_LOCAL_WRITE as i32;
        let read = bindings::ib_access_flags_IB_ACCESS_REMOTE_READ as i32;
        let write = bindings::ib_access_flags_IB_ACCESS_REMOTE_WRITE as i32;
        assert_eq!(MrAccess::LOCAL.to_raw(Transport::Ib), local);
        let rw = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let ro = MrAccess {
            remote_read: true,
            remote_write: false,
        };
        for transport in [Transport::Ib, Transport::Iwarp] {
            assert_eq!(rw.to_raw(transport), local | read | write);
            assert_eq!(ro.to_raw(transport), local | read);
        }
    }

    #[test]
    fn iwarp_read_sinks_allow_remote_write() {
        // The READ response is placed as a tagged write: a sink registered
        // for local use must take it on iWARP (siw checks only local write
        // there, hardware RNICs check this).
        let local = bindings::ib_access_flags_IB_ACCESS_LOCAL_WRITE as i32;
        let write = bindings::ib_access_flags_IB_ACCESS_REMOTE_WRITE as i32;
        assert_eq!(MrAccess::LOCAL.to_raw(Transport::Iwarp), local | write);
    }

    /// On a device (the test VMs put rxe at 192.0.2.1): region limits, CPU
    /// copies, and a registration refused by a QP that is not connected,
    /// which must leave the region unregistered.
    #[test]
    fn regions_on_a_device() {
        let owner = owner();
        let id = CmId::new(&owner, Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let addr = SocketAddr::V4 {
            ip: [192, 0, 2, 1],
            port: 0,
        };
        let made = id.with_lock(|l| {
            l.bind(&addr)?;
            nop_qp(l, 4)
        });
        let (pd, qp) = match made {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        let same_device = mr_device_is_pd_device(&pd);
        let refused_lens = (Mr::new(&pd, 0).err(), Mr::new(&pd, MAX_MR_LEN + 1).err());
        let remote = RemoteRegion {
            addr: 0,
            rkey: 0,
            len: 8,
        };
        let checked = Mr::new(&pd, 5000).map(|mr| {
            let mut zeroes = [0xffu8; 8];
            let read_zeroes = mr.read(4992, &mut zeroes);
            let written = mr.write(4990, b"0123456789");
            let mut back = [0u8; 8];
            let read_back = mr.read(4992, &mut back);
            let mut one = [0u8; 1];
            let beyond = (mr.write(4991, b"0123456789"), mr.read(5000, &mut one));
            let free = !mr.is_registered();
            // An unconnected QP refuses posts: the region stays free, and a
            // second try behaves the same (no state leaks from the first).
            let first = qp.register(&mr, MrAccess::LOCAL, 1).is_err();
            let still_free = !mr.is_registered();
            let second = qp.register(&mr, MrAccess::LOCAL, 2).is_err();
            let invalidate = qp.invalidate(&mr, 3);
            // Not registered: no RDMA through it.
            let rdma = (
                qp.rdma(RwOp::Read, &mr, 0, remote, 4),
                qp.rdma(RwOp::Write, &mr, 0, remote, 5),
            );
            (
                mr.len(),
                (read_zeroes, zeroes, written, read_back, back),
                beyond,
                (free, first, still_free, second, invalidate),
                rdma,
            )
        });
        let largest = Mr::new(&pd, MAX_MR_LEN).and_then(|mr| mr.write(MAX_MR_LEN - 1, b"x"));
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((qp, pd));
        drop(id);
        assert!(same_device);
        assert_eq!(refused_lens, (Some(EINVAL), Some(EINVAL)));
        let Ok((len, copies, beyond, states, rdma)) = checked else {
            assert!(checked.is_ok());
            return;
        };
        assert_eq!(len, 5000);
        assert_eq!(copies, (Ok(()), [0; 8], Ok(()), Ok(()), *b"23456789"));
        assert_eq!(beyond, (Err(EINVAL), Err(EINVAL)));
        assert_eq!(states, (true, true, true, true, Err(EINVAL)));
        assert_eq!(rdma, (Err(EINVAL), Err(EINVAL)));
        assert_eq!(largest, Ok(()));
    }

    fn mr_device_is_pd_device(pd: &kernel::sync::Arc<Pd>) -> bool {
        Mr::new(pd, 1).is_ok_and(|mr| mr.device().same(pd.device()))
    }
}
