// SPDX-License-Identifier: GPL-2.0

//! KUnit: a QP between two kernel ids: its events, inline and unsignaled
//! sends, a post the driver failed, and re-entry from its completion
//! handlers and callbacks (teardown, disconnect, iWARP's hold).

use super::fixture::*;
use super::{skip_without_devices, take_out, wait_closely_until, wait_until};
use crate::rdma::{
    addr::SocketAddr,
    cm::*,
    conn_param::ConnParam,
    event::*,
    mr::{Mr, MrAccess, RemoteRegion},
    net::NetNs,
    pd::Pd,
    synchronous::EventWaiter,
    verbs::{CompletionHandler, Cq, PollContext, QpCaps, RecvBuffer, RwOp, SendBuffer},
    QpType,
};
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::{delay::fsleep, Delta},
    workqueue,
};

#[kunit_tests(rdma_cm_rs_qp)]
mod qp_tests {
    use super::*;

    /// An RDMA WRITE with a key the server never gave out: the server's QP
    /// reports `IB_EVENT_QP_ACCESS_ERR` (rxe: no receive to pin the error
    /// on, C9-222.1) to its CQ's handler, in the driver's context; the
    /// client's WRITE completes with `EACCES`.
    #[test]
    fn access_error_reaches_the_qp_event_handler() {
        let owner = owner();
        let Some(pair) = connected_pair(&owner, &NetNs::init(), 7188) else {
            return;
        };
        let mr = Mr::new(pair.client_qp.pd(), 64).unwrap();
        let registered = pair.client_qp.register(&mr, MrAccess::LOCAL, 1).is_ok();
        let nowhere = RemoteRegion {
            addr: 0x1000,
            rkey: 0x5eed_0001,
            len: 16,
        };
        let written = pair.client_qp.rdma(RwOp::Write, &mr, 0, nowhere, 2).is_ok();
        let (server_seen, client_seen) = (pair.server_seen.clone(), pair.client_seen.clone());
        let reported = wait_until(|| server_seen.access_errors.load(Ordering::Acquire) > 0);
        let refused = wait_until(|| client_seen.refused_work.load(Ordering::Acquire) > 0);
        drop((mr, pair));
        assert!(registered && written);
        // The server's QP reported the access error; the client's WRITE
        // failed with EACCES.
        assert!(reported);
        assert!(refused);
        assert_eq!(server_seen.access_errors.load(Ordering::Acquire), 1);
    }

    /// SEND_WITH_INV: the client's message invalidates the key of the
    /// server's registration; the server's receive reports the key, its
    /// region is no longer registered and may be registered again (under
    /// a new key), and the old key is refused.  Immediate data and an
    /// invalidation together are refused before the post.
    #[test]
    fn remote_invalidation_ends_the_registration() {
        let owner = owner();
        let Some(pair) = connected_pair(&owner, &NetNs::init(), 7189) else {
            return;
        };
        let region = Mr::new(pair.server_qp.pd(), 4096).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let advertised = pair.server_qp.register(&region, access, 1).unwrap();
        let registered = region.is_registered();

        let mut both = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        both.fill(b"both").unwrap();
        both.set_imm(Some(7));
        both.set_invalidate(Some(advertised.rkey));
        let refused = pair.client_qp.post_send(both).err().map(Error::from);

        let mut done = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        done.fill(b"done").unwrap();
        done.set_invalidate(Some(advertised.rkey));
        let posted = pair.client_qp.post_send(done).is_ok();
        let server_seen = pair.server_seen.clone();
        let received = wait_until(|| server_seen.received.load(Ordering::Acquire) > 0);
        let invalidated = server_seen.invalidated_rkey.load(Ordering::Acquire);
        let unregistered = !region.is_registered();
        // Registered again, under a new key; the old one is no longer
        // recorded for the PD.
        let again = pair.server_qp.register(&region, access, 2);
        let new_key = again.as_ref().map(|r| r.rkey).ok();
        drop((region, pair));
        assert!(registered);
        assert_eq!(refused, Some(EINVAL));
        assert!(posted);
        assert!(received);
        assert_eq!(invalidated, advertised.rkey);
        assert!(unregistered);
        assert!(new_key.is_some_and(|k| k != advertised.rkey));
    }

    /// A send of the QP's inline size posted inline arrives whole; one byte
    /// more is refused before the post (`EMSGSIZE`) and comes back.
    #[test]
    fn inline_send_arrives_whole() {
        let owner = owner();
        let Some(pair) = connected_pair(&owner, &NetNs::init(), 7190) else {
            return;
        };
        let mut message = KVec::new();
        for i in 0..INLINE {
            message.push((i * 7 + 3) as u8, GFP_KERNEL).unwrap();
        }
        let mut too_long = SendBuffer::new(pair.client_qp.pd(), INLINE + 1).unwrap();
        too_long.fill(&[0x5a; INLINE + 1]).unwrap();
        too_long.set_inline(true);
        let refused = pair.client_qp.post_send(too_long).err();
        let refused = refused.map(|e| (e.error, e.value.data().len()));

        let mut send = SendBuffer::new(pair.client_qp.pd(), INLINE + 1).unwrap();
        send.fill(&message).unwrap();
        send.set_inline(true);
        let posted = pair.client_qp.post_send(send).is_ok();
        let server_seen = pair.server_seen.clone();
        let received = wait_until(|| server_seen.received.load(Ordering::Acquire) > 0);
        let len = server_seen.last_len.load(Ordering::Acquire) as usize;
        let got = server_seen.last_digest.load(Ordering::Acquire);
        drop(pair);
        assert_eq!(refused, Some((EMSGSIZE, INLINE + 1)));
        assert!(posted);
        assert!(received);
        assert_eq!(len, INLINE);
        assert_eq!(got, digest(&message));
    }

    /// Selective signaling: an unsignaled send that arrived makes no
    /// completion (its buffer is not given back while the QP is idle); the
    /// next signaled send's completion gives it back first, with success,
    /// then its own; a registration's completion gives one back as well.
    #[test]
    fn unsignaled_send_comes_back_with_the_next_signaled_one() {
        let owner = owner();
        let Some(pair) = connected_pair(&owner, &NetNs::init(), 7191) else {
            return;
        };
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let first = post_marked(&pair.client_qp, 1, true);
        let arrived = wait_until(|| server.received.load(Ordering::Acquire) == 1);
        // Time for a completion that should not come.
        fsleep(Delta::from_millis(200));
        let back_while_idle = client.sends_back.load(Ordering::Acquire);
        let second = post_marked(&pair.client_qp, 2, false);
        let both_back = wait_until(|| client.sends_back.load(Ordering::Acquire) == 2);
        let both_arrived = wait_until(|| server.received.load(Ordering::Acquire) == 2);
        // A memory work request's completion gives one back too.
        let third = post_marked(&pair.client_qp, 3, true);
        let third_arrived = wait_until(|| server.received.load(Ordering::Acquire) == 3);
        let back_before_work = client.sends_back.load(Ordering::Acquire);
        let mr = Mr::new(pair.client_qp.pd(), 64).unwrap();
        let registered = pair.client_qp.register(&mr, MrAccess::LOCAL, 9).is_ok();
        let third_back = wait_until(|| client.sends_back.load(Ordering::Acquire) == 3);
        drop((mr, pair));
        assert!(first && second && third && registered);
        assert!(arrived);
        assert_eq!(back_while_idle, 0);
        assert!(both_back && both_arrived);
        assert!(third_arrived);
        assert_eq!(back_before_work, 2);
        assert!(third_back);
        assert_eq!(client.send_log.load(Ordering::Acquire), 0x01_0203);
        assert_eq!(client.sends_failed.load(Ordering::Acquire), 0);
        assert_eq!(client.sends_back.load(Ordering::Acquire), 3);
    }

    /// A send queue filled with unsignaled sends ends in a completion: the
    /// layer signals those that leave fewer than two credits free, whose
    /// completions give back all four in order.
    #[test]
    fn last_credit_send_is_signaled() {
        let owner = owner();
        let Some(pair) = connected_pair(&owner, &NetNs::init(), 7192) else {
            return;
        };
        let client = pair.client_seen.clone();
        let posted = (1..=4u8).all(|byte| post_marked(&pair.client_qp, byte, true));
        let all_back = wait_until(|| client.sends_back.load(Ordering::Acquire) == 4);
        drop(pair);
        assert!(posted);
        assert!(all_back);
        assert_eq!(client.send_log.load(Ordering::Acquire), 0x0102_0304);
        assert_eq!(client.sends_failed.load(Ordering::Acquire), 0);
    }

    /// Unsignaled sends leave room for a registration chained with its
    /// SEND, which takes two credits: the send that leaves fewer than two
    /// free is signaled, so three unsignaled sends on a queue of four come
    /// back (none would, and the chain would get `ENOSPC` for ever), and
    /// the chain then fits.
    #[test]
    fn unsignaled_sends_leave_room_for_a_chain() {
        let owner = owner();
        let Some(pair) = connected_pair(&owner, &NetNs::init(), 7208) else {
            return;
        };
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let posted = (1..=3u8).all(|byte| post_marked(&pair.client_qp, byte, true));
        let all_back = wait_until(|| client.sends_back.load(Ordering::Acquire) == 3);
        let region = Mr::new(pair.client_qp.pd(), 64).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: false,
        };
        let prepared = pair
            .client_qp
            .prepare_registration(&region, access)
            .unwrap();
        let mut advert = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        advert.fill(&advertisement(prepared.region())).unwrap();
        let chained = pair
            .client_qp
            .register_then_send(prepared, 1, advert)
            .map(|_| ())
            .map_err(Error::from);
        let arrived = wait_until(|| server.received.load(Ordering::Acquire) == 4);
        drop(region);
        drop(pair);
        assert!(posted);
        assert!(all_back);
        assert_eq!(chained, Ok(()));
        assert!(arrived);
    }

    /// An unsignaled send still in flight when its QP shuts down comes
    /// back, with success (it arrived): the shutdown's marker behind it
    /// completes after it, instead of the send waiting out the flush and
    /// coming back from the reclaim as flushed.
    #[test]
    fn unsignaled_send_comes_back_at_shutdown() {
        let Some(client) = unsignaled_send_then_teardown(7193, PollContext::Workqueue, 7) else {
            return;
        };
        assert_eq!(client.send_log.load(Ordering::Acquire), 7);
    }

    /// siw takes a READ on a connection that negotiated no initiator depth
    /// into its send queue, then fails the post when it cannot start it.
    /// The request is the driver's all the same: the post reports success,
    /// the QP goes to the error state, and the region comes back once,
    /// flushed (freed at the failed post, the flush at the teardown read
    /// the freed request: KASAN, slab-use-after-free).
    #[test]
    fn post_the_driver_failed_after_taking_it_completes_once() {
        let owner = owner();
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&owner, &ns, SIW_IP, 7201, PollContext::Workqueue, 0)
        else {
            return;
        };
        let region = Mr::new(pair.server_qp.pd(), 64).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: false,
        };
        let remote = pair.server_qp.register(&region, access, 1).unwrap();
        let sink = Mr::new(pair.client_qp.pd(), 64).unwrap();
        let registered = pair.client_qp.register(&sink, MrAccess::LOCAL, 2).is_ok();
        let registered =
            registered && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == 1);
        let read = pair.client_qp.rdma(RwOp::Read, &sink, 0, remote, 3);
        let flushed = wait_until(|| pair.client_seen.work_flushed.load(Ordering::Acquire) == 1);
        let client_seen = pair.client_seen.clone();
        drop((region, sink, pair));
        assert!(registered);
        assert_eq!(read, Ok(()));
        assert!(flushed);
        // Once: the teardown flushed nothing more.
        assert_eq!(client_seen.work_flushed.load(Ordering::Acquire), 1);
    }

    /// What a completion handler does to its own id, through a nested
    /// `with_lock`, the first time it runs.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Reentry {
        /// Gives the id a new QP on the spare CQ.
        CreateQp,
        /// Destroys the id's QP.
        DestroyQp,
    }

    /// The caps of the QPs of the re-entry cases.
    const REENTRY_CAPS: QpCaps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 2,
        max_inline_data: 0,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_rdma_ctxs: 0,
    };

    /// The id a [`Reentrant`] handler turns back to, its PD and a spare CQ.
    type ReentryTarget = (Arc<CmId<Node>>, Arc<Pd>, Arc<Cq<Nop>>);

    /// A client made by [`reentrant_client`]: its id, its handler's state
    /// and the `Direct` CQ of its QP.
    type ReentrantClient = (Arc<CmId<Node>>, Arc<ReentryState>, Arc<Cq<Reentrant>>);

    /// The id a [`Reentrant`] handler turns back to, and what it saw.
    #[pin_data]
    struct ReentryState {
        action: Reentry,
        /// The id, its PD and a spare CQ: taken by the first completion.
        #[pin]
        target: Mutex<Option<ReentryTarget>>,
        /// What the nested call returned.
        #[pin]
        outcome: Mutex<Option<Result>>,
    }

    /// A completion handler that calls into its QP's id.
    struct Reentrant(Arc<ReentryState>);

    impl Reentrant {
        fn reenter(&self) {
            let Some((id, pd, spare)) = self.0.target.lock().take() else {
                return;
            };
            let outcome = id.with_lock(|l| match self.0.action {
                Reentry::CreateQp => l.create_qp(&pd, &spare, REENTRY_CAPS).map(drop),
                Reentry::DestroyQp => l.destroy_qp(),
            });
            *self.0.outcome.lock() = Some(outcome);
        }
    }

    impl CompletionHandler for Reentrant {
        fn recv_done(&self, _buf: RecvBuffer, _result: Result<usize>) {
            self.reenter();
        }
        fn send_done(&self, _buf: SendBuffer, _result: Result) {
            self.reenter();
        }
    }

    /// A synchronous client of `world` resolved to `addr`, with a QP on a
    /// `Direct` CQ whose [`Reentrant`] handler does `action`, two receives
    /// posted; the state, the CQ and the spare CQ's PD and CQ.
    fn reentrant_client(
        world: &Arc<World>,
        addr: &SocketAddr,
        action: Reentry,
    ) -> Result<ReentrantClient> {
        let ns = NetNs::init();
        let id = sync_client(world, &ns)?;
        id.resolve_addr_sync(None, addr, ms(2000), Some(ms(5000)))?
            .into_event()?;
        id.resolve_route_sync(ms(2000), Some(ms(5000)))?
            .into_event()?;
        let id = Arc::new(id, GFP_KERNEL)?;
        let state = Arc::pin_init(
            pin_init!(ReentryState {
                action,
                target <- new_mutex!(None),
                outcome <- new_mutex!(None),
            }),
            GFP_KERNEL,
        )?;
        let cq = id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(l.owner(), &dev)?;
            let entries = REENTRY_CAPS.cq_entries()?;
            let cq = Cq::alloc_with(
                &world.owner,
                &dev,
                entries,
                0,
                PollContext::Direct,
                Reentrant(state.clone()),
            )?;
            let spare = Cq::alloc(&world.owner, &dev, entries, Nop)?;
            let qp = l.create_qp(&pd, &cq, REENTRY_CAPS)?;
            for _ in 0..2 {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(Error::from)?;
            }
            *state.target.lock() = Some((id.clone(), pd, spare));
            Ok(cq)
        });
        match cq {
            Ok(cq) => Ok((id, state, cq)),
            Err(e) => {
                // The handler's reference to the id goes with the state.
                drop(state.target.lock().take());
                Err(e)
            }
        }
    }

    /// A QP's teardown runs its flushed completions in the caller's task
    /// when its CQ is `Direct`; a handler there that locks the id again
    /// (which runs directly: the task holds the id's mutex) finds the QP
    /// being torn down, and its `create_qp` is refused with `EBUSY`.
    /// Before, it succeeded: `rdma_create_qp` replaced the id's `qp`,
    /// the outer call destroyed the new QP, and the old one stayed with a
    /// context about to be freed.  Once the teardown returned the id
    /// takes a new QP.
    #[test]
    fn qp_created_inside_its_teardown_is_refused() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&owner, &ns, 7220) else {
            return;
        };
        let made = reentrant_client(&world, &addr, Reentry::CreateQp);
        let (id, state, cq) = match made {
            Ok(made) => made,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let destroyed = id.with_lock(|l| l.destroy_qp());
        let nested = take_out(&state.outcome, Option::take);
        let spare = take_out(&state.target, Option::take);
        let again = id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(&owner, &dev)?;
            let spare = Cq::alloc(&owner, &dev, REENTRY_CAPS.cq_entries()?, Nop)?;
            l.create_qp(&pd, &spare, REENTRY_CAPS).map(drop)
        });
        drop((id, spare, cq, listener, world));
        assert_eq!(destroyed, Ok(()));
        assert_eq!(nested, Some(Err(EBUSY)));
        assert_eq!(again, Ok(()));
    }

    /// A handler that [`Cq::poll`] runs inside the id's `with_lock` may
    /// not destroy the QP of that CQ (`EDEADLK`): the teardown would wait
    /// for the poll that is running it, holding the id's mutex, for ever.
    /// The QP's receives are flushed by a connect the peer's CM rejected
    /// (nobody listens on the port).
    #[test]
    fn qp_destroyed_from_its_own_poll_is_refused() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, _)) = listening(&owner, &ns, 7221) else {
            return;
        };
        let nobody = SocketAddr::V4 {
            ip: RXE_IP,
            port: 7222,
        };
        let made = reentrant_client(&world, &nobody, Reentry::DestroyQp);
        let (id, state, cq) = match made {
            Ok(made) => made,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let refused = id
            .connect_sync(&ConnParam::new(), Some(ms(5000)))
            .map(|o| o.result());
        // The flushed receives reach the CQ after the rejection; the
        // handler runs in the first poll that finds one.
        let ran = wait_until(|| {
            let _ = id.with_lock(|_| cq.poll(4));
            state.outcome.lock().is_some()
        });
        let nested = take_out(&state.outcome, Option::take);
        drop(take_out(&state.target, Option::take));
        let destroyed = id.with_lock(|l| l.destroy_qp());
        drop((id, cq, listener, world));
        assert_eq!(refused, Ok(Err(ECONNREFUSED)));
        assert!(ran);
        assert_eq!(nested, Some(Err(EDEADLK)));
        assert_eq!(destroyed, Ok(()));
    }

    /// The state of one [`CrossDestroyer`]: the id whose QP it destroys
    /// (taken by its first completion), how many handlers have arrived,
    /// and what its `destroy_qp` returned.
    #[pin_data]
    struct CrossState {
        #[pin]
        target: Mutex<Option<Arc<CmId<Node>>>>,
        arrived: Arc<AtomicU32>,
        #[pin]
        outcome: Mutex<Option<Result>>,
    }

    /// A completion handler that waits (up to 2 s) until the other one runs
    /// too, then destroys its target's QP through a nested `with_lock`.
    struct CrossDestroyer(Arc<CrossState>);

    impl CrossDestroyer {
        fn destroy(&self) {
            let Some(id) = self.0.target.lock().take() else {
                return;
            };
            self.0.arrived.fetch_add(1, Ordering::AcqRel);
            let _ = wait_closely_until(ms(2000), || self.0.arrived.load(Ordering::Acquire) >= 2);
            let outcome = id.with_lock(|l| l.destroy_qp());
            *self.0.outcome.lock() = Some(outcome);
        }
    }

    impl CompletionHandler for CrossDestroyer {
        fn recv_done(&self, _buf: RecvBuffer, _result: Result<usize>) {
            self.destroy();
        }
        fn send_done(&self, _buf: SendBuffer, _result: Result) {
            self.destroy();
        }
    }

    /// A client of `world` whose QP completes on `cq`, two receives posted
    /// and flushed by a connect to `nobody` that the peer's CM refused.
    fn refused_client(
        world: &Arc<World>,
        nobody: &SocketAddr,
        cq: &Arc<Cq<CrossDestroyer>>,
    ) -> Result<Arc<CmId<Node>>> {
        let id = resolved_client(
            &world.owner,
            Node::synchronous(world)?,
            &NetNs::init(),
            nobody,
        )?;
        id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(l.owner(), &dev)?;
            let qp = l.create_qp(&pd, cq, REENTRY_CAPS)?;
            for _ in 0..2 {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(Error::from)?;
            }
            Ok(())
        })?;
        match id.connect_sync(&ConnParam::new(), Some(ms(5000)))?.result() {
            Err(e) if e == ECONNREFUSED => Ok(Arc::new(id, GFP_KERNEL)?),
            other => Err(other.err().unwrap_or(EPROTO)),
        }
    }

    /// Two tasks, each inside one id's `with_lock`, poll a `Direct` CQ that
    /// holds the other id's flushed receives; each handler, once both run,
    /// destroys its own task's id's QP, which completes on the CQ the
    /// other task is polling.  Both are refused (`EDEADLK`): a completion
    /// handler may not tear a QP down.  Before, the teardown checked only
    /// the QP's own CQs, and each waited for the other's poll for ever.
    #[test]
    fn qp_destroyed_from_another_cqs_poll_is_refused() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, _)) = listening(&owner, &ns, 7225) else {
            return;
        };
        let nobody = SocketAddr::V4 {
            ip: RXE_IP,
            port: 7226,
        };
        let made = (|| {
            let arrived = Arc::new(AtomicU32::new(0), GFP_KERNEL)?;
            let state = |arrived: &Arc<AtomicU32>| {
                Arc::pin_init(
                    pin_init!(CrossState {
                        target <- new_mutex!(None),
                        arrived: arrived.clone(),
                        outcome <- new_mutex!(None),
                    }),
                    GFP_KERNEL,
                )
            };
            let (on_x, on_y) = (state(&arrived)?, state(&arrived)?);
            // Any device of the test bed: the CQs need one before an id has.
            let probe = sync_client(&world, &ns)?;
            probe
                .resolve_addr_sync(None, &nobody, ms(2000), Some(ms(5000)))?
                .into_event()?;
            let dev = probe.with_lock(|l| l.device())?;
            let entries = REENTRY_CAPS.cq_entries()?;
            let cq = |state: &Arc<CrossState>| {
                Cq::alloc_with(
                    &owner,
                    &dev,
                    entries,
                    0,
                    PollContext::Direct,
                    CrossDestroyer(state.clone()),
                )
            };
            let (x, y) = (cq(&on_x)?, cq(&on_y)?);
            // The first id's QP completes on Y, the second's on X.
            let first = refused_client(&world, &nobody, &y)?;
            let second = refused_client(&world, &nobody, &x)?;
            *on_x.target.lock() = Some(first.clone());
            *on_y.target.lock() = Some(second.clone());
            Ok::<_, Error>((first, second, x, y, on_x, on_y))
        })();
        let (first, second, x, y, on_x, on_y) = match made {
            Ok(made) => made,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let done = Arc::new(AtomicBool::new(false), GFP_KERNEL).unwrap();
        let (b_id, b_cq, b_state, b_done) = (second.clone(), y.clone(), on_y.clone(), done.clone());
        let spawned = workqueue::system().try_spawn(GFP_KERNEL, move || {
            let _ = wait_until(|| {
                let _ = b_id.with_lock(|_| b_cq.poll(4));
                b_state.outcome.lock().is_some()
            });
            drop((b_id, b_cq, b_state));
            b_done.store(true, Ordering::Release);
        });
        let ran = spawned.is_ok()
            && wait_until(|| {
                let _ = first.with_lock(|_| x.poll(4));
                on_x.outcome.lock().is_some()
            });
        let b_ran = spawned.is_ok() && wait_until(|| done.load(Ordering::Acquire));
        let arrived = on_x.arrived.load(Ordering::Acquire);
        let (a_outcome, b_outcome) = (
            take_out(&on_x.outcome, Option::take),
            take_out(&on_y.outcome, Option::take),
        );
        drop(take_out(&on_x.target, Option::take));
        drop(take_out(&on_y.target, Option::take));
        let destroyed = (
            first.with_lock(|l| l.destroy_qp()),
            second.with_lock(|l| l.destroy_qp()),
        );
        drop((first, second, x, y, on_x, on_y, listener, world));
        assert!(ran && b_ran);
        assert_eq!(arrived, 2);
        assert_eq!(a_outcome, Some(Err(EDEADLK)));
        assert_eq!(b_outcome, Some(Err(EDEADLK)));
        assert_eq!(destroyed, (Ok(()), Ok(())));
    }

    /// What [`ConnectsInCallback`] did.
    #[derive(Default)]
    struct ConnectRace {
        /// The id's callbacks are over: its connect returned, or it failed
        /// before.
        done: AtomicBool,
        /// Connects that returned, and those refused with `EBUSY` (a
        /// disconnect was running).
        connects: AtomicU32,
        busy: AtomicU32,
        /// Route resolutions refused with `EBUSY` (a disconnect was
        /// running): the round ends without a connect.
        busy_before_connect: AtomicU32,
        /// Disconnects made while the connect could run, and the loop
        /// making them returned.
        disconnects: AtomicU32,
        disconnector_done: AtomicBool,
    }

    /// Makes its QP on ADDR_RESOLVED and connects from ROUTE_RESOLVED,
    /// inside the callback, as a ULP that drives its id from its events.
    struct ConnectsInCallback(Arc<ConnectRace>);

    impl Handler for ConnectsInCallback {
        fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
            let race = &self.0;
            let next = match event.kind() {
                EventType::AddrResolved => {
                    let routing = (|| {
                        let dev = id.device()?;
                        let pd = Pd::alloc(id.owner(), &dev)?;
                        let cq = Cq::alloc(id.owner(), &dev, REENTRY_CAPS.cq_entries()?, Nop)?;
                        id.create_qp(&pd, &cq, REENTRY_CAPS)?;
                        id.resolve_route(ms(2000))
                    })();
                    if routing == Err(EBUSY) {
                        race.busy_before_connect.fetch_add(1, Ordering::AcqRel);
                    }
                    routing
                }
                EventType::RouteResolved => {
                    let connected = id.connect(&ConnParam::new());
                    race.connects.fetch_add(1, Ordering::AcqRel);
                    if connected == Err(EBUSY) {
                        race.busy.fetch_add(1, Ordering::AcqRel);
                    }
                    Err(ECANCELED)
                }
                _ => Ok(()),
            };
            if next.is_err() {
                race.done.store(true, Ordering::Release);
            }
        }
    }

    /// `CmId::disconnect` runs without the handler mutex, and is ordered
    /// against a connect that a callback of the id makes: on siw the
    /// connect to a port nobody listens on fails and frees the iWARP CM id
    /// while a disconnect, looping on another thread, would use it (KASAN
    /// reported the use after free in `iw_cm_disconnect` before).  Every
    /// round ends with its connect returned, or with the callback's call
    /// refused (`EBUSY`) while a disconnect ran, and the disconnects
    /// returned.
    #[test]
    fn disconnect_is_ordered_against_a_callbacks_connect() {
        let owner = owner();
        let ns = NetNs::init();
        let nobody = SocketAddr::V4 {
            ip: SIW_IP,
            port: 7223,
        };
        let (mut rounds, mut ended, mut connects, mut disconnects) = (0, 0, 0, 0);
        let (mut busy, mut busy_before_connect) = (0, 0);
        for _ in 0..24 {
            let Ok(race) = Arc::new(ConnectRace::default(), GFP_KERNEL) else {
                break;
            };
            let made = CmId::new(
                &owner,
                ConnectsInCallback(race.clone()),
                &ns,
                PortSpace::Tcp,
                QpType::Rc,
            )
            .and_then(|id| Ok(Arc::new(id, GFP_KERNEL)?));
            let Ok(id) = made else { break };
            let (looping, looped) = (id.clone(), race.clone());
            let spawned = workqueue::system().try_spawn(GFP_KERNEL, move || {
                while !looped.done.load(Ordering::Acquire) {
                    let _ = looping.disconnect();
                    looped.disconnects.fetch_add(1, Ordering::AcqRel);
                }
                drop(looping);
                looped.disconnector_done.store(true, Ordering::Release);
            });
            if spawned.is_err() {
                race.done.store(true, Ordering::Release);
                break;
            }
            rounds += 1;
            if let Err(e) = id.with_lock(|l| l.resolve_addr(None, &nobody, ms(2000))) {
                race.done.store(true, Ordering::Release);
                let _ = wait_until(|| race.disconnector_done.load(Ordering::Acquire));
                drop(id);
                super::skip_without_devices(e);
                return;
            }
            let done = wait_until(|| race.done.load(Ordering::Acquire));
            // Ends the loop if the callbacks did not.
            race.done.store(true, Ordering::Release);
            let stopped = wait_until(|| race.disconnector_done.load(Ordering::Acquire));
            if done && stopped {
                ended += 1;
            }
            connects += race.connects.load(Ordering::Acquire);
            busy += race.busy.load(Ordering::Acquire);
            busy_before_connect += race.busy_before_connect.load(Ordering::Acquire);
            disconnects += race.disconnects.load(Ordering::Acquire);
            drop(id);
            if !stopped {
                break;
            }
        }
        kernel::pr_info!(
            "disconnect race: {rounds} rounds, {connects} connects ({busy} refused with EBUSY), {busy_before_connect} route resolutions refused with EBUSY, {disconnects} disconnects\n"
        );
        assert_eq!(rounds, 24);
        assert_eq!(ended, rounds);
        assert_eq!(connects + busy_before_connect, rounds);
        assert!(disconnects >= rounds);
    }

    /// What [`DestroysQpOnEvents`] got from `destroy_qp`.
    #[derive(Default)]
    struct TeardownSeen {
        on_established: Option<Result>,
        on_disconnected: Option<Result>,
    }

    /// A synchronous client that destroys its QP from its ESTABLISHED and
    /// DISCONNECTED callbacks.
    struct DestroysQpOnEvents {
        seen: Arc<Mutex<TeardownSeen>>,
        waiter: Pin<KBox<EventWaiter>>,
    }

    impl Handler for DestroysQpOnEvents {
        fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
            match event.kind() {
                EventType::Established => {
                    self.seen.lock().on_established = Some(id.destroy_qp());
                }
                EventType::Disconnected => {
                    self.seen.lock().on_disconnected = Some(id.destroy_qp());
                }
                _ => {}
            }
        }

        fn waiter(&self) -> Option<&EventWaiter> {
            Some(&self.waiter)
        }
    }

    /// On iWARP the CM holds a connected id's QP until the connection
    /// ends, and siw's destroy waits for that reference: from the id's own
    /// ESTABLISHED callback `destroy_qp` is refused (`EBUSY`).  Before, it
    /// waited for good for the CM's close work, queued behind that very
    /// callback, and with it every later iWARP event, siw teardown and
    /// `rdma link delete`.  From the DISCONNECTED of the peer's disconnect
    /// (the CM let go first) it destroys the QP.
    #[test]
    fn iwarp_qp_held_by_the_cm_is_not_destroyed() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&owner, &ns, SIW_IP, 7224) else {
            return;
        };
        let seen = Arc::pin_init(new_mutex!(TeardownSeen::default()), GFP_KERNEL).unwrap();
        let made = (|| {
            let handler = DestroysQpOnEvents {
                seen: seen.clone(),
                waiter: KBox::pin_init(EventWaiter::new(), GFP_KERNEL)?,
            };
            let client = resolved_client(&owner, handler, &ns, &addr)?;
            with_qp(&client)?;
            Ok(client)
        })();
        let client = match made {
            Ok(client) => client,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let connected = accept_in_background(&world, None, with_qp)
            .and_then(|()| client.connect_sync(&ConnParam::new(), Some(ms(5000))))
            .and_then(|o| o.result());
        let accepted = wait_until(|| world.seen.lock().accepted.is_some());
        // The peer disconnects: a disconnect of the client's own, still
        // running when its DISCONNECTED came, would make that `EBUSY`.
        let server = world.seen.lock().server.clone();
        let disconnected = server
            .ok_or(ENOENT)
            .and_then(|server| server.disconnect_sync(Some(ms(5000))))
            .and_then(|o| o.result());
        let told = wait_until(|| seen.lock().on_disconnected.is_some());
        let gone = client.with_lock(|l| l.destroy_qp());
        drop(client);
        drop(listener);
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);
        let seen = take_out(&seen, core::mem::take);
        assert_eq!(connected, Ok(()));
        assert!(accepted);
        assert_eq!(seen.on_established, Some(Err(EBUSY)));
        assert_eq!(disconnected, Ok(()));
        assert!(told);
        assert_eq!(seen.on_disconnected, Some(Ok(())));
        assert_eq!(gone, Err(ENOENT));
    }
}
