// SPDX-License-Identifier: GPL-2.0

//! The data path of one connection: the module's QP, receives kept posted,
//! sends waited for or up to a window in flight, and registered regions for RDMA READ/WRITE with one
//! memory work request at a time (RC); or, on a UD id, datagrams to and from
//! the peers the id knows: the one its SIDR lookup found, and every sender
//! it received from.

use super::wait::{wait_busy, wait_notified, Wait, POLL_BUDGET};
use crate::{
    abi,
    rdma::{
        ah::GRH_SIZE, CompletionHandler, Cq, LockedId, Mr, MrAccess, Pd, PollContext, PostError,
        Qp, QpCaps, QpType, RecvBuffer, RemoteRegion, RwOp, SendBuffer, UdDest, WorkDone,
    },
};
use core::sync::atomic::{AtomicBool, Ordering};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex, MutexGuard},
    uaccess::{UserSliceReader, UserSliceWriter},
};

/// What completions changed, shared by the CQ handler and the ioctls, whose
/// waits run the handler themselves (they poll the CQ).
#[pin_data]
pub(crate) struct ConnShared {
    /// Received messages, oldest first; their buffers are reposted once read.
    #[pin]
    rx: Mutex<KVec<RecvBuffer>>,
    /// The QP flushed its receives (disconnect, device removal, teardown):
    /// nothing more will arrive, so RECV must not wait.
    rx_closed: AtomicBool,
    #[pin]
    tx: Mutex<TxState>,
    #[pin]
    work: Mutex<WorkState>,
}

/// Memory work requests, tagged 1, 2, ... in posting order; the send queue
/// completes them in that order.
struct WorkState {
    posted: u64,
    completed: u64,
    /// The result of the request tagged `completed`.
    result: Result,
}

/// Sends, counted 1, 2, ... in posting order: an RC send queue completes
/// them in that order, flushes included, so a count tells which send a
/// completion is.
struct TxState {
    /// Send buffers not in flight; at most [`abi::SEND_WINDOW`] exist
    /// (these and the `posted - completed` in flight), made when a send
    /// finds none free.
    free: KVec<SendBuffer>,
    posted: u64,
    completed: u64,
    /// The send a caller waits for, if any: its completion's result goes to
    /// `waited_result`, any other failure to `unreported`.
    waited: Option<u64>,
    waited_result: Option<Result>,
    /// The first failure of a send nobody waited for (NOWAIT, or one whose
    /// caller timed out), until a SEND returns it.
    unreported: Option<Error>,
}

impl TxState {
    /// A free buffer, made if none is free and the window allows.
    fn take_free(&mut self, pd: &Arc<Pd>) -> Result<Option<SendBuffer>> {
        if let Some(buf) = self.free.pop() {
            return Ok(Some(buf));
        }
        // Called with the lock held from the take to the post (or the
        // return to `free`): every buffer is free or counted in flight.
        let in_flight = self.posted - self.completed;
        if in_flight >= abi::SEND_WINDOW as u64 {
            return Ok(None);
        }
        // Room for every buffer that may come back.
        self.free.reserve(abi::SEND_WINDOW, GFP_KERNEL)?;
        Ok(Some(SendBuffer::new(pd, abi::MAX_MESSAGE)?))
    }
}

/// The CQ handler of a connection.
pub(crate) struct ConnCompletions {
    shared: Arc<ConnShared>,
}

impl CompletionHandler for ConnCompletions {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        let mut rx = self.shared.rx.lock();
        if result.is_ok() {
            // Cannot fail: the vector was reserved for every receive buffer.
            let _ = rx.push_within_capacity(buf);
        } else {
            // Flushed: the buffer is freed; waiting readers must give up.
            self.shared.rx_closed.store(true, Ordering::Release);
        }
    }

    fn send_done(&self, buf: SendBuffer, result: Result) {
        let mut tx = self.shared.tx.lock();
        // Cannot fail: reserved for every buffer made (`take_free`).
        let _ = tx.free.push_within_capacity(buf);
        tx.completed += 1;
        if tx.waited == Some(tx.completed) {
            tx.waited_result = Some(result);
        } else if let Err(e) = result {
            if tx.unreported.is_none() {
                tx.unreported = Some(e);
            }
        }
    }

    fn work_done(&self, done: WorkDone, result: Result) {
        {
            let mut work = self.shared.work.lock();
            work.completed = done.tag;
            work.result = result;
        }
        // The region's reference goes here, outside the lock: the last one
        // deregisters it, which may sleep.
        drop(done);
    }
}

/// The regions of a connection, by handle - 1.
type MrTable = [Option<Arc<Mr>>; abi::MAX_MRS];

/// The bytes of a send in user memory: a reader of exactly `len` bytes.
pub(crate) struct UserData {
    pub(crate) reader: UserSliceReader,
    pub(crate) len: usize,
}

/// The peers of a UD id, by handle - 1: a peer stays until the id goes, so
/// a handle user space holds never names another peer.
type PeerTable = KVec<UdDest>;

/// A received datagram, as `UD_RECV` reports it.
pub(crate) struct DatagramInfo {
    pub(crate) len: usize,
    pub(crate) imm: Option<u32>,
    /// 0 when the sender could not be given a handle (table full).
    pub(crate) peer: u32,
    pub(crate) src_qp: u32,
    pub(crate) src_gid: Option<[u8; 16]>,
}

/// One connection's data path.
#[pin_data]
pub(crate) struct Conn {
    qp: Arc<Qp<ConnCompletions>>,
    /// The connection's CQ, which only its callers process
    /// ([`PollContext::Notified`]): their waits poll it and sleep until the
    /// device notifies a completion, on a busy-polling id after polling
    /// it in a loop first (`busy_poll`).
    cq: Arc<Cq<ConnCompletions>>,
    /// A busy-polling id's (`RDMA_CM_RS_ID_BUSY_POLL`): waits poll before
    /// they sleep ([`wait_busy`]).
    busy_poll: bool,
    pd: Arc<Pd>,
    shared: Arc<ConnShared>,
    #[pin]
    mrs: Mutex<MrTable>,
    /// Serialises memory work requests: one in flight at a time.
    #[pin]
    work_ops: Mutex<()>,
    /// Serialises the sends that wait for their completion: one waited
    /// for at a time ([`TxState::waited`]).
    #[pin]
    waited_sends: Mutex<()>,
    /// UD ids: the peers.
    #[pin]
    peers: Mutex<PeerTable>,
}

/// Of the sends nobody waits for (`NOWAIT`), every this many asks for a
/// completion; the others are given back before it (selective
/// signaling), so a window of [`abi::SEND_WINDOW`] always has one that
/// completes.  Half the window: a full window frees half its buffers at a
/// time.
const SIGNAL_EVERY: u64 = abi::SEND_WINDOW as u64 / 2;
const _: () = assert!(SIGNAL_EVERY > 0, "a window of at least 2 sends");

/// Send and memory work timeout when the caller gives none.
const DEFAULT_SEND_TIMEOUT_MS: u32 = 5000;

fn timeout_or_default(timeout_ms: u32) -> u32 {
    if timeout_ms == 0 {
        DEFAULT_SEND_TIMEOUT_MS
    } else {
        timeout_ms
    }
}

impl Conn {
    /// Creates PD, CQ and QP (of the id's type) on a locked id and posts
    /// the receives.  The connection's calls process its CQ in their
    /// callers' tasks: their waits sleep until the device notifies a
    /// completion, with `busy_poll` after polling it in a loop for a while.
    /// On failure the caller destroys the QP, if one was made.
    pub(crate) fn setup(id: &LockedId<'_>, busy_poll: bool) -> Result<Arc<Self>> {
        let dev = id.device()?;
        let qp_type = id.qp_type();
        let pd = Pd::alloc(id.owner(), &dev)?;
        let mut rx = KVec::new();
        rx.reserve(abi::RECV_DEPTH, GFP_KERNEL)?;
        let shared = Arc::pin_init(
            pin_init!(ConnShared {
                rx <- new_mutex!(rx),
                rx_closed: AtomicBool::new(false),
                tx <- new_mutex!(TxState {
                    free: KVec::new(),
                    posted: 0,
                    completed: 0,
                    waited: None,
                    waited_result: None,
                    unreported: None,
                }),
                work <- new_mutex!(WorkState {
                    posted: 0,
                    completed: 0,
                    result: Ok(()),
                }),
            }),
            GFP_KERNEL,
        )?;
        let caps = QpCaps {
            // The send window and one memory work request in flight (more
            // after timeouts: a timed-out request still holds its slot).
            max_send_wr: abi::SEND_WINDOW as u32 + 8,
            max_recv_wr: abi::RECV_DEPTH as u32,
            max_inline_data: 0,
            ..QpCaps::default()
        };
        let cq = Cq::alloc_with(
            id.owner(),
            &dev,
            caps.cq_entries()?,
            0,
            PollContext::Notified,
            ConnCompletions {
                shared: shared.clone(),
            },
        )?;
        let qp = id.create_qp(&pd, &cq, caps)?;
        // A UD receive starts with the global route header.
        let recv_size = match qp_type {
            QpType::Rc => abi::MAX_MESSAGE,
            QpType::Ud => abi::MAX_MESSAGE + GRH_SIZE,
        };
        for _ in 0..abi::RECV_DEPTH {
            let buf = RecvBuffer::new(&pd, recv_size)?;
            qp.post_recv(buf).map_err(Error::from)?;
        }
        let mut peers = KVec::new();
        if qp_type == QpType::Ud {
            peers.reserve(abi::MAX_UD_PEERS, GFP_KERNEL)?;
        }
        {
            // One buffer up front: the first SEND of a connection needs no
            // allocation.
            let mut tx = shared.tx.lock();
            if let Some(buf) = tx.take_free(&pd)? {
                let _ = tx.free.push_within_capacity(buf);
            }
        }
        Arc::pin_init(
            pin_init!(Self {
                qp,
                cq,
                busy_poll,
                pd,
                shared,
                mrs <- new_mutex!([const { None }; abi::MAX_MRS]),
                work_ops <- new_mutex!(()),
                waited_sends <- new_mutex!(()),
                peers <- new_mutex!(peers),
            }),
            GFP_KERNEL,
        )
    }

    /// Sends one message and waits for its completion, or with `nowait`
    /// returns once it is posted.  `wait` bounds each wait: for a free
    /// buffer, then for the completion.
    pub(crate) fn send(&self, data: UserData, wait: Wait, nowait: bool) -> Result {
        self.send_with(data, None, wait, nowait, |buf| self.qp.post_send(buf))
    }

    /// The waits of SEND and UD_SEND: up to `timeout_ms`, or the default
    /// for 0; never non-blocking (the file's `O_NONBLOCK` is for RECV).
    pub(crate) fn send_wait(timeout_ms: u32) -> Wait {
        Wait::new(timeout_or_default(timeout_ms), false)
    }

    /// Sends one datagram to a peer and waits for its completion: `EINVAL`
    /// for a handle the id does not have, `EMSGSIZE` above the path MTU.
    pub(crate) fn ud_send(
        &self,
        peer: u32,
        data: UserData,
        imm: Option<u32>,
        timeout_ms: u32,
    ) -> Result {
        let dest = {
            let index = usize::try_from(peer).map_err(|_| EINVAL)?.wrapping_sub(1);
            self.peers.lock().get(index).cloned().ok_or(EINVAL)?
        };
        if data.len > self.max_datagram() {
            return Err(EMSGSIZE);
        }
        self.send_with(data, imm, Self::send_wait(timeout_ms), false, |buf| {
            self.qp.post_send_ud(buf, &dest)
        })
    }

    /// The QP's type.
    pub(crate) fn qp_type(&self) -> QpType {
        self.qp.qp_type()
    }

    /// UD: the largest datagram (the path MTU, within the ABI's message
    /// size); 0 on RC.
    pub(crate) fn max_datagram(&self) -> usize {
        self.qp.max_datagram().min(abi::MAX_MESSAGE)
    }

    /// UD: the QP's Q_Key.
    pub(crate) fn qkey(&self) -> u32 {
        self.qp.qkey()
    }

    /// The PD of the QP: address handles for it are made on this one.
    pub(crate) fn pd(&self) -> &Arc<Pd> {
        &self.pd
    }

    /// Gives a destination a peer handle, or returns the handle of the
    /// peer it already is (same remote QP and GID): `ENOSPC` once the id
    /// has [`abi::MAX_UD_PEERS`].
    pub(crate) fn add_peer(&self, dest: UdDest) -> Result<u32> {
        let mut peers = self.peers.lock();
        if let Some(found) = Self::find_peer(&peers, dest.qp_num(), dest.gid()) {
            return Ok(found);
        }
        // Reserved for every peer at setup: never allocates.
        peers.push_within_capacity(dest).map_err(|_| ENOSPC)?;
        Ok(peers.len() as u32)
    }

    fn find_peer(peers: &PeerTable, qp_num: u32, gid: Option<[u8; 16]>) -> Option<u32> {
        peers
            .iter()
            .position(|p| p.qp_num() == qp_num && p.gid() == gid)
            .map(|i| i as u32 + 1)
    }

    /// Posts one send through `post`: first the failure of an earlier send
    /// nobody waited for, if any (then nothing is sent); then a free buffer,
    /// waited for if the window is full; then, unless `nowait`, its
    /// completion.  A waited send that times out leaves its completion to
    /// [`TxState::unreported`].
    fn send_with(
        &self,
        mut data: UserData,
        imm: Option<u32>,
        wait: Wait,
        nowait: bool,
        post: impl FnOnce(SendBuffer) -> Result<(), PostError<SendBuffer>>,
    ) -> Result {
        let _waited = (!nowait).then(|| self.waited_sends.lock());
        // What came meanwhile first: buffers back, and on iWARP's passive
        // side the peer's first message, which lets sends go.
        self.poll_on_the_way();
        let shared = &self.shared;
        let mut tx = shared.tx.lock();
        if let Some(e) = tx.unreported.take() {
            return Err(e);
        }
        let mut buf = loop {
            if let Some(buf) = tx.take_free(&self.pd)? {
                break buf;
            }
            let waited = self.wait_until(&shared.tx, tx, wait, |t| !t.free.is_empty());
            tx = waited.0;
            waited.1?;
        };
        // Straight from user memory into the buffer, without the lock,
        // which the send's completion takes: a copy that user space stalls
        // (userfaultfd, FUSE) must not stall the connection's completions.
        drop(tx);
        let filled = buf.fill_with(data.len, |dst| data.reader.read_slice(dst));
        let mut tx = shared.tx.lock();
        if let Err(e) = filled {
            let _ = tx.free.push_within_capacity(buf);
            return Err(e);
        }
        buf.set_imm(imm);
        let seq = tx.posted + 1;
        // A waited send needs its own completion.  A UD send is waited.
        buf.set_unsignaled(nowait && seq % SIGNAL_EVERY != 0);
        if !nowait {
            tx.waited = Some(seq);
            tx.waited_result = None;
        }
        // The completion may run at once on another CPU: it waits for this
        // lock, so it finds `posted` and `waited` as they are after the post.
        if let Err(PostError {
            error: e,
            value: buf,
        }) = post(buf)
        {
            tx.waited = None;
            let _ = tx.free.push_within_capacity(buf);
            return Err(e);
        }
        tx.posted = seq;
        if nowait {
            return Ok(());
        }
        let (mut tx, r) = self.wait_until(&shared.tx, tx, wait, |t| t.completed >= seq);
        tx.waited = None;
        r?;
        match tx.waited_result.take() {
            Some(Ok(())) => Ok(()),
            // A send flushed behind an earlier failure: that one is the
            // cause.
            Some(Err(e)) => Err(tx.unreported.take().unwrap_or(e)),
            None => Err(EIO),
        }
    }

    /// Copies the oldest received message to `out` (at most `capacity`
    /// bytes), returns its length and reposts its buffer.
    pub(crate) fn recv(
        &self,
        out: &mut UserSliceWriter,
        capacity: usize,
        wait: Wait,
    ) -> Result<usize> {
        self.recv_with(out, capacity, wait, |_| Ok(()))
    }

    /// UD: copies the oldest datagram to `out` like [`Self::recv`] and
    /// reports its sender, giving a sender seen for the first time a peer
    /// handle (an address handle back to it: this may sleep).
    pub(crate) fn ud_recv(
        &self,
        out: &mut UserSliceWriter,
        capacity: usize,
        wait: Wait,
    ) -> Result<DatagramInfo> {
        let mut info = DatagramInfo {
            len: 0,
            imm: None,
            peer: 0,
            src_qp: 0,
            src_gid: None,
        };
        info.len = self.recv_with(out, capacity, wait, |buf| {
            let datagram = buf.datagram().ok_or(EIO)?;
            info.imm = buf.imm();
            info.src_qp = datagram.src_qp();
            info.src_gid = datagram.src_gid();
            let known = Self::find_peer(&self.peers.lock(), info.src_qp, info.src_gid);
            info.peer = match known {
                Some(peer) => peer,
                // A sender that cannot get a handle (table full, no
                // memory, no route back) is still reported, with peer 0:
                // the datagram is delivered, only a reply is impossible.
                None => self
                    .qp
                    .reply_dest(buf)
                    .and_then(|dest| self.add_peer(dest))
                    .unwrap_or(0),
            };
            Ok(())
        })?;
        Ok(info)
    }

    fn recv_with(
        &self,
        out: &mut UserSliceWriter,
        capacity: usize,
        wait: Wait,
        inspect: impl FnOnce(&RecvBuffer) -> Result,
    ) -> Result<usize> {
        let buf = {
            let shared = &self.shared;
            let rx = shared.rx.lock();
            let closed = &shared.rx_closed;
            let (mut rx, r) = self.wait_until(&shared.rx, rx, wait, |q| {
                !q.is_empty() || closed.load(Ordering::Acquire)
            });
            r?;
            if rx.is_empty() {
                return Err(ENOTCONN);
            }
            if rx[0].data().len() > capacity {
                return Err(EMSGSIZE);
            }
            rx.remove(0)?
        };
        // The copy may fault and sleep: not with the receive lock held,
        // which the completion handler, the drain and device removal need.
        if let Err(e) = inspect(&buf).and_then(|()| out.write_slice(buf.data())) {
            // A bad user pointer loses nothing: the message goes back first
            // (capacity for every receive buffer was reserved).
            let mut rx = self.shared.rx.lock();
            if rx.insert_within_capacity(0, buf).is_err() {
                return Err(EIO);
            }
            return Err(e);
        }
        let len = buf.data().len();
        // After a disconnect the QP flushes this at once, freeing the buffer.
        let _ = self.qp.post_recv(buf);
        Ok(len)
    }

    /// Runs one memory work request: waits for any earlier one (which may
    /// have timed out), posts through `post` with the next tag and waits for
    /// its completion.
    fn run_work<T>(&self, timeout_ms: u32, post: impl FnOnce(u64) -> Result<T>) -> Result<T> {
        let wait = Wait::new(timeout_or_default(timeout_ms), false);
        let _serial = self.work_ops.lock();
        // As in `send_with`: before the post, what arrived.
        self.poll_on_the_way();
        let shared = &self.shared;
        let work = shared.work.lock();
        let (mut work, r) = self.wait_until(&shared.work, work, wait, |w| w.completed == w.posted);
        r?;
        let tag = work.posted + 1;
        // The completion may run at once on another CPU; it waits for this
        // lock, so `posted` is updated before it is compared.
        let value = post(tag)?;
        work.posted = tag;
        let (mut work, r) = self.wait_until(&shared.work, work, wait, |w| w.completed >= tag);
        r?;
        core::mem::replace(&mut work.result, Ok(()))?;
        Ok(value)
    }

    /// Runs the handler for what the CQ holds, keeping the CPU: on the way
    /// to a post, not in a wait's loop.
    fn poll_on_the_way(&self) {
        // `EBUSY`: another caller polls, and its poll runs the handler that
        // changes what this one checks.
        let _ = self.cq.poll_once(POLL_BUDGET);
    }

    /// Waits until `ready` holds for the state `mutex` guards, processing
    /// the CQ in the caller's task: polling it and sleeping until the
    /// device notifies, on a busy-polling connection after a spell of
    /// polling in a loop.
    fn wait_until<'a, T>(
        &self,
        mutex: &'a Mutex<T>,
        guard: MutexGuard<'a, T>,
        wait: Wait,
        ready: impl Fn(&T) -> bool,
    ) -> (MutexGuard<'a, T>, Result) {
        if self.busy_poll {
            return wait_busy(mutex, guard, wait, &self.cq, ready);
        }
        wait_notified(mutex, guard, wait, &self.cq, ready)
    }

    fn mr(&self, handle: u32) -> Result<Arc<Mr>> {
        let index = usize::try_from(handle).map_err(|_| EINVAL)?.wrapping_sub(1);
        let mrs = self.mrs.lock();
        mrs.get(index).and_then(Clone::clone).ok_or(EINVAL)
    }

    /// Allocates and registers a region of `len` bytes; returns its handle
    /// and what the peer needs to reach it.
    pub(crate) fn register(
        &self,
        len: usize,
        access: MrAccess,
        timeout_ms: u32,
    ) -> Result<(u32, RemoteRegion)> {
        if len == 0 || len > abi::MAX_MR_LEN {
            return Err(EINVAL);
        }
        let index = {
            let mrs = self.mrs.lock();
            mrs.iter().position(Option::is_none).ok_or(ENOSPC)?
        };
        let mr = Mr::new(&self.pd, len)?;
        let remote = self.run_work(timeout_ms, |tag| self.qp.register(&mr, access, tag))?;
        let mut mrs = self.mrs.lock();
        // Another registration may have taken the slot meanwhile.
        let index = if mrs[index].is_none() {
            index
        } else {
            mrs.iter().position(Option::is_none).ok_or(ENOSPC)?
        };
        mrs[index] = Some(mr);
        Ok((index as u32 + 1, remote))
    }

    /// Invalidates, deregisters and frees a region.  The region leaves the
    /// table first; an invalidation that cannot run (QP in error) is no
    /// failure, since deregistration revokes the key as well.
    pub(crate) fn deregister(&self, handle: u32, timeout_ms: u32) -> Result {
        let mr = {
            let index = usize::try_from(handle).map_err(|_| EINVAL)?.wrapping_sub(1);
            let mut mrs = self.mrs.lock();
            mrs.get_mut(index).and_then(Option::take).ok_or(EINVAL)?
        };
        let invalidated = self.run_work(timeout_ms, |tag| self.qp.invalidate(&mr, tag));
        // Dropping the last reference deregisters (`ib_dereg_mr`).
        drop(mr);
        match invalidated {
            Err(e) if e == ETIMEDOUT || e == ERESTARTSYS => Err(e),
            _ => Ok(()),
        }
    }

    /// Copies `data` into a region.
    pub(crate) fn mr_write(&self, handle: u32, offset: usize, data: &[u8]) -> Result {
        self.mr(handle)?.write(offset, data)
    }

    /// Copies `out.len()` bytes out of a region.
    pub(crate) fn mr_read(&self, handle: u32, offset: usize, out: &mut [u8]) -> Result {
        self.mr(handle)?.read(offset, out)
    }

    /// Checks a copy's range against a region before any user memory moves.
    pub(crate) fn mr_check(&self, handle: u32, offset: usize, len: usize) -> Result {
        self.mr(handle)?.check_range(offset, len)
    }

    /// One RDMA READ or WRITE, waited for.
    pub(crate) fn rdma(
        &self,
        op: RwOp,
        handle: u32,
        offset: usize,
        remote: RemoteRegion,
        timeout_ms: u32,
    ) -> Result {
        let mr = self.mr(handle)?;
        self.run_work(timeout_ms, |tag| self.qp.rdma(op, &mr, offset, remote, tag))
    }
}
