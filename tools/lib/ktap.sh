# SPDX-License-Identifier: GPL-2.0
# Flat KTAP for the in-VM shell tests: `result STATUS NAME` prints one
# "ok N - NAME" or "not ok N - NAME", `skip NAME REASON` a skipped one;
# `ktap_end` prints the plan and returns
# non-zero if any result failed.
ktap_n=0
ktap_fails=0
result() {
	ktap_n=$((ktap_n + 1))
	if [ "$1" -eq 0 ]; then
		echo "ok $ktap_n - $2"
	else
		echo "not ok $ktap_n - $2"
		ktap_fails=$((ktap_fails + 1))
	fi
}
# skip NAME REASON: "ok N - NAME # SKIP REASON", counted as neither.
skip() {
	ktap_n=$((ktap_n + 1))
	echo "ok $ktap_n - $1 # SKIP $2"
}
ktap_end() {
	echo "1..$ktap_n"
	[ "$ktap_fails" -eq 0 ]
}
