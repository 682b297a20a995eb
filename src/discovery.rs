//! Server discovery by DNS (docs/protocol.md §7, §13): an SRV lookup of
//! `_ratelimitly._udp.<domain>`, then the A/AAAA addresses of every SRV target whose first
//! label is `s-<canonical decimal server id>`.
//!
//! Owns: the DNS lookups ([`Resolver`], with the `dns` cargo feature, on by default:
//! `hickory-resolver`, which honours every resolv.conf
//! nameserver and its options, fails over between nameservers, retries over TCP when a
//! UDP answer is truncated, and caches answers by TTL), the caps on what one discovery
//! may look up, the server-label rule, the server-id → start-time arithmetic, and the
//! conversion of a discovery result into engine [`Endpoint`]s.
//!
//! Must not touch: request policy, the wire format of Ratelimitly datagrams, or any
//! background scheduling — refreshing periodically and keeping the last good set is the
//! caller's job (the engine's membership). A [`Resolver`] is blocking (it runs its own
//! current-thread Tokio runtime) and every call is bounded in time.
//!
//! Caps, so that a large or hostile answer cannot make one discovery unbounded or let
//! one server crowd out the others once the endpoint list is cut to 64:
//! - at most [`MAX_SRV_TARGETS`] SRV targets are looked up (the oldest servers, by id);
//! - at most [`MAX_ADDRS_PER_SERVER`] addresses are kept per server;
//! - one discovery takes at most [`TOTAL_TIME_FACTOR`] × the per-attempt timeout.
//!
//! Without the `dns` feature only the lookups are left out: the server-label rule, the
//! server-id arithmetic and the conversion to endpoints stay (the responder and tools
//! use them), and an engine built with a domain fails with `BuildError::DnsNotCompiled`.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::proto::machine::Endpoint;

#[cfg(feature = "dns")]
mod resolver;
#[cfg(feature = "dns")]
pub use resolver::{Resolver, resolve};

/// Unix time (seconds) of 2025-01-01T00:00:00Z, the epoch of server ids (docs/protocol.md §7).
pub const SERVER_ID_EPOCH_UNIX_S: u64 = 1_735_689_600;
/// Number of low bits of a server id below its start time (docs/protocol.md §7: `id >> 23`).
pub const SERVER_ID_TIME_SHIFT: u32 = 23;
/// The SRV service prefix put in front of the domain.
pub const SRV_PREFIX: &str = "_ratelimitly._udp.";
/// Default per-attempt timeout used by callers that have no opinion.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// SRV targets whose addresses one discovery looks up (the smallest ids: the oldest).
pub const MAX_SRV_TARGETS: usize = 64;
/// Addresses kept per server (A before AAAA, in the order received).
pub const MAX_ADDRS_PER_SERVER: usize = 4;
/// One discovery lasts at most this many per-attempt timeouts.
pub const TOTAL_TIME_FACTOR: u32 = 3;

/// One Ratelimitly server found in DNS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredServer {
    /// Server id from the target's first label `s-<id>`.
    pub server_id: u64,
    /// SRV target name, without the trailing dot.
    pub target: String,
    /// SRV port; every address of the server uses it.
    pub port: u16,
    /// A and AAAA addresses of the target, deduplicated, in the order received, at most
    /// [`MAX_ADDRS_PER_SERVER`].
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

pub use crate::proto::error::DiscoveryError;

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

/// The first `nameserver` of /etc/resolv.conf, port 53 (informational: the resolver
/// itself reads every nameserver).
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
}
