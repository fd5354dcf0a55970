// SPDX-License-Identifier: GPL-2.0

//! Per-device state of an upper-layer protocol (`struct ib_client`).
//!
//! C header: [`include/rdma/ib_verbs.h`](srctree/include/rdma/ib_verbs.h).
//!
//! Every ULP keeps some objects per RDMA device rather than per connection
//! (one PD, a CQ pool, the device's limits) and must let go of them when
//! the device goes, whether or not a CM id of it is open.  A
//! [`ClientRegistration`] registers a [`Client`] with the IB core: its
//! [`Client::add`] runs for every device registered at that moment and for
//! every one registered later, and what it returns is kept for the device;
//! [`Client::remove`] gets it back when the device unregisters or the
//! registration is dropped, whichever comes first, and exactly once for
//! each successful `add`.  Dropping the registration waits until every
//! `remove` returned.
//!
//! The C `add` callback names the device only, not the client, so the
//! registration is found through a slot of the client's type
//! ([`Client::slot`]): one registration of a type at a time.

use super::{bindings, device::Device};
use core::{
    ffi::c_int,
    marker::PhantomPinned,
    ptr,
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{prelude::*, str::CStr, sync::aref::ARef, types::Opaque};

/// Where the registration of a [`Client`] type is found while it is
/// registered.  Declare one `static` per client type and return it from
/// [`Client::slot`].
pub struct ClientSlot(AtomicPtr<core::ffi::c_void>);

impl ClientSlot {
    /// An empty slot.
    pub const fn new() -> Self {
        Self(AtomicPtr::new(ptr::null_mut()))
    }
}

impl Default for ClientSlot {
    fn default() -> Self {
        Self::new()
    }
}

/// A ULP's presence on every RDMA device.
pub trait Client: Send + Sync + Sized + 'static {
    /// What the client keeps for one device: for example its PD, made in
    /// [`Client::add`].
    type DeviceData: Send + Sync;

    /// The name the IB core lists the client under.
    const NAME: &'static CStr;

    /// The slot of this type's registration, a `static` of the
    /// implementation's own.
    fn slot() -> &'static ClientSlot;

    /// A device is there.  Runs with the IB core's lists of devices and
    /// clients locked for writing when called during registration: it must
    /// not register or unregister a client or a device.  May sleep.  An
    /// error leaves the client off this device: no `remove` for it.
    fn add(&self, dev: &ARef<Device>) -> Result<Self::DeviceData>;

    /// The device is unregistering, or the client is: `data` is dropped
    /// when this returns, and with it what the client kept on the device
    /// (the device's unregistration waits until every reference to it is
    /// gone).  No lock of the IB core is held; may sleep.
    fn remove(&self, dev: &Device, data: Self::DeviceData) {
        let _ = dev;
        drop(data);
    }
}

/// A registered [`Client`].
///
/// # Invariants
///
/// While the registration lives, `raw` is an `ib_client` registered with
/// the IB core whose callbacks are [`ClientRegistration::add_callback`] and
/// [`ClientRegistration::remove_callback`] for `C`, and `C::slot()` points
/// to this registration.  The client data the IB core keeps for a device is
/// a `KBox<C::DeviceData>` made by `add_callback`.
#[pin_data(PinnedDrop)]
pub struct ClientRegistration<C: Client> {
    client: C,
    #[pin]
    raw: Opaque<bindings::ib_client>,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: The IB core may call the callbacks from any thread; `C` is `Send`
// and `Sync`, and `raw` is only handed to the IB core.
unsafe impl<C: Client> Send for ClientRegistration<C> {}
// SAFETY: As above; shared access only reads `client`.
unsafe impl<C: Client> Sync for ClientRegistration<C> {}

impl<C: Client> ClientRegistration<C> {
    /// Registers `client`: its `add` runs for every device there is before
    /// this returns.  `EBUSY` if a registration of `C` exists.
    pub fn new(client: C) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            client,
            raw <- Opaque::try_ffi_init(|raw: *mut bindings::ib_client| {
                // SAFETY: `raw` points into the `raw` field (an `Opaque`,
                // transparent over the `ib_client`) of a `Self` being
                // initialized in place.
                let this = unsafe {
                    kernel::container_of!(raw.cast::<Opaque<bindings::ib_client>>(), Self, raw)
                };
                let slot = &C::slot().0;
                slot.compare_exchange(
                    ptr::null_mut(),
                    this.cast(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .map_err(|_| EBUSY)?;
                // SAFETY: `raw` is valid for writes; every field of
                // `ib_client` is valid all-zero (NULL callbacks, counts the
                // IB core sets itself in `ib_register_client`).
                unsafe {
                    ptr::write_bytes(raw, 0, 1);
                    (*raw).name = C::NAME.as_char_ptr();
                    (*raw).add = Some(Self::add_callback);
                    (*raw).remove = Some(Self::remove_callback);
                }
                // On an error `ib_register_client` unregisters what it added
                // before it returns; the callbacks find `this` through the
                // slot set above.
                // SAFETY: `raw` is a zeroed `ib_client` with a name and our
                // callbacks, pinned until `PinnedDrop` unregisters it.
                let r = kernel::error::to_result(unsafe { bindings::ib_register_client(raw) });
                if r.is_err() {
                    slot.store(ptr::null_mut(), Ordering::Release);
                }
                r
            }),
            _pin: PhantomPinned,
        })
    }

    /// The client.
    pub fn client(&self) -> &C {
        &self.client
    }

    /// The registration of `C`, found through its slot.
    ///
    /// # Safety
    ///
    /// Called from a callback of the registration's `ib_client`: the IB core
    /// calls those only between `ib_register_client` and the end of
    /// `ib_unregister_client`, while the slot holds the registration.
    unsafe fn registered<'a>() -> &'a Self {
        let this = C::slot().0.load(Ordering::Acquire);
        // During `ib_register_client` the registration's `raw` field is
        // still being initialized, but `client` is (initialized first), `raw`
        // is an `Opaque`, whose bytes may be anything, and `_pin` has none.
        // SAFETY: By the safety requirements the slot points to a pinned
        // registration that outlives the callback.
        unsafe { &*this.cast::<Self>() }
    }

    /// The `add` of the `ib_client`.
    ///
    /// # Safety
    ///
    /// Called by the IB core only, for a device it holds a count on, while
    /// the client is registered.
    unsafe extern "C" fn add_callback(raw_dev: *mut bindings::ib_device) -> c_int {
        // SAFETY: The IB core calls `add` of a registered client only.
        let this = unsafe { Self::registered() };
        // SAFETY: The IB core holds a count on the device during `add`
        // (`add_client_context` takes one before it calls `add`).
        let dev = match unsafe { Device::try_get(raw_dev) } {
            Ok(dev) => dev,
            Err(e) => return e.to_errno(),
        };
        let data = match this
            .client
            .add(&dev)
            .and_then(|d| Ok(KBox::new(d, GFP_KERNEL)?))
        {
            Ok(data) => data,
            Err(e) => return e.to_errno(),
        };
        // SAFETY: `raw_dev` is the device `add` was called for, `this.raw`
        // the registered client; the IB core reserved the device's slot for
        // this client before calling `add`, so storing cannot fail.  The
        // box goes back to a `KBox` in `remove_callback` (type invariant).
        unsafe {
            bindings::ib_set_client_data(raw_dev, this.raw.get(), KBox::into_raw(data).cast())
        };
        0
    }

    /// The `remove` of the `ib_client`.
    ///
    /// # Safety
    ///
    /// Called by the IB core only, once for each device whose `add`
    /// succeeded, with the data `add` stored, while it holds a count on the
    /// device.
    unsafe extern "C" fn remove_callback(
        raw_dev: *mut bindings::ib_device,
        data: *mut core::ffi::c_void,
    ) {
        // SAFETY: The IB core calls `remove` of a registered client only.
        let this = unsafe { Self::registered() };
        // SAFETY: `remove` is only called for devices whose `add` succeeded,
        // with the data it stored: a `KBox<C::DeviceData>` (type
        // invariant), handed back once.
        let data = unsafe { KBox::from_raw(data.cast::<C::DeviceData>()) };
        // SAFETY: The IB core holds a count on the device until `remove`
        // returned (`remove_client_context` drops it after the call).
        let dev = unsafe { Device::from_raw(raw_dev) };
        this.client.remove(dev, KBox::into_inner(data));
    }
}

#[pinned_drop]
impl<C: Client> PinnedDrop for ClientRegistration<C> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: Registered in `new` (type invariants);
        // `ib_unregister_client` calls `remove` for every device that has
        // our data and returns only once every callback finished.
        unsafe { bindings::ib_unregister_client(self.raw.get()) };
        C::slot().0.store(ptr::null_mut(), Ordering::Release);
    }
}
