//! Metrics: the layer's own lock-free counters ([`LayerMetrics`]), readable without any
//! exporter; the Prometheus exporter (`exporter.rs`, feature `prometheus`) renders them.
//!
//! Owns: the counters and the meaning of each. Must not touch: requests, the engine.
//!
//! The series the exporter renders from them (an app with its own exporter can use the
//! same names through the accessors below):
//! - `ratelimitly_requests_total{outcome="granted|rejected|timeout|overloaded|discovery|communication|stopped|invalid|no_client_addr"}`
//!   — decisions and failures seen by the layer;
//! - `ratelimitly_decision_latency_seconds` — histogram, admission call to verdict;
//! - `ratelimitly_not_ready_total` — `poll_ready` answered `Pending` (decisions in
//!   flight at the layer's limit);
//! - `ratelimitly_breaker_open` (gauge, 0 or 1),
//!   `ratelimitly_breaker_transitions_total{to="open|closed"}`,
//!   `ratelimitly_breaker_short_circuits_total` — the circuit breaker;
//! - with an engine: `ratelimitly_datagrams_sent_total` (request datagrams, replays and
//!   completion deliveries included, plus latency-report datagrams),
//!   `ratelimitly_responses_dropped_total{reason=...}` (one reason per wire rule, plus
//!   `ignored` for valid responses that came too late or twice) and
//!   `ratelimitly_in_flight{core="N"}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crate::failure::FailureKind;
use crate::verdict::Verdict;

/// Upper bounds of the decision-latency histogram buckets, in seconds.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The `outcome` label values, in counter order.
pub const OUTCOMES: [&str; 9] = [
    "granted",
    "rejected",
    "timeout",
    "overloaded",
    "discovery",
    "communication",
    "stopped",
    "invalid",
    "no_client_addr",
];

/// The layer's counters: atomics only, one relaxed increment per request per counter.
#[derive(Debug, Default)]
pub struct LayerMetrics {
    outcomes: [AtomicU64; 9],
    buckets: [AtomicU64; 14],
    count: AtomicU64,
    sum_ns: AtomicU64,
    not_ready: AtomicU64,
    breaker_open: AtomicBool,
    breaker_opened: AtomicU64,
    breaker_closed: AtomicU64,
    short_circuits: AtomicU64,
}

fn outcome_index(v: &Verdict) -> usize {
    match v {
        Verdict::Granted => 0,
        Verdict::Rejected { .. } => 1,
        Verdict::Decided(d) if d.granted => 0,
        Verdict::Decided(_) => 1,
        Verdict::Failed(FailureKind::Timeout) => 2,
        Verdict::Failed(FailureKind::Overload) => 3,
        Verdict::Failed(FailureKind::Discovery) => 4,
        Verdict::Failed(FailureKind::Communication) => 5,
        Verdict::Failed(FailureKind::EngineStopped) => 6,
        Verdict::Invalid => 7,
        Verdict::Failed(FailureKind::NoClientAddr) => 8,
    }
}

impl LayerMetrics {
    /// Fresh counters.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts one verdict reached after `latency`.
    pub fn record(&self, verdict: &Verdict, latency: Duration) {
        self.outcomes[outcome_index(verdict)].fetch_add(1, Ordering::Relaxed);
        let secs = latency.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|b| secs <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Counts one `poll_ready` that answered `Pending`.
    pub fn record_not_ready(&self) {
        self.not_ready.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one request answered by the open breaker without asking.
    pub fn record_short_circuit(&self) {
        self.short_circuits.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one breaker transition (`open`: to open, else to closed).
    pub fn record_breaker(&self, open: bool) {
        self.breaker_open.store(open, Ordering::Relaxed);
        if open {
            self.breaker_opened.fetch_add(1, Ordering::Relaxed);
        } else {
            self.breaker_closed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The circuit breaker is open.
    pub fn breaker_is_open(&self) -> bool {
        self.breaker_open.load(Ordering::Relaxed)
    }

    /// Requests answered by the open breaker without asking the service.
    pub fn short_circuits(&self) -> u64 {
        self.short_circuits.load(Ordering::Relaxed)
    }

    /// Requests counted with `outcome` (one of [`OUTCOMES`]).
    pub fn outcome(&self, outcome: &str) -> u64 {
        OUTCOMES
            .iter()
            .position(|o| *o == outcome)
            .map_or(0, |i| self.outcomes[i].load(Ordering::Relaxed))
    }

    /// Decisions counted in the latency histogram.
    pub fn decisions(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The count of each outcome, in [`OUTCOMES`] order.
    pub fn outcomes(&self) -> [u64; 9] {
        std::array::from_fn(|i| self.outcomes[i].load(Ordering::Relaxed))
    }

    /// Decisions per latency bucket, in [`LATENCY_BUCKETS`] order; each count is of its
    /// own bucket only (not cumulative). Decisions slower than the last bound are in
    /// [`LayerMetrics::decisions`] but in no bucket.
    pub fn latency_buckets(&self) -> [u64; 14] {
        std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed))
    }

    /// The sum of all decision latencies.
    pub fn latency_sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns.load(Ordering::Relaxed))
    }

    /// `poll_ready` calls that answered `Pending`.
    pub fn not_ready(&self) -> u64 {
        self.not_ready.load(Ordering::Relaxed)
    }

    /// Breaker transitions: (to open, to closed).
    pub fn breaker_transitions(&self) -> (u64, u64) {
        (
            self.breaker_opened.load(Ordering::Relaxed),
            self.breaker_closed.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_read_back_without_an_exporter() {
        let m = LayerMetrics::new();
        m.record(&Verdict::Granted, Duration::from_micros(300));
        m.record(
            &Verdict::Rejected { retry_after: None },
            Duration::from_millis(3),
        );
        m.record(
            &Verdict::Failed(FailureKind::Timeout),
            Duration::from_secs(10),
        );
        m.record_not_ready();
        m.record_breaker(true);
        assert_eq!(m.outcomes()[..3], [1, 1, 1]);
        assert_eq!(m.outcome("rejected"), 1);
        assert_eq!(m.decisions(), 3);
        let b = m.latency_buckets();
        assert_eq!(b[2], 1); // 300 µs: le 0.0005
        assert_eq!(b.iter().sum::<u64>(), 2); // 10 s is past the last bound
        assert_eq!(m.latency_sum(), Duration::from_micros(10_003_300));
        assert_eq!(m.not_ready(), 1);
        assert_eq!(m.breaker_transitions(), (1, 0));
        assert!(m.breaker_is_open());
    }
}
