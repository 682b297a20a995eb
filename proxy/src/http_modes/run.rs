//! The start of an HTTP mode (`--mode proxy`, `--mode forward-auth`): the route file,
//! the admission backend (the engine, or the official client), the layers over the
//! upstream or the grant, the admin page, the readiness line, serving until SIGINT or
//! SIGTERM.
//!
//! Owns: the admission backend of the HTTP modes and how their parts are wired. Must not
//! touch: admission rules (the layer), forwarding (`upstream`), the accept loop
//! (`serve`).

use std::sync::Arc;

use arc_swap::ArcSwap;
use ratelimitly_engine::{ApiKey, Engine, EngineHandle};
use ratelimitly_tower::{AdmissionLayer, Exporter, FailurePolicy, LayerMetrics, OnFailure, keyed};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::Layer;

use crate::admin;
use crate::cli::{AdmissionKind, Cli, ClientFlags, LimitArg, Mode};
use crate::config;
use crate::health::{self, Health, Watch};
use crate::http_modes::conn::{ProxyMetrics, Timeouts};
use crate::http_modes::official::OfficialAdmission;
use crate::http_modes::route_metrics::RouteMetrics;
use crate::http_modes::routes::{Reload, RouteClassify, Router, reload_on_hangup};
use crate::http_modes::serve::{ConnLimits, serve};
use crate::http_modes::upstream::Upstream;
use crate::start::{self, Shutdown, StartError};

/// What admits the proxy modes' requests, once started.
enum Backend {
    /// Nothing: no route is limited.
    Off,
    /// The engine, and the key its diagnosis probes with.
    Engine(Engine, ApiKey),
    Official(ratelimitly::ApiKey),
}

/// What the granted requests of an HTTP mode go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// `--mode proxy`: the upstream.
    Upstream,
    /// `--mode forward-auth`: nowhere; a grant is answered `200`.
    Grant,
}

/// Starts an HTTP mode and runs it until SIGINT or SIGTERM (with `--check`, checks the
/// route file and returns).
pub fn run(cli: Cli, target: Target) -> Result<(), StartError> {
    let table = load_table(&cli)?;
    if cli.check {
        if let (Some(path), Some(t)) = (cli.config.first(), &table) {
            if target == Target::Upstream && t.upstream.is_none() {
                return Err(StartError::Usage(format!(
                    "{}: proxy mode needs an upstream: add upstream = \"http://HOST:PORT\" to \
                     the file (--mode forward-auth needs none)",
                    path.display()
                )));
            }
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
    let upstream = upstream(&cli, target, table.as_ref(), &proxy_metrics)?;
    let rt = start::runtime()?;
    let backend = if limited {
        start_backend(&cli, &rt)?
    } else {
        Backend::Off
    };
    let result = rt.block_on(serve_all(cli, upstream, &backend, proxy_metrics, table));
    let engine = match backend {
        Backend::Engine(e, _) => Some(e),
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
    target: Target,
    table: Option<&config::Table>,
    metrics: &Arc<ProxyMetrics>,
) -> Result<Upstream, StartError> {
    let uri = match table {
        Some(t) => t.upstream.clone(),
        None => cli.upstream.clone(),
    };
    match (target, uri) {
        (Target::Upstream, None) => Err(StartError::Usage(match cli.config.first() {
            Some(path) => format!(
                "{}: proxy mode needs an upstream: add upstream = \"http://HOST:PORT\" to the \
                 file (--mode forward-auth needs none)",
                path.display()
            ),
            None => "--upstream is required (or --config with an upstream)".into(),
        })),
        (Target::Upstream, Some(uri)) => Upstream::new(&uri, cli.upstream_timeout, metrics.clone())
            .map_err(|e| StartError::Usage(e.to_string())),
        (Target::Grant, _) => Ok(Upstream::granting(metrics.clone())),
    }
}

/// The admission backend of a limited proxy: the engine, or the official client's key.
fn start_backend(cli: &Cli, rt: &tokio::runtime::Runtime) -> Result<Backend, StartError> {
    let text = start::key_text(cli)?;
    match cli.admission {
        AdmissionKind::Engine => {
            let key: ApiKey = text.parse().map_err(|e| StartError::Usage(e.to_string()))?;
            Ok(Backend::Engine(start::engine(cli, key.clone(), rt)?, key))
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
        Backend::Engine(e, _) => Some(e.handle()),
        _ => None,
    };
    let routes = RouteMetrics::new();
    let (server, exporters) = match table {
        Some(mut table) => {
            table.count_routes_in(&routes);
            serve_routes(
                &cli,
                table,
                upstream,
                engine.clone(),
                listener,
                limits,
                &routes,
            )?
        }
        None => {
            let one = (backend, &*routes);
            serve_one_route(&cli, upstream, one, engine.clone(), listener, limits).await?
        }
    };
    let health = Health::new();
    let monitor = match (backend, engine) {
        (Backend::Engine(_, key), Some(engine)) => Some(
            health::start(Watch {
                layers: exporters.iter().map(Exporter::metrics).collect(),
                engine,
                key: key.clone(),
                health: health.clone(),
            })
            .await,
        ),
        _ => None,
    };
    let page = proxy_metrics.clone();
    let admin_task = tokio::spawn(admin::serve(
        admin,
        admin::Page {
            exporters,
            own: Arc::new(move |out: &mut String| {
                page.encode(out);
                routes.encode(out);
            }),
            health,
            extra: None,
        },
    ));
    let shutdown =
        Shutdown::register().map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;
    start::print_ready(local, admin_addr);
    shutdown.wait().await;
    server.abort();
    admin_task.abort();
    if let Some(m) = monitor {
        m.abort();
    }
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
    route_metrics: &Arc<RouteMetrics>,
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
            route_metrics: route_metrics.clone(),
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
    (backend, routes): (&Backend, &RouteMetrics),
    engine: Option<EngineHandle>,
    listener: TcpListener,
    limits: ConnLimits,
) -> Result<Serving, StartError> {
    let failure = FailurePolicy::all(cli.on_failure.unwrap_or(OnFailure::Open));
    let (server, metrics) = match (backend, cli.limit) {
        (Backend::Engine(e, _), LimitArg::On(limit)) => {
            let keyed = keyed(limit, cli.key_by.clone()).also_count_in(routes.of("default"));
            let layer = AdmissionLayer::new(e.handle(), keyed).failure_policy(failure);
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
                keyed(limit, cli.key_by.clone()).also_count_in(routes.of("default")),
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
