//! The parsers of the three headers the rule reads: `X-Forwarded-For`, RFC 7239
//! `Forwarded` and `X-Real-IP`. Every one reads untrusted input and never panics.
//!
//! Owns: the header syntaxes and the canonical form of an address (IPv4-mapped IPv6 as
//! IPv4). Must not touch: trust (the rule decides what is believed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use http::HeaderMap;
use http::header::HeaderName;

/// `X-Forwarded-For`.
pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Real-IP`.
pub(crate) const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// An IPv4-mapped IPv6 address as its IPv4 address; anything else unchanged.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// The entries of one `X-Forwarded-For` line, left to right: `Some(ip)` for an address
/// (optionally with a port, IPv6 optionally in brackets), `None` for anything else.
/// Never panics.
pub fn parse_x_forwarded_for(line: &[u8]) -> Vec<Option<IpAddr>> {
    let mut v: Vec<_> = xff_line_rev(line).collect();
    v.reverse();
    v
}

/// The entries of one `X-Forwarded-For` line, right to left (no allocation).
fn xff_line_rev(line: &[u8]) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    let (text, bad) = match std::str::from_utf8(line) {
        Ok(t) => (t, None),
        Err(_) => ("", Some(None)),
    };
    bad.into_iter().chain(
        text.rsplit(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(parse_node),
    )
}

/// Every `X-Forwarded-For` entry of `headers`, right to left (the lines joined in
/// order, the last line's last entry first); no allocation.
pub(crate) fn xff_hops_rev(headers: &HeaderMap) -> impl Iterator<Item = Option<IpAddr>> + '_ {
    headers
        .get_all(X_FORWARDED_FOR)
        .into_iter()
        .rev()
        .flat_map(|line| xff_line_rev(line.as_bytes()))
}

/// Every `Forwarded` `for=` node of `headers`, right to left (see [`parse_forwarded`]).
pub(crate) fn forwarded_hops_rev(headers: &HeaderMap) -> impl Iterator<Item = Option<IpAddr>> {
    let mut v = Vec::new();
    for line in headers.get_all(http::header::FORWARDED) {
        v.extend(parse_forwarded(line.as_bytes()));
    }
    v.into_iter().rev()
}

/// The `X-Real-IP` address: `None` when the header is absent, appears more than once
/// (a client's and a proxy's), or is no address.
pub(crate) fn x_real_ip(headers: &HeaderMap) -> Option<IpAddr> {
    let mut lines = headers.get_all(X_REAL_IP).into_iter();
    let line = lines.next()?;
    if lines.next().is_some() {
        return None;
    }
    std::str::from_utf8(line.as_bytes())
        .ok()
        .and_then(parse_node)
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
            .parse::<Ipv6Addr>()
            .ok()
            .map(|a| canonical(IpAddr::V6(a)));
    }
    // `1.2.3.4:_port`
    let (addr, _) = s.split_once(':')?;
    addr.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn forwarded_rfc7239_nodes() {
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        assert_eq!(
            parse_forwarded(
                b"for=192.0.2.60;proto=http;by=203.0.113.43, for=\"[2001:db8:cafe::17]:4711\""
            ),
            vec![ip("192.0.2.60"), ip("2001:db8:cafe::17")]
        );
        assert_eq!(
            parse_forwarded(b"For=\"198.51.100.17:_hidden\""),
            vec![ip("198.51.100.17")]
        );
        assert_eq!(parse_forwarded(b"for=unknown"), vec![None]);
        assert_eq!(
            parse_forwarded(b"for=_hidden, for=\"a,b\";proto=https"),
            vec![None, None]
        );
        assert_eq!(
            parse_x_forwarded_for(b"6.6.6.6, nonsense,, [::ffff:10.0.0.1]:80"),
            vec![ip("6.6.6.6"), None, ip("10.0.0.1")]
        );
        assert_eq!(parse_x_forwarded_for(b"\xff"), vec![None]);
    }

    #[test]
    fn x_real_ip_is_one_address_or_nothing() {
        let mut h = HeaderMap::new();
        assert_eq!(x_real_ip(&h), None);
        h.insert(X_REAL_IP, HeaderValue::from_static(" 192.0.2.5 "));
        assert_eq!(x_real_ip(&h), Some("192.0.2.5".parse().unwrap()));
        h.append(X_REAL_IP, HeaderValue::from_static("192.0.2.6"));
        assert_eq!(x_real_ip(&h), None, "two lines: ambiguous");
        h.insert(X_REAL_IP, HeaderValue::from_static("nope"));
        assert_eq!(x_real_ip(&h), None);
    }

    proptest::proptest! {
        #[test]
        fn parsers_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..200)) {
            let _ = parse_forwarded(&bytes);
            let _ = parse_x_forwarded_for(&bytes);
            if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                let mut h = HeaderMap::new();
                h.insert(http::header::FORWARDED, v.clone());
                h.insert(X_FORWARDED_FOR, v.clone());
                h.insert(X_REAL_IP, v);
                let _ = forwarded_hops_rev(&h).count();
                let _ = xff_hops_rev(&h).count();
                let _ = x_real_ip(&h);
            }
        }

        #[test]
        fn text_parsers_never_panic(s in "[ -~]{0,120}") {
            let _ = parse_forwarded(s.as_bytes());
            let _ = parse_x_forwarded_for(s.as_bytes());
        }

        /// The right-to-left walk sees exactly the entries of the lines, reversed.
        #[test]
        fn the_reverse_walk_is_the_lines_reversed(
            lines in proptest::collection::vec("[0-9a-f.:, \\[\\]x]{0,40}", 0..4)
        ) {
            let mut h = HeaderMap::new();
            let mut want = Vec::new();
            for l in &lines {
                h.append(X_FORWARDED_FOR, HeaderValue::from_str(l).unwrap());
                want.extend(parse_x_forwarded_for(l.as_bytes()));
            }
            want.reverse();
            proptest::prop_assert_eq!(xff_hops_rev(&h).collect::<Vec<_>>(), want);
        }
    }
}
