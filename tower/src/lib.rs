//! # ratelimitly-tower
//!
//! A [`tower`](https://docs.rs/tower) layer, [`AdmissionLayer`], that admits HTTP
//! requests through the Ratelimitly client engine before the inner service sees them.
//! It works with any Tokio HTTP stack built on `http` 1 types (hyper 1, axum 0.8), and
//! re-exports what an app needs from the engine ([`Engine`], [`Endpoint`], [`ApiKey`],
//! [`key_from_env`], ...), so this crate is the one dependency.
//!
//! ## Quick start (axum)
//!
//! Outside this repository an app needs three dependencies (the defaults of this crate
//! include axum's `ConnectInfo` keying and the Prometheus exporter, see "Features"):
//!
//! ```toml
//! [dependencies]
//! ratelimitly-tower = "0.1"
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread", "net"] }
//! ```
//!
//! ```no_run
//! # #[cfg(all(feature = "axum", feature = "prometheus"))]
//! # mod app {
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use axum::{Router, routing::get};
//! use ratelimitly_tower::{
//!     AdmissionLayer, CONTENT_TYPE, Engine, Exporter, KeyBy, Limit, key_from_env, keyed,
//!     parse_endpoints, verify,
//! };
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The key from RATELIMITLY_API_KEY; endpoints as ID@IP:PORT (the id is the server's id).
//! let key = key_from_env()?;
//! let endpoints = parse_endpoints(&std::env::var("RATELIMITLY_ENDPOINTS")?)?;
//! // Optional startup check: logs each endpoint that does not answer validly.
//! verify(&key, &endpoints).await;
//! // build_async: does not block the runtime while the engine starts. Pinned (the
//! // default): the engine's cores run on threads of their own; add
//! // `.runtime(tokio::runtime::Handle::current())` to host them on this runtime instead.
//! let engine = Arc::new(Engine::builder(key).endpoints(endpoints).build_async().await?);
//!
//! // 5 requests per 10 s per client IP (axum's ConnectInfo, see below).
//! let limit = Limit::new(5, Duration::from_secs(10))?;
//! let layer = AdmissionLayer::new(&engine, keyed(limit, KeyBy::ClientIp).prefix("api"));
//! let exporter = Exporter::new(layer.metrics()).with_engine(engine.handle());
//!
//! let app = Router::new()
//!     .route("/api", get(|| async { "ok" }).layer(layer)) // limited
//!     .route("/health", get(|| async { "healthy" }))     // unlimited
//!     .route("/metrics", get(move || {
//!         let exporter = exporter.clone();
//!         async move {
//!             let text = tokio::task::spawn_blocking(move || exporter.encode()).await.unwrap();
//!             ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text)
//!         }
//!     }));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//! // with_connect_info: the peer address KeyBy::ClientIp keys by.
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok(())
//! # }
//! # }
//! # fn main() {}
//! ```
//!
//! `examples/axum.rs` is the same app, runnable; `examples/hyper.rs` uses plain hyper.
//!
//! ## What the layer does
//!
//! - A user function ([`Classify`]) maps each request to a [`Consumption`]: resources
//!   with token counts, latency guards and a metrics label. [`keyed`] is a ready one that
//!   keys a bucket `PREFIX:KEY` by client IP, a header or the path. Two layers with the
//!   same limit and prefix share buckets: give each route its own
//!   [`Keyed::prefix`].
//! - A grant forwards the request to the inner service.
//! - A rejection is answered `429 Too Many Requests` with `Retry-After` in whole seconds
//!   (see below), or whatever [`AdmissionLayer::on_rejection`] builds.
//! - Both carry the IETF `RateLimit-Policy` and `RateLimit` fields ([`fields`]) unless
//!   turned off ([`AdmissionLayer::ratelimit_fields`]).
//! - A failure (no decision) follows the layer's [`FailurePolicy`]: forward (fail-open)
//!   or answer `503` with `Retry-After: 1` (fail-closed), per [`FailureKind`]. The default and its reasoning are
//!   in [`failure`]. Failures are logged at `warn!` (at most once per 10 s per kind), an
//!   engine that stopped at `error!`.
//! - A circuit breaker ([`CircuitBreaker`]): after a run of timeouts or communication
//!   failures the failure policy applies at once, without waiting the engine's horizon,
//!   and one request per probe interval asks the service until it answers.
//! - After the inner service answered (response head), the observed latency, rounded up
//!   to whole milliseconds, is reported to every guarded tracker of the request.
//! - `poll_ready` answers `Pending` while the layer's limit of pending decisions is
//!   reached ([`AdmissionLayer::max_pending`]), and is woken when one completes.
//! - `Exporter` (feature `prometheus`) renders the layer's counters (breaker included) and the engine's
//!   statistics in the Prometheus text format.
//!
//! ## The sliding window, and what `Retry-After` promises
//!
//! The service keeps a sliding window per bucket: a request is admitted while the
//! tokens consumed in the last window, plus its own, fit the limit. The service says how
//! many tokens are in the window (`actual_rate`), not when they were consumed. So the
//! default [`RetryAfter::Window`] sends the window of the rejected resources: a client
//! that waits that long and retries unchanged is admitted unless new consumption
//! arrived in between. It is never too short. [`RetryAfter::EvenSpread`] sends the
//! shorter estimate that assumes the window's tokens were used evenly; after a burst it
//! is too short. The `RateLimit` field's `t` is the same value; its `r` is the limit
//! minus the service's `actual_rate` at decision time (at least 0).
//!
//! ## Keying by client IP
//!
//! [`KeyBy::ClientIp`] reads the peer address from axum's `ConnectInfo<SocketAddr>`
//! (feature `axum`, on by default: serve with
//! `into_make_service_with_connect_info::<SocketAddr>()`), the [`ClientAddr`]
//! extension, or a bare `SocketAddr` extension (insert one of these yourself with plain
//! hyper). Behind a reverse proxy, [`Keyed::trusted_proxies`] believes peers in a CIDR
//! list, and only for the header [`Keyed::client_ip_from`] names (default: the rightmost
//! untrusted `X-Forwarded-For` hop; `X-Real-IP` and `Forwarded`, which some proxies pass
//! from the client unchanged, only when asked for, for a proxy that overwrites them): the rule of [`forwarded`], the same
//! one `rl-proxy` applies. A request with no address
//! is never put in a shared bucket: it gets the failure policy of
//! [`FailureKind::NoClientAddr`], and a warning is logged once.
//!
//! ## The engine: owned, pinned or hosted
//!
//! [`AdmissionLayer::new`] takes the [`Engine`] or an `Arc<Engine>` and keeps it
//! running while the layer is in use (a bare [`EngineHandle`] does not keep it alive).
//! By default the engine's cores are **pinned**: each runs on a thread of its own,
//! which is best for throughput when the host has a CPU to spare. A small app can
//! **host** them on its Tokio runtime instead ([`EngineBuilder::runtime`]): no extra
//! threads, at the cost of sharing the runtime's workers.
//!
//! ## Endpoints
//!
//! An endpoint is `ID@IP:PORT`, and the id must be the id of the server at that
//! address: the engine drops answers from any other id, so a wrong id looks like an
//! outage (every request times out). [`verify`] reports such endpoints at startup.
//!
//! ## Features
//!
//! All four are on by default; an app turns off what it does without with
//! `default-features = false` and lists the rest.
//!
//! | Feature | Default | What it brings |
//! |---|---|---|
//! | `axum` | on | `KeyBy::ClientIp` reads axum's `ConnectInfo<SocketAddr>` |
//! | `prometheus` | on | `Exporter` and `CONTENT_TYPE` (`prometheus-client`); without it the layer's counters still count and are read through [`LayerMetrics`]'s accessors, for an exporter of the app's own |
//! | `dns` | on | the engine's DNS SRV discovery of endpoints (`hickory-resolver`); without it endpoints are `ID@IP:PORT` only |
//! | `io-uring` | on | the engine's io_uring driver (forwarded to the engine's feature of that name) |
//!
//! Crates in the normal dependency graph, this crate and the engine included, counted
//! with (the `sed` drops cargo's `(*)` marks of repeated crates):
//!
//! ```text
//! cargo tree -p ratelimitly-tower -e normal --prefix none FEATURES | sed 's/ (\*)$//' | sort -u | wc -l
//! ```
//!
//! | FEATURES | Crates |
//! |---|---|
//! | (defaults) | 133 |
//! | `--no-default-features --features axum,prometheus` | 81 |
//! | `--no-default-features --features axum` | 74 |
//! | `--no-default-features --features prometheus` | 65 |
//! | `--no-default-features` | 58 |
//!
//! DNS discovery is most of the difference: `--no-default-features --features dns`
//! counts 117. The engine's own core (its AES-GCM from `aws-lc-rs`, its queues, Tokio)
//! is in every set; `io-uring` adds the `io-uring` crate and nothing else (without it
//! the engine's `Auto` backend is mmsg, and asking for `Uring` fails at start).
//!
//! ## Names
//!
//! The engine mirrors the official `ratelimitly` crate's names where they exist
//! (`request_policy`, `metrics_label`, `final_receive_units`, `replay_gap`,
//! `Schedule::fixed`, `Response::decision()`, `selected_server_id()`). This crate's own
//! names differ on purpose in one place: the official client has no HTTP layer, so
//! "failure policy" here is the HTTP answer to a failed admission, not a retry policy.
//! The layer was called `RateLimitLayer`; that name stays as a deprecated alias (it
//! collides with tower's own `tower::limit::RateLimitLayer`, a local backpressure
//! limiter that never answers `429`).

#![warn(missing_docs, missing_debug_implementations)]

mod admission;
mod breaker;
mod consumption;
#[cfg(feature = "prometheus")]
mod exporter;
pub mod failure;
pub mod fields;
pub mod forwarded;
mod metrics;
mod service;
mod verdict;
mod verify;

pub use crate::admission::{
    Admission, Decided, EngineAdmission, EngineDecision, EngineRef, Verdict, whole_ms_up,
};
pub use crate::breaker::{Breaker, CircuitBreaker, FAILURE_LOG_INTERVAL, FailureLog, Gate};
pub use crate::consumption::{
    Classify, ClientAddr, Consumption, KeyBy, Keyed, Limit, LimitError, keyed, peer_addr,
};
#[cfg(feature = "prometheus")]
pub use crate::exporter::{CONTENT_TYPE, Exporter};
pub use crate::failure::{FailureKind, FailurePolicy, OnFailure};
pub use crate::fields::PolicyState;
pub use crate::forwarded::{ClientIpFrom, ClientIpRule, TrustedProxies};
pub use crate::metrics::{LATENCY_BUCKETS, LayerMetrics, OUTCOMES};
pub use crate::service::{
    AdmissionLayer, AdmissionService, DEFAULT_MAX_PENDING, Rejection, RejectionHook, ResponseBody,
    ResponseFuture, RetryAfter, assess, retry_after_secs, too_many_requests, unavailable_text,
};
#[allow(deprecated)]
pub use crate::service::{RateLimit, RateLimitLayer};
pub use crate::verify::{EndpointCheck, EndpointProblem, verify};
/// The small-vector crate of [`Decided::resources`].
pub use smallvec;

/// The engine crate, for what this crate does not re-export.
pub use ratelimitly_engine as engine;
/// Loading the API key from `RATELIMITLY_API_KEY` (or a file).
pub use ratelimitly_engine::key_source;
pub use ratelimitly_engine::key_source::{KEY_ENV, KeyLoadError};
pub use ratelimitly_engine::{
    ApiKey, BuildError, Cores, DnsConfig, Endpoint, EndpointParseError, Engine, EngineBuilder,
    EngineHandle, LatencyTracker, RequestPolicy, Resource,
};

/// The API key from the environment variable [`KEY_ENV`] (`RATELIMITLY_API_KEY`);
/// surrounding whitespace ignored, the text never echoed in errors.
pub fn key_from_env() -> Result<ApiKey, KeyLoadError> {
    key_source::read_key_text(None)?.parse()
}

/// Endpoints from comma-separated `ID@IP:PORT` text (what `RATELIMITLY_ENDPOINTS`
/// holds); blanks around items are ignored. An endpoint's id must be the id of the
/// server at that address: responses from another id are dropped.
pub fn parse_endpoints(text: &str) -> Result<Vec<Endpoint>, EndpointParseError> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::parse)
        .collect()
}
