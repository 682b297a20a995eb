//! Server discovery by DNS (docs/protocol.md §7, §13): a blocking SRV lookup of
//! `_ratelimitly._udp.<domain>`, then the A/AAAA addresses of every SRV target whose first
//! label is `s-<canonical decimal server id>`.
//!
//! Owns: the DNS query/response exchange (hickory-proto `Message` encode/decode over a std
//! `UdpSocket`, with a TCP retry when an answer comes back truncated), the server-label
//! rule, the server-id → start-time arithmetic, and the conversion of a discovery result
//! into engine [`Endpoint`]s.
//!
//! Must not touch: request policy, the wire format of Ratelimitly datagrams, or any
//! background scheduling — refreshing periodically and keeping the last good set is the
//! caller's job (the engine's). Everything here is blocking and bounded by the timeout
//! passed in; nothing is cached.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, Record, RecordType};

use crate::machine::Endpoint;

/// Unix time (seconds) of 2025-01-01T00:00:00Z, the epoch of server ids (docs/protocol.md §7).
pub const SERVER_ID_EPOCH_UNIX_S: u64 = 1_735_689_600;
/// Number of low bits of a server id below its start time (docs/protocol.md §7: `id >> 23`).
pub const SERVER_ID_TIME_SHIFT: u32 = 23;
/// The SRV service prefix put in front of the domain.
pub const SRV_PREFIX: &str = "_ratelimitly._udp.";
/// Default per-attempt timeout used by callers that have no opinion.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest DNS message we accept over UDP (advertised through EDNS).
const UDP_PAYLOAD: usize = 4096;
/// Attempts per query over UDP (the first try plus one retry).
const UDP_ATTEMPTS: u32 = 2;
/// Bound on datagrams read while waiting for one answer (stray or mismatched replies).
const MAX_STRAY_REPLIES: u32 = 64;

/// One Ratelimitly server found in DNS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredServer {
    /// Server id from the target's first label `s-<id>`.
    pub server_id: u64,
    /// SRV target name, without the trailing dot.
    pub target: String,
    /// SRV port; every address of the server uses it.
    pub port: u16,
    /// A and AAAA addresses of the target, deduplicated, in the order received.
    pub addrs: Vec<IpAddr>,
    /// Smallest TTL among this server's SRV and address records, in seconds.
    pub ttl_s: u32,
    /// `server_start_unix_s(server_id)`.
    pub start_time_unix_s: u64,
}

/// Result of one discovery: the usable servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Discovery {
    /// Sorted by server id: the first one is the oldest server.
    pub servers: Vec<DiscoveredServer>,
    /// Smallest TTL among all records used (seconds); a refresh should come no later.
    pub min_ttl_s: u32,
}

impl Discovery {
    /// The oldest server (smallest id), if any.
    pub fn oldest(&self) -> Option<&DiscoveredServer> {
        self.servers.first()
    }
}

pub use crate::error::DiscoveryError;

/// Start time of a server, Unix seconds: `(id >> 23) + 1735689600`.
pub fn server_start_unix_s(server_id: u64) -> u64 {
    (server_id >> SERVER_ID_TIME_SHIFT) + SERVER_ID_EPOCH_UNIX_S
}

/// The server id of an SRV target whose first label is `s-<canonical decimal u64>`:
/// lowercase `s-`, ASCII digits only, no leading zero, fits a u64, not 0.
pub fn parse_server_label(target: &str) -> Option<u64> {
    let first = target.split('.').next()?;
    let digits = first.strip_prefix("s-")?;
    if digits.is_empty() || digits.len() > 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.starts_with('0') {
        return None; // leading zero, or the id 0 itself
    }
    digits.parse::<u64>().ok()
}

/// One [`Endpoint`] per (server, address), oldest server first.
pub fn endpoints(d: &Discovery) -> Vec<Endpoint> {
    d.servers
        .iter()
        .flat_map(|s| {
            s.addrs.iter().map(move |ip| Endpoint {
                server_id: s.server_id,
                addr: SocketAddr::new(*ip, s.port),
            })
        })
        .collect()
}

/// The first `nameserver` of /etc/resolv.conf, port 53.
pub fn system_dns_server() -> Option<SocketAddr> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    parse_resolv_conf(&text)
}

/// The first usable `nameserver` line of a resolv.conf text, port 53 (a `%zone` is dropped).
pub fn parse_resolv_conf(text: &str) -> Option<SocketAddr> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next()? != "nameserver" {
            return None;
        }
        let addr = words.next()?;
        let addr = addr.split('%').next()?;
        addr.parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, 53))
    })
}

/// Resolves the Ratelimitly servers of `domain`.
///
/// `dns_server`: where to send the queries; `None` uses the first nameserver of
/// /etc/resolv.conf. `timeout` bounds each attempt of each query; a UDP query is tried
/// twice, and an answer with the truncation bit is asked again over TCP. Additional
/// records of the SRV answer are used when they hold the targets' addresses; otherwise
/// A and AAAA are queried for each target. Targets not named `s-<id>` are skipped, and so
/// are targets without any address.
pub fn resolve(
    domain: &str,
    dns_server: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Discovery, DiscoveryError> {
    let server = match dns_server {
        Some(s) => s,
        None => system_dns_server().ok_or(DiscoveryError::NoDnsServer)?,
    };
    let timeout = timeout.max(Duration::from_millis(1));
    let domain = domain.trim_end_matches('.');
    if domain.is_empty() {
        return Err(DiscoveryError::InvalidDomain);
    }
    let srv_name = Name::from_ascii(format!("{SRV_PREFIX}{domain}."))
        .map_err(|_| DiscoveryError::InvalidDomain)?;
    let client = DnsClient::new(server, timeout)?;
    let srv_answer = client.query(&srv_name, RecordType::SRV)?;

    // Collect SRV targets with a valid server label, keyed by server id.
    struct Pending {
        target: Name,
        port: u16,
        ttl_s: u32,
    }
    let mut pending: BTreeMap<u64, Pending> = BTreeMap::new();
    for rec in &srv_answer.answers {
        let RData::SRV(srv) = &rec.data else { continue };
        let target_text = name_text(&srv.target);
        let Some(id) = parse_server_label(&target_text) else {
            continue;
        };
        pending
            .entry(id)
            .and_modify(|p| p.ttl_s = p.ttl_s.min(rec.ttl))
            .or_insert(Pending {
                target: srv.target.clone(),
                port: srv.port,
                ttl_s: rec.ttl,
            });
    }

    let mut servers = Vec::with_capacity(pending.len());
    let mut last_err = None;
    for (id, p) in pending {
        let mut addrs = Vec::new();
        let mut ttl_s = p.ttl_s;
        collect_addrs(&srv_answer.additionals, &p.target, &mut addrs, &mut ttl_s);
        collect_addrs(&srv_answer.answers, &p.target, &mut addrs, &mut ttl_s);
        if addrs.is_empty() {
            for rtype in [RecordType::A, RecordType::AAAA] {
                match client.query(&p.target, rtype) {
                    Ok(msg) => collect_addrs(&msg.answers, &p.target, &mut addrs, &mut ttl_s),
                    Err(e) => last_err = Some(e),
                }
            }
        }
        if addrs.is_empty() {
            continue;
        }
        servers.push(DiscoveredServer {
            server_id: id,
            target: name_text(&p.target),
            port: p.port,
            addrs,
            ttl_s,
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
    let mut s = name.to_ascii();
    if s.ends_with('.') {
        s.pop();
    }
    s
}

/// Appends the A/AAAA addresses for `owner` found in `records` (deduplicated).
fn collect_addrs(records: &[Record], owner: &Name, addrs: &mut Vec<IpAddr>, ttl_s: &mut u32) {
    for rec in records {
        if rec.name != *owner {
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

/// One DNS server, one UDP socket, bounded attempts.
struct DnsClient {
    server: SocketAddr,
    socket: UdpSocket,
    timeout: Duration,
}

impl DnsClient {
    fn new(server: SocketAddr, timeout: Duration) -> Result<Self, DiscoveryError> {
        let bind: SocketAddr = if server.is_ipv4() {
            (Ipv4Addr::UNSPECIFIED, 0).into()
        } else {
            (Ipv6Addr::UNSPECIFIED, 0).into()
        };
        let socket = UdpSocket::bind(bind)?;
        socket.connect(server)?;
        Ok(Self {
            server,
            socket,
            timeout,
        })
    }

    /// Asks `name`/`rtype`; checks id, question and response code.
    fn query(&self, name: &Name, rtype: RecordType) -> Result<Message, DiscoveryError> {
        let mut msg = Message::query();
        msg.metadata.recursion_desired = true;
        msg.add_query(Query::query(name.clone(), rtype));
        let mut edns = Edns::new();
        edns.set_max_payload(UDP_PAYLOAD as u16);
        msg.set_edns(edns);
        let bytes = msg.to_vec().map_err(|_| DiscoveryError::Malformed)?;
        let id = msg.metadata.id;

        let mut last = DiscoveryError::Timeout;
        for _ in 0..UDP_ATTEMPTS {
            match self.exchange_udp(&bytes, id, name, rtype) {
                Ok(answer) if answer.metadata.truncation => {
                    return check_rcode(self.exchange_tcp(&bytes, id, name, rtype)?);
                }
                Ok(answer) => return check_rcode(answer),
                Err(e @ (DiscoveryError::Timeout | DiscoveryError::Io(_))) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    fn exchange_udp(
        &self,
        query: &[u8],
        id: u16,
        name: &Name,
        rtype: RecordType,
    ) -> Result<Message, DiscoveryError> {
        self.socket.send(query)?;
        let deadline = Instant::now() + self.timeout;
        let mut buf = vec![0u8; UDP_PAYLOAD];
        for _ in 0..MAX_STRAY_REPLIES {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(DiscoveryError::Timeout);
            }
            self.socket.set_read_timeout(Some(left))?;
            // ICMP port unreachable surfaces as ConnectionRefused: the caller retries once.
            let n = self.socket.recv(&mut buf)?;
            match Message::from_vec(&buf[..n]) {
                Ok(m) if is_answer_to(&m, id, name, rtype) => return Ok(m),
                // A stray or stale reply (e.g. to the first attempt): keep waiting.
                Ok(_) => continue,
                Err(_) => {
                    // Undecodable but addressed to us: report it as malformed.
                    if n >= 2 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                        return Err(DiscoveryError::Malformed);
                    }
                }
            }
        }
        Err(DiscoveryError::Timeout)
    }

    fn exchange_tcp(
        &self,
        query: &[u8],
        id: u16,
        name: &Name,
        rtype: RecordType,
    ) -> Result<Message, DiscoveryError> {
        let mut stream = TcpStream::connect_timeout(&self.server, self.timeout)?;
        stream.set_read_timeout(Some(self.timeout))?;
        stream.set_write_timeout(Some(self.timeout))?;
        let len = u16::try_from(query.len()).map_err(|_| DiscoveryError::Malformed)?;
        let mut framed = Vec::with_capacity(query.len() + 2);
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(query);
        stream.write_all(&framed)?;
        let mut len_buf = [0u8; 2];
        stream.read_exact(&mut len_buf)?;
        let mut buf = vec![0u8; usize::from(u16::from_be_bytes(len_buf))];
        stream.read_exact(&mut buf)?;
        let m = Message::from_vec(&buf).map_err(|_| DiscoveryError::Malformed)?;
        if is_answer_to(&m, id, name, rtype) {
            Ok(m)
        } else {
            Err(DiscoveryError::Malformed)
        }
    }
}

fn is_answer_to(m: &Message, id: u16, name: &Name, rtype: RecordType) -> bool {
    m.metadata.id == id
        && m.metadata.message_type == MessageType::Response
        && m.queries.len() == 1
        && m.queries[0].name() == name
        && m.queries[0].query_type() == rtype
}

fn check_rcode(m: Message) -> Result<Message, DiscoveryError> {
    match m.metadata.response_code {
        ResponseCode::NoError => Ok(m),
        ResponseCode::NXDomain => Err(DiscoveryError::NxDomain),
        other => Err(DiscoveryError::ServerError(u16::from(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_accepts_canonical_ids() {
        assert_eq!(parse_server_label("s-1.example.com"), Some(1));
        assert_eq!(parse_server_label("s-42"), Some(42));
        assert_eq!(parse_server_label("s-42.example.com."), Some(42));
        assert_eq!(
            parse_server_label("s-18446744073709551615.x"),
            Some(u64::MAX)
        );
    }

    #[test]
    fn label_rejects_non_canonical() {
        for bad in [
            "",
            "s-",
            "s-0",
            "s-00",
            "s-01",
            "S-1",
            "s-1a",
            "s-+1",
            "s- 1",
            "s-18446744073709551616",
            "s-99999999999999999999999",
            "x-1",
            "ss-1",
            "example.s-1",
            "s-١",
        ] {
            assert_eq!(parse_server_label(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn start_time_math() {
        assert_eq!(server_start_unix_s(1), 1_735_689_600);
        assert_eq!(server_start_unix_s((1 << 23) - 1), 1_735_689_600);
        assert_eq!(server_start_unix_s(1 << 23), 1_735_689_601);
        // 2026-01-01T00:00:00Z = 1767225600 = epoch + 31536000 s.
        let id = (31_536_000u64 << 23) | 12345;
        assert_eq!(server_start_unix_s(id), 1_767_225_600);
        assert_eq!(
            server_start_unix_s(u64::MAX),
            (u64::MAX >> 23) + 1_735_689_600
        );
    }

    #[test]
    fn resolv_conf_parsing() {
        let text = "# comment\nsearch x\nnameserver fe80::1%eth0\nnameserver 10.0.0.1\n";
        assert_eq!(
            parse_resolv_conf(text),
            Some("[fe80::1]:53".parse().unwrap())
        );
        assert_eq!(
            parse_resolv_conf("nameserver 10.0.0.1"),
            Some("10.0.0.1:53".parse().unwrap())
        );
        assert_eq!(parse_resolv_conf("nameserver bogus\n"), None);
        assert_eq!(parse_resolv_conf(""), None);
    }

    #[test]
    fn endpoints_one_per_address() {
        let d = Discovery {
            servers: vec![
                DiscoveredServer {
                    server_id: 5,
                    target: "s-5.x".into(),
                    port: 9000,
                    addrs: vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
                    ttl_s: 30,
                    start_time_unix_s: server_start_unix_s(5),
                },
                DiscoveredServer {
                    server_id: 9,
                    target: "s-9.x".into(),
                    port: 9001,
                    addrs: vec!["127.0.0.2".parse().unwrap()],
                    ttl_s: 30,
                    start_time_unix_s: server_start_unix_s(9),
                },
            ],
            min_ttl_s: 30,
        };
        let eps = endpoints(&d);
        assert_eq!(eps.len(), 3);
        assert_eq!(eps[0].server_id, 5);
        assert_eq!(eps[1].addr, "[::1]:9000".parse().unwrap());
        assert_eq!(eps[2].addr, "127.0.0.2:9001".parse().unwrap());
        assert_eq!(d.oldest().map(|s| s.server_id), Some(5));
    }

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
