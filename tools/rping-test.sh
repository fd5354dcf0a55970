#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# RDMA READ/WRITE through the sample rping server, run inside the test VM on
# rxe0 and on siw0: rdma_cm_rs_rping.ko serves rping's protocol; the
# unmodified rping client of rdmacm-utils (user space, librdmacm) and
# rdma_cm_rs.ko's own rping client (kernel to kernel, driven through
# /dev/rdma_cm_rs) ping it and verify every byte (-V).  Prints flat KTAP;
# exits non-zero on failure.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
# The build directory (tools/lib/env.sh): the tool and the .ko files.
built=${RDMA_CM_RS_OUT:-.}
tool=$built/tools/userspace-test/target/release/userspace-test
# The sample listens on the wildcard: it serves rxe0 and siw0 alike.
transports="rxe=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1} siw=${RDMA_CM_RS_SIW_IP:-203.0.113.1}"
port=7174
. tools/lib/ktap.sh
# ibv_reg_mr in rping needs locked memory.
ulimit -l unlimited

# The kernel log from here on (other tests loaded the sample before).
marker="rdma-cm-rs: rping test starts $$"
echo "$marker" >/dev/kmsg
insmod "$built"/rdma_cm_rs_rping.ko port=$port size=65536
result $? "rping: insmod rdma_cm_rs_rping"
# Sessions the sample ended after N pings, as its dmesg lines say.
ended() { dmesg | grep -c "session ended .* after $1 pings\$"; }
# Whether the sample ends one more such session within 10 s: rping -c
# exits on its own DISCONNECTED, the sample's teardown may come later.
one_more_ended() {
	local i
	for ((i = 0; i < 50; i++)); do
		[ "$(ended "$1")" -gt "$2" ] && return 0
		sleep 0.2
	done
	return 1
}
for t in $transports; do
	ip=${t#*=}
	for args in "-C 10 -S 64" "-C 3 -S 60000" "-C 25 -S 1000"; do
		count=${args#-C }
		count=${count%% *}
		before=$(ended "$count")
		out=$(timeout 120 rping -c -a "$ip" -p $port -V $args 2>&1)
		rc=$?
		echo "$out" | tail -n 3 | sed 's/^/# /' | cut -c1-200
		[ $rc -eq 0 ] || echo "# rping exited with status $rc"
		[ $rc -eq 0 ] && one_more_ended "$count" "$before"
		result $? "rping: ${t%%=*}: unmodified rping -c $args -V against the kernel server"
	done
	for args in "--count 20 --size 64" "--count 3 --size 65536"; do
		out=$($tool ctl rping "$ip:$port" $args 2>&1)
		rc=$?
		echo "$out" | tail -n 3 | sed 's/^/# /' | cut -c1-200
		result $rc "rping: ${t%%=*}: kernel client (rdma_cm_rs.ko) $args against the kernel server"
	done
done
rmmod rdma_cm_rs_rping
result $? "rping: rmmod with sessions ended"
# The sample logs a session that failed as "session ended (...) after N
# pings, failed".  grep reads to the end (no -q: a writer it left behind
# would die of SIGPIPE, which pipefail reports as no match).
failed=$(dmesg | sed -n "/$marker/,\$p" | grep "rdma_cm_rs_rping: session ended .*, failed\$")
if [ -n "$failed" ]; then
	echo "$failed" | sed 's/^/# /'
	result 1 "rping: no session failed"
else
	result 0 "rping: no session failed"
fi
ktap_end
