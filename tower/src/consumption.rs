//! What one HTTP request consumes: resources with quantities, latency guards and a
//! metrics label ([`Consumption`]), the user's mapping from a request to it
//! ([`Classify`]), and the ready mapping keyed by client IP, a header or the path
//! ([`Keyed`] with [`Limit`] and [`KeyBy`]).
//!
//! Owns: the request → consumption rules and the `COUNT/WINDOW` limit syntax.
//! Must not touch: the engine, the network, responses (the service module decides what
//! happens with a consumption).

use std::borrow::{Borrow, Cow};
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::io::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::header::HeaderName;
use ratelimitly_engine::{LatencyTracker, Resource};
use smallvec::SmallVec;

use crate::failure::FailureKind;
use crate::forwarded::{ClientIpFrom, ClientIpRule, TrustedProxies, UnvouchedLog};
use crate::metrics::LayerMetrics;

/// What one request consumes; an empty consumption is granted locally without asking
/// the service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Consumption {
    /// Inline up to two, so a request's consumption needs no allocation.
    resources: SmallVec<[(Resource, u32); 2]>,
    extras: Extras,
    failure: Option<FailureKind>,
}

/// What a request carries besides its resources (guards, a metrics label, counters it is
/// also counted in): a [`Consumption`]'s own, and what a [`Keyed`] gives every request's.
/// Their builders (`guard`, `label`, `also_count_in`) set it through these methods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Extras {
    guards: Vec<(LatencyTracker, Duration)>,
    label: Cow<'static, str>,
    also: AlsoCounted,
}

impl Extras {
    fn guard(&mut self, tracker: LatencyTracker, threshold: Duration) {
        self.guards.push((tracker, threshold));
    }

    fn label(&mut self, label: Cow<'static, str>) {
        self.label = label;
    }

    fn also_count_in(&mut self, metrics: Arc<LayerMetrics>) {
        self.also = AlsoCounted(Some(metrics));
    }
}

/// The counters a consumption's verdict is also counted in (besides the layer's own):
/// equal when they are the same counters.
#[derive(Clone, Debug, Default)]
struct AlsoCounted(Option<Arc<LayerMetrics>>);

impl PartialEq for AlsoCounted {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (a, b) => a.is_none() && b.is_none(),
        }
    }
}

impl Eq for AlsoCounted {}

impl Consumption {
    /// A consumption that cannot be asked for: the layer applies its failure policy for
    /// `kind` without asking the service (e.g. no client address to key by).
    pub fn failed(kind: FailureKind) -> Self {
        Consumption {
            failure: Some(kind),
            ..Self::default()
        }
    }

    /// The failure set by [`Consumption::failed`].
    pub fn failure(&self) -> Option<FailureKind> {
        self.failure
    }

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
        self.extras.guard(tracker, threshold);
        self
    }

    /// A metrics label (groups the service's own metrics; not a key).
    pub fn label(mut self, label: impl Into<Cow<'static, str>>) -> Self {
        self.extras.label(label.into());
        self
    }

    /// Also counts this request's verdict and decision latency in `metrics` (e.g. one
    /// route's counters, beside the layer's).
    pub fn also_count_in(mut self, metrics: Arc<LayerMetrics>) -> Self {
        self.extras.also_count_in(metrics);
        self
    }

    /// The counters set by [`Consumption::also_count_in`].
    pub fn counted_in(&self) -> Option<&Arc<LayerMetrics>> {
        self.extras.also.0.as_ref()
    }

    /// The resources and their token counts.
    pub fn resources(&self) -> &[(Resource, u32)] {
        &self.resources
    }

    /// The guards and their thresholds.
    pub fn guards(&self) -> &[(LatencyTracker, Duration)] {
        &self.extras.guards
    }

    /// The metrics label ("" = none).
    pub fn metrics_label(&self) -> &str {
        &self.extras.label
    }

    /// No resource and no guard.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty() && self.extras.guards.is_empty()
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
/// request's extensions (the `rl-proxy` binary does); [`KeyBy::ClientIp`] reads it
/// when axum's `ConnectInfo<SocketAddr>` is not there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub SocketAddr);

/// The connection's peer address from the request's extensions, whichever is present,
/// in this order: axum's `ConnectInfo<SocketAddr>` (with the default `axum` feature;
/// serve with `into_make_service_with_connect_info::<SocketAddr>()`), [`ClientAddr`],
/// a bare `SocketAddr`.
pub fn peer_addr<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    let ext = request.extensions();
    #[cfg(feature = "axum")]
    if let Some(ci) = ext.get::<axum::extract::ConnectInfo<SocketAddr>>() {
        return Some(ci.0);
    }
    if let Some(a) = ext.get::<ClientAddr>() {
        return Some(a.0);
    }
    ext.get::<SocketAddr>().copied()
}

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
    /// The client's IP address: the peer address ([`peer_addr`]), or behind trusted
    /// proxies ([`Keyed::trusted_proxies`]) the client they vouch for, read from the
    /// source [`Keyed::client_ip_from`] names ([`crate::forwarded`]). A request without any peer address is not
    /// keyed: it gets the failure policy for [`FailureKind::NoClientAddr`] (logged once
    /// per mapping at `warn!`), never a shared bucket.
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
///
/// The buckets of the most recent keys are kept (up to 4,096 keys, shared
/// by clones; the cache starts over when full), so a request of a known key costs a
/// map lookup instead of formatting its name and hashing its bucket id.
#[derive(Clone, Debug)]
pub struct Keyed {
    limit: Limit,
    key_by: KeyBy,
    prefix: Cow<'static, str>,
    /// Given to every request's consumption.
    extras: Extras,
    client_rule: Arc<ClientIpRule>,
    unvouched: Arc<UnvouchedLog>,
    buckets: Arc<Mutex<Buckets>>,
    warned_no_addr: Arc<AtomicBool>,
}

/// The cached buckets: by key text, and for [`KeyBy::ClientIp`] by address, so a
/// known client costs a lookup with no formatting.
#[derive(Debug, Default)]
struct Buckets {
    by_key: HashMap<Box<str>, Resource>,
    by_ip: HashMap<IpAddr, Resource>,
}

impl Buckets {
    /// Makes room for one more (the cache starts over when full).
    fn room(&mut self) {
        if self.by_key.len() + self.by_ip.len() >= BUCKET_CACHE {
            self.by_key.clear();
            self.by_ip.clear();
        }
    }
}

/// Most keys whose bucket a [`Keyed`] keeps.
const BUCKET_CACHE: usize = 4096;

/// The ready mapping keyed by `key_by` with `limit` (bucket names `http:KEY`).
pub fn keyed(limit: Limit, key_by: KeyBy) -> Keyed {
    Keyed {
        limit,
        key_by,
        prefix: Cow::Borrowed("http"),
        extras: Extras::default(),
        client_rule: Arc::default(),
        unvouched: Arc::default(),
        buckets: Arc::default(),
        warned_no_addr: Arc::default(),
    }
}

/// Longest key taken from a request (longer values are cut, on a char boundary).
const MAX_KEY: usize = 200;

impl Keyed {
    /// Bucket names become `PREFIX:KEY` (default prefix `http`).
    pub fn prefix(mut self, prefix: impl Into<Cow<'static, str>>) -> Self {
        self.prefix = prefix.into();
        self.buckets = Arc::default(); // other names: not shared with earlier clones
        self
    }

    /// Believes what peers in `trusted` say about the client for [`KeyBy::ClientIp`]
    /// (default: nobody is trusted), read from the source of
    /// [`Keyed::client_ip_from`] (default: `X-Forwarded-For`).
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.client_rule = Arc::new(ClientIpRule::new(trusted, self.client_rule.source()));
        self
    }

    /// The header trusted peers name the client in ([`ClientIpFrom`]; default
    /// [`ClientIpFrom::Xff`]): the one the proxy in front writes itself.
    pub fn client_ip_from(mut self, source: ClientIpFrom) -> Self {
        let trusted = self.client_rule.trusted().clone();
        self.client_rule = Arc::new(ClientIpRule::new(trusted, source));
        self
    }

    /// Adds a guard to every request.
    pub fn guard(mut self, tracker: LatencyTracker, threshold: Duration) -> Self {
        self.extras.guard(tracker, threshold);
        self
    }

    /// A metrics label for every request.
    pub fn label(mut self, label: impl Into<Cow<'static, str>>) -> Self {
        self.extras.label(label.into());
        self
    }

    /// Also counts every request's verdict in `metrics` ([`Consumption::also_count_in`]).
    pub fn also_count_in(mut self, metrics: Arc<LayerMetrics>) -> Self {
        self.extras.also_count_in(metrics);
        self
    }

    /// The key of `request` (bounded length); `None` for [`KeyBy::ClientIp`] without a
    /// peer address.
    pub fn key_of<B>(&self, request: &http::Request<B>) -> Option<String> {
        let mut ip = IpText::default();
        self.with_key(Head::of(request), &mut ip, str::to_owned)
    }

    /// [`Classify::classify`] for a request known by its head and peer address, for
    /// servers that do not hand over an `http::Request` (Pingora's `RequestHeader`
    /// dereferences to [`http::request::Parts`]). `peer`: the TCP peer; the
    /// trusted-forwarding rule ([`Keyed::trusted_proxies`]) applies to it as to
    /// [`peer_addr`]'s.
    pub fn classify_head(
        &self,
        peer: Option<SocketAddr>,
        head: &http::request::Parts,
    ) -> Consumption {
        self.classify_parts(Head {
            peer,
            headers: &head.headers,
            uri: &head.uri,
        })
    }

    /// Calls `f` with the key of `request` (bounded length), formatting a client IP
    /// into `ip` instead of the heap.
    fn with_key<'a, R>(
        &self,
        head: Head<'a>,
        ip: &'a mut IpText,
        f: impl FnOnce(&str) -> R,
    ) -> Option<R> {
        let raw: Cow<'a, str> = match &self.key_by {
            KeyBy::ClientIp => Cow::Borrowed(ip.format(self.client_addr(head)?)),
            KeyBy::Header(name) => head
                .headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v.as_bytes()))
                .unwrap_or(Cow::Borrowed("")),
            KeyBy::Path => Cow::Borrowed(head.uri.path()),
        };
        let mut end = raw.len().min(MAX_KEY);
        while !raw.is_char_boundary(end) {
            end -= 1;
        }
        Some(f(&raw[..end]))
    }

    /// The client address of a request for [`KeyBy::ClientIp`]; `None` without a peer
    /// address.
    fn client_addr(&self, head: Head<'_>) -> Option<IpAddr> {
        let peer = head.peer?;
        Some(if self.client_rule.trusted().is_empty() {
            peer.ip()
        } else {
            let client = self.client_rule.client_ip(peer.ip(), head.headers);
            self.unvouched.note(client).addr()
        })
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, Buckets> {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new bucket for `key`. `None` when the engine refuses its name (never for a
    /// [`Limit`] that parsed).
    fn new_bucket(&self, key: &str) -> Option<Resource> {
        let name = format!("{}:{key}", self.prefix);
        Resource::new(name, self.limit.window, self.limit.count).ok()
    }

    /// The bucket cached in `map` under `key`, or the one `make` gives (with the key it
    /// is cached under), cached.
    fn cached<K, Q>(
        &self,
        map: fn(&mut Buckets) -> &mut HashMap<K, Resource>,
        key: &Q,
        make: impl FnOnce() -> Option<(K, Resource)>,
    ) -> Option<Resource>
    where
        K: Hash + Eq + Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if let Some(r) = map(&mut self.cache()).get(key) {
            return Some(r.clone());
        }
        let (k, r) = make()?;
        let mut cache = self.cache();
        cache.room();
        map(&mut cache).insert(k, r.clone());
        Some(r)
    }

    /// The bucket of `key`: from the cache, or made and cached.
    fn bucket(&self, key: &str) -> Option<Resource> {
        self.cached(
            |b| &mut b.by_key,
            key,
            || Some((key.into(), self.new_bucket(key)?)),
        )
    }

    /// The bucket of client address `addr`: from the cache, or made (its key the
    /// address's text, as [`Keyed::key_of`] gives it) and cached.
    fn bucket_of_ip(&self, addr: IpAddr) -> Option<Resource> {
        let make = || Some((addr, self.new_bucket(IpText::default().format(addr))?));
        self.cached(|b| &mut b.by_ip, &addr, make)
    }
}

/// A client IP's text, formatted on the stack (an IPv6 address is at most 45 bytes).
struct IpText {
    buf: [u8; 48],
}

impl Default for IpText {
    fn default() -> Self {
        IpText { buf: [0; 48] }
    }
}

impl IpText {
    fn format(&mut self, addr: IpAddr) -> &str {
        let mut w = &mut self.buf[..];
        let room = w.len();
        let len = match write!(w, "{addr}") {
            Ok(()) => room - w.len(),
            Err(_) => 0,
        };
        std::str::from_utf8(&self.buf[..len]).unwrap_or("unknown")
    }
}

impl Keyed {
    fn classify_parts(&self, head: Head<'_>) -> Consumption {
        // A name or limit the engine refuses shows up as an invalid request (500), not
        // as a panic: Resource::new only fails on limits Limit::new already refused.
        let bucket = match self.key_by {
            KeyBy::ClientIp => self.client_addr(head).map(|a| self.bucket_of_ip(a)),
            _ => self.with_key(head, &mut IpText::default(), |key| self.bucket(key)),
        };
        let Some(bucket) = bucket else {
            if !self.warned_no_addr.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "KeyBy::ClientIp found no client address on a request (no axum ConnectInfo<SocketAddr>, \
                     ClientAddr or SocketAddr extension; with axum serve with \
                     into_make_service_with_connect_info::<SocketAddr>()): such requests get the failure \
                     policy (no_client_addr) instead of a bucket"
                );
            }
            return Consumption::failed(FailureKind::NoClientAddr);
        };
        let c = Consumption {
            extras: self.extras.clone(),
            ..Consumption::default()
        };
        match bucket {
            Some(r) => c.consume(r, 1),
            None => c,
        }
    }
}

impl<B> Classify<B> for Keyed {
    fn classify(&self, request: &http::Request<B>) -> Consumption {
        self.classify_parts(Head::of(request))
    }
}

/// What keying reads of a request: the peer address, the headers, the URI.
#[derive(Clone, Copy)]
struct Head<'a> {
    peer: Option<SocketAddr>,
    headers: &'a http::HeaderMap,
    uri: &'a http::Uri,
}

impl<'a> Head<'a> {
    fn of<B>(request: &'a http::Request<B>) -> Self {
        Head {
            peer: peer_addr(request),
            headers: request.headers(),
            uri: request.uri(),
        }
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
        assert_eq!(k.key_of(&req).unwrap(), "/a/b");
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
        assert_eq!(k.key_of(&req).unwrap(), "alice");
        let k = keyed(
            Limit::new(1, Duration::from_secs(1)).unwrap(),
            KeyBy::ClientIp,
        );
        let mut req = http::Request::get("/").body(()).unwrap();
        assert_eq!(k.key_of(&req), None);
        assert_eq!(k.classify(&req).failure(), Some(FailureKind::NoClientAddr));
        req.extensions_mut()
            .insert(ClientAddr("10.1.2.3:5555".parse().unwrap()));
        assert_eq!(k.key_of(&req).unwrap(), "10.1.2.3");
        // a bare SocketAddr extension also works
        let mut req = http::Request::get("/").body(()).unwrap();
        req.extensions_mut()
            .insert("10.9.9.9:1".parse::<SocketAddr>().unwrap());
        assert_eq!(k.key_of(&req).unwrap(), "10.9.9.9");
        // forwarded headers only from trusted peers
        let k = k.trusted_proxies("10.0.0.0/8".parse().unwrap());
        let mut req = http::Request::get("/")
            .header("x-forwarded-for", "198.51.100.7")
            .body(())
            .unwrap();
        req.extensions_mut()
            .insert(ClientAddr("10.1.2.3:5555".parse().unwrap()));
        assert_eq!(k.key_of(&req).unwrap(), "198.51.100.7");
        req.extensions_mut()
            .insert(ClientAddr("192.0.2.1:5555".parse().unwrap()));
        assert_eq!(k.key_of(&req).unwrap(), "192.0.2.1");
        assert!("header:bad name".parse::<KeyBy>().is_err());
        assert!("cookie".parse::<KeyBy>().is_err());
    }

    #[test]
    fn cached_buckets_are_the_buckets_of_their_keys() {
        let limit = Limit::new(5, Duration::from_secs(2)).unwrap();
        let k = keyed(limit, KeyBy::ClientIp);
        let longest = "[ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255]:1";
        for addr in ["10.1.2.3:5555", longest, "10.1.2.3:6666"] {
            let mut req = http::Request::get("/").body(()).unwrap();
            req.extensions_mut()
                .insert(ClientAddr(addr.parse().unwrap()));
            for _ in 0..2 {
                let c = k.classify(&req);
                let key = k.key_of(&req).unwrap();
                let want = Resource::new(format!("http:{key}"), Duration::from_secs(2), 5).unwrap();
                assert_eq!(c.resources()[0].0, want, "{addr}");
            }
        }
        assert_eq!(k.buckets.lock().unwrap().by_ip.len(), 2);
        // a clone with another prefix does not see the first one's buckets
        let other = k.clone().prefix("api");
        let mut req = http::Request::get("/").body(()).unwrap();
        req.extensions_mut()
            .insert(ClientAddr("10.1.2.3:1".parse().unwrap()));
        assert_eq!(other.classify(&req).resources()[0].0.name(), "api:10.1.2.3");
        assert_eq!(k.classify(&req).resources()[0].0.name(), "http:10.1.2.3");
        // a full cache starts over
        let k = keyed(limit, KeyBy::Path);
        for i in 0..BUCKET_CACHE + 10 {
            let req = http::Request::get(format!("/{i}")).body(()).unwrap();
            assert_eq!(
                k.classify(&req).resources()[0].0.name(),
                format!("http:/{i}")
            );
        }
        assert!(k.buckets.lock().unwrap().by_key.len() <= BUCKET_CACHE);
    }
}
