#!/usr/bin/env bash
# SPDX-License-Identifier: GPL-2.0
#
# tools/abi-doc-check.sh: the ioctl ABI page and the uapi header in step.
#
# Every command of rust/uapi/rdma_cm_rs.h (RDMA_CM_RS_IOC_NAME, with its
# structure) is a row ``NAME`` ``structure`` of the command table in
# Documentation/rdma_cm_rs/ioctl-abi.rst, every row there is a command of
# the header, and every structure of the header is named on the page.
# Prints each difference; exit status 1 if there is one.  --help prints
# this.
set -euo pipefail
. "$(dirname "$0")/lib/help.sh"
cd "$(dirname "$0")/.."
exec python3 - rust/uapi/rdma_cm_rs.h Documentation/rdma_cm_rs/ioctl-abi.rst <<'PY'
import re, sys
header, page = (open(p).read() for p in sys.argv[1:3])
cmds = dict(re.findall(
    r'^#define\s+RDMA_CM_RS_IOC_(\w+)\s+_IO\w*\([^,]+,\s*0x[0-9a-fA-F]+,\s*struct\s+(\w+)\)',
    header, re.M))
structs = set(re.findall(r'^struct\s+(rdma_cm_rs_\w+)\s*\{', header, re.M))
rows = dict(re.findall(r'^``([A-Z_]+)``\s+``(rdma_cm_rs_\w+)``', page, re.M))
bad = []
for name, st in sorted(cmds.items()):
    if name not in rows:
        bad.append(f'RDMA_CM_RS_IOC_{name} ({st}) has no row in the page')
    elif rows[name] != st:
        bad.append(f'{name}: the header says struct {st}, the page {rows[name]}')
for name, st in sorted(rows.items()):
    if name not in cmds:
        bad.append(f'the page has a row {name} ({st}), the header no such command')
for st in sorted(structs):
    if not re.search(rf'\b{st}\b', page):
        bad.append(f'struct {st} of the header is not named on the page')
for line in bad:
    print(line)
print(f'{len(cmds)} commands, {len(structs)} structures, {len(rows)} rows: '
      f'{len(bad)} differences')
sys.exit(1 if bad else 0)
PY
