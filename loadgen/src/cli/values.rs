//! Value parsers of the command-line options: range checks (out-of-range values are
//! rejected with the usage text, never clamped), `on`/`off`, core lists, and the serde
//! helpers of the JSON `parameters`.
//!
//! Owns the textual forms of option values. Must not touch sockets, responders or clients.

use clap::builder::RangedU64ValueParser;
use serde::Serializer;

pub(super) fn as_text<S: Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

pub(super) fn negated<S: Serializer>(v: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bool(!*v)
}

/// `on` or `off`.
pub(super) fn on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("{text:?} is neither on nor off")),
    }
}

/// An integer option within `min..=max` (of the field's type `T`).
pub(super) fn ranged<T>(min: u64, max: u64) -> RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: std::error::Error + Send + Sync + 'static,
{
    RangedU64ValueParser::<T>::new().range(min..=max)
}

/// Longest measured duration (s): a day.
const MAX_DURATION_S: f64 = 86_400.0;
/// Longest warm-up (s): an hour.
const MAX_WARMUP_S: f64 = 3_600.0;
/// Highest open-loop rate (requests/s).
const MAX_RATE: f64 = 10_000_000.0;

pub(super) fn number(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(format!("{text:?} is not a finite number"))
    }
}

/// A probability in [0, 1].
pub(super) fn probability(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is not a probability in [0, 1]"))
    }
}

/// A warm-up: seconds in 0..=3600.
pub(super) fn warmup_seconds(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if (0.0..=MAX_WARMUP_S).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} s is not in 0..={MAX_WARMUP_S}"))
    }
}

/// A measured duration: seconds > 0, at most 86400.
pub(super) fn duration_seconds(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if v > 0.0 && v <= MAX_DURATION_S {
        Ok(v)
    } else {
        Err(format!("{v} s must be > 0 and at most {MAX_DURATION_S}"))
    }
}

/// Requests/s > 0, at most 10,000,000.
pub(super) fn positive_rate(text: &str) -> Result<f64, String> {
    let v = number(text)?;
    if v > 0.0 && v <= MAX_RATE {
        Ok(v)
    } else {
        Err(format!("{v} requests/s must be > 0 and at most {MAX_RATE}"))
    }
}

/// A list of CPU cores (`0,2-3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

pub(super) fn parse_cores(s: &str) -> Result<CoreList, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.parse().map_err(|e| format!("{a:?}: {e}"))?;
            let b: usize = b.parse().map_err(|e| format!("{b:?}: {e}"))?;
            if b < a || b - a > 1024 {
                return Err(format!("bad core range {part}"));
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().map_err(|e| format!("{part:?}: {e}"))?);
        }
    }
    if out.is_empty() {
        return Err("empty core list".into());
    }
    Ok(CoreList(out))
}
