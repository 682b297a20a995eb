//! Rate buckets: exact sliding-window token accounting keyed by (key id, bucket id).
//!
//! Owns: the bucket table and each bucket's grant log. Must not touch: sockets, clocks
//! (time is a millisecond count relative to the caller's epoch), wire formats.
//!
//! Scheme: each bucket keeps a log of (grant time ms, tokens) for the grants of the last
//! `window_ms` milliseconds, grants of the same millisecond merged into one entry, so the
//! log holds at most min(rate_limit, window_ms) entries. `available = rate_limit −
//! tokens in (now − window, now]`, which means no window of `window_ms` ever holds more than
//! `rate_limit` granted tokens. The table holds at most `capacity` buckets; when full,
//! idle buckets (empty logs) are swept, and if none is idle a new bucket is refused
//! (the caller drops the request and counts it).

use std::collections::{HashMap, VecDeque};

/// (key id, bucket id).
pub type BucketKey = (u64, [u8; 16]);

/// One bucket's grant log.
#[derive(Debug, Default)]
pub struct Bucket {
    log: VecDeque<(u64, u32)>,
    consumed: u64,
    window_ms: u32,
}

impl Bucket {
    fn trim(&mut self, now_ms: u64, window_ms: u32) {
        while let Some(&(t, n)) = self.log.front() {
            if now_ms.saturating_sub(t) < u64::from(window_ms) {
                break;
            }
            self.consumed -= u64::from(n);
            self.log.pop_front();
        }
    }

    /// Tokens consumed in the window ending at `now_ms`.
    pub fn consumed(&mut self, now_ms: u64, window_ms: u32) -> u64 {
        self.trim(now_ms, window_ms);
        self.consumed
    }

    /// Records a grant of `tokens` at `now_ms` (caller checked availability).
    pub fn debit(&mut self, now_ms: u64, tokens: u32) {
        if tokens == 0 {
            return;
        }
        self.consumed += u64::from(tokens);
        match self.log.back_mut() {
            Some((t, n)) if *t == now_ms => *n += tokens,
            _ => self.log.push_back((now_ms, tokens)),
        }
    }
}

/// All buckets of one responder core.
pub struct BucketTable {
    map: HashMap<BucketKey, Bucket>,
    capacity: usize,
}

impl BucketTable {
    /// A table of at most `capacity` buckets.
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            capacity: capacity.max(1),
        }
    }

    /// Number of buckets held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no bucket is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Tokens consumed in `key`'s window at `now_ms` (0 for an unknown bucket).
    pub fn consumed(&mut self, key: &BucketKey, now_ms: u64, window_ms: u32) -> u64 {
        self.map
            .get_mut(key)
            .map_or(0, |b| b.consumed(now_ms, window_ms))
    }

    /// Makes sure a bucket for `key` exists; false when the table is full of busy buckets.
    pub fn reserve(&mut self, key: &BucketKey, now_ms: u64, window_ms: u32) -> bool {
        if self.map.contains_key(key) {
            return true;
        }
        if self.map.len() >= self.capacity {
            // Sweep idle buckets (nothing granted in their window).
            self.map.retain(|_, b| {
                let w = b.window_ms;
                b.trim(now_ms, w);
                !b.log.is_empty()
            });
            if self.map.len() >= self.capacity {
                return false;
            }
        }
        self.map.insert(
            *key,
            Bucket {
                window_ms,
                ..Bucket::default()
            },
        );
        true
    }

    /// Debits `tokens` from `key` (created by [`BucketTable::reserve`]).
    pub fn debit(&mut self, key: &BucketKey, now_ms: u64, tokens: u32) {
        if let Some(b) = self.map.get_mut(key) {
            b.debit(now_ms, tokens);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Brute force: over a run of random grant attempts, no window of window_ms
    /// ever contains more than rate_limit granted tokens.
    #[test]
    fn never_more_than_rate_in_any_window() {
        let mut b = Bucket::default();
        let (window, rate) = (100u32, 10u32);
        let mut grants: Vec<(u64, u32)> = Vec::new();
        let mut x = 12345u64;
        let mut now = 0u64;
        for _ in 0..5000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now += x % 7;
            let want = 1 + (x >> 8) as u32 % 3;
            let used = b.consumed(now, window) as u32;
            if rate - used >= want {
                b.debit(now, want);
                grants.push((now, want));
            }
        }
        for &(t0, _) in &grants {
            let sum: u32 = grants
                .iter()
                .filter(|&&(t, _)| t >= t0 && t < t0 + u64::from(window))
                .map(|&(_, n)| n)
                .sum();
            assert!(sum <= rate, "window at {t0} holds {sum}");
        }
        assert!(grants.len() > 100);
    }

    #[test]
    fn table_full_sweeps_idle() {
        let mut t = BucketTable::new(2);
        let a = (1, [1; 16]);
        let b = (1, [2; 16]);
        let c = (1, [3; 16]);
        assert!(t.reserve(&a, 0, 10));
        t.debit(&a, 0, 1);
        assert!(t.reserve(&b, 0, 10));
        t.debit(&b, 0, 1);
        assert!(!t.reserve(&c, 5, 10));
        // a and b are idle after their window
        assert!(t.reserve(&c, 20, 10));
        assert_eq!(t.len(), 1);
    }
}
