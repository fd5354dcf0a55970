# SPDX-License-Identifier: GPL-2.0
#
# rdma-cm-rs: the two commands a fresh machine needs are
#
#   make demo     build everything, boot the test VM, show a connection
#   make check    build everything, run every test, print "N passed, N failed"
#
#   make fuzz     the ioctl fuzzer in the test VM, DURATION=1800 s, SEED=N
#                 to replay one seed (make check runs a 45 s round)
#   make bench    the module against a user-space librdmacm peer, side by
#                 side, in one VM on the bench kernel (no debug options, a
#                 real clocksource; built once, make check never builds
#                 it); table and plot in build/bench/DATE/, see
#                 Documentation/rdma_cm_rs/benchmarks.rst
#   make intree   the layer copied into a kernel tree as rust/kernel/rdma/,
#                 that kernel built (doctests, the echo sample in tree),
#                 linted and booted, the sample driven in the VM; not
#                 part of make check (tools/intree.sh --help)
#
# KDIR=/path/to/a/Rust-enabled/kernel/build skips fetching and building the
# test kernel; KERNEL=stock builds and tests the same configuration without
# tools/kernel-patches/ (the tests needing a fix are skipped).  Everything
# slow is cached under $(RDMA_CM_RS_CACHE) (default /var/cache/rdma-cm-rs),
# keyed by kernel version and fragment.

SHELL := /bin/bash
export RDMA_CM_RS_CACHE ?= /var/cache/rdma-cm-rs
export RDMA_CM_RS_KERNEL := $(KERNEL)
export PATH := $(HOME)/.cargo/bin:$(PATH)
export LIBCLANG_PATH ?= /usr/lib/llvm-19/lib

# Each recipe takes its paths from tools/lib/env.sh: the build directory
# $out_dir (the checkout, or for a read-only one a directory in the cache;
# the same layout either way, RDMA_CM_RS_OUT chooses), the tool $tool_bin,
# the cargo target, Kbuild's M=/MO= (module_dirs).
ENV := source tools/lib/env.sh &&
KMAKE = mapfile -t dirs < <(module_dirs) && \
	$(MAKE) -C "$$(cat "$$out_dir/.kdir")" "$${dirs[@]}" LLVM=-19

.PHONY: all setup kernel module tool check demo fuzz bench intree clean help

all: module tool

help:
	@sed -n '3,24p' Makefile

setup:
	@tools/setup.sh

# Prints nothing; writes the kernel build directory to .kdir for later steps.
kernel: setup
	@$(ENV) if [ -n "$(KDIR)" ]; then echo "$(KDIR)" >"$$out_dir/.kdir"; \
		else tools/kernel.sh $(if $(KERNEL),--$(KERNEL)) >"$$out_dir/.kdir"; fi

module: kernel
	@$(ENV) $(KMAKE) modules

tool: setup
	@$(ENV) cd tools/userspace-test && cargo build --release --locked

check: setup
	@tools/check.sh

demo: module tool
	@tools/demo.sh

DURATION ?= 1800
FUZZ_SEED := $(if $(SEED),$(SEED),$(shell date +%s))

# The ioctl fuzzer in the test VM for DURATION s; the dmesg gate and
# kmemleak judge the kernel side.  Logs in build/logs/fuzz-SEED.
fuzz: module tool
	$(ENV) tools/vm/run --kernel "$$(cat "$$out_dir/.kdir")" --timeout $$(($(DURATION) + 600)) \
		--keep-logs "$$out_dir/build/logs/fuzz-$(FUZZ_SEED)" --module "$$out_dir/rdma_cm_rs.ko" -- \
		"$$tool_bin fuzz --seed $(FUZZ_SEED) --seconds $(DURATION)"

# The bench kernel, the module built against it, the tool, one VM, the plot:
# tools/bench.sh does it all (its --help says how).
bench:
	@tools/bench.sh

# The layer in a kernel tree, proven there: tools/intree.sh (its --help says
# what it does).  Its own kernel build, cached beside the test kernel's.
intree: setup
	@tools/intree.sh

clean:
	@$(ENV) if [ -f "$$out_dir/.kdir" ]; then $(KMAKE) clean; fi
	@$(ENV) rm -f "$$out_dir/.kdir" && cd tools/userspace-test && cargo clean
