//! Latency trackers keyed by (key id, tracker id), fed by latency reports and read by
//! guards.
//!
//! Owns: the tracker table and each tracker's sample ring. Must not touch: sockets,
//! clocks (time is a millisecond count relative to the caller's epoch), wire formats.
//!
//! current latency = the 90th percentile (nearest rank: the ⌈0.9·n⌉-th smallest) of the
//! newest `max_samples` samples younger than `ttl_ms`, or 0 while fewer than
//! `min_sample_threshold` such samples exist. Each ring holds at most
//! min(max_samples, [`MAX_SAMPLES_CAP`]) samples; the table holds at most `capacity`
//! trackers (when full, trackers without live samples are swept, else the report entry
//! is refused and counted by the caller).

use std::collections::{HashMap, VecDeque};

/// (key id, tracker id).
pub type TrackerKey = (u64, [u8; 16]);

/// Most samples one tracker keeps, whatever its max_samples says.
pub const MAX_SAMPLES_CAP: usize = 65_536;

/// Tracker definition fields as carried by reports and guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrackerDef {
    /// Sample age limit in ms.
    pub ttl_ms: u32,
    /// Newest samples considered.
    pub max_samples: u32,
    /// Minimum live samples before a latency is reported.
    pub min_samples: u32,
}

#[derive(Debug)]
struct Tracker {
    /// (time ms, latency ms), oldest first.
    samples: VecDeque<(u64, u32)>,
    ttl_ms: u32,
}

/// All trackers of one responder core.
pub struct TrackerTable {
    map: HashMap<TrackerKey, Tracker>,
    capacity: usize,
    scratch: Vec<u32>,
}

fn live(now_ms: u64, t: u64, ttl_ms: u32) -> bool {
    now_ms.saturating_sub(t) < u64::from(ttl_ms)
}

impl TrackerTable {
    /// A table of at most `capacity` trackers.
    pub fn new(capacity: usize) -> Self {
        Self {
            map: HashMap::new(),
            capacity: capacity.max(1),
            scratch: Vec::new(),
        }
    }

    /// Number of trackers held.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when no tracker is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds one sample; false when the table is full (the sample is dropped).
    pub fn report(
        &mut self,
        key: &TrackerKey,
        def: TrackerDef,
        now_ms: u64,
        latency_ms: u32,
    ) -> bool {
        let keep = (def.max_samples as usize).clamp(1, MAX_SAMPLES_CAP);
        if !self.map.contains_key(key) {
            if self.map.len() >= self.capacity {
                self.map.retain(|_, t| {
                    t.samples
                        .back()
                        .is_some_and(|&(ts, _)| live(now_ms, ts, t.ttl_ms))
                });
                if self.map.len() >= self.capacity {
                    return false;
                }
            }
            self.map.insert(
                *key,
                Tracker {
                    samples: VecDeque::new(),
                    ttl_ms: def.ttl_ms,
                },
            );
        }
        let Some(t) = self.map.get_mut(key) else {
            return false;
        };
        t.ttl_ms = def.ttl_ms;
        while t.samples.len() >= keep {
            t.samples.pop_front();
        }
        t.samples.push_back((now_ms, latency_ms));
        true
    }

    /// Current latency of `key` at `now_ms` as defined in the module doc.
    pub fn current(&mut self, key: &TrackerKey, def: TrackerDef, now_ms: u64) -> u32 {
        let Some(t) = self.map.get(key) else {
            return 0;
        };
        let max = (def.max_samples as usize).clamp(1, MAX_SAMPLES_CAP);
        self.scratch.clear();
        for &(ts, lat) in t.samples.iter().rev() {
            if self.scratch.len() >= max || !live(now_ms, ts, def.ttl_ms) {
                break;
            }
            self.scratch.push(lat);
        }
        let n = self.scratch.len();
        if n == 0 || n < def.min_samples as usize {
            return 0;
        }
        let rank = (n * 9).div_ceil(10).max(1) - 1;
        *self.scratch.select_nth_unstable(rank).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEF: TrackerDef = TrackerDef {
        ttl_ms: 1000,
        max_samples: 10,
        min_samples: 3,
    };

    #[test]
    fn p90_min_samples_ttl_and_window() {
        let mut t = TrackerTable::new(8);
        let k = (1, [9; 16]);
        assert_eq!(t.current(&k, DEF, 0), 0);
        assert!(t.report(&k, DEF, 0, 50));
        assert!(t.report(&k, DEF, 0, 60));
        assert_eq!(t.current(&k, DEF, 0), 0, "below min samples");
        assert!(t.report(&k, DEF, 0, 70));
        assert_eq!(t.current(&k, DEF, 0), 70);
        for i in 1..=10 {
            t.report(&k, DEF, 10, i);
        }
        // newest 10 = 1..=10 -> p90 nearest rank 9
        assert_eq!(t.current(&k, DEF, 10), 9);
        // all older than ttl
        assert_eq!(t.current(&k, DEF, 1010), 0);
    }

    #[test]
    fn full_table_refuses_then_sweeps() {
        let mut t = TrackerTable::new(1);
        assert!(t.report(&(1, [1; 16]), DEF, 0, 5));
        assert!(!t.report(&(1, [2; 16]), DEF, 10, 5));
        assert!(t.report(&(1, [2; 16]), DEF, 2000, 5));
        assert_eq!(t.len(), 1);
    }
}
