//! `rl-toolkit`: what the workspace's command-line tools (rlctl, loadgen) share, so that
//! the same failure reads the same in every tool.
//!
//! | module | owns |
//! |---|---|
//! | [`words`] | the text of each failure a tool names ([`words::Finding`], discovery failures) |
//! | [`trace`] | a traced request: the engine's sans-IO request machine on sockets of the tool's own, every transmit, receive and ICMP error recorded with its round |
//! | [`probe`] | the reachability probe a tool runs after a timeout (a guard-only request through [`trace`]) |
//! | [`errqueue`] | ICMP errors from the socket error queue (`IP_RECVERR` / `IPV6_RECVERR`) |
//! | [`build_info`] | the commit the tools were built from (`build.rs`) |
//! | [`utc`] | UTC time text (RFC 3339) |
//!
//! Must not touch: the wire format, request policy or selection rules (the engine
//! crate's `proto`), output formats of the tools (theirs). The API key is never printed.

// Every `unsafe` block states why it is sound (a `// SAFETY:` comment); CI's clippy run
// (`-D warnings`) enforces it, as in the engine crate.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod build_info;
pub mod errqueue;
pub mod probe;
pub mod trace;
pub mod utc;
pub mod words;
