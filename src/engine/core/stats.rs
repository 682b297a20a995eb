//! Engine statistics: per-core counters and decision-latency histograms, and the merged
//! snapshot returned by `EngineHandle::stats()`.
//!
//! Owns: the per-core counters (plain counters, updated only by the owning core, so no atomics on
//! the hot path), [`Stats`] (the merged snapshot), [`LatencyHistogram`] (our face of the
//! HdrHistograms, so no dependency type is public) and the drop-reason indexing.
//! Must not touch: sockets, request state, clocks (latencies are passed in), the
//! callers' completion-wake figures (recorded by the runtime's completion slots).

use std::time::Duration;

use hdrhistogram::Histogram;

pub use super::consts::ROUND_BUCKETS;
use crate::proto::machine::Endpoint;
use crate::proto::outcome::{Failure, Phase, Response};
use crate::proto::wire::DropReason;

/// Why a received datagram was dropped by the engine (wire rules plus routing).
pub const DROP_REASONS: usize = DropReason::ALL.len();

/// A latency histogram (HdrHistogram: fixed bounds, recording never allocates). Values
/// are in the unit its field names (µs, or per-mille of H).
#[derive(Clone, Debug)]
pub struct LatencyHistogram(Histogram<u64>);

impl LatencyHistogram {
    /// Values `1..=max`, `digits` significant digits.
    fn with_bounds(max: u64, digits: u8) -> LatencyHistogram {
        LatencyHistogram(Histogram::new_with_bounds(1, max, digits).expect("valid bounds"))
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The value at quantile `q` (0.0..=1.0); 0 when empty.
    pub fn value_at_quantile(&self, q: f64) -> u64 {
        if self.0.is_empty() {
            0
        } else {
            self.0.value_at_quantile(q)
        }
    }

    /// The largest value recorded (0 when empty).
    pub fn max(&self) -> u64 {
        self.0.max()
    }

    /// The mean of the recorded values (0.0 when empty).
    pub fn mean(&self) -> f64 {
        self.0.mean()
    }

    /// Recorded values in `low..=high` (at the histogram's resolution).
    pub fn count_between(&self, low: u64, high: u64) -> u64 {
        self.0.count_between(low, high)
    }

    /// Records `v` (clamped to the bounds).
    pub(crate) fn record(&mut self, v: u64) {
        self.0.saturating_record(v.max(1));
    }

    /// Records `v` `n` times (clamped to the bounds).
    pub(crate) fn record_n(&mut self, v: u64, n: u64) {
        let v = v.clamp(1, self.0.high());
        let _ = self.0.record_n(v, n);
    }

    /// Adds `other`'s values (same bounds: never fails).
    fn add(&mut self, other: &LatencyHistogram) {
        let _ = self.0.add(&other.0);
    }

    /// Becomes a copy of `other` without allocating.
    fn copy_from(&mut self, other: &LatencyHistogram) {
        self.0.reset();
        self.add(other);
    }
}

/// Counters and histograms of one core (and, merged, of the engine). New counters may be
/// added: build one with [`Stats::new`].
#[derive(Clone, Debug)]
#[non_exhaustive]
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
    pub latency_us: LatencyHistogram,
    /// Decision latency as a fraction of the horizon H, in per-mille (1000 = H).
    pub latency_permille_of_h: LatencyHistogram,
    /// The I/O layer's counters (backend, batch sizes, GSO/GRO, fallbacks), summed over
    /// the cores (`None` in simulation, where no I/O runs).
    pub io: Option<crate::udp::IoStats>,
    /// Breakdown, queue wait: from submit until the core took the request (µs).
    pub queue_wait_us: LatencyHistogram,
    /// Breakdown, wire time: from the first send until the deciding answer arrived (µs).
    pub wire_us: LatencyHistogram,
    /// Breakdown, decision time: from the deciding answer until the decision (µs; the
    /// wait for the oldest server until the round ends shows here).
    pub decision_us: LatencyHistogram,
    /// Breakdown, completion wake: from the decision until the caller ran (µs; measured
    /// by the callers on one decision in
    /// [`WAKE_SAMPLE_EVERY`](super::WAKE_SAMPLE_EVERY), engine-wide: filled in by
    /// `EngineHandle::stats`).
    pub completion_wake_us: LatencyHistogram,
}

/// A µs histogram (1 µs .. 1 h, 2 significant digits).
fn us_hist() -> LatencyHistogram {
    LatencyHistogram::with_bounds(3_600_000_000, 2)
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
            // 1 µs .. 1 h, 3 significant digits
            latency_us: LatencyHistogram::with_bounds(3_600_000_000, 3),
            latency_permille_of_h: LatencyHistogram::with_bounds(1_000_000, 3),
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
        self.latency_us.record(us);
        let h = horizon.as_micros().max(1) as u64;
        let pm = (us.saturating_mul(1000) / h).clamp(1, 1_000_000);
        self.latency_permille_of_h.record(pm);
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
        self.copy_counters_from(other);
        for (a, b) in self.histograms_with(other) {
            a.copy_from(b);
        }
    }

    /// Copies every counter and the I/O counters of `other`, not its histograms (a
    /// fraction of the cost: a hosted core publishes these at every pause).
    pub(crate) fn copy_counters_from(&mut self, other: &Stats) {
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
    }

    /// Each histogram of `self` with the same histogram of `other`.
    fn histograms_with<'a>(
        &'a mut self,
        other: &'a Stats,
    ) -> [(&'a mut LatencyHistogram, &'a LatencyHistogram); 6] {
        [
            (&mut self.latency_us, &other.latency_us),
            (
                &mut self.latency_permille_of_h,
                &other.latency_permille_of_h,
            ),
            (&mut self.queue_wait_us, &other.queue_wait_us),
            (&mut self.wire_us, &other.wire_us),
            (&mut self.decision_us, &other.decision_us),
            (&mut self.completion_wake_us, &other.completion_wake_us),
        ]
    }

    /// Records the stages of one decision (µs each).
    pub(crate) fn record_breakdown(&mut self, queue: u64, wire: u64, decision: u64) {
        self.queue_wait_us.record(queue);
        self.wire_us.record(wire);
        self.decision_us.record(decision);
    }

    /// Counts one decision: granted or rejected, its round or the final phase, and a
    /// round-0 decision by a server other than the oldest of `snapshot`.
    pub(crate) fn count_decision(&mut self, r: &Response, snapshot: &[Endpoint]) {
        if r.is_granted() {
            self.granted += 1;
        } else {
            self.rejected += 1;
        }
        match r.phase {
            Phase::Round(k) => {
                self.decisions_by_round[(k as usize).min(ROUND_BUCKETS - 1)] += 1;
                if k == 0 && r.server_id != snapshot.iter().map(|x| x.server_id).min() {
                    self.oldest_fallbacks += 1;
                    if self.oldest_fallbacks.is_power_of_two() {
                        tracing::info!(
                            fallbacks = self.oldest_fallbacks,
                            "oldest server silent in round 0: a younger one decided"
                        );
                    }
                }
            }
            Phase::Final => self.decisions_final += 1,
            Phase::Local => {}
        }
    }

    /// Counts a request that failed after its start.
    pub(crate) fn count_failure(&mut self, f: &Failure) {
        match f {
            Failure::Timeout { .. } => self.timeouts += 1,
            Failure::Communication(_) => self.comm_failures += 1,
            Failure::Shutdown => self.shutdown_failures += 1,
            _ => {}
        }
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
        for (a, b) in self.histograms_with(other) {
            a.add(b);
        }
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
