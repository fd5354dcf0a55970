// SPDX-License-Identifier: GPL-2.0
//! Loading and unloading the project's sample modules (`rdma_cm_rs_echo`,
//! `rdma_cm_rs_rping`) from the build directory, `$RDMA_CM_RS_OUT` (the
//! checkout's top, where Kbuild puts the `.ko` files, when unset).

use anyhow::{ensure, Context, Result};
use std::{path::PathBuf, process::Command};

/// `insmod $RDMA_CM_RS_OUT/NAME.ko port=PORT PARAMS...`.
pub fn load_with(name: &str, port: u16, params: &[&str]) -> Result<()> {
    let dir = std::env::var("RDMA_CM_RS_OUT").unwrap_or_else(|_| ".".into());
    let ko = PathBuf::from(dir).join(format!("{name}.ko"));
    let st = Command::new("insmod")
        .arg(&ko)
        .arg(format!("port={port}"))
        .args(params)
        .status()
        .context("insmod")?;
    ensure!(
        st.success(),
        "insmod {} port={port} {}: {st}",
        ko.display(),
        params.join(" ")
    );
    Ok(())
}

/// Runs `f` with `NAME.ko` loaded (`port=PORT PARAMS...`), then unloads
/// it, whatever `f` returned.  Passes of the suite running at once share
/// the kernel: one of them has the sample loaded at a time, under a lock
/// file (`/tmp/NAME.lock`, released with it).
pub fn with_loaded<R>(
    name: &str,
    port: u16,
    params: &[&str],
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(format!("/tmp/{name}.lock"))
        .context("the sample's lock file")?;
    lock.lock().context("lock the sample")?;
    load_with(name, port, params)?;
    let done = f();
    let unloaded = unload(name);
    let done = done?;
    unloaded?;
    Ok(done)
}

/// `rmmod NAME`.
pub fn unload(name: &str) -> Result<()> {
    let st = Command::new("rmmod").arg(name).status().context("rmmod")?;
    ensure!(st.success(), "rmmod {name}: {st}");
    Ok(())
}
