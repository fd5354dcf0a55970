// SPDX-License-Identifier: GPL-2.0

//! KUnit: shared receive queues feeding several connections.

use super::fixture::*;
use super::{take_out, wait_until};
use crate::rdma::{
    cm::*,
    net::NetNs,
    pd::Pd,
    verbs::{Cq, PollContext, QpCaps, RecvBuffer, Srq, SrqEvent, SrqEvents},
};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::{prelude::*, sync::Arc};

#[kunit_tests(rdma_cm_rs_srq)]
mod srq_tests {
    use super::*;

    /// A shared receive queue feeds the QPs of two connections, which share
    /// one receive CQ: each message takes the SRQ's next buffer and names
    /// the QP it arrived on.  The SRQ takes no more than its depth
    /// (`ENOSPC`) and only buffers of its PD; a QP on it has no receives of
    /// its own (`EINVAL` at its creation, `EOPNOTSUPP` at a post) and is of
    /// the SRQ's PD.  The CQ carries the SRQ's room once for both QPs, and
    /// gets it back after the last; the QPs' teardown leaves the SRQ's
    /// buffers posted, and its drop frees them (kmemleak would see them).
    #[test]
    fn srq_feeds_every_connection_and_outlives_them() {
        srq_feeds_two_connections(RXE_IP, 7197);
    }

    /// The same on siw (iWARP), where the passive side may send only once
    /// the active side's first message arrived: a message taken from the
    /// SRQ releases the hold of the QP it arrived on, and of no other.
    #[test]
    fn srq_on_iwarp_releases_each_qps_first_message_hold() {
        srq_feeds_two_connections(SIW_IP, 7198);
    }

    /// Counts an SRQ's limit events (atomic context: a counter).
    struct LimitCount(AtomicU32);

    impl SrqEvents for LimitCount {
        fn srq_event(&self, event: SrqEvent) {
            if event == SrqEvent::LimitReached {
                self.0.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    fn srq_feeds_two_connections(ip: [u8; 4], port: u16) {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&owner, &ns, ip, port) else {
            return;
        };
        let iwarp = ip == SIW_IP;
        let dev = listener.with_lock(|l| l.device()).unwrap();
        let pd = Pd::alloc(&owner, &dev).unwrap();
        let other_pd = Pd::alloc(&owner, &dev).unwrap();
        let too_deep = Srq::<Recording>::new(&pd, dev.caps().max_srq_wr + 1).err();
        let empty = Srq::<Recording>::new(&pd, 0).err();
        const DEPTH: u32 = 4;
        let limits = Arc::new(LimitCount(AtomicU32::new(0)), GFP_KERNEL).unwrap();
        let srq = Srq::<Recording>::with_events(&pd, DEPTH, limits.clone()).unwrap();
        let mut posted = 0;
        for _ in 0..DEPTH {
            posted += u32::from(srq.post_recv(RecvBuffer::new(&pd, 64).unwrap()).is_ok());
        }
        let beyond_depth = srq.post_recv(RecvBuffer::new(&pd, 64).unwrap());
        let beyond_depth = beyond_depth.err().map(Error::from);
        let foreign = srq.post_recv(RecvBuffer::new(&other_pd, 64).unwrap());
        let foreign = foreign.err().map(Error::from);
        // An event once fewer than 3 are posted: at the second message.
        let limit_refused = (srq.arm_limit(0).err(), srq.arm_limit(DEPTH + 1).err());
        let armed = srq.arm_limit(DEPTH - 1);

        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let caps = on_srq_caps();
        let per_qp = caps.send_cq_entries().unwrap();
        let entries = DEPTH + 2 * per_qp;
        let cq = Cq::alloc(&owner, &dev, entries, Recording(server_seen.clone())).unwrap();

        // Refused on an id with a device and no QP yet.
        let probe = sync_client(&world, &ns).unwrap();
        let probe_resolved = probe
            .resolve_addr_sync(None, &addr, ms(2000), Some(ms(5000)))
            .is_ok();
        let own_recvs = QpCaps {
            max_recv_wr: 1,
            ..caps
        };
        let with_own_recvs = probe
            .with_lock(|l| {
                l.create_qp_on_srq(&pd, &cq, &cq, &srq, own_recvs)
                    .map(|_| ())
            })
            .err();
        let of_other_pd = probe
            .with_lock(|l| {
                l.create_qp_on_srq(&other_pd, &cq, &cq, &srq, caps)
                    .map(|_| ())
            })
            .err();
        drop(probe);
        let untouched = cq.free_entries();

        let on_srq = || {
            let (pd, cq, srq) = (pd.clone(), cq.clone(), srq.clone());
            move |server: &CmId<Node>| {
                server.with_lock(|l| l.create_qp_on_srq(&pd, &cq, &cq, &srq, caps))
            }
        };
        let first = connect_client(&world, &ns, &addr, PollContext::Workqueue, on_srq());
        let after_first = cq.free_entries();
        let second = connect_client(&world, &ns, &addr, PollContext::Workqueue, on_srq());
        let after_second = cq.free_entries();
        let (first, second) = match (first, second) {
            (Ok(first), Ok(second)) => (first, second),
            (first, second) => {
                let failed = (first.err(), second.err());
                // Nothing of the device held past here (see
                // `qps_reserve_room_for_the_drain`).
                drop((srq, cq, listener, world, pd, other_pd, dev));
                assert_eq!(failed, (None, None));
                return;
            }
        };
        let (first_qp, second_qp) = (first.4.qp_num(), second.4.qp_num());

        let own_post = first.4.post_recv(RecvBuffer::new(&pd, 64).unwrap());
        let own_post = own_post.err().map(Error::from);
        let held_before = first.4.awaits_first_message();
        let sent_first = post_marked(&first.1 .0, 1, false);
        let got_first = wait_until(|| server_seen.received.load(Ordering::Acquire) == 1);
        let limit_after_first = limits.0.load(Ordering::Acquire);
        let first_from = server_seen.last_qp_num.load(Ordering::Acquire);
        let first_held_after = first.4.awaits_first_message();
        let second_held_meanwhile = second.4.awaits_first_message();
        let answered = post_marked(&first.4, 3, false);
        let first_digest = server_seen.last_digest.load(Ordering::Acquire);
        let sent_second = post_marked(&second.1 .0, 2, false);
        let got_second = wait_until(|| server_seen.received.load(Ordering::Acquire) == 2);
        let second_from = server_seen.last_qp_num.load(Ordering::Acquire);
        let left_posted = srq.posted();
        let limit_reached = wait_until(|| limits.0.load(Ordering::Acquire) == 1);

        drop(first);
        let after_first_gone = cq.free_entries();
        drop(second);
        let after_both_gone = cq.free_entries();
        let still_posted = srq.posted();
        let flushed = server_seen.recvs_flushed.load(Ordering::Acquire);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((srq, cq, listener, pd, other_pd, dev));
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);

        assert_eq!(too_deep, Some(EINVAL));
        assert_eq!(empty, Some(EINVAL));
        assert!(probe_resolved);
        assert_eq!(posted, DEPTH);
        assert_eq!(beyond_depth, Some(ENOSPC));
        assert_eq!(foreign, Some(EINVAL));
        assert_eq!(with_own_recvs, Some(EINVAL));
        assert_eq!(of_other_pd, Some(EINVAL));
        assert_eq!(untouched, entries);
        assert_eq!(after_first, entries - DEPTH - per_qp);
        assert_eq!(after_second, entries - DEPTH - 2 * per_qp);
        assert_eq!(own_post, Some(EOPNOTSUPP));
        assert_eq!(held_before, iwarp);
        assert!(!first_held_after);
        assert_eq!(second_held_meanwhile, iwarp);
        assert!(answered);
        assert!(sent_first && got_first && sent_second && got_second);
        assert_ne!(first_qp, second_qp);
        assert_eq!(first_from, first_qp);
        assert_eq!(first_digest, digest(&[1; 16]));
        assert_eq!(second_from, second_qp);
        assert_eq!(left_posted, DEPTH - 2);
        assert_eq!(limit_refused, (Some(EINVAL), Some(EINVAL)));
        assert_eq!(armed, Ok(()));
        assert_eq!(limit_after_first, 0);
        assert!(limit_reached);
        assert_eq!(after_first_gone, entries - DEPTH - per_qp);
        assert_eq!(after_both_gone, entries);
        assert_eq!(still_posted, DEPTH - 2);
        assert_eq!(flushed, 0);
    }
}
