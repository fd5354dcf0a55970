// SPDX-License-Identifier: GPL-2.0

//! A QP's teardown: the shutdown that flushes its outstanding requests
//! through the CQ, bounded by [`FLUSH_TIMEOUT`], the reclaim of what the
//! driver never flushed, and the marker that ends a flush.

use super::{
    attachment::Attachment,
    completion::CompletionHandler,
    credits::{PostedCqe, Signaling, WrQueue, FLUSH_TIMEOUT},
    qp::{Qp, QpShutdown},
    request::{hand_back_rw, marker_done, DrainMarker, RwWork},
};
use crate::rdma::bindings;
use core::{
    ptr::{self, NonNull},
    sync::atomic::Ordering,
};
use kernel::{prelude::*, sync::Arc};

impl<C: CompletionHandler> Qp<C> {
    /// Posts, on the QP `shutdown` took and moved to the error state, a
    /// signaled zero-length RDMA WRITE (as `ib_drain_sq` does): the driver
    /// flushes it after every request before it, and its completion gives
    /// back the unsignaled sends that succeeded without one.  Uses the
    /// spare slot of the send queue and the spare entry of its CQ
    /// ([`Self::prepare`]).  If it cannot be posted, those sends come back
    /// at the reclaim, as flushed.
    fn post_drain_marker(&self, raw: NonNull<bindings::ib_qp>) {
        let mut cqe: bindings::ib_cqe = pin_init::zeroed();
        cqe.done = Some(marker_done::<C>);
        let Ok(marker) = KBox::new(
            DrainMarker {
                cqe,
                credits: self.credits.clone(),
            },
            GFP_KERNEL,
        ) else {
            return;
        };
        let leaked = KBox::into_raw(marker);
        // SAFETY: `leaked` is live until its completion or the failure below.
        let cqe = unsafe { &raw mut (*leaked).cqe };
        // SAFETY: `cqe` points into the live object.
        let entry = PostedCqe(unsafe { NonNull::new_unchecked(cqe) }, WrQueue::Send);
        if !self.credits.track(entry) {
            // SAFETY: Not posted: this is the only owner.
            drop(unsafe { KBox::from_raw(leaked) });
            return;
        }
        self.credits.push_send(entry, Signaling::Signaled);
        let mut wr: bindings::ib_send_wr = pin_init::zeroed();
        wr.__bindgen_anon_1.wr_cqe = cqe;
        wr.opcode = bindings::ib_wr_opcode_IB_WR_RDMA_WRITE;
        wr.send_flags = bindings::ib_send_flags_IB_SEND_SIGNALED;
        // `raw` is live (the caller took it from `self.raw` and destroys it
        // only after the wait for this completion); `wr` lives across the
        // call, moves no data (no SGE) and names the marker, whose `done`
        // is set; the driver copies it.
        let mut refused = ptr::null();
        // SAFETY: As above; `refused` is writable for the call.
        let ret = unsafe { bindings::ib_post_send(raw.as_ptr(), &wr, &mut refused) };
        // Unless the driver refused the marker itself, it may hold it: the
        // QP is in the error state already.
        if ret != 0 && ptr::eq(refused, &wr) {
            self.credits.remove_send(entry);
            self.credits.untrack(entry);
            // SAFETY: The post failed: the QP does not own the marker.
            drop(unsafe { KBox::from_raw(leaked) });
        }
    }
}

impl<C: CompletionHandler> QpShutdown for Qp<C> {
    fn shutdown(&self) -> Option<NonNull<bindings::ib_qp>> {
        // Stop new posts first, outside of the wait for completions.
        let raw = self.raw.lock().take()?;
        if let Some(srq) = &self.srq {
            srq.credits
                .depart(self.srq_key.load(Ordering::Acquire), &self.credits);
        }
        // `ib_modify_qp` to the error state (refused from RESET, which the
        // CM never leaves a QP in) makes the driver flush every outstanding
        // request through the CQ's workqueue, and on iWARP drops the
        // connection.
        // SAFETY: The QP is live (type invariants); nothing posts to it.
        let moved = unsafe { bindings::rdma_cm_rs_modify_qp_err(raw.as_ptr()) };
        if moved == 0 {
            // The driver now flushes every outstanding request through the
            // CQ's workqueue, or for a `Direct` CQ into the CQ, which this
            // task then polls.  The caller is not a completion of this CQ
            // (the CM defers such destructions): the wait cannot be on
            // itself.  An unsignaled send that succeeded has no completion
            // to wait for: a marker behind it gives it back.
            if self.credits.has_unsignaled() {
                self.post_drain_marker(raw);
            }
            let poll_direct = || {
                self.send_cq.poll_for_teardown();
                self.recv_cq.poll_for_teardown();
            };
            let direct = self.send_cq.poll.owner_polls() || self.recv_cq.poll.owner_polls();
            self.credits
                .wait_flushed(FLUSH_TIMEOUT, direct.then_some(&poll_direct as &dyn Fn()));
        }
        // What the driver did not flush is completed after the QP's
        // destruction, when an R/W transfer could no longer give its QP
        // back what it holds of it.
        self.release_rw_transfers();
        // The destruction that follows fails while the QP counts an
        // attachment.
        self.detach_all_multicast(raw);
        Some(raw)
    }

    fn reclaim(&self) {
        // The registrations a failed transfer's sink had are gone with the
        // QP: its buffer may go back at once.
        self.credits.destroyed.store(true, Ordering::Release);
        // Completions the driver queued before the QP was destroyed reach
        // their handlers first, and a handler still running returns (its
        // request stopped being tracked just before it was called); none
        // comes after.  A direct CQ stays held until the leftovers are
        // done (one hold when both queues share it: a second would wait
        // for the first).
        let _send_hold = self.send_cq.quiesce();
        let _recv_hold = if Arc::ptr_eq(&self.send_cq, &self.recv_cq) {
            None
        } else {
            self.recv_cq.quiesce()
        };
        // Each request left is completed on its own below, an unsignaled
        // send that may have succeeded as flushed too: none gives back
        // another.
        self.credits.clear_send_order();
        if self.credits.holds_rw() {
            // The destruction deregistered the pool's registrations, among
            // them the keys of iWARP READ sinks the peer was given; a chunk
            // of a WRITE placed through one may still be copying.  Their
            // buffers go back below.
            self.device().wait_for_ended_key_writes();
        }
        let mut reclaimed = 0u32;
        while let Some(entry) = self.credits.pop_posted() {
            let cqe = entry.0.as_ptr();
            // The CQ the request would have completed on.
            let cq = if entry.1.on_send_cq() {
                &self.send_cq
            } else {
                &self.recv_cq
            };
            let mut wc: bindings::ib_wc = pin_init::zeroed();
            wc.__bindgen_anon_1.wr_cqe = cqe;
            wc.status = bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR;
            // `cqe` is the `cqe` field of the `Buffer` or `Work` a request
            // posted on this QP owns (`track`, under the QP's lock, only for
            // a request that was posted), whose completion did not run (it
            // would have removed the entry) and never will: the owner
            // destroyed the QP (`rdma_destroy_qp` waits until rxe and siw
            // dropped its requests without completing them) and the CQ
            // holds nothing of it any more.  Popping the entry made this
            // the object's only owner.
            // SAFETY: By the above, `cqe` is live; its `done` was set before
            // the post.
            let done = unsafe { (*cqe).done };
            if let Some(done) = done {
                // SAFETY: As above: `done` takes ownership of the request's
                // object from `wc`, as for a flushed completion of the CQ of
                // its queue, which is live.
                unsafe { done(cq.as_ptr(), &mut wc) };
                reclaimed += 1;
            }
        }
        if reclaimed > 0 {
            pr_warn!(
                "QP {}: {} requests the driver did not flush in {} ms, completed as flushed after its destruction\n",
                self.qp_num(),
                reclaimed,
                FLUSH_TIMEOUT.as_millis()
            );
        }
        // Transfers kept back because the peer could still write into
        // their sink go back now, with the error they completed with.
        while let Some((entry, error)) = self.credits.take_parked() {
            // A parked entry is the `cqe` of a released `RwWork` that
            // `park_rw` took out of the tracking (its completion returned
            // without handing it over): nothing else owns it.
            // SAFETY: By the above, the live object `KBox::into_raw` leaked.
            let work =
                unsafe { KBox::from_raw(kernel::container_of!(entry.0.as_ptr(), RwWork, cqe)) };
            hand_back_rw(self.send_cq.handler(), work, Err(error));
        }
        // Every completion of the QP ran: the SRQ may give its address to
        // a new QP.
        if let Some(srq) = &self.srq {
            srq.credits
                .leave(self.srq_key.swap(0, Ordering::AcqRel), &self.credits);
        }
    }

    fn qp_num(&self) -> u32 {
        Qp::qp_num(self)
    }

    fn attach_multicast(&self, group: Attachment) -> Result {
        Qp::attach_multicast(self, group)
    }

    fn detach_multicast(&self, group: Attachment) -> Result {
        Qp::detach_multicast(self, group)
    }
}

#[pinned_drop]
impl<C: CompletionHandler> PinnedDrop for Qp<C> {
    fn drop(self: Pin<&mut Self>) {
        // The QP itself is destroyed by its owner after `shutdown`; the CQ
        // room goes with this object.
        self.send_cq.release(self.send_room);
        self.recv_cq.release(self.recv_room);
        if let Some(srq) = &self.srq {
            let key = self.srq_key.load(Ordering::Acquire);
            if key != 0 {
                srq.credits.leave(key, &self.credits);
            }
            srq.detach_cq(&self.recv_cq);
        }
    }
}
