#!/usr/bin/env python3
# SPDX-License-Identifier: GPL-2.0
#
# tools/debug/module-memory.py N < SCRIPT
#
# The kernel memory a module holds per connection, from the kmalloc and
# kfree tracepoints: SCRIPT is `perf script -F event,trace,ip,sym` of a
# `perf record -a -g -e kmem:kmalloc -e kmem:kfree` around a run that
# holds N connections at its peak.  An allocation counts when a frame of
# its call chain is in rdma_cm_rs (its Rust symbols carry the crate's
# name); it is the module's own when the first frame above the allocator's
# is Rust, and made for it by the C code it called (the CM, the core,
# rxe) otherwise.  Each is counted at its kmalloc size class on a kernel
# without debug options (from bytes_req: a KASAN kernel's bytes_alloc
# includes its metadata), from its kmalloc to its kfree.  Prints both
# peaks per connection and the module's own live objects at its peak, by
# size class and allocating function.  vmalloc'd memory (rxe's queues)
# and pages taken whole are not traced.  The test kernel has the
# tracepoints (the bench kernel has not):
#
#   tools/vm/run --kernel $(cat .kdir) --no-stream --timeout 900 \
#     --kernel-arg kunit.enable=0 --share-rw $PWD/build/memprof \
#     --module $PWD/rdma_cm_rs.ko -- "cd /tmp; RDMA_CM_RS_OUT=$PWD \
#     perf record -e kmem:kmalloc -e kmem:kfree -a -g -o /tmp/k.data -- \
#     $PWD/tools/userspace-test/target/release/userspace-test bench \
#     --only scale --side kernel --reps 1 --quick --allow-coarse-clock \
#     --out-dir /tmp/o; perf script -i /tmp/k.data -F event,trace,ip,sym \
#     > $PWD/build/memprof/k.txt; \
#     python3 $PWD/tools/debug/module-memory.py 50 < $PWD/build/memprof/k.txt"
#
# (--quick's largest step holds 50 connections at once.)

import collections
import re
import sys

SIZE_CLASSES = (8, 16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048, 4096, 8192)
ALLOCATOR = re.compile(
    r"__do_trace|kmalloc|krealloc|kvmalloc|kvrealloc|kzalloc|kcalloc|kmem_cache"
    r"|Kmalloc|Vmalloc|KVmalloc|allocator|5alloc|realloc"
)


def size_class(n):
    for c in SIZE_CLASSES:
        if n <= c:
            return c
    return (n + 4095) // 4096 * 4096


def readable(symbol):
    """The last path identifiers of a Rust v0 symbol (each a decimal length
    and that many characters), or a C name as it is."""
    if not symbol.startswith("_R"):
        return symbol
    idents = []
    for m in re.finditer(r"(?<!\d)(\d+)", symbol):
        ident = symbol[m.end() : m.end() + int(m.group(1))]
        if re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", ident) and ident != "rdma_cm_rs":
            idents.append(ident)
    return "::".join(idents[-3:]) if idents else symbol


class Peak:
    def __init__(self):
        self.live = {}
        self.now = 0
        self.peak = 0
        self.by_site = collections.Counter()
        self.at_peak = collections.Counter()

    def alloc(self, ptr, size, site):
        self.live[ptr] = (size, site)
        self.now += size
        self.by_site[(size, site)] += 1
        if self.now > self.peak:
            self.peak = self.now
            self.at_peak = collections.Counter(self.by_site)

    def free(self, ptr):
        if ptr in self.live:
            size, site = self.live.pop(ptr)
            self.now -= size
            self.by_site[(size, site)] -= 1


def events(lines):
    block = []
    for line in lines:
        line = line.rstrip("\n")
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


def main():
    n = int(sys.argv[1])
    own, made_for = Peak(), Peak()
    for block in events(sys.stdin):
        head, chain = block[0], block[1:]
        if "kmem:kfree:" in head:
            m = re.search(r"ptr=(0x[0-9a-f]+)", head)
            if m:
                own.free(m.group(1))
                made_for.free(m.group(1))
            continue
        if "kmem:kmalloc:" not in head or not any("rdma_cm_rs" in l for l in chain):
            continue
        m = re.search(r"ptr=(0x[0-9a-f]+) bytes_req=(\d+)", head)
        if not m:
            continue
        frames = [l.split()[1] for l in chain if len(l.split()) > 1]
        caller = next((f for f in frames if not ALLOCATOR.search(f)), "?")
        size = size_class(int(m.group(2)))
        (own if caller.startswith("_R") else made_for).alloc(m.group(1), size, readable(caller))
    print(f"the module's own: peak {own.peak} bytes, {own.peak / 1024 / n:.1f} KiB per connection")
    print(f"made for it by C: peak {made_for.peak} bytes, {made_for.peak / 1024 / n:.1f} KiB per connection")
    print("the module's own at its peak, by size class and allocating function:")
    for (size, site), count in sorted(own.at_peak.items(), key=lambda kv: -kv[0][0] * kv[1]):
        if count:
            print(f"  {size:6d} B x {count:5d} = {size * count:9d} B  {site}")


if __name__ == "__main__":
    main()
