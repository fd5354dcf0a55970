// SPDX-License-Identifier: GPL-2.0

//! The RDMA transport binding: one queue per RDMA CM connection (the
//! admin queue, or an I/O queue), with its QP, CQ and receives; the
//! connect request's checks and the accept; commands from their receive
//! to their completion, their data moved by the R/W API; teardown.

use super::ctrl::{Ctrl, Data, Outcome, QueueCtx, QueueHandle, Subsystem, Transfer};
use super::rdma::{
    CmId, CompletionHandler, ConnectRequest, Cq, Event, EventType, Handler, LockedId, Owner, Pd,
    PollContext, PostError, Qp, QpCaps, QpEvent, RecvBuffer, RemoteRegion, RwDone, RwOp,
    SendBuffer, SgBuffer, Transport as Fabric,
};
use super::wire::{self, cm_status, status, CmReq, DataDesc, Sqe};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use kernel::{
    new_mutex, new_spinlock,
    prelude::*,
    sync::{Arc, Mutex, SpinLock},
};

/// Tags of RDMA WRITEs (data to the host): their completion only returns
/// the buffer.  READ tags count up from 0.
const WRITE_TAG: u64 = 1 << 63;

/// Transfer buffers an I/O queue keeps for reuse, by capacity: a 4 KiB
/// block, and up to 128 KiB.  Larger transfers get a buffer of their own.
const SMALL_BUF: usize = 4096;
const LARGE_BUF: usize = 128 * 1024;

/// What every queue shares: the subsystem, the owner objects are made
/// for, and the queues alive.
#[pin_data]
pub(crate) struct Transport {
    pub(crate) subsys: Arc<Subsystem>,
    pub(crate) owner: Owner,
    #[pin]
    queues: Mutex<KVec<Arc<Queue>>>,
    /// Set by [`Self::shut_down`]: the keep-alive sweep ends.
    shut_down: AtomicBool,
}

impl Transport {
    pub(crate) fn new(subsys: Arc<Subsystem>, owner: Owner) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            subsys,
            owner,
            queues <- new_mutex!(KVec::new()),
            shut_down: AtomicBool::new(false),
        })
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// Ends every queue (the module goes): disconnects it, then drops its
    /// id, which destroys it and its QP.  Process context.
    pub(crate) fn shut_down(&self) {
        self.shut_down.store(true, Ordering::Release);
        let queues = core::mem::take(&mut *self.queues.lock());
        for queue in &queues {
            queue.disconnect();
        }
        for queue in queues {
            queue.end();
        }
        for ctrl in self.subsys.take_all() {
            drop(ctrl.fail());
        }
    }

    /// Disconnects the queues of failed controllers, from the owner's
    /// queue (process context).
    pub(crate) fn fail_ctrls(&self, ctrls: KVec<Arc<Ctrl>>) {
        for ctrl in ctrls {
            // Once: every queue of a controller may report its failure.
            let Some(queues) = ctrl.fail() else {
                continue;
            };
            pr_info!(
                "controller {} failed: disconnecting its queues\n",
                ctrl.cntlid
            );
            for queue in queues {
                queue.disconnect();
            }
        }
    }
}

/// An IP address's text.
struct AddrText {
    bytes: [u8; 48],
    len: usize,
}

impl Default for AddrText {
    fn default() -> Self {
        Self {
            bytes: [0; 48],
            len: 0,
        }
    }
}

impl core::fmt::Write for AddrText {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let end = self.len + s.len();
        self.bytes
            .get_mut(self.len..end)
            .ok_or(core::fmt::Error)?
            .copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// A command waiting for its host-to-target data (an RDMA READ).
struct Reading {
    tag: u64,
    sqe: Sqe,
    invalidate: Option<u32>,
}

/// A transfer or response that found the send queue full, posted again
/// when a completion frees room.
enum Waiting {
    Send(SendBuffer),
    Read(SgBuffer, RemoteRegion, u64),
    WriteThenSend(SgBuffer, RemoteRegion, SendBuffer),
}

/// One queue: an RDMA CM connection.
#[pin_data]
pub(crate) struct Queue {
    transport: Arc<Transport>,
    qid: u16,
    /// Receives posted: the host's submission queue size.
    size: u16,
    /// In-capsule data a receive takes past the command.
    inline_size: usize,
    /// The address the host reached, as text, for the discovery log.
    traddr: AddrText,
    ipv6: bool,
    /// Over iWARP: a flush or the QP's error event ends the queue, not its
    /// controller ([`Self::fatal`]).
    iwarp: bool,
    #[pin]
    qp: SpinLock<Option<Arc<Qp<QueueCq>>>>,
    #[pin]
    pd: SpinLock<Option<Arc<Pd>>>,
    #[pin]
    id: Mutex<Option<Arc<CmId<NvmetCm>>>>,
    #[pin]
    ctrl: Mutex<Option<Arc<Ctrl>>>,
    #[pin]
    sends: SpinLock<KVec<SendBuffer>>,
    #[pin]
    reads: Mutex<KVec<Reading>>,
    #[pin]
    waiting: SpinLock<KVec<Waiting>>,
    /// Transfer buffers for reuse ([`SMALL_BUF`], [`LARGE_BUF`]).
    #[pin]
    small_bufs: SpinLock<KVec<SgBuffer>>,
    #[pin]
    large_bufs: SpinLock<KVec<SgBuffer>>,
    next_tag: AtomicU64,
    sq_head: AtomicU32,
    ended: AtomicBool,
    /// Set by the first fatal error: the others of the same failure (every
    /// request flushed after it) add nothing.
    failing: AtomicBool,
}

/// What failed, for [`Queue::fatal`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// A request or its completion, on its own.
    Request,
    /// A request flushed: the QP was already in the error state (a
    /// disconnect, the device's removal, or an error seen by no completion
    /// of ours, such as an unsignaled RDMA WRITE to a bad key, whose
    /// chained response is then flushed).  No news to warn about.
    Flushed,
    /// The QP's asynchronous error event.
    QpError,
}

impl Failure {
    /// The failure a request's completion `error` reports.
    fn of(error: Error) -> Self {
        if error == ECANCELED {
            Failure::Flushed
        } else {
            Failure::Request
        }
    }
}

/// The CM handler of the listener and of every queue.
pub(crate) enum NvmetCm {
    Listener(Arc<Transport>),
    Queue(Arc<Queue>),
}

impl Handler for NvmetCm {
    fn event(&self, _id: &LockedId<'_>, event: &Event<'_>) {
        let NvmetCm::Queue(queue) = self else {
            return;
        };
        match event.kind() {
            EventType::Disconnected
            | EventType::TimewaitExit
            | EventType::AddrChange
            | EventType::DeviceRemoval
            | EventType::Rejected
            | EventType::Unreachable
            | EventType::ConnectError => queue.end(),
            _ => {}
        }
    }

    fn connect_request(&self, request: ConnectRequest<'_, Self>, event: &Event<'_>) {
        let NvmetCm::Listener(transport) = self else {
            return;
        };
        let private = event.conn_param().map(|p| p.private_data()).unwrap_or(&[]);
        let checked = CmReq::parse(private)
            .and_then(|req| check_request(&transport.subsys, &req).map(|()| req));
        let req = match checked {
            Ok(req) => req,
            Err(sts) => {
                pr_debug!("connect request refused: status {}\n", sts);
                let _ = request.id().reject(0, &wire::cm_rej(sts));
                return;
            }
        };
        if let Err(e) = Queue::accept(transport, request, &req) {
            pr_warn!("queue {} not accepted: {:?}\n", req.qid, e);
        }
    }
}

/// The connect request's checks (`nvme_rdma_cm_rej` statuses).
fn check_request(subsys: &Subsystem, req: &CmReq) -> core::result::Result<(), u16> {
    let sq_size = u32::from(req.hsqsize) + 1;
    if req.qid == 0 {
        if sq_size > u32::from(wire::ADMIN_QUEUE_SIZE) {
            return Err(cm_status::INVALID_HSQSIZE);
        }
    } else {
        if req.qid > subsys.limits.max_io_queues {
            return Err(cm_status::INVALID_QID);
        }
        if !subsys.has_ctrl(req.cntlid) {
            return Err(cm_status::INVALID_CNTLID);
        }
        if sq_size > u32::from(subsys.limits.io_queue_size) {
            return Err(cm_status::INVALID_HSQSIZE);
        }
    }
    if sq_size < 2 {
        return Err(cm_status::INVALID_HSQSIZE);
    }
    if u32::from(req.hrqsize) < sq_size {
        return Err(cm_status::INVALID_HRQSIZE);
    }
    Ok(())
}

impl Queue {
    /// Adopts the request's id, makes the queue's PD, CQ and QP, posts its
    /// receives and accepts with the controller's receive queue size.
    fn accept(
        transport: &Arc<Transport>,
        request: ConnectRequest<'_, NvmetCm>,
        req: &CmReq,
    ) -> Result {
        let size = req.hsqsize + 1;
        let inline_size = if req.qid == 0 {
            0
        } else {
            transport.subsys.limits.inline_size as usize
        };
        let mut traddr = AddrText::default();
        let ipv6 = match request.id().src_addr() {
            Some(addr) => {
                let addr = core::net::SocketAddr::from(addr);
                // 45 characters at most: the buffer holds any.
                let _ = core::fmt::write(&mut traddr, format_args!("{}", addr.ip()));
                addr.is_ipv6()
            }
            None => false,
        };
        let iwarp = request.id().transport() == Ok(Fabric::Iwarp);
        let queue = Arc::pin_init(
            try_pin_init!(Queue {
                transport: transport.clone(),
                qid: req.qid,
                size,
                inline_size,
                traddr,
                ipv6,
                iwarp,
                qp <- new_spinlock!(None),
                pd <- new_spinlock!(None),
                id <- new_mutex!(None),
                ctrl <- new_mutex!(None),
                sends <- new_spinlock!(KVec::new()),
                reads <- new_mutex!(KVec::new()),
                waiting <- new_spinlock!(KVec::new()),
                small_bufs <- new_spinlock!(KVec::new()),
                large_bufs <- new_spinlock!(KVec::new()),
                next_tag: AtomicU64::new(0),
                sq_head: AtomicU32::new(0),
                ended: AtomicBool::new(false),
                failing: AtomicBool::new(false),
            }),
            GFP_KERNEL,
        )?;
        transport.queues.lock().reserve(1, GFP_KERNEL)?;
        let id = Arc::new(request.adopt(NvmetCm::Queue(queue.clone()))?, GFP_KERNEL)?;
        *queue.id.lock() = Some(id.clone());
        let accepted = id.with_lock(|l| {
            let made = queue.make_qp(l);
            if made.is_err() {
                let _ = l.reject(0, &wire::cm_rej(cm_status::NO_RSC));
                return made;
            }
            let param = l
                .request_accept_param()?
                .private_data(&wire::cm_rep(size))?;
            l.accept(Some(&param))
        });
        match accepted {
            Ok(()) => {
                transport.queues.lock().push(queue, GFP_KERNEL)?;
                Ok(())
            }
            Err(e) => {
                queue.end();
                Err(e)
            }
        }
    }

    fn make_qp(self: &Arc<Self>, l: &LockedId<'_>) -> Result {
        let owner = &self.transport.owner;
        let dev = l.device()?;
        let pd = Pd::alloc(owner, &dev)?;
        let depth = u32::from(self.size);
        let pages = if self.inline_size > 0 {
            self.inline_size.div_ceil(kernel::page::PAGE_SIZE) as u32
        } else {
            0
        };
        let caps = QpCaps {
            // A response's SEND may still be in flight when the host's next
            // command for its slot arrives: twice the depth, as nvmet.
            max_send_wr: 2 * depth,
            max_recv_wr: depth,
            max_inline_data: 0,
            max_send_sge: dev.caps().max_send_sge.clamp(1, 16),
            max_recv_sge: 1 + pages,
            max_rdma_ctxs: depth,
        };
        let vector = u32::from(self.qid) % dev.num_comp_vectors().max(1);
        let cq = Cq::alloc_with(
            owner,
            &dev,
            caps.cq_entries()?,
            vector,
            PollContext::Workqueue,
            QueueCq(self.clone()),
        )?;
        let qp = l.create_qp(&pd, &cq, caps)?;
        for _ in 0..depth {
            let mut recv = RecvBuffer::new(&pd, wire::SQE_LEN)?;
            if self.inline_size > 0 {
                recv.attach_pages(SgBuffer::new(self.inline_size)?);
            }
            qp.post_recv(recv).map_err(Error::from)?;
        }
        *self.pd.lock() = Some(pd);
        *self.qp.lock() = Some(qp);
        Ok(())
    }

    fn qp(&self) -> Option<Arc<Qp<QueueCq>>> {
        self.qp.lock().clone()
    }

    /// Ends the queue (its connection ended, or the module goes): unbinds
    /// it from its controller (failing the controller when it is the
    /// admin queue), and lets go of its QP and id, which breaks the cycle
    /// queue -> QP -> CQ -> handler -> queue.
    pub(crate) fn end(self: &Arc<Self>) {
        if self.ended.swap(true, Ordering::AcqRel) {
            return;
        }
        let transport = &self.transport;
        if let Some(ctrl) = self.ctrl.lock().take() {
            ctrl.detach(&**self);
            if self.qid == 0 {
                transport.subsys.remove(&ctrl);
                let queues = ctrl.fail().unwrap_or_default();
                if !queues.is_empty() {
                    let spawned = transport.owner.spawn(move || {
                        for queue in queues {
                            queue.disconnect();
                        }
                    });
                    if spawned.is_err() {
                        pr_warn!("I/O queues of controller {} left connected\n", ctrl.cntlid);
                    }
                }
            }
        }
        // Each taken under its lock, dropped after it.
        let qp = self.qp.lock().take();
        let pd = self.pd.lock().take();
        let waiting = core::mem::take(&mut *self.waiting.lock());
        let reads = core::mem::take(&mut *self.reads.lock());
        let sends = core::mem::take(&mut *self.sends.lock());
        let small = core::mem::take(&mut *self.small_bufs.lock());
        let large = core::mem::take(&mut *self.large_bufs.lock());
        drop((qp, pd, waiting, reads, sends, small, large));
        let me = {
            let mut queues = transport.queues.lock();
            let at = queues.iter().position(|q| Arc::ptr_eq(q, self));
            at.and_then(|i| queues.remove(i).ok())
        };
        let id = self.id.lock().take();
        // Destroyed now, or from the owner's queue when this is a callback.
        drop((id, me));
    }

    /// A fatal error of the queue's controller (or of the queue, before it
    /// has one): disconnects them from the owner's queue.
    ///
    /// Over iWARP the host answers a bad RDMA WRITE with a TERMINATE that
    /// ends the connection, which the controller outlives as it outlives
    /// the host's disconnect (nvmet-rdma alike); the QP's error event and
    /// the flush of what followed the WRITE may come before or after the
    /// connection's end is seen, so over iWARP those two end this queue
    /// only.
    fn fatal(self: &Arc<Self>, why: &str, failure: Failure) {
        if self.ended.load(Ordering::Acquire) || self.failing.swap(true, Ordering::AcqRel) {
            return;
        }
        if failure == Failure::Flushed {
            pr_info!("queue {}: {} (flushed): disconnecting\n", self.qid, why);
        } else {
            pr_warn!("queue {}: {}: disconnecting\n", self.qid, why);
        }
        let ctrl = if self.iwarp && failure != Failure::Request {
            None
        } else {
            self.ctrl.lock().clone()
        };
        let transport = self.transport.clone();
        let queue = self.clone();
        let spawned = self.transport.owner.spawn(move || match ctrl {
            Some(ctrl) => {
                transport.subsys.remove(&ctrl);
                let mut ctrls = KVec::new();
                if ctrls.push(ctrl, GFP_KERNEL).is_ok() {
                    transport.fail_ctrls(ctrls);
                }
                queue.disconnect();
            }
            None => queue.disconnect(),
        });
        if spawned.is_err() {
            pr_warn!("queue {} left connected\n", self.qid);
        }
    }

    fn ctx<'a>(&'a self, ctrl: Option<&'a Arc<Ctrl>>) -> QueueCtx<'a> {
        QueueCtx {
            qid: self.qid,
            ctrl,
            traddr: &self.traddr.bytes[..self.traddr.len],
            ipv6: self.ipv6,
        }
    }

    /// Serves the command that arrived in `recv`.
    fn command(self: &Arc<Self>, qp: &Qp<QueueCq>, recv: RecvBuffer) {
        let Some(sqe) = Sqe::from_bytes(recv.data()) else {
            self.fatal("command capsule shorter than 64 bytes", Failure::Request);
            return;
        };
        let ctrl = self.ctrl.lock().clone();
        let subsys = &self.transport.subsys;
        let q = self.ctx(ctrl.as_ref());
        let checked = sqe
            .check_flags()
            .and_then(|()| subsys.transfer(&q, &sqe))
            .and_then(|t| Ok((t, sqe.data_desc()?)))
            .and_then(|(t, desc)| self.check_data(t, desc, &recv).map(|()| (t, desc)));
        let (transfer, desc) = match checked {
            Ok(c) => c,
            Err(st) => {
                self.repost(qp, recv);
                self.respond(qp, sqe.cid(), st, 0, None);
                return;
            }
        };
        let invalidate = match desc {
            DataDesc::Keyed {
                key,
                invalidate: true,
                ..
            } => Some(key),
            _ => None,
        };
        match (transfer, desc) {
            (Transfer::In(_), DataDesc::InCapsule { offset, .. }) => {
                let outcome = match recv.pages() {
                    Some(pages) => subsys.execute(&q, &sqe, Data::In(pages, offset as usize)),
                    None => Outcome::fail(status::SGL_INVALID_OFFSET | status::DNR),
                };
                self.repost(qp, recv);
                self.finish(qp, &sqe, outcome, None);
            }
            (Transfer::In(len), DataDesc::Keyed { addr, key, .. }) => {
                self.repost(qp, recv);
                let remote = RemoteRegion {
                    addr,
                    rkey: key,
                    len,
                };
                self.read_data(qp, sqe, remote, invalidate);
            }
            (Transfer::Out(len), DataDesc::Keyed { addr, key, .. }) => {
                self.repost(qp, recv);
                let remote = RemoteRegion {
                    addr,
                    rkey: key,
                    len,
                };
                self.write_data(qp, &q, &sqe, remote, invalidate);
            }
            _ => {
                self.repost(qp, recv);
                let outcome = subsys.execute(&q, &sqe, Data::None);
                self.finish(qp, &sqe, outcome, invalidate);
            }
        }
    }

    /// The data descriptor against the command's transfer: the same
    /// length, in-capsule data only host to target and within the
    /// capsule.
    fn check_data(
        &self,
        transfer: Transfer,
        desc: DataDesc,
        recv: &RecvBuffer,
    ) -> core::result::Result<(), u16> {
        let want = match transfer {
            Transfer::None => 0,
            Transfer::In(len) | Transfer::Out(len) => len,
        };
        if let DataDesc::InCapsule { offset, len } = desc {
            if !matches!(transfer, Transfer::In(_)) {
                return Err(status::INVALID_FIELD | status::DNR);
            }
            let inline = self.inline_size as u64;
            if offset > inline || u64::from(len) > inline - offset {
                return Err(status::SGL_INVALID_OFFSET | status::DNR);
            }
            if (offset + u64::from(len)) as usize > recv.paged_len() {
                return Err(status::SGL_INVALID_DATA | status::DNR);
            }
        }
        if desc.len() != want {
            return Err(status::SGL_INVALID_DATA | status::DNR);
        }
        Ok(())
    }

    /// A buffer of `len` bytes for a command's data.  On I/O queues it is
    /// reused, and holds a former transfer's bytes: Read and Write fill
    /// every byte of it (the namespace's, or the host's by the RDMA READ)
    /// before it goes to the host or the namespace.  The admin queue's
    /// structures fill only part of theirs, which must be zeroes: fresh.
    fn buffer(&self, len: usize) -> Result<SgBuffer> {
        let pool = if self.qid == 0 || len > LARGE_BUF {
            None
        } else if len <= SMALL_BUF {
            Some((&self.small_bufs, SMALL_BUF))
        } else {
            Some((&self.large_bufs, LARGE_BUF))
        };
        let Some((pool, capacity)) = pool else {
            return SgBuffer::new(len);
        };
        let reused = pool.lock().pop();
        let mut buf = match reused {
            Some(buf) => buf,
            None => SgBuffer::new(capacity)?,
        };
        buf.set_len(len)?;
        Ok(buf)
    }

    /// Keeps `buf` for reuse when it is of a pooled capacity and the pool
    /// has room (one for each entry of the queue).
    fn recycle(&self, buf: SgBuffer) {
        let pool = match buf.capacity() {
            SMALL_BUF => &self.small_bufs,
            LARGE_BUF => &self.large_bufs,
            _ => return,
        };
        if self.ended.load(Ordering::Acquire) {
            return;
        }
        let refused = {
            let mut pool = pool.lock();
            if pool.len() < usize::from(self.size) {
                push_or_give_back(&mut pool, buf)
            } else {
                Some(buf)
            }
        };
        drop(refused);
    }

    /// Moves a command's data from the host (RDMA READ); the command runs
    /// when it has arrived.
    fn read_data(&self, qp: &Qp<QueueCq>, sqe: Sqe, remote: RemoteRegion, invalidate: Option<u32>) {
        let tag = self.next_tag.fetch_add(1, Ordering::Relaxed) & !WRITE_TAG;
        let started = self.buffer(remote.len as usize).and_then(|buf| {
            self.reads.lock().push(
                Reading {
                    tag,
                    sqe,
                    invalidate,
                },
                GFP_KERNEL,
            )?;
            Ok(buf)
        });
        let buf = match started {
            Ok(buf) => buf,
            Err(_) => {
                self.respond(qp, sqe.cid(), status::INTERNAL, 0, invalidate);
                return;
            }
        };
        self.post(qp, Waiting::Read(buf, remote, tag));
    }

    /// Runs a command whose data goes to the host, then RDMA WRITEs the
    /// data with the response chained behind.
    fn write_data(
        self: &Arc<Self>,
        qp: &Qp<QueueCq>,
        q: &QueueCtx<'_>,
        sqe: &Sqe,
        remote: RemoteRegion,
        invalidate: Option<u32>,
    ) {
        let mut buf = match self.buffer(remote.len as usize) {
            Ok(buf) => buf,
            Err(_) => {
                self.respond(qp, sqe.cid(), status::INTERNAL, 0, invalidate);
                return;
            }
        };
        match self.transport.subsys.execute(q, sqe, Data::Out(&mut buf)) {
            Outcome::Done { status: 0, result } => {
                match self.response(sqe.cid(), 0, result, invalidate) {
                    Ok(send) => self.post(qp, Waiting::WriteThenSend(buf, remote, send)),
                    Err(_) => self.fatal("no memory for a response", Failure::Request),
                }
            }
            outcome => self.finish(qp, sqe, outcome, invalidate),
        }
    }

    /// Completes a command with its outcome.
    fn finish(
        self: &Arc<Self>,
        qp: &Qp<QueueCq>,
        sqe: &Sqe,
        outcome: Outcome,
        invalidate: Option<u32>,
    ) {
        match outcome {
            Outcome::Done { status, result } => {
                self.respond(qp, sqe.cid(), status, result, invalidate)
            }
            Outcome::Held => {}
            Outcome::Connected { ctrl } => {
                let handle: Arc<dyn QueueHandle> = self.clone();
                if ctrl.attach(handle).is_err() {
                    self.respond(
                        qp,
                        sqe.cid(),
                        status::CONNECT_CTRL_BUSY | status::DNR,
                        0,
                        invalidate,
                    );
                    return;
                }
                let cntlid = ctrl.cntlid;
                *self.ctrl.lock() = Some(ctrl);
                self.respond(qp, sqe.cid(), 0, u64::from(cntlid), invalidate);
            }
        }
    }

    /// A response capsule (from the queue's free list when it has one).
    fn response(
        &self,
        cid: u16,
        status: u16,
        result: u64,
        invalidate: Option<u32>,
    ) -> Result<SendBuffer> {
        if self.ended.load(Ordering::Acquire) {
            return Err(ENOTCONN);
        }
        let free = self.sends.lock().pop();
        let mut send = match free {
            Some(send) => send,
            None => {
                let pd = self.pd.lock().clone().ok_or(ENOTCONN)?;
                SendBuffer::new(&pd, wire::CQE_LEN)?
            }
        };
        let head = (self.sq_head.fetch_add(1, Ordering::Relaxed) + 1) % u32::from(self.size);
        send.fill(&wire::cqe(result, head as u16, self.qid, cid, status))?;
        send.set_invalidate(invalidate);
        Ok(send)
    }

    fn respond(
        &self,
        qp: &Qp<QueueCq>,
        cid: u16,
        status: u16,
        result: u64,
        invalidate: Option<u32>,
    ) {
        match self.response(cid, status, result, invalidate) {
            Ok(send) => self.post(qp, Waiting::Send(send)),
            // The queue ended under the command (a disconnect, the device
            // deleted): the host fails the command when it reconnects.
            Err(e) if e == ENOTCONN => {}
            Err(_) => pr_warn!("queue {}: no response to command {}\n", self.qid, cid),
        }
    }

    /// Posts `what`, or keeps it for later when the send queue is full.
    fn post(&self, qp: &Qp<QueueCq>, what: Waiting) {
        if let Some(back) = Self::try_post(qp, what) {
            if !push_unlocked_drop(&self.waiting, back) {
                pr_warn!("queue {}: a transfer dropped\n", self.qid);
            }
        }
    }

    /// Posts `what`; gives it back when the send queue is full.
    fn try_post(qp: &Qp<QueueCq>, what: Waiting) -> Option<Waiting> {
        let full = |e: Error| e == ENOSPC || e == EAGAIN;
        match what {
            Waiting::Send(send) => match qp.post_send(send) {
                Err(PostError { error, value }) if full(error) => Some(Waiting::Send(value)),
                _ => None,
            },
            Waiting::Read(buf, remote, tag) => match qp.rdma_rw(RwOp::Read, buf, remote, tag) {
                Err(PostError { error, value }) if full(error) => {
                    Some(Waiting::Read(value, remote, tag))
                }
                _ => None,
            },
            Waiting::WriteThenSend(buf, remote, send) => {
                match qp.rdma_rw_then_send(RwOp::Write, buf, remote, WRITE_TAG, send) {
                    Err(PostError {
                        error,
                        value: (buf, Some(send)),
                    }) if full(error) => Some(Waiting::WriteThenSend(buf, remote, send)),
                    _ => None,
                }
            }
        }
    }

    /// Posts what waited for room, in order, until the queue is full again.
    fn post_waiting(&self, qp: &Qp<QueueCq>) {
        loop {
            let next = {
                let mut waiting = self.waiting.lock();
                if waiting.is_empty() {
                    return;
                }
                waiting.remove(0).ok()
            };
            let Some(next) = next else { return };
            if let Some(back) = Self::try_post(qp, next) {
                let refused = self.waiting.lock().insert_within_capacity(0, back);
                drop(refused);
                return;
            }
        }
    }

    fn repost(&self, qp: &Qp<QueueCq>, recv: RecvBuffer) {
        if let Err(PostError { error, .. }) = qp.post_recv(recv) {
            if error != ENOTCONN {
                pr_warn!("queue {}: receive not reposted: {:?}\n", self.qid, error);
            }
        }
    }
}

impl QueueHandle for Queue {
    fn disconnect(&self) {
        let id = self.id.lock().clone();
        if let Some(id) = id {
            let _ = id.disconnect();
        }
    }
}

/// Pushes `value` onto `list`; without room, drops it after the lock
/// (buffers are unmapped and freed outside a spinlock) and returns false.
fn push_unlocked_drop<T>(list: &SpinLock<KVec<T>>, value: T) -> bool {
    let refused = push_or_give_back(&mut list.lock(), value);
    let pushed = refused.is_none();
    drop(refused);
    pushed
}

/// Pushes `value` onto `list`, or gives it back without the memory.
fn push_or_give_back<T>(list: &mut KVec<T>, value: T) -> Option<T> {
    match list.reserve(1, GFP_ATOMIC) {
        Ok(()) => list.push_within_capacity(value).err().map(|e| e.0),
        Err(_) => Some(value),
    }
}

/// The completion handler of a queue's CQ.
pub(crate) struct QueueCq(Arc<Queue>);

impl QueueCq {
    fn queue(&self) -> &Arc<Queue> {
        &self.0
    }
}

impl CompletionHandler for QueueCq {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        let queue = self.queue();
        let Some(qp) = queue.qp() else { return };
        match result {
            Ok(_) => queue.command(&qp, buf),
            Err(e) => {
                if e != ECANCELED {
                    queue.fatal("receive failed", Failure::Request);
                }
            }
        }
    }

    fn send_done(&self, mut buf: SendBuffer, result: Result) {
        let queue = self.queue();
        let Some(qp) = queue.qp() else { return };
        // A flush too (ECANCELED), unlike nvmet-rdma's send_done: the RDMA
        // WRITEs chained before a response complete to no handler of ours
        // (unsignaled, or on iWARP the layer's no-op), so when one fails
        // (a key the host never registered) the flushed response is all
        // that tells (over iWARP [`Queue::fatal`] ends the queue only).  A
        // queue that ended first (the host's disconnect) has no QP here.
        if let Err(e) = result {
            queue.fatal("response not sent", Failure::of(e));
            return;
        }
        buf.set_invalidate(None);
        push_unlocked_drop(&queue.sends, buf);
        queue.post_waiting(&qp);
    }

    fn rw_done(&self, done: RwDone, result: Result) {
        let queue = self.queue();
        let Some(qp) = queue.qp() else { return };
        if done.tag & WRITE_TAG != 0 {
            // The response went with it; its completion reports both.
            queue.recycle(done.buf);
            queue.post_waiting(&qp);
            return;
        }
        let reading = {
            let mut reads = queue.reads.lock();
            let at = reads.iter().position(|r| r.tag == done.tag);
            at.and_then(|i| reads.remove(i).ok())
        };
        let Some(reading) = reading else { return };
        if let Err(e) = result {
            // A bad key or a host that went: the QP is in error.
            queue.fatal("RDMA READ of a command's data failed", Failure::of(e));
            return;
        }
        let ctrl = queue.ctrl.lock().clone();
        let q = queue.ctx(ctrl.as_ref());
        let outcome = queue
            .transport
            .subsys
            .execute(&q, &reading.sqe, Data::In(&done.buf, 0));
        queue.recycle(done.buf);
        queue.finish(&qp, &reading.sqe, outcome, reading.invalidate);
        queue.post_waiting(&qp);
    }

    fn qp_event(&self, _qp_num: u32, event: QpEvent) {
        if event.is_error() {
            self.0.fatal("QP error", Failure::QpError);
        }
    }
}
