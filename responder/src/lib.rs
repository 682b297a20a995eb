//! `rl-responder`: the project's own wire-v2 Ratelimitly responder and a test DNS
//! responder.
//!
//! This crate is **test and benchmark infrastructure, not a production rate-limit
//! service**: it lets the client engine, the official clients, rlctl and the load
//! generator talk to a real wire-v2 peer on loopback, with faults on demand.

pub mod buckets;
pub mod dedup;
pub mod dns;
pub mod faults;
pub mod trackers;

pub use faults::{BrokenReply, FaultRng, Faults, FixedDecision};
pub mod decide;
pub mod frame;
pub mod pdu;
