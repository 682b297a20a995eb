//! Dedup table: remembers the response PDU of every rate request, keyed by
//! (key id, unique id), for at least the request's dedup TTL, in bounded memory.
//!
//! Owns: the FIFO entry log, the byte arena holding cached plaintext response PDUs and
//! the hash index. Must not touch: sockets, clocks (time is a millisecond count
//! relative to the caller's epoch), crypto, bucket or tracker state.
//!
//! Scheme: entries are appended in arrival order to a ring of at most `capacity`
//! entries, and their PDU bytes to a ring arena of `arena_bytes` bytes. Old entries
//! leave from the front: expired ones silently, live ones (table or arena full) are
//! counted as `overflow`. A lookup checks the entry's own expiry, so an entry kept
//! longer than its TTL is never answered after the TTL. No allocation after
//! construction, and every page resident from it: the rings move through their whole
//! memory under any traffic, so without touching it first a server's footprint grew for
//! seconds after each start by up to the table's size (about 13 MiB at the default
//! 65,536 entries), at a pace set by its request rate, and a soak's memory bar read that as
//! the client's growth.

use std::collections::{HashMap, VecDeque};

/// (key id, unique id).
pub type DedupKey = (u64, [u8; 16]);

#[derive(Clone, Copy, Debug)]
struct Entry {
    key: DedupKey,
    seq: u64,
    expires_ms: u64,
    off: u32,
    len: u32,
}

/// Counters of the dedup table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DedupStats {
    /// Entries currently held.
    pub len: usize,
    /// Live entries evicted before their TTL because the table or arena was full.
    pub overflow: u64,
    /// Entries removed after their TTL.
    pub expired: u64,
}

/// Bounded dedup table (see module doc).
pub struct DedupTable {
    capacity: usize,
    entries: VecDeque<Entry>,
    front_seq: u64,
    next_seq: u64,
    index: HashMap<DedupKey, u64>,
    arena: Vec<u8>,
    tail: usize,
    overflow: u64,
    expired: u64,
}

/// Largest PDU the table stores (a whole datagram).
pub const MAX_ENTRY: usize = 1200;

impl DedupTable {
    /// A table holding at most `capacity` entries (>= 1) and about `capacity * 96`
    /// bytes of cached PDUs (at least 64 KiB).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let arena_bytes = capacity.saturating_mul(96).clamp(64 * 1024, 1 << 30);
        let mut t = Self {
            capacity,
            entries: VecDeque::with_capacity(capacity),
            front_seq: 0,
            next_seq: 0,
            index: HashMap::with_capacity(capacity),
            arena: vec![0; arena_bytes],
            tail: 0,
            overflow: 0,
            expired: 0,
        };
        t.make_resident();
        t
    }

    /// Writes every page of the arena, the entry ring and the index once (see the module
    /// doc), leaving the table empty with its capacity kept.
    fn make_resident(&mut self) {
        for page in self.arena.chunks_mut(4096) {
            // A volatile write: the zeroed allocation may be the kernel's shared zero page
            // until written, and a plain store of the same zero may be optimised away.
            // SAFETY: `page` is a non-empty, initialised, exclusively borrowed slice.
            unsafe { std::ptr::write_volatile(page.as_mut_ptr(), 0) };
        }
        let empty = Entry {
            key: (0, [0; 16]),
            seq: 0,
            expires_ms: 0,
            off: 0,
            len: 0,
        };
        self.entries
            .extend(std::iter::repeat_n(empty, self.capacity));
        self.entries.clear();
        for n in 0..self.capacity as u64 {
            let mut unique = [0u8; 16];
            unique[..8].copy_from_slice(&n.to_le_bytes());
            self.index.insert((u64::MAX, unique), n);
        }
        self.index.clear();
    }

    /// Configured entry capacity.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Current counters.
    pub fn stats(&self) -> DedupStats {
        DedupStats {
            len: self.entries.len(),
            overflow: self.overflow,
            expired: self.expired,
        }
    }

    /// The cached PDU for `key` if its TTL has not passed at `now_ms`.
    pub fn get(&self, key: &DedupKey, now_ms: u64) -> Option<&[u8]> {
        let seq = *self.index.get(key)?;
        let e = self.entries.get((seq - self.front_seq) as usize)?;
        if now_ms >= e.expires_ms {
            return None;
        }
        Some(&self.arena[e.off as usize..(e.off + e.len) as usize])
    }

    /// Removes expired entries from the front.
    pub fn expire(&mut self, now_ms: u64) {
        while let Some(f) = self.entries.front() {
            if f.expires_ms > now_ms {
                break;
            }
            self.expired += 1;
            self.pop_front();
        }
    }

    fn pop_front(&mut self) {
        if let Some(f) = self.entries.pop_front() {
            if self.index.get(&f.key) == Some(&f.seq) {
                self.index.remove(&f.key);
            }
            self.front_seq += 1;
        }
        if self.entries.is_empty() {
            self.tail = 0;
        }
    }

    fn evict_front(&mut self, now_ms: u64) {
        if let Some(f) = self.entries.front() {
            if f.expires_ms > now_ms {
                self.overflow += 1;
            } else {
                self.expired += 1;
            }
        }
        self.pop_front();
    }

    /// Finds arena room for `len` bytes, evicting from the front as needed.
    fn alloc(&mut self, len: usize, now_ms: u64) -> usize {
        let cap = self.arena.len();
        loop {
            let Some(front) = self.entries.front() else {
                self.tail = 0;
                return 0;
            };
            let start = front.off as usize;
            if start < self.tail {
                // live = [start, tail)
                if self.tail + len <= cap {
                    return self.tail;
                }
                if len <= start {
                    return 0;
                }
            } else if self.tail + len <= start {
                // live = [start, end) ∪ [0, tail)
                return self.tail;
            }
            self.evict_front(now_ms);
        }
    }

    /// Remembers `pdu` for `key` until `now_ms + ttl_ms`. A PDU longer than
    /// [`MAX_ENTRY`] is not stored.
    pub fn insert(&mut self, key: DedupKey, pdu: &[u8], now_ms: u64, ttl_ms: u32) {
        if pdu.len() > MAX_ENTRY {
            return;
        }
        self.expire(now_ms);
        if self.entries.len() >= self.capacity {
            self.evict_front(now_ms);
        }
        let off = self.alloc(pdu.len(), now_ms);
        self.arena[off..off + pdu.len()].copy_from_slice(pdu);
        self.tail = off + pdu.len();
        let seq = self.next_seq;
        self.next_seq += 1;
        if self.entries.is_empty() {
            self.front_seq = seq;
        }
        self.entries.push_back(Entry {
            key,
            seq,
            expires_ms: now_ms.saturating_add(u64::from(ttl_ms)),
            off: off as u32,
            len: pdu.len() as u32,
        });
        self.index.insert(key, seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: u64) -> DedupKey {
        let mut u = [0u8; 16];
        u[..8].copy_from_slice(&n.to_le_bytes());
        (7, u)
    }

    #[test]
    fn hit_within_ttl_miss_after() {
        let mut t = DedupTable::new(16);
        t.insert(k(1), b"abc", 100, 50);
        assert_eq!(t.get(&k(1), 149), Some(&b"abc"[..]));
        assert_eq!(t.get(&k(1), 150), None);
        assert_eq!(t.get(&k(2), 120), None);
        // re-insert after expiry replaces
        t.insert(k(1), b"xyz", 150, 50);
        assert_eq!(t.get(&k(1), 160), Some(&b"xyz"[..]));
    }

    #[test]
    fn bounded_with_overflow_count() {
        let mut t = DedupTable::new(100);
        for i in 0..10_000u64 {
            t.insert(k(i), &[i as u8; 40], 0, 1000);
            assert!(t.stats().len <= 100);
        }
        assert_eq!(t.stats().overflow, 9_900);
        // the newest 100 are still there, with the right bytes
        for i in 9_900..10_000u64 {
            assert_eq!(t.get(&k(i), 1), Some(&[i as u8; 40][..]));
        }
        assert_eq!(t.get(&k(0), 1), None);
    }

    #[test]
    fn arena_wraps_with_mixed_sizes() {
        let mut t = DedupTable::new(10_000);
        let arena = t.arena.len();
        let mut now = 0;
        for i in 0..50_000u64 {
            let len = 1 + (i as usize * 37) % MAX_ENTRY;
            let fill = (i % 251) as u8;
            t.insert(k(i), &vec![fill; len], now, 5);
            now += 1;
            let got = t.get(&k(i), now).unwrap();
            assert_eq!(got.len(), len);
            assert!(got.iter().all(|&b| b == fill));
        }
        assert!(t.tail <= arena);
        // everything older than 5 ms has gone
        assert!(t.stats().len <= 6);
    }
}
