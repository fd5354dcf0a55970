// SPDX-License-Identifier: GPL-2.0

//! Verbs for the data path: protection domains, completion queues, the
//! id's queue pair, and DMA-mapped buffers.
//!
//! # Ownership
//!
//! * A buffer is owned by the consumer until it is posted; posting moves it
//!   into the QP, and its completion hands it back to the
//!   [`CompletionHandler`] (also when the QP is flushed at teardown).  A
//!   buffer in flight can therefore be neither freed nor reused.
//! * The QP belongs to its CM id: it is created through a [`LockedId`] and
//!   torn down (drained, then `rdma_destroy_qp`) by the id's destruction,
//!   before `rdma_destroy_id`.  A [`Qp`] handle that outlives the id fails
//!   its posts with `ENOTCONN`.
//! * A QP keeps its PD and CQ alive; they are freed after it.

use super::{
    bindings,
    cm::{CallbackMark, LockedId},
    mr::WorkDone,
};
use core::{
    ptr::{self, NonNull},
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex},
};

/// A reference that holds a device's unregistration back.
///
/// `ib_unregister_device` first removes its clients (the CM sends
/// DEVICE_REMOVAL and waits for the ids on the device to be destroyed), then
/// waits until every `ib_device_try_get` reference is put
/// (`disable_device`), and only then frees the device.  Every object of this
/// layer that lives on a device (PD, CQ, DMA buffers, and regions through
/// their PD) holds one, so none can outlive its device: a consumer that
/// drops them after DEVICE_REMOVAL (as dropping the id's owner does) lets
/// the removal finish, and none is ever used on a freed device.
///
/// # Invariants
///
/// `raw` is a device on which this object owns one `ib_device_try_get`
/// reference.
pub(crate) struct DeviceRef {
    raw: NonNull<bindings::ib_device>,
}

// SAFETY: The reference may be taken and put on any thread.
unsafe impl Send for DeviceRef {}
// SAFETY: `&DeviceRef` only reads the pointer.
unsafe impl Sync for DeviceRef {}

impl DeviceRef {
    /// Takes a reference on `dev`; `ENODEV` once its unregistration began.
    ///
    /// # Safety
    ///
    /// `dev` must be a live device (e.g. the device of a bound, live id).
    unsafe fn get(dev: *mut bindings::ib_device) -> Result<Arc<Self>> {
        let raw = NonNull::new(dev).ok_or(EINVAL)?;
        // SAFETY: `dev` is live by the safety requirements.
        if !unsafe { bindings::rdma_cm_rs_device_try_get(dev) } {
            return Err(ENODEV);
        }
        // INVARIANT: Referenced just above.
        let this = Self { raw };
        Ok(Arc::new(this, GFP_KERNEL)?)
    }

    pub(crate) fn as_ptr(&self) -> *mut bindings::ib_device {
        self.raw.as_ptr()
    }
}

impl Drop for DeviceRef {
    fn drop(&mut self) {
        // SAFETY: Puts the reference this object owns.
        unsafe { bindings::ib_device_put(self.raw.as_ptr()) };
    }
}

/// A protection domain (`ib_alloc_pd`).
///
/// # Invariants
///
/// `raw` is a live PD allocated by [`Pd::alloc`] on `dev`'s device, freed
/// only by `drop` (before `dev` is put).
pub struct Pd {
    raw: NonNull<bindings::ib_pd>,
    dev: Arc<DeviceRef>,
}

// SAFETY: A PD may be used and freed from any thread.
unsafe impl Send for Pd {}
// SAFETY: `&Pd` only reads immutable fields.
unsafe impl Sync for Pd {}

impl Pd {
    /// Allocates a PD on the device the id is bound to.
    pub fn alloc(id: &LockedId<'_>) -> Result<Arc<Self>> {
        // SAFETY: The device of a bound, live (locked) id is live.
        let dev = unsafe { DeviceRef::get(id.device_ptr().ok_or(EINVAL)?)? };
        // SAFETY: `dev` is live and referenced.
        let raw = unsafe { bindings::rdma_cm_rs_alloc_pd(dev.as_ptr(), 0) };
        let raw = kernel::error::from_err_ptr(raw)?;
        // INVARIANT: `raw` is a PD just allocated on `dev`.
        Ok(Arc::new(
            Self {
                raw: NonNull::new(raw).ok_or(ENOMEM)?,
                dev,
            },
            GFP_KERNEL,
        )?)
    }

    /// The key that gives the device access to all of memory for local use.
    pub fn local_dma_lkey(&self) -> u32 {
        // SAFETY: The PD is live (type invariants).
        unsafe { (*self.raw.as_ptr()).local_dma_lkey }
    }

    pub(crate) fn device(&self) -> *mut bindings::ib_device {
        self.dev.as_ptr()
    }

    pub(crate) fn device_ref(&self) -> Arc<DeviceRef> {
        self.dev.clone()
    }

    pub(crate) fn as_ptr(&self) -> *mut bindings::ib_pd {
        self.raw.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: The PD is live and, by the type invariants, freed only here.
        unsafe { bindings::rdma_cm_rs_dealloc_pd(self.raw.as_ptr()) };
    }
}

/// Receives the buffers of completed work requests.
///
/// Runs on the CQ's workqueue (`IB_POLL_WORKQUEUE`, process context).  A
/// [`super::cm::CmId`] dropped here is destroyed from a workqueue: its QP's
/// drain could otherwise wait for this very context.
pub trait CompletionHandler: Send + Sync + 'static {
    /// A receive completed: `Ok(len)` bytes arrived, or the error (ECANCELED
    /// when the QP was flushed).
    fn recv_done(&self, buf: RecvBuffer, result: Result<usize>);
    /// A send completed.
    fn send_done(&self, buf: SendBuffer, result: Result);

    /// A memory work request (registration, invalidation, RDMA READ or
    /// WRITE, see [`super::mr`]) completed.  Errors: `EACCES` for a remote
    /// access error (bad key, range or permission at the peer),
    /// `EHOSTUNREACH` when the transport's retries ran out, `ECANCELED` when the QP was flushed,
    /// `EIO` otherwise.  The default logs failures other than flushes.
    fn work_done(&self, done: WorkDone, result: Result) {
        if let Err(e) = result {
            if e != ECANCELED {
                pr_warn!(
                    "rdma_cm_rs: {:?} (tag {}) failed: {:?}\n",
                    done.op,
                    done.tag,
                    e
                );
            }
        }
    }
}

/// The handler of a CQ's completions.
///
/// # Safety
///
/// `cq` must be live, with a `Cq<C>` as its context, for `'a`.
pub(crate) unsafe fn handler_of<'a, C: CompletionHandler>(cq: *mut bindings::ib_cq) -> &'a C {
    // SAFETY: By the safety requirements.
    unsafe { &(*(*cq).cq_context.cast::<Cq<C>>()).handler }
}

/// A completion queue (`ib_alloc_cq`, polled from a workqueue).
///
/// # Invariants
///
/// Once allocated, `raw` is a live CQ whose `cq_context` is this object.
pub struct Cq<C: CompletionHandler> {
    raw: AtomicPtr<bindings::ib_cq>,
    handler: C,
    /// Holds the device's unregistration until the CQ is freed.
    _dev: Arc<DeviceRef>,
}

// SAFETY: A CQ may be used and freed from any thread; `C` is `Send + Sync`.
unsafe impl<C: CompletionHandler> Send for Cq<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Cq<C> {}

impl<C: CompletionHandler> Cq<C> {
    /// Allocates a CQ of `entries` on the device the id is bound to.
    pub fn alloc(id: &LockedId<'_>, entries: u32, handler: C) -> Result<Arc<Self>> {
        // SAFETY: The device of a bound, live (locked) id is live.
        let dev_ref = unsafe { DeviceRef::get(id.device_ptr().ok_or(EINVAL)?)? };
        let dev = dev_ref.as_ptr();
        let cq = Arc::new(
            Self {
                raw: AtomicPtr::new(ptr::null_mut()),
                handler,
                _dev: dev_ref,
            },
            GFP_KERNEL,
        )?;
        let context: *const Self = &*cq;
        // SAFETY: `dev` is live; `context` stays valid until `drop` frees the
        // CQ, because the CQ is freed in this object's `drop`.
        let raw = unsafe {
            bindings::rdma_cm_rs_alloc_cq(
                dev,
                context.cast_mut().cast(),
                i32::try_from(entries).map_err(|_| EINVAL)?,
                0,
                bindings::ib_poll_context_IB_POLL_WORKQUEUE,
            )
        };
        let raw = kernel::error::from_err_ptr(raw)?;
        // INVARIANT: Just allocated with this object as its context.
        cq.raw.store(raw, Ordering::Release);
        Ok(cq)
    }

    /// The handler.
    pub fn handler(&self) -> &C {
        &self.handler
    }

    fn as_ptr(&self) -> *mut bindings::ib_cq {
        self.raw.load(Ordering::Acquire)
    }
}

impl<C: CompletionHandler> Drop for Cq<C> {
    fn drop(&mut self) {
        let raw = self.as_ptr();
        if !raw.is_null() {
            // SAFETY: Live CQ; its QPs are gone (each QP holds the CQ alive).
            unsafe { bindings::ib_free_cq(raw) };
        }
    }
}

/// The memory of a posted or postable buffer.
///
/// # Invariants
///
/// `data` is DMA-mapped at `dma` for `device` in `direction` while the
/// object lives; `cqe` is the completion entry the QP reports it with.
#[repr(C)]
struct Buffer {
    cqe: bindings::ib_cqe,
    device: *mut bindings::ib_device,
    /// Holds the device's unregistration until the buffer is unmapped.
    _dev: Arc<DeviceRef>,
    dma: u64,
    direction: bindings::dma_data_direction,
    lkey: u32,
    len: usize,
    data: KVec<u8>,
}

// SAFETY: `device` is only passed to the DMA API, which may be called from
// any thread; the data is owned.
unsafe impl Send for Buffer {}
// SAFETY: Shared references only read the data.
unsafe impl Sync for Buffer {}

impl Buffer {
    fn new(
        pd: &Pd,
        capacity: usize,
        direction: bindings::dma_data_direction,
    ) -> Result<KBox<Self>> {
        if capacity == 0 || capacity > u32::MAX as usize {
            return Err(EINVAL);
        }
        let mut data = KVec::with_capacity(capacity, GFP_KERNEL)?;
        data.resize(capacity, 0, GFP_KERNEL)?;
        let device = pd.device();
        let mut dma = 0u64;
        // SAFETY: `data` is a live kmalloc'ed region of `capacity` bytes
        // (physically contiguous), unmapped in `drop`.
        kernel::error::to_result(unsafe {
            bindings::rdma_cm_rs_dma_map_single(
                device,
                data.as_mut_ptr().cast(),
                capacity,
                direction,
                &mut dma,
            )
        })?;
        // INVARIANT: Mapped just above.
        Ok(KBox::new(
            Self {
                cqe: bindings::ib_cqe { done: None },
                device,
                _dev: pd.device_ref(),
                dma,
                direction,
                lkey: pd.local_dma_lkey(),
                len: 0,
                data,
            },
            GFP_KERNEL,
        )?)
    }

    fn sge(&self, len: usize) -> bindings::ib_sge {
        bindings::ib_sge {
            addr: self.dma,
            length: len as u32,
            lkey: self.lkey,
        }
    }

    fn sync_for_cpu(&self) {
        // SAFETY: Mapped by the type invariants.
        unsafe {
            bindings::rdma_cm_rs_dma_sync_for_cpu(
                self.device,
                self.dma,
                self.data.len(),
                self.direction,
            )
        };
    }

    fn sync_for_device(&self) {
        // SAFETY: Mapped by the type invariants.
        unsafe {
            bindings::rdma_cm_rs_dma_sync_for_device(
                self.device,
                self.dma,
                self.data.len(),
                self.direction,
            )
        };
    }

    /// Recovers the buffer of a completed work request.
    ///
    /// # Safety
    ///
    /// `wc` must be the completion of a work request posted with a buffer
    /// leaked by `KBox::into_raw` in this module.
    unsafe fn from_wc(wc: *mut bindings::ib_wc) -> KBox<Self> {
        // SAFETY: By the safety requirements `wr_cqe` is the `cqe` field of a `Buffer`.
        unsafe {
            let cqe = (*wc).__bindgen_anon_1.wr_cqe;
            let buf = cqe
                .byte_sub(core::mem::offset_of!(Buffer, cqe))
                .cast::<Buffer>();
            KBox::from_raw(buf)
        }
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: Mapped by the type invariants, unmapped once here.
        unsafe {
            bindings::rdma_cm_rs_dma_unmap_single(
                self.device,
                self.dma,
                self.data.len(),
                self.direction,
            )
        };
    }
}

/// A receive buffer: DMA-mapped, owned by the consumer while not posted.
pub struct RecvBuffer(KBox<Buffer>);

impl RecvBuffer {
    /// A buffer of `capacity` bytes for the PD's device.
    pub fn new(pd: &Pd, capacity: usize) -> Result<Self> {
        Ok(Self(Buffer::new(
            pd,
            capacity,
            bindings::dma_data_direction::DMA_FROM_DEVICE,
        )?))
    }

    /// The bytes the last completion delivered.
    pub fn data(&self) -> &[u8] {
        &self.0.data[..self.0.len]
    }

    /// How much one receive can take.
    pub fn capacity(&self) -> usize {
        self.0.data.len()
    }
}

/// A send buffer: DMA-mapped, owned by the consumer while not posted.
pub struct SendBuffer(KBox<Buffer>);

impl SendBuffer {
    /// A buffer of `capacity` bytes for the PD's device.
    pub fn new(pd: &Pd, capacity: usize) -> Result<Self> {
        Ok(Self(Buffer::new(
            pd,
            capacity,
            bindings::dma_data_direction::DMA_TO_DEVICE,
        )?))
    }

    /// Replaces the contents; `EMSGSIZE` if `data` does not fit.
    pub fn fill(&mut self, data: &[u8]) -> Result {
        if data.len() > self.0.data.len() {
            return Err(EMSGSIZE);
        }
        self.0.data[..data.len()].copy_from_slice(data);
        self.0.len = data.len();
        Ok(())
    }

    /// The bytes that will be sent.
    pub fn data(&self) -> &[u8] {
        &self.0.data[..self.0.len]
    }

    /// How much one send can carry.
    pub fn capacity(&self) -> usize {
        self.0.data.len()
    }
}

/// Sizes of a QP's queues.
#[derive(Clone, Copy)]
pub struct QpCaps {
    /// Send work requests in flight.
    pub max_send_wr: u32,
    /// Receive work requests in flight.
    pub max_recv_wr: u32,
}

/// Tears a QP down when its id is destroyed.
pub(crate) trait QpTeardown: Send + Sync {
    /// Stops posts, flushes outstanding work (handing the buffers back) and
    /// destroys the QP.  Called once, by the id's destruction.
    fn teardown(&self, id: *mut bindings::rdma_cm_id);
}

/// The queue pair of a CM id.
///
/// # Invariants
///
/// `raw` holds the id's live QP until [`QpTeardown::teardown`] takes it.
#[pin_data]
pub struct Qp<C: CompletionHandler> {
    #[pin]
    raw: Mutex<Option<NonNull<bindings::ib_qp>>>,
    qp_num: u32,
    _pd: Arc<Pd>,
    _cq: Arc<Cq<C>>,
}

// SAFETY: Posting is serialised by `raw`'s mutex; the pointers are only
// used under it.
unsafe impl<C: CompletionHandler> Send for Qp<C> {}
// SAFETY: As above.
unsafe impl<C: CompletionHandler> Sync for Qp<C> {}

impl<C: CompletionHandler> Qp<C> {
    pub(crate) fn create(
        id: &LockedId<'_>,
        pd: &Arc<Pd>,
        cq: &Arc<Cq<C>>,
        caps: QpCaps,
    ) -> Result<Arc<Self>> {
        let mut attr: bindings::ib_qp_init_attr = pin_init::zeroed();
        attr.send_cq = cq.as_ptr();
        attr.recv_cq = cq.as_ptr();
        attr.qp_type = id.qp_type();
        attr.sq_sig_type = bindings::ib_sig_type_IB_SIGNAL_ALL_WR;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        // SAFETY: The id is live and locked; `pd` and the CQ are live and
        // outlive the QP (it holds them).
        kernel::error::to_result(unsafe {
            bindings::rdma_create_qp(id.raw(), pd.raw.as_ptr(), &mut attr)
        })?;
        // SAFETY: `rdma_create_qp` succeeded, so `qp` is set.
        let raw = unsafe { (*id.raw()).qp };
        // SAFETY: `raw` is the live QP just created.
        let qp_num = unsafe { (*raw).qp_num };
        let qp = Arc::pin_init(
            pin_init!(Self {
                raw <- new_mutex!(NonNull::new(raw)),
                qp_num,
                _pd: pd.clone(),
                _cq: cq.clone(),
            }),
            GFP_KERNEL,
        );
        match qp {
            Ok(qp) => Ok(qp),
            Err(e) => {
                // SAFETY: The QP was created above and is unknown to anyone else.
                unsafe { bindings::rdma_destroy_qp(id.raw()) };
                Err(e)
            }
        }
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Posts one send-queue work request that `fill` completes from a
    /// zeroed one (returning the request to post, which may embed it) while
    /// the QP is locked.  The caller keeps whatever the request points to
    /// alive until its completion.
    pub(crate) fn post_send_raw(
        &self,
        fill: impl FnOnce(&mut bindings::ib_send_wr) -> *const bindings::ib_send_wr,
    ) -> Result {
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err(ENOTCONN);
        };
        let mut wr: bindings::ib_send_wr = pin_init::zeroed();
        let wr = fill(&mut wr);
        // SAFETY: `raw` is live under the lock; `wr` and what it points to
        // live across the call (the caller's contract).
        kernel::error::to_result(unsafe { bindings::rdma_cm_rs_post_send(raw.as_ptr(), wr) })
    }

    /// Posts a receive of the buffer's full capacity.  On failure the buffer
    /// comes back with the error.
    pub fn post_recv(&self, buf: RecvBuffer) -> core::result::Result<(), (Error, RecvBuffer)> {
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err((ENOTCONN, buf));
        };
        let mut inner = buf.0;
        inner.cqe.done = Some(recv_done::<C>);
        let mut sge = inner.sge(inner.data.len());
        let mut wr: bindings::ib_recv_wr = pin_init::zeroed();
        wr.__bindgen_anon_1.wr_cqe = &mut inner.cqe;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let leaked = KBox::into_raw(inner);
        // SAFETY: `raw` is live under the lock; `wr` and `sge` live across
        // the call; the buffer stays allocated and mapped until its
        // completion recovers it.
        let ret = unsafe { bindings::rdma_cm_rs_post_recv(raw.as_ptr(), &wr) };
        if ret != 0 {
            // SAFETY: The post failed: the QP does not own the buffer.
            let inner = unsafe { KBox::from_raw(leaked) };
            return Err((Error::from_errno(ret), RecvBuffer(inner)));
        }
        Ok(())
    }

    /// Posts a SEND of the buffer's contents (signaled).  On failure the
    /// buffer comes back with the error.
    pub fn post_send(&self, buf: SendBuffer) -> core::result::Result<(), (Error, SendBuffer)> {
        let guard = self.raw.lock();
        let Some(raw) = *guard else {
            return Err((ENOTCONN, buf));
        };
        let mut inner = buf.0;
        inner.sync_for_device();
        inner.cqe.done = Some(send_done::<C>);
        let mut sge = inner.sge(inner.len);
        let mut wr: bindings::ib_send_wr = pin_init::zeroed();
        wr.__bindgen_anon_1.wr_cqe = &mut inner.cqe;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = bindings::ib_wr_opcode_IB_WR_SEND;
        wr.send_flags = bindings::ib_send_flags_IB_SEND_SIGNALED;
        let leaked = KBox::into_raw(inner);
        // SAFETY: As in `post_recv`.
        let ret = unsafe { bindings::rdma_cm_rs_post_send(raw.as_ptr(), &wr) };
        if ret != 0 {
            // SAFETY: The post failed: the QP does not own the buffer.
            let inner = unsafe { KBox::from_raw(leaked) };
            return Err((Error::from_errno(ret), SendBuffer(inner)));
        }
        Ok(())
    }
}

impl<C: CompletionHandler> QpTeardown for Qp<C> {
    fn teardown(&self, id: *mut bindings::rdma_cm_id) {
        // Stop new posts first, outside of the drain that waits for completions.
        let raw = self.raw.lock().take();
        if let Some(raw) = raw {
            // SAFETY: The QP is live; draining flushes every outstanding work
            // request through the completion handler, returning its buffer.
            unsafe { bindings::ib_drain_qp(raw.as_ptr()) };
            // SAFETY: `id` is the live id owning this QP (the caller's contract).
            unsafe { bindings::rdma_destroy_qp(id) };
        }
    }
}

/// A work completion's status as a result.
pub(crate) fn wc_result(wc: &bindings::ib_wc) -> Result {
    match wc.status {
        bindings::ib_wc_status_IB_WC_SUCCESS => Ok(()),
        bindings::ib_wc_status_IB_WC_WR_FLUSH_ERR => Err(ECANCELED),
        bindings::ib_wc_status_IB_WC_REM_ACCESS_ERR => Err(EACCES),
        bindings::ib_wc_status_IB_WC_RETRY_EXC_ERR
        | bindings::ib_wc_status_IB_WC_RNR_RETRY_EXC_ERR => Err(EHOSTUNREACH),
        _ => Err(EIO),
    }
}

/// # Safety
///
/// Called by the CQ for a receive posted by [`Qp::post_recv`] on a QP whose
/// CQ is a `Cq<C>`.
unsafe extern "C" fn recv_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter();
    // SAFETY: By the safety requirements.
    let mut buf = unsafe { Buffer::from_wc(wc) };
    // SAFETY: The CQ is live during its callback; its context is the `Cq<C>`.
    let handler = unsafe { handler_of::<C>(cq) };
    // SAFETY: `wc` is valid during the callback.
    let wc = unsafe { &*wc };
    let result = wc_result(wc).map(|()| {
        buf.sync_for_cpu();
        buf.len = (wc.byte_len as usize).min(buf.data.len());
        buf.len
    });
    handler.recv_done(RecvBuffer(buf), result);
}

/// # Safety
///
/// Called by the CQ for a send posted by [`Qp::post_send`] on a QP whose CQ
/// is a `Cq<C>`.
unsafe extern "C" fn send_done<C: CompletionHandler>(
    cq: *mut bindings::ib_cq,
    wc: *mut bindings::ib_wc,
) {
    let _mark = CallbackMark::enter();
    // SAFETY: By the safety requirements.
    let buf = unsafe { Buffer::from_wc(wc) };
    // SAFETY: As in `recv_done`.
    let handler = unsafe { handler_of::<C>(cq) };
    // SAFETY: `wc` is valid during the callback.
    let result = wc_result(unsafe { &*wc });
    handler.send_done(SendBuffer(buf), result);
}
