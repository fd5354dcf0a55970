#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# NVMe over Fabrics in the test VM, on rxe0 and on siw0: the kernel's own
# NVMe host (nvme-rdma, driven by nvme-cli) against the kernel's C target
# (nvmet-rdma, configured through configfs, a brd RAM disk as its
# namespace), then against the Rust target (rdma_cm_rs_nvmet.ko, a RAM
# namespace of the same size).  Per target and transport: `nvme discover`
# lists the subsystem, `nvme connect` gives a block device of the
# namespace's size, fio writes and verifies (crc32c; on the C target 4 KiB
# to 64 KiB at queue depth 8 from two jobs, so two I/O queues; on the Rust
# target a matrix, and data across a reconnect), `nvme disconnect` removes
# it.  Then the Rust target with two hosts at once, configured through
# its configfs directory, and unloaded under a connected host.  The C target stays up (see the end).  Prints KTAP;
# exits non-zero on failure.
#
# Environment: RDMA_CM_RS_NVME_MODULES (tools/vm/run: the modules in load
# order), RDMA_CM_RS_LOCAL_IP and RDMA_CM_RS_SIW_IP.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
. tools/lib/ktap.sh
. tools/lib/nvme.sh

transports="rxe=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1} siw=${RDMA_CM_RS_SIW_IP:-203.0.113.1}"
port=4421
nqn=nqn.2026-11.org.rdma-cm-rs:c-target
hostid=8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0001
hostnqn=nqn.2014-08.org.nvmexpress:uuid:$hostid
size_mib=64

if [ -z "${RDMA_CM_RS_NVME_MODULES:-}" ]; then
	echo "# no nvme-rdma, nvmet-rdma or brd in this kernel (RDMA_CM_RS_NVME_MODULES is empty)"
	result 1 "nvme: the kernel has the NVMe over Fabrics modules"
	ktap_end
	exit
fi
load_nvme_modules $size_mib
result $? "nvme: insmod ${nvme_loaded[*]}"
loaded=("${nvme_loaded[@]}")

ips=()
for t in $transports; do ips+=("${t#*=}"); done
c_target "$nqn" $port "${ips[@]}"
result $? "nvme: C target (nvmet-rdma) configured: $nqn on /dev/ram0 ($size_mib MiB), port $port on rxe0 and siw0"

# Discover, connect, fio with verify, disconnect: $1 names the target in
# the results, $2 its subsystem, $3 its port, on each transport; with a
# fourth argument, that function runs on the connection instead of the
# one fio (with the device, the transport's name and address).
exercise() {
	local who=$1 nqn=$2 port=$3 with=${4:-} t name ip out rc dev bytes
	for t in $transports; do
		name=${t%%=*} ip=${t#*=}
		out=$(nvme discover -t rdma -a "$ip" -s "$port" --hostnqn="$hostnqn" --hostid="$hostid" 2>&1)
		rc=$?
		echo "$out" | sed 's/^/# /' | grep -E 'subnqn|trsvcid|traddr|rror' | head -n 8
		[ $rc -eq 0 ] && grep -q "subnqn: *$nqn" <<<"$out"
		result $? "nvme: $who: $name: nvme discover lists $nqn"
		dev=$(connect_dev "$nqn" "$ip" "$port" 2)
		bytes=$([ -n "$dev" ] && blockdev --getsize64 "$dev" 2>/dev/null)
		[ "${bytes:-0}" = $((size_mib << 20)) ]
		result $? "nvme: $who: $name: nvme connect: ${dev:-no block device}, ${bytes:-0} bytes"
		if [ -n "$with" ]; then
			"$with" "${dev:-/nonexistent}" "$name" "$ip"
		else
			fio_on "${dev:-/nonexistent}" --name="nvme-$name" --rw=randwrite --bsrange=4k-64k \
				--iodepth=8 --numjobs=2 --size=4m --offset_increment=16m
			result $? "nvme: $who: $name: fio writes 2 x 4 MiB at random, 4-64 KiB at queue depth 8, and verifies them"
		fi
		out=$(nvme disconnect -n "$nqn" 2>&1)
		rc=$?
		echo "$out" | sed 's/^/# /' | head -n 2
		[ $rc -eq 0 ] && ! namespace_of "$nqn" >/dev/null
		result $? "nvme: $who: $name: nvme disconnect"
	done
}

exercise "C target" "$nqn" $port

# The Rust target (samples/rdma_cm_rs_nvmet.rs) on the wildcard address,
# port 4420, a RAM namespace of the same size.
rust_nqn=nqn.2026-11.org.rdma-cm-rs:nvmet
insmod "${RDMA_CM_RS_OUT:-.}/rdma_cm_rs_nvmet.ko" ns_mib=$size_mib
result $? "nvme: insmod rdma_cm_rs_nvmet ns_mib=$size_mib"
# The Rust target's fio on one connection: the verify matrix (random and
# sequential, 512 B to 1 MiB, queue depth 1 to 32, two jobs so two I/O
# queues), then data that outlives a disconnect: written, the host
# disconnected and connected again, read back.
rust_matrix() {
	local dev=$1 name=$2 ip=$3
	fio_on "$dev" --name=rand --rw=randrw --bsrange=512-1m --iodepth=32 --numjobs=2 \
		--size=4m --offset_increment=16m
	result $? "nvme: Rust target: $name: fio randrw 512 B-1 MiB, queue depth 32, 2 jobs, verified"
	fio_on "$dev" --name=seq --rw=write --bs=1m --iodepth=1 --numjobs=2 --size=4m \
		--offset_increment=16m
	result $? "nvme: Rust target: $name: fio sequential 1 MiB writes, queue depth 1, 2 jobs, verified"
	fio_on "$dev" --name=keep --rw=write --bs=64k --iodepth=4 --size=8m --offset=32m \
		--do_verify=0
	result $? "nvme: Rust target: $name: fio writes 8 MiB to keep"
	nvme disconnect -n "$rust_nqn" >/dev/null 2>&1
	dev=$(connect_dev "$rust_nqn" "$ip" 4420 2)
	fio_on "${dev:-/nonexistent}" --name=keep --rw=write --bs=64k --iodepth=4 --size=8m \
		--offset=32m --verify_only
	result $? "nvme: Rust target: $name: disconnected, connected again: the 8 MiB read back unchanged"
}
exercise "Rust target" "$rust_nqn" 4420 rust_matrix

# Two hosts at once (two host NQNs, so two controllers of the subsystem,
# each with its I/O queues; one over rxe, one over siw: nvme-cli refuses a
# second connection to one address and port), fio on both together, then
# both disconnected.
ip=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1}
siw_ip=${RDMA_CM_RS_SIW_IP:-203.0.113.1}
host2id=8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0003
host2nqn=nqn.2014-08.org.nvmexpress:uuid:$host2id
dev1=$(connect_dev "$rust_nqn" "$ip" 4420 2)
dev2=$(hostnqn=$host2nqn hostid=$host2id connect_dev "$rust_nqn" "$siw_ip" 4420 2)
[ -n "$dev1" ] && [ -n "$dev2" ] && [ "$dev1" != "$dev2" ]
result $? "nvme: Rust target: two hosts connected at once: ${dev1:-none} over rxe, ${dev2:-none} over siw"
if [ -n "$dev1" ] && [ -n "$dev2" ]; then
	fio_on "$dev1" --name=host1 --rw=randwrite --bsrange=4k-64k --iodepth=8 --size=4m \
		--offset=0 >/tmp/nvme-host1.log 2>&1 &
	pid=$!
	fio_on "$dev2" --name=host2 --rw=randwrite --bsrange=4k-64k --iodepth=8 --size=4m \
		--offset=16m
	rc2=$?
	wait $pid
	rc1=$?
	cat /tmp/nvme-host1.log
	[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
	result $? "nvme: Rust target: both hosts write 4 MiB at random at once, each verified"
else
	result 1 "nvme: Rust target: both hosts write 4 MiB at random at once, each verified"
fi
nvme disconnect -n "$rust_nqn" >/dev/null 2>&1
! namespace_of "$rust_nqn" >/dev/null && ! hostnqn=$host2nqn namespace_of "$rust_nqn" >/dev/null
result $? "nvme: Rust target: both hosts disconnected"

# The port through configfs (/sys/kernel/config/rdma_cm_rs_nvmet, on a
# kernel with CONFIG_CONFIGFS_FS): its defaults shown; the address and
# the NQN refused while it listens (EBUSY); disabled with a host
# connected; a bad NQN refused (EINVAL); a subsystem NQN of our own on
# rxe's address only, enabled: discovery lists it there, siw's address has
# no listener, a host connects and fio verifies; then the defaults back.
cfg=/sys/kernel/config/rdma_cm_rs_nvmet
own_nqn=nqn.2026-11.org.rdma-cm-rs:configured
discover() { nvme discover -t rdma -a "$1" -s 4420 --hostnqn="$hostnqn" --hostid="$hostid" 2>&1; }
if [ -d "$cfg" ]; then
	[ "$(cat $cfg/enable)" = 1 ] && [ -z "$(cat $cfg/addr_traddr)" ] &&
		[ "$(cat $cfg/subsysnqn)" = "$rust_nqn" ]
	result $? "nvme: Rust target: configfs shows the port enabled, on every address, for $rust_nqn"
	out=$(echo "$ip" 2>&1 >$cfg/addr_traddr)
	grep -q "busy" <<<"$out" && [ -z "$(cat $cfg/addr_traddr)" ]
	result $? "nvme: Rust target: configfs refuses a new address while the port listens (${out##*: })"
	dev=$(connect_dev "$rust_nqn" "$ip" 4420 2)
	echo 0 >$cfg/enable && [ "$(cat $cfg/enable)" = 0 ] && ! discover "$ip" >/dev/null
	result $? "nvme: Rust target: configfs disables the port with a host connected (${dev:-no device}): no listener"
	nvme disconnect -n "$rust_nqn" >/dev/null 2>&1
	out=$(echo "rdma-cm-rs:no-prefix" 2>&1 >$cfg/subsysnqn)
	grep -q "Invalid argument" <<<"$out" && [ "$(cat $cfg/subsysnqn)" = "$rust_nqn" ]
	result $? "nvme: Rust target: configfs refuses an NQN without the nqn. prefix (${out##*: })"
	echo "$ip" >$cfg/addr_traddr && echo "$own_nqn" >$cfg/subsysnqn && echo 1 >$cfg/enable &&
		[ "$(cat $cfg/addr_traddr)" = "$ip" ] && [ "$(cat $cfg/subsysnqn)" = "$own_nqn" ]
	result $? "nvme: Rust target: configfs: $own_nqn on $ip, enabled"
	out=$(discover "$ip")
	echo "$out" | sed 's/^/# /' | grep -E 'subnqn|traddr' | head -n 4
	grep -q "subnqn: *$own_nqn" <<<"$out" && ! discover "$siw_ip" >/dev/null
	result $? "nvme: Rust target: discovery lists $own_nqn on $ip, and $siw_ip has no listener"
	dev=$(connect_dev "$own_nqn" "$ip" 4420 2)
	fio_on "${dev:-/nonexistent}" --name=own --rw=randwrite --bsrange=4k-64k --iodepth=8 --size=4m
	result $? "nvme: Rust target: a host of $own_nqn (${dev:-no device}) writes 4 MiB at random, verified"
	nvme disconnect -n "$own_nqn" >/dev/null 2>&1
	echo 0 >$cfg/enable && echo >$cfg/addr_traddr && echo "$rust_nqn" >$cfg/subsysnqn &&
		echo 1 >$cfg/enable && discover "$siw_ip" | grep -q "subnqn: *$rust_nqn"
	result $? "nvme: Rust target: configfs: the defaults back, $rust_nqn on every address"
else
	skip "nvme: Rust target: configured through configfs" "left out: no configfs in this kernel (CONFIG_CONFIGFS_FS)"
fi

# rmmod with a host connected: the target disconnects its queues (as
# nvmet-rdma's port removal does) and unloads; the host's controller goes
# to reconnecting until it is deleted.
dev=$(connect_dev "$rust_nqn" "$ip" 4420 2)
start=$(date +%s%N)
rmmod rdma_cm_rs_nvmet
rc=$?
ms=$((($(date +%s%N) - start) / 1000000))
[ -n "$dev" ] && [ $rc -eq 0 ]
result $? "nvme: rmmod rdma_cm_rs_nvmet with a host connected (${dev:-no device}): $ms ms"
nvme disconnect -n "$rust_nqn" >/dev/null 2>&1
! namespace_of "$rust_nqn" >/dev/null
result $? "nvme: the host's controller deleted after the target went"

# Not torn down: disabling the port (the configfs unlink) destroys its
# listening id with nvmet_config_sem held, and a queue's Connect run from
# its CM handler (a command that came before ESTABLISHED) takes
# nvmet_config_sem under the id's handler mutex: lockdep reports the
# circular dependency (make check, 2026-11-29, one run of two).  The C
# target stays up until the VM ends, and its modules loaded.
why="kernel issue: the C target's teardown makes lockdep report nvmet_config_sem against the CM's handler_mutex (testing.rst)"
skip "nvme: C target torn down" "$why"
skip "nvme: rmmod ${loaded[*]}" "$why"
ktap_end
