// SPDX-License-Identifier: GPL-2.0

//! KUnit: Socket addresses: `core::net` conversions, text form and the
//! sockaddr encoding.

use kernel::prelude::*;
#[kunit_tests(rdma_cm_rs_addr)]
mod addr_tests {
    use crate::rdma::addr::*;
    use kernel::{prelude::*, str::CString};

    fn addr(text: &str) -> SocketAddr {
        SocketAddr::from(text.parse::<core::net::SocketAddr>().unwrap())
    }

    #[test]
    fn converts_from_and_to_core_net() {
        assert_eq!(
            addr("192.0.2.1:7471"),
            SocketAddr::V4 {
                ip: [192, 0, 2, 1],
                port: 7471
            }
        );
        let mut ip = [0u8; 16];
        ip[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
        ip[15] = 1;
        let v6 = SocketAddr::V6 {
            ip,
            port: 7471,
            flowinfo: 5,
            scope_id: 3,
        };
        let back = SocketAddr::from(core::net::SocketAddr::from(v6));
        assert_eq!(back, v6);
        assert!(matches!(
            addr("[fe80::1%3]:1"),
            SocketAddr::V6 { scope_id: 3, .. }
        ));
    }

    #[test]
    fn text_form_is_rfc_5952() {
        let mut text = KVec::new();
        for (a, want) in [
            (addr("192.0.2.1:7471"), &b"192.0.2.1:7471"[..]),
            (addr("[2001:db8:0:0:0:0:0:1]:1"), b"[2001:db8::1]:1"),
            (addr("[fe80::1%3]:1"), b"[fe80::1%3]:1"),
        ] {
            text.clear();
            let s = CString::try_from_fmt(fmt!("{a}")).unwrap();
            text.extend_from_slice(s.to_bytes(), GFP_KERNEL).unwrap();
            assert_eq!(&text[..], want);
        }
    }

    #[test]
    fn sockaddr_round_trip() {
        for text in ["192.0.2.1:7471", "[2001:db8::2]:1", "0.0.0.0:0"] {
            let a = addr(text);
            let bytes = a.to_sockaddr();
            assert_eq!(SocketAddr::from_sockaddr(&bytes.0).unwrap(), Some(a));
        }
        // Network byte order on the wire: port 7471 = 0x1d2f.
        let b = addr("192.0.2.1:7471").to_sockaddr();
        assert_eq!(&b.0[..8], &[2, 0, 0x1d, 0x2f, 192, 0, 2, 1]);
    }

    #[test]
    fn sockaddr_rejects_garbage() {
        let mut b = addr("192.0.2.1:1").to_sockaddr();
        b.0[9] = 1; // sin_zero
        assert!(SocketAddr::from_sockaddr(&b.0).is_err());
        let mut b = addr("[::1]:1").to_sockaddr();
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
