/* SPDX-License-Identifier: GPL-2.0 */
/* What build.rs runs bindgen over (allowlisted there), and what the C
 * wrappers of verbs.h's static inline functions include. */
#include <rdma/rdma_cma.h>
#include <infiniband/verbs.h>
