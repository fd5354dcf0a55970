#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# NVMe over Fabrics in the test VM, on rxe0 and on siw0: the kernel's own
# NVMe host (nvme-rdma, driven by nvme-cli) against the kernel's C target
# (nvmet-rdma, configured through configfs, a brd RAM disk as its
# namespace), then against the Rust target (rdma_cm_rs_nvmet.ko, a RAM
# namespace of the same size).  Per target and transport: `nvme discover` lists the subsystem,
# `nvme connect` gives a block device of the namespace's size, fio writes
# and verifies (crc32c, 4 KiB to 64 KiB, queue depth 8, two jobs, so two
# I/O queues), `nvme disconnect` removes it.  The C target stays up (see
# the end).  Prints KTAP; exits non-zero on failure.
#
# Environment: RDMA_CM_RS_NVME_MODULES (tools/vm/run: the modules in load
# order), RDMA_CM_RS_LOCAL_IP and RDMA_CM_RS_SIW_IP.
set -uo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
. tools/lib/ktap.sh

transports="rxe=${RDMA_CM_RS_LOCAL_IP:-192.0.2.1} siw=${RDMA_CM_RS_SIW_IP:-203.0.113.1}"
port=4421
nqn=nqn.2026-11.org.rdma-cm-rs:c-target
hostid=8f6c2f14-7e1b-4b43-9a37-0c3f3b0c0001
hostnqn=nqn.2014-08.org.nvmexpress:uuid:$hostid
size_mib=64
cfg=/sys/kernel/config/nvmet

read -ra modules <<<"${RDMA_CM_RS_NVME_MODULES:-}"
if [ ${#modules[@]} -eq 0 ]; then
	echo "# no nvme-rdma, nvmet-rdma or brd in this kernel (RDMA_CM_RS_NVME_MODULES is empty)"
	result 1 "nvme: the kernel has the NVMe over Fabrics modules"
	ktap_end
	exit
fi
loaded=()
ok=0
for m in "${modules[@]}"; do
	name=$(basename "$m" .ko)
	name=${name//-/_}
	if grep -q "^$name " /proc/modules; then
		continue
	fi
	if [ "$name" = brd ]; then
		insmod "$m" rd_nr=1 rd_size=$((size_mib * 1024)) || ok=1
	else
		insmod "$m" || ok=1
	fi
	loaded+=("$name")
done
result $ok "nvme: insmod ${loaded[*]}"
grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config

# The C target: one subsystem on /dev/ram0, any host, one port a transport.
c_target() {
	mkdir "$cfg/subsystems/$nqn" &&
		echo 1 >"$cfg/subsystems/$nqn/attr_allow_any_host" &&
		mkdir "$cfg/subsystems/$nqn/namespaces/1" &&
		echo /dev/ram0 >"$cfg/subsystems/$nqn/namespaces/1/device_path" &&
		echo 1 >"$cfg/subsystems/$nqn/namespaces/1/enable" || return 1
	local i=1 t
	for t in $transports; do
		mkdir "$cfg/ports/$i" &&
			echo rdma >"$cfg/ports/$i/addr_trtype" &&
			echo ipv4 >"$cfg/ports/$i/addr_adrfam" &&
			echo "${t#*=}" >"$cfg/ports/$i/addr_traddr" &&
			echo $port >"$cfg/ports/$i/addr_trsvcid" &&
			ln -s "$cfg/subsystems/$nqn" "$cfg/ports/$i/subsystems/$nqn" || return 1
		i=$((i + 1))
	done
}
c_target
result $? "nvme: C target (nvmet-rdma) configured: $nqn on /dev/ram0 ($size_mib MiB), port $port on rxe0 and siw0"

# The controller nvme-cli made for subsystem $1, once its namespace is there.
namespace_of() {
	local c n
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] || continue
		for n in "$c"/nvme*n1; do
			[ -e "$n" ] && [ -b "/dev/$(basename "$n")" ] && echo "/dev/$(basename "$n")" && return 0
		done
	done
	return 1
}

# Discover, connect, fio with verify, disconnect: $1 names the target in
# the results, $2 its subsystem, $3 its port, on each transport.
exercise() {
	local who=$1 nqn=$2 port=$3 t name ip out rc dev bytes
	for t in $transports; do
		name=${t%%=*} ip=${t#*=}
		out=$(nvme discover -t rdma -a "$ip" -s "$port" --hostnqn="$hostnqn" --hostid="$hostid" 2>&1)
		rc=$?
		echo "$out" | sed 's/^/# /' | grep -E 'subnqn|trsvcid|traddr|rror' | head -n 8
		[ $rc -eq 0 ] && grep -q "subnqn: *$nqn" <<<"$out"
		result $? "nvme: $who: $name: nvme discover lists $nqn"
		out=$(nvme connect -t rdma -a "$ip" -s "$port" -n "$nqn" --hostnqn="$hostnqn" \
			--hostid="$hostid" -i 2 2>&1)
		rc=$?
		echo "$out" | sed 's/^/# /' | head -n 4
		dev=
		if [ $rc -eq 0 ]; then
			for _ in $(seq 100); do
				dev=$(namespace_of "$nqn") && break
				sleep 0.1
			done
		fi
		bytes=$([ -n "$dev" ] && blockdev --getsize64 "$dev" 2>/dev/null)
		[ "${bytes:-0}" = $((size_mib << 20)) ]
		result $? "nvme: $who: $name: nvme connect: ${dev:-no block device}, ${bytes:-0} bytes"
		if [ -n "$dev" ]; then
			out=$(fio --name="nvme-$name" --filename="$dev" --direct=1 --ioengine=libaio \
				--rw=randwrite --bsrange=4k-64k --iodepth=8 --numjobs=2 --size=8m \
				--offset_increment=16m --verify=crc32c --verify_fatal=1 --verify_state_save=0 \
				--group_reporting --thread 2>&1)
			rc=$?
			echo "$out" | grep -E 'WRITE:|READ:|err=|verify' | sed 's/^ */# /' | head -n 6
		else
			rc=1
		fi
		result $rc "nvme: $who: $name: fio writes 2 x 8 MiB at random, 4-64 KiB at queue depth 8, and verifies them"
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
exercise "Rust target" "$rust_nqn" 4420
rmmod rdma_cm_rs_nvmet
result $? "nvme: rmmod rdma_cm_rs_nvmet"

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
