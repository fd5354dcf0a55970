// SPDX-License-Identifier: GPL-2.0

//! KUnit: IB clients, device events and capabilities.

use super::fixture::owner;
use super::{skip_without_devices, wait_until};
use kernel::prelude::*;

#[kunit_tests(rdma_cm_rs_client)]
mod client_tests {
    use super::{owner, wait_until};
    use crate::rdma::{
        async_event::{AsyncEventHandler, AsyncEventRegistration, DeviceEvent},
        client::{Client, ClientRegistration},
        device::{Device, Transport},
        owner::Owner,
        pd::Pd,
    };
    use core::sync::atomic::{AtomicUsize, Ordering};
    use kernel::{
        new_mutex,
        prelude::*,
        sync::{aref::ARef, Arc, Mutex},
        time::{delay::fsleep, Delta},
    };

    /// What the test client saw.
    #[derive(Default)]
    struct Seen {
        added: AtomicUsize,
        removed: AtomicUsize,
        rxe: AtomicUsize,
        siw: AtomicUsize,
        /// A `remove` whose data was not the device's own.
        mixed_up: AtomicUsize,
    }

    /// A ULP's per-device state, as every ULP keeps it: the device and one
    /// PD on it.
    struct PerDevice {
        dev: ARef<Device>,
        _pd: Arc<Pd>,
    }

    struct TestClient(Arc<Seen>, Owner);

    crate::rdma_client_slot!(TestClient);

    impl Client for TestClient {
        type DeviceData = PerDevice;
        const NAME: &'static CStr = c"rdma_cm_rs_kunit";
        fn add(&self, dev: &ARef<Device>) -> Result<PerDevice> {
            let pd = Pd::alloc(&self.1, dev)?;
            let name = dev.name();
            if name.as_bytes().starts_with(b"rxe") {
                self.0.rxe.fetch_add(1, Ordering::AcqRel);
            } else if name.as_bytes().starts_with(b"siw") {
                self.0.siw.fetch_add(1, Ordering::AcqRel);
            }
            self.0.added.fetch_add(1, Ordering::AcqRel);
            Ok(PerDevice {
                dev: dev.clone(),
                _pd: pd,
            })
        }

        fn remove(&self, dev: &Device, data: Arc<PerDevice>) {
            if !data.dev.same(dev) {
                self.0.mixed_up.fetch_add(1, Ordering::AcqRel);
            }
            self.0.removed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Registering runs `add` for every device there is (the test bed has
    /// rxe0 and siw0), each with a PD of its own; dropping the registration
    /// gives every device's data back to `remove`, with its own device, once.
    #[test]
    fn client_sees_every_device_and_gives_each_back() {
        let owner = owner();
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let reg = KBox::pin_init(
            ClientRegistration::new(&owner, TestClient(seen.clone(), owner.owner().clone())),
            GFP_KERNEL,
        );
        let added_while_registered = seen.added.load(Ordering::Acquire);
        let removed_while_registered = seen.removed.load(Ordering::Acquire);
        let (rxe, siw) = (
            seen.rxe.load(Ordering::Acquire),
            seen.siw.load(Ordering::Acquire),
        );
        let registered = reg.is_ok();
        drop(reg);
        assert!(registered);
        if rxe == 0 || siw == 0 {
            super::skip_without_devices(ENODEV);
            return;
        }
        assert_eq!((rxe, siw), (1, 1));
        assert_eq!(removed_while_registered, 0);
        assert_eq!(seen.removed.load(Ordering::Acquire), added_while_registered);
        assert_eq!(seen.mixed_up.load(Ordering::Acquire), 0);
    }

    /// The C `add` callback names no client: one registration of a type at
    /// a time, a second is refused before it reaches the IB core, and the
    /// first keeps working.
    #[test]
    fn second_registration_of_a_type_is_busy() {
        let owner = owner();
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let first = KBox::pin_init(
            ClientRegistration::new(&owner, TestClient(seen.clone(), owner.owner().clone())),
            GFP_KERNEL,
        );
        let second = KBox::pin_init(
            ClientRegistration::new(&owner, TestClient(seen.clone(), owner.owner().clone())),
            GFP_KERNEL,
        );
        let second_err = second.as_ref().err().copied();
        let added = seen.added.load(Ordering::Acquire);
        drop(second);
        let first_ok = first.is_ok();
        drop(first);
        let removed = seen.removed.load(Ordering::Acquire);
        // A third, after both are gone, registers again.
        let third = KBox::pin_init(
            ClientRegistration::new(&owner, TestClient(seen.clone(), owner.owner().clone())),
            GFP_KERNEL,
        );
        let third_ok = third.is_ok();
        drop(third);
        assert!(first_ok);
        assert_eq!(second_err, Some(EBUSY));
        assert_eq!(removed, added);
        assert!(third_ok);
    }

    /// A client that takes rxe and refuses every other device, and keeps
    /// every device it was offered.
    struct RxeOnly {
        seen: Arc<Seen>,
        offered: Arc<Mutex<KVec<ARef<Device>>>>,
        owner: Owner,
    }

    crate::rdma_client_slot!(RxeOnly);

    impl Client for RxeOnly {
        type DeviceData = PerDevice;
        const NAME: &'static CStr = c"rdma_cm_rs_kunit_rxe_only";
        fn add(&self, dev: &ARef<Device>) -> Result<PerDevice> {
            self.offered.lock().push(dev.clone(), GFP_KERNEL)?;
            if !dev.name().as_bytes().starts_with(b"rxe") {
                self.seen.siw.fetch_add(1, Ordering::AcqRel);
                return Err(EOPNOTSUPP);
            }
            self.seen.rxe.fetch_add(1, Ordering::AcqRel);
            self.seen.added.fetch_add(1, Ordering::AcqRel);
            Ok(PerDevice {
                dev: dev.clone(),
                _pd: Pd::alloc(&self.owner, dev)?,
            })
        }

        fn remove(&self, dev: &Device, data: Arc<PerDevice>) {
            if !data.dev.same(dev) {
                self.seen.mixed_up.fetch_add(1, Ordering::AcqRel);
            }
            self.seen.removed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// `device_data` finds what `add` returned for a device, the same
    /// object every time, and nothing for a device whose `add` failed; a
    /// failed `add` gets no `remove`, and a clone taken before the
    /// registration went outlives it.
    #[test]
    fn device_data_is_found_by_device_until_remove() {
        let owner = owner();
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let offered = Arc::pin_init(new_mutex!(KVec::new()), GFP_KERNEL).unwrap();
        let reg = KBox::pin_init(
            ClientRegistration::new(
                &owner,
                RxeOnly {
                    seen: seen.clone(),
                    offered: offered.clone(),
                    owner: owner.owner().clone(),
                },
            ),
            GFP_KERNEL,
        )
        .unwrap();
        let devices = core::mem::take(&mut *offered.lock());
        let (mut found, mut same_twice, mut found_refused) = (0, 0, 0);
        let mut kept = None;
        for dev in devices.iter() {
            let first = reg.device_data(dev);
            let second = reg.device_data(dev);
            match (&first, &second) {
                (Some(a), Some(b)) => {
                    found += usize::from(a.dev.same(dev));
                    same_twice += usize::from(core::ptr::eq(&**a, &**b));
                }
                (None, None) => {}
                _ => found_refused += 100,
            }
            if !dev.name().as_bytes().starts_with(b"rxe") && first.is_some() {
                found_refused += 1;
            }
            if kept.is_none() {
                kept = first;
            }
        }
        let added = seen.added.load(Ordering::Acquire);
        drop(reg);
        if seen.rxe.load(Ordering::Acquire) == 0 || seen.siw.load(Ordering::Acquire) == 0 {
            super::skip_without_devices(ENODEV);
            return;
        }
        assert_eq!((found, same_twice, found_refused), (added, added, 0));
        // Every device was offered, rxe taken: remove came for it alone.
        assert_eq!(seen.removed.load(Ordering::Acquire), added);
        assert_eq!(seen.mixed_up.load(Ordering::Acquire), 0);
        // The clone is still good after its `remove`: its PD lives on.
        let kept = kept.expect("rxe's data was found");
        assert!(kept.dev.name().as_bytes().starts_with(b"rxe"));
        drop(kept);
        drop(devices);
    }

    /// Counts the events of its device.
    struct CountEvents {
        sm_changes_on_port_1: AtomicUsize,
        others: AtomicUsize,
    }

    impl AsyncEventHandler for CountEvents {
        fn event(&self, _dev: &Device, event: DeviceEvent) {
            if event == DeviceEvent::SmChange(1) {
                self.sm_changes_on_port_1.fetch_add(1, Ordering::AcqRel);
            } else {
                self.others.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Has the IB core deliver an `IB_EVENT_SM_CHANGE` of port 1 of `dev`,
    /// as a driver would (no other handler acts on it for rxe: the SA and
    /// multicast clients are IB-only, and KUnit runs before user space has
    /// a verbs context).
    fn dispatch_sm_change(dev: &Device) {
        let mut event: crate::rdma::bindings::ib_event = pin_init::zeroed();
        event.device = dev.as_ptr();
        event.element.port_num = 1;
        event.event = crate::rdma::bindings::ib_event_type_IB_EVENT_SM_CHANGE;
        // SAFETY: `event` names a registered device (the caller holds it)
        // and a port of it; `ib_dispatch_event` copies it into a work item
        // (GFP_ATOMIC) before it returns.
        unsafe { crate::rdma::bindings::ib_dispatch_event(&event) };
    }

    /// rxe0, as an IB client is offered it.
    fn rxe_device() -> Option<ARef<Device>> {
        let owner = owner();
        let seen = Arc::new(Seen::default(), GFP_KERNEL).ok()?;
        let offered = Arc::pin_init(new_mutex!(KVec::new()), GFP_KERNEL).ok()?;
        let reg = KBox::pin_init(
            ClientRegistration::new(
                &owner,
                RxeOnly {
                    seen,
                    offered: offered.clone(),
                    owner: owner.owner().clone(),
                },
            ),
            GFP_KERNEL,
        )
        .ok()?;
        drop(reg);
        let devices = core::mem::take(&mut *offered.lock());
        devices
            .into_iter()
            .find(|d| d.name().as_bytes().starts_with(b"rxe"))
    }

    /// A registered handler gets the device's events, on its workqueue; once
    /// the registration is dropped, none.
    #[test]
    fn device_events_reach_the_handler_until_dropped() {
        let owner = owner();
        let Some(rxe) = rxe_device() else {
            super::skip_without_devices(ENODEV);
            return;
        };
        let events = AsyncEventRegistration::new(
            &owner,
            &rxe,
            CountEvents {
                sm_changes_on_port_1: AtomicUsize::new(0),
                others: AtomicUsize::new(0),
            },
        )
        .unwrap();
        assert!(events.device().same(&rxe));
        dispatch_sm_change(&rxe);
        let delivered = wait_until(|| {
            events
                .handler()
                .sm_changes_on_port_1
                .load(Ordering::Acquire)
                == 1
        });
        let others = events.handler().others.load(Ordering::Acquire);
        drop(events);
        // Dropped: a later event finds no handler of ours (the registration
        // and its counters are gone; KASAN would report a call into them).
        dispatch_sm_change(&rxe);
        fsleep(Delta::from_millis(300));
        assert!(delivered);
        assert_eq!(others, 0);
    }

    /// What [`DropsItself`] saw.
    #[derive(Default)]
    struct SelfSeen {
        events: AtomicUsize,
        new_refused: AtomicUsize,
    }

    /// A handler that drops its own registration from its first event, and
    /// tries to make another there.
    struct DropsItself {
        slot: Arc<Mutex<Option<AsyncEventRegistration<DropsItself>>>>,
        seen: Arc<SelfSeen>,
        owner: Owner,
    }

    impl AsyncEventHandler for DropsItself {
        fn event(&self, dev: &Device, _event: DeviceEvent) {
            self.seen.events.fetch_add(1, Ordering::AcqRel);
            let dev: ARef<Device> = dev.into();
            let nested = AsyncEventRegistration::new(
                &self.owner,
                &dev,
                CountEvents {
                    sm_changes_on_port_1: AtomicUsize::new(0),
                    others: AtomicUsize::new(0),
                },
            );
            if nested.err() == Some(EDEADLK) {
                self.seen.new_refused.fetch_add(1, Ordering::AcqRel);
            }
            // Unregistering here would wait for the lock this runs under:
            // the drop defers it.
            let own = self.slot.lock().take();
            drop(own);
        }
    }

    /// A registration dropped inside its own handler is unregistered from
    /// the module's queue instead of deadlocking on the device's handler
    /// lock, and a registration made there is refused (`EDEADLK`).
    #[test]
    fn registration_dropped_in_its_handler_is_deferred() {
        let owner = owner();
        let Some(rxe) = rxe_device() else {
            super::skip_without_devices(ENODEV);
            return;
        };
        let slot = Arc::pin_init(new_mutex!(None), GFP_KERNEL).unwrap();
        let self_seen = Arc::new(SelfSeen::default(), GFP_KERNEL).unwrap();
        let registration = AsyncEventRegistration::new(
            &owner,
            &rxe,
            DropsItself {
                slot: slot.clone(),
                seen: self_seen.clone(),
                owner: owner.owner().clone(),
            },
        )
        .unwrap();
        *slot.lock() = Some(registration);
        dispatch_sm_change(&rxe);
        let handled = wait_until(|| self_seen.events.load(Ordering::Acquire) == 1);
        // The deferred unregistration has run once this returns.
        let flushed = owner.flush();
        dispatch_sm_change(&rxe);
        fsleep(Delta::from_millis(300));
        // Breaks the cycle if the handler never ran.
        let left = slot.lock().take();
        let was_left = left.is_some();
        drop(left);
        assert!(handled);
        assert!(flushed.is_ok());
        assert!(!was_left);
        assert_eq!(self_seen.events.load(Ordering::Acquire), 1);
        assert_eq!(self_seen.new_refused.load(Ordering::Acquire), 1);
    }

    /// The capabilities are the drivers' own: rxe is RoCE with fast
    /// registration and SRQs; siw is iWARP with fast registration.
    #[test]
    fn device_caps_are_the_drivers() {
        let owner = owner();
        let seen = Arc::new(Seen::default(), GFP_KERNEL).unwrap();
        let reg = KBox::pin_init(
            ClientRegistration::new(&owner, CapsClient(seen.clone())),
            GFP_KERNEL,
        );
        let ok = reg.is_ok();
        drop(reg);
        assert!(ok);
        if seen.rxe.load(Ordering::Acquire) == 0 || seen.siw.load(Ordering::Acquire) == 0 {
            super::skip_without_devices(ENODEV);
            return;
        }
        // `CapsClient::add` counted a device only if its caps were right.
        assert_eq!(seen.mixed_up.load(Ordering::Acquire), 0);
    }

    /// Checks each device's capabilities in `add`; a wrong one counts as
    /// mixed up.
    struct CapsClient(Arc<Seen>);

    crate::rdma_client_slot!(CapsClient);

    impl Client for CapsClient {
        type DeviceData = ();
        const NAME: &'static CStr = c"rdma_cm_rs_kunit_caps";
        fn add(&self, dev: &ARef<Device>) -> Result {
            let c = dev.caps();
            let name = dev.name();
            let sane = c.max_qp > 0
                && c.max_qp_wr > 0
                && c.max_send_sge > 0
                && c.max_recv_sge > 0
                && c.max_cqe > 0
                && c.max_pd > 0
                && c.fast_registration
                && c.max_fast_reg_page_list_len > 0;
            let right = if name.as_bytes().starts_with(b"rxe") {
                self.0.rxe.fetch_add(1, Ordering::AcqRel);
                c.transport == Transport::Ib && c.max_srq > 0 && c.max_srq_wr > 0
            } else if name.as_bytes().starts_with(b"siw") {
                self.0.siw.fetch_add(1, Ordering::AcqRel);
                c.transport == Transport::Iwarp
            } else {
                true
            };
            // One port, 1, on both; its protocol and CM the transport's.
            let ports = dev.ports();
            let port_sane = *ports.start() == 1
                && *ports.end() == 1
                && dev.port_caps(0) == Err(EINVAL)
                && dev.port_caps(2) == Err(EINVAL)
                && dev.rw_mr_factor(2, 1) == Err(EINVAL);
            // The R/W API's factor: rxe moves 32 SGEs a READ (`max_sge_rd`)
            // without registering; siw registers 256 pages an MR.
            let factor_right = if name.as_bytes().starts_with(b"rxe") {
                dev.rw_mr_factor(1, 32) == Ok(1) && dev.rw_mr_factor(1, 64) == Ok(2)
            } else if name.as_bytes().starts_with(b"siw") {
                dev.rw_mr_factor(1, 256) == Ok(1) && dev.rw_mr_factor(1, 257) == Ok(2)
            } else {
                true
            };
            let port_right = match dev.port_caps(1) {
                Ok(p) if name.as_bytes().starts_with(b"rxe") => {
                    p.protocol_roce_udp_encap()
                        && p.protocol_roce()
                        && p.ib_or_roce()
                        && !p.protocol_ib()
                        && p.cap_ib_cm()
                        && !p.cap_iw_cm()
                        && p.cap_eth_ah()
                        && p.grh_required()
                        && !p.cap_read_inv()
                }
                Ok(p) if name.as_bytes().starts_with(b"siw") => {
                    p.protocol_iwarp()
                        && !p.ib_or_roce()
                        && p.cap_iw_cm()
                        && !p.cap_ib_cm()
                        && !p.cap_ib_mad()
                        && !p.grh_required()
                        && p.cap_read_inv()
                }
                Ok(_) => true,
                Err(_) => false,
            };
            if !(sane && right && port_sane && port_right && factor_right) {
                self.0.mixed_up.fetch_add(1, Ordering::AcqRel);
            }
            Ok(())
        }
    }
}
