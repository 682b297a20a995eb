//! Our engine as a loadgen [`Target`]: builds the engine on the client cores with the
//! run's policy and endpoints, prepares the resources and trackers once, and maps
//! each operation to a request (or latency report) and its outcome to a kind.
//!
//! At shutdown it leaves the engine's I/O counters and latency breakdown in the phase's
//! [`ExtraSlot`]. Must not set up servers or measure; `tokio_driver` shapes the load.

use std::time::Duration;

use ratelimitly_engine::engine::{Cores, Engine, EngineHandle};
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource};

use ratelimitly_engine::proto::outcome::{Decision, FailureCategory, Outcome};

use super::tokio_driver::{self, AsyncClient};
use super::{PhaseSpec, Ready, RunContext, Target};
use crate::extra::{ExtraSlot, Stage};
use crate::stats::Kind;
use crate::workload::{self, Workload};

/// Our engine, built and ready, as a loadgen client.
pub struct EngineTarget(EngineClient);

impl EngineTarget {
    /// Builds the engine on the client cores (its threads start now).
    pub fn build(ctx: &RunContext<'_>) -> Result<Self, String> {
        EngineClient::build(ctx).map(EngineTarget)
    }
}

impl Target for EngineTarget {
    fn run(self: Box<Self>, spec: PhaseSpec, ready: Ready) {
        let mut client = self.0;
        client.extra = spec.extra.clone();
        tokio_driver::run_phase(spec, ready, move || async move { Ok(client) });
    }
}

/// Our engine with the prepared resources and trackers.
pub struct EngineClient {
    engine: Option<Engine>,
    handle: EngineHandle,
    resources: Vec<Resource>,
    trackers: Vec<LatencyTracker>,
    work: Workload,
    /// Where the engine's I/O counters and latency breakdown go at shutdown.
    extra: ExtraSlot,
}

impl EngineClient {
    fn build(ctx: &RunContext<'_>) -> Result<Self, String> {
        let (servers, args, work, cores) = (ctx.servers, ctx.args, &ctx.work, &ctx.client_cores);
        let policy = args.policy().map_err(|e| format!("policy: {e}"))?;
        let mut b = Engine::builder(servers.key.clone())
            .policy(policy)
            .cores(Cores::List(cores.to_vec()))
            .in_flight_per_core(args.in_flight.max(1024))
            .io_backend(args.io)
            .gso(args.gso);
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
        Ok(EngineClient {
            engine: Some(engine),
            handle,
            resources,
            trackers,
            work: work.clone(),
            extra: ExtraSlot::default(),
        })
    }
}

impl AsyncClient for EngineClient {
    async fn op(&self, j: u64) -> (Kind, Option<u32>) {
        if self.work.is_report(j) {
            let r = self.handle.report(
                &self.trackers[0],
                Duration::from_millis(u64::from(workload::REPORT_MS)),
            );
            return (Kind::report(r.is_ok()), None);
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

    fn finish(self) {
        self.shutdown();
    }
}

/// Maps an engine outcome to a kind and its datagram count.
fn outcome_kind(o: Outcome) -> (Kind, Option<u32>) {
    match o {
        Ok(r) => (
            match r.decision {
                Decision::Granted => Kind::Granted,
                Decision::Rejected => Kind::Rejected,
            },
            Some(r.sends),
        ),
        Err(f) => (
            match f.category() {
                FailureCategory::Configuration => Kind::Configuration,
                FailureCategory::Discovery => Kind::Discovery,
                FailureCategory::Timeout => Kind::Timeout,
                FailureCategory::Overloaded => Kind::Overloaded,
                FailureCategory::Shutdown => Kind::Shutdown,
                // Communication, and any category added later
                _ => Kind::Communication,
            },
            None,
        ),
    }
}

impl EngineClient {
    /// Shuts the engine down (every in-flight request completes exactly once).
    fn shutdown(mut self) {
        let s = self.handle.stats();
        let replay_decisions: u64 = s.decisions_by_round[1..].iter().sum();
        eprintln!(
            "  engine stats: decisions round0 {} replay rounds {} final {} timeouts {} oldest fallbacks {} sends {} (completion {}) drops {} p99 {} µs",
            s.decisions_by_round[0],
            replay_decisions,
            s.decisions_final,
            s.timeouts,
            s.oldest_fallbacks,
            s.sends,
            s.completion_sends,
            s.drops.iter().sum::<u64>(),
            s.latency_us.value_at_quantile(0.99),
        );
        {
            let mut e = self.extra.lock().unwrap_or_else(|p| p.into_inner());
            e.io = s.io.clone();
            e.breakdown = vec![
                Stage::of("queue_wait", &s.queue_wait_us),
                Stage::of("wire", &s.wire_us),
                Stage::of("decision", &s.decision_us),
                Stage::of("completion_wake", &s.completion_wake_us),
            ];
        }
        if let Some(engine) = self.engine.take() {
            engine.shutdown();
        }
    }
}
