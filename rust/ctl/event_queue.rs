// SPDX-License-Identifier: GPL-2.0

//! [`EventQueue`]: events not yet read, oldest first: a file's, and a
//! synchronous listener's connection requests.
//!
//! A vector read from a moving front: taking the oldest event costs the
//! same however many wait behind it.  (`KVec::remove(0)` moved all of
//! them, 320 bytes each, on every `GET_EVENT`: with a thousand
//! connections being set up at once, the setup's cost per connection grew
//! with their number.)  The read part is reclaimed when the queue
//! empties, or when it is at least half the vector and room is needed.

use crate::abi;
use kernel::prelude::*;

#[derive(Default)]
pub(crate) struct EventQueue {
    buf: KVec<abi::Event>,
    /// The oldest unread event's index; those before it were read.
    head: usize,
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        Self {
            buf: KVec::new(),
            head: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.buf.len() - self.head
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Room for `n` more events, so that as many pushes do not allocate.
    pub(crate) fn reserve(&mut self, n: usize) -> Result {
        if self.head > 0 && self.head * 2 >= self.buf.len() {
            self.compact();
        }
        Ok(self.buf.reserve(n, GFP_KERNEL)?)
    }

    /// Appends an event in reserved room (what was read makes room too);
    /// `ENOMEM` without room.
    pub(crate) fn push_within_capacity(&mut self, event: abi::Event) -> Result {
        if self.buf.len() == self.buf.capacity() {
            self.compact();
        }
        self.buf.push_within_capacity(event).map_err(|_| ENOMEM)
    }

    /// Takes the oldest event.
    pub(crate) fn pop_front(&mut self) -> Option<abi::Event> {
        let event = *self.buf.get(self.head)?;
        self.head += 1;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        }
        Some(event)
    }

    /// Puts back an event taken by [`Self::pop_front`], as the oldest, in
    /// room its caller kept reserved.
    pub(crate) fn push_front_within_capacity(&mut self, event: abi::Event) -> Result {
        if self.head > 0 {
            self.head -= 1;
            self.buf[self.head] = event;
            return Ok(());
        }
        self.buf
            .insert_within_capacity(0, event)
            .map_err(|_| ENOMEM)
    }

    /// The unread events, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &abi::Event> {
        self.buf[self.head..].iter()
    }

    /// Keeps the events `keep` says yes to.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&mut abi::Event) -> bool) {
        self.compact();
        self.buf.retain(keep);
    }

    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
    }

    /// Moves the unread events to the front of the vector.
    fn compact(&mut self) {
        if self.head == 0 {
            return;
        }
        let unread = self.len();
        self.buf.as_mut_slice().copy_within(self.head.., 0);
        self.buf.truncate(unread);
        self.head = 0;
    }
}
