//! The chaos run's verdict: every outcome sorted into explained and unexplained by the
//! schedule, and the exit conditions checked.
//!
//! Owns the verdict's rules. Must not measure (`measure.rs`) or print (`report.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::control::{Event, round3};
use crate::clients::RunContext;
use crate::output::PhaseResult;
use crate::stats::{KINDS, Kind};

/// Slack over H before a completion counts as late: timer and scheduling delays of a
/// loaded two-core machine, where the engine, the responders and the load share cores.
pub const SLACK: Duration = Duration::from_millis(250);

/// What the controller thread measured.
pub(super) struct Measured {
    /// The warm-up's rehearsal (times since the window start: negative).
    pub(super) warmup_events: Vec<Event>,
    pub(super) events: Vec<Event>,
    pub(super) failures: Vec<String>,
    pub(super) rss: (u64, u64),
}

/// Explaining windows of the schedule, in seconds since the phase start.
fn windows(ctx: &RunContext<'_>, events: &[Event]) -> Vec<(f64, f64)> {
    let after = (ctx.horizon + SLACK).as_secs_f64();
    events
        .iter()
        .filter(|e| e.kind.explains_timeouts())
        .map(|e| {
            let until = e.details["until_s"].as_f64().unwrap_or(e.at_s);
            (ctx.args.warmup + e.at_s, ctx.args.warmup + until + after)
        })
        .collect()
}

/// Sorts every outcome into explained and unexplained.
fn tally(
    ctx: &RunContext<'_>,
    r: &PhaseResult,
    events: &[Event],
) -> [BTreeMap<&'static str, u64>; 2] {
    let wins = windows(ctx, events);
    let window_end = ctx.args.warmup + ctx.args.duration;
    let mut out = [BTreeMap::new(), BTreeMap::new()];
    for (sec, counts) in r.rec.by_second.iter().enumerate() {
        let (lo, hi) = (sec as f64, sec as f64 + 1.0);
        let faulty = wins.iter().any(|(a, b)| *a < hi && *b > lo);
        for k in KINDS {
            let n = counts[k.index()];
            if n == 0 {
                continue;
            }
            let ok = match k {
                Kind::Granted | Kind::Report => true,
                Kind::Timeout | Kind::Communication => faulty,
                Kind::Shutdown => hi > window_end,
                _ => false,
            };
            *out[usize::from(!ok)].entry(k.name()).or_insert(0) += n;
        }
    }
    out
}

/// The verdict: outcomes by kind, explained and not, late completions, and why the run
/// fails (empty: it passes).
pub(super) struct Verdict {
    pub(super) explained: BTreeMap<&'static str, u64>,
    pub(super) unexplained: BTreeMap<&'static str, u64>,
    pub(super) late: u64,
    pub(super) max_latency_ms: f64,
    pub(super) failures: Vec<String>,
}

pub(super) fn judge(ctx: &RunContext<'_>, r: &PhaseResult, m: &Measured) -> Verdict {
    let all: Vec<Event> = m.warmup_events.iter().chain(&m.events).cloned().collect();
    let [explained, unexplained] = tally(ctx, r, &all);
    let (late, max_ns) = crate::stats::late_completions();
    let mut failures = m.failures.clone();
    if r.submitted != r.completed {
        failures.push(format!(
            "submitted {} != completed {}",
            r.submitted, r.completed
        ));
    }
    if late > 0 {
        failures.push(format!("{late} completions later than H + slack"));
    }
    if !unexplained.is_empty() {
        failures.push(format!(
            "outcomes the schedule cannot explain: {unexplained:?}"
        ));
    }
    Verdict {
        explained,
        unexplained,
        late,
        max_latency_ms: round3(max_ns as f64 / 1e6),
        failures,
    }
}
