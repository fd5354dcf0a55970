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

# The build directory: the checkout, or for a read-only one a directory in
# the cache (tools/lib/env.sh, RDMA_CM_RS_OUT); the same layout either way.
OUT := $(shell source tools/lib/env.sh && echo "$$RDMA_CM_RS_OUT")
export RDMA_CM_RS_OUT := $(OUT)
ifneq ($(OUT),$(CURDIR))
export CARGO_TARGET_DIR := $(OUT)/tools/userspace-test/target
endif
# Kbuild's M= (and MO=), from env.sh's module_dirs.
KMAKE = source tools/lib/env.sh && mapfile -t dirs < <(module_dirs) && \
	$(MAKE) -C "$$(cat $(KDIR_FILE))" "$${dirs[@]}" LLVM=-19
KDIR_FILE := $(OUT)/.kdir
TOOL := $(OUT)/tools/userspace-test/target/release/userspace-test

.PHONY: all setup kernel module tool check demo fuzz clean help

all: module tool

help:
	@sed -n '3,15p' Makefile

setup:
	@tools/setup.sh

# Prints nothing; writes the kernel build directory to .kdir for later steps.
kernel: setup
	@if [ -n "$(KDIR)" ]; then echo "$(KDIR)" > $(KDIR_FILE); else tools/kernel.sh > $(KDIR_FILE); fi

module: kernel
	@$(KMAKE) modules

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
	tools/vm/run --kernel "$$(cat $(KDIR_FILE))" --timeout $$(($(DURATION) + 600)) \
		--keep-logs $(OUT)/build/logs/fuzz-$(FUZZ_SEED) --module $(OUT)/rdma_cm_rs.ko -- \
		'$(TOOL) fuzz --seed $(FUZZ_SEED) --seconds $(DURATION)'

clean:
	@if [ -f $(KDIR_FILE) ]; then $(KMAKE) clean; fi
	rm -f $(KDIR_FILE)
	cd tools/userspace-test && cargo clean
