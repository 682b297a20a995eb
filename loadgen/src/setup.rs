//! The servers a run talks to: embedded loopback responders (plus the test DNS
//! responder for the official client) or external endpoints / a DNS domain.
//!
//! Owns the choice of key (a public fixture from `rl-testkit` for embedded runs; for
//! external servers the key from RATELIMITLY_API_KEY or --key-file, loaded by the
//! engine's `key_source`), responder placement on cores and fault injection. Must not
//! drive load; the key string is never printed.

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ratelimitly_engine::key_source::{self, KeyLoadError, KeyText};
use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::key::ApiKey;
use rl_responder::{Faults, ResponderConfig, ResponderHandle};
use rl_testkit::keys;

use crate::cli::Args;

/// Domain the embedded DNS responder serves.
/// Not under `.invalid`: hickory (the official client's resolver) answers NXDOMAIN for
/// that zone without asking the DNS server (RFC 6761).
pub const EMBEDDED_DOMAIN: &str = "loadgen.ratelimitly.test";

/// Dedup entries of each embedded responder under `--chaos` (default 65,536). The dedup
/// table's response arena (96 bytes an entry) is a ring: a responder touches all of it,
/// 6 MiB at the default size, over its first ~40 s at loadgen's rates, which a soak's
/// memory figures would read as growth. At 16,384 entries (1.5 MiB) it is touched within
/// the warm-up; that is still several times the entries live within a horizon
/// (~50,000 requests/s × H).
pub const CHAOS_DEDUP_CAPACITY: usize = 16_384;

/// Why the servers could not be set up.
#[derive(Debug)]
pub enum SetupError {
    /// No usable key with --endpoint/--domain (the key itself is never shown).
    Key(KeyLoadError),
    /// An embedded responder did not start.
    Responder(String),
    /// The embedded DNS responder did not start.
    Dns(std::io::Error),
    /// External DNS discovery failed (the text names the domain, as rlctl's does).
    Discovery(String),
    /// No endpoint at all.
    NoServers,
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetupError::Key(e) => write!(f, "with --endpoint/--domain: {e}"),
            SetupError::Responder(e) => write!(f, "embedded responder failed: {e}"),
            SetupError::Dns(e) => write!(f, "embedded DNS responder failed: {e}"),
            SetupError::Discovery(e) => f.write_str(e),
            SetupError::NoServers => write!(f, "no servers"),
        }
    }
}

/// The key text of a run: a public fixture, or the loaded secret (wiped on drop).
enum Secret {
    Fixture(&'static str),
    Loaded(KeyText),
}

/// The servers of one run.
pub struct Servers {
    key_text: Secret,
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
    /// The embedded responders (`--chaos` stops, restarts, adds and removes them).
    responders: Mutex<Vec<ResponderHandle>>,
    dns: Option<rl_responder::dns::DnsHandle>,
    /// Threads of the embedded responders and DNS responder.
    pub server_threads: std::collections::HashSet<u32>,
}

impl Servers {
    /// The API key text, for the official client's own parser. Never print it.
    pub fn key_text(&self) -> &str {
        match &self.key_text {
            Secret::Fixture(t) => t,
            Secret::Loaded(t) => t.expose(),
        }
    }

    /// Datagrams received by every embedded responder so far (None when external).
    pub fn received_datagrams(&self) -> Option<u64> {
        let responders = self.responders();
        if responders.is_empty() {
            return None;
        }
        Some(responders.iter().map(|r| r.counters().received).sum())
    }

    /// The embedded responders running now (for `--chaos`).
    pub fn responders(&self) -> MutexGuard<'_, Vec<ResponderHandle>> {
        self.responders.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The embedded DNS responder, when there is one.
    pub fn dns(&self) -> Option<&rl_responder::dns::DnsHandle> {
        self.dns.as_ref()
    }

    /// The embedded responders' I/O counters, merged (None when external).
    pub fn responder_io(&self) -> Option<ratelimitly_engine::udp::IoStats> {
        let responders = self.responders();
        let (first, rest) = responders.split_first()?;
        let mut io = first.io_stats();
        for r in rest {
            io.merge(&r.io_stats());
        }
        Some(io)
    }

    pub fn stop(self) {
        let responders = self
            .responders
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        for r in responders {
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

/// The configuration of the `i`-th embedded responder: `--responder-threads` threads,
/// pinned in turn to the responder cores through [`ResponderConfig::cpus`], with the
/// run's I/O backend, reply batching and faults.
pub fn responder_config(
    args: &Args,
    key: &ApiKey,
    i: usize,
    responder_cores: &[usize],
) -> ResponderConfig {
    let mut cfg = ResponderConfig::new(vec![key.clone()]);
    cfg.server_id = Some(embedded_server_id(i));
    let threads = args.responder_threads.max(1);
    cfg.cores = threads;
    cfg.reply_batch = args.reply_batch;
    cfg.io = args.io;
    // thread j of responder i on the (i * threads + j)-th responder core, in turn
    cfg.cpus = (0..threads)
        .filter_map(|j| responder_cores.get((i * threads + j) % responder_cores.len().max(1)))
        .copied()
        .collect();
    cfg.faults = base_faults(args, i);
    if args.chaos {
        cfg.dedup_capacity = CHAOS_DEDUP_CAPACITY;
    }
    cfg
}

/// The faults of the `i`-th embedded responder that the options ask for (`--loss`,
/// `--delay-ms`, `--jitter-ms`; not `--dead-oldest`).
pub fn base_faults(args: &Args, i: usize) -> Faults {
    Faults {
        drop_out: args.loss,
        delay: Duration::from_millis(args.delay_ms),
        jitter: Duration::from_millis(args.jitter_ms),
        seed: 0x10ad_0000 + i as u64,
        ..Faults::default()
    }
}

/// Starts the `i`-th embedded responder ([`responder_config`]); records its threads.
fn spawn_responder(
    args: &Args,
    key: &ApiKey,
    i: usize,
    silent: bool,
    responder_cores: &[usize],
    server_threads: &mut std::collections::HashSet<u32>,
) -> Result<ResponderHandle, SetupError> {
    let mut cfg = responder_config(args, key, i, responder_cores);
    cfg.faults.silent = silent;
    let before = crate::cpu::thread_ids();
    let h = rl_responder::spawn(cfg).map_err(|e| SetupError::Responder(format!("{e}")))?;
    server_threads.extend(crate::cpu::thread_ids().difference(&before));
    Ok(h)
}

/// Starts (or resolves) the servers for `args`. `responder_cores` are where the
/// embedded responders' threads should live.
pub fn start(args: &Args, responder_cores: &[usize]) -> Result<Servers, SetupError> {
    if args.external() {
        let text = key_source::read_key_text(args.key_file.as_deref()).map_err(SetupError::Key)?;
        let key = text.parse().map_err(SetupError::Key)?;
        return start_external(args, Secret::Loaded(text), key);
    }
    let fixture = args.auth.fixture();
    let key_text = Secret::Fixture(fixture);
    let key = keys::key(fixture);
    let count = args.servers;
    let mut responders = Vec::with_capacity(count);
    let mut endpoints = Vec::with_capacity(count);
    let mut dead = Vec::new();
    let mut server_threads = std::collections::HashSet::new();
    for i in 0..count {
        let silent = args.dead_oldest && i == 0;
        let h = spawn_responder(args, &key, i, silent, responder_cores, &mut server_threads)?;
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
    let before = crate::cpu::thread_ids();
    // --chaos changes the membership: the engine discovers it by DNS, with a 1 s TTL
    let ttl_s = if args.chaos { 1 } else { 30 };
    let options = rl_responder::dns::DnsOptions {
        ttl_s,
        ..Default::default()
    };
    let dns = rl_responder::dns::spawn_with(EMBEDDED_DOMAIN, dns_servers, options)
        .map_err(SetupError::Dns)?;
    for tid in crate::cpu::thread_ids().difference(&before) {
        if let Some(c) = responder_cores.first() {
            crate::cpu::pin_thread(*tid, *c);
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
        via_dns: args.chaos,
        embedded: true,
        responders: Mutex::new(responders),
        dns: Some(dns),
        server_threads,
    })
}

fn start_external(args: &Args, key_text: Secret, key: ApiKey) -> Result<Servers, SetupError> {
    if !args.endpoints.is_empty() {
        let mut endpoints: Vec<Endpoint> = args.endpoints.clone();
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
            responders: Mutex::new(Vec::new()),
            dns: Some(dns),
            server_threads: std::collections::HashSet::new(),
        });
    }
    let domain = args.domain.clone().unwrap_or_else(|| key.default_domain());
    let d =
        ratelimitly_engine::discovery::resolve(&domain, args.dns_server, Duration::from_secs(3))
            .map_err(|e| {
                let srv = format!("{}{domain}", ratelimitly_engine::discovery::SRV_PREFIX);
                SetupError::Discovery(rl_toolkit::words::discovery_failed(&srv, &e))
            })?;
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
        responders: Mutex::new(Vec::new()),
        dns: None,
        server_threads: std::collections::HashSet::new(),
    })
}
