#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Configures and builds the test kernel (tinyconfig + .config.fragment, clang
# 19) into a cache directory keyed by kernel version, fragment and toolchain,
# and prints that directory.  A cached build costs nothing.
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

[ -f "$kernel_src/Makefile" ] || die "no kernel source in $kernel_src: run tools/setup.sh"
build=$(kernel_build_dir)
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
"$kernel_src/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" \
	"$repo_root/.config.fragment" >/dev/null
kmake olddefconfig >/dev/null

# Options drop silently when a dependency is missing (SLUB_TINY blocks KASAN,
# a missing toolchain drops RUST): name every one that did not survive.
lost=()
while IFS= read -r line; do
	case "$line" in
	CONFIG_*=*)
		grep -qxF "$line" "$build/.config" || lost+=("$line (have: $(grep -E "^(# )?${line%%=*}[= ]" "$build/.config" || echo unset))")
		;;
	"# CONFIG_"*" is not set")
		opt=${line#\# }
		opt=${opt%% *}
		! grep -qE "^$opt=" "$build/.config" || lost+=("$line (have: $(grep -E "^$opt=" "$build/.config"))")
		;;
	esac
done <"$repo_root/.config.fragment"
if [ ${#lost[@]} -gt 0 ]; then
	printf 'kernel: error: fragment options that did not survive olddefconfig:\n' >&2
	printf '  %s\n' "${lost[@]}" >&2
	[ "${lost[*]}" = "${lost[*]#CONFIG_RUST=y}" ] || "$kernel_src/scripts/rust_is_available.sh" >&2 || true
	exit 1
fi

logs=${RDMA_CM_RS_LOGS:-$out_dir/build/logs}
mkdir -p "$logs"
build_log=$logs/kernel-build.log
log "build: $(kernel_version) with LLVM=-19 -j$jobs, about 15 min on 2 cores (25 on a loaded machine), log $build_log"
start=$(date +%s)
kmake -j"$jobs" bzImage modules >"$build_log" 2>&1 &
pid=$!
# A heartbeat each minute: the build is silent (make -s) for its whole run.
ticks=0
while sleep 1 && kill -0 "$pid" 2>/dev/null; do
	((++ticks % 60)) && continue
	objects=$(find "$build" -name '*.o' | wc -l)
	last=$(tail -n1 "$build_log" | cut -c1-100)
	log "build: $(($(date +%s) - start)) s, $objects objects${last:+; last log line: $last}"
done
if ! wait "$pid"; then
	tail -n 30 "$build_log" >&2
	die "kernel build failed after $(($(date +%s) - start)) s (log $build_log)"
fi
touch "$build/.rdma-cm-rs-built"
log "built in $(($(date +%s) - start)) s"
echo "$build"
