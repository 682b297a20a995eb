//! # ratelimitly-tower
//!
//! A [`tower`](https://docs.rs/tower) layer that admits HTTP requests through the
//! Ratelimitly client engine before the inner service sees them. It works with any
//! Tokio HTTP stack built on `http` 1 types (hyper 1, axum).
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//!
//! use ratelimitly_engine::{ApiKey, Endpoint, Engine};
//! use ratelimitly_tower::{KeyBy, Limit, RateLimitLayer, keyed};
//! use tower::{Layer, ServiceExt, service_fn};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A test responder on loopback stands in for the Ratelimitly service.
//! let key: ApiKey = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys".parse()?;
//! let responder = rl_responder::spawn(rl_responder::ResponderConfig::new(vec![key.clone()]))?;
//! let engine = Engine::builder(key)
//!     .endpoints(vec![Endpoint { server_id: responder.server_id(), addr: responder.addr() }])
//!     .build()?;
//!
//! // Two requests per minute for each path; the layer wraps any http service.
//! let layer = RateLimitLayer::new(engine.handle(), keyed(Limit::new(2, Duration::from_secs(60))?, KeyBy::Path));
//! let service = layer.layer(service_fn(|_req: http::Request<String>| async {
//!     Ok::<_, Infallible>(http::Response::new(String::from("hello")))
//! }));
//!
//! let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
//! rt.block_on(async {
//!     let get = || http::Request::get("/checkout").body(String::new()).unwrap();
//!     for _ in 0..2 {
//!         let resp = service.clone().oneshot(get()).await.unwrap();
//!         assert_eq!(resp.status(), 200);
//!     }
//!     // The third one in the same minute is rejected, with a hint when to come back.
//!     let resp = service.clone().oneshot(get()).await.unwrap();
//!     assert_eq!(resp.status(), 429);
//!     let secs: u64 = resp.headers()["retry-after"].to_str().unwrap().parse().unwrap();
//!     assert!((1..=60).contains(&secs));
//! });
//! # engine.shutdown();
//! # responder.stop();
//! # Ok(())
//! # }
//! ```
//!
//! ## What the layer does
//!
//! - A user function ([`Classify`]) maps each request to a [`Consumption`]: resources
//!   with token counts, latency guards and a metrics label. [`keyed`] is a ready one that
//!   keys a bucket by client IP ([`ClientAddr`]), a header or the path.
//! - A grant forwards the request to the inner service.
//! - A rejection is answered `429 Too Many Requests` with `Retry-After` in whole seconds
//!   (at least 1), derived from the rejected resources' window and deficit
//!   ([`ratelimitly_engine::ResourceResult::retry_after`]).
//! - A failure (no decision) follows the layer's [`FailurePolicy`]: forward (fail-open)
//!   or answer `503` (fail-closed), per [`FailureKind`]. The default and its reasoning are
//!   in [`failure`].
//! - After the inner service answered (response head), the observed latency, rounded up
//!   to whole milliseconds, is reported to every guarded tracker of the request; the
//!   engine coalesces reports per core before sending them.
//! - `poll_ready` answers `Pending` while the layer's limit of pending decisions is
//!   reached ([`RateLimitLayer::max_pending`]), and is woken when one completes.
//! - [`Exporter`] renders the layer's counters and the engine's statistics in the
//!   Prometheus text format.
//!
//! ## Names
//!
//! The engine mirrors the official `ratelimitly` crate's names where they exist
//! (`request_policy`, `metrics_label`, `final_receive_units`, `replay_gap`,
//! `Schedule::fixed`, `Response::decision()`, `selected_server_id()`). This crate's own
//! names differ on purpose in one place: the official client has no HTTP layer, so
//! "failure policy" here is the HTTP answer to a failed admission, not a retry policy.

#![warn(missing_docs, missing_debug_implementations)]

mod admission;
mod breaker;
mod consumption;
pub mod failure;
pub mod fields;
pub mod forwarded;
mod metrics;
mod service;
mod verify;

pub use crate::admission::{
    Admission, Decided, EngineAdmission, EngineDecision, EngineRef, Verdict, whole_ms_up,
};
pub use crate::breaker::{CircuitBreaker, FAILURE_LOG_INTERVAL};
pub use crate::consumption::{
    Classify, ClientAddr, Consumption, KeyBy, Keyed, Limit, LimitError, keyed, peer_addr,
};
pub use crate::failure::{FailureKind, FailurePolicy, OnFailure};
pub use crate::fields::PolicyState;
pub use crate::forwarded::TrustedProxies;
pub use crate::metrics::{CONTENT_TYPE, Exporter, LATENCY_BUCKETS, LayerMetrics, OUTCOMES};
pub use crate::service::{
    AdmissionLayer, AdmissionService, DEFAULT_MAX_PENDING, Rejection, RejectionHook, ResponseBody,
    ResponseFuture, RetryAfter, retry_after_secs, too_many_requests,
};
#[allow(deprecated)]
pub use crate::service::{RateLimit, RateLimitLayer};
pub use crate::verify::{EndpointCheck, EndpointProblem, verify};

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
