//! # ratelimitly-pingora
//!
//! Distributed rate limiting for [Pingora](https://github.com/cloudflare/pingora)
//! proxies through the Ratelimitly client engine. `pingora-limits` counts per process;
//! this crate asks the Ratelimitly service, so every proxy instance shares the buckets.
//!
//! A [`RateLimiter`] is called from three phases of a `ProxyHttp` implementation:
//!
//! - [`RateLimiter::request_filter`]: classifies the request (by default with
//!   ratelimitly-tower's [`Keyed`]: client address, path or a header), asks the
//!   service and, on a rejection, writes `429 Too Many Requests` with `Retry-After`
//!   and the IETF RateLimit fields and ends the request (returns `Ok(true)`). When no
//!   decision comes, the [`FailurePolicy`] lets the request through (open) or answers
//!   `503` with `Retry-After: 1` (closed).
//! - [`RateLimiter::response_filter`]: adds the RateLimit fields to a granted
//!   request's response and notes when the upstream's response head arrived.
//! - [`RateLimiter::logging`]: reports the upstream's latency (grant to response head,
//!   whole milliseconds rounded up) to the request's latency trackers.
//!
//! ```no_run
//! use async_trait::async_trait;
//! use pingora::prelude::*;
//! use ratelimitly_pingora::{RateLimitCtx, RateLimiter};
//!
//! struct Proxy {
//!     limiter: RateLimiter,
//!     upstream: std::net::SocketAddr,
//! }
//!
//! #[async_trait]
//! impl ProxyHttp for Proxy {
//!     type CTX = RateLimitCtx;
//!     fn new_ctx(&self) -> RateLimitCtx {
//!         RateLimitCtx::default()
//!     }
//!     async fn request_filter(&self, session: &mut Session, ctx: &mut RateLimitCtx) -> Result<bool> {
//!         self.limiter.request_filter(session, ctx).await
//!     }
//!     async fn upstream_peer(&self, _: &mut Session, _: &mut RateLimitCtx) -> Result<Box<HttpPeer>> {
//!         Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
//!     }
//!     async fn response_filter(
//!         &self,
//!         _: &mut Session,
//!         response: &mut ResponseHeader,
//!         ctx: &mut RateLimitCtx,
//!     ) -> Result<()> {
//!         self.limiter.response_filter(response, ctx)
//!     }
//!     async fn logging(&self, _: &mut Session, _: Option<&pingora::Error>, ctx: &mut RateLimitCtx) {
//!         self.limiter.logging(ctx);
//!     }
//! }
//! ```
//!
//! ## Where the engine runs
//!
//! [`RateLimiter::hosted`] takes an [`EngineBuilder`] and builds the engine on the
//! first request, hosted on the Pingora service's Tokio runtime
//! (`tokio::runtime::Handle::current()` inside `request_filter`: Pingora hands out no
//! runtime handle before it runs): no threads of its own. With work stealing off
//! (`ServerConf::work_stealing = false`) Pingora runs one single-threaded runtime per
//! thread, and a hosted engine would live on whichever thread took the first request;
//! there [`RateLimiter::new`] with an engine built beforehand (its cores **pinned** on
//! threads of their own, the engine's default) is the better fit.
//!
//! Hosted is the default of the example and of this documentation because it is the
//! cheaper one: in `bench/cpu.sh` (README.md) it added -3 to +8 µs of CPU per request over
//! plain Pingora (release build, noise included), pinned 13-21 µs.
//!
//! ## Client addresses
//!
//! [`KeyBy::ClientIp`] keys by the session's TCP peer. Forwarding headers
//! (`X-Forwarded-For`, `X-Real-IP`, `Forwarded`) are believed only from peers in
//! [`Keyed::trusted_proxies`], by ratelimitly-tower's rule ([`forwarded`]); from any
//! other peer they are ignored.

#![warn(missing_docs, missing_debug_implementations)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header;
use pingora::http::ResponseHeader;
use pingora::proxy::Session;
use tokio::sync::OnceCell;

use ratelimitly_tower::{
    Admission, FailureLog, Gate, LayerMetrics, assess, retry_after_secs, unavailable_text,
    whole_ms_up,
};
pub use ratelimitly_tower::{
    ApiKey, Breaker, BuildError, CircuitBreaker, Consumption, Endpoint, Engine, EngineAdmission,
    EngineBuilder, EngineRef, FailureKind, FailurePolicy, KeyBy, Keyed, Limit, LimitError,
    OnFailure, PolicyState, RetryAfter, Verdict, fields, forwarded, key_from_env, keyed,
    parse_endpoints,
};

/// Maps a request (its head and TCP peer address) to what it consumes.
///
/// Implemented for ratelimitly-tower's [`Keyed`] and for closures
/// `Fn(Option<SocketAddr>, &http::request::Parts) -> Consumption` (Pingora's
/// `RequestHeader` dereferences to `Parts`).
pub trait Classify: Send + Sync + 'static {
    /// The consumption of one request; `peer` is the session's TCP peer (`None` on a
    /// Unix socket).
    fn classify(&self, peer: Option<SocketAddr>, head: &http::request::Parts) -> Consumption;
}

impl Classify for Keyed {
    fn classify(&self, peer: Option<SocketAddr>, head: &http::request::Parts) -> Consumption {
        self.classify_head(peer, head)
    }
}

impl<F> Classify for F
where
    F: Fn(Option<SocketAddr>, &http::request::Parts) -> Consumption + Send + Sync + 'static,
{
    fn classify(&self, peer: Option<SocketAddr>, head: &http::request::Parts) -> Consumption {
        self(peer, head)
    }
}

/// The engine: given, or built on the first request on the runtime that serves it.
enum Source {
    Ready(EngineAdmission),
    Hosted {
        /// Boxed: a builder is large, and taken once.
        builder: Mutex<Option<Box<EngineBuilder>>>,
        cell: OnceCell<Option<EngineAdmission>>,
    },
}

/// Admission for a Pingora `ProxyHttp`: call [`RateLimiter::request_filter`],
/// [`RateLimiter::response_filter`] and [`RateLimiter::logging`] from the phases of
/// those names, with a [`RateLimitCtx`] in the proxy's `CTX`.
pub struct RateLimiter {
    source: Source,
    classify: Box<dyn Classify>,
    failure: FailurePolicy,
    retry_after: RetryAfter,
    fields: bool,
    metrics: Arc<LayerMetrics>,
    breaker: Breaker,
    log: FailureLog,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("hosted", &matches!(self.source, Source::Hosted { .. }))
            .field("failure", &self.failure)
            .field("retry_after", &self.retry_after)
            .field("ratelimit_fields", &self.fields)
            .finish_non_exhaustive()
    }
}

/// Per-request state of [`RateLimiter`]: keep one in the proxy's `CTX`
/// ([`Default`] in `new_ctx`).
#[derive(Debug, Default)]
pub struct RateLimitCtx {
    /// What the request consumed and the verdict, once granted (`None` otherwise).
    granted: Option<(Consumption, Verdict)>,
    /// Whether a grant's response gets the RateLimit fields.
    fields: bool,
    /// When the request was granted (set only when it has latency guards).
    granted_at: Option<Instant>,
    /// The upstream's latency: grant to response head.
    observed: Option<Duration>,
}

impl RateLimitCtx {
    /// The request's verdict, once `request_filter` let it through on a decision
    /// (`None` before, after a rejection, or when it failed open).
    pub fn verdict(&self) -> Option<&Verdict> {
        self.granted.as_ref().map(|(_, v)| v)
    }
}

impl RateLimiter {
    /// A limiter on an engine built beforehand (pinned cores, the engine's default, or
    /// hosted on a runtime of the app's); it keeps an owned engine running.
    pub fn new(engine: impl Into<EngineRef>, classify: impl Classify) -> Self {
        Self::with_source(Source::Ready(EngineAdmission::new(engine)), classify)
    }

    /// A limiter whose engine is built from `builder` on the first request, hosted on
    /// the Tokio runtime that serves it (Pingora's). A build failure is logged and every
    /// request then gets the failure policy of [`FailureKind::EngineStopped`].
    pub fn hosted(builder: EngineBuilder, classify: impl Classify) -> Self {
        Self::with_source(
            Source::Hosted {
                builder: Mutex::new(Some(Box::new(builder))),
                cell: OnceCell::new(),
            },
            classify,
        )
    }

    fn with_source(source: Source, classify: impl Classify) -> Self {
        RateLimiter {
            source,
            classify: Box::new(classify),
            failure: FailurePolicy::default(),
            retry_after: RetryAfter::default(),
            fields: true,
            metrics: LayerMetrics::new(),
            breaker: Breaker::new(CircuitBreaker::default()),
            log: FailureLog::default(),
        }
    }

    /// What a request gets when no decision comes (default: ratelimitly-tower's, open
    /// except on overload).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// The `Retry-After` estimate of a rejection ([`RetryAfter::Window`] by default).
    pub fn retry_after(mut self, mode: RetryAfter) -> Self {
        self.retry_after = mode;
        self
    }

    /// Whether answers carry the `RateLimit-Policy` and `RateLimit` fields (default on).
    pub fn ratelimit_fields(mut self, on: bool) -> Self {
        self.fields = on;
        self
    }

    /// The circuit breaker in front of the service (ratelimitly-tower's default).
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.breaker = Breaker::new(breaker);
        self
    }

    /// The counters of verdicts and decision latencies (ratelimitly-tower's
    /// [`LayerMetrics`]).
    pub fn metrics(&self) -> Arc<LayerMetrics> {
        self.metrics.clone()
    }

    /// The engine, built if hosted and not built yet; `None` when its build failed.
    async fn admission(&self) -> Option<&EngineAdmission> {
        match &self.source {
            Source::Ready(a) => Some(a),
            Source::Hosted { builder, cell } => cell
                .get_or_init(|| async {
                    let taken = builder.lock().unwrap_or_else(|p| p.into_inner()).take();
                    let builder = taken?;
                    let handle = tokio::runtime::Handle::current();
                    match builder.runtime(handle).build_async().await {
                        Ok(engine) => Some(EngineAdmission::new(engine)),
                        Err(e) => {
                            tracing::error!(error = %e, "ratelimitly engine did not start");
                            None
                        }
                    }
                })
                .await
                .as_ref(),
        }
    }

    /// Decides the request from `request_filter`. `Ok(true)`: a `429` (rejection),
    /// `503` (failure, closed) or `500` (a consumption the service refuses) was written
    /// and the request is done; return it from `request_filter`. `Ok(false)`: go on.
    pub async fn request_filter(
        &self,
        session: &mut Session,
        ctx: &mut RateLimitCtx,
    ) -> pingora::Result<bool> {
        let peer = session.client_addr().and_then(|a| a.as_inet()).copied();
        let consumption = self.classify.classify(peer, session.req_header());
        let verdict = self.decide(&consumption).await;
        match verdict {
            Verdict::Failed(kind) => {
                let closed = self.failure.action(kind) == OnFailure::Closed;
                self.log.failure(kind, false, !closed);
                if closed {
                    write_local(session, 503, unavailable_text(kind), 1, &[]).await?;
                    return Ok(true);
                }
                ctx.fields = false;
                Ok(false)
            }
            Verdict::Invalid => {
                tracing::warn!("request mapped to an invalid consumption");
                write_local(session, 500, "invalid rate limit request\n", 0, &[]).await?;
                Ok(true)
            }
            v if v.is_rejected() => {
                let (policies, retry) = assess(&consumption, &v, self.retry_after);
                let fields: &[PolicyState] = if self.fields { &policies } else { &[] };
                let secs = retry_after_secs(retry);
                write_local(session, 429, "rate limited\n", secs, fields).await?;
                Ok(true)
            }
            v => {
                if !consumption.guards().is_empty() {
                    ctx.granted_at = Some(Instant::now());
                }
                ctx.fields = self.fields && !consumption.is_empty();
                ctx.granted = Some((consumption, v));
                Ok(false)
            }
        }
    }

    /// The verdict on `consumption`: local for an empty or failed one and an open
    /// breaker, otherwise the service's.
    async fn decide(&self, consumption: &Consumption) -> Verdict {
        if let Some(kind) = consumption.failure() {
            return Verdict::Failed(kind);
        }
        if consumption.is_empty() {
            return Verdict::Granted;
        }
        let Some(admission) = self.admission().await else {
            return Verdict::Failed(FailureKind::EngineStopped);
        };
        let gate = self.breaker.gate(&self.metrics);
        if let Gate::Open(kind) = gate {
            return Verdict::Failed(kind);
        }
        let asked = Instant::now();
        let verdict = admission.admit(consumption).await;
        self.breaker
            .observe(&verdict, gate == Gate::Probe, &self.metrics);
        let latency = asked.elapsed();
        self.metrics.record(&verdict, latency);
        if let Some(m) = consumption.counted_in() {
            m.record(&verdict, latency);
        }
        verdict
    }

    /// From `response_filter`: adds the RateLimit fields to a granted request's
    /// response and notes the upstream's latency for [`RateLimiter::logging`].
    pub fn response_filter(
        &self,
        response: &mut ResponseHeader,
        ctx: &mut RateLimitCtx,
    ) -> pingora::Result<()> {
        if let Some(at) = ctx.granted_at {
            ctx.observed
                .get_or_insert_with(|| whole_ms_up(at.elapsed()));
        }
        if let (true, Some((c, v))) = (ctx.fields, &ctx.granted) {
            let (policies, _) = assess(c, v, self.retry_after);
            insert_fields(response, &policies)?;
        }
        Ok(())
    }

    /// From `logging`: reports the upstream's latency to the request's latency
    /// trackers (only when a response head came from the upstream).
    pub fn logging(&self, ctx: &mut RateLimitCtx) {
        let (Some(observed), Some((c, _))) = (ctx.observed.take(), &ctx.granted) else {
            return;
        };
        let admission = match &self.source {
            Source::Ready(a) => Some(a),
            Source::Hosted { cell, .. } => cell.get().and_then(Option::as_ref),
        };
        if let Some(admission) = admission {
            for (tracker, _) in c.guards() {
                admission.report(tracker, observed);
            }
        }
    }
}

fn insert_fields(response: &mut ResponseHeader, policies: &[PolicyState]) -> pingora::Result<()> {
    if let Some(v) = fields::policy_value(policies) {
        response.insert_header(fields::RATELIMIT_POLICY, v)?;
    }
    if let Some(v) = fields::ratelimit_value(policies) {
        response.insert_header(fields::RATELIMIT, v)?;
    }
    Ok(())
}

/// Writes a local answer: `status`, a text body, `Retry-After: retry_after` (unless 0)
/// and the RateLimit fields of `policies`.
async fn write_local(
    session: &mut Session,
    status: u16,
    text: &'static str,
    retry_after: u64,
    policies: &[PolicyState],
) -> pingora::Result<()> {
    let mut resp = ResponseHeader::build(status, Some(5))?;
    resp.insert_header(header::CONTENT_TYPE, "text/plain; charset=utf-8")?;
    resp.insert_header(header::CONTENT_LENGTH, text.len())?;
    if retry_after > 0 {
        resp.insert_header(header::RETRY_AFTER, retry_after)?;
    }
    insert_fields(&mut resp, policies)?;
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from_static(text.as_bytes())), true)
        .await?;
    Ok(())
}
