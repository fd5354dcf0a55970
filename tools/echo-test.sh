#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Kernel-to-kernel test, run inside the test VM on rxe0 and on siw0: the
# sample echo module listens, rdma_cm_rs.ko connects to it through
# /dev/rdma_cm_rs (driven by the userspace tool) and checks that messages
# come back unchanged; once as it is, once busy-polling (busy_poll=1).
# Prints KTAP; exits non-zero on failure.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
# The build directory (tools/lib/env.sh): the tool and the .ko files.
built=${RDMA_CM_RS_OUT:-.}
tool=$built/tools/userspace-test/target/release/userspace-test
# The sample listens on the wildcard: it serves rxe0 and siw0 alike.
transports="rxe=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1} siw=${RDMA_CM_RS_SIW_IP:-203.0.113.1}"
port=7500
. tools/lib/ktap.sh

# Twice: the completions run by a workqueue's worker, then polled by a
# loop of each connection's own (busy_poll=1).
for mode in workqueue busy_poll; do
	params=
	[ $mode = busy_poll ] && params=busy_poll=1
	insmod "$built"/rdma_cm_rs_echo.ko port=$port $params
	result $? "echo: $mode: insmod rdma_cm_rs_echo $params"
	for t in $transports; do
		ip=${t#*=}
		# Busy-polling, the largest message alone: the loop is what differs.
		msgs=(x "hello, echo" "$(head -c 4000 /dev/zero | tr '\0' 'e')")
		[ $mode = busy_poll ] && msgs=("${msgs[2]}")
		for msg in "${msgs[@]}"; do
			# The tool compares the reply with the message byte for byte.
			out=$($tool ctl connect "$ip:$port" --message "$msg" --expect-echo 2>&1)
			rc=$?
			echo "$out" | sed 's/^/# /' | cut -c1-200
			[ $rc -eq 0 ] && grep -qx "module: the reply is the message, ${#msg} bytes" <<<"$out"
			result $? "echo: $mode: ${t%%=*}: kernel client <-> kernel echo service, ${#msg}-byte message"
		done
	done
	rmmod rdma_cm_rs_echo
	result $? "echo: $mode: rmmod with connections ended"
done
ktap_end
