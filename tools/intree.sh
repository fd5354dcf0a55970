#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/intree.sh (`make intree`): the proof that the abstraction layer is a
# move away from the kernel tree, not a rewrite.  Not part of `make check`.
#
#   tree      a copy of the kernel source (the pristine unpacked tree of
#             tools/setup.sh, tools/kernel-patches/ applied) at
#             $RDMA_CM_RS_CACHE/src/linux-intree-7.3, refreshed from it
#             with rsync each run (a copy, never hard links)
#   place     rust/rdma/ (without tests/) as rust/kernel/rdma/,
#             rust/helpers/rdma.c as rust/helpers/rdma.c and
#             samples/rdma_cm_rs_echo.rs as samples/rust/rdma_cm_rs_echo.rs,
#             each byte for byte (checked with cmp); the kernel's own files
#             get the snippets of tools/intree/ (each names its file and
#             anchor line): the `pub mod rdma` line of rust/kernel/lib.rs,
#             the rdma headers in rust/bindings/bindings_helper.h, rdma.c
#             in rust/helpers/helpers.c, RUST_INFINIBAND_ABSTRACTIONS
#             (depends on RUST && INFINIBAND=y) in drivers/infiniband/Kconfig,
#             SAMPLE_RUST_RDMA_ECHO in samples/rust/Kconfig and Makefile
#   config    tinyconfig + .config.fragment +
#             tools/intree/intree.config.fragment (the option, the sample
#             =m, CONFIG_RUST_KERNEL_DOCTESTS=y), in a build directory of its
#             own beside the test kernel's,
#             $RDMA_CM_RS_CACHE/kernel/VERSION-intree-KEY, keyed like it
#             (fragments, kernel patches, toolchain); done once per directory
#   build     bzImage and modules with CLIPPY=1 (clippy-driver compiles the
#             kernel crate, the doctests and the sample), incremental; fails
#             on any rustc, clippy or compiler warning in the placed files
#   lint      `make rustfmtcheck`, `make rustdoc` (the kernel crate's
#             documentation; a warning in the placed files fails) and
#             scripts/checkpatch.pl over the change as a patch (pristine
#             tree to this one, new files whole; an ERROR fails, warnings
#             are listed)
#   module    rdma_cm_rs.ko (the char device, its own copy of the layer) and
#             the out-of-tree samples (kernel::rdma here) built against
#             this kernel with CLIPPY=1 and no warnings, the userspace tool;
#             into $RDMA_CM_RS_CACHE/out/intree-KEY, where the in-tree
#             sample's rdma_cm_rs_echo.ko replaces the out-of-tree one
#   vm        this kernel in the test VM (tools/vm/run), booted twice: once
#             with debug objects off (no_debug_objects), where every doctest
#             of the kernel crate runs as KUnit at boot (the kernel's own
#             hrtimer doctest trips ODEBUG, fatal under panic_on_warn); once
#             with them on, where the layer's doctests alone run at boot
#             (kunit.filter_glob), then rdma_cm_rs.ko goes in (its KUnit
#             suites run) and tools/echo-test.sh drives the in-tree echo
#             sample on rxe and siw; fails on a failed command, a dmesg-gate
#             report, a "not ok" in the KTAP, or no rdma doctest having run
#
# Prints each stage as it ends, with its time, and a summary; exits non-zero
# at the first failure.  Logs in $RDMA_CM_RS_LOGS (default build/logs in the
# checkout): intree-build.log, intree-rustdoc.log, intree-checkpatch.log,
# intree-module.log, intree-vm-doctests/ and intree-vm/ (tools/vm/run
# --keep-logs), intree.patch (what checkpatch read).
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
. "$(dirname "$0")/lib/env.sh"
cd "$repo_root"

log() { printf 'intree: %s\n' "$*"; }
die() {
	printf 'intree: error: %s\n' "$*" >&2
	exit 1
}

[ $# -eq 0 ] || die "no arguments (tools/intree.sh [--help])"
[ -f "$kernel_src/Makefile" ] || die "no kernel source in $kernel_src: run tools/setup.sh"
command -v rsync >/dev/null || die "rsync not found: run tools/setup.sh"

logs=${RDMA_CM_RS_LOGS:-$out_dir/build/logs}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd -P)
work=$RDMA_CM_RS_CACHE/src/linux-intree-$kernel_series
stage=$RDMA_CM_RS_CACHE/intree/stage
version=$(kernel_version)
key=$({
	echo "$version"
	cat .config.fragment tools/intree/intree.config.fragment
	kernel_patches_digest
	rustc --version
	bindgen --version
	clang-19 --version | head -n1
} | sha256sum | cut -c1-16)
build=$RDMA_CM_RS_CACHE/kernel/$version-intree-$key
run=$RDMA_CM_RS_CACHE/out/intree-$key
jobs=$(($(nproc) + 1))

# One run at a time: the work tree and the build directory are shared.
mkdir -p "$RDMA_CM_RS_CACHE/intree"
exec 9>"$RDMA_CM_RS_CACHE/intree/lock"
flock -n 9 || die "another tools/intree.sh is running"

# Stage timing: `stage NAME` starts one (ending the previous), the summary
# lists them all, also after a failure.
stages=() times=() notes=() cur= cur_start=0 start_all=$(date +%s)
stage_end() {
	[ -n "$cur" ] || return 0
	stages+=("$cur") times+=($(($(date +%s) - cur_start))) notes+=("$1")
	log "$cur: ${times[-1]} s${1:+, $1}"
	cur=
}
stage() { cur=$1 cur_start=$(date +%s); }
summary() {
	local rc=$? i
	[ -z "$cur" ] || stage_end "FAILED"
	log "summary (kernel $build):"
	for i in "${!stages[@]}"; do
		printf '  %-7s %5d s  %s\n' "${stages[$i]}" "${times[$i]}" "${notes[$i]}"
	done
	printf '  %-7s %5d s  %s\n' total $(($(date +%s) - start_all)) \
		"$([ "$rc" -eq 0 ] && echo passed || echo FAILED)"
}
trap summary EXIT

# The files that are placed, as "source target" pairs (target relative to
# the kernel tree); rust/rdma/tests/ stays out of tree.
placed=()
while IFS= read -r f; do
	placed+=("$f rust/kernel/rdma/${f#rust/rdma/}")
done < <(find rust/rdma -name '*.rs' -not -path 'rust/rdma/tests/*' | sort)
placed+=("rust/helpers/rdma.c rust/helpers/rdma.c")
placed+=("samples/rdma_cm_rs_echo.rs samples/rust/rdma_cm_rs_echo.rs")
snippets=(tools/intree/*.snippet tools/intree/Kconfig.* tools/intree/Makefile.*)

# --- tree, place --------------------------------------------------------------
# The stage holds what the script writes: edited/ the kernel files with the
# snippets, placed/ the copies.  Both keep a file's modification time while
# its content stays the same, and so does the work tree, whose other files
# rsync keeps equal to the pristine tree: an unchanged layer costs the
# kernel build nothing.
stage tree
mkdir -p "$stage/edited" "$stage/placed" "$work"
python3 tools/intree/place.py "$kernel_src" "$stage/edited" "${snippets[@]}" >"$logs/intree-edits.log"
for p in "${placed[@]}"; do
	src=${p% *} dst=$stage/placed/${p#* }
	mkdir -p "$(dirname "$dst")"
	cmp -s "$src" "$dst" 2>/dev/null || cp "$src" "$dst"
done
# Copies of files gone from the checkout go.
(cd "$stage/placed" && find . -type f | sed 's|^\./||' | sort) |
	comm -23 - <(for p in "${placed[@]}"; do echo "${p#* }"; done | sort) |
	while IFS= read -r f; do rm -f "$stage/placed/$f"; done
excludes=()
while IFS= read -r f; do
	excludes+=(--exclude="/$f")
done < <(cd "$stage/edited" && find . -type f | sed 's|^\./||'; printf '%s\n' rust/kernel/rdma/ \
	rust/helpers/rdma.c samples/rust/rdma_cm_rs_echo.rs)
rsync -a --delete "${excludes[@]}" "$kernel_src/" "$work/"
stage_end "$work refreshed from $kernel_src"

stage place
rsync -a "$stage/edited/" "$work/"
rsync -a --delete "$stage/placed/rust/kernel/rdma/" "$work/rust/kernel/rdma/"
rsync -a "$stage/placed/rust/helpers/rdma.c" "$work/rust/helpers/rdma.c"
rsync -a "$stage/placed/samples/rust/rdma_cm_rs_echo.rs" "$work/samples/rust/rdma_cm_rs_echo.rs"
copied=0
for p in "${placed[@]}"; do
	cmp -s "${p% *}" "$work/${p#* }" || die "$work/${p#* } is not ${p% *} byte for byte"
	copied=$((copied + 1))
done
in_tree=$(cd "$work/rust/kernel/rdma" && find . -type f | wc -l)
[ "$in_tree" -eq $((copied - 2)) ] || die "rust/kernel/rdma/ has $in_tree files, the checkout's rust/rdma/ $((copied - 2))"
sed 's/^/  /' "$logs/intree-edits.log"
stage_end "$copied files copied byte for byte, 0 edited; $(wc -l <"$logs/intree-edits.log") snippets in the kernel's files"

# --- config -------------------------------------------------------------------
stage config
# CLIPPY=1 for every target: a make without it (rustdoc builds the proc
# macros) would change the commands of the kernel's Rust objects, and the
# next build would redo them all.
kmake() { make -C "$work" O="$build" LLVM=-19 CLIPPY=1 "$@"; }
if [ -f "$build/.intree-configured" ]; then
	stage_end "cached ($build)"
else
	rm -rf "$build"
	mkdir -p "$build"
	kmake -s tinyconfig >/dev/null
	"$work/scripts/kconfig/merge_config.sh" -m -O "$build" "$build/.config" \
		.config.fragment tools/intree/intree.config.fragment >/dev/null
	kmake -s olddefconfig >/dev/null
	lost=()
	while IFS= read -r line; do
		case "$line" in
		CONFIG_*=*) grep -qxF "$line" "$build/.config" || lost+=("$line") ;;
		esac
	done < <(cat .config.fragment tools/intree/intree.config.fragment)
	[ ${#lost[@]} -eq 0 ] || die "options that did not survive olddefconfig: ${lost[*]}"
	touch "$build/.intree-configured"
	stage_end "configured $build"
fi

# --- build --------------------------------------------------------------------
# The placed files' paths as the compilers print them (relative to the
# build directory or absolute, both end so).
ours='rust/kernel/rdma/|rust/helpers/rdma\.c|samples/rust/rdma_cm_rs_echo\.rs'
# warnings LOG [PATHS]: the rustc/clippy/rustdoc diagnostics (a block up to
# the next empty line) and the compiler's lines that name a file matching
# PATHS (a regex; default: any placed file).
warnings() {
	python3 - "$1" "${2:-$ours}" <<'EOF'
import re, sys
text = open(sys.argv[1], errors="replace").read()
ours = re.compile(sys.argv[2])
out = []
for block in re.split(r"\n\s*\n", text):
    lines = block.split("\n")
    for i, line in enumerate(lines):
        if re.match(r"^(warning|error)(\[\w+\])?: ", line):
            rest = "\n".join(lines[i:])
            if ours.search(rest) and not re.match(r"^warning: \d+ warnings? emitted", line):
                out.append(rest)
            break
    else:
        out += [l for l in lines if re.search(r": (warning|error): ", l) and ours.search(l)]
if out:
    print("\n\n".join(out))
EOF
}
stage build
# The units that compile the placed files: what the build log shows when it
# compiles one, the paths of its warnings, its objects.  A unit whose
# warnings this build directory has not recorded is compiled again.
unit_names=(kernel helpers sample)
unit_built=(' (RUSTC|CLIPPY) +L rust/kernel\.o|RUSTDOC TK|doctests_kernel_generated'
	'rust/helpers/helpers(_module)?\.(o|bc)' 'samples/rust/rdma_cm_rs_echo\.o')
unit_paths=('rust/kernel/rdma/|rust/doctests_kernel_generated' 'rust/helpers/rdma\.c' 'samples/rust/rdma_cm_rs_echo\.rs')
unit_objects=(rust/kernel.o 'rust/helpers/helpers.o rust/helpers/helpers.bc rust/helpers/helpers_module.bc'
	samples/rust/rdma_cm_rs_echo.o)
for i in "${!unit_names[@]}"; do
	[ -f "$build/.intree-warnings.${unit_names[$i]}" ] ||
		for o in ${unit_objects[$i]}; do rm -f "$build/$o"; done
done
log "build: make CLIPPY=1 bzImage modules -j$jobs in $build, log $logs/intree-build.log (a first build: about 20 min on 2 cores)"
kmake -j"$jobs" bzImage modules >"$logs/intree-build.log" 2>&1 &
pid=$!
ticks=0
while sleep 1 && kill -0 "$pid" 2>/dev/null; do
	((++ticks % 60)) && continue
	log "build: $ticks s, last log line: $(tail -n1 "$logs/intree-build.log" 2>/dev/null | cut -c1-100)"
done
if ! wait "$pid"; then
	grep -E -B2 -A12 '^error' "$logs/intree-build.log" | head -n 80 >&2 || tail -n 40 "$logs/intree-build.log" >&2
	die "kernel build failed (log $logs/intree-build.log)"
fi
# A build compiles only what changed: the warnings of the placed files are
# those of the last build that compiled them, kept beside the build for
# each of the three units that compile them (the kernel crate with its
# doctests, the C helpers, the sample).
fresh=() kept=() found=
for i in "${!unit_names[@]}"; do
	w=$build/.intree-warnings.${unit_names[$i]}
	if grep -qE "${unit_built[$i]}" "$logs/intree-build.log"; then
		warnings "$logs/intree-build.log" "${unit_paths[$i]}" >"$w"
		fresh+=("${unit_names[$i]}")
	else
		kept+=("${unit_names[$i]} ($(date -r "$w" '+%F %T'))")
	fi
	[ ! -s "$w" ] || { cat "$w" >&2; found+=" ${unit_names[$i]}"; }
done
when="compiled now: ${fresh[*]:-none}${kept:+; as last compiled: ${kept[*]}}"
[ -z "$found" ] || die "warnings in the placed files:$found ($when)"
stage_end "no rustc, clippy or compiler warning in the placed files; $when"

# --- lint ---------------------------------------------------------------------
stage lint
kmake rustfmtcheck >"$logs/intree-rustfmt.log" 2>&1 || {
	head -n 60 "$logs/intree-rustfmt.log" >&2
	die "make rustfmtcheck failed (log $logs/intree-rustfmt.log)"
}
kmake -j"$jobs" rustdoc >"$logs/intree-rustdoc.log" 2>&1 || {
	tail -n 40 "$logs/intree-rustdoc.log" >&2
	die "make rustdoc failed (log $logs/intree-rustdoc.log)"
}
doc_warnings=$(warnings "$logs/intree-rustdoc.log")
[ -z "$doc_warnings" ] || {
	printf '%s\n' "$doc_warnings" >&2
	die "rustdoc warnings in the placed files"
}
# The change as a patch: the kernel files edited, the placed files whole.
patch=$logs/intree.patch
cat >"$patch" <<EOF
Subject: [PATCH] rust: rdma: RDMA verbs and connection manager abstractions

The abstraction layer of rdma-cm-rs ($(git rev-parse --short HEAD)) as
rust/kernel/rdma/ behind RUST_INFINIBAND_ABSTRACTIONS, its helpers as
rust/helpers/rdma.c, and its echo sample as
samples/rust/rdma_cm_rs_echo.rs, written by tools/intree.sh: the files
copied as they are, the kernel's own files given the snippets of
tools/intree/.

---
EOF
while IFS= read -r f; do
	if [ -f "$kernel_src/$f" ]; then a=$kernel_src/$f la=a/$f; else a=/dev/null la=/dev/null; fi
	diff -u --label "$la" --label "b/$f" "$a" "$work/$f" >>"$patch" || true
done < <({
	(cd "$stage/edited" && find . -type f | sed 's|^\./||')
	for p in "${placed[@]}"; do echo "${p#* }"; done
} | sort)
"$work/scripts/checkpatch.pl" --no-tree --no-signoff --show-types "$patch" >"$logs/intree-checkpatch.log" 2>&1 || true
total=$(grep -E '^total: ' "$logs/intree-checkpatch.log" || echo "total: ? (see the log)")
grep -E '^(ERROR|WARNING|CHECK):' "$logs/intree-checkpatch.log" | sort | uniq -c | sed 's/^/  checkpatch: /' || true
grep -qE '^total: 0 errors' "$logs/intree-checkpatch.log" ||
	die "checkpatch: $total (log $logs/intree-checkpatch.log, patch $patch)"
stage_end "rustfmtcheck clean, rustdoc without warnings in the placed files, checkpatch $total"

# --- module -------------------------------------------------------------------
stage module
mkdir -p "$run"
mapfile -t dirs < <(RDMA_CM_RS_OUT=$run bash -c '. tools/lib/env.sh && module_dirs')
make -C "$build" "${dirs[@]}" LLVM=-19 CLIPPY=1 modules >"$logs/intree-module.log" 2>&1 || {
	tail -n 40 "$logs/intree-module.log" >&2
	die "the out-of-tree build against $build failed (log $logs/intree-module.log)"
}
# Objects built with a warning go, so that the next run compiles them again
# rather than find nothing to do.
if grep -iE 'warning|error' "$logs/intree-module.log" >&2; then
	make -C "$build" "${dirs[@]}" LLVM=-19 clean >/dev/null 2>&1 || true
	die "warnings in the out-of-tree build against $build (log $logs/intree-module.log)"
fi
(export RDMA_CM_RS_OUT=$run && . tools/lib/env.sh && cd tools/userspace-test &&
	cargo build --release --locked -q) >>"$logs/intree-module.log" 2>&1 || {
	tail -n 20 "$logs/intree-module.log" >&2
	die "the userspace tool did not build (log $logs/intree-module.log)"
}
cp "$build/samples/rust/rdma_cm_rs_echo.ko" "$run/rdma_cm_rs_echo.ko"
[ "$(modinfo -F intree "$run/rdma_cm_rs_echo.ko")" = Y ] ||
	die "$run/rdma_cm_rs_echo.ko is not the in-tree module"
stage_end "rdma_cm_rs.ko and the samples out of tree, no warning; the in-tree rdma_cm_rs_echo.ko (intree: Y) in $run"

# --- vm -----------------------------------------------------------------------
# Two boots.  The first runs every doctest of the kernel crate (KUnit at
# boot) with debug objects off: the kernel's own hrtimer doctest puts a
# timer on the stack without annotating it, which ODEBUG reports (a
# WARNING, fatal under panic_on_warn).  The second, debug objects on, runs
# the layer's doctests alone at boot (kunit.filter_glob), then lifts the
# filter, inserts rdma_cm_rs.ko (its KUnit suites run) and drives the echo
# sample with tools/echo-test.sh.  (The filter is written with printf: a
# newline would be part of the glob.)
stage vm
ktap_counts() { # DMESG: "pass fail skip total" of the doctest suite
	sed -n 's/^# rust_doctests_kernel: pass:\([0-9]*\) fail:\([0-9]*\) skip:\([0-9]*\) total:\([0-9]*\).*/\1 \2 \3 \4/p' "$1" | tail -n1
}
vm_rc=0
RDMA_CM_RS_OUT=$run tools/vm/run --kernel "$build" --timeout 600 --no-stream \
	--kernel-arg no_debug_objects --keep-logs "$logs/intree-vm-doctests" -- true \
	>"$logs/intree-vm-doctests.out" 2>&1 || vm_rc=$?
[ "$vm_rc" -eq 0 ] || {
	tail -n 40 "$logs/intree-vm-doctests.out" >&2
	die "the doctest boot failed, status $vm_rc (logs $logs/intree-vm-doctests)"
}
read -r d_pass d_fail d_skip d_total < <(ktap_counts "$logs/intree-vm-doctests/dmesg") ||
	die "no doctest results in $logs/intree-vm-doctests/dmesg"
[ "$d_fail" -eq 0 ] && [ "$d_pass" -gt 0 ] ||
	die "doctests: $d_pass passed, $d_fail failed of $d_total ($logs/intree-vm-doctests/dmesg)"

vm_logs=$logs/intree-vm
rm -rf "$vm_logs"
RDMA_CM_RS_OUT=$run tools/vm/run --kernel "$build" --timeout 1500 --no-stream \
	--kernel-arg 'kunit.filter_glob=rust_doctests_kernel.rust_doctest_kernel_rdma_*' \
	--keep-logs "$vm_logs" -- \
	'printf "*" >/sys/module/kunit/parameters/filter_glob && insmod "$RDMA_CM_RS_OUT/rdma_cm_rs.ko" && { tools/echo-test.sh; s=$?; rmmod rdma_cm_rs || s=1; exit $s; }' \
	>"$logs/intree-vm.out" 2>&1 || vm_rc=$?
grep -E '^(not )?ok ' "$logs/intree-vm.out" | sed 's/^/  echo: /' || true
[ "$vm_rc" -eq 0 ] || {
	tail -n 40 "$logs/intree-vm.out" >&2
	die "the VM run failed, status $vm_rc (output $logs/intree-vm.out, logs $vm_logs)"
}
dmesg=$vm_logs/dmesg
[ -f "$dmesg" ] || die "no dmesg in $vm_logs"
! grep -nE '^\s*not ok ' "$dmesg" >&2 || die "a KUnit case failed ($dmesg)"
doc_rdma=$(grep -cE '^\s*ok [0-9]+ rust_doctest_kernel_rdma_' "$dmesg" || true)
doc_skip=$(grep -cE '^\s*ok [0-9]+ rust_doctest_kernel_rdma_.*# SKIP' "$dmesg" || true)
suites=$(grep -cE '^ok [0-9]+ rdma_cm_rs_' "$dmesg" || true)
[ "$doc_rdma" -gt 0 ] || die "no rdma doctest ran ($dmesg)"
[ "$suites" -gt 0 ] || die "no KUnit suite of rdma_cm_rs.ko ran ($dmesg)"
# The suites' cases (a suite of one case prints no totals line).
cases=$(grep -E '^    ok [0-9]+ ' "$dmesg" | grep -vc ' rust_doctest_kernel_' || true)
grep -E '^\s*ok [0-9]+ rust_doctest_kernel_rdma_' "$dmesg" | sed 's/^ */  doctest: /'
stage_end "doctests: all $d_pass of the kernel crate pass (debug objects off), the layer's $doc_rdma again with them on ($doc_skip skipped); rdma_cm_rs.ko: $suites KUnit suites, $cases cases passed; the in-tree echo sample passed on rxe and siw; dmesg gate clean"
