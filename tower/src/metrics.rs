//! Metrics: the layer's own lock-free counters ([`LayerMetrics`]) and the Prometheus
//! exporter ([`Exporter`]) that renders them together with the engine's statistics.
//!
//! Owns: the series names and their meaning. Must not touch: requests, the engine's
//! internals (it only reads `EngineHandle::stats`-style snapshots at scrape time).
//!
//! Why `prometheus-client` and not the `metrics` facade: the series here are read, not
//! pushed. Most of them already live in the engine as counters; the exporter turns a
//! snapshot into text only when scraped, which is what `prometheus-client`'s
//! [`Collector`] is for. The `metrics` facade would need a global recorder and an
//! exporter crate (`metrics-exporter-prometheus`, with its own HTTP server and
//! dependencies), and every engine counter would have to be mirrored into it on the hot
//! path or on a timer. `prometheus-client` is the Prometheus project's own Rust client,
//! has no global state and few dependencies, and encodes the Prometheus text format
//! 0.0.4 that every scraper reads.
//!
//! Series:
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

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use ratelimitly_engine::EngineHandle;
use ratelimitly_engine::proto::wire::DropReason;

use crate::admission::Verdict;
use crate::failure::FailureKind;

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
}

/// Renders [`LayerMetrics`] and, when given, an engine's statistics in the Prometheus
/// text format.
#[derive(Clone)]
pub struct Exporter {
    layer: Arc<LayerMetrics>,
    engine: Option<EngineHandle>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("layer", &self.layer)
            .field("engine", &self.engine.is_some())
            .finish()
    }
}

/// The `Content-Type` of [`Exporter::encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

impl Exporter {
    /// An exporter of the layer's counters.
    pub fn new(layer: Arc<LayerMetrics>) -> Self {
        Exporter {
            layer,
            engine: None,
        }
    }

    /// Also exports `engine`'s statistics (datagrams, drops, in-flight per core). The
    /// statistics are read once per [`Exporter::encode`].
    pub fn with_engine(mut self, engine: EngineHandle) -> Self {
        self.engine = Some(engine);
        self
    }

    /// The metrics in the Prometheus text format (version 0.0.4). Reads the engine's
    /// per-core statistics when an engine was given: call it off the async runtime's
    /// worker threads (e.g. in `spawn_blocking`) while that read can block.
    pub fn encode(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.clone()));
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }

    fn encode_layer(&self, enc: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let m = &self.layer;
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_requests",
                "Admission outcomes of HTTP requests (decisions and failures)",
                None,
                MetricType::Counter,
            )?;
            for (i, name) in OUTCOMES.iter().enumerate() {
                let labels = [("outcome", *name)];
                let mut fe = me.encode_family(&labels)?;
                fe.encode_counter::<NoLabelSet, _, u64>(
                    &m.outcomes[i].load(Ordering::Relaxed),
                    None,
                )?;
            }
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_decision_latency_seconds",
                "Time from the admission call to its verdict",
                None,
                MetricType::Histogram,
            )?;
            // Per-bucket (not cumulative) counts: the encoder accumulates them.
            let mut in_buckets = 0u64;
            let mut buckets = Vec::with_capacity(LATENCY_BUCKETS.len() + 1);
            for (i, ub) in LATENCY_BUCKETS.iter().enumerate() {
                let n = m.buckets[i].load(Ordering::Relaxed);
                in_buckets += n;
                buckets.push((*ub, n));
            }
            let count = m.count.load(Ordering::Relaxed).max(in_buckets);
            buckets.push((f64::INFINITY, count - in_buckets));
            let sum = m.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
            me.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        {
            let me = enc.encode_descriptor(
                "ratelimitly_not_ready",
                "poll_ready answered Pending: decisions in flight at the layer's limit",
                None,
                MetricType::Counter,
            )?;
            let mut me = me;
            me.encode_counter::<NoLabelSet, _, u64>(&m.not_ready.load(Ordering::Relaxed), None)?;
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_breaker_open",
                "1 while the layer's circuit breaker is open (failure policy applied at once)",
                None,
                MetricType::Gauge,
            )?;
            me.encode_gauge(&i64::from(m.breaker_open.load(Ordering::Relaxed)))?;
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_breaker_transitions",
                "Circuit breaker transitions, by the state entered",
                None,
                MetricType::Counter,
            )?;
            for (to, c) in [("open", &m.breaker_opened), ("closed", &m.breaker_closed)] {
                let labels = [("to", to)];
                let mut fe = me.encode_family(&labels)?;
                fe.encode_counter::<NoLabelSet, _, u64>(&c.load(Ordering::Relaxed), None)?;
            }
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_breaker_short_circuits",
                "Requests given the failure policy by the open breaker without asking the service",
                None,
                MetricType::Counter,
            )?;
            me.encode_counter::<NoLabelSet, _, u64>(
                &m.short_circuits.load(Ordering::Relaxed),
                None,
            )?;
        }
        Ok(())
    }

    fn encode_engine(
        &self,
        engine: &EngineHandle,
        enc: &mut DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let cores = engine.core_stats();
        let mut total = ratelimitly_engine::Stats::new();
        for s in &cores {
            total.merge(s);
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_datagrams_sent",
                "Datagrams sent by the engine: requests, replays, completion deliveries and latency reports",
                None,
                MetricType::Counter,
            )?;
            me.encode_counter::<NoLabelSet, _, u64>(&(total.sends + total.report_datagrams), None)?;
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_responses_dropped",
                "Received datagrams the engine dropped, by reason",
                None,
                MetricType::Counter,
            )?;
            for reason in DropReason::ALL {
                let labels = [("reason", reason.name())];
                let mut fe = me.encode_family(&labels)?;
                fe.encode_counter::<NoLabelSet, _, u64>(&total.drops_of(reason), None)?;
            }
            let labels = [("reason", "ignored")];
            let mut fe = me.encode_family(&labels)?;
            fe.encode_counter::<NoLabelSet, _, u64>(&total.ignored_responses, None)?;
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_in_flight",
                "Requests in flight on each engine core",
                None,
                MetricType::Gauge,
            )?;
            for (i, s) in cores.iter().enumerate() {
                let core = i.to_string();
                let labels = [("core", core.as_str())];
                let mut fe = me.encode_family(&labels)?;
                fe.encode_gauge(&s.in_flight)?;
            }
        }
        Ok(())
    }
}

impl Collector for Exporter {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        self.encode_layer(&mut encoder)?;
        if let Some(e) = &self.engine {
            self.encode_engine(e, &mut encoder)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_series_render() {
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
        let text = Exporter::new(m.clone()).encode();
        assert!(
            text.contains("ratelimitly_requests_total{outcome=\"granted\"} 1"),
            "{text}"
        );
        assert!(text.contains("ratelimitly_requests_total{outcome=\"timeout\"} 1"));
        assert!(text.contains("ratelimitly_decision_latency_seconds_count 3"));
        assert!(text.contains("ratelimitly_decision_latency_seconds_bucket{le=\"0.0005\"} 1"));
        assert!(
            text.contains("ratelimitly_decision_latency_seconds_bucket{le=\"+Inf\"} 3"),
            "{text}"
        );
        assert_eq!(m.outcome("rejected"), 1);
        assert_eq!(m.decisions(), 3);
    }
}
