// SPDX-License-Identifier: GPL-2.0

//! KUnit: Connection parameters and the man pages' private-data limits.

use kernel::prelude::*;
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
            assert_eq!(usage.limit(transport), Ok(limit));
            assert!(PrivateData::new(&data[..limit])
                .unwrap()
                .check(limit)
                .is_ok());
            assert_eq!(
                PrivateData::new(&data[..limit + 1]).unwrap().check(limit),
                Err(EINVAL)
            );
        }
        // No UD on iWARP, whatever the length.
        for usage in [PrivateDataUse::ConnectUd, PrivateDataUse::AcceptUd] {
            assert_eq!(usage.limit(Transport::Iwarp), Err(EPROTONOSUPPORT));
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
            let limit = PrivateDataUse::ConnectRc.limit(transport).unwrap();
            let check = |rd, init| p.check_against(limit, rd, init);
            assert!(check(4, 2).is_ok());
            assert!(check(3, 2).is_err());
            assert!(check(4, 1).is_err());
        }
    }
}
