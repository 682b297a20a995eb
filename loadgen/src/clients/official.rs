//! The official `ratelimitly` 0.1.0 client as a loadgen [`Target`]: built inside its own
//! Tokio runtime against the (embedded or given) DNS responder, since it only discovers
//! servers by DNS; each operation maps to a request (or latency report) and its error
//! taxonomy to a kind.
//!
//! Must not set up servers or measure.

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::proto::policy::Schedule;

use super::tokio_load::{self, AsyncClient};
use super::{PhaseSpec, Ready, RunContext, Target};
use crate::cli::Args;
use crate::stats::Kind;
use crate::workload::{self, Workload};

/// The official client's policy from the command line (validated when the client builds).
fn official_policy(a: &Args) -> Result<ratelimitly::RequestPolicy, String> {
    use ratelimitly::Schedule as S;
    let s = match a.schedule {
        Schedule::Fixed(b) => S::fixed(b),
        Schedule::Linear { initial, step, max } => S::linear(initial, step, max),
        Schedule::Exponential {
            initial,
            factor,
            max,
        } => S::exponential(initial, factor, max),
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

/// What the official client is built from, inside its runtime.
pub struct OfficialTarget {
    key: ratelimitly::ApiKey,
    domain: String,
    dns: Option<SocketAddr>,
    policy: Result<ratelimitly::RequestPolicy, String>,
    work: Workload,
}

impl OfficialTarget {
    /// Parses the key with the official client's own parser (the text is not kept).
    pub fn new(ctx: &RunContext<'_>) -> Result<Self, String> {
        let key = ctx
            .servers
            .key_text()
            .parse()
            .map_err(|_| "the official client refused the API key".to_string())?;
        Ok(OfficialTarget {
            key,
            domain: ctx.servers.domain.clone(),
            dns: ctx.servers.dns_server,
            policy: official_policy(ctx.args),
            work: ctx.work.clone(),
        })
    }

    /// Builds the client (inside its Tokio runtime) against the DNS responder.
    async fn connect(self) -> Result<Official, String> {
        let mut b = ratelimitly::Client::builder(self.key)
            .service_domain(&self.domain)
            .map_err(|e| format!("official client: {e}"))?
            .request_policy(self.policy?);
        if let Some(d) = self.dns {
            b = b.dns_server(d);
        }
        let client = b
            .build()
            .await
            .map_err(|e| format!("official client: {e}"))?;
        Official::prepare(client, &self.work).map_err(|e| format!("official client: {e}"))
    }
}

impl Target for OfficialTarget {
    fn run(self: Box<Self>, spec: PhaseSpec, ready: Ready) {
        tokio_load::run_phase(spec, ready, move || self.connect());
    }
}

/// The official client with its prepared resources and trackers.
pub struct Official {
    client: ratelimitly::Client,
    resources: Vec<ratelimitly::Resource>,
    trackers: Vec<ratelimitly::LatencyTracker>,
    work: Workload,
}

impl Official {
    fn prepare(client: ratelimitly::Client, work: &Workload) -> Result<Self, ratelimitly::Error> {
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
}

impl AsyncClient for Official {
    async fn op(&self, j: u64) -> (Kind, Option<u32>) {
        if self.work.is_report(j) {
            let r = self
                .client
                .report_latency(
                    &self.trackers[0],
                    Duration::from_millis(u64::from(workload::REPORT_MS)),
                )
                .await;
            return (Kind::report(r.is_ok()), None);
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

    fn finish(self) {}
}
