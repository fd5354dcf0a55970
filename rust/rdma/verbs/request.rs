// SPDX-License-Identifier: GPL-2.0

//! Posted requests: what each kind of work request carries while the
//! device owns it (a message buffer, a memory work request, an R/W
//! transfer, a drain marker), posting a receive to a QP or an SRQ, and the
//! C completion callbacks that hand each back to its [`CompletionHandler`].

use super::{
    buffer::{Buffer, RecvBuffer, SendBuffer},
    completion::{wc_result, CompletionHandler, RwDone, WorkDone, WorkOp},
    cq::handler_of,
    credits::{Credit, PostedCqe, Signaling, WorkLedger, WrQueue},
    post_error::PostError,
};
use crate::rdma::{
    ah::{Datagram, GRH_SIZE},
    bindings,
    callback::CallbackMark,
    device,
    sg::SgBuffer,
};
use core::{
    ptr::NonNull,
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{prelude::*, sync::Arc, types::Opaque};

/// Posts `buf` as a receive of its full capacity and its pages (at most
/// `max_sge` entries, `EMSGSIZE` otherwise), counted and tracked by
/// `credits` (`ENOSPC` when they are all taken), with `post`, which hands
/// the request to the driver and fails only if the driver did not take it;
/// the buffer's completion runs [`recv_done`] on the CQ of `C` it
/// completes on.  On failure the buffer comes back with the error.
pub(super) fn post_recv_buffer<C: CompletionHandler>(
    buf: RecvBuffer,
    credits: &Arc<WorkLedger>,
    on_ud: bool,
    max_sge: u32,
    post: impl FnOnce(&bindings::ib_recv_wr) -> Result,
) -> Result<(), PostError<RecvBuffer>> {
    let credit = match credits.take(WrQueue::Recv) {
        Ok(credit) => credit,
        Err(e) => return Err(PostError::new(e, buf)),
    };
    let mut inner = buf.0;
    let capacity = inner.data.len();
    // Kept across the post.
    let list = match inner.map_pages(capacity, max_sge) {
        Ok(list) => list,
        Err(e) => return Err(PostError::new(e, RecvBuffer(inner))),
    };
    inner.credit = Some(credit);
    inner.on_ud = on_ud;
    // The CPU may have read the buffer since its last use: give it back to
    // the device before the device writes it.
    inner.sync_for_device(inner.data.len());
    inner.cqe.done = Some(recv_done::<C>);
    let mut sge = inner.sge(capacity);
    let (sg_list, num_sge) = Buffer::sg_list(&mut sge, list.as_ref());
    let leaked = KBox::into_raw(inner);
    // SAFETY: `leaked` is live until its completion or the failure below.
    let cqe = unsafe { &raw mut (*leaked).cqe };
    // Tracked before the post (the completion may run before it returns);
    // a failure below untracks it when the credit goes.
    // SAFETY: As above; the credit is a field apart from `cqe`.
    if let Some(credit) = unsafe { (*leaked).credit.as_mut() } {
        // SAFETY: `cqe` points into the live object.
        credit.track(unsafe { NonNull::new_unchecked(cqe) });
    }
    let mut wr: bindings::ib_recv_wr = pin_init::zeroed();
    wr.__bindgen_anon_1.wr_cqe = cqe;
    wr.sg_list = sg_list;
    wr.num_sge = num_sge;
    // The buffer stays allocated and mapped until its completion recovers it.
    if let Err(e) = post(&wr) {
        // SAFETY: The driver refused it: nothing else owns the buffer.
        let mut inner = unsafe { KBox::from_raw(leaked) };
        inner.credit = None;
        return Err(PostError::new(e, RecvBuffer::back(inner)));
    }
    Ok(())
}

/// # Safety
///
/// Called by the CQ for a receive posted by [`Qp::post_recv`] on a QP whose
/// CQ is a `Cq<C>`, or by [`Srq::post_recv`] on a `Srq<C>` (whose QPs'
/// receive CQs are `Cq<C>`s).
pub(super) unsafe extern "C" fn recv_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: By the safety requirements.
    let mut buf = unsafe { Buffer::from_wc(wc) };
    let credit = buf.credit.take();
    // SAFETY: The CQ is live during its callback; its context is the `Cq<C>`.
    let handler = unsafe { handler_of::<C>(cq) };
    // SAFETY: `wc` is valid during the callback.
    let wc = unsafe { &*wc };
    // Nothing arrived on an error: no stale bytes or sender from an
    // earlier use.
    buf.len = 0;
    buf.offset = 0;
    buf.imm = None;
    buf.invalidate = None;
    buf.datagram = None;
    buf.qp_num = None;
    buf.paged_len = 0;
    let result = wc_result(wc).and_then(|()| {
        let total = (wc.byte_len as usize).min(buf.data.len());
        buf.sync_for_cpu(total);
        // Past the buffer, the pages (unmapped, and so synced for the CPU,
        // when the buffer is handed back).
        if let Some(mapped) = &buf.mapped {
            let paged = wc.byte_len as usize - total;
            buf.paged_len = paged.min(mapped.pages.len());
        }
        if wc.wc_flags & bindings::ib_wc_flags_IB_WC_WITH_IMM as i32 != 0 {
            // SAFETY: With IB_WC_WITH_IMM the device set `imm_data`.
            buf.imm = Some(u32::from_be(unsafe { wc.ex.imm_data }));
        }
        if wc.wc_flags & bindings::ib_wc_flags_IB_WC_WITH_INVALIDATE as i32 != 0 {
            // SAFETY: With IB_WC_WITH_INVALIDATE the device set
            // `invalidate_rkey` (host order, a key of this QP's PD that it
            // invalidated before completing the receive).
            let rkey = unsafe { wc.ex.invalidate_rkey };
            buf.pd.invalidated_remotely(rkey);
            buf.invalidate = Some(rkey);
        }
        if buf.on_ud {
            // A UD receive always starts with the GRH's 40 bytes, counted
            // in `byte_len` (IBTA 11.4.1.1): fewer is a device error.
            if total < GRH_SIZE {
                return Err(EIO);
            }
            buf.datagram = Some(Datagram::new(wc, &buf.data[..GRH_SIZE]));
            buf.offset = GRH_SIZE;
            buf.len = total - GRH_SIZE;
        } else {
            buf.len = total;
        }
        Ok(buf.len + buf.paged_len)
    });
    if let Some(credit) = credit {
        // On success the peer has spoken: held sends may go.
        buf.qp_num = credit.credits.received_on(wc.qp, result.is_ok());
    }
    handler.recv_done(RecvBuffer::back(buf), result);
}

/// # Safety
///
/// Called by the CQ for a send posted by [`Qp::post_send`] on a QP whose CQ
/// is a `Cq<C>`.
pub(super) unsafe extern "C" fn send_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: By the safety requirements.
    let buf = unsafe { Buffer::from_wc(wc) };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    if let Some(credit) = &buf.credit {
        credit.give_back_unsignaled_before(handler);
    }
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    send_completed(handler, buf, result);
}

/// Hands a send that is done back to `handler`, with what it held of the QP
/// (its credit) and of the destination (the address handle) let go.
pub(super) fn send_completed<C: CompletionHandler>(
    handler: &C,
    mut buf: KBox<Buffer>,
    result: Result,
) {
    buf.credit = None;
    buf.dest = None;
    handler.send_done(SendBuffer::back(buf), result);
}

/// A posted memory work request.
///
/// # Invariants
///
/// `cqe` is the completion entry of the work request that owns this object.
pub(super) struct Work {
    pub(super) cqe: bindings::ib_cqe,
    /// The range of the region to sync for the CPU on success.
    pub(super) cpu_sync: Option<(usize, usize)>,
    /// Returned when the work is taken apart at its completion.
    pub(super) credit: Credit,
    pub(super) done: WorkDone,
}

impl Work {
    /// Recovers the work of a completion.
    ///
    /// # Safety
    ///
    /// `wc` must complete a work request posted with a `Work` leaked by
    /// `KBox::into_raw` in this module.
    unsafe fn from_wc(wc: *mut bindings::ib_wc) -> KBox<Self> {
        // SAFETY: By the safety requirements `wr_cqe` is the `cqe` of a
        // `Work`, its `cqe` field.
        unsafe {
            KBox::from_raw(kernel::container_of!(
                (*wc).__bindgen_anon_1.wr_cqe,
                Work,
                cqe
            ))
        }
    }
}

/// # Safety
///
/// Called by the CQ for a work request posted by [`Qp::post_work`] or
/// [`Qp::register_then_send`] on a QP whose CQ is a `Cq<C>`.
pub(super) unsafe extern "C" fn work_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: By the safety requirements.
    let work = unsafe { Work::from_wc(wc) };
    // SAFETY: The CQ is live during its callback and its context is a `Cq<C>`.
    let handler = unsafe { handler_of::<C>(cq) };
    work.credit.give_back_unsignaled_before(handler);
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    work_completed(handler, work, result);
}

/// Hands memory work that is done back to `handler`, the region's state
/// following its result.
pub(super) fn work_completed<C: CompletionHandler>(handler: &C, work: KBox<Work>, result: Result) {
    let Work { done, cpu_sync, .. } = KBox::into_inner(work);
    match (done.op, &result) {
        // The region is free again: a failed registration grants nothing.
        (WorkOp::Register, Err(_)) => done.mr.registration().valid = false,
        // A failed invalidation may leave the keys valid: refuse to
        // register again; dropping the region still revokes everything.
        (WorkOp::Invalidate, Err(_)) => done.mr.registration().valid = true,
        _ => {}
    }
    if let (Some((offset, len)), Ok(())) = (cpu_sync, &result) {
        done.mr.sync_for_cpu(offset, len);
    }
    handler.work_done(done, result);
}

/// A posted transfer of the R/W API ([`Qp::rdma_rw`]).
///
/// # Invariants
///
/// `cqe` is the completion entry of the transfer that owns this object.
/// Unless `released`, `ctx` was initialised (`rdma_rw_ctx_init`) on the QP
/// `qp` at `port` over the scatterlist of `done.buf`, which it holds
/// mapped (and, on devices that register, registrations of the QP's
/// pool); the QP is live until `released` is set.  While `posting`, the
/// driver may still read the requests inside `ctx`.
pub(super) struct RwWork {
    pub(super) cqe: bindings::ib_cqe,
    pub(super) ctx: Opaque<bindings::rdma_rw_ctx>,
    pub(super) released: AtomicBool,
    pub(super) posting: AtomicBool,
    /// An iWARP READ: its sink is registered for the peer to write, under
    /// a key the READ request hands over and only its success revokes.
    pub(super) exposes_sink: bool,
    /// An iWARP READ on a device whose placements may outlive the key's
    /// invalidation ([`Device::places_after_deregistration`]): its sink
    /// goes back a grace period after the key ended.
    pub(super) sink_waits_for_placements: bool,
    pub(super) qp: *mut bindings::ib_qp,
    pub(super) port: u32,
    /// Returned when the transfer is taken apart at its completion.
    pub(super) credit: Option<Credit>,
    /// The SEND posted after the transfer, if any, and its send-queue
    /// credit.
    pub(super) send_credit: Option<Credit>,
    pub(super) then_send: Option<KBox<Buffer>>,
    pub(super) done: RwDone,
}

impl RwWork {
    /// Ends the context's hold on its QP and on the buffer's mapping
    /// (`rdma_rw_ctx_destroy`: registrations back to the QP's pool, the
    /// buffer unmapped, which makes a READ's bytes visible to the CPU),
    /// once.  Called by the post that failed, under the QP's lock, or
    /// under the lock of the QP's tracking by the transfer's completion
    /// ([`WorkLedger::finish_rw`]) or the QP's shutdown before the QP's
    /// destruction ([`WorkLedger::release_rw`]), whichever comes first: the
    /// QP is live for each.
    pub(super) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let (sgl, nents) = self.done.buf.sgl();
        // SAFETY: Not released before (the swap), so by the type invariants
        // the context was initialised on the live `qp` at `port` over
        // `sgl` of `nents` entries in this direction; it is destroyed once.
        unsafe {
            bindings::rdma_rw_ctx_destroy(
                self.ctx.get(),
                self.qp,
                self.port,
                sgl,
                nents,
                self.done.op.direction(),
            )
        };
    }

    /// `error` with the buffers of a transfer that is released (or never
    /// held them), for a post that did not happen.
    pub(super) fn refused(
        self: KBox<Self>,
        error: Error,
    ) -> PostError<(SgBuffer, Option<SendBuffer>)> {
        let work = KBox::into_inner(self);
        PostError::new(error, (work.done.buf, work.then_send.map(SendBuffer::back)))
    }
}

/// # Safety
///
/// Called by the CQ for a transfer posted by [`Qp::rdma_rw`] on a QP whose
/// send CQ is a `Cq<C>` (or by a reclaim, as its flushed completion).
pub(super) unsafe extern "C" fn rw_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: `wc` is valid during the callback.
    let own = unsafe { (*wc).__bindgen_anon_1.wr_cqe };
    // By the safety requirements `own` is the `cqe` of an `RwWork` leaked
    // by `KBox::into_raw`, its `cqe` field, whose completion
    // runs once.  A shutdown may reach it through the tracking until it
    // is untracked below: shared until then.
    // SAFETY: As above.
    let work = unsafe { &*kernel::container_of!(own, RwWork, cqe) };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    if let (Some(credit), Some(own)) = (&work.credit, NonNull::new(own)) {
        let credits = &credit.credits;
        let entry = PostedCqe(own, WrQueue::Rw);
        {
            // The poster may be between the driver's post, whose walk of
            // the chain reads the context, and its return.
            let mut tracking = credits.posted.lock();
            while work.posting.load(Ordering::Acquire) {
                credits.post_done.wait(&mut tracking);
            }
            // A completion from the driver (a reclaim's has no QP) for a
            // transfer no longer tracked is the driver's second one: siw
            // completes a READ it took up but had not sent twice when the
            // QP is flushed.  The first, a failure, parked the transfer
            // (every failed iWARP READ is parked), so the object is still
            // here; only the first counts.
            // SAFETY: `wc` is valid during the callback.
            let qp = unsafe { (*wc).qp };
            if !qp.is_null() && !tracking.contains(&entry) {
                drop(tracking);
                // SAFETY: The driver's completion names the QP it belongs
                // to, which lives while its completions run.
                let qp_num = unsafe { (*qp).qp_num };
                pr_err!(
                    "QP {qp_num}: a second completion of one RDMA READ from the driver, ignored\n"
                );
                return;
            }
        }
        credit.give_back_unsignaled_before(handler);
        if let (true, Err(e)) = (work.exposes_sink, result) {
            // The peer holds a key to write into the sink, which only the
            // READ's success revokes: the buffer stays the QP's until its
            // destruction deregisters the key (`Qp::reclaim`).
            if credits.park_rw(entry, e, || work.release()) {
                return;
            }
        }
        credits.finish_rw(entry, || work.release());
        if work.sink_waits_for_placements {
            // The sink's key ended before this completion (the READ's
            // READ_WITH_INV, or for a failed READ not parked, the QP's
            // destruction), but a chunk of another QP's WRITE that passed
            // the key's check before may still be copying into the sink
            // (see `Device::places_after_deregistration`).  Process
            // context: the layer offers no softirq polling, and the
            // handler already slept on `post_done` above.
            device::ended_key_grace_period();
        }
    }
    // A transfer the reclaim completes was released by the shutdown.
    work.release();
    // Untracked: nothing else reaches the object now.
    // SAFETY: As above; the only owner.
    let work = unsafe { KBox::from_raw(kernel::container_of!(own, RwWork, cqe)) };
    hand_back_rw(handler, work, result);
}

/// Hands a released, untracked transfer's buffers to `handler`.
pub(super) fn hand_back_rw<C: CompletionHandler>(
    handler: &C,
    mut work: KBox<RwWork>,
    result: Result,
) {
    work.credit = None;
    work.send_credit = None;
    let RwWork {
        done, then_send, ..
    } = KBox::into_inner(work);
    handler.rw_done(done, result);
    if let Some(send) = then_send {
        handler.send_done(SendBuffer::back(send), result);
    }
}

/// The marker a shutdown posts after unsignaled sends: its completion, which
/// comes after theirs, gives back the ones that succeeded.
///
/// # Invariants
///
/// `cqe` is the completion entry of the work request that owns this object.
pub(super) struct DrainMarker {
    pub(super) cqe: bindings::ib_cqe,
    pub(super) credits: Arc<WorkLedger>,
}

/// # Safety
///
/// Called by the CQ for the marker [`Qp::post_drain_marker`] posted on a QP
/// whose send CQ is a `Cq<C>` (or by a reclaim, as its flushed completion).
pub(super) unsafe extern "C" fn marker_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter_completion();
    // SAFETY: `wc` is valid during the callback.
    let own = unsafe { (*wc).__bindgen_anon_1.wr_cqe };
    // SAFETY: By the safety requirements `own` is the `cqe` of a
    // `DrainMarker` leaked by `KBox::into_raw`; its completion runs once.
    let marker = unsafe { KBox::from_raw(kernel::container_of!(own, DrainMarker, cqe)) };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    if let Some(own) = NonNull::new(own) {
        let entry = PostedCqe(own, WrQueue::Send);
        marker.credits.give_back_unsignaled_before(handler, entry);
        marker.credits.untrack(entry);
    }
}

impl WorkLedger {
    /// For a completion of the send queue's request `own`: gives back to
    /// `handler`, in post order and before the caller reports `own`, every
    /// unsignaled request posted before it, done with success.
    pub(super) fn give_back_unsignaled_before<C: CompletionHandler>(
        &self,
        handler: &C,
        own: PostedCqe,
    ) {
        while let Some(done) = self.take_done_before(own) {
            // Taking it out of the order made this the request's only
            // owner: a successful unsignaled request has no completion of
            // its own, a failed one's would have taken it out of the order
            // first, and a reclaim empties the order before it completes
            // anything.  Its kind says which object leaked it, the entry
            // being that object's `cqe` field.
            match done.signaling {
                Signaling::UnsignaledSend => {
                    // SAFETY: By the above, the live `Buffer` that
                    // `post_send_to` or `register_then_send` leaked.
                    let buf = unsafe {
                        KBox::from_raw(kernel::container_of!(done.cqe.0.as_ptr(), Buffer, cqe))
                    };
                    send_completed(handler, buf, Ok(()));
                }
                Signaling::UnsignaledWork => {
                    // SAFETY: By the above, the live `Work` that
                    // `register_then_send` leaked.
                    let work = unsafe {
                        KBox::from_raw(kernel::container_of!(done.cqe.0.as_ptr(), Work, cqe))
                    };
                    work_completed(handler, work, Ok(()));
                }
                // Not taken: `take_done_before` skips them.
                Signaling::Signaled => {}
            }
        }
    }
}

impl Credit {
    /// For the completion of this credit's send-queue request: gives back
    /// the unsignaled sends posted before it (see
    /// [`WorkLedger::give_back_unsignaled_before`]).
    pub(super) fn give_back_unsignaled_before<C: CompletionHandler>(&self, handler: &C) {
        if let Some(own) = self.posted {
            self.credits.give_back_unsignaled_before(handler, own);
        }
    }
}
