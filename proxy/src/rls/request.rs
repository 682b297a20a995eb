//! A `ShouldRateLimit` request, checked: what is refused with gRPC `INVALID_ARGUMENT`
//! ([`Invalid`]), and what each descriptor asks for ([`Call`]).
//!
//! Bounds (each chosen above what Envoy sends with its defaults, so that no request a
//! client can shape through Envoy is refused, and a refused one never reaches the
//! engine):
//! - the whole message: [`MAX_MESSAGE`] bytes (the gRPC layer refuses a longer one with
//!   `OUT_OF_RANGE` before decoding it);
//! - the domain: not empty, at most [`MAX_DOMAIN`] bytes;
//! - descriptors: 1 to [`MAX_DESCRIPTORS`], each with at most [`MAX_ENTRIES`] entries;
//! - an entry's key and value: at most [`MAX_TEXT`] bytes each (Envoy's request headers
//!   are at most 60 KiB by default, `max_request_headers_kb`);
//! - hits (`hits_addend`, the request's or a descriptor's; 0 means 1): at most 65535, the
//!   protocol's tokens per resource; `is_negative_hits` is refused (Ratelimitly never
//!   gives tokens back);
//! - distinct limited buckets of one call: as many as descriptors (a call with more than
//!   one request carries is split, `decide`);
//! - a `RateLimitOverride`'s unit: second, minute, hour or day (`UNKNOWN`, month, year
//!   and values outside the enum are refused).
//!
//! Owns: the checks and their messages. Must not touch: rules, the engine.

use std::fmt;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::r#type::v3::RateLimitUnit;

use super::rules::{Limit, Unit};

/// Bytes of one request message at most (the gRPC layer's decoding limit).
pub const MAX_MESSAGE: usize = 2 << 20;
/// Bytes of the domain at most.
pub const MAX_DOMAIN: usize = 1024;
/// Descriptors of one request at most.
pub const MAX_DESCRIPTORS: usize = 64;
/// Entries of one descriptor at most.
pub const MAX_ENTRIES: usize = 32;
/// Bytes of an entry's key or value at most.
pub const MAX_TEXT: usize = 64 << 10;
/// Hits of one descriptor at most (tokens of one resource in the protocol).
pub const MAX_HITS: u64 = 65_535;

/// Why a request is refused (`INVALID_ARGUMENT`, with this text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// `domain` is empty.
    EmptyDomain,
    /// `domain` is longer than [`MAX_DOMAIN`].
    DomainTooLong(usize),
    /// No descriptors.
    NoDescriptors,
    /// More than [`MAX_DESCRIPTORS`].
    TooManyDescriptors(usize),
    /// Descriptor `.0` has more than [`MAX_ENTRIES`] entries (`.1`).
    TooManyEntries(usize, usize),
    /// Descriptor `.0`, entry `.1`: a key or value of `.2` bytes, over [`MAX_TEXT`].
    TextTooLong(usize, usize, usize),
    /// Descriptor `.0` asks for `.1` hits, over [`MAX_HITS`].
    TooManyHits(usize, u64),
    /// Descriptor `.0` has `is_negative_hits`.
    NegativeHits(usize),
    /// Descriptor `.0`'s override has unit `.1` (the proto's enum value).
    BadOverrideUnit(usize, i32),
    /// Descriptor `.0`'s override sets a window of `.1` ms, over the API key's `.2` ms.
    OverrideTooLong(usize, u128, u128),
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::EmptyDomain => f.write_str("domain is empty"),
            Invalid::DomainTooLong(n) => {
                write!(f, "domain is {n} bytes long, at most {MAX_DOMAIN}")
            }
            Invalid::NoDescriptors => f.write_str("no descriptors"),
            Invalid::TooManyDescriptors(n) => {
                write!(f, "{n} descriptors, at most {MAX_DESCRIPTORS}")
            }
            Invalid::TooManyEntries(d, n) => {
                write!(f, "descriptor {d}: {n} entries, at most {MAX_ENTRIES}")
            }
            Invalid::TextTooLong(d, e, n) => write!(
                f,
                "descriptor {d}, entry {e}: a key or value of {n} bytes, at most {MAX_TEXT}"
            ),
            Invalid::TooManyHits(d, n) => {
                write!(f, "descriptor {d}: {n} hits, at most {MAX_HITS}")
            }
            Invalid::NegativeHits(d) => write!(
                f,
                "descriptor {d}: is_negative_hits is not supported (tokens are never given back)"
            ),
            Invalid::BadOverrideUnit(d, u) => write!(
                f,
                "descriptor {d}: limit override unit {} is not supported (second, minute, hour or day)",
                RateLimitUnit::try_from(*u)
                    .map(|u| u.as_str_name().to_owned())
                    .unwrap_or_else(|_| u.to_string())
            ),
            Invalid::OverrideTooLong(d, w, max) => write!(
                f,
                "descriptor {d}: limit override window of {w} ms, over the API key's {max} ms"
            ),
        }
    }
}

impl std::error::Error for Invalid {}

/// One descriptor, checked.
#[derive(Clone, Copy, Debug)]
pub struct Descriptor<'a> {
    /// Its entries.
    pub entries: &'a [Entry],
    /// Tokens asked (1..=65535).
    pub hits: u16,
    /// Its `RateLimitOverride`, if any.
    pub limit: Option<Limit>,
    /// The override as sent (`requests_per_unit`, the unit's enum value), for the
    /// answer's `dynamic_metadata`.
    pub sent_limit: Option<(u32, i32)>,
    /// Its own `hits_addend` as sent, if any.
    pub sent_hits: Option<u64>,
}

/// A request, checked.
#[derive(Clone, Debug)]
pub struct Call<'a> {
    /// The domain.
    pub domain: &'a str,
    /// The descriptors, in request order.
    pub descriptors: Vec<Descriptor<'a>>,
    /// The request's `hits_addend` as sent.
    pub hits_addend: u32,
}

fn override_limit(i: usize, d: &RateLimitDescriptor) -> Result<Option<Limit>, Invalid> {
    let Some(o) = &d.limit else { return Ok(None) };
    let unit = match RateLimitUnit::try_from(o.unit) {
        Ok(RateLimitUnit::Second) => Unit::Second,
        Ok(RateLimitUnit::Minute) => Unit::Minute,
        Ok(RateLimitUnit::Hour) => Unit::Hour,
        Ok(RateLimitUnit::Day) => Unit::Day,
        _ => return Err(Invalid::BadOverrideUnit(i, o.unit)),
    };
    Ok(Some(Limit {
        requests_per_unit: o.requests_per_unit,
        window: unit.window().unwrap_or(Duration::ZERO),
        unit,
    }))
}

/// A request message as the gRPC layer hands it over: the protobuf bytes decoded (the
/// fuzz target's entry, with [`Call::check`]).
pub fn decode(bytes: &[u8]) -> Result<RateLimitRequest, prost::DecodeError> {
    use prost::Message;
    RateLimitRequest::decode(bytes)
}

impl<'a> Call<'a> {
    /// Checks `req`.
    pub fn check(req: &'a RateLimitRequest) -> Result<Call<'a>, Invalid> {
        if req.domain.is_empty() {
            return Err(Invalid::EmptyDomain);
        }
        if req.domain.len() > MAX_DOMAIN {
            return Err(Invalid::DomainTooLong(req.domain.len()));
        }
        match req.descriptors.len() {
            0 => return Err(Invalid::NoDescriptors),
            n if n > MAX_DESCRIPTORS => return Err(Invalid::TooManyDescriptors(n)),
            _ => {}
        }
        let mut descriptors = Vec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            if d.entries.len() > MAX_ENTRIES {
                return Err(Invalid::TooManyEntries(i, d.entries.len()));
            }
            for (j, e) in d.entries.iter().enumerate() {
                let n = e.key.len().max(e.value.len());
                if n > MAX_TEXT {
                    return Err(Invalid::TextTooLong(i, j, n));
                }
            }
            if d.is_negative_hits {
                return Err(Invalid::NegativeHits(i));
            }
            let hits = match &d.hits_addend {
                Some(h) => h.value,
                None => u64::from(req.hits_addend),
            }
            .max(1);
            if hits > MAX_HITS {
                return Err(Invalid::TooManyHits(i, hits));
            }
            descriptors.push(Descriptor {
                entries: &d.entries,
                hits: hits as u16,
                limit: override_limit(i, d)?,
                sent_limit: d.limit.as_ref().map(|o| (o.requests_per_unit, o.unit)),
                sent_hits: d.hits_addend.as_ref().map(|h| h.value),
            });
        }
        Ok(Call {
            domain: &req.domain,
            descriptors,
            hits_addend: req.hits_addend,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::google::protobuf::UInt64Value;
    use prost::Message;

    fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).into(),
                    value: (*v).into(),
                })
                .collect(),
            ..Default::default()
        }
    }

    fn req(domain: &str, descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
        RateLimitRequest {
            domain: domain.into(),
            descriptors,
            hits_addend: hits,
        }
    }

    #[test]
    fn hits_and_overrides() {
        let mut d2 = desc(&[("k", "v")]);
        d2.hits_addend = Some(UInt64Value { value: 7 });
        d2.limit = Some(RateLimitOverride {
            requests_per_unit: 9,
            unit: RateLimitUnit::Minute as i32,
        });
        let r = req("edge", vec![desc(&[("a", "b")]), d2], 0);
        let c = Call::check(&r).unwrap();
        assert_eq!(c.domain, "edge");
        assert_eq!(c.descriptors[0].hits, 1, "0 means 1");
        assert_eq!(c.descriptors[1].hits, 7, "the descriptor's own hits_addend");
        let l = c.descriptors[1].limit.unwrap();
        assert_eq!(
            (l.requests_per_unit, l.window, l.unit),
            (9, Duration::from_secs(60), Unit::Minute)
        );
        let r = req("edge", vec![desc(&[("a", "b")])], 5);
        assert_eq!(Call::check(&r).unwrap().descriptors[0].hits, 5);
    }

    #[test]
    fn refusals_say_why() {
        let one = || vec![desc(&[("a", "b")])];
        let check = |r: &RateLimitRequest| Call::check(r).map(|_| ()).unwrap_err();
        assert_eq!(check(&req("", one(), 1)), Invalid::EmptyDomain);
        assert_eq!(check(&req("e", vec![], 1)), Invalid::NoDescriptors);
        let many: Vec<_> = (0..10_000).map(|_| desc(&[("a", "b")])).collect();
        assert_eq!(
            check(&req("e", many, 1)),
            Invalid::TooManyDescriptors(10_000)
        );
        let big = "x".repeat(1 << 20);
        let e = check(&req(
            "e",
            vec![desc(&[("a", "b")]), desc(&[("k", &big)])],
            1,
        ));
        assert_eq!(e, Invalid::TextTooLong(1, 0, 1 << 20));
        assert!(e.to_string().contains("1048576 bytes"), "{e}");
        assert_eq!(
            check(&req("e", one(), 70_000)),
            Invalid::TooManyHits(0, 70_000)
        );
        let mut d = desc(&[("a", "b")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: RateLimitUnit::Month as i32,
        });
        let e = check(&req("e", vec![d.clone()], 1));
        assert!(e.to_string().contains("MONTH"), "{e}");
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 1,
            unit: 99,
        });
        assert_eq!(
            check(&req("e", vec![d], 1)),
            Invalid::BadOverrideUnit(0, 99)
        );
        let mut d = desc(&[("a", "b")]);
        d.is_negative_hits = true;
        assert_eq!(check(&req("e", vec![d], 1)), Invalid::NegativeHits(0));
    }

    proptest::proptest! {
        /// Any bytes: decoding fails or the check answers; nothing panics.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            if let Ok(r) = decode(&bytes) {
                let _ = Call::check(&r).map(|c| c.descriptors.len());
            }
        }

        /// Any request within the bounds is accepted, with its hits and entries.
        #[test]
        fn requests_within_bounds_pass(
            domain in "[a-z]{1,16}",
            descs in proptest::collection::vec(
                (proptest::collection::vec(("\\PC{0,8}", "\\PC{0,8}"), 0..4), 0u64..70_000),
                1..8,
            ),
            hits in 0u32..70_000,
        ) {
            let descriptors: Vec<_> = descs.iter().map(|(entries, h)| {
                let mut d = RateLimitDescriptor {
                    entries: entries.iter().map(|(k, v)| Entry { key: k.clone(), value: v.clone() }).collect(),
                    ..Default::default()
                };
                if *h > 0 { d.hits_addend = Some(UInt64Value { value: *h }); }
                d
            }).collect();
            let r = req(&domain, descriptors, hits);
            let bytes = r.encode_to_vec();
            let back = RateLimitRequest::decode(bytes.as_slice()).unwrap();
            let want_ok = descs.iter().all(|(_, h)| {
                let eff = if *h > 0 { *h } else { u64::from(hits) };
                eff.max(1) <= MAX_HITS
            });
            let got = Call::check(&back);
            proptest::prop_assert_eq!(got.is_ok(), want_ok);
            if let Ok(c) = got {
                proptest::prop_assert_eq!(c.descriptors.len(), descs.len());
                for (d, (entries, _)) in c.descriptors.iter().zip(&descs) {
                    proptest::prop_assert_eq!(d.entries.len(), entries.len());
                    proptest::prop_assert!(d.hits >= 1);
                }
            }
        }
    }
}
