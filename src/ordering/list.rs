//! Doubly linked lists of ready keys, threaded through the keys' entries:
//! what the built-in orderings are made of.
//!
//! Appending, taking the front and taking a key out of the middle are all
//! O(1), and a list costs 16 bytes however many keys it holds: the links
//! live in each key's slot, in room the slot has anyway.

use super::{Handle, Queued};

// "No key": the end of a list, as in the queue's own links.
pub(crate) use crate::slot::NIL;

/// A ready key's place in a list of the built-in orderings: its neighbours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Links {
    prev: u32,
    next: u32,
}

impl Default for Links {
    fn default() -> Self {
        Links {
            prev: NIL,
            next: NIL,
        }
    }
}

/// An entry that holds [`Links`].
pub(crate) trait Linked: Copy {
    fn links(&self) -> &Links;
    fn links_mut(&mut self) -> &mut Links;
}

/// Implements [`Linked`] for an entry type through its `links` field.
macro_rules! linked_through_field {
    ($entry:ty) => {
        impl $crate::ordering::list::Linked for $entry {
            #[inline]
            fn links(&self) -> &$crate::ordering::Links {
                &self.links
            }
            #[inline]
            fn links_mut(&mut self) -> &mut $crate::ordering::Links {
                &mut self.links
            }
        }
    };
}
pub(crate) use linked_through_field;

impl Linked for Links {
    #[inline]
    fn links(&self) -> &Links {
        self
    }
    #[inline]
    fn links_mut(&mut self) -> &mut Links {
        self
    }
}

/// A FIFO list of ready keys.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    pub(crate) head: u32,
    tail: u32,
    pub(crate) len: usize,
}

impl Default for List {
    fn default() -> Self {
        List::EMPTY
    }
}

impl List {
    pub(crate) const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };

    /// Appends `h` at the back.
    #[inline(always)]
    pub(crate) fn push_back<K, E: Linked>(&mut self, q: &mut Queued<'_, K, E>, h: Handle) {
        let tail = self.tail;
        self.tail = h.slot();
        if tail == NIL {
            self.head = h.slot();
        } else {
            q.entry_mut(Handle::new(tail)).links_mut().next = h.slot();
        }
        self.len += 1;
        *q.entry_mut(h).links_mut() = Links {
            prev: tail,
            next: NIL,
        };
    }

    /// Takes `h`, which is in this list, out of it.
    #[inline(always)]
    pub(crate) fn unlink<K, E: Linked>(&mut self, q: &mut Queued<'_, K, E>, h: Handle) {
        let Links { prev, next } = *q.entry(h).links();
        if prev == NIL {
            self.head = next;
        } else {
            q.entry_mut(Handle::new(prev)).links_mut().next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            q.entry_mut(Handle::new(next)).links_mut().prev = prev;
        }
        self.len -= 1;
    }

    /// Takes the front key.
    #[inline(always)]
    pub(crate) fn pop_front<K, E: Linked>(&mut self, q: &mut Queued<'_, K, E>) -> Option<Handle> {
        let head = self.head;
        if head == NIL {
            return None;
        }
        let h = Handle::new(head);
        self.unlink(q, h);
        Some(h)
    }

    /// The front key, and a prefetch hint for the one after it.
    #[inline]
    pub(crate) fn peek_and_prefetch<K, E: Linked>(&self, q: &Queued<'_, K, E>) -> Option<Handle> {
        if self.head == NIL {
            return None;
        }
        let h = Handle::new(self.head);
        let after = q.entry(h).links().next;
        if after != NIL {
            q.prefetch(Handle::new(after));
        }
        Some(h)
    }
}
