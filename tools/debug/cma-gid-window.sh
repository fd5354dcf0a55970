#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/cma-gid-window.sh (in the VM, on the kernel of
# tools/debug/cma-gid-window.patch): the last id on siw0, bound to its
# address (so it holds a GID entry of siw0), is destroyed by the module's
# deferred destruction after DEVICE_REMOVAL while `rdma link delete siw0`
# finishes; prints what dmesg reported.
set -u
tool=$RDMA_CM_RS_OUT/tools/userspace-test/target/release/userspace-test
fifo=/tmp/shell.fifo
mkfifo $fifo
$tool ctl shell <$fifo >/tmp/shell.out 2>&1 &
shell=$!
exec 3>$fifo
echo "create tcp rc" >&3
echo "bind 1 $RDMA_CM_RS_SIW_IP:7777" >&3
echo "query 1" >&3
sleep 2
start=$(date +%s.%N)
rdma link delete siw0
echo "rdma link delete siw0: exit $? after $(echo "$(date +%s.%N) - $start" | bc) s"
echo "event 5000" >&3
sleep 4
echo quit >&3
exec 3>&-
wait $shell
cat /tmp/shell.out
sleep 2
rdma link add siw0 type siw netdev "$RDMA_CM_RS_SIW_NETDEV" && echo "siw0 added back"
sleep 2
dmesg | grep -E "cma_release_dev|Oops|KASAN|free_gid_work|BUG:|general protection" || echo "no report in dmesg"
