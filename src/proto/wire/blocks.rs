//! Guard and resource blocks shared by the rate request and the rate response PDUs
//! (docs/protocol.md §2–§3): their field offsets, the guard block encoder and view, and the grant
//! rule over result blocks.
//!
//! Owns: the guard block layout (36 bytes, identical in both directions) and its values
//! ([`GuardSpec`]), the resource block layout both directions share (28 bytes: bucket id,
//! window, a rate at +20, a token count at +24; request.rs and response.rs name the last
//! two) with its one reader and writer, [`GuardView`], and the one statement of the grant
//! rule ([`guard_passes`], [`grants`]). Must not touch: PDU framing and counts
//! (request.rs, response.rs), anything above the wire.

use std::fmt;

use super::{get_id, get_u16, get_u32, put_u16, put_u32};

/// Guard block offsets (request and response).
pub(crate) mod guard {
    pub const TRACKER_ID: usize = 0;
    pub const TTL: usize = 16;
    pub const MAX_SAMPLES: usize = 20;
    pub const MIN_SAMPLES: usize = 24;
    pub const THRESHOLD: usize = 28;
    pub const CURRENT: usize = 32;
}

/// Resource block offsets, the same in the request and the response block.
pub(crate) mod resource {
    pub const BUCKET_ID: usize = 0;
    pub const WINDOW: usize = 16;
    /// Request: the rate limit; response: the actual rate.
    pub const RATE: usize = 20;
    /// Request: the tokens asked for; response: the deficit.
    pub const TOKENS: usize = 24;
    pub const RESERVED: usize = 26;
}

/// Writes one resource block into `out[..28]` (the caller checked the length): `rate` and
/// `tokens` are the request's rate limit and tokens, or the response's actual rate and
/// deficit.
pub(crate) fn put_resource(
    out: &mut [u8],
    bucket_id: &[u8; 16],
    window_ms: u32,
    rate: u32,
    tokens: u16,
) {
    out[resource::BUCKET_ID..resource::WINDOW].copy_from_slice(bucket_id);
    put_u32(out, resource::WINDOW, window_ms);
    put_u32(out, resource::RATE, rate);
    put_u16(out, resource::TOKENS, tokens);
    put_u16(out, resource::RESERVED, 0);
}

/// One resource block (request or response), read by both directions' views. Only made
/// from a 28-byte chunk of a validated PDU, so no accessor can read out of bounds. Its
/// `Debug` is the bytes', as the views showed before they shared it.
#[derive(Clone, Copy)]
pub(crate) struct ResourceBlock<'a>(&'a [u8]);

impl<'a> ResourceBlock<'a> {
    /// `b` must be exactly one block (`chunks_exact(RESOURCE_BLOCK_LEN)`).
    #[inline]
    pub(crate) fn new(b: &'a [u8]) -> ResourceBlock<'a> {
        debug_assert_eq!(b.len(), super::RESOURCE_BLOCK_LEN);
        ResourceBlock(b)
    }
    #[inline]
    pub(crate) fn bucket_id(self) -> [u8; 16] {
        get_id(self.0, resource::BUCKET_ID)
    }
    #[inline]
    pub(crate) fn window_ms(self) -> u32 {
        get_u32(self.0, resource::WINDOW)
    }
    /// Request: the rate limit; response: the actual rate.
    #[inline]
    pub(crate) fn rate(self) -> u32 {
        get_u32(self.0, resource::RATE)
    }
    /// Request: the tokens asked for; response: the deficit.
    #[inline]
    pub(crate) fn tokens(self) -> u16 {
        get_u16(self.0, resource::TOKENS)
    }
}

impl fmt::Debug for ResourceBlock<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.0, f)
    }
}

/// A guard block's values (request: current_latency_ms = 0; response: filled in).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuardSpec {
    /// Tracker id.
    pub tracker_id: [u8; 16],
    /// Max sample age.
    pub ttl_ms: u32,
    /// Max samples considered.
    pub max_samples: u32,
    /// Warm-up population.
    pub min_samples: u32,
    /// Latency threshold in ms (grant needs current < threshold).
    pub threshold_ms: u32,
    /// Current latency (0 in requests).
    pub current_latency_ms: u32,
}

/// A guard passes exactly when its current latency is strictly below its threshold (as
/// echoed by the server; docs/protocol.md §3).
#[inline]
pub const fn guard_passes(threshold_ms: u32, current_latency_ms: u32) -> bool {
    current_latency_ms < threshold_ms
}

/// The grant rule (docs/protocol.md §3): a response is a grant exactly when every guard passed
/// and every deficit is 0. Zero entries = grant. Bounded by its inputs (at most 65535 of
/// each in one PDU).
#[inline]
pub fn grants(
    guards_passed: impl IntoIterator<Item = bool>,
    deficits: impl IntoIterator<Item = u16>,
) -> bool {
    guards_passed.into_iter().all(|p| p) && deficits.into_iter().all(|d| d == 0)
}

/// Writes one guard block into `out[..36]` (the caller checked the length).
pub(crate) fn put_guard(out: &mut [u8], g: &GuardSpec) {
    out[guard::TRACKER_ID..guard::TTL].copy_from_slice(&g.tracker_id);
    put_u32(out, guard::TTL, g.ttl_ms);
    put_u32(out, guard::MAX_SAMPLES, g.max_samples);
    put_u32(out, guard::MIN_SAMPLES, g.min_samples);
    put_u32(out, guard::THRESHOLD, g.threshold_ms);
    put_u32(out, guard::CURRENT, g.current_latency_ms);
}

/// A guard block (request or response). Only made from a 36-byte chunk of a validated
/// PDU, so no accessor can read out of bounds.
#[derive(Clone, Copy, Debug)]
pub struct GuardView<'a> {
    b: &'a [u8],
}

impl<'a> GuardView<'a> {
    /// `b` must be exactly one block (`chunks_exact(GUARD_BLOCK_LEN)`).
    pub(crate) fn new(b: &'a [u8]) -> GuardView<'a> {
        debug_assert_eq!(b.len(), super::GUARD_BLOCK_LEN);
        GuardView { b }
    }
    /// Tracker id.
    pub fn tracker_id(&self) -> [u8; 16] {
        get_id(self.b, guard::TRACKER_ID)
    }
    /// Max sample age.
    pub fn ttl_ms(&self) -> u32 {
        get_u32(self.b, guard::TTL)
    }
    /// Max samples.
    pub fn max_samples(&self) -> u32 {
        get_u32(self.b, guard::MAX_SAMPLES)
    }
    /// Warm-up population.
    pub fn min_samples(&self) -> u32 {
        get_u32(self.b, guard::MIN_SAMPLES)
    }
    /// Latency threshold (as echoed).
    pub fn threshold_ms(&self) -> u32 {
        get_u32(self.b, guard::THRESHOLD)
    }
    /// Current latency (0 in requests).
    pub fn current_latency_ms(&self) -> u32 {
        get_u32(self.b, guard::CURRENT)
    }
    /// current < threshold (strict; [`guard_passes`]).
    pub fn passed(&self) -> bool {
        guard_passes(self.threshold_ms(), self.current_latency_ms())
    }
    /// The values, copied out.
    pub fn spec(&self) -> GuardSpec {
        GuardSpec {
            tracker_id: self.tracker_id(),
            ttl_ms: self.ttl_ms(),
            max_samples: self.max_samples(),
            min_samples: self.min_samples(),
            threshold_ms: self.threshold_ms(),
            current_latency_ms: self.current_latency_ms(),
        }
    }
}
