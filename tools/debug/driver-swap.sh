#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/driver-swap.sh rxe|siw KO: run inside a test VM (tools/vm/run
# ... -- 'tools/debug/driver-swap.sh rxe build/rxe/rdma_rxe.ko; ...'),
# replaces the driver (rdma_rxe or siw) with KO, one built out of tree (for
# example with tools/debug/rxe-stall-watchdog.patch, rxe-ack-window.patch
# or siw-fin-window.patch applied), and brings its device (rxe0, siw0)
# back on the netdev the guest set up for it, with its addresses' GIDs.
# The module under test stays loaded: its IB client lets the old device go
# and takes the new one.  Debugging aid; make check never runs it.
#
# Building KO from the test kernel's source, with K=$(cat .kdir) and
# D=rxe (CONFIG_RDMA_RXE) or D=siw (CONFIG_RDMA_SIW):
#   mkdir -p build/$D && cp $K/source/drivers/infiniband/sw/$D/* build/$D/
#   patch -d build/$D -p5 < tools/debug/THE.patch
#   make -C $K M=$PWD/build/$D LLVM=-19 CONFIG_RDMA_RXE=m CONFIG_RDMA_SIW=m modules
set -e
[ $# -eq 2 ] && [ -f "$2" ] || { echo "usage: $0 rxe|siw KO" >&2; exit 2; }
case $1 in
rxe) module=rdma_rxe dev=rxe0 netdev=${RDMA_CM_RS_NETDEV:-} ;;
siw) module=siw dev=siw0 netdev=${RDMA_CM_RS_SIW_NETDEV:-} ;;
*) echo "usage: $0 rxe|siw KO" >&2; exit 2 ;;
esac
[ -n "$netdev" ] || { echo "$0: not in a test VM (no netdev for $dev)" >&2; exit 2; }
rdma link delete "$dev"
rmmod "$module"
insmod "$2"
rdma link add "$dev" type "$1" netdev "$netdev"
# rxe's GID table fills asynchronously: wait for a GID of each family
# (siw has its device once the link is added).
for ((i = 0; i < 100; i++)); do
	v4="" v6=""
	for ((n = 0; n < 16; n++)); do
		read -r gid <"/sys/class/infiniband/$dev/ports/1/gids/$n" 2>/dev/null || continue
		case $gid in
		0000:0000:0000:0000:0000:ffff:*) v4=1 ;;
		fe80:*|0000:0000:0000:0000:0000:0000:0000:0000) ;;
		*) v6=1 ;;
		esac
	done
	[ "$1" = siw ] && [ -e "/sys/class/infiniband/$dev" ] && break
	[ -n "$v4" ] && [ -n "$v6" ] && break
	sleep 0.1
done
[ -e "/sys/class/infiniband/$dev" ] || { echo "$0: $dev did not come back" >&2; exit 1; }
[ "$1" = siw ] || { [ -n "$v4" ] && [ -n "$v6" ]; } ||
	{ echo "$0: $dev has no IPv4 and IPv6 GIDs after 10 s" >&2; exit 1; }
echo "$dev is up on $netdev with $2"
