//! `--mode rls`: Envoy's rate limit service, started from the flags: the YAML files
//! checked against the API key, the engine, the gRPC listener, the admin page, reloads
//! (SIGHUP, and the files watched), the readiness line, shutdown.
//!
//! Owns: the mode's flags and its start. Must not touch: the service's semantics
//! (the other modules of `rls`).

use std::sync::Arc;
use std::time::Duration;

use crate::rls::env::Settings;
use crate::rls::{self, Bounds, RateLimiter, Reload, RlsMetrics, Rules};
use arc_swap::ArcSwap;
use ratelimitly_engine::{ApiKey, EngineHandle};
use ratelimitly_tower::{Exporter, LayerMetrics};

use crate::admin;
use crate::cli::{AdmissionKind, Cli};
use crate::health::{self, Health, Watch};
use crate::start::Shutdown;
use crate::start::{self, StartError};

/// Runs `--mode rls` until SIGINT or SIGTERM (or, with `--check`, checks the files).
pub fn run(cli: Cli) -> Result<(), StartError> {
    run_with(cli, Settings::default())
}

/// [`run`], with the settings of envoyproxy/ratelimit's environment variables
/// ([`rls::env::apply`]).
pub fn run_with(mut cli: Cli, settings: Settings) -> Result<(), StartError> {
    if cli.config.is_empty() {
        cli.config.extend(runtime_dir());
    }
    check_flags(&cli)?;
    let metrics = RlsMetrics::new();
    if cli.check {
        let rules =
            rls::load(&cli.config, Bounds::default(), &metrics).map_err(StartError::Usage)?;
        let files = rls::config::files(&cli.config).map_err(StartError::Usage)?;
        eprintln!(
            "rl-proxy: {} file(s) ok ({} domains, {} rules)",
            files.len(),
            rules.domains.len(),
            rules.rule_count()
        );
        return Ok(());
    }
    let text = start::key_text(&cli)?;
    let key: ApiKey = text.parse().map_err(|e| StartError::Usage(e.to_string()))?;
    let bounds = Bounds {
        window_max: Some(Duration::from_millis(u64::from(
            key.quotas().rate_window_size_ms_max,
        ))),
    };
    let rules = rls::load(&cli.config, bounds, &metrics).map_err(StartError::Usage)?;
    let rt = start::runtime()?;
    let engine = start::engine(&cli, key.clone(), &rt)?;
    let result = rt.block_on(serve_rls(
        &cli,
        (engine.handle(), key),
        rules,
        bounds,
        metrics,
        settings,
    ));
    start::stop(rt, Some(engine));
    result
}

/// envoyproxy/ratelimit's layout, without `--config`: the YAML files in
/// `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY` (`config` when unset),
/// when `RUNTIME_ROOT` is set (its default there, `/srv/runtime_data/current`, is not
/// assumed: without either, `--config` is asked for).
fn runtime_dir() -> Option<std::path::PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let mut dir = std::path::PathBuf::from(var("RUNTIME_ROOT")?);
    if let Some(sub) = var("RUNTIME_SUBDIRECTORY") {
        dir.push(sub);
    }
    dir.push(var("RUNTIME_APPDIRECTORY").unwrap_or_else(|| "config".into()));
    Some(dir)
}

/// The flags `--mode rls` refuses, and the one it needs.
fn check_flags(cli: &Cli) -> Result<(), StartError> {
    let refuse = |m: &str| Err(StartError::Usage(m.into()));
    if cli.config.is_empty() {
        return refuse(
            "--mode rls needs --config FILE.yaml (envoyproxy/ratelimit's format, one domain per file; repeatable) or RUNTIME_ROOT (the files in $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY)",
        );
    }
    if cli.upstream.is_some() {
        return refuse("--mode rls forwards nothing: no --upstream");
    }
    if cli.admission == AdmissionKind::Official {
        return refuse("--mode rls decides through the engine only (--admission engine)");
    }
    Ok(())
}

/// Listeners, reloads, the service and the admin page; serves until SIGINT or SIGTERM.
async fn serve_rls(
    cli: &Cli,
    (engine, key): (EngineHandle, ApiKey),
    rules: Rules,
    bounds: Bounds,
    metrics: Arc<RlsMetrics>,
    settings: Settings,
) -> Result<(), StartError> {
    let (listener, local) = start::bind(cli.listen).await?;
    let (admin, admin_addr) = start::bind(cli.admin_listen).await?;
    let rules = Arc::new(ArcSwap::from_pointee(rules));
    // registered before the readiness line: a SIGHUP from then on reloads
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;
    let reload = Arc::new(Reload {
        paths: cli.config.clone(),
        bounds,
        rules: rules.clone(),
        metrics: metrics.clone(),
    });
    let watcher = rls::watch::watch(reload.clone()).map_err(StartError::Usage)?;
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            reload.reload();
        }
    });
    let layer = LayerMetrics::new();
    let service = RateLimiter::new(
        rules,
        engine.clone(),
        cli.on_failure,
        metrics.clone(),
        layer.clone(),
    )
    .with_env(&settings);
    let health = Health::new();
    let reporter = tonic_health::server::HealthReporter::new();
    let ready = health.clone();
    let reporting = tokio::spawn(rls::report_health(reporter.clone(), move || {
        ready.ready().is_ok()
    }));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(rls::serve(
        listener,
        service.clone(),
        Some(reporter),
        async move {
            let _ = stopped.await;
        },
    ));
    let monitor = health::start(Watch {
        layers: vec![layer.clone()],
        engine: engine.clone(),
        key,
        health: health.clone(),
    })
    .await;
    let admin_task = tokio::spawn(admin::serve(
        admin,
        admin::Page {
            exporters: vec![Exporter::new(layer).with_engine(engine)],
            own: Arc::new(move |out: &mut String| metrics.encode(out)),
            health,
            extra: Some(Arc::new(rls::service::AdminRoutes(service))),
        },
    ));
    let shutdown =
        Shutdown::register().map_err(|e| StartError::Runtime(format!("signal handler: {e}")))?;
    start::print_ready(local, admin_addr);
    shutdown.wait().await;
    // calls in flight finish (at most the horizon); connections still open then are
    // closed
    let _ = stop.send(());
    if tokio::time::timeout(Duration::from_secs(1), &mut server)
        .await
        .is_err()
    {
        server.abort();
    }
    admin_task.abort();
    monitor.abort();
    watcher.abort();
    reporting.abort();
    Ok(())
}
