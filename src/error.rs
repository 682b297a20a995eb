//! Configuration errors shared by the whole crate: API keys ([`KeyError`]), resource and
//! tracker definitions ([`ResourceError`], [`TrackerError`]), request shape
//! ([`RequestError`]) and the umbrella [`ConfigError`] that every "found before any send"
//! failure is reported as.
//!
//! Owns: the error enums only. Must not touch: I/O, policy logic, wire encoding. No variant
//! ever carries an API key string, its secret, or any bytes of it (only key ids, lengths and
//! limits), so every error is safe to log.

use thiserror::Error;

use crate::key::AuthMode;
use crate::policy::PolicyError;

/// Why an API key string was rejected. Each variant names the rule that failed; none
/// carries any part of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum KeyError {
    /// The string is empty.
    #[error("API key is empty")]
    Empty,
    /// A character is outside printable ASCII, or outside the Bech32 alphabet in the data part.
    #[error("API key contains a character outside printable ASCII / the Bech32 alphabet")]
    InvalidCharacter,
    /// Upper- and lower-case letters are mixed.
    #[error("API key mixes upper and lower case")]
    MixedCase,
    /// No `1` separator between the human-readable part and the data.
    #[error("API key has no '1' separator")]
    MissingSeparator,
    /// The human-readable part is empty or longer than 83 characters.
    #[error("API key human-readable part is empty or too long")]
    BadHrp,
    /// The human-readable part is not `rl-aes`, `rl-cookie` or `rl-none`.
    #[error("API key method is not rl-aes, rl-cookie or rl-none")]
    UnknownMethod,
    /// The data part is shorter than the 6-character checksum.
    #[error("API key data part is shorter than its checksum")]
    TooShort,
    /// The whole string is longer than a Bech32 code allows (1023 characters).
    #[error("API key is longer than 1023 characters")]
    TooLong,
    /// The Bech32 (BIP-173, constant 1) checksum does not verify.
    #[error("API key checksum does not verify")]
    BadChecksum,
    /// The 5-to-8-bit regrouping leaves 5 or more bits, or non-zero leftover bits.
    #[error("API key payload has invalid padding bits")]
    BadPadding,
    /// The payload has the wrong length for its method (45 bytes aes/cookie, 13 none).
    #[error("API key payload is {actual} bytes, {mode:?} keys have {expected}")]
    BadLength {
        /// The key's method.
        mode: AuthMode,
        /// Required payload length.
        expected: usize,
        /// Decoded payload length.
        actual: usize,
    },
    /// The format version byte is not 0x01.
    #[error("API key format version {found} is not supported (only 1)")]
    BadVersion {
        /// The version byte found.
        found: u8,
    },
    /// Quota word: rate-bucket exponent above 24.
    #[error("API key quota word has a reserved rate-bucket exponent")]
    ReservedRateExponent,
    /// Quota word: latency-tracker exponent above 24.
    #[error("API key quota word has a reserved latency-tracker exponent")]
    ReservedLatencyExponent,
    /// Quota word: dedup code outside 1..=200.
    #[error("API key quota word has a dedup code outside 1..=200")]
    BadDedupCode,
}

/// Why a [`crate::ids::Resource`] definition was rejected.
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

/// Why a [`crate::ids::LatencyTracker`] definition was rejected.
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
