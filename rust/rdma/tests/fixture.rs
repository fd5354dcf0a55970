// SPDX-License-Identifier: GPL-2.0

//! KUnit fixtures of the suites that connect kernel ids: a listener and its
//! world, synchronous clients, QPs whose handler records what it saw, and
//! connected pairs on rxe or siw.

use super::{take_out, wait_until};
use crate::rdma::{
    addr::SocketAddr,
    cm::*,
    conn_param::ConnParam,
    event::*,
    mr::{Mr, MrAccess, RemoteRegion},
    net::NetNs,
    owner::{ModuleOwner, Owner},
    pd::Pd,
    sg::SgBuffer,
    synchronous::{EventWaiter, SyncOutcome},
    verbs::{
        CompletionHandler, Cq, PollContext, Qp, QpCaps, QpEvent, RecvBuffer, RwDone, SendBuffer,
        WorkDone, FLUSH_TIMEOUT,
    },
    QpType,
};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
    time::{Delta, Instant, Monotonic},
    workqueue,
};

pub(super) fn ms(ms: i64) -> Delta {
    Delta::from_millis(ms)
}

/// The case's own owner: declared first in a case, it drops last and waits
/// for every object the case made the C side can call back (a leak keeps
/// the case waiting, and says so after 10 s).
pub(super) fn owner() -> ModuleOwner {
    ModuleOwner::new::<crate::LocalModule>().expect("an owner for the case")
}

/// A CM handler and a completion handler that do nothing.
#[derive(Clone)]
pub(super) struct Nop;
impl Handler for Nop {
    fn event(&self, _id: &LockedId<'_>, _event: &Event<'_>) {}
}
impl CompletionHandler for Nop {
    fn recv_done(&self, _buf: RecvBuffer, _result: Result<usize>) {}
    fn send_done(&self, _buf: SendBuffer, _result: Result) {}
}

/// A PD of `l`'s device and a QP on it of `max_wr` sends and receives,
/// completing on a [`Nop`] CQ.
pub(super) fn nop_qp(l: &LockedId<'_>, max_wr: u32) -> Result<(Arc<Pd>, Arc<Qp<Nop>>)> {
    let dev = l.device()?;
    let pd = Pd::alloc(l.owner(), &dev)?;
    let caps = QpCaps {
        max_send_wr: max_wr,
        max_recv_wr: max_wr,
        max_inline_data: 0,
        ..QpCaps::default()
    };
    let cq = Cq::alloc(l.owner(), &dev, caps.cq_entries()?, Nop)?;
    let qp = l.create_qp(&pd, &cq, caps)?;
    Ok((pd, qp))
}

/// What the listener adopted and the accepting work saw.
#[derive(Default)]
pub(super) struct Seen {
    pub(super) server: Option<Arc<CmId<Node>>>,
    pub(super) accepted: Option<Result<SyncOutcome>>,
    /// REJECTED events of any id of the world.
    pub(super) rejected: u32,
}

#[pin_data]
pub(super) struct World {
    #[pin]
    pub(super) seen: Mutex<Seen>,
    /// The case's: what the world's ids are made for.
    pub(super) owner: Owner,
}

/// A listener (no waiter) or a synchronous id (a waiter).
pub(super) struct Node {
    world: Arc<World>,
    waiter: Option<Pin<KBox<EventWaiter>>>,
}

impl Node {
    pub(super) fn synchronous(world: &Arc<World>) -> Result<Self> {
        Ok(Self {
            world: world.clone(),
            waiter: Some(KBox::pin_init(EventWaiter::new(), GFP_KERNEL)?),
        })
    }
}

impl Handler for Node {
    fn event(&self, _id: &LockedId<'_>, event: &Event<'_>) {
        if event.kind() == EventType::Rejected {
            self.world.seen.lock().rejected += 1;
        }
    }

    fn connect_request(&self, request: ConnectRequest<'_, Self>, _event: &Event<'_>) {
        let Ok(node) = Node::synchronous(&self.world) else {
            return;
        };
        if let Ok(id) = request.adopt(node) {
            if let Ok(id) = Arc::new(id, GFP_KERNEL) {
                self.world.seen.lock().server = Some(id);
            }
        }
    }

    fn waiter(&self) -> Option<&EventWaiter> {
        self.waiter.as_deref()
    }
}

pub(super) fn with_qp<H: Handler>(id: &CmId<H>) -> Result {
    id.with_lock(|l| nop_qp(l, 2).map(drop))
}

/// A synchronous RC id of `world`, unresolved.
pub(super) fn sync_client(world: &Arc<World>, ns: &NetNs) -> Result<CmId<Node>> {
    CmId::new(
        &world.owner,
        Node::synchronous(world)?,
        ns,
        PortSpace::Tcp,
        QpType::Rc,
    )
}

/// A synchronous id with `handler` whose address and route to `addr` are
/// resolved.
pub(super) fn resolved_client<H: Handler>(
    owner: &Owner,
    handler: H,
    ns: &NetNs,
    addr: &SocketAddr,
) -> Result<CmId<H>> {
    let client = CmId::new(owner, handler, ns, PortSpace::Tcp, QpType::Rc)?;
    client
        .resolve_addr_sync(None, addr, ms(2000), Some(ms(5000)))?
        .into_event()?;
    client
        .resolve_route_sync(ms(2000), Some(ms(5000)))?
        .into_event()?;
    Ok(client)
}

/// A synchronous client of `world` with its address and route to
/// `addr` resolved and a QP, ready to connect.
pub(super) fn ready_client(
    world: &Arc<World>,
    ns: &NetNs,
    addr: &SocketAddr,
) -> Result<CmId<Node>> {
    let client = resolved_client(&world.owner, Node::synchronous(world)?, ns, addr)?;
    with_qp(&client)?;
    Ok(client)
}

/// Accepts from a work item, with `param` and the QP `make_qp` gives it,
/// the request that `world`'s listener adopts (waited for up to 5 s); the
/// outcome goes to `world.seen.accepted`.  The accept and the client's
/// connect block at once, each until its own ESTABLISHED.
pub(super) fn accept_in_background(
    world: &Arc<World>,
    param: Option<ConnParam>,
    make_qp: impl FnOnce(&CmId<Node>) -> Result + Send + 'static,
) -> Result {
    let w = world.clone();
    workqueue::system()
        .try_spawn(GFP_KERNEL, move || {
            let server = if wait_until(|| w.seen.lock().server.is_some()) {
                w.seen.lock().server.clone()
            } else {
                None
            };
            let accepted = server.ok_or(ENOENT).and_then(|server| {
                make_qp(&server)?;
                server.accept_sync(param.as_ref(), Some(ms(5000)))
            });
            w.seen.lock().accepted = Some(accepted);
        })
        .map_err(|_| ENOMEM)
}

/// A world and a listener of it (no waiter) on rxe at `port`; `None`
/// (the test skipped) without the device.
pub(super) fn listening(
    owner: &Owner,
    ns: &NetNs,
    port: u16,
) -> Option<(Arc<World>, CmId<Node>, SocketAddr)> {
    listening_at(owner, ns, RXE_IP, port)
}

/// The address of the test VM's rxe device, and of its siw device.
pub(super) const RXE_IP: [u8; 4] = [192, 0, 2, 1];
pub(super) const SIW_IP: [u8; 4] = [203, 0, 113, 1];

/// [`listening`] on the device at `ip`.
pub(super) fn listening_at(
    owner: &Owner,
    ns: &NetNs,
    ip: [u8; 4],
    port: u16,
) -> Option<(Arc<World>, CmId<Node>, SocketAddr)> {
    let world = Arc::pin_init(
        pin_init!(World {
            seen <- new_mutex!(Seen::default()),
            owner: owner.clone(),
        }),
        GFP_KERNEL,
    )
    .unwrap();
    let addr = SocketAddr::V4 { ip, port };
    let node = Node {
        world: world.clone(),
        waiter: None,
    };
    let listener = CmId::new(owner, node, ns, PortSpace::Tcp, QpType::Rc).unwrap();
    if let Err(e) = listener.with_lock(|l| l.bind(&addr)) {
        super::skip_without_devices(e);
        return None;
    }
    listener.listen(4).unwrap();
    Some((world, listener, addr))
}

/// What a QP's handler saw of its QP's events and completions.
#[derive(Default)]
pub(super) struct QpSeen {
    pub(super) access_errors: AtomicU32,
    other_events: AtomicU32,
    /// Memory work that failed with `EACCES`.
    pub(super) refused_work: AtomicU32,
    /// Receives that completed, and the key the last one invalidated
    /// (0: none).
    pub(super) received: AtomicU32,
    pub(super) invalidated_rkey: AtomicU32,
    /// Receives that came back flushed (`ECANCELED`).
    pub(super) recvs_flushed: AtomicU32,
    /// The last receive's length and [`digest`].
    pub(super) last_len: AtomicU32,
    pub(super) last_digest: AtomicU32,
    /// The QP the last receive arrived on.
    pub(super) last_qp_num: AtomicU32,
    /// Memory work that succeeded, that was flushed, and all of it.
    pub(super) work_ok: AtomicU32,
    pub(super) work_flushed: AtomicU32,
    pub(super) work_back: AtomicU32,
    /// R/W transfers given back, the successful ones, and the
    /// [`digest`] of the last successful one's buffer.
    pub(super) rw_back: AtomicU32,
    pub(super) rw_ok: AtomicU32,
    pub(super) rw_digest: AtomicU32,
    /// Send buffers given back, failed ones, and the first byte of
    /// the last eight given back (the latest in the low byte).
    pub(super) sends_back: AtomicU32,
    pub(super) sends_failed: AtomicU32,
    pub(super) send_log: AtomicU64,
    /// `work_ok` when the last send was given back.
    pub(super) work_ok_at_send: AtomicU32,
    /// Sends and receives given back with their pages attached.
    pub(super) send_pages_back: AtomicU32,
    pub(super) recv_pages_back: AtomicU32,
}

impl QpSeen {
    /// Whether the `n`th receive completed within 5 s, and the length
    /// and [`digest`] of the last one received by then.
    pub(super) fn arrival(&self, n: u32) -> (bool, u32, u32) {
        let arrived = wait_until(|| self.received.load(Ordering::Acquire) == n);
        (
            arrived,
            self.last_len.load(Ordering::Acquire),
            self.last_digest.load(Ordering::Acquire),
        )
    }
}

/// FNV-1a of `bytes`: enough to tell a message from a damaged one.
pub(super) fn digest(bytes: &[u8]) -> u32 {
    digest_on(0x811c_9dc5, bytes)
}

/// [`digest`] of bytes that follow those whose digest is `h`.
pub(super) fn digest_on(h: u32, bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .fold(h, |h, &b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193))
}

/// The digest of the first `len` bytes of `pages`, following `h`.
pub(super) fn digest_pages(h: u32, pages: &SgBuffer, len: usize) -> Result<u32> {
    let mut bytes = KVec::new();
    bytes.resize(len, 0, GFP_KERNEL)?;
    if len > 0 {
        pages.read(0, &mut bytes)?;
    }
    Ok(digest_on(h, &bytes))
}

#[derive(Clone)]
pub(super) struct Recording(pub(super) Arc<QpSeen>);

impl CompletionHandler for Recording {
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>) {
        if result == Err(ECANCELED) {
            self.0.recvs_flushed.fetch_add(1, Ordering::AcqRel);
        }
        if result.is_ok() {
            let rkey = buf.invalidated_rkey().unwrap_or(0);
            self.0.invalidated_rkey.store(rkey, Ordering::Release);
            // A message is the buffer's bytes, then what went into its
            // pages.
            let len = (buf.data().len() + buf.paged_len()) as u32;
            self.0.last_len.store(len, Ordering::Release);
            let mut h = digest(buf.data());
            if let Some(pages) = buf.pages() {
                h = digest_pages(h, pages, buf.paged_len()).unwrap_or(0);
                self.0.recv_pages_back.fetch_add(1, Ordering::AcqRel);
            }
            self.0.last_digest.store(h, Ordering::Release);
            let qp_num = buf.qp_num().unwrap_or(0);
            self.0.last_qp_num.store(qp_num, Ordering::Release);
            self.0.received.fetch_add(1, Ordering::AcqRel);
        }
    }
    fn send_done(&self, buf: SendBuffer, result: Result) {
        let first = u64::from(buf.data().first().copied().unwrap_or(0));
        let _ = self
            .0
            .send_log
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |log| {
                Some(log << 8 | first)
            });
        if result.is_err() {
            self.0.sends_failed.fetch_add(1, Ordering::AcqRel);
        }
        let work_ok = self.0.work_ok.load(Ordering::Acquire);
        self.0.work_ok_at_send.store(work_ok, Ordering::Release);
        if buf.pages().is_some() {
            self.0.send_pages_back.fetch_add(1, Ordering::AcqRel);
        }
        self.0.sends_back.fetch_add(1, Ordering::AcqRel);
    }
    fn work_done(&self, _done: WorkDone, result: Result) {
        self.0.work_back.fetch_add(1, Ordering::AcqRel);
        if result == Err(EACCES) {
            self.0.refused_work.fetch_add(1, Ordering::AcqRel);
        }
        if result.is_ok() {
            self.0.work_ok.fetch_add(1, Ordering::AcqRel);
        }
        if result == Err(ECANCELED) {
            self.0.work_flushed.fetch_add(1, Ordering::AcqRel);
        }
    }
    fn rw_done(&self, done: RwDone, result: Result) {
        if result.is_ok() {
            let mut bytes = KVec::new();
            if bytes.resize(done.buf.len(), 0, GFP_KERNEL).is_ok()
                && done.buf.read(0, &mut bytes).is_ok()
            {
                self.0.rw_digest.store(digest(&bytes), Ordering::Release);
            }
            self.0.rw_ok.fetch_add(1, Ordering::AcqRel);
        }
        self.0.rw_back.fetch_add(1, Ordering::AcqRel);
    }
    fn qp_event(&self, _qp_num: u32, event: QpEvent) {
        // Atomic context: counters only.
        if event == QpEvent::AccessError {
            self.0.access_errors.fetch_add(1, Ordering::AcqRel);
        } else {
            self.0.other_events.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// Bytes a send of a [`recording_qp`] may carry inline.
pub(super) const INLINE: usize = 64;

/// A [`recording_qp`] and its CQ.
pub(super) type RecordingQp = (Arc<Qp<Recording>>, Arc<Cq<Recording>>);

/// A QP with a [`Recording`] handler on a CQ polled from `poll`, and
/// four receives posted (which it does not post again).
pub(super) fn recording_qp(
    id: &CmId<Node>,
    seen: &Arc<QpSeen>,
    poll: PollContext,
) -> Result<RecordingQp> {
    recording_qp_with(id, seen, poll, RECORDING_CAPS, RECORDING_CAPS.max_recv_wr)
}

/// The queues of a [`recording_qp`].
pub(super) const RECORDING_CAPS: QpCaps = QpCaps {
    max_send_wr: 4,
    max_recv_wr: 4,
    max_inline_data: INLINE as u32,
    max_send_sge: 4,
    max_recv_sge: 4,
    max_rdma_ctxs: 2,
};

/// [`recording_qp`] with `caps`, and `recvs` receives of 64 bytes
/// posted.
pub(super) fn recording_qp_with(
    id: &CmId<Node>,
    seen: &Arc<QpSeen>,
    poll: PollContext,
    caps: QpCaps,
    recvs: u32,
) -> Result<RecordingQp> {
    id.with_lock(|l| {
        let dev = l.device()?;
        let pd = Pd::alloc(l.owner(), &dev)?;
        let cq = Cq::alloc_with(
            l.owner(),
            &dev,
            caps.cq_entries()?,
            0,
            poll,
            Recording(seen.clone()),
        )?;
        let qp = l.create_qp(&pd, &cq, caps)?;
        for _ in 0..recvs {
            qp.post_recv(RecvBuffer::new(&pd, 64)?)
                .map_err(Error::from)?;
        }
        Ok((qp, cq))
    })
}

/// Two kernel ids connected over rxe, each with a [`Recording`] QP.
pub(super) struct Pair {
    /// Held: dropping an id destroys it and its QP.
    pub(super) _client: CmId<Node>,
    pub(super) client_qp: Arc<Qp<Recording>>,
    pub(super) client_cq: Arc<Cq<Recording>>,
    pub(super) client_seen: Arc<QpSeen>,
    _server: Arc<CmId<Node>>,
    pub(super) server_qp: Arc<Qp<Recording>>,
    pub(super) server_seen: Arc<QpSeen>,
    _listener: CmId<Node>,
}

impl Pair {
    /// A region of `len` bytes of the server's, registered for the client
    /// to read and write (tag 1), and whether the registration completed.
    pub(super) fn server_region(&self, len: usize) -> (Arc<Mr>, RemoteRegion, bool) {
        let region = Mr::new(self.server_qp.pd(), len).unwrap();
        let access = MrAccess {
            remote_read: true,
            remote_write: true,
        };
        let remote = self.server_qp.register(&region, access, 1).unwrap();
        let registered = wait_until(|| self.server_seen.work_ok.load(Ordering::Acquire) == 1);
        (region, remote, registered)
    }
}

/// Connects a [`Pair`] through a listener on `port`; `None` (the test
/// skipped) without rxe.
pub(super) fn connected_pair(owner: &Owner, ns: &NetNs, port: u16) -> Option<Pair> {
    connected_pair_polled(owner, ns, port, PollContext::Workqueue)
}

/// [`connected_pair`], the client's CQ polled from `client_poll`.
pub(super) fn connected_pair_polled(
    owner: &Owner,
    ns: &NetNs,
    port: u16,
    client_poll: PollContext,
) -> Option<Pair> {
    recording_pair(owner, ns, RXE_IP, port, client_poll, 0)
}

/// A [`Pair`] through a listener on the device at `ip`, the client's
/// CQ polled from `client_poll`, both sides offering `read_depth` RDMA
/// READs each way; `None` (the test skipped) without the device.
pub(super) fn recording_pair(
    owner: &Owner,
    ns: &NetNs,
    ip: [u8; 4],
    port: u16,
    client_poll: PollContext,
    read_depth: u8,
) -> Option<Pair> {
    let (world, listener, addr) = listening_at(owner, ns, ip, port)?;
    let server_seen = Arc::new(QpSeen::default(), GFP_KERNEL).ok()?;
    let s_seen = server_seen.clone();
    let connected =
        connect_client_with(&world, ns, &addr, client_poll, read_depth, move |server| {
            recording_qp(server, &s_seen, PollContext::Workqueue).map(|(qp, _)| qp)
        });
    let (client, (client_qp, client_cq), client_seen, server, server_qp) = match connected {
        Ok(connected) => connected,
        Err(e) => {
            failed_to_connect(listener, world, e);
            return None;
        }
    };
    Some(Pair {
        _client: client,
        client_qp,
        client_cq,
        client_seen,
        _server: server,
        server_qp,
        server_seen,
        _listener: listener,
    })
}

/// Fails the case with `e`, a connection's failure, once nothing of the
/// device is held: a failed assertion ends the case without unwinding,
/// and the device's unregistration would wait for good for what it
/// held.  A request adopted meanwhile would hold `world`, which holds
/// it: taken out first.
pub(super) fn failed_to_connect(listener: CmId<Node>, world: Arc<World>, e: Error) {
    drop(listener);
    drop(take_out(&world.seen, |seen| seen.server.take()));
    drop(world);
    assert_eq!(Err::<(), _>(e), Ok(()));
}

/// A connected client of `world`, what it is made of, and its server.
pub(super) type Connected = (
    CmId<Node>,
    RecordingQp,
    Arc<QpSeen>,
    Arc<CmId<Node>>,
    Arc<Qp<Recording>>,
);

/// Connects a new client with a [`recording_qp`] polled from
/// `client_poll` to the listener of `world` at `addr`; the server's id
/// gets its QP from `server_qp`, in the work that accepts it.
pub(super) fn connect_client(
    world: &Arc<World>,
    ns: &NetNs,
    addr: &SocketAddr,
    client_poll: PollContext,
    server_qp: impl FnOnce(&CmId<Node>) -> Result<Arc<Qp<Recording>>> + Send + 'static,
) -> Result<Connected> {
    connect_client_with(world, ns, addr, client_poll, 0, server_qp)
}

/// [`connect_client`], both sides offering `read_depth` RDMA READs in
/// flight each way.  On failure everything the attempt made is gone
/// (the server's id taken out of `world` once the accepting work is
/// done), so that the caller can let its own objects go before it
/// fails the case.
pub(super) fn connect_client_with(
    world: &Arc<World>,
    ns: &NetNs,
    addr: &SocketAddr,
    client_poll: PollContext,
    read_depth: u8,
    server_qp: impl FnOnce(&CmId<Node>) -> Result<Arc<Qp<Recording>>> + Send + 'static,
) -> Result<Connected> {
    let param = ConnParam::new()
        .initiator_depth(read_depth)
        .responder_resources(read_depth);
    // Without reads, the server answers with the CM's defaults.
    let server_param = (read_depth > 0).then_some(param);
    let client = sync_client(world, ns)?;
    client.resolve_addr_sync(None, addr, ms(2000), Some(ms(5000)))?;
    client.resolve_route_sync(ms(2000), Some(ms(5000)))?;
    let client_seen = Arc::new(QpSeen::default(), GFP_KERNEL)?;
    let client_qp = recording_qp(&client, &client_seen, client_poll)?;
    let made = Arc::pin_init(new_mutex!(None), GFP_KERNEL)?;

    let s_qp = made.clone();
    accept_in_background(world, server_param, move |server| {
        *s_qp.lock() = Some(server_qp(server)?);
        Ok(())
    })?;
    let connected = client.connect_sync(&param, Some(ms(5000)));
    // The work waits 5 s for the request and 5 s for its accept: until
    // it is done, it holds the server's id and QP.
    let finished = (0..6).any(|_| wait_until(|| world.seen.lock().accepted.is_some()));
    let accepted = world.seen.lock().accepted.take();
    let server = world.seen.lock().server.take();
    let server_qp = made.lock().take();
    match (finished, accepted, connected, server, server_qp) {
        (true, Some(Ok(_)), Ok(_), Some(server), Some(server_qp)) => {
            Ok((client, client_qp, client_seen, server, server_qp))
        }
        (false, ..) => Err(ETIMEDOUT),
        (_, Some(Err(e)), ..) | (_, _, Err(e), ..) => Err(e),
        _ => Err(EPROTO),
    }
}

/// Posts a send of 16 bytes of `byte` on `qp`, unsignaled or not.
pub(super) fn post_marked(qp: &Qp<Recording>, byte: u8, unsignaled: bool) -> bool {
    let Ok(mut buf) = SendBuffer::new(qp.pd(), 16) else {
        return false;
    };
    if buf.fill(&[byte; 16]).is_err() {
        return false;
    }
    buf.set_unsignaled(unsignaled);
    qp.post_send(buf).is_ok()
}

/// What a SEND advertising `region` carries: address, key, length.
pub(super) fn advertisement(region: RemoteRegion) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&region.addr.to_be_bytes());
    bytes[8..12].copy_from_slice(&region.rkey.to_be_bytes());
    bytes[12..].copy_from_slice(&region.len.to_be_bytes());
    bytes
}

/// The caps of a server's QP on an SRQ: 4 sends, its receives the
/// SRQ's.
pub(super) fn on_srq_caps() -> QpCaps {
    QpCaps {
        max_send_wr: 4,
        max_recv_wr: 0,
        max_inline_data: 0,
        ..QpCaps::default()
    }
}

/// Posts an unsignaled send marked `byte` from the client of a pair
/// whose client CQ is polled from `poll`, waits until it arrived, and
/// tears the pair down; checks that the send came back once, with
/// success, well inside the flush's limit (which a reclaim waits out).
/// The client's record; `None` (skipped) without rxe.
pub(super) fn unsignaled_send_then_teardown(
    port: u16,
    poll: PollContext,
    byte: u8,
) -> Option<Arc<QpSeen>> {
    let owner = owner();
    let pair = connected_pair_polled(&owner, &NetNs::init(), port, poll)?;
    let (client, server) = (pair.client_seen.clone(), pair.server_seen.clone());
    let posted = post_marked(&pair.client_qp, byte, true);
    let arrived = wait_until(|| server.received.load(Ordering::Acquire) == 1);
    let start = Instant::<Monotonic>::now();
    drop(pair);
    let teardown = start.elapsed();
    assert!(posted && arrived);
    assert_eq!(client.sends_back.load(Ordering::Acquire), 1);
    assert_eq!(client.sends_failed.load(Ordering::Acquire), 0);
    assert!(teardown.as_millis() < FLUSH_TIMEOUT.as_millis());
    Some(client)
}
