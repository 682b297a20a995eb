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
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

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
    /// `LIMIT_RESPONSE_HEADERS_ENABLED=false`: answers without RateLimit headers.
    no_headers: bool,
    /// `SHADOW_MODE=true`: never `OVER_LIMIT` overall.
    shadow: bool,
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
            no_headers: false,
            shadow: false,
        }
    }

    /// With envoyproxy/ratelimit's settings: `LIMIT_RESPONSE_HEADERS_ENABLED=false`
    /// (answers without `response_headers_to_add`'s RateLimit headers) and
    /// `SHADOW_MODE=true` (a call over a limit is answered `OK` overall, its statuses
    /// unchanged, and counted in `rl_proxy_rls_global_shadow_mode_total`).
    pub fn with_env(mut self, s: &super::env::Settings) -> Self {
        self.no_headers = s.no_headers;
        self.shadow = s.shadow;
        self
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
            Ok(mut a) => {
                if self.no_headers {
                    a.response_headers_to_add.clear();
                }
                if self.shadow && a.overall_code == Code::OverLimit as i32 {
                    a.overall_code = Code::Ok as i32;
                    self.metrics.record_global_shadow();
                }
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

impl RateLimiter {
    /// The rules in force as text ([`Rules::dump`], `GET /rlconfig`).
    pub fn rules_text(&self) -> String {
        self.rules.load().dump()
    }
}

/// Serves `service` on `listener` (h2c) until `shutdown` completes: messages of at most
/// [`MAX_MESSAGE`] bytes, at most [`MAX_STREAMS`] streams per connection. With `health`,
/// `grpc.health.v1.Health` on the same listener, answered from it.
pub async fn serve(
    listener: TcpListener,
    service: RateLimiter,
    health: Option<HealthReporter>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let routes = Routes {
        rls: RateLimitServiceServer::new(service).max_decoding_message_size(MAX_MESSAGE),
        health: health.map(|h| HealthServer::new(HealthService::from_health_reporter(h))),
    };
    tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS)
        .serve_with_incoming_shutdown(routes, incoming, shutdown)
        .await
}

/// The two services of the listener, by path (tonic's router needs its `router`
/// feature, axum, for what one comparison does).
#[derive(Clone)]
struct Routes {
    rls: RateLimitServiceServer<RateLimiter>,
    health: Option<HealthServer<HealthService>>,
}

impl tonic::server::NamedService for Routes {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<B> tower_service::Service<http::Request<B>> for Routes
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // both generated servers are always ready
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match &mut self.health {
            Some(h) if req.uri().path().starts_with("/grpc.health.v1.Health/") => {
                Box::pin(h.call(req))
            }
            _ => Box::pin(self.rls.call(req)),
        }
    }
}

/// The service's `grpc.health.v1.Health` statuses, for the whole server (`""`) and
/// `envoy.service.ratelimit.v3.RateLimitService`: `SERVING` while `ready` says so
/// (looked at every second), `NOT_SERVING` while not. Runs until aborted.
pub async fn report_health(reporter: HealthReporter, ready: impl Fn() -> bool + Send + 'static) {
    let mut last = None;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tick.tick().await;
        let now = ready();
        if last == Some(now) {
            continue;
        }
        last = Some(now);
        let status = if now {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        reporter.set_service_status("", status).await;
        reporter
            .set_service_status(<Routes as tonic::server::NamedService>::NAME, status)
            .await;
    }
}

/// The rls routes of the admin listener: `POST /json` (the JSON form of
/// `ShouldRateLimit`, [`super::json`]) and `GET /rlconfig` (the rules in force,
/// [`Rules::dump`]).
pub(crate) struct AdminRoutes(pub(crate) RateLimiter);

impl crate::admin::Extra for AdminRoutes {
    fn serves(&self, method: &http::Method, path: &str) -> bool {
        matches!(
            (method, path),
            (&http::Method::POST, "/json") | (&http::Method::GET, "/rlconfig")
        )
    }

    fn answer(
        &self,
        method: http::Method,
        path: String,
        body: bytes::Bytes,
    ) -> std::pin::Pin<Box<dyn Future<Output = crate::admin::Answer> + Send>> {
        use crate::admin::{PLAIN, text};
        use http::StatusCode;
        let service = self.0.clone();
        Box::pin(async move {
            if method == http::Method::GET && path == "/rlconfig" {
                return text(StatusCode::OK, PLAIN, service.rules_text());
            }
            let req = match super::json::request(&body) {
                Ok(r) => r,
                Err(e) => return text(StatusCode::BAD_REQUEST, PLAIN, format!("{e}\n")),
            };
            match service.decide(&req).await {
                Ok(a) => {
                    let status = match Code::try_from(a.overall_code) {
                        Ok(Code::Ok) => StatusCode::OK,
                        Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
                        _ => StatusCode::INTERNAL_SERVER_ERROR,
                    };
                    let body = super::json::response(&a).to_string();
                    text(status, "application/json", body)
                }
                Err(s) if s.code() == tonic::Code::Unavailable => text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    PLAIN,
                    format!("{}\n", s.message()),
                ),
                Err(s) => text(StatusCode::BAD_REQUEST, PLAIN, format!("{}\n", s.message())),
            }
        })
    }
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
