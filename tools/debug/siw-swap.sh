#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/siw-swap.sh SIW_KO: run inside a test VM (tools/vm/run ... --
# 'tools/debug/siw-swap.sh build/siw/siw.ko; ...'), replaces siw with
# SIW_KO, a siw.ko built out of tree (for example with
# tools/debug/siw-fin-window.patch applied), and brings siw0 back on the
# netdev the guest set up for it.  Debugging aid; make check never runs it.
#
# Building SIW_KO from the test kernel's source, with K=$(cat .kdir):
#   mkdir -p build/siw && cp $K/source/drivers/infiniband/sw/siw/* build/siw/
#   patch -d build/siw -p5 < tools/debug/siw-fin-window.patch
#   make -C $K M=$PWD/build/siw LLVM=-19 CONFIG_RDMA_SIW=m modules
set -e
[ $# -eq 1 ] && [ -f "$1" ] || { echo "usage: $0 SIW_KO" >&2; exit 2; }
[ -n "$RDMA_CM_RS_SIW_NETDEV" ] || { echo "$0: not in a test VM (no RDMA_CM_RS_SIW_NETDEV)" >&2; exit 2; }
rdma link delete siw0
rmmod siw
insmod "$1"
rdma link add siw0 type siw netdev "$RDMA_CM_RS_SIW_NETDEV"
i=0
until [ -e /sys/class/infiniband/siw0 ]; do
	i=$((i + 1))
	[ $i -le 30 ] || { echo "$0: siw0 did not come back" >&2; exit 1; }
	sleep 1
done
echo "siw0 is up on $RDMA_CM_RS_SIW_NETDEV with $1"
