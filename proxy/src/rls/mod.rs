//! `rl-proxy --mode rls`: Envoy's rate limit service,
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` (gRPC over h2c), a
//! drop-in for envoyproxy/ratelimit whose decisions are Ratelimitly's.
//!
//! - Configuration: envoyproxy/ratelimit's YAML, one domain per file ([`config`]), with
//!   one extension, `window:` (any window, e.g. `window: 10s`); matched like the
//!   reference server, wildcards, `replaces`, `quota_mode`, `share_threshold` and
//!   `metadata` included ([`rules`]).
//! - A call: checked ([`request`]; bad input is `INVALID_ARGUMENT` with the reason),
//!   planned and answered ([`decide`]): every descriptor with an enforced limit in
//!   **one** Ratelimitly request, decided atomically (split, each part atomic, past the
//!   32 resources one request carries); served by [`service`].
//! - Failures: `--on-failure open` answers OK, `closed` `OVER_LIMIT`; without the flag
//!   a call without a decision is gRPC `UNAVAILABLE`, and Envoy's `failure_mode_deny`
//!   decides.
//! - Series: per rule and per call ([`metrics`]), with the tower layer's and the
//!   engine's on the admin page.
//!
//! Envoy's timeout: the HTTP rate limit filter's `timeout` defaults to 20 ms. The engine
//! answers within its policy horizon H (60 ms by default: the first send, one replay 20 ms
//! later, the final wait; `docs/protocol.md` §10), and a decision that needs a replay
//! (a lost datagram, a dead server) takes up to H. With the 20 ms default Envoy gives up
//! first and applies `failure_mode_deny` to calls the engine would still have decided.
//! Set the filter's `timeout` above H: 100 ms for the default policy (`proxy/README.md`'s
//! configuration uses 1 s, a bound that only matters if rl-proxy itself stalls).

pub mod config;
pub mod decide;
pub mod env;
pub mod json;
pub mod metrics;
pub mod request;
pub mod rules;
mod run;
pub mod service;
pub mod watch;

pub use config::{Bounds, load, parse_window};
pub use metrics::{CallAnswer, DescriptorOutcome, RlsMetrics, RuleCounters};
/// The failure policy `RateLimiter::new` takes (`--on-failure`).
pub use ratelimitly_tower::OnFailure;
pub use request::{Call, Invalid};
pub use rules::Rules;
pub use run::{run, run_with};
pub use service::{RateLimiter, Reload, report_health, serve};
