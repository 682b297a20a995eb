//! The rule: who the client of a request is (see the module docs of `forwarded`).
//!
//! Owns: [`ClientIpFrom`] (the source, its names), [`ClientIpRule`] (the one place that
//! decides) and [`ClientIp`] (its answer), [`UnvouchedLog`]. Must not touch: header
//! syntax (`parse`), requests beyond their headers.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use http::HeaderMap;

use super::parse::{X_REAL_IP, canonical, forwarded_hops_rev, x_real_ip, xff_hops_rev};
use super::trusted::TrustedProxies;

/// Which header names the client when the connection's peer is a trusted proxy
/// (`rl-proxy --client-ip-from`, the route file's `client_ip_from`). From any other
/// peer no header is read, whatever the source.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ClientIpFrom {
    /// `X-Real-IP`, as nginx's realip module reads it (`real_ip_header X-Real-IP`):
    /// from a trusted peer, the one address in `X-Real-IP` is the client.
    /// `X-Forwarded-For` and `Forwarded` are not read. For a front proxy that
    /// overwrites `X-Real-IP` with the address it received the request from (nginx's
    /// `proxy_set_header X-Real-IP $remote_addr;`, with or without `X-Forwarded-For`):
    /// choose it only when that proxy overwrites the header, since a client's own
    /// `X-Real-IP` that a proxy passes through chooses its bucket. When `X-Real-IP` is
    /// absent, given twice or no address, the request is keyed by the peer
    /// ([`ClientIp::Unvouched`]).
    RealIp,
    /// The rightmost `X-Forwarded-For` address that is not itself trusted (the
    /// default). `X-Real-IP` and `Forwarded` are not read, but an `X-Real-IP` without
    /// any `X-Forwarded-For` is reported as [`ClientIp::Unvouched`] (the key is the
    /// peer, as without it): the proxy in front sets only `X-Real-IP`, so every client
    /// shares its bucket.
    #[default]
    Xff,
    /// The rightmost RFC 7239 `Forwarded` `for=` address that is not itself trusted.
    /// `X-Real-IP` and `X-Forwarded-For` are not read.
    Forwarded,
    /// The peer, always: no header is read.
    Peer,
}

impl ClientIpFrom {
    /// Every source, by the name `FromStr` and `Display` use.
    pub const ALL: [ClientIpFrom; 4] = [
        ClientIpFrom::RealIp,
        ClientIpFrom::Xff,
        ClientIpFrom::Forwarded,
        ClientIpFrom::Peer,
    ];

    /// `real-ip`, `xff`, `forwarded` or `peer`.
    pub fn name(self) -> &'static str {
        match self {
            ClientIpFrom::RealIp => "real-ip",
            ClientIpFrom::Xff => "xff",
            ClientIpFrom::Forwarded => "forwarded",
            ClientIpFrom::Peer => "peer",
        }
    }
}

impl fmt::Display for ClientIpFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A client IP source that is none of `real-ip`, `xff`, `forwarded`, `peer`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIpFromError(pub String);

impl fmt::Display for ClientIpFromError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "client IP source {:?} is none of real-ip, xff, forwarded, peer",
            self.0
        )
    }
}

impl std::error::Error for ClientIpFromError {}

impl FromStr for ClientIpFrom {
    type Err = ClientIpFromError;

    /// `real-ip`, `xff`, `forwarded` or `peer`.
    fn from_str(s: &str) -> Result<Self, ClientIpFromError> {
        Self::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| ClientIpFromError(s.to_owned()))
    }
}

/// Who the client is, and on what grounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientIp {
    /// The connection's peer: it is not trusted, the source is
    /// [`ClientIpFrom::Peer`], or its header named nobody beyond it.
    Peer(IpAddr),
    /// An address the trusted peer named in the header its source reads.
    Forwarded(IpAddr),
    /// A trusted peer that did not name the client in the header its source reads:
    /// [`ClientIpFrom::RealIp`] with an `X-Real-IP` absent, repeated or no address;
    /// [`ClientIpFrom::Xff`] with an `X-Real-IP` and no `X-Forwarded-For` at all (a
    /// front proxy that sets only `X-Real-IP`). Keyed by the peer (the proxy in front,
    /// one bucket for all its clients). Worth a warning ([`UnvouchedLog`]).
    Unvouched(IpAddr),
}

impl ClientIp {
    /// The address a request is keyed by.
    pub fn addr(self) -> IpAddr {
        match self {
            ClientIp::Peer(a) | ClientIp::Forwarded(a) | ClientIp::Unvouched(a) => a,
        }
    }
}

/// The one rule for who the client is: the trusted networks and the source read from
/// them. The default trusts nobody (every client is its peer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientIpRule {
    trusted: TrustedProxies,
    source: ClientIpFrom,
}

impl ClientIpRule {
    /// Reads `source` from peers in `trusted`.
    pub fn new(trusted: TrustedProxies, source: ClientIpFrom) -> Self {
        ClientIpRule { trusted, source }
    }

    /// The trusted networks.
    pub fn trusted(&self) -> &TrustedProxies {
        &self.trusted
    }

    /// The source read from trusted peers.
    pub fn source(&self) -> ClientIpFrom {
        self.source
    }

    /// The client of a request that came from `peer` with `headers`. Never panics;
    /// allocates only for [`ClientIpFrom::Forwarded`] from a trusted peer.
    pub fn client_ip(&self, peer: IpAddr, headers: &HeaderMap) -> ClientIp {
        let peer = canonical(peer);
        if !self.trusted.contains(peer) {
            return ClientIp::Peer(peer);
        }
        let found = match self.source {
            ClientIpFrom::Peer => peer,
            ClientIpFrom::Xff => {
                let mut hops = xff_hops_rev(headers).peekable();
                if hops.peek().is_none() && headers.contains_key(X_REAL_IP) {
                    // the key is the peer either way; said, since it usually means
                    // a proxy that sets X-Real-IP only (nginx without
                    // $proxy_add_x_forwarded_for), and every client shares a bucket
                    return ClientIp::Unvouched(peer);
                }
                self.walk(peer, hops, |_| {})
            }
            ClientIpFrom::Forwarded => self.walk(peer, forwarded_hops_rev(headers), |_| {}),
            ClientIpFrom::RealIp => match x_real_ip(headers) {
                Some(real) => real,
                None => return ClientIp::Unvouched(peer),
            },
        };
        if found == peer {
            ClientIp::Peer(peer)
        } else {
            ClientIp::Forwarded(found)
        }
    }

    /// Walks `hops` (right to left) from the trusted `peer`: the first address that is
    /// not trusted; at the chain's end or at an entry that is no address, the last
    /// trusted address reached. `visit` sees every address the walk passes, the answer
    /// included.
    fn walk(
        &self,
        peer: IpAddr,
        hops: impl Iterator<Item = Option<IpAddr>>,
        mut visit: impl FnMut(IpAddr),
    ) -> IpAddr {
        let mut current = peer;
        for hop in hops {
            let Some(ip) = hop else {
                return current;
            };
            visit(ip);
            if !self.trusted.contains(ip) {
                return ip;
            }
            current = ip;
        }
        current
    }
}

/// Counts the requests keyed by their trusted peer because it named no client in the
/// header the source reads ([`ClientIp::Unvouched`]), and logs a warning for the 1st, 2nd, 4th,
/// 8th, … of them: a misconfigured front proxy (or a forging client) is reported
/// without a line per request.
#[derive(Debug, Default)]
pub struct UnvouchedLog(AtomicU64);

impl UnvouchedLog {
    /// Notes `client` when it is [`ClientIp::Unvouched`]; returns it unchanged.
    pub fn note(&self, client: ClientIp) -> ClientIp {
        if let ClientIp::Unvouched(peer) = client {
            let n = self.0.fetch_add(1, Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(
                    %peer,
                    count = n,
                    "client IP: a trusted peer did not name the client: with --client-ip-from \
                     real-ip its X-Real-IP is absent, repeated or no address; with xff it sent \
                     X-Real-IP and no X-Forwarded-For. The request is keyed by the peer, the \
                     proxy in front, one bucket for all its clients. Make that proxy \
                     overwrite X-Real-IP (nginx: proxy_set_header X-Real-IP $remote_addr) and \
                     use --client-ip-from real-ip, or make it append X-Forwarded-For (nginx: \
                     proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for)"
                );
            }
        }
        client
    }

    /// How many requests were keyed by their peer for it.
    pub fn count(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use http::header::HeaderName;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn rule(trusted: &str, source: ClientIpFrom) -> ClientIpRule {
        ClientIpRule::new(trusted.parse().unwrap(), source)
    }

    #[test]
    fn names_round_trip() {
        for f in ClientIpFrom::ALL {
            assert_eq!(f.name().parse::<ClientIpFrom>(), Ok(f));
            assert_eq!(f.to_string(), f.name());
        }
        assert_eq!(ClientIpFrom::default(), ClientIpFrom::Xff);
        assert!("x-real-ip".parse::<ClientIpFrom>().is_err());
    }

    #[test]
    fn untrusted_peer_is_the_client() {
        let h = headers(&[
            ("x-forwarded-for", "1.1.1.1"),
            ("x-real-ip", "1.1.1.1"),
            ("forwarded", "for=1.1.1.1"),
        ]);
        for f in ClientIpFrom::ALL {
            let r = rule("10.0.0.0/8", f);
            assert_eq!(
                r.client_ip(ip("192.0.2.9"), &h),
                ClientIp::Peer(ip("192.0.2.9"))
            );
            let nobody = ClientIpRule::new(TrustedProxies::none(), f);
            assert_eq!(
                nobody.client_ip(ip("10.0.0.1"), &h),
                ClientIp::Peer(ip("10.0.0.1"))
            );
        }
    }

    #[test]
    fn xff_rightmost_untrusted() {
        let r = rule("10.0.0.0/8, 192.168.0.1", ClientIpFrom::Xff);
        let p = ip("10.0.0.2");
        // the client forged 6.6.6.6; 203.0.113.5 is who reached our first proxy
        let h = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.1.1.1")]);
        assert_eq!(r.client_ip(p, &h), ClientIp::Forwarded(ip("203.0.113.5")));
        // several lines join in order
        let h = headers(&[
            ("x-forwarded-for", "6.6.6.6"),
            ("x-forwarded-for", "203.0.113.5:4444, 192.168.0.1"),
        ]);
        assert_eq!(r.client_ip(p, &h).addr(), ip("203.0.113.5"));
        // all trusted: the leftmost
        let h = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(r.client_ip(p, &h).addr(), ip("10.9.9.9"));
        // garbage stops the walk at the last trusted hop
        let h = headers(&[("x-forwarded-for", "6.6.6.6, nonsense, 10.1.1.1")]);
        assert_eq!(r.client_ip(p, &h).addr(), ip("10.1.1.1"));
        // no header: the peer; X-Real-IP alone (a proxy that sets only that): the
        // peer, reported
        assert_eq!(r.client_ip(p, &HeaderMap::new()), ClientIp::Peer(p));
        let h = headers(&[("x-real-ip", "192.0.2.5")]);
        assert_eq!(r.client_ip(p, &h), ClientIp::Unvouched(p));
        // X-Real-IP and Forwarded are not read
        let h = headers(&[
            ("x-real-ip", "192.0.2.5"),
            ("forwarded", "for=198.51.100.1"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(r.client_ip(p, &h).addr(), ip("203.0.113.9"));
    }

    #[test]
    fn forwarded_rightmost_untrusted() {
        let r = rule("127.0.0.0/8, ::1", ClientIpFrom::Forwarded);
        let h = headers(&[
            ("forwarded", "for=198.51.100.1, for=127.0.0.2"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(r.client_ip(ip("::1"), &h).addr(), ip("198.51.100.1"));
        let h = headers(&[
            ("forwarded", "for=unknown"),
            ("x-forwarded-for", "203.0.113.9"),
        ]);
        assert_eq!(
            r.client_ip(ip("127.0.0.1"), &h),
            ClientIp::Peer(ip("127.0.0.1"))
        );
    }

    #[test]
    fn real_ip_is_the_header_from_a_trusted_peer() {
        let r = rule("10.0.0.0/8", ClientIpFrom::RealIp);
        let p = ip("10.0.0.2");
        // nginx's classic snippet: X-Real-IP $remote_addr, no X-Forwarded-For
        let h = headers(&[("x-real-ip", "192.0.2.5")]);
        assert_eq!(r.client_ip(p, &h), ClientIp::Forwarded(ip("192.0.2.5")));
        // with X-Forwarded-For too (not read, whatever it says)
        let h = headers(&[
            ("x-real-ip", "192.0.2.5"),
            ("x-forwarded-for", "6.6.6.6, 198.51.100.1"),
        ]);
        assert_eq!(r.client_ip(p, &h), ClientIp::Forwarded(ip("192.0.2.5")));
        // a port, an IPv4-mapped address
        let h = headers(&[("x-real-ip", "192.0.2.5:4444")]);
        assert_eq!(r.client_ip(p, &h).addr(), ip("192.0.2.5"));
        let h = headers(&[("x-real-ip", "::ffff:192.0.2.6")]);
        assert_eq!(r.client_ip(p, &h).addr(), ip("192.0.2.6"));
        // the peer itself
        let h = headers(&[("x-real-ip", "10.0.0.2")]);
        assert_eq!(r.client_ip(p, &h), ClientIp::Peer(p));
        // from a peer that is not trusted, never read
        let h = headers(&[("x-real-ip", "192.0.2.5")]);
        assert_eq!(
            r.client_ip(ip("192.0.2.9"), &h),
            ClientIp::Peer(ip("192.0.2.9"))
        );
        // absent, repeated (a client's and a proxy's) or no address: the peer, reported
        for h in [
            headers(&[("x-forwarded-for", "192.0.2.5")]),
            HeaderMap::new(),
            headers(&[("x-real-ip", "192.0.2.5"), ("x-real-ip", "192.0.2.5")]),
            headers(&[("x-real-ip", "6.6.6.6"), ("x-real-ip", "192.0.2.5")]),
            headers(&[("x-real-ip", "unknown")]),
            headers(&[("x-real-ip", "192.0.2.5, 6.6.6.6")]),
        ] {
            assert_eq!(r.client_ip(p, &h), ClientIp::Unvouched(p), "{h:?}");
        }
        let log = UnvouchedLog::default();
        log.note(ClientIp::Unvouched(p));
        log.note(ClientIp::Peer(p));
        assert_eq!(log.count(), 1);
    }

    /// What a trusted proxy does with each header a client sent.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Xff {
        /// Appends its peer: as a line of its own, or joined to the last line.
        Append { new_line: bool },
        /// Replaces the header with its peer.
        Replace,
        /// Passes the client's unchanged.
        Pass,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Set {
        Overwrite,
        Strip,
        Pass,
    }

    #[derive(Clone, Copy, Debug)]
    struct Hop {
        xff: Xff,
        real_ip: Set,
        forwarded: Set,
    }

    impl Hop {
        /// The headers after this hop, which received them from `remote`.
        fn apply(&self, h: &mut HeaderMap, remote: IpAddr) {
            let value = |s: String| HeaderValue::from_str(&s).unwrap();
            match self.xff {
                Xff::Append { new_line } => {
                    let mut lines: Vec<_> = h.get_all("x-forwarded-for").iter().cloned().collect();
                    let last = if new_line { None } else { lines.pop() };
                    let entry = match last {
                        Some(l) => format!("{}, {remote}", String::from_utf8_lossy(l.as_bytes())),
                        None => remote.to_string(),
                    };
                    lines.push(value(entry));
                    h.remove("x-forwarded-for");
                    for l in lines {
                        h.append("x-forwarded-for", l);
                    }
                }
                Xff::Replace => {
                    h.insert("x-forwarded-for", value(remote.to_string()));
                }
                Xff::Pass => {}
            }
            match self.real_ip {
                Set::Overwrite => {
                    h.insert("x-real-ip", value(remote.to_string()));
                }
                Set::Strip => {
                    h.remove("x-real-ip");
                }
                Set::Pass => {}
            }
            match self.forwarded {
                // the proxies that write Forwarded append to it
                Set::Overwrite => {
                    let node = match remote {
                        IpAddr::V4(a) => format!("for={a}"),
                        IpAddr::V6(a) => format!("for=\"[{a}]\""),
                    };
                    h.append(http::header::FORWARDED, value(node));
                }
                Set::Strip => {
                    h.remove(http::header::FORWARDED);
                }
                Set::Pass => {}
            }
        }
    }

    fn hop() -> impl Strategy<Value = Hop> {
        let xff = prop_oneof![
            any::<bool>().prop_map(|new_line| Xff::Append { new_line }),
            Just(Xff::Replace),
            Just(Xff::Pass),
        ];
        let set = || prop_oneof![Just(Set::Overwrite), Just(Set::Strip), Just(Set::Pass)];
        (xff, set(), set()).prop_map(|(xff, real_ip, forwarded)| Hop {
            xff,
            real_ip,
            forwarded,
        })
    }

    /// An address or entry a forging client writes: the proxies' own addresses, other
    /// trusted ones, strangers, its own, garbage.
    fn forged() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "10.0.0.1",
                "10.0.0.2",
                "10.0.0.3",
                "10.9.9.9",
                "127.0.0.1",
                "198.51.100.7",
                "203.0.113.7",
                "2001:db8::66",
                "[2001:db8::66]:80",
                "::ffff:10.0.0.2",
                "198.51.100.1",
                "unknown",
                "_hidden",
                "",
                " ",
                "x",
            ])
            .prop_map(str::to_owned),
            any::<[u8; 4]>().prop_map(|o| IpAddr::from(o).to_string()),
        ]
    }

    /// The headers a client sends: any number of lines of each, of forged entries.
    fn client_headers() -> impl Strategy<Value = HeaderMap> {
        let lines = || prop::collection::vec(prop::collection::vec(forged(), 0..4), 0..3);
        (lines(), lines(), lines()).prop_map(|(xff, real, fwd)| {
            let mut h = HeaderMap::new();
            for l in xff {
                h.append(
                    "x-forwarded-for",
                    HeaderValue::from_str(&l.join(", ")).unwrap(),
                );
            }
            for l in real {
                h.append("x-real-ip", HeaderValue::from_str(&l.join(",")).unwrap());
            }
            for l in fwd {
                let nodes: Vec<_> = l.iter().map(|n| format!("for=\"{n}\"")).collect();
                h.append(
                    http::header::FORWARDED,
                    HeaderValue::from_str(&nodes.join(", ")).unwrap(),
                );
            }
            h
        })
    }

    /// The proxies' behaviour that each source needs to be safe (the documented
    /// requirements): `xff` an appended or replaced `X-Forwarded-For` at every hop,
    /// `forwarded` an appended `Forwarded` at every hop, `real-ip` a hop that
    /// overwrites (or strips) `X-Real-IP`, so that a client's own never arrives.
    fn meets_requirement(source: ClientIpFrom, hops: &[Hop]) -> bool {
        let xff_everywhere = hops.iter().all(|h| h.xff != Xff::Pass);
        match source {
            ClientIpFrom::Peer => true,
            ClientIpFrom::Xff => xff_everywhere,
            ClientIpFrom::Forwarded => hops.iter().all(|h| h.forwarded == Set::Overwrite),
            ClientIpFrom::RealIp => hops.iter().any(|h| h.real_ip != Set::Pass),
        }
    }

    /// Whether the proxies write what `source` reads at every hop, so that the answer
    /// must be the client itself.
    fn exact(source: ClientIpFrom, hops: &[Hop]) -> bool {
        let appended = hops.iter().all(|h| matches!(h.xff, Xff::Append { .. }));
        match source {
            ClientIpFrom::Peer => false,
            ClientIpFrom::Xff => appended,
            ClientIpFrom::Forwarded => hops.iter().all(|h| h.forwarded == Set::Overwrite),
            // the first hop overwrites it with the client, the others pass it on
            ClientIpFrom::RealIp => {
                hops[0].real_ip == Set::Overwrite
                    && hops[1..].iter().all(|h| h.real_ip == Set::Pass)
            }
        }
    }

    proptest! {
        /// Whatever headers a client sends, through trusted proxies that meet the
        /// source's requirement, the answer is the client or one of the proxies: never
        /// an address the client alone chose.
        #[test]
        fn a_client_never_chooses_its_own_address(
            sent in client_headers(),
            hops in prop::collection::vec(hop(), 1..4),
            client in prop_oneof![
                (1u8..=250).prop_map(|n| IpAddr::from([198, 51, 100, n])),
                Just(ip("2001:db8::c")),
            ],
            source in prop::sample::select(ClientIpFrom::ALL.to_vec()),
        ) {
            prop_assume!(meets_requirement(source, &hops));
            let addrs: Vec<IpAddr> = (1..=hops.len() as u8).map(|n| IpAddr::from([10, 0, 0, n])).collect();
            let mut h = sent;
            let mut remote = client;
            for (hop, addr) in hops.iter().zip(&addrs) {
                hop.apply(&mut h, remote);
                remote = *addr;
            }
            let r = rule("10.0.0.0/8, 127.0.0.0/8", source);
            let got = r.client_ip(remote, &h).addr();
            prop_assert!(got == client || addrs.contains(&got), "{got} from {h:?}");
            if exact(source, &hops) {
                prop_assert_eq!(got, client, "{:?}", h);
            }
        }

        /// From a peer that is not trusted nothing is read, in every source.
        #[test]
        fn untrusted_peers_headers_are_ignored(
            sent in client_headers(),
            peer in any::<[u8; 4]>().prop_filter("untrusted", |o| o[0] != 10 && o[0] != 127),
        ) {
            let peer = IpAddr::from(peer);
            for source in ClientIpFrom::ALL {
                let r = rule("10.0.0.0/8, 127.0.0.0/8", source);
                prop_assert_eq!(r.client_ip(peer, &sent), ClientIp::Peer(peer));
            }
        }

        /// Any bytes in the three headers from a trusted peer: no panic, and the answer
        /// is the peer or an address written in them.
        #[test]
        fn any_bytes_from_a_trusted_peer(
            values in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..60), 3),
        ) {
            let mut h = HeaderMap::new();
            for (name, v) in ["x-forwarded-for", "x-real-ip", "forwarded"].iter().zip(&values) {
                if let Ok(v) = HeaderValue::from_bytes(v) {
                    h.insert(*name, v);
                }
            }
            let mut written: Vec<IpAddr> = xff_hops_rev(&h).flatten().collect();
            written.extend(forwarded_hops_rev(&h).flatten());
            written.extend(x_real_ip(&h));
            for source in ClientIpFrom::ALL {
                let got = rule("127.0.0.0/8", source).client_ip(ip("127.0.0.1"), &h);
                if let ClientIp::Forwarded(a) = got {
                    prop_assert!(written.contains(&a), "{} not in {:?}", a, h);
                }
            }
        }
    }
}
