// SPDX-License-Identifier: GPL-2.0

//! Model updates: states, QUERY answers, datagrams and events.

#[allow(unused_imports)]
use super::*;

impl Worker {
    pub(super) fn set_state(&mut self, op: &Op, st: St) {
        if let IdRef::Slot(n) = op.id {
            if let Some(i) = self.files[op.f as usize].ids.get_mut(n as usize) {
                i.st = st;
            }
        }
    }

    /// `op` on one of its own file's ids when it names another file's id
    /// or a raw handle that is also one of this file's: handles are the
    /// file's own, counted from 1 in every file, so the module takes it
    /// for this file's id and the model must follow (seed 2, 2026-11-28:
    /// a CONNECT on another file's id connected this file's UD id of the
    /// same handle, whose UD_RECV the model then expected to be
    /// `ENOTCONN`).
    pub(super) fn as_own_id(&self, op: &Op) -> Option<Op> {
        if matches!(op.id, IdRef::Slot(_)) {
            return None;
        }
        let handle = self.resolve_id(op);
        let n = self.files.get(op.f as usize)?.slot_of(handle)?;
        Some(Op {
            id: IdRef::Slot(n as u32),
            ..op.clone()
        })
    }

    /// The model of the id `op` names in its own file.
    pub(super) fn rec_of(&mut self, op: &Op) -> Option<&mut IdRec> {
        let IdRef::Slot(n) = op.id else { return None };
        self.files.get_mut(op.f as usize)?.ids.get_mut(n as usize)
    }

    /// A QUERY's answer: the QP type as created; `max_datagram` and `qkey`
    /// only on a UD id, `max_datagram` (learnt for UD_SEND's sizes) once
    /// it has its QP, and never above the ABI's message size.
    pub(super) fn on_query(&mut self, op: &Op, q: &rdma_cm_rs_query) {
        let line = op.line();
        let Some(i) = self.rec_of(op) else { return };
        let qpt = if i.ud {
            RDMA_CM_RS_QPT_UD
        } else {
            RDMA_CM_RS_QPT_RC
        };
        let why = if q.qp_type != qpt {
            Some(format!("qp_type {} (created {qpt})", q.qp_type))
        } else if !i.ud && (q.max_datagram != 0 || q.qkey != 0) {
            Some(format!(
                "an RC id with max_datagram {} qkey {:#x}",
                q.max_datagram, q.qkey
            ))
        } else if q.max_datagram > RDMA_CM_RS_MAX_MESSAGE {
            Some(format!("max_datagram {}", q.max_datagram))
        } else if i.ud && i.qp && q.max_datagram == 0 {
            Some("a UD id with its QP and max_datagram 0".into())
        } else {
            None
        };
        if q.max_datagram != 0 {
            i.max_dg = q.max_datagram;
        }
        if let Some(why) = why {
            self.sh.finding(format!("QUERY: {why} [{line}]"));
        }
    }

    /// A datagram UD_RECV returned (`bad`: the first byte that is not what
    /// was sent): judged, and its sender's peer handle kept.
    pub(super) fn on_datagram(&mut self, op: &Op, d: &rdma_cm_rs_ud_recv, bad: Option<usize>) {
        let line = op.line();
        let cap = op.v[0].min(u64::from(u32::MAX)) as u32;
        let why = if d.len == 0 || d.len > cap || d.len > RDMA_CM_RS_MAX_MESSAGE {
            Some(format!("length {} (buffer {cap})", d.len))
        } else if d.peer > RDMA_CM_RS_MAX_UD_PEERS {
            Some(format!("peer {}", d.peer))
        } else if d.flags & !RDMA_CM_RS_UD_WITH_IMM != 0 || (d.flags == 0 && d.imm_data != 0) {
            Some(format!("flags {:#x} imm_data {:#x}", d.flags, d.imm_data))
        } else {
            bad.map(|b| format!("{} bytes, byte {b} is not what was sent", d.len))
        };
        if let Some(why) = why {
            self.sh.finding(format!("UD_RECV: {why} [{line}]"));
        }
        if d.flags != 0 {
            self.sh.kind("ud: datagrams received with imm_data");
        }
        if d.peer == 0 {
            return;
        }
        let sh = self.sh.clone();
        if let Some(i) = self.rec_of(op) {
            if !i.peers.contains(&d.peer) {
                i.peers.push(d.peer);
                sh.kind("ud: peers learnt from UD_RECV");
            }
        }
    }

    pub(super) fn on_event(&mut self, f: usize, ev: &rdma_cm_rs_event) {
        let kind = EventType::from(ev.event);
        let rec = &mut self.files[f];
        let Some(slot) = rec.slot_of(ev.id) else {
            self.sh.finding(format!(
                "GET_EVENT: event {} names id {} this file was never given",
                kind.name(),
                ev.id
            ));
            return;
        };
        if rec.ids[slot].st == St::Destroyed {
            self.sh.finding(format!(
                "GET_EVENT: event {} for id {} after DESTROY_ID returned",
                kind.name(),
                ev.id
            ));
            return;
        }
        if rec.ids[slot].st == St::Removed {
            self.sh.finding(format!(
                "GET_EVENT: event {} for id {} after its DEVICE_REMOVAL (the id's last)",
                kind.name(),
                ev.id
            ));
            return;
        }
        if rec.ids[slot].ud {
            match kind {
                EventType::Unreachable => self.sh.kind("ud: SIDR lookups UNREACHABLE"),
                EventType::Rejected => self.sh.kind("ud: SIDR lookups REJECTED"),
                _ => {}
            }
            // The module's state is DISCONNECT until a CONNECT succeeds.
            if rec.ids[slot].qp
                && matches!(
                    kind,
                    EventType::Unreachable | EventType::Rejected | EventType::ConnectError
                )
            {
                rec.ids[slot].dead = true;
            }
        }
        if matches!(kind, EventType::MulticastJoin | EventType::MulticastError) {
            // A UD id's group: MULTICAST_JOIN names it as a peer (the
            // all-ones QP), MULTICAST_ERROR carries none; the id's state
            // stays.
            let i = &mut rec.ids[slot];
            let ok = i.ud
                && if kind == EventType::MulticastJoin && ev.status == 0 {
                    (1..=RDMA_CM_RS_MAX_UD_PEERS).contains(&ev.ud_peer)
                        && ev.ud_qp_num == 0x00ff_ffff
                } else {
                    ev.ud_peer == 0 && ev.status < 0
                };
            if !ok {
                self.sh.finding(format!(
                    "GET_EVENT: {} of {} id {}: status {} ud_peer {} ud_qp_num {:#x}",
                    kind.name(),
                    if i.ud { "UD" } else { "RC" },
                    ev.id,
                    ev.status,
                    ev.ud_peer,
                    ev.ud_qp_num
                ));
            }
            if ev.ud_peer != 0 && !i.peers.contains(&ev.ud_peer) {
                i.peers.push(ev.ud_peer);
            }
            self.sh.kind(if kind == EventType::MulticastJoin {
                "mcast: MULTICAST_JOIN events"
            } else {
                "mcast: MULTICAST_ERROR events"
            });
            return;
        }
        let st = match kind {
            EventType::AddrResolved => St::AddrResolved,
            EventType::RouteResolved => St::RouteResolved,
            EventType::Established => {
                // UD: the SIDR reply, with the peer's handle unless the
                // status says why there is none; RC: no UD fields.
                let i = &mut rec.ids[slot];
                let ok = if i.ud {
                    if ev.status == 0 {
                        (1..=RDMA_CM_RS_MAX_UD_PEERS).contains(&ev.ud_peer)
                    } else {
                        ev.ud_peer == 0
                    }
                } else {
                    ev.ud_peer == 0 && ev.ud_qp_num == 0 && ev.ud_qkey == 0
                };
                if !ok {
                    self.sh.finding(format!(
                        "GET_EVENT: ESTABLISHED of {} id {}: status {} ud_peer {} ud_qp_num {:#x}",
                        if i.ud { "UD" } else { "RC" },
                        ev.id,
                        ev.status,
                        ev.ud_peer,
                        ev.ud_qp_num
                    ));
                }
                if i.ud && ev.ud_peer != 0 && !i.peers.contains(&ev.ud_peer) {
                    i.peers.push(ev.ud_peer);
                }
                if i.ud {
                    self.sh.kind("ud: SIDR lookups ESTABLISHED");
                }
                St::Connected
            }
            EventType::ConnectRequest => {
                let ud = rec.ids[slot].ud;
                if ev.new_id == 0 || rec.slot_of(ev.new_id).is_some() {
                    self.sh.finding(format!(
                        "GET_EVENT: CONNECT_REQUEST with new_id {} (zero or in use)",
                        ev.new_id
                    ));
                    return;
                }
                rec.ids.push(IdRec::new(ev.new_id, ud, St::Requested));
                return;
            }
            EventType::DeviceRemoval => {
                self.sh.kind("siw: DEVICE_REMOVAL events");
                for m in rec.mrs.iter_mut().filter(|m| m.id == ev.id) {
                    m.alive = false;
                }
                St::Removed
            }
            // ADDR_CHANGE leaves the id as it was (so does the module).
            EventType::TimewaitExit | EventType::ConnectResponse | EventType::AddrChange => return,
            _ => St::Down,
        };
        rec.ids[slot].st = st;
    }

    fn close_all(&mut self) {
        for f in 0..self.files.len() {
            while self.files[f].open() {
                let op = Op::new(self.t, f as u32, Act::Close);
                self.exec(&op);
            }
        }
    }

    /// The end of a thread: its files closed, its peers killed, the siw
    /// device back if it deleted it.
    pub(super) fn finish(&mut self) {
        self.close_all();
        for slot in 0..self.peers.len() {
            if let Some(p) = self.peers[slot].take() {
                self.reap(p);
            }
        }
        if self.link_deleted {
            self.link_add("link: added back at the end");
            if let Some((dev, _)) = &self.sh.opts.link {
                if !device_exists(dev) {
                    self.sh
                        .finding(format!("{dev} is missing at the end of the run"));
                }
            }
        }
    }
}
