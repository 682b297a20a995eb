//! The result of `rlctl request` as printed: one JSON object (its keys are a contract,
//! see `cli.rs`'s request help) or readable text naming the buckets and trackers.
//!
//! Owns: [`RequestSummary`] and its two renderings. Must not touch: sending, keys.

use serde_json::{Value, json};

use ratelimitly_engine::proto::outcome::Response;

use crate::output::hex16;

/// The fields of a request's result, ready to print.
pub struct RequestSummary {
    pub outcome: &'static str,
    pub failure: Option<&'static str>,
    pub response: Option<Response>,
    pub round: Option<u32>,
    pub latency_us: u64,
    pub horizon_ms: Option<u32>,
    pub sends: u32,
    pub completion_sends: u32,
    pub error: Option<String>,
    /// The exit status.
    pub code: u8,
}

impl RequestSummary {
    /// A failure: no response, no sends (the caller fills in sends it knows of).
    pub fn failed(
        category: &'static str,
        error: String,
        code: u8,
        horizon_ms: Option<u32>,
    ) -> Self {
        RequestSummary {
            outcome: "failed",
            failure: Some(category),
            response: None,
            round: None,
            latency_us: 0,
            horizon_ms,
            sends: 0,
            completion_sends: 0,
            error: Some(error),
            code,
        }
    }

    /// Adds what was seen of each endpoint to the error (the JSON keeps its keys: the
    /// findings extend the `error` text).
    pub fn explain(&mut self, findings: &[rl_toolkit::words::EndpointFinding]) {
        if findings.is_empty() {
            return;
        }
        let seen = rl_toolkit::words::one_line(findings);
        self.error = Some(match self.error.take() {
            Some(e) => format!("{e}. {seen}"),
            None => seen,
        });
    }

    /// The one-line JSON object.
    pub fn to_json(&self) -> Value {
        let (server_id, resources, guards) = match &self.response {
            Some(r) => (
                r.server_id,
                r.resources
                    .iter()
                    .map(|x| {
                        json!({
                            "bucket_id": hex16(&x.bucket_id),
                            "actual_rate": x.actual_rate,
                            "deficit": x.deficit,
                        })
                    })
                    .collect::<Vec<_>>(),
                r.guards
                    .iter()
                    .map(|g| {
                        json!({
                            "tracker_id": hex16(&g.tracker_id),
                            "threshold_ms": g.threshold_ms,
                            "current_latency_ms": g.current_latency_ms,
                            "passed": g.passed,
                        })
                    })
                    .collect::<Vec<_>>(),
            ),
            None => (None, Vec::new(), Vec::new()),
        };
        json!({
            "outcome": self.outcome,
            "failure": self.failure,
            "server_id": server_id,
            "round": self.round,
            "latency_us": self.latency_us,
            "horizon_ms": self.horizon_ms,
            "sends": self.sends,
            "completion_sends": self.completion_sends,
            "resources": resources,
            "guards": guards,
            "error": self.error,
        })
    }

    /// The first line: outcome, failure category, server, round.
    fn headline(&self) -> String {
        let mut line = format!("outcome: {}", self.outcome);
        if let Some(f) = self.failure {
            line.push_str(&format!(" ({f})"));
        }
        if let Some(r) = &self.response {
            match r.server_id {
                Some(id) => line.push_str(&format!("  server {id}")),
                None => line.push_str("  (local: nothing to send)"),
            }
        }
        if let Some(k) = self.round {
            line.push_str(&format!("  round {k}"));
        }
        line
    }

    /// Readable text; `names` maps bucket and tracker ids to the names given.
    pub fn print_text(&self, names: &[(String, [u8; 16])]) {
        let name_of = |id: &[u8; 16]| {
            names
                .iter()
                .find(|(_, i)| i == id)
                .map_or_else(|| hex16(id), |(n, i)| format!("{n} ({})", hex16(i)))
        };
        println!("{}", self.headline());
        let horizon = self
            .horizon_ms
            .map_or_else(|| "-".to_owned(), |h| format!("{h} ms"));
        println!(
            "latency: {:.3} ms  horizon: {horizon}  sends: {} (completion: {})",
            self.latency_us as f64 / 1000.0,
            self.sends,
            self.completion_sends
        );
        if let Some(r) = &self.response {
            for x in &r.resources {
                println!(
                    "resource {}: actual_rate {} deficit {}",
                    name_of(&x.bucket_id),
                    x.actual_rate,
                    x.deficit
                );
            }
            for g in &r.guards {
                println!(
                    "guard {}: current latency {} ms, threshold {} ms: {}",
                    name_of(&g.tracker_id),
                    g.current_latency_ms,
                    g.threshold_ms,
                    if g.passed { "passed" } else { "FAILED" }
                );
            }
        }
        if let Some(e) = &self.error {
            println!("error: {e}");
        }
    }
}
