#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# `make check`: every test of the project, one summary line.
#
#   static   rustfmt, the module built with CLIPPY=1 and no warnings allowed,
#            no `unsafe` in the char device (rust/ctl) or the samples
#   host     cargo fmt/clippy/test of the userspace tool
#   vm       one VM (rxe on a dummy netdev, siw beside it): KUnit suites at
#            insmod, the userspace suite against the module, the sample
#            echo module, the sample rping server against unmodified rping
#            and the module's own rping client, a 45 s round of the seeded
#            ioctl fuzzer (seed 1), the fault scenarios (rmmod while open,
#            injected allocation failures), then device removal under 101
#            connections (last: it deletes and re-adds rxe0);
#            two VMs (rxe over a QEMU socket link): the userspace suite with
#            the librdmacm peer in the other VM, then the peer VM killed by
#            the host mid-transfer.  Every guest runs with panic_on_warn=1
#            and each VM run is gated on a clean dmesg (tools/vm/dmesg-gate).
#
# Every KUnit case, every KTAP case of the userspace suite, every cargo test
# and every gate counts once in "N passed, N failed".  Exit status is
# non-zero if anything failed.
#
# Logs: $RDMA_CM_RS_LOGS (default build/logs).
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
. tools/lib/env.sh

logs=${RDMA_CM_RS_LOGS:-$PWD/build/logs}
rm -rf "$logs"
mkdir -p "$logs"
passed=0
failed=0
start_all=$(date +%s)

note() { printf '# %s\n' "$*"; }
pass() { passed=$((passed + 1)); printf 'ok - %s\n' "$1"; }
fail() {
	failed=$((failed + 1))
	printf 'not ok - %s\n' "$1"
	[ -n "${2:-}" ] && [ -f "$2" ] && tail -n 40 "$2" | sed 's/^/#   /'
	return 0
}
# step NAME LOGFILE CMD...: one pass/fail from the command's exit status.
step() {
	local name=$1 log=$2
	shift 2
	local t0=$(date +%s)
	if "$@" >"$log" 2>&1; then
		pass "$name ($(($(date +%s) - t0)) s)"
	else
		fail "$name ($(($(date +%s) - t0)) s)" "$log"
		return 1
	fi
}
# step_loud NAME LOGFILE CMD...: as step, for the long ones that report
# progress on stderr: those lines reach the terminal as TAP comments as they
# are written, and LOGFILE; the command's stdout goes to LOGFILE.out.
step_loud() {
	local name=$1 log=$2 rc
	shift 2
	local t0=$(date +%s)
	: >"$log"
	"$@" 2>&1 >"$log.out" | tee -a "$log" | sed -u 's/^/# /'
	rc=${PIPESTATUS[0]}
	if [ "$rc" -eq 0 ]; then
		pass "$name ($(($(date +%s) - t0)) s)"
	else
		fail "$name ($(($(date +%s) - t0)) s)" "$log"
		return 1
	fi
}
finish() {
	note "total $(($(date +%s) - start_all)) s; logs in $logs"
	echo "$passed passed, $failed failed"
	[ "$failed" -eq 0 ]
	exit $?
}

# KUnit counting: the cases of our suites (rdma_cm_rs_*) in the guest's
# dmesg, timestamps stripped; the kernel's own boot-time suites and the
# suite-level summary lines do not count.  No case at all is a failure.
count_ktap() {
	local file=$1 label=$2 p f
	sed -E 's/^\[[^]]*\] ?//' "$file" | awk '
		/^ *# Subtest: / { ours = ($3 ~ /^rdma_cm_rs_/) ; next }
		ours && /^ +ok [0-9]+ /     { print "pass " $0 }
		ours && /^ +not ok [0-9]+ / { print "fail " $0 }' >"$logs/kunit-cases.txt"
	p=$(grep -c '^pass' "$logs/kunit-cases.txt" || true)
	f=$(grep -c '^fail' "$logs/kunit-cases.txt" || true)
	passed=$((passed + p))
	failed=$((failed + f))
	note "$label: $p passed, $f failed"
	sed -n 's/^fail *not ok [0-9]* /not ok - '"$label"': /p' "$logs/kunit-cases.txt"
	[ "$((p + f))" -gt 0 ] || fail "$label: no KUnit case found in $file"
	# A case that needs the rxe device says so when it finds none: in the
	# test VMs that is a failure, not a pass.
	if grep -q 'rdma_cm_rs: kunit: skipped' "$file"; then
		fail "$label: a device case was skipped" "$file"
	fi
}
# The userspace suite prints flat KTAP (no indentation).
count_flat_ktap() {
	local file=$1 label=$2 p f
	p=$(grep -cE '^ok [0-9]+ ' "$file" || true)
	f=$(grep -cE '^not ok [0-9]+ ' "$file" || true)
	passed=$((passed + p))
	failed=$((failed + f))
	note "$label: $p passed, $f failed"
	grep -E '^not ok [0-9]+ ' "$file" | sed "s/^/not ok - $label: /" || true
	[ "$((p + f))" -gt 0 ] || fail "$label ran no test" "$file"
}

echo "TAP version 13"

# --- build -----------------------------------------------------------------
step_loud "setup" "$logs/setup.log" tools/setup.sh || finish
if [ -n "${KDIR:-}" ]; then
	kdir=$KDIR
	pass "kernel (KDIR=$kdir)"
else
	step_loud "kernel build (cached when unchanged)" "$logs/kernel.log" tools/kernel.sh || finish
	kdir=$(tail -n1 "$logs/kernel.log.out")
fi

kmake() { make -C "$kdir" M="$PWD" LLVM=-19 "$@"; }
# A fresh module build, so that clippy sees every file: the module's own
# objects go, not Kbuild's `clean`, which deletes every *.o and *.a under
# M=, the tool's cargo target directory included (cargo would not notice,
# and the tool's link then misses the static library its build.rs made).
rm -f ./*.ko ./*.mod ./*.mod.c ./*.o ./modules.order ./Module.symvers
find rust samples -name '*.o' -delete
# One build serves both: clippy-driver compiles the module too.  It runs
# beside the tool's cargo steps below: it is mostly one rustc at a time,
# and the machine has two cores.
t_module=$(date +%s)
kmake CLIPPY=1 modules >"$logs/module.log" 2>&1 &
module_pid=$!

# --- host ------------------------------------------------------------------
# Cargo runs in the tool's directory; its build.rs runs bindgen (the uapi
# header, librdmacm and verbs) with env.sh's LIBCLANG_PATH (llvm 19).
tool_dir=tools/userspace-test
tcargo() { (cd "$tool_dir" && cargo "$@"); }
step "userspace-test: cargo fmt --check" "$logs/cargo-fmt.log" tcargo fmt -- --check
step "userspace-test: cargo clippy -D warnings" "$logs/cargo-clippy.log" \
	tcargo clippy --locked --all-targets -- -D warnings
if tcargo test --locked >"$logs/cargo-test.log" 2>&1; then
	pass "userspace-test: cargo test"
else
	fail "userspace-test: cargo test" "$logs/cargo-test.log"
fi
p=$(sed -nE 's/^test result: .*\. ([0-9]+) passed; ([0-9]+) failed.*/\1/p' "$logs/cargo-test.log" | paste -sd+ | bc)
f=$(sed -nE 's/^test result: .*\. ([0-9]+) passed; ([0-9]+) failed.*/\2/p' "$logs/cargo-test.log" | paste -sd+ | bc)
passed=$((passed + ${p:-0}))
failed=$((failed + ${f:-0}))
note "cargo test: ${p:-0} passed, ${f:-0} failed"
tool_built=1
step "userspace-test: release build" "$logs/cargo-build.log" tcargo build --locked --release || tool_built=0
tool=$tool_dir/target/release/userspace-test

# --- module ----------------------------------------------------------------
if wait "$module_pid"; then
	pass "module build with CLIPPY=1 ($(($(date +%s) - t_module)) s)"
	if grep -qE '^(warning|error)' "$logs/module.log"; then
		fail "module build has no warnings" "$logs/module.log"
	else
		pass "module build has no warnings"
	fi
else
	fail "module build with CLIPPY=1 ($(($(date +%s) - t_module)) s)" "$logs/module.log"
	finish
fi
[ "$tool_built" = 1 ] || finish

rustfmt_cfg="$kernel_src/.rustfmt.toml"
step "rustfmt --check (module and samples)" "$logs/rustfmt.log" \
	rustfmt --edition 2021 --config-path "$rustfmt_cfg" --check \
	rust/rdma_cm_rs.rs samples/rdma_cm_rs_echo.rs samples/rdma_cm_rs_rping.rs

# No `unsafe` in the layer's consumers: the char device forbids it,
# the samples deny it; this catches an `allow` slipping in.
unsafe_outside() {
	! grep -rnE '\bunsafe\b' --include='*.rs' rust/ctl samples | grep -vE '^\S+:\s*//' |
		grep -vE 'deny\(unsafe_code\)|forbid\(unsafe_code\)|allow\(dead_code, unsafe_code\)|unsafe_code` is denied|no `unsafe`|owns no `unsafe`'
}
step "no unsafe in rust/ctl and samples" "$logs/unsafe.log" unsafe_outside

# --- one VM ----------------------------------------------------------------
vm_one="$logs/vm-one"
step "VM (one, rxe loopback): KUnit + userspace suite + echo and rping samples + 45 s ioctl fuzz + fault scenarios, clean dmesg" "$logs/vm-one.log" \
	tools/vm/run --kernel "$kdir" --timeout 1500 --keep-logs "$vm_one" \
	--module "$PWD/rdma_cm_rs.ko" -- \
	"$tool suite; s=\$?; tools/echo-test.sh || s=1; tools/rping-test.sh || s=1; $tool fuzz --seed 1 --seconds 45 --shrink-secs 0 || s=1; tools/fault-test.sh || s=1; tools/removal-test.sh || s=1; exit \$s"
if [ -f "$vm_one/dmesg" ]; then
	count_ktap "$vm_one/dmesg" "KUnit"
else
	fail "KUnit results (no dmesg saved)"
fi
count_flat_ktap "$logs/vm-one.log" "suite, one VM"

# --- two VMs ---------------------------------------------------------------
# Run from a copy of the tree under /tmp, in a directory whose name has a
# space: a checkout anywhere must work, though the guests mount their own
# tmpfs over /tmp (tools/vm/run shares the repository explicitly).
copy=$(mktemp -d "/tmp/rdma-cm-rs check.XXXXXX")
trap 'rm -rf "$copy"' EXIT
tar -C "$PWD" --exclude=./.git --exclude=./build --exclude=./tools/userspace-test/target -cf - . |
	tar -C "$copy" -xf -
mkdir -p "$copy/$(dirname "$tool")"
cp "$tool" "$copy/$tool"
cp rdma_cm_rs.ko "$copy/"
vm_two="$logs/vm-two"
# The guest's cwd is the copy's: `pwd` proves which tree it ran.
step "VMs (two, socket link, from a copy under '$copy'): userspace suite across the wire, then the peer VM killed mid-transfer, clean dmesg" "$logs/vm-two.log" \
	"$copy/tools/vm/run" --kernel "$kdir" --timeout 1500 --keep-logs "$vm_two" \
	--module "$copy/rdma_cm_rs.ko" --two-vms \
	--peer-cmd "$tool agent --listen 0.0.0.0:7999" -- \
	"echo \"guest cwd: \$PWD\"; $tool suite --peer \$RDMA_CM_RS_PEER_IP:7999; s=\$?; $tool ctl peer-vm-killed \$RDMA_CM_RS_LOCAL_IP:7695 --peer \$RDMA_CM_RS_PEER_IP:7999 || s=1; exit \$s"
count_flat_ktap "$logs/vm-two.log" "suite, two VMs"
if grep -qxF "guest cwd: $copy" "$logs/vm-two.log"; then
	pass "any checkout location: the two VMs ran the copy under /tmp"
else
	fail "any checkout location: the two VMs ran the copy under /tmp (no 'guest cwd: $copy')" "$logs/vm-two.log"
fi

finish
