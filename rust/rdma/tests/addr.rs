// SPDX-License-Identifier: GPL-2.0

//! KUnit: Socket addresses: parsing and the sockaddr encoding.

use kernel::prelude::*;
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
