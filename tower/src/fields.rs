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

use std::time::Duration;

use http::HeaderValue;
use smallvec::SmallVec;

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

/// A policy's name as the fields write it: `base`, or `base-index` when an earlier
/// policy of the same request has the same base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Name<'a> {
    pub base: &'a str,
    pub index: Option<usize>,
}

impl std::fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.index {
            Some(i) => write!(f, "{}-{i}", self.base),
            None => f.write_str(self.base),
        }
    }
}

/// One policy, borrowed: what a [`PolicyState`] owns, or what the service reads from a
/// request's consumption and verdict without building one. Both fields are written from
/// these, so the layer's grant path formats them with no intermediate strings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Policy<'a> {
    pub name: Name<'a>,
    pub quota: u32,
    pub window: Duration,
    pub remaining: Option<u32>,
    pub reset: Option<Duration>,
}

impl<'a> From<&'a PolicyState> for Policy<'a> {
    fn from(p: &'a PolicyState) -> Self {
        Policy {
            name: Name {
                base: &p.name,
                index: None,
            },
            quota: p.quota,
            window: p.window,
            remaining: p.remaining,
            reset: p.reset,
        }
    }
}

/// Whole seconds, rounded up, at least 1 (the `Retry-After`, `w` and `t` rule).
pub fn whole_secs_up(d: Duration) -> u64 {
    (d.as_nanos().div_ceil(1_000_000_000).max(1)).min(u128::from(u64::MAX)) as u64
}

/// A field value being written: on the stack up to 256 bytes (a request's few
/// policies), copied once into the `HeaderValue`.
type Value = SmallVec<[u8; 256]>;

fn num(out: &mut Value, n: impl itoa::Integer) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `name` as a structured-field String: printable ASCII kept (`"` and `\` escaped),
/// anything else replaced with `_`, at most 64 characters; an empty base becomes
/// `"default"`.
fn sf_string(out: &mut Value, name: Name<'_>) {
    out.push(b'"');
    let mut digits = itoa::Buffer::new();
    let suffix = name.index.map_or("", |i| digits.format(i));
    let plain = |b: &u8| (b' '..=b'~').contains(b) && *b != b'"' && *b != b'\\';
    if name.base.is_empty() && name.index.is_none() {
        out.extend_from_slice(b"default");
    } else if name.base.len() + suffix.len() < 64 && name.base.as_bytes().iter().all(plain) {
        // the usual name (a bucket prefix): copied whole
        out.extend_from_slice(name.base.as_bytes());
        if name.index.is_some() {
            out.push(b'-');
            out.extend_from_slice(suffix.as_bytes());
        }
    } else {
        let dash = if name.index.is_some() { "-" } else { "" };
        for c in name
            .base
            .chars()
            .chain(dash.chars())
            .chain(suffix.chars())
            .take(64)
        {
            match c {
                '"' | '\\' => {
                    out.push(b'\\');
                    out.push(c as u8);
                }
                ' '..='~' => out.push(c as u8),
                _ => out.push(b'_'),
            }
        }
    }
    out.push(b'"');
}

fn value(v: &Value) -> Option<HeaderValue> {
    if v.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(v).ok()
}

/// The `RateLimit-Policy` text of `policies`: `"NAME";q=Q;w=W, ...` (empty for none).
fn policy_text<'a>(policies: impl Iterator<Item = Policy<'a>>) -> Value {
    let mut s = Value::new();
    for p in policies {
        if !s.is_empty() {
            s.extend_from_slice(b", ");
        }
        sf_string(&mut s, p.name);
        s.extend_from_slice(b";q=");
        num(&mut s, p.quota);
        s.extend_from_slice(b";w=");
        num(&mut s, whole_secs_up(p.window));
    }
    s
}

/// The `RateLimit-Policy` value of `policies`. `None` for none.
fn policy_of<'a>(policies: impl Iterator<Item = Policy<'a>>) -> Option<HeaderValue> {
    value(&policy_text(policies))
}

/// The last `RateLimit-Policy` value a service wrote, reused while a request's policies
/// format to the same text (the usual case: every request of a [`crate::Keyed`] mapping
/// has the same policy), so the value is checked and allocated once, not per request.
#[derive(Debug, Default)]
pub(crate) struct PolicyCache(Option<HeaderValue>);

impl PolicyCache {
    /// The `RateLimit-Policy` value of `policies`: the cached one when the text is the
    /// same. `None` for none.
    pub(crate) fn value<'a>(
        &mut self,
        policies: impl Iterator<Item = Policy<'a>>,
    ) -> Option<HeaderValue> {
        let text = policy_text(policies);
        if let Some(v) = &self.0
            && v.as_bytes() == &text[..]
        {
            return Some(v.clone());
        }
        let v = value(&text)?;
        self.0 = Some(v.clone());
        Some(v)
    }
}

/// The `RateLimit` value of `policies`: `"NAME";r=R;t=T, ...` for those whose remaining
/// quota is known. `None` when none is.
fn ratelimit_of<'a>(policies: impl Iterator<Item = Policy<'a>>) -> Option<HeaderValue> {
    let mut s = Value::new();
    for p in policies {
        let Some(r) = p.remaining else { continue };
        if !s.is_empty() {
            s.extend_from_slice(b", ");
        }
        sf_string(&mut s, p.name);
        s.extend_from_slice(b";r=");
        num(&mut s, r);
        if let Some(t) = p.reset {
            s.extend_from_slice(b";t=");
            num(&mut s, whole_secs_up(t));
        }
    }
    value(&s)
}

/// The `RateLimit-Policy` value: `"NAME";q=Q;w=W, ...`. `None` for no policies.
pub fn policy_value(policies: &[PolicyState]) -> Option<HeaderValue> {
    policy_of(policies.iter().map(Policy::from))
}

/// The `RateLimit` value: `"NAME";r=R;t=T, ...` for the policies whose remaining quota
/// is known. `None` when none is.
pub fn ratelimit_value(policies: &[PolicyState]) -> Option<HeaderValue> {
    ratelimit_of(policies.iter().map(Policy::from))
}

/// Sets both fields on `headers` unless already there.
pub fn insert(headers: &mut http::HeaderMap, policies: &[PolicyState]) {
    let policy = policy_of(policies.iter().map(Policy::from));
    insert_each(headers, policy, policies.iter().map(Policy::from));
}

/// [`insert`] from borrowed policies whose `RateLimit-Policy` value is `policy`.
pub(crate) fn insert_each<'a>(
    headers: &mut http::HeaderMap,
    policy: Option<HeaderValue>,
    policies: impl Iterator<Item = Policy<'a>>,
) {
    use http::header::Entry;
    if let Entry::Vacant(e) = headers.entry(RATELIMIT_POLICY)
        && let Some(v) = policy
    {
        e.insert(v);
    }
    if let Entry::Vacant(e) = headers.entry(RATELIMIT)
        && let Some(v) = ratelimit_of(policies)
    {
        e.insert(v);
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

    #[test]
    fn the_policy_cache_follows_the_text() {
        let p = |base, quota| Policy {
            name: Name { base, index: None },
            quota,
            window: Duration::from_secs(1),
            remaining: None,
            reset: None,
        };
        let mut cache = PolicyCache::default();
        let a = cache.value([p("http", 5)].into_iter()).unwrap();
        assert_eq!(a, "\"http\";q=5;w=1");
        assert_eq!(cache.value([p("http", 5)].into_iter()).unwrap(), a);
        let b = cache.value([p("http", 6)].into_iter()).unwrap();
        assert_eq!(b, "\"http\";q=6;w=1");
        assert_eq!(
            cache.value([p("api", 6)].into_iter()).unwrap(),
            "\"api\";q=6;w=1"
        );
        assert!(cache.value(std::iter::empty()).is_none());
    }

    /// The formatting as first written (one `String` per value, `write!` for the
    /// numbers): the oracle of the stack-buffer writer.
    fn oracle(policies: &[(String, Option<usize>, u32, u64)]) -> String {
        let mut s = String::new();
        for (name, index, quota, window) in policies {
            let full = match index {
                Some(i) => format!("{name}-{i}"),
                None => name.clone(),
            };
            if !s.is_empty() {
                s.push_str(", ");
            }
            s.push('"');
            if full.is_empty() {
                s.push_str("default");
            }
            for c in full.chars().take(64) {
                match c {
                    '"' | '\\' => {
                        s.push('\\');
                        s.push(c);
                    }
                    ' '..='~' => s.push(c),
                    _ => s.push('_'),
                }
            }
            s.push('"');
            s.push_str(&format!(";q={quota};w={}", window.max(&1)));
        }
        s
    }

    proptest::proptest! {
        #[test]
        fn policy_field_matches_the_oracle(
            policies in proptest::collection::vec(
                ("\\PC{0,80}", proptest::option::of(0usize..1000), proptest::num::u32::ANY, 1u64..100_000),
                1..5,
            )
        ) {
            let views = policies.iter().map(|(name, index, quota, window)| Policy {
                name: Name { base: name, index: *index },
                quota: *quota,
                window: Duration::from_secs(*window),
                remaining: None,
                reset: None,
            });
            let got = policy_of(views).expect("a value for any names");
            proptest::prop_assert_eq!(got.to_str().unwrap(), oracle(&policies));
        }
    }
}
