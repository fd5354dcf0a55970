// SPDX-License-Identifier: GPL-2.0

//! Shared receive queues ([`Srq`]) and their events.

use super::{
    buffer::{Buffer, RecvBuffer},
    caps::QpCaps,
    completion::CompletionHandler,
    cq::Cq,
    credits::WorkLedger,
    post_error::PostError,
    request::post_recv_buffer,
};
use crate::rdma::{bindings, owner::CallbackTarget, pd::Pd};
use core::{
    ptr::{self, NonNull},
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

/// A shared receive queue (`ib_create_srq`, basic): receive buffers posted
/// once for every RC QP attached to it, each message taking the next one
/// whichever QP it arrives on, so that a server sizes its receives by its
/// load rather than by its connections.
///
/// A QP is attached at its creation (`CmId::create_qp_on_srq`), and holds
/// the SRQ: the SRQ outlives every QP on it.  A receive completes on the
/// receive CQ of the QP that took it, to that CQ's handler (of the same
/// `C`, which the types make sure of), and [`RecvBuffer::qp_num`] names
/// the QP.  The SRQ reserves room for all its receives on each CQ its QPs
/// receive on, once however many QPs share that CQ: no CQ can overflow
/// with them.
///
/// A posted buffer is the SRQ's until its completion hands it to a
/// handler.  A QP's shutdown flushes only its own queue: the receives
/// still posted stay with the SRQ for the other QPs, and one that a QP had
/// begun to fill when it failed may never complete (a driver may drop it):
/// that buffer, and its place among the SRQ's `max_wr`, stay taken until
/// the SRQ goes ([`Srq::posted`] counts it).  The SRQ's destruction,
/// after its last QP's, frees the buffers still posted without a
/// completion: nothing can reach them any more.
///
/// # Invariants
///
/// * Once set by the constructor (and whenever the object is
///   reachable), `raw` is a live SRQ on `pd`, of at least `max_wr`
///   receives of at least `max_sge` scatter entries each, whose events'
///   context is `sink`, until the object is dropped.
/// * `sink` is a live `SrqEventSink` leaked by the constructor, freed by
///   the drop only once the SRQ is destroyed (one whose destruction failed
///   keeps it, and the module's code with its count of callback targets).
/// * `credits` (shared) counts and tracks every buffer posted to it whose
///   completion has not run, at most `max_wr`, and records the QPs
///   created on it that still exist.
/// * `recv_cqs` holds each CQ that a QP on the SRQ receives on, with the
///   number of such QPs; the object owns a reservation of `max_wr` entries
///   on each.
#[pin_data(PinnedDrop)]
pub struct Srq<C: CompletionHandler> {
    raw: AtomicPtr<bindings::ib_srq>,
    max_wr: u32,
    max_sge: u32,
    pub(super) credits: Arc<WorkLedger>,
    pub(super) pd: Arc<Pd>,
    #[pin]
    recv_cqs: Mutex<KVec<(Arc<Cq<C>>, u32)>>,
    /// The context of the SRQ's events.
    sink: NonNull<SrqEventSink>,
}

/// The context of an [`Srq`]'s events, apart from it: an SRQ whose
/// destruction failed stays registered with the driver, and keeps this
/// (and the module's code) while the `Srq` itself goes.
struct SrqEventSink {
    /// Who hears of the SRQ's events.
    events: Option<Arc<dyn SrqEvents>>,
    /// Counted while the C side may call into the module through this
    /// object (see [`CallbackTarget`]).
    _target: CallbackTarget,
}

/// What an [`Srq`] is made for ([`Srq::with_caps`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SrqCaps {
    /// Receives posted at once: `1..=` the device's `max_srq_wr`.
    pub max_wr: u32,
    /// Scatter entries one receive carries (its buffer, then each entry of
    /// its attached pages, [`RecvBuffer::attach_pages`]), at most the
    /// device's `max_srq_sge`; 0 means 1.
    pub max_sge: u32,
}

/// An asynchronous event of a shared receive queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SrqEvent {
    /// `IB_EVENT_SRQ_LIMIT_REACHED`: fewer receives are posted than the
    /// limit [`Srq::arm_limit`] armed (which it disarmed).
    LimitReached,
    /// `IB_EVENT_SRQ_ERR`: the SRQ failed; its QPs are in error.
    Error,
    /// Another event code a driver reported for the SRQ.
    Other(u32),
}

/// Hears a [`Srq`]'s events ([`Srq::with_events`]).
pub trait SrqEvents: Send + Sync {
    /// The event.  Runs in the driver's context, which may be atomic (a
    /// driver may report the limit under the SRQ's lock): it
    /// must not sleep, take a `Mutex`, post or drop the SRQ; a ULP that
    /// refills records the event and refills from process context.
    fn srq_event(&self, event: SrqEvent);
}

// SAFETY: Drivers serialise posts to an SRQ themselves (rxe's producer
// lock, siw's SRQ lock), from any thread; the rest is immutable or locked.
unsafe impl<C: CompletionHandler> Send for Srq<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Srq<C> {}

impl<C: CompletionHandler> Srq<C> {
    /// Creates an SRQ for `max_wr` receives in flight on `pd`.  `EINVAL`
    /// for 0 or more than the device's `max_srq_wr`
    /// ([`crate::rdma::device::DeviceCaps`]), `EOPNOTSUPP` on a device without
    /// SRQs.
    pub fn new(pd: &Arc<Pd>, max_wr: u32) -> Result<Arc<Self>> {
        Self::with_caps(pd, SrqCaps { max_wr, max_sge: 1 }, None)
    }

    /// [`Self::new`], the SRQ's events to `events`.
    pub fn with_events(pd: &Arc<Pd>, max_wr: u32, events: Arc<dyn SrqEvents>) -> Result<Arc<Self>> {
        Self::with_caps(pd, SrqCaps { max_wr, max_sge: 1 }, Some(events))
    }

    /// An SRQ of `caps`, its events to `events` if any: with `max_sge`
    /// above 1 its receives scatter into attached pages.  `EINVAL` for a
    /// depth as [`Self::new`] refuses, or more entries than the device's
    /// `max_srq_sge`.
    pub fn with_caps(
        pd: &Arc<Pd>,
        caps: SrqCaps,
        events: Option<Arc<dyn SrqEvents>>,
    ) -> Result<Arc<Self>> {
        let (max_wr, max_sge) = (caps.max_wr, caps.max_sge.max(1));
        let dev = pd.device().caps();
        if dev.max_srq == 0 {
            return Err(EOPNOTSUPP);
        }
        if max_wr == 0 || max_wr > dev.max_srq_wr || max_sge > dev.max_srq_sge {
            return Err(EINVAL);
        }
        let credits = WorkLedger::new(
            QpCaps {
                max_recv_wr: max_wr,
                ..QpCaps::default()
            },
            true,
        )?;
        // The context of the SRQ's events first.
        let sink = KBox::new(
            SrqEventSink {
                events,
                _target: CallbackTarget::new(pd.owner())?,
            },
            GFP_KERNEL,
        )?;
        // Freed by the drop, or below if the object cannot be made.
        let sink = NonNull::from(KBox::leak(sink));
        let srq = Arc::pin_init(
            pin_init!(Self {
                raw: AtomicPtr::new(ptr::null_mut()),
                max_wr,
                max_sge,
                credits,
                pd: pd.clone(),
                recv_cqs <- new_mutex!(KVec::new()),
                sink,
            }),
            GFP_KERNEL,
        )
        .inspect_err(|_| {
            // SAFETY: Leaked above, never handed to C: this is its owner.
            drop(unsafe { KBox::from_raw(sink.as_ptr()) });
        })?;
        let context = sink.as_ptr();
        // SAFETY: `pd` is live (held); `ib_create_srq` sleeps, as this may;
        // `context` (the sink) outlives the SRQ (the drop frees it only once
        // the SRQ is destroyed), and `srq_event_callback` is its handler.
        let raw = unsafe {
            bindings::rdma_cm_rs_create_srq(
                pd.as_ptr(),
                max_wr,
                max_sge,
                Some(srq_event_callback),
                context.cast(),
            )
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        // INVARIANT: Just created on `pd` for `max_wr` receives of
        // `max_sge` entries (drivers round up, never down); nothing posted
        // or attached yet.
        srq.raw.store(raw, Ordering::Release);
        Ok(srq)
    }

    /// Arms the SRQ's limit (`ib_modify_srq`, `IB_SRQ_LIMIT`): once fewer
    /// than `limit` receives are posted, the device reports
    /// [`SrqEvent::LimitReached`] once, and the limit is disarmed until
    /// armed again.  `EINVAL` unless `limit` is within `1..=max_wr`.
    pub fn arm_limit(&self, limit: u32) -> Result {
        if limit == 0 || limit > self.max_wr {
            return Err(EINVAL);
        }
        // SAFETY: Live SRQ (type invariants); `ib_modify_srq` may sleep,
        // as this may.
        kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_arm_srq_limit(self.as_ptr(), limit)
        })
    }

    /// Posts a receive of the buffer's full capacity (and its attached
    /// pages), for whichever QP on the SRQ takes the next message.  On
    /// failure the buffer comes back with the error: `EXDEV`/`EINVAL` for a
    /// buffer of another device or PD, `ENOSPC` with `max_wr` receives
    /// posted, `EMSGSIZE` for more scatter entries than
    /// [`SrqCaps::max_sge`].
    pub fn post_recv(&self, buf: RecvBuffer) -> Result<(), PostError<RecvBuffer>> {
        if let Err(e) = self.pd.device().check_same(buf.0.pd.device()) {
            return Err(PostError::new(e, buf));
        }
        if !Arc::ptr_eq(&self.pd, &buf.0.pd) {
            return Err(PostError::new(EINVAL, buf));
        }
        // Within the entries the SRQ was made for (`rdma_cm_rs_create_srq`).
        post_recv_buffer::<C>(buf, &self.credits, false, self.max_sge, |wr| {
            let (srq, mut refused) = (self.as_ptr(), ptr::null());
            // SAFETY: Live SRQ (type invariants); the request and its SGE
            // live across the call; drivers serialise concurrent posts;
            // `refused` is writable for the call.
            let ret = unsafe { bindings::ib_post_srq_recv(srq, wr, &mut refused) };
            // A buffer the driver may hold stays the SRQ's: its drop frees
            // it if no completion ever comes.
            if ret != 0 && ptr::eq(refused, wr) {
                Err(Error::from_errno(ret))
            } else {
                Ok(())
            }
        })
    }

    /// Receives the SRQ takes at once.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Receives posted whose completion has not reached a handler.
    pub fn posted(&self) -> u32 {
        self.credits.recv.load(Ordering::Acquire)
    }

    /// The SRQ's PD: its buffers and its QPs' must be of this one.
    pub fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    pub(super) fn as_ptr(&self) -> *mut bindings::ib_srq {
        self.raw.load(Ordering::Acquire)
    }

    /// For a QP created on the SRQ that receives on `cq`: room on `cq` for
    /// every receive of the SRQ (`ENOSPC`), reserved by the first such QP
    /// and released after the last ([`Self::detach_cq`]).
    pub(super) fn attach_cq(&self, cq: &Arc<Cq<C>>) -> Result {
        let mut cqs = self.recv_cqs.lock();
        if let Some(entry) = cqs.iter_mut().find(|(c, _)| Arc::ptr_eq(c, cq)) {
            entry.1 += 1;
            return Ok(());
        }
        cqs.reserve(1, GFP_KERNEL)?;
        cq.reserve(self.max_wr)?;
        // INVARIANT: Reserved just above.  Cannot fail: room reserved.
        Ok(cqs.push((cq.clone(), 1), GFP_KERNEL)?)
    }

    /// Undoes one [`Self::attach_cq`] of `cq`.
    pub(super) fn detach_cq(&self, cq: &Arc<Cq<C>>) {
        let mut cqs = self.recv_cqs.lock();
        let Some(i) = cqs.iter().position(|(c, _)| Arc::ptr_eq(c, cq)) else {
            return;
        };
        cqs[i].1 -= 1;
        if cqs[i].1 == 0 {
            // INVARIANT: The reservation goes with the entry.
            cq.release(self.max_wr);
            // In bounds: just found.
            let _ = cqs.remove(i);
        }
    }
}

#[pinned_drop]
impl<C: CompletionHandler> PinnedDrop for Srq<C> {
    fn drop(self: Pin<&mut Self>) {
        let raw = self.as_ptr();
        let sink = self.sink;
        // SAFETY: The sink the constructor leaked, which no SRQ names as
        // its events' context any more (none was created, or it was
        // destroyed): this is its owner.
        let free_sink = || drop(unsafe { KBox::from_raw(sink.as_ptr()) });
        if raw.is_null() {
            // Never created: nothing was posted.
            free_sink();
            return;
        }
        // Every QP on the SRQ is gone (each holds it), and dropped after
        // its reclaim delivered what its CQ held of it.
        // `ib_destroy_srq_user` (no user data: a kernel SRQ), which returns
        // an error that `ib_destroy_srq` would only warn about.
        // SAFETY: Live SRQ (type invariants) that no QP uses any more;
        // destroyed once, here, before the sink its events name goes.
        let ret = unsafe { bindings::ib_destroy_srq_user(raw, ptr::null_mut()) };
        if ret != 0 {
            // The device may still reach the buffers: they stay allocated
            // and mapped for good.  The SRQ stays too, its events naming
            // this module's trampoline and the sink, which stays with its
            // count of callback targets (the owner's `ModuleOwner` waits
            // for it at unload) and a reference on the module.
            pr_err!(
                "SRQ destruction failed ({}): {} receive buffers leaked\n",
                ret,
                self.posted()
            );
            self.pd.owner().pin_module();
            // The SRQ still counts as a user of its PD (a failed
            // `ib_destroy_srq_user` leaves `pd->usecnt` alone), and
            // `ib_dealloc_pd` would free it under the SRQ: its reference
            // is leaked too.
            core::mem::forget(self.pd.clone());
            return;
        }
        while let Some(entry) = self.credits.pop_posted() {
            // `entry` is the `cqe` of a `Buffer` that `post_recv_buffer`
            // leaked, its `cqe` field, whose completion never
            // ran (it would have untracked it) and never will: the SRQ and
            // its QPs are destroyed and their CQs hold nothing of them.
            // Popping it made this its only owner.
            // SAFETY: By the above, the live object `KBox::into_raw` leaked.
            drop(unsafe { KBox::from_raw(kernel::container_of!(entry.0.as_ptr(), Buffer, cqe)) });
        }
        free_sink();
    }
}

/// The `event_handler` of every SRQ of this layer.
///
/// # Safety
///
/// Called by the driver only, for an SRQ created by [`Srq::with_caps`]:
/// `context` is its [`SrqEventSink`], which outlives the SRQ (freed only
/// after its destruction succeeded), and no event comes after the
/// destruction.
unsafe extern "C" fn srq_event_callback(
    event: *mut bindings::ib_event,
    context: *mut core::ffi::c_void,
) {
    // SAFETY: `context` is the live sink (the safety requirements).
    let srq = unsafe { &*context.cast::<SrqEventSink>() };
    // SAFETY: The driver passes a valid event for the call.
    let event = match unsafe { (*event).event } {
        bindings::ib_event_type_IB_EVENT_SRQ_LIMIT_REACHED => SrqEvent::LimitReached,
        bindings::ib_event_type_IB_EVENT_SRQ_ERR => SrqEvent::Error,
        other => SrqEvent::Other(other),
    };
    match &srq.events {
        Some(events) => events.srq_event(event),
        None if event == SrqEvent::Error => pr_warn!("SRQ error\n"),
        None => {}
    }
}
