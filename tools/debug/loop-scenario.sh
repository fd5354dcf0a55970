#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/loop-scenario.sh FILTER ROUNDS [PASS...]
#
# Inside the test VM (tools/vm/run, the module inserted): runs the suite's
# scenarios whose names contain FILTER in the given passes at once (default
# all four of make check: rxe, rxe-sync, siw, siw-sync), ROUNDS times, and
# stops at the first round with a failure, whose output it prints.  For a
# failure seen once in a few make checks: a scenario alone, looped, meets
# it in minutes.  Prints "loop: N rounds, F failed".  With LOOP_PEER=1,
# in VM A of `tools/vm/run --two-vms` whose VM B runs the agent on port
# 7999, the scenarios run against the other VM, as in make check's vm-two.
#
#   tools/vm/run --no-stream --timeout 1800 --keep-logs build/loop \
#     --module $PWD/rdma_cm_rs.ko -- \
#     "cd $PWD && RDMA_CM_RS_OUT=$PWD bash tools/debug/loop-scenario.sh first_message 50"
#
#   tools/vm/run --no-stream --timeout 1800 --keep-logs build/loop2 \
#     --module $PWD/rdma_cm_rs.ko --two-vms --kernel-arg kunit.enable=0 \
#     --peer-cmd "$PWD/tools/userspace-test/target/release/userspace-test agent --listen 0.0.0.0:7999" -- \
#     "cd $PWD && RDMA_CM_RS_OUT=$PWD LOOP_PEER=1 bash tools/debug/loop-scenario.sh ucmatose_module_server 20"
set -u
source "$(dirname "$0")/../lib/env.sh"
filter=${1:?FILTER}
rounds=${2:?ROUNDS}
shift 2
passes=("$@")
[ ${#passes[@]} -gt 0 ] || passes=(rxe rxe-sync siw siw-sync)
args_of() {
	case $1 in
	rxe) echo "" ;;
	rxe-sync) echo "--sync" ;;
	siw) echo "--transport siw" ;;
	siw-sync) echo "--sync --transport siw" ;;
	*) echo "loop: unknown pass $1" >&2; exit 2 ;;
	esac
	if [ "${LOOP_PEER:-0}" = 1 ]; then
		echo "--peer $RDMA_CM_RS_PEER_IP:7999"
	fi
}
logs=$(mktemp -d)
failed=0
for ((round = 1; round <= rounds; round++)); do
	pids=()
	for pass in "${passes[@]}"; do
		# shellcheck disable=SC2046 # the pass's flags, split on purpose
		"$tool_bin" suite --filter "$filter" $(args_of "$pass") >"$logs/$pass" 2>&1 &
		pids+=($!)
	done
	bad=()
	for i in "${!pids[@]}"; do
		wait "${pids[$i]}" || bad+=("${passes[$i]}")
	done
	if [ ${#bad[@]} -gt 0 ]; then
		failed=1
		for pass in "${bad[@]}"; do
			echo "loop: round $round, pass $pass failed:"
			cat "$logs/$pass"
		done
		break
	fi
	echo "loop: round $round passed ($(date +%T))"
done
echo "loop: $((round > rounds ? rounds : round)) rounds, $failed failed"
rm -rf "$logs"
exit $failed
