//! Test helpers shared by the tower crate's integration tests.

use std::convert::Infallible;
use std::net::SocketAddr;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::ClientAddr;
use tower::{Service, ServiceExt};

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
