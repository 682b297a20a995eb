//! The per-core table of requests in flight.
//!
//! Owns: a generation-checked slab of [`Entry`] (request machine, sealed datagram bytes,
//! completion slot, timer handle, source socket), the O(1) routing of a response by the
//! slab index and generation that the core writes into bytes 0..5 of the unique id
//! (masked with a per-core random value; the remaining bytes stay random and v4-shaped),
//! and the pool of large datagram buffers.
//! Must not touch: sockets, clocks, the completion protocol; capacity is fixed at start
//! so the steady state never allocates.

use std::time::Instant;

use super::wheel::TimerHandle;
use crate::machine::RequestMachine;
use crate::wire::MAX_DATAGRAM;

/// Datagram bytes stored inline in an entry; larger datagrams use a pooled buffer.
pub(crate) const DGRAM_INLINE: usize = 160;

/// Offset of the unique id in a datagram (tenant TLV offset 12).
const UID_OFF: usize = 12;

/// The sealed request datagram (identical for every send).
pub(crate) enum Dgram {
    Inline {
        len: u16,
        bytes: [u8; DGRAM_INLINE],
    },
    Pooled {
        len: u16,
        buf: Box<[u8; MAX_DATAGRAM]>,
    },
}

impl Dgram {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Dgram::Inline { len, bytes } => &bytes[..*len as usize],
            Dgram::Pooled { len, buf } => &buf[..*len as usize],
        }
    }

    pub(crate) fn unique_id(&self) -> &[u8] {
        &self.as_slice()[UID_OFF..UID_OFF + 16]
    }
}

/// One request in flight.
pub(crate) struct Entry {
    pub machine: RequestMachine,
    pub submitted: Instant,
    pub timer: Option<(TimerHandle, Instant)>,
    pub slot: u32,
    pub sock: u32,
    pub dgram: Dgram,
}

struct Cell {
    generation: u32,
    entry: Option<Entry>,
}

/// Key of an entry: slab index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub idx: u32,
    pub generation: u32,
}

/// Largest in-flight limit (index must fit 24 bits of the unique id).
pub(crate) const MAX_IN_FLIGHT: usize = 1 << 24;

impl Key {
    /// Packs the key with an endpoint index into a send tag.
    pub(crate) fn tag(self, endpoint: usize) -> u64 {
        (self.idx as u64) | ((self.generation as u64) << 24) | ((endpoint as u64 & 0xFF) << 56)
    }

    /// Unpacks a send tag.
    pub(crate) fn from_tag(tag: u64) -> (Key, usize) {
        (
            Key {
                idx: (tag & 0xFF_FFFF) as u32,
                generation: ((tag >> 24) & 0xFFFF_FFFF) as u32,
            },
            (tag >> 56) as usize,
        )
    }

    /// Wheel value.
    pub(crate) fn pack(self) -> u64 {
        self.tag(0)
    }

    pub(crate) fn unpack(v: u64) -> Key {
        Key::from_tag(v).0
    }
}

/// The in-flight table of one core.
pub(crate) struct InFlight {
    cells: Vec<Cell>,
    free: Vec<u32>,
    limit: usize,
    len: usize,
    mask: [u8; 5],
    #[allow(clippy::vec_box)] // boxes move in and out of entries without copying
    big: Vec<Box<[u8; MAX_DATAGRAM]>>,
}

impl InFlight {
    /// A table for `limit` requests; `mask` hides the routing bytes of unique ids.
    pub(crate) fn new(limit: usize, mask: [u8; 5]) -> InFlight {
        let limit = limit.clamp(1, MAX_IN_FLIGHT);
        let prealloc = limit.min(1 << 16);
        InFlight {
            cells: Vec::with_capacity(prealloc),
            free: Vec::with_capacity(prealloc),
            limit,
            len: 0,
            mask,
            big: Vec::new(),
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len >= self.limit
    }

    /// Reserves a key for a new entry (insert it with [`InFlight::insert`]).
    pub(crate) fn reserve(&mut self) -> Option<Key> {
        if self.is_full() {
            return None;
        }
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                self.cells.push(Cell {
                    generation: 0,
                    entry: None,
                });
                (self.cells.len() - 1) as u32
            }
        };
        self.len += 1;
        Some(Key {
            idx,
            generation: self.cells[idx as usize].generation,
        })
    }

    /// Gives back a reserved key that was never inserted.
    pub(crate) fn unreserve(&mut self, key: Key) {
        let c = &mut self.cells[key.idx as usize];
        debug_assert!(c.entry.is_none());
        c.generation = c.generation.wrapping_add(1);
        self.free.push(key.idx);
        self.len -= 1;
    }

    pub(crate) fn insert(&mut self, key: Key, entry: Entry) {
        let c = &mut self.cells[key.idx as usize];
        debug_assert_eq!(c.generation, key.generation);
        c.entry = Some(entry);
    }

    /// Writes the routing bytes for `key` into a fresh random unique id.
    pub(crate) fn stamp_unique_id(&self, key: Key, uid: &mut [u8; 16]) {
        let i = key.idx.to_le_bytes();
        let g = (key.generation as u16).to_le_bytes();
        let route = [i[0], i[1], i[2], g[0], g[1]];
        for k in 0..5 {
            uid[k] = route[k] ^ self.mask[k];
        }
    }

    /// Finds the entry a response's unique id belongs to (O(1)), checking the whole id.
    pub(crate) fn route(&self, uid: &[u8; 16]) -> Option<Key> {
        let mut r = [0u8; 5];
        for k in 0..5 {
            r[k] = uid[k] ^ self.mask[k];
        }
        let idx = u32::from_le_bytes([r[0], r[1], r[2], 0]);
        let g16 = u16::from_le_bytes([r[3], r[4]]);
        let c = self.cells.get(idx as usize)?;
        let e = c.entry.as_ref()?;
        if c.generation as u16 != g16 || e.dgram.unique_id() != uid {
            return None;
        }
        Some(Key {
            idx,
            generation: c.generation,
        })
    }

    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut Entry> {
        let c = self.cells.get_mut(key.idx as usize)?;
        if c.generation != key.generation {
            return None;
        }
        c.entry.as_mut()
    }

    /// Removes an entry (its large buffer goes back to the pool by [`InFlight::recycle`]).
    pub(crate) fn remove(&mut self, key: Key) -> Option<Entry> {
        let c = self.cells.get_mut(key.idx as usize)?;
        if c.generation != key.generation {
            return None;
        }
        let e = c.entry.take()?;
        c.generation = c.generation.wrapping_add(1);
        self.free.push(key.idx);
        self.len -= 1;
        Some(e)
    }

    /// A large datagram buffer from the pool.
    pub(crate) fn big_buffer(&mut self) -> Box<[u8; MAX_DATAGRAM]> {
        self.big
            .pop()
            .unwrap_or_else(|| Box::new([0u8; MAX_DATAGRAM]))
    }

    /// Returns a removed entry's buffer to the pool.
    pub(crate) fn recycle(&mut self, d: Dgram) {
        if let Dgram::Pooled { buf, .. } = d
            && self.big.len() < 1024
        {
            self.big.push(buf);
        }
    }

    /// Keys of every entry (for shutdown).
    pub(crate) fn keys(&self) -> Vec<Key> {
        self.cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.entry.is_some())
            .map(|(i, c)| Key {
                idx: i as u32,
                generation: c.generation,
            })
            .collect()
    }
}

/// Size in bytes of one in-flight entry (memory per in-flight request, excluding the
/// shared snapshot and pooled large datagrams).
pub fn entry_size() -> usize {
    // the slab cell plus its free-list slot
    std::mem::size_of::<Cell>() + std::mem::size_of::<u32>()
}
