// SPDX-License-Identifier: GPL-2.0
/*
 * Helpers of the RDMA abstractions (rust/kernel/rdma/ in tree; out of tree
 * rust/rdma/, each module compiling its own copy through
 * rdma_cm_rs_helpers.c).  As every file of rust/helpers/:
 * rust_helper_<function> wraps a static inline or a macro <function>, and
 * bindgen strips the prefix, so Rust calls bindings::<function>.
 *
 * The rust_helper_rdma_cm_rs_<name> helpers below have no C function of
 * their name: each holds a few lines of logic, and says why it stays in C.
 */

#include <linux/cpumask.h>
#include <linux/dma-direction.h>
#include <linux/highmem.h>
#include <linux/nsproxy.h>
#include <linux/scatterlist.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <net/net_namespace.h>
#include <rdma/ib_verbs.h>
#include <rdma/rdma_cm.h>
#include <rdma/rw.h>

__rust_helper struct net *rust_helper_get_net(struct net *net)
{
	return get_net(net);
}

__rust_helper void rust_helper_put_net(struct net *net)
{
	put_net(net);
}

__rust_helper int rust_helper_ib_req_notify_cq(struct ib_cq *cq,
						enum ib_cq_notify_flags flags)
{
	return ib_req_notify_cq(cq, flags);
}

__rust_helper bool rust_helper_wq_has_sleeper(struct wait_queue_head *wq_head)
{
	return wq_has_sleeper(wq_head);
}

__rust_helper int rust_helper_cond_resched(void)
{
	return cond_resched();
}

__rust_helper unsigned int rust_helper_num_online_cpus(void)
{
	return num_online_cpus();
}

__rust_helper bool rust_helper_ib_device_try_get(struct ib_device *dev)
{
	return ib_device_try_get(dev);
}

__rust_helper void rust_helper_ib_dealloc_pd(struct ib_pd *pd)
{
	ib_dealloc_pd(pd);
}

/*
 * The layer's callers pass @bad_send_wr pointing at NULL: a driver that
 * fails without naming the refused request (siw, when starting its send
 * queue fails after it queued every request) leaves it so.
 */
__rust_helper int rust_helper_ib_post_send(struct ib_qp *qp,
					   const struct ib_send_wr *send_wr,
					   const struct ib_send_wr **bad_send_wr)
{
	return ib_post_send(qp, send_wr, bad_send_wr);
}

__rust_helper int rust_helper_ib_post_recv(struct ib_qp *qp,
					   const struct ib_recv_wr *recv_wr,
					   const struct ib_recv_wr **bad_recv_wr)
{
	return ib_post_recv(qp, recv_wr, bad_recv_wr);
}

__rust_helper int rust_helper_ib_post_srq_recv(struct ib_srq *srq,
					       const struct ib_recv_wr *recv_wr,
					       const struct ib_recv_wr **bad_recv_wr)
{
	return ib_post_srq_recv(srq, recv_wr, bad_recv_wr);
}

__rust_helper void rust_helper_ib_dma_unmap_single(struct ib_device *dev,
						   u64 addr, size_t size,
						   enum dma_data_direction direction)
{
	ib_dma_unmap_single(dev, addr, size, direction);
}

__rust_helper void rust_helper_ib_dma_sync_single_for_cpu(struct ib_device *dev,
							  u64 addr, size_t size,
							  enum dma_data_direction dir)
{
	ib_dma_sync_single_for_cpu(dev, addr, size, dir);
}

__rust_helper void
rust_helper_ib_dma_sync_single_for_device(struct ib_device *dev, u64 addr,
					  size_t size,
					  enum dma_data_direction dir)
{
	ib_dma_sync_single_for_device(dev, addr, size, dir);
}

__rust_helper int rust_helper_ib_dma_map_sg(struct ib_device *dev,
					    struct scatterlist *sg, int nents,
					    enum dma_data_direction direction)
{
	return ib_dma_map_sg(dev, sg, nents, direction);
}

__rust_helper void rust_helper_ib_dma_unmap_sg(struct ib_device *dev,
					       struct scatterlist *sg, int nents,
					       enum dma_data_direction direction)
{
	ib_dma_unmap_sg(dev, sg, nents, direction);
}

__rust_helper int rust_helper_ib_dereg_mr(struct ib_mr *mr)
{
	return ib_dereg_mr(mr);
}

__rust_helper void rust_helper_ib_update_fast_reg_key(struct ib_mr *mr,
						      u8 newkey)
{
	ib_update_fast_reg_key(mr, newkey);
}

__rust_helper u32 rust_helper_rdma_start_port(const struct ib_device *device)
{
	return rdma_start_port(device);
}

__rust_helper u32 rust_helper_rdma_end_port(const struct ib_device *device)
{
	return rdma_end_port(device);
}

/*
 * The caller's network namespace, with a reference the caller must put, or
 * NULL for a task that has left its namespaces (exit_task_namespaces() runs
 * before an exiting task's last file releases).  In C: current->nsproxy is
 * read through the current macro, and the test and get_net() belong
 * together.
 */
__rust_helper struct net *rust_helper_rdma_cm_rs_get_current_net(void)
{
	struct nsproxy *nsproxy = current->nsproxy;

	return nsproxy ? get_net(nsproxy->net_ns) : NULL;
}

/*
 * Waits until the poll work of a CQ polled from a workqueue is idle: every
 * completion the driver queued before the call has reached its done
 * callback.  The work re-queues itself while completions keep coming, so
 * flush until a flush finds it idle.  In C: cq->work is a member of an
 * anonymous union of struct ib_cq, which bindgen names by position.
 */
__rust_helper void rust_helper_rdma_cm_rs_flush_cq_work(struct ib_cq *cq)
{
	while (flush_work(&cq->work))
		;
}

/*
 * The error state: the driver flushes every outstanding work request.  In
 * C: struct ib_qp_attr embeds address vectors with unions, set up here by
 * a designated initialiser.
 */
__rust_helper int rust_helper_rdma_cm_rs_modify_qp_err(struct ib_qp *qp)
{
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };

	return ib_modify_qp(qp, &attr, IB_QP_STATE);
}

/*
 * A basic shared receive queue of @max_wr one-SGE receives on @pd, its
 * events to @handler with @context; ERR_PTR(-EOPNOTSUPP) on a device
 * without SRQs.  In C: the attributes are a designated initialiser of a
 * struct with unions.
 */
__rust_helper struct ib_srq *
rust_helper_rdma_cm_rs_create_srq(struct ib_pd *pd, u32 max_wr, u32 max_sge,
				  void (*handler)(struct ib_event *, void *),
				  void *context)
{
	struct ib_srq_init_attr attr = {
		.event_handler = handler,
		.srq_context = context,
		.srq_type = IB_SRQT_BASIC,
		.attr = { .max_wr = max_wr, .max_sge = max_sge },
	};

	return ib_create_srq(pd, &attr);
}

/*
 * Arms the SRQ's limit: an event once fewer than @limit receives are
 * posted.  In C, as above, for its attributes.
 */
__rust_helper int rust_helper_rdma_cm_rs_arm_srq_limit(struct ib_srq *srq,
						       u32 limit)
{
	struct ib_srq_attr attr = { .srq_limit = limit };

	return ib_modify_srq(srq, &attr, IB_SRQ_LIMIT);
}

/*
 * rdma_rw_ctx_post(), with the request the driver refused in @bad; @chain,
 * if not NULL, follows the transfer and carries the completion.  With
 * @write_cqe (not NULL), every RDMA WRITE of the transfer is signaled, its
 * completion going to @write_cqe (whose done ignores it: the transfer's
 * last request completes after it, in order), and counted in
 * @signal_writes: siw sends an unsignaled request of a page or more
 * straight from its pages (MSG_SPLICE_PAGES) and TCP may retransmit from
 * them after the transfer completed, while a signaled one is copied.  In
 * C: it walks the chain rdma_rw_ctx_wrs() built.  The entry comes from the
 * caller: an inline function with external linkage, as a helper is in
 * tree, may not refer to a static of its own.
 */
__rust_helper int
rust_helper_rdma_cm_rs_rw_ctx_post(struct rdma_rw_ctx *ctx, struct ib_qp *qp,
				   u32 port_num, struct ib_cqe *cqe,
				   struct ib_send_wr *chain,
				   struct ib_cqe *write_cqe, u32 *signal_writes,
				   const struct ib_send_wr **first,
				   const struct ib_send_wr **bad)
{
	struct ib_send_wr *wr, *head = rdma_rw_ctx_wrs(ctx, qp, port_num, cqe, chain);

	for (wr = head; write_cqe && wr && wr != chain; wr = wr->next) {
		if (wr->opcode != IB_WR_RDMA_WRITE ||
		    (wr->send_flags & IB_SEND_SIGNALED))
			continue;
		wr->send_flags |= IB_SEND_SIGNALED;
		wr->wr_cqe = write_cqe;
		(*signal_writes)++;
	}
	*first = head;
	*bad = NULL;
	return ib_post_send(qp, head, bad);
}

/*
 * ib_dma_map_single() checked with ib_dma_mapping_error(): the address in
 * @dma_addr, or -ENOMEM.  In C: an unchecked DMA address never reaches
 * Rust.
 */
__rust_helper int rust_helper_rdma_cm_rs_dma_map_single(struct ib_device *dev,
							void *cpu_addr,
							size_t size,
							enum dma_data_direction dir,
							u64 *dma_addr)
{
	u64 addr = ib_dma_map_single(dev, cpu_addr, size, dir);

	if (ib_dma_mapping_error(dev, addr))
		return -ENOMEM;
	*dma_addr = addr;
	return 0;
}

/*
 * Maps one DMA-contiguous region into the MR's page list (the first half of
 * an FRWR registration; the IB_WR_REG_MR work request is the second).  The
 * region must be mapped whole: a partial mapping is an error here.  In C:
 * the one-entry scatterlist lives on this stack, set with the sg_dma_*
 * macros.
 */
__rust_helper int rust_helper_rdma_cm_rs_map_mr(struct ib_mr *mr, u64 dma_addr,
						u32 len)
{
	struct scatterlist sg;
	int mapped;

	sg_init_table(&sg, 1);
	sg_dma_address(&sg) = dma_addr;
	sg_dma_len(&sg) = len;
	mapped = ib_map_mr_sg(mr, &sg, 1, NULL, PAGE_SIZE);
	if (mapped < 0)
		return mapped;
	return mapped == 1 ? 0 : -EINVAL;
}

/*
 * Maps the @mapped DMA segments of a scatterlist whole into the MR's page
 * list (the first half of an FRWR registration).  ib_map_mr_sg() is
 * exported and Rust could call it; the helper stays beside
 * rdma_cm_rs_map_mr() so that both registration paths apply the
 * whole-mapping rule in one place.
 */
__rust_helper int rust_helper_rdma_cm_rs_map_mr_sg(struct ib_mr *mr,
						   struct scatterlist *sgl,
						   unsigned int mapped)
{
	int n = ib_map_mr_sg(mr, sgl, mapped, NULL, PAGE_SIZE);

	if (n < 0)
		return n;
	return n == mapped ? 0 : -EINVAL;
}

/*
 * A UD QP's Q_Key and port.  In C: ib_qp_attr embeds address vectors whose
 * unions Rust cannot zero-initialise.
 */
__rust_helper int rust_helper_rdma_cm_rs_query_ud_qp(struct ib_qp *qp,
						     u32 *qkey, u32 *port_num)
{
	struct ib_qp_attr attr = {};
	struct ib_qp_init_attr init_attr = {};
	int ret;

	ret = ib_query_qp(qp, &attr, IB_QP_QKEY | IB_QP_PORT, &init_attr);
	if (ret)
		return ret;
	*qkey = attr.qkey;
	*port_num = attr.port_num;
	return 0;
}

/*
 * The port's active MTU in bytes, or a negative errno.  In C: the query and
 * the conversion of its enum (ib_mtu_enum_to_int(), an inline) go together.
 */
__rust_helper int rust_helper_rdma_cm_rs_port_active_mtu(struct ib_device *dev,
							 u32 port_num)
{
	struct ib_port_attr attr;
	int ret;

	ret = ib_query_port(dev, port_num, &attr);
	if (ret)
		return ret;
	ret = ib_mtu_enum_to_int(attr.active_mtu);
	return ret > 0 ? ret : -EINVAL;
}

/*
 * An address handle from an address vector the caller holds (a CM event's):
 * rdma_create_ah may fill in and restore the vector's GID reference, so it
 * works on a copy, which borrows the caller's reference for the call.  In
 * C: the copy of struct rdma_ah_attr, unions and all.
 */
__rust_helper struct ib_ah *
rust_helper_rdma_cm_rs_create_ah(struct ib_pd *pd,
				 const struct rdma_ah_attr *ah_attr)
{
	struct rdma_ah_attr copy = *ah_attr;

	return rdma_create_ah(pd, &copy, RDMA_CREATE_AH_SLEEPABLE);
}

/* A copy between two pages, each mapped for it (a static inline in C). */
__rust_helper void rust_helper_memcpy_page(struct page *dst_page, size_t dst_off,
					   struct page *src_page, size_t src_off,
					   size_t len)
{
	memcpy_page(dst_page, dst_off, src_page, src_off, len);
}

/*
 * A scatterlist over the first @len bytes of @n_pages pages (physically
 * adjacent pages merged into one entry), in a table of its own.  In C,
 * with rdma_cm_rs_sg_table_free(): the table's allocation and its entries'
 * are made and freed together.
 */
__rust_helper struct sg_table *
rust_helper_rdma_cm_rs_sg_table_from_pages(struct page **pages,
					   unsigned int n_pages, size_t len)
{
	struct sg_table *sgt = kzalloc(sizeof(*sgt), GFP_KERNEL);
	int ret;

	if (!sgt)
		return ERR_PTR(-ENOMEM);
	ret = sg_alloc_table_from_pages(sgt, pages, n_pages, 0, len, GFP_KERNEL);
	if (ret) {
		kfree(sgt);
		return ERR_PTR(ret);
	}
	return sgt;
}

__rust_helper void rust_helper_rdma_cm_rs_sg_table_free(struct sg_table *sgt)
{
	sg_free_table(sgt);
	kfree(sgt);
}

/*
 * The first @mapped DMA segments of a scatterlist ib_dma_map_sg() mapped
 * (@mapped is what it returned) as SGEs of @lkey, into @out (room for
 * @mapped entries).  In C: for_each_sg() and the sg_dma_* macros.
 */
__rust_helper void rust_helper_rdma_cm_rs_sg_dma_sges(struct scatterlist *sgl,
						      int mapped, u32 lkey,
						      struct ib_sge *out)
{
	struct scatterlist *sg;
	int i;

	for_each_sg(sgl, sg, mapped, i) {
		out[i].addr = sg_dma_address(sg);
		out[i].length = sg_dma_len(sg);
		out[i].lkey = lkey;
	}
}

/*
 * Syncs @len bytes at @offset of a bidirectionally mapped scatterlist of
 * @mapped DMA segments, for the CPU or for the device: only the segments
 * (and the parts of them) the range covers.  In C, as above.
 */
__rust_helper void
rust_helper_rdma_cm_rs_sync_sg_range(struct ib_device *dev,
				     struct scatterlist *sgl,
				     unsigned int mapped, size_t offset,
				     size_t len, bool for_cpu)
{
	struct scatterlist *sg;
	unsigned int i;

	for_each_sg(sgl, sg, mapped, i) {
		size_t seg = sg_dma_len(sg), n;

		if (!len)
			break;
		if (offset >= seg) {
			offset -= seg;
			continue;
		}
		n = min(seg - offset, len);
		if (for_cpu)
			ib_dma_sync_single_for_cpu(dev, sg_dma_address(sg) + offset,
						   n, DMA_BIDIRECTIONAL);
		else
			ib_dma_sync_single_for_device(dev,
						      sg_dma_address(sg) + offset,
						      n, DMA_BIDIRECTIONAL);
		offset = 0;
		len -= n;
	}
}

/*
 * Copies between @buf and @len bytes at @skip of the pages of a
 * scatterlist of @nents entries (to the pages with @to_pages); -EINVAL
 * unless all of it was copied.  Both copies are exported and Rust could
 * call them; the helper keeps the direction and the all-or-nothing rule
 * in one call, as its one caller (an MR's copy) wants them.
 */
__rust_helper int rust_helper_rdma_cm_rs_sg_copy(struct scatterlist *sgl,
						 unsigned int nents, void *buf,
						 size_t len, size_t skip,
						 bool to_pages)
{
	size_t copied = to_pages ?
		sg_pcopy_from_buffer(sgl, nents, buf, len, skip) :
		sg_pcopy_to_buffer(sgl, nents, buf, len, skip);

	return copied == len ? 0 : -EINVAL;
}
