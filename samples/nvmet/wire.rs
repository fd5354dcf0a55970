// SPDX-License-Identifier: GPL-2.0

//! The NVMe over Fabrics wire formats the target reads and writes: the
//! RDMA transport binding's CM private data, the 64-byte command (SQE)
//! with its SGL descriptor, the 16-byte completion (CQE), the Connect
//! data, the Identify and log-page structures, and the status codes.
//!
//! Offsets follow `include/linux/nvme.h` and `include/linux/nvme-rdma.h`
//! (NVMe 2.1 base, NVMe-oF 1.1, the RDMA transport binding); all integers
//! are little-endian.  Pure functions over byte arrays, `core` only: the
//! userspace tool compiles this file too, for its tests and its malformed
//! capsules.

#![allow(dead_code, unreachable_pub)]

/// A command's size.
pub const SQE_LEN: usize = 64;
/// A completion's size.
pub const CQE_LEN: usize = 16;
/// The Connect command's data.
pub const CONNECT_DATA_LEN: usize = 1024;
/// Identify data, and the size of one discovery log entry's page.
pub const IDENTIFY_LEN: usize = 4096;
/// A logical block of the namespace.
pub const LBA_SHIFT: u32 = 9;
/// The discovery subsystem's NQN.
pub const DISCOVERY_NQN: &[u8] = b"nqn.2014-08.org.nvmexpress.discovery";
/// The NVMe over RDMA port.
pub const RDMA_IP_PORT: u16 = 4420;
/// The admin queue's size (`NVME_AQ_DEPTH`).
pub const ADMIN_QUEUE_SIZE: u16 = 32;
/// The largest I/O queue (`NVME_RDMA_MAX_QUEUE_SIZE`).
pub const MAX_QUEUE_SIZE: u16 = 256;
/// An NQN field's size; its last byte is forced to NUL.
pub const NQN_FIELD_LEN: usize = 256;
/// The controller id an admin Connect asks for a new controller with.
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// Status codes, `SCT << 8 | SC` (`nvme.h`, `NVME_SC_*`), and the
/// do-not-retry bit.
pub mod status {
    pub const SUCCESS: u16 = 0x0;
    pub const INVALID_OPCODE: u16 = 0x1;
    pub const INVALID_FIELD: u16 = 0x2;
    pub const DATA_XFER_ERROR: u16 = 0x4;
    pub const INTERNAL: u16 = 0x6;
    pub const INVALID_NS: u16 = 0xb;
    pub const CMD_SEQ_ERROR: u16 = 0xc;
    pub const SGL_INVALID_DATA: u16 = 0xf;
    pub const SGL_INVALID_TYPE: u16 = 0x11;
    pub const SGL_INVALID_OFFSET: u16 = 0x16;
    pub const KA_TIMEOUT_INVALID: u16 = 0x1a;
    pub const LBA_RANGE: u16 = 0x80;
    pub const ASYNC_LIMIT: u16 = 0x105;
    pub const INVALID_LOG_PAGE: u16 = 0x109;
    pub const CONNECT_FORMAT: u16 = 0x180;
    pub const CONNECT_CTRL_BUSY: u16 = 0x181;
    pub const CONNECT_INVALID_PARAM: u16 = 0x182;
    pub const CONNECT_INVALID_HOST: u16 = 0x184;
    /// Do not retry.
    pub const DNR: u16 = 0x4000;
}

/// `nvme_rdma_cm_rej` status values (`NVME_RDMA_CM_*`).
pub mod cm_status {
    pub const INVALID_LEN: u16 = 1;
    pub const INVALID_RECFMT: u16 = 2;
    pub const INVALID_QID: u16 = 3;
    pub const INVALID_HSQSIZE: u16 = 4;
    pub const INVALID_HRQSIZE: u16 = 5;
    pub const NO_RSC: u16 = 6;
    pub const INVALID_IRD: u16 = 7;
    pub const INVALID_ORD: u16 = 8;
    pub const INVALID_CNTLID: u16 = 9;
}

/// Opcodes of the admin queue, the I/O queues and fabrics commands.
pub mod opcode {
    pub const FLUSH: u8 = 0x00;
    pub const WRITE: u8 = 0x01;
    pub const READ: u8 = 0x02;
    pub const WRITE_ZEROES: u8 = 0x08;

    pub const GET_LOG_PAGE: u8 = 0x02;
    pub const IDENTIFY: u8 = 0x06;
    pub const ABORT: u8 = 0x08;
    pub const SET_FEATURES: u8 = 0x09;
    pub const GET_FEATURES: u8 = 0x0a;
    pub const ASYNC_EVENT: u8 = 0x0c;
    pub const KEEP_ALIVE: u8 = 0x18;

    pub const FABRICS: u8 = 0x7f;
    pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
    pub const FCTYPE_CONNECT: u8 = 0x01;
    pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
}

/// Controller properties (registers) by offset.
pub mod prop {
    pub const CAP: u32 = 0x00;
    pub const VS: u32 = 0x08;
    pub const CC: u32 = 0x14;
    pub const CSTS: u32 = 0x1c;
}

/// Feature identifiers.
pub mod feature {
    pub const VOLATILE_WC: u8 = 0x06;
    pub const NUM_QUEUES: u8 = 0x07;
    pub const ASYNC_EVENT: u8 = 0x0b;
    pub const KATO: u8 = 0x0f;
    pub const HOST_ID: u8 = 0x81;
}

/// Log page identifiers.
pub mod log {
    pub const SUPPORTED: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const DISCOVERY: u8 = 0x70;
}

/// Identify CNS values.
pub mod cns {
    pub const NS: u8 = 0x00;
    pub const CTRL: u8 = 0x01;
    pub const NS_ACTIVE_LIST: u8 = 0x02;
    pub const NS_DESC_LIST: u8 = 0x03;
    pub const CS_NS: u8 = 0x05;
    pub const CS_CTRL: u8 = 0x06;
    pub const NS_CS_INDEP: u8 = 0x08;
}

/// The version the controllers report: 2.1.
pub const VERSION: u32 = 0x0002_0100;

pub fn get16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

pub fn get32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

pub fn get64(b: &[u8], off: usize) -> u64 {
    u64::from(get32(b, off)) | u64::from(get32(b, off + 4)) << 32
}

pub fn put16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

pub fn put32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Copies `src` into `dst` and fills the rest of `dst` with `pad`.
pub fn put_padded(dst: &mut [u8], src: &[u8], pad: u8) {
    let n = src.len().min(dst.len());
    dst[..n].copy_from_slice(&src[..n]);
    dst[n..].fill(pad);
}

/// `value`'s decimal digits (a port's `trsvcid`), written into `buf`.
pub fn decimal(mut value: u16, buf: &mut [u8; 5]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            return &buf[at..];
        }
    }
}

/// An NQN field's string: up to its first NUL, at most 255 bytes (the
/// target forces the last byte to NUL, as nvmet does).
pub fn nqn(field: &[u8]) -> &[u8] {
    let field = &field[..field.len().min(NQN_FIELD_LEN - 1)];
    let end = field.iter().position(|&c| c == 0).unwrap_or(field.len());
    &field[..end]
}

/// The private data of an RDMA CM connect request (`nvme_rdma_cm_req`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CmReq {
    pub qid: u16,
    /// The host's receive queue size (completions it can take).
    pub hrqsize: u16,
    /// The host's submission queue size, 0-based.
    pub hsqsize: u16,
    pub cntlid: u16,
}

impl CmReq {
    /// The request's size.
    pub const LEN: usize = 32;

    /// Parses `data`; `Err` with the `nvme_rdma_cm_rej` status for a
    /// request too short or of another record format.
    pub fn parse(data: &[u8]) -> Result<Self, u16> {
        if data.len() < Self::LEN {
            return Err(cm_status::INVALID_LEN);
        }
        if get16(data, 0) != 0 {
            return Err(cm_status::INVALID_RECFMT);
        }
        Ok(Self {
            qid: get16(data, 2),
            hrqsize: get16(data, 4),
            hsqsize: get16(data, 6),
            cntlid: get16(data, 8),
        })
    }

    /// The request's bytes (for the userspace tool's clients).
    pub fn encode(&self, recfmt: u16) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        put16(&mut b, 0, recfmt);
        put16(&mut b, 2, self.qid);
        put16(&mut b, 4, self.hrqsize);
        put16(&mut b, 6, self.hsqsize);
        put16(&mut b, 8, self.cntlid);
        b
    }
}

/// The accept's private data (`nvme_rdma_cm_rep`): the controller's
/// receive queue size.
pub fn cm_rep(crqsize: u16) -> [u8; 32] {
    let mut b = [0u8; 32];
    put16(&mut b, 2, crqsize);
    b
}

/// The reject's private data (`nvme_rdma_cm_rej`).
pub fn cm_rej(sts: u16) -> [u8; 4] {
    let mut b = [0u8; 4];
    put16(&mut b, 2, sts);
    b
}

/// Where a command's data is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataDesc {
    /// No data.
    None,
    /// In the host's memory, moved with RDMA READ or WRITE; `invalidate`:
    /// the response invalidates `key` (SEND_WITH_INV).
    Keyed {
        addr: u64,
        len: u32,
        key: u32,
        invalidate: bool,
    },
    /// In the command capsule, `offset` bytes after the SQE.
    InCapsule { offset: u64, len: u32 },
}

impl DataDesc {
    /// The data's length in bytes.
    pub fn len(&self) -> u32 {
        match *self {
            Self::None => 0,
            Self::Keyed { len, .. } | Self::InCapsule { len, .. } => len,
        }
    }
}

/// A command capsule's 64 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sqe(pub [u8; SQE_LEN]);

impl Sqe {
    /// The first 64 bytes of `data` (`None` if shorter).
    pub fn from_bytes(data: &[u8]) -> Option<Self> {
        let mut b = [0u8; SQE_LEN];
        b.copy_from_slice(data.get(..SQE_LEN)?);
        Some(Self(b))
    }

    pub fn opcode(&self) -> u8 {
        self.0[0]
    }

    pub fn flags(&self) -> u8 {
        self.0[1]
    }

    pub fn cid(&self) -> u16 {
        get16(&self.0, 2)
    }

    pub fn nsid(&self) -> u32 {
        get32(&self.0, 4)
    }

    /// A fabrics command's type.
    pub fn fctype(&self) -> u8 {
        self.0[4]
    }

    /// Command dword `n` (10 to 15).
    pub fn cdw(&self, n: usize) -> u32 {
        get32(&self.0, 40 + 4 * (n - 10))
    }

    pub fn u8_at(&self, off: usize) -> u8 {
        self.0[off]
    }

    pub fn u16_at(&self, off: usize) -> u16 {
        get16(&self.0, off)
    }

    pub fn u32_at(&self, off: usize) -> u32 {
        get32(&self.0, off)
    }

    pub fn u64_at(&self, off: usize) -> u64 {
        get64(&self.0, off)
    }

    /// The flags checked as nvmet checks them: no fused operation, and
    /// PSDT 01b (SGLs for data); `Err` with the status otherwise.
    pub fn check_flags(&self) -> Result<(), u16> {
        let flags = self.flags();
        if flags & 0x3 != 0 || flags & 0xc0 != 0x40 {
            return Err(status::INVALID_FIELD | status::DNR);
        }
        Ok(())
    }

    /// The SGL descriptor: a data block with an offset (in-capsule data)
    /// or a keyed data block (with or without invalidation); `Err` with
    /// the status for another.
    pub fn data_desc(&self) -> Result<DataDesc, u16> {
        let kind = self.0[39];
        match (kind >> 4, kind & 0xf) {
            (0x4, sub @ (0x0 | 0xf)) => {
                let len = u32::from_le_bytes([self.0[32], self.0[33], self.0[34], 0]);
                if len == 0 {
                    return Ok(DataDesc::None);
                }
                Ok(DataDesc::Keyed {
                    addr: get64(&self.0, 24),
                    len,
                    key: get32(&self.0, 35),
                    invalidate: sub == 0xf,
                })
            }
            (0x4, _) => Err(status::INVALID_FIELD | status::DNR),
            (0x0, 0x1) => {
                let len = get32(&self.0, 32);
                if len == 0 {
                    return Ok(DataDesc::None);
                }
                Ok(DataDesc::InCapsule {
                    offset: get64(&self.0, 24),
                    len,
                })
            }
            (0x0, _) => Err(status::INVALID_FIELD | status::DNR),
            _ => Err(status::SGL_INVALID_TYPE | status::DNR),
        }
    }

    /// A command with `opcode`, `cid` and `nsid` and PSDT 01b, no data.
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Self {
        let mut b = [0u8; SQE_LEN];
        b[0] = opcode;
        b[1] = 0x40;
        put16(&mut b, 2, cid);
        put32(&mut b, 4, nsid);
        b[39] = 0x40;
        Self(b)
    }

    /// Sets a keyed SGL descriptor.
    pub fn set_keyed(&mut self, addr: u64, len: u32, key: u32, invalidate: bool) {
        put64(&mut self.0, 24, addr);
        self.0[32..35].copy_from_slice(&len.to_le_bytes()[..3]);
        put32(&mut self.0, 35, key);
        self.0[39] = if invalidate { 0x4f } else { 0x40 };
    }

    /// Sets an in-capsule data descriptor.
    pub fn set_in_capsule(&mut self, offset: u64, len: u32) {
        put64(&mut self.0, 24, offset);
        put32(&mut self.0, 32, len);
        self.0[36..39].fill(0);
        self.0[39] = 0x01;
    }
}

/// A completion's 16 bytes: `status` is `SCT << 8 | SC` with
/// [`status::DNR`]; the phase bit is 0.
pub fn cqe(result: u64, sq_head: u16, sq_id: u16, cid: u16, status: u16) -> [u8; CQE_LEN] {
    let mut b = [0u8; CQE_LEN];
    put64(&mut b, 0, result);
    put16(&mut b, 8, sq_head);
    put16(&mut b, 10, sq_id);
    put16(&mut b, 12, cid);
    put16(&mut b, 14, status << 1);
    b
}

/// A completion's fields: (result, sq_head, sq_id, cid, status).
pub fn parse_cqe(b: &[u8]) -> Option<(u64, u16, u16, u16, u16)> {
    if b.len() < CQE_LEN {
        return None;
    }
    Some((
        get64(b, 0),
        get16(b, 8),
        get16(b, 10),
        get16(b, 12),
        get16(b, 14) >> 1,
    ))
}

/// The Connect command's data (`nvmf_connect_data`).
pub struct ConnectData<'a>(pub &'a [u8]);

impl ConnectData<'_> {
    pub fn hostid(&self) -> [u8; 16] {
        let mut id = [0u8; 16];
        id.copy_from_slice(&self.0[..16]);
        id
    }

    pub fn cntlid(&self) -> u16 {
        get16(self.0, 16)
    }

    pub fn subsysnqn(&self) -> &[u8] {
        nqn(&self.0[256..512])
    }

    pub fn hostnqn(&self) -> &[u8] {
        nqn(&self.0[512..768])
    }
}

/// The Connect command's data, encoded (for the userspace tool).
pub fn connect_data(
    hostid: &[u8; 16],
    cntlid: u16,
    subsysnqn: &[u8],
    hostnqn: &[u8],
) -> [u8; CONNECT_DATA_LEN] {
    let mut b = [0u8; CONNECT_DATA_LEN];
    b[..16].copy_from_slice(hostid);
    put16(&mut b, 16, cntlid);
    put_padded(&mut b[256..511], subsysnqn, 0);
    put_padded(&mut b[512..767], hostnqn, 0);
    b
}

/// What Identify Controller says of a controller.
pub struct CtrlIdentity<'a> {
    pub cntlid: u16,
    pub discovery: bool,
    pub serial: &'a [u8],
    pub model: &'a [u8],
    pub firmware: &'a [u8],
    pub subnqn: &'a [u8],
    /// Largest transfer, as a power of two of 4 KiB pages.
    pub mdts: u8,
    pub maxcmd: u16,
    pub nn: u32,
    /// Command capsule size in 16-byte units (64 bytes plus in-capsule data).
    pub ioccsz: u32,
}

/// Identify Controller (CNS 01h), `nvme_id_ctrl`.
pub fn identify_ctrl(out: &mut [u8], c: &CtrlIdentity<'_>) {
    out[..IDENTIFY_LEN].fill(0);
    put_padded(&mut out[4..24], c.serial, b' ');
    put_padded(&mut out[24..64], c.model, b' ');
    put_padded(&mut out[64..72], c.firmware, b' ');
    out[72] = 6; // rab
    out[76] = if c.discovery { 0 } else { 1 << 1 }; // cmic: several controllers
    out[77] = if c.discovery { 0 } else { c.mdts };
    put16(out, 78, c.cntlid);
    put32(out, 80, VERSION);
    // oaes: namespace attribute notices (or discovery log changes).
    put32(out, 92, if c.discovery { 1 << 31 } else { 1 << 8 });
    put32(out, 96, 1); // ctratt: 128-bit host id
    out[111] = if c.discovery { 2 } else { 1 }; // cntrltype
    out[258] = 3; // acl
    out[259] = 3; // aerl: four held
    out[261] = 1 << 2; // lpa: extended data
    put16(out, 320, 10); // kas: 100 ms units
    out[512] = 0x66; // sqes
    out[513] = 0x44; // cqes
    put16(out, 514, c.maxcmd);
    put32(out, 516, c.nn);
    if !c.discovery {
        put16(out, 520, 1 << 3); // oncs: write zeroes
        out[525] = 1; // vwc
        put32(out, 540, c.nn); // mnan
    }
    // sgls: supported, keyed data blocks, offsets (in-capsule data).
    put32(out, 536, 1 | 1 << 2 | 1 << 20);
    put_padded(&mut out[768..1023], c.subnqn, 0);
    put32(out, 1792, c.ioccsz);
    put32(out, 1796, 1); // iorcsz
    out[1803] = 1; // msdbd
}

/// What Identify Namespace says of the namespace.
pub struct NsIdentity {
    /// Size in logical blocks.
    pub blocks: u64,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
    pub uuid: [u8; 16],
}

/// Identify Namespace (CNS 00h), `nvme_id_ns`: 512-byte blocks, shared.
pub fn identify_ns(out: &mut [u8], ns: &NsIdentity) {
    out[..IDENTIFY_LEN].fill(0);
    put64(out, 0, ns.blocks);
    put64(out, 8, ns.blocks);
    put64(out, 16, ns.blocks);
    out[30] = 1; // nmic: shared
    out[104..120].copy_from_slice(&ns.nguid);
    out[120..128].copy_from_slice(&ns.eui64);
    out[128 + 2] = LBA_SHIFT as u8; // lbaf[0].ds
}

/// The namespace identification descriptor list (CNS 03h): NGUID, UUID,
/// and the NVM command set.
pub fn identify_ns_descs(out: &mut [u8], ns: &NsIdentity) {
    out[..IDENTIFY_LEN].fill(0);
    let mut at = 0;
    for (kind, id) in [(2u8, &ns.nguid[..]), (3u8, &ns.uuid[..]), (4u8, &[0u8][..])] {
        out[at] = kind;
        out[at + 1] = id.len() as u8;
        out[at + 4..at + 4 + id.len()].copy_from_slice(id);
        at += 4 + id.len();
    }
}

/// The I/O command set independent namespace (CNS 08h): shared, ready.
pub fn identify_ns_cs_indep(out: &mut [u8]) {
    out[..IDENTIFY_LEN].fill(0);
    out[1] = 1; // nmic
    out[14] = 1; // nstat: ready
}

/// The active namespace list (CNS 02h) after `after`, of the namespaces
/// `nsids` (ascending).
pub fn identify_active_list(out: &mut [u8], nsids: &[u32], after: u32) {
    out[..IDENTIFY_LEN].fill(0);
    for (i, id) in nsids
        .iter()
        .filter(|&&id| id > after)
        .take(1024)
        .enumerate()
    {
        put32(out, 4 * i, *id);
    }
}

/// One discovery log entry (`nvmf_disc_rsp_page_entry`, 1024 bytes).
pub struct DiscoveryEntry<'a> {
    pub ipv6: bool,
    /// 2: an NVM subsystem, 3: this discovery subsystem.
    pub subtype: u8,
    pub portid: u16,
    pub trsvcid: &'a [u8],
    pub subnqn: &'a [u8],
    pub traddr: &'a [u8],
}

/// A discovery log entry's size, and its header's.
pub const DISCOVERY_ENTRY_LEN: usize = 1024;

/// The discovery log page (header and entries).
pub fn discovery_log(out: &mut [u8], genctr: u64, entries: &[DiscoveryEntry<'_>]) {
    let len = DISCOVERY_ENTRY_LEN * (1 + entries.len());
    out[..len].fill(0);
    put64(out, 0, genctr);
    put64(out, 8, entries.len() as u64);
    for (i, e) in entries.iter().enumerate() {
        let b = &mut out[DISCOVERY_ENTRY_LEN * (1 + i)..DISCOVERY_ENTRY_LEN * (2 + i)];
        b[0] = 1; // trtype: RDMA
        b[1] = if e.ipv6 { 2 } else { 1 };
        b[2] = e.subtype;
        b[3] = 0; // treq: not specified
        put16(b, 4, e.portid);
        put16(b, 6, CNTLID_DYNAMIC);
        put16(b, 8, ADMIN_QUEUE_SIZE);
        put_padded(&mut b[32..64], e.trsvcid, 0);
        put_padded(&mut b[256..511], e.subnqn, 0);
        put_padded(&mut b[512..767], e.traddr, 0);
        b[768] = 1; // qptype: connected
        b[769] = 1; // prtype: not specified
        b[770] = 1; // cms: RDMA CM
    }
}

/// The supported log pages (log 00h): `lids` with LSUPP.
pub fn supported_logs(out: &mut [u8], lids: &[u8]) {
    out[..1024].fill(0);
    for &lid in lids {
        put32(out, 4 * usize::from(lid), 1);
    }
}

/// Offsets asserted against the table of `nvmet-plan.md` (computed by
/// compiling the 7.3 headers), not against this file: run by the
/// userspace tool's `cargo test`, which compiles this file.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_private_data_offsets() {
        let req = CmReq {
            qid: 3,
            hrqsize: 128,
            hsqsize: 127,
            cntlid: 0x1234,
        };
        let b = req.encode(0);
        assert_eq!(get16(&b, 2), 3);
        assert_eq!(get16(&b, 4), 128);
        assert_eq!(get16(&b, 6), 127);
        assert_eq!(get16(&b, 8), 0x1234);
        assert_eq!(CmReq::parse(&b), Ok(req));
        assert_eq!(CmReq::parse(&b[..31]), Err(cm_status::INVALID_LEN));
        assert_eq!(CmReq::parse(&req.encode(1)), Err(cm_status::INVALID_RECFMT));
        // RoCE pads to 56 bytes: the request is the first 32.
        let mut padded = [0u8; 56];
        padded[..32].copy_from_slice(&b);
        assert_eq!(CmReq::parse(&padded), Ok(req));
        assert_eq!(get16(&cm_rep(32), 2), 32);
        assert_eq!(cm_rej(cm_status::INVALID_CNTLID), [0, 0, 9, 0]);
    }

    #[test]
    fn sgl_descriptors_by_type() {
        let mut sqe = Sqe::new(opcode::READ, 7, 1);
        sqe.set_keyed(0x1122_3344_5566_7788, 0x0abcde, 0xdead_beef, true);
        assert_eq!(sqe.0[39], 0x4f);
        assert_eq!(&sqe.0[32..35], &[0xde, 0xbc, 0x0a]);
        assert_eq!(get32(&sqe.0, 35), 0xdead_beef);
        assert_eq!(
            sqe.data_desc(),
            Ok(DataDesc::Keyed {
                addr: 0x1122_3344_5566_7788,
                len: 0x0abcde,
                key: 0xdead_beef,
                invalidate: true
            })
        );
        let with_type = |t: u8| {
            let mut s = sqe;
            s.0[39] = t;
            s.data_desc()
        };
        assert!(matches!(
            with_type(0x40),
            Ok(DataDesc::Keyed {
                invalidate: false,
                ..
            })
        ));
        assert_eq!(with_type(0x4a), Err(status::INVALID_FIELD | status::DNR));
        assert_eq!(with_type(0x00), Err(status::INVALID_FIELD | status::DNR));
        for t in [0x20, 0x30, 0x50, 0xff] {
            assert_eq!(
                with_type(t),
                Err(status::SGL_INVALID_TYPE | status::DNR),
                "type {t:#x}"
            );
        }
        let mut inline = Sqe::new(opcode::WRITE, 1, 1);
        inline.set_in_capsule(0, 4096);
        assert_eq!(inline.0[39], 0x01);
        assert_eq!(
            inline.data_desc(),
            Ok(DataDesc::InCapsule {
                offset: 0,
                len: 4096
            })
        );
        // The host's null descriptor: keyed, length 0.
        assert_eq!(
            Sqe::new(opcode::FLUSH, 1, 1).data_desc(),
            Ok(DataDesc::None)
        );
    }

    #[test]
    fn flags_fuse_and_psdt() {
        let sqe = Sqe::new(opcode::READ, 1, 1);
        assert_eq!(sqe.check_flags(), Ok(()));
        let mut fused = sqe;
        fused.0[1] |= 1;
        assert_eq!(
            fused.check_flags(),
            Err(status::INVALID_FIELD | status::DNR)
        );
        let mut prp = sqe;
        prp.0[1] = 0;
        assert_eq!(prp.check_flags(), Err(status::INVALID_FIELD | status::DNR));
        assert_eq!(sqe.cid(), 1);
        assert_eq!(Sqe::new(0, 0xbeef, 9).nsid(), 9);
    }

    #[test]
    fn completion_layout() {
        let b = cqe(0x1_0000_0002, 5, 1, 0x4321, status::LBA_RANGE | status::DNR);
        assert_eq!(get64(&b, 0), 0x1_0000_0002);
        assert_eq!(get16(&b, 8), 5);
        assert_eq!(get16(&b, 10), 1);
        assert_eq!(get16(&b, 12), 0x4321);
        // Shifted past the phase bit.
        assert_eq!(get16(&b, 14), 0x4080 << 1);
        assert_eq!(parse_cqe(&b), Some((0x1_0000_0002, 5, 1, 0x4321, 0x4080)));
    }

    #[test]
    fn connect_data_layout() {
        let d = connect_data(&[7; 16], 0xffff, b"nqn.sub", b"nqn.host");
        assert_eq!(get16(&d, 16), 0xffff);
        assert_eq!(&d[256..263], b"nqn.sub");
        assert_eq!(&d[512..520], b"nqn.host");
        let c = ConnectData(&d);
        assert_eq!(c.subsysnqn(), b"nqn.sub");
        assert_eq!(c.hostnqn(), b"nqn.host");
        assert_eq!(c.hostid(), [7; 16]);
        // An NQN of 256 bytes without NUL is cut at 255.
        let mut long = [b'a'; 1024];
        long[..16].fill(0);
        assert_eq!(ConnectData(&long).subsysnqn().len(), 255);
    }

    #[test]
    fn identify_controller_offsets() {
        let mut out = [0u8; IDENTIFY_LEN];
        identify_ctrl(
            &mut out,
            &CtrlIdentity {
                cntlid: 0x42,
                discovery: false,
                serial: b"serial",
                model: b"model",
                firmware: b"fw",
                subnqn: b"nqn.x",
                mdts: 8,
                maxcmd: 128,
                nn: 1,
                ioccsz: (64 + 4096) / 16,
            },
        );
        assert_eq!(&out[4..10], b"serial");
        assert_eq!(out[10], b' ');
        assert_eq!(out[77], 8);
        assert_eq!(get16(&out, 78), 0x42);
        assert_eq!(get32(&out, 80), VERSION);
        assert_eq!(out[111], 1);
        assert_eq!(get16(&out, 320), 10);
        assert_eq!(out[512], 0x66);
        assert_eq!(out[513], 0x44);
        assert_eq!(get16(&out, 514), 128);
        assert_eq!(get32(&out, 516), 1);
        assert_eq!(get32(&out, 536) & 1 << 2, 1 << 2);
        assert_eq!(&out[768..773], b"nqn.x");
        assert_eq!(get32(&out, 1792), 260);
        assert_eq!(get32(&out, 1796), 1);
        assert_eq!(get16(&out, 1800), 0);
    }

    #[test]
    fn identify_namespace_offsets() {
        let ns = NsIdentity {
            blocks: 131072,
            nguid: [1; 16],
            eui64: [2; 8],
            uuid: [3; 16],
        };
        let mut out = [0u8; IDENTIFY_LEN];
        identify_ns(&mut out, &ns);
        assert_eq!(get64(&out, 0), 131072);
        assert_eq!(get64(&out, 8), 131072);
        assert_eq!(out[30], 1);
        assert_eq!(&out[104..120], &[1; 16]);
        assert_eq!(&out[120..128], &[2; 8]);
        assert_eq!(out[130], 9);
        identify_ns_descs(&mut out, &ns);
        assert_eq!(&out[..4], &[2, 16, 0, 0]);
        assert_eq!(&out[4..20], &[1; 16]);
        assert_eq!(&out[20..24], &[3, 16, 0, 0]);
        assert_eq!(&out[40..45], &[4, 1, 0, 0, 0]);
        identify_ns_cs_indep(&mut out);
        assert_eq!(out[14], 1);
        identify_active_list(&mut out, &[1], 0);
        assert_eq!(get32(&out, 0), 1);
        identify_active_list(&mut out, &[1], 1);
        assert_eq!(get32(&out, 0), 0);
    }

    #[test]
    fn discovery_log_offsets() {
        let mut out = [0u8; 3 * DISCOVERY_ENTRY_LEN];
        let entry = |subtype, subnqn| DiscoveryEntry {
            ipv6: false,
            subtype,
            portid: 1,
            trsvcid: b"4420",
            subnqn,
            traddr: b"192.0.2.1",
        };
        discovery_log(&mut out, 9, &[entry(3, DISCOVERY_NQN), entry(2, b"nqn.x")]);
        assert_eq!(get64(&out, 0), 9);
        assert_eq!(get64(&out, 8), 2);
        let e = &out[2 * DISCOVERY_ENTRY_LEN..];
        assert_eq!(&e[..4], &[1, 1, 2, 0]);
        assert_eq!(get16(e, 6), 0xffff);
        assert_eq!(get16(e, 8), 32);
        assert_eq!(&e[32..37], b"4420\0");
        assert_eq!(&e[256..262], b"nqn.x\0");
        assert_eq!(&e[512..521], b"192.0.2.1");
        assert_eq!(&e[768..771], &[1, 1, 1]);
    }

    #[test]
    fn decimal_ports() {
        let mut b = [0u8; 5];
        assert_eq!(decimal(4420, &mut b), b"4420");
        assert_eq!(decimal(0, &mut b), b"0");
        assert_eq!(decimal(65535, &mut b), b"65535");
    }
}
