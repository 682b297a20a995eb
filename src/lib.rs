//! # ratelimitly-engine
//!
//! A client engine for the Ratelimitly admission-control service (wire v2).
//!
//! ```
//! use std::time::Duration;
//! use ratelimitly_engine::{Decision, Engine, Resource};
//! # use rl_testkit::{harness, keys};
//! # let responder = harness::responder(keys::AES, 1 << 23, Default::default());
//! # let key = keys::key(keys::AES);
//! // the key comes from RATELIMITLY_API_KEY or a file: ratelimitly_engine::key_source
//! let engine = Engine::builder(key)
//!     .endpoints(vec![harness::endpoint(&responder)]) // or .dns(..): SRV discovery
//!     .build()?;
//! let api = Resource::new("api", Duration::from_secs(1), 100)?;
//! let response = engine.handle().request().consume(&api, 1).wait()?; // or .send().await
//! assert_eq!(response.decision(), Decision::Granted);
//! engine.shutdown();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The crate is split along one boundary: **sans-IO** parts that never touch a socket,
//! a thread or a clock (time is always a parameter, outputs are data), and the layers
//! that own the I/O and the threads and feed them.
//!
//! ```text
//!  application threads (Tokio, plain threads, ...)
//!     │  EngineHandle::request().consume(..).guard(..).send() / .wait() / submit_batch()
//!     ▼  engine::runtime: PDU into a completion slot, lock-free queue + udp::Waker
//! ┌── engine::runtime, one turn per core: a pinned thread or a Tokio task (hosted) ───────┐
//! │  clock · udp::UdpIo (io_uring or mmsg, GSO/GRO) · outcomes into slots · faults        │
//! └────────────┬──────────────────────────────────────────────▲───────────────────────────┘
//!    submissions, datagrams, now: Instant        transmits, socket ops, outcomes, deadline
//! ┌────────────▼──────── engine::core::CoreState (sans-IO) ───┴───────────────────────────┐
//! │  in-flight slab · timer wheel · steering socket table · report coalescing · stats     │
//! └────────────┬──────────────────────────────────────────────────────────────────────────┘
//! ┌────────────▼──────────── proto: sans-IO protocol core (no sockets, no clocks) ────────┐
//! │  key (ApiKey)  ids (Resource, LatencyTracker)  endpoint  wire (views, seal/open)      │
//! │  policy (RequestPolicy, Schedule)  machine (Delivery)  outcome (Response, Failure)    │
//! └───────────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! The runtime is tested on real loopback sockets against our responder (`rl-responder`);
//! `CoreState` and everything below it run in deterministic simulation on virtual time
//! (`tests/simulation.rs`), and the protocol core against test vectors.
//!
//! Public API: the types re-exported at the crate root (what an embedding application
//! uses) and [`proto`] (the sans-IO protocol, also used by the responder). The engine's
//! sans-IO layer that the benches, the simulation and the fuzz target reach
//! ([`engine::core`]) and the I/O layer ([`udp`]) are internal: they follow the engine,
//! not semver.
//!
//! The lock-free code (the completion slots, the driver's waker, the shutdown gate) takes
//! its atomics, cells and park/unpark from one shim module; with the cargo feature
//! `loom` they are [loom](https://docs.rs/loom)'s, and loom models explore the
//! interleavings of the real code (up to 3 preemptions). The feature is for the models
//! only; the crate in `loom/` runs them:
//!
//! ```text
//! cd loom && CARGO_TARGET_DIR=../target cargo test
//! ```

#![warn(missing_docs, missing_debug_implementations)]
// Every `unsafe` block states why it is sound (a `// SAFETY:` comment); CI's clippy run
// (`-D warnings`) enforces it.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod discovery;
pub mod engine;
pub mod key_source;
pub mod proto;
pub mod udp;

mod sync;

#[cfg(feature = "loom")]
#[doc(hidden)]
pub mod loom_models;

pub use crate::engine::{
    Batch, BuildError, Completion, Cores, DnsConfig, Engine, EngineBuilder, EngineHandle,
    LatencyHistogram, OptionError, Request, RequestBuilder, Stats,
};
pub use crate::proto::endpoint::{Endpoint, EndpointParseError};
pub use crate::proto::error::{ConfigError, KeyError};
pub use crate::proto::ids::{LatencyTracker, Resource};
pub use crate::proto::key::{ApiKey, AuthMode, Quotas};
pub use crate::proto::outcome::{
    Decision, Failure, FailureCategory, GuardResult, Outcome, Phase, ResourceResult, Response,
    Results,
};
pub use crate::proto::policy::{PolicyError, RequestPolicy, Schedule, ScheduleParseError};
