// SPDX-License-Identifier: GPL-2.0

//! KUnit: multicast groups of UD ids: joins, their destinations, the QP's
//! attachment through a leave and a QP made anew, and the refusals.

use super::fixture::owner;
use super::{wait_until, Checks};
use kernel::prelude::*;

#[kunit_tests(rdma_cm_rs_multicast)]
mod multicast_tests {
    use super::{owner, wait_until, Checks};
    use crate::rdma::{
        addr::SocketAddr,
        ah::UdDest,
        cm::*,
        event::*,
        net::NetNs,
        pd::Pd,
        verbs::{CompletionHandler, Cq, Qp, QpCaps, RecvBuffer, SendBuffer},
        QpType,
    };
    use core::sync::atomic::{AtomicU32, Ordering};
    use kernel::{
        new_mutex,
        prelude::*,
        sync::{Arc, Mutex},
        time::Delta,
    };

    /// Datagrams a QP received.
    struct Count(Arc<AtomicU32>);

    impl CompletionHandler for Count {
        fn recv_done(&self, _buf: RecvBuffer, result: Result<usize>) {
            if result.is_ok() {
                self.0.fetch_add(1, Ordering::AcqRel);
            }
        }
        fn send_done(&self, _buf: SendBuffer, _result: Result) {}
    }

    /// What an id's handler saw: its group's destination, and the group
    /// its events named.
    #[derive(Default)]
    struct Seen {
        dest: Option<Result<UdDest>>,
        group: Option<SocketAddr>,
        joins: u32,
    }

    #[pin_data]
    struct Node {
        #[pin]
        seen: Mutex<Seen>,
        #[pin]
        pd: Mutex<Option<Arc<Pd>>>,
    }

    struct NodeRef(Arc<Node>);

    impl Handler for NodeRef {
        fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
            if !matches!(
                event.kind(),
                EventType::MulticastJoin | EventType::MulticastError
            ) {
                return;
            }
            let pd = self.0.pd.lock().clone();
            let mut seen = self.0.seen.lock();
            seen.group = id.multicast_group(event);
            seen.joins += 1;
            seen.dest = Some(match pd {
                Some(pd) => id.multicast_dest(event, &pd),
                None => Err(ENOTCONN),
            });
        }
    }

    const GROUP: SocketAddr = SocketAddr::V4 {
        ip: [239, 35, 9, 1],
        port: 0,
    };
    const LOCAL: SocketAddr = SocketAddr::V4 {
        ip: [192, 0, 2, 1],
        port: 0,
    };

    fn node() -> Arc<Node> {
        Arc::pin_init(
            pin_init!(Node {
                seen <- new_mutex!(Seen::default()),
                pd <- new_mutex!(None),
            }),
            GFP_KERNEL,
        )
        .unwrap()
    }

    /// A UD QP with 4 receives posted, counting what arrives.
    fn make_qp(id: &CmId<NodeRef>, got: &Arc<AtomicU32>) -> Result<Arc<Qp<Count>>> {
        id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(l.owner(), &dev)?;
            let caps = QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                ..QpCaps::default()
            };
            let cq = Cq::alloc(l.owner(), &dev, caps.cq_entries()?, Count(got.clone()))?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            for _ in 0..4 {
                qp.post_recv(RecvBuffer::new(&pd, 256)?)
                    .map_err(Error::from)?;
            }
            *id.handler().0.pd.lock() = Some(pd);
            Ok(qp)
        })
    }

    /// Joins and waits for the join's destination.
    fn join(c: &mut Checks, id: &CmId<NodeRef>, state: JoinState) -> Option<UdDest> {
        let n = &id.handler().0;
        let before = n.seen.lock().joins;
        if !c.eq(
            "join",
            id.with_lock(|l| l.join_multicast(&GROUP, state)),
            Ok(()),
        ) {
            return None;
        }
        c.check(
            "MULTICAST_JOIN within 5 s",
            wait_until(|| n.seen.lock().joins > before),
        );
        let mut seen = n.seen.lock();
        c.eq("the event's group", seen.group, Some(GROUP));
        match seen.dest.take() {
            Some(Ok(dest)) => {
                c.eq("the group's QP number", dest.qp_num(), 0x00ff_ffff);
                Some(dest)
            }
            other => {
                c.check("a destination for the group", other.is_none());
                c.eq("the destination", other.map(|d| d.err()), Some(None));
                None
            }
        }
    }

    /// Sends one datagram through `qp` to `dest`.
    fn send(qp: &Qp<Count>, dest: &UdDest) -> Result {
        let mut buf = SendBuffer::new(qp.pd(), 64)?;
        buf.fill(&[0x6d; 64])?;
        qp.post_send_ud(buf, dest).map_err(Error::from)
    }

    /// Whether `got` grows past `from` within `ms`.
    fn arrives(got: &AtomicU32, from: u32, ms: i64) -> bool {
        let until = kernel::time::Instant::<kernel::time::Monotonic>::now();
        while until.elapsed() < Delta::from_millis(ms) {
            if got.load(Ordering::Acquire) > from {
                return true;
            }
            kernel::time::delay::fsleep(Delta::from_millis(10));
        }
        false
    }

    /// A send-only member sends to a group a full member receives from;
    /// after a leave nothing arrives; a QP made anew after a join is
    /// attached to the group; the refusals.
    #[test]
    fn join_send_receive_leave() {
        let mut c = Checks::new();
        let owner = owner();
        let ns = NetNs::init();
        let make = || CmId::new(&owner, NodeRef(node()), &ns, PortSpace::Udp, QpType::Ud);
        let (sender, receiver) = (make().unwrap(), make().unwrap());
        // Before a bind: the CM's EINVAL.
        c.eq(
            "join unbound",
            receiver.with_lock(|l| l.join_multicast(&GROUP, JoinState::FullMember)),
            Err(EINVAL),
        );
        if let Err(e) = sender.with_lock(|l| l.bind(&LOCAL)) {
            super::super::skip_without_devices(e);
            return;
        }
        c.eq("bind", receiver.with_lock(|l| l.bind(&LOCAL)), Ok(()));
        let rc = CmId::new(&owner, NodeRef(node()), &ns, PortSpace::Tcp, QpType::Rc).unwrap();
        c.eq("bind an RC id", rc.with_lock(|l| l.bind(&LOCAL)), Ok(()));
        c.eq(
            "join on an RC id",
            rc.with_lock(|l| l.join_multicast(&GROUP, JoinState::FullMember)),
            Err(EINVAL),
        );
        c.eq("leave on an RC id", rc.leave_multicast(&GROUP), Err(EINVAL));
        drop(rc);
        let (sent_got, got) = (
            Arc::new(AtomicU32::new(0), GFP_KERNEL).unwrap(),
            Arc::new(AtomicU32::new(0), GFP_KERNEL).unwrap(),
        );
        let (Ok(sender_qp), Ok(receiver_qp)) =
            (make_qp(&sender, &sent_got), make_qp(&receiver, &got))
        else {
            c.check("two UD QPs", false);
            assert_eq!(c.failures(), 0);
            return;
        };
        let Some(dest) = join(&mut c, &sender, JoinState::SendOnlyFullMember) else {
            assert_eq!(c.failures(), 0);
            return;
        };
        join(&mut c, &receiver, JoinState::FullMember);
        c.eq(
            "a second join",
            receiver.with_lock(|l| l.join_multicast(&GROUP, JoinState::FullMember)),
            Err(EADDRINUSE),
        );
        c.eq(
            "a unicast address",
            receiver.with_lock(|l| l.join_multicast(&LOCAL, JoinState::FullMember)),
            Err(EINVAL),
        );
        // A leave waits for a callback that takes the handler mutex.
        c.eq(
            "leave inside with_lock",
            sender.with_lock(|_| Ok(receiver.leave_multicast(&GROUP))),
            Ok(Err(EDEADLK)),
        );
        let other = SocketAddr::V4 {
            ip: [239, 35, 9, 2],
            port: 0,
        };
        c.eq(
            "leave a group not joined",
            receiver.leave_multicast(&other),
            Err(ENOENT),
        );
        // The group's datagram reaches the full member (rxe: looped back
        // by the IP stack), not the send-only one.
        c.eq("send to the group", send(&sender_qp, &dest), Ok(()));
        c.check("the full member received it", arrives(&got, 0, 2000));
        c.eq("the send-only member", sent_got.load(Ordering::Acquire), 0);
        // Left: nothing more arrives.
        c.eq("leave", receiver.leave_multicast(&GROUP), Ok(()));
        let had = got.load(Ordering::Acquire);
        c.eq("send after the leave", send(&sender_qp, &dest), Ok(()));
        c.check("nothing after the leave", !arrives(&got, had, 500));
        // Joined again, then a new QP: attached to the group before.
        join(&mut c, &receiver, JoinState::FullMember);
        drop(receiver_qp);
        c.eq(
            "destroy the QP",
            receiver.with_lock(|l| l.destroy_qp()),
            Ok(()),
        );
        let got2 = Arc::new(AtomicU32::new(0), GFP_KERNEL).unwrap();
        c.check("a new QP", make_qp(&receiver, &got2).is_ok());
        c.eq("send to the new QP", send(&sender_qp, &dest), Ok(()));
        c.check("the new QP received it", arrives(&got2, 0, 2000));
        // Dropped with their groups joined: the QPs' shutdowns detach them,
        // the CM leaves the groups.
        drop(sender_qp);
        drop((sender, receiver));
        assert_eq!(c.failures(), 0);
    }
}
