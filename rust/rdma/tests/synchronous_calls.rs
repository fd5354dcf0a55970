// SPDX-License-Identifier: GPL-2.0

//! KUnit: synchronous operation: the blocking calls (`*_sync`) and the
//! event that ends each.

use super::fixture::*;
use super::{take_out, wait_until, Checks};
use crate::rdma::{conn_param::ConnParam, event::*, net::NetNs};
use kernel::{prelude::*, types::ScopeGuard, workqueue};

#[kunit_tests(rdma_cm_rs_synchronous_calls)]
mod synchronous_tests {
    use super::*;

    /// The blocking forms on rxe, client and server in the kernel: each
    /// returns the event that ended it (ADDR_RESOLVED, ROUTE_RESOLVED,
    /// ESTABLISHED with the peer's private data on both sides,
    /// DISCONNECTED); inside `with_lock` they are refused (`EDEADLK`), on
    /// a handler without a waiter too (`EINVAL`).
    #[test]
    fn blocking_calls_return_their_events() {
        let mut checks = Checks::new();
        blocking_exchange(&mut checks);
        assert_eq!(checks.failures(), 0);
    }

    /// The body of [`blocking_calls_return_their_events`]: everything of
    /// the device it makes is dropped when it returns.
    fn blocking_exchange(c: &mut Checks) {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&owner, &ns, 7185) else {
            return;
        };
        // The server's id holds the world its handler records into: let
        // it go on every way out.
        let _release = ScopeGuard::new(|| drop(take_out(&world.seen, |seen| seen.server.take())));
        c.eq(
            "resolve_route_sync on a listener",
            listener.resolve_route_sync(ms(100), None).err(),
            Some(EINVAL),
        );

        let client = sync_client(&world, &ns).unwrap();
        let nested =
            client.with_lock(|_| Ok(client.resolve_addr_sync(None, &addr, ms(2000), None).err()));
        c.eq(
            "resolve_addr_sync inside with_lock",
            nested.ok().flatten(),
            Some(EDEADLK),
        );
        let resolved = client.resolve_addr_sync(None, &addr, ms(2000), Some(ms(5000)));
        let routed = resolved.and_then(|o| {
            c.eq(
                "resolve_addr_sync",
                (o.event().kind(), o.result()),
                (EventType::AddrResolved, Ok(())),
            );
            client.resolve_route_sync(ms(2000), Some(ms(5000)))
        });
        let routed = routed.map(|o| o.event().kind());
        if !c.eq(
            "the client's resolution",
            routed,
            Ok(EventType::RouteResolved),
        ) || !c.eq("the client's QP", with_qp(&client).err(), None)
        {
            return;
        }

        // The server accepts from a work item.
        let spawned = ConnParam::new()
            .private_data(b"from the server")
            .and_then(|param| accept_in_background(&world, Some(param), with_qp));
        if !c.eq("the accepting work", spawned.err(), None) {
            return;
        }
        let param = ConnParam::new().private_data(b"from the client").unwrap();
        let connected = client.connect_sync(&param, Some(ms(5000)));
        c.check(
            "the server's accept_sync returned within 5 s",
            wait_until(|| world.seen.lock().accepted.is_some()),
        );
        let accepted = world.seen.lock().accepted.take();
        let (Some(Ok(accepted)), Ok(connected)) = (accepted, connected) else {
            c.check(
                "the server's accept_sync and the client's connect_sync",
                false,
            );
            return;
        };
        c.eq(
            "connect_sync's event",
            connected.event().kind(),
            EventType::Established,
        );
        c.eq("connect_sync's result", connected.result(), Ok(()));
        // Over RoCE the REP's private data arrives padded to 196 bytes.
        let reply = connected.event().conn_param().map(|p| p.data().as_slice());
        c.check(
            "the server's private data",
            reply.is_some_and(|d| d.starts_with(b"from the server")),
        );
        c.eq(
            "accept_sync's event",
            accepted.event().kind(),
            EventType::Established,
        );
        c.eq(
            "the client's last event",
            client.last_event().map(|e| e.kind()),
            Some(EventType::Established),
        );

        // The server disconnects from a work item: its DISCONNECTED needs
        // the client's answer (a DREP, or the client's own DREQ), which the
        // client's disconnect sends; that one returns the DISCONNECTED the
        // server's request caused, kept if it came first.
        let server = world.seen.lock().server.take();
        let Some(server) = server else {
            c.check("the server's id", false);
            return;
        };
        let s = server.clone();
        let w = world.clone();
        let spawned = workqueue::system().try_spawn(GFP_KERNEL, move || {
            let ended = s.disconnect_sync(Some(ms(5000)));
            w.seen.lock().accepted = Some(ended);
        });
        if !c.eq("the disconnecting work", spawned.err(), None) {
            return;
        }
        let ended = client.disconnect_sync(Some(ms(5000)));
        c.eq(
            "the client's disconnect_sync",
            ended.map(|o| o.event().kind()),
            Ok(EventType::Disconnected),
        );
        c.check(
            "the server's disconnect_sync returned within 5 s",
            wait_until(|| world.seen.lock().accepted.is_some()),
        );
        let ended = world.seen.lock().accepted.take();
        c.eq(
            "the server's disconnect_sync",
            ended.map(|r| r.map(|o| o.event().kind())),
            Some(Ok(EventType::Disconnected)),
        );
        // Kept: a second disconnect returns it at once.
        let again = client.disconnect_sync(Some(ms(1)));
        c.eq(
            "a second disconnect_sync",
            again.map(|o| o.event().kind()),
            Ok(EventType::Disconnected),
        );
        drop((client, server, listener));
    }

    /// A blocking call past its limit fails with `ETIMEDOUT` and leaves
    /// its operation in flight: another operation is refused (`EBUSY`),
    /// and repeating the call waits for the first one's event, here the
    /// REJECTED of a request the server held, then rejected.
    #[test]
    fn timed_out_call_resumes() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&owner, &ns, 7186) else {
            return;
        };
        let client = ready_client(&world, &ns, &addr);
        assert!(client.is_ok());
        let Ok(client) = client else { return };
        let param = ConnParam::new();
        let first = client.connect_sync(&param, Some(ms(100)));
        assert_eq!(first.err(), Some(ETIMEDOUT));
        assert_eq!(client.resolve_route_sync(ms(100), None).err(), Some(EBUSY));
        assert!(wait_until(|| world.seen.lock().server.is_some()));
        let server = world.seen.lock().server.take();
        let Some(server) = server else { return };
        assert!(server.with_lock(|l| l.reject(0, b"held")).is_ok());
        let resumed = client.connect_sync(&param, Some(ms(10_000)));
        let Ok(resumed) = resumed else {
            panic!("the resumed call got no event");
        };
        assert_eq!(resumed.event().kind(), EventType::Rejected);
        assert_eq!(resumed.result(), Err(ECONNREFUSED));
        drop((client, server, listener));
    }

    /// A request whose peer gave up before it was accepted: its REJECTED
    /// came while no call waited, and the accept that follows returns it
    /// at once (`ECONNREFUSED`, the event with it) instead of asking the
    /// CM to answer a request that is gone (which fails with `EINVAL`
    /// and loses the event).
    #[test]
    fn failure_before_accept_is_returned_by_it() {
        let owner = owner();
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&owner, &ns, 7187) else {
            return;
        };
        let client = ready_client(&world, &ns, &addr);
        assert!(client.is_ok());
        let Ok(client) = client else { return };
        let first = client.connect_sync(&ConnParam::new(), Some(ms(100)));
        assert_eq!(first.err(), Some(ETIMEDOUT));
        assert!(wait_until(|| world.seen.lock().server.is_some()));
        // The client goes with its request pending: its CM rejects it.
        drop(client);
        assert!(wait_until(|| world.seen.lock().rejected > 0));
        let server = world.seen.lock().server.take();
        let Some(server) = server else { return };
        // No QP: the CM refuses one on a rejected request (its IB CM id is
        // idle, `ib_cm_init_qp_attr` fails).
        let accepted = server.accept_sync(None, Some(ms(5000)));
        assert_eq!(
            accepted.map(|o| (o.event().kind(), o.result())),
            Ok((EventType::Rejected, Err(ECONNREFUSED)))
        );
        assert_eq!(
            server.last_event().map(|e| e.kind()),
            Some(EventType::Rejected)
        );
        drop((server, listener));
    }
}
