#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Fault scenarios, run inside the one test VM (tools/check.sh) with
# rdma_cm_rs.ko loaded: the guest runs with panic_on_warn=1; rmmod is
# refused while a file of the device is open and succeeds once it is
# closed; allocation and user-copy failures injected at every fault point
# of open, create, listen, connect, accept, send and MR_REG.  Prints flat
# KTAP; exits non-zero on failure.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
# The build directory (tools/lib/env.sh): the tool and the .ko files.
built=${RDMA_CM_RS_OUT:-.}
tool=$built/tools/userspace-test/target/release/userspace-test
ip=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1}
. tools/lib/ktap.sh

[ "$(cat /proc/sys/kernel/panic_on_warn)" = 1 ]
result $? "faults: the guest runs with panic_on_warn=1"

# --- rmmod while a file is open ----------------------------------------------
# A file with a listener and a resolved id, held open by a shell session.
module=/run/rdma-cm-rs-vm/modules/rdma_cm_rs.ko
fifo=$(mktemp -u /tmp/fault-shell.XXXXXX)
mkfifo "$fifo"
$tool ctl shell <"$fifo" >/tmp/fault-shell.out 2>&1 &
shell=$!
exec 7>"$fifo"
printf 'create tcp rc 1\nbind 1 %s:7690\nlisten 1 4\ncreate tcp rc 2\nresolve-addr 2 %s:7690\nevent 5000\n' "$ip" "$ip" >&7
for _ in $(seq 100); do grep -q ADDR_RESOLVED /tmp/fault-shell.out && break; sleep 0.1; done
grep -q ADDR_RESOLVED /tmp/fault-shell.out
result $? "faults: a file with a listener and a resolved id is open"
out=$(rmmod rdma_cm_rs 2>&1)
rc=$?
echo "# rmmod with the file open: status $rc: $out"
[ $rc -ne 0 ] && grep -q '^rdma_cm_rs ' /proc/modules
result $? "faults: rmmod is refused while a file is open"
exec 7>&-
wait $shell
rm -f "$fifo"
rmmod rdma_cm_rs
result $? "faults: rmmod succeeds once the file is closed"
# Back for what follows, without running the KUnit suites a second time
# (no suite matches the filter; nothing loaded later has suites).
echo 'rdma_cm_rs_none' >/sys/module/kunit/parameters/filter_glob
insmod "$module"
result $? "faults: insmod again"

# --- injected allocation failures ----------------------------------------------
# The tool prints one KTAP line per operation and one for the resources;
# two operations run at a time, each in a thread of its own.
out=$($tool ctl fail-nth "$ip:7692" 2>&1)
rc=$?
lines=0
while IFS= read -r line; do
	case $line in
	"ok "*) result 0 "faults: ${line#ok * - }"; lines=$((lines + 1)) ;;
	"not ok "*) result 1 "faults: ${line#not ok * - }"; lines=$((lines + 1)) ;;
	*) echo "# $line" ;;
	esac
done <<<"$out"
[ $rc -eq 0 ] && [ $lines -eq 8 ]
result $? "faults: fail-nth ran every operation to the end (status $rc, $lines results)"
ktap_end
