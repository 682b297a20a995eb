//! Drives the engine or the official client on a Tokio runtime limited to the
//! client cores (worker threads pinned), closed loop (N in flight) or open loop
//! (a pacer at a fixed rate; latency from each request's intended send time).
//!
//! Owns the load shape for the future-based clients. Must not set up servers or
//! print results.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::stats::{Kind, Phase};
use crate::workload::{self, Workload};

/// The official client with its prepared resources and trackers.
pub struct Official {
    pub client: ratelimitly::Client,
    pub resources: Vec<ratelimitly::Resource>,
    pub trackers: Vec<ratelimitly::LatencyTracker>,
    pub work: Workload,
}

impl Official {
    pub fn prepare(
        client: ratelimitly::Client,
        work: &Workload,
    ) -> Result<Self, ratelimitly::Error> {
        let resources = (0..work.buckets)
            .map(|i| {
                ratelimitly::Resource::new(
                    Workload::bucket_name(i),
                    Duration::from_millis(u64::from(work.window_ms)),
                    work.rate_limit,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let trackers = (0..work.guards.max(1))
            .map(|i| {
                ratelimitly::LatencyTracker::builder(Workload::tracker_name(i))
                    .sample_ttl(Duration::from_millis(u64::from(workload::TRACKER_TTL_MS)))
                    .max_samples(workload::TRACKER_MAX_SAMPLES)
                    .min_samples(workload::TRACKER_MIN_SAMPLES)
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Official {
            client,
            resources,
            trackers,
            work: work.clone(),
        })
    }

    async fn op(&self, j: u64) -> (Kind, Option<u32>) {
        if self.work.is_report(j) {
            let r = self
                .client
                .report_latency(
                    &self.trackers[0],
                    Duration::from_millis(u64::from(workload::REPORT_MS)),
                )
                .await;
            return (
                if r.is_ok() {
                    Kind::Report
                } else {
                    Kind::ReportFailed
                },
                None,
            );
        }
        let mut b = self.client.request();
        for i in self.work.buckets_of(j) {
            b = match b.consume(&self.resources[i], 1) {
                Ok(b) => b,
                Err(_) => return (Kind::Configuration, None),
            };
        }
        for t in self.trackers.iter().take(self.work.guards) {
            b = match b.guard(
                t,
                Duration::from_millis(u64::from(workload::GUARD_THRESHOLD_MS)),
            ) {
                Ok(b) => b,
                Err(_) => return (Kind::Configuration, None),
            };
        }
        if !self.work.label.is_empty() {
            b = match b.metrics_label(self.work.label.as_str()) {
                Ok(b) => b,
                Err(_) => return (Kind::Configuration, None),
            };
        }
        let kind = match b.send().await {
            Ok(r) => match r.decision() {
                ratelimitly::Decision::Granted => Kind::Granted,
                ratelimitly::Decision::Rejected => Kind::Rejected,
            },
            Err(ratelimitly::Error::Timeout) => Kind::Timeout,
            Err(ratelimitly::Error::Discovery) => Kind::Discovery,
            Err(ratelimitly::Error::Communication(_)) => Kind::Communication,
            Err(
                ratelimitly::Error::InvalidApiKey(_) | ratelimitly::Error::InvalidConfiguration(_),
            ) => Kind::Configuration,
            Err(_) => Kind::Protocol,
        };
        (kind, None)
    }
}

/// A future-based client.
pub enum Target {
    Engine(crate::adapt::EngineTarget),
    Official(Official),
}

impl Target {
    async fn op(&self, j: u64) -> (Kind, Option<u32>) {
        match self {
            Target::Engine(e) => e.op(j).await,
            Target::Official(o) => o.op(j).await,
        }
    }
}

/// Load shape.
#[derive(Clone, Copy, Debug)]
pub enum Load {
    Closed { in_flight: usize },
    Open { rate: f64 },
}

/// A Tokio runtime with one worker per client core, each pinned to its core.
pub fn runtime(cores: &[usize]) -> std::io::Result<tokio::runtime::Runtime> {
    let cores: Arc<Vec<usize>> = Arc::new(cores.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let c2 = Arc::clone(&cores);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.len().max(1))
        .max_blocking_threads(2)
        .enable_all()
        .on_thread_start(move || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = c2.get(i % c2.len().max(1)) {
                crate::stats::pin(*c);
            }
        })
        .build()
}

/// Runs `target` under `load` until the phase's window ends, then waits (at most
/// `drain`) for every submitted operation to complete.
pub async fn drive(target: Arc<Target>, phase: Arc<Phase>, load: Load, drain: Duration) {
    let next = Arc::new(AtomicU64::new(0));
    let stop_at = phase.window_end;
    match load {
        Load::Closed { in_flight } => {
            let mut tasks = Vec::with_capacity(in_flight);
            for _ in 0..in_flight.max(1) {
                let (target, phase, next) =
                    (Arc::clone(&target), Arc::clone(&phase), Arc::clone(&next));
                tasks.push(tokio::spawn(async move {
                    loop {
                        let t0 = Instant::now();
                        if t0 >= stop_at {
                            break;
                        }
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        phase.submit();
                        let (k, s) = target.op(j).await;
                        phase.record(t0, Instant::now(), k, s);
                    }
                }));
            }
            let all = async {
                for t in tasks {
                    let _ = t.await;
                }
            };
            let _ = tokio::time::timeout(
                stop_at.saturating_duration_since(Instant::now()) + drain,
                all,
            )
            .await;
        }
        Load::Open { rate } => {
            let rate = rate.max(1e-3);
            let start = Instant::now();
            let mut i: u64 = 0;
            let done = Arc::new(AtomicBool::new(false));
            loop {
                let now = Instant::now();
                let mut intended = start + Duration::from_secs_f64(i as f64 / rate);
                if intended >= stop_at {
                    break;
                }
                while intended <= now {
                    let (target, phase, next) =
                        (Arc::clone(&target), Arc::clone(&phase), Arc::clone(&next));
                    phase.submit();
                    let at = intended;
                    tokio::spawn(async move {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        let (k, s) = target.op(j).await;
                        phase.record(at, Instant::now(), k, s);
                    });
                    i += 1;
                    intended = start + Duration::from_secs_f64(i as f64 / rate);
                }
                tokio::time::sleep_until(intended.into()).await;
            }
            done.store(true, Ordering::Relaxed);
            let deadline = Instant::now() + drain;
            while phase.completed.load(Ordering::Relaxed) < phase.submitted.load(Ordering::Relaxed)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}
