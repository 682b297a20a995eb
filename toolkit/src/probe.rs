//! The reachability probe a tool runs when its requests went unanswered: one traced
//! request ([`crate::trace`]) to every endpoint, with the same key and policy, that
//! carries a single latency guard and no resource, so that a server that answers debits
//! nothing. Its events tell an ICMP error (closed port, unreachable host), a response
//! from another server id, datagrams this key cannot read, and silence apart.
//!
//! Owns: the probe's request (tracker [`PROBE_TRACKER`]). Must not touch: the tools'
//! output.

use std::io;

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::GuardSpec;

use crate::trace::{self, TraceRequest};
use crate::words::EndpointFinding;

/// Name of the probe's latency tracker (TTL 1 s, 1 sample kept, warm-up 1). A server
/// that answers the probe evaluates this guard and consumes no token; it may keep an
/// empty tracker of this name for its TTL.
pub const PROBE_TRACKER: &str = "rl-probe";

/// The probe's one guard: [`PROBE_TRACKER`], threshold 60 s (it passes).
fn probe_guard() -> GuardSpec {
    let (ttl_ms, max_samples, min_samples) = (1_000, 1, 1);
    GuardSpec {
        tracker_id: ratelimitly_engine::proto::ids::tracker_id(
            PROBE_TRACKER.as_bytes(),
            ttl_ms,
            max_samples,
            min_samples,
        ),
        ttl_ms,
        max_samples,
        min_samples,
        threshold_ms: 60_000,
        current_latency_ms: 0,
    }
}

/// Probes `endpoints` with `key` under `policy` (one horizon at most) and says what came
/// back from each. Fails only if the probe cannot be sent (no socket).
pub fn probe(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: &[Endpoint],
) -> io::Result<Vec<EndpointFinding>> {
    let guards = [probe_guard()];
    let req = TraceRequest {
        key,
        policy,
        endpoints,
        guards: &guards,
        resources: &[],
        label: "",
    };
    Ok(trace::run(&req, |_| {})?.findings())
}
