//! An axum 0.8 app limited by Ratelimitly: `/api` at 5 requests per 10 s per client IP,
//! `/health` unlimited, `/metrics` in the Prometheus text format.
//!
//! ```text
//! RATELIMITLY_API_KEY=... RATELIMITLY_ENDPOINTS=7@127.0.0.1:9000 \
//!     cargo run --release -p ratelimitly-tower --example axum
//! ```
//!
//! Environment: `RATELIMITLY_API_KEY` (the key), `RATELIMITLY_ENDPOINTS`
//! (comma-separated `ID@IP:PORT`; the id must be the server's id), `LISTEN` (default
//! `127.0.0.1:0`). Once listening it prints one line on stdout,
//! `{"event":"ready","address":"127.0.0.1","port":N}`; logs go to stderr. When the
//! service is gone requests are let through (fail-open) and a warning is logged.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use ratelimitly_tower::{
    AdmissionLayer, CONTENT_TYPE, Cores, Engine, Exporter, KeyBy, Limit, key_from_env, keyed,
    parse_endpoints, verify,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();

    let key = key_from_env()?;
    let endpoints = parse_endpoints(&std::env::var("RATELIMITLY_ENDPOINTS").unwrap_or_default())?;
    if endpoints.is_empty() {
        return Err("RATELIMITLY_ENDPOINTS is empty: set ID@IP:PORT[,ID@IP:PORT...]".into());
    }
    let listen: SocketAddr = std::env::var("LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:0".to_owned())
        .parse()?;

    // A startup check: each endpoint that does not answer validly is logged (the app
    // still starts, and fails open while the service is unreachable).
    for check in verify(&key, &endpoints).await {
        if let Some(problem) = &check.problem {
            tracing::warn!(endpoint = %check.endpoint, %problem, "endpoint check failed");
        }
    }

    // Pinned: the engine's core runs on a thread of its own (build_async does not block
    // the runtime). The layer owns the engine and keeps it running.
    let engine = Arc::new(
        Engine::builder(key)
            .endpoints(endpoints)
            .cores(Cores::Count(1))
            .build_async()
            .await?,
    );
    let limit = Limit::new(5, Duration::from_secs(10))?;
    let layer = AdmissionLayer::new(&engine, keyed(limit, KeyBy::ClientIp).prefix("api"));
    let exporter = Exporter::new(layer.metrics()).with_engine(engine.handle());

    let app = Router::new()
        .route("/api", get(|| async { "ok\n" }).layer(layer))
        .route("/health", get(|| async { "healthy\n" }))
        .route(
            "/metrics",
            get(move || {
                let exporter = exporter.clone();
                async move {
                    let text = tokio::task::spawn_blocking(move || exporter.encode())
                        .await
                        .unwrap_or_default();
                    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
                }
            }),
        );
    drop(engine); // the layer holds its own reference

    let listener = tokio::net::TcpListener::bind(listen).await?;
    let local = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "{{\"event\":\"ready\",\"address\":\"{}\",\"port\":{}}}",
            local.ip(),
            local.port()
        )?;
        out.flush()?;
    }
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
