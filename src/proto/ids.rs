//! Identities (docs/protocol.md §5): bucket ids and tracker ids are the first 16 bytes of the
//! unkeyed BLAKE2s-256 digest of `domain NUL · u32 name length · name · fields (u32 LE)`.
//! Also the validated definitions that carry them: [`Resource`] (a rate bucket) and
//! [`LatencyTracker`], whose id is computed once at construction.
//!
//! Owns: id derivation, definition validation, and the one conversion of a duration the
//! wire carries (window, sample lifetime, guard threshold, observed latency) to whole
//! milliseconds ([`latency_ms`] for the latency values). Must not touch: I/O, keys, wire
//! framing, per-request state.

use std::sync::Arc;
use std::time::Duration;

use blake2::{Blake2s256, Digest};

use crate::proto::error::{ConfigError, RequestError, ResourceError, TrackerError};

/// Hash domain of bucket ids (NUL included).
const BUCKET_DOMAIN: &[u8] = b"ratelimitly.resource.v1\0";
/// Hash domain of tracker ids (NUL included).
const TRACKER_DOMAIN: &[u8] = b"ratelimitly.latency-tracker.v2\0";

fn derive(domain: &[u8], name: &[u8], fields: &[u32]) -> [u8; 16] {
    let mut h = Blake2s256::new();
    h.update(domain);
    // Names longer than u32::MAX are rejected by the constructors; saturate for raw callers.
    h.update(u32::try_from(name.len()).unwrap_or(u32::MAX).to_le_bytes());
    h.update(name);
    for f in fields {
        h.update(f.to_le_bytes());
    }
    let digest = h.finalize();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id
}

/// Bucket id of (name, window_size_ms, rate_limit).
pub fn bucket_id(name: &[u8], window_ms: u32, rate_limit: u32) -> [u8; 16] {
    derive(BUCKET_DOMAIN, name, &[window_ms, rate_limit])
}

/// Tracker id of (name, ttl_ms, max_samples, min_sample_threshold).
pub fn tracker_id(name: &[u8], ttl_ms: u32, max_samples: u32, min_samples: u32) -> [u8; 16] {
    derive(TRACKER_DOMAIN, name, &[ttl_ms, max_samples, min_samples])
}

/// Why a duration is not a wire millisecond count.
enum MsError {
    Zero,
    NotWhole,
    TooLong,
}

/// A positive whole number of milliseconds that fits u32.
fn whole_ms(d: Duration) -> Result<u32, MsError> {
    if d.is_zero() {
        return Err(MsError::Zero);
    }
    if !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err(MsError::NotWhole);
    }
    u32::try_from(d.as_millis()).map_err(|_| MsError::TooLong)
}

/// Which latency value a duration is converted for ([`latency_ms`]); the rules differ only
/// for zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LatencyField {
    /// A guard's latency threshold: zero is refused (a guard passes only when the current
    /// latency is strictly below it, so a zero threshold could never pass; the official
    /// client refuses it too).
    GuardThreshold,
    /// An observed latency in a latency report: zero is a real measurement and accepted.
    Observed,
}

/// A latency as whole milliseconds for the wire: a whole number of milliseconds that
/// fits u32, and non-zero for a guard threshold. Anything else, a sub-millisecond part
/// included, is [`RequestError::BadLatency`] (never rounded, as the official client does).
pub fn latency_ms(d: Duration, field: LatencyField) -> Result<u32, RequestError> {
    match (whole_ms(d), field) {
        (Ok(ms), _) => Ok(ms),
        (Err(MsError::Zero), LatencyField::Observed) => Ok(0),
        (Err(_), _) => Err(RequestError::BadLatency),
    }
}

/// A rate bucket definition: name, window and rate limit (tokens per window).
/// The same name with other settings is another bucket.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Resource {
    /// Shared, so a clone (a request per HTTP request in the tower layer) costs a
    /// reference count, not an allocation.
    name: Arc<str>,
    window_ms: u32,
    rate_limit: u32,
    id: [u8; 16],
}

impl Resource {
    /// Validates and builds a resource. The name must be non-empty; the window a positive
    /// whole number of milliseconds that fits u32. Any rate limit is accepted (as the
    /// official client does); the key's window limit is checked per request.
    pub fn new(
        name: impl Into<String>,
        window: Duration,
        rate_limit: u32,
    ) -> Result<Resource, ConfigError> {
        let name = name.into();
        if name.is_empty() {
            return Err(ResourceError::EmptyName.into());
        }
        if u32::try_from(name.len()).is_err() {
            return Err(ResourceError::NameTooLong.into());
        }
        let window_ms = whole_ms(window).map_err(|e| match e {
            MsError::Zero => ResourceError::ZeroWindow,
            MsError::NotWhole => ResourceError::WindowNotWholeMs,
            MsError::TooLong => ResourceError::WindowTooLong,
        })?;
        let id = bucket_id(name.as_bytes(), window_ms, rate_limit);
        Ok(Resource {
            name: name.into(),
            window_ms,
            rate_limit,
            id,
        })
    }

    /// The bucket name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The window in milliseconds.
    pub fn window_ms(&self) -> u32 {
        self.window_ms
    }

    /// Tokens per window.
    pub fn rate_limit(&self) -> u32 {
        self.rate_limit
    }

    /// The bucket id.
    pub fn id(&self) -> [u8; 16] {
        self.id
    }
}

/// A latency tracker definition: name, sample lifetime, max samples kept and warm-up
/// population. The same name with other settings is another tracker.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LatencyTracker {
    /// Shared, as [`Resource`]'s.
    name: Arc<str>,
    ttl_ms: u32,
    max_samples: u32,
    min_samples: u32,
    id: [u8; 16],
}

impl LatencyTracker {
    /// Validates and builds a tracker: non-empty name, ttl a positive whole number of
    /// milliseconds that fits u32, max_samples > 0, min_samples > 0.
    pub fn new(
        name: impl Into<String>,
        ttl: Duration,
        max_samples: u32,
        min_samples: u32,
    ) -> Result<LatencyTracker, ConfigError> {
        let name = name.into();
        if name.is_empty() {
            return Err(TrackerError::EmptyName.into());
        }
        if u32::try_from(name.len()).is_err() {
            return Err(TrackerError::NameTooLong.into());
        }
        let ttl_ms = whole_ms(ttl).map_err(|e| match e {
            MsError::Zero => TrackerError::ZeroTtl,
            MsError::NotWhole => TrackerError::TtlNotWholeMs,
            MsError::TooLong => TrackerError::TtlTooLong,
        })?;
        if max_samples == 0 {
            return Err(TrackerError::ZeroMaxSamples.into());
        }
        if min_samples == 0 {
            return Err(TrackerError::ZeroMinSamples.into());
        }
        let id = tracker_id(name.as_bytes(), ttl_ms, max_samples, min_samples);
        Ok(LatencyTracker {
            name: name.into(),
            ttl_ms,
            max_samples,
            min_samples,
            id,
        })
    }

    /// The tracker name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Maximum sample age in milliseconds.
    pub fn ttl_ms(&self) -> u32 {
        self.ttl_ms
    }

    /// Maximum number of samples considered.
    pub fn max_samples(&self) -> u32 {
        self.max_samples
    }

    /// Warm-up population (min_sample_threshold).
    pub fn min_samples(&self) -> u32 {
        self.min_samples
    }

    /// The tracker id.
    pub fn id(&self) -> [u8; 16] {
        self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation() {
        let ms = Duration::from_millis;
        assert!(Resource::new("a", ms(1), 0).is_ok());
        assert_eq!(
            Resource::new("", ms(1), 1),
            Err(ResourceError::EmptyName.into())
        );
        assert_eq!(
            Resource::new("a", Duration::ZERO, 1),
            Err(ResourceError::ZeroWindow.into())
        );
        assert_eq!(
            Resource::new("a", Duration::from_micros(1500), 1),
            Err(ResourceError::WindowNotWholeMs.into())
        );
        assert_eq!(
            Resource::new("a", ms(u64::from(u32::MAX) + 1), 1),
            Err(ResourceError::WindowTooLong.into())
        );
        assert!(LatencyTracker::new("t", ms(10), 1, 1).is_ok());
        assert_eq!(
            LatencyTracker::new("t", ms(10), 0, 1),
            Err(TrackerError::ZeroMaxSamples.into())
        );
        assert_eq!(
            LatencyTracker::new("t", ms(10), 1, 0),
            Err(TrackerError::ZeroMinSamples.into())
        );
        assert_eq!(
            LatencyTracker::new("", ms(10), 1, 1),
            Err(TrackerError::EmptyName.into())
        );
    }

    #[test]
    fn latency_ms_rules() {
        use LatencyField::{GuardThreshold, Observed};
        let ms = Duration::from_millis;
        let bad = Err(RequestError::BadLatency);
        assert_eq!(latency_ms(ms(250), GuardThreshold), Ok(250));
        assert_eq!(latency_ms(ms(250), Observed), Ok(250));
        assert_eq!(latency_ms(Duration::ZERO, GuardThreshold), bad);
        assert_eq!(latency_ms(Duration::ZERO, Observed), Ok(0));
        for field in [GuardThreshold, Observed] {
            assert_eq!(latency_ms(Duration::from_micros(1500), field), bad);
            assert_eq!(latency_ms(Duration::from_micros(500), field), bad);
            assert_eq!(latency_ms(ms(u64::from(u32::MAX)), field), Ok(u32::MAX));
            assert_eq!(latency_ms(ms(u64::from(u32::MAX) + 1), field), bad);
            assert_eq!(latency_ms(Duration::MAX, field), bad);
        }
    }

    #[test]
    fn checkout_vector() {
        let r = Resource::new("checkout", Duration::from_secs(1), 100).unwrap();
        assert_eq!(
            r.id(),
            [
                0xf5, 0xcf, 0x3a, 0xd8, 0xb8, 0x40, 0x68, 0x54, 0xb5, 0x96, 0xba, 0x36, 0x14, 0xf1,
                0x6e, 0xff
            ]
        );
    }
}
