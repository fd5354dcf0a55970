#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Configures and builds the test kernel (tinyconfig + .config.fragment, clang
# 19) into a cache directory keyed by kernel version, fragment and toolchain,
# and prints that directory.  A cached build costs nothing.
set -euo pipefail
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

log "building with LLVM=-19 -j$jobs (about 13 minutes on 2 cores)"
start=$(date +%s)
kmake -j"$jobs" bzImage modules
touch "$build/.rdma-cm-rs-built"
log "built in $(($(date +%s) - start)) s"
echo "$build"
