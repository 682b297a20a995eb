//! # ratelimitly-engine
//!
//! A client engine for the Ratelimitly admission-control service (wire v2).
//!
//! The crate is split along one boundary: a **sans-IO core** that never touches a
//! socket or reads a clock (time is always a parameter), and a thin **I/O driver**
//! (`engine`) that owns sockets, timers and threads and feeds the core.
//!
//! ```text
//!  application threads (Tokio, plain threads, ...)
//!     │  EngineHandle::request().consume(..).guard(..).send() / .wait() / submit_batch()
//!     ▼  crossbeam channel (lock-free), wake if the core is parked
//! ┌──────────────── I/O driver: engine (one pinned glommio executor per core) ─────────────┐
//! │  submission drain ─▶ in-flight slab ─▶ timer wheel (one glommio timer per core)         │
//! │  UDP sockets (batched send/receive) ◀─▶ steering ◀─▶ membership (discovery thread)       │
//! └────────────┬──────────────────────────────────────────────▲────────────────────────────┘
//!    datagram bytes, now: Instant                        transmits, deadlines, outcomes
//! ┌────────────▼──────────── sans-IO core (no sockets, no clocks) ─┴─────────────────────────┐
//! │  key (ApiKey)  ids (Resource, LatencyTracker)  wire (views, encoders, seal/open)          │
//! │  policy (RequestPolicy, Schedule)  machine (RequestMachine)  outcome (Response, Failure)   │
//! └───────────────────────────────────────────────────────────────────────────────────────────┘
//! ```
//!
//! Everything above the line is tested on real loopback sockets against our responder
//! (`rl-responder`); everything below it is tested on virtual time and test vectors.

pub mod discovery;
pub mod engine;
pub mod key_source;
pub mod proto;
pub mod udp;

pub use crate::engine::{
    Batch, BuildError, Completion, Cores, DnsConfig, Engine, EngineBuilder, EngineHandle,
    OptionError, Request, RequestBuilder, Stats,
};
pub use crate::proto::endpoint::{Endpoint, EndpointParseError};
pub use crate::proto::error::{ConfigError, KeyError};
pub use crate::proto::ids::{LatencyTracker, Resource};
pub use crate::proto::key::{ApiKey, AuthMode, Quotas};
pub use crate::proto::outcome::{
    Decision, Failure, FailureCategory, GuardResult, Outcome, Phase, ResourceResult, Response,
};
pub use crate::proto::policy::{PolicyError, RequestPolicy, Schedule, ScheduleParseError};
