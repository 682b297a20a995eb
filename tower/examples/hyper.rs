//! A plain hyper 1 server limited by Ratelimitly: every path at 5 requests per 10 s per
//! client IP (the peer address goes into the request as `ClientAddr`), `/health`
//! unlimited.
//!
//! Environment: `RATELIMITLY_API_KEY`, `RATELIMITLY_ENDPOINTS` (`ID@IP:PORT,...`),
//! `LISTEN` (default `127.0.0.1:0`). Prints
//! `{"event":"ready","address":"127.0.0.1","port":N}` on stdout once listening.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::{
    AdmissionLayer, ClientAddr, Engine, KeyBy, Limit, key_from_env, keyed, parse_endpoints,
};
use tower::{Layer, ServiceExt};

async fn app(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let body = if req.uri().path() == "/health" {
        "healthy\n"
    } else {
        "ok\n"
    };
    Ok(Response::new(Full::new(Bytes::from_static(
        body.as_bytes(),
    ))))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let key = key_from_env()?;
    let endpoints = parse_endpoints(&std::env::var("RATELIMITLY_ENDPOINTS").unwrap_or_default())?;
    let listen: SocketAddr = std::env::var("LISTEN")
        .unwrap_or_else(|_| "127.0.0.1:0".to_owned())
        .parse()?;
    let engine = Engine::builder(key)
        .endpoints(endpoints)
        .build_async()
        .await?;
    let limit = Limit::new(5, Duration::from_secs(10))?;
    // The layer owns the engine.
    let limited =
        AdmissionLayer::new(engine, keyed(limit, KeyBy::ClientIp)).layer(tower::service_fn(app));

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
    loop {
        let (stream, peer) = listener.accept().await?;
        let limited = limited.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let limited = limited.clone();
                async move {
                    if req.uri().path() == "/health" {
                        return app(req)
                            .await
                            .map(|r| r.map(ratelimitly_tower::ResponseBody::inner));
                    }
                    req.extensions_mut().insert(ClientAddr(peer));
                    limited.oneshot(req).await
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
