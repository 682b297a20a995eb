//! The gRPC service: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`
//! over h2c, answered by the engine ([`RateLimiter`], [`serve`]), and the configuration
//! reload.
//!
//! Owns: a call's path from the request to the answer (check, plan, the engine's two
//! requests, the answer, the counters) and the server's limits. Must not touch: the
//! rules' format, the content of an answer (`decide`).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimitly_engine::{EngineHandle, Resource};
use ratelimitly_tower::{Breaker, CircuitBreaker, Gate, LayerMetrics, OnFailure, Verdict};
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use super::config::{Bounds, load};
use super::decide::Plan;
use super::metrics::{CallAnswer, RlsMetrics};
use super::request::{Call, MAX_MESSAGE};
use super::rules::Rules;

/// Streams one connection may have open at once (HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS`):
/// with [`MAX_MESSAGE`], what bounds the memory a connection's requests hold.
pub const MAX_STREAMS: u32 = 256;

/// The rate limit service: the current rules, the engine, the failure policy.
#[derive(Clone)]
pub struct RateLimiter {
    rules: Arc<ArcSwap<Rules>>,
    engine: EngineHandle,
    on_failure: Option<OnFailure>,
    metrics: Arc<RlsMetrics>,
    layer: Arc<LayerMetrics>,
    breaker: Arc<Breaker>,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("on_failure", &self.on_failure)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    /// Decides with `engine` under `rules` (replaced on reload). `on_failure`: what a
    /// call without a decision is answered (`None`: gRPC `UNAVAILABLE`). The engine's
    /// verdicts are also counted in `layer` (the tower layer's series: outcomes, the
    /// decision latency and the breaker).
    ///
    /// A circuit breaker (the tower layer's, [`CircuitBreaker::default`]: open after 5
    /// consecutive timeouts or communication failures, a probe every second): while it
    /// is open a call is answered at once under the failure policy instead of waiting
    /// the engine's horizon; the first probe that gets a decision closes it.
    pub fn new(
        rules: Arc<ArcSwap<Rules>>,
        engine: EngineHandle,
        on_failure: Option<OnFailure>,
        metrics: Arc<RlsMetrics>,
        layer: Arc<LayerMetrics>,
    ) -> Self {
        RateLimiter {
            rules,
            engine,
            on_failure,
            metrics,
            layer,
            breaker: Arc::new(Breaker::new(CircuitBreaker::default())),
        }
    }

    /// Sends `resources` as one request (none: no request), unless the open breaker
    /// answers it at once. The request is sent on the call; the future only awaits it.
    fn ask(&self, resources: &[(Resource, u32)]) -> Option<impl Future<Output = Verdict> + use<>> {
        if resources.is_empty() {
            return None;
        }
        let gate = self.breaker.gate(&self.layer);
        let completion = match gate {
            Gate::Open(_) => None,
            Gate::Ask | Gate::Probe => {
                let mut b = self.engine.request();
                for (r, n) in resources {
                    b = b.consume(r, *n);
                }
                Some(b.send())
            }
        };
        let (layer, breaker) = (self.layer.clone(), self.breaker.clone());
        let start = Instant::now();
        Some(async move {
            let v = match (completion, gate) {
                (Some(c), _) => {
                    let v = Verdict::of(&c.await);
                    breaker.observe(&v, gate == Gate::Probe, &layer);
                    v
                }
                (None, Gate::Open(kind)) => Verdict::Failed(kind),
                (None, _) => Verdict::Invalid,
            };
            layer.record(&v, start.elapsed());
            v
        })
    }

    /// The answer to one request.
    pub async fn decide(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, Status> {
        let call = match Call::check(req) {
            Ok(c) => c,
            Err(e) => {
                self.metrics.record_call(CallAnswer::InvalidArgument);
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        let rules = self.rules.load_full();
        let plan = match Plan::new(&rules, &call) {
            Ok(p) => p,
            Err(e) => {
                self.metrics.record_call(CallAnswer::InvalidArgument);
                return Err(Status::invalid_argument(e.to_string()));
            }
        };
        // every request is sent before any is awaited
        let asked: Vec<_> = plan.parts.iter().map(|p| self.ask(&p.resources)).collect();
        let mut verdicts = Vec::with_capacity(asked.len());
        for a in asked {
            // a part is never empty: every one is asked
            verdicts.push(match a {
                Some(f) => f.await,
                None => Verdict::Granted,
            });
        }
        match plan.answer(&verdicts, self.on_failure) {
            Ok(a) => {
                self.metrics
                    .record_call(if a.overall_code == Code::OverLimit as i32 {
                        CallAnswer::OverLimit
                    } else {
                        CallAnswer::Ok
                    });
                Ok(a)
            }
            Err(e) => {
                self.metrics.record_call(CallAnswer::Unavailable);
                Err(Status::unavailable(e.0))
            }
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        self.decide(request.get_ref()).await.map(Response::new)
    }
}

/// Serves `service` on `listener` (h2c) until `shutdown` completes: messages of at most
/// [`MAX_MESSAGE`] bytes, at most [`MAX_STREAMS`] streams per connection.
pub async fn serve(
    listener: TcpListener,
    service: RateLimiter,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS)
        .serve_with_incoming_shutdown(
            RateLimitServiceServer::new(service).max_decoding_message_size(MAX_MESSAGE),
            incoming,
            shutdown,
        )
        .await
}

/// What a SIGHUP reloads.
#[derive(Debug)]
pub struct Reload {
    /// The files (`--config`).
    pub paths: Vec<PathBuf>,
    /// What they are checked against.
    pub bounds: Bounds,
    /// The running rules, replaced by a reload that checks.
    pub rules: Arc<ArcSwap<Rules>>,
    /// Where the rules' counters live.
    pub metrics: Arc<RlsMetrics>,
}

impl Reload {
    /// Reads the files again (SIGHUP, or a change seen by [`super::watch`]): new calls get the new rules; files that do not check leave
    /// the running rules in place. A refusal is logged at `warn` (why, and which file and
    /// line), a reload at `info`.
    pub fn reload(&self) -> bool {
        match load(&self.paths, self.bounds, &self.metrics) {
            Ok(r) => {
                tracing::info!(
                    domains = r.domains.len(),
                    rules = r.rule_count(),
                    "rate limit configuration reloaded"
                );
                self.rules.store(Arc::new(r));
                self.metrics.record_reload(true);
                true
            }
            Err(e) => {
                tracing::warn!(
                    "rate limit configuration reload refused, the running configuration is kept: {e}"
                );
                self.metrics.record_reload(false);
                false
            }
        }
    }
}
