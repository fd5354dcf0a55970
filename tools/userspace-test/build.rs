// SPDX-License-Identifier: GPL-2.0
//! Generates, with bindgen, the Rust side of
//!  - the device ABI from the C uapi header, so the tool and the module read
//!    the same structures (`uapi.rs`);
//!  - librdmacm and libibverbs from the system's headers, allowlisted to
//!    what `src/cm.rs` and `src/cm/ud.rs` call (`rdma.rs`, included by
//!    `src/cm/ffi.rs`, from `src/cm/ffi.h`), and links both libraries.

use std::path::{Path, PathBuf};

fn main() {
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    uapi(&out);
    rdma(&out);
}

fn uapi(out: &Path) {
    let header = "../../rust/uapi/rdma_cm_rs.h";
    println!("cargo:rerun-if-changed={header}");
    let bindings = bindgen::Builder::default()
        .header(header)
        .allowlist_file(".*rdma_cm_rs.h")
        .derive_default(true)
        .derive_debug(true)
        .generate()
        .expect("bindgen over rust/uapi/rdma_cm_rs.h");
    bindings
        .write_to_file(out.join("uapi.rs"))
        .expect("write uapi.rs");
}

/// The librdmacm and libibverbs functions `cm.rs` and `cm/ud.rs` call.
const FUNCTIONS: &[&str] = &[
    "rdma_create_event_channel",
    "rdma_destroy_event_channel",
    "rdma_create_id",
    "rdma_destroy_id",
    "rdma_get_cm_event",
    "rdma_ack_cm_event",
    "rdma_bind_addr",
    "rdma_listen",
    "rdma_resolve_addr",
    "rdma_resolve_route",
    "rdma_create_qp",
    "rdma_destroy_qp",
    "rdma_connect",
    "rdma_accept",
    "rdma_reject",
    "rdma_disconnect",
    "ibv_alloc_pd",
    "ibv_dealloc_pd",
    "ibv_create_cq",
    "ibv_destroy_cq",
    // The exported function: verbs.h's `ibv_reg_mr` macro calls it as well
    // unless the access flags hold IBV_ACCESS_OPTIONAL_RANGE bits.
    "ibv_reg_mr",
    "ibv_dereg_mr",
    // `static inline` in verbs.h (calls through the provider's ops).
    "ibv_post_send",
    "ibv_post_recv",
    "ibv_poll_cq",
    // UD (`src/cm/ud.rs`): address handles from a SIDR reply's attributes
    // or from a received datagram, and the QP's Q_Key.
    "ibv_create_ah",
    "ibv_create_ah_from_wc",
    "ibv_destroy_ah",
    "ibv_query_qp",
    // Memory windows (`static inline`): a store client's type 2 window,
    // bound afresh for each request the sample answers with SEND_WITH_INV.
    "ibv_alloc_mw",
    "ibv_dealloc_mw",
    "ibv_inc_rkey",
    // The device's asynchronous events (QP fatal, COMM_EST, ...), read
    // without waiting when a connection fails (`Conn::async_events`).
    "ibv_get_async_event",
    "ibv_ack_async_event",
    "ibv_event_type_str",
    // What the module's GETADDRINFO is compared with (`src/cm/addrinfo.rs`).
    "rdma_getaddrinfo",
    "rdma_freeaddrinfo",
    // UD ids of RDMA_PS_IB (`src/cm/ud.rs`): `rdma_create_id` makes RC ones.
    "rdma_create_ep",
    "rdma_migrate_id",
    // Sleeping waits of the benchmark's librdmacm side
    // (`cm::set_notified_waits`):
    // a completion channel, its CQs armed (`static inline`), its events.
    "ibv_create_comp_channel",
    "ibv_destroy_comp_channel",
    "ibv_req_notify_cq",
    "ibv_get_cq_event",
    "ibv_ack_cq_events",
];

/// The types `cm.rs` and `cm/ud.rs` name or reads fields of; bindgen adds what they
/// contain (pointers to opaque types below stay pointers).
const TYPES: &[&str] = &[
    "rdma_event_channel",
    "rdma_cm_id",
    "rdma_cm_event",
    "rdma_cm_event_type",
    "rdma_conn_param",
    "rdma_port_space",
    "ibv_qp_init_attr",
    "ibv_qp_type",
    "ibv_access_flags",
    "ibv_sge",
    "ibv_send_wr",
    "ibv_send_flags",
    "ibv_wr_opcode",
    "ibv_recv_wr",
    "ibv_wc",
    "ibv_wc_status",
    "ibv_wc_flags",
    "rdma_ud_param",
    "ibv_ah_attr",
    "ibv_grh",
    "ibv_qp_attr",
    "ibv_qp_attr_mask",
    "ibv_mw",
    "ibv_mw_bind_info",
    "ibv_mw_type",
    "ibv_async_event",
    "ibv_event_type",
    "rdma_addrinfo",
    // Its `fd`, polled with a timeout before `ibv_get_cq_event`, and the
    // CQ's `channel`.
    "ibv_comp_channel",
    "ibv_cq",
];

/// Types the tool only passes pointers to, or never reads (fields of
/// allowlisted types, union members): their size and alignment are kept,
/// their fields and what those would pull in are not.
const OPAQUE: &[&str] = &[
    "ibv_context_ops",
    "ibv_device",
    "ibv_srq",
    "ibv_ah",
    "ibv_xrcd",
    "rdma_route",
];

/// Bits combined with `|`: newtypes with the bit operators.
const FLAGS: &[&str] = &["ibv_access_flags", "ibv_send_flags"];

/// librdmacm and libibverbs.
///
/// `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline`
/// in verbs.h, so no library exports them.  bindgen's `wrap_static_fns`
/// (feature `experimental`) writes a C wrapper for each allowlisted one and
/// points the Rust declaration at it; `cc` compiles that file.  Chosen over
/// a C shim of our own because nothing is written twice: the wrappers'
/// signatures come from the same headers, through the same allowlist, as
/// the rest of the bindings, and the C compiler checks them against the
/// real inline functions.  The feature's API is pinned by Cargo.lock.
fn rdma(out: &Path) {
    // By absolute path: the generated wrappers (in OUT_DIR) include it.
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cm/ffi.h");
    let wrappers = out.join("rdma_static_fns");
    let mut b = bindgen::Builder::default()
        .header(header.to_str().expect("UTF-8 path"))
        .allowlist_recursively(true)
        .default_enum_style(bindgen::EnumVariation::ModuleConsts)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&wrappers)
        .layout_tests(true)
        .generate_comments(false)
        // Rebuild when a system header changes.
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in FUNCTIONS {
        b = b.allowlist_function(format!("^{f}$"));
    }
    for t in TYPES {
        b = b.allowlist_type(format!("^{t}$"));
    }
    for t in OPAQUE {
        b = b.opaque_type(format!("^{t}$"));
    }
    for t in FLAGS {
        b = b.bitfield_enum(format!("^{t}$"));
    }
    let bindings = b.generate().unwrap_or_else(|e| {
        panic!("bindgen over <rdma/rdma_cma.h> and <infiniband/verbs.h> (librdmacm-dev, libibverbs-dev): {e}")
    });
    bindings
        .write_to_file(out.join("rdma.rs"))
        .expect("write rdma.rs");

    cc::Build::new()
        .file(wrappers.with_extension("c"))
        .warnings(true)
        .warnings_into_errors(true)
        .compile("rdma_static_fns");
    println!("cargo:rustc-link-lib=rdmacm");
    println!("cargo:rustc-link-lib=ibverbs");
}
