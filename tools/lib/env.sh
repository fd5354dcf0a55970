# SPDX-License-Identifier: GPL-2.0
# Sourced by the tools/ scripts: one place for the toolchain and cache paths.

: "${RDMA_CM_RS_CACHE:=/var/cache/rdma-cm-rs}"
export RDMA_CM_RS_CACHE
export PATH="$HOME/.cargo/bin:$PATH"
# 7.3's Rust support needs libclang >= 17; bookworm's default is 14.
export LIBCLANG_PATH=/usr/lib/llvm-19/lib
export LLVM=-19
kernel_series=7.3
kernel_src="$RDMA_CM_RS_CACHE/src/linux-source-$kernel_series"
# The same Debian source without tools/kernel-patches/: the stock kernel a
# user brings (`KERNEL=stock make check`, tools/kernel.sh --stock).
kernel_src_stock="$RDMA_CM_RS_CACHE/src/linux-source-$kernel_series-stock"
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)

# Where builds go: the module and samples (Kbuild's objects and .ko files),
# the tool's cargo target, .kdir, the logs.  The checkout itself when it is
# writable, as Kbuild and cargo have it by default; for a read-only checkout
# or one whose path has whitespace (Kbuild splits M= on it)
# $RDMA_CM_RS_CACHE/out/<hash of its path>.  RDMA_CM_RS_OUT chooses.  The
# layout is the same either way: the .ko files at the top, the tool at
# tools/userspace-test/target/release/userspace-test, logs in build/logs
# (RDMA_CM_RS_LOGS chooses).
if [ -z "${RDMA_CM_RS_OUT:-}" ]; then
	if [ -w "$repo_root" ] && [[ $repo_root != *[[:space:]]* ]]; then
		RDMA_CM_RS_OUT=$repo_root
	else
		RDMA_CM_RS_OUT=$RDMA_CM_RS_CACHE/out/$(printf '%s' "$repo_root" | sha256sum | cut -c1-16)
	fi
fi
mkdir -p "$RDMA_CM_RS_OUT"
RDMA_CM_RS_OUT=$(cd "$RDMA_CM_RS_OUT" && pwd -P)
export RDMA_CM_RS_OUT
out_dir=$RDMA_CM_RS_OUT
tool_bin=$out_dir/tools/userspace-test/target/release/userspace-test
if [ "$out_dir" != "$repo_root" ]; then
	export CARGO_TARGET_DIR=$out_dir/tools/userspace-test/target
fi
# module_dirs: Kbuild's directory arguments, one a line.  Built elsewhere
# than in the checkout, the module's sources (Kbuild, rust/, samples/) are
# copied to $out_dir/src first, their mtimes kept, so that M= is a path
# Kbuild takes (Kbuild resolves M= and splits it on whitespace); the
# objects and .ko files go to $out_dir (MO=, Linux 6.13 and later).
module_dirs() {
	if [ "$out_dir" = "$repo_root" ]; then
		echo "M=$repo_root"
		return
	fi
	rm -rf "$out_dir/src"
	mkdir -p "$out_dir/src"
	tar -C "$repo_root" --exclude='*.o' --exclude='*.ko' --exclude='*.mod*' \
		-cf - Kbuild rust samples | tar -C "$out_dir/src" -xf -
	printf '%s\n' "M=$out_dir/src" "MO=$out_dir"
}

# The kernel build's cache key: anything that changes the built kernel or the
# ABI the module is compiled against (Rust modules must be built by the same
# rustc as the kernel).
kernel_version() { make -s -C "$kernel_src" kernelversion; }
# The patches tools/setup.sh applies to the kernel source.
kernel_patches_digest() {
	local p
	for p in "$repo_root"/tools/kernel-patches/*.patch; do
		[ -f "$p" ] && cat "$p"
	done | sha256sum | cut -c1-16
}
# A variant (the one argument of the functions below) is "" for the test
# kernel, "bench" for the bench kernel of `make bench`, "stock" for the test
# kernel's configuration on the unpatched source.
# kernel_source [VARIANT]: the source tree the variant is built from.
kernel_source() {
	if [ "${1:-}" = stock ]; then echo "$kernel_src_stock"; else echo "$kernel_src"; fi
}
# kernel_fragments [VARIANT]: the config fragments merged over tinyconfig,
# one a line, in order: later ones override earlier ones.
kernel_fragments() {
	echo "$repo_root/.config.fragment"
	[ "${1:-}" != bench ] || echo "$repo_root/bench.config.fragment"
}
# kernel_cache_key [VARIANT]: the test kernel's key is VERSION-HASH, the
# bench kernel's VERSION-bench-HASH, its hash over its fragment too, the
# stock kernel's VERSION-stock-HASH, its hash without the patches.
kernel_cache_key() {
	local version variant=${1:-}
	version=$(kernel_version)
	{
		echo "$version"
		cat "$repo_root/.config.fragment"
		if [ "$variant" = stock ]; then echo stock; else kernel_patches_digest; fi
		rustc --version
		bindgen --version
		clang-19 --version | head -n1
		[ "$variant" != bench ] || cat "$repo_root/$variant.config.fragment"
	} | sha256sum | cut -c1-16 | sed "s/^/$version-${variant:+$variant-}/"
}
kernel_build_dir() { echo "$RDMA_CM_RS_CACHE/kernel/$(kernel_cache_key "${1:-}")"; }
