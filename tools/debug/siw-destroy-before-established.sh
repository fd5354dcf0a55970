#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/siw-destroy-before-established.sh (in the VM, on the kernel of
# tools/debug/iwcm-conn-reply-window.patch):
# A siw connection whose ESTABLISHED (CONNECT_REPLY) is still queued on
# iw_cm_wq when the active id is destroyed (no DISCONNECT).  With
# tools/debug/iwcm-conn-reply-window.patch the upcall waits 3 s, so the
# destroy always lands in the window.
set -u
tool=$RDMA_CM_RS_OUT/tools/userspace-test/target/release/userspace-test
ip=$RDMA_CM_RS_SIW_IP
fifo=/tmp/shell.fifo
mkfifo $fifo
$tool ctl shell <$fifo >/tmp/shell.out 2>&1 &
exec 3>$fifo
cmd() { echo "$*" >&3; }
cmd create tcp rc            # 1: listener
cmd bind 1 $ip:7790
cmd listen 1 4
cmd create tcp rc            # 2: client
cmd resolve-addr 2 $ip:7790
cmd event 5000
cmd resolve-route 2
cmd event 5000
cmd connect 2
cmd event 5000               # CONNECT_REQUEST on 1: new id 3
sleep 2
cmd accept 3 -
sleep 1
echo "--- destroy 2 while its ESTABLISHED is queued"
start=$(date +%s)
cmd destroy 2
cmd info
for i in $(seq 20); do
	sleep 1
	grep -q abi_version /tmp/shell.out && break
done
echo "--- destroy 2 answered: $(grep -c abi_version /tmp/shell.out) after $(( $(date +%s) - start )) s"
echo "--- tasks in D state"
for p in /proc/[0-9]*/task/[0-9]*; do
	s=$(awk '/^State:/ {print $2}' $p/status 2>/dev/null)
	[ "$s" = D ] || continue
	echo "task ${p##*/} $(cat $p/comm): $(cat $p/wchan 2>/dev/null)"
	head -12 $p/stack 2>/dev/null
done
cmd destroy 3
cmd destroy 1
cmd event 0
sleep 3
cat /tmp/shell.out
dmesg | grep -E "iwcm: DEBUG|blocked for more|Oops|KASAN|WARNING" || echo "no report in dmesg"
