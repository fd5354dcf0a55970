// SPDX-License-Identifier: GPL-2.0

//! A misc device with `poll`.
//!
//! `kernel::miscdevice` in 7.3 has open, release, ioctl, read/write and
//! mmap, but no `poll`; an event-queue device needs it.  This is the same
//! shape (a pinned `struct miscdevice` registration, a vtable of
//! trampolines) with `poll` added.  32-bit callers go through
//! `compat_ptr_ioctl`, which converts the argument with `compat_ptr` before
//! calling `ioctl`: the device's ABI has one layout for both.

use core::marker::PhantomData;
use kernel::{
    bindings,
    error::{to_result, VTABLE_DEFAULT_ERROR},
    ffi,
    fs::File,
    module::this_module,
    prelude::*,
    sync::poll::PollTable,
    types::{ForeignOwnable, Opaque},
};

/// `EPOLLIN | EPOLLRDNORM` (`include/uapi/linux/eventpoll.h`; bindgen cannot
/// evaluate their `__force` casts).
pub const POLL_READABLE: u32 = 0x0000_0001 | 0x0000_0040;

/// A misc device whose files can be polled.
#[vtable]
pub trait PollMiscDevice: Sized {
    /// What `open` returns and every other call borrows.
    type Ptr: ForeignOwnable + Send + Sync;

    /// What the registration keeps for `open`.
    type RegistrationData: Send + Sync;

    /// Called when the device file is opened, with the registration's data.
    fn open(file: &File, data: &Self::RegistrationData) -> Result<Self::Ptr>;

    /// Called when the last reference to the file is dropped.
    fn release(device: Self::Ptr, _file: &File) {
        drop(device);
    }

    /// An ioctl; 32-bit callers arrive here too, their argument converted
    /// by `compat_ptr`.
    fn ioctl(
        _device: <Self::Ptr as ForeignOwnable>::Borrowed<'_>,
        _file: &File,
        _cmd: u32,
        _arg: usize,
    ) -> Result<isize> {
        build_error!(VTABLE_DEFAULT_ERROR)
    }

    /// Registers the file's wait queues with `table` and returns the
    /// `EPOLL*` readiness mask.
    fn poll(
        _device: <Self::Ptr as ForeignOwnable>::Borrowed<'_>,
        _file: &File,
        _table: &PollTable<'_>,
    ) -> u32 {
        build_error!(VTABLE_DEFAULT_ERROR)
    }
}

/// A registered misc device.
///
/// # Invariants
///
/// `inner` is a registered `struct miscdevice` from `register` until drop,
/// with [`Vtable`] for `T` as its file operations.
#[pin_data(PinnedDrop)]
pub struct PollMiscRegistration<T: PollMiscDevice> {
    /// Initialized before `inner`, dropped after it is deregistered: no
    /// `open` runs without it.
    data: T::RegistrationData,
    #[pin]
    inner: Opaque<bindings::miscdevice>,
    _t: PhantomData<T>,
}

// SAFETY: `misc_deregister` may run on any thread; the data is `Send`.
unsafe impl<T: PollMiscDevice> Send for PollMiscRegistration<T> {}
// SAFETY: `&self` gives access to nothing but the data, which is `Sync`.
unsafe impl<T: PollMiscDevice> Sync for PollMiscRegistration<T> {}

impl<T: PollMiscDevice> PollMiscRegistration<T> {
    /// Registers `/dev/<name>` (dynamic minor, mode 0600); every `open`
    /// gets `data`.
    pub fn register(name: &'static CStr, data: T::RegistrationData) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            data,
            inner <- Opaque::try_ffi_init(move |slot: *mut bindings::miscdevice| {
                let mut misc: bindings::miscdevice = pin_init::zeroed();
                misc.minor = bindings::MISC_DYNAMIC_MINOR as ffi::c_int;
                misc.name = name.as_char_ptr();
                misc.fops = &Vtable::<T>::VTABLE;
                misc.mode = 0o600;
                // SAFETY: The initializer may write to `slot`.
                unsafe { slot.write(misc) };
                // SAFETY: `slot` holds a filled-in miscdevice that stays
                // pinned until `drop` deregisters it.
                // INVARIANT: On success the device is registered.
                to_result(unsafe { bindings::misc_register(slot) })
            }),
            _t: PhantomData,
        })
    }
}

#[pinned_drop]
impl<T: PollMiscDevice> PinnedDrop for PollMiscRegistration<T> {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: Registered by the type invariants.
        unsafe { bindings::misc_deregister(self.inner.get()) };
    }
}

struct Vtable<T: PollMiscDevice>(PhantomData<T>);

impl<T: PollMiscDevice> Vtable<T> {
    const VTABLE: bindings::file_operations = bindings::file_operations {
        open: Some(Self::open),
        release: Some(Self::release),
        unlocked_ioctl: if T::HAS_IOCTL {
            Some(Self::ioctl)
        } else {
            None
        },
        compat_ioctl: if T::HAS_IOCTL {
            // `None` in kernels without CONFIG_COMPAT.
            bindings::compat_ptr_ioctl
        } else {
            None
        },
        poll: if T::HAS_POLL { Some(Self::poll) } else { None },
        llseek: Some(bindings::noop_llseek),
        owner: this_module::<T::OwnerModule>().as_ptr(),
        ..pin_init::zeroed()
    };

    /// # Safety
    ///
    /// Called by the VFS for a file of this device being opened.
    unsafe extern "C" fn open(
        inode: *mut bindings::inode,
        raw_file: *mut bindings::file,
    ) -> ffi::c_int {
        // SAFETY: The pointers are valid for a file being opened.
        let ret = unsafe { bindings::generic_file_open(inode, raw_file) };
        if ret != 0 {
            return ret;
        }
        // SAFETY: `misc_open` set the private data to the `miscdevice`
        // before calling this, and keeps it registered during the call.
        let misc = unsafe { (*raw_file).private_data }.cast::<Opaque<bindings::miscdevice>>();
        // SAFETY: That `miscdevice` is the `inner` field of a
        // `PollMiscRegistration<T>` (only `register` registers one with
        // these file operations), live during the call.
        let registration = unsafe { &*kernel::container_of!(misc, PollMiscRegistration<T>, inner) };
        // SAFETY: The file is valid for the duration of `open`, with no
        // fdget_pos region active on this thread.
        let file = unsafe { File::from_raw_file(raw_file) };
        match T::open(file, &registration.data) {
            Ok(ptr) => {
                // SAFETY: `open` may set the private data; every other
                // callback reads it back as `T::Ptr`.
                unsafe { (*raw_file).private_data = ptr.into_foreign().cast() };
                0
            }
            Err(e) => e.to_errno(),
        }
    }

    /// # Safety
    ///
    /// Called by the VFS once, for a file opened by `open`.
    unsafe extern "C" fn release(
        _inode: *mut bindings::inode,
        raw_file: *mut bindings::file,
    ) -> ffi::c_int {
        // SAFETY: Release owns the private data `open` stored.
        let ptr = unsafe { T::Ptr::from_foreign((*raw_file).private_data.cast()) };
        // SAFETY: The file is valid during release.
        T::release(ptr, unsafe { File::from_raw_file(raw_file) });
        0
    }

    /// # Safety
    ///
    /// Called by the VFS between `open` and `release`.
    unsafe extern "C" fn ioctl(
        raw_file: *mut bindings::file,
        cmd: ffi::c_uint,
        arg: ffi::c_ulong,
    ) -> ffi::c_long {
        // SAFETY: Between open and release the private data may be borrowed.
        let device = unsafe { T::Ptr::borrow((*raw_file).private_data.cast()) };
        // SAFETY: The file is valid during the call.
        let file = unsafe { File::from_raw_file(raw_file) };
        match T::ioctl(device, file, cmd, arg) {
            Ok(ret) => ret as ffi::c_long,
            Err(e) => e.to_errno() as ffi::c_long,
        }
    }

    /// # Safety
    ///
    /// Called by the VFS between `open` and `release`.
    unsafe extern "C" fn poll(
        raw_file: *mut bindings::file,
        table: *mut bindings::poll_table,
    ) -> bindings::__poll_t {
        // SAFETY: Between open and release the private data may be borrowed.
        let device = unsafe { T::Ptr::borrow((*raw_file).private_data.cast()) };
        // SAFETY: The file is valid during the call.
        let file = unsafe { File::from_raw_file(raw_file) };
        // SAFETY: `table` is valid (or null) for the duration of the call.
        let table = unsafe { PollTable::from_raw(table) };
        T::poll(device, file, &table)
    }
}
