//! The IETF RateLimit header fields (draft-ietf-httpapi-ratelimit-headers, the
//! structured-field syntax of drafts 08 and later):
//!
//! ```text
//! RateLimit-Policy: "http";q=5;w=10
//! RateLimit: "http";r=0;t=10
//! ```
//!
//! `RateLimit-Policy` lists each quota policy (a String naming it) with its quota `q`
//! and window `w` in seconds; `RateLimit` lists, for the same names, the remaining
//! quota `r` and `t`, the seconds after which the quota is available again. Several
//! resources in one request give several list members, in the request's order.
//!
//! Owns: [`PolicyState`] and the formatting of both fields. Must not touch: the engine,
//! requests. Reused by `rl-proxy`.

use std::fmt::Write as _;
use std::time::Duration;

use http::HeaderValue;

/// `RateLimit-Policy`.
pub const RATELIMIT_POLICY: http::header::HeaderName =
    http::header::HeaderName::from_static("ratelimit-policy");
/// `RateLimit`.
pub const RATELIMIT: http::header::HeaderName = http::header::HeaderName::from_static("ratelimit");

/// One resource's policy and, when the service answered, its state at decision time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyState {
    /// The policy's name (any text; sanitised when formatted).
    pub name: String,
    /// Tokens per window.
    pub quota: u32,
    /// The window.
    pub window: Duration,
    /// Tokens left (the limit minus the service's `actual_rate`, at least 0); `None`
    /// when the backend gave no per-resource result.
    pub remaining: Option<u32>,
    /// When the quota is available again; `None` when unknown.
    pub reset: Option<Duration>,
}

/// Whole seconds, rounded up, at least 1 (the `Retry-After`, `w` and `t` rule).
pub fn whole_secs_up(d: Duration) -> u64 {
    (d.as_nanos().div_ceil(1_000_000_000).max(1)).min(u128::from(u64::MAX)) as u64
}

/// `name` as a structured-field String: printable ASCII kept (`"` and `\` escaped),
/// anything else replaced with `_`; empty becomes `"default"`.
fn sf_string(out: &mut String, name: &str) {
    out.push('"');
    if name.is_empty() {
        out.push_str("default");
    }
    for c in name.chars().take(64) {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out.push('"');
}

/// The `RateLimit-Policy` value: `"NAME";q=Q;w=W, ...`. `None` for no policies.
pub fn policy_value(policies: &[PolicyState]) -> Option<HeaderValue> {
    if policies.is_empty() {
        return None;
    }
    let mut s = String::new();
    for (i, p) in policies.iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        sf_string(&mut s, &p.name);
        let _ = write!(s, ";q={};w={}", p.quota, whole_secs_up(p.window));
    }
    HeaderValue::from_str(&s).ok()
}

/// The `RateLimit` value: `"NAME";r=R;t=T, ...` for the policies whose remaining quota
/// is known. `None` when none is.
pub fn ratelimit_value(policies: &[PolicyState]) -> Option<HeaderValue> {
    let mut s = String::new();
    for p in policies {
        let Some(r) = p.remaining else { continue };
        if !s.is_empty() {
            s.push_str(", ");
        }
        sf_string(&mut s, &p.name);
        let _ = write!(s, ";r={r}");
        if let Some(t) = p.reset {
            let _ = write!(s, ";t={}", whole_secs_up(t));
        }
    }
    if s.is_empty() {
        return None;
    }
    HeaderValue::from_str(&s).ok()
}

/// Sets both fields on `headers` unless already there.
pub fn insert(headers: &mut http::HeaderMap, policies: &[PolicyState]) {
    if !headers.contains_key(RATELIMIT_POLICY)
        && let Some(v) = policy_value(policies)
    {
        headers.insert(RATELIMIT_POLICY, v);
    }
    if !headers.contains_key(RATELIMIT)
        && let Some(v) = ratelimit_value(policies)
    {
        headers.insert(RATELIMIT, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let p = |name: &str, r| PolicyState {
            name: name.into(),
            quota: 5,
            window: Duration::from_millis(9500),
            remaining: r,
            reset: Some(Duration::from_secs(10)),
        };
        let ps = [p("http", Some(0)), p("a\"b\u{e9}", Some(3)), p("x", None)];
        assert_eq!(
            policy_value(&ps).unwrap(),
            "\"http\";q=5;w=10, \"a\\\"b_\";q=5;w=10, \"x\";q=5;w=10"
        );
        assert_eq!(
            ratelimit_value(&ps).unwrap(),
            "\"http\";r=0;t=10, \"a\\\"b_\";r=3;t=10"
        );
        assert!(ratelimit_value(&ps[2..]).is_none());
        assert!(policy_value(&[]).is_none());
        assert_eq!(whole_secs_up(Duration::ZERO), 1);
        assert_eq!(whole_secs_up(Duration::from_millis(2001)), 3);
    }
}
