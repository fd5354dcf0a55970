#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# `make check`: every test of the project, as nested KTAP v1
# (tools/testing/kunit/kunit.py parse reads it), then one line
# "N passed, N failed".
#
#   setup            packages and toolchain (tools/setup.sh), the test kernel
#                    (tools/kernel.sh, cached)
#   userspace-test   cargo fmt, clippy -D warnings, every cargo test, the
#                    release build of the librdmacm tool
#   module           the module and samples built with CLIPPY=1 and no
#                    warnings (rustc, clippy, C, objtool, modpost),
#                    rustfmt, no `unsafe` in the char device (rust/ctl) or
#                    the samples, the ioctl ABI page and the uapi header in
#                    step
#   vm-one           one VM (rxe on a dummy netdev, siw beside it): the KUnit
#                    suites at insmod, the userspace suite against the
#                    module on rxe and on siw, each with asynchronous and
#                    with synchronous ids (four passes at once; among its
#                    scenarios the kernel's NVMe host, nvme-cli and fio
#                    against the NVMe target sample),
#                    the sample echo module, the sample rping server
#                    against unmodified rping and the module's own rping
#                    client, the kernel's NVMe host against its C target
#                    over rxe and siw (tools/nvme-test.sh), a 45 s round of the seeded ioctl fuzzer
#                    (seed 2, whose path found the ib_cm use after free
#                    and the siw teardown hang) and beside it a short
#                    functional round of
#                    `make bench`'s measurements on rxe (10 cycles, 20
#                    round trips, 2 RDMA operations of 1 MiB; one leaf,
#                    its exit status: every step worked), the fault
#                    scenarios (rmmod while open,
#                    injected allocation failures), then device removal
#                    under 101 connections (last: it deletes and re-adds
#                    rxe0)
#   vm-two           two VMs (rxe and siw over two QEMU socket links), run
#                    from a copy of the tree under /tmp: the userspace
#                    suite with the librdmacm peer in the other VM, the
#                    four passes at once, then on rxe and on siw the
#                    scenarios that need the machine to themselves
#                    (`suite --alone`: the NVMe target's device deleted
#                    and re-added under the other VM's host and fio), then
#                    the peer VM killed by the host mid-transfer, its NVMe
#                    host mid-I/O against the NVMe target sample
#   ktap             kunit.py parse reads all of the above and counts as
#                    this script does
#
# Every guest runs with panic_on_warn=1 and each VM run is gated on a clean
# dmesg (tools/vm/dmesg-gate).  Each leaf counts once: a KUnit case, a case
# of the userspace suite or of an in-VM script, a cargo test, a build step
# or gate.  A leaf that could not run is a "# SKIP", counted apart and shown
# on a "# skipped" line; in the test VMs, which have every device the cases
# need, a skipped case is also a failure.  Exit status is non-zero if
# anything failed.  Long steps print progress as KTAP comments ("# ...") at
# least once a minute.
#
# Builds go to the checkout, or for a read-only one to RDMA_CM_RS_OUT
# (tools/lib/env.sh).  Logs: $RDMA_CM_RS_LOGS (default build/logs there);
# the KTAP as printed in check.ktap.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
. tools/lib/env.sh

logs=${RDMA_CM_RS_LOGS:-$out_dir/build/logs}
rm -rf "$logs"
mkdir -p "$logs"
logs=$(cd "$logs" && pwd -P)
export RDMA_CM_RS_LOGS=$logs
exec > >(tee "$logs/check.ktap")
tee_pid=$!
start_all=$(date +%s)

groups=(setup userspace-test module vm-one vm-two ktap)
top=0      # top-level results printed
passed=0   # leaves
failed=0
skipped=0
group=     # the open group
glines=    # its buffered lines
gn=0       # its results so far
gfail=0

note() { printf '# %s\n' "$*"; }
# The name of a result: no '#', which would start a KTAP directive.
clean() { local s=${1//#/No.}; printf '%s' "${s//$'\n'/ }"; }
gline() { glines+="$1"$'\n'; }
group_begin() {
	group=$1 glines= gn=0 gfail=0
	note "$group: started $(date +%H:%M:%S)"
}
# leaf STATUS NAME [LOGFILE]: a result in the open group; a failure shows
# the last lines of LOGFILE.
leaf() {
	local st=$1 name
	name=$(clean "$2")
	gn=$((gn + 1))
	if [ "$st" -eq 0 ]; then
		passed=$((passed + 1))
		gline "    ok $gn $name"
	else
		failed=$((failed + 1)) gfail=1
		if [ -n "${3:-}" ] && [ -f "$3" ]; then
			gline "    # $(clean "$3"), last lines:"
			gline "$(tail -n 40 "$3" | sed 's/^/    #   /')"
		fi
		gline "    not ok $gn $name"
	fi
}
leaf_skip() {
	gn=$((gn + 1)) skipped=$((skipped + 1))
	gline "    ok $gn $(clean "$1") # SKIP $2"
}
# subtree KIND LOG ARGS...: a nested subtest of the open group from
# tools/lib/ktap_tree.py, its leaves counted.
subtree() {
	local kind=$1 log=$2 p f s rc tree
	shift 2
	gn=$((gn + 1))
	tree=$(python3 tools/lib/ktap_tree.py "$kind" "$log" --number "$gn" --depth 1 \
		--counts "$logs/counts" "$@")
	rc=$?
	gline "$tree"
	read -r p f s <"$logs/counts" || { p=0 f=1 s=0; }
	passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
	[ "$rc" -eq 0 ] || gfail=1
	rm -f "$logs/counts"
	return "$rc"
}
group_end() {
	top=$((top + 1))
	printf '    KTAP version 1\n    # Subtest: %s\n    1..%d\n%s' "$group" "$gn" "$glines"
	if [ "$gfail" -eq 0 ] && [ "$gn" -gt 0 ]; then
		echo "ok $top $group"
	else
		echo "not ok $top $group"
	fi
	group=
}
# finish [WHY]: closes the open group; the groups not reached are skipped.
finish() {
	[ -z "$group" ] || group_end
	while [ "$top" -lt "${#groups[@]}" ]; do
		top=$((top + 1)) skipped=$((skipped + 1))
		echo "ok $top ${groups[$((top - 1))]} # SKIP not run: ${1:-an earlier failure}"
	done
	note "total $(($(date +%s) - start_all)) s; logs in $logs"
	note "skipped: $skipped"
	# What the count is: a scenario runs on rxe and siw, asynchronous and
	# synchronous, in one VM and in two.
	local leaves distinct
	sleep 0.5 # tee has written what was printed
	read -r leaves distinct _ < <(python3 tools/lib/distinct_checks.py "$logs/check.ktap" || echo "? ? ?")
	note "$leaves results of $distinct distinct checks (scenarios once per transport, mode and topology)"
	echo "$passed passed, $failed failed"
	exec >&- 2>&-
	wait "$tee_pid"
	[ "$failed" -eq 0 ]
	exit $?
}

# heartbeat LABEL FILE [shown]: every 60 s until killed, a comment with
# the time so far, the part of a VM command running (its last "ktap-part"
# line) and FILE's last line, so that a long step shows it is alive.  With
# "shown" (FILE's lines reach the terminal as they come) only after a
# minute in which FILE did not grow.
heartbeat() {
	local label=$1 file=$2 shown=${3:-} t0 last part size seen
	t0=$(date +%s)
	seen=$(stat -c %s "$file" 2>/dev/null || echo 0)
	while sleep 60 </dev/null >/dev/null 2>&1; do
		size=$(stat -c %s "$file" 2>/dev/null || echo 0)
		if [ -n "$shown" ] && [ "$size" != "$seen" ]; then
			seen=$size
			continue
		fi
		seen=$size
		part=$(sed -nE 's/^(VM A: )?ktap-part ([^ ]+)$/\2/p' "$file" 2>/dev/null | tail -n 1)
		last=$(tail -n 1 "$file" 2>/dev/null | cut -c1-150)
		note "$label: $(($(date +%s) - t0)) s so far${part:+, in $part}; last line: ${last:-(none yet)}"
	done
}
# timed NAME LOGFILE MODE CMD...: runs CMD with a heartbeat on LOGFILE
# (MODE "" or "shown", as for heartbeat), notes its time and returns its
# status.
timed() {
	local name=$1 log=$2 mode=$3 t0 hb rc
	shift 3
	t0=$(date +%s)
	heartbeat "$name" "$log" "$mode" &
	hb=$!
	"$@"
	rc=$?
	kill "$hb" 2>/dev/null
	wait "$hb" 2>/dev/null
	note "$name: $(($(date +%s) - t0)) s"
	return "$rc"
}
# into_log LOGFILE CMD...: CMD's output to LOGFILE.
into_log() {
	local log=$1
	shift
	"$@" >"$log" 2>&1
}
# shown_and_logged LOGFILE CMD...: CMD's stderr (its progress) to the
# terminal as KTAP comments as it is written, and to LOGFILE; its stdout
# to LOGFILE.out.
shown_and_logged() {
	local log=$1
	shift
	"$@" 2>&1 >"$log.out" | tee -a "$log" | sed -u 's/^/# /'
	return "${PIPESTATUS[0]}"
}
# watched NAME LOGFILE CMD...: CMD with a heartbeat, its output to LOGFILE.
watched() { timed "$1" "$2" "" into_log "$2" "${@:3}"; }
# step NAME LOGFILE CMD...: one leaf from the command's exit status.
step() {
	local rc
	watched "$@"
	rc=$?
	leaf "$rc" "$1" "$2"
	return "$rc"
}
# step_loud NAME LOGFILE CMD...: as step, for the long ones that report
# progress on stderr (shown_and_logged).
step_loud() {
	local rc
	: >"$2"
	timed "$1" "$2" shown shown_and_logged "$2" "${@:3}"
	rc=$?
	leaf "$rc" "$1" "$2"
	return "$rc"
}

echo "KTAP version 1"
echo "1..${#groups[@]}"

# --- setup -------------------------------------------------------------------
group_begin setup
step_loud "setup (tools/setup.sh)" "$logs/setup.log" tools/setup.sh || finish "setup failed"
# The kernel: the test kernel (tools/kernel-patches/ applied), with
# RDMA_CM_RS_KERNEL=stock (`make check KERNEL=stock`) the same configuration
# on the unpatched source, or a user's KDIR.
variant=${RDMA_CM_RS_KERNEL:-}
case "$variant" in
"" | stock) ;;
*) finish "RDMA_CM_RS_KERNEL=$variant: only stock is known" ;;
esac
if [ -n "${KDIR:-}" ]; then
	kdir=$KDIR
	# What the suite needs of a kernel: tools/vm/run says what is missing.
	kernel_has() {
		local f=$kdir/.config o missing=()
		[ -f "$kdir/arch/x86/boot/bzImage" ] || missing+=(bzImage)
		for o in CONFIG_RUST=y CONFIG_KUNIT=y CONFIG_INFINIBAND=m CONFIG_RDMA_RXE=m CONFIG_RDMA_SIW=m; do
			grep -qxF "$o" "$f" 2>/dev/null || grep -qxF "${o%=m}=y" "$f" 2>/dev/null || missing+=("$o")
		done
		echo "KDIR=$kdir"
		[ ${#missing[@]} -eq 0 ] || { echo "missing: ${missing[*]}"; return 1; }
	}
	step "kernel: KDIR has a bzImage, Rust, KUnit, rxe and siw" "$logs/kernel.log" kernel_has ||
		finish "KDIR lacks what the suite needs"
else
	step_loud "kernel build (tools/kernel.sh${variant:+ --$variant}, cached when unchanged)" \
		"$logs/kernel.log" tools/kernel.sh ${variant:+"--$variant"} || finish "no kernel"
	kdir=$(tail -n1 "$logs/kernel.log.out")
fi
# The fixes of tools/kernel-patches/ the kernel carries: the test kernel
# must carry all, another kernel gets the tests that need an absent one
# skipped ("# SKIP needs kernel fix NNNN (subject)").
if [ -f "$kdir/.rdma-cm-rs-fixes" ]; then
	cp "$kdir/.rdma-cm-rs-fixes" "$logs/kernel-fixes.log"
else
	tools/kernel-fixes.sh "$kdir" >"$logs/kernel-fixes.log" 2>&1
fi
fixes_total=$(grep -c . "$logs/kernel-fixes.log")
fixes_absent=$(awk '$2 != "present" { printf "%s%s", sep, $1; sep = " " }' "$logs/kernel-fixes.log")
if [ -z "${KDIR:-}$variant" ]; then
	[ -z "$fixes_absent" ]
	leaf $? "kernel: carries the $fixes_total fixes of tools/kernel-patches/" "$logs/kernel-fixes.log"
elif [ -z "$fixes_absent" ]; then
	leaf 0 "kernel: carries the $fixes_total fixes of tools/kernel-patches/"
else
	leaf_skip "kernel: carries the $fixes_total fixes of tools/kernel-patches/" \
		"lacks $fixes_absent: the tests that need them are skipped"
fi
group_end

# --- userspace-test ------------------------------------------------------------
mapfile -t module_dirs < <(module_dirs)
kmake() { make -C "$kdir" "${module_dirs[@]}" LLVM=-19 "$@"; }
# A fresh module build, so that clippy sees every file: the module's own
# objects go, not Kbuild's `clean`, which deletes every *.o and *.a under
# M=, the tool's cargo target directory included (cargo would not notice,
# and the tool's link then misses the static library its build.rs made).
rm -f "$out_dir"/*.ko "$out_dir"/*.mod "$out_dir"/*.mod.c "$out_dir"/*.o \
	"$out_dir/modules.order" "$out_dir/Module.symvers"
for d in rust samples; do
	[ ! -d "$out_dir/$d" ] || find "$out_dir/$d" -name '*.o' -delete
done
# One build serves both: clippy-driver compiles the module too.  It runs
# beside the tool's cargo steps: it is mostly one rustc at a time, and the
# machine has two cores.
t_module=$(date +%s)
kmake CLIPPY=1 modules >"$logs/module.log" 2>&1 &
module_pid=$!

# Cargo runs in the tool's directory; its build.rs runs bindgen (the uapi
# header, librdmacm and verbs) with env.sh's LIBCLANG_PATH (llvm 19).
group_begin userspace-test
tool_dir=tools/userspace-test
tcargo() { (cd "$tool_dir" && cargo "$@"); }
step "cargo fmt --check" "$logs/cargo-fmt.log" tcargo fmt -- --check
step "cargo clippy -D warnings" "$logs/cargo-clippy.log" \
	tcargo clippy --locked --all-targets -- -D warnings
t0=$(date +%s)
tcargo test --locked >"$logs/cargo-test.log" 2>&1
rc=$?
note "cargo test: $(($(date +%s) - t0)) s"
subtree cargo "$logs/cargo-test.log" --name "cargo test" --status "$rc"
tool_built=1
step "release build" "$logs/cargo-build.log" tcargo build --locked --release || tool_built=0
tool=$tool_bin
group_end

# --- module ------------------------------------------------------------------
group_begin module
wait "$module_pid"
rc=$?
note "module build: $(($(date +%s) - t_module)) s"
leaf "$rc" "module and samples build with CLIPPY=1" "$logs/module.log"
[ "$rc" -eq 0 ] || finish "the module did not build"
# rustc and clippy, the C compiler (the shims), objtool and modpost
# (tools/lib/build-warnings.sh): the lines that count, on a failure.
tools/lib/build-warnings.sh "$logs/module.log" >"$logs/build-warnings.log" 2>&1
leaf $? "the build has no warnings" "$logs/build-warnings.log"
step "rustfmt --check (module and samples)" "$logs/rustfmt.log" \
	rustfmt --edition 2021 --config-path "$kernel_src/.rustfmt.toml" --check \
	rust/rdma_cm_rs.rs samples/rdma_cm_rs_echo.rs samples/rdma_cm_rs_rping.rs \
	samples/rdma_cm_rs_store.rs
# No `unsafe` in the layer's consumers: the char device forbids it,
# the samples deny it; this catches an `allow` slipping in.
unsafe_outside() {
	! grep -rnE '\bunsafe\b' --include='*.rs' rust/ctl samples | grep -vE '^\S+:\s*//' |
		grep -vE 'deny\(unsafe_code\)|forbid\(unsafe_code\)|allow\(dead_code, unsafe_code\)|unsafe_code` is denied|no `unsafe`|owns no `unsafe`'
}
step "no unsafe in rust/ctl and samples" "$logs/unsafe.log" unsafe_outside
# Union members read the same way under both bindings: the kernel's
# (`make intree`) make a C union a Rust union, a module's make some a
# struct of `__BindgenUnionField`s, whose `as_ref`/`as_mut` the kernel's
# lack (cm/multicast.rs had one: `make intree` failed, E0599).  A cast of
# the union's address to the member's type works under both.
union_members_portable() {
	! grep -rnE '__bindgen_anon_[0-9]+\.[A-Za-z_0-9]+\.as_(ref|mut)\(' --include='*.rs' rust/rdma
}
step "union members read as both bindings allow (rust/rdma)" "$logs/unions.log" union_members_portable
# The kernel fixes as a maintainer takes them: each a mail `git am` reads
# (an author with an address, a subject, a Fixes: tag), checkpatch --strict
# clean in the kernel tree but for the Signed-off-by its sender adds.
kernel_patches_form() {
	local p info rc=0
	for p in tools/kernel-patches/*.patch; do
		info=$(git mailinfo /dev/null /dev/null <"$p")
		grep -q '^Email: .*@' <<<"$info" || { echo "$p: no author address"; rc=1; }
		grep -q '^Fixes: [0-9a-f]\{12\} ("' "$p" || { echo "$p: no Fixes: tag"; rc=1; }
	done
	(cd "$kernel_src" && scripts/checkpatch.pl --strict --quiet \
		--ignore MISSING_SIGN_OFF,UNKNOWN_COMMIT_ID "$OLDPWD"/tools/kernel-patches/*.patch) || rc=1
	return "$rc"
}
if [ -f "$kernel_src/scripts/checkpatch.pl" ]; then
	step "kernel fixes: git am's form, a Fixes: tag each, checkpatch --strict clean" \
		"$logs/kernel-patches.log" kernel_patches_form
else
	leaf_skip "kernel fixes: git am's form, a Fixes: tag each, checkpatch --strict clean" \
		"no kernel source at $kernel_src (KDIR=): checkpatch.pl is the kernel's"
fi
step "ioctl-abi.rst and the uapi header name the same commands and structures" \
	"$logs/abi-doc.log" tools/abi-doc-check.sh
group_end
[ "$tool_built" = 1 ] || finish "the userspace tool did not build"

# A VM's command: each part of it between "ktap-part NAME" and
# "ktap-part-end NAME STATUS" lines, a subtest of its own.
# Each part also says when it started and ended on the guest's clock
# ("part-time NAME START END", outside the KTAP): part_times sums them up.
part='up() { cut -d" " -f1 /proc/uptime; }'
part+='; part() { local n=$1 s t; t=$(up); shift; echo "ktap-part $n"; "$@"; s=$?; echo "ktap-part-end $n $s"; echo "part-time $n $t $(up)"; return $s; }'
# Parts that run at once with the next foreground part: bg_part starts one
# (its output kept in the guest's /tmp), bg_show waits for all of them and
# prints one as a part, whole.  The four passes (rxe with asynchronous
# and with synchronous ids, siw likewise) overlap their waits this way;
# they use distinct ports.  (The fourth, synchronous ids on siw, found two
# siw bugs beside the others, tools/kernel-patches/0006 and 0007.  Under
# that load siw's RDMA scenarios saw the module's connect end in
# CONNECT_ERROR -EINVAL now and then: the suite's peer, passive, sent
# before the module's first message, which iWARP forbids; it waits for it
# now.  The siw pass ran alone for a while: beside the others it lost
# first messages, which was siw's accept race, now patched in the test
# kernel: tools/kernel-patches/0001.)
part+='; bg_part() { local n=$1; shift; ( t=$(up); "$@" >"/tmp/part-$n.out" 2>&1; echo $? >"/tmp/part-$n.rc"; echo "$t $(up)" >"/tmp/part-$n.time" ) & }'
part+='; bg_show() { local n=$1 s; wait; echo "ktap-part $n"; cat "/tmp/part-$n.out"; s=$(cat "/tmp/part-$n.rc" 2>/dev/null || echo 1); echo "ktap-part-end $n $s"; echo "part-time $n $(cat "/tmp/part-$n.time")"; return $s; }'
# part_times LOG: one line, each part's wall time in the VM (guest clock,
# which under TCG may lag the host's), and the span from the first start
# to the last end.
part_times() {
	awk '$1 == "part-time" && NF == 4 {
		if (first == "" || $3 < first) first = $3
		if ($4 > last) last = $4
		line = line sprintf("%s%s %.0f s", sep, $2, $4 - $3); sep = ", "
	} END { if (line != "") printf "parts (guest clock): %s; all %.0f s\n", line, last - first }' "$1"
}
# vm_group LOG STATUS DESCRIPTION [ARGS...]: the VM run's results.
vm_group() {
	local log=$1 st=$2 what=$3
	shift 3
	subtree vm "$log" --name "VM run" --status "$st" --status-name "$what" "$@"
}
# The skip rule: in our VMs every case's device is there.  A scenario the
# pass leaves out by design says so ("# SKIP left out ...: why"), one that
# needs a fix the kernel lacks says which ("# SKIP needs kernel fix NNNN
# (subject)"; the test kernel lacks none, the setup group checks it), one
# held back by a kernel issue not fixed yet says so ("# SKIP kernel issue:
# ..."): all are counted as skipped, not held against the run.
no_skip_in() {
	local n skips
	skips=$(grep -E '^\s*ok [0-9]+ .*# SKIP' "$1" | grep -vE '# SKIP (left out|needs kernel fix|kernel issue)' || true)
	n=$(grep -c . <<<"$skips" || true)
	[ -z "$skips" ] || sed 's/^ */# skipped: /' <<<"$skips" >>"$logs/skips.log"
	return $((n > 0))
}

# The manifest: what each VM run must report.  Every pass of the suite
# prints a result for each scenario (those it leaves out as SKIPs); the
# KUnit suites are those of rust/rdma/tests/, each with its cases.  A part,
# a suite or a result missing fails, so a VM that dies mid-run costs every
# result it swallowed (tools/lib/ktap_tree.py).
scenarios=$("$tool" suite --list | wc -l)
expect_suites=()
for p in suite-rxe suite-rxe-sync suite-siw suite-siw-sync; do
	expect_suites+=(--expect-part "$p=$scenarios")
done
# The passes that have the machine to themselves (two VMs): the scenarios
# the four above leave out for them.
alone_scenarios=$("$tool" suite --list --alone | wc -l)
expect_alone=(--expect-part "suite-rxe-alone=$alone_scenarios" --expect-part "suite-siw-alone=$alone_scenarios")
expect_kunit=()
for f in rust/rdma/tests/*.rs; do
	kunit_suite=$(sed -n 's/.*#\[kunit_tests(\([a-z_0-9]*\))\].*/\1/p' "$f")
	[ -z "$kunit_suite" ] || expect_kunit+=(--expect-kunit "$kunit_suite=$(grep -c '#\[test\]' "$f")")
done

# --- vm-one ------------------------------------------------------------------
# The NVMe part (its own target module, the kernel's host and C target)
# runs beside the fault injection (the tool's module, fail-nth on the
# tool's own task): neither deletes a device, and together they take 79 s
# where one after the other took 149 s (2026-11-29).  The fuzzer and the
# removal test delete devices: they run after.
group_begin vm-one
vm_one="$logs/vm-one"
watched vm-one "$logs/vm-one.log" \
	tools/vm/run --kernel "$kdir" --timeout 1500 --keep-logs "$vm_one" --stream \
	--module "$out_dir/rdma_cm_rs.ko" -- \
	"$part; bg_part suite-rxe-sync $tool suite --sync; bg_part suite-siw $tool suite --transport siw; bg_part suite-siw-sync $tool suite --sync --transport siw; part suite-rxe $tool suite; s=\$?; bg_show suite-rxe-sync || s=1; bg_show suite-siw || s=1; bg_show suite-siw-sync || s=1; part echo tools/echo-test.sh || s=1; part rping tools/rping-test.sh || s=1; bg_part nvme tools/nvme-test.sh; part faults tools/fault-test.sh || s=1; bg_show nvme || s=1; bg_part bench-round $tool bench --quick --allow-coarse-clock --reps 1 --cycles 10 --round-trips 20 --rdma-ops 2 --only active,sync,passive,data,sample,store --out-dir /tmp/bench-round; part fuzz $tool fuzz --seed 2 --seconds 45 --shrink-secs 0 --nvmet-port 7650 || s=1; bg_show bench-round || s=1; part removal tools/removal-test.sh || s=1; exit \$s"
rc=$?
kunit_args=(--kunit "${expect_kunit[@]}")
[ ! -f "$vm_one/dmesg" ] || kunit_args+=(--dmesg "$vm_one/dmesg")
vm_group "$logs/vm-one.log" "$rc" \
	"the VM ran to its end: modules unloaded, dmesg and kmemleak clean" "${kunit_args[@]}" \
	"${expect_suites[@]}" --expect-part echo --expect-part rping --expect-part nvme --expect-part bench-round \
	--expect-part fuzz --expect-part faults --expect-part removal
printf '%s' "$glines" >"$logs/vm-one.ktap"
note "vm-one $(part_times "$logs/vm-one.log")"
no_skip_in "$logs/vm-one.ktap"
leaf $? "no case skipped (the VM has rxe0 and siw0)" "$logs/skips.log"
group_end

# --- vm-two ------------------------------------------------------------------
# Run from a copy of the tree under /tmp, in a directory whose name has a
# space, mounted read-only: a checkout anywhere must work, though the
# guests mount their own tmpfs over /tmp (tools/vm/run shares the checkout
# and the build directory explicitly).  The copy holds the tool and the
# module where a build in it would put them, and is its own build directory.
group_begin vm-two
copy=$(mktemp -d "/tmp/rdma-cm-rs check.XXXXXX")
trap 'umount "$copy" 2>/dev/null; rm -rf "$copy"' EXIT
tar -C "$PWD" --exclude=./.git --exclude=./build --exclude=./tools/userspace-test/target \
	--exclude='*.o' --exclude='*.ko' -cf - . | tar -C "$copy" -xf -
tool_rel=tools/userspace-test/target/release/userspace-test
mkdir -p "$copy/$(dirname "$tool_rel")"
cp "$tool" "$copy/$tool_rel"
# The sample servers too: the suite loads them for their server roles.
cp "$out_dir/rdma_cm_rs.ko" "$out_dir/rdma_cm_rs_rping.ko" "$out_dir/rdma_cm_rs_store.ko" \
	"$out_dir/rdma_cm_rs_nvmet.ko" "$copy/"
read_only=no
if mount --bind "$copy" "$copy" 2>"$logs/ro-mount.log" &&
	mount -o remount,bind,ro "$copy" 2>>"$logs/ro-mount.log" && ! touch "$copy/.w" 2>/dev/null; then
	read_only=yes
fi
vm_two="$logs/vm-two"
# The guest's cwd is the copy's: `pwd` proves which tree it ran.
guest_tool='"$RDMA_CM_RS_OUT"/'$tool_rel
# The KUnit suites ran in vm-one, on the same kernel and devices (their
# cases connect within one machine): VM A does not run them again at
# insmod (kunit.enable=0), which VM B would sit out idle.
RDMA_CM_RS_OUT=$copy watched vm-two "$logs/vm-two.log" \
	"$copy/tools/vm/run" --kernel "$kdir" --timeout 1500 --keep-logs "$vm_two" \
	--stream --module "$copy/rdma_cm_rs.ko" --two-vms --kernel-arg kunit.enable=0 \
	--peer-cmd "$guest_tool agent --listen 0.0.0.0:7999" -- \
	"$part; echo \"guest cwd: \$PWD\"; bg_part suite-rxe-sync $guest_tool suite --sync --peer \$RDMA_CM_RS_PEER_IP:7999; bg_part suite-siw $guest_tool suite --transport siw --peer \$RDMA_CM_RS_PEER_IP:7999; bg_part suite-siw-sync $guest_tool suite --sync --transport siw --peer \$RDMA_CM_RS_PEER_IP:7999; part suite-rxe $guest_tool suite --peer \$RDMA_CM_RS_PEER_IP:7999; s=\$?; bg_show suite-rxe-sync || s=1; bg_show suite-siw || s=1; bg_show suite-siw-sync || s=1; part suite-rxe-alone $guest_tool suite --alone --peer \$RDMA_CM_RS_PEER_IP:7999 || s=1; part suite-siw-alone $guest_tool suite --alone --transport siw --peer \$RDMA_CM_RS_PEER_IP:7999 || s=1; part peer-vm-killed $guest_tool ctl peer-vm-killed \$RDMA_CM_RS_LOCAL_IP:7695 --peer \$RDMA_CM_RS_PEER_IP:7999 --nvme-target \$RDMA_CM_RS_SIW_IP:4420 || s=1; exit \$s"
rc=$?
# VM A's lines only (VM B's are its agent's log).
sed -n 's/^VM A: //p' "$logs/vm-two.log" >"$logs/vm-two-a.log"
vm_group "$logs/vm-two-a.log" "$rc" \
	"both VMs ran to their end: dmesg and kmemleak clean (VM B killed on request)" \
	--diag "$logs/vm-two.log" "${expect_suites[@]}" "${expect_alone[@]}" --expect-part peer-vm-killed
note "vm-two, VM A $(part_times "$logs/vm-two-a.log")"
grep -qxF "guest cwd: $copy" "$logs/vm-two-a.log"
leaf $? "any checkout location: the VMs ran the copy under '$copy'" "$logs/vm-two.log"
if [ "$read_only" = yes ]; then
	leaf 0 "any checkout location: that copy was mounted read-only"
else
	leaf_skip "any checkout location: that copy was mounted read-only" \
		"no read-only bind mount here: $(head -c 200 "$logs/ro-mount.log" | tr '\n' ' ')"
fi
umount "$copy" 2>/dev/null
group_end

# --- ktap --------------------------------------------------------------------
# What was printed so far, read by the kernel's own KTAP parser: it must
# find no error and count what this script counted.  Its plan line is
# shortened to the groups printed (this one is not, yet).
group_begin ktap
ktap_check() {
	local out
	sed "2s/^1\.\.[0-9]*$/1..$top/" "$logs/check.ktap" >"$logs/check-so-far.ktap"
	out=$(python3 "$kernel_src/tools/testing/kunit/kunit.py" parse "$logs/check-so-far.ktap" 2>&1)
	printf '%s\n' "$out" >"$logs/kunit-parse.log"
	if grep -q '\[ERROR\]' <<<"$out"; then
		echo "kunit.py parse reported errors"
		return 1
	fi
	# kunit_parser.TestCounts: the non-zero counts, in this order.
	local want=() n
	for n in "passed: $passed" "failed: $failed" "skipped: $skipped"; do
		[ "${n##* }" = 0 ] || want+=("$n")
	done
	want=$(IFS=,; echo "${want[*]}")
	grep -qE "Ran $((passed + failed + skipped)) tests: ${want//,/, }\$" <<<"$out" || {
		echo "kunit.py parse counts otherwise: we have $passed passed, $failed failed, $skipped skipped"
		return 1
	}
}
sleep 0.5 # tee has written what was printed
ktap_check >>"$logs/kunit-parse.log" 2>&1
leaf $? "kunit.py parse reads the KTAP above without error, counting $passed passed, $failed failed, $skipped skipped" "$logs/kunit-parse.log"
group_end

finish
