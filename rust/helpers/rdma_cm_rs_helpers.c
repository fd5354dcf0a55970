// SPDX-License-Identifier: GPL-2.0
/*
 * C shims for the RDMA abstraction layer; see rdma_cm_rs_helpers.h.  Each is
 * a plain call-through: the safety rules live on the Rust side.
 */
#include <linux/cpumask.h>
#include <linux/nsproxy.h>
#include <linux/scatterlist.h>
#include <linux/sched.h>
#include <linux/string.h>
#include <linux/module.h>
#include <linux/workqueue.h>
#include <kunit/test.h>
#include <kunit/test-bug.h>
#include <net/net_namespace.h>
#include "rdma_cm_rs_helpers.h"

struct net *rdma_cm_rs_init_net(void)
{
	return &init_net;
}

/*
 * The caller's network namespace, with a reference the caller must put, or
 * NULL for a task that has left its namespaces (exit_task_namespaces() runs
 * before an exiting task's last file releases).
 */
struct net *rdma_cm_rs_get_current_net(void)
{
	struct nsproxy *nsproxy = current->nsproxy;

	return nsproxy ? get_net(nsproxy->net_ns) : NULL;
}

struct net *rdma_cm_rs_get_net(struct net *net)
{
	return get_net(net);
}

void rdma_cm_rs_put_net(struct net *net)
{
	put_net(net);
}

struct task_struct *rdma_cm_rs_current_task(void)
{
	return current;
}

/* Unregistration waits for this reference (disable_device), after DEVICE_REMOVAL. */
bool rdma_cm_rs_device_try_get(struct ib_device *dev)
{
	return ib_device_try_get(dev);
}

/* One more reference, for a caller that holds one already (count > 0). */
void rdma_cm_rs_device_get(struct ib_device *dev)
{
	refcount_inc(&dev->refcount);
}

void rdma_cm_rs_dealloc_pd(struct ib_pd *pd)
{
	ib_dealloc_pd(pd);
}

/*
 * Waits until the poll work of a CQ polled from a workqueue is idle: every
 * completion the driver queued before the call has reached its done
 * callback.  The work re-queues itself while completions keep coming, so
 * flush until a flush finds it idle.
 */
void rdma_cm_rs_flush_cq_work(struct ib_cq *cq)
{
	while (flush_work(&cq->work))
		;
}

/*
 * Gives the CPU to another task if the scheduler asks for it: what a caller
 * that polls a CQ in a loop (IB_POLL_DIRECT) needs between two polls, and a
 * macro, out of bindgen's reach.
 */
void rdma_cm_rs_cond_resched(void)
{
	cond_resched();
}

/*
 * Lets every other runnable task of this CPU run first, as a user-space
 * poller's sched_yield(): what a poll that found nothing does, so that the
 * software device's own work (rxe's and siw's tasks), which makes the
 * completions, is not kept waiting for the scheduler's tick.
 */
void rdma_cm_rs_yield(void)
{
	yield();
}

/* The error state: the driver flushes every outstanding work request. */
int rdma_cm_rs_modify_qp_err(struct ib_qp *qp)
{
	struct ib_qp_attr attr = { .qp_state = IB_QPS_ERR };

	return ib_modify_qp(qp, &attr, IB_QP_STATE);
}

/*
 * The posts report in @bad the request the driver refused (it took none of
 * the chain from there on), or leave it NULL when a driver failed without
 * saying which: siw returns an error from starting its send queue after it
 * queued every request.
 */
int rdma_cm_rs_post_send(struct ib_qp *qp, const struct ib_send_wr *wr,
			 const struct ib_send_wr **bad)
{
	*bad = NULL;
	return ib_post_send(qp, wr, bad);
}

int rdma_cm_rs_post_recv(struct ib_qp *qp, const struct ib_recv_wr *wr,
			 const struct ib_recv_wr **bad)
{
	*bad = NULL;
	return ib_post_recv(qp, wr, bad);
}

/*
 * A basic shared receive queue of @max_wr one-SGE receives on @pd, its
 * events to @handler with @context; ERR_PTR(-EOPNOTSUPP) on a device
 * without SRQs.
 */
struct ib_srq *rdma_cm_rs_create_srq(struct ib_pd *pd, u32 max_wr,
				     u32 max_sge,
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

/* Arms the SRQ's limit: an event once fewer than @limit receives are posted. */
int rdma_cm_rs_arm_srq_limit(struct ib_srq *srq, u32 limit)
{
	struct ib_srq_attr attr = { .srq_limit = limit };

	return ib_modify_srq(srq, &attr, IB_SRQ_LIMIT);
}

/* Unlike ib_destroy_srq(), returns the error instead of warning. */
int rdma_cm_rs_destroy_srq(struct ib_srq *srq)
{
	return ib_destroy_srq_user(srq, NULL);
}

int rdma_cm_rs_post_srq_recv(struct ib_srq *srq, const struct ib_recv_wr *wr,
			     const struct ib_recv_wr **bad)
{
	*bad = NULL;
	return ib_post_srq_recv(srq, wr, bad);
}

/*
 * The completion of such a WRITE: the transfer's last request (or the SEND
 * after it) completes after it, in order, and reports the transfer.
 */
static void rdma_cm_rs_signaled_write_done(struct ib_cq *cq, struct ib_wc *wc)
{
}

static struct ib_cqe rdma_cm_rs_signaled_write_cqe = {
	.done = rdma_cm_rs_signaled_write_done,
};

/*
 * rdma_rw_ctx_post(), with the request the driver refused in @bad; @chain,
 * if not NULL, follows the transfer and carries the completion.  With
 * @signal_writes (not NULL), every RDMA WRITE of the transfer is signaled,
 * its completion ignored, and counted there: siw sends an unsignaled
 * request of a page or more straight from its pages (MSG_SPLICE_PAGES) and
 * TCP may retransmit from them after the transfer completed, while a
 * signaled one is copied.
 */
int rdma_cm_rs_rw_ctx_post(struct rdma_rw_ctx *ctx, struct ib_qp *qp,
			   u32 port_num, struct ib_cqe *cqe,
			   struct ib_send_wr *chain, u32 *signal_writes,
			   const struct ib_send_wr **first,
			   const struct ib_send_wr **bad)
{
	struct ib_send_wr *wr, *head = rdma_rw_ctx_wrs(ctx, qp, port_num, cqe, chain);

	for (wr = head; signal_writes && wr && wr != chain; wr = wr->next) {
		if (wr->opcode != IB_WR_RDMA_WRITE ||
		    (wr->send_flags & IB_SEND_SIGNALED))
			continue;
		wr->send_flags |= IB_SEND_SIGNALED;
		wr->wr_cqe = &rdma_cm_rs_signaled_write_cqe;
		(*signal_writes)++;
	}
	*first = head;
	*bad = NULL;
	return ib_post_send(qp, head, bad);
}

int rdma_cm_rs_dma_map_single(struct ib_device *dev, void *cpu_addr,
			      size_t size, enum dma_data_direction dir,
			      u64 *dma_addr)
{
	u64 addr = ib_dma_map_single(dev, cpu_addr, size, dir);

	if (ib_dma_mapping_error(dev, addr))
		return -ENOMEM;
	*dma_addr = addr;
	return 0;
}

void rdma_cm_rs_dma_unmap_single(struct ib_device *dev, u64 addr, size_t size,
				 enum dma_data_direction dir)
{
	ib_dma_unmap_single(dev, addr, size, dir);
}

void rdma_cm_rs_dma_sync_for_cpu(struct ib_device *dev, u64 addr, size_t size,
				 enum dma_data_direction dir)
{
	ib_dma_sync_single_for_cpu(dev, addr, size, dir);
}

void rdma_cm_rs_dma_sync_for_device(struct ib_device *dev, u64 addr,
				    size_t size, enum dma_data_direction dir)
{
	ib_dma_sync_single_for_device(dev, addr, size, dir);
}

/* A fast-registration MR (FRWR) for up to max_num_sg pages. */
struct ib_mr *rdma_cm_rs_alloc_mr(struct ib_pd *pd, u32 max_num_sg)
{
	return ib_alloc_mr(pd, IB_MR_TYPE_MEM_REG, max_num_sg);
}

int rdma_cm_rs_dereg_mr(struct ib_mr *mr)
{
	return ib_dereg_mr(mr);
}

/*
 * Maps one DMA-contiguous region into the MR's page list (the first half of
 * an FRWR registration; the IB_WR_REG_MR work request is the second).  The
 * region must be mapped whole: a partial mapping is an error here.
 */
int rdma_cm_rs_map_mr(struct ib_mr *mr, u64 dma_addr, u32 len)
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

void rdma_cm_rs_update_fast_reg_key(struct ib_mr *mr, u8 newkey)
{
	ib_update_fast_reg_key(mr, newkey);
}

/*
 * Copies to or from memory a device may access concurrently (a registered
 * MR): done in C so that no Rust reference ever covers such memory.
 */
void rdma_cm_rs_copy(void *dst, const void *src, size_t len)
{
	memcpy(dst, src, len);
}

/*
 * Marks the KUnit case running in this task skipped, with @reason in its
 * result line ("ok N name # SKIP reason"); nothing outside a KUnit case.
 * kunit_mark_skipped() is a macro, and the case goes on running: the caller
 * returns from it.
 */
void rdma_cm_rs_kunit_skip(const char *reason)
{
	struct kunit *test = kunit_get_current_test();

	if (test)
		kunit_mark_skipped(test, "%s", reason);
}

/*
 * A UD QP's Q_Key and port: ib_qp_attr embeds address vectors whose unions
 * Rust cannot zero-initialise, so the query runs here.
 */
int rdma_cm_rs_query_ud_qp(struct ib_qp *qp, u32 *qkey, u32 *port_num)
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
 * The device's first and last port numbers (rdma_start_port, rdma_end_port:
 * 0 and 0 for a switch, else 1 and phys_port_cnt), fixed at registration.
 */
void rdma_cm_rs_port_range(struct ib_device *dev, u32 *first, u32 *last)
{
	*first = rdma_start_port(dev);
	*last = rdma_end_port(dev);
}

/*
 * The core capability flags of a valid port (RDMA_CORE_CAP_*, what the
 * rdma_protocol_* and rdma_cap_* inlines test), set by the driver's
 * get_port_immutable before registration and never changed.
 */
u32 rdma_cm_rs_port_core_caps(struct ib_device *dev, u32 port_num)
{
	return dev->port_data[port_num].immutable.core_cap_flags;
}

/* The port's active MTU in bytes, or a negative errno. */
int rdma_cm_rs_port_active_mtu(struct ib_device *dev, u32 port_num)
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
 * works on a copy, which borrows the caller's reference for the call.
 */
struct ib_ah *rdma_cm_rs_create_ah(struct ib_pd *pd,
				   const struct rdma_ah_attr *ah_attr)
{
	struct rdma_ah_attr copy = *ah_attr;

	return rdma_create_ah(pd, &copy, RDMA_CREATE_AH_SLEEPABLE);
}

/*
 * A scatterlist over the first @len bytes of @n_pages pages (physically
 * adjacent pages merged into one entry), in a table of its own.
 */
struct sg_table *rdma_cm_rs_sg_table_from_pages(struct page **pages,
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

void rdma_cm_rs_sg_table_free(struct sg_table *sgt)
{
	sg_free_table(sgt);
	kfree(sgt);
}

/* ib_dma_map_sg() of a scatterlist for both directions: the entries mapped. */
int rdma_cm_rs_dma_map_sg(struct ib_device *dev, struct scatterlist *sgl,
			  unsigned int nents)
{
	return ib_dma_map_sg(dev, sgl, nents, DMA_BIDIRECTIONAL);
}

void rdma_cm_rs_dma_unmap_sg(struct ib_device *dev, struct scatterlist *sgl,
			     unsigned int nents)
{
	ib_dma_unmap_sg(dev, sgl, nents, DMA_BIDIRECTIONAL);
}

/*
 * The first @mapped DMA segments of a scatterlist ib_dma_map_sg() mapped
 * (@mapped is what it returned) as SGEs of @lkey, into @out (room for
 * @mapped entries).
 */
void rdma_cm_rs_sg_dma_sges(struct scatterlist *sgl, int mapped, u32 lkey,
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
 * (and the parts of them) the range covers.
 */
void rdma_cm_rs_sync_sg_range(struct ib_device *dev, struct scatterlist *sgl,
			      unsigned int mapped, size_t offset, size_t len,
			      bool for_cpu)
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
 * unless all of it was copied.
 */
int rdma_cm_rs_sg_copy(struct scatterlist *sgl, unsigned int nents, void *buf,
		       size_t len, size_t skip, bool to_pages)
{
	size_t copied = to_pages ?
		sg_pcopy_from_buffer(sgl, nents, buf, len, skip) :
		sg_pcopy_to_buffer(sgl, nents, buf, len, skip);

	return copied == len ? 0 : -EINVAL;
}

/*
 * Maps the @mapped DMA segments of a scatterlist whole into the MR's page
 * list (the first half of an FRWR registration).
 */
int rdma_cm_rs_map_mr_sg(struct ib_mr *mr, struct scatterlist *sgl,
			 unsigned int mapped)
{
	int n = ib_map_mr_sg(mr, sgl, mapped, NULL, PAGE_SIZE);

	if (n < 0)
		return n;
	return n == mapped ? 0 : -EINVAL;
}

/*
 * The CPUs online now (num_online_cpus() is an inline reading an atomic):
 * a CQ pool spreads over no more completion vectors than these, as
 * ib_cq_pool_get does.
 */
unsigned int rdma_cm_rs_num_online_cpus(void)
{
	return num_online_cpus();
}
