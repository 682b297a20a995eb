//! The admin listener: `GET /metrics` (Prometheus text format) and `GET /healthz`.
//!
//! Owns: the admin routes. Must not touch: proxied traffic, admission.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::{CONTENT_TYPE, Exporter};
use tokio::net::TcpListener;

use crate::conn::ProxyMetrics;

/// Serves the admin routes on `listener` until the task is aborted.
pub async fn serve(listener: TcpListener, exporter: Exporter, proxy: Arc<ProxyMetrics>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let exporter = exporter.clone();
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let exporter = exporter.clone();
                let proxy = proxy.clone();
                async move { Ok::<_, Infallible>(route(req, exporter, proxy).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

async fn route(
    req: Request<Incoming>,
    exporter: Exporter,
    proxy: Arc<ProxyMetrics>,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            // Reading the engine's statistics may block briefly: off the async workers.
            let encode = move || {
                let mut page = exporter.encode();
                proxy.encode(&mut page);
                page
            };
            match tokio::task::spawn_blocking(encode).await {
                Ok(body) => text(StatusCode::OK, CONTENT_TYPE, body),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    "metrics unavailable\n",
                ),
            }
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        ),
    }
}
