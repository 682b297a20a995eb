//! How rlctl sends: [`request`] runs one resource request through the engine
//! (`ratelimitly_engine::engine::Engine`, one core, static endpoints) and falls back to a
//! small blocking driver — the sans-IO [`RequestMachine`] fed by one std `UdpSocket` and
//! the monotonic clock — when the engine cannot start here (io_uring or locked memory
//! unavailable) or when `RLCTL_DRIVER=direct` is set. [`report`] chooses the same way:
//! the engine (reports queued, flushed once, counted by the engine's statistics) or a
//! blocking loop that sends each datagram exactly once and counts what it sent.
//!
//! Owns: backend choice, the direct driver's socket and loop. Must not touch: request
//! policy rules, selection, completion delivery (all in the machine), argument parsing
//! and output (main.rs).

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimitly_engine::engine::{BuildError, Cores, Engine};
use ratelimitly_engine::error::{ConfigError, RequestError};
use ratelimitly_engine::ids::{LatencyTracker, Resource};
use ratelimitly_engine::key::ApiKey;
use ratelimitly_engine::machine::{Endpoint, RequestMachine};
use ratelimitly_engine::outcome::{CommError, Failure, GuardResult, Outcome, ResourceResult};
use ratelimitly_engine::policy::RequestPolicy;
use ratelimitly_engine::wire::{
    self, Auth, EncodeError, GuardSpec, MAX_DATAGRAM, RateResponseView, ReportEntry, ResourceSpec,
    TenantFields,
};

/// Receive buffer size (wire.md §1: 2048 bytes suffice).
const RECV_BUF: usize = 2048;
/// Extra wall time after D before the loop gives up regardless of the machine (guards
/// against a machine that never yields an outcome).
const SAFETY_MARGIN: Duration = Duration::from_secs(2);
/// Bound on loop iterations (datagrams plus deadlines) of one request.
const MAX_ITERATIONS: u32 = 1_000_000;

/// What one request run produced.
#[derive(Debug)]
pub struct RequestRun {
    /// The outcome.
    pub outcome: Outcome,
    /// Request datagrams actually sent (also known when the outcome is a failure).
    pub sends: u32,
    /// Of which completion deliveries.
    pub completion_sends: u32,
    /// From the start of the request (encoding included) to the outcome.
    pub latency: Duration,
}

/// Environment variable that selects the backend: `direct` forces the blocking driver,
/// `engine` forces the engine (a communication failure if it cannot start), anything
/// else (or unset) uses the engine when it can start, else the direct driver.
pub const DRIVER_ENV: &str = "RLCTL_DRIVER";

/// The request's resources (with tokens) and guards (with threshold ms).
pub struct RequestParts<'a> {
    pub resources: &'a [(Resource, u16)],
    pub guards: &'a [(LatencyTracker, u32)],
    pub label: &'a str,
}

/// Sends one resource request to `endpoints` under `policy` and waits for its outcome.
/// The caller has checked the policy against the key and the resource definitions.
pub fn request(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: Vec<Endpoint>,
    parts: &RequestParts<'_>,
) -> RequestRun {
    let mode = std::env::var(DRIVER_ENV).unwrap_or_default();
    if mode != "direct" {
        match engine_request(key, policy, endpoints.clone(), parts) {
            Ok(run) => return run,
            Err(kind) if mode == "engine" => {
                return RequestRun {
                    outcome: Err(Failure::Communication(CommError::Socket(kind))),
                    sends: 0,
                    completion_sends: 0,
                    latency: Duration::ZERO,
                };
            }
            Err(_) => {}
        }
    }
    let guards: Vec<GuardSpec> = parts
        .guards
        .iter()
        .map(|(t, threshold_ms)| GuardSpec {
            tracker_id: t.id(),
            ttl_ms: t.ttl_ms(),
            max_samples: t.max_samples(),
            min_samples: t.min_samples(),
            threshold_ms: *threshold_ms,
            current_latency_ms: 0,
        })
        .collect();
    let resources: Vec<ResourceSpec> = parts
        .resources
        .iter()
        .map(|(r, tokens)| ResourceSpec {
            bucket_id: r.id(),
            window_ms: r.window_ms(),
            rate_limit: r.rate_limit(),
            tokens: *tokens,
        })
        .collect();
    direct_request(key, policy, endpoints, &guards, &resources, parts.label)
}

/// The request through a one-core engine with static endpoints. `Err` when the engine
/// cannot start in this environment (memlock, io_uring, sockets).
fn engine_request(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: Vec<Endpoint>,
    parts: &RequestParts<'_>,
) -> Result<RequestRun, io::ErrorKind> {
    let built = Engine::builder(key.clone())
        .policy(policy.clone())
        .cores(Cores::Count(1))
        .endpoints(endpoints)
        .socket_buffers(256 << 10, 256 << 10)
        .in_flight_per_core(16)
        .build();
    let engine = match built {
        Ok(e) => e,
        Err(BuildError::Config(c)) => {
            return Ok(RequestRun {
                outcome: Err(Failure::Configuration(c)),
                sends: 0,
                completion_sends: 0,
                latency: Duration::ZERO,
            });
        }
        Err(BuildError::Socket(kind) | BuildError::Executor { kind, .. }) => return Err(kind),
        Err(BuildError::MemlockTooLow { .. }) => return Err(io::ErrorKind::OutOfMemory),
        Err(_) => return Err(io::ErrorKind::InvalidInput),
    };
    let h = engine.handle();
    let t0 = Instant::now();
    let mut b = h.request();
    for (r, tokens) in parts.resources {
        b = b.consume(r, u32::from(*tokens));
    }
    for (t, threshold_ms) in parts.guards {
        b = b.guard(t, Duration::from_millis(u64::from(*threshold_ms)));
    }
    let outcome = b.label(parts.label).wait();
    let latency = t0.elapsed();
    let stats = h.stats();
    engine.shutdown();
    let clamp = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    Ok(RequestRun {
        outcome,
        sends: clamp(stats.sends),
        completion_sends: clamp(stats.completion_sends),
        latency,
    })
}

/// The request through the blocking direct driver.
fn direct_request(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: Vec<Endpoint>,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> RequestRun {
    let t0 = Instant::now();
    let mut sends = 0u32;
    let mut completion_sends = 0u32;
    let outcome = run_request(
        key,
        policy,
        endpoints,
        guards,
        resources,
        label,
        t0,
        &mut sends,
        &mut completion_sends,
    );
    RequestRun {
        outcome,
        sends,
        completion_sends,
        latency: t0.elapsed(),
    }
}

/// Maps an encoder error to the configuration error the request reports.
pub fn encode_config_error(e: EncodeError) -> Failure {
    let r = match e {
        EncodeError::TooLarge { needed, max } => RequestError::TooLarge { needed, max },
        EncodeError::BufferTooSmall { needed, .. } => RequestError::TooLarge {
            needed,
            max: MAX_DATAGRAM,
        },
        EncodeError::LabelTooLong { len } => RequestError::LabelTooLong { len },
        EncodeError::TooManyBlocks | EncodeError::EmptyPdu => RequestError::TooManyBlocks,
    };
    Failure::Configuration(ConfigError::Request(r))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// One socket for every endpoint family: IPv4 only, IPv6 only, or a dual-stack IPv6
/// socket that reaches IPv4 endpoints through v4-mapped addresses.
struct Sock {
    socket: UdpSocket,
    mapped: bool,
}

impl Sock {
    fn for_endpoints(endpoints: &[Endpoint]) -> io::Result<Sock> {
        let v4 = endpoints.iter().any(|e| e.addr.is_ipv4());
        let v6 = endpoints.iter().any(|e| e.addr.is_ipv6());
        let (bind, mapped): (SocketAddr, bool) = match (v4, v6) {
            (true, false) => ((Ipv4Addr::UNSPECIFIED, 0).into(), false),
            (false, true) => ((Ipv6Addr::UNSPECIFIED, 0).into(), false),
            _ => ((Ipv6Addr::UNSPECIFIED, 0).into(), true),
        };
        Ok(Sock {
            socket: UdpSocket::bind(bind)?,
            mapped,
        })
    }

    fn send(&self, datagram: &[u8], to: SocketAddr) -> io::Result<usize> {
        let to = match to {
            SocketAddr::V4(a) if self.mapped => {
                SocketAddr::new(a.ip().to_ipv6_mapped().into(), a.port())
            }
            other => other,
        };
        self.socket.send_to(datagram, to)
    }
}

#[allow(clippy::too_many_arguments)]
fn run_request(
    key: &ApiKey,
    policy: &RequestPolicy,
    endpoints: Vec<Endpoint>,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
    t0: Instant,
    sends: &mut u32,
    completion_sends: &mut u32,
) -> Outcome {
    let auth = Auth::new(key);
    let unique_id = wire::new_unique_id().map_err(|_| CommError::Rng)?;
    let nonce = wire::new_nonce().map_err(|_| CommError::Rng)?;
    let tenant = TenantFields {
        id: key.key_id(),
        unique_id,
        timestamp_ms: unix_ms(),
        steering: 0,
    };
    let mut out = [0u8; MAX_DATAGRAM];
    let len = wire::encode_request(
        &auth,
        &tenant,
        nonce,
        &mut out,
        policy.horizon_ms(),
        guards,
        resources,
        label,
    )
    .map_err(encode_config_error)?;
    let datagram = &out[..len];

    let snapshot: Arc<[Endpoint]> = endpoints.into();
    let mut machine = RequestMachine::new(policy, snapshot.clone(), t0)?;
    let sock = Sock::for_endpoints(&snapshot).map_err(|e| CommError::Socket(e.kind()))?;
    let hard_stop = machine.deadline() + SAFETY_MARGIN;
    let mut buf = [0u8; RECV_BUF];

    for _ in 0..MAX_ITERATIONS {
        while let Some(tx) = machine.poll_transmit() {
            if sock.send(datagram, tx.addr).is_ok() {
                *sends += 1;
                if tx.kind == ratelimitly_engine::machine::TransmitKind::Completion {
                    *completion_sends += 1;
                }
            } else {
                machine.transmit_failed(tx.endpoint);
            }
        }
        if let Some(outcome) = machine.poll_outcome() {
            return outcome;
        }
        let now = Instant::now();
        if now >= hard_stop {
            break;
        }
        let wake = machine.poll_timeout().unwrap_or(now).min(hard_stop);
        if now >= wake {
            machine.handle_timeout(now);
            continue;
        }
        if sock.socket.set_read_timeout(Some(wake - now)).is_err() {
            machine.handle_timeout(Instant::now());
            continue;
        }
        match sock.socket.recv_from(&mut buf) {
            Ok((n, _from)) => {
                handle_datagram(&mut machine, &auth, &unique_id, &mut buf[..n]);
            }
            Err(_) => machine.handle_timeout(Instant::now()),
        }
    }
    Err(Failure::Timeout {
        horizon_ms: policy.horizon_ms(),
    })
}

/// Full validity checks (tenant, auth, unique id, PDU), then the machine's server-id and
/// timing rules. Invalid datagrams are ignored.
fn handle_datagram(machine: &mut RequestMachine, auth: &Auth, unique_id: &[u8; 16], dg: &mut [u8]) {
    let now = Instant::now();
    let Ok(opened) = wire::open(auth, dg) else {
        return;
    };
    if opened.tenant.unique_id() != *unique_id {
        return;
    }
    let Ok(view) = RateResponseView::parse(opened.pdu) else {
        return;
    };
    let guards = view
        .guards()
        .map(|g| GuardResult::new(g.tracker_id(), g.threshold_ms(), g.current_latency_ms()));
    let resources = view.resources().map(|r| ResourceResult {
        bucket_id: r.bucket_id(),
        actual_rate: r.actual_rate(),
        deficit: r.deficit(),
    });
    let _ = machine.handle_results(
        now,
        opened.tenant.id(),
        opened.tenant.steering(),
        guards,
        resources,
    );
}

/// What a latency report run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportRun {
    /// Datagrams sent (all endpoints, all batches).
    pub datagrams: u32,
    /// Endpoints addressed.
    pub endpoints: u32,
}

/// Sends one latency report per `(tracker, observed ms)` pair once to every endpoint,
/// coalesced up to the mode's per-datagram maximum (each datagram with a fresh unique
/// id). Through a one-core engine whose reports are flushed once all pairs are queued;
/// the backend is chosen as for [`request`] (`RLCTL_DRIVER`). Fails only if no datagram
/// could be sent.
pub fn report(
    key: &ApiKey,
    endpoints: &[Endpoint],
    pairs: &[(LatencyTracker, u32)],
) -> Result<ReportRun, Failure> {
    if endpoints.is_empty() {
        return Err(Failure::Discovery(
            ratelimitly_engine::discovery::DiscoveryError::NoServer,
        ));
    }
    let mode = std::env::var(DRIVER_ENV).unwrap_or_default();
    if mode != "direct" {
        match engine_report(key, endpoints, pairs) {
            Ok(run) => return run,
            Err(kind) if mode == "engine" => {
                return Err(Failure::Communication(CommError::Socket(kind)));
            }
            Err(_) => {}
        }
    }
    let entries: Vec<ReportEntry> = pairs
        .iter()
        .map(|(t, observed_ms)| ReportEntry {
            tracker_id: t.id(),
            ttl_ms: t.ttl_ms(),
            max_samples: t.max_samples(),
            min_samples: t.min_samples(),
            observed_ms: *observed_ms,
        })
        .collect();
    direct_report(key, endpoints, &entries)
}

/// Longest report flush interval the engine accepts: nothing is flushed by age while
/// rlctl queues its few entries, so batches are exactly as full as the direct driver's.
const ENGINE_REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// The reports through a one-core engine with static endpoints. `Err` when the engine
/// cannot start in this environment (memlock, io_uring, sockets, options it refuses).
fn engine_report(
    key: &ApiKey,
    endpoints: &[Endpoint],
    pairs: &[(LatencyTracker, u32)],
) -> Result<Result<ReportRun, Failure>, io::ErrorKind> {
    // the queue must hold every entry until the core drains it
    let queue = pairs.len().saturating_add(16).min(1 << 16);
    let built = Engine::builder(key.clone())
        .cores(Cores::Count(1))
        .endpoints(endpoints.to_vec())
        .socket_buffers(256 << 10, 256 << 10)
        .in_flight_per_core(queue)
        .report_interval(ENGINE_REPORT_INTERVAL)
        .build();
    let engine = match built {
        Ok(e) => e,
        Err(BuildError::Socket(kind) | BuildError::Executor { kind, .. }) => return Err(kind),
        Err(BuildError::MemlockTooLow { .. }) => return Err(io::ErrorKind::OutOfMemory),
        Err(_) => return Err(io::ErrorKind::InvalidInput),
    };
    let h = engine.handle();
    let mut queued = Ok(());
    for (t, observed_ms) in pairs {
        let observed = Duration::from_millis(u64::from(*observed_ms));
        let mut r = h.report(t, observed);
        if matches!(r, Err(Failure::Overloaded)) {
            // the queue is full: let the core drain it, then retry once
            h.flush_reports();
            r = h.report(t, observed);
        }
        if let Err(f) = r {
            queued = Err(f);
            break;
        }
    }
    let stats = h.flush_reports();
    engine.shutdown();
    if let Err(f) = queued {
        return Ok(Err(f));
    }
    let endpoints = u32::try_from(endpoints.len()).unwrap_or(u32::MAX);
    let datagrams = u32::try_from(stats.report_datagrams).unwrap_or(u32::MAX);
    if datagrams == 0 && !pairs.is_empty() {
        return Ok(Err(Failure::Communication(CommError::AllSendsFailed {
            endpoints,
        })));
    }
    Ok(Ok(ReportRun {
        datagrams,
        endpoints,
    }))
}

/// The reports through the blocking direct driver: each datagram sent exactly once.
fn direct_report(
    key: &ApiKey,
    endpoints: &[Endpoint],
    entries: &[ReportEntry],
) -> Result<ReportRun, Failure> {
    let auth = Auth::new(key);
    let per = wire::max_report_entries(key.mode()).max(1);
    let sock = Sock::for_endpoints(endpoints).map_err(|e| CommError::Socket(e.kind()))?;
    let mut datagrams = 0u32;
    let mut out = [0u8; MAX_DATAGRAM];
    for chunk in entries.chunks(per) {
        let tenant = TenantFields {
            id: key.key_id(),
            unique_id: wire::new_unique_id().map_err(|_| CommError::Rng)?,
            timestamp_ms: unix_ms(),
            steering: 0,
        };
        let nonce = wire::new_nonce().map_err(|_| CommError::Rng)?;
        let len = wire::encode_report(&auth, &tenant, nonce, &mut out, chunk)
            .map_err(encode_config_error)?;
        for ep in endpoints {
            if sock.send(&out[..len], ep.addr).is_ok() {
                datagrams += 1;
            }
        }
    }
    if datagrams == 0 && !entries.is_empty() {
        return Err(Failure::Communication(CommError::AllSendsFailed {
            endpoints: u32::try_from(endpoints.len()).unwrap_or(u32::MAX),
        }));
    }
    Ok(ReportRun {
        datagrams,
        endpoints: u32::try_from(endpoints.len()).unwrap_or(u32::MAX),
    })
}
