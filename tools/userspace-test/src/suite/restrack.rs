// SPDX-License-Identifier: GPL-2.0

//! What `rdma res` shows of the module's resources while others go: the
//! kernel's resource dump, which tools and this suite read.

#[allow(unused_imports)]
use super::*;

/// Ids the scenario binds: the first half destroyed during the dumps, the
/// second half alive throughout.
const IDS: usize = 400;

/// The destroyed ids go in this many batches, one more dump started
/// before each: at least as many dumps run while ids are destroyed.
const BATCHES: usize = 4;

/// `rdma res show cm_id` lists every id that lives from the dump's start
/// to its end, while ids listed before them are destroyed: 400 ids bound
/// to the device's address, one port each, then the 200 first destroyed
/// one every 2 ms while dumps run back to back, in [`BATCHES`] batches
/// each begun once one more dump started (a loaded VM dumps slowly); every
/// dump must list the 200 that stay.  A dump of this many ids takes
/// several messages, and a kernel that resumes each after the count of
/// entries it sent (nldev before kernel fix 0016) skips live ids once
/// earlier ones are gone.
pub(super) fn res_dump_lists_every_live_id(ctx: &mut Ctx) -> Result<()> {
    let dev = Device::open()?;
    let mut ids = Vec::with_capacity(IDS);
    for i in 0..IDS {
        let port = ctx.port();
        let id = dev.create_id(i as u64 + 1)?;
        dev.bind(id, &SocketAddr::new(ctx.local4, port))
            .with_context(|| format!("bind of id {} to port {port}", i + 1))?;
        ids.push((id, port));
    }
    let (going, staying) = ids.split_at(IDS / 2);
    let ports = |dump: &str| -> std::collections::BTreeSet<u16> {
        dump.lines()
            .filter_map(|l| {
                let addr = l
                    .split_whitespace()
                    .skip_while(|w| *w != "src-addr")
                    .nth(1)?;
                addr.rsplit(':').next()?.parse().ok()
            })
            .collect()
    };
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let done = AtomicBool::new(false);
    let started = AtomicUsize::new(0);
    let (dumps, destroyed) = std::thread::scope(|s| {
        let dumper = s.spawn(|| -> Result<Vec<std::collections::BTreeSet<u16>>> {
            let mut seen = Vec::new();
            loop {
                let finished = done.load(Ordering::Acquire);
                started.fetch_add(1, Ordering::AcqRel);
                let out = std::process::Command::new("rdma")
                    .args(["res", "show", "cm_id"])
                    .output()
                    .context("rdma res show cm_id")?;
                seen.push(ports(&String::from_utf8_lossy(&out.stdout)));
                if finished {
                    return Ok(seen);
                }
            }
        });
        let mut destroyed: Result<()> = Ok(());
        let from = started.load(Ordering::Acquire);
        'batches: for (k, batch) in going.chunks(going.len().div_ceil(BATCHES)).enumerate() {
            // A dumper that ended did so on an error, reported below.
            let next_dump = poll_until(T.into(), 1, || {
                Ok(started.load(Ordering::Acquire) > from + k || dumper.is_finished())
            });
            if !matches!(next_dump, Ok(true)) || dumper.is_finished() {
                destroyed = Err(anyhow!("dump {} did not start within {T} ms", k + 1));
                break 'batches;
            }
            for &(id, _) in batch {
                if let Err(e) = dev.destroy(id) {
                    destroyed = Err(anyhow::Error::from(e).context("DESTROY_ID"));
                    break 'batches;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        done.store(true, Ordering::Release);
        (dumper.join(), destroyed)
    });
    // The dumps' failure first: it ends the batches' wait too.
    let dumps = dumps.map_err(|_| anyhow!("the dumping thread panicked"))??;
    destroyed?;
    let incomplete: Vec<usize> = dumps
        .iter()
        .map(|seen| {
            staying
                .iter()
                .filter(|(_, port)| !seen.contains(port))
                .count()
        })
        .collect();
    for &(id, _) in staying {
        dev.destroy(id)?;
    }
    ensure!(
        dumps.len() > BATCHES,
        "only {} dumps ran while ids were destroyed",
        dumps.len()
    );
    ensure!(
        incomplete.iter().all(|&n| n == 0),
        "of {} dumps, these lacked ids that lived throughout (of {}): {incomplete:?}",
        dumps.len(),
        staying.len()
    );
    println!(
        "# {} dumps while {} of {IDS} ids were destroyed: each listed the {} that stayed",
        dumps.len(),
        going.len(),
        staying.len()
    );
    Ok(())
}
