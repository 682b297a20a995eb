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
//! Modules: `cli` (the flags), `config` (the route file), `routes` (the router and the
//! reload), `serve` (the accept loop), `conn` (timeouts and counters), `client` (the
//! client address and the original request), `upstream` (forwarding), `admin`,
//! `official`.
//!
//! Owns: starting: key loading (environment or `--key-file`, never the command line,
//! never echoed), the admission backend, the listeners, the readiness line, shutdown
//! on SIGINT/SIGTERM. Must not touch: admission rules (the layer) and forwarding
//! (`upstream`).

mod admin;
mod cli;
mod client;
mod config;
mod conn;
mod official;
mod routes;
mod serve;
mod upstream;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use clap::Parser;
use ratelimitly_engine::{ApiKey, DnsConfig, Engine, EngineHandle};
use ratelimitly_tower::{AdmissionLayer, Exporter, FailurePolicy, LayerMetrics, OnFailure, keyed};
use tokio::net::TcpListener;
use tower::Layer;

use crate::cli::{AdmissionKind, Cli, ClientFlags, EngineCore, LimitArg, Mode};
use crate::conn::{ProxyMetrics, Timeouts};
use crate::official::OfficialAdmission;
use crate::routes::{Reload, RouteClassify, Router, reload_on_hangup};
use crate::serve::{ConnLimits, Shutdown, serve};
use crate::upstream::Upstream;

/// Why the proxy could not start. Never carries the key.
#[derive(Debug)]
enum StartError {
    /// Bad arguments or key: exit 2.
    Usage(String),
    /// Anything else (bind, engine start): exit 1.
    Runtime(String),
}

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
        client_rule: Arc::new(ArcSwap::from_pointee(
            ClientFlags::of(&cli).rule(table.as_ref()),
        )),
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
                client_rule: limits.client_rule.clone(),
                client_flags: ClientFlags::of(&cli),
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
    let shutdown =
        Shutdown::register().map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;

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
