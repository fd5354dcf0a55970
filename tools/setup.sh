#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Installs everything rdma-cm-rs needs on a Debian machine (bookworm or
# trixie, as root) and prepares the kernel source.  Idempotent: a second run
# only checks and takes seconds.
#
#   tools/setup.sh            packages, Rust components, bindgen, kernel source
#   tools/setup.sh --bench    the same, and gnuplot-nox for `make bench`'s plot
#
# Environment:
#   KDIR=...                  a Rust-enabled kernel build of the user's own: no
#                             kernel source is fetched
#   RDMA_CM_RS_KERNEL=stock   also the same source without tools/kernel-patches/
#                             (`make check KERNEL=stock`)
#   RDMA_CM_RS_CACHE=...      where downloads and builds are cached
#                             (default /var/cache/rdma-cm-rs)
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
. "$(dirname "$0")/lib/env.sh"

cache=$RDMA_CM_RS_CACHE
bindgen_version=0.72.1

log() { printf 'setup: %s\n' "$*" >&2; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (packages are installed with apt-get)"

packages=(
	clang-19 lld-19 llvm-19 libclang-19-dev
	qemu-system-x86 busybox-static
	librdmacm-dev libibverbs-dev ibverbs-providers rdmacm-utils ibverbs-utils
	iproute2 flex bison bc libelf-dev libssl-dev cpio kmod xz-utils
	make gcc pkg-config patch
	rsync
	nvme-cli fio
)
case "${1:-}" in
--bench) packages+=(gnuplot-nox) ;;
"") ;;
*) die "unknown argument '$1' (tools/setup.sh [--bench])" ;;
esac

install_packages() {
	local missing=() p
	for p in "${packages[@]}"; do
		dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
			missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

install_rust_parts() {
	command -v rustup >/dev/null || die "rustup not found: install Rust with rustup first"
	# grep reads the whole list: with -q, rustup (writing line by line)
	# could die of SIGPIPE, and pipefail would install again.
	rustup component list --installed 2>/dev/null | grep '^rust-src' >/dev/null ||
		rustup component add rust-src
	for c in rustfmt clippy; do
		rustup component list --installed 2>/dev/null | grep "^$c" >/dev/null ||
			rustup component add "$c"
	done
	if ! bindgen --version 2>/dev/null | grep -qx "bindgen $bindgen_version"; then
		log "installing bindgen-cli $bindgen_version"
		cargo install --quiet bindgen-cli --version "$bindgen_version" --locked
	fi
}

# The mirror of the machine's own Debian sources, read at run time so that no
# registry host name is ever written into the repository.
debian_mirror() {
	local uri
	uri=$(awk '
		/^URIs:/ { u = $2 }
		/^Suites:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) s = 1 }
		/^$/ { if (u != "" && s) { print u; exit } u = ""; s = 0 }
		END { if (u != "" && s) print u }' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
	if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
		uri=$(awk '$1 == "deb" && $0 !~ /security/ {
			for (i = 2; i <= NF; i++) if ($i !~ /^\[/ && $i !~ /\]$/ && $i ~ /:\/\//) { print $i; exit } }' \
			/etc/apt/sources.list)
	fi
	[ -n "$uri" ] || die "no Debian mirror found in the system's apt sources"
	printf '%s\n' "$uri"
}

# fetch_kernel_source [stock]: fetches Debian's linux-source-$kernel_series
# from trixie-backports through a private apt configuration: its own sources
# and lists, the system keyring; unpacks it and applies tools/kernel-patches/
# (fixes of kernel bugs the suite found, each written for upstream), or with
# "stock" unpacks it as it is into $kernel_src_stock.  The stamp holds the
# digest of the patches applied: a changed set unpacks the source again.
fetch_kernel_source() {
	local src_root="$cache/src" apt_root="$cache/apt" deb tarball dir digest stock=${1:-}
	local name=linux-source-$kernel_series
	if [ -n "$stock" ]; then
		digest=stock
		dir=$kernel_src_stock
	else
		digest=$(kernel_patches_digest)
		dir=$kernel_src
	fi
	if [ -f "$dir/.rdma-cm-rs-complete" ] &&
		[ "$(cat "$dir/.rdma-cm-rs-complete")" = "$digest" ]; then
		return 0
	fi
	mkdir -p "$apt_root/sources.list.d" "$apt_root/lists/partial" \
		"$apt_root/archives/partial" "$apt_root/preferences.d" "$src_root"
	printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s trixie-backports main\n' \
		"$(debian_mirror)" >"$apt_root/sources.list"
	local opts=(
		-o Dir::Etc::sourcelist="$apt_root/sources.list"
		-o Dir::Etc::sourceparts="$apt_root/sources.list.d"
		-o Dir::Etc::preferencesparts="$apt_root/preferences.d"
		-o Dir::State::Lists="$apt_root/lists"
		-o Dir::Cache::Archives="$apt_root/archives"
		-o Dir::Cache::pkgcache="" -o Dir::Cache::srcpkgcache=""
		-o APT::Get::List-Cleanup=0
		# The cache is root's: download as root rather than as _apt.
		-o APT::Sandbox::User=root
	)
	deb=$(ls -t "$apt_root"/archives/linux-source-"$kernel_series"_*.deb 2>/dev/null | head -n1 || true)
	if [ -z "$deb" ]; then
		log "fetching linux-source-$kernel_series (private apt configuration)"
		apt-get "${opts[@]}" update -qq
		(cd "$apt_root/archives" && apt-get "${opts[@]}" download -qq "linux-source-$kernel_series")
		deb=$(ls -t "$apt_root"/archives/linux-source-"$kernel_series"_*.deb | head -n1)
	fi
	[ -f "$deb" ] || die "linux-source-$kernel_series was not downloaded"
	log "unpacking $(basename "$deb")"
	rm -rf "$apt_root/unpack" && mkdir -p "$apt_root/unpack"
	dpkg-deb -x "$deb" "$apt_root/unpack"
	tarball=$(ls "$apt_root"/unpack/usr/src/linux-source-"$kernel_series".tar.* | head -n1)
	rm -rf "$dir" "$src_root/unpack"
	mkdir -p "$src_root/unpack"
	tar -C "$src_root/unpack" -xf "$tarball"
	rm -rf "$apt_root/unpack"
	[ -f "$src_root/unpack/$name/Makefile" ] || die "unexpected tarball layout in $deb"
	mv "$src_root/unpack/$name" "$dir"
	rmdir "$src_root/unpack"
	local version
	version=$(make -s -C "$dir" kernelversion)
	case "$version" in
	"$kernel_series".*) log "kernel source $version in $dir" ;;
	*) die "expected a $kernel_series.x kernel, got $version" ;;
	esac
	local p
	[ -n "$stock" ] || for p in "$repo_root"/tools/kernel-patches/*.patch; do
		[ -f "$p" ] || continue
		log "applying $(basename "$p")"
		patch -d "$dir" -p1 --forward --quiet <"$p" || die "$(basename "$p") does not apply to $version"
	done
	echo "$digest" >"$dir/.rdma-cm-rs-complete"
}

install_packages
install_rust_parts
if [ -z "${KDIR:-}" ]; then
	fetch_kernel_source
	[ "${RDMA_CM_RS_KERNEL:-}" != stock ] || fetch_kernel_source stock
fi
log "ready"
