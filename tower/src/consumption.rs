//! What one HTTP request consumes: resources with quantities, latency guards and a
//! metrics label ([`Consumption`]), the user's mapping from a request to it
//! ([`Classify`]), and the ready mapping keyed by client IP, a header or the path
//! ([`Keyed`] with [`Limit`] and [`KeyBy`]).
//!
//! Owns: the request → consumption rules and the `COUNT/WINDOW` limit syntax.
//! Must not touch: the engine, the network, responses (the service module decides what
//! happens with a consumption).

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use http::header::HeaderName;
use ratelimitly_engine::{LatencyTracker, Resource};

/// What one request consumes; an empty consumption is granted locally without asking
/// the service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consumption {
    resources: Vec<(Resource, u32)>,
    guards: Vec<(LatencyTracker, Duration)>,
    label: Cow<'static, str>,
}

impl Consumption {
    /// Nothing consumed, no guard, no label.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tokens` (1..=65535) of `resource`.
    pub fn consume(mut self, resource: Resource, tokens: u32) -> Self {
        self.resources.push((resource, tokens));
        self
    }

    /// Adds a guard: the request is admitted only while `tracker`'s current latency is
    /// below `threshold`. After a forwarded request the layer reports the inner service's
    /// observed latency to every guarded tracker.
    pub fn guard(mut self, tracker: LatencyTracker, threshold: Duration) -> Self {
        self.guards.push((tracker, threshold));
        self
    }

    /// A metrics label (groups the service's own metrics; not a key).
    pub fn label(mut self, label: impl Into<Cow<'static, str>>) -> Self {
        self.label = label.into();
        self
    }

    /// The resources and their token counts.
    pub fn resources(&self) -> &[(Resource, u32)] {
        &self.resources
    }

    /// The guards and their thresholds.
    pub fn guards(&self) -> &[(LatencyTracker, Duration)] {
        &self.guards
    }

    /// The metrics label ("" = none).
    pub fn metrics_label(&self) -> &str {
        &self.label
    }

    /// No resource and no guard.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.guards.is_empty()
    }
}

/// Maps a request to what it consumes. Implemented for every
/// `Fn(&http::Request<B>) -> Consumption + Send + Sync + 'static`.
pub trait Classify<B>: Send + Sync + 'static {
    /// What `request` consumes.
    fn classify(&self, request: &http::Request<B>) -> Consumption;
}

impl<B, F> Classify<B> for F
where
    F: Fn(&http::Request<B>) -> Consumption + Send + Sync + 'static,
{
    fn classify(&self, request: &http::Request<B>) -> Consumption {
        self(request)
    }
}

/// The peer address of the connection a request came on. A server inserts it into the
/// request's extensions (the `rl-proxy` binary does); [`KeyBy::ClientIp`] reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub SocketAddr);

/// `COUNT` tokens per `WINDOW`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    count: u32,
    window: Duration,
}

/// Why a `COUNT/WINDOW` limit was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LimitError {
    /// Not of the form `COUNT/WINDOW` (e.g. `10/60s`, `1000/1s`, `5/250ms`, `100/1m`).
    Syntax,
    /// COUNT is 0 or does not fit a u32.
    BadCount,
    /// WINDOW is 0, not whole milliseconds, or above u32::MAX milliseconds.
    BadWindow,
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LimitError::Syntax => "limit must look like COUNT/WINDOW, e.g. 100/1s or 10/60s",
            LimitError::BadCount => "limit count must be 1..=4294967295",
            LimitError::BadWindow => "limit window must be whole milliseconds, 1 ms or more",
        })
    }
}

impl std::error::Error for LimitError {}

impl Limit {
    /// `count` tokens per `window` (count >= 1, window whole milliseconds >= 1 ms).
    pub fn new(count: u32, window: Duration) -> Result<Self, LimitError> {
        if count == 0 {
            return Err(LimitError::BadCount);
        }
        if window < Duration::from_millis(1)
            || !window.subsec_nanos().is_multiple_of(1_000_000)
            || u32::try_from(window.as_millis()).is_err()
        {
            return Err(LimitError::BadWindow);
        }
        Ok(Limit { count, window })
    }

    /// Tokens per window.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The window.
    pub fn window(&self) -> Duration {
        self.window
    }
}

impl FromStr for Limit {
    type Err = LimitError;

    /// `COUNT/WINDOW` with WINDOW a number and a unit `ms`, `s`, `m` or `h`.
    fn from_str(s: &str) -> Result<Self, LimitError> {
        let (count, window) = s.trim().split_once('/').ok_or(LimitError::Syntax)?;
        let count: u32 = count.parse().map_err(|_| LimitError::BadCount)?;
        let split = window
            .find(|c: char| !c.is_ascii_digit())
            .ok_or(LimitError::Syntax)?;
        let (num, unit) = window.split_at(split);
        let num: u64 = num.parse().map_err(|_| LimitError::Syntax)?;
        let ms_per = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(LimitError::Syntax),
        };
        let ms = num.checked_mul(ms_per).ok_or(LimitError::BadWindow)?;
        Limit::new(count, Duration::from_millis(ms))
    }
}

/// What the ready mapping keys its buckets by.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyBy {
    /// The client's IP address, from the [`ClientAddr`] extension (requests without it
    /// share the bucket `unknown`).
    ClientIp,
    /// The value of a header (requests without it share one bucket).
    Header(HeaderName),
    /// The request path (without the query).
    Path,
}

impl FromStr for KeyBy {
    type Err = String;

    /// `ip`, `path` or `header:NAME`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ip" => Ok(KeyBy::ClientIp),
            "path" => Ok(KeyBy::Path),
            _ => match s.strip_prefix("header:") {
                Some(name) => HeaderName::from_bytes(name.as_bytes())
                    .map(KeyBy::Header)
                    .map_err(|_| format!("invalid header name {name:?}")),
                None => Err("key must be ip, path or header:NAME".to_owned()),
            },
        }
    }
}

/// The ready mapping: one token of a bucket `PREFIX:KEY` limited to [`Limit`], where KEY
/// comes from [`KeyBy`], plus optional guards applied to every request.
#[derive(Clone, Debug)]
pub struct Keyed {
    limit: Limit,
    key_by: KeyBy,
    prefix: Cow<'static, str>,
    guards: Vec<(LatencyTracker, Duration)>,
    label: Cow<'static, str>,
}

/// The ready mapping keyed by `key_by` with `limit` (bucket names `http:KEY`).
pub fn keyed(limit: Limit, key_by: KeyBy) -> Keyed {
    Keyed {
        limit,
        key_by,
        prefix: Cow::Borrowed("http"),
        guards: Vec::new(),
        label: Cow::Borrowed(""),
    }
}

/// Longest key taken from a request (longer values are cut, on a char boundary).
const MAX_KEY: usize = 200;

impl Keyed {
    /// Bucket names become `PREFIX:KEY` (default prefix `http`).
    pub fn prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Adds a guard to every request.
    pub fn guard(mut self, tracker: LatencyTracker, threshold: Duration) -> Self {
        self.guards.push((tracker, threshold));
        self
    }

    /// A metrics label for every request.
    pub fn label(mut self, label: impl Into<Cow<'static, str>>) -> Self {
        self.label = label.into();
        self
    }

    /// The key of `request` (bounded length).
    pub fn key_of<B>(&self, request: &http::Request<B>) -> String {
        let raw: Cow<'_, str> = match &self.key_by {
            KeyBy::ClientIp => match request.extensions().get::<ClientAddr>() {
                Some(a) => Cow::Owned(a.0.ip().to_string()),
                None => Cow::Borrowed("unknown"),
            },
            KeyBy::Header(name) => request
                .headers()
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()))
                .unwrap_or(Cow::Borrowed("")),
            KeyBy::Path => Cow::Borrowed(request.uri().path()),
        };
        let mut end = raw.len().min(MAX_KEY);
        while !raw.is_char_boundary(end) {
            end -= 1;
        }
        raw[..end].to_owned()
    }
}

impl<B> Classify<B> for Keyed {
    fn classify(&self, request: &http::Request<B>) -> Consumption {
        let name = format!("{}:{}", self.prefix, self.key_of(request));
        let mut c = Consumption::new().label(self.label.clone());
        // A name or limit the engine refuses shows up as an invalid request (500), not
        // as a panic: Resource::new only fails on limits Limit::new already refused.
        if let Ok(r) = Resource::new(name, self.limit.window, self.limit.count) {
            c = c.consume(r, 1);
        }
        for (t, th) in &self.guards {
            c = c.guard(t.clone(), *th);
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_syntax() {
        let l: Limit = "10/60s".parse().unwrap();
        assert_eq!((l.count(), l.window()), (10, Duration::from_secs(60)));
        let l: Limit = "1000/1s".parse().unwrap();
        assert_eq!((l.count(), l.window()), (1000, Duration::from_secs(1)));
        let l: Limit = "5/250ms".parse().unwrap();
        assert_eq!(l.window(), Duration::from_millis(250));
        assert_eq!(
            "3/2m".parse::<Limit>().unwrap().window(),
            Duration::from_secs(120)
        );
        for bad in [
            "", "10", "10/", "/1s", "0/1s", "10/0s", "10/1", "10/1x", "-1/1s", "a/1s",
        ] {
            assert!(bad.parse::<Limit>().is_err(), "{bad}");
        }
    }

    #[test]
    fn keys() {
        let k = keyed(Limit::new(1, Duration::from_secs(1)).unwrap(), KeyBy::Path);
        let req = http::Request::get("/a/b?x=1").body(()).unwrap();
        assert_eq!(k.key_of(&req), "/a/b");
        let c = k.classify(&req);
        assert_eq!(c.resources()[0].0.name(), "http:/a/b");
        let k = keyed(
            Limit::new(1, Duration::from_secs(1)).unwrap(),
            "header:x-user".parse().unwrap(),
        );
        let req = http::Request::get("/")
            .header("x-user", "alice")
            .body(())
            .unwrap();
        assert_eq!(k.key_of(&req), "alice");
        let k = keyed(
            Limit::new(1, Duration::from_secs(1)).unwrap(),
            KeyBy::ClientIp,
        );
        let mut req = http::Request::get("/").body(()).unwrap();
        assert_eq!(k.key_of(&req), "unknown");
        req.extensions_mut()
            .insert(ClientAddr("10.1.2.3:5555".parse().unwrap()));
        assert_eq!(k.key_of(&req), "10.1.2.3");
        assert!("header:bad name".parse::<KeyBy>().is_err());
        assert!("cookie".parse::<KeyBy>().is_err());
    }
}
