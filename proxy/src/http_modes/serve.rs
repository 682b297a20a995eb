//! The accept loop: the connection cap, one HTTP/1.1 connection per client under the
//! header and idle timeouts, the client address and the original request of each
//! request.
//!
//! Owns: `serve`, `ConnLimits`. Must not touch: admission (the
//! service it is given), forwarding.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::{ClientAddr, ClientIpRule};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::client::client_ip;
use crate::forward_auth::original_request;
use crate::http_modes::conn::{Clock, Expiry, ProxyMetrics, Timeouts, Watched};
use crate::http_modes::upstream::append_forwarded_for;

/// The accept loop's limits.
pub(crate) struct ConnLimits {
    pub(crate) timeouts: Timeouts,
    pub(crate) max_connections: usize,
    pub(crate) metrics: Arc<ProxyMetrics>,
    /// `--mode forward-auth`: requests are decided as their original request, and a
    /// rejection (429) is answered with this status.
    pub(crate) deny_status: Option<http::StatusCode>,
    /// Who the client is: the trusted peers and the source read from them (replaced
    /// on SIGHUP).
    pub(crate) client_rule: Arc<ArcSwap<ClientIpRule>>,
}

/// Accepts connections (at most `max_connections` open at once; more are closed at
/// once) and serves each with HTTP/1.1 keep-alive under the header and idle timeouts;
/// every request carries the client address as [`ClientAddr`].
pub(crate) async fn serve<S, B>(listener: TcpListener, svc: S, limits: ConnLimits)
where
    S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut refusals = Refusals::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors or similar: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            refusals.refuse(&limits);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let conn = Conn {
            peer,
            timeouts: limits.timeouts,
            deny_status: limits.deny_status,
            metrics: limits.metrics.clone(),
            client_rule: limits.client_rule.clone(),
        };
        let svc = svc.clone();
        tokio::spawn(async move {
            conn.serve(stream, svc).await;
            drop(permit);
        });
    }
}

/// Connections refused at the cap, logged at most once a second.
#[derive(Default)]
struct Refusals {
    last_warn: Option<Instant>,
    unlogged: u64,
}

impl Refusals {
    fn refuse(&mut self, limits: &ConnLimits) {
        limits.metrics.refused.fetch_add(1, Ordering::Relaxed);
        self.unlogged += 1;
        if self
            .last_warn
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            tracing::warn!(
                max_connections = limits.max_connections,
                refused = self.unlogged,
                "connection limit reached: new connections are closed at once"
            );
            self.last_warn = Some(Instant::now());
            self.unlogged = 0;
        }
    }
}

/// One accepted connection and what serving it needs.
struct Conn {
    peer: SocketAddr,
    timeouts: Timeouts,
    deny_status: Option<http::StatusCode>,
    metrics: Arc<ProxyMetrics>,
    client_rule: Arc<ArcSwap<ClientIpRule>>,
}

impl Conn {
    /// Serves the connection's requests until it closes or a timeout closes it.
    async fn serve<S, B>(self, stream: TcpStream, svc: S)
    where
        S: tower_service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send + 'static,
        B: http_body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Conn {
            peer,
            timeouts,
            deny_status,
            metrics,
            client_rule,
        } = self;
        metrics.open.fetch_add(1, Ordering::Relaxed);
        let clock = Clock::new();
        let svc_clock = clock.clone();
        let svc_metrics = metrics.clone();
        let conn_svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let client = client_ip(peer, req.headers(), &client_rule, &svc_metrics.unvouched);
            req.extensions_mut().insert(ClientAddr(client));
            if deny_status.is_some() {
                original_request(&mut req);
            } else {
                append_forwarded_for(req.headers_mut(), peer.ip());
            }
            svc_clock.request_started();
            let clock = svc_clock.clone();
            let answer = svc.clone().oneshot(req);
            async move {
                let mut r = answer.await;
                clock.request_done();
                if let (Some(deny), Ok(resp)) = (deny_status, r.as_mut())
                    && resp.status() == http::StatusCode::TOO_MANY_REQUESTS
                {
                    *resp.status_mut() = deny;
                }
                r
            }
        });
        let io = TokioIo::new(Watched::new(stream, clock.clone()));
        let mut builder = hyper::server::conn::http1::Builder::new();
        // the watchdog below owns the header and idle timeouts
        builder.header_read_timeout(None::<Duration>);
        let conn = builder.serve_connection(io, conn_svc);
        let mut conn = std::pin::pin!(conn);
        let tick = timeouts.tick();
        loop {
            tokio::select! {
                _ = conn.as_mut() => break,
                _ = tokio::time::sleep(tick) => match clock.expired(timeouts) {
                    Some(Expiry::Header) => {
                        metrics.header_timeouts.fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(%peer, "header timeout: connection closed");
                        break;
                    }
                    Some(Expiry::Idle) => {
                        metrics.idle_timeouts.fetch_add(1, Ordering::Relaxed);
                        break;
                    }
                    None => {}
                },
            }
        }
        metrics.open.fetch_sub(1, Ordering::Relaxed);
    }
}
