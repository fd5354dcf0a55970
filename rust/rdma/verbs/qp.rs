// SPDX-License-Identifier: GPL-2.0

//! Queue pairs ([`Qp`]): types and capabilities, creation by the owner of
//! their connection, posting sends and receives.

use super::{
    attachment::Attachment,
    buffer::{RecvBuffer, SendBuffer, SgeList},
    caps::{QpCaps, QpType, RW_SLOTS_PER_CTX},
    completion::{CompletionHandler, QpEvent},
    cq::Cq,
    credits::{Credit, PostedCqe, Signaling, WorkLedger, WrQueue},
    post_error::PostError,
    request::{post_recv_buffer, send_done},
    srq::Srq,
};
use crate::rdma::{
    ah::{UdDest, GRH_SIZE},
    bindings,
    device::{Device, Transport},
    owner::CallbackTarget,
    pd::Pd,
    sg::SgBuffer,
};
use core::{
    ptr::{self, NonNull},
    sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering},
};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

/// What a QP's owner does when the QP reports [`QpEvent::CommEstablished`]
/// (the CM level passes it to `rdma_notify`), before the handler hears of
/// it.
///
/// # Invariants
///
/// `notify(context)` may be called in any context, atomic included, while
/// the QP this was given to ([`Qp::prepare`]) exists.
pub(crate) struct CommEstNotify {
    notify: unsafe fn(*mut core::ffi::c_void),
    context: *mut core::ffi::c_void,
}

// SAFETY: By the type invariants `notify(context)` may be called from any
// context, so from any thread.
unsafe impl Send for CommEstNotify {}
// SAFETY: As above; the value is only read.
unsafe impl Sync for CommEstNotify {}

impl CommEstNotify {
    /// # Safety
    ///
    /// Calling `notify(context)` must be sound in any context, atomic
    /// included, as long as a QP created with the returned value exists.
    pub(crate) unsafe fn new(
        notify: unsafe fn(*mut core::ffi::c_void),
        context: *mut core::ffi::c_void,
    ) -> Self {
        // INVARIANT: By the safety requirements.
        Self { notify, context }
    }
}

/// What a QP's owner does with it whatever its completion handler type:
/// stop it, and attach it to the multicast groups it joins.
pub(crate) trait QpShutdown: Send + Sync {
    /// Stops posts, moves the QP to the error state and waits, at most
    /// [`FLUSH_TIMEOUT`], until the driver has flushed every outstanding
    /// work request through the completion handler, handing buffers and
    /// regions back, and detaches it from its multicast groups.  The live
    /// QP if there was one, which the caller must destroy next (and nobody
    /// else may use), then call [`QpShutdown::reclaim`].  Only the first
    /// call does anything.
    fn shutdown(&self) -> Option<NonNull<bindings::ib_qp>>;
    /// After the caller destroyed the QP that [`QpShutdown::shutdown`]
    /// stopped: completes the requests the driver did not flush as flushed,
    /// once the CQ has delivered whatever the driver queued before the
    /// destruction.  Runs the completion handler in the caller's context.
    fn reclaim(&self);
    /// The QP's number.
    fn qp_num(&self) -> u32;
    /// See [`Qp::attach_multicast`].
    fn attach_multicast(&self, group: Attachment) -> Result;
    /// See [`Qp::detach_multicast`].
    fn detach_multicast(&self, group: Attachment) -> Result;
}

/// Where a QP's completions go and its receives come from (see
/// [`Qp::prepare`]).
pub(crate) struct QpQueues<'a, C: CompletionHandler> {
    /// The CQ of the send queue's completions (and of the QP's events).
    pub(crate) send_cq: &'a Arc<Cq<C>>,
    /// The CQ of the receives' completions (also of those from `srq`).
    pub(crate) recv_cq: &'a Arc<Cq<C>>,
    /// The shared receive queue the QP takes its receives from, if any.
    pub(crate) srq: Option<&'a Arc<Srq<C>>>,
}

/// A queue pair: reliable connected or unreliable datagram.
///
/// # Invariants
///
/// * `raw` holds the live QP from `Qp::set_created` until
///   `QpShutdown::shutdown` takes it; it was created on `pd` with
///   `send_cq` and `recv_cq` (which may be one CQ), of type `qp_type`.
/// * The object owns a reservation of `send_room` entries on `send_cq` and
///   of `recv_room` on `recv_cq`.
/// * With `srq`, the QP takes its receives from it (and has no receive
///   queue of its own), and the object holds one of the SRQ's attachments
///   of `recv_cq` (`Srq::attach_cq`).
#[pin_data(PinnedDrop)]
pub struct Qp<C: CompletionHandler> {
    #[pin]
    pub(super) raw: Mutex<Option<NonNull<bindings::ib_qp>>>,
    qp_type: QpType,
    qp_num: AtomicU32,
    /// UD: the QP's Q_Key and port, read once created.
    qkey: AtomicU32,
    pub(super) port_num: AtomicU32,
    pub(super) send_room: u32,
    pub(super) recv_room: u32,
    max_inline_data: u32,
    /// The entries one send, and one receive, may have.
    pub(super) max_send_sge: u32,
    max_recv_sge: u32,
    pub(super) credits: Arc<WorkLedger>,
    pd: Arc<Pd>,
    pub(super) send_cq: Arc<Cq<C>>,
    pub(super) recv_cq: Arc<Cq<C>>,
    /// The owner's part in [`QpEvent::CommEstablished`].
    comm_est: Option<CommEstNotify>,
    /// The shared receive queue the QP takes its receives from.
    pub(super) srq: Option<Arc<Srq<C>>>,
    /// With `srq`: the address of the `ib_qp` the SRQ knows the QP by (0
    /// until created).
    pub(super) srq_key: AtomicUsize,
    /// RDMA WRITEs of R/W transfers posted signaled only for siw's sake
    /// (see [`Self::rdma_rw`]).
    pub(super) signaled_writes: AtomicU64,
    /// UD: the multicast groups the QP is attached to (taken before
    /// `raw`'s lock, never inside it).
    #[pin]
    pub(super) multicast: Mutex<KVec<Attachment>>,
    /// Counted while the C side may call into the module through this
    /// object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

// SAFETY: Posting is serialised by `raw`'s mutex; the pointer is only used
// under it.
unsafe impl<C: CompletionHandler> Send for Qp<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Qp<C> {}

impl<C: CompletionHandler> Qp<C> {
    /// Checks that `pd` and the CQs live on `dev` (`EXDEV`) and that the
    /// CQs have room for `caps` and the spare entries (`ENOSPC`): one CQ
    /// for both queues needs [`QpCaps::cq_entries`], a send CQ apart
    /// [`QpCaps::send_cq_entries`] and a receive CQ apart
    /// [`QpCaps::recv_cq_entries`].  With `srq`, the QP takes its
    /// receives from it: an RC QP (`EOPNOTSUPP`) of the SRQ's PD
    /// (`EINVAL`, `EXDEV`) with no receives of its own in `caps`
    /// (`EINVAL`), whose receive CQ has room for the SRQ's
    /// ([`Srq::attach_cq`]).  Reserves that room, and returns a QP
    /// object not created yet with the attributes to create it with
    /// (`qp_type`, one SGE a request, one spare slot a queue, completions
    /// only for the requests that ask for one, and the
    /// object as the context of the QP's events, which go to `comm_est` and
    /// the send CQ's handler).  The QP created from them must be destroyed
    /// while the object lives ([`Qp::set_created`]).
    pub(crate) fn prepare(
        dev: &Device,
        pd: &Arc<Pd>,
        queues: QpQueues<'_, C>,
        caps: QpCaps,
        qp_type: QpType,
        comm_est: Option<CommEstNotify>,
    ) -> Result<(Arc<Self>, bindings::ib_qp_init_attr)> {
        let QpQueues {
            send_cq,
            recv_cq,
            srq,
        } = queues;
        dev.check_same(pd.device())?;
        dev.check_same(send_cq.device())?;
        dev.check_same(recv_cq.device())?;
        if let Some(srq) = srq {
            dev.check_same(srq.pd.device())?;
            if qp_type != QpType::Rc {
                return Err(EOPNOTSUPP);
            }
            if !Arc::ptr_eq(&srq.pd, pd) || caps.max_recv_wr != 0 || caps.max_recv_sge > 1 {
                return Err(EINVAL);
            }
        }
        // Each queue's room on its CQ; one CQ for both takes the sum,
        // `cq_entries`.  A QP on an SRQ has no receive queue of its own:
        // the SRQ reserves room for its receives on each CQ it completes
        // on, once.
        let send_room = caps.send_cq_entries()?;
        let recv_room = if srq.is_some() {
            0
        } else {
            caps.recv_cq_entries()?
        };
        let mut attr: bindings::ib_qp_init_attr = pin_init::zeroed();
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.qp_type = qp_type as u32;
        // Each request says whether it wants a completion: every one the
        // layer posts does, except the sends the caller made unsignaled.
        attr.sq_sig_type = bindings::ib_sig_type_IB_SIGNAL_REQ_WR;
        if qp_type != QpType::Rc && caps.max_rdma_ctxs != 0 {
            return Err(EINVAL);
        }
        // The core adds one slot per R/W context, or three on devices that
        // register for it (`rdma_rw_init_qp`, which would also cut the
        // queue down to the device's limit): the QP's own part makes it
        // three either way, and the whole must fit the device.
        let rw_extra = caps
            .max_rdma_ctxs
            .checked_mul(RW_SLOTS_PER_CTX - 1)
            .ok_or(EINVAL)?;
        attr.cap.max_send_wr = caps
            .max_send_wr
            .checked_add(1)
            .and_then(|n| n.checked_add(rw_extra))
            .ok_or(EINVAL)?;
        if caps.send_cq_entries()? > dev.caps().max_qp_wr {
            return Err(EINVAL);
        }
        attr.cap.max_send_sge = caps.max_send_sge.max(1);
        attr.cap.max_rdma_ctxs = caps.max_rdma_ctxs;
        attr.cap.max_inline_data = caps.max_inline_data;
        if let Some(srq) = srq {
            attr.srq = srq.as_ptr();
        } else {
            attr.cap.max_recv_wr = caps.max_recv_wr.checked_add(1).ok_or(EINVAL)?;
            attr.cap.max_recv_sge = caps.max_recv_sge.max(1);
        }
        let credits = WorkLedger::new(caps, false)?;
        let target = CallbackTarget::new(pd.owner())?;
        send_cq.reserve(send_room)?;
        if let Err(e) = recv_cq.reserve(recv_room) {
            send_cq.release(send_room);
            return Err(e);
        }
        if let Some(srq) = srq {
            if let Err(e) = srq.attach_cq(recv_cq) {
                send_cq.release(send_room);
                recv_cq.release(recv_room);
                return Err(e);
            }
        }
        let release = || {
            send_cq.release(send_room);
            recv_cq.release(recv_room);
            if let Some(srq) = srq {
                srq.detach_cq(recv_cq);
            }
        };
        // INVARIANT: Not created yet; the reservations are owned from here.
        let qp = Arc::pin_init(
            pin_init!(Self {
                raw <- new_mutex!(None),
                qp_type,
                qp_num: AtomicU32::new(0),
                qkey: AtomicU32::new(0),
                port_num: AtomicU32::new(0),
                send_room,
                recv_room,
                max_inline_data: caps.max_inline_data,
                max_send_sge: caps.max_send_sge.max(1),
                max_recv_sge: caps.max_recv_sge.max(1),
                credits,
                pd: pd.clone(),
                send_cq: send_cq.clone(),
                recv_cq: recv_cq.clone(),
                comm_est,
                srq: srq.cloned(),
                srq_key: AtomicUsize::new(0),
                signaled_writes: AtomicU64::new(0),
                multicast <- new_mutex!(KVec::new()),
                _target: target,
            }),
            GFP_KERNEL,
        );
        match qp {
            Ok(qp) => {
                attr.event_handler = Some(qp_event_callback::<C>);
                attr.qp_context = Arc::as_ptr(&qp).cast_mut().cast();
                Ok((qp, attr))
            }
            Err(e) => {
                release();
                Err(e)
            }
        }
    }

    /// Records the QP its owner created from [`Self::prepare`]'s attributes
    /// (on a UD QP, after reading its Q_Key and port: an error leaves it
    /// unrecorded).
    ///
    /// # Safety
    ///
    /// `raw` must be a live QP created from those attributes (on this
    /// object's PD and CQ, with this object as the context of its events),
    /// which its owner destroys only after [`QpShutdown::shutdown`]
    /// returned it, or at once if this fails (nothing was posted to it,
    /// nothing else knows it), and in either case while it still holds a
    /// reference to this object.
    pub(crate) unsafe fn set_created(&self, raw: NonNull<bindings::ib_qp>) -> Result {
        // SAFETY: `raw` is live by the safety requirements.
        let num = unsafe { (*raw.as_ptr()).qp_num };
        self.qp_num.store(num, Ordering::Release);
        self.credits.qp_num.store(num, Ordering::Release);
        // SAFETY: As above; the CM created it on the id's port, which the
        // R/W API needs, and nothing modifies it yet.
        let port = unsafe { (*raw.as_ptr()).port };
        self.port_num.store(port, Ordering::Release);
        if let Some(srq) = &self.srq {
            // Before anything can arrive: the CM moves the QP to RTR only
            // once its owner has it.
            let key = raw.as_ptr() as usize;
            srq.credits.join(key, num, self.credits.clone())?;
            self.srq_key.store(key, Ordering::Release);
        }
        if self.qp_type == QpType::Ud {
            let (mut qkey, mut port_num) = (0u32, 0u32);
            // SAFETY: `raw` is live; both outputs are writable for the call
            // (`ib_query_qp`, process context).
            kernel::error::to_result(unsafe {
                bindings::rdma_cm_rs_query_ud_qp(raw.as_ptr(), &mut qkey, &mut port_num)
            })?;
            self.qkey.store(qkey, Ordering::Release);
            self.port_num.store(port_num, Ordering::Release);
        }
        // INVARIANT: By the safety requirements.
        *self.raw.lock() = Some(raw);
        Ok(())
    }

    /// The QP's type.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }

    /// UD QPs: the Q_Key datagrams to this QP must carry.
    pub fn qkey(&self) -> u32 {
        self.qkey.load(Ordering::Acquire)
    }

    /// UD QPs: the largest datagram a send may carry, the port's active
    /// MTU now (a RoCE port's follows its netdev's, which may change); 0 on
    /// RC QPs or when the port cannot be queried.  Sleeps.
    pub fn max_datagram(&self) -> usize {
        if self.qp_type != QpType::Ud {
            return 0;
        }
        let port = self.port_num.load(Ordering::Acquire);
        self.device()
            .port_active_mtu(port)
            .map_or(0, |mtu| mtu as usize)
    }

    /// `EOPNOTSUPP` unless the QP is of type `want`.
    /// Makes the requests that reach the peer (SEND, RDMA READ and WRITE)
    /// fail with `EAGAIN` until a message from the peer completed a
    /// receive: the passive side of an iWARP connection must not send
    /// before the active side did (`rdma_connect(3)`; MPA, RFC 5044).
    /// Registrations and invalidations stay local and are not held.
    pub(crate) fn hold_sends_until_first_message(&self) {
        self.credits
            .awaiting_first_message
            .store(true, Ordering::Release);
    }

    /// Whether requests to the peer are held until its first message (the
    /// passive side of an iWARP connection before the first receive
    /// completed): [`Self::post_send`] and [`Self::rdma`] fail with `EAGAIN`
    /// meanwhile.  A peer's RDMA WRITE completes no receive and does not
    /// count.
    pub fn awaits_first_message(&self) -> bool {
        self.credits.awaiting_first_message.load(Ordering::Acquire)
    }

    pub(super) fn check_peer_spoke(&self) -> Result {
        if self.awaits_first_message() {
            Err(EAGAIN)
        } else {
            Ok(())
        }
    }

    /// What a post that returned `ret` on `raw` (under the QP's lock)
    /// means for the chain of requests starting at `first`, the driver
    /// naming `refused` as the first it did not take: `Err` only when it
    /// took none of them, which the caller then owns again.  A driver may
    /// fail a post after taking the requests, without naming one (siw
    /// queues a READ, then fails to start it on a connection that
    /// negotiated no initiator depth), or after taking the first ones of a
    /// chain: those requests are the driver's, and it may reach their
    /// memory.  They stay tracked, the QP goes to the error state, where
    /// the driver flushes what it holds (what it never completes is
    /// reclaimed at the teardown), and the post reports success.
    pub(super) fn post_outcome<T>(
        &self,
        raw: NonNull<bindings::ib_qp>,
        ret: i32,
        first: *const T,
        refused: *const T,
    ) -> Result {
        if ret == 0 {
            return Ok(());
        }
        if ptr::eq(first, refused) {
            return Err(Error::from_errno(ret));
        }
        pr_warn!(
            "QP {}: the driver failed a post ({}) after taking it; moving the QP to the error state\n",
            self.qp_num(),
            ret
        );
        // SAFETY: `raw` is live under the QP's lock, which the caller holds.
        let _ = unsafe { bindings::rdma_cm_rs_modify_qp_err(raw.as_ptr()) };
        Ok(())
    }

    /// What a SEND of `buf` on this RC QP needs: a buffer of its PD
    /// (`EXDEV`, `EINVAL`), one opcode (immediate data or an invalidation,
    /// not both: `EINVAL`), inline bytes within the QP's limit
    /// (`EMSGSIZE`).
    pub(super) fn check_send(&self, buf: &SendBuffer) -> Result {
        self.check_pd(&buf.0.pd)?;
        Self::check_one_opcode(buf)?;
        self.check_inline(buf)
    }

    /// A SEND carries immediate data or an invalidation, not both
    /// (`EINVAL`).
    fn check_one_opcode(buf: &SendBuffer) -> Result {
        if buf.0.imm.is_some() && buf.0.invalidate.is_some() {
            return Err(EINVAL);
        }
        Ok(())
    }

    /// An inline send fits the QP's inline limit (`EMSGSIZE`) and has no
    /// pages, which the driver would not copy (`EINVAL`).
    fn check_inline(&self, buf: &SendBuffer) -> Result {
        if buf.0.inline && buf.0.pages.is_some() {
            return Err(EINVAL);
        }
        if buf.0.inline && buf.0.len > self.max_inline_data as usize {
            return Err(EMSGSIZE);
        }
        Ok(())
    }

    /// Whether the device may transmit an unsignaled request from its
    /// pages after a later request completed: on iWARP, where siw sends an
    /// unsignaled request of a page or more straight from its pages
    /// (`MSG_SPLICE_PAGES`), and TCP may retransmit from them after a later
    /// signaled request completed, which would hand them back to be
    /// rewritten too early.  A signaled request is copied.
    pub(super) fn sends_unsignaled_from_pages(&self) -> bool {
        self.device().transport() == Transport::Iwarp
    }

    /// Whether a send of `len` bytes from its buffer, with pages (`list`)
    /// or not, must be signaled whatever its buffer asks
    /// ([`Self::sends_unsignaled_from_pages`]): one with pages, and one
    /// whose buffer is a page or more (siw's `SENDPAGE_THRESH`; a buffer
    /// above 8 KiB is not slab memory, which siw would copy, but pages of
    /// their own that it splices).  Its own completion then hands the
    /// memory back, once TCP has let go of it.
    pub(super) fn signals_pages(&self, len: usize, list: Option<&SgeList>) -> bool {
        (list.is_some() || len >= kernel::page::PAGE_SIZE) && self.sends_unsignaled_from_pages()
    }

    pub(super) fn check_type(&self, want: QpType) -> Result {
        if self.qp_type == want {
            Ok(())
        } else {
            Err(EOPNOTSUPP)
        }
    }

    /// A destination back to the sender of a datagram this QP received:
    /// an address handle on the QP's PD (made from the receive's
    /// completion and global route header; sleeps), the sender's QP number
    /// and this QP's Q_Key (a UD service answers with its own).  `EINVAL`
    /// if the buffer holds no datagram or is of another PD, `EXDEV` of
    /// another device.
    pub fn reply_dest(&self, buf: &RecvBuffer) -> Result<UdDest> {
        self.check_type(QpType::Ud)?;
        self.check_pd(&buf.0.pd)?;
        let datagram = buf.datagram().ok_or(EINVAL)?;
        // SAFETY: The port was read from this live UD QP (`set_created`):
        // a port of its device, the PD's.
        let ah = unsafe { datagram.reply_ah(&self.pd, self.port_num.load(Ordering::Acquire)) }?;
        UdDest::new(ah, datagram.src_qp(), self.qkey(), datagram.src_gid())
    }

    /// The PD's device.
    pub fn device(&self) -> &Device {
        self.pd.device()
    }

    /// The QP's PD: buffers and regions posted to it must be of this one.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// `EXDEV` for a PD of another device, `EINVAL` for another PD of the
    /// same device.
    pub(super) fn check_pd(&self, pd: &Arc<Pd>) -> Result {
        self.device().check_same(pd.device())?;
        if Arc::ptr_eq(&self.pd, pd) {
            Ok(())
        } else {
            Err(EINVAL)
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num.load(Ordering::Acquire)
    }

    /// Posts one send-queue work request that `fill` completes from a
    /// zeroed one (returning the request to post, which may embed it) while
    /// the QP is locked.  Under the lock, the request's completion entry
    /// `cqe` is tracked through `credit` before the post, and untracked if
    /// the post fails: a shutdown (which takes the QP under that lock) can
    /// therefore never reclaim a request that was not posted.
    ///
    /// # Safety
    ///
    /// `cqe` and `credit` must point into one object leaked by the caller,
    /// live until the request's completion or, if this fails, until the
    /// caller recovers it; `cqe.done` must be set.  The request `fill`
    /// returns must be one of the QP's type, and what it points to must
    /// live across the call (an address handle it names until the
    /// request's completion).
    pub(super) unsafe fn post_send_raw(
        &self,
        cqe: *mut bindings::ib_cqe,
        credit: *mut Credit,
        signaled: bool,
        fill: impl FnOnce(&mut bindings::ib_send_wr) -> *const bindings::ib_send_wr,
    ) -> Result {
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err(ENOTCONN);
        };
        // SAFETY: By the safety requirements; nothing else refers to the
        // credit, a field apart from `cqe`.
        let credit = unsafe { &mut *credit };
        // SAFETY: By the safety requirements, a live entry.
        let entry = PostedCqe(unsafe { NonNull::new_unchecked(cqe) }, WrQueue::Send);
        credit.track(entry.0);
        let signaled = signaled || self.credits.leaves_under_two_send_credits();
        // Only sends are posted unsignaled through here.
        self.credits.push_send(
            entry,
            if signaled {
                Signaling::Signaled
            } else {
                Signaling::UnsignaledSend
            },
        );
        let mut wr: bindings::ib_send_wr = pin_init::zeroed();
        wr.__bindgen_anon_1.wr_cqe = cqe;
        if signaled {
            wr.send_flags = bindings::ib_send_flags_IB_SEND_SIGNALED;
        }
        let wr = fill(&mut wr);
        // A request of the QP's type (on UD an `ib_ud_wr` naming a live
        // address handle), alive with what it points to across the call;
        // the driver copies it.  `raw` is live under the lock.
        let mut refused = ptr::null();
        // SAFETY: As above; `refused` is writable for the call.
        let posted = unsafe { bindings::ib_post_send(raw.as_ptr(), wr, &mut refused) };
        let ret = self.post_outcome(raw, posted, wr, refused);
        if ret.is_err() {
            self.credits.remove_send(entry);
            credit.untrack();
        }
        ret
    }
}

impl<C: CompletionHandler> Qp<C> {
    /// Posts a receive of the buffer's full capacity.  On failure the buffer
    /// comes back with the error: `EXDEV`/`EINVAL` for a buffer of another
    /// device or PD, `ENOSPC` with `max_recv_wr` receives in flight,
    /// `ENOTCONN` once the QP is shut down, `EOPNOTSUPP` on a QP that takes
    /// its receives from a [`Srq`] (post them there).
    pub fn post_recv(&self, buf: RecvBuffer) -> Result<(), PostError<RecvBuffer>> {
        if self.srq.is_some() {
            return Err(PostError::new(EOPNOTSUPP, buf));
        }
        if let Err(e) = self.check_pd(&buf.0.pd) {
            return Err(PostError::new(e, buf));
        }
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err(PostError::new(ENOTCONN, buf));
        };
        let on_ud = self.qp_type == QpType::Ud;
        // A datagram's global route header comes first in the scatter
        // list, and the completion reads it from the buffer: the buffer
        // holds all of it, and room for payload after it or in pages.
        if on_ud {
            let least = if buf.0.pages.is_some() {
                GRH_SIZE
            } else {
                GRH_SIZE + 1
            };
            if buf.0.data.len() < least {
                return Err(PostError::new(EINVAL, buf));
            }
        }
        // Tracked under the QP's lock, before the post (the completion may
        // run before it returns); a failure untracks it, still under the
        // lock: a shutdown never reclaims a receive that was not posted.
        post_recv_buffer::<C>(buf, &self.credits, on_ud, self.max_recv_sge, |wr| {
            let mut refused = ptr::null();
            // SAFETY: `raw` is live under the lock; the request and its SGE
            // live across the call; `refused` is writable for it.
            let ret = unsafe { bindings::ib_post_recv(raw.as_ptr(), wr, &mut refused) };
            self.post_outcome(raw, ret, wr, refused)
        })
    }

    /// Posts a SEND (or SEND_WITH_IMM, see [`SendBuffer::set_imm`], or
    /// SEND_WITH_INV, see [`SendBuffer::set_invalidate`]) of the buffer's
    /// contents (signaled) on an RC QP.  On failure the buffer comes back
    /// with the error: `EINVAL` for both immediate data and an
    /// invalidation, `EOPNOTSUPP` on a UD QP (see
    /// [`Self::post_send_ud`]), `EXDEV`/`EINVAL` for a buffer of another
    /// device or PD, `ENOSPC` with `max_send_wr` requests in flight,
    /// `ENOTCONN` once the QP is shut down, `EAGAIN` on the passive side of
    /// an iWARP connection before the peer's first message
    /// ([`Self::awaits_first_message`]).
    pub fn post_send(&self, buf: SendBuffer) -> Result<(), PostError<SendBuffer>> {
        if let Err(e) = self
            .check_type(QpType::Rc)
            .and_then(|()| Self::check_one_opcode(&buf))
        {
            return Err(PostError::new(e, buf));
        }
        self.post_send_to(buf, None)
    }

    /// Posts one datagram (SEND or SEND_WITH_IMM, signaled) of the buffer's
    /// contents to `dest` on a UD QP; the request holds `dest` until its
    /// completion.  Errors as [`Self::post_send`], and `EOPNOTSUPP` on an
    /// RC QP, `EXDEV`/`EINVAL` for an address handle of another device or
    /// PD, `EMSGSIZE` above [`Self::max_datagram`] (the buffer's bytes and
    /// its attached pages together).
    pub fn post_send_ud(
        &self,
        buf: SendBuffer,
        dest: &UdDest,
    ) -> Result<(), PostError<SendBuffer>> {
        if let Err(e) = self
            .check_type(QpType::Ud)
            .and_then(|()| self.check_pd(dest.ah.pd()))
        {
            return Err(PostError::new(e, buf));
        }
        let paged = buf.0.pages.as_ref().map_or(0, SgBuffer::len);
        if buf.0.len.saturating_add(paged) > self.max_datagram() {
            return Err(PostError::new(EMSGSIZE, buf));
        }
        // A datagram invalidates nothing (SEND_WITH_INV is RC only).
        if buf.0.invalidate.is_some() {
            return Err(PostError::new(EOPNOTSUPP, buf));
        }
        // Selective signaling is for RC: the shutdown's marker, which
        // gives back unsignaled sends, is an RDMA WRITE.
        if buf.0.unsignaled {
            return Err(PostError::new(EINVAL, buf));
        }
        self.post_send_to(buf, Some(dest.clone()))
    }

    fn post_send_to(
        &self,
        buf: SendBuffer,
        dest: Option<UdDest>,
    ) -> Result<(), PostError<SendBuffer>> {
        if let Err(e) = self
            .check_pd(&buf.0.pd)
            .and_then(|()| self.check_peer_spoke())
            .and_then(|()| self.check_inline(&buf))
        {
            return Err(PostError::new(e, buf));
        }
        let credit = match self.credits.take(WrQueue::Send) {
            Ok(credit) => credit,
            Err(e) => return Err(PostError::new(e, buf)),
        };
        let mut inner = buf.0;
        let head_len = inner.len;
        let list = match inner.map_pages(head_len, self.max_send_sge) {
            Ok(list) => list,
            Err(e) => return Err(PostError::new(e, SendBuffer(inner))),
        };
        let mut sge = bindings::ib_sge::default();
        let mut send_wr: bindings::ib_send_wr = pin_init::zeroed();
        inner.prepare_send(
            credit,
            send_done::<C>,
            &mut send_wr,
            &mut sge,
            list.as_ref(),
        );
        let unsignaled = inner.unsignaled && !self.signals_pages(inner.len, list.as_ref());
        // The request keeps the address handle; a copy of its fields goes
        // into the work request.
        let ud = dest.as_ref().map(|d| (d.ah.as_ptr(), d.qp_num, d.qkey));
        inner.dest = dest;
        let leaked = KBox::into_raw(inner);
        // SAFETY: `leaked` is live until its completion or the failure
        // below; the credit, set above, is a field apart from the entry.
        let (cqe, credit) = unsafe {
            (
                &raw mut (*leaked).cqe,
                (*leaked)
                    .credit
                    .as_mut()
                    .map_or(ptr::null_mut(), ptr::from_mut),
            )
        };
        // The UD form of the request, filled in below on UD QPs.  The bytes
        // of an inline send are read through `sge` during the post, from
        // `leaked`'s data, which lives until the completion.
        let mut ud_wr: bindings::ib_ud_wr = pin_init::zeroed();
        // SAFETY: Both point into `leaked`, recovered below on failure; its
        // `done` is set.  The address handle `ud` names is held by the
        // request (`dest`) until its completion.
        let ret = unsafe {
            self.post_send_raw(cqe, credit, !unsignaled, |wr| {
                // The SEND's fields, on the entry and flags set already.
                wr.sg_list = send_wr.sg_list;
                wr.num_sge = send_wr.num_sge;
                wr.opcode = send_wr.opcode;
                wr.ex = send_wr.ex;
                wr.send_flags |= send_wr.send_flags;
                match ud {
                    Some((ah, remote_qpn, remote_qkey)) => {
                        ud_wr.wr = *wr;
                        ud_wr.ah = ah;
                        ud_wr.remote_qpn = remote_qpn;
                        ud_wr.remote_qkey = remote_qkey;
                        // The whole request: the driver reaches the UD
                        // fields from `wr` (`ud_wr()`, container_of).
                        (&raw const ud_wr).cast()
                    }
                    None => wr,
                }
            })
        };
        if let Err(e) = ret {
            // SAFETY: The post failed: the QP does not own the buffer.
            let mut inner = unsafe { KBox::from_raw(leaked) };
            inner.credit = None;
            inner.dest = None;
            return Err(PostError::new(e, SendBuffer::back(inner)));
        }
        Ok(())
    }
}

/// The `event_handler` of every QP of this layer.
///
/// # Safety
///
/// Called by the IB core only, for a QP created from the attributes of
/// [`Qp::prepare`] for a `Qp<C>`: `context` is that object, which lives
/// until after the QP is destroyed (the safety requirements of
/// [`Qp::set_created`]), and no event comes after the destruction.
unsafe extern "C" fn qp_event_callback<C: CompletionHandler>(
    event: *mut bindings::ib_event,
    context: *mut core::ffi::c_void,
) {
    // SAFETY: `context` is the live `Qp<C>` (the function's safety
    // requirements).
    let qp = unsafe { &*context.cast::<Qp<C>>() };
    // SAFETY: The IB core passes a valid event for the call.
    let event = QpEvent::from_raw(unsafe { (*event).event });
    if event == QpEvent::CommEstablished {
        if let Some(n) = &qp.comm_est {
            // SAFETY: The QP exists (an event of it is being reported), so
            // by `CommEstNotify`'s invariants the call is sound here.
            unsafe { (n.notify)(n.context) };
        }
    }
    qp.send_cq.handler().qp_event(qp.qp_num(), event);
}
