// SPDX-License-Identifier: GPL-2.0
//! NVMe over Fabrics: the Rust target (`samples/rdma_cm_rs_nvmet.rs`) on
//! the module's machine, listening on the wildcard address, against the
//! kernel's own host (nvme-rdma, nvme-cli, fio) on the agent's
//! (`agent::nvme_host`), from VM B across two (in one VM,
//! `tools/nvme-test.sh` runs host and target).
//!
//! * `nvmet_kernel_host` (two machines, in a pass that has the machine to
//!   itself): connect, fio's small verified run (two jobs of
//!   4 MiB, 4-64 KiB at queue depth 8), disconnect; the target warns of
//!   nothing.
//! * `nvmet_link_deleted_under_io` (two machines, in a pass that has the
//!   machine to itself): fio runs time-based, the host reconnecting every
//!   second; the target's device goes (`rdma link delete rxe0` or `siw0`)
//!   and comes back 3 s later.  The target's queues end with the device;
//!   its listener, on the wildcard address, is back on the new device (the
//!   CM re-creates the per-device listeners); the host reconnects, fio's
//!   verify passes, and the target warns of nothing.

use super::{note, Ctx};
use crate::agent::Call;
use crate::nvmet_target::{self as nvmet, SMALL_FIO};
use crate::rdma_cmd;
use anyhow::{bail, ensure, Context, Result};
use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

/// How long the agent waits for fio (each run takes seconds) and the
/// suite for the agent's answer.
const FIO_TIMEOUT_S: u32 = 120;
const ANSWER_WAIT: Duration = Duration::from_secs(180);
/// The time-based run: the outage and the reconnect fall inside it.
const UNDER_IO_S: u32 = 15;
/// fio runs this long before the link goes...
const BEFORE_DELETE: Duration = Duration::from_secs(3);
/// ...which stays gone this long.
const LINK_DOWN: Duration = Duration::from_secs(3);

pub(super) fn kernel_host(ctx: &mut Ctx) -> Result<()> {
    let port = ctx.port();
    let addr = SocketAddr::new(ctx.local4, port);
    let outcome = nvmet::with_target(port, || {
        let request = format!("{SMALL_FIO} timeout_s={FIO_TIMEOUT_S}");
        let mut call = Call::start(&ctx.agent, &nvmet::host_request(addr, &request))?;
        call.set_read_timeout(ANSWER_WAIT)?;
        note_ready(&call.ready()?, addr);
        nvmet::judge_host(&call.result()?, note)
    });
    let clean = nvmet::target_log_clean(port, &[], note);
    outcome?;
    clean
}

pub(super) fn link_deleted_under_io(ctx: &mut Ctx) -> Result<()> {
    ensure!(
        ctx.two_machines(),
        "host and target on one machine share the device"
    );
    let port = ctx.port();
    let addr = SocketAddr::new(ctx.local4, port);
    let mut link = Link::of(ctx.transport.name())?;
    let outcome = nvmet::with_target(port, || {
        let request = format!(
            "{SMALL_FIO} runtime_s={UNDER_IO_S} reconnect_delay=1 ctrl_loss_tmo=60 timeout_s={FIO_TIMEOUT_S}"
        );
        let mut call = Call::start(&ctx.agent, &nvmet::host_request(addr, &request))?;
        call.set_read_timeout(ANSWER_WAIT)?;
        note_ready(&call.ready()?, addr);
        // The agent's states count from its `ready`, these from reading it.
        let start = Instant::now();
        std::thread::sleep(BEFORE_DELETE);
        let deleting = start.elapsed();
        link.delete()?;
        let deleted = start.elapsed();
        std::thread::sleep(LINK_DOWN);
        link.add()?;
        let added = start.elapsed();
        let r = call.result()?;
        let states = r.get("states").map_or("", String::as_str).to_owned();
        nvmet::judge_host(&r, note)?;
        let (down, live) = reconnect(&states)?;
        note(&format!(
            "{}: `rdma link delete` from {} to {} ms after fio started, `rdma link add` at {} ms; the host's controller: {states} (ms from fio's start)",
            link.device,
            deleting.as_millis(),
            deleted.as_millis(),
            added.as_millis()
        ));
        // The two clocks start within the agent's `ready` line's trip (a
        // guest under TCG may take its time to read it).
        ensure!(
            u128::from(down) + 1000 >= deleting.as_millis(),
            "the host's controller left `live` at {down} ms, before the link went at {} ms",
            deleting.as_millis()
        );
        note(&format!(
            "the host noticed {} ms after the deletion began, and was live again {} ms after the link came back",
            i128::from(down) - deleting.as_millis() as i128,
            i128::from(live) - added.as_millis() as i128
        ));
        Ok(())
    });
    // Back whatever happened: the scenarios after this one need it.
    let restored = link.restore();
    // siw ends a QP whose send failed under the deletion (its socket
    // going) with IB_EVENT_QP_FATAL (`siw_qp_sq_process`), which may reach
    // the target before the CM's DEVICE_REMOVAL (seen 2026-11-29 across
    // two VMs: "queue 1: QP error"); the C target logs it as an error too.
    let clean = nvmet::target_log_clean(port, &[": QP error: disconnecting"], note);
    outcome?;
    restored?;
    clean
}

fn note_ready(line: &str, addr: SocketAddr) {
    let f = nvmet::ready_fields(line);
    let get = |k: &str| f.get(k).map_or("?", String::as_str);
    note(&format!(
        "host: {} of {} ({}, controller {} of the target at {addr})",
        get("dev"),
        get("bytes"),
        get("ctrl"),
        get("cntlid")
    ));
}

/// When the host's controller left `live` and when it was live again
/// after that, from the agent's `states` (`live@0,resetting@5120,...`,
/// ms); it must end live.
fn reconnect(states: &str) -> Result<(u64, u64)> {
    let mut seen = Vec::new();
    for s in states.split(',') {
        let (state, at) = s
            .split_once('@')
            .with_context(|| format!("states={states}"))?;
        seen.push((state, at.parse::<u64>().context("states")?));
    }
    let Some(&(_, down)) = seen.iter().find(|(s, _)| *s != "live") else {
        bail!(
            "the host's controller never left `live` ({states}): the link's removal went unnoticed"
        );
    };
    let Some(&(_, live)) = seen.iter().find(|(s, at)| *s == "live" && *at > down) else {
        bail!("the host's controller did not come back ({states})");
    };
    ensure!(
        seen.last().is_some_and(|(s, _)| *s == "live"),
        "the host's controller did not stay live ({states})"
    );
    Ok((down, live))
}

/// The pass's device, deleted and added back on its netdev.
struct Link {
    device: String,
    kind: &'static str,
    netdev: String,
}

impl Link {
    /// `rxe0` or `siw0`, on the netdev `rdma link show` tells.
    fn of(kind: &'static str) -> Result<Self> {
        let device = format!("{kind}0");
        let shown = rdma_cmd(&["link", "show", &format!("{device}/1")])?;
        let netdev = shown
            .split_whitespace()
            .skip_while(|w| *w != "netdev")
            .nth(1)
            .with_context(|| format!("no netdev in `rdma link show {device}/1`: {shown}"))?
            .to_owned();
        Ok(Self {
            device,
            kind,
            netdev,
        })
    }

    fn present(&self) -> bool {
        Path::new("/sys/class/infiniband")
            .join(&self.device)
            .exists()
    }

    /// `rdma link delete`, and the device gone.
    fn delete(&self) -> Result<()> {
        rdma_cmd(&["link", "delete", &self.device])?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.present() {
            ensure!(
                Instant::now() < deadline,
                "{} still there 30 s after `rdma link delete`",
                self.device
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// `rdma link add` on its netdev.
    fn add(&self) -> Result<()> {
        rdma_cmd(&[
            "link",
            "add",
            &self.device,
            "type",
            self.kind,
            "netdev",
            &self.netdev,
        ])?;
        ensure!(
            self.present(),
            "{} not there after `rdma link add`",
            self.device
        );
        Ok(())
    }

    /// Adds the device back if it is not there.
    fn restore(&mut self) -> Result<()> {
        if self.present() {
            return Ok(());
        }
        self.add()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_reconnect_off_the_states() {
        assert_eq!(
            reconnect("live@0,resetting@5120,connecting@5140,live@9001").unwrap(),
            (5120, 9001)
        );
        assert_eq!(
            reconnect("live@0,connecting@4000,live@7000").unwrap(),
            (4000, 7000)
        );
        for bad in [
            "live@0",
            "live@0,connecting@4000",
            "live@0,connecting@1,live@2,deleting@3",
        ] {
            assert!(reconnect(bad).is_err(), "{bad}");
        }
    }
}
