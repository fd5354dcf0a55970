// SPDX-License-Identifier: GPL-2.0
//! librdmacm and libibverbs as bindgen generates them in `build.rs` from
//! `<rdma/rdma_cma.h>` and `<infiniband/verbs.h>`, allowlisted to what
//! [`crate::cm`] uses.  Private to `cm`: nothing else sees a raw pointer.

#![allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    clippy::all
)]

include!(concat!(env!("OUT_DIR"), "/rdma.rs"));
