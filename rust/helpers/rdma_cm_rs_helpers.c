// SPDX-License-Identifier: GPL-2.0
/*
 * The RDMA abstractions' helpers for a module that compiles the layer in
 * (rust/rdma/): rdma.c, which is rust/helpers/rdma.c in a kernel tree
 * with the layer in it, compiled into the module as the kernel's
 * rust/helpers/helpers.c compiles it into vmlinux.  Kbuild's bindgen reads
 * this file as the kernel's rust/Makefile reads helpers.c: the
 * rust_helper_ functions, the prefix stripped.
 */
#include <linux/compiler_types.h>

/* Plain external functions: nothing inlines them into Rust code here. */
#define __rust_helper

#include "rdma.c"
