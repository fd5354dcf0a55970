// SPDX-License-Identifier: GPL-2.0
//! The NVMe over Fabrics target of `samples/rdma_cm_rs_nvmet.rs` on this
//! machine, against the kernel's host that the agent runs
//! (`agent::nvme_host`; in one VM on this machine, across two in the
//! other): what the suite's scenarios (`suite::nvmet`) and `ctl
//! peer-vm-killed --nvme-target` share, and the latter's check.

use crate::agent::{parse, Call};
use crate::kmsg::{self, Record};
use crate::payload::unhex;
use crate::report::Flat;
use crate::sample_module;
use anyhow::{ensure, Context, Result};
use std::{
    collections::BTreeMap,
    net::SocketAddr,
    time::{Duration, Instant},
};

pub const MODULE: &str = "rdma_cm_rs_nvmet";
/// The target's subsystem.
pub const NQN: &str = "nqn.2026-11.org.rdma-cm-rs:nvmet";
/// Its namespace's size (the module's default).
pub const NS_MIB: u64 = 64;
/// The host's identity in every test (tools/nvme-test.sh's is ...0001).
/// Both VMs share /etc/nvme (nvmet-plan.md §0.6): it is given, not read.
pub const HOSTID: &str = "8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0002";
/// fio's small run: two jobs of 4 MiB side by side, reads and writes at
/// random of 4 to 64 KiB at queue depth 8, every block written verified.
pub const SMALL_FIO: &str = "rw=randrw bs=4k-64k iodepth=8 numjobs=2 size_mib=4";
/// The keep-alive timeout the host asks for: the kernel host's default
/// (`NVME_DEFAULT_KATO`), said explicitly.
pub const KATO_S: u64 = 5;
/// How much later than the keep-alive timeout after its host died the
/// target may fail a controller: the sweep runs every second (and the
/// host's last keep-alive came up to KATO/2 before it died, which only
/// makes it earlier).
pub const KATO_SLACK: Duration = Duration::from_secs(2);

/// The fix a target on `target`'s address needs, if the kernel lacks it:
/// on siw, "RDMA/siw: flush the ORQ when a closing QP moves to ERROR"
/// (tools/kernel-patches/0015).  Without it the READs of the host's data
/// that a disconnected queue still waited for are never flushed (siw's
/// CLOSING to ERROR flushed the send queue and the ORQ only with its
/// transmitter busy), and the layer logs "requests the driver did not
/// flush" at the QP's destruction, which the dmesg gate fails.
pub fn lacking_fix(target: SocketAddr) -> Option<String> {
    let iwarp = ["RDMA_CM_RS_SIW_IP", "RDMA_CM_RS_SIW_IP6"]
        .iter()
        .any(|v| std::env::var(v).ok() == Some(target.ip().to_string()));
    if !iwarp {
        return None;
    }
    crate::kernel_fixes::Present::from_env().lacking(&["0015"])
}

/// The agent's `nvme_host` request for the target at `addr`, two I/O
/// queues, then `rest` (fio's parameters and the like).
pub fn host_request(addr: SocketAddr, rest: &str) -> String {
    format!(
        "nvme_host addr={addr} nqn={NQN} hostnqn=nqn.2014-08.org.nvmexpress:uuid:{HOSTID} hostid={HOSTID} queues=2 {rest}"
    )
}

/// Loads the target on `port` (the wildcard address), runs `f`, unloads
/// it; one suite pass at a time has it (`sample_module::with_loaded`).
pub fn with_target<R>(port: u16, f: impl FnOnce() -> Result<R>) -> Result<R> {
    sample_module::with_loaded(MODULE, port, &[&format!("ns_mib={NS_MIB}")], f)
}

/// The fields of a `ready ...` line.
pub fn ready_fields(line: &str) -> BTreeMap<String, String> {
    parse(line).1
}

/// What the host's result says, checked: the namespace's size, fio's
/// exit status 0 (its verify passed), the disconnect; fio's lines and
/// the host kernel's as notes (`# `).
pub fn judge_host(r: &BTreeMap<String, String>, note: impl Fn(&str)) -> Result<()> {
    let text = |k: &str| -> Result<String> {
        let v = r
            .get(k)
            .with_context(|| format!("the host's result has no {k}: {r:?}"))?;
        Ok(String::from_utf8_lossy(&unhex(v)?).into_owned())
    };
    let fio = text("fio")?;
    for l in fio.lines() {
        note(&format!("fio: {l}"));
    }
    for l in text("host_log")?.lines() {
        note(&format!("host: {l}"));
    }
    let field = |k: &str| r.get(k).map_or("", String::as_str);
    ensure!(
        field("bytes") == (NS_MIB << 20).to_string(),
        "the host's block device {} has {} bytes, not the namespace's {}",
        field("dev"),
        field("bytes"),
        NS_MIB << 20
    );
    ensure!(
        r.get("stopped").is_none() && r.get("timed_out").is_none(),
        "fio was killed: {r:?}"
    );
    ensure!(
        field("fio_status") == "0",
        "fio on {} exited with {}: {fio}",
        field("dev"),
        field("fio_status")
    );
    ensure!(
        field("disconnect") == "0",
        "nvme disconnect: {}",
        r.get("disconnect_out")
            .and_then(|d| unhex(d).ok())
            .map(|d| String::from_utf8_lossy(&d).into_owned())
            .unwrap_or_default()
    );
    Ok(())
}

/// Whether `r` is the target's "listening" line of its load on `port`.
fn listening(r: &Record, port: u16) -> bool {
    r.text.starts_with("rdma_cm_rs_nvmet: ")
        && r.text.ends_with(&format!(" listening on 0.0.0.0:{port}"))
}

/// The target's records (`rdma_cm_rs_nvmet: ...`, the layer it compiles
/// in too) from its last load on `port` on: ports are a pass's own, so
/// the load is the caller's.
pub fn target_log(port: u16) -> Result<Vec<Record>> {
    let records = kmsg::records()?;
    let start = records
        .iter()
        .rposition(|r| listening(r, port))
        .with_context(|| format!("no \"listening on 0.0.0.0:{port}\" line of the target"))?;
    Ok(records[start..]
        .iter()
        .filter(|r| r.text.starts_with("rdma_cm_rs_nvmet: "))
        .cloned()
        .collect())
}

/// The target's records of its load on `port` at warning level or worse
/// (a clean run logs none) fail, but for those ending with one of
/// `expected` (what the scenario provokes); the others are noted.
pub fn target_log_clean(port: u16, expected: &[&str], note: impl Fn(&str)) -> Result<()> {
    let log = target_log(port)?;
    for r in log.iter().skip(1) {
        note(&format!("target: {}", r.text));
    }
    let bad: Vec<&str> = log
        .iter()
        .filter(|r| r.level <= kmsg::WARNING)
        .map(|r| r.text.as_str())
        .filter(|t| !expected.iter().any(|e| t.ends_with(e)))
        .collect();
    ensure!(bad.is_empty(), "the target warned: {}", bad.join(" / "));
    Ok(())
}

/// The record that says the target failed controller `cntlid`.
fn failed_line(cntlid: &str) -> String {
    format!("rdma_cm_rs_nvmet: controller {cntlid} failed: disconnecting its queues")
}

/// `ctl peer-vm-killed --nvme-target ADDR` (two VMs): the kernel's NVMe
/// host in the peer VM does I/O (fio, time-based, verified) against the
/// target here, loaded on ADDR's port, when `kill` (`ctl
/// peer-vm-killed`'s own scenario, which writes
/// [`crate::faults::PEER_VM_KILLED`] to the kernel log once the host
/// killed the peer VM) runs.  Nothing tells the target: its keep-alive
/// sweep must fail the host's controller within [`KATO_S`] and
/// [`KATO_SLACK`] of the kill, as the kernel log's clock has it (or a
/// transport error sooner: an RDMA transfer to the dead machine whose
/// retries ran out), not before; then the target unloads, its queues to
/// the dead machine with it.  Two more results into `results`; see
/// [`lacking_fix`] for siw.
pub fn host_killed_mid_io(
    target: SocketAddr,
    agent: SocketAddr,
    results: &mut Flat,
    kill: impl FnOnce(&mut Flat) -> Result<()>,
) -> Result<()> {
    let port = target.port();
    sample_module::load_with(MODULE, port, &[&format!("ns_mib={NS_MIB}")])?;
    let mut loaded = Loaded(true);
    let request = host_request(
        target,
        &format!("{SMALL_FIO} runtime_s=600 timeout_s=900 kato={KATO_S}"),
    );
    let mut call = Call::start(&agent, &request)?;
    let ready = ready_fields(&call.ready()?);
    let field = |k: &str| ready.get(k).cloned().unwrap_or_default();
    let cntlid = field("cntlid");
    println!(
        "# NVMe host of the peer VM: {} ({}, controller {cntlid} of the target at {target}), fio under way",
        field("dev"),
        field("ctrl")
    );
    // fio's jobs started and their I/O flows.
    std::thread::sleep(Duration::from_secs(2));
    kill(results)?;
    let wanted = failed_line(&cntlid);
    let bound = Duration::from_secs(KATO_S) + KATO_SLACK;
    let waited = Instant::now();
    let (killed, failed) = loop {
        let log = kmsg::records()?;
        let killed = log
            .iter()
            .rposition(|r| r.text.contains(crate::faults::PEER_VM_KILLED))
            .context("no record of the kill in the kernel log")?;
        let start = log.iter().rposition(|r| listening(r, port)).unwrap_or(0);
        let failed = log[start..].iter().find(|r| r.text == wanted).cloned();
        if failed.is_some() || waited.elapsed() > bound + Duration::from_secs(5) {
            break (log[killed].clone(), failed);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for r in target_log(port)?.iter().skip(1) {
        println!("# target: {}", r.text);
    }
    match failed {
        Some(f) => {
            let after = f.usec as i64 - killed.usec as i64;
            results.result(
                after >= 0 && Duration::from_micros(after as u64) <= bound,
                &format!(
                    "NVMe host VM killed mid-I/O: the target failed its controller {cntlid} {} ms after the kill (keep-alive timeout {} s, bound {} ms)",
                    after / 1000,
                    KATO_S,
                    bound.as_millis()
                ),
            );
        }
        None => results.result(
            false,
            &format!(
                "NVMe host VM killed mid-I/O: the target did not fail controller {cntlid} (no \"{wanted}\" {} ms after the kill)",
                (bound + Duration::from_secs(5)).as_millis()
            ),
        ),
    }
    let t = Instant::now();
    let unloaded = sample_module::unload(MODULE);
    loaded.0 = false;
    results.result(
        unloaded.is_ok() && t.elapsed() < Duration::from_secs(10),
        &format!(
            "NVMe host VM killed mid-I/O: the target unloaded with the dead host's queues ({}) in {} ms",
            unloaded.map_or_else(|e| format!("{e:#}"), |()| "ok".into()),
            t.elapsed().as_millis()
        ),
    );
    // The agent died with its machine.
    drop(call);
    Ok(())
}

/// The target loaded until a failure path drops this.
struct Loaded(bool);

impl Drop for Loaded {
    fn drop(&mut self) {
        if self.0 {
            let _ = sample_module::unload(MODULE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_the_host_for_the_targets_subsystem() {
        let r = host_request("192.0.2.1:4420".parse().unwrap(), SMALL_FIO);
        let (verb, kv) = parse(&r);
        assert_eq!(verb, "nvme_host");
        assert_eq!(kv["nqn"], NQN);
        assert_eq!(kv["hostid"], HOSTID);
        assert!(kv["hostnqn"].ends_with(HOSTID));
        assert_eq!(kv["size_mib"], "4");
    }

    #[test]
    fn judges_the_hosts_result() {
        let hex = |s: &str| crate::payload::hex(s.as_bytes());
        let mut r = BTreeMap::new();
        for (k, v) in [
            ("dev", "/dev/nvme0n1".to_owned()),
            ("bytes", (NS_MIB << 20).to_string()),
            ("fio_status", "0".into()),
            ("fio", hex("nvme-host: (groupid=0, jobs=2): err= 0")),
            ("host_log", hex("")),
            ("disconnect", "0".into()),
        ] {
            r.insert(k.to_owned(), v);
        }
        judge_host(&r, |_| {}).unwrap();
        r.insert("fio_status".into(), "1".into());
        let e = judge_host(&r, |_| {}).unwrap_err();
        assert!(format!("{e:#}").contains("exited with 1"), "{e:#}");
    }

    #[test]
    fn knows_the_targets_lines() {
        let rec = |text: &str| Record {
            level: 6,
            seq: 1,
            usec: 1,
            text: text.into(),
        };
        assert!(listening(
            &rec("rdma_cm_rs_nvmet: nqn.2026-11.org.rdma-cm-rs:nvmet (64 MiB, 4 I/O queues of 128) listening on 0.0.0.0:4420"),
            4420
        ));
        assert!(!listening(
            &rec("rdma_cm_rs_nvmet: nqn.2026-11.org.rdma-cm-rs:nvmet (64 MiB, 4 I/O queues of 128) listening on 0.0.0.0:44201"),
            4420
        ));
        assert_eq!(
            failed_line("3"),
            "rdma_cm_rs_nvmet: controller 3 failed: disconnecting its queues"
        );
    }
}
