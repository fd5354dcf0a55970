/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What bindgen sees for the RDMA abstraction layer.  Kbuild limits the output
 * to the rdma headers (--allowlist-file); the helpers' functions are generated
 * apart, from rust/helpers/rdma_cm_rs_helpers.c; every other type comes
 * from `kernel::bindings` through a glob import, so `sockaddr`, `net` or
 * `device` keep one identity across both binding sets.
 */
#include <linux/socket.h>
#include <linux/in.h>
#include <linux/in6.h>
#include <rdma/ib_verbs.h>
#include <rdma/ib_cm.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>
