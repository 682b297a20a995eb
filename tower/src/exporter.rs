//! The Prometheus exporter ([`Exporter`], feature `prometheus`): renders the layer's
//! counters ([`LayerMetrics`]) and an engine's statistics in the Prometheus text format.
//!
//! Owns: the series names (listed in `metrics.rs`) and their encoding. Must not touch:
//! requests, the engine's internals (it reads `EngineHandle::core_stats` snapshots at
//! scrape time only).
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

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use ratelimitly_engine::EngineHandle;
use ratelimitly_engine::proto::wire::DropReason;

use crate::metrics::{LATENCY_BUCKETS, LayerMetrics, OUTCOMES};

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

    /// The layer's counters it renders.
    pub fn metrics(&self) -> Arc<LayerMetrics> {
        self.layer.clone()
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
        let outcomes = m.outcomes();
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
                fe.encode_counter::<NoLabelSet, _, u64>(&outcomes[i], None)?;
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
            let per_bucket = m.latency_buckets();
            for (i, ub) in LATENCY_BUCKETS.iter().enumerate() {
                let n = per_bucket[i];
                in_buckets += n;
                buckets.push((*ub, n));
            }
            let count = m.decisions().max(in_buckets);
            buckets.push((f64::INFINITY, count - in_buckets));
            let sum = m.latency_sum().as_secs_f64();
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
            me.encode_counter::<NoLabelSet, _, u64>(&m.not_ready(), None)?;
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_breaker_open",
                "1 while the layer's circuit breaker is open (failure policy applied at once)",
                None,
                MetricType::Gauge,
            )?;
            me.encode_gauge(&i64::from(m.breaker_is_open()))?;
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_breaker_transitions",
                "Circuit breaker transitions, by the state entered",
                None,
                MetricType::Counter,
            )?;
            let (opened, closed) = m.breaker_transitions();
            for (to, c) in [("open", opened), ("closed", closed)] {
                let labels = [("to", to)];
                let mut fe = me.encode_family(&labels)?;
                fe.encode_counter::<NoLabelSet, _, u64>(&c, None)?;
            }
        }
        {
            let mut me = enc.encode_descriptor(
                "ratelimitly_breaker_short_circuits",
                "Requests given the failure policy by the open breaker without asking the service",
                None,
                MetricType::Counter,
            )?;
            me.encode_counter::<NoLabelSet, _, u64>(&m.short_circuits(), None)?;
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
    use std::time::Duration;

    use super::*;
    use crate::admission::Verdict;
    use crate::failure::FailureKind;

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
    }
}
