// SPDX-License-Identifier: GPL-2.0
//! Generates the Rust side of the device ABI from the C uapi header, so the
//! tool and the module read the same structures.

fn main() {
    let header = "../../rust/uapi/rdma_cm_rs.h";
    println!("cargo:rerun-if-changed={header}");
    let bindings = bindgen::Builder::default()
        .header(header)
        .allowlist_file(".*rdma_cm_rs.h")
        .derive_default(true)
        .derive_debug(true)
        .generate()
        .expect("bindgen over rust/uapi/rdma_cm_rs.h");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap());
    bindings
        .write_to_file(out.join("uapi.rs"))
        .expect("write uapi.rs");
}
