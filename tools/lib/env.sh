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
repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# The kernel build's cache key: anything that changes the built kernel or the
# ABI the module is compiled against (Rust modules must be built by the same
# rustc as the kernel).
kernel_version() { make -s -C "$kernel_src" kernelversion; }
kernel_cache_key() {
	local version
	version=$(kernel_version)
	{
		echo "$version"
		cat "$repo_root/.config.fragment"
		rustc --version
		bindgen --version
		clang-19 --version | head -n1
	} | sha256sum | cut -c1-16 | sed "s/^/$version-/"
}
kernel_build_dir() { echo "$RDMA_CM_RS_CACHE/kernel/$(kernel_cache_key)"; }
