//! Parsing of rlctl's argument formats (`NAME:WINDOW_MS:RATE[:TOKENS]`,
//! `NAME:TTL_MS:MAX:MIN[:THRESHOLD_MS]`, `ID@IP:PORT`, schedules) and loading of the API
//! key from `RATELIMITLY_API_KEY` or `--key-file`.
//!
//! Owns: turning argument text into plain values, and the key-loading rule. Must not touch:
//! sockets, DNS, the engine. Errors never carry the API key text (only which rule failed).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::Path;

use ratelimitly_engine::error::KeyError;
use ratelimitly_engine::key::ApiKey;
use ratelimitly_engine::machine::Endpoint;
use ratelimitly_engine::policy::Schedule;

/// Environment variable holding the API key.
pub const KEY_ENV: &str = "RATELIMITLY_API_KEY";

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
    /// `--endpoint` has no `@` between the server id and the address.
    MissingAt,
    /// `--endpoint` server id is not a decimal u64 > 0.
    BadServerId,
    /// `--endpoint` address is not `IP:PORT` / `[IPv6]:PORT`.
    BadAddress,
    /// `--schedule` kind is not fixed, linear or exp.
    UnknownSchedule,
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
            Self::MissingAt => {
                f.write_str("expected ID@IP:PORT (e.g. 7@127.0.0.1:4000 or 7@[::1]:4000)")
            }
            Self::BadServerId => f.write_str("server ID must be a decimal number > 0"),
            Self::BadAddress => f.write_str("address must be IP:PORT, IPv6 as [::1]:PORT"),
            Self::UnknownSchedule => {
                f.write_str("expected fixed:B, linear:INIT,STEP,MAX or exp:INIT,FACTOR,MAX")
            }
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

/// `ID@IP:PORT` or `ID@[IPv6]:PORT`.
pub fn parse_endpoint(text: &str) -> Result<Endpoint, SpecError> {
    let (id, addr) = text.split_once('@').ok_or(SpecError::MissingAt)?;
    let server_id = id
        .parse::<u64>()
        .ok()
        .filter(|v| *v != 0 && id.bytes().all(|b| b.is_ascii_digit()))
        .ok_or(SpecError::BadServerId)?;
    let addr = addr
        .parse::<SocketAddr>()
        .map_err(|_| SpecError::BadAddress)?;
    Ok(Endpoint { server_id, addr })
}

/// `fixed:B`, `linear:INIT,STEP,MAX`, `exp:INIT,FACTOR,MAX` (the domain of the values is
/// checked by the policy builder, which names the rule that fails).
pub fn parse_schedule(text: &str) -> Result<Schedule, SpecError> {
    let (kind, rest) = text.split_once(':').ok_or(SpecError::UnknownSchedule)?;
    let nums = rest.split(',').map(parse_u32).collect::<Option<Vec<_>>>();
    let bad = SpecError::BadNumber {
        field: "schedule value",
    };
    match (kind, nums.as_deref()) {
        ("fixed", Some(&[b])) => Ok(Schedule::Fixed(b)),
        ("linear", Some(&[initial, step, max])) => Ok(Schedule::Linear { initial, step, max }),
        ("exp" | "exponential", Some(&[initial, factor, max])) => Ok(Schedule::Exponential {
            initial,
            factor,
            max,
        }),
        ("fixed" | "linear" | "exp" | "exponential", _) => Err(bad),
        _ => Err(SpecError::UnknownSchedule),
    }
}

/// Why no API key could be loaded. Never carries the key text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyLoadError {
    /// Neither `--key-file` nor `RATELIMITLY_API_KEY` is set.
    Missing,
    /// The `--key-file` could not be read.
    FileRead(io::ErrorKind),
    /// The key text is invalid; the variant names the rule.
    Invalid(KeyError),
}

impl fmt::Display for KeyLoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Missing => write!(f, "no API key: set {KEY_ENV} or pass --key-file PATH"),
            Self::FileRead(kind) => write!(f, "cannot read the key file: {kind}"),
            Self::Invalid(e) => write!(f, "invalid API key: {e}"),
        }
    }
}

impl std::error::Error for KeyLoadError {}

/// Loads the key: `--key-file` when given (surrounding whitespace ignored), else the
/// environment variable.
pub fn load_key(key_file: Option<&Path>) -> Result<ApiKey, KeyLoadError> {
    let text = match key_file {
        Some(path) => {
            std::fs::read_to_string(path).map_err(|e| KeyLoadError::FileRead(e.kind()))?
        }
        None => std::env::var(KEY_ENV).map_err(|_| KeyLoadError::Missing)?,
    };
    text.trim().parse::<ApiKey>().map_err(KeyLoadError::Invalid)
}

/// Lowercase hex of 16 id bytes.
pub fn hex16(id: &[u8; 16]) -> String {
    use fmt::Write;
    let mut s = String::with_capacity(32);
    for b in id {
        let _ = write!(s, "{b:02x}");
    }
    s
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

    #[test]
    fn endpoints() {
        let e = parse_endpoint("7@127.0.0.1:4000").unwrap();
        assert_eq!(
            (e.server_id, e.addr),
            (7, "127.0.0.1:4000".parse().unwrap())
        );
        let e = parse_endpoint("9@[::1]:5").unwrap();
        assert_eq!(e.addr, "[::1]:5".parse().unwrap());
        assert_eq!(parse_endpoint("0@127.0.0.1:1"), Err(SpecError::BadServerId));
        assert_eq!(
            parse_endpoint("+1@127.0.0.1:1"),
            Err(SpecError::BadServerId)
        );
        assert_eq!(parse_endpoint("127.0.0.1:1"), Err(SpecError::MissingAt));
        assert_eq!(parse_endpoint("1@::1:5"), Err(SpecError::BadAddress));
    }

    #[test]
    fn schedules() {
        assert_eq!(parse_schedule("fixed:2"), Ok(Schedule::Fixed(2)));
        assert_eq!(
            parse_schedule("linear:1,1,3"),
            Ok(Schedule::Linear {
                initial: 1,
                step: 1,
                max: 3
            })
        );
        assert_eq!(
            parse_schedule("exp:1,2,4"),
            Ok(Schedule::Exponential {
                initial: 1,
                factor: 2,
                max: 4
            })
        );
        assert!(parse_schedule("fixed:1,2").is_err());
        assert_eq!(parse_schedule("poisson:1"), Err(SpecError::UnknownSchedule));
    }

    #[test]
    fn hex() {
        assert_eq!(hex16(&[0xab; 16]), "ab".repeat(16));
    }
}
