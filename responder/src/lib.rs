//! `rl-responder`: the project's own wire-v2 Ratelimitly responder and a test DNS
//! responder.
//!
//! This crate is **test and benchmark infrastructure, not a production rate-limit
//! service**: it lets the client engine, the official clients, rlctl and the load
//! generator talk to a real wire-v2 peer on loopback, with faults on demand. Limits are
//! exact but live in memory only; there is no persistence, clustering or hardening
//! beyond "untrusted input never panics".
//!
//! Layout: [`decide`] (sans-IO decision logic over [`frame`], [`pdu`], [`dedup`],
//! [`buckets`], [`trackers`]), [`faults`], [`nonce`] (response nonces), [`runner`] (thread-per-core I/O on the
//! engine's `udp` layer, and the embedded API), [`dns`] (discovery records for tests), [`keys`] (key loading for the
//! binary).

// Every `unsafe` block states why it is sound (a `// SAFETY:` comment); CI's clippy run
// (`-D warnings`) enforces it, as in the engine crate.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod buckets;
pub mod decide;
pub mod dedup;
pub mod dns;
pub mod faults;
pub mod frame;
pub mod keys;
pub mod nonce;
pub mod pdu;
pub mod runner;
pub mod trackers;

pub use decide::Counters;
pub use faults::{BrokenReply, FaultRng, Faults, FixedDecision};
pub use runner::{ResponderConfig, ResponderError, ResponderHandle, spawn};
