// SPDX-License-Identifier: GPL-2.0

//! [`PostError`]: a post that was refused, with what it was to post.

use core::fmt;
use kernel::prelude::*;

/// A refused post: why, and what was to be posted, back with its owner (as
/// `kernel::xarray::StoreError` hands back the value it could not store).
/// It converts to its [`Error`], so `?` works where the value is not
/// wanted.
pub struct PostError<T> {
    /// Why the post was refused.
    pub error: Error,
    /// What was to be posted.
    pub value: T,
}

impl<T> PostError<T> {
    pub(super) fn new(error: Error, value: T) -> Self {
        Self { error, value }
    }
}

impl<T> From<PostError<T>> for Error {
    fn from(e: PostError<T>) -> Self {
        e.error
    }
}

impl<T> fmt::Debug for PostError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}
