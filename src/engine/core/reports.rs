//! Latency-report coalescing for one core (docs/protocol.md §15).
//!
//! Owns: the pending report entries of a core, flushed as one datagram (up to the mode's
//! limit, 34 entries in cookie/aes) when full or when the oldest entry is older than the
//! flush interval. The core encodes, seals and sends each batch once to every endpoint of
//! the current membership.
//! Must not touch: sockets, the request path, clocks (time is a parameter).

use std::time::{Duration, Instant};

use crate::proto::wire::ReportEntry;

/// Pending report entries of one core.
pub(crate) struct Reports {
    entries: Vec<ReportEntry>,
    first_at: Option<Instant>,
    interval: Duration,
    max: usize,
}

impl Reports {
    pub(crate) fn new(max: usize, interval: Duration) -> Reports {
        let max = max.max(1);
        Reports {
            entries: Vec::with_capacity(max),
            first_at: None,
            interval,
            max,
        }
    }

    /// Adds an entry; returns true when the batch is full and must be flushed now.
    pub(crate) fn push(&mut self, e: ReportEntry, now: Instant) -> bool {
        if self.entries.is_empty() {
            self.first_at = Some(now);
        }
        self.entries.push(e);
        self.entries.len() >= self.max
    }

    /// When the pending batch must be flushed.
    pub(crate) fn due_at(&self) -> Option<Instant> {
        self.first_at.map(|t| t + self.interval)
    }

    /// True when there is a batch to flush at `now` (full or old enough).
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.entries.len() >= self.max || self.due_at().is_some_and(|t| now >= t)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries to send; call [`Reports::clear`] after sending.
    pub(crate) fn entries(&self) -> &[ReportEntry] {
        &self.entries
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.first_at = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(ms: u32) -> ReportEntry {
        ReportEntry {
            tracker_id: [1; 16],
            ttl_ms: 1000,
            max_samples: 10,
            min_samples: 1,
            observed_ms: ms,
        }
    }

    #[test]
    fn flushes_when_full_or_old() {
        let t0 = Instant::now();
        let mut r = Reports::new(3, Duration::from_millis(5));
        assert!(!r.is_due(t0));
        assert!(!r.push(e(1), t0));
        assert!(!r.is_due(t0 + Duration::from_millis(4)));
        assert!(r.is_due(t0 + Duration::from_millis(5)));
        assert!(!r.push(e(2), t0));
        assert!(r.push(e(3), t0));
        assert_eq!(r.entries().len(), 3);
        r.clear();
        assert!(r.is_empty() && r.due_at().is_none());
    }
}
