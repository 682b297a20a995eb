//! What the two HTTP modes (`--mode proxy` and `--mode forward-auth`) share: the accept
//! loop and its connections ([`serve`], [`conn`]), the routes of a route file
//! ([`routes`]), the service behind the admission layer ([`upstream`]: forwarding, or
//! the forward-auth grant), the official client as a backend ([`official`]), the
//! per-route series ([`route_metrics`]), and their
//! start ([`run()`]: the backend, the layers, the admin page, serving until a signal).
//!
//! Owns: nothing of its own (docs and re-exports). Must not touch: the rate limit
//! service of `--mode rls`.

pub mod conn;
pub mod official;
pub mod route_metrics;
pub mod routes;
pub mod run;
pub mod serve;
pub mod upstream;

pub use run::{Target, run};
