#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# `make demo`: one VM, rxe on a dummy netdev at 192.0.2.1.  The module
# listens (driven through /dev/rdma_cm_rs by `userspace-test ctl listen`);
# a plain librdmacm client connects with private data; the module accepts
# with its own; a message each way; the client disconnects.  Both sides
# print what they see.
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
. tools/lib/env.sh
tool=$tool_bin
kdir=${KDIR:-$(cat "$out_dir/.kdir")}

cat <<'TXT'
rdma-cm-rs demo: the kernel module listens, a librdmacm client connects.
Booting the test VM (debug kernel under TCG: about 30 s)...

TXT
tools/vm/run --kernel "$kdir" --timeout 120 --module "$out_dir/rdma_cm_rs.ko" -- "
  echo '--- module: rdma_cm_rs.ko loaded; /dev/rdma_cm_rs:' \$($tool ctl info)
  $tool ctl listen 192.0.2.1:7471 --accept-data 'hello from the kernel' \
      --reply 'pong from the kernel' --connections 1 &
  server=\$!
  sleep 1
  $tool peer client 192.0.2.1:7471 --data 'hello from librdmacm' \
      --message 'ping from librdmacm'
  wait \$server
  echo '--- both sides saw DISCONNECTED; the module unloads with nothing left behind'
"
