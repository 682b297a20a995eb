//! Who a request is from: the client address it is keyed by.
//!
//! Owns: [`client_ip`] (the proxy's use of the one rule, `ratelimitly_tower::forwarded`). Must not
//! touch: connections, admission, forwarding.

use std::net::SocketAddr;

use arc_swap::ArcSwap;
use http::HeaderMap;
use ratelimitly_tower::forwarded::{ClientIp, ClientIpRule, UnvouchedLog};

/// The client address a request is keyed by, in every mode: the current `rule` of
/// `ratelimitly_tower::forwarded` (`--trust-forwarded`, `--client-ip-from` and the
/// file's `trust_forwarded`, `client_ip_from`; replaced on reload). From an untrusted peer, the peer; from a
/// trusted one, what its source names. A trusted peer that names nobody
/// (`--client-ip-from real-ip` with an `X-Real-IP` absent, repeated or no address; `xff`
/// with an `X-Real-IP` and no `X-Forwarded-For`) is keyed by the peer and counted in `log` (warned about on the 1st, 2nd, 4th, … time).
///
/// The peer keeps its port; an address taken from a header has port 0.
pub fn client_ip(
    peer: SocketAddr,
    headers: &HeaderMap,
    rule: &ArcSwap<ClientIpRule>,
    log: &UnvouchedLog,
) -> SocketAddr {
    let rule = rule.load();
    if rule.trusted().is_empty() {
        return peer;
    }
    match log.note(rule.client_ip(peer.ip(), headers)) {
        ClientIp::Forwarded(ip) => SocketAddr::new(ip, 0),
        ClientIp::Peer(_) | ClientIp::Unvouched(_) => peer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimitly_tower::forwarded::ClientIpFrom;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, http::HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn client_ip_believes_trusted_peers_only() {
        let rule =
            |from| ArcSwap::from_pointee(ClientIpRule::new("127.0.0.2/32".parse().unwrap(), from));
        let log = UnvouchedLog::default();
        let p2: SocketAddr = "127.0.0.2:5000".parse().unwrap();
        let p3: SocketAddr = "127.0.0.3:5000".parse().unwrap();
        let h = headers(&[
            ("x-real-ip", "192.0.2.5"),
            ("forwarded", "for=198.51.100.1"),
            ("x-forwarded-for", "198.51.100.1, 203.0.113.9"),
        ]);
        for from in ClientIpFrom::ALL {
            assert_eq!(client_ip(p3, &h, &rule(from), &log), p3, "untrusted peer");
        }
        let ip = |from| client_ip(p2, &h, &rule(from), &log).to_string();
        assert_eq!(
            ip(ClientIpFrom::Xff),
            "203.0.113.9:0",
            "rightmost untrusted"
        );
        assert_eq!(ip(ClientIpFrom::Forwarded), "198.51.100.1:0");
        assert_eq!(ip(ClientIpFrom::Peer), "127.0.0.2:5000");
        // X-Real-IP, whatever the chain says
        assert_eq!(ip(ClientIpFrom::RealIp), "192.0.2.5:0");
        assert_eq!(log.count(), 0);
        // nginx's classic snippet: X-Real-IP alone
        let h = headers(&[("x-real-ip", "192.0.2.6")]);
        let got = client_ip(p2, &h, &rule(ClientIpFrom::RealIp), &log);
        assert_eq!(got.to_string(), "192.0.2.6:0");
        // no X-Real-IP: the peer, counted
        let h = headers(&[("x-forwarded-for", "192.0.2.5")]);
        let got = client_ip(p2, &h, &rule(ClientIpFrom::RealIp), &log);
        assert_eq!(got, p2);
        assert_eq!(log.count(), 1);
        // garbage never panics and never moves the key onto a chosen address
        let h = headers(&[("x-real-ip", "nope"), ("x-forwarded-for", "unknown, ,x")]);
        assert_eq!(client_ip(p2, &h, &rule(ClientIpFrom::Xff), &log), p2);
        let nobody = ArcSwap::from_pointee(ClientIpRule::default());
        assert_eq!(client_ip(p2, &h, &nobody, &log), p2);
    }
}
