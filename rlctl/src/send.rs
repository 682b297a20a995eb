//! How rlctl sends: [`request`] runs one resource request through the engine
//! (`ratelimitly_engine::engine::Engine` on one core with static endpoints),
//! [`traced_request`] runs it through the engine's request machine on rlctl's own socket
//! (`rl_toolkit::trace`, for `--verbose`), and [`report`] queues the latency reports on
//! a one-core engine, flushes them once and counts the datagrams from the engine's
//! statistics.
//!
//! Owns: the one-shot engine set-up, the request's blocks for the trace, and the mapping
//! of both to rlctl's figures. An engine that cannot start is returned as its [`BuildError`] (nothing was
//! sent); the commands map it to a configuration failure. Must not touch: request
//! policy rules (the engine's machine), argument parsing (cli.rs) and output (cmd/).

use std::time::{Duration, Instant};

use ratelimitly_engine::engine::{BuildError, Cores, Engine};
use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource};
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::outcome::{CommError, Failure, Outcome};
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::{GuardSpec, ResourceSpec};
use rl_toolkit::trace::{self, Event, TraceRequest};
use rl_toolkit::words::EndpointFinding;

/// What one request run produced.
#[derive(Debug)]
pub struct RequestRun {
    /// The outcome.
    pub outcome: Outcome,
    /// Request datagrams actually sent (also known when the outcome is a failure).
    pub sends: u32,
    /// Of which completion deliveries.
    pub completion_sends: u32,
    /// From the start of the request (encoding included) to the outcome.
    pub latency: Duration,
}

/// The request's resources (with tokens) and guards (with threshold ms).
pub struct RequestParts<'a> {
    pub resources: &'a [(Resource, u16)],
    pub guards: &'a [(LatencyTracker, u32)],
    pub label: &'a str,
}

/// Why a report run did not send.
#[derive(Debug)]
pub enum ReportError {
    /// The engine could not start on this host; nothing was sent.
    Start(BuildError),
    /// A report was refused, or no datagram could be sent.
    Failed(Failure),
}

fn clamp(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// Sends one resource request to `endpoints` under `policy` through a one-core engine and
/// waits for its outcome. The caller has checked the policy against the key and the
/// resource definitions. rlctl runs one request per engine, so the engine's send counters
/// are this request's. Fails only if the engine cannot start (nothing sent).
pub fn request(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: Vec<Endpoint>,
    parts: &RequestParts<'_>,
) -> Result<RequestRun, BuildError> {
    let engine = Engine::builder(key.clone())
        .policy(policy.clone())
        .cores(Cores::Count(1))
        .endpoints(endpoints)
        .socket_buffers(256 << 10, 256 << 10)
        .in_flight_per_core(16)
        .build()?;
    let h = engine.handle();
    let t0 = Instant::now();
    let mut b = h.request();
    for (r, tokens) in parts.resources {
        b = b.consume(r, u32::from(*tokens));
    }
    for (t, threshold_ms) in parts.guards {
        b = b.guard(t, Duration::from_millis(u64::from(*threshold_ms)));
    }
    let outcome = b.label(parts.label).wait();
    let latency = t0.elapsed();
    let stats = h.stats();
    engine.shutdown();
    Ok(RequestRun {
        outcome,
        sends: clamp(stats.sends),
        completion_sends: clamp(stats.completion_sends),
        latency,
    })
}

/// [`request`], traced: the same request (blocks, label, policy) driven by the engine's
/// request machine on rlctl's own socket, `on_event` called for every transmit, receive
/// and ICMP error. Returns the run and what the trace saw of each endpoint. Fails only
/// if the socket cannot be opened or the request not encoded (nothing sent).
pub fn traced_request(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: &[Endpoint],
    parts: &RequestParts<'_>,
    on_event: impl FnMut(&Event),
) -> std::io::Result<(RequestRun, Vec<EndpointFinding>)> {
    let resources: Vec<ResourceSpec> = parts
        .resources
        .iter()
        .map(|(r, tokens)| ResourceSpec {
            bucket_id: r.id(),
            window_ms: r.window_ms(),
            rate_limit: r.rate_limit(),
            tokens: *tokens,
        })
        .collect();
    let guards: Vec<GuardSpec> = parts
        .guards
        .iter()
        .map(|(t, threshold_ms)| GuardSpec {
            tracker_id: t.id(),
            ttl_ms: t.ttl_ms(),
            max_samples: t.max_samples(),
            min_samples: t.min_samples(),
            threshold_ms: *threshold_ms,
            current_latency_ms: 0,
        })
        .collect();
    let req = TraceRequest {
        key,
        policy,
        endpoints,
        guards: &guards,
        resources: &resources,
        label: parts.label,
    };
    let t = trace::run(&req, on_event)?;
    let findings = t.findings();
    let run = RequestRun {
        outcome: t.outcome,
        sends: t.sends,
        completion_sends: t.completion_sends,
        latency: t.latency,
    };
    Ok((run, findings))
}

/// What a latency report run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportRun {
    /// Datagrams sent (all endpoints, all batches).
    pub datagrams: u32,
    /// Endpoints addressed.
    pub endpoints: u32,
}

/// Longest report flush interval the engine accepts: nothing is flushed by age while
/// rlctl queues its few entries, so every datagram is as full as the mode allows.
const ENGINE_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// Sends one latency report per `(tracker, observed ms)` pair once to every endpoint,
/// coalesced up to the mode's per-datagram maximum (each datagram with a fresh unique
/// id), through a one-core engine whose reports are flushed once all pairs are queued.
/// Fails if the engine cannot start, a report is refused, or no datagram could be sent.
pub fn report(
    key: &ApiKey,
    endpoints: &[Endpoint],
    pairs: &[(LatencyTracker, u32)],
) -> Result<ReportRun, ReportError> {
    if endpoints.is_empty() {
        return Err(ReportError::Failed(Failure::Discovery(
            ratelimitly_engine::discovery::DiscoveryError::NoServer,
        )));
    }
    // the queue must hold every entry until the core drains it
    let queue = pairs.len().saturating_add(16).min(1 << 16);
    let engine = Engine::builder(key.clone())
        .cores(Cores::Count(1))
        .endpoints(endpoints.to_vec())
        .socket_buffers(256 << 10, 256 << 10)
        .in_flight_per_core(queue)
        .report_interval(ENGINE_REPORT_INTERVAL)
        .build()
        .map_err(ReportError::Start)?;
    let h = engine.handle();
    let mut queued = Ok(());
    for (t, observed_ms) in pairs {
        let observed = Duration::from_millis(u64::from(*observed_ms));
        let mut r = h.report(t, observed);
        if matches!(r, Err(Failure::Overloaded)) {
            // the queue is full: let the core drain it, then retry once
            h.flush_reports();
            r = h.report(t, observed);
        }
        if let Err(f) = r {
            queued = Err(f);
            break;
        }
    }
    let stats = h.flush_reports();
    engine.shutdown();
    queued.map_err(ReportError::Failed)?;
    let endpoints = clamp(endpoints.len() as u64);
    let datagrams = clamp(stats.report_datagrams);
    if datagrams == 0 && !pairs.is_empty() {
        return Err(ReportError::Failed(Failure::Communication(
            CommError::AllSendsFailed { endpoints },
        )));
    }
    Ok(ReportRun {
        datagrams,
        endpoints,
    })
}
