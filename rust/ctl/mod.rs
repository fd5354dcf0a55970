// SPDX-License-Identifier: GPL-2.0

//! `/dev/rdma_cm_rs`: an in-kernel RDMA CM consumer driven from user space.
//!
//! Written against the safe abstractions only: this module forbids
//! `unsafe`.  The ABI is `rust/uapi/rdma_cm_rs.h`, documented in
//! `Documentation/rdma_cm_rs/ioctl-abi.rst`.
//!
//! * Every open file is a [`CtlFile`]: its ids live in an `XArray` under
//!   32-bit handles, its events in a FIFO that `GET_EVENT` and `poll` read.
//! * An id belongs to the file that created it (or whose listener received
//!   its connection request): handles are per file, so another file cannot
//!   name it.
//! * `close()` destroys every id of the file without waiting for user
//!   space; the module cannot be unloaded while a file is open (the file
//!   operations hold the module).
//! * A synchronous id (`RDMA_CM_RS_ID_SYNC`) blocks in the commands that
//!   end with an event and returns the event with the call
//!   (`CmId::call_sync`); its events never reach the file's queue, and
//!   its listener's requests are fetched with `GET_REQUEST`.

#![forbid(unsafe_code)]

mod addrinfo;
mod conn;
mod event_queue;
mod id;
mod mcast;
mod wait;

use crate::{
    abi,
    capability::{capable_in_init_ns, Capability},
    misc_poll::{PollMiscDevice, POLL_READABLE},
    rdma::{
        CmId, ConnParam, LockedId, MrAccess, NetNs, Owner, PortSpace, PrivateDataUse, QpType,
        RemoteRegion, RwOp, SocketAddr, SyncOp, SyncResult,
    },
};
use core::mem::size_of;
use event_queue::EventQueue;
use id::{Backlog, CtlId, IdEvents, IdShared};
use kernel::{
    fs::{file::flags::O_NONBLOCK, File},
    new_mutex, new_poll_condvar,
    prelude::*,
    sync::{
        aref::ARef,
        poll::{PollCondVar, PollTable},
        Arc, ArcBorrow, Mutex,
    },
    time::Delta,
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
    xarray::{AllocKind, XArray},
};
use wait::{wait_for, Wait};

/// Ids one file may hold: a bound on what one opener makes the kernel
/// keep (ucma has none), above the 2,000 connections at once that
/// `make bench` opens.
pub(crate) const MAX_IDS: usize = 4096;
/// Events one file may have queued; connection requests beyond are refused.
const MAX_QUEUED_EVENTS: usize = 4096;
/// The backlog the char device gives the CM: 0, its default.  No CM
/// bounds unanswered requests (the file's `Backlog` does); a small number
/// only shrinks the iWARP CM's and siw's pools of queued events and
/// connection takeovers, and siw, short of them, leaves a request of a
/// burst unanswered until the peer gives up (UNREACHABLE after its 10 s
/// MPA timer, instead of the prompt REJECTED of the file's own bound).
const CM_BACKLOG: u32 = 0;

/// Largest listen backlog.
const MAX_BACKLOG: u32 = 1024;

/// The misc device.
pub(crate) struct Ctl;

#[vtable]
impl PollMiscDevice for Ctl {
    type Ptr = Arc<CtlFile>;
    type RegistrationData = Owner;

    /// Only a task with `CAP_NET_ADMIN` in the initial user namespace may
    /// open the device (`Documentation/rdma_cm_rs/ioctl-abi.rst`, "Who may
    /// use the device"): the file is then the authority for every ioctl.
    fn open(_file: &File, owner: &Owner) -> Result<Arc<CtlFile>> {
        if !capable_in_init_ns(Capability::NetAdmin) {
            return Err(EPERM);
        }
        CtlFile::new(owner)
    }

    fn release(device: Arc<CtlFile>, _file: &File) {
        device.close();
    }

    fn ioctl(device: ArcBorrow<'_, CtlFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        CtlFile::ioctl(device, file, cmd, arg).map(|()| 0)
    }

    fn poll(device: ArcBorrow<'_, CtlFile>, file: &File, table: &PollTable<'_>) -> u32 {
        table.register_wait(file, &device.events_ready);
        if device.state.lock().events.is_empty() {
            0
        } else {
            POLL_READABLE
        }
    }
}

struct FileState {
    /// Events not yet read, oldest first.
    events: EventQueue,
    /// Room in `events` promised to connection requests whose new id is
    /// being made: `events` always has capacity for that many more, so
    /// the request's event cannot be lost once its id exists.
    reserved: usize,
    /// Handles in use: the file's ids, and ids being made or destroyed
    /// (a handle is reused only once its queued events are gone).
    handles: KVec<u32>,
    next_handle: u32,
    closing: bool,
}

impl FileState {
    /// Frees a handle (the set's order means nothing).
    fn forget_handle(&mut self, handle: u32) {
        if let Some(at) = self.handles.iter().position(|h| *h == handle) {
            let last = self.handles.len() - 1;
            self.handles.swap(at, last);
            self.handles.pop();
        }
    }
}

/// One open file of the device.
#[pin_data]
pub(crate) struct CtlFile {
    #[pin]
    ids: XArray<Arc<CtlId>>,
    #[pin]
    state: Mutex<FileState>,
    #[pin]
    events_ready: PollCondVar,
    /// The opener's network namespace: every id of the file lives there,
    /// whichever task makes the ioctl (a socket's rule).
    net: ARef<NetNs>,
    /// The module's: what the file makes is counted on it.
    owner: Owner,
}

/// Reads an ioctl argument: the command number encodes the structure's
/// size, so exactly a `T` is read.
fn read_arg<T: FromBytes>(arg: usize) -> Result<T> {
    UserSlice::new(UserPtr::from_addr(arg), size_of::<T>())
        .reader()
        .read::<T>()
}

fn write_arg<T: AsBytes>(arg: usize, value: &T) -> Result {
    UserSlice::new(UserPtr::from_addr(arg), size_of::<T>())
        .writer()
        .write(value)
}

fn require_zero(fields: &[u32]) -> Result {
    if fields.iter().any(|&f| f != 0) {
        Err(EINVAL)
    } else {
        Ok(())
    }
}

fn conn_param_from_abi(p: &abi::ConnParam) -> Result<ConnParam> {
    require_zero(&[p.reserved])?;
    let len = usize::from(p.private_data_len);
    if len > p.private_data.len() {
        return Err(EINVAL);
    }
    ConnParam::new()
        .private_data(&p.private_data[..len])?
        .responder_resources(p.responder_resources)
        .initiator_depth(p.initiator_depth)
        .flow_control(p.flow_control != 0)
        .retry_count(p.retry_count)?
        .rnr_retry_count(p.rnr_retry_count)
}

fn addr_from_abi(bytes: &[u8]) -> Result<Option<SocketAddr>> {
    SocketAddr::from_sockaddr(bytes)
}

impl CtlFile {
    fn new(owner: &Owner) -> Result<Arc<Self>> {
        let net = NetNs::current()?;
        Arc::pin_init(
            pin_init!(Self {
                ids <- XArray::new(AllocKind::Alloc),
                state <- new_mutex!(FileState {
                    events: EventQueue::new(),
                    reserved: 0,
                    handles: KVec::new(),
                    next_handle: 1,
                    closing: false,
                }),
                events_ready <- new_poll_condvar!("rdma_cm_rs events"),
                net,
                owner: owner.clone(),
            }),
            GFP_KERNEL,
        )
    }

    /// Registers a new id under a fresh handle; `make` builds it.
    ///
    /// The id is built, and dropped on failure, outside the file's lock:
    /// dropping an id destroys it, which takes the CM's handler mutex,
    /// ranked above the file's lock (inside a callback, where the mutex is
    /// held already, the destruction is deferred).
    pub(crate) fn insert(&self, make: impl FnOnce(u32) -> Result<Arc<CtlId>>) -> Result<u32> {
        let handle = {
            let mut st = self.state.lock();
            if st.closing {
                return Err(ENODEV);
            }
            if st.handles.len() >= MAX_IDS {
                return Err(EMFILE);
            }
            st.handles.reserve(1, GFP_KERNEL)?;
            // Handles count up from 1 and skip ones in use after wrapping.
            let mut handle = st.next_handle;
            while handle == 0 || st.handles.contains(&handle) {
                handle = handle.wrapping_add(1);
            }
            st.next_handle = handle.wrapping_add(1);
            st.handles
                .push_within_capacity(handle)
                .map_err(|_| ENOMEM)?;
            handle
        };
        let stored = make(handle).and_then(|id| {
            let refused = {
                let mut ids = self.ids.lock();
                ids.store(handle as usize, id, GFP_KERNEL).err()
            };
            // The refused id drops here, after the XArray's lock.
            refused.map_or(Ok(()), |refused| Err(refused.error))
        });
        let closing = {
            let mut st = self.state.lock();
            if stored.is_err() {
                st.forget_handle(handle);
            }
            st.closing
        };
        stored?;
        if closing {
            // `close` ran meanwhile and could not see this id: undo.  (Not
            // through `destroy`: a connection request calls this with its
            // listener's state locked, the lock `retire` would take again.)
            let id = self.ids.lock().remove(handle as usize);
            self.state.lock().forget_handle(handle);
            drop(id);
            return Err(ENODEV);
        }
        Ok(handle)
    }

    fn get(&self, handle: u32) -> Result<Arc<CtlId>> {
        self.ids
            .lock()
            .get(handle as usize)
            .map(Arc::from)
            .ok_or(ENOENT)
    }

    /// Unregisters an id whose device went away; the caller drops it.  Its
    /// queued events stay for user space to read.
    pub(crate) fn detach(&self, handle: u32) -> Option<Arc<CtlId>> {
        let id = self.ids.lock().remove(handle as usize)?;
        self.state.lock().forget_handle(handle);
        Some(id)
    }

    /// Destroys an id, the connection requests it received that user space
    /// never fetched, and their queued events.
    fn destroy(&self, handle: u32) -> Result {
        let id = self.ids.lock().remove(handle as usize).ok_or(ENOENT)?;
        self.retire(handle, id)
    }

    /// Destroys an id already removed from the XArray (see `destroy`).
    ///
    /// Ucma's order: the id stops reporting first (its handler checks
    /// `retired` under the lock it queues events with), then its queued
    /// events go, then its handle.  The id itself is destroyed when the
    /// last reference drops, possibly after an ioctl in flight returns;
    /// retired, it queues nothing meanwhile.
    fn retire(&self, handle: u32, id: Arc<CtlId>) -> Result {
        let shared = Self::shared(&id);
        shared.retire();
        // A synchronous listener's requests not fetched: their ids go too.
        let queued = core::mem::take(&mut shared.state.lock().requests);
        let orphans = {
            let mut st = self.state.lock();
            let mut orphans = KVec::new();
            for e in queued.iter() {
                orphans.push(e.new_id, GFP_KERNEL)?;
            }
            for e in st.events.iter() {
                if e.id == handle && e.new_id != 0 {
                    orphans.push(e.new_id, GFP_KERNEL)?;
                }
            }
            st.events.discard(|e| e.id == handle);
            st.forget_handle(handle);
            orphans
        };
        // Outside the locks: destruction takes the CM's handler mutexes.
        drop(id);
        for orphan in orphans {
            let id = self.ids.lock().remove(orphan as usize);
            if let Some(id) = id {
                self.retire(orphan, id)?;
            }
        }
        Ok(())
    }

    /// Queues an event for user space; `false` if it cannot be (no memory,
    /// or the file is closing).  Room promised to connection requests is
    /// kept free.
    pub(crate) fn push_event(&self, event: abi::Event) -> bool {
        let mut st = self.state.lock();
        if st.closing {
            return false;
        }
        let room = st.reserved + 1;
        if st.events.reserve(room).is_err() || st.events.push_within_capacity(event).is_err() {
            return false;
        }
        self.events_ready.notify_all();
        true
    }

    /// Promises room for one connection request's event: `EMFILE` when
    /// the queue is full, `ENOMEM` without memory.  Kept by
    /// [`Self::push_reserved_event`] or returned by [`Self::unreserve_event`].
    pub(crate) fn reserve_event(&self) -> Result {
        let mut st = self.state.lock();
        if st.closing {
            return Err(ENODEV);
        }
        if st.events.len() + st.reserved >= MAX_QUEUED_EVENTS {
            return Err(EMFILE);
        }
        let room = st.reserved + 1;
        st.events.reserve(room)?;
        st.reserved += 1;
        Ok(())
    }

    /// Queues an event in room promised by [`Self::reserve_event`]: cannot
    /// fail (a closing file drops it with everything else).
    pub(crate) fn push_reserved_event(&self, event: abi::Event) {
        let mut st = self.state.lock();
        st.reserved -= 1;
        if st.closing {
            return;
        }
        // The capacity was reserved: this does not allocate.
        if st.events.push_within_capacity(event).is_ok() {
            self.events_ready.notify_all();
        }
    }

    /// Returns room promised by [`Self::reserve_event`].
    pub(crate) fn unreserve_event(&self) {
        self.state.lock().reserved -= 1;
    }

    fn close(&self) {
        let handles = {
            let mut st = self.state.lock();
            st.closing = true;
            st.events.clear();
            core::mem::take(&mut st.handles)
        };
        for handle in handles {
            // The XArray guard must be gone before the id is destroyed: the
            // destruction sleeps.
            let id = self.ids.lock().remove(handle as usize);
            if let Some(id) = id {
                Self::shared(&id).retire();
                drop(id);
            }
        }
    }

    fn shared(id: &CtlId) -> &Arc<IdShared> {
        &id.handler().shared
    }

    fn ioctl(this: ArcBorrow<'_, Self>, file: &File, cmd: u32, arg: usize) -> Result {
        // Exact command numbers, size included (as binder matches them): a
        // number with another size is another, unknown command.
        let nonblock = file.flags() & O_NONBLOCK != 0;
        use abi::cmd::*;
        let me = Arc::from(this);
        let this: &Self = &me;
        match cmd {
            INFO => this.info(arg),
            CREATE_ID => this.create_id(me.clone(), arg, nonblock),
            DESTROY_ID => {
                let c: abi::IdCmd = read_arg(arg)?;
                require_zero(&[c.reserved])?;
                this.destroy(c.id)
            }
            BIND => this.bind(arg),
            RESOLVE_ADDR => this.resolve_addr(arg, nonblock),
            RESOLVE_ROUTE => this.resolve_route(arg, nonblock),
            LISTEN => this.listen(arg),
            CONNECT => this.connect(arg, nonblock),
            ACCEPT => this.accept(arg, nonblock),
            REJECT => this.reject(arg),
            DISCONNECT => this.disconnect(arg, nonblock),
            SET_OPTION => this.set_option(arg),
            QUERY => this.query(arg),
            GET_EVENT => this.get_event(arg, nonblock),
            GET_REQUEST => this.get_request(arg, nonblock),
            SEND => this.send(arg),
            RECV => this.recv(arg, nonblock),
            SEND_RECV => this.send_recv(arg, nonblock),
            MR_REG => this.mr_reg(arg),
            MR_DEREG => this.mr_dereg(arg),
            MR_WRITE => this.mr_copy(arg, CopyDirection::ToRegion),
            MR_READ => this.mr_copy(arg, CopyDirection::FromRegion),
            RDMA => this.rdma(arg),
            UD_SEND => this.ud_send(arg),
            UD_RECV => this.ud_recv(arg, nonblock),
            GETADDRINFO => addrinfo::getaddrinfo(arg),
            JOIN_MCAST => this.join_mcast(arg, nonblock),
            LEAVE_MCAST => this.leave_mcast(arg),
            _ => Err(ENOTTY),
        }
    }

    fn info(&self, arg: usize) -> Result {
        let mut info: abi::Info = pin_init::zeroed();
        info.abi_version = abi::ABI_VERSION;
        info.max_private_data = abi::MAX_PRIVATE_DATA as u32;
        info.max_message = abi::MAX_MESSAGE as u32;
        info.max_ids = MAX_IDS as u32;
        info.recv_depth = abi::RECV_DEPTH as u32;
        info.max_ud_peers = abi::MAX_UD_PEERS as u32;
        info.send_window = abi::SEND_WINDOW as u32;
        info.max_mcast_groups = abi::MAX_MCAST_GROUPS as u32;
        write_arg(arg, &info)
    }

    fn create_id(&self, me: Arc<CtlFile>, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::CreateId = read_arg(arg)?;
        require_zero(&[c.id, c.flags & !(abi::ID_SYNC | abi::ID_BUSY_POLL)])?;
        let sync = c.flags & abi::ID_SYNC != 0;
        let busy_poll = c.flags & abi::ID_BUSY_POLL != 0;
        // A synchronous id's calls block: a non-blocking file cannot have one.
        if sync && nonblock {
            return Err(EINVAL);
        }
        let ps = PortSpace::from_raw(c.port_space)?;
        let qp_type = QpType::from_raw(c.qp_type)?;
        if !ps.carries(qp_type) {
            return Err(EINVAL);
        }
        let handle = self.insert(|handle| {
            let events = IdEvents {
                file: me,
                handle,
                context: c.context,
                shared: IdShared::new(abi::state::IDLE, qp_type, None, sync, busy_poll)?,
            };
            Ok(Arc::new(
                CmId::new(&self.owner, events, &self.net, ps, qp_type)?,
                GFP_KERNEL,
            )?)
        })?;
        c.id = handle;
        if let Err(e) = write_arg(arg, &c) {
            // User space never learned the handle: undo.
            let _ = self.destroy(handle);
            return Err(e);
        }
        Ok(())
    }

    fn bind(&self, arg: usize) -> Result {
        let c: abi::Bind = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        let addr = addr_from_abi(&c.addr.bytes)?.ok_or(EINVAL)?;
        let id = self.get(c.id)?;
        Self::locked_then_state(&id, abi::state::ADDR_BOUND, |l| l.bind(&addr))
    }

    fn resolve_addr(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::ResolveAddr = read_arg(arg)?;
        let src = addr_from_abi(&c.src.bytes)?;
        let dst = addr_from_abi(&c.dst.bytes)?.ok_or(EINVAL)?;
        let id = self.get(c.id)?;
        let timeout = Delta::from_millis(i64::from(c.timeout_ms));
        let start = || {
            Self::locked_then_state(&id, abi::state::ADDR_QUERY, |l| {
                l.resolve_addr(src.as_ref(), &dst, timeout)
            })
        };
        let (result, write_back) =
            Self::run(&id, SyncOp::ResolveAddr, &mut c.sync, nonblock, start);
        if write_back {
            write_arg(arg, &c)?;
        }
        result
    }

    fn resolve_route(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::ResolveRoute = read_arg(arg)?;
        let id = self.get(c.id)?;
        let timeout = Delta::from_millis(i64::from(c.timeout_ms));
        let start =
            || Self::locked_then_state(&id, abi::state::ROUTE_QUERY, |l| l.resolve_route(timeout));
        let (result, write_back) =
            Self::run(&id, SyncOp::ResolveRoute, &mut c.sync, nonblock, start);
        if write_back {
            write_arg(arg, &c)?;
        }
        result
    }

    /// Starts `op` on an id (`start`).  On a synchronous id, then waits
    /// for the event that ends it and puts that in `sync`; the flag says
    /// whether the structure must go back to user space (an event came).
    /// On an asynchronous id `sync.timeout_ms` must be 0.
    fn run(
        id: &CtlId,
        op: SyncOp,
        sync: &mut abi::Sync,
        nonblock: bool,
        start: impl FnOnce() -> Result,
    ) -> (Result, bool) {
        if !Self::shared(id).sync {
            return (
                require_zero(&[sync.timeout_ms]).and_then(|()| start()),
                false,
            );
        }
        // `CREATE_ID` refused a synchronous id on a non-blocking file; it
        // may have been made non-blocking since.
        if nonblock {
            return (Err(EINVAL), false);
        }
        let limit = (sync.timeout_ms != 0).then(|| Delta::from_millis(i64::from(sync.timeout_ms)));
        Self::sync_outcome(id, id.call_sync(op, limit, start), sync)
    }

    /// Puts a blocking call's event, if one ended it, in `sync`.
    fn sync_outcome(id: &CtlId, result: SyncResult, sync: &mut abi::Sync) -> (Result, bool) {
        let (result, event) = match result {
            Ok(outcome) => (outcome.result(), Some(*outcome.event())),
            Err(e) => (Err(e), None),
        };
        sync.flags = 0;
        sync.event = pin_init::zeroed();
        match event {
            Some(event) => {
                sync.flags = abi::SYNC_EVENT;
                sync.event = id.handler().abi_owned_event(&event);
                (result, true)
            }
            None => (result, false),
        }
    }

    fn listen(&self, arg: usize) -> Result {
        let c: abi::Listen = read_arg(arg)?;
        // 0 takes the largest, as ucma does for librdmacm's rdma_listen.
        // The file bounds unanswered requests itself (`Backlog`); the CM
        // gets its own default (see `CM_BACKLOG`).
        let backlog = match c.backlog {
            0 => MAX_BACKLOG,
            1..=MAX_BACKLOG => c.backlog,
            _ => return Err(EINVAL),
        };
        let id = self.get(c.id)?;
        let shared = Self::shared(&id);
        // Requests may arrive as soon as the CM listens: install the
        // backlog first.
        let slots = Backlog::new(backlog)?;
        {
            let mut st = shared.state.lock();
            if st.backlog.is_some() {
                return Err(EINVAL);
            }
            if shared.sync {
                // Room for every request the backlog admits (see `IdState`).
                st.requests.reserve(backlog as usize)?;
            }
            st.backlog = Some(slots);
        }
        // Not under the handler mutex (see `CmId::listen`); a listener's
        // events (requests) do not change its state, so setting it after
        // the call loses nothing.
        match id.listen(CM_BACKLOG) {
            Ok(()) => {
                shared.state.lock().state = abi::state::LISTEN;
                Ok(())
            }
            Err(e) => {
                shared.state.lock().backlog = None;
                Err(e)
            }
        }
    }

    fn connect(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::Connect = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        let param = conn_param_from_abi(&c.param)?;
        let id = self.get(c.id)?;
        let start = || Self::start_connect(&id, &param);
        let (result, write_back) = Self::run(&id, SyncOp::Connect, &mut c.sync, nonblock, start);
        if write_back {
            write_arg(arg, &c)?;
        }
        result
    }

    fn start_connect(id: &CtlId, param: &ConnParam) -> Result {
        id.with_lock(|l| {
            // Refuse bad parameters before a QP exists.
            let usage = match l.qp_type() {
                // The SIDR lookup of the remote QP, for the id's UD QP.
                QpType::Ud => PrivateDataUse::ConnectUd,
                QpType::Rc => PrivateDataUse::ConnectRc,
            };
            l.check_param(param, usage)?;
            // The ESTABLISHED event may run as soon as the connect is
            // sent, and needs the data path (a UD id makes its peer
            // there): it is in place first.  The handler mutex held here
            // keeps the event from running before this returns.
            let busy_poll = Self::shared(id).busy_poll;
            let conn = Self::with_new_qp(l, busy_poll, |conn| l.connect(param).map(|()| conn))?;
            let mut st = Self::shared(id).state.lock();
            st.conn = Some(conn);
            st.state = abi::state::CONNECT;
            (st.responder_resources, st.initiator_depth) = param.rd_atom();
            Ok(())
        })
    }

    /// Builds the data path on a locked RC id and runs `then` (the connect
    /// or accept): if either fails, the QP goes again, so the id can try
    /// once more (the CM checks the id's state only in `then`).
    fn with_new_qp(
        l: &LockedId<'_>,
        busy_poll: bool,
        then: impl FnOnce(Arc<conn::Conn>) -> Result<Arc<conn::Conn>>,
    ) -> Result<Arc<conn::Conn>> {
        // A second CONNECT or ACCEPT: the QP in place carries the
        // connection, and the cleanup below must never take it.
        if l.qp_num().is_some() {
            return Err(EBUSY);
        }
        let result = conn::Conn::setup(l, busy_poll).and_then(then);
        if result.is_err() {
            // ENOENT when setup failed before the QP existed.
            let _ = l.destroy_qp();
        }
        result
    }

    /// Runs a CM operation on a locked id and, if it succeeds, records the
    /// id's new state while still locked, so that the operation's own
    /// event cannot be overtaken.
    fn locked_then_state(
        id: &CtlId,
        state: u32,
        op: impl FnOnce(&LockedId<'_>) -> Result,
    ) -> Result {
        id.with_lock(|l| {
            op(l)?;
            Self::shared(id).state.lock().state = state;
            Ok(())
        })
    }

    fn accept(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::Accept = read_arg(arg)?;
        if c.flags & !abi::ACCEPT_REQUEST_PARAM != 0 {
            return Err(EINVAL);
        }
        let user_param = if c.flags & abi::ACCEPT_REQUEST_PARAM != 0 {
            None
        } else {
            Some(conn_param_from_abi(&c.param)?)
        };
        let id = self.get(c.id)?;
        let start = || Self::start_accept(&id, user_param);
        // A SIDR reply ends the exchange: no event follows, on any id.
        // (The id's state lock is released before `start` takes the
        // handler mutex, which ranks above it.)
        let qp_type = Self::shared(&id).state.lock().qp_type;
        let op = match qp_type {
            QpType::Rc => SyncOp::Accept,
            QpType::Ud => {
                require_zero(&[c.sync.timeout_ms])?;
                return start();
            }
        };
        let (result, write_back) = Self::run(&id, op, &mut c.sync, nonblock, start);
        if write_back {
            write_arg(arg, &c)?;
        }
        result
    }

    fn start_accept(id: &CtlId, user_param: Option<ConnParam>) -> Result {
        id.with_lock(|l| {
            let (param, usage) = match (l.qp_type(), user_param) {
                (QpType::Rc, Some(p)) => (p, PrivateDataUse::AcceptRc),
                (QpType::Rc, None) => (l.request_accept_param()?, PrivateDataUse::AcceptRc),
                // A SIDR reply: the request's values mean nothing to it.
                (QpType::Ud, p) => (p.unwrap_or_default(), PrivateDataUse::AcceptUd),
            };
            l.check_param(&param, usage)?;
            let busy_poll = Self::shared(id).busy_poll;
            let conn =
                Self::with_new_qp(l, busy_poll, |conn| l.accept(Some(&param)).map(|()| conn))?;
            let mut st = Self::shared(id).state.lock();
            st.conn = Some(conn);
            st.slot = None;
            st.state = abi::state::CONNECT;
            (st.responder_resources, st.initiator_depth) = param.rd_atom();
            Ok(())
        })
    }

    fn reject(&self, arg: usize) -> Result {
        let c: abi::Reject = read_arg(arg)?;
        require_zero(&[u32::from(c.reserved[0])])?;
        // The layer checks the length for the id's transport; this only
        // keeps the slice within the structure.
        let len = usize::from(c.private_data_len);
        if len > c.private_data.len() {
            return Err(EINVAL);
        }
        let id = self.get(c.id)?;
        id.with_lock(|l| {
            l.reject(c.reason, &c.private_data[..len])?;
            let mut st = Self::shared(&id).state.lock();
            st.slot = None;
            st.state = abi::state::DISCONNECT;
            Ok(())
        })
    }

    fn disconnect(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::Disconnect = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        let id = self.get(c.id)?;
        let start = || {
            // Not under the handler lock: see `CmId::disconnect`.
            id.disconnect()?;
            Self::shared(&id).state.lock().state = abi::state::DISCONNECT;
            Ok(())
        };
        let (result, write_back) = Self::run(&id, SyncOp::Disconnect, &mut c.sync, nonblock, start);
        if write_back {
            write_arg(arg, &c)?;
        }
        result
    }

    fn set_option(&self, arg: usize) -> Result {
        let c: abi::SetOption = read_arg(arg)?;
        let id = self.get(c.id)?;
        // An `int` as `rdma_set_option(3)` takes it, any non-zero value
        // meaning on (as `ucma.c` reads it); wider than an `int`: `EINVAL`.
        let flag = |v: u64| u32::try_from(v).map(|v| v != 0).map_err(|_| EINVAL);
        let small = |v: u64, max: u8| u8::try_from(v).ok().filter(|&v| v <= max).ok_or(EINVAL);
        match c.option {
            abi::option::TOS => {
                let tos = small(c.value, u8::MAX)?;
                id.with_lock(|l| {
                    l.set_tos(tos);
                    Self::shared(&id).state.lock().tos = Some(tos);
                    Ok(())
                })
            }
            abi::option::REUSEADDR => {
                let on = flag(c.value)?;
                id.with_lock(|l| l.set_reuseaddr(on))
            }
            abi::option::AFONLY => {
                let on = flag(c.value)?;
                id.with_lock(|l| l.set_afonly(on))
            }
            abi::option::ACK_TIMEOUT => {
                let t = small(c.value, 31)?;
                id.with_lock(|l| l.set_ack_timeout(t))
            }
            abi::option::MIN_RNR_TIMER => {
                let t = small(c.value, 31)?;
                id.with_lock(|l| l.set_min_rnr_timer(t))
            }
            _ => Err(EINVAL),
        }
    }

    fn query(&self, arg: usize) -> Result {
        let c: abi::Query = read_arg(arg)?;
        if c.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        let id = self.get(c.id)?;
        let mut out: abi::Query = pin_init::zeroed();
        out.id = c.id;
        id.with_lock(|l| {
            out.port_space = l.port_space() as u32;
            out.qp_type = l.qp_type() as u32;
            out.port_num = l.port_num();
            out.qp_num = l.qp_num().unwrap_or(0);
            if let Some(a) = l.src_addr() {
                out.src.bytes = a.to_sockaddr().0;
            }
            if let Some(a) = l.dst_addr() {
                out.dst.bytes = a.to_sockaddr().0;
            }
            if let Ok(dev) = l.device() {
                let name = dev.name();
                // The last byte stays 0: the name is NUL-terminated.
                let room = out.device.len() - 1;
                for (d, s) in out.device[..room].iter_mut().zip(name.as_bytes()) {
                    *d = *s;
                }
            }
            Ok(())
        })?;
        {
            let st = Self::shared(&id).state.lock();
            out.state = st.state;
            out.tos = st.tos.unwrap_or(0);
            out.tos_set = u8::from(st.tos.is_some());
            out.responder_resources = st.responder_resources;
            out.initiator_depth = st.initiator_depth;
            out.backlog = st.backlog.as_ref().map_or(0, |b| b.pending());
            if let Some(conn) = st.conn.as_ref().filter(|c| c.qp_type() == QpType::Ud) {
                out.max_datagram = conn.max_datagram() as u32;
                out.qkey = conn.qkey();
            }
        }
        write_arg(arg, &out)
    }

    fn get_event(&self, arg: usize, nonblock: bool) -> Result {
        let req: abi::GetEvent = read_arg(arg)?;
        require_zero(&[req.reserved])?;
        let mut st = self.state.lock();
        wait_for(
            &self.events_ready,
            &mut st,
            Wait::new(req.timeout_ms, nonblock),
            |s| !s.events.is_empty(),
        )?;
        // Dequeued, then copied out without the lock, which the CM's
        // callbacks take: a copy that faults on memory user space stalls
        // (userfaultfd, FUSE) would stall every CM event of the system.
        // The dequeued event keeps its room (a promise, as a connection
        // request's), so that a failed copy puts it back first: a bad
        // pointer loses no event.
        let mut out = req;
        out.event = st.events.pop_front().ok_or(EAGAIN)?;
        st.reserved += 1;
        drop(st);
        let copied = write_arg(arg, &out);
        let mut st = self.state.lock();
        st.reserved -= 1;
        let Err(e) = copied else {
            return Ok(());
        };
        let listener_gone = out.event.new_id != 0 && !st.handles.contains(&out.event.id);
        if st.closing || listener_gone {
            // Its id went meanwhile (the file closes, or the listener was
            // destroyed and the requests queued for it with it): the new
            // id of a connection request goes the same way.
            drop(st);
            if out.event.new_id != 0 {
                drop(self.detach(out.event.new_id));
            }
            return Err(e);
        }
        // The room promised above: this does not allocate.
        if st.events.push_front_within_capacity(out.event).is_err() {
            // Unreachable by the promise; the new id must not linger
            // unknown to user space.
            drop(st);
            if out.event.new_id != 0 {
                drop(self.detach(out.event.new_id));
            }
        }
        Err(e)
    }

    /// The oldest connection request of a synchronous listener.
    fn get_request(&self, arg: usize, nonblock: bool) -> Result {
        let req: abi::GetRequest = read_arg(arg)?;
        let id = self.get(req.id)?;
        let shared = Self::shared(&id);
        if !shared.sync {
            return Err(EINVAL);
        }
        let mut st = shared.state.lock();
        if st.backlog.is_none() {
            return Err(EINVAL);
        }
        wait_for(
            &shared.requests_ready,
            &mut st,
            Wait::new(req.timeout_ms, nonblock),
            |s| !s.requests.is_empty() || s.retired,
        )?;
        if st.retired {
            return Err(ECANCELED);
        }
        // Dequeued, then copied out without the listener's lock, which its
        // callbacks take (see `get_event`); a failed copy puts it back.
        let mut out = req;
        out.event = st.requests.pop_front().ok_or(EAGAIN)?;
        drop(st);
        let copied = write_arg(arg, &out);
        let Err(e) = copied else {
            return Ok(());
        };
        let mut st = shared.state.lock();
        // Room the request left, unless another took it meanwhile.
        let requeued = !st.retired
            && (st.requests.push_front_within_capacity(out.event).is_ok()
                || (st.requests.reserve(1).is_ok()
                    && st.requests.push_front_within_capacity(out.event).is_ok()));
        drop(st);
        if !requeued {
            // The listener was destroyed meanwhile (and the requests it
            // had with it), or no memory: the new id goes, as a request
            // the listener never got (the peer's connect fails).
            drop(self.detach(out.event.new_id));
        }
        Err(e)
    }

    /// The data path of an id of type `qp_type`: `EOPNOTSUPP` on an id of
    /// the other type (RC ids have messages and regions, UD ids
    /// datagrams), `ENOTCONN` before connect or accept.
    fn conn_of(&self, handle: u32, qp_type: QpType) -> Result<Arc<conn::Conn>> {
        let id = self.get(handle)?;
        let st = Self::shared(&id).state.lock();
        if st.qp_type != qp_type {
            return Err(EOPNOTSUPP);
        }
        st.conn.clone().ok_or(ENOTCONN)
    }

    /// [`Self::conn_of`] for work that needs the peer (SEND, MR_REG,
    /// RDMA): `ENOTCONN` also once the connection ended (a DISCONNECTED,
    /// REJECTED, UNREACHABLE, CONNECT_ERROR or DEVICE_REMOVAL event).  The
    /// kernel CM leaves the QP ready to send after the peer's disconnect
    /// until the id disconnects too: a SEND then would only retry into the
    /// void until its timeout.  Receiving (what arrived before) and the
    /// regions' own calls still work.  On a UD id: once its SIDR lookup
    /// failed or its device went.
    fn live_conn_of(&self, handle: u32, qp_type: QpType) -> Result<Arc<conn::Conn>> {
        let id = self.get(handle)?;
        let st = Self::shared(&id).state.lock();
        if st.qp_type != qp_type {
            return Err(EOPNOTSUPP);
        }
        if st.state == abi::state::DISCONNECT || st.state == abi::state::DEVICE_REMOVAL {
            return Err(ENOTCONN);
        }
        st.conn.clone().ok_or(ENOTCONN)
    }

    fn send(&self, arg: usize) -> Result {
        let c: abi::Send = read_arg(arg)?;
        if c.flags & !abi::SEND_NOWAIT != 0 {
            return Err(EINVAL);
        }
        let len = c.len as usize;
        if len == 0 || len > abi::MAX_MESSAGE {
            return Err(EINVAL);
        }
        let conn = self.live_conn_of(c.id, QpType::Rc)?;
        let data = conn::UserData {
            reader: UserSlice::new(UserPtr::from_addr(c.buf as usize), len).reader(),
            len,
        };
        let nowait = c.flags & abi::SEND_NOWAIT != 0;
        conn.send(data, conn::Conn::send_wait(c.timeout_ms), nowait)
    }

    /// SEND (NOWAIT) and RECV in one call; `sent` says whether an error
    /// came after the send was posted.
    fn send_recv(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::SendRecv = read_arg(arg)?;
        require_zero(&[c.sent, c.reserved])?;
        let len = c.send_len as usize;
        if len == 0 || len > abi::MAX_MESSAGE {
            return Err(EINVAL);
        }
        let conn = self.live_conn_of(c.id, QpType::Rc)?;
        let wait = Wait::new(c.timeout_ms, nonblock);
        let data = conn::UserData {
            reader: UserSlice::new(UserPtr::from_addr(c.send_buf as usize), len).reader(),
            len,
        };
        conn.send(data, wait, true)?;
        c.sent = 1;
        let capacity = c.recv_len as usize;
        let mut writer = UserSlice::new(UserPtr::from_addr(c.recv_buf as usize), capacity).writer();
        let received = conn.recv(&mut writer, capacity, wait);
        if let Ok(n) = received {
            c.recv_len = n as u32;
        }
        write_arg(arg, &c)?;
        // A restart would send again.
        received
            .map(|_| ())
            .map_err(|e| if e == ERESTARTSYS { EINTR } else { e })
    }

    fn recv(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::Recv = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        let conn = self.conn_of(c.id, QpType::Rc)?;
        let capacity = c.len as usize;
        let mut writer = UserSlice::new(UserPtr::from_addr(c.buf as usize), capacity).writer();
        c.len = conn.recv(&mut writer, capacity, Wait::new(c.timeout_ms, nonblock))? as u32;
        write_arg(arg, &c)
    }

    fn ud_send(&self, arg: usize) -> Result {
        let c: abi::UdSend = read_arg(arg)?;
        if c.flags & !abi::UD_WITH_IMM != 0 {
            return Err(EINVAL);
        }
        let len = c.len as usize;
        if len == 0 || len > abi::MAX_MESSAGE {
            return Err(EINVAL);
        }
        let imm = (c.flags & abi::UD_WITH_IMM != 0).then_some(c.imm_data);
        if imm.is_none() && c.imm_data != 0 {
            return Err(EINVAL);
        }
        let conn = self.live_conn_of(c.id, QpType::Ud)?;
        let data = conn::UserData {
            reader: UserSlice::new(UserPtr::from_addr(c.buf as usize), len).reader(),
            len,
        };
        conn.ud_send(c.peer, data, imm, c.timeout_ms)
    }

    fn ud_recv(&self, arg: usize, nonblock: bool) -> Result {
        let mut c: abi::UdRecv = read_arg(arg)?;
        // flags, imm_data, peer, src_qp and src are outputs.
        require_zero(&[c.reserved])?;
        let conn = self.conn_of(c.id, QpType::Ud)?;
        let capacity = c.len as usize;
        let mut writer = UserSlice::new(UserPtr::from_addr(c.buf as usize), capacity).writer();
        let got = conn.ud_recv(&mut writer, capacity, Wait::new(c.timeout_ms, nonblock))?;
        c.len = got.len as u32;
        c.flags = if got.imm.is_some() {
            abi::UD_WITH_IMM
        } else {
            0
        };
        c.imm_data = got.imm.unwrap_or(0);
        c.peer = got.peer;
        c.src_qp = got.src_qp;
        c.src.bytes = got
            .src_gid
            .map(|gid| SocketAddr::from_gid(&gid).to_sockaddr().0)
            .unwrap_or([0; 128]);
        write_arg(arg, &c)
    }

    fn mr_reg(&self, arg: usize) -> Result {
        let mut c: abi::MrReg = read_arg(arg)?;
        let known = abi::ACCESS_REMOTE_READ | abi::ACCESS_REMOTE_WRITE;
        // addr, rkey and mr are outputs: their input values are ignored.
        if c.access & !known != 0 {
            return Err(EINVAL);
        }
        require_zero(&[
            c.reserved[0] as u32,
            (c.reserved[0] >> 32) as u32,
            c.reserved[1] as u32,
            (c.reserved[1] >> 32) as u32,
        ])?;
        let access = MrAccess {
            remote_read: c.access & abi::ACCESS_REMOTE_READ != 0,
            remote_write: c.access & abi::ACCESS_REMOTE_WRITE != 0,
        };
        let conn = self.live_conn_of(c.id, QpType::Rc)?;
        let (handle, remote) = conn.register(c.length as usize, access, c.timeout_ms)?;
        c.mr = handle;
        c.addr = remote.addr;
        c.rkey = remote.rkey;
        if let Err(e) = write_arg(arg, &c) {
            // User space cannot learn the handle: do not leave the region.
            let _ = conn.deregister(handle, 0);
            return Err(e);
        }
        Ok(())
    }

    fn mr_dereg(&self, arg: usize) -> Result {
        let c: abi::MrCmd = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        self.conn_of(c.id, QpType::Rc)?
            .deregister(c.mr, c.timeout_ms)
    }

    fn mr_copy(&self, arg: usize, direction: CopyDirection) -> Result {
        let c: abi::MrCopy = read_arg(arg)?;
        let conn = self.conn_of(c.id, QpType::Rc)?;
        let (offset, len) = (c.offset as usize, c.len as usize);
        conn.mr_check(c.mr, offset, len)?;
        let user = UserSlice::new(UserPtr::from_addr(c.buf as usize), len);
        let mut bounce = KVec::new();
        match direction {
            CopyDirection::ToRegion => {
                user.read_all(&mut bounce, GFP_KERNEL)?;
                conn.mr_write(c.mr, offset, &bounce)
            }
            CopyDirection::FromRegion => {
                bounce.resize(len, 0, GFP_KERNEL)?;
                conn.mr_read(c.mr, offset, &mut bounce)?;
                user.writer().write_slice(&bounce)
            }
        }
    }

    fn rdma(&self, arg: usize) -> Result {
        let c: abi::Rdma = read_arg(arg)?;
        require_zero(&[c.reserved])?;
        let op = match c.opcode {
            abi::RDMA_READ => RwOp::Read,
            abi::RDMA_WRITE => RwOp::Write,
            _ => return Err(EINVAL),
        };
        let remote = RemoteRegion {
            addr: c.remote_addr,
            rkey: c.rkey,
            len: c.len,
        };
        if c.len == 0 {
            return Err(EINVAL);
        }
        self.live_conn_of(c.id, QpType::Rc)?
            .rdma(op, c.mr, c.offset as usize, remote, c.timeout_ms)
    }
}

/// Which way `MR_WRITE`/`MR_READ` copy.
enum CopyDirection {
    ToRegion,
    FromRegion,
}
