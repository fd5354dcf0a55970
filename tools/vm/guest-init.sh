#!/bin/bash
# SPDX-License-Identifier: GPL-2.0
#
# The test sequence inside a VM started by tools/vm/run.  The initramfs'
# /init (tools/vm/init) runs this with the host's bash, chrooted into the
# host root: that root is read-only (9p), /tmp, /run and /dev/shm are tmpfs,
# and $R below is the writable results share, a temporary directory of the
# host's.
#
# Protocol with the host (files in $R; the host polls them):
#   job.env    written by the host: what to run, addresses, modules
#   guest.log  this script's progress messages (also on the console)
#   ready      setup done; in the two-VM case we then wait for the host's
#              `go` (or `abort`), so both VMs start their commands together
#   started    the command started (guest uptime)
#   cmd-done   the command ended; holds its exit status
#   stop       written by the host to the peer VM once VM A's command ended:
#              a peer command still running is a service and is stopped
#   timeout    written by the host when --timeout passed on its clock: the
#              command is stopped and the run fails
#   errors     one line per failure of the harness (setup, insmod, rmmod,
#              timeout); any line fails the run
#   output     the command's stdout and stderr, interleaved as written
#   kmemleak   the kmemleak report after the command and the rmmods (a
#              failed scan or read, or a kmemleak that disabled itself, is
#              a line in `errors` instead)
#   dmesg      the whole kernel log, no timestamps (KTAP parses from it)
#   dmesg.time the same with timestamps
#   timing     guest uptimes at each phase
#   done       everything above is written
#
# Every wait below is bounded and says what it waited for when it gives up.
set -u
R=/run/rdma-cm-rs-vm
# shellcheck source=/dev/null
. "$R/job.env"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/tmp TMPDIR=/tmp
busybox=/run/vm-busybox/busybox

# nap SECONDS: a wait without a process.  sleep(1) is a fork and an exec,
# which under TCG cost enough that the command's wait loop, ten of them a
# second, was 11% of a benchmark's CPU samples (perf, 2026-11-26); read's
# timeout on a FIFO nobody writes is bash alone.
# (/run is the guest's tmpfs; $R is the host's share.)
if mkfifo /run/rdma-cm-rs-nap && exec {nap_fd}<>/run/rdma-cm-rs-nap; then
	nap() { read -r -t "$1" -u "$nap_fd" _ || :; }
else
	nap() { sleep "$1"; }
fi

# running PID: the child PID has not exited.  kill -0 also succeeds on a
# zombie, and bash reaps an exited background job only at some points,
# which a loop of builtins (nap's read among them) may never reach: VM A
# of two once looked busy for 1500 s with its command ended (CI, and a
# local run of 2026-11-26: the wait after the host's `timeout` returned
# the command's status, 0).  /proc says Z for an exited, unreaped child.
running() {
	local stat
	kill -0 "$1" 2>/dev/null || return 1
	read -r stat <"/proc/$1/stat" 2>/dev/null || return 1
	stat=${stat##*) }
	[ "${stat%% *}" != Z ]
}

log() { echo "vm[$VM_NAME] $(uptime_s)s: $*" | tee -a "$R/guest.log"; }
error() {
	log "ERROR: $*"
	echo "$*" >>"$R/errors"
}
uptime_s() { cut -d' ' -f1 /proc/uptime; }
mark() { echo "$1=$(uptime_s)" >>"$R/timing"; }
kmsg() { echo "rdma-cm-rs-vm: $*" >/dev/kmsg; }

# Everything that must be collected whatever happened before, then `done`.
collect() {
	dmesg -t >"$R/dmesg" 2>&1
	dmesg >"$R/dmesg.time" 2>&1
	# log_buf_len is large; if the log still wrapped, say so: the KTAP
	# output or a report may be gone.
	if ! head -n 1 "$R/dmesg" | grep -q '^Linux version'; then
		error "the kernel log wrapped (raise log_buf_len in tools/vm/run)"
	fi
	mark end
	sync
	touch "$R/done"
	sync
}
setup_failed() {
	error "setup: $*"
	collect
	exit 0
}

mark boot
log "user space reached after $(uptime_s) s"
hostname "rdma-cm-rs-$VM_NAME"
# Verbs users pin memory (ucmatose, rping with large buffers).
ulimit -l unlimited

# The verbs providers of this guest's devices alone.  libibverbs loads every
# provider /etc/libibverbs.d names (17 with Debian's rdma-core 44) into each
# verbs process before it matches them to the devices, and every load is
# opens and mmaps over 9p through the debug kernel: every librdmacm tool a
# test starts paid for it (testing.rst, "Where the time goes").  The guest
# has rxe and siw only.  Without the bind the tools still work, slower.
verbs_d=/run/rdma-cm-rs-libibverbs.d
if mkdir -p "$verbs_d" && cp /etc/libibverbs.d/rxe.driver /etc/libibverbs.d/siw.driver "$verbs_d"/ &&
	mount --bind "$verbs_d" /etc/libibverbs.d; then
	log "libibverbs: the rxe and siw providers only"
else
	log "libibverbs: could not narrow its providers to rxe and siw; every provider loads"
fi

# tools/vm/run --share-rw: a host directory the command may write, mounted
# over its read-only view at its host path (or, under /tmp or /run, on a
# new directory in the guest's tmpfs).
if [ -n "${RW_SHARE:-}" ]; then
	mkdir -p "$RW_SHARE" 2>/dev/null
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rwshare "$RW_SHARE" ||
		setup_failed "cannot mount the read-write share (9p tag rwshare) at $RW_SHARE"
fi

# --- kmemleak, part 1 ------------------------------------------------------
# Only leaks of objects allocated from here on may count.  No periodic scans
# (they would cost CPU in the middle of a test, and report at random
# times).  An object is reported once two scans found it unreferenced and
# unchanged: scan twice, then `clear` forgets everything reported so far
# (boot noise); objects allocated later are not affected by the clear.  A
# scan takes seconds under TCG: this runs while we set up rxe, and the
# modules are inserted only after it finished.
#
# The peer VM of two (VM B) only stops the periodic scans: no module of
# ours runs there (it runs librdmacm and rxe for the module's peer), and
# its scans, with VM A's, on two cores doubled the time both took to set
# up (rxe up 61 s after user space, kmemleak cleared after 141 s).
#
# A kernel built without kmemleak (the bench kernel of `make bench`) has no
# leak check; one built with it must have it working.
kml=/sys/kernel/debug/kmemleak
kml_pid=
if [ ! -e $kml ] && [ -f "$KDIR/.config" ] && ! grep -qx 'CONFIG_DEBUG_KMEMLEAK=y' "$KDIR/.config"; then
	log "kmemleak: not in this kernel (CONFIG_DEBUG_KMEMLEAK is off), no leak check"
	kml=
elif [ "$PEER" = 1 ]; then
	{ echo scan=off >$kml; } 2>/dev/null &
	kml_pid=$!
else
	{ echo scan=off >$kml && echo scan >$kml && echo scan >$kml && echo clear >$kml; } 2>/dev/null &
	kml_pid=$!
fi

# --- network and rxe -------------------------------------------------------
ip link set lo up
# IPv6 duplicate address detection would hold the addresses "tentative" (no
# GID, no bind) for a second or more: there is nobody to collide with.
for c in all default; do
	sysctl -qw "net.ipv6.conf.$c.accept_dad=0" || setup_failed "sysctl accept_dad"
done

# rdma_rxe and the modules it needs (the host resolved them), from the
# kernel build directory.
for m in "${RXE_MODULES[@]}"; do
	insmod "$m" || setup_failed "insmod $m"
done

# netdev_up VAR DUMMY MAC IP IP6: the netdev a device goes on, its name put
# in VAR: in one VM (no MAC) a new dummy netdev DUMMY, in two VMs the NIC
# the host gave MAC; up, with IP/24 and IP6/64.
netdev_up() {
	local var=$1 dummy=$2 mac=$3 ip4=$4 ip6=$5 dev= d
	if [ -z "$mac" ]; then
		dev=$dummy
		ip link add "$dev" type dummy || setup_failed "ip link add $dev type dummy"
	else
		for d in /sys/class/net/*; do
			[ "$(cat "$d/address")" != "$mac" ] || dev=${d##*/}
		done
		[ -n "$dev" ] || setup_failed "no netdev with MAC $mac"
	fi
	sysctl -qw "net.ipv6.conf.$dev.accept_dad=0" || setup_failed "sysctl accept_dad on $dev"
	ip addr add "$ip4/24" dev "$dev" || setup_failed "ip addr add $ip4/24"
	ip -6 addr add "$ip6/64" dev "$dev" nodad || setup_failed "ip addr add $ip6/64"
	ip link set "$dev" up || setup_failed "ip link set $dev up"
	printf -v "$var" '%s' "$dev"
}

# rxe0: in one VM there is no NIC at all (-nic none) and rxe, which
# refuses lo, loops to its own address on a dummy netdev; in two VMs it
# goes on the one virtio NIC.
netdev_up netdev rxenet0 "$NIC_MAC" "$LOCAL_IP" "$LOCAL_IP6"
rdma link add rxe0 type rxe netdev "$netdev" || setup_failed "rdma link add rxe0 on $netdev"

# The GID table fills asynchronously (netdev events, a workqueue): wait for
# the IPv4-mapped and the IPv6 GID of our addresses.  Only the first 16 of
# rxe's 1024 entries: entries are taken lowest first (the link-local GID and
# each address, once per RoCE version), and reading all 1024 takes some 15 s
# under TCG.
gids_ready() {
	local n gid v4="" v6=""
	for ((n = 0; n < 16; n++)); do
		read -r gid </sys/class/infiniband/rxe0/ports/1/gids/$n 2>/dev/null || continue
		[ "$gid" != "$GID4" ] || v4=1
		[ "$gid" != "$GID6" ] || v6=1
	done
	[ -n "$v4" ] && [ -n "$v6" ]
}
for ((i = 0; i < 100; i++)); do
	gids_ready && break
	nap 0.1
done
gids_ready || setup_failed "rxe0 has no GIDs $GID4 and $GID6 after 10 s"
log "rxe0 is up on $netdev"
# A second device, of the other transport: siw0 (iWARP) on a netdev of its
# own, since the CM finds one device per netdev.  One VM: a dummy netdev
# (TEST-NET-3; siw loops through the kernel's TCP); two VMs: the second
# NIC, a wire of its own (TEST-NET-2).
netdev_up siwnet rxenet1 "$SIW_MAC" "$SIW_IP" "$SIW_IP6"
rdma link add siw0 type siw netdev "$siwnet" || setup_failed "rdma link add siw0 on $siwnet"
for ((i = 0; i < 300; i++)); do
	[ -e /sys/class/infiniband/siw0 ] && break
	nap 0.1
done
[ -e /sys/class/infiniband/siw0 ] || setup_failed "siw0 did not appear in 30 s"
log "siw0 is up on $siwnet"
export RDMA_CM_RS_IN_VM=1 RDMA_CM_RS_NETDEV=$netdev RDMA_CM_RS_RDMA_DEV=rxe0
export RDMA_CM_RS_OUT=$OUT RDMA_CM_RS_KERNEL_FIXES=$KERNEL_FIXES
export RDMA_CM_RS_NVME_MODULES=${NVME_MODULES:-}
export RDMA_CM_RS_LOCAL_IP=$LOCAL_IP RDMA_CM_RS_PEER_IP=$PEER_IP
export RDMA_CM_RS_LOCAL_IP6=$LOCAL_IP6 RDMA_CM_RS_PEER_IP6=$PEER_IP6
export RDMA_CM_RS_SIW_NETDEV=$siwnet
export RDMA_CM_RS_SIW_IP=$SIW_IP RDMA_CM_RS_SIW_PEER_IP=$SIW_PEER_IP
export RDMA_CM_RS_SIW_IP6=$SIW_IP6 RDMA_CM_RS_SIW_PEER_IP6=$SIW_PEER_IP6
# VM A of two may have the host kill VM B (tools/vm/run).
[ "$TWO_VMS" = 1 ] && [ "$PEER" = 0 ] && export RDMA_CM_RS_KILL_PEER=$R/kill-peer

if [ "$TWO_VMS" = 1 ]; then
	# Start together: the host answers `go` once both VMs are ready.
	touch "$R/ready"
	for ((i = 0; i < BARRIER_WAIT * 10; i++)); do
		[ -e "$R/go" ] || [ -e "$R/abort" ] && break
		nap 0.1
	done
	[ -e "$R/abort" ] && setup_failed "the other VM failed to set up"
	[ -e "$R/go" ] || setup_failed "no go from the host after $BARRIER_WAIT s"
	# The wire: both addresses must answer (this also fills the
	# neighbour caches).
	for ip in "$PEER_IP" "$PEER_IP6" "$SIW_PEER_IP" "$SIW_PEER_IP6"; do
		ok=
		for ((i = 0; i < 10; i++)); do
			if "$busybox" ping -c 1 -W 1 "$ip" >/dev/null 2>&1; then
				ok=1
				break
			fi
		done
		[ -n "$ok" ] || setup_failed "the peer $ip does not answer ping (10 s)"
	done
fi


# --- kmemleak, part 2 ------------------------------------------------------
for ((i = 0; i < 1200; i++)); do
	[ -n "$kml_pid" ] && running "$kml_pid" || break
	nap 0.1
done
if [ -z "$kml_pid" ]; then
	: # no kmemleak in this kernel: said above
elif running "$kml_pid"; then
	error "kmemleak's first scans took more than 120 s"
	kml=
elif ! wait $kml_pid; then
	error "kmemleak is not available or was disabled (see dmesg)"
	kml=
elif [ "$PEER" = 1 ]; then
	log "kmemleak: no scans on the peer VM"
	kml=
else
	log "kmemleak cleared"
fi

# --- modules and the command -----------------------------------------------
loaded=()
for m in "${MODULES[@]}"; do
	if ! insmod "$m"; then
		error "insmod $m failed"
		break
	fi
	loaded=("$(modinfo -F name "$m" 2>/dev/null || basename "$m" .ko)" "${loaded[@]}")
done

if [ ! -s "$R/errors" ]; then
	cd "$REPO" || setup_failed "cd $REPO"
	kmsg "running the command"
	log "setup done after $(uptime_s) s; running the command"
	mark started
	uptime_s >"$R/started"
	# timeout(1) puts the command in a process group of its own (pgid =
	# its pid): at the end we can find and kill what it left behind.
	timeout -v -k 10 "$CMD_TIMEOUT" bash -c "$CMD" >"$R/output" 2>&1 </dev/null &
	pid=$!
	# The guest's clock is jiffies (no TSC calibration, HPET or ACPI PM
	# timer under TCG) and falls behind when the host is busy: the host
	# says when --timeout has passed on its clock (`timeout`), and
	# timeout(1) is only the backstop.  The loop's bound is a backstop
	# too: both should fire first.
	# The command is looked at twice a second and the host's files (each
	# look a 9p request: that share is not cached) once.  Ten times a
	# second both, this loop alone was 8.8 % of an idle guest's CPU
	# samples on its two CPUs (perf, 30 s, 2026-11-26) and 14 % in a suite
	# pass: the host's two cores run both VMs, so it slowed everything.
	stopped="" timed_out=""
	for ((i = 0; i < (CMD_TIMEOUT + 20) * 2; i++)); do
		running "$pid" || break
		if ((i % 2)); then
			nap 0.5
			continue
		fi
		if [ "$PEER" = 1 ] && [ -e "$R/stop" ]; then
			# VM A is done: a peer still running was a service.
			log "VM A's command ended: stopping ours"
			stopped=1
			kill -TERM "$pid" 2>/dev/null
			break
		fi
		if [ -e "$R/timeout" ]; then
			timed_out=1
			kill -TERM "$pid" 2>/dev/null
			break
		fi
		nap 0.5
	done
	for ((i = 0; i < 30; i++)); do
		running "$pid" || break
		nap 0.5
	done
	if running "$pid"; then
		error "the command did not end (timeout $CMD_TIMEOUT s, then 15 s more)"
		kill -KILL -- "-$pid" 2>/dev/null
	fi
	wait "$pid"
	status=$?
	mark ended
	kmsg "the command exited with status $status"
	log "the command exited with status $status"
	if [ -n "$stopped" ]; then
		status=0
	elif [ -n "$timed_out" ] || [ "$status" = 124 ]; then
		error "the command timed out (--timeout $CMD_TIMEOUT)"
		status=124
	fi
	echo "$status" >"$R/status"
	echo "$status" >"$R/cmd-done"
	# Whatever the command left running (rping -s &) goes now, or it
	# would hold the modules.
	if kill -0 -- "-$pid" 2>/dev/null; then
		log "killing processes the command left behind"
		kill -TERM -- "-$pid" 2>/dev/null
		for ((i = 0; i < 50; i++)); do
			kill -0 -- "-$pid" 2>/dev/null || break
			nap 0.1
		done
		kill -KILL -- "-$pid" 2>/dev/null
		nap 0.5
	fi
	cd /
fi

# --- unload and leaks --------------------------------------------------------
# A module that does not unload holds a reference it should not.
for name in "${loaded[@]}"; do
	if ! rmmod "$name"; then
		error "rmmod $name failed (a leaked reference?)"
		lsmod >>"$R/guest.log" 2>&1
	fi
done
# kmemleak_report FILE: two scans, then the report into $R/kmemleak.  An
# empty report is what the host reads as "kmemleak clean", so every step
# must have worked: a write kmemleak refuses (EPERM once it has disabled
# itself, mm/kmemleak.c, which also empties the report if it had found
# nothing yet) or a report that cannot be read is an error, and so is a
# kmemleak that refuses a command after the report was read (it may have
# disabled itself while we read).  The host's dmesg gate also fails the run
# on kmemleak's "Kernel memory leak detector disabled".
kmemleak_report() {
	local f=$1 err step
	for step in "the first scan" "the second scan"; do
		[ "$step" = "the first scan" ] || sleep 5
		if ! err=$({ echo scan >"$f"; } 2>&1); then
			error "kmemleak: $step after the command failed (${err:-no message}): kmemleak disabled itself? No leak check for this run (see dmesg)"
			return 1
		fi
	done
	if ! err=$(cat "$f" 2>&1 >"$R/kmemleak"); then
		error "kmemleak: cannot read its report (${err:-no message}): no leak check for this run"
		return 1
	fi
	# scan=off: no change (the periodic scans are off since the set-up),
	# refused once kmemleak is disabled.
	if ! err=$({ echo scan=off >"$f"; } 2>&1); then
		error "kmemleak: refuses commands after its report was read (${err:-no message}): it disabled itself, the report means nothing"
		return 1
	fi
}
[ -z "$kml" ] || kmemleak_report "$kml"
collect
