# SPDX-License-Identifier: GPL-2.0
#
# rdma-cm-rs: the two commands a fresh machine needs are
#
#   make demo     build everything, boot the test VM, show a connection
#   make check    build everything, run every test, print "N passed, N failed"
#
#   make fuzz     the ioctl fuzzer in the test VM, DURATION=1800 s, SEED=N
#                 to replay one seed (make check runs a 45 s round)
#
# KDIR=/path/to/a/Rust-enabled/kernel/build skips fetching and building the
# test kernel.  Everything slow is cached under $(RDMA_CM_RS_CACHE)
# (default /var/cache/rdma-cm-rs), keyed by kernel version and fragment.

SHELL := /bin/bash
export RDMA_CM_RS_CACHE ?= /var/cache/rdma-cm-rs
export PATH := $(HOME)/.cargo/bin:$(PATH)
export LIBCLANG_PATH ?= /usr/lib/llvm-19/lib

TOOL := tools/userspace-test/target/release/userspace-test

.PHONY: all setup kernel module tool check demo fuzz clean help

all: module tool

help:
	@sed -n '3,15p' Makefile

setup:
	@tools/setup.sh

# Prints nothing; writes the kernel build directory to .kdir for later steps.
kernel: setup
	@if [ -n "$(KDIR)" ]; then echo "$(KDIR)" > .kdir; else tools/kernel.sh > .kdir; fi

module: kernel
	$(MAKE) -C "$$(cat .kdir)" M=$(CURDIR) LLVM=-19 modules

tool: setup
	cd tools/userspace-test && cargo build --release --locked

check: setup
	@tools/check.sh

demo: module tool
	@tools/demo.sh

DURATION ?= 1800
FUZZ_SEED := $(if $(SEED),$(SEED),$(shell date +%s))

# The ioctl fuzzer in the test VM for DURATION s; the dmesg gate and
# kmemleak judge the kernel side.  Logs in build/logs/fuzz-SEED.
fuzz: module tool
	tools/vm/run --kernel "$$(cat .kdir)" --timeout $$(($(DURATION) + 600)) \
		--keep-logs build/logs/fuzz-$(FUZZ_SEED) --module $(CURDIR)/rdma_cm_rs.ko -- \
		'$(TOOL) fuzz --seed $(FUZZ_SEED) --seconds $(DURATION)'

clean:
	@if [ -f .kdir ]; then $(MAKE) -C "$$(cat .kdir)" M=$(CURDIR) LLVM=-19 clean; fi
	rm -f .kdir
	cd tools/userspace-test && cargo clean
