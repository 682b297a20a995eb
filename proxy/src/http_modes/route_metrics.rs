//! Per-route series of the HTTP modes: each limited route's decisions and failures by
//! outcome, and its decision latency, named by the route's `label` (else its path; the
//! one-route flags' route is `default`). Cardinality is bounded by the routes configured
//! (since start, reloads included), never by clients.
//!
//! ```text
//! rl_proxy_route_requests_total{route="R",outcome="granted|rejected|timeout|..."}
//! rl_proxy_route_decision_latency_seconds{route="R"} (histogram)
//! ```
//!
//! Owns: the routes' counters (kept across reloads: a route keeps its series) and their
//! text. Must not touch: requests (the layer counts into them).

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use ratelimitly_tower::{LATENCY_BUCKETS, LayerMetrics, OUTCOMES};

/// The counters of every route by name.
#[derive(Debug, Default)]
pub struct RouteMetrics {
    routes: Mutex<Vec<(String, Arc<LayerMetrics>)>>,
}

impl RouteMetrics {
    /// No route yet.
    pub fn new() -> Arc<Self> {
        Arc::new(RouteMetrics::default())
    }

    /// The counters of route `name` (made on first use).
    pub fn of(&self, name: &str) -> Arc<LayerMetrics> {
        let mut routes = self.routes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, m)) = routes.iter().find(|(n, _)| n == name) {
            return m.clone();
        }
        let m = LayerMetrics::new();
        routes.push((name.to_owned(), m.clone()));
        m
    }

    /// Appends the series of every route to `out`.
    pub fn encode(&self, out: &mut String) {
        let routes = self
            .routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if routes.is_empty() {
            return;
        }
        out.push_str(
            "# HELP rl_proxy_route_requests_total Decisions and failures per route, by outcome.\n\
             # TYPE rl_proxy_route_requests_total counter\n",
        );
        for (name, m) in &routes {
            let name = escape(name);
            for (outcome, n) in OUTCOMES.iter().zip(m.outcomes()) {
                let _ = writeln!(
                    out,
                    "rl_proxy_route_requests_total{{route=\"{name}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        out.push_str(
            "# HELP rl_proxy_route_decision_latency_seconds Admission call to verdict, per route.\n\
             # TYPE rl_proxy_route_decision_latency_seconds histogram\n",
        );
        for (name, m) in &routes {
            let name = escape(name);
            let mut cumulative = 0;
            for (le, n) in LATENCY_BUCKETS.iter().zip(m.latency_buckets()) {
                cumulative += n;
                let _ = writeln!(
                    out,
                    "rl_proxy_route_decision_latency_seconds_bucket{{route=\"{name}\",le=\"{le}\"}} {cumulative}"
                );
            }
            let count = m.decisions();
            let _ = write!(
                out,
                "rl_proxy_route_decision_latency_seconds_bucket{{route=\"{name}\",le=\"+Inf\"}} {count}\n\
                 rl_proxy_route_decision_latency_seconds_sum{{route=\"{name}\"}} {}\n\
                 rl_proxy_route_decision_latency_seconds_count{{route=\"{name}\"}} {count}\n",
                m.latency_sum().as_secs_f64()
            );
        }
    }
}

/// A label value in the Prometheus text format.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ratelimitly_tower::Verdict;

    use super::*;

    #[test]
    fn each_route_has_its_series_kept_by_name() {
        let reg = RouteMetrics::new();
        reg.of("api")
            .record(&Verdict::Granted, Duration::from_micros(300));
        reg.of("api")
            .record(&Verdict::Granted, Duration::from_millis(3));
        reg.of("a\"b")
            .record(&Verdict::Rejected { retry_after: None }, Duration::ZERO);
        let mut page = String::new();
        reg.encode(&mut page);
        assert!(
            page.contains("rl_proxy_route_requests_total{route=\"api\",outcome=\"granted\"} 2\n")
        );
        assert!(
            page.contains(
                "rl_proxy_route_requests_total{route=\"a\\\"b\",outcome=\"rejected\"} 1\n"
            )
        );
        assert!(page.contains(
            "rl_proxy_route_decision_latency_seconds_bucket{route=\"api\",le=\"0.0005\"} 1\n"
        ));
        assert!(page.contains("rl_proxy_route_decision_latency_seconds_count{route=\"api\"} 2\n"));
        assert_eq!(page.matches("# TYPE").count(), 2);
    }
}
