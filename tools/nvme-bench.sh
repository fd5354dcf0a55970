#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# The NVMe over Fabrics part of `make bench`, in the bench VM (tools/bench.sh
# runs it after the tool's benchmarks): the same fio jobs from the kernel's
# NVMe host over rxe0 against (a) the Rust target (rdma_cm_rs_nvmet.ko, a
# RAM namespace) and (b) the kernel's C target (nvmet-rdma over brd, a RAM
# disk of the same size), REPS times each, alternating:
#   randread-qd1    4 KiB random reads, queue depth 1: p50 and p99 latency
#   randread-qd32   4 KiB random reads, queue depth 32 (2 jobs of 16, so
#                   both I/O queues): IOPS
#   randwrite-qd32  4 KiB random writes, the same: IOPS
#   read-128k       128 KiB sequential reads, 2 jobs of queue depth 4: MB/s
#   write-128k      128 KiB sequential writes, the same: MB/s
# and the guest's CPU time per I/O of each job (/proc/stat, all CPUs,
# busy jiffies over the job's I/Os).  Writes RESULTS/nvme.tsv (one row a
# job, target and repetition), RESULTS/nvme-plot.tsv (the medians, Rust
# and C, a row a metric) and RESULTS/nvme.md (the table: medians and
# Rust / C).
#
# Usage: tools/nvme-bench.sh RESULTS MODULE_DIR [REPS]
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
. tools/lib/nvme.sh

dir=$1 mods=$2 reps=${3:-3}
ip=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1}
size_mib=256
rust_nqn=nqn.2026-11.org.rdma-cm-rs:nvmet
c_nqn=nqn.2026-11.org.rdma-cm-rs:c-target
hostid=8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0002
hostnqn=nqn.2014-08.org.nvmexpress:uuid:$hostid
runtime=${BENCH_NVME_RUNTIME:-10}
say() { printf 'bench: guest: nvme: %s\n' "$*"; }

load_nvme_modules $size_mib || { say "error: the NVMe modules did not load" >&2; exit 1; }
c_target "$c_nqn" 4421 "$ip" || { say "error: the C target was not configured" >&2; exit 1; }
insmod "$mods/rdma_cm_rs_nvmet.ko" ns_mib=$size_mib || { say "error: insmod rdma_cm_rs_nvmet" >&2; exit 1; }
rust_dev=$(connect_dev "$rust_nqn" "$ip" 4420 2) || { say "error: no connection to the Rust target" >&2; exit 1; }
c_dev=$(connect_dev "$c_nqn" "$ip" 4421 2) || { say "error: no connection to the C target" >&2; exit 1; }
say "Rust target $rust_dev, C target $c_dev, $size_mib MiB each, ${runtime} s a job, $reps repetitions"
# Both namespaces written once, so that reads read data (brd reads of
# pages never written return zeroes without touching memory).
for dev in "$rust_dev" "$c_dev"; do
	fio --name=fill --filename="$dev" --direct=1 --ioengine=libaio --rw=write --bs=1m \
		--iodepth=8 --size=${size_mib}m >/dev/null 2>&1 || { say "error: filling $dev" >&2; exit 1; }
done

# busy_jiffies: the guest's busy CPU time so far (all CPUs), in jiffies.
busy_jiffies() {
	awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

jobs=(
	"randread-qd1 --rw=randread --bs=4k --iodepth=1 --numjobs=1"
	"randread-qd32 --rw=randread --bs=4k --iodepth=16 --numjobs=2"
	"randwrite-qd32 --rw=randwrite --bs=4k --iodepth=16 --numjobs=2"
	"read-128k --rw=read --bs=128k --iodepth=4 --numjobs=2"
	"write-128k --rw=write --bs=128k --iodepth=4 --numjobs=2"
)
hz=$(getconf CLK_TCK)
printf 'job\ttarget\trep\tiops\tmb_s\tp50_us\tp99_us\tcpu_us_per_io\n' >"$dir/nvme.tsv"
rc=0
for ((r = 1; r <= reps; r++)); do
	for j in "${jobs[@]}"; do
		read -r job opts <<<"$j"
		for target in rust c; do
			dev=$rust_dev
			[ $target = c ] && dev=$c_dev
			b0=$(busy_jiffies)
			# shellcheck disable=SC2086 # the job's options, split
			if ! fio --name="$job" --filename="$dev" --direct=1 --ioengine=libaio --thread \
				--group_reporting --time_based --runtime="$runtime" --ramp_time=1 \
				--size=${size_mib}m --offset_increment=$((size_mib / 2))m $opts \
				--output-format=json >"$dir/nvme-$job-$target-$r.json" 2>"$dir/nvme-$job-$target-$r.err"; then
				say "error: fio $job on the $target target failed ($dir/nvme-$job-$target-$r.err)" >&2
				rc=1
				continue
			fi
			b1=$(busy_jiffies)
			python3 - "$dir/nvme-$job-$target-$r.json" "$job" "$target" "$r" "$((b1 - b0))" "$hz" \
				"$runtime" >>"$dir/nvme.tsv" <<'PY'
import json, sys
path, job, target, rep, busy, hz, runtime = sys.argv[1:]
j = json.load(open(path))["jobs"][0]
side = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
iops = side["iops"]
mbs = side["bw_bytes"] / 1e6
pct = side["clat_ns"].get("percentile", {})
p50 = pct.get("50.000000", 0) / 1e3
p99 = pct.get("99.000000", 0) / 1e3
ios = side["total_ios"]
# The busy time covers the ramp too: scaled to the measured part.
cpu = int(busy) / int(hz) * 1e6 * int(runtime) / (int(runtime) + 1) / ios if ios else 0
print(f"{job}\t{target}\t{rep}\t{iops:.0f}\t{mbs:.1f}\t{p50:.1f}\t{p99:.1f}\t{cpu:.1f}")
PY
			say "$(tail -n 1 "$dir/nvme.tsv" | tr '\t' ' ')"
		done
	done
done
nvme disconnect -n "$rust_nqn" >/dev/null 2>&1
nvme disconnect -n "$c_nqn" >/dev/null 2>&1

# Medians per job and target, the metric each job is for, Rust / C.
python3 - "$dir/nvme.tsv" "$dir/nvme.md" "$dir/nvme-plot.tsv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
metrics = [
    ("randread-qd1", "p50_us", "4 KiB randread QD1 p50 latency", "us", "lower"),
    ("randread-qd1", "p99_us", "4 KiB randread QD1 p99 latency", "us", "lower"),
    ("randread-qd32", "iops", "4 KiB randread QD32", "IOPS", "higher"),
    ("randwrite-qd32", "iops", "4 KiB randwrite QD32", "IOPS", "higher"),
    ("read-128k", "mb_s", "128 KiB sequential read", "MB/s", "higher"),
    ("write-128k", "mb_s", "128 KiB sequential write", "MB/s", "higher"),
]
for job in ["randread-qd1", "randread-qd32", "randwrite-qd32", "read-128k", "write-128k"]:
    metrics.append((job, "cpu_us_per_io", f"{job} CPU per I/O", "us", "lower"))
def med(job, target, key):
    v = [float(r[key]) for r in rows if r["job"] == job and r["target"] == target]
    return statistics.median(v) if v else float("nan")
with open(sys.argv[2], "w") as md, open(sys.argv[3], "w") as plot:
    md.write("| metric | unit | Rust target | C target | Rust / C | better |\n|---|---|---|---|---|---|\n")
    plot.write("metric\trust\tc\tunit\n")
    for job, key, name, unit, better in metrics:
        r, c = med(job, "rust", key), med(job, "c", key)
        ratio = r / c if c else float("nan")
        md.write(f"| {name} | {unit} | {r:.1f} | {c:.1f} | {ratio:.2f} | {better} |\n")
        plot.write(f"{name}\t{r}\t{c}\t{unit}\n")
PY
cat "$dir/nvme.md" | sed 's/^/bench: guest: nvme: /'
exit $rc
