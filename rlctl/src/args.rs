//! Parsing of rlctl's bucket and tracker argument formats (`NAME:WINDOW_MS:RATE[:TOKENS]`,
//! `NAME:TTL_MS:MAX:MIN[:THRESHOLD_MS]`).
//!
//! Owns: turning that argument text into plain values. Must not touch: sockets, DNS, the
//! engine, keys. Endpoints (`ID@IP:PORT`) and schedules are parsed by the engine's
//! `FromStr` implementations, the key by `ratelimitly_engine::key_source`.

use std::fmt;
use std::time::Duration;

use ratelimitly_engine::proto::error::ConfigError;
use ratelimitly_engine::proto::ids::{LatencyTracker, bucket_id, tracker_id};

/// Why an argument could not be parsed. Shown by clap as the reason of a usage error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecError {
    /// Fewer or more `:`-separated fields than the format has.
    FieldCount { expected: &'static str },
    /// The name part is empty.
    EmptyName,
    /// A numeric field is not a decimal u32 (`field` names it).
    BadNumber { field: &'static str },
    /// `--consume` tokens outside 1..=65535.
    TokensOutOfRange,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::FieldCount { expected } => write!(f, "expected {expected}"),
            Self::EmptyName => f.write_str("the name must not be empty"),
            Self::BadNumber { field } => {
                write!(f, "{field} must be a decimal number 0..=4294967295")
            }
            Self::TokensOutOfRange => f.write_str("TOKENS must be 1..=65535"),
        }
    }
}

impl std::error::Error for SpecError {}

/// `--resource NAME:WINDOW_MS:RATE` / `--consume NAME:WINDOW_MS:RATE[:TOKENS]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceArg {
    pub name: String,
    pub window_ms: u32,
    pub rate_limit: u32,
    /// 1 when not given.
    pub tokens: u16,
}

/// `--tracker NAME:TTL_MS:MAX:MIN` / `--guard NAME:TTL_MS:MAX:MIN:THRESHOLD_MS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackerArg {
    pub name: String,
    pub ttl_ms: u32,
    pub max_samples: u32,
    pub min_samples: u32,
    /// Only for `--guard`; 0 otherwise.
    pub threshold_ms: u32,
}

impl ResourceArg {
    /// The bucket id of NAME:WINDOW_MS:RATE.
    pub fn bucket_id(&self) -> [u8; 16] {
        bucket_id(self.name.as_bytes(), self.window_ms, self.rate_limit)
    }
}

impl TrackerArg {
    /// The tracker id of NAME:TTL_MS:MAX:MIN.
    pub fn tracker_id(&self) -> [u8; 16] {
        tracker_id(
            self.name.as_bytes(),
            self.ttl_ms,
            self.max_samples,
            self.min_samples,
        )
    }

    /// The tracker definition, checked (samples > 0, name not empty).
    pub fn tracker(&self) -> Result<LatencyTracker, ConfigError> {
        LatencyTracker::new(
            self.name.clone(),
            Duration::from_millis(u64::from(self.ttl_ms)),
            self.max_samples,
            self.min_samples,
        )
    }
}

/// Splits `text` into a name and exactly `n` trailing numeric fields. The name is
/// everything before them, so it may itself contain `:`.
fn split_fields<'a>(
    text: &'a str,
    n: usize,
    names: &[&'static str],
    expected: &'static str,
) -> Result<(&'a str, Vec<u32>), SpecError> {
    let mut parts = text.rsplitn(n + 1, ':').collect::<Vec<_>>();
    if parts.len() != n + 1 {
        return Err(SpecError::FieldCount { expected });
    }
    let name = parts.pop().unwrap_or_default();
    if name.is_empty() {
        return Err(SpecError::EmptyName);
    }
    parts.reverse();
    let mut nums = Vec::with_capacity(n);
    for (i, p) in parts.iter().enumerate() {
        nums.push(parse_u32(p).ok_or(SpecError::BadNumber { field: names[i] })?);
    }
    Ok((name, nums))
}

fn parse_u32(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `NAME:WINDOW_MS:RATE` (no tokens field).
pub fn parse_resource(text: &str) -> Result<ResourceArg, SpecError> {
    let (name, n) = split_fields(text, 2, &["WINDOW_MS", "RATE"], "NAME:WINDOW_MS:RATE")?;
    Ok(ResourceArg {
        name: name.to_owned(),
        window_ms: n[0],
        rate_limit: n[1],
        tokens: 1,
    })
}

/// `NAME:WINDOW_MS:RATE[:TOKENS]`. With four or more fields whose last three are numbers,
/// the last one is TOKENS (a name containing `:` therefore needs an explicit `:TOKENS`).
pub fn parse_consume(text: &str) -> Result<ResourceArg, SpecError> {
    const EXPECTED: &str = "NAME:WINDOW_MS:RATE[:TOKENS]";
    let with_tokens = split_fields(text, 3, &["WINDOW_MS", "RATE", "TOKENS"], EXPECTED);
    match with_tokens {
        Ok((name, n)) => {
            let tokens = u16::try_from(n[2])
                .ok()
                .filter(|t| *t >= 1)
                .ok_or(SpecError::TokensOutOfRange)?;
            Ok(ResourceArg {
                name: name.to_owned(),
                window_ms: n[0],
                rate_limit: n[1],
                tokens,
            })
        }
        Err(_) => {
            split_fields(text, 2, &["WINDOW_MS", "RATE"], EXPECTED).map(|(name, n)| ResourceArg {
                name: name.to_owned(),
                window_ms: n[0],
                rate_limit: n[1],
                tokens: 1,
            })
        }
    }
}

/// `NAME:TTL_MS:MAX:MIN`.
pub fn parse_tracker(text: &str) -> Result<TrackerArg, SpecError> {
    let (name, n) = split_fields(text, 3, &["TTL_MS", "MAX", "MIN"], "NAME:TTL_MS:MAX:MIN")?;
    Ok(TrackerArg {
        name: name.to_owned(),
        ttl_ms: n[0],
        max_samples: n[1],
        min_samples: n[2],
        threshold_ms: 0,
    })
}

/// `NAME:TTL_MS:MAX:MIN:THRESHOLD_MS`.
pub fn parse_guard(text: &str) -> Result<TrackerArg, SpecError> {
    let (name, n) = split_fields(
        text,
        4,
        &["TTL_MS", "MAX", "MIN", "THRESHOLD_MS"],
        "NAME:TTL_MS:MAX:MIN:THRESHOLD_MS",
    )?;
    Ok(TrackerArg {
        name: name.to_owned(),
        ttl_ms: n[0],
        max_samples: n[1],
        min_samples: n[2],
        threshold_ms: n[3],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_and_consume() {
        let r = parse_resource("checkout:1000:100").unwrap();
        assert_eq!(
            (r.name.as_str(), r.window_ms, r.rate_limit, r.tokens),
            ("checkout", 1000, 100, 1)
        );
        assert_eq!(parse_resource("a:b:1000:100").unwrap().name, "a:b");
        assert_eq!(parse_resource(":1:2"), Err(SpecError::EmptyName));
        assert!(parse_resource("x:1").is_err());
        assert!(parse_resource("x:-1:2").is_err());
        let c = parse_consume("x:1000:10:3").unwrap();
        assert_eq!((c.window_ms, c.rate_limit, c.tokens), (1000, 10, 3));
        assert_eq!(parse_consume("x:1000:10").unwrap().tokens, 1);
        assert_eq!(
            parse_consume("x:1000:10:0"),
            Err(SpecError::TokensOutOfRange)
        );
        assert_eq!(
            parse_consume("x:1000:10:65536"),
            Err(SpecError::TokensOutOfRange)
        );
    }

    #[test]
    fn trackers_guards() {
        let t = parse_tracker("inv:10000:100:5").unwrap();
        assert_eq!((t.ttl_ms, t.max_samples, t.min_samples), (10000, 100, 5));
        let g = parse_guard("inv:10000:100:5:250").unwrap();
        assert_eq!(g.threshold_ms, 250);
        assert!(parse_guard("inv:10000:100:5").is_err());
    }
}
