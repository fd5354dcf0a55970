// SPDX-License-Identifier: GPL-2.0

//! KUnit: how CQs are processed: `Direct` polling, busy polling, a busy-polled
//! CQ pool, a teardown's poll, and sleeping on a `Notified` CQ.

use super::fixture::*;
use super::wait_until;
use crate::rdma::{
    cq_pool::CqPool,
    net::NetNs,
    pd::Pd,
    poller::BusyPoller,
    verbs::{Cq, PollContext, RecvBuffer},
};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::{
    prelude::*,
    sync::Arc,
    time::{delay::fsleep, msecs_to_jiffies, Delta, Instant, Monotonic},
    workqueue,
};

#[kunit_tests(rdma_cm_rs_cq)]
mod cq_tests {
    use super::*;

    /// A `Direct` CQ runs its handler only when polled, in the poller's
    /// task: a message that arrived stays in the CQ until `poll`, which
    /// reports it; a send's completion comes back the same way, through
    /// `poll_once`.  Both refuse an empty budget (and a CQ polled from a
    /// workqueue, see `cq_on_the_last_vector_polled_unbound`).
    #[test]
    fn direct_cq_runs_handlers_only_when_polled() {
        let owner = owner();
        let Some(pair) = connected_pair_polled(&owner, &NetNs::init(), 7194, PollContext::Direct)
        else {
            return;
        };
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let sent = post_marked(&pair.server_qp, 5, false);
        // Acknowledged: the message sits in the client's CQ.
        let acked = wait_until(|| server.sends_back.load(Ordering::Acquire) == 1);
        fsleep(Delta::from_millis(100));
        let before_poll = client.received.load(Ordering::Acquire);
        let polled = pair.client_cq.poll(16);
        let after_poll = client.received.load(Ordering::Acquire);
        let digest_ok = client.last_digest.load(Ordering::Acquire) == digest(&[5; 16]);
        let answered = post_marked(&pair.client_qp, 6, false);
        let answer_back = wait_until(|| {
            let _ = pair.client_cq.poll_once(16);
            client.sends_back.load(Ordering::Acquire) == 1
        });
        let server_got = wait_until(|| server.received.load(Ordering::Acquire) == 1);
        let zero_budget = pair.client_cq.poll(0).err();
        let zero_budget_once = pair.client_cq.poll_once(0).err();
        drop(pair);
        assert!(sent && acked && answered);
        assert_eq!(before_poll, 0);
        assert_eq!(polled, Ok(1));
        assert_eq!(after_poll, 1);
        assert!(digest_ok);
        assert!(answer_back && server_got);
        assert_eq!(client.send_log.load(Ordering::Acquire), 6);
        assert_eq!(zero_budget, Some(EINVAL));
        assert_eq!(zero_budget_once, Some(EINVAL));
    }

    /// A `BusyPoller` loop delivers a `Direct` CQ's completions with nobody
    /// calling `poll`, and stops when its `PollLoop` goes: a message that
    /// arrives after that waits in the CQ for a poll.  A CQ a workqueue
    /// polls gets no loop.  Dropping the poller with a loop running waits
    /// for the loop.
    #[test]
    fn busy_poller_loops_until_stopped() {
        let owner = owner();
        let Some(pair) = connected_pair_polled(&owner, &NetNs::init(), 7196, PollContext::Direct)
        else {
            return;
        };
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let poller = BusyPoller::new(&owner).unwrap();
        let polling = poller.start(&pair.client_cq);
        let first = post_marked(&pair.server_qp, 1, false);
        let looped = wait_until(|| client.received.load(Ordering::Acquire) == 1);
        drop(polling);
        // The loop sees its stop flag within one poll.
        fsleep(Delta::from_millis(50));
        let second = post_marked(&pair.server_qp, 2, false);
        let acked = wait_until(|| server.sends_back.load(Ordering::Acquire) == 2);
        fsleep(Delta::from_millis(100));
        let after_stop = client.received.load(Ordering::Acquire);
        let polled = pair.client_cq.poll(16);
        // A second loop, still running when the poller goes.
        let again = poller.start(&pair.client_cq);
        let third = post_marked(&pair.server_qp, 3, false);
        let looped_again = wait_until(|| client.received.load(Ordering::Acquire) == 3);
        drop(poller);
        drop(again);
        drop(pair);
        assert!(first && second && third && acked);
        assert!(looped);
        assert_eq!(after_stop, 1);
        assert_eq!(polled, Ok(1));
        assert!(looped_again);
    }

    /// A busy-polled CQ pool's CQs are polled by a loop each from their
    /// creation: the server's QP, placed through the pool, gets the
    /// client's messages with nobody calling `poll`, and its CQ is
    /// `Direct`.  Once the pool is gone its loop ends: a message that
    /// arrives after that waits in the CQ (the QP's teardown then polls it
    /// for the flush).  A busy-polled pool of no entries is refused.
    #[test]
    fn busy_polled_cq_pool_delivers_without_a_poll() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&owner, &ns, RXE_IP, 7212) else {
            return;
        };
        // Bound to the device's address: it has the device.
        let dev = listener.with_lock(|l| l.device()).unwrap();
        let poller = Arc::new(BusyPoller::new(&owner).unwrap(), GFP_KERNEL).unwrap();
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let entries = RECORDING_CAPS.cq_entries().unwrap();
        let handler = Recording(server_seen.clone());
        let refused = CqPool::busy_polled(&owner, &dev, 0, &poller, handler.clone()).err();
        let pool = CqPool::busy_polled(&owner, &dev, entries, &poller, handler).unwrap();
        drop(dev);
        let server_pool = pool.clone();
        let connected = connect_client(&world, &ns, &addr, PollContext::Workqueue, move |server| {
            server.with_lock(|l| {
                let dev = l.device()?;
                let pd = Pd::alloc(l.owner(), &dev)?;
                let (qp, poll) = server_pool.with_cq(entries, None, |_, cq| {
                    Ok((l.create_qp(&pd, cq, RECORDING_CAPS)?, cq.poll_context()))
                })?;
                if poll != PollContext::Direct {
                    return Err(EINVAL);
                }
                for _ in 0..RECORDING_CAPS.max_recv_wr {
                    qp.post_recv(RecvBuffer::new(&pd, 64)?)
                        .map_err(Error::from)?;
                }
                Ok(qp)
            })
        });
        let (client, (client_qp, _client_cq), client_seen, server, server_qp) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                drop((pool, poller));
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let first = post_marked(&client_qp, 1, false) && post_marked(&client_qp, 2, false);
        let looped = wait_until(|| server_seen.received.load(Ordering::Acquire) == 2);
        let cqs = pool.len();
        drop(pool);
        // The loop sees its stop flag within one poll.
        fsleep(Delta::from_millis(50));
        let third = post_marked(&client_qp, 3, false);
        let acked = wait_until(|| client_seen.sends_back.load(Ordering::Acquire) == 3);
        fsleep(Delta::from_millis(100));
        let after_pool = server_seen.received.load(Ordering::Acquire);
        drop((
            client, client_qp, server, server_qp, listener, world, poller,
        ));
        assert_eq!(refused, Some(EINVAL));
        assert!(first && third && acked);
        assert!(looped);
        assert_eq!(cqs, 1);
        assert_eq!(after_pool, 2);
    }

    /// The teardown of a QP on a `Direct` CQ nobody polls polls it itself:
    /// the four receives come back flushed and an unsignaled send that
    /// arrived comes back with success behind the shutdown's marker, well
    /// inside the flush's limit (waiting it out and reclaiming would take
    /// `FLUSH_TIMEOUT`).
    #[test]
    fn direct_cq_teardown_polls_for_the_flush() {
        let Some(client) = unsignaled_send_then_teardown(7195, PollContext::Direct, 9) else {
            return;
        };
        assert_eq!(client.recvs_flushed.load(Ordering::Acquire), 4);
        assert_eq!(client.send_log.load(Ordering::Acquire), 9);
    }

    /// A `Notified` CQ runs its handler only when polled, like a `Direct`
    /// one, and its owner can sleep until there is something to poll:
    /// nothing comes, and the wait times out after its time; a message
    /// posted while the owner sleeps wakes it (the device's notification),
    /// well before its time, and the poll that follows reports it; news
    /// since the mark (a poll that ended after it) ends a wait at once.
    /// Other CQs refuse the wait.
    #[test]
    fn notified_cq_wakes_its_sleeping_owner() {
        let owner = owner();
        let Some(pair) = connected_pair_polled(&owner, &NetNs::init(), 7213, PollContext::Notified)
        else {
            return;
        };
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let cq = &pair.client_cq;
        // Nothing to poll: the wait takes its time.
        let empty = cq.poll(16);
        let mark = cq.mark();
        let start = Instant::<Monotonic>::now();
        let quiet = cq.wait_since(mark, msecs_to_jiffies(100)).err();
        let quiet_ms = start.elapsed().as_millis();
        // A message posted 200 ms into a wait of 5 s.
        let posted = Arc::new(AtomicBool::new(false), GFP_KERNEL).unwrap();
        let (server_qp, posted_flag) = (pair.server_qp.clone(), posted.clone());
        let spawned = workqueue::system().try_spawn(GFP_KERNEL, move || {
            fsleep(Delta::from_millis(200));
            posted_flag.store(post_marked(&server_qp, 9, false), Ordering::Release);
        });
        let mark = cq.mark();
        let start = Instant::<Monotonic>::now();
        let woken = cq.wait_since(mark, msecs_to_jiffies(5000));
        let woken_ms = start.elapsed().as_millis();
        let before_poll = client.received.load(Ordering::Acquire);
        let polled = cq.poll(16);
        let sent = spawned.is_ok() && wait_until(|| posted.load(Ordering::Acquire));
        let acked = wait_until(|| server.sends_back.load(Ordering::Acquire) == 1);
        // A poll that ended after the mark: news.
        let mark = cq.mark();
        let answered = post_marked(&pair.server_qp, 10, false);
        let arrived = wait_until(|| cq.poll(16) == Ok(1));
        let start = Instant::<Monotonic>::now();
        let news = cq.wait_since(mark, msecs_to_jiffies(5000));
        let news_ms = start.elapsed().as_millis();
        // Not a `Notified` CQ: no wait.
        let other = Cq::alloc(&owner, cq.device(), 4, Nop);
        let other_refuses = other
            .as_ref()
            .ok()
            .and_then(|o| o.wait_since(o.mark(), 1).err());
        drop(other);
        drop(pair);
        assert_eq!(empty, Ok(0));
        assert_eq!(quiet, Some(ETIMEDOUT));
        assert!(quiet_ms >= 90);
        assert!(woken.is_ok() && (150..2000).contains(&woken_ms));
        assert_eq!(before_poll, 0);
        assert_eq!(polled, Ok(1));
        assert!(sent && acked && answered && arrived);
        assert_eq!(
            client.last_digest.load(Ordering::Acquire),
            digest(&[10; 16])
        );
        assert!(news.is_ok() && news_ms < 50);
        assert_eq!(other_refuses, Some(EINVAL));
    }
}
