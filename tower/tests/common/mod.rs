//! Test helpers shared by the tower crate's integration tests.

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::{ApiKey, ClientAddr, Cores, Endpoint, Engine};
use rl_responder::{Faults, ResponderConfig, ResponderHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
#[allow(dead_code)]
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
#[allow(dead_code)]
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

/// The answer to [`raw_get`]: status, header lines in order, body.
#[allow(dead_code)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

#[allow(dead_code)]
impl Answer {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A minimal HTTP/1.1 GET from source address `from` (bounded by 10 s).
#[allow(dead_code)]
pub async fn raw_get(from: IpAddr, to: SocketAddr, path: &str, extra: &[(&str, &str)]) -> Answer {
    let fut = async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind(SocketAddr::new(from, 0)).unwrap();
        let mut s = sock.connect(to).await.unwrap();
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n");
        for (k, v) in extra {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let mut lines = head.lines();
        let status: u16 = lines
            .next()
            .unwrap()
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect();
        Answer {
            status,
            headers,
            body: body.to_owned(),
        }
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("answer within 10 s")
}
