//! The DNS lookups of discovery (the `dns` feature): a blocking [`Resolver`] over
//! `hickory-resolver` on its own current-thread Tokio runtime, every call bounded in time
//! (the parent module's docs state the caps and the label rule this applies).

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, NameServerConfig, ResolveHosts, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RData, Record};
use hickory_resolver::{TokioResolver, lookup::Lookup};

use super::{
    DiscoveredServer, Discovery, DiscoveryError, MAX_ADDRS_PER_SERVER, MAX_SRV_TARGETS, SRV_PREFIX,
    TOTAL_TIME_FACTOR, parse_server_label, server_start_unix_s,
};

/// UDP attempts per query and nameserver.
const ATTEMPTS: usize = 2;
/// Entries of the resolver's answer cache.
const CACHE_SIZE: u64 = 256;
impl From<&NetError> for DiscoveryError {
    fn from(e: &NetError) -> Self {
        use hickory_resolver::net::DnsError;
        if e.is_nx_domain() {
            return Self::NxDomain;
        }
        if e.is_no_records_found() {
            return Self::NoServer;
        }
        match e {
            NetError::Timeout => Self::Timeout,
            NetError::Io(io) => Self::from(io::Error::new(io.kind(), "dns")),
            NetError::Dns(DnsError::ResponseCode(code)) => Self::ServerError(u16::from(*code)),
            NetError::NoConnections => Self::Io(io::ErrorKind::NotConnected),
            _ => Self::Malformed,
        }
    }
}

/// A blocking DNS resolver for discovery, kept across refreshes so that its cache and
/// its nameserver statistics (failover order) carry over.
pub struct Resolver {
    rt: tokio::runtime::Runtime,
    inner: TokioResolver,
    timeout: Duration,
}

impl fmt::Debug for Resolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resolver")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Resolver {
    /// A resolver asking `dns_server` (UDP, TCP on truncation), or, with `None`, every
    /// nameserver of the system configuration with its options. `timeout` bounds each
    /// attempt; a whole [`Resolver::resolve`] takes at most [`TOTAL_TIME_FACTOR`] times
    /// it.
    pub fn new(dns_server: Option<SocketAddr>, timeout: Duration) -> Result<Self, DiscoveryError> {
        match dns_server {
            Some(addr) => Self::build(Some(&[addr]), timeout),
            None => Self::build(None, timeout),
        }
    }

    /// A resolver asking `servers` in turn (failover between them, UDP with TCP on
    /// truncation). An empty list is [`DiscoveryError::NoDnsServer`].
    pub fn with_nameservers(
        servers: &[SocketAddr],
        timeout: Duration,
    ) -> Result<Self, DiscoveryError> {
        if servers.is_empty() {
            return Err(DiscoveryError::NoDnsServer);
        }
        Self::build(Some(servers), timeout)
    }

    fn build(servers: Option<&[SocketAddr]>, timeout: Duration) -> Result<Self, DiscoveryError> {
        let timeout = timeout.max(Duration::from_millis(1));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(DiscoveryError::from)?;
        let provider = TokioRuntimeProvider::default();
        let mut builder = match servers {
            Some(list) => {
                let ns = list
                    .iter()
                    .map(|addr| {
                        let mut udp = ConnectionConfig::udp();
                        udp.port = addr.port();
                        let mut tcp = ConnectionConfig::tcp();
                        tcp.port = addr.port();
                        NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                    })
                    .collect();
                TokioResolver::builder_with_config(ResolverConfig::from_name_servers(ns), provider)
            }
            None => TokioResolver::builder(provider).map_err(|_| DiscoveryError::NoDnsServer)?,
        };
        let opts: &mut ResolverOpts = builder.options_mut();
        opts.timeout = timeout;
        opts.attempts = ATTEMPTS;
        opts.cache_size = CACHE_SIZE;
        opts.use_hosts_file = ResolveHosts::Never;
        opts.edns0 = true;
        opts.try_tcp_on_error = true;
        let inner = {
            // The resolver's background work is spawned on this runtime.
            let _guard = rt.enter();
            builder.build().map_err(|e| DiscoveryError::from(&e))?
        };
        Ok(Resolver { rt, inner, timeout })
    }

    /// Forgets every cached answer (the next resolve asks the nameservers).
    pub fn clear_cache(&self) {
        self.inner.clear_cache();
    }

    /// Resolves the Ratelimitly servers of `domain`. Additional records of the SRV answer
    /// are used when they hold the targets' addresses; otherwise A and AAAA are looked up
    /// for each target (concurrently). Targets not named `s-<id>` are skipped, and so are
    /// targets without any address.
    pub fn resolve(&self, domain: &str) -> Result<Discovery, DiscoveryError> {
        let srv_name = srv_name(domain)?;
        let budget = self.timeout * TOTAL_TIME_FACTOR;
        let resolver = self.inner.clone();
        self.rt.block_on(async move {
            match tokio::time::timeout(budget, resolve_async(resolver, srv_name)).await {
                Ok(r) => r,
                Err(_) => Err(DiscoveryError::Timeout),
            }
        })
    }
}

fn srv_name(domain: &str) -> Result<Name, DiscoveryError> {
    let domain = domain.trim_end_matches('.');
    if domain.is_empty() {
        return Err(DiscoveryError::InvalidDomain);
    }
    Name::from_ascii(format!("{SRV_PREFIX}{domain}.")).map_err(|_| DiscoveryError::InvalidDomain)
}

/// Resolves the Ratelimitly servers of `domain` with a one-off [`Resolver`] (no cache
/// carried over). `dns_server`: where to send the queries; `None` uses the system
/// configuration. `timeout` bounds each attempt.
pub fn resolve(
    domain: &str,
    dns_server: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Discovery, DiscoveryError> {
    srv_name(domain)?;
    Resolver::new(dns_server, timeout)?.resolve(domain)
}

/// An SRV target with a valid server label.
struct Pending {
    target: Name,
    port: u16,
    ttl_s: u32,
}

/// An SRV target with its server id and the addresses found for it.
type Found = (u64, Pending, Vec<IpAddr>);

/// One discovery: the SRV lookup, the addresses of its targets, then the servers.
async fn resolve_async(
    resolver: TokioResolver,
    srv_name: Name,
) -> Result<Discovery, DiscoveryError> {
    let srv = resolver
        .srv_lookup(srv_name)
        .await
        .map_err(|e| DiscoveryError::from(&e))?;
    let pending = srv_targets(&srv);
    let (found, last_err) = target_addresses(&resolver, &srv, pending).await;
    discovery(found, last_err)
}

/// The SRV targets with a valid server label, keyed (and so sorted) by server id; a
/// server named by several records keeps the smallest TTL.
fn srv_targets(srv: &Lookup) -> BTreeMap<u64, Pending> {
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    let mut skipped = 0usize;
    for rec in srv.answers() {
        let RData::SRV(s) = &rec.data else { continue };
        let Some(id) = parse_server_label(&name_text(&s.target)) else {
            skipped += 1;
            continue;
        };
        pending
            .entry(id)
            .and_modify(|p| p.ttl_s = p.ttl_s.min(rec.ttl))
            .or_insert(Pending {
                target: s.target.clone(),
                port: s.port,
                ttl_s: rec.ttl,
            });
    }
    if skipped > 0 {
        tracing::debug!(skipped, "SRV targets without a server label ignored");
    }
    if pending.len() > MAX_SRV_TARGETS {
        tracing::warn!(
            found = pending.len(),
            kept = MAX_SRV_TARGETS,
            "more SRV targets than one discovery looks up; keeping the oldest servers"
        );
    }
    pending
}

/// The addresses of the oldest [`MAX_SRV_TARGETS`] targets: those the SRV answer carries,
/// else an A and an AAAA lookup per target, all at once. Returns them sorted by server id,
/// with the last lookup error seen.
async fn target_addresses(
    resolver: &TokioResolver,
    srv: &Lookup,
    pending: BTreeMap<u64, Pending>,
) -> (Vec<Found>, Option<DiscoveryError>) {
    let mut lookups = tokio::task::JoinSet::new();
    let mut found: Vec<Found> = Vec::new();
    for (id, mut p) in pending.into_iter().take(MAX_SRV_TARGETS) {
        let mut addrs = Vec::new();
        collect_addrs(srv.additionals(), &p.target, &mut addrs, &mut p.ttl_s);
        collect_addrs(srv.answers(), &p.target, &mut addrs, &mut p.ttl_s);
        if addrs.is_empty() {
            let r = resolver.clone();
            lookups.spawn(async move {
                let v4 = r.ipv4_lookup(p.target.clone());
                let v6 = r.ipv6_lookup(p.target.clone());
                let (v4, v6) = tokio::join!(v4, v6);
                (id, p, v4, v6)
            });
        } else {
            found.push((id, p, addrs));
        }
    }
    let mut last_err = None;
    while let Some(joined) = lookups.join_next().await {
        let Ok((id, mut p, v4, v6)) = joined else {
            continue;
        };
        let mut addrs = Vec::new();
        for r in [v4, v6] {
            match r {
                Ok(l) => add_lookup(&l, &p.target, &mut addrs, &mut p.ttl_s),
                Err(e) if e.is_no_records_found() => {}
                Err(e) => {
                    tracing::debug!(target = %p.target, error = %e, "address lookup failed");
                    last_err = Some(DiscoveryError::from(&e));
                }
            }
        }
        found.push((id, p, addrs));
    }
    found.sort_by_key(|(id, _, _)| *id);
    (found, last_err)
}

/// The servers with at least one address (at most [`MAX_ADDRS_PER_SERVER`] each), oldest
/// first; none is `NoServer`, or the lookup error that left them without addresses.
fn discovery(
    found: Vec<Found>,
    last_err: Option<DiscoveryError>,
) -> Result<Discovery, DiscoveryError> {
    let mut servers = Vec::with_capacity(found.len());
    for (id, p, mut addrs) in found {
        if addrs.is_empty() {
            continue;
        }
        if addrs.len() > MAX_ADDRS_PER_SERVER {
            tracing::debug!(
                server_id = id,
                addrs = addrs.len(),
                kept = MAX_ADDRS_PER_SERVER,
                "server addresses capped"
            );
            addrs.truncate(MAX_ADDRS_PER_SERVER);
        }
        servers.push(DiscoveredServer {
            server_id: id,
            target: name_text(&p.target),
            port: p.port,
            addrs,
            ttl_s: p.ttl_s,
            start_time_unix_s: server_start_unix_s(id),
        });
    }
    if servers.is_empty() {
        return Err(match last_err {
            Some(DiscoveryError::NxDomain) | None => DiscoveryError::NoServer,
            Some(e) => e,
        });
    }
    let min_ttl_s = servers.iter().map(|s| s.ttl_s).min().unwrap_or(0);
    Ok(Discovery { servers, min_ttl_s })
}

/// Lowercase target text without the trailing dot.
fn name_text(name: &Name) -> String {
    let mut s = name.to_ascii().to_ascii_lowercase();
    if s.ends_with('.') {
        s.pop();
    }
    s
}

fn add_lookup(l: &Lookup, owner: &Name, addrs: &mut Vec<IpAddr>, ttl_s: &mut u32) {
    collect_addrs(l.answers(), owner, addrs, ttl_s);
}

/// Appends the A/AAAA addresses for `owner` found in `records` (deduplicated).
fn collect_addrs(records: &[Record], owner: &Name, addrs: &mut Vec<IpAddr>, ttl_s: &mut u32) {
    for rec in records {
        if !rec.name.eq_case(owner) && rec.name != *owner {
            continue;
        }
        let ip = match &rec.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        if !addrs.contains(&ip) {
            addrs.push(ip);
        }
        *ttl_s = (*ttl_s).min(rec.ttl);
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, UdpSocket};
    use std::time::Instant;

    use hickory_proto::op::Message;
    use hickory_proto::rr::RecordType;

    use super::*;
    use crate::discovery::{SERVER_ID_EPOCH_UNIX_S, endpoints};
    use crate::proto::machine::Endpoint;

    #[test]
    fn invalid_domain_is_rejected_before_io() {
        let server: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(
            resolve("", Some(server), Duration::from_millis(10)),
            Err(DiscoveryError::InvalidDomain)
        );
        assert_eq!(
            resolve("bad..domain", Some(server), Duration::from_millis(10)),
            Err(DiscoveryError::InvalidDomain)
        );
    }

    /// A loopback socket that never answers: both attempts time out.
    #[test]
    fn silent_server_times_out() {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let t0 = Instant::now();
        let r = resolve("example.com", Some(addr), Duration::from_millis(30));
        assert_eq!(r, Err(DiscoveryError::Timeout));
        assert!(t0.elapsed() < Duration::from_secs(5));
    }

    /// One server with many addresses keeps at most MAX_ADDRS_PER_SERVER of them, so it
    /// cannot crowd the others out of the 64 endpoints a request addresses.
    #[test]
    fn addresses_per_server_are_capped() {
        let many: Vec<SocketAddr> = (1..=7u8)
            .map(|i| SocketAddr::from(([127, 0, 1, i], 4300)))
            .collect();
        let other: SocketAddr = "127.0.0.9:4301".parse().unwrap();
        let dns = rl_responder::dns::spawn("caps.test", vec![(5, many.clone()), (9, vec![other])])
            .unwrap();
        let d = resolve("caps.test", Some(dns.addr()), Duration::from_secs(2)).unwrap();
        assert_eq!(d.servers.len(), 2);
        assert_eq!(d.servers[0].addrs.len(), MAX_ADDRS_PER_SERVER);
        assert_eq!(d.servers[0].addrs[0], many[0].ip());
        assert_eq!(d.servers[1].addrs, vec![other.ip()]);
        dns.stop();
    }

    /// A dead first nameserver does not stop discovery: the resolver fails over.
    #[test]
    fn fails_over_to_the_next_nameserver() {
        let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a: SocketAddr = "127.0.0.1:4500".parse().unwrap();
        let dns = rl_responder::dns::spawn("fo.test", vec![(77, vec![a])]).unwrap();
        let r = Resolver::with_nameservers(
            &[silent.local_addr().unwrap(), dns.addr()],
            Duration::from_millis(300),
        )
        .unwrap();
        let d = r.resolve("fo.test").unwrap();
        assert_eq!(d.servers[0].server_id, 77);
        // Cached, then asked again after the cache is cleared: the same answer.
        assert_eq!(r.resolve("fo.test").unwrap(), d);
        r.clear_cache();
        assert_eq!(r.resolve("fo.test").unwrap(), d);
        assert!(Resolver::with_nameservers(&[], Duration::from_millis(10)).is_err());
        dns.stop();
    }

    /// A nameserver whose UDP answers are truncated (TC bit, no records) and whose TCP
    /// answer is complete: discovery retries over TCP and finds the server.
    #[test]
    fn truncated_udp_answer_falls_back_to_tcp() {
        use std::io::{Read, Write};
        use std::net::TcpListener;

        use hickory_proto::rr::rdata::{A, SRV};
        // UDP and TCP on the same port number (separate namespaces; retry if taken).
        let (udp, tcp) = (0..20)
            .find_map(|_| {
                let udp = UdpSocket::bind("127.0.0.1:0").ok()?;
                let tcp = TcpListener::bind(udp.local_addr().ok()?).ok()?;
                Some((udp, tcp))
            })
            .expect("a free port for UDP and TCP");
        let addr = udp.local_addr().unwrap();
        udp.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        // Answers the first UDP query (bounded wait) with an empty, truncated response.
        let udp_thread = std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            for _ in 0..20 {
                let Ok((n, from)) = udp.recv_from(&mut buf) else {
                    continue;
                };
                let q = Message::from_vec(&buf[..n]).unwrap();
                let mut r = Message::response(q.metadata.id, q.metadata.op_code);
                r.metadata.truncation = true;
                r.add_query(q.queries[0].clone());
                udp.send_to(&r.to_vec().unwrap(), from).unwrap();
                return 1;
            }
            0
        });
        let tcp_thread = std::thread::spawn(move || {
            let (mut conn, _) = tcp.accept().unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            let mut len = [0u8; 2];
            conn.read_exact(&mut len).unwrap();
            let mut q = vec![0u8; usize::from(u16::from_be_bytes(len))];
            conn.read_exact(&mut q).unwrap();
            let q = Message::from_vec(&q).unwrap();
            let name = q.queries[0].name().clone();
            let mut r = Message::response(q.metadata.id, q.metadata.op_code);
            r.add_query(q.queries[0].clone());
            let target = Name::from_ascii("s-42.tc.test.").unwrap();
            r.add_answer(Record::from_rdata(
                name,
                60,
                RData::SRV(SRV::new(0, 0, 4600, target.clone())),
            ));
            r.add_additional(Record::from_rdata(
                target,
                60,
                RData::A(A(Ipv4Addr::new(127, 0, 0, 42))),
            ));
            let bytes = r.to_vec().unwrap();
            let mut framed = (bytes.len() as u16).to_be_bytes().to_vec();
            framed.extend_from_slice(&bytes);
            conn.write_all(&framed).unwrap();
        });
        let d = resolve("tc.test", Some(addr), Duration::from_secs(1)).unwrap();
        assert_eq!(d.servers.len(), 1);
        assert_eq!(d.servers[0].server_id, 42);
        assert_eq!(d.servers[0].addrs, vec![IpAddr::from([127, 0, 0, 42])]);
        assert_eq!(udp_thread.join().unwrap(), 1, "asked over UDP first");
        tcp_thread.join().unwrap();
    }

    /// Against the project's test DNS responder on loopback (SRV + additional A records).
    #[test]
    fn resolves_from_test_dns_responder() {
        let young = (400u64 << 23) | 7;
        let old = (100u64 << 23) | 1;
        let a1: SocketAddr = "127.0.0.1:4100".parse().unwrap();
        let a2: SocketAddr = "127.0.0.2:4100".parse().unwrap();
        let b1: SocketAddr = "127.0.0.3:4200".parse().unwrap();
        let dns = rl_responder::dns::spawn("rl.test", vec![(young, vec![a1, a2]), (old, vec![b1])])
            .unwrap();
        let d = resolve("rl.test", Some(dns.addr()), Duration::from_secs(2)).unwrap();
        assert_eq!(d.servers.len(), 2);
        assert_eq!(d.servers[0].server_id, old);
        assert_eq!(
            d.servers[0].target,
            "s-".to_owned() + &old.to_string() + ".rl.test"
        );
        assert_eq!(d.servers[0].addrs, vec![b1.ip()]);
        assert_eq!(d.servers[0].port, 4200);
        assert_eq!(d.servers[0].start_time_unix_s, SERVER_ID_EPOCH_UNIX_S + 100);
        assert_eq!(d.servers[1].addrs, vec![a1.ip(), a2.ip()]);
        assert!(d.min_ttl_s > 0);
        let eps = endpoints(&d);
        assert_eq!(eps.len(), 3);
        assert_eq!(
            eps[0],
            Endpoint {
                server_id: old,
                addr: b1
            }
        );
        assert_eq!(
            eps[2],
            Endpoint {
                server_id: young,
                addr: a2
            }
        );

        // Another domain: NXDOMAIN from this responder.
        assert_eq!(
            resolve("other.test", Some(dns.addr()), Duration::from_secs(2)),
            Err(DiscoveryError::NxDomain)
        );
        // No servers at all: the SRV set is empty.
        dns.set_servers(Vec::new());
        let r = resolve("rl.test", Some(dns.addr()), Duration::from_secs(2));
        assert!(
            matches!(r, Err(DiscoveryError::NoServer | DiscoveryError::NxDomain)),
            "{r:?}"
        );
        dns.stop();
    }

    /// A DNS server that answers SRV without additional records, A for one target,
    /// nothing for AAAA, and ignores everything after `max` queries. Returns its address.
    fn bare_dns(max: usize) -> (SocketAddr, std::thread::JoinHandle<usize>) {
        use hickory_proto::rr::rdata::{A, SRV};
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let addr = sock.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut served = 0;
            let mut buf = [0u8; 1500];
            for _ in 0..max {
                let Ok((n, from)) = sock.recv_from(&mut buf) else {
                    break;
                };
                let q = Message::from_vec(&buf[..n]).unwrap();
                let mut r = Message::response(q.metadata.id, q.metadata.op_code);
                let query = q.queries[0].clone();
                let name = query.name().clone();
                match query.query_type() {
                    RecordType::SRV => {
                        for (id, port) in [(0u64, 1u16), (12, 4400), (3, 4401)] {
                            let target = Name::from_ascii(format!("s-{id}.bare.test.")).unwrap();
                            let srv = SRV::new(0, 0, port, target);
                            r.add_answer(Record::from_rdata(name.clone(), 60, RData::SRV(srv)));
                        }
                        // Not a server label: ignored.
                        let other = Name::from_ascii("www.bare.test.").unwrap();
                        r.add_answer(Record::from_rdata(
                            name.clone(),
                            60,
                            RData::SRV(SRV::new(0, 0, 1, other)),
                        ));
                    }
                    RecordType::A if name.to_ascii().starts_with("s-12.") => {
                        let a = A(Ipv4Addr::new(127, 0, 0, 12));
                        r.add_answer(Record::from_rdata(name.clone(), 7, RData::A(a)));
                    }
                    _ => {}
                }
                r.add_query(query);
                sock.send_to(&r.to_vec().unwrap(), from).unwrap();
                served += 1;
            }
            served
        });
        (addr, t)
    }

    #[test]
    fn queries_addresses_when_no_additionals() {
        let (addr, t) = bare_dns(5);
        let d = resolve("bare.test", Some(addr), Duration::from_secs(2)).unwrap();
        // s-0 is not a server; s-3 has no address; only s-12 remains.
        assert_eq!(d.servers.len(), 1, "{d:?}");
        let s = &d.servers[0];
        assert_eq!((s.server_id, s.port), (12, 4400));
        assert_eq!(s.addrs, vec![IpAddr::from([127, 0, 0, 12])]);
        assert_eq!((s.ttl_s, d.min_ttl_s), (7, 7));
        // SRV, then A + AAAA for s-3 and for s-12.
        assert_eq!(t.join().unwrap(), 5);
    }
}
