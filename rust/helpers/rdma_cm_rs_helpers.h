/* SPDX-License-Identifier: GPL-2.0 */
/*
 * C shims for the parts of the kernel API that Rust cannot call directly:
 * static inlines and macros (post, DMA mapping, device and namespace
 * references).  None captures KBUILD_MODNAME or THIS_MODULE: a module's
 * name and pointer come in through its Owner (rust/rdma/owner.rs).  The
 * prefix keeps them apart from the kernel's own rust_helper_ functions.
 */
#ifndef RDMA_CM_RS_HELPERS_H
#define RDMA_CM_RS_HELPERS_H

#include <linux/types.h>
#include <linux/dma-direction.h>
#include <linux/workqueue.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

struct net *rdma_cm_rs_init_net(void);
struct net *rdma_cm_rs_get_current_net(void);
struct net *rdma_cm_rs_get_net(struct net *net);
void rdma_cm_rs_put_net(struct net *net);
struct task_struct *rdma_cm_rs_current_task(void);
void rdma_cm_rs_kunit_skip(const char *reason);

bool rdma_cm_rs_device_try_get(struct ib_device *dev);
void rdma_cm_rs_device_get(struct ib_device *dev);
void rdma_cm_rs_dealloc_pd(struct ib_pd *pd);
void rdma_cm_rs_flush_cq_work(struct ib_cq *cq);
void rdma_cm_rs_cond_resched(void);
void rdma_cm_rs_yield(void);
int rdma_cm_rs_modify_qp_err(struct ib_qp *qp);
int rdma_cm_rs_post_send(struct ib_qp *qp, const struct ib_send_wr *wr,
			 const struct ib_send_wr **bad);
int rdma_cm_rs_post_recv(struct ib_qp *qp, const struct ib_recv_wr *wr,
			 const struct ib_recv_wr **bad);
struct ib_srq *rdma_cm_rs_create_srq(struct ib_pd *pd, u32 max_wr,
				     u32 max_sge,
				     void (*handler)(struct ib_event *, void *),
				     void *context);
int rdma_cm_rs_arm_srq_limit(struct ib_srq *srq, u32 limit);
int rdma_cm_rs_destroy_srq(struct ib_srq *srq);
int rdma_cm_rs_post_srq_recv(struct ib_srq *srq, const struct ib_recv_wr *wr,
			     const struct ib_recv_wr **bad);
int rdma_cm_rs_rw_ctx_post(struct rdma_rw_ctx *ctx, struct ib_qp *qp,
			   u32 port_num, struct ib_cqe *cqe,
			   struct ib_send_wr *chain, u32 *signal_writes,
			   const struct ib_send_wr **first,
			   const struct ib_send_wr **bad);
struct sg_table *rdma_cm_rs_sg_table_from_pages(struct page **pages,
						unsigned int n_pages, size_t len);
void rdma_cm_rs_sg_table_free(struct sg_table *sgt);
int rdma_cm_rs_dma_map_sg(struct ib_device *dev, struct scatterlist *sgl,
			  unsigned int nents);
void rdma_cm_rs_dma_unmap_sg(struct ib_device *dev, struct scatterlist *sgl,
			     unsigned int nents);
void rdma_cm_rs_sg_dma_sges(struct scatterlist *sgl, int mapped, u32 lkey,
			    struct ib_sge *out);
void rdma_cm_rs_sync_sg_range(struct ib_device *dev, struct scatterlist *sgl,
			      unsigned int mapped, size_t offset, size_t len,
			      bool for_cpu);
int rdma_cm_rs_sg_copy(struct scatterlist *sgl, unsigned int nents, void *buf,
		       size_t len, size_t skip, bool to_pages);
int rdma_cm_rs_map_mr_sg(struct ib_mr *mr, struct scatterlist *sgl,
			 unsigned int mapped);
unsigned int rdma_cm_rs_num_online_cpus(void);
int rdma_cm_rs_dma_map_single(struct ib_device *dev, void *cpu_addr,
			      size_t size, enum dma_data_direction dir,
			      u64 *dma_addr);
void rdma_cm_rs_dma_unmap_single(struct ib_device *dev, u64 addr, size_t size,
				 enum dma_data_direction dir);
void rdma_cm_rs_dma_sync_for_cpu(struct ib_device *dev, u64 addr, size_t size,
				 enum dma_data_direction dir);
void rdma_cm_rs_dma_sync_for_device(struct ib_device *dev, u64 addr,
				    size_t size, enum dma_data_direction dir);

struct ib_mr *rdma_cm_rs_alloc_mr(struct ib_pd *pd, u32 max_num_sg);
int rdma_cm_rs_dereg_mr(struct ib_mr *mr);
int rdma_cm_rs_map_mr(struct ib_mr *mr, u64 dma_addr, u32 len);
void rdma_cm_rs_update_fast_reg_key(struct ib_mr *mr, u8 newkey);
void rdma_cm_rs_copy(void *dst, const void *src, size_t len);

int rdma_cm_rs_query_ud_qp(struct ib_qp *qp, u32 *qkey, u32 *port_num);
void rdma_cm_rs_port_range(struct ib_device *dev, u32 *first, u32 *last);
u32 rdma_cm_rs_port_core_caps(struct ib_device *dev, u32 port_num);
int rdma_cm_rs_port_active_mtu(struct ib_device *dev, u32 port_num);
struct ib_ah *rdma_cm_rs_create_ah(struct ib_pd *pd,
				   const struct rdma_ah_attr *ah_attr);

#endif /* RDMA_CM_RS_HELPERS_H */
