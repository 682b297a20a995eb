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
//!     [--client-ip-from xff|forwarded|real-ip|peer]
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
//! nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth`, HAProxy (a Lua
//! action) or Envoy `ext_authz` (HTTP): `200` (empty body) when granted, `--deny-status` (default 429) with `Retry-After`
//! when rejected, and the failure policy otherwise (`open`: 200, `closed`: 503). The
//! request decided (route matching, `--key-by path`) is the original one, from
//! `X-Original-URI` / `X-Forwarded-Uri` and `X-Original-Method` /
//! `X-Forwarded-Method` (the shipped front proxy configurations overwrite or strip
//! those a client sends); the client address is the TCP peer unless it is trusted
//! (below).
//!
//! Who the client is, in every mode (`client::client_ip`, the rule of
//! `ratelimitly_tower::forwarded`): the TCP peer, unless the peer is in
//! `--trust-forwarded CIDR` (repeatable; the config file's `trust_forwarded` list adds
//! to it). From a trusted peer, only the header `--client-ip-from` names (the file's
//! `client_ip_from` when the flag is absent): `xff` (default) the rightmost
//! `X-Forwarded-For` address that is not itself trusted, `forwarded` the same in RFC
//! 7239 `Forwarded`, `real-ip` `X-Real-IP` when the `X-Forwarded-For` chain vouches for
//! it (else the peer), `peer` no header. A trusted peer's `X-Real-IP` that no chain
//! vouches for (`real-ip`; `xff` with no `X-Forwarded-For` at all: a front proxy that
//! sets only `X-Real-IP`) is counted in `rl_proxy_client_ip_unvouched_total` and warned
//! about. A header the client can also send is never believed on
//! its own: the proxy in front must write the one named (`proxy/README.md` has a tested
//! configuration for nginx, Caddy, Traefik, HAProxy and Envoy). In proxy mode the
//! upstream receives `X-Forwarded-For` with the TCP peer appended (an existing value
//! kept: `EXISTING, PEER`).
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
//! Envoy's rate limit service: `--mode rls` (feature `rls`, on by default) serves
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over h2c on `--listen`,
//! with rules from envoyproxy/ratelimit YAML files (`--config FILE`, repeatable, one
//! domain each; `--check` checks them, SIGHUP reloads them, a bad reload keeps the
//! running rules and logs why as a warning). `--on-failure open|closed` answers a call
//! without a decision OK or `OVER_LIMIT`; without it the call is gRPC `UNAVAILABLE`. The
//! library part `rl_proxy_rls::rls` documents the semantics.
//!
//! Modules: `cli` (the flags), `start` (key, engine, listeners, readiness line),
//! `config` (the route file), `routes` (the router and the reload), `serve` (the accept
//! loop), `conn` (timeouts and counters), `client` (the client address and the original
//! request), `upstream` (forwarding), `admin`, `official`, `rls_mode` (`--mode rls`).
//!
//! Owns: which mode runs, the admission backend of the proxy modes, their accept loop,
//! shutdown on SIGINT/SIGTERM. Must not touch: admission rules (the layer) and
//! forwarding (`upstream`).

mod admin;
mod cli;
mod client;
mod config;
mod conn;
mod official;
#[cfg(feature = "rls")]
mod rls_mode;
mod routes;
mod serve;
mod start;
mod upstream;

use std::process::ExitCode;
use std::sync::Arc;

use arc_swap::ArcSwap;
use clap::Parser;
use ratelimitly_engine::{Engine, EngineHandle};
use ratelimitly_tower::{AdmissionLayer, Exporter, FailurePolicy, LayerMetrics, OnFailure, keyed};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::Layer;

use crate::cli::{AdmissionKind, Cli, ClientFlags, LimitArg, Mode};
use crate::conn::{ProxyMetrics, Timeouts};
use crate::official::OfficialAdmission;
use crate::routes::{Reload, RouteClassify, Router, reload_on_hangup};
use crate::serve::{ConnLimits, Shutdown, serve};
use crate::start::StartError;
use crate::upstream::Upstream;

/// mimalloc, as in the responder and loadgen: a proxied request allocates a few dozen
/// small blocks (hyper's buffers and futures, the upstream request). Under
/// `proxy/bench/run.sh`'s load, glibc's malloc and free took about 2.0 µs of CPU per
/// engine-admitted request and 0.6 with `--limit off` (`perf record -e cpu-clock`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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

/// What admits the proxy modes' requests, once started.
enum Backend {
    /// Nothing: no route is limited.
    Off,
    Engine(Engine),
    Official(ratelimitly::ApiKey),
}

/// Starts the mode the flags name and runs it until SIGINT or SIGTERM.
fn run(cli: Cli) -> Result<(), StartError> {
    #[cfg(feature = "rls")]
    if cli.mode == Mode::Rls {
        return rls_mode::run(cli);
    }
    let table = load_table(&cli)?;
    if cli.check {
        if let (Some(path), Some(t)) = (cli.config.first(), &table) {
            eprintln!(
                "rl-proxy: {}: ok ({} routes)",
                path.display(),
                t.route_count()
            );
        }
        return Ok(());
    }
    let limited = match &table {
        Some(t) => t.limited(),
        None => matches!(cli.limit, LimitArg::On(_)),
    };
    let proxy_metrics = ProxyMetrics::new();
    let upstream = upstream(&cli, table.as_ref(), &proxy_metrics)?;
    let rt = start::runtime()?;
    let backend = if limited {
        start_backend(&cli, &rt)?
    } else {
        Backend::Off
    };
    let result = rt.block_on(serve_all(cli, upstream, &backend, proxy_metrics, table));
    let engine = match backend {
        Backend::Engine(e) => Some(e),
        _ => None,
    };
    start::stop(rt, engine);
    result
}

/// The route file of `--config`, if given (once, without `--on-failure`: the file says
/// it).
fn load_table(cli: &Cli) -> Result<Option<config::Table>, StartError> {
    match cli.config.as_slice() {
        [] => Ok(None),
        [_] if cli.on_failure.is_some() => Err(StartError::Usage(
            "the argument '--config <CONFIG>' cannot be used with '--on-failure <ON_FAILURE>' \
             (the route file sets on_failure)"
                .into(),
        )),
        [path] => config::load(path).map(Some).map_err(StartError::Usage),
        _ => Err(StartError::Usage(
            "--config takes one route file (several files are for --mode rls)".into(),
        )),
    }
}

/// Where granted requests go: the upstream, or (`--mode forward-auth`) nowhere.
fn upstream(
    cli: &Cli,
    table: Option<&config::Table>,
    metrics: &Arc<ProxyMetrics>,
) -> Result<Upstream, StartError> {
    let uri = match table {
        Some(t) => t.upstream.clone(),
        None => cli.upstream.clone(),
    };
    match (cli.mode, uri) {
        (Mode::Proxy, None) => Err(StartError::Usage(
            "--upstream is required (or --config with an upstream)".into(),
        )),
        (Mode::Proxy, Some(uri)) => Upstream::new(&uri, cli.upstream_timeout, metrics.clone())
            .map_err(|e| StartError::Usage(e.to_string())),
        (_, _) if cli.upstream.is_some() => Err(StartError::Usage(
            "--mode forward-auth forwards nothing: no --upstream".into(),
        )),
        (_, _) => Ok(Upstream::granting(metrics.clone())),
    }
}

/// The admission backend of a limited proxy: the engine, or the official client's key.
fn start_backend(cli: &Cli, rt: &tokio::runtime::Runtime) -> Result<Backend, StartError> {
    let text = start::key_text(cli)?;
    match cli.admission {
        AdmissionKind::Engine => {
            let key = text.parse().map_err(|e| StartError::Usage(e.to_string()))?;
            Ok(Backend::Engine(start::engine(cli, key, rt)?))
        }
        AdmissionKind::Official if !cli.config.is_empty() => Err(StartError::Usage(
            "--config admits through the engine only (--admission engine)".into(),
        )),
        AdmissionKind::Official if cli.domain.is_none() => Err(StartError::Usage(
            "--admission official needs --domain (the official client discovers servers through DNS)"
                .into(),
        )),
        AdmissionKind::Official => text
            .expose()
            .parse()
            .map(Backend::Official)
            .map_err(|_| StartError::Usage("invalid API key".into())),
    }
}

/// The accept loop's limits from the flags (and the route file's client rule).
fn conn_limits(
    cli: &Cli,
    metrics: &Arc<ProxyMetrics>,
    table: Option<&config::Table>,
) -> ConnLimits {
    ConnLimits {
        timeouts: Timeouts {
            header: cli.header_timeout,
            idle: cli.idle_timeout,
        },
        max_connections: cli.max_connections as usize,
        metrics: metrics.clone(),
        deny_status: match cli.mode {
            Mode::ForwardAuth => http::StatusCode::from_u16(cli.deny_status).ok(),
            _ => None,
        },
        client_rule: Arc::new(ArcSwap::from_pointee(ClientFlags::of(cli).rule(table))),
    }
}

/// A server task and the exporters of its admin page.
type Serving = (JoinHandle<()>, Vec<Exporter>);

/// The proxy modes: the listeners, the admin page, the readiness line, then serving
/// until SIGINT or SIGTERM.
async fn serve_all(
    cli: Cli,
    upstream: Upstream,
    backend: &Backend,
    proxy_metrics: Arc<ProxyMetrics>,
    table: Option<config::Table>,
) -> Result<(), StartError> {
    let limits = conn_limits(&cli, &proxy_metrics, table.as_ref());
    let (listener, local) = start::bind(cli.listen).await?;
    let (admin, admin_addr) = start::bind(cli.admin_listen).await?;
    let engine = match backend {
        Backend::Engine(e) => Some(e.handle()),
        _ => None,
    };
    let (server, exporters) = match table {
        Some(table) => serve_routes(&cli, table, upstream, engine, listener, limits)?,
        None => serve_one_route(&cli, upstream, backend, engine, listener, limits).await?,
    };
    let page = proxy_metrics.clone();
    let admin_task = tokio::spawn(admin::serve(
        admin,
        exporters,
        Arc::new(move |out: &mut String| page.encode(out)),
    ));
    let shutdown =
        Shutdown::register().map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;
    start::print_ready(local, admin_addr);
    shutdown.wait().await;
    server.abort();
    admin_task.abort();
    Ok(())
}

/// `--config`: the router over the route table, reloaded on SIGHUP.
fn serve_routes(
    cli: &Cli,
    table: config::Table,
    upstream: Upstream,
    engine: Option<EngineHandle>,
    listener: TcpListener,
    limits: ConnLimits,
) -> Result<Serving, StartError> {
    let table = Arc::new(ArcSwap::from_pointee(table));
    if let Some(path) = cli.config.first().cloned() {
        // registered before the readiness line: a SIGHUP from then on reloads
        let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;
        let reload = Reload {
            path,
            table: table.clone(),
            backend: engine.is_some(),
            client_rule: limits.client_rule.clone(),
            client_flags: ClientFlags::of(cli),
        };
        tokio::spawn(reload_on_hangup(hup, reload));
    }
    let (layers, exporters) = match engine {
        Some(h) => {
            let layer = |on: OnFailure| {
                AdmissionLayer::new(h.clone(), RouteClassify).failure_policy(FailurePolicy::all(on))
            };
            let (open, closed) = (layer(OnFailure::Open), layer(OnFailure::Closed));
            let exporters = vec![
                Exporter::new(open.metrics()).with_engine(h.clone()),
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
    Ok((tokio::spawn(serve(listener, router, limits)), exporters))
}

/// The one-route flags (`--limit`, `--key-by`, `--on-failure`): the layer over the
/// upstream, or the upstream alone with `--limit off`.
async fn serve_one_route(
    cli: &Cli,
    upstream: Upstream,
    backend: &Backend,
    engine: Option<EngineHandle>,
    listener: TcpListener,
    limits: ConnLimits,
) -> Result<Serving, StartError> {
    let failure = FailurePolicy::all(cli.on_failure.unwrap_or(OnFailure::Open));
    let (server, metrics) = match (backend, cli.limit) {
        (Backend::Engine(e), LimitArg::On(limit)) => {
            let layer = AdmissionLayer::new(e.handle(), keyed(limit, cli.key_by.clone()))
                .failure_policy(failure);
            let m = layer.metrics();
            (
                tokio::spawn(serve(listener, layer.layer(upstream), limits)),
                m,
            )
        }
        (Backend::Official(key), LimitArg::On(limit)) => {
            let client = official_client(cli, key.clone()).await?;
            let layer = AdmissionLayer::with_admission(
                OfficialAdmission::new(client),
                keyed(limit, cli.key_by.clone()),
            )
            .failure_policy(failure);
            let m = layer.metrics();
            (
                tokio::spawn(serve(listener, layer.layer(upstream), limits)),
                m,
            )
        }
        // `--limit off`: no backend was started
        _ => (
            tokio::spawn(serve(listener, upstream, limits)),
            LayerMetrics::new(),
        ),
    };
    let mut exporter = Exporter::new(metrics);
    if let Some(h) = engine {
        exporter = exporter.with_engine(h);
    }
    Ok((server, vec![exporter]))
}

/// The official client of `--admission official` (DNS discovery of `--domain`).
async fn official_client(
    cli: &Cli,
    key: ratelimitly::ApiKey,
) -> Result<ratelimitly::Client, StartError> {
    let mut b = ratelimitly::Client::builder(key);
    if let Some(d) = &cli.domain {
        b = b
            .service_domain(d.clone())
            .map_err(|e| StartError::Usage(format!("bad --domain: {e}")))?;
    }
    if let Some(s) = cli.dns_server {
        b = b.dns_server(s);
    }
    b.build()
        .await
        .map_err(|e| StartError::Runtime(format!("official client: {e}")))
}
