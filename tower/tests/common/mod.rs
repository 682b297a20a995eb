//! Test helpers shared by the tower crate's integration tests.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::{ApiKey, ClientAddr, Cores, Endpoint, Engine};
use rl_responder::{Faults, ResponderConfig, ResponderHandle};
use tower::{Service, ServiceExt};

/// The public fixture key the test responders accept.
pub const NONE_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";

pub fn key() -> ApiKey {
    NONE_KEY.parse().unwrap()
}

/// A responder with id `server_id` and `faults`, on `listen` or a fresh loopback port.
fn spawn(server_id: u64, faults: Faults, listen: Option<SocketAddr>) -> ResponderHandle {
    let mut cfg = ResponderConfig::new(vec![key()]);
    cfg.server_id = Some(server_id);
    cfg.faults = faults;
    if let Some(l) = listen {
        cfg.listen = l;
    }
    rl_responder::spawn(cfg).expect("responder starts")
}

/// A responder with `faults` on a fresh loopback port.
#[allow(dead_code)] // not every test file uses every helper
pub fn responder(server_id: u64, faults: Faults) -> ResponderHandle {
    spawn(server_id, faults, None)
}

/// A fault-free responder on `listen` (a restart on the same address) or a fresh port.
#[allow(dead_code)]
pub fn responder_at(server_id: u64, listen: Option<SocketAddr>) -> ResponderHandle {
    spawn(server_id, Faults::default(), listen)
}

/// A one-core engine that asks only `r`.
pub fn engine(r: &ResponderHandle) -> Engine {
    Engine::builder(key())
        .cores(Cores::Count(1))
        .endpoints(vec![Endpoint {
            server_id: r.server_id(),
            addr: r.addr(),
        }])
        .socket_buffers(1 << 20, 1 << 20)
        .in_flight_per_core(1024)
        .build()
        .expect("engine builds")
}

/// Serves `svc` on a fresh loopback listener (the peer address goes in as ClientAddr).
pub async fn listen<S, B>(svc: S) -> SocketAddr
where
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let svc = svc.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                    req.extensions_mut().insert(ClientAddr(peer));
                    svc.clone().oneshot(req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}
