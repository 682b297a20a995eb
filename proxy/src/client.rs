//! Who and what a request is: the client address it is keyed by (trusted forwarded
//! headers) and, in `--mode forward-auth`, the original request it stands for.
//!
//! Owns: [`client_ip`] (the one place that decides the client) and
//! [`original_request`]. Must not touch: connections, admission, forwarding.

use std::net::{IpAddr, SocketAddr};

use http::HeaderMap;
use ratelimitly_tower::TrustedProxies;
use ratelimitly_tower::forwarded;

/// The client address a request is keyed by: the one place that decides it.
///
/// - From a peer that is not in `trusted` (`--trust-forwarded`, `trust_forwarded`):
///   the TCP peer; `X-Forwarded-For`, `Forwarded` and `X-Real-IP` are ignored.
/// - From a trusted peer, in `--mode forward-auth` (`forward_auth`): `X-Real-IP` first
///   (what nginx sets to `$remote_addr`), taken as the address the proxy in front saw;
///   when that one is trusted too, or absent, the forwarded chain is walked from it.
/// - From a trusted peer otherwise (and when `X-Real-IP` is absent or no address): the
///   rightmost `Forwarded` (RFC 7239, when present) or `X-Forwarded-For` address that
///   is not itself trusted (`ratelimitly_tower::forwarded::client_ip`; Caddy's
///   `forward_auth` sends `X-Forwarded-For`).
///
/// An address taken from a header has port 0.
pub fn client_ip(
    peer: SocketAddr,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
    forward_auth: bool,
) -> SocketAddr {
    if trusted.is_empty() || !trusted.contains(peer.ip()) {
        return peer;
    }
    let mut seen = peer.ip();
    if forward_auth
        && let Some(real) = headers
            .get("x-real-ip")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.trim().parse::<IpAddr>().ok())
    {
        seen = real;
    }
    let ip = forwarded::client_ip(seen, headers, trusted);
    if ip == peer.ip() {
        peer
    } else {
        SocketAddr::new(ip, 0)
    }
}

/// `--mode forward-auth`: the request being decided is the original one named by
/// `X-Original-URI` / `X-Forwarded-Uri` and `X-Original-Method` / `X-Forwarded-Method`
/// (nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth`); without them, the
/// request itself.
pub fn original_request<B>(req: &mut http::Request<B>) {
    let h = req.headers();
    let uri = h
        .get("x-original-uri")
        .or_else(|| h.get("x-forwarded-uri"))
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<http::Uri>().ok());
    let method = h
        .get("x-original-method")
        .or_else(|| h.get("x-forwarded-method"))
        .and_then(|v| http::Method::from_bytes(v.as_bytes()).ok());
    if let Some(u) = uri {
        *req.uri_mut() = u;
    }
    if let Some(m) = method {
        *req.method_mut() = m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn client_ip_believes_trusted_peers_only() {
        let trusted: TrustedProxies = "127.0.0.2/32".parse().unwrap();
        let p2: SocketAddr = "127.0.0.2:5000".parse().unwrap();
        let p3: SocketAddr = "127.0.0.3:5000".parse().unwrap();
        let xff = headers(&[("x-forwarded-for", "198.51.100.1, 203.0.113.9")]);
        assert_eq!(client_ip(p3, &xff, &trusted, false), p3, "untrusted peer");
        assert_eq!(
            client_ip(p2, &xff, &trusted, false),
            "203.0.113.9:0".parse().unwrap(),
            "rightmost untrusted"
        );
        // trusted hops are skipped; Forwarded wins over X-Forwarded-For
        let h = headers(&[
            ("x-forwarded-for", "203.0.113.9"),
            ("forwarded", "for=198.51.100.1, for=127.0.0.2"),
        ]);
        assert_eq!(
            client_ip(p2, &h, &trusted, false),
            "198.51.100.1:0".parse().unwrap()
        );
        // X-Real-IP: forward-auth mode only, from a trusted peer only, before the chain
        let h = headers(&[
            ("x-real-ip", "192.0.2.5"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(
            client_ip(p2, &h, &trusted, true).ip().to_string(),
            "192.0.2.5"
        );
        assert_eq!(
            client_ip(p2, &h, &trusted, false).ip().to_string(),
            "203.0.113.9"
        );
        assert_eq!(client_ip(p3, &h, &trusted, true), p3);
        // an X-Real-IP that is itself trusted: the chain is walked from it
        let h = headers(&[
            ("x-real-ip", "127.0.0.2"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(
            client_ip(p2, &h, &trusted, true).ip().to_string(),
            "203.0.113.9"
        );
        // garbage never panics and never moves the key onto a chosen address
        let h = headers(&[("x-real-ip", "nope"), ("x-forwarded-for", "unknown, ,x")]);
        assert_eq!(client_ip(p2, &h, &trusted, true), p2);
        assert_eq!(client_ip(p2, &xff, &TrustedProxies::none(), false), p2);
    }
}
