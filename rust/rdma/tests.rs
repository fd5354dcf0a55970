// SPDX-License-Identifier: GPL-2.0

//! KUnit suites for the abstraction layer's validation rules.  They run when
//! the module is loaded (`kunit_module_notify`) and report KTAP to dmesg.

use kernel::{
    prelude::*,
    str::{CStrExt, CString},
};

/// Marks the running case skipped (KTAP `ok N case # SKIP reason`), for a
/// case that could not set up on the test bed's devices (`rxe0` at
/// 192.0.2.1, `siw0` at 203.0.113.1): counted apart from passes, and
/// `tools/check.sh` fails on it in its test VMs, which have both.
fn skip_without_devices(e: Error) {
    let owned = CString::try_from_fmt(fmt!("needs the test bed's rxe0 (and siw0): {e:?}"));
    let reason: &CStr = match &owned {
        Ok(reason) => reason,
        Err(_) => c"needs the test bed's rxe0 (and siw0)",
    };
    // SAFETY: `reason` is a NUL-terminated string that outlives the call;
    // `rdma_cm_rs_kunit_skip` copies it (scnprintf) into this task's case,
    // or does nothing when no case runs in this task.
    unsafe { crate::rdma::bindings::rdma_cm_rs_kunit_skip(reason.as_char_ptr()) };
}

/// Checks of a case made while it holds objects of a device, asserted
/// once they are gone.  A KUnit assertion ends the
/// case's thread where it stands, without running destructors: an id, a
/// QP or a PD left behind would keep its device, and `rdma link delete`
/// would wait for it for ever.  A case records instead, returns (which
/// drops what it holds), and asserts last that none failed.
struct Checks {
    failed: KVec<CString>,
    lost: bool,
}

impl Checks {
    fn new() -> Self {
        Self {
            failed: KVec::new(),
            lost: false,
        }
    }

    /// Records `what` as failed unless `ok`; returns `ok`.
    fn check(&mut self, what: &str, ok: bool) -> bool {
        if !ok {
            self.fail(fmt!("{what}"));
        }
        ok
    }

    /// Records `what` as failed unless `got == want`, with both; returns
    /// whether they were equal.
    fn eq<T: PartialEq + core::fmt::Debug>(&mut self, what: &str, got: T, want: T) -> bool {
        let ok = got == want;
        if !ok {
            self.fail(fmt!("{what}: {got:?}, expected {want:?}"));
        }
        ok
    }

    fn fail(&mut self, message: core::fmt::Arguments<'_>) {
        let recorded = CString::try_from_fmt(message)
            .ok()
            .is_some_and(|m| self.failed.push(m, GFP_KERNEL).is_ok());
        // Still a failure, without its words.
        self.lost |= !recorded;
    }

    /// Prints every failed check and returns how many there were, for the
    /// case to assert none (`assert_eq!(checks.failures(), 0)`): only the
    /// assertions of a `#[kunit_tests]` module's functions are KUnit's,
    /// one here would panic the kernel.
    fn failures(self) -> usize {
        for message in &self.failed {
            pr_err!("check failed: {}\n", &**message);
        }
        self.failed.len() + usize::from(self.lost)
    }
}

/// What `take` moves out of the state behind `lock`, handed back once the
/// lock is released.  An id a case keeps in the state its handlers share
/// must be dropped without that lock: the id's destruction waits for its
/// handler, which takes the lock.  (As a statement, `seen.lock().server.take();`
/// drops the id before the guard: lockdep reported the inversion when a
/// SIDR case failed on a loaded machine.)
fn take_out<T: Unpin, U>(lock: &kernel::sync::Mutex<T>, take: impl FnOnce(&mut T) -> U) -> U {
    let mut guard = lock.lock();
    let taken = take(&mut guard);
    drop(guard);
    taken
}

/// [`wait_until`] checking every 10 to 20 microseconds, for up to `limit`:
/// the caller acts while what it waits for is still under way.  Sleeping
/// (rather than spinning) lets the scheduler wake the caller on another
/// CPU than the work it watches.
fn wait_closely_until(limit: kernel::time::Delta, mut done: impl FnMut() -> bool) -> bool {
    let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        kernel::time::delay::fsleep(kernel::time::Delta::from_micros(10));
    }
    done()
}

/// Polls `done` every 10 ms for up to 5 s; whether it came true.
fn wait_until(mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..500 {
        if done() {
            return true;
        }
        kernel::time::delay::fsleep(kernel::time::Delta::from_millis(10));
    }
    false
}

#[kunit_tests(rdma_cm_rs_addr)]
mod addr_tests {
    use crate::rdma::addr::*;

    #[test]
    fn parses_ipv4_with_port() {
        let a = SocketAddr::parse(b"192.0.2.1:7471").unwrap();
        assert_eq!(
            a,
            SocketAddr::V4 {
                ip: [192, 0, 2, 1],
                port: 7471
            }
        );
    }

    #[test]
    fn rejects_malformed_ipv4() {
        for bad in [
            &b"192.0.2:7471"[..],
            b"192.0.2.1.5:1",
            b"256.0.0.1:1",
            b"192.0.2.1",
            b"192.0.2.1:",
            b"192.0.2.1:65536",
            b"1a.0.0.1:1",
            b"192.0.2.1:-1",
        ] {
            assert!(SocketAddr::parse(bad).is_err());
        }
    }

    #[test]
    fn parses_ipv6_forms() {
        let a = SocketAddr::parse(b"[2001:db8::1]:7471").unwrap();
        let mut ip = [0u8; 16];
        ip[0] = 0x20;
        ip[1] = 0x01;
        ip[2] = 0x0d;
        ip[3] = 0xb8;
        ip[15] = 1;
        assert_eq!(
            a,
            SocketAddr::V6 {
                ip,
                port: 7471,
                flowinfo: 0,
                scope_id: 0
            }
        );
        assert_eq!(parse_ipv6(b"::").unwrap(), [0u8; 16]);
        let mapped = parse_ipv6(b"::ffff:192.0.2.1").unwrap();
        assert_eq!(&mapped[10..], &[0xff, 0xff, 192, 0, 2, 1]);
        assert_eq!(parse_ipv6(b"1:2:3:4:5:6:7:8").unwrap()[15], 8);
        let scoped = SocketAddr::parse(b"[fe80::1%3]:1").unwrap();
        assert!(matches!(scoped, SocketAddr::V6 { scope_id: 3, .. }));
    }

    #[test]
    fn rejects_malformed_ipv6() {
        for bad in [
            &b"1::2::3"[..],
            b"1:2:3:4:5:6:7:8:9",
            b"1:2:3:4:5:6:7",
            b"12345::",
            b"g::1",
            b":1:2:3:4:5:6:7",
        ] {
            assert!(parse_ipv6(bad).is_err());
        }
        assert!(SocketAddr::parse(b"[2001:db8::1]7471").is_err());
        assert!(SocketAddr::parse(b"[2001:db8::1:7471").is_err());
    }

    #[test]
    fn sockaddr_round_trip() {
        for text in [&b"192.0.2.1:7471"[..], b"[2001:db8::2]:1", b"0.0.0.0:0"] {
            let a = SocketAddr::parse(text).unwrap();
            let bytes = a.to_sockaddr();
            assert_eq!(SocketAddr::from_sockaddr(&bytes.0).unwrap(), Some(a));
        }
        // Network byte order on the wire: port 7471 = 0x1d2f.
        let b = SocketAddr::parse(b"192.0.2.1:7471").unwrap().to_sockaddr();
        assert_eq!(&b.0[..8], &[2, 0, 0x1d, 0x2f, 192, 0, 2, 1]);
    }

    #[test]
    fn sockaddr_rejects_garbage() {
        let mut b = SocketAddr::parse(b"192.0.2.1:1").unwrap().to_sockaddr();
        b.0[9] = 1; // sin_zero
        assert!(SocketAddr::from_sockaddr(&b.0).is_err());
        let mut b = SocketAddr::parse(b"[::1]:1").unwrap().to_sockaddr();
        b.0[100] = 1; // past sockaddr_in6
        assert!(SocketAddr::from_sockaddr(&b.0).is_err());
        let mut none = [0u8; SOCKADDR_SIZE];
        assert_eq!(SocketAddr::from_sockaddr(&none).unwrap(), None);
        none[5] = 1;
        assert!(SocketAddr::from_sockaddr(&none).is_err());
        let mut ib = [0u8; SOCKADDR_SIZE];
        ib[0] = AF_IB as u8;
        assert_eq!(
            SocketAddr::from_sockaddr(&ib),
            Err(kernel::error::code::EAFNOSUPPORT)
        );
    }
}

#[kunit_tests(rdma_cm_rs_conn_param)]
mod conn_param_tests {
    use crate::rdma::{conn_param::*, device::Transport};
    use kernel::error::code::*;

    #[test]
    fn private_data_limits_match_the_man_pages() {
        assert_eq!(MAX_CONNECT_PRIVATE_DATA_RC, 56);
        assert_eq!(MAX_CONNECT_PRIVATE_DATA_UD, 180);
        assert_eq!(MAX_ACCEPT_PRIVATE_DATA_RC, 196);
        assert_eq!(MAX_ACCEPT_PRIVATE_DATA_UD, 136);
        assert_eq!(MAX_REJECT_PRIVATE_DATA, 148);
    }

    #[test]
    fn private_data_checked_per_use_and_transport() {
        let data = [0xa5u8; 256];
        for (transport, usage, limit) in [
            (Transport::Ib, PrivateDataUse::ConnectRc, 56),
            (Transport::Ib, PrivateDataUse::ConnectUd, 180),
            (Transport::Ib, PrivateDataUse::AcceptRc, 196),
            (Transport::Ib, PrivateDataUse::AcceptUd, 136),
            (Transport::Ib, PrivateDataUse::Reject, 148),
            // MPA's 256 less the MPA v2 header's 4.
            (Transport::Iwarp, PrivateDataUse::ConnectRc, 252),
            (Transport::Iwarp, PrivateDataUse::AcceptRc, 252),
            (Transport::Iwarp, PrivateDataUse::Reject, 252),
        ] {
            assert!(PrivateData::new(&data[..limit])
                .unwrap()
                .check(usage, transport)
                .is_ok());
            assert_eq!(
                PrivateData::new(&data[..limit + 1])
                    .unwrap()
                    .check(usage, transport),
                Err(EINVAL)
            );
        }
        // No UD on iWARP, whatever the length.
        for usage in [PrivateDataUse::ConnectUd, PrivateDataUse::AcceptUd] {
            assert_eq!(usage.limit(Transport::Iwarp), Err(EPROTONOSUPPORT));
            assert_eq!(
                PrivateData::default().check(usage, Transport::Iwarp),
                Err(EPROTONOSUPPORT)
            );
        }
        assert!(PrivateData::new(&[0u8; 257]).is_err());
    }

    #[test]
    fn retry_counts_are_three_bits() {
        for v in 0..=7u8 {
            assert!(ConnParam::new().retry_count(v).is_ok());
            assert!(ConnParam::new().rnr_retry_count(v).is_ok());
        }
        assert!(ConnParam::new().retry_count(8).is_err());
        assert!(ConnParam::new().rnr_retry_count(8).is_err());
        assert!(ConnParam::new().retry_count(255).is_err());
    }

    #[test]
    fn no_qp_number_reaches_the_cm() {
        let raw = ConnParam::new().as_raw();
        assert_eq!((raw.qp_num, raw.srq), (0, 0));
        assert_eq!(ConnParam::new().peer_qp_num(), 0);
    }

    #[test]
    fn rd_atom_bounded_by_device() {
        let p = ConnParam::new().responder_resources(4).initiator_depth(2);
        for transport in [Transport::Ib, Transport::Iwarp] {
            let check = |rd, init| p.check_against(PrivateDataUse::ConnectRc, transport, rd, init);
            assert!(check(4, 2).is_ok());
            assert!(check(3, 2).is_err());
            assert!(check(4, 1).is_err());
        }
    }
}

#[kunit_tests(rdma_cm_rs_getaddrinfo)]
mod getaddrinfo_tests {
    use crate::rdma::{addr::*, cm::*, getaddrinfo::*, QpType};
    use kernel::error::code::*;

    #[test]
    fn active_numeric() {
        let ai = getaddrinfo(Some(b"192.0.2.1"), Some(b"7471"), &Hints::default()).unwrap();
        assert_eq!(
            ai.dst,
            Some(SocketAddr::V4 {
                ip: [192, 0, 2, 1],
                port: 7471
            })
        );
        assert_eq!(ai.src, None);
        assert_eq!(ai.port_space, PortSpace::Tcp);
        assert_eq!(ai.qp_type, QpType::Rc);
    }

    #[test]
    fn passive_defaults_to_wildcard() {
        let hints = Hints {
            flags: RAI_PASSIVE,
            ..Hints::default()
        };
        let ai = getaddrinfo(None, Some(b"7471"), &hints).unwrap();
        assert_eq!(
            ai.src,
            Some(SocketAddr::V4 {
                ip: [0; 4],
                port: 7471
            })
        );
        let hints = Hints {
            flags: RAI_PASSIVE | RAI_FAMILY,
            family: AF_INET6,
            ..Hints::default()
        };
        let ai = getaddrinfo(None, None, &hints).unwrap();
        assert_eq!(ai.family, AF_INET6);
        assert!(ai.src.unwrap().is_any());
    }

    #[test]
    fn ud_hint_selects_udp() {
        let hints = Hints {
            qp_type: Some(QpType::Ud),
            ..Hints::default()
        };
        let ai = getaddrinfo(Some(b"2001:db8::1"), Some(b"7174"), &hints).unwrap();
        assert_eq!(ai.port_space, PortSpace::Udp);
        assert_eq!(ai.family, AF_INET6);
        let bad = Hints {
            qp_type: Some(QpType::Ud),
            port_space: Some(PortSpace::Tcp),
            ..Hints::default()
        };
        assert_eq!(getaddrinfo(Some(b"192.0.2.1"), None, &bad), Err(EINVAL));
    }

    #[test]
    fn names_are_not_resolved() {
        assert_eq!(
            getaddrinfo(Some(b"localhost"), None, &Hints::default()),
            Err(EOPNOTSUPP)
        );
        assert_eq!(
            getaddrinfo(Some(b"192.0.2.1"), Some(b"http"), &Hints::default()),
            Err(EOPNOTSUPP)
        );
        let numeric = Hints {
            flags: RAI_NUMERICHOST,
            ..Hints::default()
        };
        assert_eq!(getaddrinfo(Some(b"localhost"), None, &numeric), Err(EINVAL));
    }

    #[test]
    fn family_and_flags_checked() {
        let v6 = Hints {
            flags: RAI_FAMILY,
            family: AF_INET6,
            ..Hints::default()
        };
        assert_eq!(
            getaddrinfo(Some(b"192.0.2.1"), None, &v6),
            Err(EAFNOSUPPORT)
        );
        let ib = Hints {
            family: AF_IB,
            ..Hints::default()
        };
        assert_eq!(
            getaddrinfo(Some(b"192.0.2.1"), None, &ib),
            Err(EAFNOSUPPORT)
        );
        let unknown = Hints {
            flags: 0x100,
            ..Hints::default()
        };
        assert_eq!(getaddrinfo(Some(b"192.0.2.1"), None, &unknown), Err(EINVAL));
        assert_eq!(
            getaddrinfo(None, Some(b"1"), &Hints::default()),
            Err(EINVAL)
        );
        let scoped = getaddrinfo(Some(b"fe80::1%2"), None, &Hints::default()).unwrap();
        assert!(matches!(
            scoped.dst,
            Some(SocketAddr::V6 { scope_id: 2, .. })
        ));
        assert_eq!(
            getaddrinfo(Some(b"fe80::1%"), None, &Hints::default()),
            Err(EINVAL)
        );
        let noroute = Hints {
            flags: RAI_NOROUTE,
            ..Hints::default()
        };
        assert!(getaddrinfo(Some(b"192.0.2.1"), None, &noroute).is_ok());
    }
}

#[kunit_tests(rdma_cm_rs_ids)]
mod id_tests {
    use crate::rdma::{
        addr::SocketAddr,
        async_event::{AsyncEventHandler, AsyncEventRegistration, DeviceEvent},
        bindings,
        callback::{callback_targets, without_destroy_queue},
        client::{Client, ClientRegistration},
        cm::*,
        cq_pool::CqPool,
        deferred::flush_deferred_destroys,
        device::{Device, Transport},
        event::*,
        mr::{Mr, MrAccess},
        net::NetNs,
        pd::Pd,
        poller::BusyPoller,
        sg::SgBuffer,
        verbs::{CompletionHandler, Cq, PollContext, Qp, QpCaps, RecvBuffer, SendBuffer, Srq},
        QpType,
    };
    use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use kernel::{
        new_mutex,
        prelude::*,
        sync::{aref::ARef, Arc, Mutex},
        time::{delay::fsleep, Delta},
    };

    #[test]
    fn every_event_type_has_a_name() {
        for (i, t) in EventType::ALL.iter().enumerate() {
            assert_eq!(*t as usize, i);
            assert_eq!(EventType::from_raw(i as u32), Some(*t));
            // `rdma_event_msg` knows the 16 events the CM sends.
            assert!(!t.name().to_bytes().is_empty());
            if i < 16 {
                assert!(t.name().to_bytes() != b"unrecognized event");
            }
        }
        // All 20 values of 7.3's `enum rdma_cm_event_type`, and no more.
        assert_eq!(EventType::ALL.len(), 20);
        assert_eq!(
            EventType::ALL[19] as u32,
            bindings::rdma_cm_event_type_RDMA_CM_EVENT_INTERNAL
        );
        assert_eq!(EventType::from_raw(20), None);
    }

    #[test]
    fn read_depths_are_this_sides_on_every_transport() {
        // SAFETY: All-zero is a valid `rdma_cm_event`: null private data,
        // no pointer that anything follows.
        let mut raw: bindings::rdma_cm_event = unsafe { core::mem::zeroed() };
        {
            // SAFETY: Connection events use the `conn` member of the union.
            let conn = unsafe { raw.param.conn.as_mut() };
            conn.responder_resources = 5;
            conn.initiator_depth = 2;
        }
        for (kind, transport, want) in [
            // Requests and IB's replies come from the receiver's side.
            (EventType::ConnectRequest, Some(Transport::Iwarp), (5, 2)),
            (EventType::ConnectRequest, Some(Transport::Ib), (5, 2)),
            (EventType::Established, Some(Transport::Ib), (5, 2)),
            // cma_iw_handler reports the provider's IRD as initiator_depth.
            (EventType::Established, Some(Transport::Iwarp), (2, 5)),
            (EventType::Established, None, (5, 2)),
        ] {
            raw.event = kind as u32;
            // SAFETY: `raw` is valid for the loop body, which `event` does
            // not outlive; the id would be RC; `transport` is the one tried.
            let event = unsafe { Event::from_raw(&raw, false, transport) }.unwrap();
            assert_eq!(event.transport(), transport);
            let view = event.conn_param().unwrap();
            assert_eq!((view.responder_resources(), view.initiator_depth()), want);
            assert_eq!(view.to_owned().rd_atom(), want);
        }
    }

    #[test]
    fn qp_type_must_fit_port_space() {
        assert!(PortSpace::Tcp.carries(QpType::Rc));
        assert!(!PortSpace::Tcp.carries(QpType::Ud));
        assert!(PortSpace::Udp.carries(QpType::Ud));
        assert!(!PortSpace::Udp.carries(QpType::Rc));
        assert!(PortSpace::Ib.carries(QpType::Rc));
    }

    #[derive(Clone)]
    struct Nop;
    impl Handler for Nop {
        fn event(&self, _id: &LockedId<'_>, _event: &Event<'_>) {}
    }
    impl CompletionHandler for Nop {
        fn recv_done(&self, _buf: RecvBuffer, _result: Result<usize>) {}
        fn send_done(&self, _buf: SendBuffer, _result: Result) {}
    }

    fn ms(ms: i64) -> Delta {
        Delta::from_millis(ms)
    }

    /// The test VMs put rxe at 192.0.2.1.
    fn rxe_addr() -> SocketAddr {
        SocketAddr::V4 {
            ip: [192, 0, 2, 1],
            port: 0,
        }
    }

    // Assertions run outside `with_lock`: a failed KUnit assertion ends the
    // test thread, which must not happen with the CM's handler mutex held.

    /// Every object the C side can call into the module through is
    /// counted from its creation to its drop (what the module's
    /// `DestroyQueue` waits for before the module's code goes): an id, and
    /// on its device a CQ and a busy poller (its loops' workqueue) add one
    /// each, a loop nothing more, and their drops take them back.
    #[test]
    fn callback_targets_are_counted_until_they_go() {
        flush_deferred_destroys().unwrap();
        let before = callback_targets();
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let with_id = callback_targets();
        let dev = match id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            l.device()
        }) {
            Ok(dev) => dev,
            Err(e) => {
                drop(id);
                super::skip_without_devices(e);
                return;
            }
        };
        let cq = Cq::alloc_with(&dev, 8, 0, PollContext::Direct, Nop).unwrap();
        let with_cq = callback_targets();
        let poller = BusyPoller::new().unwrap();
        let with_poller = callback_targets();
        let polling = poller.start(&cq).unwrap();
        let with_loop = callback_targets();
        drop(polling);
        // The loop ends within a poll and lets go of the CQ.
        drop(poller);
        let loop_gone = callback_targets();
        drop(cq);
        let cq_gone = callback_targets();
        drop(dev);
        drop(id);
        flush_deferred_destroys().unwrap();
        let after = callback_targets();
        assert_eq!(with_id, before + 1);
        assert_eq!(with_cq, before + 2);
        assert_eq!(with_poller, before + 3);
        assert_eq!(with_loop, before + 3);
        assert_eq!(loop_gone, before + 2);
        assert_eq!(cq_gone, before + 1);
        assert_eq!(after, before);
    }

    /// A client that keeps nothing per device.
    struct Bare;

    crate::rdma_client_slot!(Bare);

    impl Client for Bare {
        type DeviceData = ();
        const NAME: &'static kernel::str::CStr = c"rdma_cm_rs_kunit_bare";

        fn add(&self, _dev: &ARef<Device>) -> Result {
            Ok(())
        }
    }

    impl AsyncEventHandler for Nop {
        fn event(&self, _dev: &Device, _event: DeviceEvent) {}
    }

    /// Without the module's `DestroyQueue`, whose drop waits for them,
    /// no object the C side calls back through is made (`ENXIO`): an id,
    /// a CQ, a QP, an SRQ, a busy poller, a client and a device event
    /// registration.  Before, all but the ids and the event registration
    /// were made, and one leaked (`mem::forget`) in a module without a
    /// queue had the RDMA core call freed module text after the unload.
    #[test]
    fn callback_targets_need_a_destroy_queue() {
        flush_deferred_destroys().unwrap();
        let before = callback_targets();
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let made = id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let cq = Cq::alloc(&dev, 16, Nop)?;
            Ok((dev, pd, cq))
        });
        let (dev, pd, cq) = match made {
            Ok(made) => made,
            Err(e) => {
                drop(id);
                super::skip_without_devices(e);
                return;
            }
        };
        let caps = QpCaps {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_inline_data: 0,
            ..QpCaps::default()
        };
        let with_objects = callback_targets();
        let refused = without_destroy_queue(|| {
            [
                CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).err(),
                Cq::alloc(&dev, 8, Nop).err(),
                id.with_lock(|l| l.create_qp(&pd, &cq, caps)).err(),
                Srq::<Nop>::new(&pd, 4).err(),
                BusyPoller::new().err(),
                KBox::pin_init(ClientRegistration::new(Bare), GFP_KERNEL).err(),
                AsyncEventRegistration::new(&dev, Nop).err(),
            ]
        });
        let after_refusals = callback_targets();
        // With the queue, the QP is made.
        let qp = id.with_lock(|l| l.create_qp(&pd, &cq, caps)).map(drop);
        drop((cq, pd, dev, id));
        flush_deferred_destroys().unwrap();
        let after = callback_targets();
        assert_eq!(refused, [Some(ENXIO); 7]);
        assert_eq!(after_refusals, with_objects);
        assert_eq!(qp, Ok(()));
        assert_eq!(after, before);
    }

    #[test]
    fn create_and_destroy_ids() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let (port, qp, src, ack32, rnr32, ack14, reuse, route0, listen_locked, dev) = id
            .with_lock(|l| {
                Ok((
                    l.port_num(),
                    l.qp_num(),
                    l.src_addr(),
                    l.set_ack_timeout(32),
                    l.set_min_rnr_timer(32),
                    l.set_ack_timeout(14),
                    l.set_reuseaddr(true),
                    l.resolve_route(ms(0)),
                    // `rdma_listen` runs without the handler mutex.
                    id.listen(1),
                    l.device().err(),
                ))
            })
            .unwrap();
        // Unbound: no device, no QP, no address.
        assert_eq!(port, 0);
        assert_eq!(qp, None);
        assert!(src.is_none());
        assert_eq!(dev, Some(ENODEV));
        // Out-of-range options are refused before reaching the CM.
        assert!(ack32.is_err());
        assert!(rnr32.is_err());
        assert!(ack14.is_ok());
        assert!(reuse.is_ok());
        assert!(route0.is_err());
        assert_eq!(listen_locked, Err(EDEADLK));
        // 0: the CM's default (no bound on RoCE), on the wildcard.
        assert_eq!(id.listen(0), Ok(()));
        assert_eq!(id.listen(u32::MAX), Err(EINVAL));
        drop(id);
        let ns = NetNs::current().unwrap();
        assert!(CmId::new(Nop, &ns, PortSpace::Tcp, QpType::Ud).is_err());
        let ud = CmId::new(Nop, &ns, PortSpace::Udp, QpType::Ud).unwrap();
        // RC only; the CM would WARN on a UD id (found by the fuzzer).
        let rnr = ud.with_lock(|l| Ok(l.set_min_rnr_timer(12))).unwrap();
        assert_eq!(rnr, Err(EINVAL));
        drop(ud);
    }

    /// `rdma_reject_msg` reads the id's device and port: on an unbound id
    /// (or a wildcard listener) the device is NULL, and the C function
    /// would dereference it.
    #[test]
    fn reject_msg_needs_a_bound_device() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let unbound = id.with_lock(|l| Ok(l.reject_msg(28))).unwrap();
        assert!(unbound.is_none());
        let wildcard = SocketAddr::any(crate::rdma::addr::AF_INET, 0).unwrap();
        id.with_lock(|l| l.bind(&wildcard)).unwrap();
        id.listen(1).unwrap();
        let listening = id.with_lock(|l| Ok(l.reject_msg(28))).unwrap();
        assert!(listening.is_none());
        drop(id);
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let bound = id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            Ok(l.reject_msg(28))
        });
        match bound {
            Ok(msg) => assert_eq!(msg.map(|m| m.to_bytes()), Some(&b"consumer defined"[..])),
            Err(e) => super::skip_without_devices(e),
        }
    }

    /// Binds the locked id to rxe and makes a PD and a CQ sized for `caps`
    /// there, completing to `handler`.
    fn pd_and_cq_on_rxe<C: CompletionHandler>(
        l: &LockedId<'_>,
        caps: QpCaps,
        handler: C,
    ) -> Result<(Arc<Pd>, Arc<Cq<C>>)> {
        l.bind(&rxe_addr())?;
        let dev = l.device()?;
        let pd = Pd::alloc(&dev)?;
        let cq = Cq::alloc(&dev, caps.cq_entries()?, handler)?;
        Ok((pd, cq))
    }

    /// A UD id gets a UD QP, which takes datagrams only: an RC SEND (no
    /// address handle: rxe would follow a null one) and memory work are
    /// refused before they reach the driver, and so is a datagram above the
    /// port's MTU (rxe would drop it and report success).  A receive's
    /// buffer holds the global route header:
    /// one more byte without pages, the header alone with pages.
    #[test]
    fn ud_qp_takes_only_datagrams() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Udp, QpType::Ud).unwrap();
        let made = id.with_lock(|l| {
            let caps = QpCaps {
                max_send_wr: 2,
                max_recv_wr: 2,
                max_inline_data: 0,
                max_send_sge: 2,
                max_recv_sge: 2,
                ..QpCaps::default()
            };
            let (pd, cq) = pd_and_cq_on_rxe(l, caps, Nop)?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            let mut buf = SendBuffer::new(&pd, 64)?;
            buf.fill(b"datagram")?;
            let rc_send = qp.post_send(buf).err().map(|(e, _)| e);
            let mr = Mr::new(&pd, 4096)?;
            let access = MrAccess {
                remote_read: true,
                remote_write: false,
            };
            let register = qp.register(&mr, access, 1).err();
            let grh = crate::rdma::ah::GRH_SIZE;
            let recv_without_room = qp
                .post_recv(RecvBuffer::new(&pd, grh)?)
                .err()
                .map(|(e, _)| e);
            // A refusal's error, and whether the buffer came back with its
            // pages attached.
            let paged_recv = |len| -> Result<Option<(Error, bool)>> {
                let mut buf = RecvBuffer::new(&pd, len)?;
                buf.attach_pages(SgBuffer::new(4096)?);
                Ok(qp
                    .post_recv(buf)
                    .err()
                    .map(|(e, back)| (e, back.pages().is_some())))
            };
            let recv_header_short = paged_recv(grh - 1)?;
            // Posted, and flushed with the QP.
            let recv_header_then_pages = paged_recv(grh)?;
            Ok((
                qp.qp_type(),
                qp.qkey(),
                qp.max_datagram(),
                rc_send,
                register,
                recv_without_room,
                recv_header_short,
                recv_header_then_pages,
            ))
        });
        match made {
            Ok((
                qp_type,
                qkey,
                max_datagram,
                rc_send,
                register,
                recv_without_room,
                recv_header_short,
                recv_header_then_pages,
            )) => {
                assert_eq!(qp_type, QpType::Ud);
                // RDMA_UDP_QKEY, the CM's Q_Key for RDMA_PS_UDP.
                assert_eq!(qkey, 0x0123_4567);
                assert!((256..=4096).contains(&max_datagram));
                assert_eq!(rc_send, Some(EOPNOTSUPP));
                assert_eq!(register, Some(EOPNOTSUPP));
                assert_eq!(recv_without_room, Some(EINVAL));
                assert_eq!(recv_header_short, Some((EINVAL, true)));
                assert_eq!(recv_header_then_pages, None);
            }
            Err(e) => super::skip_without_devices(e),
        }
    }

    /// A QP reserves its requests and the drain's two on its CQ.
    #[test]
    fn qps_reserve_room_for_the_drain() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let made = id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let caps = QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_inline_data: 0,
                ..QpCaps::default()
            };
            // 8 requests in flight need 10 entries.
            let small = Cq::alloc(&dev, 9, Nop)?;
            let too_small = l.create_qp(&pd, &small, caps).err();
            let cq = Cq::alloc(&dev, 10, Nop)?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            let busy = l.create_qp(&pd, &cq, caps).err();
            Ok((too_small, small.free_entries(), cq, qp, busy))
        });
        let (too_small, small_free, cq, qp, busy) = match made {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        let full = cq.free_entries();
        // No more requests in flight than the caps: the CQ cannot overflow.
        let mut posted = 0;
        for _ in 0..4 {
            let buf = RecvBuffer::new(qp.pd(), 8);
            posted += u32::from(buf.is_ok_and(|buf| qp.post_recv(buf).is_ok()));
        }
        let post = |pd: &Arc<Pd>| {
            let buf = RecvBuffer::new(pd, 8).map_err(|e| (e, None))?;
            qp.post_recv(buf).map_err(|(e, buf)| (e, Some(buf)))
        };
        let fifth = post(qp.pd()).err().map(|(e, _)| e);
        // A buffer of another PD (its local key is that PD's) is refused.
        let foreign = Pd::alloc(qp.device())
            .map_err(|e| (e, None))
            .and_then(|other_pd| post(&other_pd))
            .err()
            .map(|(e, _)| e);
        // Destroying the id shuts the QP down, flushing the four receives;
        // the room goes with the QP.
        drop(id);
        let late = post(qp.pd()).err().map(|(e, _)| e);
        drop(qp);
        let free_at_end = cq.free_entries();
        // Nothing of the device is held past here: a failed assertion
        // ends the case without unwinding, and what it held would keep
        // the device's unregistration waiting for good.
        drop(cq);
        assert_eq!(too_small, Some(ENOSPC));
        assert_eq!(small_free, 9);
        assert_eq!(busy, Some(EBUSY));
        assert_eq!(full, 0);
        assert_eq!(posted, 4);
        assert_eq!(fifth, Some(ENOSPC));
        assert_eq!(foreign, Some(EINVAL));
        assert_eq!(late, Some(ENOTCONN));
        assert_eq!(free_at_end, 10);
    }

    /// A CQ pool places each QP on the CQ of its vector with the most
    /// room, and makes a CQ when none has room: two QPs that each fill a CQ
    /// on vector 0 get two CQs, one on vector 1 (when the device has two) a
    /// third; once the first QP is gone, a fourth goes on its CQ again.
    /// `ENOSPC` from the placement tries the next CQ, then a new one (not
    /// kept if it refuses too); another error is returned as it is; a pool
    /// of no entries or of direct CQs is refused.
    #[test]
    fn cq_pool_places_qps_by_room_and_vector() {
        let caps = QpCaps {
            max_send_wr: 2,
            max_recv_wr: 2,
            ..QpCaps::default()
        };
        let mut ids = KVec::new();
        for _ in 0..4 {
            let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
            if let Err(e) = id.with_lock(|l| l.bind(&rxe_addr())) {
                super::skip_without_devices(e);
                return;
            }
            ids.push(Some(id), GFP_KERNEL).unwrap();
        }
        let made = ids[0].as_ref().unwrap().with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let entries = caps.cq_entries()?;
            let refused = (
                CqPool::new(&dev, 0, PollContext::Workqueue, Nop).err(),
                CqPool::new(&dev, entries, PollContext::Direct, Nop).err(),
            );
            let pool = CqPool::new(&dev, entries, PollContext::Workqueue, Nop)?;
            Ok((dev.num_comp_vectors(), pd, entries, refused, pool))
        });
        let (vectors, pd, entries, refused, pool) = match made {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        // Creates a QP for `ids[i]` through the pool on `vector`: the CQ's
        // index and vector, and the QP.
        let place = |ids: &KVec<Option<CmId<Nop>>>, i: usize, vector: u32| {
            let id = ids[i].as_ref().ok_or(EINVAL)?;
            id.with_lock(|l| {
                pool.with_cq(entries, Some(vector), |index, cq| {
                    let qp = l.create_qp(&pd, cq, caps)?;
                    Ok((index, cq.comp_vector(), qp))
                })
            })
        };
        let first = place(&ids, 0, 0).map(|(i, v, qp)| (i, v, Some(qp)));
        let second = place(&ids, 1, 0).map(|(i, v, qp)| (i, v, Some(qp)));
        let third = place(&ids, 2, 1).map(|(i, v, qp)| (i, v, Some(qp)));
        let made_three = pool.len();
        // Another error than ENOSPC comes back as it is, the CQ made for
        // it not kept.
        let other_error = pool
            .with_cq(entries, Some(0), |_, _| Err::<(), _>(EPERM))
            .err();
        let after_error = pool.len();
        // The first QP goes with its id: its CQ has room again.
        let first = first.map(|(i, v, _)| (i, v));
        ids[0] = None;
        let fourth = place(&ids, 3, 0).map(|(i, v, _)| (i, v));
        // ENOSPC moves on to the next CQ of the vector (both have the
        // room asked for, none), and from the last to a new one, not kept
        // when that refuses too.
        let next = pool.with_cq(0, Some(0), |i, _| if i == 0 { Err(ENOSPC) } else { Ok(i) });
        let tried = pool.with_cq(0, Some(0), |_, _| Err::<(), _>(ENOSPC)).err();
        let made_in_all = pool.len();
        let second = second.map(|(i, v, _)| (i, v));
        let third = third.map(|(i, v, _)| (i, v));
        drop((ids, pool, pd));
        assert_eq!(refused, (Some(EINVAL), Some(EINVAL)));
        assert_eq!(first, Ok((0, 0)));
        assert_eq!(second, Ok((1, 0)));
        assert_eq!(third, Ok((2, 1 % vectors.max(1))));
        assert_eq!(made_three, 3);
        assert_eq!(other_error, Some(EPERM));
        assert_eq!(after_error, 3);
        assert_eq!(fourth, Ok((0, 0)));
        assert_eq!(next, Ok(1));
        assert_eq!(tried, Some(ENOSPC));
        assert_eq!(made_in_all, 3);
    }

    /// A QP whose queues complete on two CQs reserves each queue's
    /// requests and its spare entry on that queue's CQ, and a failed
    /// reservation on either takes nothing from the other.
    #[test]
    fn split_cqs_reserve_room_per_queue() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 6,
            max_inline_data: 0,
            ..QpCaps::default()
        };
        let made = id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let send_cq = Cq::alloc(&dev, caps.send_cq_entries()?, Nop)?;
            let recv_cq = Cq::alloc(&dev, caps.recv_cq_entries()?, Nop)?;
            let small_send = Cq::alloc(&dev, caps.send_cq_entries()? - 1, Nop)?;
            let small_recv = Cq::alloc(&dev, caps.recv_cq_entries()? - 1, Nop)?;
            let send_too_small = l.create_qp_with_cqs(&pd, &small_send, &recv_cq, caps).err();
            let recv_too_small = l.create_qp_with_cqs(&pd, &send_cq, &small_recv, caps).err();
            let free_after_failures = (send_cq.free_entries(), recv_cq.free_entries());
            let qp = l.create_qp_with_cqs(&pd, &send_cq, &recv_cq, caps)?;
            Ok((
                send_too_small,
                recv_too_small,
                free_after_failures,
                send_cq,
                recv_cq,
                qp,
            ))
        });
        let (send_too_small, recv_too_small, free_after_failures, send_cq, recv_cq, qp) = match made
        {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        let full = (send_cq.free_entries(), recv_cq.free_entries());
        let post = || {
            let buf = RecvBuffer::new(qp.pd(), 8).map_err(|e| (e, None))?;
            qp.post_recv(buf).map_err(|(e, buf)| (e, Some(buf)))
        };
        let posted = (0..6).filter(|_| post().is_ok()).count();
        let seventh = post().err().map(|(e, _)| e);
        drop(id);
        drop(qp);
        let free_at_end = (send_cq.free_entries(), recv_cq.free_entries());
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((send_cq, recv_cq));
        assert_eq!(
            (caps.send_cq_entries(), caps.recv_cq_entries()),
            (Ok(5), Ok(7))
        );
        assert_eq!(send_too_small, Some(ENOSPC));
        assert_eq!(recv_too_small, Some(ENOSPC));
        assert_eq!(free_after_failures, (5, 7));
        assert_eq!(full, (0, 0));
        assert_eq!(posted, 6);
        assert_eq!(seventh, Some(ENOSPC));
        assert_eq!(free_at_end, (5, 7));
    }

    /// Counts the receives handed back flushed.
    struct CountFlushed(AtomicU32);
    impl CompletionHandler for CountFlushed {
        fn recv_done(&self, _buf: RecvBuffer, result: Result<usize>) {
            if result == Err(ECANCELED) {
                self.0.fetch_add(1, Ordering::AcqRel);
            }
        }
        fn send_done(&self, _buf: SendBuffer, _result: Result) {}
    }

    /// The id's destruction hands every posted buffer back to the
    /// completion handler, flushed, before it returns.
    #[test]
    fn teardown_hands_back_every_posted_buffer() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let made = id.with_lock(|l| {
            let caps = QpCaps {
                max_send_wr: 2,
                max_recv_wr: 6,
                max_inline_data: 0,
                ..QpCaps::default()
            };
            let (pd, cq) = pd_and_cq_on_rxe(l, caps, CountFlushed(AtomicU32::new(0)))?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            for _ in 0..6 {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(|(e, _)| e)?;
            }
            Ok((cq, qp))
        });
        let (cq, qp) = match made {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        drop(id);
        let flushed = cq.handler().0.load(Ordering::Acquire);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((qp, cq));
        assert_eq!(flushed, 6);
    }

    /// A CQ is bound to one of the device's completion vectors (one past
    /// them is `EINVAL`) and may be polled from the unbound workqueue: a
    /// QP's teardown hands every posted buffer back through it, flushed.
    #[test]
    fn cq_on_the_last_vector_polled_unbound() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let made = id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            let dev = l.device()?;
            let vectors = dev.num_comp_vectors();
            let last = vectors.checked_sub(1).ok_or(ENODEV)?;
            let beyond = Cq::alloc_with(&dev, 8, vectors, PollContext::Workqueue, Nop).err();
            let caps = QpCaps {
                max_send_wr: 2,
                max_recv_wr: 6,
                max_inline_data: 0,
                ..QpCaps::default()
            };
            let counter = CountFlushed(AtomicU32::new(0));
            let unbound = PollContext::UnboundWorkqueue;
            let cq = Cq::alloc_with(&dev, caps.cq_entries()?, last, unbound, counter)?;
            let pd = Pd::alloc(&dev)?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            for _ in 0..6 {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(|(e, _)| e)?;
            }
            Ok((last, beyond, cq, qp))
        });
        let (last, beyond, cq, qp) = match made {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        let placed = (cq.comp_vector(), cq.poll_context());
        // Its workqueue polls it: nobody else may, nor may a loop.
        let polled = cq.poll(8);
        let looped = BusyPoller::new().map(|poller| poller.start(&cq).err());
        drop(id);
        let flushed = cq.handler().0.load(Ordering::Acquire);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((qp, cq));
        assert_eq!(beyond, Some(EINVAL));
        assert_eq!(placed, (last, PollContext::UnboundWorkqueue));
        assert_eq!(polled, Err(EINVAL));
        assert_eq!(looped, Ok(Some(EINVAL)));
        assert_eq!(flushed, 6);
    }

    /// The one-VM test bed puts siw at 203.0.113.1, next to rxe.
    fn siw_addr() -> SocketAddr {
        SocketAddr::V4 {
            ip: [203, 0, 113, 1],
            port: 0,
        }
    }

    /// Objects of two devices never meet: a QP of rxe refuses a CQ or PD
    /// of siw, and buffers and regions of siw (rxe's `to_rcq` on a siw CQ
    /// would take a reference inside an unrelated object; a buffer mapped
    /// for one device means nothing to another).
    #[test]
    fn objects_of_two_devices_never_meet() {
        let on_siw = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let siw = on_siw.with_lock(|l| {
            l.bind(&siw_addr())?;
            l.device()
        });
        let siw = match siw {
            Ok(siw) => siw,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let caps = QpCaps {
            max_send_wr: 2,
            max_recv_wr: 2,
            max_inline_data: 0,
            ..QpCaps::default()
        };
        let made = id.with_lock(|l| {
            l.bind(&rxe_addr())?;
            let rxe = l.device()?;
            let (pd_rxe, pd_siw) = (Pd::alloc(&rxe)?, Pd::alloc(&siw)?);
            let cq_rxe = Cq::alloc(&rxe, caps.cq_entries()?, Nop)?;
            let cq_siw = Cq::alloc(&siw, caps.cq_entries()?, Nop)?;
            let foreign_pd = l.create_qp(&pd_siw, &cq_rxe, caps).err();
            let foreign_cq = l.create_qp(&pd_rxe, &cq_siw, caps).err();
            let foreign_recv_cq = l.create_qp_with_cqs(&pd_rxe, &cq_rxe, &cq_siw, caps).err();
            let foreign_send_cq = l.create_qp_with_cqs(&pd_rxe, &cq_siw, &cq_rxe, caps).err();
            let qp = l.create_qp(&pd_rxe, &cq_rxe, caps)?;
            Ok((
                rxe,
                foreign_pd,
                foreign_cq,
                (foreign_recv_cq, foreign_send_cq),
                qp,
                pd_siw,
            ))
        });
        let (rxe, foreign_pd, foreign_cq, foreign_split, qp, pd_siw) = match made {
            Ok(made) => made,
            Err(e) => {
                super::skip_without_devices(e);
                return;
            }
        };
        let post_buffers = || -> Result<(Option<Error>, Option<Error>)> {
            let recv = qp.post_recv(RecvBuffer::new(&pd_siw, 64)?);
            let mut send = SendBuffer::new(&pd_siw, 64)?;
            send.fill(b"x")?;
            let send = qp.post_send(send);
            Ok((recv.err().map(|(e, _)| e), send.err().map(|(e, _)| e)))
        };
        let posts = post_buffers();
        let registered = crate::rdma::mr::Mr::new(&pd_siw, 4096).map(|mr| {
            let refused = qp.register(&mr, crate::rdma::mr::MrAccess::LOCAL, 1).err();
            (refused, mr.is_registered())
        });
        let devices = (rxe.same(&siw), rxe.same(qp.device()));
        // Nothing of the devices held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((qp, pd_siw, rxe, siw));
        drop(id);
        drop(on_siw);
        assert_eq!(devices, (false, true));
        assert_eq!(foreign_pd, Some(EXDEV));
        assert_eq!(foreign_cq, Some(EXDEV));
        assert_eq!(foreign_split, (Some(EXDEV), Some(EXDEV)));
        assert_eq!(posts, Ok((Some(EXDEV), Some(EXDEV))));
        assert_eq!(registered, Ok((Some(EXDEV), false)));
    }

    /// What the slow handler below made, shared with the test.
    #[pin_data]
    struct Made {
        #[pin]
        qp: Mutex<Option<Arc<Qp<Nop>>>>,
        started: AtomicBool,
        finished: AtomicBool,
    }

    /// Creates a QP from inside ROUTE_RESOLVED, slowly.
    struct SlowQpMaker(Arc<Made>);
    impl Handler for SlowQpMaker {
        fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
            if event.kind() != EventType::RouteResolved {
                return;
            }
            self.0.started.store(true, Ordering::Release);
            // Long enough for the owner to start destroying the id.
            fsleep(ms(500));
            let made = (|| -> Result<Arc<Qp<Nop>>> {
                let dev = id.device()?;
                let pd = Pd::alloc(&dev)?;
                let caps = QpCaps {
                    max_send_wr: 2,
                    max_recv_wr: 2,
                    max_inline_data: 0,
                    ..QpCaps::default()
                };
                let cq = Cq::alloc(&dev, caps.cq_entries()?, Nop)?;
                id.create_qp(&pd, &cq, caps)
            })();
            if let Ok(qp) = made {
                *self.0.qp.lock() = Some(qp);
            }
            self.0.finished.store(true, Ordering::Release);
        }
    }

    /// A handler that creates the id's QP while the owner destroys the id:
    /// the destruction must wait for it and tear that QP down, or the QP
    /// outlives the id (its PD, CQ and device references with it, and
    /// `rdma link delete` hangs).
    #[test]
    fn destroy_tears_down_a_qp_made_meanwhile() {
        let made = Arc::pin_init(
            pin_init!(Made {
                qp <- new_mutex!(None),
                started: AtomicBool::new(false),
                finished: AtomicBool::new(false),
            }),
            GFP_KERNEL,
        )
        .unwrap();
        let id = CmId::new(
            SlowQpMaker(made.clone()),
            &NetNs::init(),
            PortSpace::Tcp,
            QpType::Rc,
        )
        .unwrap();
        let dst = SocketAddr::V4 {
            ip: [192, 0, 2, 1],
            port: 7,
        };
        if let Err(e) = id.with_lock(|l| l.resolve_addr(None, &dst, ms(2000))) {
            super::skip_without_devices(e);
            return;
        }
        // ADDR_RESOLVED comes first; then resolve the route.
        let mut routed = Err(EAGAIN);
        for _ in 0..200 {
            fsleep(ms(10));
            routed = id.with_lock(|l| l.resolve_route(ms(2000)));
            if routed.is_ok() {
                break;
            }
        }
        // Asserted once the id and the QP are gone: a failed assertion
        // ends the case where it stands, and an id left behind would
        // hold its device (`rdma link delete` would wait for ever).
        let routed = routed.is_ok();
        for _ in 0..500 {
            if !routed || made.started.load(Ordering::Acquire) {
                break;
            }
            fsleep(ms(10));
        }
        let started = made.started.load(Ordering::Acquire);
        // The handler is asleep inside its callback: destroy now.
        drop(id);
        let finished = made.finished.load(Ordering::Acquire);
        let qp = made.qp.lock().take();
        let made_qp = qp.is_some();
        let posted = qp.as_ref().map(|qp| match RecvBuffer::new(qp.pd(), 8) {
            Ok(buf) => qp.post_recv(buf).err().map(|(e, _)| e),
            Err(e) => Some(e),
        });
        drop(qp);
        assert!(routed);
        assert!(started);
        assert!(finished);
        assert!(made_qp);
        assert_eq!(posted, Some(Some(ENOTCONN)));
    }

    /// Drops another id from inside its event handler, and tries to lock
    /// it there first.
    struct DropsOther {
        victim: Pin<KBox<Mutex<Option<CmId<Nop>>>>>,
        locked: Pin<KBox<Mutex<Option<Result>>>>,
        fired: AtomicBool,
    }
    impl Handler for DropsOther {
        fn event(&self, _id: &LockedId<'_>, _event: &Event<'_>) {
            let victim = self.victim.lock().take();
            if let Some(victim) = &victim {
                *self.locked.lock() = Some(victim.with_lock(|_| Ok(())));
            }
            drop(victim);
            self.fired.store(true, Ordering::Release);
        }
    }

    /// Dropping another id inside a callback defers its destruction
    /// (synchronously it would nest two handler mutexes of one lock class,
    /// which lockdep reports and the dmesg gate fails on); locking it there
    /// is refused for the same reason.
    #[test]
    fn another_id_in_a_callback_is_neither_locked_nor_destroyed() {
        let victim = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc);
        assert!(victim.is_ok());
        let Ok(victim) = victim else { return };
        let slot = KBox::pin_init(new_mutex!(Some(victim)), GFP_KERNEL);
        assert!(slot.is_ok());
        let Ok(slot) = slot else { return };
        let locked = KBox::pin_init(new_mutex!(None), GFP_KERNEL).unwrap();
        let handler = DropsOther {
            victim: slot,
            locked,
            fired: AtomicBool::new(false),
        };
        let id = CmId::new(handler, &NetNs::init(), PortSpace::Tcp, QpType::Rc);
        assert!(id.is_ok());
        let Ok(id) = id else { return };
        let dst = SocketAddr::V4 {
            ip: [192, 0, 2, 1],
            port: 7,
        };
        if let Err(e) = id.with_lock(|l| l.resolve_addr(None, &dst, ms(2000))) {
            super::skip_without_devices(e);
            return;
        }
        for _ in 0..5000 {
            if id.handler().fired.load(Ordering::Acquire) {
                break;
            }
            fsleep(ms(1));
        }
        // Asserted after the drops: an id left behind by a failed
        // assertion would hold its device.
        let fired = id.handler().fired.load(Ordering::Acquire);
        let victim_gone = id.handler().victim.lock().is_none();
        let locked = *id.handler().locked.lock();
        let flushed = flush_deferred_destroys();
        drop(id);
        assert!(fired);
        assert!(victim_gone);
        assert_eq!(locked, Some(Err(EDEADLK)));
        assert_eq!(flushed, Ok(()));
    }

    /// `with_lock` holds the mutex as a callback does: nested on the same
    /// id it runs directly (a second `rdma_lock_handler` would hang), on
    /// another id it is refused (two handler mutexes of one lock class),
    /// and a flush there is refused (a queued destruction may wait for it).
    #[test]
    fn nested_with_lock() {
        let a = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let b = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let (same, other, flush) = a
            .with_lock(|_| {
                Ok((
                    a.with_lock(|_| Ok(())),
                    b.with_lock(|_| Ok(())),
                    flush_deferred_destroys(),
                ))
            })
            .unwrap();
        assert_eq!(same, Ok(()));
        assert_eq!(other, Err(EDEADLK));
        assert_eq!(flush, Err(EDEADLK));
        // Outside, both lock again.
        assert_eq!(b.with_lock(|_| Ok(())), Ok(()));
        assert_eq!(a.with_lock(|_| Ok(())), Ok(()));
    }

    #[test]
    fn namespace_references() {
        let init = NetNs::init();
        assert!(init.is_init());
        // KUnit runs in a kernel thread of the initial namespace.
        let current = NetNs::current().unwrap();
        assert!(current.is_init());
        let copy = current.clone();
        drop(current);
        assert!(copy.is_init());
        let id = CmId::new(Nop, &copy, PortSpace::Tcp, QpType::Rc);
        // The id keeps its own reference: dropping ours first is fine.
        drop(copy);
        assert!(id.is_ok());
        drop(id);
    }

    #[test]
    fn bind_to_wildcard_any_port() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let any = SocketAddr::any(crate::rdma::addr::AF_INET, 0).unwrap();
        let (first, src, second, afonly_bound) = id
            .with_lock(|l| {
                Ok((
                    l.bind(&any),
                    l.src_addr(),
                    l.bind(&any),
                    l.set_afonly(false),
                ))
            })
            .unwrap();
        let listen = id.listen(1);
        let (afonly_listening, reuse_listening) = id
            .with_lock(|l| Ok((l.set_afonly(true), l.set_reuseaddr(true))))
            .unwrap();
        assert!(first.is_ok());
        // The CM picked a port; binding again fails.
        assert!(src.map(|a| a.port() != 0).unwrap_or(false));
        assert!(second.is_err());
        // AFONLY is taken while idle or bound, REUSEADDR until listening.
        assert!(afonly_bound.is_ok());
        assert!(listen.is_ok());
        assert!(afonly_listening.is_err());
        assert!(reuse_listening.is_err());
    }
}

#[kunit_tests(rdma_cm_rs_ud)]
mod ud_tests {
    use super::{take_out, wait_until, Checks};
    use crate::rdma::{
        addr::SocketAddr,
        ah::{UdDest, GRH_SIZE},
        cm::*,
        conn_param::ConnParam,
        event::*,
        net::NetNs,
        pd::Pd,
        sg::SgBuffer,
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

    fn ms(ms: i64) -> Delta {
        Delta::from_millis(ms)
    }

    /// Datagrams one side received, its sends' completions, and the
    /// completions that reached a CQ not of their queue.
    #[pin_data]
    struct Inbox {
        #[pin]
        got: Mutex<KVec<RecvBuffer>>,
        sent: AtomicU32,
        misrouted: AtomicU32,
    }

    /// Which completions a CQ's handler is for.
    #[derive(Clone, Copy, PartialEq)]
    enum Takes {
        Both,
        Sends,
        Recvs,
    }

    struct InboxRef(Arc<Inbox>, Takes);
    impl CompletionHandler for InboxRef {
        fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
            if self.1 == Takes::Sends {
                self.0.misrouted.fetch_add(1, Ordering::AcqRel);
            }
            if result.is_ok() {
                let _ = self.0.got.lock().push(buf, GFP_KERNEL);
            }
        }
        fn send_done(&self, _buf: SendBuffer, result: Result) {
            if self.1 == Takes::Recvs {
                self.0.misrouted.fetch_add(1, Ordering::AcqRel);
            }
            if result.is_ok() {
                self.0.sent.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    struct Side {
        qp: Arc<Qp<InboxRef>>,
        inbox: Arc<Inbox>,
    }

    /// How a side's receives take a datagram.
    #[derive(Clone, Copy)]
    enum Receives {
        /// Into 256 bytes of buffer.
        Buffer,
        /// The global route header and [`ROOM`] bytes into the buffer, the
        /// rest into a page.
        HeaderThenPage,
    }

    /// The payload a [`Receives::HeaderThenPage`] buffer takes before the
    /// page.
    const ROOM: usize = 16;

    /// Makes a UD QP on a locked id, with receives posted: its queues
    /// complete on one CQ, or with `split` on a CQ each.
    fn side(l: &LockedId<'_>, split: bool, receives: Receives) -> Result<Side> {
        let dev = l.device()?;
        let pd = Pd::alloc(&dev)?;
        let inbox = Arc::pin_init(
            pin_init!(Inbox {
                got <- new_mutex!(KVec::new()),
                sent: AtomicU32::new(0),
                misrouted: AtomicU32::new(0),
            }),
            GFP_KERNEL,
        )?;
        let caps = QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_inline_data: 0,
            max_send_sge: 2,
            max_recv_sge: 2,
            ..QpCaps::default()
        };
        let qp = if split {
            let handler = |takes| InboxRef(inbox.clone(), takes);
            let send_cq = Cq::alloc(&dev, caps.send_cq_entries()?, handler(Takes::Sends))?;
            let recv_cq = Cq::alloc(&dev, caps.recv_cq_entries()?, handler(Takes::Recvs))?;
            l.create_qp_with_cqs(&pd, &send_cq, &recv_cq, caps)?
        } else {
            let cq = Cq::alloc(
                &dev,
                caps.cq_entries()?,
                InboxRef(inbox.clone(), Takes::Both),
            )?;
            l.create_qp(&pd, &cq, caps)?
        };
        for _ in 0..4 {
            let buf = match receives {
                Receives::Buffer => RecvBuffer::new(&pd, 256)?,
                Receives::HeaderThenPage => {
                    let mut buf = RecvBuffer::new(&pd, GRH_SIZE + ROOM)?;
                    buf.attach_pages(SgBuffer::new(4096)?);
                    buf
                }
            };
            qp.post_recv(buf).map_err(|(e, _)| e)?;
        }
        Ok(Side { qp, inbox })
    }

    /// What the handlers saw and made, for the test thread.
    #[derive(Default)]
    struct Seen {
        server: Option<CmId<UdNode>>,
        server_side: Option<Side>,
        request_data: usize,
        accept_137: Option<Error>,
        accept_again: Option<Error>,
        client_side: Option<Side>,
        connect_181: Option<Error>,
        dest: Option<Result<UdDest>>,
    }

    #[pin_data]
    struct World {
        #[pin]
        seen: Mutex<Seen>,
    }

    struct UdNode {
        world: Arc<World>,
        client: bool,
    }

    impl Handler for UdNode {
        fn event(&self, id: &LockedId<'_>, event: &Event<'_>) {
            if !self.client {
                return;
            }
            let mut seen = self.world.seen.lock();
            match event.kind() {
                EventType::AddrResolved => {
                    if let Err(e) = id.resolve_route(ms(2000)) {
                        seen.dest = Some(Err(e));
                    }
                }
                EventType::RouteResolved => {
                    let connected = side(id, false, Receives::HeaderThenPage).and_then(|side| {
                        seen.connect_181 = ConnParam::new()
                            .private_data(&[0x5a; 181])
                            .and_then(|p| id.connect(&p))
                            .err();
                        seen.client_side = Some(side);
                        id.connect(&ConnParam::new().private_data(&[0x5a; 180])?)
                    });
                    if let Err(e) = connected {
                        seen.dest = Some(Err(e));
                    }
                }
                EventType::Established => {
                    let dest = match &seen.client_side {
                        Some(side) => id.ud_dest(event, side.qp.pd()),
                        None => Err(ENOTCONN),
                    };
                    seen.dest = Some(dest);
                }
                _ => seen.dest = Some(Err(event.result().err().unwrap_or(EPROTO))),
            }
        }

        fn connect_request(&self, request: ConnectRequest<'_, Self>, event: &Event<'_>) {
            let data = event.ud_param().map_or(0, |ud| ud.private_data().len());
            let Ok(server) = request.adopt(UdNode {
                world: self.world.clone(),
                client: false,
            }) else {
                return;
            };
            let made = server.with_lock(|l| {
                // The server's QP completes its sends and its receives
                // on a CQ each.
                let side = side(l, true, Receives::Buffer)?;
                let refused = ConnParam::new()
                    .private_data(&[0xa5; 137])
                    .and_then(|p| l.accept(Some(&p)))
                    .err();
                l.accept(Some(&ConnParam::new().private_data(&[0xa5; 136])?))?;
                // The SIDR reply left the CM's state alone: a second
                // answer would fail there and put the QP in error.
                let again = l.accept(None).err();
                Ok((side, refused, again))
            });
            let mut seen = self.world.seen.lock();
            seen.request_data = data;
            if let Ok((side, refused, again)) = made {
                seen.server_side = Some(side);
                seen.accept_137 = refused;
                seen.accept_again = again;
            }
            // Kept by the test, which drops it (an id in its own world
            // would keep itself alive).
            seen.server = Some(server);
        }
    }

    /// A datagram gathered from a header and a page, to a receive that
    /// scatters it over the header's room in its buffer and a page; and
    /// one a byte above the MTU, its page counted, refused.  Returns the
    /// receive, for the caller to drop with the rest.
    fn paged_datagram(
        c: &mut Checks,
        server_qp: &Arc<Qp<InboxRef>>,
        server_inbox: &Inbox,
        client_inbox: &Inbox,
        back: &UdDest,
    ) -> Option<RecvBuffer> {
        let pd = server_qp.pd();
        let max = server_qp.max_datagram();
        let mut oversize = SendBuffer::new(pd, ROOM).unwrap();
        oversize.fill(&[0x48; ROOM]).unwrap();
        oversize.attach_pages(SgBuffer::new(max - ROOM + 1).unwrap());
        let refused = server_qp.post_send_ud(oversize, back).err().map(|(e, _)| e);
        c.eq(
            "a datagram of a header and a page above the MTU",
            refused,
            Some(EMSGSIZE),
        );

        let header = b"paged datagram: ";
        let paged_len = (max - ROOM).min(900);
        let mut bytes = KVec::new();
        for i in 0..paged_len {
            bytes.push((i * 7 % 251) as u8, GFP_KERNEL).unwrap();
        }
        let mut pages = SgBuffer::new(paged_len).unwrap();
        pages.write(0, &bytes).unwrap();
        let mut send = SendBuffer::new(pd, ROOM).unwrap();
        send.fill(header).unwrap();
        send.attach_pages(pages);
        let sent = server_qp.post_send_ud(send, back).err().map(|(e, _)| e);
        if !c.eq("the paged datagram's post", sent, None) {
            return None;
        }
        let mut got = None;
        wait_until(|| {
            got = take_one(client_inbox);
            got.is_some()
        });
        let Some(got) = got else {
            c.check("the paged datagram arrived within 5 s", false);
            return None;
        };
        c.eq("its header, in the buffer", got.data(), header.as_slice());
        c.eq("its bytes in the page", got.paged_len(), paged_len);
        let mut arrived = KVec::new();
        arrived.resize(paged_len, 0u8, GFP_KERNEL).unwrap();
        let read = got.pages().map(|p| p.read(0, &mut arrived));
        c.eq("the page came back with the receive", read, Some(Ok(())));
        c.check("the page holds what was sent", arrived[..] == bytes[..]);
        let sent_back = wait_until(|| server_inbox.sent.load(Ordering::Acquire) == 2);
        c.check("the paged datagram's send completed", sent_back);
        Some(got)
    }

    fn take_one(inbox: &Inbox) -> Option<RecvBuffer> {
        let mut got = inbox.got.lock();
        if got.is_empty() {
            None
        } else {
            got.remove(0).ok()
        }
    }

    /// A UD service in the kernel: a SIDR lookup answered by an adopted
    /// id's UD QP; a datagram with immediate data to the destination the
    /// reply named; the answer to its sender through `reply_dest`; the
    /// SIDR private-data limits (180 and 136) refused one byte above, a
    /// second accept refused without harming the accepted id's QP, and a
    /// datagram above the MTU and an unsignaled one refused.  The server's
    /// QP completes on a send and a receive CQ: each handler gets its own
    /// queue's completions only, the flushed ones of the teardown included.
    #[test]
    fn sidr_lookup_and_datagrams_both_ways() {
        let mut checks = Checks::new();
        sidr_exchange(&mut checks);
        assert_eq!(checks.failures(), 0);
    }

    /// The body of [`sidr_lookup_and_datagrams_both_ways`]: everything of
    /// the device it makes is dropped when it returns.
    fn sidr_exchange(c: &mut Checks) {
        let world = Arc::pin_init(
            pin_init!(World {
                seen <- new_mutex!(Seen::default()),
            }),
            GFP_KERNEL,
        )
        .unwrap();
        let node = |client| UdNode {
            world: world.clone(),
            client,
        };
        let ns = NetNs::init();
        let addr = SocketAddr::V4 {
            ip: [192, 0, 2, 1],
            port: 7183,
        };
        let listener = CmId::new(node(false), &ns, PortSpace::Udp, QpType::Ud).unwrap();
        if let Err(e) = listener.with_lock(|l| l.bind(&addr)) {
            super::skip_without_devices(e);
            return;
        }
        if !c.eq("listen", listener.listen(4), Ok(())) {
            return;
        }
        let client = CmId::new(node(true), &ns, PortSpace::Udp, QpType::Ud).unwrap();
        let resolving = client.with_lock(|l| l.resolve_addr(None, &addr, ms(2000)));
        if !c.eq("the client's resolve_addr", resolving, Ok(())) {
            return;
        }
        // The SIDR reply leaves inside the server's handler, which records
        // its side afterwards: the client may have its destination first.
        let looked_up = wait_until(|| {
            let seen = world.seen.lock();
            match &seen.dest {
                Some(Ok(_)) => seen.server.is_some(),
                Some(Err(_)) => true,
                None => false,
            }
        });
        let (dest, client_qp, client_inbox, server_qp, server_inbox, data, a137, again, c181) = {
            let mut seen = world.seen.lock();
            let client_side = seen.client_side.take();
            let server_side = seen.server_side.take();
            (
                seen.dest.take(),
                client_side.as_ref().map(|s| s.qp.clone()),
                client_side.map(|s| s.inbox),
                server_side.as_ref().map(|s| s.qp.clone()),
                server_side.map(|s| s.inbox),
                seen.request_data,
                seen.accept_137,
                seen.accept_again,
                seen.connect_181,
            )
        };
        // Which part is missing says where the exchange stopped (seen with
        // a kernel build beside the VM: the server's side missing, before
        // the wait above took the server's handler into account).
        let (client_made, server_made) = (client_qp.is_some(), server_qp.is_some());
        let client_error = dest.as_ref().map(|d| d.as_ref().err().copied());
        let (
            Some(Ok(dest)),
            Some(client_qp),
            Some(client_inbox),
            Some(server_qp),
            Some(server_inbox),
        ) = (dest, client_qp, client_inbox, server_qp, server_inbox)
        else {
            c.check("the SIDR reply within 5 s", looked_up);
            c.eq(
                "the SIDR exchange (the client's error, its QP made, the server's QP made)",
                (client_error, client_made, server_made),
                (Some(None), true, true),
            );
            drop(take_out(&world.seen, |seen| seen.server.take()));
            return;
        };
        c.eq("connect with 181 bytes", c181, Some(EINVAL));
        c.eq("accept with 137 bytes", a137, Some(EINVAL));
        c.eq("a second accept", again, Some(EINVAL));
        // The CM pads the SIDR request's private data to 180 bytes.
        c.eq("the request's private data", data, 180);
        c.eq("the reply's QP", dest.qp_num(), server_qp.qp_num());
        c.eq("the reply's Q_Key", dest.qkey(), server_qp.qkey());

        let pd = client_qp.pd();
        let mut zeros = KVec::new();
        zeros
            .resize(client_qp.max_datagram() + 1, 0u8, GFP_KERNEL)
            .unwrap();
        let mut big = SendBuffer::new(pd, zeros.len()).unwrap();
        big.fill(&zeros).unwrap();
        let refused = client_qp.post_send_ud(big, &dest).err().map(|(e, _)| e);
        c.eq("a datagram above the MTU", refused, Some(EMSGSIZE));
        // Selective signaling is RC's (the shutdown's marker is a WRITE).
        let mut quiet = SendBuffer::new(pd, 64).unwrap();
        quiet.set_unsignaled(true);
        let refused = client_qp.post_send_ud(quiet, &dest).err().map(|(e, _)| e);
        c.eq("an unsignaled datagram", refused, Some(EINVAL));

        let mut ping = SendBuffer::new(pd, 64).unwrap();
        ping.fill(b"ud ping").unwrap();
        ping.set_imm(Some(client_qp.qp_num()));
        let sent = client_qp.post_send_ud(ping, &dest).err().map(|(e, _)| e);
        // The send holds the address handle: the consumer's copy may go.
        drop(dest);
        let mut got = None;
        if c.eq("the ping's post", sent, None) {
            wait_until(|| {
                got = take_one(&server_inbox);
                got.is_some()
            });
        }
        let mut answer = None;
        let mut back_dest = None;
        if let Some(got) = &got {
            c.eq("the ping", got.data(), b"ud ping".as_slice());
            c.eq("its immediate data", got.imm(), Some(client_qp.qp_num()));
            c.eq(
                "its source QP",
                got.datagram().map(|d| d.src_qp()),
                Some(client_qp.qp_num()),
            );
            c.eq(
                "the datagram's immediate data",
                got.datagram().and_then(|d| d.imm()),
                Some(client_qp.qp_num()),
            );
            match server_qp.reply_dest(got) {
                Ok(back) => {
                    c.eq("the reply's destination", back.qp_num(), client_qp.qp_num());
                    let mut pong = SendBuffer::new(server_qp.pd(), 64).unwrap();
                    pong.fill(b"ud pong").unwrap();
                    let sent = server_qp.post_send_ud(pong, &back).err().map(|(e, _)| e);
                    if c.eq("the pong's post", sent, None) {
                        wait_until(|| {
                            answer = take_one(&client_inbox);
                            answer.is_some()
                        });
                    }
                    back_dest = Some(back);
                }
                Err(e) => {
                    c.eq("reply_dest", Err(e), Ok(()));
                }
            }
        } else {
            c.check("the ping arrived within 5 s", false);
        }
        if let Some(answer) = &answer {
            c.eq("the pong", answer.data(), b"ud pong".as_slice());
            c.eq("the pong's bytes in the page", answer.paged_len(), 0);
            c.eq("its immediate data", answer.imm(), None);
            c.eq(
                "its source QP",
                answer.datagram().map(|d| d.src_qp()),
                Some(server_qp.qp_num()),
            );
            let both_sent = wait_until(|| {
                client_inbox.sent.load(Ordering::Acquire) == 1
                    && server_inbox.sent.load(Ordering::Acquire) == 1
            });
            c.check("each side's send completed", both_sent);
        } else if got.is_some() {
            c.check("the pong arrived within 5 s", false);
        }
        let paged = match (&answer, &back_dest) {
            (Some(_), Some(back)) => {
                paged_datagram(c, &server_qp, &server_inbox, &client_inbox, back)
            }
            _ => None,
        };
        drop(back_dest);

        let server = world.seen.lock().server.take();
        drop((got, answer, paged));
        drop((client, server, listener));
        drop((client_qp, server_qp));
        // The server's three receives left were flushed by its id's
        // destruction: to the receive CQ's handler as well.
        c.eq(
            "the server's completions on the wrong CQ",
            server_inbox.misrouted.load(Ordering::Acquire),
            0,
        );
        c.eq(
            "the client's completions on the wrong CQ",
            client_inbox.misrouted.load(Ordering::Acquire),
            0,
        );
    }
}

#[kunit_tests(rdma_cm_rs_mr)]
mod mr_tests {
    use crate::rdma::{
        addr::SocketAddr,
        bindings,
        cm::*,
        device::Transport,
        event::Event,
        mr::*,
        net::NetNs,
        pd::Pd,
        sg::check_range,
        verbs::{CompletionHandler, Cq, QpCaps, RecvBuffer, SendBuffer, WorkOp},
        QpType,
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

    struct Nop;
    impl Handler for Nop {
        fn event(&self, _id: &LockedId<'_>, _event: &Event<'_>) {}
    }
    impl CompletionHandler for Nop {
        fn recv_done(&self, _buf: RecvBuffer, _result: Result<usize>) {}
        fn send_done(&self, _buf: SendBuffer, _result: Result) {}
    }

    /// On a device (the test VMs put rxe at 192.0.2.1): region limits, CPU
    /// copies, and a registration refused by a QP that is not connected,
    /// which must leave the region unregistered.
    #[test]
    fn regions_on_a_device() {
        let id = CmId::new(Nop, &NetNs::init(), PortSpace::Tcp, QpType::Rc).unwrap();
        let addr = SocketAddr::parse(b"192.0.2.1:0");
        assert!(addr.is_ok());
        let Ok(addr) = addr else { return };
        let made = id.with_lock(|l| {
            l.bind(&addr)?;
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let caps = QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_inline_data: 0,
                ..QpCaps::default()
            };
            let cq = Cq::alloc(&dev, caps.cq_entries()?, Nop)?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            Ok((pd, qp))
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
                qp.rdma(WorkOp::RdmaRead, &mr, 0, remote, 4),
                qp.rdma(WorkOp::Register, &mr, 0, remote, 5),
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

#[kunit_tests(rdma_cm_rs_sync)]
mod sync_tests {
    use super::{take_out, wait_closely_until, wait_until, Checks};
    use crate::rdma::{
        addr::SocketAddr,
        blocking::{EventWaiter, SyncOutcome},
        cm::*,
        conn_param::ConnParam,
        cq_pool::CqPool,
        event::*,
        mr::{Mr, MrAccess, RemoteRegion, MAX_MR_LEN},
        net::NetNs,
        pd::Pd,
        poller::BusyPoller,
        sg::SgBuffer,
        verbs::{
            CompletionHandler, Cq, PollContext, Qp, QpCaps, QpEvent, RecvBuffer, RwDone, RwOp,
            SendBuffer, Srq, SrqCaps, SrqEvent, SrqEvents, WorkDone, WorkOp, FLUSH_TIMEOUT,
        },
        QpType,
    };
    use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
    use kernel::{
        new_mutex,
        prelude::*,
        sync::{Arc, Mutex},
        time::{delay::fsleep, Delta, Instant, Monotonic},
        types::ScopeGuard,
        workqueue,
    };

    fn ms(ms: i64) -> Delta {
        Delta::from_millis(ms)
    }

    struct Nop;
    impl CompletionHandler for Nop {
        fn recv_done(&self, _buf: RecvBuffer, _result: Result<usize>) {}
        fn send_done(&self, _buf: SendBuffer, _result: Result) {}
    }

    /// What the listener adopted and the accepting work saw.
    #[derive(Default)]
    struct Seen {
        server: Option<Arc<CmId<Node>>>,
        accepted: Option<Result<SyncOutcome>>,
        /// REJECTED events of any id of the world.
        rejected: u32,
    }

    #[pin_data]
    struct World {
        #[pin]
        seen: Mutex<Seen>,
    }

    /// A listener (no waiter) or a synchronous id (a waiter).
    struct Node {
        world: Arc<World>,
        waiter: Option<Pin<KBox<EventWaiter>>>,
    }

    impl Node {
        fn synchronous(world: &Arc<World>) -> Result<Self> {
            Ok(Self {
                world: world.clone(),
                waiter: Some(KBox::pin_init(EventWaiter::new(), GFP_KERNEL)?),
            })
        }
    }

    impl Handler for Node {
        fn event(&self, _id: &LockedId<'_>, event: &Event<'_>) {
            if event.kind() == EventType::Rejected {
                self.world.seen.lock().rejected += 1;
            }
        }

        fn connect_request(&self, request: ConnectRequest<'_, Self>, _event: &Event<'_>) {
            let Ok(node) = Node::synchronous(&self.world) else {
                return;
            };
            if let Ok(id) = request.adopt(node) {
                if let Ok(id) = Arc::new(id, GFP_KERNEL) {
                    self.world.seen.lock().server = Some(id);
                }
            }
        }

        fn waiter(&self) -> Option<&EventWaiter> {
            self.waiter.as_deref()
        }
    }

    fn with_qp<H: Handler>(id: &CmId<H>) -> Result {
        id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let caps = QpCaps {
                max_send_wr: 2,
                max_recv_wr: 2,
                max_inline_data: 0,
                ..QpCaps::default()
            };
            let cq = Cq::alloc(&dev, caps.cq_entries()?, Nop)?;
            l.create_qp(&pd, &cq, caps).map(|_| ())
        })
    }

    /// A synchronous client of `world` with its address and route to
    /// `addr` resolved and a QP, ready to connect.
    fn ready_client(world: &Arc<World>, ns: &NetNs, addr: &SocketAddr) -> Result<CmId<Node>> {
        let client = CmId::new(Node::synchronous(world)?, ns, PortSpace::Tcp, QpType::Rc)?;
        client
            .resolve_addr_sync(None, addr, ms(2000), Some(ms(5000)))?
            .into_event()?;
        client
            .resolve_route_sync(ms(2000), Some(ms(5000)))?
            .into_event()?;
        with_qp(&client)?;
        Ok(client)
    }

    /// A world and a listener of it (no waiter) on rxe at `port`; `None`
    /// (the test skipped) without the device.
    fn listening(ns: &NetNs, port: u16) -> Option<(Arc<World>, CmId<Node>, SocketAddr)> {
        listening_at(ns, RXE_IP, port)
    }

    /// The address of the test VM's rxe device, and of its siw device.
    const RXE_IP: [u8; 4] = [192, 0, 2, 1];
    const SIW_IP: [u8; 4] = [203, 0, 113, 1];

    /// [`listening`] on the device at `ip`.
    fn listening_at(
        ns: &NetNs,
        ip: [u8; 4],
        port: u16,
    ) -> Option<(Arc<World>, CmId<Node>, SocketAddr)> {
        let world = Arc::pin_init(
            pin_init!(World {
                seen <- new_mutex!(Seen::default()),
            }),
            GFP_KERNEL,
        )
        .unwrap();
        let addr = SocketAddr::V4 { ip, port };
        let node = Node {
            world: world.clone(),
            waiter: None,
        };
        let listener = CmId::new(node, ns, PortSpace::Tcp, QpType::Rc).unwrap();
        if let Err(e) = listener.with_lock(|l| l.bind(&addr)) {
            super::skip_without_devices(e);
            return None;
        }
        listener.listen(4).unwrap();
        Some((world, listener, addr))
    }

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
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&ns, 7185) else {
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

        let client = CmId::new(
            Node::synchronous(&world).unwrap(),
            &ns,
            PortSpace::Tcp,
            QpType::Rc,
        )
        .unwrap();
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

        // The server accepts from a work item: its accept and the client's
        // connect block at once, each until its own ESTABLISHED.
        let w = world.clone();
        let spawned = workqueue::system().try_spawn(GFP_KERNEL, move || {
            let server = if wait_until(|| w.seen.lock().server.is_some()) {
                w.seen.lock().server.clone()
            } else {
                None
            };
            let accepted = server.ok_or(ENOENT).and_then(|server| {
                with_qp(&server)?;
                let param = ConnParam::new().private_data(b"from the server")?;
                server.accept_sync(Some(&param), Some(ms(5000)))
            });
            w.seen.lock().accepted = Some(accepted);
        });
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

    /// What a QP's handler saw of its QP's events and completions.
    #[derive(Default)]
    struct QpSeen {
        access_errors: AtomicU32,
        other_events: AtomicU32,
        /// Memory work that failed with `EACCES`.
        refused_work: AtomicU32,
        /// Receives that completed, and the key the last one invalidated
        /// (0: none).
        received: AtomicU32,
        invalidated_rkey: AtomicU32,
        /// Receives that came back flushed (`ECANCELED`).
        recvs_flushed: AtomicU32,
        /// The last receive's length and [`digest`].
        last_len: AtomicU32,
        last_digest: AtomicU32,
        /// The QP the last receive arrived on.
        last_qp_num: AtomicU32,
        /// Memory work that succeeded, that was flushed, and all of it.
        work_ok: AtomicU32,
        work_flushed: AtomicU32,
        work_back: AtomicU32,
        /// R/W transfers given back, the successful ones, and the
        /// [`digest`] of the last successful one's buffer.
        rw_back: AtomicU32,
        rw_ok: AtomicU32,
        rw_digest: AtomicU32,
        /// Send buffers given back, failed ones, and the first byte of
        /// the last eight given back (the latest in the low byte).
        sends_back: AtomicU32,
        sends_failed: AtomicU32,
        send_log: AtomicU64,
        /// `work_ok` when the last send was given back.
        work_ok_at_send: AtomicU32,
        /// Sends and receives given back with their pages attached.
        send_pages_back: AtomicU32,
        recv_pages_back: AtomicU32,
    }

    impl QpSeen {
        /// Whether the `n`th receive completed within 5 s, and the length
        /// and [`digest`] of the last one received by then.
        fn arrival(&self, n: u32) -> (bool, u32, u32) {
            let arrived = wait_until(|| self.received.load(Ordering::Acquire) == n);
            (
                arrived,
                self.last_len.load(Ordering::Acquire),
                self.last_digest.load(Ordering::Acquire),
            )
        }
    }

    /// FNV-1a of `bytes`: enough to tell a message from a damaged one.
    fn digest(bytes: &[u8]) -> u32 {
        digest_on(0x811c_9dc5, bytes)
    }

    /// [`digest`] of bytes that follow those whose digest is `h`.
    fn digest_on(h: u32, bytes: &[u8]) -> u32 {
        bytes
            .iter()
            .fold(h, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
    }

    /// The digest of the first `len` bytes of `pages`, following `h`.
    fn digest_pages(h: u32, pages: &SgBuffer, len: usize) -> Result<u32> {
        let mut bytes = KVec::new();
        bytes.resize(len, 0, GFP_KERNEL)?;
        if len > 0 {
            pages.read(0, &mut bytes)?;
        }
        Ok(digest_on(h, &bytes))
    }

    #[derive(Clone)]
    struct Recording(Arc<QpSeen>);

    impl CompletionHandler for Recording {
        fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
            if result == Err(ECANCELED) {
                self.0.recvs_flushed.fetch_add(1, Ordering::AcqRel);
            }
            if result.is_ok() {
                let rkey = buf.invalidated_rkey().unwrap_or(0);
                self.0.invalidated_rkey.store(rkey, Ordering::Release);
                // A message is the buffer's bytes, then what went into its
                // pages.
                let len = (buf.data().len() + buf.paged_len()) as u32;
                self.0.last_len.store(len, Ordering::Release);
                let mut h = digest(buf.data());
                if let Some(pages) = buf.pages() {
                    h = digest_pages(h, pages, buf.paged_len()).unwrap_or(0);
                    self.0.recv_pages_back.fetch_add(1, Ordering::AcqRel);
                }
                self.0.last_digest.store(h, Ordering::Release);
                let qp_num = buf.qp_num().unwrap_or(0);
                self.0.last_qp_num.store(qp_num, Ordering::Release);
                self.0.received.fetch_add(1, Ordering::AcqRel);
            }
        }
        fn send_done(&self, buf: SendBuffer, result: Result) {
            let first = u64::from(buf.data().first().copied().unwrap_or(0));
            let _ = self
                .0
                .send_log
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |log| {
                    Some(log << 8 | first)
                });
            if result.is_err() {
                self.0.sends_failed.fetch_add(1, Ordering::AcqRel);
            }
            let work_ok = self.0.work_ok.load(Ordering::Acquire);
            self.0.work_ok_at_send.store(work_ok, Ordering::Release);
            if buf.pages().is_some() {
                self.0.send_pages_back.fetch_add(1, Ordering::AcqRel);
            }
            self.0.sends_back.fetch_add(1, Ordering::AcqRel);
        }
        fn work_done(&self, _done: WorkDone, result: Result) {
            self.0.work_back.fetch_add(1, Ordering::AcqRel);
            if result == Err(EACCES) {
                self.0.refused_work.fetch_add(1, Ordering::AcqRel);
            }
            if result.is_ok() {
                self.0.work_ok.fetch_add(1, Ordering::AcqRel);
            }
            if result == Err(ECANCELED) {
                self.0.work_flushed.fetch_add(1, Ordering::AcqRel);
            }
        }
        fn rw_done(&self, done: RwDone, result: Result) {
            if result.is_ok() {
                let mut bytes = KVec::new();
                if bytes.resize(done.buf.len(), 0, GFP_KERNEL).is_ok()
                    && done.buf.read(0, &mut bytes).is_ok()
                {
                    self.0.rw_digest.store(digest(&bytes), Ordering::Release);
                }
                self.0.rw_ok.fetch_add(1, Ordering::AcqRel);
            }
            self.0.rw_back.fetch_add(1, Ordering::AcqRel);
        }
        fn qp_event(&self, _qp_num: u32, event: QpEvent) {
            // Atomic context: counters only.
            if event == QpEvent::AccessError {
                self.0.access_errors.fetch_add(1, Ordering::AcqRel);
            } else {
                self.0.other_events.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Bytes a send of a [`recording_qp`] may carry inline.
    const INLINE: usize = 64;

    /// A [`recording_qp`] and its CQ.
    type RecordingQp = (Arc<Qp<Recording>>, Arc<Cq<Recording>>);

    /// A QP with a [`Recording`] handler on a CQ polled from `poll`, and
    /// four receives posted (which it does not post again).
    fn recording_qp(id: &CmId<Node>, seen: &Arc<QpSeen>, poll: PollContext) -> Result<RecordingQp> {
        recording_qp_with(id, seen, poll, RECORDING_CAPS, RECORDING_CAPS.max_recv_wr)
    }

    /// The queues of a [`recording_qp`].
    const RECORDING_CAPS: QpCaps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_inline_data: INLINE as u32,
        max_send_sge: 4,
        max_recv_sge: 4,
        max_rdma_ctxs: 2,
    };

    /// [`recording_qp`] with `caps`, and `recvs` receives of 64 bytes
    /// posted.
    fn recording_qp_with(
        id: &CmId<Node>,
        seen: &Arc<QpSeen>,
        poll: PollContext,
        caps: QpCaps,
        recvs: u32,
    ) -> Result<RecordingQp> {
        id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let cq = Cq::alloc_with(&dev, caps.cq_entries()?, 0, poll, Recording(seen.clone()))?;
            let qp = l.create_qp(&pd, &cq, caps)?;
            for _ in 0..recvs {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(|(e, _)| e)?;
            }
            Ok((qp, cq))
        })
    }

    /// Two kernel ids connected over rxe, each with a [`Recording`] QP.
    struct Pair {
        /// Held: dropping an id destroys it and its QP.
        _client: CmId<Node>,
        client_qp: Arc<Qp<Recording>>,
        client_cq: Arc<Cq<Recording>>,
        client_seen: Arc<QpSeen>,
        _server: Arc<CmId<Node>>,
        server_qp: Arc<Qp<Recording>>,
        server_seen: Arc<QpSeen>,
        _listener: CmId<Node>,
    }

    /// Connects a [`Pair`] through a listener on `port`; `None` (the test
    /// skipped) without rxe.
    fn connected_pair(ns: &NetNs, port: u16) -> Option<Pair> {
        connected_pair_polled(ns, port, PollContext::Workqueue)
    }

    /// [`connected_pair`], the client's CQ polled from `client_poll`.
    fn connected_pair_polled(ns: &NetNs, port: u16, client_poll: PollContext) -> Option<Pair> {
        recording_pair(ns, RXE_IP, port, client_poll, 0)
    }

    /// A [`Pair`] through a listener on the device at `ip`, the client's
    /// CQ polled from `client_poll`, both sides offering `read_depth` RDMA
    /// READs each way; `None` (the test skipped) without the device.
    fn recording_pair(
        ns: &NetNs,
        ip: [u8; 4],
        port: u16,
        client_poll: PollContext,
        read_depth: u8,
    ) -> Option<Pair> {
        let (world, listener, addr) = listening_at(ns, ip, port)?;
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).ok()?;
        let s_seen = server_seen.clone();
        let connected =
            connect_client_with(&world, ns, &addr, client_poll, read_depth, move |server| {
                recording_qp(server, &s_seen, PollContext::Workqueue).map(|(qp, _)| qp)
            });
        let (client, (client_qp, client_cq), client_seen, server, server_qp) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return None;
            }
        };
        Some(Pair {
            _client: client,
            client_qp,
            client_cq,
            client_seen,
            _server: server,
            server_qp,
            server_seen,
            _listener: listener,
        })
    }

    /// Fails the case with `e`, a connection's failure, once nothing of the
    /// device is held: a failed assertion ends the case without unwinding,
    /// and the device's unregistration would wait for good for what it
    /// held.  A request adopted meanwhile would hold `world`, which holds
    /// it: taken out first.
    fn failed_to_connect(listener: CmId<Node>, world: Arc<World>, e: Error) {
        drop(listener);
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);
        assert_eq!(Err::<(), _>(e), Ok(()));
    }

    /// A connected client of `world`, what it is made of, and its server.
    type Connected = (
        CmId<Node>,
        RecordingQp,
        Arc<QpSeen>,
        Arc<CmId<Node>>,
        Arc<Qp<Recording>>,
    );

    /// Connects a new client with a [`recording_qp`] polled from
    /// `client_poll` to the listener of `world` at `addr`; the server's id
    /// gets its QP from `server_qp`, in the work that accepts it.
    fn connect_client(
        world: &Arc<World>,
        ns: &NetNs,
        addr: &SocketAddr,
        client_poll: PollContext,
        server_qp: impl FnOnce(&CmId<Node>) -> Result<Arc<Qp<Recording>>> + Send + 'static,
    ) -> Result<Connected> {
        connect_client_with(world, ns, addr, client_poll, 0, server_qp)
    }

    /// [`connect_client`], both sides offering `read_depth` RDMA READs in
    /// flight each way.  On failure everything the attempt made is gone
    /// (the server's id taken out of `world` once the accepting work is
    /// done), so that the caller can let its own objects go before it
    /// fails the case.
    fn connect_client_with(
        world: &Arc<World>,
        ns: &NetNs,
        addr: &SocketAddr,
        client_poll: PollContext,
        read_depth: u8,
        server_qp: impl FnOnce(&CmId<Node>) -> Result<Arc<Qp<Recording>>> + Send + 'static,
    ) -> Result<Connected> {
        let param = ConnParam::new()
            .initiator_depth(read_depth)
            .responder_resources(read_depth);
        // Without reads, the server answers with the CM's defaults.
        let server_param = (read_depth > 0).then_some(param);
        let client = CmId::new(Node::synchronous(world)?, ns, PortSpace::Tcp, QpType::Rc)?;
        client.resolve_addr_sync(None, addr, ms(2000), Some(ms(5000)))?;
        client.resolve_route_sync(ms(2000), Some(ms(5000)))?;
        let client_seen = Arc::new(QpSeen::default(), GFP_KERNEL)?;
        let client_qp = recording_qp(&client, &client_seen, client_poll)?;
        let made = Arc::pin_init(new_mutex!(None), GFP_KERNEL)?;

        let (w, s_qp) = (world.clone(), made.clone());
        workqueue::system()
            .try_spawn(GFP_KERNEL, move || {
                let server = if wait_until(|| w.seen.lock().server.is_some()) {
                    w.seen.lock().server.clone()
                } else {
                    None
                };
                let accepted = server.ok_or(ENOENT).and_then(|server| {
                    *s_qp.lock() = Some(server_qp(&server)?);
                    server.accept_sync(server_param.as_ref(), Some(ms(5000)))
                });
                w.seen.lock().accepted = Some(accepted);
            })
            .map_err(|_| ENOMEM)?;
        let connected = client.connect_sync(&param, Some(ms(5000)));
        // The work waits 5 s for the request and 5 s for its accept: until
        // it is done, it holds the server's id and QP.
        let finished = (0..6).any(|_| wait_until(|| world.seen.lock().accepted.is_some()));
        let accepted = world.seen.lock().accepted.take();
        let server = world.seen.lock().server.take();
        let server_qp = made.lock().take();
        match (finished, accepted, connected, server, server_qp) {
            (true, Some(Ok(_)), Ok(_), Some(server), Some(server_qp)) => {
                Ok((client, client_qp, client_seen, server, server_qp))
            }
            (false, ..) => Err(ETIMEDOUT),
            (_, Some(Err(e)), ..) | (_, _, Err(e), ..) => Err(e),
            _ => Err(EPROTO),
        }
    }

    /// An RDMA WRITE with a key the server never gave out: the server's QP
    /// reports `IB_EVENT_QP_ACCESS_ERR` (rxe: no receive to pin the error
    /// on, C9-222.1) to its CQ's handler, in the driver's context; the
    /// client's WRITE completes with `EACCES`.
    #[test]
    fn access_error_reaches_the_qp_event_handler() {
        let Some(pair) = connected_pair(&NetNs::init(), 7188) else {
            return;
        };
        let mr = Mr::new(pair.client_qp.pd(), 64).unwrap();
        let registered = pair.client_qp.register(&mr, MrAccess::LOCAL, 1).is_ok();
        let nowhere = RemoteRegion {
            addr: 0x1000,
            rkey: 0x5eed_0001,
            len: 16,
        };
        let written = pair
            .client_qp
            .rdma(WorkOp::RdmaWrite, &mr, 0, nowhere, 2)
            .is_ok();
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
        let Some(pair) = connected_pair(&NetNs::init(), 7189) else {
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
        let refused = pair.client_qp.post_send(both).err().map(|(e, _)| e);

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
        let Some(pair) = connected_pair(&NetNs::init(), 7190) else {
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
        let refused = refused.map(|(e, buf)| (e, buf.data().len()));

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

    /// Posts a send of 16 bytes of `byte` on `qp`, unsignaled or not.
    fn post_marked(qp: &Qp<Recording>, byte: u8, unsignaled: bool) -> bool {
        let Ok(mut buf) = SendBuffer::new(qp.pd(), 16) else {
            return false;
        };
        if buf.fill(&[byte; 16]).is_err() {
            return false;
        }
        buf.set_unsignaled(unsignaled);
        qp.post_send(buf).is_ok()
    }

    /// Selective signaling: an unsignaled send that arrived makes no
    /// completion (its buffer is not given back while the QP is idle); the
    /// next signaled send's completion gives it back first, with success,
    /// then its own; a registration's completion gives one back as well.
    #[test]
    fn unsignaled_send_comes_back_with_the_next_signaled_one() {
        let Some(pair) = connected_pair(&NetNs::init(), 7191) else {
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
        let Some(pair) = connected_pair(&NetNs::init(), 7192) else {
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
        let Some(pair) = connected_pair(&NetNs::init(), 7208) else {
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
            .map_err(|(e, _, _)| e);
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

    /// Posts an unsignaled send marked `byte` from the client of a pair
    /// whose client CQ is polled from `poll`, waits until it arrived, and
    /// tears the pair down; checks that the send came back once, with
    /// success, well inside the flush's limit (which a reclaim waits out).
    /// The client's record; `None` (skipped) without rxe.
    fn unsignaled_send_then_teardown(
        port: u16,
        poll: PollContext,
        byte: u8,
    ) -> Option<Arc<QpSeen>> {
        let pair = connected_pair_polled(&NetNs::init(), port, poll)?;
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let posted = post_marked(&pair.client_qp, byte, true);
        let arrived = wait_until(|| server.received.load(Ordering::Acquire) == 1);
        let start = Instant::<Monotonic>::now();
        drop(pair);
        let teardown = start.elapsed();
        assert!(posted && arrived);
        assert_eq!(client.sends_back.load(Ordering::Acquire), 1);
        assert_eq!(client.sends_failed.load(Ordering::Acquire), 0);
        assert!(teardown.as_millis() < FLUSH_TIMEOUT.as_millis());
        Some(client)
    }

    /// A `Direct` CQ runs its handler only when polled, in the poller's
    /// task: a message that arrived stays in the CQ until `poll`, which
    /// reports it; a send's completion comes back the same way.  `poll`
    /// refuses an empty budget (and a CQ polled from a workqueue, see
    /// `cq_on_the_last_vector_polled_unbound`).
    #[test]
    fn direct_cq_runs_handlers_only_when_polled() {
        let Some(pair) = connected_pair_polled(&NetNs::init(), 7194, PollContext::Direct) else {
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
            let _ = pair.client_cq.poll(16);
            client.sends_back.load(Ordering::Acquire) == 1
        });
        let server_got = wait_until(|| server.received.load(Ordering::Acquire) == 1);
        let zero_budget = pair.client_cq.poll(0).err();
        drop(pair);
        assert!(sent && acked && answered);
        assert_eq!(before_poll, 0);
        assert_eq!(polled, Ok(1));
        assert_eq!(after_poll, 1);
        assert!(digest_ok);
        assert!(answer_back && server_got);
        assert_eq!(client.send_log.load(Ordering::Acquire), 6);
        assert_eq!(zero_budget, Some(EINVAL));
    }

    /// A `BusyPoller` loop delivers a `Direct` CQ's completions with nobody
    /// calling `poll`, and stops when its `PollLoop` goes: a message that
    /// arrives after that waits in the CQ for a poll.  A CQ a workqueue
    /// polls gets no loop.  Dropping the poller with a loop running waits
    /// for the loop.
    #[test]
    fn busy_poller_loops_until_stopped() {
        let Some(pair) = connected_pair_polled(&NetNs::init(), 7196, PollContext::Direct) else {
            return;
        };
        let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
        let poller = BusyPoller::new().unwrap();
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
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&ns, RXE_IP, 7212) else {
            return;
        };
        // Bound to the device's address: it has the device.
        let dev = listener.with_lock(|l| l.device()).unwrap();
        let poller = Arc::new(BusyPoller::new().unwrap(), GFP_KERNEL).unwrap();
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let entries = RECORDING_CAPS.cq_entries().unwrap();
        let handler = Recording(server_seen.clone());
        let refused = CqPool::busy_polled(&dev, 0, &poller, handler.clone()).err();
        let pool = CqPool::busy_polled(&dev, entries, &poller, handler).unwrap();
        drop(dev);
        let server_pool = pool.clone();
        let connected = connect_client(&world, &ns, &addr, PollContext::Workqueue, move |server| {
            server.with_lock(|l| {
                let dev = l.device()?;
                let pd = Pd::alloc(&dev)?;
                let (qp, poll) = server_pool.with_cq(entries, None, |_, cq| {
                    Ok((l.create_qp(&pd, cq, RECORDING_CAPS)?, cq.poll_context()))
                })?;
                if poll != PollContext::Direct {
                    return Err(EINVAL);
                }
                for _ in 0..RECORDING_CAPS.max_recv_wr {
                    qp.post_recv(RecvBuffer::new(&pd, 64)?)
                        .map_err(|(e, _)| e)?;
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

    /// The caps of a server's QP on an SRQ: 4 sends, its receives the
    /// SRQ's.
    fn on_srq_caps() -> QpCaps {
        QpCaps {
            max_send_wr: 4,
            max_recv_wr: 0,
            max_inline_data: 0,
            ..QpCaps::default()
        }
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
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&ns, ip, port) else {
            return;
        };
        let iwarp = ip == SIW_IP;
        let dev = listener.with_lock(|l| l.device()).unwrap();
        let pd = Pd::alloc(&dev).unwrap();
        let other_pd = Pd::alloc(&dev).unwrap();
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
        let beyond_depth = beyond_depth.err().map(|(e, _)| e);
        let foreign = srq.post_recv(RecvBuffer::new(&other_pd, 64).unwrap());
        let foreign = foreign.err().map(|(e, _)| e);
        // An event once fewer than 3 are posted: at the second message.
        let limit_refused = (srq.arm_limit(0).err(), srq.arm_limit(DEPTH + 1).err());
        let armed = srq.arm_limit(DEPTH - 1);

        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let caps = on_srq_caps();
        let per_qp = caps.send_cq_entries().unwrap();
        let entries = DEPTH + 2 * per_qp;
        let cq = Cq::alloc(&dev, entries, Recording(server_seen.clone())).unwrap();

        // Refused on an id with a device and no QP yet.
        let probe = CmId::new(
            Node::synchronous(&world).unwrap(),
            &ns,
            PortSpace::Tcp,
            QpType::Rc,
        )
        .unwrap();
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
        let own_post = own_post.err().map(|(e, _)| e);
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

    /// The R/W API moves a buffer of pages (four of them, the last one
    /// partly) into the server's region with an RDMA WRITE and back with a
    /// READ, every byte checked, on rxe (plain requests) and on siw (where
    /// a READ registers its sink from the QP's pool and invalidates it).
    /// A region of another length is refused (`EINVAL`), the transfers in
    /// flight are bounded (`ENOSPC`: the slots on rxe, the pool's
    /// registrations on siw), and those still in flight at the teardown
    /// come back, each once.
    #[test]
    fn rw_api_moves_pages_both_ways() {
        rw_moves_pages(RXE_IP, 7199);
    }

    /// [`rw_api_moves_pages_both_ways`] on siw.
    #[test]
    fn rw_api_on_iwarp_registers_read_sinks() {
        rw_moves_pages(SIW_IP, 7200);
    }

    fn rw_moves_pages(ip: [u8; 4], port: u16) {
        const PAGE: usize = kernel::page::PAGE_SIZE;
        const LEN: usize = 3 * PAGE + 100;
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&ns, ip, port, PollContext::Direct, 4) else {
            return;
        };
        let poll_until = |done: &dyn Fn() -> bool| {
            wait_until(|| {
                let _ = pair.client_cq.poll(16);
                done()
            })
        };
        let region = Mr::new(pair.server_qp.pd(), 4 * PAGE + 200).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let remote = pair.server_qp.register(&region, access, 1).unwrap();
        let registered = wait_until(|| pair.server_seen.work_ok.load(Ordering::Acquire) == 1);
        let target = remote.slice(100, LEN as u32).unwrap();
        let mut pattern = KVec::new();
        for i in 0..LEN {
            pattern.push((i * 7 + 3) as u8, GFP_KERNEL).unwrap();
        }
        let mut out = SgBuffer::new(LEN).unwrap();
        out.write(0, &pattern).unwrap();

        let short = pair
            .client_qp
            .rdma_rw(RwOp::Write, SgBuffer::new(LEN - 1).unwrap(), target, 1);
        let short = short.err().map(|(e, buf)| (e, buf.len()));
        let written = pair.client_qp.rdma_rw(RwOp::Write, out, target, 2).is_ok();
        let write_done = poll_until(&|| pair.client_seen.rw_ok.load(Ordering::Acquire) == 1);
        let mut landed = KVec::new();
        landed.resize(LEN, 0u8, GFP_KERNEL).unwrap();
        region.read(100, &mut landed).unwrap();
        let read = pair
            .client_qp
            .rdma_rw(RwOp::Read, SgBuffer::new(LEN).unwrap(), target, 3);
        let read = read.map_err(|(e, _)| e);
        let read_done = poll_until(&|| pair.client_seen.rw_ok.load(Ordering::Acquire) == 2);
        let read_digest = pair.client_seen.rw_digest.load(Ordering::Acquire);

        // A WRITE and a SEND in one post: the message arrives after the
        // bytes, and both buffers come back.  One opcode only for the SEND.
        let mut reversed = KVec::new();
        for b in pattern.iter().rev() {
            reversed.push(*b, GFP_KERNEL).unwrap();
        }
        let mut second = SgBuffer::new(LEN).unwrap();
        second.write(0, &reversed).unwrap();
        let mut both = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        both.fill(&[7; 16]).unwrap();
        both.set_imm(Some(1));
        both.set_invalidate(Some(2));
        let two_opcodes = pair
            .client_qp
            .rdma_rw_then_send(RwOp::Write, second, target, 4, both);
        let (two_opcodes, second, _both) = match two_opcodes {
            Err((e, second, both)) => (Some(e), second, both),
            Ok(()) => (None, SgBuffer::new(LEN).unwrap(), None),
        };
        let mut done = SendBuffer::new(pair.client_qp.pd(), 16).unwrap();
        done.fill(&[7; 16]).unwrap();
        let signaled_before = pair.client_qp.signaled_rw_writes();
        let chained = pair
            .client_qp
            .rdma_rw_then_send(RwOp::Write, second, target, 5, done)
            .is_ok();
        let arrived = wait_until(|| pair.server_seen.received.load(Ordering::Acquire) == 1);
        let mut after_message = KVec::new();
        after_message.resize(LEN, 0u8, GFP_KERNEL).unwrap();
        region.read(100, &mut after_message).unwrap();
        let chain_back = poll_until(&|| {
            pair.client_seen.rw_ok.load(Ordering::Acquire) == 3
                && pair.client_seen.sends_back.load(Ordering::Acquire) == 1
        });
        // The chain's WRITE, unsignaled before its SEND, is signaled on
        // iWARP only (so that siw copies it).
        let signaled = pair.client_qp.signaled_rw_writes() - signaled_before;

        // Nobody polls: the transfers stay in flight until refused.
        let page = remote.slice(0, PAGE as u32).unwrap();
        let (mut in_flight, mut refused) = (0u32, None);
        for tag in 10..30 {
            match pair
                .client_qp
                .rdma_rw(RwOp::Read, SgBuffer::new(PAGE).unwrap(), page, tag)
            {
                Ok(()) => in_flight += 1,
                Err((e, _)) => {
                    refused = Some(e);
                    break;
                }
            }
        }
        drop(pair._client);
        let back = pair.client_seen.rw_back.load(Ordering::Acquire);
        // The rest of the pair goes at the end.
        drop(region);

        assert!(registered);
        assert_eq!(short, Some((EINVAL, LEN - 1)));
        assert!(written && write_done);
        assert!(landed == pattern);
        assert_eq!(read, Ok(()));
        assert!(read_done);
        assert_eq!(read_digest, digest(&pattern));
        assert!(in_flight >= 1);
        assert_eq!(refused, Some(ENOSPC));
        assert_eq!(two_opcodes, Some(EINVAL));
        assert!(chained && arrived && chain_back);
        assert_eq!(signaled, u64::from(ip == SIW_IP));
        assert!(after_message == reversed);
        assert_eq!(back, 3 + in_flight);
    }

    /// A region over pages (2 MiB less 100 bytes on rxe, twice the
    /// contiguous limit; 1 MiB on siw, its fast registration's limit), one
    /// page more refused: the peer writes 64 KiB at its start, across its
    /// middle at an odd offset and at its end, and reads them back; the
    /// server's own RDMA WRITE from an odd offset of it (its local bytes
    /// named through the registration's addresses, across pages) lands in
    /// the client's region; every byte checked.
    #[test]
    fn page_region_beyond_the_contiguous_limit() {
        page_region_moves_bytes(RXE_IP, 7202);
    }

    /// A registration chained before the SEND that advertises it
    /// (`prepare_registration`, then `register_then_send`): one post; the
    /// registration has no completion of its own, yet is reported done
    /// before the SEND comes back, and the peer reads the region through
    /// the key it got at once.  While prepared, the region refuses another
    /// registration; prepared and dropped, it is free again; a SEND of
    /// another PD hands both back.  With the SEND unsignaled, nothing comes
    /// back until the next signaled request, which gives back both first.
    #[test]
    fn registration_chained_before_its_advertisement() {
        chained_registration(RXE_IP, 7206);
    }

    /// [`registration_chained_before_its_advertisement`] on siw.
    #[test]
    fn registration_chained_on_iwarp() {
        chained_registration(SIW_IP, 7207);
    }

    /// Sends gather the buffer's bytes and attached pages, receives
    /// scatter into the buffer and then its pages (rxe).
    #[test]
    fn pages_gathered_and_scattered() {
        gather_and_scatter(RXE_IP, 7209, false);
    }

    /// [`pages_gathered_and_scattered`] on siw.
    #[test]
    fn pages_gathered_and_scattered_on_iwarp() {
        gather_and_scatter(SIW_IP, 7210, true);
    }

    /// Posts a SEND of `head` from a buffer of `qp`'s PD and of `paged`
    /// from pages attached to it, unsignaled or not.
    fn post_with_pages(qp: &Qp<Recording>, head: &[u8], paged: &[u8], unsignaled: bool) -> Result {
        let mut send = SendBuffer::new(qp.pd(), head.len().max(1))?;
        send.fill(head)?;
        let mut pages = SgBuffer::new(paged.len())?;
        pages.write(0, paged)?;
        send.attach_pages(pages);
        send.set_unsignaled(unsignaled);
        qp.post_send(send).map_err(|(e, _)| e)
    }

    /// `len` bytes of a pattern that differs from offset to offset and
    /// from `seed` to `seed`.
    fn pattern(len: usize, seed: u8) -> KVec<u8> {
        let mut bytes = KVec::new();
        for i in 0..len {
            let _ = bytes.push((i * 7) as u8 ^ (i >> 8) as u8 ^ seed, GFP_KERNEL);
        }
        bytes
    }

    /// The client sends a 16-byte header from its buffer and 2 pages and
    /// 100 bytes from attached pages into the server's receive of 16 bytes
    /// and 3 pages; the server answers with attached pages alone (40
    /// bytes, no bytes of the buffer's own) into the client's plain
    /// receive.  Every byte arrives in order, and each buffer comes back
    /// with its pages.  Refused before the post, the pages still attached:
    /// more entries than the QP's `max_send_sge` (the server's is 1)
    /// (`EMSGSIZE`), pages on an inline send (`EINVAL`), a receive with
    /// pages on an SRQ (`EMSGSIZE`).  A second send with pages, unsignaled,
    /// comes back by itself on iWARP (signaled by the layer: siw would send
    /// it straight from the pages), and not before a later completion on
    /// RoCE.
    fn gather_and_scatter(ip: [u8; 4], port: u16, iwarp: bool) {
        const HEAD: usize = 16;
        const PAGED: usize = 2 * 4096 + 100;
        const ANSWER: usize = 40;
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&ns, ip, port) else {
            return;
        };
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let s_seen = server_seen.clone();
        let server_caps = QpCaps {
            max_send_sge: 1,
            ..RECORDING_CAPS
        };
        let connected = connect_client(&world, &ns, &addr, PollContext::Workqueue, move |server| {
            recording_qp_with(server, &s_seen, PollContext::Workqueue, server_caps, 0)
                .map(|(qp, _)| qp)
        });
        let (client, (client_qp, client_cq), client_seen, server, server_qp) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let s_pd = server_qp.pd().clone();
        let header = pattern(HEAD, 1);
        let paged = pattern(PAGED, 2);
        let answer = pattern(ANSWER, 3);

        // The server's receive: 16 bytes, then 3 pages.
        let mut recv = RecvBuffer::new(&s_pd, HEAD).unwrap();
        let none_before = recv
            .attach_pages(SgBuffer::new(3 * 4096).unwrap())
            .is_none();
        let recv_posted = server_qp.post_recv(recv).is_ok();
        // The client's send: the header, then 2 pages and 100 bytes.
        let sent = post_with_pages(&client_qp, &header, &paged, false).is_ok();
        let (arrived, s_len, s_digest) = server_seen.arrival(1);
        let send_back = wait_until(|| client_seen.send_pages_back.load(Ordering::Acquire) == 1);

        // The same again, unsignaled.
        let mut recv = RecvBuffer::new(&s_pd, HEAD).unwrap();
        recv.attach_pages(SgBuffer::new(3 * 4096).unwrap());
        let second_recv_posted = server_qp.post_recv(recv).is_ok();
        let second_sent = post_with_pages(&client_qp, &header, &paged, true).is_ok();
        let second_arrived = wait_until(|| server_seen.received.load(Ordering::Acquire) == 2);
        let second_digest = server_seen.last_digest.load(Ordering::Acquire);
        // Time for a completion to arrive, if one comes.
        fsleep(Delta::from_millis(50));
        let unsignaled_back = client_seen.send_pages_back.load(Ordering::Acquire);

        // Refusals on the server's QP: a header and pages are two entries,
        // over its one.
        let mut too_many = SendBuffer::new(&s_pd, 8).unwrap();
        too_many.fill(b"header").unwrap();
        too_many.attach_pages(SgBuffer::new(ANSWER).unwrap());
        let over_sge = server_qp.post_send(too_many).err();
        let over_sge = over_sge.map(|(e, buf)| (e, buf.pages().is_some()));
        let mut inline = SendBuffer::new(&s_pd, 8).unwrap();
        inline.set_inline(true);
        inline.attach_pages(SgBuffer::new(ANSWER).unwrap());
        let inline = server_qp.post_send(inline).err();
        let inline = inline.map(|(e, buf)| (e, buf.pages().is_some()));
        let srq = Srq::<Recording>::new(&s_pd, 4).unwrap();
        let mut on_srq = RecvBuffer::new(&s_pd, 8).unwrap();
        on_srq.attach_pages(SgBuffer::new(ANSWER).unwrap());
        let on_srq = srq.post_recv(on_srq).err();
        let on_srq = on_srq.map(|(e, buf)| (e, buf.pages().is_some()));
        drop(srq);

        // The answer: pages alone, one entry.
        let answered = post_with_pages(&server_qp, &[], &answer, false).is_ok();
        let (answer_arrived, c_len, c_digest) = client_seen.arrival(1);
        let answer_back = wait_until(|| server_seen.send_pages_back.load(Ordering::Acquire) == 1);
        let recv_back = server_seen.recv_pages_back.load(Ordering::Acquire);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((
            client_qp, client_cq, client, server_qp, s_pd, server, listener,
        ));
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);
        assert!(none_before);

        assert!(recv_posted && sent && arrived && send_back);
        assert_eq!(s_len as usize, HEAD + PAGED);
        assert_eq!(s_digest, digest_on(digest(&header), &paged));
        assert!(second_recv_posted && second_sent && second_arrived);
        assert_eq!(second_digest, s_digest);
        assert_eq!(unsignaled_back, if iwarp { 2 } else { 1 });
        assert_eq!(recv_back, 2);
        assert_eq!(over_sge, Some((EMSGSIZE, true)));
        assert_eq!(inline, Some((EINVAL, true)));
        assert_eq!(on_srq, Some((EMSGSIZE, true)));
        assert!(answered && answer_arrived && answer_back);
        assert_eq!(c_len as usize, ANSWER);
        assert_eq!(c_digest, digest(&answer));
    }

    /// An SRQ made for 4 scatter entries ([`SrqCaps::max_sge`]): the
    /// client's 16-byte header, 2 pages and 100 bytes arrive in the
    /// server's SRQ receive of 16 bytes and 3 pages, every byte in order,
    /// and the receive comes back with its pages.  An SRQ of more entries
    /// than the device's `max_srq_sge` is refused (`EINVAL`).
    #[test]
    fn srq_receives_scatter_into_pages() {
        const HEAD: usize = 16;
        const PAGED: usize = 2 * 4096 + 100;
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&ns, RXE_IP, 7211) else {
            return;
        };
        let dev = listener.with_lock(|l| l.device()).unwrap();
        let pd = Pd::alloc(&dev).unwrap();
        let beyond_device = SrqCaps {
            max_wr: 4,
            max_sge: dev.caps().max_srq_sge + 1,
        };
        let too_wide = Srq::<Recording>::with_caps(&pd, beyond_device, None).err();
        let srq_caps = SrqCaps {
            max_wr: 4,
            max_sge: 4,
        };
        let srq = Srq::<Recording>::with_caps(&pd, srq_caps, None).unwrap();
        let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).unwrap();
        let caps = on_srq_caps();
        let entries = srq_caps.max_wr + caps.send_cq_entries().unwrap();
        let cq = Cq::alloc(&dev, entries, Recording(server_seen.clone())).unwrap();
        let mut recv = RecvBuffer::new(&pd, HEAD).unwrap();
        let pages = SgBuffer::new(3 * 4096).unwrap();
        let page_entries = pages.entries();
        recv.attach_pages(pages);
        let posted = srq.post_recv(recv).err().map(|(e, _)| e);

        let (s_pd, s_cq, s_srq) = (pd.clone(), cq.clone(), srq.clone());
        let connected = connect_client(&world, &ns, &addr, PollContext::Workqueue, move |server| {
            server.with_lock(|l| l.create_qp_on_srq(&s_pd, &s_cq, &s_cq, &s_srq, caps))
        });
        let (client, (client_qp, client_cq), _client_seen, server, server_qp) = match connected {
            Ok(connected) => connected,
            Err(e) => {
                drop((srq, cq, pd, dev));
                failed_to_connect(listener, world, e);
                return;
            }
        };
        let header = pattern(HEAD, 4);
        let paged = pattern(PAGED, 5);
        let sent = post_with_pages(&client_qp, &header, &paged, false).is_ok();
        let (arrived, len, digest_seen) = server_seen.arrival(1);
        let recv_back = wait_until(|| server_seen.recv_pages_back.load(Ordering::Acquire) == 1);
        // Nothing of the device held past here (see
        // `qps_reserve_room_for_the_drain`).
        drop((
            client_qp, client_cq, client, server_qp, server, srq, cq, pd, dev,
        ));
        drop(listener);
        drop(take_out(&world.seen, |seen| seen.server.take()));
        drop(world);
        assert_eq!(too_wide, Some(EINVAL));
        // 3 pages are 1 to 3 entries (adjacent pages merge): with the
        // buffer's, within the SRQ's 4.
        assert!((1..=3).contains(&page_entries));
        assert_eq!(posted, None);
        assert!(sent && arrived && recv_back);
        assert_eq!(len as usize, HEAD + PAGED);
        assert_eq!(digest_seen, digest_on(digest(&header), &paged));
    }

    /// What a SEND advertising `region` carries: address, key, length.
    fn advertisement(region: RemoteRegion) -> [u8; 16] {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&region.addr.to_be_bytes());
        bytes[8..12].copy_from_slice(&region.rkey.to_be_bytes());
        bytes[12..].copy_from_slice(&region.len.to_be_bytes());
        bytes
    }

    fn chained_registration(ip: [u8; 4], port: u16) {
        const LEN: usize = 8192;
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&ns, ip, port, PollContext::Workqueue, 4) else {
            return;
        };
        // The client registers and advertises: on iWARP the passive side
        // may not send before the active side's first message.
        let (owner, reader) = (&pair.client_qp, &pair.server_qp);
        let (owned, read_by) = (pair.client_seen.clone(), pair.server_seen.clone());
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let mut pattern = KVec::new();
        for i in 0..LEN {
            pattern.push((i * 13 + 5) as u8, GFP_KERNEL).unwrap();
        }
        let region = Mr::new(owner.pd(), LEN).unwrap();
        region.write(0, &pattern).unwrap();

        let dropped = owner.prepare_registration(&region, access).is_ok();
        let prepared = owner.prepare_registration(&region, access).unwrap();
        let while_prepared = owner.register(&region, access, 1).err();
        let prepared_twice = owner.prepare_registration(&region, access).err();
        let registered_early = region.is_registered();
        let remote = prepared.region();
        // On iWARP the passive side may not send before the active side's
        // first message: refused, both back.
        let passive_first = (ip == SIW_IP).then(|| {
            let early = Mr::new(reader.pd(), 4096).unwrap();
            let prepared = reader.prepare_registration(&early, access).unwrap();
            let send = SendBuffer::new(reader.pd(), 16).unwrap();
            reader
                .register_then_send(prepared, 6, send)
                .err()
                .map(|(e, _, _)| e)
        });

        let other_pd = Pd::alloc(owner.device()).unwrap();
        let foreign = SendBuffer::new(&other_pd, 16).unwrap();
        let refused = owner.register_then_send(prepared, 2, foreign);
        let both_back = matches!(refused, Err((_, Some(_), _)));
        let Err((refused, Some(prepared), foreign)) = refused else {
            // An assertion ends the test without unwinding: what holds the
            // device goes first.
            drop((region, other_pd));
            drop(pair);
            assert!(both_back);
            return;
        };
        let mut advert = SendBuffer::new(owner.pd(), 16).unwrap();
        advert.fill(&advertisement(remote)).unwrap();
        let posted = owner
            .register_then_send(prepared, 3, advert)
            .map_err(|(e, _, _)| e);
        let registered = region.is_registered();
        let arrived = wait_until(|| read_by.received.load(Ordering::Acquire) == 1);
        let advert_digest = read_by.last_digest.load(Ordering::Acquire);
        // The peer acts on the message at once.
        let read = reader
            .rdma_rw(RwOp::Read, SgBuffer::new(LEN).unwrap(), remote, 4)
            .map_err(|(e, _)| e);
        let read_back = wait_until(|| read_by.rw_back.load(Ordering::Acquire) == 1);
        let read_ok = read_by.rw_ok.load(Ordering::Acquire);
        let read_digest = read_by.rw_digest.load(Ordering::Acquire);
        let advert_back = wait_until(|| owned.sends_back.load(Ordering::Acquire) == 1);
        let work_at_advert = owned.work_ok_at_send.load(Ordering::Acquire);

        // Unsignaled: both wait for the next signaled request.
        let second = Mr::new(owner.pd(), 4096).unwrap();
        let prepared = owner.prepare_registration(&second, access).unwrap();
        let mut quiet = SendBuffer::new(owner.pd(), 16).unwrap();
        quiet.fill(&advertisement(prepared.region())).unwrap();
        quiet.set_unsignaled(true);
        let quiet_posted = owner.register_then_send(prepared, 5, quiet).is_ok();
        let quiet_arrived = wait_until(|| read_by.received.load(Ordering::Acquire) == 2);
        // Time for completions that should not come.
        fsleep(Delta::from_millis(200));
        let while_idle = (
            owned.work_ok.load(Ordering::Acquire),
            owned.sends_back.load(Ordering::Acquire),
        );
        let loud = post_marked(owner, 9, false);
        let all_back = wait_until(|| owned.sends_back.load(Ordering::Acquire) == 3);
        let work_at_quiet = owned.work_ok.load(Ordering::Acquire);
        // Everything of the device goes before the first assertion, which
        // ends the test without unwinding: a PD left would hold the device.
        drop((region, second, foreign, other_pd));
        drop(pair);
        assert!(dropped);
        assert_eq!(while_prepared, Some(EBUSY));
        assert_eq!(prepared_twice, Some(EBUSY));
        assert!(!registered_early);
        if let Some(refused) = passive_first {
            assert_eq!(refused, Some(EAGAIN));
        }
        assert_eq!(refused, EINVAL);
        assert_eq!(posted, Ok(remote));
        assert!(registered);
        assert!(arrived);
        assert_eq!(advert_digest, digest(&advertisement(remote)));
        assert_eq!(read, Ok(()));
        assert!(read_back);
        assert_eq!(read_ok, 1);
        assert_eq!(read_digest, digest(&pattern));
        assert!(advert_back);
        assert_eq!(work_at_advert, 1);
        assert!(quiet_posted && quiet_arrived && loud);
        assert_eq!(while_idle, (1, 1));
        assert!(all_back);
        assert_eq!(work_at_quiet, 2);
        assert_eq!(owned.sends_failed.load(Ordering::Acquire), 0);
    }

    /// [`page_region_beyond_the_contiguous_limit`] on siw.
    #[test]
    fn page_region_on_iwarp() {
        page_region_moves_bytes(SIW_IP, 7203);
    }

    /// A region dropped while its peer still WRITEs into it, on siw: the
    /// memory is freed only once no placement of the driver can still
    /// reach it.  siw places a WRITE chunk by chunk, each after checking
    /// the key, in its socket's receive callback, and its `ib_dereg_mr`
    /// does not wait for a chunk under way: freed right after the
    /// deregistration, the region is written after its free.  Each round
    /// drops the region once the first WRITE's placement passed a point
    /// that moves with the round; the later WRITEs fail.  The window (siw's
    /// check to its copy) is a few instructions: with
    /// `tools/debug/siw-dereg-window.patch`, which widens it to 200 us,
    /// KASAN reported the write to freed memory in the first run without
    /// the grace period.
    #[test]
    fn region_dropped_under_a_peers_write_is_freed_after_it() {
        const ROUNDS: u16 = 16;
        const WRITES: u32 = 3;
        const PATTERN: u8 = 0xa5;
        let ns = NetNs::init();
        let access = MrAccess {
            remote_read: false,
            remote_write: true,
        };
        let mut checks = Checks::new();
        let mut writes_failed = 0;
        for round in 0..ROUNDS {
            let Some(pair) = recording_pair(&ns, SIW_IP, 7221 + round, PollContext::Workqueue, 0)
            else {
                // Without siw0 the case is skipped (the first round);
                // later, a round that could not connect failed.
                if round == 0 {
                    return;
                }
                checks.eq("rounds that could connect", round, ROUNDS);
                break;
            };
            let local = Mr::new(pair.client_qp.pd(), MAX_MR_LEN).unwrap();
            let mut bytes = KVec::new();
            bytes.resize(MAX_MR_LEN, PATTERN, GFP_KERNEL).unwrap();
            local.write(0, &bytes).unwrap();
            let region = Mr::new(pair.server_qp.pd(), MAX_MR_LEN).unwrap();
            let ready = pair.client_qp.register(&local, MrAccess::LOCAL, 1).is_ok()
                && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == 1);
            let remote = pair.server_qp.register(&region, access, 1).ok();
            let ready = ready
                && remote.is_some()
                && wait_until(|| pair.server_seen.work_ok.load(Ordering::Acquire) == 1);
            let posted = match (ready, remote) {
                (true, Some(remote)) => (0..WRITES)
                    .take_while(|w| {
                        pair.client_qp
                            .rdma(WorkOp::RdmaWrite, &local, 0, remote, 2 + u64::from(*w))
                            .is_ok()
                    })
                    .count() as u32,
                _ => 0,
            };
            // Dropped while the placement is under way: as soon as the
            // first WRITE reached a point that moves with the round.
            let at = (usize::from(round) + 1) * (MAX_MR_LEN / usize::from(ROUNDS + 1));
            let mut byte = [0u8];
            let reached = posted > 0
                && wait_closely_until(Delta::from_secs(5), || {
                    region.read(at, &mut byte).is_ok() && byte[0] == PATTERN
                });
            drop(region);
            // The WRITEs left come back before the pair goes (failed, or
            // flushed once the peer's QP terminated the connection).
            let seen = &pair.client_seen;
            let back = wait_until(|| seen.work_back.load(Ordering::Acquire) > posted);
            writes_failed +=
                seen.work_back.load(Ordering::Acquire) - seen.work_ok.load(Ordering::Acquire);
            // Each with its round, to tell which failed.
            checks.eq("registered, in round", (round, ready), (round, true));
            checks.eq("WRITEs posted, in round", (round, posted), (round, WRITES));
            checks.eq(
                "the first WRITE reached the drop's offset, in round",
                (round, at, reached),
                (round, at, true),
            );
            checks.eq(
                "requests back (the registration and the WRITEs), in round",
                (round, back, seen.work_back.load(Ordering::Acquire)),
                (round, true, posted + 1),
            );
            drop((local, pair));
        }
        // The WRITEs after the drop failed (the peer's QP saw the key
        // invalid and terminated the connection).
        checks.check("a WRITE after a drop failed", writes_failed > 0);
        assert_eq!(checks.failures(), 0);
    }

    fn page_region_moves_bytes(ip: [u8; 4], port: u16) {
        const PAGE: usize = kernel::page::PAGE_SIZE;
        const CHUNK: usize = 64 * 1024;
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&ns, ip, port, PollContext::Workqueue, 4) else {
            return;
        };
        let pages = (pair.server_qp.device().max_fast_reg_page_list_len() as usize).min(512);
        let len = pages * PAGE - 100;
        let too_many =
            Mr::from_pages(pair.server_qp.pd(), SgBuffer::new(len + PAGE).unwrap()).err();
        let region = Mr::from_pages(pair.server_qp.pd(), SgBuffer::new(len).unwrap()).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let remote = pair.server_qp.register(&region, access, 1).unwrap();
        let local = Mr::new(pair.client_qp.pd(), CHUNK).unwrap();
        let client_remote = pair.client_qp.register(&local, access, 2).unwrap();
        let registered = wait_until(|| {
            pair.server_seen.work_ok.load(Ordering::Acquire) == 1
                && pair.client_seen.work_ok.load(Ordering::Acquire) == 1
        });

        let mut pattern = KVec::new();
        let mut back = KVec::new();
        let mut mismatches = 0u32;
        // The client's registration succeeded: one.
        let mut done = 1;
        for (round, at) in [0, len / 2 + 3001, len - CHUNK].into_iter().enumerate() {
            pattern.clear();
            for i in 0..CHUNK {
                pattern
                    .push((i * 13 + round * 7 + 1) as u8, GFP_KERNEL)
                    .unwrap();
            }
            local.write(0, &pattern).unwrap();
            let span = remote.slice(at as u64, CHUNK as u32).unwrap();
            let wrote = pair.client_qp.rdma(WorkOp::RdmaWrite, &local, 0, span, 10);
            done += 1;
            let written = wrote.is_ok()
                && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == done);
            back.clear();
            back.resize(CHUNK, 0u8, GFP_KERNEL).unwrap();
            region.read(at, &mut back).unwrap();
            // Read back by the peer too, over a zeroed local copy.
            local.write(0, &[0; 4096]).unwrap();
            let read = pair.client_qp.rdma(WorkOp::RdmaRead, &local, 0, span, 11);
            done += 1;
            let read = read.is_ok()
                && wait_until(|| pair.client_seen.work_ok.load(Ordering::Acquire) == done);
            let mut peer_view = KVec::new();
            peer_view.resize(CHUNK, 0u8, GFP_KERNEL).unwrap();
            local.read(0, &mut peer_view).unwrap();
            if !(written && read && back == pattern && peer_view == pattern) {
                mismatches += 1;
            }
        }

        // The server's WRITE from its page region, at an odd offset: on
        // iWARP once the client's first message came.
        let spoke = post_marked(&pair.client_qp, 1, false)
            && wait_until(|| pair.server_seen.received.load(Ordering::Acquire) == 1);
        let from = PAGE + 77;
        pattern.clear();
        for i in 0..CHUNK {
            pattern.push((i * 5 + 9) as u8, GFP_KERNEL).unwrap();
        }
        region.write(from, &pattern).unwrap();
        let pushed = pair
            .server_qp
            .rdma(WorkOp::RdmaWrite, &region, from, client_remote, 12);
        let pushed =
            pushed.is_ok() && wait_until(|| pair.server_seen.work_ok.load(Ordering::Acquire) == 2);
        let mut landed = KVec::new();
        landed.resize(CHUNK, 0u8, GFP_KERNEL).unwrap();
        local.read(0, &mut landed).unwrap();
        drop((local, pair));
        let region_len = region.len();
        drop(region);

        assert_eq!(too_many, Some(EINVAL));
        assert_eq!(region_len, len);
        assert!(registered);
        assert_eq!(mismatches, 0);
        assert!(spoke && pushed);
        assert!(landed == pattern);
    }

    /// An R/W READ refused by the peer (a key it never gave): on rxe the
    /// buffer comes back with the error at once; on siw (iWARP) the READ
    /// request handed the peer a key to write into the sink, which only a
    /// successful READ revokes, so the buffer comes back only once the QP
    /// is destroyed (before, a peer could write into pages the consumer
    /// had back).
    #[test]
    fn failed_read_returns_its_sink_when_no_peer_can_write_it() {
        failed_read_hand_back(RXE_IP, 7204);
        failed_read_hand_back(SIW_IP, 7205);
    }

    fn failed_read_hand_back(ip: [u8; 4], port: u16) {
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&ns, ip, port, PollContext::Workqueue, 4) else {
            return;
        };
        let nowhere = RemoteRegion {
            addr: 0x1000,
            rkey: 0x5eed_0001,
            len: 4096,
        };
        let read = pair
            .client_qp
            .rdma_rw(RwOp::Read, SgBuffer::new(4096).unwrap(), nowhere, 1);
        let read = read.map_err(|(e, _)| e);
        let iwarp = ip == SIW_IP;
        let back_at_once = if iwarp {
            // Time for the peer's refusal to come back, which must not
            // hand the buffer over.
            fsleep(ms(500));
            pair.client_seen.rw_back.load(Ordering::Acquire) == 1
        } else {
            wait_until(|| pair.client_seen.rw_back.load(Ordering::Acquire) == 1)
        };
        let before_teardown = pair.client_seen.rw_back.load(Ordering::Acquire);
        drop(pair._client);
        let after_teardown = pair.client_seen.rw_back.load(Ordering::Acquire);
        let succeeded = pair.client_seen.rw_ok.load(Ordering::Acquire);
        assert_eq!(read, Ok(()));
        assert_eq!(back_at_once, !iwarp);
        assert_eq!(before_teardown, u32::from(!iwarp));
        assert_eq!(after_teardown, 1);
        assert_eq!(succeeded, 0);
    }

    /// siw takes a READ on a connection that negotiated no initiator depth
    /// into its send queue, then fails the post when it cannot start it.
    /// The request is the driver's all the same: the post reports success,
    /// the QP goes to the error state, and the region comes back once,
    /// flushed (freed at the failed post, the flush at the teardown read
    /// the freed request: KASAN, slab-use-after-free).
    #[test]
    fn post_the_driver_failed_after_taking_it_completes_once() {
        let ns = NetNs::init();
        let Some(pair) = recording_pair(&ns, SIW_IP, 7201, PollContext::Workqueue, 0) else {
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
        let read = pair.client_qp.rdma(WorkOp::RdmaRead, &sink, 0, remote, 3);
        let flushed = wait_until(|| pair.client_seen.work_flushed.load(Ordering::Acquire) == 1);
        let client_seen = pair.client_seen.clone();
        drop((region, sink, pair));
        assert!(registered);
        assert_eq!(read, Ok(()));
        assert!(flushed);
        // Once: the teardown flushed nothing more.
        assert_eq!(client_seen.work_flushed.load(Ordering::Acquire), 1);
    }

    /// A blocking call past its limit fails with `ETIMEDOUT` and leaves
    /// its operation in flight: another operation is refused (`EBUSY`),
    /// and repeating the call waits for the first one's event, here the
    /// REJECTED of a request the server held, then rejected.
    #[test]
    fn timed_out_call_resumes() {
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&ns, 7186) else {
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
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&ns, 7187) else {
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
        let id = CmId::new(Node::synchronous(world)?, &ns, PortSpace::Tcp, QpType::Rc)?;
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
            let pd = Pd::alloc(&dev)?;
            let entries = REENTRY_CAPS.cq_entries()?;
            let cq = Cq::alloc_with(
                &dev,
                entries,
                0,
                PollContext::Direct,
                Reentrant(state.clone()),
            )?;
            let spare = Cq::alloc(&dev, entries, Nop)?;
            let qp = l.create_qp(&pd, &cq, REENTRY_CAPS)?;
            for _ in 0..2 {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(|(e, _)| e)?;
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
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening(&ns, 7220) else {
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
            let pd = Pd::alloc(&dev)?;
            let spare = Cq::alloc(&dev, REENTRY_CAPS.cq_entries()?, Nop)?;
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
        let ns = NetNs::init();
        let Some((world, listener, _)) = listening(&ns, 7221) else {
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
        let ns = NetNs::init();
        let id = CmId::new(Node::synchronous(world)?, &ns, PortSpace::Tcp, QpType::Rc)?;
        id.resolve_addr_sync(None, nobody, ms(2000), Some(ms(5000)))?
            .into_event()?;
        id.resolve_route_sync(ms(2000), Some(ms(5000)))?
            .into_event()?;
        id.with_lock(|l| {
            let dev = l.device()?;
            let pd = Pd::alloc(&dev)?;
            let qp = l.create_qp(&pd, cq, REENTRY_CAPS)?;
            for _ in 0..2 {
                qp.post_recv(RecvBuffer::new(&pd, 64)?)
                    .map_err(|(e, _)| e)?;
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
        let ns = NetNs::init();
        let Some((world, listener, _)) = listening(&ns, 7225) else {
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
            let probe = CmId::new(Node::synchronous(&world)?, &ns, PortSpace::Tcp, QpType::Rc)?;
            probe
                .resolve_addr_sync(None, &nobody, ms(2000), Some(ms(5000)))?
                .into_event()?;
            let dev = probe.with_lock(|l| l.device())?;
            let entries = REENTRY_CAPS.cq_entries()?;
            let cq = |state: &Arc<CrossState>| {
                Cq::alloc_with(
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
                        let pd = Pd::alloc(&dev)?;
                        let cq = Cq::alloc(&dev, REENTRY_CAPS.cq_entries()?, Nop)?;
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
        let ns = NetNs::init();
        let Some((world, listener, addr)) = listening_at(&ns, SIW_IP, 7224) else {
            return;
        };
        let seen = Arc::pin_init(new_mutex!(TeardownSeen::default()), GFP_KERNEL).unwrap();
        let made = (|| {
            let handler = DestroysQpOnEvents {
                seen: seen.clone(),
                waiter: KBox::pin_init(EventWaiter::new(), GFP_KERNEL)?,
            };
            let client = CmId::new(handler, &ns, PortSpace::Tcp, QpType::Rc)?;
            client
                .resolve_addr_sync(None, &addr, ms(2000), Some(ms(5000)))?
                .into_event()?;
            client
                .resolve_route_sync(ms(2000), Some(ms(5000)))?
                .into_event()?;
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
        let w = world.clone();
        let spawned = workqueue::system().try_spawn(GFP_KERNEL, move || {
            let server = if wait_until(|| w.seen.lock().server.is_some()) {
                w.seen.lock().server.clone()
            } else {
                None
            };
            let accepted = server.ok_or(ENOENT).and_then(|server| {
                with_qp(&server)?;
                server.accept_sync(None, Some(ms(5000)))
            });
            w.seen.lock().accepted = Some(accepted);
        });
        let connected = spawned
            .map_err(|_| ENOMEM)
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

#[kunit_tests(rdma_cm_rs_client)]
mod client_tests {
    use super::wait_until;
    use crate::rdma::{
        async_event::{AsyncEventHandler, AsyncEventRegistration, DeviceEvent},
        client::{Client, ClientRegistration},
        device::{Device, Transport},
        pd::Pd,
    };
    use core::sync::atomic::{AtomicUsize, Ordering};
    use kernel::{
        new_mutex,
        prelude::*,
        sync::{aref::ARef, Arc, Mutex},
        time::{delay::fsleep, Delta},
    };

    /// What the test client saw.
    #[derive(Default)]
    struct Seen {
        added: AtomicUsize,
        removed: AtomicUsize,
        rxe: AtomicUsize,
        siw: AtomicUsize,
        /// A `remove` whose data was not the device's own.
        mixed_up: AtomicUsize,
    }

    /// A ULP's per-device state, as every ULP keeps it: the device and one
    /// PD on it.
    struct PerDevice {
        dev: ARef<Device>,
        _pd: Arc<Pd>,
    }

    struct TestClient(Arc<Seen>);

    crate::rdma_client_slot!(TestClient);

    impl Client for TestClient {
        type DeviceData = PerDevice;
        const NAME: &'static CStr = c"rdma_cm_rs_kunit";
        fn add(&self, dev: &ARef<Device>) -> Result<PerDevice> {
            let pd = Pd::alloc(dev)?;
            let name = dev.name();
            if name.as_bytes().starts_with(b"rxe") {
                self.0.rxe.fetch_add(1, Ordering::AcqRel);
            } else if name.as_bytes().starts_with(b"siw") {
                self.0.siw.fetch_add(1, Ordering::AcqRel);
            }
            self.0.added.fetch_add(1, Ordering::AcqRel);
            Ok(PerDevice {
                dev: dev.clone(),
                _pd: pd,
            })
        }

        fn remove(&self, dev: &Device, data: Arc<PerDevice>) {
            if !data.dev.same(dev) {
                self.0.mixed_up.fetch_add(1, Ordering::AcqRel);
            }
            self.0.removed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Registering runs `add` for every device there is (the test bed has
    /// rxe0 and siw0), each with a PD of its own; dropping the registration
    /// gives every device's data back to `remove`, with its own device, once.
    #[test]
    fn client_sees_every_device_and_gives_each_back() {
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let reg = KBox::pin_init(
            ClientRegistration::new(TestClient(seen.clone())),
            GFP_KERNEL,
        );
        let added_while_registered = seen.added.load(Ordering::Acquire);
        let removed_while_registered = seen.removed.load(Ordering::Acquire);
        let (rxe, siw) = (
            seen.rxe.load(Ordering::Acquire),
            seen.siw.load(Ordering::Acquire),
        );
        let registered = reg.is_ok();
        drop(reg);
        assert!(registered);
        if rxe == 0 || siw == 0 {
            super::skip_without_devices(ENODEV);
            return;
        }
        assert_eq!((rxe, siw), (1, 1));
        assert_eq!(removed_while_registered, 0);
        assert_eq!(seen.removed.load(Ordering::Acquire), added_while_registered);
        assert_eq!(seen.mixed_up.load(Ordering::Acquire), 0);
    }

    /// The C `add` callback names no client: one registration of a type at
    /// a time, a second is refused before it reaches the IB core, and the
    /// first keeps working.
    #[test]
    fn second_registration_of_a_type_is_busy() {
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let first = KBox::pin_init(
            ClientRegistration::new(TestClient(seen.clone())),
            GFP_KERNEL,
        );
        let second = KBox::pin_init(
            ClientRegistration::new(TestClient(seen.clone())),
            GFP_KERNEL,
        );
        let second_err = second.as_ref().err().copied();
        let added = seen.added.load(Ordering::Acquire);
        drop(second);
        let first_ok = first.is_ok();
        drop(first);
        let removed = seen.removed.load(Ordering::Acquire);
        // A third, after both are gone, registers again.
        let third = KBox::pin_init(
            ClientRegistration::new(TestClient(seen.clone())),
            GFP_KERNEL,
        );
        let third_ok = third.is_ok();
        drop(third);
        assert!(first_ok);
        assert_eq!(second_err, Some(EBUSY));
        assert_eq!(removed, added);
        assert!(third_ok);
    }

    /// A client that takes rxe and refuses every other device, and keeps
    /// every device it was offered.
    struct RxeOnly {
        seen: Arc<Seen>,
        offered: Arc<Mutex<KVec<ARef<Device>>>>,
    }

    crate::rdma_client_slot!(RxeOnly);

    impl Client for RxeOnly {
        type DeviceData = PerDevice;
        const NAME: &'static CStr = c"rdma_cm_rs_kunit_rxe_only";
        fn add(&self, dev: &ARef<Device>) -> Result<PerDevice> {
            self.offered.lock().push(dev.clone(), GFP_KERNEL)?;
            if !dev.name().as_bytes().starts_with(b"rxe") {
                self.seen.siw.fetch_add(1, Ordering::AcqRel);
                return Err(EOPNOTSUPP);
            }
            self.seen.rxe.fetch_add(1, Ordering::AcqRel);
            self.seen.added.fetch_add(1, Ordering::AcqRel);
            Ok(PerDevice {
                dev: dev.clone(),
                _pd: Pd::alloc(dev)?,
            })
        }

        fn remove(&self, dev: &Device, data: Arc<PerDevice>) {
            if !data.dev.same(dev) {
                self.seen.mixed_up.fetch_add(1, Ordering::AcqRel);
            }
            self.seen.removed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// `device_data` finds what `add` returned for a device, the same
    /// object every time, and nothing for a device whose `add` failed; a
    /// failed `add` gets no `remove`, and a clone taken before the
    /// registration went outlives it.
    #[test]
    fn device_data_is_found_by_device_until_remove() {
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let offered = Arc::pin_init(new_mutex!(KVec::new()), GFP_KERNEL).unwrap();
        let reg = KBox::pin_init(
            ClientRegistration::new(RxeOnly {
                seen: seen.clone(),
                offered: offered.clone(),
            }),
            GFP_KERNEL,
        )
        .unwrap();
        let devices = core::mem::take(&mut *offered.lock());
        let (mut found, mut same_twice, mut found_refused) = (0, 0, 0);
        let mut kept = None;
        for dev in devices.iter() {
            let first = reg.device_data(dev);
            let second = reg.device_data(dev);
            match (&first, &second) {
                (Some(a), Some(b)) => {
                    found += usize::from(a.dev.same(dev));
                    same_twice += usize::from(core::ptr::eq(&**a, &**b));
                }
                (None, None) => {}
                _ => found_refused += 100,
            }
            if !dev.name().as_bytes().starts_with(b"rxe") && first.is_some() {
                found_refused += 1;
            }
            if kept.is_none() {
                kept = first;
            }
        }
        let added = seen.added.load(Ordering::Acquire);
        drop(reg);
        if seen.rxe.load(Ordering::Acquire) == 0 || seen.siw.load(Ordering::Acquire) == 0 {
            super::skip_without_devices(ENODEV);
            return;
        }
        assert_eq!((found, same_twice, found_refused), (added, added, 0));
        // Every device was offered, rxe taken: remove came for it alone.
        assert_eq!(seen.removed.load(Ordering::Acquire), added);
        assert_eq!(seen.mixed_up.load(Ordering::Acquire), 0);
        // The clone is still good after its `remove`: its PD lives on.
        let kept = kept.expect("rxe's data was found");
        assert!(kept.dev.name().as_bytes().starts_with(b"rxe"));
        drop(kept);
        drop(devices);
    }

    /// Counts the events of its device.
    struct CountEvents {
        sm_changes_on_port_1: AtomicUsize,
        others: AtomicUsize,
    }

    impl AsyncEventHandler for CountEvents {
        fn event(&self, _dev: &Device, event: DeviceEvent) {
            if event == DeviceEvent::SmChange(1) {
                self.sm_changes_on_port_1.fetch_add(1, Ordering::AcqRel);
            } else {
                self.others.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Has the IB core deliver an `IB_EVENT_SM_CHANGE` of port 1 of `dev`,
    /// as a driver would (no other handler acts on it for rxe: the SA and
    /// multicast clients are IB-only, and KUnit runs before user space has
    /// a verbs context).
    fn dispatch_sm_change(dev: &Device) {
        let mut event: crate::rdma::bindings::ib_event = pin_init::zeroed();
        event.device = dev.as_ptr();
        event.element.port_num = 1;
        event.event = crate::rdma::bindings::ib_event_type_IB_EVENT_SM_CHANGE;
        // SAFETY: `event` names a registered device (the caller holds it)
        // and a port of it; `ib_dispatch_event` copies it into a work item
        // (GFP_ATOMIC) before it returns.
        unsafe { crate::rdma::bindings::ib_dispatch_event(&event) };
    }

    /// rxe0, as an IB client is offered it.
    fn rxe_device() -> Option<ARef<Device>> {
        let seen = Arc::new(Seen::default(), GFP_KERNEL).ok()?;
        let offered = Arc::pin_init(new_mutex!(KVec::new()), GFP_KERNEL).ok()?;
        let reg = KBox::pin_init(
            ClientRegistration::new(RxeOnly {
                seen,
                offered: offered.clone(),
            }),
            GFP_KERNEL,
        )
        .ok()?;
        drop(reg);
        let devices = core::mem::take(&mut *offered.lock());
        devices
            .into_iter()
            .find(|d| d.name().as_bytes().starts_with(b"rxe"))
    }

    /// A registered handler gets the device's events, on its workqueue; once
    /// the registration is dropped, none.
    #[test]
    fn device_events_reach_the_handler_until_dropped() {
        let Some(rxe) = rxe_device() else {
            super::skip_without_devices(ENODEV);
            return;
        };
        let events = AsyncEventRegistration::new(
            &rxe,
            CountEvents {
                sm_changes_on_port_1: AtomicUsize::new(0),
                others: AtomicUsize::new(0),
            },
        )
        .unwrap();
        assert!(events.device().same(&rxe));
        dispatch_sm_change(&rxe);
        let delivered = wait_until(|| {
            events
                .handler()
                .sm_changes_on_port_1
                .load(Ordering::Acquire)
                == 1
        });
        let others = events.handler().others.load(Ordering::Acquire);
        drop(events);
        // Dropped: a later event finds no handler of ours (the registration
        // and its counters are gone; KASAN would report a call into them).
        dispatch_sm_change(&rxe);
        fsleep(Delta::from_millis(300));
        assert!(delivered);
        assert_eq!(others, 0);
    }

    /// What [`DropsItself`] saw.
    #[derive(Default)]
    struct SelfSeen {
        events: AtomicUsize,
        new_refused: AtomicUsize,
    }

    /// A handler that drops its own registration from its first event, and
    /// tries to make another there.
    struct DropsItself {
        slot: Arc<Mutex<Option<AsyncEventRegistration<DropsItself>>>>,
        seen: Arc<SelfSeen>,
    }

    impl AsyncEventHandler for DropsItself {
        fn event(&self, dev: &Device, _event: DeviceEvent) {
            self.seen.events.fetch_add(1, Ordering::AcqRel);
            let dev: ARef<Device> = dev.into();
            let nested = AsyncEventRegistration::new(
                &dev,
                CountEvents {
                    sm_changes_on_port_1: AtomicUsize::new(0),
                    others: AtomicUsize::new(0),
                },
            );
            if nested.err() == Some(EDEADLK) {
                self.seen.new_refused.fetch_add(1, Ordering::AcqRel);
            }
            // Unregistering here would wait for the lock this runs under:
            // the drop defers it.
            let own = self.slot.lock().take();
            drop(own);
        }
    }

    /// A registration dropped inside its own handler is unregistered from
    /// the module's queue instead of deadlocking on the device's handler
    /// lock, and a registration made there is refused (`EDEADLK`).
    #[test]
    fn registration_dropped_in_its_handler_is_deferred() {
        let Some(rxe) = rxe_device() else {
            super::skip_without_devices(ENODEV);
            return;
        };
        let slot = Arc::pin_init(new_mutex!(None), GFP_KERNEL).unwrap();
        let self_seen = Arc::new(SelfSeen::default(), GFP_KERNEL).unwrap();
        let registration = AsyncEventRegistration::new(
            &rxe,
            DropsItself {
                slot: slot.clone(),
                seen: self_seen.clone(),
            },
        )
        .unwrap();
        *slot.lock() = Some(registration);
        dispatch_sm_change(&rxe);
        let handled = wait_until(|| self_seen.events.load(Ordering::Acquire) == 1);
        // The deferred unregistration has run once this returns.
        let flushed = crate::rdma::deferred::flush_deferred_destroys();
        dispatch_sm_change(&rxe);
        fsleep(Delta::from_millis(300));
        // Breaks the cycle if the handler never ran.
        let left = slot.lock().take();
        let was_left = left.is_some();
        drop(left);
        assert!(handled);
        assert!(flushed.is_ok());
        assert!(!was_left);
        assert_eq!(self_seen.events.load(Ordering::Acquire), 1);
        assert_eq!(self_seen.new_refused.load(Ordering::Acquire), 1);
    }

    /// The capabilities are the drivers' own: rxe is RoCE with fast
    /// registration and SRQs; siw is iWARP with fast registration.
    #[test]
    fn device_caps_are_the_drivers() {
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let reg = KBox::pin_init(
            ClientRegistration::new(CapsClient(seen.clone())),
            GFP_KERNEL,
        );
        let ok = reg.is_ok();
        drop(reg);
        assert!(ok);
        if seen.rxe.load(Ordering::Acquire) == 0 || seen.siw.load(Ordering::Acquire) == 0 {
            super::skip_without_devices(ENODEV);
            return;
        }
        // `CapsClient::add` counted a device only if its caps were right.
        assert_eq!(seen.mixed_up.load(Ordering::Acquire), 0);
    }

    /// Checks each device's capabilities in `add`; a wrong one counts as
    /// mixed up.
    struct CapsClient(Arc<Seen>);

    crate::rdma_client_slot!(CapsClient);

    impl Client for CapsClient {
        type DeviceData = ();
        const NAME: &'static CStr = c"rdma_cm_rs_kunit_caps";
        fn add(&self, dev: &ARef<Device>) -> Result {
            let c = dev.caps();
            let name = dev.name();
            let sane = c.max_qp > 0
                && c.max_qp_wr > 0
                && c.max_send_sge > 0
                && c.max_recv_sge > 0
                && c.max_cqe > 0
                && c.max_pd > 0
                && c.fast_registration
                && c.max_fast_reg_page_list_len > 0;
            let right = if name.as_bytes().starts_with(b"rxe") {
                self.0.rxe.fetch_add(1, Ordering::AcqRel);
                c.transport == Transport::Ib && c.max_srq > 0 && c.max_srq_wr > 0
            } else if name.as_bytes().starts_with(b"siw") {
                self.0.siw.fetch_add(1, Ordering::AcqRel);
                c.transport == Transport::Iwarp
            } else {
                true
            };
            // One port, 1, on both; its protocol and CM the transport's.
            let ports = dev.ports();
            let port_sane = *ports.start() == 1
                && *ports.end() == 1
                && dev.port_caps(0) == Err(EINVAL)
                && dev.port_caps(2) == Err(EINVAL)
                && dev.rw_mr_factor(2, 1) == Err(EINVAL);
            // The R/W API's factor: rxe moves 32 SGEs a READ (`max_sge_rd`)
            // without registering; siw registers 256 pages an MR.
            let factor_right = if name.as_bytes().starts_with(b"rxe") {
                dev.rw_mr_factor(1, 32) == Ok(1) && dev.rw_mr_factor(1, 64) == Ok(2)
            } else if name.as_bytes().starts_with(b"siw") {
                dev.rw_mr_factor(1, 256) == Ok(1) && dev.rw_mr_factor(1, 257) == Ok(2)
            } else {
                true
            };
            let port_right = match dev.port_caps(1) {
                Ok(p) if name.as_bytes().starts_with(b"rxe") => {
                    p.protocol_roce_udp_encap()
                        && p.protocol_roce()
                        && p.ib_or_roce()
                        && !p.protocol_ib()
                        && p.cap_ib_cm()
                        && !p.cap_iw_cm()
                        && p.cap_eth_ah()
                        && p.grh_required()
                        && !p.cap_read_inv()
                }
                Ok(p) if name.as_bytes().starts_with(b"siw") => {
                    p.protocol_iwarp()
                        && !p.ib_or_roce()
                        && p.cap_iw_cm()
                        && !p.cap_ib_cm()
                        && !p.cap_ib_mad()
                        && !p.grh_required()
                        && p.cap_read_inv()
                }
                Ok(_) => true,
                Err(_) => false,
            };
            if !(sane && right && port_sane && port_right && factor_right) {
                self.0.mixed_up.fetch_add(1, Ordering::AcqRel);
            }
            Ok(())
        }
    }
}
