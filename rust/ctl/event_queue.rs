// SPDX-License-Identifier: GPL-2.0

//! [`EventQueue`]: events not yet read, oldest first: a file's, and a
//! synchronous listener's connection requests.
//!
//! A vector read from a moving front, whose events a destroyed id takes
//! with it are discarded in place: taking the oldest event, and discarding
//! some, moves none of the others.  (`KVec::remove(0)` moved all of them,
//! 320 bytes each, on every `GET_EVENT`, and `KVec::retain` those behind
//! a destroyed id's: with a thousand connections set up, or destroyed, at
//! once, the cost per connection grew with their number.)  The read and
//! discarded slots are reclaimed when the queue empties, or when they are
//! at least half the vector and room is needed.

use crate::abi;
use kernel::prelude::*;

#[derive(Default)]
pub(crate) struct EventQueue {
    /// From `head` on, the unread events, oldest first; `None` for one
    /// discarded in place.
    buf: KVec<Option<abi::Event>>,
    /// The oldest unread slot's index; those before it were read.
    head: usize,
    /// The events from `head` on (the `Some`s).
    live: usize,
}

impl EventQueue {
    pub(crate) fn new() -> Self {
        Self {
            buf: KVec::new(),
            head: 0,
            live: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Room for `n` more events, so that as many pushes do not allocate.
    pub(crate) fn reserve(&mut self, n: usize) -> Result {
        if (self.buf.len() - self.live) * 2 >= self.buf.len() {
            self.compact();
        }
        Ok(self.buf.reserve(n, GFP_KERNEL)?)
    }

    /// Appends an event in reserved room (what was read or discarded makes
    /// room too); `ENOMEM` without room.
    pub(crate) fn push_within_capacity(&mut self, event: abi::Event) -> Result {
        if self.buf.len() == self.buf.capacity() {
            self.compact();
        }
        self.buf
            .push_within_capacity(Some(event))
            .map_err(|_| ENOMEM)?;
        self.live += 1;
        Ok(())
    }

    /// Takes the oldest event.
    pub(crate) fn pop_front(&mut self) -> Option<abi::Event> {
        let mut event = None;
        while event.is_none() && self.head < self.buf.len() {
            event = self.buf[self.head].take();
            self.head += 1;
        }
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        }
        if event.is_some() {
            self.live -= 1;
        }
        event
    }

    /// Puts back an event taken by [`Self::pop_front`], as the oldest, in
    /// room its caller kept reserved.
    pub(crate) fn push_front_within_capacity(&mut self, event: abi::Event) -> Result {
        if self.head > 0 {
            self.head -= 1;
            self.buf[self.head] = Some(event);
        } else {
            self.buf
                .insert_within_capacity(0, Some(event))
                .map_err(|_| ENOMEM)?;
        }
        self.live += 1;
        Ok(())
    }

    /// The unread events, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &abi::Event> {
        self.buf[self.head..].iter().flatten()
    }

    /// Discards the events `gone` says yes to, in place.
    pub(crate) fn discard(&mut self, mut gone: impl FnMut(&abi::Event) -> bool) {
        for slot in self.buf[self.head..].iter_mut() {
            if slot.as_ref().is_some_and(&mut gone) {
                *slot = None;
                self.live -= 1;
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.buf.clear();
        self.head = 0;
        self.live = 0;
    }

    /// Moves the unread events, in order, to the front of the vector.
    fn compact(&mut self) {
        if self.live == self.buf.len() {
            return;
        }
        let mut to = 0;
        for from in self.head..self.buf.len() {
            if let Some(event) = self.buf[from].take() {
                self.buf[to] = Some(event);
                to += 1;
            }
        }
        self.buf.truncate(to);
        self.head = 0;
    }
}
