#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/kernel.sh [--bench | --stock]
#
# Configures and builds the test kernel (tinyconfig + .config.fragment, clang
# 19) into a cache directory keyed by kernel version, fragment and toolchain,
# and prints that directory.  A cached build costs nothing.
#
#   --bench   the bench kernel of `make bench` instead: bench.config.fragment
#             merged after .config.fragment (no debug options; ACPI, so that
#             the guest has the HPET and a calibrated TSC), in a cache
#             directory of its own ($RDMA_CM_RS_CACHE/kernel/VERSION-bench-KEY,
#             the key covering both fragments); log kernel-bench-build.log.
#             `make check` never builds it.
#   --stock   the test kernel's configuration on the Debian source without
#             tools/kernel-patches/ ($RDMA_CM_RS_CACHE/src/linux-source-7.3-stock,
#             unpacked by RDMA_CM_RS_KERNEL=stock tools/setup.sh): the stock
#             kernel a user brings, for `make check KERNEL=stock`; cached in
#             $RDMA_CM_RS_CACHE/kernel/VERSION-stock-KEY, log
#             kernel-stock-build.log.
#
# Beside the build it records in .rdma-cm-rs-fixes which of
# tools/kernel-patches/ its source carries (tools/kernel-fixes.sh), for the
# tests that need one of them.
#
# Progress goes to stderr: what is being built as it starts, then a heartbeat
# every 60 s (objects compiled so far, the last line of the build log).  The
# compiler's own output goes to $RDMA_CM_RS_LOGS/kernel-build.log (default
# build/logs/kernel-build.log in the checkout).
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
. "$(dirname "$0")/lib/env.sh"

log() { printf 'kernel: %s\n' "$*" >&2; }
die() { printf 'kernel: error: %s\n' "$*" >&2; exit 1; }

variant=
case "${1:-}" in
--bench) variant=bench ;;
--stock) variant=stock ;;
"") ;;
*) die "unknown argument '$1' (tools/kernel.sh [--bench | --stock])" ;;
esac
mapfile -t fragments < <(kernel_fragments "$variant")
kernel_src=$(kernel_source "$variant")

[ -f "$kernel_src/Makefile" ] ||
	die "no kernel source in $kernel_src: run ${variant:+RDMA_CM_RS_KERNEL=$variant }tools/setup.sh"
build=$(kernel_build_dir "$variant")
if [ -f "$build/.rdma-cm-rs-built" ]; then
	echo "$build"
	exit 0
fi

jobs=$(($(nproc) + 1))
kmake() { make -s -C "$kernel_src" O="$build" LLVM=-19 "$@"; }

log "configuring $build"
rm -rf "$build"
mkdir -p "$build"
kmake tinyconfig >/dev/null
# Later fragments override earlier ones (merge_config.sh says so on its
# output, which is not shown).
"$kernel_src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" \
	"${fragments[@]}" >/dev/null
kmake olddefconfig >/dev/null

# Options drop silently when a dependency is missing (SLUB_TINY blocks KASAN,
# a missing toolchain drops RUST): name every one that did not survive.
# What each option should be: its line in the last fragment that sets it.
declare -A want from
order=()
for f in "${fragments[@]}"; do
	while IFS= read -r line; do
		case "$line" in
		CONFIG_*=*) opt=${line%%=*} ;;
		"# CONFIG_"*" is not set") opt=${line#\# } opt=${opt%% *} ;;
		*) continue ;;
		esac
		[ -n "${want[$opt]+set}" ] || order+=("$opt")
		want[$opt]=$line from[$opt]=${f##*/}
	done <"$f"
done
lost=()
for opt in "${order[@]}"; do
	line=${want[$opt]}
	case "$line" in
	CONFIG_*=*)
		grep -qxF "$line" "$build/.config" || lost+=("$line [${from[$opt]}] (have: $(grep -E "^(# )?$opt[= ]" "$build/.config" || echo unset))")
		;;
	*)
		! grep -qE "^$opt=" "$build/.config" || lost+=("$line [${from[$opt]}] (have: $(grep -E "^$opt=" "$build/.config"))")
		;;
	esac
done
if [ ${#lost[@]} -gt 0 ]; then
	printf 'kernel: error: fragment options that did not survive olddefconfig:\n' >&2
	printf '  %s\n' "${lost[@]}" >&2
	[ "${lost[*]}" = "${lost[*]#CONFIG_RUST=y}" ] || "$kernel_src/scripts/rust_is_available.sh" >&2 || true
	exit 1
fi

logs=${RDMA_CM_RS_LOGS:-$out_dir/build/logs}
mkdir -p "$logs"
build_log=$logs/kernel${variant:+-$variant}-build.log
log "build${variant:+ ($variant kernel)}: $(kernel_version) with LLVM=-19 -j$jobs, about 15 min on 2 cores (25 on a loaded machine), log $build_log"
start=$(date +%s)
kmake -j"$jobs" bzImage modules >"$build_log" 2>&1 &
pid=$!
# A heartbeat each minute: the build is silent (make -s) for its whole run.
ticks=0
while sleep 1 && kill -0 "$pid" 2>/dev/null; do
	((++ticks % 60)) && continue
	# Neither may end the script: the log may be gone (another make
	# check cleared the logs directory) while the build goes on.
	objects=$(find "$build" -name '*.o' 2>/dev/null | wc -l) || true
	last=$(tail -n1 "$build_log" 2>/dev/null | cut -c1-100) || last=
	[ -f "$build_log" ] || last="(log $build_log removed meanwhile)"
	log "build: $(($(date +%s) - start)) s, $objects objects${last:+; last log line: $last}"
done
if ! wait "$pid"; then
	tail -n 30 "$build_log" >&2 || true
	die "kernel build failed after $(($(date +%s) - start)) s (log $build_log)"
fi
"$(dirname "$0")/kernel-fixes.sh" "$build" >"$build/.rdma-cm-rs-fixes"
touch "$build/.rdma-cm-rs-built"
log "built in $(($(date +%s) - start)) s"
echo "$build"
