//! The client address behind trusted proxies: `X-Forwarded-For` and RFC 7239
//! `Forwarded`, believed only when the connection's peer is a trusted proxy.
//!
//! Owns: [`TrustedProxies`] (a CIDR list), the parsers of both headers and the rule
//! [`client_ip`]. Must not touch: requests beyond their headers, the engine. Reused by
//! `rl-proxy`; every parser here reads untrusted input and never panics.
//!
//! # The rule
//!
//! - The peer (the address the TCP connection came from) is the client unless it is in
//!   the trusted list.
//! - When it is trusted, the forwarded chain is read from right to left (each proxy
//!   appends the address it received the request from): the first address that is not
//!   trusted is the client. `Forwarded` is used when present, otherwise
//!   `X-Forwarded-For`; several header lines are joined in order.
//! - A chain that ends (every hop trusted) or holds an entry that is no IP address
//!   (`unknown`, an obfuscated `_name`, garbage) stops the walk: the client is the last
//!   trusted address reached, so a forged or broken entry never moves the key onto an
//!   address the client chose.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use http::HeaderMap;
use ipnet::IpNet;

/// Networks whose peers' forwarded headers are believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

/// A CIDR (or plain address) that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedProxiesError(pub String);

impl std::fmt::Display for TrustedProxiesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a CIDR or IP address: {:?}", self.0)
    }
}

impl std::error::Error for TrustedProxiesError {}

impl TrustedProxies {
    /// Trusts nobody: forwarded headers are ignored.
    pub fn none() -> Self {
        Self::default()
    }

    /// Trusts `nets`.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        TrustedProxies {
            nets: nets.into_iter().collect(),
        }
    }

    /// Trusts loopback (`127.0.0.0/8`, `::1/128`): a proxy on the same host.
    pub fn loopback() -> Self {
        "127.0.0.0/8,::1/128".parse().expect("valid CIDRs")
    }

    /// Also trusts `net`.
    pub fn with(mut self, net: IpNet) -> Self {
        self.nets.push(net);
        self
    }

    /// The trusted networks.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Nobody is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// `ip` is in a trusted network (an IPv4-mapped IPv6 address counts as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

impl FromStr for TrustedProxies {
    type Err = TrustedProxiesError;

    /// Comma-separated CIDRs or addresses (`10.0.0.0/8, 192.168.1.7, fd00::/8`); an
    /// empty string trusts nobody.
    fn from_str(s: &str) -> Result<Self, TrustedProxiesError> {
        let mut nets = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let net = match part.parse::<IpNet>() {
                Ok(n) => n,
                Err(_) => part
                    .parse::<IpAddr>()
                    .map(IpNet::from)
                    .map_err(|_| TrustedProxiesError(part.to_owned()))?,
            };
            nets.push(net);
        }
        Ok(TrustedProxies { nets })
    }
}

/// An IPv4-mapped IPv6 address as its IPv4 address; anything else unchanged.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The client's address: `peer` unless it is trusted, else the rightmost untrusted
/// address of the forwarded chain (see the module docs). Never panics.
pub fn client_ip(peer: IpAddr, headers: &HeaderMap, trusted: &TrustedProxies) -> IpAddr {
    let mut current = canonical(peer);
    if !trusted.contains(current) {
        return current;
    }
    let chain = if headers.contains_key(http::header::FORWARDED) {
        let mut v = Vec::new();
        for line in headers.get_all(http::header::FORWARDED) {
            v.extend(parse_forwarded(line.as_bytes()));
        }
        v
    } else {
        let mut v = Vec::new();
        for line in headers.get_all("x-forwarded-for") {
            v.extend(parse_x_forwarded_for(line.as_bytes()));
        }
        v
    };
    for hop in chain.into_iter().rev() {
        match hop {
            Some(ip) if trusted.contains(ip) => current = ip,
            Some(ip) => return ip,
            None => return current,
        }
    }
    current
}

/// The entries of one `X-Forwarded-For` line, left to right: `Some(ip)` for an address
/// (optionally with a port, IPv6 optionally in brackets), `None` for anything else.
/// Never panics.
pub fn parse_x_forwarded_for(line: &[u8]) -> Vec<Option<IpAddr>> {
    let Ok(text) = std::str::from_utf8(line) else {
        return vec![None];
    };
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(parse_node)
        .collect()
}

/// The `for=` nodes of one `Forwarded` line (RFC 7239), one per element, left to right:
/// `Some(ip)` for an address, `None` for `unknown`, an obfuscated identifier, a missing
/// `for` or a malformed element. Never panics.
pub fn parse_forwarded(line: &[u8]) -> Vec<Option<IpAddr>> {
    let Ok(text) = std::str::from_utf8(line) else {
        return vec![None];
    };
    let mut out = Vec::new();
    for element in split_outside_quotes(text, ',') {
        if element.trim().is_empty() {
            continue;
        }
        let mut node = None;
        let mut ok = true;
        for pair in split_outside_quotes(element, ';') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let Some((k, v)) = pair.split_once('=') else {
                ok = false;
                break;
            };
            if k.trim().eq_ignore_ascii_case("for") {
                match unquote(v.trim()) {
                    Some(v) => node = parse_node(&v),
                    None => ok = false,
                }
            }
        }
        out.push(if ok { node } else { None });
    }
    out
}

/// Splits `s` at `sep` outside double-quoted strings (backslash escapes inside them).
fn split_outside_quotes(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A token, or a quoted string without its quotes and escapes; `None` if malformed.
fn unquote(v: &str) -> Option<String> {
    let Some(inner) = v.strip_prefix('"') else {
        return (!v.contains('"')).then(|| v.to_owned());
    };
    let inner = inner.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next()?),
            '"' => return None,
            c => out.push(c),
        }
    }
    Some(out)
}

/// `1.2.3.4`, `1.2.3.4:80`, `::1`, `[::1]`, `[::1]:80` → the address; else `None`.
fn parse_node(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Some(canonical(sa.ip()));
    }
    if let Some(inner) = s.strip_prefix('[') {
        // `[v6]` or `[v6]:port` where the port is not a number (RFC 7239 allows an
        // obfuscated port): the address is still known.
        let (addr, _) = inner.split_once(']')?;
        return addr
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|a| canonical(IpAddr::V6(a)));
    }
    // `1.2.3.4:_port`
    let (addr, _) = s.split_once(':')?;
    addr.parse::<std::net::Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                http::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let t: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        let h = headers(&[("x-forwarded-for", "1.1.1.1")]);
        assert_eq!(client_ip(ip("192.0.2.9"), &h, &t), ip("192.0.2.9"));
        assert_eq!(
            client_ip(ip("192.0.2.9"), &h, &TrustedProxies::none()),
            ip("192.0.2.9")
        );
    }

    #[test]
    fn rightmost_untrusted_of_x_forwarded_for() {
        let t: TrustedProxies = "10.0.0.0/8, 192.168.0.1".parse().unwrap();
        // the client forged 6.6.6.6; 203.0.113.5 is who reached our first proxy
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.1.1.1")]);
        assert_eq!(client_ip(ip("10.0.0.2"), &h, &t), ip("203.0.113.5"));
        // several lines join in order
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.5:4444, 192.168.0.1"),
        ]);
        assert_eq!(client_ip(ip("10.0.0.2"), &h, &t), ip("203.0.113.5"));
        // all trusted: the leftmost
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(client_ip(ip("10.0.0.2"), &h, &t), ip("10.9.9.9"));
        // garbage stops the walk at the last trusted hop
        let h = headers(&[("x-forwarded-for", "6.6.6.6, nonsense, 10.1.1.1")]);
        assert_eq!(client_ip(ip("10.0.0.2"), &h, &t), ip("10.1.1.1"));
        // no header: the peer
        assert_eq!(
            client_ip(ip("10.0.0.2"), &HeaderMap::new(), &t),
            ip("10.0.0.2")
        );
    }

    #[test]
    fn forwarded_rfc7239() {
        let t = TrustedProxies::loopback();
        let h = headers(&[(
            "forwarded",
            "for=192.0.2.60;proto=http;by=203.0.113.43, for=\"[2001:db8:cafe::17]:4711\"",
        )]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("2001:db8:cafe::17"));
        let h = headers(&[("forwarded", "For=\"198.51.100.17:_hidden\"")]);
        assert_eq!(client_ip(ip("::1"), &h, &t), ip("198.51.100.17"));
        let h = headers(&[("forwarded", "for=unknown")]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("127.0.0.1"));
        let h = headers(&[("forwarded", "for=_hidden, for=\"a,b\";proto=https")]);
        assert_eq!(parse_forwarded(h["forwarded"].as_bytes()), vec![None, None]);
        // Forwarded wins over X-Forwarded-For
        let h = headers(&[
            ("forwarded", "for=198.51.100.1"),
            ("x-forwarded-for", "198.51.100.2"),
        ]);
        assert_eq!(client_ip(ip("127.0.0.1"), &h, &t), ip("198.51.100.1"));
        // IPv4-mapped peers count as IPv4
        assert!(t.contains(ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn trusted_list_syntax() {
        assert!("".parse::<TrustedProxies>().unwrap().is_empty());
        assert_eq!(
            "10.0.0.0/8,::1"
                .parse::<TrustedProxies>()
                .unwrap()
                .nets()
                .len(),
            2
        );
        assert!("10.0.0.0/33".parse::<TrustedProxies>().is_err());
        assert!("example.com".parse::<TrustedProxies>().is_err());
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse_forwarded(&bytes);
            let _ = parse_x_forwarded_for(&bytes);
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let mut h = HeaderMap::new();
                h.insert(http::header::FORWARDED, v.clone());
                h.insert("x-forwarded-for", v);
                let t = TrustedProxies::loopback();
                let _ = client_ip(IpAddr::from([127, 0, 0, 1]), &h, &t);
            }
        }

        #[test]
        fn text_parsers_never_panic(s in "[ -~]{0,120}") {
            let _ = parse_forwarded(s.as_bytes());
            let _ = parse_x_forwarded_for(s.as_bytes());
            let _ = s.parse::<TrustedProxies>();
        }

        #[test]
        fn the_client_is_never_a_trusted_hop_when_an_untrusted_one_exists(
            a in proptest::num::u8::ANY, b in proptest::num::u8::ANY
        ) {
            let t: TrustedProxies = "10.0.0.0/8".parse().unwrap();
            let line = format!("203.0.113.{a}, 10.0.0.{b}");
            let h = headers(&[("x-forwarded-for", &line)]);
            let got = client_ip(IpAddr::from([10, 0, 0, 1]), &h, &t);
            proptest::prop_assert_eq!(got, IpAddr::from([203, 0, 113, a]));
        }
    }
}
