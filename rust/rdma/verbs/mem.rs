// SPDX-License-Identifier: GPL-2.0

//! Memory work requests on RC QPs: fast registration, invalidation, and
//! RDMA READ/WRITE of one registered region ([`Mr`]).

use super::{
    buffer::SendBuffer,
    caps::QpType,
    completion::{CompletionHandler, RwOp, WorkDone, WorkOp},
    credits::{PostedCqe, Signaling, WrQueue},
    post_error::PostError,
    qp::Qp,
    request::{send_done, work_done, Work},
};
use crate::rdma::{
    bindings,
    device::Transport,
    mr::{Mr, MrAccess, Registration, RemoteRegion},
    pd::RemoteKey,
    sg::check_range,
};
use core::ptr::{self, NonNull};
use kernel::{prelude::*, sync::Arc};

impl<C: CompletionHandler> Qp<C> {
    fn post_work(
        &self,
        done: WorkDone,
        cpu_sync: Option<(usize, usize)>,
        fill: impl FnOnce(&mut bindings::ib_send_wr) -> *const bindings::ib_send_wr,
    ) -> Result {
        self.check_type(QpType::Rc)?;
        self.check_pd(done.mr.pd())?;
        let credit = self.credits.take(WrQueue::Send)?;
        let work = KBox::new(
            Work {
                cqe: bindings::ib_cqe {
                    done: Some(work_done::<C>),
                },
                cpu_sync,
                credit,
                done,
            },
            GFP_KERNEL,
        )?;
        let leaked = KBox::into_raw(work);
        // SAFETY: `leaked` is live until its completion or the failure
        // below; the credit is a field apart from the entry.
        let (cqe, credit) = unsafe { (&raw mut (*leaked).cqe, &raw mut (*leaked).credit) };
        // SAFETY: Both point into `leaked`, recovered below on failure; its
        // `done` is set.
        let ret = unsafe { self.post_send_raw(cqe, credit, true, fill) };
        if let Err(e) = ret {
            // SAFETY: The post failed: nothing else owns the work.
            drop(unsafe { KBox::from_raw(leaked) });
            return Err(e);
        }
        Ok(())
    }

    /// Registers `mr` with `access` (`IB_WR_REG_MR`, the flags chosen for
    /// the QP's transport: see [`MrAccess::to_raw`]) under a fresh key and
    /// returns what to advertise to the peer.
    ///
    /// The key is usable by the peer once the registration has executed;
    /// the send queue runs in order, so a SEND posted after this call that
    /// carries the region is safe to act on.  Completion (or failure) is
    /// reported to [`CompletionHandler::work_done`] with `tag`.  `EBUSY` if
    /// the region is registered already (or a registration of it is
    /// prepared), `EXDEV` if it lives on another device, `EINVAL` in
    /// another PD.
    pub fn register(&self, mr: &Arc<Mr>, access: MrAccess, tag: u64) -> Result<RemoteRegion> {
        // Dropped on failure, after the guard below: the key is withdrawn.
        let mut prepared = self.prepare_registration(mr, access)?;
        let mut reg = mr.registration();
        // Registered meanwhile: an invalidation posted before failed.
        if reg.is_valid() {
            return Err(EBUSY);
        }
        let mut wr_reg: bindings::ib_reg_wr = pin_init::zeroed();
        self.post_work(
            WorkDone {
                op: WorkOp::Register,
                tag,
                mr: mr.clone(),
            },
            None,
            |wr| {
                wr_reg.wr = *wr;
                prepared.fill_reg_wr(&mut wr_reg, self.device().transport());
                (&raw const wr_reg).cast()
            },
        )?;
        Ok(prepared.posted(&mut reg))
    }

    /// Prepares a registration of `mr` with `access` for
    /// [`Self::register_then_send`]: chooses its key and records it for
    /// the PD (a peer's remote invalidation of it is never missed), so
    /// that the SEND that advertises the region can be written before one
    /// post carries both.  Errors as [`Self::register`]: while the
    /// registration is prepared, another one of the region is refused
    /// (`EBUSY`), as are requests that use it (it is not registered yet).
    pub fn prepare_registration(
        &self,
        mr: &Arc<Mr>,
        access: MrAccess,
    ) -> Result<PreparedRegistration> {
        self.check_type(QpType::Rc)?;
        self.check_pd(mr.pd())?;
        let mut reg = mr.registration();
        if reg.is_valid() || reg.prepared {
            return Err(EBUSY);
        }
        // The last registration is over (invalidated locally or by the
        // peer) and its key forgotten; the new one is recorded before the
        // post, so a remote invalidation of it is never missed.
        reg.valid = false;
        reg.withdraw_remote(mr.pd());
        let (addr, lkey, rkey) = mr.map_for_registration(&mut reg)?;
        let key = mr.pd().publish_key(rkey)?;
        reg.prepared = true;
        Ok(PreparedRegistration {
            mr: mr.clone(),
            access,
            region: RemoteRegion {
                addr,
                rkey,
                len: mr.len() as u32,
            },
            lkey,
            key: Some(key),
        })
    }

    /// Posts the registration `prepared` (`IB_WR_REG_MR`) and, chained
    /// behind it in the same post, a SEND of `send` (which usually carries
    /// [`PreparedRegistration::region`]): one doorbell, and no completion
    /// of the registration's own, as nvme-rdma sends a command with the
    /// registration of its data.  The send queue runs in order, so the
    /// peer acting on the SEND finds the key valid.
    ///
    /// The registration is unsignaled: when the SEND's completion comes (or
    /// that of a later signaled request, if `send` is unsignaled),
    /// [`CompletionHandler::work_done`] reports the registration done with
    /// `tag`, before [`CompletionHandler::send_done`] hands `send` back.  A
    /// failed registration reports its error and flushes the SEND.  The
    /// region is registered (for whatever is posted next) once this
    /// returns `Ok`, which returns what `prepared` advertises.
    ///
    /// Errors as [`Self::post_send`] (two requests of `max_send_wr`:
    /// `ENOSPC` unless both fit, `EMSGSIZE` on a queue of one), `EINVAL`
    /// for a region of another PD, `EBUSY` if the region was registered
    /// meanwhile (an invalidation posted before the preparation failed);
    /// `send` comes back, and `prepared` with it unless the driver took
    /// the registration and refused only the SEND: then the QP is in the
    /// error state (as after any post the driver failed after taking
    /// requests) and the registration completes flushed.
    pub fn register_then_send(
        &self,
        mut prepared: PreparedRegistration,
        tag: u64,
        send: SendBuffer,
    ) -> Result<RemoteRegion, PostError<(Option<PreparedRegistration>, SendBuffer)>> {
        if let Err(e) = self
            .check_type(QpType::Rc)
            .and_then(|()| self.check_pd(prepared.mr.pd()))
            .and_then(|()| self.check_send(&send))
            .and_then(|()| self.check_peer_spoke())
        {
            return Err(PostError::new(e, (Some(prepared), send)));
        }
        if self.credits.caps.max_send_wr < 2 {
            return Err(PostError::new(EMSGSIZE, (Some(prepared), send)));
        }
        // The region's state changes with the post, under its lock (taken
        // before the QP's, as `register` does).
        let mr = prepared.mr.clone();
        let mut reg = mr.registration();
        if reg.is_valid() {
            drop(reg);
            return Err(PostError::new(EBUSY, (Some(prepared), send)));
        }
        let credits = self
            .credits
            .take(WrQueue::Send)
            .and_then(|reg| Ok((reg, self.credits.take(WrQueue::Send)?)));
        let (reg_credit, send_credit) = match credits {
            Ok(both) => both,
            Err(e) => {
                drop(reg);
                return Err(PostError::new(e, (Some(prepared), send)));
            }
        };
        let work = KBox::new(
            Work {
                cqe: bindings::ib_cqe {
                    done: Some(work_done::<C>),
                },
                cpu_sync: None,
                credit: reg_credit,
                done: WorkDone {
                    op: WorkOp::Register,
                    tag,
                    mr: prepared.mr.clone(),
                },
            },
            GFP_KERNEL,
        );
        let work = match work {
            Ok(work) => work,
            Err(e) => {
                drop(reg);
                return Err(PostError::new(e.into(), (Some(prepared), send)));
            }
        };
        let mut inner = send.0;
        let head_len = inner.len;
        let list = match inner.map_pages(head_len, self.max_send_sge) {
            Ok(list) => list,
            Err(e) => {
                drop(reg);
                return Err(PostError::new(e, (Some(prepared), SendBuffer(inner))));
            }
        };
        let mut sge = bindings::ib_sge::default();
        let mut send_wr: bindings::ib_send_wr = pin_init::zeroed();
        inner.prepare_send(
            send_credit,
            send_done::<C>,
            &mut send_wr,
            &mut sge,
            list.as_ref(),
        );
        let unsignaled = inner.unsignaled && !self.signals_pages(inner.len, list.as_ref());

        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            drop((guard, reg));
            inner.credit = None;
            return Err(PostError::new(
                ENOTCONN,
                (Some(prepared), SendBuffer::back(inner)),
            ));
        };
        let (work, inner) = (KBox::into_raw(work), KBox::into_raw(inner));
        // SAFETY: Both are live until their completion or the failure
        // below; each credit is a field apart from its entry.
        let (reg_cqe, send_cqe) = unsafe { (&raw mut (*work).cqe, &raw mut (*inner).cqe) };
        // SAFETY: As above; nothing else refers to the credits yet, and
        // the entries, fields of live objects, are not null.
        unsafe {
            (*work).credit.track(NonNull::new_unchecked(reg_cqe));
            if let Some(credit) = (*inner).credit.as_mut() {
                credit.track(NonNull::new_unchecked(send_cqe));
            }
        }
        // SAFETY: Both point into live objects: not null.
        let (reg_entry, send_entry) = unsafe {
            (
                PostedCqe(NonNull::new_unchecked(reg_cqe), WrQueue::Send),
                PostedCqe(NonNull::new_unchecked(send_cqe), WrQueue::Send),
            )
        };
        // The SEND, posted after the registration, completes after it and
        // gives it back; it is signaled if it leaves under two credits.
        let signaled = !unsignaled || self.credits.leaves_under_two_send_credits();
        self.credits.push_send(reg_entry, Signaling::UnsignaledWork);
        self.credits.push_send(
            send_entry,
            if signaled {
                Signaling::Signaled
            } else {
                Signaling::UnsignaledSend
            },
        );
        send_wr.__bindgen_anon_1.wr_cqe = send_cqe;
        if signaled {
            send_wr.send_flags |= bindings::ib_send_flags_IB_SEND_SIGNALED;
        }
        let mut wr_reg: bindings::ib_reg_wr = pin_init::zeroed();
        wr_reg.wr.__bindgen_anon_1.wr_cqe = reg_cqe;
        wr_reg.wr.next = &raw mut send_wr;
        prepared.fill_reg_wr(&mut wr_reg, self.device().transport());
        let first = &raw const wr_reg.wr;
        let mut refused = ptr::null();
        // `raw` is live under the lock; the chain (the registration of a
        // live MR of the QP's PD, then the SEND and the SGE it names) lives
        // across the call, each naming its entry, whose `done` is set; the
        // driver copies it.
        // SAFETY: As above; `refused` is writable for the call.
        let posted = unsafe { bindings::ib_post_send(raw.as_ptr(), first, &mut refused) };
        let only_send_refused = posted != 0 && ptr::eq(refused, &raw const send_wr);
        if let Err(e) = self.post_outcome(raw, posted, first, refused) {
            self.credits.remove_send(reg_entry);
            self.credits.remove_send(send_entry);
            // SAFETY: The driver took neither: this is their only owner.
            let (work, mut inner) = unsafe { (KBox::from_raw(work), KBox::from_raw(inner)) };
            // The credits go and stop tracking the requests while the
            // QP's lock still keeps a shutdown's reclaim off them.
            drop(work);
            inner.credit = None;
            drop((guard, reg));
            return Err(PostError::new(e, (Some(prepared), SendBuffer::back(inner))));
        }
        if only_send_refused {
            // The registration is the driver's (flushed now that the QP is
            // in the error state); the SEND, which it never had, is the
            // caller's again, not left to be given back as done.
            self.credits.remove_send(send_entry);
            // SAFETY: The driver refused it: this is its only owner.
            let mut inner = unsafe { KBox::from_raw(inner) };
            inner.credit = None;
            drop(guard);
            let _ = prepared.posted(&mut reg);
            drop(reg);
            return Err(PostError::new(
                Error::from_errno(posted),
                (None, SendBuffer::back(inner)),
            ));
        }
        drop(guard);
        Ok(prepared.posted(&mut reg))
    }

    /// Invalidates the region's current registration (`IB_WR_LOCAL_INV`):
    /// once it has executed, the advertised key grants nothing.  `EINVAL` if
    /// the region is not registered.
    pub fn invalidate(&self, mr: &Arc<Mr>, tag: u64) -> Result {
        self.check_type(QpType::Rc)?;
        self.check_pd(mr.pd())?;
        let mut reg = mr.registration();
        if !reg.is_valid() {
            return Err(EINVAL);
        }
        let rkey = reg.rkey;
        self.post_work(
            WorkDone {
                op: WorkOp::Invalidate,
                tag,
                mr: mr.clone(),
            },
            None,
            |wr| {
                wr.opcode = bindings::ib_wr_opcode_IB_WR_LOCAL_INV;
                wr.ex.invalidate_rkey = rkey;
                wr
            },
        )?;
        reg.valid = false;
        reg.withdraw_remote(mr.pd());
        Ok(())
    }

    /// Posts an RDMA READ (`remote` into `mr` at `offset`) or WRITE (`mr` at
    /// `offset` into `remote`) of `remote.len` bytes through one region the
    /// caller registered and keeps registered: its completion is a
    /// [`WorkDone`] (`RdmaRead` or `RdmaWrite`).  The region must be
    /// registered (its local key is used; on iWARP the sink of a READ must
    /// be registered with remote write, which [`Self::register`] grants
    /// there).  To move pages without managing a region, use the R/W API
    /// ([`Self::rdma_rw`]), which registers what the device needs itself.
    /// `EINVAL` for a range outside the region, `EAGAIN` as
    /// [`Self::post_send`].
    pub fn rdma(
        &self,
        op: RwOp,
        mr: &Arc<Mr>,
        offset: usize,
        remote: RemoteRegion,
        tag: u64,
    ) -> Result {
        let (opcode, op) = match op {
            RwOp::Read => (bindings::ib_wr_opcode_IB_WR_RDMA_READ, WorkOp::RdmaRead),
            RwOp::Write => (bindings::ib_wr_opcode_IB_WR_RDMA_WRITE, WorkOp::RdmaWrite),
        };
        self.check_pd(mr.pd())?;
        self.check_peer_spoke()?;
        let len = remote.len as usize;
        check_range(offset, len, mr.len())?;
        remote
            .addr
            .checked_add(u64::from(remote.len))
            .ok_or(EINVAL)?;
        // Held across the post: an invalidation cannot slip in between
        // reading the key and posting the request that uses it.
        let reg = mr.registration();
        if !reg.is_valid() {
            return Err(EINVAL);
        }
        // The region's bytes as its registration maps them: contiguous in
        // its I/O virtual addresses, however its memory lies.
        let mut sge = bindings::ib_sge {
            addr: reg.iova + offset as u64,
            length: remote.len,
            lkey: reg.lkey,
        };
        // A READ lands in `len` bytes at `offset`: the CPU sees them once
        // it completed.  A WRITE's source was synced by `Mr::write`.
        let cpu_sync = (op == WorkOp::RdmaRead).then_some((offset, len));
        let mut rdma: bindings::ib_rdma_wr = pin_init::zeroed();
        self.post_work(
            WorkDone {
                op,
                tag,
                mr: mr.clone(),
            },
            cpu_sync,
            |wr| {
                rdma.wr = *wr;
                rdma.wr.opcode = opcode;
                rdma.wr.sg_list = &raw mut sge;
                rdma.wr.num_sge = 1;
                rdma.remote_addr = remote.addr;
                rdma.rkey = remote.rkey;
                (&raw const rdma).cast()
            },
        )
    }
}

/// A registration of a region whose key is chosen, and recorded for its
/// PD, but which is not posted yet ([`Qp::prepare_registration`]): what
/// advertises it can be written before [`Qp::register_then_send`] posts
/// both.  While it lives, no other registration of the region can start;
/// dropped unposted, it withdraws its key and frees the region for the
/// next one.
pub struct PreparedRegistration {
    mr: Arc<Mr>,
    access: MrAccess,
    region: RemoteRegion,
    lkey: u32,
    /// The key as the PD records it; taken by the post.
    key: Option<Arc<RemoteKey>>,
}

impl PreparedRegistration {
    /// What the registration will let the peer reach: to advertise.
    pub fn region(&self) -> RemoteRegion {
        self.region
    }

    /// The region to be registered.
    pub fn mr(&self) -> &Arc<Mr> {
        &self.mr
    }

    /// The `IB_WR_REG_MR` fields of the registration on a QP of
    /// `transport` (the caller sets the entry, flags and chain).
    fn fill_reg_wr(&self, wr_reg: &mut bindings::ib_reg_wr, transport: Transport) {
        wr_reg.wr.opcode = bindings::ib_wr_opcode_IB_WR_REG_MR;
        wr_reg.mr = self.mr.as_ptr();
        wr_reg.key = self.region.rkey;
        wr_reg.access = self.access.to_raw(transport);
    }

    /// Records the posted registration in the region's state `reg` (its
    /// lock held since before the post), which takes the key over, and
    /// returns what it advertises.
    fn posted(&mut self, reg: &mut Registration) -> RemoteRegion {
        reg.valid = true;
        reg.prepared = false;
        reg.lkey = self.lkey;
        reg.rkey = self.region.rkey;
        reg.iova = self.region.addr;
        reg.remote = self.key.take();
        self.region
    }
}

impl Drop for PreparedRegistration {
    fn drop(&mut self) {
        // Posted: the registration owns the key now.
        if let Some(key) = self.key.take() {
            self.mr.pd().withdraw_key(self.region.rkey, &key);
            self.mr.registration().prepared = false;
        }
    }
}
