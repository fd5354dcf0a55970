// SPDX-License-Identifier: GPL-2.0

//! The NVM command set on an I/O queue: Read, Write, Flush and Write
//! Zeroes on the RAM namespace (nsid 1), with their field checks.

use super::ctrl::{Data, Outcome, Subsystem, Transfer};
use super::wire::{opcode, status, Sqe, LBA_SHIFT};

/// The only namespace.
const NSID: u32 = 1;

/// The blocks of a Read, Write or Write Zeroes: (slba, nlb), checked
/// against the namespace.
fn range(subsys: &Subsystem, sqe: &Sqe) -> core::result::Result<(u64, u64), u16> {
    if sqe.nsid() != NSID {
        return Err(status::INVALID_NS | status::DNR);
    }
    let (slba, nlb) = (sqe.u64_at(40), u64::from(sqe.u16_at(48)) + 1);
    if !subsys.ns.contains(slba, nlb) {
        return Err(status::LBA_RANGE | status::DNR);
    }
    Ok((slba, nlb))
}

/// See [`Subsystem::transfer`].
pub(crate) fn transfer(subsys: &Subsystem, sqe: &Sqe) -> core::result::Result<Transfer, u16> {
    match sqe.opcode() {
        op @ (opcode::READ | opcode::WRITE) => {
            let (_, nlb) = range(subsys, sqe)?;
            let len = nlb << LBA_SHIFT;
            // Beyond MDTS (pages of 4 KiB).
            if len > 4096u64 << subsys.limits.mdts {
                return Err(status::INVALID_FIELD | status::DNR);
            }
            let len = len as u32;
            Ok(if op == opcode::READ {
                Transfer::Out(len)
            } else {
                Transfer::In(len)
            })
        }
        opcode::WRITE_ZEROES => range(subsys, sqe).map(|_| Transfer::None),
        opcode::FLUSH if sqe.nsid() == NSID || sqe.nsid() == 0xffff_ffff => Ok(Transfer::None),
        opcode::FLUSH => Err(status::INVALID_NS | status::DNR),
        _ => Err(status::INVALID_OPCODE | status::DNR),
    }
}

/// See [`Subsystem::execute`].
pub(crate) fn execute(subsys: &Subsystem, sqe: &Sqe, data: Data<'_>) -> Outcome {
    let (slba, nlb) = match sqe.opcode() {
        // RAM: nothing to flush.
        opcode::FLUSH => return Outcome::ok(0),
        _ => match range(subsys, sqe) {
            Ok(r) => r,
            Err(s) => return Outcome::fail(s),
        },
    };
    let len = (nlb << LBA_SHIFT) as usize;
    let done = match (sqe.opcode(), data) {
        (opcode::READ, Data::Out(buf)) => subsys.ns.read_into(slba, buf, len),
        (opcode::WRITE, Data::In(buf, off)) => subsys.ns.write_from(slba, buf, off, len),
        (opcode::WRITE_ZEROES, Data::None) => subsys.ns.zero(slba, nlb),
        _ => return Outcome::fail(status::SGL_INVALID_DATA | status::DNR),
    };
    match done {
        Ok(()) => Outcome::ok(0),
        Err(_) => Outcome::fail(status::INTERNAL),
    }
}
