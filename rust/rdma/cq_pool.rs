// SPDX-License-Identifier: GPL-2.0

//! CQs of one device shared by many QPs and spread over its completion
//! vectors, as `ib_cq_pool_get`/`ib_cq_pool_put` share them for C ULPs.
//!
//! The core's pool cannot serve this layer.  Its CQs carry no context (a
//! completion here finds its handler through its CQ's), and the core frees
//! them in `disable_device` (`ib_cq_pool_cleanup`) after the device's
//! clients are removed but before it waits for the device's references: a
//! CQ still held then would be freed under its holder, with a warning for
//! the entries still counted.  The CM's own removal, which ends the QPs on
//! it, comes after this layer's client in that order, so no client of the
//! layer could hand its CQs back in time.  The pool here is made of
//! [`Cq`]s, each holding the device, which its unregistration waits for.
//!
//! A pool's CQs are polled from a workqueue, or busy-polled
//! ([`CqPool::busy_polled`]): each CQ then has a loop of a
//! [`BusyPoller`] of its own for as long as the pool keeps it.

use super::{
    bindings,
    device::Device,
    owner::Owner,
    poller::{BusyPoller, PollLoop},
    verbs::{CompletionHandler, Cq, PollContext},
};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{aref::ARef, Arc, Mutex},
};

/// A device's CQs for the QPs of one kind of ULP connection: created on
/// demand, on the completion vector asked for or the next one in turn,
/// each QP placed on the CQ of that vector with the most room, and kept
/// until the pool goes (a ULP keeps the pool in its per-device state, see
/// [`super::client::Client`]).
///
/// Every CQ gets a clone of the pool's handler, and in a busy-polled pool a
/// loop polling it until the pool goes.  The room a QP needs is
/// reserved on its CQ when the QP is created and released when it goes
/// ([`super::verbs::Qp`]); the pool only chooses the CQ, under its lock,
/// so that two connections set up at once do not both count on the same
/// room.
#[pin_data]
pub struct CqPool<C: CompletionHandler + Clone> {
    /// The owner of the pool's CQs.
    owner: Owner,
    dev: ARef<Device>,
    cq_entries: u32,
    poll: PollContext,
    handler: C,
    /// The vector of the next request without one.
    next_vector: AtomicU32,
    #[pin]
    cqs: Mutex<KVec<PooledCq<C>>>,
    /// Starts the loop of each CQ of a busy-polled pool.  Dropped after
    /// `cqs`, whose loops are told to stop first; the poller's last drop
    /// waits for its loops (see [`BusyPoller`]).
    poller: Option<Arc<BusyPoller>>,
}

/// A CQ of a [`CqPool`].
struct PooledCq<C: CompletionHandler> {
    cq: Arc<Cq<C>>,
    /// The loop polling it in a busy-polled pool; it ends with the pool,
    /// and then lets go of the CQ.
    _polling: Option<PollLoop>,
}

impl<C: CompletionHandler + Clone> CqPool<C> {
    /// A pool of CQs of at least `cq_entries` on `dev`, polled from `poll`,
    /// each with a clone of `handler`; none is allocated yet.  `EINVAL` for
    /// 0 entries or a poll context whose CQs only their owner polls
    /// ([`PollContext::owner_polls`]: nobody would; see
    /// [`CqPool::busy_polled`]).
    pub fn new(
        owner: &Owner,
        dev: &Device,
        cq_entries: u32,
        poll: PollContext,
        handler: C,
    ) -> Result<Arc<Self>> {
        if poll.owner_polls() {
            return Err(EINVAL);
        }
        Self::with_poll(owner, dev, cq_entries, poll, handler, None)
    }

    /// A pool of [`PollContext::Direct`] CQs of at least `cq_entries` on
    /// `dev`, each with a clone of `handler` and busy-polled by a loop of
    /// `poller` ([`BusyPoller::start`]) from its creation until the pool
    /// goes, so that completions run the handler in the loop's task with
    /// no interrupt or worker to wake.  `EINVAL` for 0 entries.  Making a
    /// CQ fails with `EBUSY` once `poller` runs
    /// [`super::poller::MAX_LOOPS`] loops.
    ///
    /// The pool holds `poller`: its last drop, and with it the wait for
    /// its loops, may be the pool's.  The owner's [`ModuleOwner`] waits for
    /// its CQs and for the poller at unload: drop every pool before it.
    ///
    /// [`ModuleOwner`]: super::owner::ModuleOwner
    ///
    /// A `place` of [`CqPool::with_cq`] that fails after creating a QP on a
    /// new CQ leaves that QP on a CQ the pool did not keep, whose loop has
    /// ended: its completions then wait for its teardown's own polls.
    pub fn busy_polled(
        owner: &Owner,
        dev: &Device,
        cq_entries: u32,
        poller: &Arc<BusyPoller>,
        handler: C,
    ) -> Result<Arc<Self>> {
        Self::with_poll(
            owner,
            dev,
            cq_entries,
            PollContext::Direct,
            handler,
            Some(poller.clone()),
        )
    }

    fn with_poll(
        owner: &Owner,
        dev: &Device,
        cq_entries: u32,
        poll: PollContext,
        handler: C,
        poller: Option<Arc<BusyPoller>>,
    ) -> Result<Arc<Self>> {
        if cq_entries == 0 {
            return Err(EINVAL);
        }
        Arc::pin_init(
            pin_init!(Self {
                owner: owner.clone(),
                dev: dev.into(),
                cq_entries,
                poll,
                handler,
                next_vector: AtomicU32::new(0),
                cqs <- new_mutex!(KVec::new()),
                poller,
            }),
            GFP_KERNEL,
        )
    }

    /// Calls `place` with a CQ of the pool on completion vector `vector`
    /// (modulo the device's vectors, counting no more than the CPUs
    /// online, or the next vector in turn for `None`), and
    /// its index in the pool, and returns what `place` returns: `place`
    /// creates the QP on it.  The CQs of the vector with at least
    /// `entries` free are offered, the one with the most room first, and
    /// the next one if `place` fails with `ENOSPC` (an SRQ the CQ does not
    /// carry yet needs room for its receives too); when none took it, a
    /// new CQ of the pool's size (or of `entries` if larger) is made on the
    /// vector for a last try, kept if `place` succeeds on it.  Any other
    /// error of `place` is returned at once.  In a busy-polled pool the new
    /// CQ's loop starts before `place` runs (`EBUSY` when the poller has no
    /// room for another).  The pool is locked meanwhile: `place` must not
    /// use it.
    pub fn with_cq<R>(
        &self,
        entries: u32,
        vector: Option<u32>,
        mut place: impl FnMut(usize, &Arc<Cq<C>>) -> Result<R>,
    ) -> Result<R> {
        // As `ib_cq_pool_get`: no more vectors than CPUs online, whose
        // interrupts (or, for rxe and siw, whose work items) they spread
        // over; a device may count vectors for every possible CPU.
        // SAFETY: Reads a counter the CPU hotplug code keeps; callable in
        // any context.
        let online = unsafe { bindings::num_online_cpus() };
        let vectors = self.dev.num_comp_vectors().min(online).max(1);
        let vector =
            vector.unwrap_or_else(|| self.next_vector.fetch_add(1, Ordering::Relaxed)) % vectors;
        let mut cqs = self.cqs.lock();
        let mut candidates = KVec::with_capacity(cqs.len(), GFP_KERNEL)?;
        for (index, pooled) in cqs.iter().enumerate() {
            let (free, cq) = (pooled.cq.free_entries(), &pooled.cq);
            if cq.comp_vector() == vector && free >= entries {
                candidates.push((free, index), GFP_KERNEL)?;
            }
        }
        // The most room first.
        candidates.sort_unstable_by_key(|&(free, index)| (core::cmp::Reverse(free), index));
        for &(_, index) in candidates.iter() {
            match place(index, &cqs[index].cq) {
                Err(e) if e == ENOSPC => continue,
                placed => return placed,
            }
        }
        // Room first: once `place` made a QP on the new CQ, keeping it
        // cannot fail.
        cqs.reserve(1, GFP_KERNEL)?;
        let cq = Cq::alloc_with(
            &self.owner,
            &self.dev,
            self.cq_entries.max(entries),
            vector,
            self.poll,
            self.handler.clone(),
        )?;
        // Polled from before its first QP, so that nothing it completes
        // waits for the loop; a CQ nothing took is not kept, and its loop
        // ends with it.
        let polling = match &self.poller {
            Some(poller) => Some(poller.start(&cq)?),
            None => None,
        };
        let placed = place(cqs.len(), &cq)?;
        cqs.push(
            PooledCq {
                cq,
                _polling: polling,
            },
            GFP_KERNEL,
        )?;
        Ok(placed)
    }

    /// The CQs the pool has made.
    pub fn len(&self) -> usize {
        self.cqs.lock().len()
    }

    /// Whether the pool has made no CQ yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device the pool's CQs live on.
    pub fn device(&self) -> &Device {
        &self.dev
    }
}
