//! Adapters to the other crates' APIs: our engine (builder, requests, outcome
//! taxonomy), the official client (builder, policy) and the responder's counters.
//!
//! Owns only the mapping; the load shape lives in `driver`, the servers in `setup`.

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::engine::{Cores, Engine, EngineHandle};
use ratelimitly_engine::ids::{LatencyTracker, Resource};
use ratelimitly_engine::outcome::{Decision, Failure, Outcome};
use ratelimitly_engine::policy::RequestPolicy;

use crate::cli::{Args, ScheduleArg};
use crate::driver::{Official, Target};
use crate::setup::Servers;
use crate::stats::Kind;
use crate::workload::{self, Workload};

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
    let client = b.build().await.map_err(|e| format!("official client: {e}"))?;
    let o = Official::prepare(client, work).map_err(|e| format!("official client: {e}"))?;
    Ok(Target::Official(o))
}

/// Our engine with the prepared resources and trackers.
pub struct EngineTarget {
    engine: Option<Engine>,
    handle: EngineHandle,
    resources: Vec<Resource>,
    trackers: Vec<LatencyTracker>,
    work: Workload,
}

impl EngineTarget {
    pub fn build(
        servers: &Servers,
        args: &Args,
        work: &Workload,
        cores: &[usize],
    ) -> Result<Self, String> {
        let policy = engine_policy(args).map_err(|e| format!("policy: {e}"))?;
        let mut b = Engine::builder(servers.key.clone())
            .policy(policy)
            .cores(Cores::List(cores.to_vec()))
            .in_flight_per_core(args.in_flight.max(1024));
        if args.socket_buffer > 0 {
            b = b.socket_buffers(args.socket_buffer, args.socket_buffer);
        }
        b = if servers.via_dns {
            b.dns(ratelimitly_engine::engine::DnsConfig {
                domain: Some(servers.domain.clone()),
                server: servers.dns_server,
            })
        } else {
            b.endpoints(servers.endpoints.clone())
        };
        let engine = b.build().map_err(|e| format!("engine: {e}"))?;
        let handle = engine.handle();
        let resources = (0..work.buckets)
            .map(|i| {
                Resource::new(
                    Workload::bucket_name(i),
                    Duration::from_millis(u64::from(work.window_ms)),
                    work.rate_limit,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("resource: {e}"))?;
        let trackers = (0..work.guards.max(1))
            .map(|i| {
                LatencyTracker::new(
                    Workload::tracker_name(i),
                    Duration::from_millis(u64::from(workload::TRACKER_TTL_MS)),
                    workload::TRACKER_MAX_SAMPLES,
                    workload::TRACKER_MIN_SAMPLES,
                )
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("tracker: {e}"))?;
        Ok(EngineTarget {
            engine: Some(engine),
            handle,
            resources,
            trackers,
            work: work.clone(),
        })
    }

    pub async fn op(&self, j: u64) -> (Kind, Option<u32>) {
        if self.work.is_report(j) {
            let r = self.handle.report(
                &self.trackers[0],
                Duration::from_millis(u64::from(workload::REPORT_MS)),
            );
            return (if r.is_ok() { Kind::Report } else { Kind::ReportFailed }, None);
        }
        let mut b = self.handle.request();
        for i in self.work.buckets_of(j) {
            b = b.consume(&self.resources[i], 1);
        }
        for t in self.trackers.iter().take(self.work.guards) {
            b = b.guard(
                t,
                Duration::from_millis(u64::from(workload::GUARD_THRESHOLD_MS)),
            );
        }
        if !self.work.label.is_empty() {
            b = b.label(&self.work.label);
        }
        outcome_kind(b.send().await)
    }
}

/// Maps an engine outcome to a kind and its datagram count.
pub fn outcome_kind(o: Outcome) -> (Kind, Option<u32>) {
    match o {
        Ok(r) => (
            match r.decision {
                Decision::Granted => Kind::Granted,
                Decision::Rejected => Kind::Rejected,
            },
            Some(r.sends),
        ),
        Err(f) => (
            match f {
                Failure::Configuration(_) => Kind::Configuration,
                Failure::Discovery(_) => Kind::Discovery,
                Failure::Communication(_) => Kind::Communication,
                Failure::Timeout { .. } => Kind::Timeout,
                Failure::Overloaded => Kind::Overloaded,
                Failure::Shutdown => Kind::Shutdown,
            },
            None,
        ),
    }
}

/// Shuts a client down after its phase (the engine completes everything in flight).
pub fn shutdown(t: Target) {
    match t {
        Target::Engine(mut e) => {
            if let Some(engine) = e.engine.take() {
                engine.shutdown();
            }
        }
        Target::Official(o) => drop(o),
    }
}

/// Datagrams one responder has received (every datagram, valid or dropped).
pub fn responder_received(c: &rl_responder::Counters) -> u64 {
    c.received
}
