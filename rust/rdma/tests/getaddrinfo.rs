// SPDX-License-Identifier: GPL-2.0

//! KUnit: The numeric `rdma_getaddrinfo`.

use kernel::prelude::*;
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
        assert_eq!(ai.flags, 0);
        assert_eq!(ai.port_space, PortSpace::Tcp);
        assert_eq!(ai.qp_type, QpType::Rc);
        // No node: the loopback address, IPv6 first as the C library
        // answers.
        let ai = getaddrinfo(None, Some(b"1"), &Hints::default()).unwrap();
        let mut ip = [0; 16];
        ip[15] = 1;
        assert_eq!(
            ai.dst,
            Some(SocketAddr::V6 {
                ip,
                port: 1,
                flowinfo: 0,
                scope_id: 0
            })
        );
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
        assert!(getaddrinfo(None, Some(b"1"), &hints)
            .unwrap()
            .src
            .is_some_and(|a| a.is_any() && a.family() == AF_INET6));
        // Neither node nor service: the hints come back, no address.
        let ai = getaddrinfo(None, None, &hints).unwrap();
        assert_eq!(ai.family, AF_INET6);
        assert_eq!(ai.flags, RAI_PASSIVE | RAI_FAMILY);
        assert_eq!((ai.src, ai.dst), (None, None));
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
        let scoped = getaddrinfo(Some(b"fe80::1%2"), None, &Hints::default()).unwrap();
        assert!(matches!(
            scoped.dst,
            Some(SocketAddr::V6 { scope_id: 2, .. })
        ));
        // Not a number: a name to a caller that did not say it is one, a
        // malformed number to one that did.
        assert_eq!(
            getaddrinfo(Some(b"fe80::1%"), None, &Hints::default()),
            Err(EOPNOTSUPP)
        );
        let numeric = Hints {
            flags: RAI_NUMERICHOST,
            ..Hints::default()
        };
        assert_eq!(getaddrinfo(Some(b"fe80::1%"), None, &numeric), Err(EINVAL));
        assert_eq!(
            getaddrinfo(Some(b"192.0.2.1"), Some(b"65536"), &Hints::default()),
            Err(EINVAL)
        );
        let noroute = Hints {
            flags: RAI_NOROUTE,
            ..Hints::default()
        };
        assert!(getaddrinfo(Some(b"192.0.2.1"), None, &noroute).is_ok());
    }
}
