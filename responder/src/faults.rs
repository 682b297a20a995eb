//! Fault injection settings and the seeded, reproducible random source that applies them.
//!
//! Owns: [`Faults`] (what to inject), [`FixedDecision`], [`BrokenReply`], and [`FaultRng`]
//! (a SplitMix64 stream: the same seed gives the same sequence of fault choices).
//! Must not touch: sockets, clocks, bucket/tracker/dedup state. The decision logic
//! (`decide`) applies steering, fixed decisions and broken replies; the runner applies
//! drops, delays and duplicates.

use std::str::FromStr;
use std::time::Duration;

/// A decision forced on every rate request (state is neither read nor debited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FixedDecision {
    /// Every resource available (deficit 0), every guard at latency 0.
    Grant,
    /// Every resource short of the tokens asked for (deficit = tokens, at least 1).
    Reject,
    /// Every guard reports current latency = its threshold (fails); resources available.
    GuardFail,
}

/// A malformed reply, for client tests: the client must ignore it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BrokenReply {
    /// GCM tag flipped (aes), echoed cookie altered (cookie), tenant type altered (none).
    BadAuth,
    /// Datagram cut short in the middle of the PDU.
    Truncated,
    /// The unique id is not the request's.
    WrongUniqueId,
    /// The server id is not this server's (bitwise complement).
    WrongServerId,
    /// One block fewer than asked (the last resource, or the last guard).
    FewerEntries,
    /// One resource block more than asked (an unknown bucket id).
    MoreEntries,
    /// Zero guards and zero resources (reads as a grant).
    ZeroEntries,
}

/// Error for the textual forms of fault options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FaultParseError {
    /// Not one of `grant`, `reject`, `guard-fail`.
    #[error("unknown fixed decision (expected grant, reject or guard-fail)")]
    UnknownFixed,
    /// Not one of the broken-reply kinds.
    #[error(
        "unknown broken reply (expected bad-auth, truncated, wrong-unique-id, wrong-server-id, fewer, more, zero)"
    )]
    UnknownBroken,
}

impl FromStr for FixedDecision {
    type Err = FaultParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "grant" => Ok(Self::Grant),
            "reject" => Ok(Self::Reject),
            "guard-fail" => Ok(Self::GuardFail),
            _ => Err(FaultParseError::UnknownFixed),
        }
    }
}

impl FromStr for BrokenReply {
    type Err = FaultParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bad-auth" | "bad-tag" | "bad-cookie" => Ok(Self::BadAuth),
            "truncated" => Ok(Self::Truncated),
            "wrong-unique-id" => Ok(Self::WrongUniqueId),
            "wrong-server-id" => Ok(Self::WrongServerId),
            "fewer" | "fewer-entries" => Ok(Self::FewerEntries),
            "more" | "more-entries" => Ok(Self::MoreEntries),
            "zero" | "zero-entries" => Ok(Self::ZeroEntries),
            _ => Err(FaultParseError::UnknownBroken),
        }
    }
}

/// Faults of one responder instance. `Default` injects nothing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability of dropping an inbound datagram before it is looked at.
    pub drop_in: f64,
    /// Probability of dropping a response instead of sending it.
    pub drop_out: f64,
    /// Fixed delay added to every response.
    pub delay: Duration,
    /// Extra uniform random delay in [0, jitter].
    pub jitter: Duration,
    /// Probability of sending a response twice.
    pub duplicate: f64,
    /// Every n-th response carries steering 0 (0 = never).
    pub steer_every: u32,
    /// Forced decision.
    pub fixed: Option<FixedDecision>,
    /// Malformed replies.
    pub broken: Option<BrokenReply>,
    /// Drop every inbound datagram (counted) until cleared.
    pub silent: bool,
    /// Seed of the fault random stream (per core: seed + core index).
    pub seed: u64,
}

impl Faults {
    /// True when the runner has anything to do per datagram (drops, delays, duplicates).
    pub fn has_io_faults(&self) -> bool {
        self.drop_in > 0.0
            || self.drop_out > 0.0
            || !self.delay.is_zero()
            || !self.jitter.is_zero()
            || self.duplicate > 0.0
            || self.silent
    }
}

/// SplitMix64: tiny, seeded, reproducible.
#[derive(Clone, Debug)]
pub struct FaultRng(u64);

impl FaultRng {
    /// A stream from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p` (no draw when p <= 0 or p >= 1).
    pub fn chance(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        if p >= 1.0 {
            return true;
        }
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    /// Uniform duration in [0, max].
    pub fn up_to(&mut self, max: Duration) -> Duration {
        let n = max.as_nanos() as u64;
        if n == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next_u64() % (n + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_reproducible_and_roughly_fair() {
        let mut a = FaultRng::new(42);
        let mut b = FaultRng::new(42);
        let hits = (0..10_000).filter(|_| a.chance(0.25)).count();
        let hits_b = (0..10_000).filter(|_| b.chance(0.25)).count();
        assert_eq!(hits, hits_b);
        assert!((2000..3000).contains(&hits), "{hits}");
    }

    #[test]
    fn parse_names() {
        assert_eq!("guard-fail".parse(), Ok(FixedDecision::GuardFail));
        assert_eq!("zero".parse(), Ok(BrokenReply::ZeroEntries));
        assert!("x".parse::<BrokenReply>().is_err());
    }
}
