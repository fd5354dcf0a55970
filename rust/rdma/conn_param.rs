// SPDX-License-Identifier: GPL-2.0

//! Connection parameters (`struct rdma_conn_param`) with the limits of
//! `rdma_connect(3)`, `rdma_accept(3)` and `rdma_reject(3)` enforced before
//! anything reaches the CM.
//!
//! Private data limits, from `include/rdma/ib_cm.h` (the IB CM message sizes,
//! checked in `drivers/infiniband/core/cm.c`) minus the 36-byte `struct
//! cma_hdr` that `cma.c` prepends to requests for IP addressing:
//!
//! | message          | CM limit | user limit |
//! |------------------|----------|------------|
//! | REQ (RC connect) | 92       | 56         |
//! | SIDR REQ (UD)    | 216      | 180        |
//! | REP (RC accept)  | 196      | 196        |
//! | SIDR REP (UD)    | 136      | 136        |
//! | REJ (reject)     | 148      | 148        |
//!
//! Receivers see padded lengths over IB/RoCE (a REQ's data always arrives as
//! 56 bytes, a REP's as 196, a REJ's as 148): the CM cannot tell the sender's
//! length.  [`ConnParamView::private_data`] reports what the CM reported.
//!
//! iWARP carries private data in the MPA request, reply or reject message
//! over TCP, with its exact length.  `cma.c` adds no header there, but MPA
//! v2 (RFC 6581) puts its 4-byte IRD/ORD header in the same field, whose
//! ceiling is `RDMA_MAX_PRIVATE_DATA` (256).  So every use is limited to
//! 252 bytes, 251 on a device that [`Device::truncates_mpa_private_data`];
//! UD does not exist on iWARP.
//!
//! | use                   | IB/RoCE | iWARP                   |
//! |-----------------------|---------|-------------------------|
//! | connect, RC           | 56      | 252                     |
//! | connect, UD (SIDR)    | 180     | `EPROTONOSUPPORT`       |
//! | accept, RC            | 196     | 252                     |
//! | accept, UD (SIDR)     | 136     | `EPROTONOSUPPORT`       |
//! | reject                | 148     | 252                     |

use super::{
    bindings,
    device::{Device, Transport},
};
use kernel::prelude::*;

/// Size of the IP header `cma.c` prepends to REQ and SIDR REQ private data.
pub const CMA_HDR_SIZE: usize = 36;
/// Connect private data on `RDMA_PS_TCP`/`RDMA_PS_IB` RC ids.
pub const MAX_CONNECT_PRIVATE_DATA_RC: usize =
    bindings::ib_cm_data_size_IB_CM_REQ_PRIVATE_DATA_SIZE as usize - CMA_HDR_SIZE;
/// Connect (SIDR REQ) private data on `RDMA_PS_UDP` ids.
pub const MAX_CONNECT_PRIVATE_DATA_UD: usize =
    bindings::ib_cm_data_size_IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE as usize - CMA_HDR_SIZE;
/// Accept (REP) private data on RC ids.
pub const MAX_ACCEPT_PRIVATE_DATA_RC: usize =
    bindings::ib_cm_data_size_IB_CM_REP_PRIVATE_DATA_SIZE as usize;
/// Accept (SIDR REP) private data on UD ids.
pub const MAX_ACCEPT_PRIVATE_DATA_UD: usize =
    bindings::ib_cm_data_size_IB_CM_SIDR_REP_PRIVATE_DATA_SIZE as usize;
/// Reject (REJ) private data.
pub const MAX_REJECT_PRIVATE_DATA: usize =
    bindings::ib_cm_data_size_IB_CM_REJ_PRIVATE_DATA_SIZE as usize;
/// The private data field of an MPA message (`RDMA_MAX_PRIVATE_DATA`).
pub const MPA_MAX_PRIVATE_DATA: usize = bindings::RDMA_MAX_PRIVATE_DATA as usize;
/// The MPA v2 header (IRD and ORD, RFC 6581) sharing that field.
pub const MPA_V2_HEADER_SIZE: usize = 4;
/// Private data of any iWARP use.
pub const MAX_PRIVATE_DATA_IWARP: usize = MPA_MAX_PRIVATE_DATA - MPA_V2_HEADER_SIZE;
/// Private data of any use on a device that
/// [`Device::truncates_mpa_private_data`]: the length and the MPA v2 header
/// must fit in 8 bits.
pub const MAX_PRIVATE_DATA_MPA_TRUNCATED: usize = u8::MAX as usize - MPA_V2_HEADER_SIZE;
/// Room for any private data a CM message can carry (RTU: 224).
pub const PRIVATE_DATA_CAPACITY: usize = 256;
/// Largest 3-bit retry count (`rnr_retry_count` 7 means "retry for ever").
pub const MAX_RETRY_COUNT: u8 = 7;
/// Queue pair numbers are 24 bits wide.
pub const MAX_QP_NUM: u32 = 0x00ff_ffff;

/// What a set of private data is for: each use has its own limit.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PrivateDataUse {
    /// `rdma_connect` on an RC id.
    ConnectRc,
    /// `rdma_connect` (SIDR REQ) on a UD id.
    ConnectUd,
    /// `rdma_accept` on an RC id.
    AcceptRc,
    /// `rdma_accept` (SIDR REP) on a UD id.
    AcceptUd,
    /// `rdma_reject`.
    Reject,
}

impl PrivateDataUse {
    /// The largest private data this use allows on `transport` (see the
    /// module documentation); `EPROTONOSUPPORT` for a UD use on iWARP.
    pub const fn limit(self, transport: Transport) -> Result<usize> {
        match (transport, self) {
            (Transport::Ib, Self::ConnectRc) => Ok(MAX_CONNECT_PRIVATE_DATA_RC),
            (Transport::Ib, Self::ConnectUd) => Ok(MAX_CONNECT_PRIVATE_DATA_UD),
            (Transport::Ib, Self::AcceptRc) => Ok(MAX_ACCEPT_PRIVATE_DATA_RC),
            (Transport::Ib, Self::AcceptUd) => Ok(MAX_ACCEPT_PRIVATE_DATA_UD),
            (Transport::Ib, Self::Reject) => Ok(MAX_REJECT_PRIVATE_DATA),
            (Transport::Iwarp, Self::ConnectRc | Self::AcceptRc | Self::Reject) => {
                Ok(MAX_PRIVATE_DATA_IWARP)
            }
            (Transport::Iwarp, Self::ConnectUd | Self::AcceptUd) => Err(EPROTONOSUPPORT),
        }
    }

    /// The largest private data this use allows on `dev`: [`Self::limit`]
    /// on its transport, [`MAX_PRIVATE_DATA_MPA_TRUNCATED`] at most on a
    /// device that [`Device::truncates_mpa_private_data`].
    pub fn limit_on(self, dev: &Device) -> Result<usize> {
        let limit = self.limit(dev.transport())?;
        Ok(if dev.truncates_mpa_private_data() {
            limit.min(MAX_PRIVATE_DATA_MPA_TRUNCATED)
        } else {
            limit
        })
    }
}

/// Private data owned by the kernel side: a copy, never a borrowed pointer.
#[derive(Clone, Copy)]
pub struct PrivateData {
    bytes: [u8; PRIVATE_DATA_CAPACITY],
    len: u16,
}

impl Default for PrivateData {
    fn default() -> Self {
        Self {
            bytes: [0; PRIVATE_DATA_CAPACITY],
            len: 0,
        }
    }
}

impl PrivateData {
    /// Copies `data`; fails with `EINVAL` above [`PRIVATE_DATA_CAPACITY`].
    pub fn new(data: &[u8]) -> Result<Self> {
        if data.len() > PRIVATE_DATA_CAPACITY {
            return Err(EINVAL);
        }
        let mut pd = Self::default();
        pd.bytes[..data.len()].copy_from_slice(data);
        pd.len = data.len() as u16;
        Ok(pd)
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Checks the length against `limit` (a [`PrivateDataUse::limit_on`]).
    pub fn check(&self, limit: usize) -> Result {
        if self.len() > limit {
            Err(EINVAL)
        } else {
            Ok(())
        }
    }
}

/// Connection parameters for `connect` and `accept`.
///
/// There is no QP number or SRQ flag to set: the CM is always given the
/// id's own QP (a number would be looked up device-wide by the iWARP CM,
/// whoever owns that QP).  Copies of a peer's parameters
/// ([`ConnParamView::to_owned`]) carry the peer's values for reading.
///
/// # Invariants
///
/// `retry_count` and `rnr_retry_count` are at most [`MAX_RETRY_COUNT`];
/// `qp_num` is at most [`MAX_QP_NUM`].
///
/// # Examples
///
/// ```
/// use kernel::prelude::*;
/// use kernel::rdma::ConnParam;
///
/// let param = ConnParam::new()
///     .private_data(b"hello")?
///     .responder_resources(4)
///     .initiator_depth(2)
///     .retry_count(7)?;
/// assert_eq!(param.rd_atom(), (4, 2));
/// assert_eq!(param.data().as_slice(), b"hello");
/// // Retry counts are three bits wide.
/// assert!(ConnParam::new().retry_count(8).is_err());
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Copy, Default)]
pub struct ConnParam {
    private_data: PrivateData,
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: bool,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: u32,
}

impl ConnParam {
    /// Parameters with no private data, no RDMA reads, no retries.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the private data (its use-specific limit is checked when used).
    pub fn private_data(mut self, data: &[u8]) -> Result<Self> {
        self.private_data = PrivateData::new(data)?;
        Ok(self)
    }

    /// Outstanding RDMA reads/atomics the local side accepts from the peer.
    pub fn responder_resources(mut self, value: u8) -> Self {
        self.responder_resources = value;
        self
    }

    /// Outstanding RDMA reads/atomics the local side issues to the peer.
    pub fn initiator_depth(mut self, value: u8) -> Self {
        self.initiator_depth = value;
        self
    }

    /// Whether the local side uses hardware flow control.
    pub fn flow_control(mut self, value: bool) -> Self {
        self.flow_control = value;
        self
    }

    /// Transport retries (3 bits: 0..=7); `EINVAL` otherwise.
    pub fn retry_count(mut self, value: u8) -> Result<Self> {
        if value > MAX_RETRY_COUNT {
            return Err(EINVAL);
        }
        // INVARIANT: checked above.
        self.retry_count = value;
        Ok(self)
    }

    /// Receiver-not-ready retries (3 bits: 0..=7, 7 = infinite); `EINVAL` otherwise.
    pub fn rnr_retry_count(mut self, value: u8) -> Result<Self> {
        if value > MAX_RETRY_COUNT {
            return Err(EINVAL);
        }
        // INVARIANT: checked above.
        self.rnr_retry_count = value;
        Ok(self)
    }

    /// The peer's QP number, in a copy of its parameters (0 otherwise).
    pub fn peer_qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Whether the peer uses an SRQ, in a copy of its parameters.
    pub fn peer_srq(&self) -> bool {
        self.srq
    }

    /// Whether flow control is on.
    pub fn has_flow_control(&self) -> bool {
        self.flow_control
    }

    /// (`retry_count`, `rnr_retry_count`).
    pub fn retry_counts(&self) -> (u8, u8) {
        (self.retry_count, self.rnr_retry_count)
    }

    /// (`responder_resources`, `initiator_depth`).
    pub fn rd_atom(&self) -> (u8, u8) {
        (self.responder_resources, self.initiator_depth)
    }

    /// The private data.
    pub fn data(&self) -> &PrivateData {
        &self.private_data
    }

    /// Checks the private data's length for `usage` on the device
    /// ([`PrivateDataUse::limit_on`]), and the RDMA read depths against the
    /// device's limits (`max_qp_rd_atom` for responder resources,
    /// `max_qp_init_rd_atom` for the initiator depth; on iWARP they travel
    /// as IRD and ORD).
    pub fn check(&self, usage: PrivateDataUse, dev: &Device) -> Result {
        self.check_against(
            usage.limit_on(dev)?,
            dev.max_qp_rd_atom(),
            dev.max_qp_init_rd_atom(),
        )
    }

    /// [`Self::check`] against given limits.
    pub fn check_against(
        &self,
        private_data_limit: usize,
        max_rd_atom: u32,
        max_init_rd_atom: u32,
    ) -> Result {
        self.private_data.check(private_data_limit)?;
        if u32::from(self.responder_resources) > max_rd_atom
            || u32::from(self.initiator_depth) > max_init_rd_atom
        {
            return Err(EINVAL);
        }
        Ok(())
    }

    /// The C structure; `private_data` points into `self`, which must outlive its use.
    pub(crate) fn as_raw(&self) -> bindings::rdma_conn_param {
        bindings::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                core::ptr::null()
            } else {
                self.private_data.as_slice().as_ptr().cast()
            },
            // The CM's field is a u8: every use-specific limit is below 256.
            private_data_len: self.private_data.len().min(255) as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: u8::from(self.flow_control),
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            // The CM uses the id's own QP: never a number from here (a UD
            // id's SIDR reply gets its QP's number from the CM level).
            srq: 0,
            qp_num: 0,
            qkey: 0,
        }
    }
}

/// A view of the connection parameters an event reported.
///
/// It borrows the event: the private data the CM delivered is valid only
/// during the callback, so a consumer that needs it later copies it
/// ([`ConnParamView::to_owned`]).
#[derive(Clone, Copy)]
pub struct ConnParamView<'a> {
    pub(crate) raw: &'a bindings::rdma_conn_param,
    /// The CM reported the read depths the other way round (iWARP's
    /// `ESTABLISHED`, see [`super::event::Event::conn_param`]).
    pub(crate) depths_swapped: bool,
}

impl<'a> ConnParamView<'a> {
    /// The private data as the CM reported it (padded over IB/RoCE).
    pub fn private_data(&self) -> &'a [u8] {
        let len = usize::from(self.raw.private_data_len);
        if self.raw.private_data.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: The CM guarantees `private_data` points to
        // `private_data_len` readable bytes for the duration of the callback,
        // which the lifetime `'a` (bound to the event) does not outlive.
        unsafe { core::slice::from_raw_parts(self.raw.private_data.cast::<u8>(), len) }
    }

    /// This side's responder resources: the RDMA reads and atomics the
    /// peer may have outstanding towards it (in a request: the peer's
    /// initiator depth).
    pub fn responder_resources(&self) -> u8 {
        if self.depths_swapped {
            self.raw.initiator_depth
        } else {
            self.raw.responder_resources
        }
    }

    /// This side's initiator depth: the RDMA reads and atomics it may have
    /// outstanding towards the peer (in a request: the peer's responder
    /// resources).
    pub fn initiator_depth(&self) -> u8 {
        if self.depths_swapped {
            self.raw.responder_resources
        } else {
            self.raw.initiator_depth
        }
    }

    /// Whether the peer uses flow control.
    pub fn flow_control(&self) -> bool {
        self.raw.flow_control != 0
    }

    /// Retry count the peer asked for.
    pub fn retry_count(&self) -> u8 {
        self.raw.retry_count
    }

    /// RNR retry count the peer asked for.
    pub fn rnr_retry_count(&self) -> u8 {
        self.raw.rnr_retry_count
    }

    /// Whether the peer uses an SRQ.
    pub fn srq(&self) -> bool {
        self.raw.srq != 0
    }

    /// The peer's QP number.
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num
    }

    /// Copies the parameters out of the event.
    pub fn to_owned(&self) -> ConnParam {
        let mut param = ConnParam::new()
            .responder_resources(self.responder_resources())
            .initiator_depth(self.initiator_depth())
            .flow_control(self.flow_control());
        param.srq = self.srq();
        // The CM's values come off the wire: clamp to the fields' widths
        // rather than fail, so that a copy always succeeds.
        param.retry_count = self.retry_count().min(MAX_RETRY_COUNT);
        param.rnr_retry_count = self.rnr_retry_count().min(MAX_RETRY_COUNT);
        param.qp_num = self.qp_num() & MAX_QP_NUM;
        let data = self.private_data();
        let n = data.len().min(PRIVATE_DATA_CAPACITY);
        param.private_data.bytes[..n].copy_from_slice(&data[..n]);
        param.private_data.len = n as u16;
        param
    }
}

/// A view of the UD parameters (SIDR) an event reported.
#[derive(Clone, Copy)]
pub struct UdParamView<'a> {
    pub(crate) raw: &'a bindings::rdma_ud_param,
}

impl<'a> UdParamView<'a> {
    /// The private data as the CM reported it.
    pub fn private_data(&self) -> &'a [u8] {
        let len = usize::from(self.raw.private_data_len);
        if self.raw.private_data.is_null() || len == 0 {
            return &[];
        }
        // SAFETY: As for `ConnParamView::private_data`: valid for the callback, which `'a`
        // does not outlive.
        unsafe { core::slice::from_raw_parts(self.raw.private_data.cast::<u8>(), len) }
    }

    /// The remote QP number.
    pub fn qp_num(&self) -> u32 {
        self.raw.qp_num
    }

    /// The remote Q_Key.
    pub fn qkey(&self) -> u32 {
        self.raw.qkey
    }
}
