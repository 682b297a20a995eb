//! The library part of `rl-proxy`: Envoy's rate limit service ([`rls`], feature `rls`,
//! on by default), used by the binary's `--mode rls`, by the gRPC load client
//! (`rl-rls-load`) and by the fuzz crate's request-decoding target.

#![warn(missing_docs)]

#[cfg(feature = "rls")]
pub mod rls;
