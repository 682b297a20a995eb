//! A deterministic simulation of engine cores on a virtual network.
//!
//! The engine's sans-IO core states (`CoreState`, built directly from a `CoreConfig` and
//! fed submissions as an engine core's turn feeds them; their outcomes taken as data with
//! `poll_outcome`) run against simulated servers built on the responder's sans-IO decision logic
//! (`rl_responder::decide::Responder`), on a virtual clock, with seeded loss, delay,
//! reordering (random delay), duplication, send failures, server death and restart,
//! steering hints and endpoint changes. No socket is opened and no thread is started:
//! a run is a pure function of its seed.
//!
//! The simulator checks, while it runs:
//! - no datagram of a request leaves at or after its D (first send + H);
//! - no datagram leaves from a socket after the core asked to close it, and the core
//!   never asks to close its current socket or one twice;
//! - the core's `sends` counter equals the request datagrams handed out minus those
//!   reported failed (nothing is counted that was not sent);
//! - every submitted request completes exactly once (checked by [`Sim::finish`]).
#![allow(dead_code)]

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimitly_engine::engine::core::{CoreConfig, CoreState, REPORT_TAG, SocketOp, TransmitSink};
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource};
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::{Endpoint, Snapshot};
use ratelimitly_engine::proto::outcome::{Failure, Outcome};
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::{self, ReportEntry, ResourceSpec, RngError};
use ratelimitly_engine::udp::SocketId;
use rl_responder::Faults;
use rl_responder::decide::{Capacities, Responder};

pub const AES: &str =
    "rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5";

/// splitmix64: a small seeded generator for the simulation's own choices.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf.iter_mut() {
            *b = self.next() as u8;
        }
    }
}

/// Network faults, each drawn independently per datagram.
#[derive(Clone, Debug, Default)]
pub struct NetFaults {
    /// Probability a datagram is lost (either direction).
    pub loss: f64,
    /// Probability a datagram is delivered twice.
    pub duplicate: f64,
    /// One-way delay: base + uniform [0, jitter] (jitter reorders).
    pub delay: Duration,
    pub jitter: Duration,
    /// Probability the driver reports a transmit as failed instead of sending it.
    pub send_fail: f64,
}

pub struct Server {
    pub id: u64,
    pub addr: SocketAddr,
    pub logic: Responder,
    pub alive: bool,
    /// Extra delay of this server's answers.
    pub slow: Duration,
    /// Datagrams it received (requests and reports).
    pub received: u64,
}

enum Packet {
    ToServer {
        server: usize,
        from: SocketAddr,
        bytes: Vec<u8>,
    },
    ToClient {
        core: usize,
        sock: SocketId,
        bytes: Vec<u8>,
    },
}

/// One transmit handed out by a core.
struct Handed {
    sock: SocketId,
    to: SocketAddr,
    bytes: Vec<u8>,
    tag: u64,
}

struct Sink<'a>(&'a mut Vec<Handed>);

impl TransmitSink for Sink<'_> {
    fn transmit(&mut self, sock: SocketId, to: SocketAddr, datagram: &[u8], tag: u64) {
        self.0.push(Handed {
            sock,
            to,
            bytes: datagram.to_vec(),
            tag,
        });
    }
}

/// What a core takes at its next turn, as an engine core takes its queue.
enum Queued {
    Request {
        pdu: Vec<u8>,
        slot: u32,
        submitted: Instant,
    },
    Report(ReportEntry),
}

/// Per-core bookkeeping of the simulator.
struct CoreSim {
    state: CoreState,
    /// Submissions for the next turn.
    queued: Vec<Queued>,
    /// Open sockets and their (virtual) local ports.
    open: BTreeMap<SocketId, u16>,
    closed: HashSet<SocketId>,
    next_sock: u32,
    next_port: u16,
    /// Request datagrams handed out (not report datagrams).
    handed: u64,
    /// Of those, reported failed.
    failed: u64,
    /// Failures to report at the next step.
    to_fail: Vec<u64>,
    max_open: usize,
}

pub struct Sim {
    pub t0: Instant,
    pub now: Instant,
    pub rng: Rng,
    pub faults: NetFaults,
    /// Free completion slot numbers (as the engine's pool hands them out).
    free_slots: Vec<u32>,
    /// The endpoint set the cores are given each turn.
    snapshot: Snapshot,
    cores: Vec<CoreSim>,
    /// The core the next submission goes to (round robin).
    next_core: usize,
    pub servers: Vec<Server>,
    net: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    packets: HashMap<usize, Packet>,
    next_packet: usize,
    seq: u64,
    /// unique id -> deadline D of the request (from its first send).
    deadlines: HashMap<[u8; 16], Instant>,
    pub horizon: Duration,
    /// Requests not yet ended, by slot: their ids.
    pending: HashMap<u32, u64>,
    pub outcomes: Vec<(u64, Outcome)>,
    next_req: u64,
    key: ApiKey,
    out_buf: Vec<u8>,
    handed_buf: Vec<Handed>,
}

pub fn key() -> ApiKey {
    AES.parse().expect("valid key")
}

pub fn server_addr(i: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 7000 + i as u16)
}

fn client_addr(core: usize, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + core as u8)), port)
}

/// What a simulation is built from.
pub struct SimConfig {
    pub seed: u64,
    pub servers: usize,
    pub cores: usize,
    pub policy: RequestPolicy,
    pub faults: NetFaults,
    pub in_flight: usize,
    pub max_sockets: usize,
}

impl SimConfig {
    pub fn new(seed: u64, servers: usize) -> SimConfig {
        SimConfig {
            seed,
            servers,
            cores: 1,
            policy: RequestPolicy::default(),
            faults: NetFaults::default(),
            in_flight: 4096,
            max_sockets: 16,
        }
    }
}

impl Sim {
    pub fn new(cfg: SimConfig) -> Sim {
        let t0 = Instant::now();
        let key = key();
        let rng = Rng::new(cfg.seed);
        let servers: Vec<Server> = (0..cfg.servers)
            .map(|i| Server {
                id: 1000 + i as u64,
                addr: server_addr(i),
                logic: Self::logic(&key, 1000 + i as u64, t0),
                alive: true,
                slow: Duration::ZERO,
                received: 0,
            })
            .collect();
        let eps = servers
            .iter()
            .map(|s| Endpoint {
                server_id: s.id,
                addr: s.addr,
            })
            .collect::<Vec<_>>();
        let seed = cfg.seed;
        let slots = (cfg.cores * cfg.in_flight * 2) as u32;
        let snapshot: Snapshot = Arc::from(eps);
        let cores = (0..cfg.cores)
            .map(|i| {
                let mut cc = CoreConfig::new(i, &key, cfg.policy.clone()).expect("policy");
                cc.in_flight = cfg.in_flight;
                cc.max_sockets = cfg.max_sockets;
                let mut r = Rng::new(seed.wrapping_mul(31).wrapping_add(i as u64 + 1));
                let entropy = Box::new(move |buf: &mut [u8]| -> Result<(), RngError> {
                    r.fill(buf);
                    Ok(())
                });
                let first = SocketId::from_raw(0);
                let state = CoreState::new(cc, snapshot.clone(), t0, first, 50_000, entropy)
                    .expect("core state");
                let mut open = BTreeMap::new();
                open.insert(first, 50_000);
                CoreSim {
                    state,
                    queued: Vec::new(),
                    open,
                    closed: HashSet::new(),
                    next_sock: 1,
                    next_port: 50_001,
                    handed: 0,
                    failed: 0,
                    to_fail: Vec::new(),
                    max_open: 1,
                }
            })
            .collect();
        Sim {
            t0,
            now: t0,
            rng,
            faults: cfg.faults,
            free_slots: (0..slots).rev().collect(),
            snapshot,
            cores,
            next_core: 0,
            servers,
            net: BinaryHeap::new(),
            packets: HashMap::new(),
            next_packet: 0,
            seq: 0,
            deadlines: HashMap::new(),
            horizon: cfg.policy.horizon(),
            pending: HashMap::new(),
            outcomes: Vec::new(),
            next_req: 0,
            key,
            out_buf: vec![0u8; 2048],
            handed_buf: Vec::new(),
        }
    }

    fn logic(key: &ApiKey, id: u64, t0: Instant) -> Responder {
        let caps = Capacities {
            dedup: 16_384,
            buckets: 4096,
            trackers: 256,
        };
        Responder::new(std::slice::from_ref(key), id, caps, t0).expect("responder")
    }

    /// Submits `n` requests of one token of `res`, one core after the other; each is
    /// encoded as `RequestBuilder` encodes it and taken by its core at its next turn.
    pub fn submit(&mut self, res: &Resource, n: usize) {
        let spec = ResourceSpec {
            bucket_id: res.id(),
            window_ms: res.window_ms(),
            rate_limit: res.rate_limit(),
            tokens: 1,
        };
        let mut buf = [0u8; 256];
        let len = wire::encode_rate_request_pdu(
            &mut buf,
            self.horizon.as_millis() as u32,
            &[],
            &[spec],
            "",
        )
        .expect("request encodes");
        for _ in 0..n {
            let Some(slot) = self.free_slots.pop() else {
                // every slot in use: the handle answers `Overloaded` at once
                self.outcomes
                    .push((self.next_req, Err(Failure::Overloaded)));
                self.next_req += 1;
                continue;
            };
            let c = self.next_core;
            self.next_core = (c + 1) % self.cores.len();
            self.cores[c].queued.push(Queued::Request {
                pdu: buf[..len].to_vec(),
                slot,
                submitted: self.now,
            });
            self.pending.insert(slot, self.next_req);
            self.next_req += 1;
        }
    }

    /// Reports an observed latency for `tracker` (whole ms) to core 0, as
    /// `EngineHandle::report` does.
    pub fn report(&mut self, tracker: &LatencyTracker, observed: Duration) {
        self.cores[0].queued.push(Queued::Report(ReportEntry {
            tracker_id: tracker.id(),
            ttl_ms: tracker.ttl_ms(),
            max_samples: tracker.max_samples(),
            min_samples: tracker.min_samples(),
            observed_ms: observed.as_millis() as u32,
        }));
    }

    pub fn submitted(&self) -> u64 {
        self.next_req
    }

    /// Kills (`false`) or revives server `i`. A revived server restarts with empty
    /// state (dedup table, buckets), like a restarted process.
    pub fn set_alive(&mut self, i: usize, alive: bool) {
        let s = &mut self.servers[i];
        if alive && !s.alive {
            s.logic = Self::logic(&self.key, s.id, self.t0);
        }
        s.alive = alive;
    }

    /// Decision-level faults of server `i` (steering, fixed decisions).
    pub fn set_server_faults(&mut self, i: usize, f: &Faults) {
        self.servers[i].logic.set_faults(f);
    }

    /// Replaces the endpoint set with servers `which` (a DNS change).
    pub fn set_endpoints(&mut self, which: &[usize]) {
        let eps = which
            .iter()
            .map(|&i| Endpoint {
                server_id: self.servers[i].id,
                addr: self.servers[i].addr,
            })
            .collect::<Vec<_>>();
        self.snapshot = Arc::from(eps);
    }

    fn delay(&mut self) -> Duration {
        let j = self.faults.jitter.as_micros() as u64;
        self.faults.delay + Duration::from_micros(self.rng.below(j + 1))
    }

    fn push_packet(&mut self, at: Instant, p: Packet) {
        let id = self.next_packet;
        self.next_packet += 1;
        self.packets.insert(id, p);
        self.seq += 1;
        self.net.push(Reverse((at, self.seq, id)));
    }

    /// Routes what core `c` handed out at `now`, checking the invariants.
    fn route(&mut self, c: usize, handed: &mut Vec<Handed>) {
        for h in handed.drain(..) {
            let core = &mut self.cores[c];
            assert!(
                core.open.contains_key(&h.sock),
                "transmit from socket {:?} which is not open (closed: {})",
                h.sock,
                core.closed.contains(&h.sock)
            );
            if h.tag != REPORT_TAG {
                core.handed += 1;
                let mut uid = [0u8; 16];
                uid.copy_from_slice(&h.bytes[12..28]);
                let d = *self.deadlines.entry(uid).or_insert(self.now + self.horizon);
                assert!(
                    self.now < d,
                    "a datagram left at {:?} after its request's D {:?}",
                    self.now - self.t0,
                    d - self.t0
                );
            }
            if self.rng.chance(self.faults.send_fail) {
                let core = &mut self.cores[c];
                core.to_fail.push(h.tag);
                if h.tag != REPORT_TAG {
                    core.failed += 1;
                }
                continue;
            }
            let Some(server) = self.servers.iter().position(|s| s.addr == h.to) else {
                continue; // an endpoint that no longer exists: lost
            };
            let port = self.cores[c].open[&h.sock];
            let from = client_addr(c, port);
            let copies = if self.rng.chance(self.faults.duplicate) {
                2
            } else {
                1
            };
            for _ in 0..copies {
                if self.rng.chance(self.faults.loss) {
                    continue;
                }
                let at = self.now + self.delay();
                self.push_packet(
                    at,
                    Packet::ToServer {
                        server,
                        from,
                        bytes: h.bytes.clone(),
                    },
                );
            }
        }
    }

    fn deliver(&mut self, p: Packet) {
        match p {
            Packet::ToServer {
                server,
                from,
                mut bytes,
            } => {
                let now = self.now;
                let s = &mut self.servers[server];
                if !s.alive {
                    return;
                }
                s.received += 1;
                let slow = s.slow;
                let Some(n) = s.logic.handle(&mut bytes, from, now, &mut self.out_buf) else {
                    return;
                };
                let reply = self.out_buf[..n].to_vec();
                // find the socket by its address
                let core = (0..self.cores.len()).find(|&c| {
                    from.ip() == client_addr(c, 0).ip()
                        && self.cores[c].open.values().any(|&p| p == from.port())
                });
                let Some(core) = core else { return };
                let sock = *self.cores[core]
                    .open
                    .iter()
                    .find(|(_, p)| **p == from.port())
                    .expect("open")
                    .0;
                let copies = if self.rng.chance(self.faults.duplicate) {
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    if self.rng.chance(self.faults.loss) {
                        continue;
                    }
                    let at = self.now + self.delay() + slow;
                    self.push_packet(
                        at,
                        Packet::ToClient {
                            core,
                            sock,
                            bytes: reply.clone(),
                        },
                    );
                }
            }
            Packet::ToClient {
                core,
                sock,
                mut bytes,
            } => {
                let c = &mut self.cores[core];
                if !c.open.contains_key(&sock) {
                    return; // the socket was closed: the datagram is lost
                }
                let mut handed = std::mem::take(&mut self.handed_buf);
                c.state
                    .handle_datagram(self.now, sock, &mut bytes, &mut Sink(&mut handed));
                self.route(core, &mut handed);
                self.handed_buf = handed;
            }
        }
    }

    /// One driver turn of core `c` at `now`.
    fn turn(&mut self, c: usize) {
        let now = self.now;
        let wall = 1_767_225_600_000 + (now - self.t0).as_millis() as u64;
        let mut handed = std::mem::take(&mut self.handed_buf);
        {
            let core = &mut self.cores[c];
            core.state.set_wall_ms(wall);
            core.state.set_membership(self.snapshot.clone());
            for q in core.queued.drain(..) {
                let out = &mut Sink(&mut handed);
                match q {
                    Queued::Request {
                        pdu,
                        slot,
                        submitted,
                    } => core.state.submit(now, &pdu, slot, submitted, out),
                    Queued::Report(e) => core.state.submit_report(now, e, out),
                }
            }
            let _ = core.state.take_refresh_request();
            core.state.handle_timeout(now, &mut Sink(&mut handed));
        }
        self.route(c, &mut handed);
        for _ in 0..8 {
            let fails = std::mem::take(&mut self.cores[c].to_fail);
            if fails.is_empty() {
                break;
            }
            for tag in fails {
                self.cores[c]
                    .state
                    .handle_send_failed(now, tag, &mut Sink(&mut handed));
            }
            self.route(c, &mut handed);
        }
        self.handed_buf = handed;
        self.take_outcomes(c);
        self.socket_ops(c);
        let core = &self.cores[c];
        assert_eq!(
            core.state.stats().sends,
            core.handed - core.failed,
            "sends counted that were not sent"
        );
    }

    fn socket_ops(&mut self, c: usize) {
        while let Some(op) = self.cores[c].state.poll_socket_op() {
            let core = &mut self.cores[c];
            match op {
                SocketOp::Open { .. } => {
                    let id = SocketId::from_raw(core.next_sock);
                    core.next_sock += 1;
                    let port = core.next_port;
                    core.next_port += 1;
                    core.open.insert(id, port);
                    core.max_open = core.max_open.max(core.open.len());
                    core.state.socket_opened(Some((id, port)));
                }
                SocketOp::Close(id) => {
                    assert_ne!(
                        id,
                        core.state.current_socket(),
                        "closing the current socket"
                    );
                    assert!(core.open.remove(&id).is_some(), "closing {id:?} twice");
                    core.closed.insert(id);
                }
            }
        }
    }

    /// The next instant anything happens.
    fn next_event(&self) -> Option<Instant> {
        let net = self.net.peek().map(|Reverse((t, _, _))| *t);
        let timers = self
            .cores
            .iter()
            .filter_map(|c| c.state.poll_timeout())
            .min();
        match (net, timers) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the cores once at the current instant (takes new submissions).
    pub fn kick(&mut self) {
        for c in 0..self.cores.len() {
            self.turn(c);
        }
        self.collect();
    }

    /// Advances virtual time by `d`, processing every event in between.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        self.kick();
        let mut steps = 0u64;
        while let Some(t) = self.next_event() {
            if t > end {
                break;
            }
            steps += 1;
            assert!(steps < 50_000_000, "simulation does not converge");
            self.now = self.now.max(t);
            while let Some(Reverse((at, _, _))) = self.net.peek() {
                if *at > self.now {
                    break;
                }
                let Reverse((_, _, id)) = self.net.pop().expect("peeked");
                let p = self.packets.remove(&id).expect("packet");
                self.deliver(p);
            }
            for c in 0..self.cores.len() {
                self.turn(c);
            }
            self.collect();
        }
        self.now = end;
        self.kick();
    }

    fn collect(&mut self) {
        for c in 0..self.cores.len() {
            self.take_outcomes(c);
        }
    }

    /// Runs until every request has completed (at most `limit` of virtual time) and
    /// checks exactly-once delivery.
    pub fn finish(&mut self, limit: Duration) {
        let end = self.now + limit;
        while !self.pending.is_empty() && self.now < end {
            self.run_for(Duration::from_millis(5));
        }
        assert!(
            self.pending.is_empty(),
            "{} requests never completed",
            self.pending.len()
        );
        let mut seen = HashSet::new();
        for (id, _) in &self.outcomes {
            assert!(seen.insert(*id), "request {id} completed twice");
        }
        assert_eq!(self.outcomes.len() as u64, self.next_req);
        let completions: u64 = self.cores.iter().map(|c| c.state.stats().completions).sum();
        let local = self.outcomes.len() as u64;
        assert!(
            completions <= local,
            "a core completed more than was submitted"
        );
    }

    pub fn core(&self, c: usize) -> &CoreState {
        &self.cores[c].state
    }

    /// Most sockets core `c` held open at once.
    pub fn max_open(&self, c: usize) -> usize {
        self.cores[c].max_open
    }

    pub fn closed_sockets(&self, c: usize) -> usize {
        self.cores[c].closed.len()
    }

    /// Shuts every core down (completing what it holds).
    pub fn shutdown(&mut self) {
        let now = self.now;
        let mut handed = std::mem::take(&mut self.handed_buf);
        for c in 0..self.cores.len() {
            let core = &mut self.cores[c];
            // what is still queued is refused, as an engine core refuses it
            for q in core.queued.drain(..) {
                if let Queued::Request { slot, .. } = q {
                    core.state.refuse(slot);
                }
            }
            core.state.shutdown(now, &mut Sink(&mut handed));
            self.take_outcomes(c);
            self.route(c, &mut handed);
        }
        self.handed_buf = handed;
        self.collect();
    }

    /// Takes the requests core `c` ended, as data: each slot's request ends once, and its
    /// slot is free again.
    fn take_outcomes(&mut self, c: usize) {
        while let Some(o) = self.cores[c].state.poll_outcome() {
            let id = self.pending.remove(&o.slot);
            let id = id.unwrap_or_else(|| panic!("slot {} ended twice or never ran", o.slot));
            self.outcomes.push((id, o.outcome));
            self.free_slots.push(o.slot);
        }
    }

    pub fn count(&self, f: impl Fn(&Outcome) -> bool) -> usize {
        self.outcomes.iter().filter(|(_, o)| f(o)).count()
    }
}

pub fn granted(o: &Outcome) -> bool {
    matches!(o, Ok(r) if r.is_granted())
}

pub fn timed_out(o: &Outcome) -> bool {
    matches!(o, Err(Failure::Timeout { .. }))
}

pub fn resource(name: &str, limit: u32) -> Resource {
    Resource::new(name, Duration::from_secs(60), limit).expect("resource")
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
