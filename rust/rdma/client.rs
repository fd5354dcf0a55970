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
//! [`ClientRegistration::device_data`] finds it again (a connection request
//! names its device, the ULP wants that device's PD); [`Client::remove`]
//! gets it back when the device unregisters or the registration is dropped,
//! whichever comes first, and exactly once for each successful `add`.
//! Dropping the registration waits until every `remove` returned.
//!
//! The data is kept in an `XArray` of the registration, indexed by the
//! device's index, rather than in the IB core's client data:
//! `ib_get_client_data` may not be called once `remove` started, and
//! nothing would tell a caller that it had.  Taken out of the `XArray`
//! before `remove` runs, the data is no longer found from then on; a
//! caller that found it earlier holds an `Arc` and keeps the objects alive
//! (the device's unregistration then waits for them, as for any object on
//! the device).
//!
//! The C `add` callback names the device only, not the client, so the
//! registration is found through a slot of the client's type
//! ([`HasClientSlot::slot`], implemented by [`rdma_client_slot!`]): one
//! registration of a type at a time.
//!
//! [`rdma_client_slot!`]: crate::rdma_client_slot

use super::{
    bindings,
    device::Device,
    owner::{CallbackTarget, Owner},
};
use core::{
    ffi::c_int,
    marker::PhantomPinned,
    ptr,
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{
    prelude::*,
    str::CStr,
    sync::{aref::ARef, Arc},
    types::Opaque,
    xarray::{AllocKind, XArray},
};

/// Where the registration of a [`Client`] type is found while it is
/// registered: a `static` of the type's own, made by [`rdma_client_slot!`].
///
/// [`rdma_client_slot!`]: crate::rdma_client_slot
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

/// The slot of a [`Client`] type's registration.
///
/// # Safety
///
/// [`HasClientSlot::slot`] returns the same `static` on every call, and no
/// other type's: the C callbacks find the registration there and read it
/// as this type's.  Implement it with [`rdma_client_slot!`].
///
/// [`rdma_client_slot!`]: crate::rdma_client_slot
pub unsafe trait HasClientSlot {
    /// The slot of this type's registration.
    fn slot() -> &'static ClientSlot;
}

/// Implements [`HasClientSlot`] for a [`Client`] type, with a `static`
/// slot of the expansion's own.  Exported at the crate's root, and here:
/// `rdma::client::rdma_client_slot!` names it whichever crate the layer is
/// compiled into.
///
/// # Examples
///
/// ```ignore
/// struct Devices;
/// rdma_client_slot!(Devices);
/// impl Client for Devices { /* ... */ }
/// ```
#[macro_export]
macro_rules! rdma_client_slot {
    ($t:ty) => {
        // SAFETY: `slot` returns the one `static` of this expansion, which
        // no other type's implementation names.
        #[allow(unsafe_code)]
        unsafe impl $crate::rdma::client::HasClientSlot for $t {
            fn slot() -> &'static $crate::rdma::client::ClientSlot {
                static SLOT: $crate::rdma::client::ClientSlot =
                    $crate::rdma::client::ClientSlot::new();
                &SLOT
            }
        }
    };
}
pub use rdma_client_slot;

/// A ULP's presence on every RDMA device.
pub trait Client: HasClientSlot + Send + Sync + Sized + 'static {
    /// What the client keeps for one device: for example its PD, made in
    /// [`Client::add`].
    type DeviceData: Send + Sync;

    /// The name the IB core lists the client under.
    const NAME: &'static CStr;

    /// A device is there.  Runs with the IB core's lists of devices and
    /// clients locked for writing when called during registration: it must
    /// not register or unregister a client or a device.  May sleep.  An
    /// error (this one's, or no memory to keep the data: it is then
    /// dropped) leaves the client off this device: no `remove` for it, and
    /// [`ClientRegistration::device_data`] finds nothing for it.
    fn add(&self, dev: &ARef<Device>) -> Result<Self::DeviceData>;

    /// The device is unregistering, or the client is: `data` is no longer
    /// found by [`ClientRegistration::device_data`], and it is dropped when
    /// this returns unless a caller still holds a clone (the objects in it
    /// then live until the last clone goes, and the device's unregistration
    /// waits for them).  No lock of the IB core is held; may sleep.
    fn remove(&self, dev: &Device, data: Arc<Self::DeviceData>) {
        let _ = dev;
        drop(data);
    }
}

/// A registered [`Client`].
///
/// # Invariants
///
/// While the registration lives, `raw` is an `ib_client` registered with
/// the IB core whose callbacks are `ClientRegistration::add_callback` and
/// `ClientRegistration::remove_callback` for `C`, and `C::slot()` points
/// to this registration.  `devices` holds, at the index of each device
/// whose `add` succeeded and whose `remove` has not started, what `add`
/// returned.
#[pin_data(PinnedDrop)]
pub struct ClientRegistration<C: Client> {
    client: C,
    #[pin]
    devices: XArray<Arc<C::DeviceData>>,
    #[pin]
    raw: Opaque<bindings::ib_client>,
    /// Counted on its owner while the C side may call into the module
    /// through this object (see [`CallbackTarget`]).
    _target: CallbackTarget,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: The IB core may call the callbacks from any thread; `C` is `Send`
// and `Sync`, and `raw` is only handed to the IB core.
unsafe impl<C: Client> Send for ClientRegistration<C> {}
// SAFETY: As above; shared access only reads `client`.
unsafe impl<C: Client> Sync for ClientRegistration<C> {}

impl<C: Client> ClientRegistration<C> {
    /// Registers `client`, of `owner`: its `add` runs for every device
    /// there is before this returns.  `EBUSY` if a registration of `C`
    /// exists; `ENXIO` once the owner's
    /// [`ModuleOwner`](super::owner::ModuleOwner) is dropping.
    pub fn new(owner: &Owner, client: C) -> impl PinInit<Self, Error> {
        let target = CallbackTarget::new(owner);
        try_pin_init!(Self {
            client,
            // Before `raw`: the callbacks the registration runs use it.
            devices <- XArray::new(AllocKind::Alloc),
            _target: target?,
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

    /// What [`Client::add`] returned for `dev`; `None` if it failed, has
    /// not run yet (a device that is registering: the IB core runs the
    /// clients' `add` in the order they registered, so the CM may report a
    /// connection request on it a moment before), or `remove` started.
    /// Process context only: the `XArray`'s lock is taken without
    /// disabling bottom halves (so not from `CompletionHandler::qp_event`,
    /// which may run in a softirq), and the `Arc` may be the last.
    pub fn device_data(&self, dev: &Device) -> Option<Arc<C::DeviceData>> {
        let devices = self.devices.lock();
        devices.get(dev.index()).map(Arc::from)
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
        // still being initialized, but `client` and `devices` are
        // (initialized before it), `raw` is an `Opaque`, whose bytes may be
        // anything, and `_pin` has none.
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
            .and_then(|d| Ok(Arc::new(d, GFP_KERNEL)?))
        {
            Ok(data) => data,
            Err(e) => return e.to_errno(),
        };
        // The IB core calls `add` once per device (it marks the client's
        // entry registered only after `add`), so the index is free: a
        // failure is the allocation's, and the client is then off the
        // device like after a failed `add` (its data dropped here, no
        // `remove`: that one runs outside the IB core's locks).
        match this.devices.lock().store(dev.index(), data, GFP_KERNEL) {
            Ok(None) => 0,
            Ok(Some(_)) => {
                // Cannot happen (see above); the entry is the new one.
                pr_warn!("client data of a device replaced\n");
                0
            }
            Err(e) => e.error.to_errno(),
        }
    }

    /// The `remove` of the `ib_client`.
    ///
    /// # Safety
    ///
    /// Called by the IB core only, once for each device whose `add`
    /// succeeded, while it holds a count on the device.
    unsafe extern "C" fn remove_callback(
        raw_dev: *mut bindings::ib_device,
        _client_data: *mut core::ffi::c_void,
    ) {
        // SAFETY: The IB core calls `remove` of a registered client only.
        let this = unsafe { Self::registered() };
        // SAFETY: The IB core holds a count on the device until `remove`
        // returned (`remove_client_context` drops it after the call).
        let dev = unsafe { Device::from_raw(raw_dev) };
        // Taken out under the lock, so `device_data` finds nothing from now
        // on; given to the client after it.
        let data = this.devices.lock().remove(dev.index());
        // `remove` comes once for each `add` that succeeded, and only those
        // stored their data (type invariants).
        if let Some(data) = data {
            this.client.remove(dev, data);
        }
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
