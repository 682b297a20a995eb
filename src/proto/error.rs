//! Errors shared by the whole crate: resource and tracker definitions ([`ResourceError`],
//! [`TrackerError`]), request shape ([`RequestError`]), the umbrella [`ConfigError`] that
//! every "found before any send" failure is reported as, and [`DiscoveryError`] (why no
//! server is known; defined here so the request machine and outcomes need not depend on
//! the DNS exchange). [`KeyError`] and [`PolicyError`] are defined by the modules whose
//! rules they name (key, policy) and only wrapped here, so this module depends on them
//! and never the other way round.
//!
//! Owns: the error enums only. Must not touch: I/O, policy logic, wire encoding. No variant
//! ever carries an API key string, its secret, or any bytes of it (only key ids, lengths and
//! limits), so every error is safe to log.

use std::{fmt, io};

use thiserror::Error;

pub use crate::proto::key::KeyError;
use crate::proto::policy::PolicyError;

/// Why a [`crate::proto::ids::Resource`] definition was rejected.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum ResourceError {
    /// The bucket name is empty.
    #[error("resource name is empty")]
    EmptyName,
    /// The bucket name is longer than u32::MAX bytes.
    #[error("resource name is too long")]
    NameTooLong,
    /// The window is zero.
    #[error("resource window is zero")]
    ZeroWindow,
    /// The window is not a whole number of milliseconds.
    #[error("resource window is not a whole number of milliseconds")]
    WindowNotWholeMs,
    /// The window does not fit a u32 of milliseconds.
    #[error("resource window does not fit u32 milliseconds")]
    WindowTooLong,
}

/// Why a [`crate::proto::ids::LatencyTracker`] definition was rejected.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum TrackerError {
    /// The tracker name is empty.
    #[error("latency tracker name is empty")]
    EmptyName,
    /// The tracker name is longer than u32::MAX bytes.
    #[error("latency tracker name is too long")]
    NameTooLong,
    /// The sample lifetime is zero.
    #[error("latency tracker sample lifetime is zero")]
    ZeroTtl,
    /// The sample lifetime is not a whole number of milliseconds.
    #[error("latency tracker sample lifetime is not a whole number of milliseconds")]
    TtlNotWholeMs,
    /// The sample lifetime does not fit a u32 of milliseconds.
    #[error("latency tracker sample lifetime does not fit u32 milliseconds")]
    TtlTooLong,
    /// max_samples is zero.
    #[error("latency tracker max_samples is zero")]
    ZeroMaxSamples,
    /// min_samples (warm-up threshold) is zero.
    #[error("latency tracker min_samples is zero")]
    ZeroMinSamples,
}

/// Why a request (or latency report) was rejected before anything was sent.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum RequestError {
    /// tokens requested outside 1..=65535.
    #[error("tokens requested ({tokens}) outside 1..=65535")]
    TokensOutOfRange {
        /// The requested amount.
        tokens: u32,
    },
    /// A resource window exceeds the key's rate_window_size_ms_max.
    #[error("resource window {window_ms} ms exceeds the key limit {limit_ms} ms")]
    WindowOverKeyLimit {
        /// The resource's window.
        window_ms: u32,
        /// The key's limit.
        limit_ms: u32,
    },
    /// A guard threshold or observed latency is zero where not allowed, not whole
    /// milliseconds, or does not fit u32 milliseconds.
    #[error("latency value is not a whole number of milliseconds that fits u32")]
    BadLatency,
    /// The metrics label is longer than a u16 length (or than a datagram) allows.
    #[error("metrics label of {len} bytes is too long")]
    LabelTooLong {
        /// Label length in bytes.
        len: usize,
    },
    /// More guards or resources than a u16 count (or a datagram) can carry.
    #[error("too many guards or resources in one request")]
    TooManyBlocks,
    /// The encoded datagram would exceed the maximum datagram size.
    #[error("encoded datagram needs {needed} bytes, the maximum is {max}")]
    TooLarge {
        /// Bytes the datagram would need.
        needed: usize,
        /// The limit (1200).
        max: usize,
    },
}

/// A configuration failure: found before any I/O or send.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// The API key string is invalid.
    #[error("invalid API key: {0}")]
    Key(#[from] KeyError),
    /// A resource definition is invalid.
    #[error("invalid resource: {0}")]
    Resource(#[from] ResourceError),
    /// A latency tracker definition is invalid.
    #[error("invalid latency tracker: {0}")]
    Tracker(#[from] TrackerError),
    /// A request is invalid.
    #[error("invalid request: {0}")]
    Request(#[from] RequestError),
    /// The request policy is invalid (or too long for the key).
    #[error("invalid request policy: {0}")]
    Policy(#[from] PolicyError),
}

/// Why a discovery produced no server.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiscoveryError {
    /// The domain is empty or not a valid DNS name.
    InvalidDomain,
    /// No DNS server was given and /etc/resolv.conf names none.
    NoDnsServer,
    /// A socket operation failed (bind, connect, send, receive) — not a timeout.
    Io(io::ErrorKind),
    /// The DNS server did not answer within the timeout, on every attempt.
    Timeout,
    /// The DNS answer could not be decoded, or an encoded query could not be built.
    Malformed,
    /// The DNS server says the SRV name does not exist.
    NxDomain,
    /// The DNS server answered with another error code (SERVFAIL, REFUSED, ...).
    ServerError(u16),
    /// The SRV answer holds no target named `s-<id>` with at least one address.
    NoServer,
}

impl fmt::Display for DiscoveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidDomain => f.write_str("invalid discovery domain"),
            Self::NoDnsServer => f.write_str("no DNS server given and none in /etc/resolv.conf"),
            Self::Io(kind) => write!(f, "DNS socket error: {kind}"),
            Self::Timeout => f.write_str("DNS server did not answer in time"),
            Self::Malformed => f.write_str("malformed DNS message"),
            Self::NxDomain => f.write_str("SRV name does not exist (NXDOMAIN)"),
            Self::ServerError(code) => write!(f, "DNS server returned error code {code}"),
            Self::NoServer => {
                f.write_str("no Ratelimitly server (s-<id> target with an address) found")
            }
        }
    }
}

impl std::error::Error for DiscoveryError {}

impl From<io::Error> for DiscoveryError {
    fn from(e: io::Error) -> Self {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Self::Timeout,
            kind => Self::Io(kind),
        }
    }
}
