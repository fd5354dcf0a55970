//! What this machine's RDMA devices say about their QPs, captured for a
//! failure at the moment it is seen (before the teardown destroys the QPs).
//!
//! For a send that got no completion within its bound (on rxe: a receiver
//! that went to the error state before its ACK left, see "Debugging rxe"
//! in `Documentation/rdma_cm_rs/testing.rst`): the QP's state and PSNs
//! (`rdma res show qp`) on both machines say which side stopped, and rxe's
//! counters (`rdma statistic show`) whether it retried.

use std::process::Command;

/// The lines of `rdma res show qp` (those of QP `qp_num` when given, with
/// the peer QP in the same line) and `rdma statistic show`, each prefixed
/// with its command; a command that could not run says why.
pub fn rdma_state(qp_num: Option<u32>) -> Vec<String> {
    let mut lines = Vec::new();
    for args in [&["res", "show", "qp"][..], &["statistic", "show"][..]] {
        let what = format!("rdma {}", args.join(" "));
        match Command::new("rdma").args(args).output() {
            Ok(out) => lines.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|line| match (qp_num, args[0]) {
                        (Some(n), "res") => line.contains(&format!("lqpn {n} ")),
                        _ => true,
                    })
                    .map(|line| format!("{what}: {}", line.trim())),
            ),
            Err(err) => lines.push(format!("{what}: {err}")),
        }
    }
    lines
}
