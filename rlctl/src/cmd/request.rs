//! `rlctl request`: validates everything before any send (key, policy against the key,
//! resources, guards), sends one request through a one-core engine and prints the
//! outcome with its exit status.
//!
//! Exit-status mapping: granted 0, rejected 1; failures by category — configuration 2
//! (also an engine that cannot start on this host: nothing was sent), timeout 3,
//! discovery / communication / overload / shutdown 4.
//!
//! A timeout is explained per endpoint (`rl_toolkit::words`): by a probe after the
//! engine's request, or, with `--verbose`, by the traced request itself.

use std::time::Duration;

use ratelimitly_engine::engine::BuildError;
use ratelimitly_engine::key_source::{self, KeyLoadError};
use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::error::{ConfigError, RequestError};
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource};
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::outcome::{Decision, Failure, FailureCategory, Phase, Response};
use ratelimitly_engine::proto::policy::{PolicyError, RequestPolicy};
use rl_toolkit::probe;
use rl_toolkit::trace::Event;

use super::request_view::RequestSummary;
use crate::cli::RequestCmd;
use crate::output::{EXIT_COMM, EXIT_CONFIG, EXIT_OK, EXIT_REJECTED, EXIT_TIMEOUT, print_json};
use crate::send::{self, RequestRun};
use crate::servers::endpoints_for;

/// A failure found before anything was sent.
#[derive(Debug)]
enum SetupError {
    /// The key could not be loaded or is invalid.
    Key(KeyLoadError),
    /// The policy is invalid or over the key's limit.
    Policy(PolicyError),
    /// A resource, tracker or request check failed.
    Config(ConfigError),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Key(e) => e.fmt(f),
            Self::Policy(e) => write!(f, "invalid policy: {e}"),
            Self::Config(e) => e.fmt(f),
        }
    }
}

/// Everything validated, ready to send.
struct Prepared {
    key: ApiKey,
    policy: RequestPolicy,
    resources: Vec<(Resource, u16)>,
    guards: Vec<(LatencyTracker, u32)>,
}

fn policy_of(r: &RequestCmd) -> Result<RequestPolicy, PolicyError> {
    RequestPolicy::builder()
        .unit(Duration::from_millis(u64::from(r.unit_ms)))
        .replays(r.replays)
        .schedule(r.schedule)
        .final_units(r.final_units)
        .completion_delivery(!r.no_completion_delivery)
        .build()
}

fn prepare(r: &RequestCmd) -> Result<Prepared, SetupError> {
    let key = key_source::load_key(r.key.key_file.as_deref()).map_err(SetupError::Key)?;
    let policy = policy_of(r).map_err(SetupError::Policy)?;
    policy.check_key(&key).map_err(SetupError::Policy)?;
    let window_max = key.quotas().rate_window_size_ms_max;
    let mut resources = Vec::with_capacity(r.consume.len());
    for c in &r.consume {
        let res = Resource::new(
            c.name.clone(),
            Duration::from_millis(u64::from(c.window_ms)),
            c.rate_limit,
        )
        .map_err(SetupError::Config)?;
        if res.window_ms() > window_max {
            return Err(SetupError::Config(ConfigError::Request(
                RequestError::WindowOverKeyLimit {
                    window_ms: res.window_ms(),
                    limit_ms: window_max,
                },
            )));
        }
        resources.push((res, c.tokens));
    }
    let mut guards = Vec::with_capacity(r.guard.len());
    for g in &r.guard {
        guards.push((g.tracker().map_err(SetupError::Config)?, g.threshold_ms));
    }
    Ok(Prepared {
        key,
        policy,
        resources,
        guards,
    })
}

fn failure_summary(f: &Failure, horizon_ms: u32) -> RequestSummary {
    let (cat, code) = match f.category() {
        FailureCategory::Configuration => ("configuration", EXIT_CONFIG),
        FailureCategory::Discovery => ("discovery", EXIT_COMM),
        FailureCategory::Timeout => ("timeout", EXIT_TIMEOUT),
        // Overloaded, Shutdown and any category added later
        _ => ("communication", EXIT_COMM),
    };
    RequestSummary::failed(cat, f.to_string(), code, Some(horizon_ms))
}

/// An engine that cannot start on this host: a configuration failure, nothing sent.
pub fn start_failure(e: &BuildError) -> String {
    format!("the engine cannot start on this host: {e}")
}

fn summarize(run: RequestRun, policy: &RequestPolicy) -> RequestSummary {
    let horizon_ms = policy.horizon_ms();
    let latency_us = u64::try_from(run.latency.as_micros()).unwrap_or(u64::MAX);
    match run.outcome {
        Ok(resp) => {
            let granted = resp.decision == Decision::Granted;
            let round = match resp.phase {
                Phase::Round(k) => Some(u32::from(k)),
                Phase::Final => Some(u32::from(policy.replays()) + 1),
                Phase::Local => None,
            };
            RequestSummary {
                outcome: if granted { "granted" } else { "rejected" },
                failure: None,
                round,
                latency_us,
                horizon_ms: Some(horizon_ms),
                sends: resp.sends,
                completion_sends: resp.completion_sends,
                error: None,
                code: if granted { EXIT_OK } else { EXIT_REJECTED },
                response: Some(resp),
            }
        }
        Err(f) => {
            let mut s = failure_summary(&f, horizon_ms);
            s.latency_us = latency_us;
            s.sends = run.sends;
            s.completion_sends = run.completion_sends;
            s
        }
    }
}

fn execute(r: &RequestCmd) -> RequestSummary {
    let p = match prepare(r) {
        Ok(p) => p,
        Err(e) => {
            return RequestSummary::failed("configuration", e.to_string(), EXIT_CONFIG, None);
        }
    };
    let horizon_ms = p.policy.horizon_ms();
    if p.resources.is_empty() && p.guards.is_empty() {
        let local = RequestRun {
            outcome: Ok(Response::local_grant()),
            sends: 0,
            completion_sends: 0,
            latency: Duration::ZERO,
        };
        return summarize(local, &p.policy);
    }
    let endpoints = match endpoints_for(&r.servers, &p.key) {
        Ok(e) => e,
        Err(e) => {
            return RequestSummary::failed("discovery", e.to_string(), EXIT_COMM, Some(horizon_ms));
        }
    };
    let parts = send::RequestParts {
        resources: &p.resources,
        guards: &p.guards,
        label: r.label.as_deref().unwrap_or(""),
    };
    if r.verbose {
        return traced(&p, &endpoints, &parts);
    }
    match send::request(&p.key, &p.policy, endpoints.clone(), &parts) {
        Ok(run) => {
            let timed_out = matches!(run.outcome, Err(Failure::Timeout { .. }));
            let mut summary = summarize(run, &p.policy);
            if timed_out {
                // what the request could not see: ICMP errors, other server ids, silence
                if let Ok(findings) = probe::probe(&p.key, &p.policy, &endpoints) {
                    summary.explain(&findings);
                }
            }
            summary
        }
        Err(e) => RequestSummary::failed(
            "configuration",
            start_failure(&e),
            EXIT_CONFIG,
            Some(horizon_ms),
        ),
    }
}

/// `--verbose`: the request traced on rlctl's own socket, each event on stderr as it
/// happens; a timeout is explained by what the request itself saw.
fn traced(p: &Prepared, endpoints: &[Endpoint], parts: &send::RequestParts<'_>) -> RequestSummary {
    eprintln!(
        "rlctl: tracing the request to {} endpoint(s), horizon {} ms",
        endpoints.len(),
        p.policy.horizon_ms()
    );
    let shown = |e: &Event| eprintln!("  {e}");
    match send::traced_request(&p.key, &p.policy, endpoints, parts, shown) {
        Ok((run, findings)) => {
            let timed_out = matches!(run.outcome, Err(Failure::Timeout { .. }));
            let mut summary = summarize(run, &p.policy);
            if timed_out {
                summary.explain(&findings);
            }
            summary
        }
        Err(e) => RequestSummary::failed(
            "configuration",
            format!("the traced request cannot start on this host: {e}"),
            EXIT_CONFIG,
            Some(p.policy.horizon_ms()),
        ),
    }
}

/// Runs `rlctl request`.
pub fn run(r: &RequestCmd) -> u8 {
    let summary = execute(r);
    if r.json {
        print_json(&summary.to_json());
    } else {
        let mut names: Vec<(String, [u8; 16])> = r
            .consume
            .iter()
            .map(|c| (c.name.clone(), c.bucket_id()))
            .collect();
        names.extend(r.guard.iter().map(|g| (g.name.clone(), g.tracker_id())));
        summary.print_text(&names);
    }
    summary.code
}
