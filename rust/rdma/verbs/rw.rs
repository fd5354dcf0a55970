// SPDX-License-Identifier: GPL-2.0

//! The R/W API (`core/rw.c`): RDMA READ/WRITE of an [`SgBuffer`] to and
//! from a peer's region, on RC QPs.

use super::{
    buffer::SendBuffer,
    caps::QpType,
    completion::{CompletionHandler, RwDone, RwOp},
    credits::{PostedCqe, Signaling, WrQueue},
    post_error::PostError,
    qp::Qp,
    request::{rw_done, RwWork},
};
use crate::rdma::{bindings, device::Transport, mr::RemoteRegion, sg::SgBuffer};
use core::{
    ptr::{self, NonNull},
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{prelude::*, types::Opaque};

/// The completion of a WRITE signaled only so that the device copies it
/// (on iWARP, see [`Qp::rdma_rw`]): ignored, the transfer's last request
/// completes after it, in order, and reports the transfer.
extern "C" fn signaled_write_done(_cq: *mut bindings::ib_cq, _wc: *mut bindings::ib_wc) {}

/// The CQ entry of those WRITEs, one for the layer: the core and the
/// driver only read it (and call its `done`).
static SIGNALED_WRITE_CQE: bindings::ib_cqe = bindings::ib_cqe {
    done: Some(signaled_write_done),
};

impl<C: CompletionHandler> Qp<C> {
    /// The generic RDMA READ/WRITE API (`rdma_rw_ctx_init`/`_post`): moves
    /// the whole of `buf` from (READ) or to (WRITE) the peer's `remote`
    /// region, of the same length, with as many RDMA requests as the
    /// buffer's pages and the QP's [`QpCaps::max_send_sge`] take, and on
    /// devices that need it (an iWARP READ's sink) a registration from the
    /// QP's pool before them and an invalidation after.  The QP owns the
    /// buffer, mapped for its device, until the transfer's one completion
    /// unmaps it and hands it to [`CompletionHandler::rw_done`] with
    /// `tag`.  On iWARP each of its RDMA WRITEs is signaled (the extra
    /// completions are the layer's, [`Self::signaled_rw_writes`] counts
    /// them): an iWARP device may send an unsignaled request from its
    /// pages, and TCP retransmit from them, after the transfer came back
    /// (`Documentation/rdma_cm_rs/design.rst`, "Driver behaviour").
    ///
    /// On failure the buffer comes back with the error: `EOPNOTSUPP` on a
    /// UD QP, `EINVAL` on a QP without [`QpCaps::max_rdma_ctxs`] or for a
    /// region of another length or beyond the address space, `EAGAIN` as
    /// [`Self::post_send`], `ENOSPC` when the transfer's requests (or the
    /// registrations of the pool) do not fit beside those in flight,
    /// `EMSGSIZE` when they could never fit, `ENOTCONN` once the QP is
    /// shut down.
    ///
    /// [`QpCaps::max_send_sge`]: crate::rdma::QpCaps::max_send_sge
    /// [`QpCaps::max_rdma_ctxs`]: crate::rdma::QpCaps::max_rdma_ctxs
    pub fn rdma_rw(
        &self,
        op: RwOp,
        buf: SgBuffer,
        remote: RemoteRegion,
        tag: u64,
    ) -> Result<(), PostError<SgBuffer>> {
        self.post_rw(op, buf, remote, tag, None)
            .map_err(|e| PostError::new(e.error, e.value.0))
    }

    /// [`Self::rdma_rw`] followed, in the same post, by a SEND of `send`
    /// (with its immediate data or invalidation, inline if asked), which
    /// the peer sees only after the transfer: a target's WRITE of the
    /// data and its response, one doorbell and one completion.  The SEND
    /// is always signaled: its completion is the transfer's, and hands
    /// `send` back to [`CompletionHandler::send_done`] right after `buf`
    /// to [`CompletionHandler::rw_done`], with the same result (a failed
    /// transfer flushes the SEND).  Errors as [`Self::rdma_rw`] and
    /// [`Self::post_send`] (the send takes one of `max_send_wr`); both
    /// buffers come back (the send in the `Option`, which holds it).
    pub fn rdma_rw_then_send(
        &self,
        op: RwOp,
        buf: SgBuffer,
        remote: RemoteRegion,
        tag: u64,
        send: SendBuffer,
    ) -> Result<(), PostError<(SgBuffer, Option<SendBuffer>)>> {
        self.post_rw(op, buf, remote, tag, Some(send))
    }

    fn post_rw(
        &self,
        op: RwOp,
        buf: SgBuffer,
        remote: RemoteRegion,
        tag: u64,
        then: Option<SendBuffer>,
    ) -> Result<(), PostError<(SgBuffer, Option<SendBuffer>)>> {
        if let Err(e) = self
            .check_type(QpType::Rc)
            .and_then(|()| self.check_peer_spoke())
        {
            return Err(PostError::new(e, (buf, then)));
        }
        let fits = usize::try_from(remote.len).is_ok_and(|len| len == buf.len())
            && remote.addr.checked_add(u64::from(remote.len)).is_some();
        let slots = match self.credits.caps.rw_slots() {
            Ok(slots) if slots > 0 && fits => slots,
            _ => return Err(PostError::new(EINVAL, (buf, then))),
        };
        let send_credit = match &then {
            None => None,
            Some(send) => match self
                .check_send(send)
                .and_then(|()| self.credits.take(WrQueue::Send))
            {
                Ok(credit) => Some(credit),
                Err(e) => return Err(PostError::new(e, (buf, then))),
            },
        };
        let Ok(room) = KBox::<RwWork>::new_uninit(GFP_KERNEL) else {
            return Err(PostError::new(ENOMEM, (buf, then)));
        };
        // The SEND's list with pages, kept across the post.
        let (then, then_list) = match then {
            Some(mut send) => {
                let head_len = send.0.len;
                match send.0.map_pages(head_len, self.max_send_sge) {
                    Ok(list) => (Some(send), list),
                    Err(e) => return Err(PostError::new(e, (buf, Some(send)))),
                }
            }
            None => (None, None),
        };
        let mut cqe: bindings::ib_cqe = pin_init::zeroed();
        cqe.done = Some(rw_done::<C>);
        let exposes_sink = op == RwOp::Read && self.device().transport() == Transport::Iwarp;
        // INVARIANT: Released (nothing initialised) until the context is.
        let mut work = KBox::write(
            room,
            RwWork {
                cqe,
                ctx: Opaque::zeroed(),
                released: AtomicBool::new(true),
                posting: AtomicBool::new(false),
                exposes_sink,
                sink_waits_for_placements: exposes_sink
                    && self.device().places_after_deregistration(),
                qp: ptr::null_mut(),
                port: self.port_num.load(Ordering::Acquire),
                credit: None,
                send_credit,
                then_send: then.map(|send| {
                    send.0.sync_for_device(send.0.len);
                    send.0
                }),
                done: RwDone { op, tag, buf },
            },
        );
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err(work.refused(ENOTCONN));
        };
        let (sgl, nents) = work.done.buf.sgl();
        // `raw` is an RC QP on the CM id's port with `max_rdma_ctxs`; the
        // call maps `sgl`, the buffer's unmapped scatterlist, for its device.
        // SAFETY: `raw` is live under the lock; `ctx` is zeroed, owned and
        // at a stable address; `sgl` has `nents` entries.
        let wrs = unsafe {
            bindings::rdma_rw_ctx_init(
                work.ctx.get(),
                raw.as_ptr(),
                work.port,
                sgl,
                nents,
                0,
                remote.addr,
                remote.rkey,
                op.direction(),
            )
        };
        // The pool's registrations all in use: like the slots, retry once
        // a transfer completed.
        let wrs = match u32::try_from(wrs) {
            Ok(wrs) => wrs,
            Err(_) if wrs == -(bindings::EAGAIN as i32) => return Err(work.refused(ENOSPC)),
            Err(_) => return Err(work.refused(Error::from_errno(wrs))),
        };
        // INVARIANT: From here the context holds the mapping (and
        // registrations) on the live QP, until released.
        work.qp = raw.as_ptr();
        work.released.store(false, Ordering::Relaxed);
        let credit = match self.credits.take_n(WrQueue::Rw, wrs) {
            Ok(credit) => credit,
            Err(e) => {
                work.release();
                let e = if wrs > slots { EMSGSIZE } else { e };
                return Err(work.refused(e));
            }
        };
        work.credit = Some(credit);
        let leaked = KBox::into_raw(work);
        // SAFETY: `leaked` is live until its completion or the failure below.
        let cqe = unsafe { &raw mut (*leaked).cqe };
        // SAFETY: As above.
        let entry = PostedCqe(unsafe { NonNull::new_unchecked(cqe) }, WrQueue::Rw);
        // SAFETY: As above; the credit is a field apart from `cqe`.
        if let Some(credit) = unsafe { (*leaked).credit.as_mut() } {
            credit.track(entry.0);
        }
        // Its last request asks for the completion, which gives back the
        // unsignaled sends before it.
        self.credits.push_send(entry, Signaling::Signaled);
        // The requests live in the context: its completion, which may come
        // while the driver still walks their chain, waits until the post
        // returned before it frees them.
        // SAFETY: As above.
        let work = unsafe { &*leaked };
        work.posting.store(true, Ordering::Release);
        // A SEND after the transfer carries its completion instead.
        let mut send_sge = bindings::ib_sge::default();
        let mut send_wr: bindings::ib_send_wr = pin_init::zeroed();
        let chain = match &work.then_send {
            Some(send) => {
                send.fill_send_wr(&mut send_wr, &mut send_sge, then_list.as_ref());
                send_wr.__bindgen_anon_1.wr_cqe = cqe;
                send_wr.send_flags |= bindings::ib_send_flags_IB_SEND_SIGNALED;
                &raw mut send_wr
            }
            None => ptr::null_mut(),
        };
        let (mut first, mut refused) = (ptr::null(), ptr::null());
        // Every WRITE of the transfer signaled where the device would send
        // the unsignaled ones from the buffer's pages after the transfer
        // came back ([`Self::sends_unsignaled_from_pages`]); counted here.
        let mut signaled = 0u32;
        let write_cqe = if self.sends_unsignaled_from_pages() {
            (&raw const SIGNALED_WRITE_CQE).cast_mut()
        } else {
            ptr::null_mut()
        };
        // `cqe` (its `done` set) lives until the completion, which does not
        // free it before `posting` is cleared; the core chains the requests
        // (then `chain`, alive across the call with the SGE it names).  The
        // WRITEs signaled for iWARP complete on `SIGNALED_WRITE_CQE`, which
        // ignores them; each has a slot's CQ entry reserved.
        // SAFETY: `raw` is live under the lock, the context initialised on
        // it just above, `cqe` as said; `write_cqe` is NULL or the static
        // entry, which the core and the driver only read; `signaled` is a
        // live counter; both outputs are writable.
        let ret = unsafe {
            bindings::rdma_cm_rs_rw_ctx_post(
                work.ctx.get(),
                raw.as_ptr(),
                work.port,
                cqe,
                chain,
                write_cqe,
                &mut signaled,
                &mut first,
                &mut refused,
            )
        };
        {
            let _tracking = self.credits.posted.lock();
            work.posting.store(false, Ordering::Release);
            self.credits.post_done.notify_all();
        }
        if let Err(e) = self.post_outcome(raw, ret, first, refused) {
            self.credits.remove_send(entry);
            // SAFETY: The driver refused it: the QP does not own the
            // transfer.
            let mut work = unsafe { KBox::from_raw(leaked) };
            work.release();
            work.credit = None;
            return Err(work.refused(e));
        }
        self.signaled_writes
            .fetch_add(u64::from(signaled), Ordering::Relaxed);
        Ok(())
    }

    /// How many RDMA WRITEs of its R/W transfers the QP signaled only so
    /// that the device copies them (see [`Self::rdma_rw`]; 0 off iWARP).
    pub fn signaled_rw_writes(&self) -> u64 {
        self.signaled_writes.load(Ordering::Relaxed)
    }

    /// For a shutdown, before the owner destroys the QP: frees what the
    /// R/W transfers still outstanding hold of it (their registrations go
    /// back to its pool, their buffers are unmapped), which their
    /// completion can no longer do once it is gone.  Their buffers stay
    /// allocated until that completion, or the reclaim, hands them back.
    pub(super) fn release_rw_transfers(&self) {
        self.credits.release_rw(|entry| {
            // A tracked entry of the R/W queue is the `cqe` of a live
            // `RwWork` (its `cqe` field): it is freed only after its
            // completion stopped tracking it, under the lock held here.
            // SAFETY: By the above.
            let work = unsafe { &*kernel::container_of!(entry.0.as_ptr(), RwWork, cqe) };
            work.release();
        });
    }
}
