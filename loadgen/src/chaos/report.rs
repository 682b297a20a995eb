//! The chaos report: `chaos` in the JSON result and the human summary.
//!
//! Owns the report's keys and wording. Must not judge (`verdict.rs`).

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{Value, json};

use super::control::Event;
use super::measure::Fds;
use super::schedule::{FAULT_KINDS, FaultKind};
use super::verdict::{Measured, SLACK, Verdict};
use crate::clients::RunContext;

/// What a chaos run did and its verdict (`chaos` in the result).
#[derive(Clone, Debug)]
pub struct ChaosReport {
    pub(super) seed: u64,
    /// The warm-up's rehearsal (faults before the window; `at_s` negative).
    pub(super) warmup_events: Vec<Event>,
    pub(super) events: Vec<Event>,
    pub(super) late: u64,
    pub(super) late_bound_ms: u64,
    pub(super) max_latency_ms: f64,
    pub(super) rss_after_warmup_kib: u64,
    pub(super) rss_end_kib: u64,
    pub(super) fds: Fds,
    /// Outcomes the schedule explains / does not explain, by kind.
    pub(super) explained: BTreeMap<&'static str, u64>,
    pub(super) unexplained: BTreeMap<&'static str, u64>,
    /// Why the run fails (empty: it passes).
    pub(super) failures: Vec<String>,
}

impl ChaosReport {
    pub(super) fn new(ctx: &RunContext<'_>, m: Measured, v: Verdict, fds: Fds) -> Self {
        ChaosReport {
            seed: ctx.args.seed,
            warmup_events: m.warmup_events,
            events: m.events,
            late: v.late,
            late_bound_ms: (ctx.horizon + SLACK).as_millis() as u64,
            max_latency_ms: v.max_latency_ms,
            rss_after_warmup_kib: m.rss.0,
            rss_end_kib: m.rss.1,
            fds,
            explained: v.explained,
            unexplained: v.unexplained,
            failures: v.failures,
        }
    }

    /// True when the run passes (exit 0).
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    fn by_kind(&self) -> Vec<(FaultKind, usize)> {
        FAULT_KINDS
            .iter()
            .map(|k| (*k, self.events.iter().filter(|e| e.kind == *k).count()))
            .collect()
    }

    /// The memory bar: end ≤ 1.1 × after warm-up + 4 MiB.
    fn rss_bound_kib(&self) -> u64 {
        self.rss_after_warmup_kib * 11 / 10 + 4096
    }

    pub fn to_json(&self) -> Value {
        let events = |list: &[Event]| -> Vec<Value> {
            list.iter()
                .map(|e| {
                    let mut m = e.details.clone();
                    m.insert("at_s".into(), json!(e.at_s));
                    m.insert("kind".into(), json!(e.kind.name()));
                    Value::Object(m)
                })
                .collect()
        };
        let by_kind: serde_json::Map<String, Value> = self
            .by_kind()
            .into_iter()
            .map(|(k, n)| (k.name().to_string(), json!(n)))
            .collect();
        json!({
            "seed": self.seed,
            "warmup_events": events(&self.warmup_events),
            "events": events(&self.events),
            "events_by_kind": by_kind,
            "late_completions": self.late,
            "late_bound_ms": self.late_bound_ms,
            "slack_ms": SLACK.as_millis() as u64,
            "max_latency_ms": self.max_latency_ms,
            "rss_kib": {
                "after_warmup": self.rss_after_warmup_kib,
                "end": self.rss_end_kib,
                "bound": self.rss_bound_kib(),
            },
            "fds": {
                "start": self.fds.start,
                "end": self.fds.end,
                "opened": self.fds.opened,
                "closed": self.fds.closed,
                "leaked": self.fds.leaked,
            },
            "outcomes_explained": self.explained,
            "outcomes_unexplained": self.unexplained,
            "failures": self.failures,
            "passed": self.passed(),
        })
    }

    /// The human summary: what happened and the verdict.
    pub fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        write!(
            out,
            "  chaos (seed {}): {} events:",
            self.seed,
            self.events.len()
        )?;
        for (k, n) in self.by_kind() {
            write!(out, " {}={n}", k.name())?;
        }
        writeln!(
            out,
            "; and in the warm-up a rehearsal of {} events",
            self.warmup_events.len()
        )?;
        writeln!(
            out,
            "  chaos: late completions {} (bound H + {} ms = {} ms; slowest {:.1} ms); outcomes explained {:?}, unexplained {:?}",
            self.late,
            SLACK.as_millis(),
            self.late_bound_ms,
            self.max_latency_ms,
            self.explained,
            self.unexplained
        )?;
        writeln!(
            out,
            "  chaos: RSS {} KiB after warm-up, {} KiB at the end (bound {} KiB{}); fds {} at the start, {} at the end{}",
            self.rss_after_warmup_kib,
            self.rss_end_kib,
            self.rss_bound_kib(),
            if self.rss_end_kib <= self.rss_bound_kib() {
                ", ok"
            } else {
                ", OVER"
            },
            self.fds.start,
            self.fds.end,
            if self.fds.start == self.fds.end {
                " (ok)"
            } else {
                " (CHANGED)"
            }
        )?;
        if !self.fds.opened.is_empty() || !self.fds.closed.is_empty() {
            writeln!(
                out,
                "  chaos: descriptors left open {:?}, closed {:?}",
                self.fds.opened, self.fds.closed
            )?;
        }
        for l in &self.fds.leaked {
            writeln!(out, "  chaos: left open: {l}")?;
        }
        if self.passed() {
            writeln!(out, "  chaos: passed")
        } else {
            writeln!(out, "  chaos: FAILED: {}", self.failures.join("; "))
        }
    }
}
