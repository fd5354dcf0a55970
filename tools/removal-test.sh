#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# Device removal, run inside the test VM after everything else (it deletes
# and re-adds the rxe device): with 101 established connections of
# rdma_cm_rs.ko (203 ids, QPs, registered regions, 100 ESTABLISHED events
# and 100 messages not yet read), UD ids (a listener, a SIDR pair with address
# handles, 3 datagrams not read) and a kernel-to-kernel rping session of the
# sample on the device, `rdma link delete` must complete within 30 s, every
# id must get DEVICE_REMOVAL, nothing of the module may stay on the device,
# two of the module's ids connected to the storage sample must not hold it,
# and the device must work again once re-added.  Runs the module's side in a
# process that never opened librdmacm (rxe cannot take a device from under
# open user verbs contexts).  Prints flat KTAP; exits non-zero on failure.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
# The build directory (tools/lib/env.sh): the tool and the .ko files.
built=${RDMA_CM_RS_OUT:-.}
tool=$built/tools/userspace-test/target/release/userspace-test
ip=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1}
. tools/lib/ktap.sh

# The kernel log from here on (the sample was loaded before, by other tests).
marker="rdma-cm-rs: device removal test starts $$"
echo "$marker" >/dev/kmsg
new_dmesg() { dmesg | sed -n "/$marker/,\$p"; }
# Whether the kernel logged $1 since the marker.  grep reads to the end:
# with `grep -q`, which quits at the first match, the writer of a long log
# dies of SIGPIPE and pipefail turns the match into a failure.
logged() { new_dmesg | grep -F -- "$1" >/dev/null; }
insmod "$built"/rdma_cm_rs_rping.ko port=7174
result $? "device removal: insmod rdma_cm_rs_rping"
# Two of the module's ids stay connected to the storage sample across the
# removal.  The sample's IB client is removed before the CM tells the
# connections (clients go in the reverse order of their registration):
# its remove must break the cycle QP -> CQ -> handler -> the device's
# table of connections -> QP itself, or the deletion waits for good.
insmod "$built"/rdma_cm_rs_store.ko port=7175 size=1048576
result $? "device removal: insmod rdma_cm_rs_store"
# The shell reads its commands from a FIFO held open until the end: it
# quits (its ids destroyed) when the FIFO closes.
holder_in=$(mktemp -u /tmp/rdma-cm-rs-holder.XXXXXX)
mkfifo "$holder_in"
$tool ctl shell <"$holder_in" >/tmp/rdma-cm-rs-store-holder.out 2>&1 &
holder=$!
exec 9>"$holder_in"
for id in 1 2; do
	printf 'create tcp rc\nresolve-addr %s %s:7175\nevent\nresolve-route %s\nevent\nconnect %s\nevent\n' \
		"$id" "$ip" "$id" "$id" >&9
done
for _ in $(seq 100); do
	[ "$(new_dmesg | grep -c 'rdma_cm_rs_store: rxe0: connection of QP')" = 2 ] && break
	sleep 0.1
done
[ "$(new_dmesg | grep -c 'rdma_cm_rs_store: rxe0: connection of QP')" = 2 ]
result $? "device removal: two of the module's ids connected to the storage sample"
# A kernel-to-kernel rping session runs during the removal (a ping every
# 50 ms: in flight, not a CPU hog competing with the teardown).
$tool ctl rping "$ip:7174" --count 100000000 --size 64 --interval-ms 50 >/dev/null 2>&1 &
pinger=$!
sleep 2
# A watchdog: `rdma link delete` waits in the kernel for every reference to
# the device, without limit; if the removal takes more than 90 s, what still
# holds it is printed (the tasks inside the module or the RDMA core, the
# kernel consumers' resources) before the result, so that a hang says where.
# (It polls a flag rather than sleeping 90 s in one go: a sleep left
# behind would hold this script's output open until it ends.)
removal_done=$(mktemp -u /tmp/rdma-cm-rs-removal-done.XXXXXX)
(
	for _ in $(seq 90); do
		[ ! -e "$removal_done" ] || exit 0
		sleep 1
	done
	echo "# watchdog: the removal still runs after 90 s"
	for t in /proc/[0-9]*/task/[0-9]*; do
		st=$(cat "$t/stack" 2>/dev/null) || continue
		grep -qE 'rdma_cm_rs|ib_|rdma_|rxe_' <<<"$st" || continue
		echo "# watchdog: task $(basename "$t") ($(cat "$t/comm" 2>/dev/null)), $(awk '/^State:/ { print $2 $3 }' "$t/status" 2>/dev/null):"
		sed 's/^/# watchdog:   /' <<<"$st"
	done
	for r in cq pd qp mr cm_id; do
		echo "# watchdog: rdma res show $r: $(rdma res show "$r" 2>/dev/null | grep -c 'rdma_cm_rs') of the module's"
	done
) &
watchdog=$!
out=$($tool ctl device-removal "$ip:7610" --connections 100 --bound-ms 30000 2>&1)
rc=$?
touch "$removal_done"
wait $watchdog 2>/dev/null
rm -f "$removal_done"
echo "$out" | grep -E "established in|link delete returned|removed|added back|Error|error" | sed 's/^/# /' | cut -c1-400
result $rc "device removal: rdma link delete within 30 s under 101 connections with unread events and messages, UD ids with peers and unread datagrams, and an rping session"
# The pinging client fails once its device is gone (bounded: 30 s).
for _ in $(seq 300); do kill -0 $pinger 2>/dev/null || break; sleep 0.1; done
if kill -0 $pinger 2>/dev/null; then
	kill $pinger
	result 1 "device removal: the pinging client ended"
else
	wait $pinger
	[ $? -ne 0 ]
	result $? "device removal: the pinging client ended with an error"
fi
logged "rdma_cm_rs_rping: session ended (device removal)"
result $? "device removal: the sample ended its session on DEVICE_REMOVAL"
# The sample keeps one PD per device through an IB client (rust/rdma/
# client.rs): its remove let go of rxe0's while a session was open (the
# link delete above would not have completed otherwise), and the device
# added back got a new one before the next session needed it.
logged "rdma_cm_rs_rping: rxe0: removed"
result $? "device removal: the sample's IB client saw rxe0 removed"
[ "$(new_dmesg | grep -c "rdma_cm_rs_rping: rxe0: added")" = 2 ]
result $? "device removal: the sample's IB client saw rxe0 added at insmod and again when re-added"
$tool ctl rping "$ip:7174" --count 2 --size 64 >/dev/null 2>&1
result $? "device removal: the sample serves again on the re-added device (with the PD its client made there)"
rmmod rdma_cm_rs_rping
result $? "device removal: rmmod rdma_cm_rs_rping"
logged "rdma_cm_rs_store: rxe0: removed"
result $? "device removal: the storage sample's IB client saw rxe0 removed, its connections open"
exec 9>&-
wait $holder
rm -f "$holder_in"
rmmod rdma_cm_rs_store
result $? "device removal: rmmod rdma_cm_rs_store"
ktap_end
