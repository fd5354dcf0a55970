#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# RDMA READ/WRITE through the sample rping server, run inside the test VM:
# rdma_cm_rs_rping.ko serves rping's protocol; the unmodified rping client
# of rdmacm-utils (user space, librdmacm) and rdma_cm_rs.ko's own rping
# client (kernel to kernel, driven through /dev/rdma_cm_rs) ping it and
# verify every byte (-V).  Prints flat KTAP; exits non-zero on failure.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
# The build directory (tools/lib/env.sh): the tool and the .ko files.
built=${RDMA_CM_RS_OUT:-.}
tool=$built/tools/userspace-test/target/release/userspace-test
ip=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1}
port=7174
. tools/lib/ktap.sh
# ibv_reg_mr in rping needs locked memory.
ulimit -l unlimited

insmod "$built"/rdma_cm_rs_rping.ko port=$port size=65536
result $? "rping: insmod rdma_cm_rs_rping"
for args in "-C 10 -S 64" "-C 3 -S 60000" "-C 25 -S 1000"; do
	out=$(timeout 120 rping -c -a "$ip" -p $port -V $args 2>&1)
	rc=$?
	echo "$out" | tail -n 3 | sed 's/^/# /' | cut -c1-200
	count=${args#-C }
	count=${count%% *}
	[ $rc -eq 0 ] && sleep 0.5 && dmesg | grep -q "session ended .* after $count pings\$"
	result $? "rping: unmodified rping -c $args -V against the kernel server"
done
for args in "--count 20 --size 64" "--count 3 --size 65536"; do
	out=$($tool ctl rping "$ip:$port" $args 2>&1)
	rc=$?
	echo "$out" | tail -n 3 | sed 's/^/# /' | cut -c1-200
	result $rc "rping: kernel client (rdma_cm_rs.ko) $args against the kernel server"
done
rmmod rdma_cm_rs_rping
result $? "rping: rmmod with sessions ended"
if dmesg | grep -q "rdma_cm_rs_rping: session failed"; then
	dmesg | grep "rdma_cm_rs_rping: session failed" | sed 's/^/# /'
	result 1 "rping: no session failed"
else
	result 0 "rping: no session failed"
fi
ktap_end
