//! The sans-IO protocol core: everything a Ratelimitly client decides, with no socket,
//! no clock and no thread (time is always a parameter).
//!
//! | module | owns |
//! |---|---|
//! | [`key`] | API keys: parsing, auth mode, quotas, constant-time equality, wiping |
//! | [`ids`] | bucket and tracker ids, `Resource`, `LatencyTracker`, latency-ms rules |
//! | [`endpoint`] | `Endpoint` and its `ID@IP:PORT` text form |
//! | [`wire`] | datagram views, exact-length encoders, seal/open |
//! | [`policy`] | the request policy, its schedule and horizon |
//! | [`machine`] | one logical request's delivery and selection rules |
//! | [`outcome`] | responses, failures and their categories |
//! | [`error`] | configuration errors |
//!
//! Must not touch: sockets, clocks, threads, the environment. The engine
//! (`crate::engine`) and the responder drive these modules; docs/protocol.md is the
//! reference they cite.

pub mod endpoint;
pub mod error;
pub mod ids;
pub mod key;
pub mod machine;
pub mod outcome;
pub mod policy;
pub mod wire;
