// SPDX-License-Identifier: GPL-2.0

//! One ioctl: its argument built, placed, made, and its result read into
//! the model.

#[allow(unused_imports)]
use super::*;

impl Worker {
    pub(super) fn ioctl_op(&mut self, fd: i32, cmd: Cmd, op: &Op) -> std::result::Result<(), i32> {
        let number = op.raw.unwrap_or(cmd.number());
        let id = self.resolve_id(op);
        let mr = self.resolve_mr(op);
        let v = op.v;
        let res = v[RESERVED];
        let local = self.sh.opts.local;
        let siw = self.sh.opts.siw_addr;
        let pattern = |n: usize, seed: u64| -> Vec<u8> {
            (0..n).map(|i| (seed as usize + i * 13) as u8).collect()
        };
        let data_ptr = |mem: &Scratch| match v[6] {
            0 => mem.data.as_ptr() as u64,
            1 => 0,
            2 => mem.prot_none(),
            3 => mem.prot_none() - 16,
            _ => 0xdead_0000_0000_0000,
        };
        let param = |v: &[u64; 8], reserved: u64| {
            let mut p = rdma_cm_rs_conn_param {
                private_data_len: v[0] as u16,
                responder_resources: v[1] as u8,
                initiator_depth: v[2] as u8,
                retry_count: v[3] as u8,
                rnr_retry_count: v[4] as u8,
                reserved: reserved as u32,
                ..Default::default()
            };
            let n = (v[0] as usize).min(p.private_data.len());
            p.private_data[..n].copy_from_slice(&pattern(n, v[0]));
            p
        };
        let p = op.ptr;
        let mem = &mut self.mem;
        // The call goes to the kernel, into a fork child's plan, or comes
        // from a fork child's results.
        macro_rules! call {
            ($val:expr, $ty:ty) => {{
                let val: $ty = $val;
                let arg = place(mem, &val, p);
                let r = match &mut self.mode {
                    Mode::Live => live_ioctl(&self.sh, fd, number, arg, op.sig),
                    Mode::Capture(plan) => {
                        plan.push(Planned {
                            fd,
                            number,
                            arg,
                            in_arg: p == Ptr::Ok,
                            bytes: mem.arg.clone(),
                        });
                        Err(NOT_RUN)
                    }
                    Mode::Feed(results) => match results.pop_front().flatten() {
                        Some((e, out)) => {
                            if p == Ptr::Ok {
                                // SAFETY: `arg` holds more than CHILD_OUT bytes.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        out.as_ptr(),
                                        mem.arg.as_mut_ptr().cast::<u8>(),
                                        out.len().min(CHILD_OUT),
                                    )
                                };
                            }
                            if e == 0 {
                                Ok(())
                            } else {
                                Err(e)
                            }
                        }
                        None => Err(NOT_RUN),
                    },
                };
                (
                    r,
                    if p == Ptr::Ok {
                        Some(fetch::<$ty>(mem))
                    } else {
                        None
                    },
                )
            }};
        }
        // Only a correct command on a good pointer tells us anything about
        // state; the rest is judged and forgotten.
        let real = op.raw.is_none() && p == Ptr::Ok;
        match cmd {
            Cmd::Info => {
                let (r, out) = call!(Default::default(), rdma_cm_rs_info);
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    if out.max_ud_peers != RDMA_CM_RS_MAX_UD_PEERS
                        || out.max_message != RDMA_CM_RS_MAX_MESSAGE
                    {
                        self.sh.finding(format!(
                            "INFO: max_ud_peers {} max_message {} (the header says {} and {})",
                            out.max_ud_peers,
                            out.max_message,
                            RDMA_CM_RS_MAX_UD_PEERS,
                            RDMA_CM_RS_MAX_MESSAGE
                        ));
                    }
                }
                r
            }
            Cmd::CreateId => {
                let (r, out) = call!(
                    rdma_cm_rs_create_id {
                        context: v[0],
                        port_space: v[1] as u32,
                        qp_type: v[2] as u32,
                        id: if res != 0 { 7 } else { 0 },
                        // Unknown flags, or busy-polling by the context's
                        // low bit; never synchronous: a synchronous id would
                        // block the actor in its calls (the suite tests
                        // those).
                        flags: if res != 0 {
                            (res >> 32) as u32 | 0x8000_0000
                        } else {
                            (v[0] as u32 & 1) * RDMA_CM_RS_ID_BUSY_POLL
                        },
                    },
                    rdma_cm_rs_create_id
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    if out.id == 0 {
                        self.sh.finding("CREATE_ID returned id 0".into());
                    }
                    self.files[op.f as usize].ids.push(IdRec::new(
                        out.id,
                        v[2] == u64::from(RDMA_CM_RS_QPT_UD),
                        St::Idle,
                    ));
                }
                r
            }
            Cmd::DestroyId | Cmd::Disconnect => {
                let reserved = res as u32 | (res >> 32) as u32;
                let r = if cmd == Cmd::DestroyId {
                    call!(rdma_cm_rs_id_cmd { id, reserved }, rdma_cm_rs_id_cmd).0
                } else {
                    call!(
                        rdma_cm_rs_disconnect {
                            id,
                            reserved,
                            ..Default::default()
                        },
                        rdma_cm_rs_disconnect
                    )
                    .0
                };
                if real && r.is_ok() {
                    let st = if cmd == Cmd::DestroyId {
                        St::Destroyed
                    } else {
                        St::Down
                    };
                    self.set_state(op, st);
                    if cmd == Cmd::DestroyId {
                        let f = &mut self.files[op.f as usize];
                        for m in f.mrs.iter_mut().filter(|m| m.id == id) {
                            m.alive = false;
                        }
                    }
                }
                r
            }
            Cmd::Bind => {
                let mut addr = match v[1] {
                    0 => sockaddr4(local, v[0] as u16),
                    2 => sockaddr4(siw, v[0] as u16),
                    _ => sockaddr4(Ipv4Addr::UNSPECIFIED, v[0] as u16),
                };
                if res & 1 != 0 {
                    addr.bytes[9] = 1; // sin_zero
                }
                let (r, _) = call!(
                    rdma_cm_rs_bind {
                        id,
                        reserved: if res != 0 && res & 1 == 0 {
                            (res >> 1) as u32 | 1
                        } else {
                            0
                        },
                        addr,
                    },
                    rdma_cm_rs_bind
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Bound);
                    if v[1] == 2 {
                        self.sh.kind("siw: ids bound to its address");
                    } else if let IdRef::Slot(n) = op.id {
                        if let Some(i) = self.files[op.f as usize].ids.get_mut(n as usize) {
                            i.port = v[0] as u16;
                        }
                    }
                }
                r
            }
            Cmd::ResolveAddr => {
                let dst = match v[1] {
                    0 => sockaddr4(local, v[0] as u16),
                    2 => {
                        let mut a = sockaddr4(local, v[0] as u16);
                        a.bytes[0] = 42; // unknown family
                        a
                    }
                    3 => {
                        let mut a = sockaddr4(local, v[0] as u16);
                        a.bytes[100] = 1; // past the structure
                        a
                    }
                    5 => sockaddr4(siw, v[0] as u16),
                    _ => rdma_cm_rs_sockaddr { bytes: [0; 128] },
                };
                let src = match v[3] {
                    0 => rdma_cm_rs_sockaddr { bytes: [0; 128] },
                    2 => sockaddr4(siw, 0),
                    _ => sockaddr4(local, 0),
                };
                let (r, _) = call!(
                    rdma_cm_rs_resolve_addr {
                        id,
                        timeout_ms: v[2] as u32,
                        src,
                        dst,
                        ..Default::default()
                    },
                    rdma_cm_rs_resolve_addr
                );
                if real && r.is_ok() {
                    self.set_state(op, St::AddrQuery);
                    if v[1] == 5 {
                        self.sh.kind("siw: ids resolving its address");
                    }
                }
                r
            }
            Cmd::ResolveRoute => {
                let (r, _) = call!(
                    rdma_cm_rs_resolve_route {
                        id,
                        timeout_ms: v[2] as u32,
                        ..Default::default()
                    },
                    rdma_cm_rs_resolve_route
                );
                if real && r.is_ok() {
                    self.set_state(op, St::RouteQuery);
                }
                r
            }
            Cmd::Listen => {
                let (r, _) = call!(
                    rdma_cm_rs_listen {
                        id,
                        backlog: v[0] as u32,
                    },
                    rdma_cm_rs_listen
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Listening);
                    // An RC listener the peers can reach: they try it
                    // first; a UD one, every thread's UD ids.
                    let (port, ud) = match op.id {
                        IdRef::Slot(n) => self.files[op.f as usize]
                            .ids
                            .get(n as usize)
                            .map_or((0, false), |i| (i.port, i.ud)),
                        _ => (0, false),
                    };
                    if port != 0 {
                        let mut ports = if ud {
                            self.sh.ud_listen_ports.lock().unwrap()
                        } else {
                            self.sh.listen_ports.lock().unwrap()
                        };
                        if ports.len() == 6 {
                            ports.pop_front();
                        }
                        ports.push_back(port);
                    }
                }
                r
            }
            Cmd::Connect => {
                let (r, _) = call!(
                    rdma_cm_rs_connect {
                        id,
                        reserved: if res != 0 { res as u32 | 1 } else { 0 },
                        param: param(&v, res >> 32),
                        ..Default::default()
                    },
                    rdma_cm_rs_connect
                );
                if real && r.is_ok() {
                    self.set_state(op, St::Connecting);
                    if let Some(i) = self.rec_of(op) {
                        i.qp = true;
                        // A UD id whose lookup failed may look up again: a
                        // connect the module took makes its state CONNECT,
                        // and its peers from before take sends again.
                        i.dead = false;
                    }
                }
                r
            }
            Cmd::Accept => {
                let (r, _) = call!(
                    rdma_cm_rs_accept {
                        id,
                        flags: (v[5] as u32) | if res != 0 { 0x80 } else { 0 },
                        param: param(&v, 0),
                        ..Default::default()
                    },
                    rdma_cm_rs_accept
                );
                if real && r.is_ok() {
                    // A SIDR reply: no event follows, the UD QP is there.
                    let ud = self.rec_of(op).is_some_and(|i| {
                        i.qp = true;
                        i.ud
                    });
                    if ud {
                        self.sh.kind("ud: SIDR requests accepted");
                    }
                    self.set_state(op, if ud { St::Connected } else { St::Connecting });
                }
                r
            }
            Cmd::Reject => {
                let mut rj = rdma_cm_rs_reject {
                    id,
                    reason: v[1] as u8,
                    reserved: [if res != 0 { res as u8 | 1 } else { 0 }],
                    private_data_len: v[0] as u16,
                    ..Default::default()
                };
                let n = (v[0] as usize).min(rj.private_data.len());
                rj.private_data[..n].copy_from_slice(&pattern(n, v[0]));
                let (r, _) = call!(rj, rdma_cm_rs_reject);
                if real && r.is_ok() {
                    self.set_state(op, St::Down);
                    if let Some(i) = self.rec_of(op) {
                        i.dead = true;
                    }
                }
                r
            }
            Cmd::SetOption => {
                call!(
                    rdma_cm_rs_set_option {
                        id,
                        option: v[0] as u32,
                        value: v[1],
                    },
                    rdma_cm_rs_set_option
                )
                .0
            }
            Cmd::Query => {
                let mut q = rdma_cm_rs_query {
                    id,
                    ..Default::default()
                };
                q.reserved[(res % 3) as usize] = res;
                let (r, out) = call!(q, rdma_cm_rs_query);
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    self.on_query(op, &out);
                }
                r
            }
            Cmd::GetEvent => {
                let (r, out) = call!(
                    rdma_cm_rs_get_event {
                        timeout_ms: v[0] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                        ..Default::default()
                    },
                    rdma_cm_rs_get_event
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    self.on_event(op.f as usize, &out.event);
                }
                r
            }
            Cmd::Send => {
                let len = v[0] as usize;
                let buf = data_ptr(mem);
                let (r, _) = call!(
                    rdma_cm_rs_send {
                        id,
                        len: len as u32,
                        buf,
                        timeout_ms: v[2] as u32,
                        // An unknown flag where other commands have a
                        // non-zero reserved field.
                        flags: (v[5] as u32 & RDMA_CM_RS_SEND_NOWAIT)
                            | if res != 0 { 0x80 } else { 0 },
                    },
                    rdma_cm_rs_send
                );
                // A UD id that connected and got as far as a send: close
                // its file soon.
                let f = &mut self.files[op.f as usize];
                if let IdRef::Slot(n) = op.id {
                    if f.ids.get(n as usize).is_some_and(|i| {
                        i.ud && matches!(i.st, St::Connecting | St::Connected | St::Down)
                    }) {
                        f.close_soon = true;
                    }
                }
                r
            }
            Cmd::Recv => {
                // The buffer is 2 MiB: a message (<= 4096 bytes) always fits
                // whatever `len` claims.
                let buf = data_ptr(mem);
                call!(
                    rdma_cm_rs_recv {
                        id,
                        len: v[0] as u32,
                        buf,
                        timeout_ms: v[2] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_recv
                )
                .0
            }
            Cmd::SendRecv => {
                // One 2 MiB buffer for both: the message is copied out
                // before the answer is copied in; `v[5]` says which of
                // the two `v[6]` may spoil.
                let good = mem.data.as_ptr() as u64;
                let (send_buf, recv_buf) = match v[5] {
                    0 => (data_ptr(mem), good),
                    _ => (good, data_ptr(mem)),
                };
                call!(
                    rdma_cm_rs_send_recv {
                        id,
                        send_len: v[0] as u32,
                        send_buf,
                        recv_buf,
                        recv_len: v[1] as u32,
                        timeout_ms: v[2] as u32,
                        sent: 0,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_send_recv
                )
                .0
            }
            Cmd::UdSend => {
                let buf = match v[6] {
                    0 => mem.ud_tx.as_ptr() as u64,
                    _ => data_ptr(mem),
                };
                let (r, _) = call!(
                    rdma_cm_rs_ud_send {
                        id,
                        peer: v[1] as u32,
                        buf,
                        len: v[0] as u32,
                        flags: v[3] as u32,
                        imm_data: v[4] as u32,
                        timeout_ms: v[2] as u32,
                    },
                    rdma_cm_rs_ud_send
                );
                // Some sends close their file soon after (`v[5]`).
                let f = &mut self.files[op.f as usize];
                if let IdRef::Slot(n) = op.id {
                    if v[5] != 0
                        && f.ids.get(n as usize).is_some_and(|i| {
                            i.ud && matches!(i.st, St::Connecting | St::Connected | St::Down)
                        })
                    {
                        f.close_soon = true;
                    }
                }
                r
            }
            Cmd::JoinMcast => {
                let (r, _) = call!(
                    rdma_cm_rs_join_mcast {
                        context: v[3],
                        id,
                        flags: v[1] as u32 | if res != 0 { res as u32 | 2 } else { 0 },
                        addr: mcast_group(self.t, v[0], local),
                        ..Default::default()
                    },
                    rdma_cm_rs_join_mcast
                );
                if real && r.is_ok() {
                    // The join made the id's UD QP if it had none.
                    if let Some(i) = self.rec_of(op) {
                        i.qp = true;
                    }
                    self.sh.kind("mcast: groups joined");
                }
                r
            }
            Cmd::LeaveMcast => {
                let (r, _) = call!(
                    rdma_cm_rs_leave_mcast {
                        id,
                        reserved: res as u32 | (res >> 32) as u32,
                        addr: mcast_group(self.t, v[0], local),
                    },
                    rdma_cm_rs_leave_mcast
                );
                if real && r.is_ok() {
                    self.sh.kind("mcast: groups left");
                }
                r
            }
            Cmd::UdRecv => {
                // Into the 2 MiB buffer, like RECV: a datagram always fits
                // whatever `len` claims.
                let buf = data_ptr(mem);
                let mut c = rdma_cm_rs_ud_recv {
                    id,
                    len: v[0] as u32,
                    buf,
                    timeout_ms: v[2] as u32,
                    reserved: res as u32 | (res >> 32) as u32,
                    ..Default::default()
                };
                if v[3] != 0 {
                    // Outputs only: their input values mean nothing.
                    c.flags = v[3] as u32;
                    c.imm_data = (v[3] >> 32) as u32;
                    c.peer = v[3] as u32 ^ 0x5a5a_5a5a;
                    c.src_qp = (v[3] >> 8) as u32;
                    c.src.bytes[..8].copy_from_slice(&v[3].to_ne_bytes());
                }
                let live = matches!(self.mode, Mode::Live);
                let (r, out) = call!(c, rdma_cm_rs_ud_recv);
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    // Every datagram in the VM is a UD_SEND of this
                    // program: a prefix of `ud_byte`, the GRH stripped.
                    let n = (out.len as usize).min(mem.data.len());
                    let bad = (live && v[6] == 0)
                        .then(|| (0..n).find(|&i| mem.data[i] != ud_byte(i)))
                        .flatten();
                    self.on_datagram(op, &out, bad);
                }
                r
            }
            Cmd::MrReg => {
                let (r, out) = call!(
                    rdma_cm_rs_mr_reg {
                        id,
                        access: v[1] as u32,
                        length: v[0] as u32,
                        timeout_ms: v[2] as u32,
                        reserved: [res, 0],
                        ..Default::default()
                    },
                    rdma_cm_rs_mr_reg
                );
                if let (true, Ok(()), Some(out)) = (real, r, out) {
                    self.files[op.f as usize].mrs.push(MrRec {
                        id,
                        handle: out.mr,
                        len: v[0] as u32,
                        alive: true,
                    });
                    if v[1] != 0 {
                        let mut regions = self.sh.regions.lock().unwrap();
                        if regions.len() > 256 {
                            regions.remove(0);
                        }
                        regions.push((out.addr, out.rkey, v[0] as u32));
                    }
                }
                r
            }
            Cmd::MrDereg => {
                let (r, _) = call!(
                    rdma_cm_rs_mr_cmd {
                        id,
                        mr,
                        timeout_ms: v[2] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_mr_cmd
                );
                if real && r.is_ok() {
                    for m in self.files[op.f as usize].mrs.iter_mut() {
                        if m.id == id && m.handle == mr {
                            m.alive = false;
                        }
                    }
                }
                r
            }
            Cmd::MrWrite | Cmd::MrRead => {
                let buf = data_ptr(mem);
                // mr_copy has no reserved field: garbage goes into the
                // length instead (past any region).
                let len = if res != 0 {
                    (1 << 20) + 1 + (res as u32 & 0xffff)
                } else {
                    v[4] as u32
                };
                // A read longer than the scratch buffer could only succeed
                // past the region: never let the kernel write beyond it.
                let len = if cmd == Cmd::MrRead && v[6] == 0 && len as usize > DATA_LEN {
                    (DATA_LEN as u32) + 1
                } else {
                    len
                };
                call!(
                    rdma_cm_rs_mr_copy {
                        id,
                        mr,
                        offset: v[3] as u32,
                        len,
                        buf,
                    },
                    rdma_cm_rs_mr_copy
                )
                .0
            }
            Cmd::Rdma => {
                call!(
                    rdma_cm_rs_rdma {
                        id,
                        opcode: v[1] as u32,
                        mr,
                        offset: v[3] as u32,
                        len: v[4] as u32,
                        rkey: v[6] as u32,
                        remote_addr: v[5],
                        timeout_ms: v[2] as u32,
                        reserved: res as u32 | (res >> 32) as u32,
                    },
                    rdma_cm_rs_rdma
                )
                .0
            }
        }
    }
}
