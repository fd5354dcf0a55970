# SPDX-License-Identifier: GPL-2.0
# NVMe over Fabrics helpers of the in-VM scripts (tools/nvme-test.sh,
# tools/nvme-bench.sh): the kernel's modules, the C target through
# configfs, the host's connections and their block devices.
#
# Expects: $hostnqn and $hostid (the host's identity, passed explicitly:
# the guests share /etc/nvme over 9p).

nvmet_cfg=/sys/kernel/config/nvmet

# load_nvme_modules BRD_MIB: insmod RDMA_CM_RS_NVME_MODULES in their order
# (brd with one RAM disk of BRD_MIB), those loaded already skipped; sets
# nvme_loaded to the names loaded.  Fails if the list is empty or an
# insmod fails.
load_nvme_modules() {
	local m name rc=0 modules
	read -ra modules <<<"${RDMA_CM_RS_NVME_MODULES:-}"
	nvme_loaded=()
	[ ${#modules[@]} -gt 0 ] || return 1
	for m in "${modules[@]}"; do
		name=$(basename "$m" .ko)
		name=${name//-/_}
		grep -q "^$name " /proc/modules && continue
		if [ "$name" = brd ]; then
			insmod "$m" rd_nr=1 rd_size=$(($1 * 1024)) || rc=1
		else
			insmod "$m" || rc=1
		fi
		nvme_loaded+=("$name")
	done
	grep -q " /sys/kernel/config " /proc/mounts || mount -t configfs none /sys/kernel/config
	return $rc
}

# c_target NQN PORT ADDR...: the C target (nvmet-rdma) serving /dev/ram0 as
# namespace 1 of NQN to any host, one port per address.
c_target() {
	local nqn=$1 port=$2 i=1 a
	shift 2
	mkdir "$nvmet_cfg/subsystems/$nqn" &&
		echo 1 >"$nvmet_cfg/subsystems/$nqn/attr_allow_any_host" &&
		mkdir "$nvmet_cfg/subsystems/$nqn/namespaces/1" &&
		echo /dev/ram0 >"$nvmet_cfg/subsystems/$nqn/namespaces/1/device_path" &&
		echo 1 >"$nvmet_cfg/subsystems/$nqn/namespaces/1/enable" || return 1
	for a in "$@"; do
		mkdir "$nvmet_cfg/ports/$i" &&
			echo rdma >"$nvmet_cfg/ports/$i/addr_trtype" &&
			echo ipv4 >"$nvmet_cfg/ports/$i/addr_adrfam" &&
			echo "$a" >"$nvmet_cfg/ports/$i/addr_traddr" &&
			echo "$port" >"$nvmet_cfg/ports/$i/addr_trsvcid" &&
			ln -s "$nvmet_cfg/subsystems/$nqn" "$nvmet_cfg/ports/$i/subsystems/$nqn" || return 1
		i=$((i + 1))
	done
}

# namespace_of NQN: the block device of namespace 1 of the controller the
# host ($hostnqn) has for NQN, once it is there.
namespace_of() {
	local c n
	for c in /sys/class/nvme/nvme*; do
		[ "$(cat "$c/subsysnqn" 2>/dev/null)" = "$1" ] || continue
		[ "$(cat "$c/hostnqn" 2>/dev/null)" = "$hostnqn" ] || continue
		for n in "$c"/nvme*n1; do
			[ -e "$n" ] && [ -b "/dev/$(basename "$n")" ] && echo "/dev/$(basename "$n")" && return 0
		done
	done
	return 1
}

# connect_dev NQN ADDR PORT QUEUES: connects with QUEUES I/O queues and
# prints the namespace's block device (nvme connect's errors as "# " lines
# on stderr).
connect_dev() {
	local out dev=
	out=$(nvme connect -t rdma -a "$2" -s "$3" -n "$1" --hostnqn="$hostnqn" \
		--hostid="$hostid" -i "$4" 2>&1) || { echo "$out" | sed 's/^/# /' >&2; return 1; }
	for _ in $(seq 100); do
		dev=$(namespace_of "$1") && echo "$dev" && return 0
		sleep 0.1
	done
	return 1
}

# fio_on DEV OPTION...: fio on DEV, direct, libaio, crc32c verify, with
# OPTIONs; its summary lines as "# " diagnostics.
fio_on() {
	local dev=$1 out rc
	shift
	out=$(fio --filename="$dev" --direct=1 --ioengine=libaio --thread --group_reporting \
		--verify=crc32c --verify_fatal=1 --verify_state_save=0 "$@" 2>&1)
	rc=$?
	echo "$out" | grep -E 'WRITE:|READ:|err=|verify|rror' | sed 's/^ */# /' | head -n 6
	return $rc
}

