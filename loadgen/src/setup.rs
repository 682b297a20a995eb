//! The servers a run talks to: embedded loopback responders (plus the test DNS
//! responder for the official client) or external endpoints / a DNS domain.
//!
//! Owns the synthetic test keys (public fixtures from the spec's vectors.json),
//! responder placement on cores and fault injection. Must not drive load; the key
//! string is never printed.

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::key::ApiKey;
use ratelimitly_engine::machine::Endpoint;
use rl_responder::{Faults, ResponderConfig, ResponderHandle};

use crate::cli::{Args, AuthArg};

/// `aes_key_id_3` from vectors.json (public synthetic test fixture, not a credential).
const AES_FIXTURE: &str =
    "rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5";
/// `cookie_key_id_2` from vectors.json (public synthetic test fixture).
const COOKIE_FIXTURE: &str =
    "rl-cookie1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqfgrrulczhg30p";
/// `rust_none_fixture` from vectors.json (public synthetic test fixture).
const NONE_FIXTURE: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";

/// Domain the embedded DNS responder serves.
/// Not under `.invalid`: hickory (the official client's resolver) answers NXDOMAIN for
/// that zone without asking the DNS server (RFC 6761).
pub const EMBEDDED_DOMAIN: &str = "loadgen.ratelimitly.test";

/// Why the servers could not be set up.
#[derive(Debug)]
pub enum SetupError {
    /// RATELIMITLY_API_KEY is missing with --endpoint/--domain.
    MissingKeyEnv,
    /// The key text does not parse (the key itself is never shown).
    BadKey(String),
    /// An embedded responder did not start.
    Responder(String),
    /// The embedded DNS responder did not start.
    Dns(std::io::Error),
    /// External DNS discovery failed.
    Discovery(String),
    /// No endpoint at all.
    NoServers,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::MissingKeyEnv => {
                write!(
                    f,
                    "RATELIMITLY_API_KEY must be set with --endpoint/--domain"
                )
            }
            SetupError::BadKey(e) => write!(f, "API key rejected: {e}"),
            SetupError::Responder(e) => write!(f, "embedded responder failed: {e}"),
            SetupError::Dns(e) => write!(f, "embedded DNS responder failed: {e}"),
            SetupError::Discovery(e) => write!(f, "DNS discovery failed: {e}"),
            SetupError::NoServers => write!(f, "no servers"),
        }
    }
}

/// The servers of one run.
pub struct Servers {
    key_text: String,
    pub key: ApiKey,
    /// Every endpoint, oldest server first.
    pub endpoints: Vec<Endpoint>,
    /// Server ids that are silent on purpose (--dead-oldest).
    pub dead: Vec<u64>,
    /// Domain and DNS server the official client (and DNS mode) resolve.
    pub domain: String,
    pub dns_server: Option<SocketAddr>,
    /// True when `endpoints` came from --domain (the engine then uses DNS too).
    pub via_dns: bool,
    pub embedded: bool,
    responders: Vec<ResponderHandle>,
    dns: Option<rl_responder::dns::DnsHandle>,
    /// Threads of the embedded responders and DNS responder.
    pub server_threads: std::collections::HashSet<u32>,
}

impl Servers {
    /// The API key text, for the official client's own parser. Never print it.
    pub fn key_text(&self) -> &str {
        &self.key_text
    }

    /// Datagrams received by every embedded responder so far (None when external).
    pub fn received_datagrams(&self) -> Option<u64> {
        if self.responders.is_empty() {
            return None;
        }
        Some(
            self.responders
                .iter()
                .map(|r| crate::adapt::responder_received(&r.counters()))
                .sum(),
        )
    }

    pub fn stop(self) {
        for r in self.responders {
            r.stop();
        }
        if let Some(d) = self.dns {
            d.stop();
        }
    }
}

/// Server id for the `index`-th embedded responder: start time now, ascending.
fn embedded_server_id(index: usize) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rl_responder::decide::default_server_id(now, index as u64 + 1)
}

/// Starts (or resolves) the servers for `args`. `responder_cores` are where the
/// embedded responders' threads should live.
pub fn start(args: &Args, responder_cores: &[usize]) -> Result<Servers, SetupError> {
    let external = !args.endpoints.is_empty() || args.domain.is_some();
    let key_text = if external {
        std::env::var("RATELIMITLY_API_KEY").map_err(|_| SetupError::MissingKeyEnv)?
    } else {
        match args.auth {
            AuthArg::Aes => AES_FIXTURE,
            AuthArg::Cookie => COOKIE_FIXTURE,
            AuthArg::None => NONE_FIXTURE,
        }
        .to_string()
    };
    let key: ApiKey = key_text
        .trim()
        .parse()
        .map_err(|e| SetupError::BadKey(format!("{e:?}")))?;
    let key_text = key_text.trim().to_string();

    if external {
        return start_external(args, key_text, key);
    }

    let count = args.servers.max(1);
    let mut responders = Vec::with_capacity(count);
    let mut endpoints = Vec::with_capacity(count);
    let mut dead = Vec::new();
    let mut server_threads = std::collections::HashSet::new();
    for i in 0..count {
        let mut cfg = ResponderConfig::new(vec![key.clone()]);
        cfg.server_id = Some(embedded_server_id(i));
        cfg.cores = 1;
        let silent = args.dead_oldest && i == 0;
        cfg.faults = Faults {
            drop_out: args.loss.clamp(0.0, 1.0),
            delay: Duration::from_millis(args.delay_ms),
            jitter: Duration::from_millis(args.jitter_ms),
            silent,
            seed: 0x10ad_0000 + i as u64,
            ..Faults::default()
        };
        // The responder pins its executors itself (executor i on CPU i); move its
        // new threads onto the responder core afterwards.
        let core = responder_cores
            .get(i % responder_cores.len().max(1))
            .copied();
        let before = crate::stats::thread_ids();
        let h = rl_responder::spawn(cfg).map_err(|e| SetupError::Responder(format!("{e}")))?;
        for tid in crate::stats::thread_ids().difference(&before) {
            if let Some(c) = core {
                crate::stats::pin_thread(*tid, c);
            }
            server_threads.insert(*tid);
        }
        let ep = Endpoint {
            server_id: h.server_id(),
            addr: h.addr(),
        };
        if silent {
            dead.push(ep.server_id);
        }
        endpoints.push(ep);
        responders.push(h);
    }
    endpoints.sort_by_key(|e| e.server_id);
    let dns_servers = endpoints
        .iter()
        .map(|e| (e.server_id, vec![e.addr]))
        .collect();
    let before = crate::stats::thread_ids();
    let dns = rl_responder::dns::spawn(EMBEDDED_DOMAIN, dns_servers).map_err(SetupError::Dns)?;
    for tid in crate::stats::thread_ids().difference(&before) {
        if let Some(c) = responder_cores.first() {
            crate::stats::pin_thread(*tid, *c);
        }
        server_threads.insert(*tid);
    }
    Ok(Servers {
        key_text,
        key,
        endpoints,
        dead,
        domain: EMBEDDED_DOMAIN.to_string(),
        dns_server: Some(dns.addr()),
        via_dns: false,
        embedded: true,
        responders,
        dns: Some(dns),
        server_threads,
    })
}

fn start_external(args: &Args, key_text: String, key: ApiKey) -> Result<Servers, SetupError> {
    if !args.endpoints.is_empty() {
        let mut endpoints: Vec<Endpoint> = args
            .endpoints
            .iter()
            .map(|(id, addr)| Endpoint {
                server_id: *id,
                addr: *addr,
            })
            .collect();
        endpoints.sort_by_key(|e| e.server_id);
        // The official client only discovers by DNS: serve the endpoints locally.
        let mut by_id: Vec<(u64, Vec<SocketAddr>)> = Vec::new();
        for e in &endpoints {
            match by_id.iter_mut().find(|(id, _)| *id == e.server_id) {
                Some((_, v)) => v.push(e.addr),
                None => by_id.push((e.server_id, vec![e.addr])),
            }
        }
        let dns = rl_responder::dns::spawn(EMBEDDED_DOMAIN, by_id).map_err(SetupError::Dns)?;
        return Ok(Servers {
            key_text,
            key,
            endpoints,
            dead: Vec::new(),
            domain: EMBEDDED_DOMAIN.to_string(),
            dns_server: Some(dns.addr()),
            via_dns: false,
            embedded: false,
            responders: Vec::new(),
            dns: Some(dns),
            server_threads: std::collections::HashSet::new(),
        });
    }
    let domain = args.domain.clone().unwrap_or_else(|| key.default_domain());
    let d =
        ratelimitly_engine::discovery::resolve(&domain, args.dns_server, Duration::from_secs(3))
            .map_err(|e| SetupError::Discovery(format!("{e:?}")))?;
    let endpoints = ratelimitly_engine::discovery::endpoints(&d);
    if endpoints.is_empty() {
        return Err(SetupError::NoServers);
    }
    Ok(Servers {
        key_text,
        key,
        endpoints,
        dead: Vec::new(),
        domain,
        dns_server: args.dns_server,
        via_dns: true,
        embedded: false,
        responders: Vec::new(),
        dns: None,
        server_threads: std::collections::HashSet::new(),
    })
}
