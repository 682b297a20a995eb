//! Our engine as a loadgen [`Target`]: builds the engine on the client cores with the
//! run's policy and endpoints (a pinned core thread, or a hosted core on the phase's
//! runtime), prepares the resources and trackers once, and maps each operation to a
//! request (or latency report) and its outcome to a kind.
//!
//! At shutdown it leaves the engine's I/O counters and latency breakdown in the phase's
//! [`ExtraSlot`]. Must not set up servers or measure; `tokio_load` shapes the load.

use std::time::Duration;

use ratelimitly_engine::engine::{
    Cores, Engine, EngineBuilder, EngineHandle, Stats as EngineStats,
};
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource};

use ratelimitly_engine::proto::outcome::{Decision, FailureCategory, Outcome};
use ratelimitly_engine::proto::wire::DropReason;

use super::tokio_load::{self, AsyncClient};
use super::{PhaseSpec, Ready, RunContext, Target};
use crate::cli::EngineCore;
use crate::extra::{ExtraSlot, Stage};
use crate::stats::Kind;
use crate::workload::{self, Workload};

/// Our engine, configured, as a loadgen client. A pinned core is built now (its
/// thread starts); a hosted one inside the phase's runtime, whose task it becomes.
pub struct EngineTarget {
    builder: EngineBuilder,
    hosted: bool,
    prepared: Prepared,
    /// `--quiet`: no statistics line at shutdown.
    quiet: bool,
}

impl EngineTarget {
    /// Validates the run's engine options and prepares resources and trackers.
    pub fn build(ctx: &RunContext<'_>) -> Result<Self, String> {
        let (servers, args, cores) = (ctx.servers, ctx.args, &ctx.client_cores);
        let policy = args.policy().map_err(|e| format!("policy: {e}"))?;
        // Open loop: the engine's own limit is the run's outstanding bound, so that it
        // sheds no more than the other clients do (a 20 ms stall at 67,000/s brings
        // 1,340 requests due at once).
        let in_flight = ctx
            .load()
            .max_outstanding()
            .unwrap_or(args.in_flight.max(1024));
        let mut b = Engine::builder(servers.key.clone())
            .policy(policy)
            .cores(Cores::List(cores.to_vec()))
            .in_flight_per_core(in_flight)
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
        Ok(EngineTarget {
            builder: b,
            hosted: args.placement() == EngineCore::Hosted,
            prepared: Prepared::new(&ctx.work)?,
            quiet: args.quiet,
        })
    }
}

impl Target for EngineTarget {
    fn run(self: Box<Self>, spec: PhaseSpec, ready: Ready) {
        let EngineTarget {
            builder,
            hosted,
            prepared,
            quiet,
        } = *self;
        let extra = spec.extra.clone();
        // A pinned engine starts here, on this thread, which is not pinned: its core
        // threads may go to CPUs outside the application's (the engine can only pin to
        // CPUs its builder's thread may run on).
        let start = if hosted {
            Err(builder)
        } else {
            match builder.build() {
                Ok(engine) => Ok(engine),
                Err(e) => {
                    let _ = ready.send(Err(format!("engine: {e}")));
                    return;
                }
            }
        };
        tokio_load::run_phase(spec, ready, move || async move {
            // Ok: the pinned engine; Err: the builder of the hosted one
            let engine = match start {
                Ok(engine) => engine,
                Err(builder) => builder
                    .runtime(tokio::runtime::Handle::current())
                    .build()
                    .map_err(|e| format!("engine: {e}"))?,
            };
            Ok(EngineClient {
                handle: engine.handle(),
                engine: Some(engine),
                prepared,
                extra,
                quiet,
            })
        });
    }
}

/// The resources and trackers of the run's workload, made once.
struct Prepared {
    resources: Vec<Resource>,
    trackers: Vec<LatencyTracker>,
    work: Workload,
}

impl Prepared {
    fn new(work: &Workload) -> Result<Self, String> {
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
        Ok(Prepared {
            resources,
            trackers,
            work: work.clone(),
        })
    }
}

/// Our engine, running, with the prepared resources and trackers.
pub struct EngineClient {
    engine: Option<Engine>,
    handle: EngineHandle,
    prepared: Prepared,
    /// Where the engine's I/O counters and latency breakdown go at shutdown.
    extra: ExtraSlot,
    quiet: bool,
}

impl AsyncClient for EngineClient {
    async fn op(&self, j: u64) -> (Kind, Option<u32>) {
        let Prepared {
            resources,
            trackers,
            work,
        } = &self.prepared;
        if work.is_report(j) {
            let r = self.handle.report(
                &trackers[0],
                Duration::from_millis(u64::from(workload::REPORT_MS)),
            );
            return (Kind::report(r.is_ok()), None);
        }
        let mut b = self.handle.request();
        for i in work.buckets_of(j) {
            b = b.consume(&resources[i], 1);
        }
        for t in trackers.iter().take(work.guards) {
            b = b.guard(
                t,
                Duration::from_millis(u64::from(workload::GUARD_THRESHOLD_MS)),
            );
        }
        if !work.label.is_empty() {
            b = b.label(&work.label);
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

/// The engine's statistics of the whole phase (warm-up, window, drain) on one line.
///
/// Of the datagrams received, those dropped are split into late answers — valid
/// responses to a request already decided or past D (the other servers' answers to round
/// 0, and the answers to completion deliveries: with two servers about two per request,
/// so they can outnumber the decisions) — and invalid ones (by reason).
fn stats_line(s: &EngineStats) -> String {
    let replay_decisions: u64 = s.decisions_by_round[1..].iter().sum();
    let late = s.drops_of(DropReason::NotExpected) + s.drops_of(DropReason::UnknownRequest);
    let invalid: Vec<String> = DropReason::ALL
        .iter()
        .filter(|r| !matches!(r, DropReason::NotExpected | DropReason::UnknownRequest))
        .filter(|r| s.drops_of(**r) > 0)
        .map(|r| format!("{} {}", r.name(), s.drops_of(*r)))
        .collect();
    format!(
        "  engine stats (whole phase): decisions round0 {} replay rounds {} final {} timeouts {} \
         oldest fallbacks {} sends {} (completion {}); received {}: late answers {} (to \
         requests already decided), invalid {}{} p99 {} µs",
        s.decisions_by_round[0],
        replay_decisions,
        s.decisions_final,
        s.timeouts,
        s.oldest_fallbacks,
        s.sends,
        s.completion_sends,
        s.received,
        late,
        s.total_drops() - late,
        if invalid.is_empty() {
            String::new()
        } else {
            format!(" ({})", invalid.join(", "))
        },
        s.latency_us.value_at_quantile(0.99),
    )
}

impl EngineClient {
    /// Shuts the engine down (every in-flight request completes exactly once).
    fn shutdown(mut self) {
        let s = self.handle.stats();
        if !self.quiet {
            eprintln!("{}", stats_line(&s));
        }
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
