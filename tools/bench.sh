#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# `make bench`: the in-kernel CM consumer against a user-space librdmacm
# peer, side by side in one VM on the bench kernel, with the plain
# user-to-user rdmacm-utils figures of the same VM as outside references.
# Documentation/rdma_cm_rs/benchmarks.rst says what it measures and how to
# read it.  The steps, each announced by a "bench: [N/6]" line:
#
#   setup    tools/setup.sh --bench (make check's packages and gnuplot-nox)
#   kernel   the bench kernel, tools/kernel.sh --bench: .config.fragment
#            less the debug options, with ACPI for a clocksource finer than
#            jiffies (bench.config.fragment), cached in
#            $RDMA_CM_RS_CACHE/kernel/VERSION-bench-KEY; never built by
#            make check
#   module   rdma_cm_rs.ko and the sample modules built against it from a
#            copy of the sources, into build/bench-module/ of the build
#            directory (the test kernel's objects are left alone)
#   tool     the userspace tool's release build (as `make tool`)
#   vm       one VM (tools/vm/run) with the bench kernel and the module:
#            the guest's clocksource is checked first (jiffies or
#            refined-jiffies ends the run: no latency would mean anything);
#            then `userspace-test bench --out-dir RESULTS` (it writes
#            table.md and plot.tsv there; the bench-built .ko files are at
#            $RDMA_CM_RS_OUT in its environment); then the references,
#            each BENCH_REFERENCE_RUNS times (default 3), timed: cmtime
#            (server `cmtime -b IP -p PORT`, client `cmtime -s IP -b IP -c
#            100 -p PORT`) and `rping -c -a IP -p PORT -C 1000 -S 64`
#            against `rping -s -a IP -p PORT`; then tools/nvme-bench.sh:
#            the Rust NVMe target against the C nvmet-rdma target, the
#            same fio jobs (nvme.tsv, nvme.md, nvme-plot.tsv)
#   plot     plot.png from plot.tsv with gnuplot, on the host: the ratio
#            kernel / user-space of each metric as a bar, a line at 1.0;
#            scale.png from scale.tsv: setup time and memory per
#            connection against the connections open at once; nvme.png
#            from nvme-plot.tsv: Rust target / C target per metric
#
# Results: build/bench/DATE/ of the build directory (tools/lib/env.sh),
# build/bench/latest pointing to the newest: clocksource.txt, bench.log
# (the tool's output), table.md, plot.tsv, plot.png, scale.tsv, scale.png,
# cmtime-N.txt,
# rping-N.txt, references.tsv (seconds per reference run), run.txt (date,
# machine, kernel, commit), vm/ (the VM's console, dmesg, output, timing).
# Exit status: 0 when every step passed; 3 the guest keeps time with
# jiffies; 4 the tool has no `bench` subcommand; otherwise the failing
# step's.
#
# Environment: BENCH_KDIR=DIR a bench kernel build of one's own (skips
# building it); RDMA_CM_RS_BENCH_TIMEOUT the VM command's limit in seconds
# (default 3600); BENCH_REFERENCE_RUNS as above.
#
# In the guest tools/vm/run runs this script as
#   tools/bench.sh --in-vm RESULTS TOOL MODULE_DIR
# which is the vm step's guest side.
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."

say() { printf 'bench: %s\n' "$*"; }
# die MESSAGE [STATUS]
die() {
	printf 'bench: error: %s\n' "$1" >&2
	exit "${2:-1}"
}

# --- the guest side ------------------------------------------------------------
# in_vm RESULTS TOOL MODULE_DIR: runs in the VM, cwd the repository, as
# root, rxe0 up at $RDMA_CM_RS_LOCAL_IP, rdma_cm_rs.ko loaded.
in_vm() {
	local dir=$1 tool=$2 mods=$3 ip=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1}
	local runs=${BENCH_REFERENCE_RUNS:-3} cs sys=/sys/devices/system/clocksource/clocksource0
	local rc=0 i st t0 t1 server
	cs=$(cat "$sys/current_clocksource")
	{
		echo "current: $cs"
		echo "available: $(cat "$sys/available_clocksource")"
		echo "kernel log:"
		dmesg | grep -iE 'clocksource|tsc|hpet' || true
	} >"$dir/clocksource.txt"
	case $cs in
	jiffies | refined-jiffies)
		say "guest: error: the clocksource is $cs, which moves in steps of 1/HZ (4 ms):" >&2
		say "guest: error: no latency below milliseconds can be measured; refusing to report any." >&2
		say "guest: error: the bench kernel needs ACPI to find the HPET (bench.config.fragment); see $dir/clocksource.txt" >&2
		return 3
		;;
	esac
	say "guest: clocksource $cs (available: $(cat "$sys/available_clocksource"))"

	if ! "$tool" bench --help >/dev/null 2>&1; then
		say "guest: error: $tool has no 'bench' subcommand (tools/userspace-test/src/bench.rs):" >&2
		say "guest: error: no kernel / user-space table this run; the references run all the same" >&2
		rc=4
	else
		say "guest: userspace-test bench --out-dir $dir"
		t0=$(date +%s.%N)
		RDMA_CM_RS_OUT=$mods "$tool" bench --out-dir "$dir" 2>&1 | tee "$dir/bench.log"
		st=${PIPESTATUS[0]}
		t1=$(date +%s.%N)
		say "guest: userspace-test bench exited with status $st after $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s"
		[ "$st" = 0 ] || rc=$st
	fi

	# The references, user space to user space on rxe0 (librdmacm on both
	# sides, no module in the loop).  TIMEFORMAT: real, user, system s.
	printf 'reference\trun\treal_s\tuser_s\tsys_s\tstatus\n' >"$dir/references.tsv"
	local TIMEFORMAT=$'%3R\t%3U\t%3S'
	for ((i = 1; i <= runs; i++)); do
		say "guest: cmtime -c 100, run $i of $runs"
		cmtime -b "$ip" -p 7330 >"$dir/cmtime-server-$i.txt" 2>&1 &
		server=$!
		wait_listener 7330
		st=0
		{ time timeout 300 cmtime -s "$ip" -b "$ip" -c 100 -p 7330 >"$dir/cmtime-$i.txt" 2>&1 || st=$?; } 2>"$dir/.time"
		printf 'cmtime -c 100\t%d\t%s\t%d\n' "$i" "$(cat "$dir/.time")" "$st" >>"$dir/references.tsv"
		kill "$server" 2>/dev/null || true
		wait "$server" 2>/dev/null || true
		[ "$st" = 0 ] || { say "guest: error: cmtime exited with status $st (cmtime-$i.txt)" >&2; [ "$rc" != 0 ] || rc=1; }
		grep -E '^(step|[a-z ]+:)' "$dir/cmtime-$i.txt" | sed 's/^/bench: guest:   /' || true

		say "guest: rping -C 1000 -S 64, run $i of $runs"
		timeout 300 rping -s -a "$ip" -p 7331 >"$dir/rping-server-$i.txt" 2>&1 &
		server=$!
		wait_listener 7331
		st=0
		{ time timeout 300 rping -c -a "$ip" -p 7331 -C 1000 -S 64 >"$dir/rping-$i.txt" 2>&1 || st=$?; } 2>"$dir/.time"
		printf 'rping -C 1000 -S 64\t%d\t%s\t%d\n' "$i" "$(cat "$dir/.time")" "$st" >>"$dir/references.tsv"
		wait "$server" 2>/dev/null || true
		[ "$st" = 0 ] || { say "guest: error: rping exited with status $st (rping-$i.txt)" >&2; [ "$rc" != 0 ] || rc=1; }
		say "guest:   $(cut -f1 "$dir/.time") s"
	done
	rm -f "$dir/.time"

	# NVMe over Fabrics: the Rust target against the C target.
	say "guest: tools/nvme-bench.sh (the Rust NVMe target and the C one, $runs repetitions)"
	st=0
	tools/nvme-bench.sh "$dir" "$mods" "$runs" 2>&1 | tee "$dir/nvme.log" || st=$?
	[ "$st" = 0 ] || { say "guest: error: tools/nvme-bench.sh exited with status $st (nvme.log)" >&2; [ "$rc" != 0 ] || rc=1; }
	# The watchdog may have changed the clocksource during the run.
	echo "at the end: $(cat "$sys/current_clocksource")" >>"$dir/clocksource.txt"
	return "$rc"
}
# wait_listener PORT: until an RDMA CM id listens on PORT (5 s at most; the
# client's failure says the rest).
wait_listener() {
	local i
	for ((i = 0; i < 50; i++)); do
		# No `grep -q`: under pipefail a writer it leaves behind dies of
		# SIGPIPE and the match counts as none.
		rdma resource show cm_id 2>/dev/null | grep -E "LISTEN" | grep -E "[:.]$1( |$)" >/dev/null && return 0
		sleep 0.1
	done
	say "guest: warning: no listener on port $1 after 5 s" >&2
}

if [ "${1:-}" = --in-vm ]; then
	[ $# = 4 ] || die "usage: tools/bench.sh --in-vm RESULTS TOOL MODULE_DIR" 2
	set +e
	in_vm "$2" "$3" "$4"
	exit $?
fi
[ $# = 0 ] || die "no arguments (tools/bench.sh --help)" 2

# --- the host side ---------------------------------------------------------------
. tools/lib/env.sh
steps=6
n=0
step() {
	n=$((n + 1))
	say "[$n/$steps] $* ($(date +%H:%M:%S))"
}
start=$(date +%s)
logs=${RDMA_CM_RS_LOGS:-$out_dir/build/logs}
mkdir -p "$logs"

step "setup: tools/setup.sh --bench"
tools/setup.sh --bench

if [ -n "${BENCH_KDIR:-}" ]; then
	step "kernel: BENCH_KDIR=$BENCH_KDIR"
	kdir=$BENCH_KDIR
else
	step "kernel: the bench kernel (tools/kernel.sh --bench; cached, else about 15 min)"
	kdir=$(tools/kernel.sh --bench)
fi
[ -f "$kdir/arch/x86/boot/bzImage" ] || die "no bzImage in $kdir"

# The module's sources copied beside its objects, mtimes kept, so that
# rebuilding is incremental; M= the copy, MO= the objects (as env.sh's
# module_dirs does for a read-only checkout).
mod_out=$out_dir/build/bench-module
step "module: rdma_cm_rs.ko and the samples against $kdir, into $mod_out"
rm -rf "$mod_out/src"
mkdir -p "$mod_out/src"
tar -C "$repo_root" --exclude='*.o' --exclude='*.ko' --exclude='*.mod*' --exclude='.*.cmd' \
	-cf - Kbuild rust samples | tar -C "$mod_out/src" -xf -
if ! make -C "$kdir" M="$mod_out/src" MO="$mod_out" LLVM=-19 modules >"$logs/bench-module.log" 2>&1; then
	tail -n 30 "$logs/bench-module.log" >&2
	die "the module did not build against the bench kernel (log $logs/bench-module.log)"
fi
for m in rdma_cm_rs rdma_cm_rs_echo rdma_cm_rs_rping rdma_cm_rs_store rdma_cm_rs_nvmet; do
	[ -f "$mod_out/$m.ko" ] || die "no $mod_out/$m.ko after the build"
done

step "tool: cargo build --release --locked"
(cd tools/userspace-test && cargo build --release --locked)

# The guest's CPU without ERMS: TCG runs `rep movsb` a byte at a time, so
# with ERMS the guest kernel's copies from and to user memory, which take
# `rep movsb` from 64 bytes on, cost ten times glibc's vector copies in
# the user side (benchmarks.rst); without it the kernel copies eight
# bytes an instruction.  Both sides run on this one CPU model.
tcg_cpu=max,la57=off,erms=off
results=$out_dir/build/bench/$(date +%Y-%m-%d-%H%M%S)
mkdir -p "$results"
ln -sfn "$(basename "$results")" "$out_dir/build/bench/latest"
{
	echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
	echo "commit: $(git -C "$repo_root" describe --always --dirty 2>/dev/null || echo unknown)"
	echo "host: $(nproc) CPUs, $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
	echo "host kernel: $(uname -r)"
	echo "qemu: $(qemu-system-x86_64 --version | head -n1)"
	echo "bench kernel: $kdir"
	echo "guest CPU under TCG: $tcg_cpu (under KVM: host)"
	echo "module: $mod_out"
	echo "tool: $tool_bin"
} >"$results/run.txt"
timeout=${RDMA_CM_RS_BENCH_TIMEOUT:-3600}
step "vm: one VM with the bench kernel, results in $results (at most $timeout s)"
t0=$(date +%s)
vm_rc=0
# tsc=reliable: the two vCPUs of a TCG guest read one host TSC, but the
# kernel finds them "unsynchronized" and falls back to the HPET, an emulated
# device whose every read is an MMIO exit (benchmarks.rst).
tools/vm/run --kernel "$kdir" --timeout "$timeout" --share-rw "$results" --kernel-arg tsc=reliable \
	--tcg-cpu "$tcg_cpu" \
	--keep-logs "$results/vm" --stream --module "$mod_out/rdma_cm_rs.ko" -- \
	"$(printf '%q ' tools/bench.sh --in-vm "$results" "$tool_bin" "$mod_out")" || vm_rc=$?
say "vm: $(($(date +%s) - t0)) s, exit status $vm_rc"

step "plot: plot.png from plot.tsv, nvme.png from nvme-plot.tsv (gnuplot)"
plot_rc=0
# ratio_plot NAME TITLE LABEL COLOUR BMARGIN: NAME.png from NAME's TSV
# (plot.tsv for "plot", else NAME-plot.tsv: metric, a, b, unit) as the
# ratio a / b per metric, a bar from 1.0 (equal) up or down, on a log
# scale so that 2x and 0.5x are bars of one length.
ratio_plot() {
	local name=$1 title=$2 label=$3 colour=$4 bmargin=$5 tsv rows
	tsv=$results/$name-plot.tsv
	[ "$name" != plot ] || tsv=$results/plot.tsv
	rows=$(tail -n +2 "$tsv" 2>/dev/null | grep -c . || true)
	if [ "${rows:-0}" -eq 0 ]; then
		say "plot: no $(basename "$tsv") in $results: no $name.png" >&2
		return 1
	fi
	cat >"$results/$name.gp" <<EOF
# Made by tools/bench.sh from $(basename "$tsv"): $label per metric.
set terminal pngcairo size $((300 + 36 * rows > 900 ? 300 + 36 * rows : 900)),1000 noenhanced font 'sans,9'
set output '$results/$name.png'
set datafile separator "\t"
set title "rdma-cm-rs: $title ($(basename "$results"), $(grep '^current' "$results/clocksource.txt" 2>/dev/null | cut -d' ' -f2) clocksource)"
set ylabel '$label (log scale)'
set logscale y 2
set format y '%g'
set xtics rotate by -60 left nomirror
set bmargin $bmargin
set rmargin 24
set grid ytics
set xrange [-0.6:$rows - 0.4]
set key top left
ratio(a, b) = (a > 0 && b > 0) ? a / b : NaN
plot '$tsv' skip 1 using 0:(ratio(\$2, \$3)):(\$0 - 0.4):(\$0 + 0.4):(1):(ratio(\$2, \$3)):xtic(sprintf('%s (%s)', strcol(1), strcol(4))) \\
	with boxxyerror fill solid 0.8 border -1 lc rgb '$colour' title '$label', \\
	1 with lines dt 2 lw 2 lc rgb '#000000' title '1.0: equal'
EOF
	if gnuplot "$results/$name.gp" 2>"$logs/bench-gnuplot-$name.log"; then
		say "plot: $results/$name.png ($rows metrics)"
	else
		cat "$logs/bench-gnuplot-$name.log" >&2
		say "error: gnuplot failed on $tsv ($rows metrics)" >&2
		return 1
	fi
}
ratio_plot plot "kernel-side peer / user-space librdmacm peer" 'kernel / user-space' '#3465a4' 28 ||
	plot_rc=1

# The scaling curve: setup time and memory per connection against the
# number of connections open at once, both sides, log-log.
if [ "$(tail -n +2 "$results/scale.tsv" 2>/dev/null | grep -c .)" -gt 0 ]; then
	cat >"$results/scale.gp" <<EOF
# Made by tools/bench.sh from scale.tsv.
set terminal pngcairo size 1100,450 noenhanced font 'sans,9'
set output '$results/scale.png'
set datafile separator "\t"
set datafile missing 'NaN'
set multiplot layout 1,2 title "rdma-cm-rs: connections open at once ($(basename "$results"))"
set logscale x 10
set xlabel 'connections open at once'
set grid
set key top left
set logscale y 10
set ylabel 'setup until the last is established (ms)'
plot '$results/scale.tsv' skip 1 using 1:2 with linespoints lw 2 title 'kernel (module)', \\
	'' skip 1 using 1:3 with linespoints lw 2 title 'user space (librdmacm)'
unset logscale y
set yrange [0:*]
set ylabel 'guest memory in use per connection (KiB, both ends)'
plot '$results/scale.tsv' skip 1 using 1:4 with linespoints lw 2 title 'kernel (module)', \\
	'' skip 1 using 1:5 with linespoints lw 2 title 'user space (librdmacm)'
unset multiplot
EOF
	if gnuplot "$results/scale.gp" 2>"$logs/bench-gnuplot-scale.log"; then
		say "plot: $results/scale.png"
	else
		cat "$logs/bench-gnuplot-scale.log" >&2
		say "error: gnuplot failed on $results/scale.tsv" >&2
		plot_rc=1
	fi
fi

# The NVMe targets: Rust / C per metric.
ratio_plot nvme "NVMe over RDMA, Rust target / C nvmet-rdma target, kernel host over rxe" \
	'Rust / C' '#cc0000' 24 || plot_rc=1

[ ! -s "$results/table.md" ] || { echo; cat "$results/table.md"; echo; }
[ ! -s "$results/nvme.md" ] || { echo "NVMe over RDMA, Rust target / C target:"; cat "$results/nvme.md"; echo; }

if [ -s "$results/references.tsv" ]; then
	say "references (seconds per run):"
	column -t -s $'\t' "$results/references.tsv" | sed 's/^/bench:   /'
fi
say "results in $results ($(($(date +%s) - start)) s in all)"
[ "$vm_rc" = 0 ] || die "the VM run failed (exit status $vm_rc; $results/vm/)" "$vm_rc"
[ "$plot_rc" = 0 ] || die "no plot" 1
