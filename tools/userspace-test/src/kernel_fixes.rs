// SPDX-License-Identifier: GPL-2.0
//! The kernel fixes of `tools/kernel-patches/` and which of them the running
//! kernel carries: a scenario that needs one the kernel lacks is skipped as
//! `# SKIP needs kernel fix NNNN (<subject>)`, never run into a known
//! kernel bug (a panic of the VM, a report of the dmesg gate, a hang).

use std::collections::BTreeSet;

/// One patch of `tools/kernel-patches/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFix {
    /// The number its file name starts with.
    pub number: &'static str,
    /// Its subject, without the `[PATCH n/m]` prefix.
    pub subject: &'static str,
}

/// The series, in order (a cargo test checks it against the patch files).
pub const FIXES: &[KernelFix] = &[
    fix(
        "0001",
        "RDMA/siw: take sk_callback_lock with bottom halves disabled",
    ),
    fix(
        "0002",
        "RDMA/siw: install the QP's socket callbacks before sending the MPA Reply",
    ),
    fix(
        "0003",
        "RDMA/siw: do not truncate the MPA private data length to 8 bits",
    ),
    fix(
        "0004",
        "RDMA/iwcm: reject a connection request dropped with its listener",
    ),
    fix(
        "0005",
        "RDMA/siw: never hand out the mmap key user space takes for \"invalid\"",
    ),
    fix(
        "0006",
        "RDMA/siw: ignore the close of a not yet accepted connection",
    ),
    fix(
        "0007",
        "RDMA/siw: wake the waiters of a CEP before unlocking it",
    ),
    fix(
        "0008",
        "RDMA/rxe: drop queued packets with interrupts enabled",
    ),
    fix(
        "0009",
        "RDMA/siw: receive the data that came with the peer's FIN",
    ),
    fix(
        "0010",
        "RDMA/siw: accept an end of stream right after a complete MPA frame",
    ),
    fix(
        "0011",
        "RDMA/siw: hide partial private data of a reply cut short by a close",
    ),
    fix(
        "0012",
        "RDMA/siw: process the MPA reply that came with the peer's FIN",
    ),
    fix(
        "0013",
        "RDMA/cma: put an id's GID entry before its cma_device",
    ),
    fix("0014", "RDMA/rxe: count down a transport retry count of 7"),
    fix(
        "0015",
        "RDMA/siw: flush the ORQ when a closing QP moves to ERROR",
    ),
    fix(
        "0016",
        "RDMA/nldev: resume a resource dump after the last entry it sent",
    ),
    fix(
        "0017",
        "RDMA/siw: complete a READ flushed before it was sent only once",
    ),
];

const fn fix(number: &'static str, subject: &'static str) -> KernelFix {
    KernelFix { number, subject }
}

/// The fixes the running kernel carries: `RDMA_CM_RS_KERNEL_FIXES`, their
/// numbers separated by commas, as `tools/vm/run` sets it from
/// `tools/kernel-fixes.sh`.  Unset, the kernel is taken to carry none.
#[derive(Clone, Debug, Default)]
pub struct Present(BTreeSet<String>);

impl Present {
    pub fn from_env() -> Self {
        Self::parse(&std::env::var("RDMA_CM_RS_KERNEL_FIXES").unwrap_or_default())
    }

    pub fn parse(list: &str) -> Self {
        Self(
            list.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect(),
        )
    }

    /// Whether the kernel carries fix `number`.
    pub fn has(&self, number: &str) -> bool {
        self.0.contains(number)
    }

    /// The skip reason for a scenario needing `numbers`, if one is absent.
    pub fn lacking(&self, numbers: &[&str]) -> Option<String> {
        let n = numbers.iter().find(|n| !self.has(n))?;
        let subject = FIXES
            .iter()
            .find(|f| f.number == *n)
            .map_or("unknown fix", |f| f.subject);
        Some(format!("needs kernel fix {n} ({subject})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// FIXES names the patch files of tools/kernel-patches/, in order, with
    /// their subjects.
    #[test]
    fn fixes_match_the_patch_files() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernel-patches");
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .expect("tools/kernel-patches")
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "patch"))
            .collect();
        files.sort();
        let found: Vec<(String, String)> = files
            .iter()
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                let text = std::fs::read_to_string(p).unwrap();
                // The header's Subject, unfolded: git format-patch folds
                // a long one onto lines that start with a space.
                let header = text.split("\n\n").next().unwrap().replace("\n ", " ");
                let subject = header
                    .lines()
                    .find_map(|l| l.strip_prefix("Subject: "))
                    .expect("a Subject: line");
                let subject = match subject.strip_prefix("[PATCH") {
                    Some(rest) => &rest[rest.find("] ").expect("[PATCH ...] ") + 2..],
                    None => subject,
                };
                (name[..4].to_string(), subject.to_string())
            })
            .collect();
        let table: Vec<(String, String)> = FIXES
            .iter()
            .map(|f| (f.number.to_string(), f.subject.to_string()))
            .collect();
        assert_eq!(found, table);
    }

    #[test]
    fn lacking_names_the_first_absent_fix() {
        let present = Present::parse("0001, 0003");
        assert!(present.has("0003"));
        assert_eq!(present.lacking(&["0001", "0003"]), None);
        assert_eq!(
            present.lacking(&["0001", "0002"]).as_deref(),
            Some("needs kernel fix 0002 (RDMA/siw: install the QP's socket callbacks before sending the MPA Reply)")
        );
        assert!(Present::parse("").lacking(&["0001"]).is_some());
    }
}
