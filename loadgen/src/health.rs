//! Whether a run's figures can be trusted, and if not, why: a client that did not
//! complete what it submitted (or failed `--chaos`) is a bug (exit 1); a client that made
//! no decision in its window, or whose requests timed out more often than
//! `--max-timeout-share`, measured something else than decisions (exit 3), and the
//! message names the cause: what the requests ended in and, against external servers,
//! what a probe of them saw (`rl_toolkit::probe`: port unreachable, no answer from a
//! reachable server, another server id), in the words rlctl uses.
//!
//! Owns the verdict and its messages. Must not touch the measurement or output formats.

use crate::clients::RunContext;
use crate::output::PhaseResult;
use crate::stats::{KINDS, Kind};

/// What a run's results are worth.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every client completed what it submitted, decided, and timed out rarely enough.
    Trusted,
    /// A client's submitted != completed (or `--chaos` failed).
    Unbalanced,
    /// Decisions are missing or timeouts too many; one message per cause.
    Untrusted(Vec<String>),
}

/// The verdict on `results` (no result at all is untrusted too).
pub fn verdict(ctx: &RunContext<'_>, results: &[PhaseResult]) -> Verdict {
    if results
        .iter()
        .any(|r| !r.balanced() || r.extra.chaos.as_ref().is_some_and(|c| !c.passed()))
    {
        return Verdict::Unbalanced;
    }
    if results.is_empty() {
        return Verdict::Untrusted(vec!["no client produced a result".into()]);
    }
    let mut causes: Vec<String> = results.iter().filter_map(|r| cause(ctx, r)).collect();
    if causes.is_empty() {
        return Verdict::Trusted;
    }
    if !ctx.servers.embedded {
        causes.extend(probe(ctx));
    }
    Verdict::Untrusted(causes)
}

/// Requests of the window that were sent (decisions and failures; not reports, not
/// requests refused as overloaded before sending).
fn sent(r: &PhaseResult) -> u64 {
    KINDS
        .iter()
        .filter(|k| k.has_latency())
        .map(|k| r.rec.window(*k))
        .sum()
}

/// What the window's operations ended in, e.g. `1280 timeout` (non-zero kinds).
fn ended_in(r: &PhaseResult) -> String {
    let parts: Vec<String> = KINDS
        .iter()
        .filter(|k| r.rec.window(**k) > 0)
        .map(|k| format!("{} {}", r.rec.window(*k), k.name()))
        .collect();
    if parts.is_empty() {
        "nothing completed in it".into()
    } else {
        format!("outcomes: {}", parts.join(", "))
    }
}

/// Why this client's figures cannot be trusted, if they cannot.
fn cause(ctx: &RunContext<'_>, r: &PhaseResult) -> Option<String> {
    let client = r.client.name();
    if r.decisions() == 0 {
        return Some(rl_toolkit::words::no_decision(client, &ended_in(r)));
    }
    let max = ctx.args.max_timeout_share;
    let (timeouts, n) = (r.rec.window(Kind::Timeout), sent(r));
    let share = timeouts as f64 / n.max(1) as f64;
    (!ctx.args.chaos && share > max).then(|| {
        format!(
            "{client}: {timeouts} of {n} requests in the window timed out ({:.2}%, more than \
             --max-timeout-share {max})",
            share * 100.0
        )
    })
}

/// What a probe of the external servers saw, one message per endpoint.
fn probe(ctx: &RunContext<'_>) -> Vec<String> {
    let Ok(policy) = ctx.args.policy() else {
        return Vec::new();
    };
    let servers = ctx.servers;
    match rl_toolkit::probe::probe(&servers.key, &policy, &servers.endpoints) {
        Ok(findings) => findings.iter().map(|f| format!("probe: {f}")).collect(),
        Err(e) => vec![format!("probe of the servers could not be sent: {e}")],
    }
}
