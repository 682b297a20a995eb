//! Forwarding to the upstream: a tower service that sends each request, unchanged but for
//! its URI (scheme and authority of the upstream) and the hop-by-hop headers, to one
//! HTTP/1.1 upstream over pooled keep-alive connections; the `X-Forwarded-For` the
//! upstream receives ([`append_forwarded_for`]).
//!
//! Owns: the upstream client, the `502` answer when the upstream cannot be reached and
//! the `504` answer when it sends no response head within the upstream timeout.
//! Must not touch: admission (the layer in front decides), listeners.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ratelimitly_tower::ResponseBody;

use crate::http_modes::conn::ProxyMetrics;

/// Why `--upstream` was refused.
#[derive(Debug)]
pub struct BadUpstream;

impl std::fmt::Display for BadUpstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("--upstream must be http://HOST:PORT")
    }
}

/// The forwarding service (cheap to clone: the pool is shared).
#[derive(Clone)]
pub struct Upstream {
    client: Client<HttpConnector, Incoming>,
    scheme: Scheme,
    authority: Authority,
    timeout: Duration,
    metrics: Arc<ProxyMetrics>,
    /// false: `--mode forward-auth`, every request that gets here is answered `200`.
    forward: bool,
}

impl Upstream {
    /// A forwarder to `uri` (`http://HOST:PORT`; a path is ignored) that answers `504`
    /// when no response head comes within `timeout` (counted in `metrics`).
    pub fn new(
        uri: &str,
        timeout: Duration,
        metrics: Arc<ProxyMetrics>,
    ) -> Result<Self, BadUpstream> {
        let uri: Uri = uri.parse().map_err(|_| BadUpstream)?;
        if uri.scheme() != Some(&Scheme::HTTP) {
            return Err(BadUpstream);
        }
        let authority = uri.authority().cloned().ok_or(BadUpstream)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(1024)
            .build(connector);
        Ok(Upstream {
            client,
            scheme: Scheme::HTTP,
            authority,
            timeout,
            metrics,
            forward: true,
        })
    }

    /// The inner service of `--mode forward-auth`: forwards nothing, answers every
    /// request `200` with an empty body (a grant, or a failure under fail-open).
    pub fn granting(metrics: Arc<ProxyMetrics>) -> Self {
        let mut up = Upstream::new("http://127.0.0.1:9", Duration::from_secs(1), metrics)
            .unwrap_or_else(|_| unreachable!("a valid upstream"));
        up.forward = false;
        up
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110 §7.6.1).
const HOP_BY_HOP: [header::HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Headers named by Connection are hop-by-hop too.
    let named: Vec<header::HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| header::HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named.iter().chain(HOP_BY_HOP.iter()) {
        headers.remove(n);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

/// What the upstream is told of the client: `X-Forwarded-For` with the TCP peer
/// appended (`EXISTING, PEER`, the existing lines joined in order; a line that is not
/// visible ASCII is dropped), whether the peer is trusted or not: the upstream applies
/// its own trust.
pub fn append_forwarded_for(headers: &mut HeaderMap, peer: IpAddr) {
    const XFF: header::HeaderName = header::HeaderName::from_static("x-forwarded-for");
    let mut line = String::new();
    for v in headers.get_all(&XFF) {
        if let Ok(s) = v.to_str()
            && !s.trim().is_empty()
        {
            line.push_str(s.trim());
            line.push_str(", ");
        }
    }
    let _ = write!(line, "{}", canonical(peer));
    if let Ok(v) = HeaderValue::try_from(line) {
        headers.insert(XFF, v);
    }
}

/// An IPv4-mapped IPv6 peer as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

impl tower_service::Service<Request<Incoming>> for Upstream {
    type Response = Response<ResponseBody<Incoming>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        if !self.forward {
            return Box::pin(async { Ok(local(StatusCode::OK, "")) });
        }
        let pq = req
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let uri = Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(pq)
            .build();
        let client = self.client.clone();
        let timeout = self.timeout;
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let Ok(uri) = uri else {
                return Ok(local(StatusCode::BAD_REQUEST, "bad request target\n"));
            };
            *req.uri_mut() = uri;
            strip_hop_by_hop(req.headers_mut());
            match tokio::time::timeout(timeout, client.request(req)).await {
                Err(_) => {
                    metrics.upstream_timeouts.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(?timeout, "upstream timeout");
                    Ok(local(StatusCode::GATEWAY_TIMEOUT, "upstream timeout\n"))
                }
                Ok(Ok(mut resp)) => {
                    strip_hop_by_hop(resp.headers_mut());
                    Ok(resp.map(ResponseBody::inner))
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "upstream request failed");
                    Ok(local(StatusCode::BAD_GATEWAY, "upstream unreachable\n"))
                }
            }
        })
    }
}

fn local(status: StatusCode, text: &'static str) -> Response<ResponseBody<Incoming>> {
    let mut r = Response::new(ResponseBody::local(text));
    *r.status_mut() = status;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_for_appends_the_peer() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, "127.0.0.2".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "127.0.0.2");
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", HeaderValue::from_static("203.0.113.7"));
        h.append("x-forwarded-for", HeaderValue::from_static(" 10.0.0.1 "));
        append_forwarded_for(&mut h, "::ffff:127.0.0.3".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "203.0.113.7, 10.0.0.1, 127.0.0.3");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);
    }
}
