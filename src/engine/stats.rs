//! Engine statistics: per-core counters and decision-latency histograms, and the merged
//! snapshot returned by `EngineHandle::stats()`.
//!
//! Owns: the per-core counters (plain counters, updated only by the owning core, so no atomics on
//! the hot path), [`Stats`] (the merged snapshot) and the drop-reason indexing.
//! Must not touch: sockets, request state, clocks (latencies are passed in).

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::proto::wire::DropReason;

/// Rounds counted individually in [`Stats::decisions_by_round`]; later rounds share the
/// last bucket.
pub const ROUND_BUCKETS: usize = 8;

/// Why a received datagram was dropped by the engine (wire rules plus routing).
pub const DROP_REASONS: usize = DropReason::ALL.len();

/// Counters and histograms of one core (and, merged, of the engine).
#[derive(Clone, Debug)]
pub struct Stats {
    /// Decisions (grants + rejections) selected in round k (last bucket: k >= 7).
    pub decisions_by_round: [u64; ROUND_BUCKETS],
    /// Decisions selected in the final receive phase.
    pub decisions_final: u64,
    /// Grants (server decided).
    pub granted: u64,
    /// Rejections.
    pub rejected: u64,
    /// Round 0 returned a server other than the snapshot's oldest (the oldest did not
    /// answer in round 0: each such request waited B(0)·U).
    pub oldest_fallbacks: u64,
    /// Requests that timed out (no valid response by D).
    pub timeouts: u64,
    /// Requests that failed because no datagram of round 0 could be sent.
    pub comm_failures: u64,
    /// Requests that failed because no endpoint was known.
    pub discovery_failures: u64,
    /// Requests completed with `Failure::Shutdown`.
    pub shutdown_failures: u64,
    /// Requests refused because the core's in-flight table or the queue was full.
    pub overloaded: u64,
    /// Request datagrams sent (initial + replays + completion deliveries).
    pub sends: u64,
    /// Of `sends`, completion deliveries.
    pub completion_sends: u64,
    /// Datagram sends that failed.
    pub send_failures: u64,
    /// Received datagrams dropped, by `DropReason::index()`.
    pub drops: [u64; DROP_REASONS],
    /// Valid responses ignored: duplicate server, after the decision, after D.
    pub ignored_responses: u64,
    /// Datagrams received in total.
    pub received: u64,
    /// Steering hints acted upon (new socket bound).
    pub steering_rebinds: u64,
    /// Steering rebinds that failed (old socket kept).
    pub rebind_failures: u64,
    /// Steering hints refused because the core already held its maximum of sockets.
    pub steering_refused: u64,
    /// Requests in flight when the snapshot was taken.
    pub in_flight: u64,
    /// Sockets open (current and draining) when the snapshot was taken.
    pub sockets: u64,
    /// Cores that failed (0 or 1 per core; summed when merged).
    pub dead_cores: u64,
    /// Latency report entries accepted.
    pub report_entries: u64,
    /// Latency report datagrams sent (one per endpoint per batch).
    pub report_datagrams: u64,
    /// Latency report batches that could not be sent to any endpoint.
    pub report_failures: u64,
    /// Outcomes delivered to callers by the cores.
    pub completions: u64,
    /// Decision latency (submit to outcome) in microseconds.
    pub latency_us: Histogram<u64>,
    /// Decision latency as a fraction of the horizon H, in per-mille (1000 = H).
    pub latency_permille_of_h: Histogram<u64>,
    /// The I/O layer's counters (backend, batch sizes, GSO/GRO, fallbacks), summed over
    /// the cores (`None` in simulation, where no I/O runs).
    pub io: Option<crate::udp::IoStats>,
    /// Breakdown, queue wait: from submit until the core took the request (µs).
    pub queue_wait_us: Histogram<u64>,
    /// Breakdown, wire time: from the first send until the deciding answer arrived (µs).
    pub wire_us: Histogram<u64>,
    /// Breakdown, decision time: from the deciding answer until the decision (µs; the
    /// wait for the oldest server until the round ends shows here).
    pub decision_us: Histogram<u64>,
    /// Breakdown, completion wake: from the decision until the caller ran (µs; measured
    /// by the callers, engine-wide: filled in by `EngineHandle::stats`).
    pub completion_wake_us: Histogram<u64>,
}

/// A µs histogram (1 µs .. 1 h, 2 significant digits: recording never allocates).
fn us_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("valid bounds")
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    /// Empty statistics (allocates the histograms once).
    pub fn new() -> Stats {
        Stats {
            decisions_by_round: [0; ROUND_BUCKETS],
            decisions_final: 0,
            granted: 0,
            rejected: 0,
            oldest_fallbacks: 0,
            timeouts: 0,
            comm_failures: 0,
            discovery_failures: 0,
            shutdown_failures: 0,
            overloaded: 0,
            sends: 0,
            completion_sends: 0,
            send_failures: 0,
            drops: [0; DROP_REASONS],
            ignored_responses: 0,
            received: 0,
            steering_rebinds: 0,
            rebind_failures: 0,
            steering_refused: 0,
            in_flight: 0,
            sockets: 0,
            dead_cores: 0,
            report_entries: 0,
            report_datagrams: 0,
            report_failures: 0,
            completions: 0,
            // 1 µs .. 1 h, 3 significant digits: recording never allocates.
            latency_us: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds"),
            latency_permille_of_h: Histogram::new_with_bounds(1, 1_000_000, 3)
                .expect("valid bounds"),
            io: None,
            queue_wait_us: us_hist(),
            wire_us: us_hist(),
            decision_us: us_hist(),
            completion_wake_us: us_hist(),
        }
    }

    /// Records one decision latency against the horizon `horizon`.
    pub(crate) fn record_latency(&mut self, latency: Duration, horizon: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, 3_600_000_000);
        self.latency_us.saturating_record(us);
        let h = horizon.as_micros().max(1) as u64;
        let pm = (us.saturating_mul(1000) / h).clamp(1, 1_000_000);
        self.latency_permille_of_h.saturating_record(pm);
    }

    /// Counts one dropped datagram.
    pub(crate) fn drop(&mut self, reason: DropReason) {
        self.drops[reason.index()] += 1;
    }

    /// Dropped datagrams of one reason.
    pub fn drops_of(&self, reason: DropReason) -> u64 {
        self.drops[reason.index()]
    }

    /// Total dropped datagrams.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Total decisions (grants + rejections).
    pub fn decisions(&self) -> u64 {
        self.granted + self.rejected
    }

    /// Makes `self` a copy of `other` without allocating (the histograms keep their
    /// storage).
    pub fn copy_from(&mut self, other: &Stats) {
        macro_rules! copy {
            ($($f:ident),*) => { $( self.$f = other.$f; )* };
        }
        copy!(
            decisions_by_round,
            decisions_final,
            granted,
            rejected,
            oldest_fallbacks,
            timeouts,
            comm_failures,
            discovery_failures,
            shutdown_failures,
            overloaded,
            sends,
            completion_sends,
            send_failures,
            drops,
            ignored_responses,
            received,
            steering_rebinds,
            rebind_failures,
            steering_refused,
            in_flight,
            sockets,
            dead_cores,
            report_entries,
            report_datagrams,
            report_failures,
            completions
        );
        self.io.clone_from(&other.io);
        self.latency_us.reset();
        let _ = self.latency_us.add(&other.latency_us);
        self.latency_permille_of_h.reset();
        let _ = self.latency_permille_of_h.add(&other.latency_permille_of_h);
        for (a, b) in [
            (&mut self.queue_wait_us, &other.queue_wait_us),
            (&mut self.wire_us, &other.wire_us),
            (&mut self.decision_us, &other.decision_us),
            (&mut self.completion_wake_us, &other.completion_wake_us),
        ] {
            a.reset();
            let _ = a.add(b);
        }
    }

    /// Records the stages of one decision (µs each).
    pub(crate) fn record_breakdown(&mut self, queue: u64, wire: u64, decision: u64) {
        self.queue_wait_us.saturating_record(queue.max(1));
        self.wire_us.saturating_record(wire.max(1));
        self.decision_us.saturating_record(decision.max(1));
    }

    /// Adds `other` into `self`.
    pub fn merge(&mut self, other: &Stats) {
        for (a, b) in self
            .decisions_by_round
            .iter_mut()
            .zip(other.decisions_by_round.iter())
        {
            *a += b;
        }
        for (a, b) in self.drops.iter_mut().zip(other.drops.iter()) {
            *a += b;
        }
        self.decisions_final += other.decisions_final;
        self.granted += other.granted;
        self.rejected += other.rejected;
        self.oldest_fallbacks += other.oldest_fallbacks;
        self.timeouts += other.timeouts;
        self.comm_failures += other.comm_failures;
        self.discovery_failures += other.discovery_failures;
        self.shutdown_failures += other.shutdown_failures;
        self.overloaded += other.overloaded;
        self.sends += other.sends;
        self.completion_sends += other.completion_sends;
        self.send_failures += other.send_failures;
        self.ignored_responses += other.ignored_responses;
        self.received += other.received;
        self.steering_rebinds += other.steering_rebinds;
        self.rebind_failures += other.rebind_failures;
        self.steering_refused += other.steering_refused;
        self.in_flight += other.in_flight;
        self.sockets += other.sockets;
        self.dead_cores += other.dead_cores;
        self.report_entries += other.report_entries;
        self.report_datagrams += other.report_datagrams;
        self.report_failures += other.report_failures;
        self.completions += other.completions;
        match (&mut self.io, &other.io) {
            (Some(a), Some(b)) => a.merge(b),
            (a @ None, Some(b)) => *a = Some(b.clone()),
            _ => {}
        }
        let _ = self.latency_us.add(&other.latency_us);
        let _ = self.latency_permille_of_h.add(&other.latency_permille_of_h);
        let _ = self.queue_wait_us.add(&other.queue_wait_us);
        let _ = self.wire_us.add(&other.wire_us);
        let _ = self.decision_us.add(&other.decision_us);
        let _ = self.completion_wake_us.add(&other.completion_wake_us);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_adds_counters_and_histograms() {
        let mut a = Stats::new();
        let mut b = Stats::new();
        a.granted = 2;
        b.granted = 3;
        a.drop(DropReason::AuthFailed);
        b.drop(DropReason::AuthFailed);
        a.record_latency(Duration::from_micros(500), Duration::from_millis(60));
        b.record_latency(Duration::from_millis(30), Duration::from_millis(60));
        a.merge(&b);
        assert_eq!(a.granted, 5);
        assert_eq!(a.drops_of(DropReason::AuthFailed), 2);
        assert_eq!(a.latency_us.len(), 2);
        assert!(a.latency_permille_of_h.max() >= 499);
    }
}
