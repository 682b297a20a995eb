//! `rl-proxy`: a small HTTP/1.1 reverse proxy that admits every request through
//! Ratelimitly (the `ratelimitly-tower` layer over the client engine) before forwarding
//! it to one upstream. It is the embedding example and the end-to-end benchmark subject.
//!
//! ```text
//! RATELIMITLY_API_KEY=... rl-proxy --upstream http://HOST:PORT
//!     (--endpoint ID@IP:PORT ... | --domain D [--dns-server IP:PORT])
//!     [--listen 127.0.0.1:0] [--admin-listen 127.0.0.1:0]
//!     [--limit COUNT/WINDOW|off] [--key-by ip|path|header:NAME] [--on-failure open|closed]
//!     [--admission engine|official] [--engine-core hosted|pinned]
//!     [--header-timeout 10s] [--idle-timeout 60s] [--upstream-timeout 30s]
//!     [--max-connections 10000] [--trust-forwarded CIDR ...]
//! ```
//!
//! DURATION arguments use the window syntax of `--limit`: a whole number and a unit
//! `ms`, `s`, `m` or `h` (`500ms`, `10s`, `1m`).
//!
//! Timeouts and limits:
//! - `--header-timeout` (default 10s): a connection that has not sent a whole request head
//!   within it is closed: counted from accept for the first request (a silent
//!   connection too) and from the first byte of each later one.
//! - `--idle-timeout` (default 60s): a keep-alive connection with no traffic between requests
//!   for it is closed.
//! - `--upstream-timeout` (default 30s): no response head from the upstream within it: the
//!   client gets `504 Gateway Timeout` (the upstream request is dropped).
//! - `--max-connections` (default 10000): client connections open at once. Beyond it a new
//!   connection is accepted and closed at once (no response: the client sees the
//!   connection closed), counted in `rl_proxy_connections_refused_total` and logged
//!   as a warning at most once a second.
//!
//! A decision service: `--mode forward-auth` (no `--upstream`) answers any path for
//! nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth` or Envoy `ext_authz`
//! (HTTP): `200` (empty body) when granted, `--deny-status` (default 429) with `Retry-After`
//! when rejected, and the failure policy otherwise (`open`: 200, `closed`: 503). The
//! request decided (route matching, `--key-by path`) is the original one, from
//! `X-Original-URI` / `X-Forwarded-Uri` and `X-Original-Method` /
//! `X-Forwarded-Method`; the client address is the TCP peer unless it is trusted (below).
//!
//! Trusted forwarding: `--trust-forwarded CIDR` (repeatable; the config file's
//! `trust_forwarded` list adds to it). From a trusted peer the client is the rightmost
//! `Forwarded` / `X-Forwarded-For` address that is not itself trusted; in
//! `--mode forward-auth` `X-Real-IP` (nginx's `$remote_addr`) comes first. From any
//! other peer those headers are ignored for keying (`conn::client_ip` is the one place
//! that decides). In proxy mode the upstream receives `X-Forwarded-For` with the TCP
//! peer appended (an existing value kept: `EXISTING, PEER`).
//!
//! Routes from a file: `--config FILE` (TOML; the format is in the `config` module's
//! docs) replaces `--upstream`, `--limit`, `--key-by` and `--on-failure`, which conflict
//! with it (the flags stay for the one-route case). `--config FILE --check` checks the
//! file and exits 0, or 2 with a message naming the line. `SIGHUP` reloads the file:
//! new requests take the new routes; a file that does not check, changes `upstream`, or
//! limits a route while the file at start limited none (no admission backend was
//! started) is refused and the running routes kept. Both are logged as warnings. With
//! `--config`, admission is by the engine only (`--admission engine`).
//!
//! The admin page adds the proxy's own counters to the layer's:
//! `rl_proxy_connections_open`, `rl_proxy_connections_refused_total`,
//! `rl_proxy_connections_timed_out_total{timeout="header"|"idle"}` and
//! `rl_proxy_upstream_timeouts_total`.
//!
//! The engine's core runs hosted by default: as a task on the proxy's own Tokio runtime,
//! so admitting a request costs no thread hand-off (`EngineBuilder::runtime`; the
//! benchmark in `proxy/bench/` measures both).
//!
//! Owns: the command line, key loading (environment or `--key-file`, never the command
//! line, never echoed), the readiness line, the listeners, SIGINT/SIGTERM handling.
//! Must not touch: admission rules (the layer) and forwarding (`upstream`).

mod admin;
mod config;
mod conn;
mod official;
mod upstream;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use clap::{Parser, ValueEnum};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_engine::{ApiKey, DnsConfig, Endpoint, Engine, EngineHandle};
use ratelimitly_tower::{
    AdmissionLayer, AdmissionService, Classify, ClientAddr, Consumption, EngineAdmission, Exporter,
    FailurePolicy, KeyBy, LayerMetrics, Limit, OnFailure, ResponseBody, TrustedProxies, keyed,
};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tower::{Layer, ServiceExt};

use crate::conn::{Clock, Expiry, ProxyMetrics, Timeouts, Watched, client_ip, original_request};
use crate::official::OfficialAdmission;
use crate::upstream::{Upstream, append_forwarded_for};

/// Where the engine's core runs (`--engine-core`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum EngineCore {
    Hosted,
    Pinned,
}

/// What the listener is (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A reverse proxy to --upstream.
    Proxy,
    /// A decision service: 200, the deny status, or the failure policy's answer.
    ForwardAuth,
}

/// Which client admits requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum AdmissionKind {
    /// The thread-per-core engine of this repository.
    Engine,
    /// The official `ratelimitly` crate (needs --domain).
    Official,
}

/// HTTP/1.1 reverse proxy admitting requests through Ratelimitly. The API key comes from
/// RATELIMITLY_API_KEY or --key-file, never from the command line.
#[derive(Parser, Debug)]
#[command(name = "rl-proxy", version)]
struct Cli {
    /// Upstream to forward granted requests to: http://HOST:PORT (required in proxy
    /// mode without --config).
    #[arg(long, conflicts_with = "config")]
    upstream: Option<String>,
    /// proxy: forward granted requests to the upstream. forward-auth: a decision
    /// service for nginx auth_request, Traefik ForwardAuth, Caddy forward_auth, Envoy
    /// ext_authz: 200 when granted, --deny-status with Retry-After when rejected, the
    /// failure policy otherwise; the original request from X-Original-URI /
    /// X-Forwarded-Uri and X-Original-Method / X-Forwarded-Method. No --upstream.
    #[arg(long, value_enum, default_value = "proxy")]
    mode: Mode,
    /// --mode forward-auth: the status of a rejection (nginx auth_request needs 403).
    #[arg(long, default_value_t = 429, value_parser = clap::value_parser!(u16).range(400..=599))]
    deny_status: u16,
    /// Routes from a TOML file (upstream, limit, key_by, on_failure, route tables);
    /// conflicts with --upstream, --limit, --key-by and --on-failure. SIGHUP reloads it.
    #[arg(long, conflicts_with_all = ["limit", "key_by", "on_failure"])]
    config: Option<PathBuf>,
    /// With --config: check the file and exit 0, or 2 with a message naming the line.
    #[arg(long, requires = "config")]
    check: bool,
    /// A service endpoint ID@IP:PORT (repeatable); bypasses DNS.
    #[arg(long = "endpoint", value_parser = parse_endpoint, conflicts_with = "domain")]
    endpoints: Vec<Endpoint>,
    /// Service domain discovered through DNS.
    #[arg(long)]
    domain: Option<String>,
    /// DNS server for --domain (default: the system resolver).
    #[arg(long, requires = "domain")]
    dns_server: Option<SocketAddr>,
    /// Proxy listener.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Admin listener (GET /metrics, GET /healthz).
    #[arg(long, default_value = "127.0.0.1:0")]
    admin_listen: SocketAddr,
    /// COUNT/WINDOW (e.g. 10/60s, 1000/1s) per key, or `off` (no admission: the baseline).
    #[arg(long, default_value = "100/1s", value_parser = parse_limit)]
    limit: LimitArg,
    /// What a bucket is keyed by: ip, path or header:NAME.
    #[arg(long, default_value = "ip", value_parser = |s: &str| s.parse::<KeyBy>())]
    key_by: KeyBy,
    /// When the service gives no decision: open (forward) or closed (503).
    #[arg(long, default_value = "open", value_parser = |s: &str| s.parse::<OnFailure>())]
    on_failure: OnFailure,
    /// Which client admits requests.
    #[arg(long, value_enum, default_value = "engine")]
    admission: AdmissionKind,
    /// Where the engine's core runs: hosted (a task on the proxy's own Tokio runtime,
    /// no thread hand-off per request) or pinned (a thread of its own on the last CPU).
    #[arg(long, value_enum, default_value = "hosted")]
    engine_core: EngineCore,
    /// Read the API key from this file instead of RATELIMITLY_API_KEY.
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Close a connection that has not sent a whole request head within DURATION
    /// (500ms, 10s, 1m): from accept for the first request, a silent connection too,
    /// and from the first byte of each later request.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    header_timeout: Duration,
    /// Close a keep-alive connection idle between requests for DURATION.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    idle_timeout: Duration,
    /// Answer 504 when the upstream sends no response head within DURATION.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    upstream_timeout: Duration,
    /// Client connections open at once; beyond it a new connection is accepted and
    /// closed at once (counted in rl_proxy_connections_refused_total, logged as a
    /// warning at most once a second).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Believe X-Forwarded-For / Forwarded (and, in forward-auth mode, X-Real-IP) from
    /// peers in CIDR (repeatable; an address alone is one host): the client is then
    /// the rightmost forwarded address that is not itself trusted. From any other peer
    /// those headers are ignored for keying.
    #[arg(long = "trust-forwarded", value_name = "CIDR", value_parser = parse_trusted)]
    trust_forwarded: Vec<TrustedProxies>,
}

fn parse_trusted(s: &str) -> Result<TrustedProxies, String> {
    s.parse::<TrustedProxies>().map_err(|e| e.to_string())
}

/// Every network of `lists`, in order.
fn merge_trusted<'a>(lists: impl IntoIterator<Item = &'a TrustedProxies>) -> TrustedProxies {
    let mut all = TrustedProxies::none();
    for net in lists.into_iter().flat_map(|t| t.nets()) {
        all = all.with(*net);
    }
    all
}

/// DURATION as in `--limit`'s WINDOW (one parser: `config::parse_duration`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    config::parse_duration(s)
}

#[derive(Clone, Copy, Debug)]
enum LimitArg {
    Off,
    On(Limit),
}

fn parse_limit(s: &str) -> Result<LimitArg, String> {
    if s == "off" {
        return Ok(LimitArg::Off);
    }
    s.parse::<Limit>()
        .map(LimitArg::On)
        .map_err(|e| e.to_string())
}

fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    s.parse()
        .map_err(|e: ratelimitly_engine::EndpointParseError| e.to_string())
}

/// Why the proxy could not start. Never carries the key.
#[derive(Debug)]
enum StartError {
    /// Bad arguments or key: exit 2.
    Usage(String),
    /// Anything else (bind, engine start): exit 1.
    Runtime(String),
}

fn main() -> ExitCode {
    init_tracing();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(StartError::Usage(m)) => {
            eprintln!("rl-proxy: {m}");
            ExitCode::from(2)
        }
        Err(StartError::Runtime(m)) => {
            eprintln!("rl-proxy: {m}");
            ExitCode::from(1)
        }
    }
}

fn init_tracing() {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::WARN);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .try_init();
}

/// What admits requests, once started.
enum Backend {
    Off,
    Engine(Engine),
    Official(ratelimitly::ApiKey),
}

fn run(cli: Cli) -> Result<(), StartError> {
    let table = match &cli.config {
        Some(path) => Some(config::load(path).map_err(StartError::Usage)?),
        None => None,
    };
    if cli.check {
        if let (Some(path), Some(t)) = (&cli.config, &table) {
            eprintln!(
                "rl-proxy: {}: ok ({} routes)",
                path.display(),
                t.route_count()
            );
        }
        return Ok(());
    }
    let upstream_uri = match &table {
        Some(t) => t.upstream.clone(),
        None => cli.upstream.clone(),
    };
    let limited = match &table {
        Some(t) => t.limited(),
        None => matches!(cli.limit, LimitArg::On(_)),
    };
    let proxy_metrics = ProxyMetrics::new();
    let upstream = match (cli.mode, upstream_uri) {
        (Mode::Proxy, None) => {
            return Err(StartError::Usage(
                "--upstream is required (or --config with an upstream)".into(),
            ));
        }
        (Mode::Proxy, Some(uri)) => {
            Upstream::new(&uri, cli.upstream_timeout, proxy_metrics.clone())
                .map_err(|e| StartError::Usage(e.to_string()))?
        }
        (Mode::ForwardAuth, _) if cli.upstream.is_some() => {
            return Err(StartError::Usage(
                "--mode forward-auth forwards nothing: no --upstream".into(),
            ));
        }
        (Mode::ForwardAuth, _) => Upstream::granting(proxy_metrics.clone()),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| StartError::Runtime(format!("runtime: {e}")))?;
    let backend = match limited {
        false => Backend::Off,
        true => {
            if cli.endpoints.is_empty() && cli.domain.is_none() {
                return Err(StartError::Usage(
                    "one of --endpoint or --domain is required".into(),
                ));
            }
            let text = ratelimitly_engine::key_source::read_key_text(cli.key_file.as_deref())
                .map_err(|e| StartError::Usage(e.to_string()))?;
            let key: ApiKey = text.parse().map_err(|e| StartError::Usage(e.to_string()))?;
            match cli.admission {
                AdmissionKind::Engine => {
                    let mut b = Engine::builder(key);
                    b = if cli.endpoints.is_empty() {
                        b.dns(DnsConfig {
                            domain: cli.domain.clone(),
                            server: cli.dns_server,
                        })
                    } else {
                        b.endpoints(cli.endpoints.clone())
                    };
                    if cli.engine_core == EngineCore::Hosted {
                        b = b.runtime(rt.handle().clone());
                    }
                    // Built outside the runtime: a pinned core's build() blocks until
                    // its thread has bound its socket.
                    let engine = b.build().map_err(|e| match e {
                        ratelimitly_engine::BuildError::Config(_)
                        | ratelimitly_engine::BuildError::Option(_) => {
                            StartError::Usage(e.to_string())
                        }
                        other => StartError::Runtime(other.to_string()),
                    })?;
                    Backend::Engine(engine)
                }
                AdmissionKind::Official => {
                    if cli.config.is_some() {
                        return Err(StartError::Usage(
                            "--config admits through the engine only (--admission engine)".into(),
                        ));
                    }
                    if cli.domain.is_none() {
                        return Err(StartError::Usage(
                            "--admission official needs --domain (the official client discovers servers through DNS)"
                                .into(),
                        ));
                    }
                    let official: ratelimitly::ApiKey = text
                        .expose()
                        .parse()
                        .map_err(|_| StartError::Usage("invalid API key".into()))?;
                    Backend::Official(official)
                }
            }
        }
    };
    let handle = match &backend {
        Backend::Engine(e) => Some(e.handle()),
        _ => None,
    };
    let official_key = match &backend {
        Backend::Official(k) => Some(k.clone()),
        _ => None,
    };
    let result = rt.block_on(serve_all(
        cli,
        upstream,
        handle,
        official_key,
        proxy_metrics,
        table,
    ));
    // the engine first (hosted cores stop on the runtime), letting decisions still in
    // flight finish (at most the horizon)
    if let Backend::Engine(e) = backend {
        rt.block_on(e.shutdown_graceful());
    }
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn serve_all(
    cli: Cli,
    upstream: Upstream,
    engine: Option<EngineHandle>,
    official_key: Option<ratelimitly::ApiKey>,
    proxy_metrics: Arc<ProxyMetrics>,
    table: Option<config::Table>,
) -> Result<(), StartError> {
    let limits = ConnLimits {
        timeouts: Timeouts {
            header: cli.header_timeout,
            idle: cli.idle_timeout,
        },
        max_connections: cli.max_connections as usize,
        metrics: proxy_metrics.clone(),
        deny_status: match cli.mode {
            Mode::Proxy => None,
            Mode::ForwardAuth => http::StatusCode::from_u16(cli.deny_status).ok(),
        },
        trusted: Arc::new(ArcSwap::from_pointee(merge_trusted(
            cli.trust_forwarded
                .iter()
                .chain(table.as_ref().map(|t| &t.trusted)),
        ))),
    };
    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| StartError::Runtime(format!("cannot listen on {}: {e}", cli.listen)))?;
    let admin = TcpListener::bind(cli.admin_listen)
        .await
        .map_err(|e| StartError::Runtime(format!("cannot listen on {}: {e}", cli.admin_listen)))?;
    let local = listener
        .local_addr()
        .map_err(|e| StartError::Runtime(e.to_string()))?;
    let admin_port = admin
        .local_addr()
        .map_err(|e| StartError::Runtime(e.to_string()))?
        .port();

    let (server, exporters) = if let Some(table) = table {
        let table = Arc::new(ArcSwap::from_pointee(table));
        if let Some(path) = cli.config.clone() {
            // registered before the readiness line: a SIGHUP from then on reloads
            let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;
            let reload = Reload {
                path,
                table: table.clone(),
                backend: engine.is_some(),
                trusted: limits.trusted.clone(),
                trusted_flags: merge_trusted(&cli.trust_forwarded),
            };
            tokio::spawn(reload_on_hangup(hup, reload));
        }
        let (layers, exporters) = match engine.clone() {
            Some(h) => {
                let open = AdmissionLayer::new(h.clone(), RouteClassify)
                    .failure_policy(FailurePolicy::all(OnFailure::Open));
                let closed = AdmissionLayer::new(h.clone(), RouteClassify)
                    .failure_policy(FailurePolicy::all(OnFailure::Closed));
                let exporters = vec![
                    Exporter::new(open.metrics()).with_engine(h),
                    Exporter::new(closed.metrics()),
                ];
                let layers = (open.layer(upstream.clone()), closed.layer(upstream.clone()));
                (Some(layers), exporters)
            }
            None => (None, vec![Exporter::new(LayerMetrics::new())]),
        };
        let router = Router {
            table,
            upstream,
            layers,
        };
        (tokio::spawn(serve(listener, router, limits)), exporters)
    } else {
        let failure = FailurePolicy::all(cli.on_failure);
        let metrics: Arc<LayerMetrics>;
        let server = match (cli.limit, engine.clone(), official_key) {
            (LimitArg::Off, _, _) => {
                metrics = LayerMetrics::new();
                tokio::spawn(serve(listener, upstream, limits))
            }
            (LimitArg::On(limit), Some(h), _) => {
                let layer = AdmissionLayer::new(h, keyed(limit, cli.key_by.clone()))
                    .failure_policy(failure);
                metrics = layer.metrics();
                tokio::spawn(serve(listener, layer.layer(upstream), limits))
            }
            (LimitArg::On(limit), None, Some(key)) => {
                let mut b = ratelimitly::Client::builder(key);
                if let Some(d) = &cli.domain {
                    b = b
                        .service_domain(d.clone())
                        .map_err(|e| StartError::Usage(format!("bad --domain: {e}")))?;
                }
                if let Some(s) = cli.dns_server {
                    b = b.dns_server(s);
                }
                let client = b
                    .build()
                    .await
                    .map_err(|e| StartError::Runtime(format!("official client: {e}")))?;
                let layer = AdmissionLayer::with_admission(
                    OfficialAdmission::new(client),
                    keyed(limit, cli.key_by.clone()),
                )
                .failure_policy(failure);
                metrics = layer.metrics();
                tokio::spawn(serve(listener, layer.layer(upstream), limits))
            }
            (LimitArg::On(_), None, None) => unreachable!("a backend exists when limiting"),
        };
        let mut exporter = Exporter::new(metrics);
        if let Some(h) = engine {
            exporter = exporter.with_engine(h);
        }
        (server, vec![exporter])
    };
    let admin_task = tokio::spawn(admin::serve(admin, exporters, proxy_metrics));
    let shutdown = Shutdown::register()?;

    println!(
        "{{\"event\":\"ready\",\"address\":\"{}\",\"port\":{},\"admin_port\":{}}}",
        local.ip(),
        local.port(),
        admin_port
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();

    shutdown.wait().await;
    server.abort();
    admin_task.abort();
    Ok(())
}

/// What a SIGHUP replaces.
struct Reload {
    path: PathBuf,
    table: Arc<ArcSwap<config::Table>>,
    /// An admission backend was started.
    backend: bool,
    /// The connections' trusted peers: the flags' and the file's.
    trusted: Arc<ArcSwap<TrustedProxies>>,
    trusted_flags: TrustedProxies,
}

/// Reloads the routes (and the file's `trust_forwarded`) on every SIGHUP; a file that
/// is refused leaves the running ones in place. Both outcomes are logged as warnings.
async fn reload_on_hangup(mut hup: tokio::signal::unix::Signal, r: Reload) {
    let Reload {
        path,
        table,
        backend,
        trusted,
        trusted_flags,
    } = r;
    while hup.recv().await.is_some() {
        let refused = "config reload refused, the running routes are kept";
        match config::load(&path) {
            Err(e) => tracing::warn!("{refused}: {e}"),
            Ok(t) if t.upstream != table.load().upstream => {
                tracing::warn!("{refused}: upstream cannot change on reload (restart to change it)")
            }
            Ok(t) if t.limited() && !backend => tracing::warn!(
                "{refused}: no admission backend was started (the file at start limited no route)"
            ),
            Ok(t) => {
                tracing::warn!(routes = t.route_count(), file = %path.display(), "config reloaded");
                trusted.store(Arc::new(merge_trusted([&trusted_flags, &t.trusted])));
                table.store(Arc::new(t));
            }
        }
    }
}

/// A limited route's service: the layer over the upstream.
type Limited = AdmissionService<Upstream, EngineAdmission, RouteClassify>;

/// The body of a routed response.
type RoutedBody = ResponseBody<ResponseBody<Incoming>>;

/// Routes each request by the current table (`--config`): an `off` route straight to
/// the upstream, a limited one through the layer whose failure policy it names.
#[derive(Clone)]
struct Router {
    table: Arc<ArcSwap<config::Table>>,
    upstream: Upstream,
    /// (fail-open, fail-closed); `None` when no admission backend was started.
    layers: Option<(Limited, Limited)>,
}

/// The route a request matched, set by [`Router`] for [`RouteClassify`].
#[derive(Clone)]
struct Matched(Arc<config::Route>);

/// What a routed request consumes: its route's limits, one token each, in one request.
struct RouteClassify;

impl<B> Classify<B> for RouteClassify {
    fn classify(&self, request: &Request<B>) -> Consumption {
        match request.extensions().get::<Matched>() {
            Some(m) => m.0.consumption(request),
            None => Consumption::new(),
        }
    }
}

impl tower_service::Service<Request<Incoming>> for Router {
    type Response = Response<RoutedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RoutedBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        let route = self
            .table
            .load()
            .find(req.method(), req.uri().path())
            .clone();
        if !route.limited() {
            let up = self.upstream.clone();
            return Box::pin(async move {
                let resp = up.oneshot(req).await?;
                Ok(resp.map(ResponseBody::inner))
            });
        }
        let Some((open, closed)) = &self.layers else {
            // not reached: a limited table is refused without a backend
            let mut r = Response::new(ResponseBody::local("no admission backend\n"));
            *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            return Box::pin(async move { Ok(r) });
        };
        let svc = if route.on_failure == OnFailure::Closed {
            closed.clone()
        } else {
            open.clone()
        };
        req.extensions_mut().insert(Matched(route));
        Box::pin(svc.oneshot(req))
    }
}

/// SIGTERM and SIGINT, registered when made (before the readiness line: a signal
/// sent as soon as it is read is handled, never the default action).
struct Shutdown {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Shutdown {
    fn register() -> Result<Self, StartError> {
        use tokio::signal::unix::{SignalKind, signal};
        let err = |e: std::io::Error| StartError::Runtime(format!("signal handler: {e}"));
        Ok(Shutdown {
            term: signal(SignalKind::terminate()).map_err(err)?,
            int: signal(SignalKind::interrupt()).map_err(err)?,
        })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The accept loop's limits.
struct ConnLimits {
    timeouts: Timeouts,
    max_connections: usize,
    metrics: Arc<ProxyMetrics>,
    /// `--mode forward-auth`: requests are decided as their original request, and a
    /// rejection (429) is answered with this status.
    deny_status: Option<http::StatusCode>,
    /// Peers whose forwarded headers are believed (replaced on SIGHUP).
    trusted: Arc<ArcSwap<TrustedProxies>>,
}

/// Accepts connections (at most `max_connections` open at once; more are closed at
/// once) and serves each with HTTP/1.1 keep-alive under the header and idle timeouts;
/// every request carries the client address as [`ClientAddr`].
async fn serve<S, B>(listener: TcpListener, svc: S, limits: ConnLimits)
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let timeouts = limits.timeouts;
    let tick = timeouts.tick();
    let deny_status = limits.deny_status;
    let mut last_warn: Option<Instant> = None;
    let mut refused_unlogged: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            limits.metrics.refused.fetch_add(1, Ordering::Relaxed);
            refused_unlogged += 1;
            if last_warn.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    refused = refused_unlogged,
                    "connection limit reached: new connections are closed at once"
                );
                last_warn = Some(Instant::now());
                refused_unlogged = 0;
            }
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = svc.clone();
        let metrics = limits.metrics.clone();
        let trusted = limits.trusted.clone();
        tokio::spawn(async move {
            metrics.open.fetch_add(1, Ordering::Relaxed);
            let clock = Clock::new();
            let svc_clock = clock.clone();
            let conn_svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let forward_auth = deny_status.is_some();
                let client = client_ip(peer, req.headers(), &trusted.load(), forward_auth);
                req.extensions_mut().insert(ClientAddr(client));
                if forward_auth {
                    original_request(&mut req);
                } else {
                    append_forwarded_for(req.headers_mut(), peer.ip());
                }
                svc_clock.request_started();
                let clock = svc_clock.clone();
                let answer = svc.clone().oneshot(req);
                async move {
                    let mut r = answer.await;
                    clock.request_done();
                    if let (Some(deny), Ok(resp)) = (deny_status, r.as_mut())
                        && resp.status() == http::StatusCode::TOO_MANY_REQUESTS
                    {
                        *resp.status_mut() = deny;
                    }
                    r
                }
            });
            let io = TokioIo::new(Watched::new(stream, clock.clone()));
            let mut builder = hyper::server::conn::http1::Builder::new();
            // the watchdog below owns the header and idle timeouts
            builder.header_read_timeout(None::<Duration>);
            let conn = builder.serve_connection(io, conn_svc);
            let mut conn = std::pin::pin!(conn);
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = tokio::time::sleep(tick) => match clock.expired(timeouts) {
                        Some(Expiry::Header) => {
                            metrics.header_timeouts.fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(%peer, "header timeout: connection closed");
                            break;
                        }
                        Some(Expiry::Idle) => {
                            metrics.idle_timeouts.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        None => {}
                    },
                }
            }
            metrics.open.fetch_sub(1, Ordering::Relaxed);
            drop(permit);
        });
    }
}
