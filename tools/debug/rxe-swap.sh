#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/rxe-swap.sh RXE_KO: run inside a test VM (tools/vm/run ... --
# 'tools/debug/rxe-swap.sh build/rxe/rdma_rxe.ko; ...'), replaces rdma_rxe
# with RXE_KO, an rdma_rxe.ko built out of tree (for example with
# tools/debug/rxe-stall-watchdog.patch applied), and brings rxe0 back on
# the netdev the guest set up for it, with its addresses' GIDs.  The
# module under test stays loaded: its IB client lets rxe0 go and takes the
# new one.  Debugging aid; make check never runs it.
#
# Building RXE_KO from the test kernel's source, with K=$(cat .kdir):
#   mkdir -p build/rxe && cp $K/source/drivers/infiniband/sw/rxe/* build/rxe/
#   patch -d build/rxe -p5 < tools/debug/rxe-stall-watchdog.patch
#   make -C $K M=$PWD/build/rxe LLVM=-19 CONFIG_RDMA_RXE=m modules
set -e
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 RXE_KO" >&2; exit 2; }
[ -n "${RDMA_CM_RS_NETDEV:-}" ] || { echo "$0: not in a test VM (no RDMA_CM_RS_NETDEV)" >&2; exit 2; }
rdma link delete rxe0
rmmod rdma_rxe
insmod "$1"
rdma link add rxe0 type rxe netdev "$RDMA_CM_RS_NETDEV"
# The GID table fills asynchronously: wait for a GID of each family.
for ((i = 0; i < 100; i++)); do
	v4="" v6=""
	for ((n = 0; n < 16; n++)); do
		read -r gid </sys/class/infiniband/rxe0/ports/1/gids/$n 2>/dev/null || continue
		case $gid in
		0000:0000:0000:0000:0000:ffff:*) v4=1 ;;
		fe80:*|0000:0000:0000:0000:0000:0000:0000:0000) ;;
		*) v6=1 ;;
		esac
	done
	[ -n "$v4" ] && [ -n "$v6" ] && break
	sleep 0.1
done
[ -n "$v4" ] && [ -n "$v6" ] || { echo "$0: rxe0 has no IPv4 and IPv6 GIDs after 10 s" >&2; exit 1; }
echo "rxe0 is up on $RDMA_CM_RS_NETDEV with $1"
