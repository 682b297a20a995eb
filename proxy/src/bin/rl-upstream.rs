//! `rl-upstream`: a minimal HTTP/1.1 upstream for tests and the proxy benchmark. Every
//! request gets `200` with a short body; `/slow/MS` answers after MS milliseconds;
//! `/echo/...` answers the request's `X-Forwarded-For` (one line, empty when absent).
//!
//! Prints `{"event":"ready","address":"IP","port":N}` once listening; exits 0 on
//! SIGINT/SIGTERM.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

const BODY: &[u8] = b"hello from upstream\n";

async fn handle(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(ms) = req.uri().path().strip_prefix("/slow/")
        && let Ok(ms) = ms.parse::<u64>()
    {
        tokio::time::sleep(Duration::from_millis(ms.min(10_000))).await;
    }
    if req.uri().path().starts_with("/echo/") {
        let xff = req
            .headers()
            .get("x-forwarded-for")
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default();
        return Ok(Response::new(Full::new(Bytes::from(xff))));
    }
    Ok(Response::new(Full::new(Bytes::from_static(BODY))))
}

fn main() -> std::process::ExitCode {
    let listen: SocketAddr = match std::env::args().nth(1).as_deref() {
        None => SocketAddr::from(([127, 0, 0, 1], 0)),
        Some(a) => match a.trim_start_matches("--listen=").parse() {
            Ok(a) => a,
            Err(_) => {
                eprintln!("usage: rl-upstream [--listen=IP:PORT]");
                return std::process::ExitCode::from(2);
            }
        },
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rl-upstream: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    rt.block_on(async move {
        let listener = match TcpListener::bind(listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("rl-upstream: cannot listen on {listen}: {e}");
                return std::process::ExitCode::from(1);
            }
        };
        let local = listener.local_addr().expect("bound");
        // registered before the readiness line: a SIGTERM sent once it is read is handled
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("signal handler");
        println!(
            "{{\"event\":\"ready\",\"address\":\"{}\",\"port\":{}}}",
            local.ip(),
            local.port()
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let accept = async {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), hyper::service::service_fn(handle))
                        .await;
                });
            }
        };
        tokio::select! {
            _ = accept => {}
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        std::process::ExitCode::SUCCESS
    })
}
