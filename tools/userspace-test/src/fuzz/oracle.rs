// SPDX-License-Identifier: GPL-2.0

//! The oracle: which errnos the ABI allows for each command, and their names.

#[allow(unused_imports)]
use super::*;

// ---------------------------------------------------------------------------
// The oracle.

/// Errnos any command may return: the ABI's own and what the CM passes up.
pub(super) const ALLOWED: &[i32] = &[
    libc::EINVAL,
    libc::EFAULT,
    libc::ENOTTY,
    libc::ENOENT,
    libc::ENOTCONN,
    libc::EAGAIN,
    libc::ETIMEDOUT,
    libc::EOPNOTSUPP,
    libc::EBUSY,
    libc::EMSGSIZE,
    libc::ENOSPC,
    libc::EADDRINUSE,
    libc::EADDRNOTAVAIL,
    libc::ECONNREFUSED,
    libc::EACCES,
    libc::ECANCELED,
    libc::EHOSTUNREACH,
    libc::ENETUNREACH,
    libc::EXDEV,
    libc::ENODEV,
    libc::EMFILE,
    libc::ENOMEM,
    libc::EAFNOSUPPORT,
    libc::EISCONN,
    libc::EALREADY,
    libc::ENODATA,
    libc::EPROTONOSUPPORT,
    libc::ECONNRESET,
    libc::ENOBUFS,
];

/// `signalled`: another thread signalled the caller during the call, which
/// ends an interruptible wait with `EINTR` (the module's `ERESTARTSYS`, not
/// restarted: the handler has no `SA_RESTART`); nothing else may answer
/// `EINTR`.
pub(super) fn errno_ok(cmd: Cmd, e: i32, signalled: bool) -> bool {
    ALLOWED.contains(&e)
        || (e == libc::EIO && cmd.may_eio())
        || (e == libc::EINTR && signalled && cmd.may_block())
}

/// `None` if the result is what the ABI allows, else why not.
pub(super) fn judge(
    cmd: Cmd,
    expect: Expect,
    r: std::result::Result<(), i32>,
    signalled: bool,
) -> Option<String> {
    match (expect, r) {
        (Expect::Enotty, Err(libc::ENOTTY))
        | (Expect::Efault, Err(libc::EFAULT))
        | (Expect::Einval, Err(libc::EINVAL))
        | (Expect::Eopnotsupp, Err(libc::EOPNOTSUPP | libc::ENOENT))
        | (Expect::Enotconn, Err(libc::ENOTCONN | libc::ENOENT))
        | (Expect::Emsgsize, Err(libc::EMSGSIZE | libc::ENOTCONN | libc::ENOENT)) => None,
        (
            Expect::Enotty
            | Expect::Efault
            | Expect::Einval
            | Expect::Eopnotsupp
            | Expect::Enotconn
            | Expect::Emsgsize,
            r,
        ) => Some(format!(
            "{}: expected {}, got {}",
            cmd.name(),
            expect.name(),
            show_result(r)
        )),
        (Expect::Any, Ok(())) => None,
        (Expect::Fail, Ok(())) => Some(format!(
            "{}: succeeded where the ABI requires a failure",
            cmd.name()
        )),
        (_, Err(e)) if errno_ok(cmd, e, signalled) => None,
        (_, Err(e)) => Some(format!(
            "{}: errno {} is not allowed",
            cmd.name(),
            errno_name(e)
        )),
    }
}

pub(super) fn show_result(r: std::result::Result<(), i32>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => errno_name(e),
    }
}

pub fn errno_name(e: i32) -> String {
    let name = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::ENODEV => "ENODEV",
        libc::EXDEV => "EXDEV",
        libc::EINVAL => "EINVAL",
        libc::EMFILE => "EMFILE",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::ENODATA => "ENODATA",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EPROTONOSUPPORT => "EPROTONOSUPPORT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EAFNOSUPPORT => "EAFNOSUPPORT",
        libc::EADDRINUSE => "EADDRINUSE",
        libc::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        libc::ENETUNREACH => "ENETUNREACH",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOBUFS => "ENOBUFS",
        libc::EISCONN => "EISCONN",
        libc::ENOTCONN => "ENOTCONN",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::EHOSTUNREACH => "EHOSTUNREACH",
        libc::EALREADY => "EALREADY",
        libc::ECANCELED => "ECANCELED",
        _ => return format!("errno{e}"),
    };
    name.into()
}
