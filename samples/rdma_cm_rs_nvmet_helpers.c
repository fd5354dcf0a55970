// SPDX-License-Identifier: GPL-2.0
/* The sample module links its own copy of the abstraction layer's C shims. */
#include "../rust/helpers/rdma_cm_rs_helpers.c"
