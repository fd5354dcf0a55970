// SPDX-License-Identifier: GPL-2.0

//! The target's configfs directory, `/sys/kernel/config/rdma_cm_rs_nvmet/`
//! (kernels with `CONFIG_CONFIGFS_FS`):
//!
//! * `addr_traddr`: the address the port listens on, a numeric IPv4 or
//!   IPv6 address or a host name, resolved by `rdma_getaddrinfo` with
//!   `RAI_PASSIVE`; empty for every address (the default);
//! * `subsysnqn`: the subsystem's NQN;
//! * `enable`: 1 while the port listens (from the module's load).
//!
//! As with nvmet's ports, the address and the NQN change only while the
//! port is disabled (`EBUSY` otherwise); disabling it disconnects every
//! host.

use crate::port::Port;
use kernel::{configfs, configfs_attrs, page::PAGE_SIZE, prelude::*, sync::Arc};

/// The directory's data: the port.
pub(crate) struct Settings {
    port: Arc<Port>,
}

/// Registers the directory.
pub(crate) fn subsystem(port: Arc<Port>) -> impl PinInit<configfs::Subsystem<Settings>, Error> {
    let item_type = configfs_attrs! {
        container: configfs::Subsystem<Settings>,
        data: Settings,
        attributes: [
            addr_traddr: 0,
            subsysnqn: 1,
            enable: 2,
        ],
    };
    configfs::Subsystem::new(c"rdma_cm_rs_nvmet", item_type, Ok(Settings { port }))
}

/// A written value without its trailing newline.
fn value(page: &[u8]) -> &[u8] {
    page.strip_suffix(b"\n").unwrap_or(page)
}

/// `value` then a newline into `page`.
fn show_line(page: &mut [u8; PAGE_SIZE], fill: impl FnOnce(&mut [u8]) -> usize) -> usize {
    let n = fill(&mut page[..PAGE_SIZE - 1]);
    page[n] = b'\n';
    n + 1
}

#[vtable]
impl configfs::AttributeOperations<0> for Settings {
    type Data = Settings;

    fn show(s: &Settings, page: &mut [u8; PAGE_SIZE]) -> Result<usize> {
        Ok(show_line(page, |out| s.port.traddr(out)))
    }

    fn store(s: &Settings, page: &[u8]) -> Result {
        s.port.set_traddr(value(page))
    }
}

#[vtable]
impl configfs::AttributeOperations<1> for Settings {
    type Data = Settings;

    fn show(s: &Settings, page: &mut [u8; PAGE_SIZE]) -> Result<usize> {
        Ok(show_line(page, |out| s.port.nqn(out)))
    }

    fn store(s: &Settings, page: &[u8]) -> Result {
        s.port.set_nqn(value(page))
    }
}

#[vtable]
impl configfs::AttributeOperations<2> for Settings {
    type Data = Settings;

    fn show(s: &Settings, page: &mut [u8; PAGE_SIZE]) -> Result<usize> {
        Ok(show_line(page, |out| {
            out[0] = if s.port.enabled() { b'1' } else { b'0' };
            1
        }))
    }

    fn store(s: &Settings, page: &[u8]) -> Result {
        match value(page) {
            b"1" => s.port.enable(),
            b"0" => {
                s.port.disable();
                Ok(())
            }
            _ => Err(EINVAL),
        }
    }
}
