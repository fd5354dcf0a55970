// SPDX-License-Identifier: GPL-2.0

//! Generation: the next operation, plausible mostly, hostile sometimes.

#[allow(unused_imports)]
use super::*;

impl Worker {
    pub(super) fn gen(&mut self) -> Op {
        match self.role {
            Role::Ioctl => {}
            Role::Peers => return self.gen_peer(),
            Role::Link => return self.gen_link(),
        }
        let t = self.t;
        let open = self.open_files();
        let want = self.sh.opts.files as usize;
        if open.is_empty() || (open.len() < want && self.rng.pct(4)) {
            let nonblock = self.rng.pct(25);
            return Op::new(t, self.files.len() as u32, Act::Open { nonblock });
        }
        // A file holding a UD id that was sent on: close it (the teardown
        // of a UD id with traffic posted is the interesting part).
        if let Some(&f) = open.iter().find(|&&f| self.files[f as usize].close_soon) {
            if self.rng.pct(35) {
                let mut op = Op::new(t, f, Act::Close);
                op.fd = self.rng.below(self.files[f as usize].fds.len() as u64) as u32;
                return op;
            }
        }
        let f = open[self.rng.below(open.len() as u64) as usize];
        let nfds = self.files[f as usize].fds.len() as u64;
        let r = self.rng.below(1000);
        if r < 12 {
            let mut op = Op::new(t, f, Act::Close);
            op.fd = self.rng.below(nfds) as u32;
            return op;
        }
        if r < 20 && nfds < 3 {
            let mut op = Op::new(t, f, Act::Dup);
            op.fd = self.rng.below(nfds) as u32;
            return op;
        }
        if (20..24).contains(&r) {
            let mut op = Op::new(t, f, Act::Fork);
            op.v[0] = self.rng.next_u64();
            op.v[1] = self.rng.range(1, CHILD_OPS);
            return op;
        }
        let mut op = self.gen_ioctl(f);
        op.fd = self.rng.below(nfds) as u32;
        if self.rng.pct(12) {
            self.mutate(&mut op);
        }
        self.maybe_signal(&mut op);
        op
    }

    /// Some calls that may sleep get a signal from another thread while in
    /// them (and a wait long enough for it to land: on a blocking file
    /// GET_EVENT may even wait for ever).
    fn maybe_signal(&mut self, op: &mut Op) {
        let Act::Ioctl(cmd) = op.act else { return };
        if !cmd.may_block() || !self.rng.pct(6) {
            return;
        }
        let ms = match self.rng.below(10) {
            0..=2 => self.rng.range(0, 3),
            3..=7 => self.rng.range(4, 60),
            _ => self.rng.range(61, 150),
        };
        op.sig = Some(ms as u32);
        let infinite = u64::from(RDMA_CM_RS_TIMEOUT_INFINITE);
        match cmd {
            Cmd::GetEvent if !self.files[op.f as usize].nonblock && self.rng.pct(35) => {
                op.v[0] = infinite;
            }
            Cmd::GetEvent if op.v[0] != infinite => op.v[0] = op.v[0].max(ms + 30),
            Cmd::Recv | Cmd::UdRecv | Cmd::SendRecv => op.v[2] = op.v[2].max(ms + 30),
            _ => {}
        }
    }

    /// The peer actor: spawns librdmacm peers into free slots and kills
    /// them at random times; now and then right after the spawn (before the
    /// peer got anywhere).
    fn gen_peer(&mut self) -> Op {
        let slots = self.sh.opts.peers.max(1) as usize;
        self.gen_peers.resize(slots, false);
        if let Some(s) = self.last_spawn.take() {
            if self.rng.pct(20) {
                let mut op = Op::new(self.t, s, Act::Peer { kill: true });
                op.v[0] = self.rng.range(0, 80);
                self.gen_peers[s as usize] = false;
                return op;
            }
        }
        let free: Vec<u32> = (0..slots as u32)
            .filter(|&s| !self.gen_peers[s as usize])
            .collect();
        let busy: Vec<u32> = (0..slots as u32)
            .filter(|&s| self.gen_peers[s as usize])
            .collect();
        if !free.is_empty() && (busy.is_empty() || self.rng.pct(50)) {
            let s = free[self.rng.below(free.len() as u64) as usize];
            let mut op = Op::new(self.t, s, Act::Peer { kill: false });
            op.v[0] = self.rng.range(100, 1200);
            op.v[2] = self.rng.next_u64();
            self.gen_peers[s as usize] = true;
            self.last_spawn = Some(s);
            return op;
        }
        let s = busy[self.rng.below(busy.len() as u64) as usize];
        let mut op = Op::new(self.t, s, Act::Peer { kill: true });
        op.v[0] = match self.rng.below(10) {
            0..=1 => self.rng.range(0, 100),
            2..=4 => self.rng.range(300, 2000),
            _ => self.rng.range(4000, 10_000),
        };
        self.gen_peers[s as usize] = false;
        op
    }

    /// The link actor: deletes the siw device, adds it back, and so on.
    fn gen_link(&mut self) -> Op {
        let add = self.gen_link_deleted;
        let mut op = Op::new(self.t, 0, Act::Link { add });
        op.v[0] = if add {
            self.rng.range(300, 3000)
        } else {
            self.rng.range(1500, 6000)
        };
        self.gen_link_deleted = !add;
        op
    }

    pub(super) fn gen_ioctl(&mut self, f: u32) -> Op {
        let t = self.t;
        let ids = self.files[f as usize].ids.clone();
        let live: Vec<usize> = (0..ids.len())
            .filter(|&i| !matches!(ids[i].st, St::Destroyed | St::Gone | St::Removed))
            .collect();
        let r = self.rng.below(100);
        if r < 22 {
            return self.get_event(f);
        }
        if live.is_empty() || (r < 30 && live.len() < 16) {
            return self.create(f);
        }
        if r < 31 {
            return Op::new(t, f, Act::Ioctl(Cmd::Info));
        }
        // Ids with a next step count more; a request most (its peer, a
        // librdmacm process perhaps, waits for the answer).
        let weights: Vec<u64> = live
            .iter()
            .map(|&i| match ids[i].st {
                St::Down | St::Listening => 1,
                St::Requested => 12,
                // A UD id with a QP: its datagrams go both ways.
                St::Connected if ids[i].ud => 6,
                _ => 4,
            })
            .collect();
        let slot = live[self.rng.weighted(&weights)];
        let rec = ids[slot].clone();
        let id = IdRef::Slot(slot as u32);
        let ud = rec.ud;
        let peers = !rec.peers.is_empty();
        // A UD id of a thread without a UD listener listens itself, more
        // often than not: SIDR lookups need somebody to answer them.
        let ud_listen = ud
            && rec.st == St::Idle
            && !self
                .files
                .iter()
                .any(|f| f.open() && f.ids.iter().any(|i| i.ud && i.st == St::Listening));
        use Cmd::*;
        // UD_SEND/UD_RECV on RC ids and the RC data path on UD ids now and
        // then, whatever the state: EOPNOTSUPP.  A second CONNECT or ACCEPT
        // on an id that has its QP: refused.
        let choices: &[(Cmd, u64)] = match rec.st {
            St::Idle if ud_listen => &[
                (Bind, 60),
                (ResolveAddr, 25),
                (SetOption, 5),
                (Query, 4),
                (DestroyId, 4),
                (UdRecv, 2),
            ],
            St::Idle => &[
                (ResolveAddr, 55),
                (Bind, 25),
                (SetOption, 8),
                (Query, 4),
                (DestroyId, 4),
                (Connect, 2),
                (Listen, 2),
                (UdRecv, 1),
            ],
            St::Bound => &[
                (Listen, 70),
                (JoinMcast, 12),
                (ResolveAddr, 10),
                (SetOption, 8),
                (Query, 6),
                (DestroyId, 6),
            ],
            St::AddrQuery | St::RouteQuery => &[
                (GetEvent, 55),
                (ResolveRoute, 10),
                (Connect, 8),
                (Query, 10),
                (DestroyId, 8),
                (Send, 9),
                (UdSend, 3),
                (UdRecv, 2),
            ],
            St::AddrResolved => &[
                (ResolveRoute, 75),
                (JoinMcast, 8),
                (Connect, 6),
                (SetOption, 5),
                (Query, 5),
                (DestroyId, 5),
                (Listen, 4),
            ],
            St::RouteResolved => &[
                (Connect, 85),
                (Query, 5),
                (DestroyId, 5),
                (Send, 5),
                (UdSend, 2),
            ],
            // The SIDR lookup under way.
            St::Connecting if ud => &[
                (GetEvent, 40),
                (UdRecv, 15),
                (UdSend, 5),
                (Query, 6),
                (Send, 5),
                (MrReg, 3),
                (Rdma, 2),
                (Disconnect, 4),
                (DestroyId, 5),
                (Connect, 1),
            ],
            St::Connecting => &[
                (GetEvent, 45),
                (Send, 20),
                (Recv, 10),
                (SendRecv, 4),
                (Disconnect, 10),
                (DestroyId, 10),
                (MrReg, 5),
                (UdSend, 2),
            ],
            // Datagrams to the peers it knows, and the RC data path.
            St::Connected if ud && peers => &[
                (UdSend, 34),
                (UdRecv, 30),
                (JoinMcast, 5),
                (LeaveMcast, 5),
                (Query, 6),
                (DestroyId, 3),
                (Send, 4),
                (Recv, 2),
                (MrReg, 2),
                (MrWrite, 1),
                (MrRead, 1),
                (MrDereg, 1),
                (Rdma, 2),
                (Disconnect, 3),
                (Connect, 1),
                (Accept, 1),
            ],
            // An accepted id: it learns its peers from what it receives.
            St::Connected if ud => &[
                (UdRecv, 50),
                (JoinMcast, 4),
                (LeaveMcast, 3),
                (UdSend, 6),
                (Query, 8),
                (DestroyId, 3),
                (Send, 3),
                (Recv, 2),
                (SendRecv, 1),
                (MrReg, 2),
                (Rdma, 2),
                (Disconnect, 3),
                (Connect, 1),
                (Accept, 1),
            ],
            St::Connected => &[
                (Send, 25),
                (Recv, 20),
                (SendRecv, 10),
                (MrReg, 12),
                (MrWrite, 8),
                (MrRead, 8),
                (Rdma, 8),
                (MrDereg, 6),
                (Disconnect, 5),
                (Query, 4),
                (DestroyId, 3),
                (SetOption, 1),
                (UdSend, 2),
                (UdRecv, 2),
                (Connect, 1),
            ],
            St::Listening => &[
                (GetEvent, 70),
                (Query, 10),
                (DestroyId, 10),
                (SetOption, 10),
                (UdRecv, 2),
            ],
            St::Requested => &[
                (Accept, 55),
                (Reject, 25),
                (DestroyId, 10),
                (GetEvent, 5),
                (Query, 5),
                (UdSend, 2),
            ],
            St::Down | St::Destroyed | St::Gone | St::Removed => &[
                (DestroyId, 45),
                (Disconnect, 10),
                (Send, 10),
                (Recv, 10),
                (SendRecv, 3),
                (GetEvent, 20),
                (Query, 5),
                (UdSend, 5),
                (UdRecv, 5),
                (LeaveMcast, 3),
            ],
        };
        let weights: Vec<u64> = choices.iter().map(|c| c.1).collect();
        let cmd = choices[self.rng.weighted(&weights)].0;
        self.plausible(f, cmd, id, &rec)
    }

    fn create(&mut self, f: u32) -> Op {
        let mut op = Op::new(self.t, f, Act::Ioctl(Cmd::CreateId));
        op.v[0] = self.rng.next_u64(); // context
        let (ps, qpt) = match self.rng.below(100) {
            0..=54 => (RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_RC),
            55..=94 => (RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_UD),
            95 => (RDMA_CM_RS_PS_IB, RDMA_CM_RS_QPT_RC),
            96 => (RDMA_CM_RS_PS_IPOIB, RDMA_CM_RS_QPT_UD),
            97 => {
                op.expect = Expect::Fail;
                (RDMA_CM_RS_PS_TCP, RDMA_CM_RS_QPT_UD)
            }
            98 => {
                op.expect = Expect::Fail;
                (RDMA_CM_RS_PS_UDP, RDMA_CM_RS_QPT_RC)
            }
            _ => {
                op.expect = Expect::Fail;
                (self.rng.below(0x200) as u32 | 0x1000, RDMA_CM_RS_QPT_RC)
            }
        };
        op.v[1] = u64::from(ps);
        op.v[2] = u64::from(qpt);
        op
    }

    fn get_event(&mut self, f: u32) -> Op {
        let mut op = Op::new(self.t, f, Act::Ioctl(Cmd::GetEvent));
        op.v[0] = match self.rng.below(10) {
            0..=3 => 0,
            4..=7 => self.rng.range(1, 50),
            _ => self.rng.range(51, 200),
        };
        // An O_NONBLOCK file never waits, whatever the timeout says.
        if self.files[f as usize].nonblock && self.rng.pct(20) {
            op.v[0] = u64::from(RDMA_CM_RS_TIMEOUT_INFINITE);
        }
        op
    }

    fn timeout(&mut self) -> u64 {
        self.rng.range(1, 200)
    }

    fn plausible(&mut self, f: u32, cmd: Cmd, id: IdRef, rec: &IdRec) -> Op {
        let mut op = Op::new(self.t, f, Act::Ioctl(cmd));
        op.id = id;
        let v = &mut op.v;
        match cmd {
            Cmd::Bind => {
                v[0] = self.port();
                // The local address (rxe), any, or the siw device's (where
                // a UD id gets nowhere: iWARP has no UD).
                v[1] = match (rec.ud, self.rng.below(100)) {
                    (_, 0..=69) => 0,
                    (_, 70..=84) | (true, 85..=94) => 1,
                    _ => 2,
                };
            }
            Cmd::ResolveAddr => {
                v[0] = self.port();
                if rec.ud {
                    // Mostly where a UD listener is, so that the SIDR
                    // lookup finds one.
                    if let Some(port) = self.ud_listener_port() {
                        v[0] = u64::from(port);
                    }
                }
                // The local address (rxe) or the siw device's.
                let siw = self.rng.pct(if rec.ud { 5 } else { 20 });
                v[1] = if siw { 5 } else { 0 };
                v[2] = self.rng.range(100, 2000);
                // A source address: none, the local one or the siw one
                // (which mostly matches the destination).
                v[3] = match (siw, self.rng.below(100)) {
                    (_, 0..=79) => 0,
                    (true, 80..=94) | (false, 95..) => 2,
                    _ => 1,
                };
            }
            Cmd::ResolveRoute => v[2] = self.rng.range(100, 2000),
            Cmd::JoinMcast => {
                // One of the thread's 4 groups (joined already:
                // EADDRINUSE), now and then the local unicast address
                // (EINVAL) or an IPv6 group (EOPNOTSUPP on RoCE v2).
                v[0] = match self.rng.below(100) {
                    0..=84 => self.rng.below(4),
                    85..=92 => MCAST_UNICAST,
                    _ => MCAST_IPV6,
                };
                v[1] = if self.rng.pct(25) {
                    u64::from(RDMA_CM_RS_JOIN_SENDONLY)
                } else {
                    0
                };
                v[3] = self.rng.next_u64(); // the join's context
            }
            // One of the 4 groups, or a fifth never joined (ENOENT).
            Cmd::LeaveMcast => v[0] = self.rng.below(5),
            // 0 too: it takes the largest backlog.
            Cmd::Listen => v[0] = self.rng.range(0, 8),
            Cmd::Connect => {
                // A UD id's SIDR request carries up to 180 bytes, an RC
                // REQ 56.
                v[0] = if rec.ud {
                    match self.rng.below(100) {
                        0..=59 => self.rng.range(0, 56),
                        60..=94 => self.rng.range(57, 180),
                        _ => self.rng.range(181, 256),
                    }
                } else {
                    self.rng.range(0, 56)
                };
                v[1] = self.rng.range(0, 2);
                v[2] = self.rng.range(0, 2);
                v[3] = self.rng.range(0, 7);
                v[4] = self.rng.range(0, 7);
                // A second CONNECT on an id with its QP, or more private
                // data than a SIDR request carries.
                if v[0] > 180 || rec.qp {
                    op.expect = Expect::Fail;
                }
            }
            Cmd::Accept => {
                v[5] = u64::from(self.rng.pct(50)); // ACCEPT_REQUEST_PARAM
                                                    // A SIDR reply carries up to 136 bytes, an RC REP 196.
                v[0] = if rec.ud && self.rng.pct(90) {
                    self.rng.range(0, 136)
                } else {
                    self.rng.range(0, 196)
                };
                v[1] = self.rng.range(0, 2);
                v[2] = self.rng.range(0, 2);
                v[3] = self.rng.range(0, 7);
                v[4] = 7;
                // Not a request (any more), or a SIDR reply's private data
                // over the limit (ignored with ACCEPT_REQUEST_PARAM).
                if rec.qp || (rec.ud && v[5] == 0 && v[0] > 136) {
                    op.expect = Expect::Fail;
                }
            }
            Cmd::Reject => {
                v[0] = if rec.ud && self.rng.pct(90) {
                    self.rng.range(0, 136)
                } else {
                    self.rng.range(0, 148)
                };
                v[1] = if self.rng.pct(50) {
                    0
                } else {
                    self.rng.below(40)
                };
                if rec.ud && v[0] > 136 {
                    op.expect = Expect::Fail;
                }
            }
            Cmd::SetOption => {
                v[0] = self.rng.range(1, 5);
                v[1] = match v[0] {
                    1 => self.rng.below(256),
                    2 | 3 => self.rng.below(2),
                    _ => self.rng.below(32),
                };
            }
            Cmd::Send => {
                v[0] = if self.rng.pct(70) {
                    self.rng.range(1, 256)
                } else {
                    self.rng.range(1, 4096)
                };
                v[2] = self.rng.range(1, 200);
                // RDMA_CM_RS_SEND_NOWAIT: posted, not waited for.
                v[5] = u64::from(self.rng.pct(30));
            }
            Cmd::Recv => {
                v[0] = if self.rng.pct(85) {
                    4096
                } else {
                    self.rng.range(0, 4200)
                };
                v[2] = self.rng.range(0, 150);
            }
            Cmd::SendRecv => {
                v[0] = self.rng.range(1, 4096);
                v[1] = if self.rng.pct(85) {
                    4096
                } else {
                    self.rng.range(0, 4200)
                };
                v[2] = self.rng.range(0, 150);
            }
            Cmd::MrReg => {
                v[0] = match self.rng.below(10) {
                    0..=6 => self.rng.range(1, 8192),
                    7..=8 => self.rng.range(8193, 128 << 10),
                    _ => 1 << 20,
                };
                v[1] = self.rng.range(0, 3);
                v[2] = self.rng.range(1, 200);
            }
            Cmd::MrDereg | Cmd::MrWrite | Cmd::MrRead | Cmd::Rdma => {
                let file = &self.files[f as usize];
                let mrs: Vec<&MrRec> = file
                    .mrs
                    .iter()
                    .filter(|m| m.alive && m.id == rec.handle)
                    .collect();
                let (mr, len) = if mrs.is_empty() {
                    (1000 + self.rng.range(1, 9), 4096)
                } else {
                    let m = mrs[self.rng.below(mrs.len() as u64) as usize];
                    let index = file
                        .mrs
                        .iter()
                        .position(|x| x.handle == m.handle && x.id == m.id)
                        .unwrap();
                    (index as u64, u64::from(m.len))
                };
                v[0] = mr;
                let off = self.rng.below(len);
                let n = self.rng.range(1, (len - off).min(8192));
                v[3] = off;
                v[4] = n;
                v[2] = self.timeout();
                if cmd == Cmd::Rdma {
                    v[1] = self.rng.range(1, 2);
                    let regions = self.sh.regions.lock().unwrap();
                    if !regions.is_empty() && self.rng.pct(80) {
                        let (addr, rkey, rlen) =
                            regions[self.rng.below(regions.len() as u64) as usize];
                        let roff = self.rng.below(u64::from(rlen));
                        v[5] = addr + roff;
                        v[6] = u64::from(rkey);
                        v[4] = self.rng.range(1, (u64::from(rlen) - roff).min(n));
                    } else {
                        v[5] = self.rng.next_u64() & 0xffff_ffff_f000;
                        v[6] = self.rng.below(1 << 32);
                    }
                }
            }
            Cmd::UdSend => {
                // Small, up to the path MTU, exactly it, above it (but
                // within the ABI's 4096: EMSGSIZE), above 4096 (EINVAL).
                let max = match rec.max_dg {
                    0 => 1024,
                    m => u64::from(m).min(4096),
                };
                v[0] = match self.rng.below(100) {
                    0..=44 => self.rng.range(1, 64.min(max)),
                    45..=69 => self.rng.range(1, max),
                    70..=79 => max,
                    80..=92 if max < 4096 => self.rng.range(max + 1, 4096),
                    93.. => self.rng.range(4097, 8192),
                    _ => max,
                };
                // A peer the id has, mostly; else a guess (1: the SIDR
                // reply's, perhaps not read yet) or one it cannot have.
                v[1] = if !rec.peers.is_empty() && self.rng.pct(92) {
                    u64::from(rec.peers[self.rng.below(rec.peers.len() as u64) as usize])
                } else if self.rng.pct(50) {
                    1
                } else {
                    [0, 65, 0x8000_0000, u64::from(u32::MAX)][self.rng.below(4) as usize]
                };
                v[2] = if self.rng.pct(10) {
                    0 // the default, 5 s
                } else {
                    self.rng.range(1, 200)
                };
                // With immediate data (0 included) or without.
                if self.rng.pct(30) {
                    v[3] = u64::from(RDMA_CM_RS_UD_WITH_IMM);
                    v[4] = if self.rng.pct(20) {
                        0
                    } else {
                        self.rng.below(1 << 32)
                    };
                }
                // Close the file soon after: the teardown of a UD id with
                // datagrams in flight.
                v[5] = u64::from(self.rng.pct(6));
            }
            Cmd::UdRecv => {
                v[0] = match self.rng.below(100) {
                    0..=84 => 4096,
                    // Smaller than most datagrams: EMSGSIZE, it stays.
                    85..=94 => self.rng.range(1, 64),
                    _ => self.rng.range(0, 4200),
                };
                v[2] = self.rng.range(0, 150);
                // Garbage in the output fields: ignored.
                if self.rng.pct(10) {
                    v[3] = self.rng.next_u64() | 1;
                }
            }
            Cmd::Query
            | Cmd::DestroyId
            | Cmd::Disconnect
            | Cmd::GetEvent
            | Cmd::Info
            | Cmd::CreateId => {}
        }
        if cmd == Cmd::GetEvent {
            return self.get_event(f);
        }
        if op.expect == Expect::Any {
            op.expect = self.expect_of(cmd, rec, &op.v);
        }
        op
    }

    /// What the module must answer to a plausible `cmd` on `rec` with
    /// parameters `v`, as far as the QP type and the model's state tell.
    fn expect_of(&self, cmd: Cmd, rec: &IdRec, v: &[u64; 8]) -> Expect {
        let gone = matches!(rec.st, St::Destroyed | St::Removed);
        // Before CONNECT/ACCEPT there is no QP; a fork child's calls come
        // from the model before any of them ran: one may connect first.
        let no_qp = !self.gen_child && !rec.qp;
        match cmd {
            // Checked before the id is looked up.
            Cmd::UdSend if v[0] == 0 || v[0] > u64::from(RDMA_CM_RS_MAX_MESSAGE) => Expect::Einval,
            c if c.rc_only() && rec.ud => Expect::Eopnotsupp,
            Cmd::UdSend | Cmd::UdRecv if !rec.ud => Expect::Eopnotsupp,
            // Groups are for UD ids; a unicast address is none.  Both
            // are checked after the id's lookup (ENOENT if it is gone).
            Cmd::JoinMcast | Cmd::LeaveMcast if !rec.ud => Expect::Fail,
            Cmd::JoinMcast if v[0] == MCAST_UNICAST => Expect::Fail,
            _ if gone => Expect::Fail,
            // Without its QP, or after its lookup failed (REJECTED,
            // UNREACHABLE, CONNECT_ERROR) or a REJECT; UD_RECV still
            // returns what came before.
            Cmd::UdSend if no_qp || rec.dead => Expect::Enotconn,
            Cmd::UdRecv if no_qp => Expect::Enotconn,
            Cmd::UdSend if v[1] == 0 || v[1] > u64::from(RDMA_CM_RS_MAX_UD_PEERS) => Expect::Fail,
            Cmd::UdSend
                if rec.qp
                    && rec.max_dg != 0
                    && v[0] > u64::from(rec.max_dg)
                    && rec.peers.contains(&(v[1] as u32)) =>
            {
                Expect::Emsgsize
            }
            _ => Expect::Any,
        }
    }

    /// A port where a UD listener is, on the local address or any: this
    /// thread's own mostly, else one any thread had lately (`None`: any
    /// port will do).
    fn ud_listener_port(&mut self) -> Option<u16> {
        let own: Vec<u16> = self
            .files
            .iter()
            .filter(|f| f.open())
            .flat_map(|f| f.ids.iter())
            .filter(|i| i.ud && i.st == St::Listening && i.port != 0)
            .map(|i| i.port)
            .collect();
        if !own.is_empty() && self.rng.pct(60) {
            return Some(own[self.rng.below(own.len() as u64) as usize]);
        }
        let any: Vec<u16> = self
            .sh
            .ud_listen_ports
            .lock()
            .unwrap()
            .iter()
            .copied()
            .collect();
        if !any.is_empty() && self.rng.pct(50) {
            return Some(any[self.rng.below(any.len() as u64) as usize]);
        }
        None
    }

    /// A changed command number for `right` (of size `size`): `kind` 0
    /// another size, 1 another direction, 2 another number or type.  It
    /// may still be a real one (another command's number): the caller
    /// draws again then.
    fn wrong_number(&mut self, right: u32, size: u32, kind: u64) -> u32 {
        match kind {
            0 => {
                // Another size: another, unknown command.
                let other = loop {
                    let s = match self.rng.below(3) {
                        0 => size + 8,
                        1 => size.saturating_sub(8),
                        _ => self.rng.below(0x4000) as u32,
                    };
                    if s != size {
                        break s;
                    }
                };
                (right & !(0x3fff << 16)) | (other << 16)
            }
            1 => {
                let dir = right >> 30;
                let other = (dir + 1 + self.rng.below(3) as u32) % 4;
                (right & 0x3fff_ffff) | (other << 30)
            }
            _ => {
                let nr = self.rng.range(0x17, 0xff) as u32;
                if self.rng.pct(30) {
                    // Another type, the right number.
                    (right & !0xff00) | (0xd8 << 8)
                } else {
                    (right & !0xff) | nr
                }
            }
        }
    }

    /// One hostile change to a plausible call.
    pub(super) fn mutate(&mut self, op: &mut Op) {
        let Act::Ioctl(cmd) = op.act else { return };
        let right = cmd.number();
        let size = (right >> 16) & 0x3fff;
        // An exact errno expected of the plausible call may not survive the
        // change: each case below says what it expects.
        if matches!(
            op.expect,
            Expect::Einval | Expect::Eopnotsupp | Expect::Enotconn | Expect::Emsgsize
        ) {
            op.expect = Expect::Any;
        }
        match self.rng.below(12) {
            kind @ 0..=2 => {
                // A wrong number: never one of the ABI's (another command
                // would answer it), drawn again until it is none.  The
                // draws are those of the first try when it is wrong, so a
                // seed's sequence changes only where it made a real one.
                let raw = loop {
                    let raw = self.wrong_number(right, size, kind);
                    if !is_real_ioctl(raw) {
                        break raw;
                    }
                };
                op.raw = Some(raw);
                op.expect = Expect::Enotty;
            }
            3 => {
                op.ptr = Ptr::Null;
                op.expect = Expect::Efault;
            }
            4 => {
                op.ptr = Ptr::ProtNone;
                op.expect = Expect::Efault;
            }
            5 => {
                op.ptr = Ptr::Straddle;
                op.expect = Expect::Efault;
            }
            6 => {
                op.ptr = Ptr::Wild;
                op.expect = Expect::Efault;
            }
            7 if cmd == Cmd::UdSend => {
                // UD_SEND has no reserved field: unknown flags, or
                // immediate data without the flag.
                if self.rng.pct(60) {
                    op.v[3] |= [2, 0x80, 0x8000_0000, self.rng.below(1 << 32) | 2]
                        [self.rng.below(4) as usize];
                } else {
                    op.v[3] = 0;
                    op.v[4] = 1 + self.rng.below(u64::from(u32::MAX));
                }
                op.expect = Expect::Einval;
            }
            7 if cmd == Cmd::UdRecv => {
                // Checked before anything else.
                op.v[RESERVED] = 1 + self.rng.below(u64::from(u32::MAX));
                op.expect = Expect::Einval;
            }
            7 => {
                // Garbage in a reserved field (or a field that must be 0).
                if matches!(
                    cmd,
                    Cmd::ResolveAddr | Cmd::ResolveRoute | Cmd::Listen | Cmd::SetOption
                ) {
                    // No reserved field: a bad sockaddr/timeout/backlog/option.
                    match cmd {
                        Cmd::ResolveAddr => op.v[1] = self.rng.range(2, 4),
                        Cmd::ResolveRoute => {
                            op.v[2] = if self.rng.pct(50) {
                                0
                            } else {
                                60_001 + self.rng.below(1 << 20)
                            }
                        }
                        // Backlog 0 takes the largest: only above it fails.
                        Cmd::Listen => op.v[0] = 1025 + self.rng.below(1 << 20),
                        _ => {
                            if self.rng.pct(50) {
                                op.v[0] = 6 + self.rng.below(100);
                            } else {
                                op.v[1] = 1 << 40;
                            }
                        }
                    }
                    op.expect = Expect::Fail;
                } else if cmd != Cmd::Info {
                    op.v[RESERVED] = 1 + self.rng.below(u64::MAX - 1);
                    op.expect = Expect::Fail;
                }
            }
            8 if cmd == Cmd::UdSend => {
                // A bad buffer to send from (never the one 16 bytes before
                // PROT_NONE: every datagram that leaves is UD_SEND's
                // pattern).
                op.v[6] = [1, 2, 4][self.rng.below(3) as usize];
                op.expect = Expect::Fail;
            }
            8 => {
                // A bad data buffer.
                if cmd == Cmd::SendRecv {
                    // Either buffer: the send's fails the call before
                    // anything is sent, the answer's only once one came.
                    op.v[5] = self.rng.below(2);
                    op.v[6] = 1 + self.rng.below(4);
                    if op.v[5] == 0 && op.v[6] != 3 {
                        op.expect = Expect::Fail;
                    }
                } else if matches!(
                    cmd,
                    Cmd::Send | Cmd::Recv | Cmd::MrWrite | Cmd::MrRead | Cmd::UdRecv
                ) {
                    op.v[6] = 1 + self.rng.below(4); // Ptr index
                                                     // 3 straddles a PROT_NONE page 16 bytes in: a shorter
                                                     // copy may succeed.
                    if (cmd == Cmd::Send || cmd == Cmd::MrWrite) && op.v[6] != 3 {
                        op.expect = Expect::Fail;
                    }
                }
            }
            9 => {
                // Huge and overflowing lengths.
                let huge = [u64::from(u32::MAX), 0x8000_0000, (1 << 20) + 1, 0xffff_ff00]
                    [self.rng.below(4) as usize];
                match cmd {
                    Cmd::Send | Cmd::SendRecv => {
                        op.v[0] = match self.rng.below(5) {
                            0 => 0,
                            1 => 4097,
                            _ => huge,
                        };
                        op.expect = Expect::Fail;
                    }
                    Cmd::Recv | Cmd::UdRecv => op.v[0] = huge,
                    Cmd::UdSend => {
                        // Checked before the id: whatever the id is.
                        op.v[0] = match self.rng.below(5) {
                            0 => 0,
                            1 => u64::from(RDMA_CM_RS_MAX_MESSAGE) + 1,
                            _ => huge,
                        };
                        op.expect = Expect::Einval;
                    }
                    Cmd::MrReg => {
                        op.v[0] = if self.rng.pct(20) { 0 } else { huge };
                        op.expect = Expect::Fail;
                    }
                    Cmd::MrWrite | Cmd::MrRead | Cmd::Rdma => {
                        op.v[3] = huge;
                        op.v[4] = 0x200;
                        if self.rng.pct(30) {
                            op.v[4] = 0;
                        }
                        if cmd == Cmd::Rdma && self.rng.pct(40) {
                            op.v[3] = 0;
                            op.v[4] = 16;
                            op.v[5] = u64::MAX - 4;
                        }
                        op.expect = Expect::Fail;
                    }
                    Cmd::Connect | Cmd::Accept | Cmd::Reject => {
                        op.v[0] = 257 + self.rng.below(0xffff - 257);
                        op.v[5] = 0;
                        op.expect = Expect::Fail;
                    }
                    _ => {}
                }
            }
            10 if !matches!(cmd, Cmd::Info | Cmd::CreateId | Cmd::GetEvent) => {
                // Somebody else's id, a stale one or garbage.
                let others: Vec<(u32, u32)> = self
                    .files
                    .iter()
                    .enumerate()
                    .filter(|(g, _)| *g as u32 != op.f)
                    .flat_map(|(g, r)| (0..r.ids.len() as u32).map(move |n| (g as u32, n)))
                    .collect();
                let destroyed: Vec<u32> = self.files[op.f as usize]
                    .ids
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.st == St::Destroyed)
                    .map(|(n, _)| n as u32)
                    .collect();
                match self.rng.below(3) {
                    0 if !others.is_empty() => {
                        let (g, n) = others[self.rng.below(others.len() as u64) as usize];
                        op.id = IdRef::Other(g, n);
                    }
                    1 if !destroyed.is_empty() && cmd != Cmd::CreateId => {
                        op.id =
                            IdRef::Slot(destroyed[self.rng.below(destroyed.len() as u64) as usize]);
                        // The handle is never reused: the call must fail.
                        op.expect = Expect::Fail;
                    }
                    _ => {
                        op.id = IdRef::Raw(
                            [0, u32::MAX, 0x8000_0000, self.rng.next_u64() as u32]
                                [self.rng.below(4) as usize],
                        );
                    }
                }
            }
            _ => {
                // The RC data path (SEND mostly) on a UD id, or datagrams
                // on an RC id, whatever the state: EOPNOTSUPP.
                let ud = self.rng.pct(70);
                let f = &self.files[op.f as usize];
                let ids: Vec<u32> = (0..f.ids.len() as u32)
                    .filter(|&n| {
                        let i = &f.ids[n as usize];
                        i.ud == ud && !matches!(i.st, St::Destroyed | St::Gone)
                    })
                    .collect();
                if !ids.is_empty() {
                    let n = ids[self.rng.below(ids.len() as u64) as usize];
                    let rec = f.ids[n as usize].clone();
                    let cmd = if ud {
                        [
                            Cmd::Send,
                            Cmd::Send,
                            Cmd::Send,
                            Cmd::Recv,
                            Cmd::MrReg,
                            Cmd::MrRead,
                            Cmd::Rdma,
                            Cmd::Disconnect,
                        ][self.rng.below(8) as usize]
                    } else if self.rng.pct(50) {
                        Cmd::UdSend
                    } else {
                        Cmd::UdRecv
                    };
                    let new = self.plausible(op.f, cmd, IdRef::Slot(n), &rec);
                    op.act = new.act;
                    op.id = new.id;
                    op.raw = None;
                    op.ptr = Ptr::Ok;
                    op.v = new.v;
                    op.expect = new.expect;
                }
            }
        }
    }
}
