#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/kernel-fixes.sh KERNEL_BUILD_OR_SOURCE
#
# Which of tools/kernel-patches/ a kernel carries, read from its source: a
# patch that reverses cleanly is in, one that applies cleanly is not.  One
# line a patch: "NNNN present|absent|unknown SUBJECT".  "unknown" (neither
# applies: another kernel version, or no source beside a headers-only
# build) counts as absent for the tests.  For an O= build the source is its
# `source` link.  tools/kernel.sh keeps this list beside each kernel it
# builds (.rdma-cm-rs-fixes); tools/check.sh computes it for KDIR=; the
# suite skips what needs an absent fix ("# SKIP needs kernel fix NNNN").
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
repo_root=$(cd "$(dirname "$0")/.." && pwd -P)

[ $# -eq 1 ] || { echo "usage: tools/kernel-fixes.sh KERNEL_BUILD_OR_SOURCE" >&2; exit 2; }
tree=$1
[ ! -e "$tree/source" ] || tree=$(cd "$tree/source" && pwd -P)

patches=("$repo_root"/tools/kernel-patches/*.patch)
declare -A state
if [ ! -d "$tree/drivers" ]; then
	for p in "${patches[@]}"; do state[$p]=unknown; done
else
	# A copy of the files the patches touch: later patches change lines
	# of earlier ones, so they are undone last to first, and what is not
	# in is then applied first to last, each for real on the copy.
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	sed -n 's|^+++ b/\([^[:space:]]*\).*|\1|p' "${patches[@]}" | sort -u |
		while read -r f; do
			[ -f "$tree/$f" ] || continue
			mkdir -p "$work/$(dirname "$f")"
			cp "$tree/$f" "$work/$f"
		done
	for ((i = ${#patches[@]} - 1; i >= 0; i--)); do
		p=${patches[i]}
		if patch -R -p1 -f -s -d "$work" <"$p" >/dev/null 2>&1; then
			state[$p]=present
		fi
	done
	for p in "${patches[@]}"; do
		[ -z "${state[$p]:-}" ] || continue
		if patch -p1 -f -s -d "$work" <"$p" >/dev/null 2>&1; then
			state[$p]=absent
		else
			state[$p]=unknown
		fi
	done
fi
for p in "${patches[@]}"; do
	number=$(basename "$p" | cut -c1-4)
	# The header's Subject, unfolded (git format-patch folds long ones).
	subject=$(awk '/^$/ { exit } /^[ \t]/ && s { sub(/^[ \t]+/, " "); print; next } { s = 0 }
		/^Subject: / { sub(/^Subject: (\[PATCH[^]]*\] )?/, ""); s = 1; print }' "$p" | tr -d '\n')
	printf '%s %s %s\n' "$number" "${state[$p]}" "$subject"
done
