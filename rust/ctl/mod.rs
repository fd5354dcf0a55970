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

#![forbid(unsafe_code)]

mod conn;
mod id;
mod wait;

use crate::{
    abi,
    misc_poll::{PollMiscDevice, POLL_READABLE},
    rdma::{
        addr::SocketAddr,
        cm::{CmId, NetNs, PortSpace, QpType},
        conn_param::{ConnParam, PrivateDataUse},
        mr::{MrAccess, RemoteRegion, WorkOp},
    },
};
use core::mem::size_of;
use id::{Backlog, CtlId, IdEvents, IdShared};
use kernel::{
    fs::{file::flags::O_NONBLOCK, File},
    ioctl::{_IOC_DIR, _IOC_NR, _IOC_SIZE, _IOC_TYPE},
    new_mutex, new_poll_condvar,
    prelude::*,
    sync::{
        poll::{PollCondVar, PollTable},
        Arc, ArcBorrow, Mutex,
    },
    transmute::{AsBytes, FromBytes},
    uaccess::{UserPtr, UserSlice},
    xarray::{AllocKind, XArray},
};
use wait::{wait_for, Wait};

/// Ids one file may hold.
pub(crate) const MAX_IDS: usize = 1024;
/// Events one file may have queued; connection requests beyond are refused.
const MAX_QUEUED_EVENTS: usize = 4096;
/// Largest listen backlog.
const MAX_BACKLOG: u32 = 1024;

/// The misc device.
pub(crate) struct Ctl;

#[vtable]
impl PollMiscDevice for Ctl {
    type Ptr = Arc<CtlFile>;

    fn open(_file: &File) -> Result<Arc<CtlFile>> {
        CtlFile::new()
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
    events: KVec<abi::Event>,
    /// Handles of the file's ids.
    handles: KVec<u32>,
    next_handle: u32,
    closing: bool,
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
    net: NetNs,
}

/// Reads an ioctl argument of `size` bytes as a `T`: shorter than `T` is
/// `EINVAL`, a longer tail must be zero (`E2BIG`), like
/// `copy_struct_from_user`.
fn read_arg<T: FromBytes>(arg: usize, size: usize) -> Result<T> {
    let ksize = size_of::<T>();
    if size < ksize {
        return Err(EINVAL);
    }
    let mut reader = UserSlice::new(UserPtr::from_addr(arg), size).reader();
    let value = reader.read::<T>()?;
    let mut chunk = [0u8; 64];
    while !reader.is_empty() {
        let n = reader.len().min(chunk.len());
        reader.read_slice(&mut chunk[..n])?;
        if chunk[..n].iter().any(|&b| b != 0) {
            return Err(E2BIG);
        }
    }
    Ok(value)
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
    fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                ids <- XArray::new(AllocKind::Alloc),
                state <- new_mutex!(FileState {
                    events: KVec::new(),
                    handles: KVec::new(),
                    next_handle: 1,
                    closing: false,
                }),
                events_ready <- new_poll_condvar!("rdma_cm_rs events"),
                net: NetNs::current(),
            }),
            GFP_KERNEL,
        )
    }

    /// Registers a new id under a fresh handle; `make` builds it.
    fn insert(&self, make: impl FnOnce(u32) -> Result<Arc<CtlId>>) -> Result<u32> {
        let mut st = self.state.lock();
        if st.closing {
            return Err(ENODEV);
        }
        if st.handles.len() >= MAX_IDS || st.events.len() >= MAX_QUEUED_EVENTS {
            return Err(EMFILE);
        }
        st.handles.reserve(1, GFP_KERNEL)?;
        // Handles count up from 1 and skip ones in use after wrapping.
        let mut handle = st.next_handle;
        while handle == 0 || self.ids.lock().get(handle as usize).is_some() {
            handle = handle.wrapping_add(1);
        }
        st.next_handle = handle.wrapping_add(1);
        let id = make(handle)?;
        self.ids
            .lock()
            .store(handle as usize, id, GFP_KERNEL)
            .map_err(|e| e.error)?;
        st.handles
            .push_within_capacity(handle)
            .map_err(|_| ENOMEM)?;
        Ok(handle)
    }

    fn get(&self, handle: u32) -> Result<Arc<CtlId>> {
        self.ids
            .lock()
            .get(handle as usize)
            .map(Arc::from)
            .ok_or(ENOENT)
    }

    /// Unregisters an id; the caller drops it outside every lock.
    fn detach(&self, handle: u32) -> Option<Arc<CtlId>> {
        let mut st = self.state.lock();
        let id = self.ids.lock().remove(handle as usize)?;
        st.handles.retain(|h| *h != handle);
        Some(id)
    }

    /// Destroys an id and the requests it received that user space never
    /// fetched; drops their queued events.
    fn destroy(&self, handle: u32) -> Result {
        let mut doomed = KVec::new();
        doomed.push(self.detach(handle).ok_or(ENOENT)?, GFP_KERNEL)?;
        let orphans = {
            let mut st = self.state.lock();
            let mut orphans = KVec::new();
            for e in st.events.iter() {
                if e.id == handle && e.new_id != 0 {
                    orphans.push(e.new_id, GFP_KERNEL)?;
                }
            }
            st.events.retain(|e| e.id != handle);
            orphans
        };
        for h in orphans {
            if let Some(id) = self.detach(h) {
                doomed.push(id, GFP_KERNEL)?;
            }
        }
        // Destroyed here, outside the locks (destruction takes the CM's
        // handler mutexes, which rank above them).
        drop(doomed);
        Ok(())
    }

    fn push_event(&self, event: abi::Event) {
        let mut st = self.state.lock();
        if st.closing {
            return;
        }
        if st.events.push(event, GFP_KERNEL).is_ok() {
            self.events_ready.notify_all();
        }
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
            drop(id);
        }
    }

    fn shared(id: &CtlId) -> &Arc<IdShared> {
        &id.handler().shared
    }

    fn ioctl(this: ArcBorrow<'_, Self>, file: &File, cmd: u32, arg: usize) -> Result {
        if _IOC_TYPE(cmd) != abi::MAGIC {
            return Err(ENOTTY);
        }
        // Dispatch on number and direction; the size is checked per command,
        // so that a longer structure from a newer header still matches.
        let size = _IOC_SIZE(cmd);
        let same = |known: u32| _IOC_NR(cmd) == _IOC_NR(known) && _IOC_DIR(cmd) == _IOC_DIR(known);
        let nonblock = file.flags() & O_NONBLOCK != 0;
        use abi::cmd::*;
        let me = Arc::from(this);
        let this: &Self = &me;
        match () {
            () if same(INFO) => this.info(arg, size),
            () if same(CREATE_ID) => this.create_id(me.clone(), arg, size),
            () if same(DESTROY_ID) => {
                let c: abi::IdCmd = read_arg(arg, size)?;
                require_zero(&[c.reserved])?;
                this.destroy(c.id)
            }
            () if same(BIND) => this.bind(arg, size),
            () if same(RESOLVE_ADDR) => this.resolve_addr(arg, size),
            () if same(RESOLVE_ROUTE) => this.resolve_route(arg, size),
            () if same(LISTEN) => this.listen(arg, size),
            () if same(CONNECT) => this.connect(arg, size),
            () if same(ACCEPT) => this.accept(arg, size),
            () if same(REJECT) => this.reject(arg, size),
            () if same(DISCONNECT) => this.disconnect(arg, size),
            () if same(SET_OPTION) => this.set_option(arg, size),
            () if same(QUERY) => this.query(arg, size),
            () if same(GET_EVENT) => this.get_event(arg, size, nonblock),
            () if same(SEND) => this.send(arg, size),
            () if same(RECV) => this.recv(arg, size, nonblock),
            () if same(MR_REG) => this.mr_reg(arg, size),
            () if same(MR_DEREG) => this.mr_dereg(arg, size),
            () if same(MR_WRITE) => this.mr_copy(arg, size, CopyDirection::ToRegion),
            () if same(MR_READ) => this.mr_copy(arg, size, CopyDirection::FromRegion),
            () if same(RDMA) => this.rdma(arg, size),
            () => Err(ENOTTY),
        }
    }

    fn info(&self, arg: usize, size: usize) -> Result {
        if size < size_of::<abi::Info>() {
            return Err(EINVAL);
        }
        let mut info: abi::Info = pin_init::zeroed();
        info.abi_version = abi::ABI_VERSION;
        info.max_private_data = abi::MAX_PRIVATE_DATA as u32;
        info.max_message = abi::MAX_MESSAGE as u32;
        info.max_ids = MAX_IDS as u32;
        info.recv_depth = abi::RECV_DEPTH as u32;
        write_arg(arg, &info)
    }

    fn create_id(&self, me: Arc<CtlFile>, arg: usize, size: usize) -> Result {
        let mut c: abi::CreateId = read_arg(arg, size)?;
        require_zero(&[c.reserved, c.id])?;
        let ps = PortSpace::from_raw(c.port_space)?;
        let qp_type = QpType::from_raw(c.qp_type)?;
        if !qp_type.allowed_in(ps) {
            return Err(EINVAL);
        }
        let handle = self.insert(|handle| {
            let events = IdEvents {
                file: me,
                handle,
                context: c.context,
                shared: IdShared::new(abi::state::IDLE, None)?,
            };
            Ok(Arc::new(
                CmId::new(events, &self.net, ps, qp_type)?,
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

    fn bind(&self, arg: usize, size: usize) -> Result {
        let c: abi::Bind = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        let addr = addr_from_abi(&c.addr.bytes)?.ok_or(EINVAL)?;
        let id = self.get(c.id)?;
        id.with_lock(|l| l.bind(&addr))?;
        Self::shared(&id).state.lock().state = abi::state::ADDR_BOUND;
        Ok(())
    }

    fn resolve_addr(&self, arg: usize, size: usize) -> Result {
        let c: abi::ResolveAddr = read_arg(arg, size)?;
        let src = addr_from_abi(&c.src.bytes)?;
        let dst = addr_from_abi(&c.dst.bytes)?.ok_or(EINVAL)?;
        let id = self.get(c.id)?;
        id.with_lock(|l| l.resolve_addr(src.as_ref(), &dst, c.timeout_ms))?;
        Self::shared(&id).state.lock().state = abi::state::ADDR_QUERY;
        Ok(())
    }

    fn resolve_route(&self, arg: usize, size: usize) -> Result {
        let c: abi::ResolveRoute = read_arg(arg, size)?;
        let id = self.get(c.id)?;
        id.with_lock(|l| l.resolve_route(c.timeout_ms))?;
        Self::shared(&id).state.lock().state = abi::state::ROUTE_QUERY;
        Ok(())
    }

    fn listen(&self, arg: usize, size: usize) -> Result {
        let c: abi::Listen = read_arg(arg, size)?;
        if c.backlog == 0 || c.backlog > MAX_BACKLOG {
            return Err(EINVAL);
        }
        let id = self.get(c.id)?;
        let shared = Self::shared(&id);
        // Requests may arrive as soon as the CM listens: install the
        // backlog first.
        let backlog = Backlog::new(c.backlog)?;
        {
            let mut st = shared.state.lock();
            if st.backlog.is_some() {
                return Err(EINVAL);
            }
            st.backlog = Some(backlog);
        }
        match id.with_lock(|l| l.listen(c.backlog as i32)) {
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

    fn connect(&self, arg: usize, size: usize) -> Result {
        let c: abi::Connect = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        let param = conn_param_from_abi(&c.param)?;
        let id = self.get(c.id)?;
        let conn = id.with_lock(|l| -> Result<_> {
            // Refuse bad parameters before a QP exists.
            let (rd, init) = l.device_rd_atom_limits().ok_or(EINVAL)?;
            param.check(PrivateDataUse::ConnectRc, rd, init)?;
            let conn = conn::Conn::setup(l)?;
            l.connect(&param)?;
            Ok(conn)
        })?;
        let mut st = Self::shared(&id).state.lock();
        st.conn = Some(conn);
        st.state = abi::state::CONNECT;
        (st.responder_resources, st.initiator_depth) = param.rd_atom();
        Ok(())
    }

    fn accept(&self, arg: usize, size: usize) -> Result {
        let c: abi::Accept = read_arg(arg, size)?;
        if c.flags & !abi::ACCEPT_REQUEST_PARAM != 0 {
            return Err(EINVAL);
        }
        let user_param = if c.flags & abi::ACCEPT_REQUEST_PARAM != 0 {
            None
        } else {
            Some(conn_param_from_abi(&c.param)?)
        };
        let id = self.get(c.id)?;
        let (conn, param) = id.with_lock(|l| -> Result<_> {
            let param = match user_param {
                Some(p) => p,
                None => l.request_accept_param()?,
            };
            let (rd, init) = l.device_rd_atom_limits().ok_or(EINVAL)?;
            param.check(PrivateDataUse::AcceptRc, rd, init)?;
            let conn = conn::Conn::setup(l)?;
            l.accept(Some(&param))?;
            Ok((conn, param))
        })?;
        let mut st = Self::shared(&id).state.lock();
        st.conn = Some(conn);
        st.slot = None;
        st.state = abi::state::CONNECT;
        (st.responder_resources, st.initiator_depth) = param.rd_atom();
        Ok(())
    }

    fn reject(&self, arg: usize, size: usize) -> Result {
        let c: abi::Reject = read_arg(arg, size)?;
        require_zero(&[u32::from(c.reserved[0])])?;
        let len = usize::from(c.private_data_len);
        if len > PrivateDataUse::Reject.limit() {
            return Err(EINVAL);
        }
        let id = self.get(c.id)?;
        id.with_lock(|l| l.reject(c.reason, &c.private_data[..len]))?;
        let mut st = Self::shared(&id).state.lock();
        st.slot = None;
        st.state = abi::state::DISCONNECT;
        Ok(())
    }

    fn disconnect(&self, arg: usize, size: usize) -> Result {
        let c: abi::IdCmd = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        let id = self.get(c.id)?;
        id.with_lock(|l| l.disconnect())?;
        Self::shared(&id).state.lock().state = abi::state::DISCONNECT;
        Ok(())
    }

    fn set_option(&self, arg: usize, size: usize) -> Result {
        let c: abi::SetOption = read_arg(arg, size)?;
        let id = self.get(c.id)?;
        let flag = |v: u64| match v {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(EINVAL),
        };
        let small = |v: u64, max: u8| u8::try_from(v).ok().filter(|&v| v <= max).ok_or(EINVAL);
        match c.option {
            abi::option::TOS => {
                let tos = small(c.value, u8::MAX)?;
                id.with_lock(|l| l.set_tos(tos));
                Self::shared(&id).state.lock().tos = Some(tos);
                Ok(())
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

    fn query(&self, arg: usize, size: usize) -> Result {
        let c: abi::Query = read_arg(arg, size)?;
        if c.reserved.iter().any(|&r| r != 0) {
            return Err(EINVAL);
        }
        let id = self.get(c.id)?;
        let mut out: abi::Query = pin_init::zeroed();
        out.id = c.id;
        id.with_lock(|l| {
            out.port_space = l.port_space();
            out.qp_type = l.qp_type();
            out.port_num = l.port_num();
            out.qp_num = l.qp_num().unwrap_or(0);
            if let Some(a) = l.src_addr() {
                out.src.bytes = a.to_sockaddr().0;
            }
            if let Some(a) = l.dst_addr() {
                out.dst.bytes = a.to_sockaddr().0;
            }
            let mut name = [0u8; 64];
            if l.device_name(&mut name) {
                for (d, s) in out.device.iter_mut().zip(name.iter()) {
                    *d = *s;
                }
            }
        });
        {
            let st = Self::shared(&id).state.lock();
            out.state = st.state;
            out.tos = st.tos.unwrap_or(0);
            out.tos_set = u8::from(st.tos.is_some());
            out.responder_resources = st.responder_resources;
            out.initiator_depth = st.initiator_depth;
            out.backlog = st.backlog.as_ref().map_or(0, |b| b.pending());
        }
        write_arg(arg, &out)
    }

    fn get_event(&self, arg: usize, size: usize, nonblock: bool) -> Result {
        let req: abi::GetEvent = read_arg(arg, size)?;
        require_zero(&[req.reserved])?;
        let mut st = self.state.lock();
        wait_for(
            &self.events_ready,
            &mut st,
            Wait::new(req.timeout_ms, nonblock),
            |s| !s.events.is_empty(),
        )?;
        let mut out = req;
        out.event = st.events[0];
        // Copy before dequeuing: a bad pointer loses no event.
        write_arg(arg, &out)?;
        st.events.remove(0)?;
        Ok(())
    }

    fn conn_of(&self, handle: u32) -> Result<Arc<conn::Conn>> {
        let id = self.get(handle)?;
        let conn = Self::shared(&id).state.lock().conn.clone();
        conn.ok_or(ENOTCONN)
    }

    fn send(&self, arg: usize, size: usize) -> Result {
        let c: abi::Send = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        let len = c.len as usize;
        if len == 0 || len > abi::MAX_MESSAGE {
            return Err(EINVAL);
        }
        let conn = self.conn_of(c.id)?;
        let mut data = KVec::new();
        UserSlice::new(UserPtr::from_addr(c.buf as usize), len).read_all(&mut data, GFP_KERNEL)?;
        conn.send(&data, c.timeout_ms)
    }

    fn recv(&self, arg: usize, size: usize, nonblock: bool) -> Result {
        let mut c: abi::Recv = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        let conn = self.conn_of(c.id)?;
        let capacity = c.len as usize;
        let mut writer = UserSlice::new(UserPtr::from_addr(c.buf as usize), capacity).writer();
        c.len = conn.recv(&mut writer, capacity, Wait::new(c.timeout_ms, nonblock))? as u32;
        write_arg(arg, &c)
    }

    fn mr_reg(&self, arg: usize, size: usize) -> Result {
        let mut c: abi::MrReg = read_arg(arg, size)?;
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
        let conn = self.conn_of(c.id)?;
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

    fn mr_dereg(&self, arg: usize, size: usize) -> Result {
        let c: abi::MrCmd = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        self.conn_of(c.id)?.deregister(c.mr, c.timeout_ms)
    }

    fn mr_copy(&self, arg: usize, size: usize, direction: CopyDirection) -> Result {
        let c: abi::MrCopy = read_arg(arg, size)?;
        let conn = self.conn_of(c.id)?;
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

    fn rdma(&self, arg: usize, size: usize) -> Result {
        let c: abi::Rdma = read_arg(arg, size)?;
        require_zero(&[c.reserved])?;
        let op = match c.opcode {
            abi::RDMA_READ => WorkOp::RdmaRead,
            abi::RDMA_WRITE => WorkOp::RdmaWrite,
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
        self.conn_of(c.id)?
            .rdma(op, c.mr, c.offset as usize, remote, c.timeout_ms)
    }
}

/// Which way `MR_WRITE`/`MR_READ` copy.
enum CopyDirection {
    ToRegion,
    FromRegion,
}
