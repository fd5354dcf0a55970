// SPDX-License-Identifier: GPL-2.0

//! Asynchronous events of a device and its ports (`struct ib_event_handler`).
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h).
//!
//! A port that goes down or up, a subnet manager or address change, a
//! device that failed: the driver reports these with `ib_dispatch_event`,
//! and the IB core calls every handler registered on the device from its
//! workqueue (`ib_wq`, process context) with the device's list of handlers
//! read-locked (GID changes come from the GID cache directly, with the
//! port's GID table locked).  An [`AsyncEventRegistration`] is such a
//! handler: registered when made, unregistered when dropped, which waits
//! for a handler that is running.  It holds the device, whose
//! unregistration waits for it: a ULP keeps it in its per-device data of
//! an IB client ([`super::client`]) and drops it in `remove`.
//!
//! The events of a QP (and the errors of a CQ) do not come here: a QP's go
//! to its CQ's handler (`CompletionHandler::qp_event`).

use super::{
    bindings,
    callback::{in_any_callback, CallbackMark},
    deferred::DeferredDestroy,
    device::Device,
    owner::{CallbackTarget, Owner},
};
use core::{
    marker::PhantomPinned,
    ptr,
    sync::atomic::{AtomicBool, Ordering},
};
use kernel::{
    prelude::*,
    sync::{aref::ARef, Arc},
    types::Opaque,
};

/// An asynchronous event of a device or of one of its ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceEvent {
    /// `IB_EVENT_DEVICE_FATAL`: the device failed; it is unusable.
    DeviceFatal,
    /// `IB_EVENT_PORT_ACTIVE`: the port came up.
    PortActive(u32),
    /// `IB_EVENT_PORT_ERR`: the port went down.
    PortError(u32),
    /// `IB_EVENT_LID_CHANGE`: the port's LID changed (an iWARP or RoCE
    /// driver may report it when its netdev's address changes).
    LidChange(u32),
    /// `IB_EVENT_PKEY_CHANGE`: the port's P_Key table changed.
    PkeyChange(u32),
    /// `IB_EVENT_SM_CHANGE`: another subnet manager took over.
    SmChange(u32),
    /// `IB_EVENT_CLIENT_REREGISTER`: the SM asks for registrations anew.
    ClientReregister(u32),
    /// `IB_EVENT_GID_CHANGE`: the port's GID table changed.
    GidChange(u32),
    /// `IB_EVENT_DEVICE_SPEED_CHANGE`: the port's speed changed.
    SpeedChange(u32),
    /// Another event code.
    Other(u32),
}

impl DeviceEvent {
    /// The event `raw` reports.
    ///
    /// # Safety
    ///
    /// `raw` must be a valid event for the duration of the call.
    unsafe fn from_raw(raw: *const bindings::ib_event) -> Self {
        // SAFETY: `raw` is valid (the function's safety requirements).
        let code = unsafe { (*raw).event };
        // SAFETY: As above; the union's `port_num` is what the reporter set
        // for the port events, the only ones that read it.
        let port = || unsafe { (*raw).element.port_num };
        match code {
            bindings::ib_event_type_IB_EVENT_DEVICE_FATAL => Self::DeviceFatal,
            bindings::ib_event_type_IB_EVENT_PORT_ACTIVE => Self::PortActive(port()),
            bindings::ib_event_type_IB_EVENT_PORT_ERR => Self::PortError(port()),
            bindings::ib_event_type_IB_EVENT_LID_CHANGE => Self::LidChange(port()),
            bindings::ib_event_type_IB_EVENT_PKEY_CHANGE => Self::PkeyChange(port()),
            bindings::ib_event_type_IB_EVENT_SM_CHANGE => Self::SmChange(port()),
            bindings::ib_event_type_IB_EVENT_CLIENT_REREGISTER => Self::ClientReregister(port()),
            bindings::ib_event_type_IB_EVENT_GID_CHANGE => Self::GidChange(port()),
            bindings::ib_event_type_IB_EVENT_DEVICE_SPEED_CHANGE => Self::SpeedChange(port()),
            other => Self::Other(other),
        }
    }
}

/// What a ULP does with a device's asynchronous events.
pub trait AsyncEventHandler: Send + Sync + 'static {
    /// An event of `dev`.  Runs in process context and may sleep: on the
    /// IB core's workqueue with the device's handlers read-locked, or, for
    /// [`DeviceEvent::GidChange`], in the GID cache's own context with the
    /// port's GID table locked (so it must not query or change GIDs).
    /// Runs with the layer's callback mark set: a registration dropped
    /// here is unregistered from its owner's queue of deferred
    /// destructions (the IB core's unregistration waits for the lock this
    /// call runs under), and making one is refused.
    fn event(&self, dev: &Device, event: DeviceEvent);
}

/// A registered [`AsyncEventHandler`] of one device: unregistered when
/// dropped, which waits for the handler if it is running, or, dropped
/// inside one of the layer's callbacks, from its owner's queue
/// (the handler may then see events until that ran).
pub struct AsyncEventRegistration<H: AsyncEventHandler> {
    inner: Arc<Registered<H>>,
}

/// The handler and its `ib_event_handler`.
///
/// # Invariants
///
/// `raw` is registered with the IB core on `dev`'s device, with
/// [`Registered::callback`] for `H` as its handler, from
/// [`AsyncEventRegistration::new`] until `registered` is cleared by
/// [`Registered::unregister`], which happens before the last reference to
/// the object goes.
#[pin_data]
struct Registered<H: AsyncEventHandler> {
    handler: H,
    dev: ARef<Device>,
    registered: AtomicBool,
    #[pin]
    raw: Opaque<bindings::ib_event_handler>,
    /// Counted on its owner while the C side may call into the module
    /// through this object (see [`CallbackTarget`]).
    target: CallbackTarget,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: The IB core calls the handler from any thread; `H` is `Send` and
// `Sync`, `raw` is only handed to the IB core, `registered` is atomic.
unsafe impl<H: AsyncEventHandler> Send for Registered<H> {}
// SAFETY: As above; shared access reads `handler` and `dev` and swaps
// `registered`.
unsafe impl<H: AsyncEventHandler> Sync for Registered<H> {}

impl<H: AsyncEventHandler> AsyncEventRegistration<H> {
    /// Registers `handler`, of `owner`, for the events of `dev` from now
    /// on.  `EDEADLK` inside one of the layer's callbacks (inside an event
    /// handler of the device, registering waits for it); `ENXIO` once the
    /// owner's [`ModuleOwner`](super::owner::ModuleOwner) is dropping.
    pub fn new(owner: &Owner, dev: &ARef<Device>, handler: H) -> Result<Self> {
        if in_any_callback() {
            return Err(EDEADLK);
        }
        let raw_dev = dev.as_ptr();
        let target = CallbackTarget::new(owner)?;
        let inner = Arc::pin_init(
            pin_init!(Registered {
                handler,
                dev: dev.clone(),
                registered: AtomicBool::new(false),
                target,
                raw <- Opaque::ffi_init(move |raw: *mut bindings::ib_event_handler| {
                    // SAFETY: `raw` is valid for writes; every field of
                    // `ib_event_handler` is valid all-zero, and what
                    // `INIT_IB_EVENT_HANDLER` sets is set here (the list
                    // head is written by `list_add_tail` when registering).
                    unsafe {
                        ptr::write_bytes(raw, 0, 1);
                        (*raw).device = raw_dev;
                        (*raw).handler = Some(Registered::<H>::callback);
                    }
                }),
                _pin: PhantomPinned,
            }),
            GFP_KERNEL,
        )?;
        inner.registered.store(true, Ordering::Release);
        // SAFETY: `raw` is initialized for the device `inner.dev` holds and
        // pinned in the `Arc`; not in a layer callback (checked above), so
        // not under the device's handler lock, which this takes for writing.
        // INVARIANT: Registered until `unregister`.
        unsafe { bindings::ib_register_event_handler(inner.raw.get()) };
        Ok(Self { inner })
    }

    /// The device whose events the handler gets.
    pub fn device(&self) -> &Device {
        &self.inner.dev
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.handler
    }
}

impl<H: AsyncEventHandler> Registered<H> {
    /// Unregisters `raw`, once; waits for a running handler.  Not inside a
    /// layer callback (an event handler of the device holds the lock this
    /// takes for writing).
    fn unregister(&self) {
        if self.registered.swap(false, Ordering::AcqRel) {
            // SAFETY: Registered (type invariants, `registered` was set);
            // `ib_unregister_event_handler` takes the device's handler list
            // write-locked, so a handler running under its read lock has
            // returned, and none starts afterwards.
            unsafe { bindings::ib_unregister_event_handler(self.raw.get()) };
        }
    }

    /// The `handler` of the `ib_event_handler`.
    ///
    /// # Safety
    ///
    /// Called by the IB core only, for a registered `raw` of a `Self`, with
    /// a valid event.
    unsafe extern "C" fn callback(
        raw: *mut bindings::ib_event_handler,
        event: *mut bindings::ib_event,
    ) {
        let _mark = CallbackMark::enter();
        // SAFETY: `raw` is the `raw` field of a registered `Self` (the
        // function's safety requirements), which is unregistered before its
        // last reference goes, and the unregistration waits for this call.
        let this = unsafe {
            &*kernel::container_of!(raw.cast::<Opaque<bindings::ib_event_handler>>(), Self, raw)
        };
        // SAFETY: `event` is valid for the call.
        let event = unsafe { DeviceEvent::from_raw(event) };
        this.handler.event(&this.dev, event);
    }
}

impl<H: AsyncEventHandler> DeferredDestroy for Registered<H> {
    fn destroy(&self) {
        self.unregister();
    }
}

impl<H: AsyncEventHandler> Drop for AsyncEventRegistration<H> {
    fn drop(&mut self) {
        if !in_any_callback() {
            self.inner.unregister();
            return;
        }
        let victim: Arc<dyn DeferredDestroy> = self.inner.clone();
        let owner = self.inner.target.owner();
        if owner.defer(victim).is_err() {
            // No memory: unregistering here could deadlock, so the
            // registration leaks, loudly.  The IB core keeps calling this
            // module's handler: the module must never go.
            pr_err!("cannot defer the unregistration of an event handler, leaking it\n");
            core::mem::forget(self.inner.clone());
            owner.pin_module();
        }
    }
}
