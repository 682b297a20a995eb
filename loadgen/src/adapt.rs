//! Adapters to the other crates' APIs: our engine (builder, requests, outcome
//! taxonomy), the official client (builder, policy) and the responder's counters.
//!
//! Owns only the mapping; the load shape lives in `driver`, the servers in `setup`.

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::policy::RequestPolicy;

use crate::cli::{Args, ScheduleArg};
use crate::driver::{Official, Target};
use crate::workload::Workload;

/// Our engine's policy from the command line.
pub fn engine_policy(a: &Args) -> Result<RequestPolicy, ratelimitly_engine::policy::PolicyError> {
    RequestPolicy::builder()
        .unit(Duration::from_millis(u64::from(a.unit_ms)))
        .replays(a.replays)
        .schedule(crate::engine_schedule(a.schedule))
        .final_units(a.final_units)
        .completion_delivery(!a.no_completion_delivery)
        .build()
}

/// The official client's policy from the command line (validated at build).
pub fn official_policy(a: &Args) -> Result<ratelimitly::RequestPolicy, String> {
    use ratelimitly::Schedule;
    let s = match a.schedule {
        ScheduleArg::Fixed(b) => Schedule::fixed(b),
        ScheduleArg::Linear { initial, step, max } => Schedule::linear(initial, step, max),
        ScheduleArg::Exponential {
            initial,
            factor,
            max,
        } => Schedule::exponential(initial, factor, max),
    };
    ratelimitly::RequestPolicy::builder()
        .unit(Duration::from_millis(u64::from(a.unit_ms)))
        .replays(u32::from(a.replays))
        .replay_gap(s)
        .final_receive_units(a.final_units)
        .completion_delivery(!a.no_completion_delivery)
        .build()
        .map_err(|e| format!("official policy: {e}"))
}

/// Builds the official client (inside its Tokio runtime) against the DNS responder.
pub async fn official_target(
    key_text: &str,
    domain: &str,
    dns: Option<SocketAddr>,
    policy: Result<ratelimitly::RequestPolicy, String>,
    work: &Workload,
) -> Result<Target, String> {
    let key: ratelimitly::ApiKey = key_text
        .parse()
        .map_err(|_| "the official client refused the API key".to_string())?;
    let mut b = ratelimitly::Client::builder(key)
        .service_domain(domain)
        .map_err(|e| format!("official client: {e}"))?
        .request_policy(policy?);
    if let Some(d) = dns {
        b = b.dns_server(d);
    }
    let client = b
        .build()
        .await
        .map_err(|e| format!("official client: {e}"))?;
    let o = Official::prepare(client, work).map_err(|e| format!("official client: {e}"))?;
    Ok(Target::Official(o))
}

pub use crate::engine_client::EngineTarget;

/// Shuts a client down after its phase (the engine completes everything in flight).
pub fn shutdown(t: Target) {
    match t {
        Target::Engine(e) => e.shutdown(),
        Target::Official(o) => drop(o),
    }
}

/// Datagrams one responder has received (every datagram, valid or dropped).
pub fn responder_received(c: &rl_responder::Counters) -> u64 {
    c.received
}
