//! Routes from a file (`--config FILE`, TOML) and the route table they make.
//!
//! ```toml
//! upstream = "http://127.0.0.1:8080"   # required, but in --mode forward-auth
//! limit = "off"                         # requests no route matches (default "off")
//! key_by = "ip"                         # default for routes (default "ip")
//! on_failure = "open"                   # default for routes (default "open")
//! trust_forwarded = ["10.0.0.0/8"]      # optional: added to --trust-forwarded (CIDRs)
//! client_ip_from = "xff"                # optional: real-ip, xff (default), forwarded, peer;
//!                                       # --client-ip-from wins over it
//!
//! [[route]]
//! path = "/api/"                        # a prefix; the longest match wins
//! methods = ["GET", "POST"]             # optional: any method when absent
//! limit = ["10/1s", "1000/1h"]          # "N/WINDOW", "off", or a list consumed atomically
//! key_by = "header:x-user"              # optional
//! on_failure = "closed"                 # optional
//! label = "api"                         # optional: metrics label, bucket names
//! latency_guard = "250ms"               # optional: reject while the upstream is slow
//! latency_window = "60s"                # optional: samples younger than this (60s)
//! latency_min_samples = 10              # optional: no rejection with fewer (10)
//! ```
//!
//! A latency guard (`latency_guard = "DURATION"`) gives the route a latency tracker
//! (`route:LABEL:latency`, the path when there is no label) fed with the upstream's
//! response latency of the route's granted requests (from the request forwarded to the
//! response head, whole milliseconds). Proxy mode only: in `--mode forward-auth`
//! nothing is forwarded, the latency fed is the local answer's (about 1 ms) and the
//! guard never rejects. The service rejects a request of the route while
//! the tracker's current latency, the 90th percentile of the newest samples (at most
//! 1000) younger than `latency_window`, is at or above the threshold; while fewer than
//! `latency_min_samples` such samples exist it reads 0 and never rejects. A rejection by
//! the guard is a `429` with `Retry-After: 1`. A guard on a route with `limit = "off"`
//! admits by the guard alone.
//!
//! Errors name the line (`line N`): toml's byte spans converted to line numbers, and
//! for values that parse as TOML but not as a limit, key or policy, the value's span.
//!
//! Owns: the file format and route matching. Must not touch: listeners, admission.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use ratelimitly_tower::{
    ClientIpFrom, Consumption, KeyBy, Keyed, LatencyTracker, LayerMetrics, Limit, OnFailure,
    TrustedProxies, keyed,
};
use serde::Deserialize;
use toml::Spanned;

use crate::http_modes::route_metrics::RouteMetrics;

/// Every top-level key of the file, as `RawFile` accepts them (`deny_unknown_fields`
/// refuses any other); `proxy/README.md`'s reference table lists each (a test checks).
pub const FILE_KEYS: &[&str] = &[
    "upstream",
    "limit",
    "key_by",
    "on_failure",
    "trust_forwarded",
    "client_ip_from",
    "route",
];

/// Every key of a `[[route]]` table, as `RawRoute` accepts them.
pub const ROUTE_KEYS: &[&str] = &[
    "path",
    "methods",
    "limit",
    "key_by",
    "on_failure",
    "label",
    "latency_guard",
    "latency_window",
    "latency_min_samples",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    upstream: Option<Spanned<String>>,
    limit: Option<Spanned<RawLimit>>,
    key_by: Option<Spanned<String>>,
    on_failure: Option<Spanned<String>>,
    trust_forwarded: Option<Spanned<Vec<String>>>,
    client_ip_from: Option<Spanned<String>>,
    #[serde(default)]
    route: Vec<RawRoute>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: Spanned<String>,
    methods: Option<Spanned<Vec<String>>>,
    limit: Spanned<RawLimit>,
    key_by: Option<Spanned<String>>,
    on_failure: Option<Spanned<String>>,
    label: Option<Spanned<String>>,
    latency_guard: Option<Spanned<String>>,
    latency_window: Option<Spanned<String>>,
    latency_min_samples: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawLimit {
    One(String),
    Many(Vec<String>),
}

/// One route: what a matching request consumes and what a failed admission does.
#[derive(Debug)]
pub struct Route {
    /// The path prefix ("" for the top-level default).
    pub path: String,
    methods: Vec<Method>,
    /// One bucket mapping per limit; empty: `off`.
    keyed: Vec<Keyed>,
    /// What a failed admission does.
    pub on_failure: OnFailure,
    label: String,
    /// `latency_guard`: the tracker the upstream's latency feeds, and the threshold.
    guard: Option<(LatencyTracker, Duration)>,
    /// The route's own counters (`Table::count_routes_in`).
    counted: Option<Arc<LayerMetrics>>,
}

impl Route {
    /// The route's name in its series and its `RateLimit-Policy`: the label, else the
    /// path (`default` for the top-level route).
    pub fn name(&self) -> &str {
        match (self.label.as_str(), self.path.as_str()) {
            ("", "") => "default",
            ("", path) => path,
            (label, _) => label,
        }
    }

    /// Whether requests of this route are admitted at all (not `off`).
    pub fn limited(&self) -> bool {
        !self.keyed.is_empty() || self.guard.is_some()
    }

    /// What `request` consumes: one token of each limit's bucket, in one request.
    pub fn consumption<B>(&self, request: &http::Request<B>) -> Consumption {
        use ratelimitly_tower::Classify;
        let mut c = Consumption::new().label(self.label.clone());
        for k in &self.keyed {
            for (r, n) in k.classify(request).resources() {
                c = c.consume(r.clone(), *n);
            }
        }
        if let Some((tracker, threshold)) = &self.guard {
            c = c.guard(tracker.clone(), *threshold);
        }
        if let Some(m) = &self.counted {
            c = c.also_count_in(m.clone());
        }
        c
    }

    fn matches(&self, method: &Method, path: &str) -> bool {
        path.starts_with(&self.path) && (self.methods.is_empty() || self.methods.contains(method))
    }
}

/// The routes of one file.
#[derive(Debug)]
pub struct Table {
    /// `upstream` of the file (none: only for `--mode forward-auth`).
    pub upstream: Option<String>,
    /// `trust_forwarded`: peers whose forwarded headers are believed (with the
    /// `--trust-forwarded` flags).
    pub trusted: TrustedProxies,
    /// `client_ip_from`: what trusted peers name the client in (`--client-ip-from`
    /// wins over it).
    pub client_ip_from: Option<ClientIpFrom>,
    /// Longest path first (file order among equal lengths).
    routes: Vec<Arc<Route>>,
    default: Arc<Route>,
}

impl Table {
    /// The route of a request: the longest matching prefix, else the default.
    pub fn find(&self, method: &Method, path: &str) -> &Arc<Route> {
        self.routes
            .iter()
            .find(|r| r.matches(method, path))
            .unwrap_or(&self.default)
    }

    /// Counts each limited route's verdicts in its own counters of `reg` (by
    /// [`Route::name`]): the per-route series.
    pub fn count_routes_in(&mut self, reg: &RouteMetrics) {
        for r in self
            .routes
            .iter_mut()
            .chain(std::iter::once(&mut self.default))
        {
            // a table being set up: its routes are not shared yet
            if let Some(r) = Arc::get_mut(r)
                && r.limited()
            {
                r.counted = Some(reg.of(r.name()));
            }
        }
    }

    /// Whether any route (or the default) is limited: admission needs a backend.
    pub fn limited(&self) -> bool {
        self.default.limited() || self.routes.iter().any(|r| r.limited())
    }

    /// Routes in the file (without the default).
    pub fn route_count(&self) -> usize {
        self.routes.len()
    }
}

/// DURATION: the WINDOW of a limit's COUNT/WINDOW, parsed by the same parser
/// (`500ms`, `10s`, `1m`, `1h`; whole milliseconds, at least 1 ms).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    format!("1/{}", s.trim())
        .parse::<Limit>()
        .map(|l| l.window())
        .map_err(|_| {
            format!("duration must look like 500ms, 10s or 1m (whole milliseconds, 1 ms or more), not {s:?}")
        })
}

/// `latency_window` when absent.
pub const DEFAULT_LATENCY_WINDOW: &str = "60s";

/// `latency_min_samples` when absent.
pub const DEFAULT_LATENCY_MIN_SAMPLES: u32 = 10;

/// Samples a route's latency tracker keeps at most.
const GUARD_MAX_SAMPLES: u32 = 1000;

/// The `latency_guard` of route `r` named `name`, if it has one.
fn guard(
    text: &str,
    r: &RawRoute,
    name: &str,
) -> Result<Option<(LatencyTracker, Duration)>, String> {
    let Some(g) = &r.latency_guard else {
        if let Some(w) = &r.latency_window {
            return Err(at(text, w, "latency_window needs latency_guard"));
        }
        if let Some(m) = &r.latency_min_samples {
            return Err(at(text, m, "latency_min_samples needs latency_guard"));
        }
        return Ok(None);
    };
    let threshold = parse_duration(g.get_ref()).map_err(|e| at(text, g, e))?;
    let window = match &r.latency_window {
        None => parse_duration(DEFAULT_LATENCY_WINDOW)?,
        Some(w) => parse_duration(w.get_ref()).map_err(|e| at(text, w, e))?,
    };
    let min = match &r.latency_min_samples {
        None => DEFAULT_LATENCY_MIN_SAMPLES,
        Some(m) if *m.get_ref() == 0 => {
            return Err(at(text, m, "latency_min_samples must be 1 or more"));
        }
        Some(m) => *m.get_ref(),
    };
    let tracker = LatencyTracker::new(
        format!("route:{name}:latency"),
        window,
        GUARD_MAX_SAMPLES,
        min,
    )
    .map_err(|e| at(text, g, format!("bad latency guard: {e}")))?;
    Ok(Some((tracker, threshold)))
}

/// Reads and checks `path`. A file that does not parse and looks like YAML is said to
/// be (envoyproxy/ratelimit's format, for `--mode rls`).
pub fn load(path: &Path) -> Result<Table, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| {
        let hint = if looks_like_yaml(&text) {
            " (this looks like YAML (envoyproxy/ratelimit's format, for --mode rls); \
             --mode proxy and forward-auth read a TOML route file)"
        } else {
            ""
        };
        format!("{}: {e}{hint}", path.display())
    })
}

/// The lines of `text` that say something: neither blank nor a `#` comment.
fn significant(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// A bare key and what follows it: `("domain", ": x")` for `domain: x`.
fn bare_key(line: &str) -> Option<(&str, &str)> {
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .unwrap_or(line.len());
    (end > 0).then(|| (&line[..end], line[end..].trim_start()))
}

/// Whether `text` looks like YAML rather than TOML: its first line that says something
/// is `---`, a list item (`- `), or a bare `key:` (TOML writes `key =`).
pub fn looks_like_yaml(text: &str) -> bool {
    let Some(first) = significant(text).next() else {
        return false;
    };
    first == "---"
        || first.starts_with("- ")
        || bare_key(first).is_some_and(|(_, rest)| rest.starts_with(':'))
}

/// Whether `text` looks like TOML rather than YAML: a line that says something is a
/// table header (`[name]`, `[[name]]`) or a bare `key = value`.
pub fn looks_like_toml(text: &str) -> bool {
    significant(text).any(|l| {
        let header = l.starts_with('[')
            && l.ends_with(']')
            && l.trim_matches(|c| c == '[' || c == ']')
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        header || bare_key(l).is_some_and(|(_, rest)| rest.starts_with('='))
    })
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

fn at<T>(text: &str, s: &Spanned<T>, msg: impl std::fmt::Display) -> String {
    format!("line {}: {msg}", line_of(text, s.span().start))
}

fn limits(text: &str, s: &Spanned<RawLimit>) -> Result<Vec<Limit>, String> {
    let items: Vec<&str> = match s.get_ref() {
        RawLimit::One(x) => vec![x.as_str()],
        RawLimit::Many(v) => v.iter().map(String::as_str).collect(),
    };
    if items == ["off"] {
        return Ok(Vec::new());
    }
    if items.is_empty() {
        return Err(at(text, s, "empty limit list (use \"off\")"));
    }
    items
        .iter()
        .map(|x| {
            if *x == "off" {
                return Err(at(text, s, "\"off\" cannot be part of a list"));
            }
            x.parse::<Limit>()
                .map_err(|e| at(text, s, format!("bad limit {x:?}: {e}")))
        })
        .collect()
}

fn key_by(text: &str, s: &Option<Spanned<String>>, default: &KeyBy) -> Result<KeyBy, String> {
    match s {
        None => Ok(default.clone()),
        Some(s) => s.get_ref().parse().map_err(|e: String| at(text, s, e)),
    }
}

fn on_failure(
    text: &str,
    s: &Option<Spanned<String>>,
    default: OnFailure,
) -> Result<OnFailure, String> {
    match s {
        None => Ok(default),
        Some(s) => s.get_ref().parse().map_err(|e: String| at(text, s, e)),
    }
}

/// A route's settings, checked.
struct RouteSpec {
    path: String,
    methods: Vec<Method>,
    limits: Vec<Limit>,
    key_by: KeyBy,
    on_failure: OnFailure,
    label: String,
    guard: Option<(LatencyTracker, Duration)>,
}

fn route(spec: RouteSpec) -> Route {
    let RouteSpec {
        path,
        methods,
        limits,
        key_by,
        on_failure,
        label,
        guard,
    } = spec;
    let prefix = if label.is_empty() {
        format!("route:{path}")
    } else {
        format!("route:{label}")
    };
    let keyed = limits
        .into_iter()
        .map(|l| {
            keyed(l, key_by.clone())
                .prefix(prefix.clone())
                .label(label.clone())
        })
        .collect();
    Route {
        path,
        methods,
        keyed,
        on_failure,
        label,
        guard,
        counted: None,
    }
}

/// Checks the text of a file.
pub fn parse(text: &str) -> Result<Table, String> {
    let raw: RawFile = toml::from_str(text).map_err(|e| match e.span() {
        Some(s) => format!("line {}: {}", line_of(text, s.start), e.message().trim()),
        None => e.message().trim().to_owned(),
    })?;
    if let Some(up) = &raw.upstream {
        let ok = up
            .get_ref()
            .parse::<http::Uri>()
            .ok()
            .is_some_and(|u| u.scheme_str() == Some("http") && u.authority().is_some());
        if !ok {
            return Err(at(text, up, "upstream must be http://HOST:PORT"));
        }
    }
    let mut trusted = TrustedProxies::none();
    if let Some(list) = &raw.trust_forwarded {
        for cidr in list.get_ref() {
            let t: TrustedProxies = cidr
                .parse()
                .map_err(|e| at(text, list, format!("trust_forwarded: {e}")))?;
            for net in t.nets() {
                trusted = trusted.with(*net);
            }
        }
    }
    let client_ip_from = match &raw.client_ip_from {
        None => None,
        Some(c) => Some(c.get_ref().parse().map_err(|e| at(text, c, e))?),
    };
    let top_limits = match &raw.limit {
        None => Vec::new(),
        Some(l) => limits(text, l)?,
    };
    let top_key = key_by(text, &raw.key_by, &KeyBy::ClientIp)?;
    let top_failure = on_failure(text, &raw.on_failure, OnFailure::Open)?;
    let mut routes = Vec::with_capacity(raw.route.len());
    for r in &raw.route {
        let path = r.path.get_ref();
        if !path.starts_with('/') {
            return Err(at(text, &r.path, "route path must start with /"));
        }
        let mut methods = Vec::new();
        if let Some(ms) = &r.methods {
            for m in ms.get_ref() {
                let m = Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                    .map_err(|_| at(text, ms, format!("bad method {m:?}")))?;
                methods.push(m);
            }
        }
        let label = r
            .label
            .as_ref()
            .map(|l| l.get_ref().clone())
            .unwrap_or_default();
        let name = if label.is_empty() { path } else { &label };
        let guard = guard(text, r, name)?;
        routes.push(Arc::new(route(RouteSpec {
            path: path.clone(),
            methods,
            limits: limits(text, &r.limit)?,
            key_by: key_by(text, &r.key_by, &top_key)?,
            on_failure: on_failure(text, &r.on_failure, top_failure)?,
            label,
            guard,
        })));
    }
    routes.sort_by_key(|r| std::cmp::Reverse(r.path.len()));
    Ok(Table {
        upstream: raw.upstream.map(Spanned::into_inner),
        trusted,
        client_ip_from,
        routes,
        default: Arc::new(route(RouteSpec {
            path: String::new(),
            methods: Vec::new(),
            limits: top_limits,
            key_by: top_key,
            on_failure: top_failure,
            label: String::new(),
            guard: None,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
upstream = "http://127.0.0.1:9"
limit = "5/1s"

[[route]]
path = "/api/"
limit = ["10/1s", "1000/1h"]
label = "api"

[[route]]
path = "/api/health"
limit = "off"

[[route]]
path = "/login"
methods = ["post"]
limit = "3/1m"
key_by = "path"
on_failure = "closed"
"#;

    /// A request as the proxy hands it to the layer: with the client's address (a request
    /// without one gets the failure policy, not a bucket).
    fn req(m: &str, p: &str) -> http::Request<()> {
        let mut r = http::Request::builder().method(m).uri(p).body(()).unwrap();
        r.extensions_mut().insert(ratelimitly_tower::ClientAddr(
            "127.0.0.1:1".parse().unwrap(),
        ));
        r
    }

    #[test]
    fn longest_prefix_methods_off_and_default() {
        let t = parse(GOOD).unwrap();
        assert_eq!(t.route_count(), 3);
        assert!(t.limited());
        assert_eq!(t.find(&Method::GET, "/api/x").path, "/api/");
        assert_eq!(t.find(&Method::GET, "/api/health/z").path, "/api/health");
        assert!(!t.find(&Method::GET, "/api/health").limited());
        assert_eq!(t.find(&Method::POST, "/login").path, "/login");
        assert_eq!(
            t.find(&Method::POST, "/login").on_failure,
            OnFailure::Closed
        );
        assert_eq!(t.find(&Method::GET, "/login").path, "", "method not listed");
        let api = t.find(&Method::GET, "/api/x");
        let c = api.consumption(&req("GET", "/api/x"));
        assert_eq!(c.resources().len(), 2, "two limits, one request");
        assert_eq!(c.metrics_label(), "api");
        let c = t
            .find(&Method::GET, "/other")
            .consumption(&req("GET", "/other"));
        assert_eq!(c.resources().len(), 1);
    }

    #[test]
    fn latency_guard_parses_into_the_consumption() {
        let t = parse(
            "[[route]]\npath = \"/slow/\"\nlimit = \"off\"\nlatency_guard = \"250ms\"\nlatency_window = \"30s\"\nlatency_min_samples = 3\n\n[[route]]\npath = \"/api/\"\nlimit = \"5/1s\"\nlabel = \"api\"\nlatency_guard = \"1s\"\n",
        )
        .unwrap();
        let slow = t.find(&Method::GET, "/slow/x");
        assert!(slow.limited(), "a guard alone admits");
        let c = slow.consumption(&req("GET", "/slow/x"));
        assert!(c.resources().is_empty());
        assert_eq!(c.guards().len(), 1);
        assert_eq!(c.guards()[0].1, Duration::from_millis(250));
        let c = t
            .find(&Method::GET, "/api/x")
            .consumption(&req("GET", "/api/x"));
        assert_eq!((c.resources().len(), c.guards().len()), (1, 1));
        assert_eq!(c.guards()[0].1, Duration::from_secs(1));
        assert_ne!(
            c.guards()[0].0,
            slow.guard.as_ref().unwrap().0,
            "a tracker per route"
        );
    }

    /// `FILE_KEYS` and `ROUTE_KEYS` are what the parser accepts: each key parses (with a
    /// value of its kind) and a key outside them is refused.
    #[test]
    fn the_key_lists_are_the_parsers() {
        let value = |k: &str| match k {
            "upstream" => "\"http://127.0.0.1:9\"",
            "trust_forwarded" => "[\"10.0.0.0/8\"]",
            "client_ip_from" => "\"xff\"",
            "limit" => "\"1/1s\"",
            "key_by" => "\"ip\"",
            "on_failure" => "\"open\"",
            "path" => "\"/a\"",
            "methods" => "[\"GET\"]",
            "label" => "\"a\"",
            "latency_guard" | "latency_window" => "\"1s\"",
            "latency_min_samples" => "3",
            other => panic!("no sample value for {other}"),
        };
        for k in FILE_KEYS.iter().filter(|k| **k != "route") {
            parse(&format!("{k} = {}\n", value(k))).unwrap_or_else(|e| panic!("{k}: {e}"));
        }
        let mut route = String::from("[[route]]\n");
        for k in ROUTE_KEYS {
            route.push_str(&format!("{k} = {}\n", value(k)));
        }
        assert_eq!(parse(&route).unwrap().route_count(), 1);
        assert!(parse("nope = 1\n").is_err());
        assert!(parse("[[route]]\npath = \"/a\"\nlimit = \"off\"\nnope = 1\n").is_err());
        // serde names the expected keys in its error: exactly the lists
        let e = parse("nope = 1\n").unwrap_err();
        for k in FILE_KEYS {
            assert!(e.contains(&format!("`{k}`")), "{k} in {e}");
        }
        let e = parse("[[route]]\nnope = 1\n").unwrap_err();
        for k in ROUTE_KEYS {
            assert!(e.contains(&format!("`{k}`")), "{k} in {e}");
        }
    }

    #[test]
    fn yaml_and_toml_are_told_apart() {
        let yaml = "# envoyproxy/ratelimit\ndomain: api\ndescriptors:\n  - key: path\n";
        assert!(looks_like_yaml(yaml) && !looks_like_toml(yaml));
        assert!(looks_like_yaml("---\ndomain: x\n"));
        assert!(looks_like_toml(GOOD) && !looks_like_yaml(GOOD));
        assert!(looks_like_toml("[[route]]\n"));
        assert!(!looks_like_yaml("") && !looks_like_toml(""));
    }

    #[test]
    fn errors_name_the_line() {
        let bad = GOOD.replace("\"3/1m\"", "\"3/1x\"");
        let e = parse(&bad).unwrap_err();
        assert!(e.starts_with("line 17:"), "{e}");
        let e = parse("upstream = \"http://127.0.0.1:9\"\n\n[[route]]\npath = \"/a\"\nlimit = \n")
            .unwrap_err();
        assert!(e.contains("line 5"), "{e}");
        let e = parse("upstream = \"http://127.0.0.1:9\"\nkey_by = \"cookie\"\n").unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = parse("upstream = \"http://127.0.0.1:9\"\nlimits = \"1/1s\"\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let e = parse("upstream = \"http://127.0.0.1:9\"\ntrust_forwarded = [\"10.0.0.0/33\"]\n")
            .unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let t = parse("trust_forwarded = [\"10.0.0.0/8\", \"::1\"]\n").unwrap();
        assert!(t.trusted.contains("10.1.2.3".parse().unwrap()));
        assert!(t.trusted.contains("::1".parse().unwrap()));
        assert!(!t.trusted.contains("11.0.0.1".parse().unwrap()));
        assert_eq!(t.client_ip_from, None);
        let t = parse("client_ip_from = \"real-ip\"\n").unwrap();
        assert_eq!(t.client_ip_from, Some(ClientIpFrom::RealIp));
        let e = parse("limit = \"off\"\nclient_ip_from = \"x-real-ip\"\n").unwrap_err();
        assert!(
            e.starts_with("line 2: ") && e.contains("real-ip, xff"),
            "{e}"
        );
        let e = parse("[[route]]\npath = \"/a\"\nlimit = \"off\"\nlatency_guard = \"fast\"\n")
            .unwrap_err();
        assert!(e.starts_with("line 4:"), "{e}");
        let e = parse("[[route]]\npath = \"/a\"\nlimit = \"off\"\nlatency_window = \"1s\"\n")
            .unwrap_err();
        assert!(e.starts_with("line 4:"), "{e}");
        let e = parse("upstream = \"ftp://x\"\n").unwrap_err();
        assert!(e.starts_with("line 1:"), "{e}");
        // the default in a file is off
        assert!(
            !parse("upstream = \"http://127.0.0.1:9\"\n")
                .unwrap()
                .limited()
        );
    }
}
