//! A traced request: one logical request driven by the request machine the engine's core
//! runs ([`Delivery`] with its policy's [`Plan`], the response it keeps held beside it, as
//! `CoreState` holds it) on sockets of the tool's own (one per address family, error
//! queue on), so that every transmit, every received datagram and every ICMP error can be
//! shown with the round it belongs to. The datagrams and rounds are the engine's (same
//! codec, same machine, same policy, the same datagram checks: [`wire::open_response`]);
//! only the I/O loop is this file's.
//!
//! Owns: that loop (send, wait with `poll`, receive, read the error queue, fire the
//! machine's deadlines), the [`Event`] record and what it says per endpoint
//! ([`Trace::findings`]). Must not touch: the request rules (the machine), the wire
//! format (the codec), output (the tools print events as they like).

use std::fmt;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::{Delivery, Plan, TransmitKind, kept_outcome};
use ratelimitly_engine::proto::outcome::{Failure, Outcome, Response};
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::{
    self, Auth, DATAGRAM_RANDOM_LEN, DropReason, GuardSpec, MAX_DATAGRAM, ResourceSpec, TenantView,
};

use crate::errqueue::{self, IcmpError};
use crate::words::{EndpointFinding, Finding};

/// What to send: the request's blocks, its label, where, under which key and policy.
pub struct TraceRequest<'a> {
    /// The key (its id and secret seal the datagram; never printed).
    pub key: &'a ApiKey,
    /// Rounds, replays and the horizon.
    pub policy: &'a RequestPolicy,
    /// Where (at most the machine's maximum).
    pub endpoints: &'a [Endpoint],
    /// Latency guards.
    pub guards: &'a [GuardSpec],
    /// Resources with their tokens.
    pub resources: &'a [ResourceSpec],
    /// Metrics label (empty: none).
    pub label: &'a str,
}

/// Which part of the request a moment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// Transmission round k (0 = the initial sends, 1..=N the replays).
    Round(u32),
    /// The final receive phase (after round N, until D).
    Final,
    /// After D = t0 + H.
    AfterDeadline,
}

impl fmt::Display for Round {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Round::Round(k) => write!(f, "round {k}"),
            Round::Final => f.write_str("final"),
            Round::AfterDeadline => f.write_str("after D"),
        }
    }
}

/// What a received datagram was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// A valid response from this server id (taken by the machine: selected, retained,
    /// or a valid answer it does not use).
    Response { server_id: u64 },
    /// Dropped; the server id when the tenant TLV could be read.
    Dropped {
        server_id: Option<u64>,
        reason: DropReason,
    },
    /// Readable, but the answer to another request (unique id not ours).
    NotOurs { server_id: u64 },
}

/// What happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// The request's datagram went to an endpoint (`error`: the send failed).
    Transmit {
        endpoint: Endpoint,
        kind: TransmitKind,
        len: usize,
        error: Option<io::ErrorKind>,
    },
    /// A datagram arrived.
    Receive {
        from: SocketAddr,
        len: usize,
        result: Received,
    },
    /// An ICMP error answered a datagram sent earlier.
    Icmp(IcmpError),
}

/// One moment of a traced request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Since t0.
    pub at: Duration,
    /// Its round.
    pub round: Round,
    /// What.
    pub what: What,
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.at.as_secs_f64() * 1e3;
        write!(f, "{ms:>8.3} ms  {:<8} ", self.round.to_string())?;
        match self.what {
            What::Transmit {
                endpoint,
                kind,
                len,
                error,
            } => {
                let kind = match kind {
                    TransmitKind::Initial => "initial",
                    TransmitKind::Replay => "replay",
                    TransmitKind::Completion => "completion",
                };
                write!(f, "send     -> {endpoint} ({kind}, {len} bytes)")?;
                match error {
                    Some(e) => write!(f, ": send failed: {e}"),
                    None => Ok(()),
                }
            }
            What::Receive { from, len, result } => {
                write!(f, "receive  <- {from} ({len} bytes): ")?;
                match result {
                    Received::Response { server_id } => write!(f, "response of server {server_id}"),
                    Received::Dropped {
                        server_id: Some(id),
                        reason,
                    } => write!(f, "from server {id}, dropped: {reason}"),
                    Received::Dropped {
                        server_id: None,
                        reason,
                    } => write!(f, "dropped: {reason}"),
                    Received::NotOurs { server_id } => {
                        write!(f, "from server {server_id}, answer to another request")
                    }
                }
            }
            What::Icmp(e) => {
                let dest = e.dest.map_or_else(|| "?".to_owned(), |d| d.to_string());
                write!(f, "ICMP     <- {} for {dest}", e.kind)
            }
        }
    }
}

/// A finished traced request.
#[derive(Debug)]
pub struct Trace {
    /// The outcome, exactly as the machine gave it (with the response it kept).
    pub outcome: Outcome,
    /// Datagrams sent (every successful transmit).
    pub sends: u32,
    /// Of which completion deliveries.
    pub completion_sends: u32,
    /// t0 to the outcome.
    pub latency: Duration,
    /// Everything, in order.
    pub events: Vec<Event>,
    endpoints: Vec<Endpoint>,
}

impl Trace {
    /// What the events say of each endpoint: an ICMP error for its address, a response
    /// with another server id, datagrams this key cannot read, a valid answer, or
    /// nothing at all.
    pub fn findings(&self) -> Vec<EndpointFinding> {
        self.endpoints
            .iter()
            .map(|ep| EndpointFinding {
                endpoint: *ep,
                finding: finding_of(ep, &self.events),
            })
            .collect()
    }
}

fn finding_of(ep: &Endpoint, events: &[Event]) -> Finding {
    let mut unreadable: Option<(DropReason, u32)> = None;
    let mut other = None;
    for e in events {
        match e.what {
            What::Icmp(i) if i.dest == Some(ep.addr) => return Finding::Icmp(i),
            What::Receive { from, result, .. } if from == ep.addr => match result {
                Received::Response { server_id } if server_id == ep.server_id => {
                    return Finding::Answered;
                }
                Received::Dropped {
                    server_id: Some(id),
                    reason: DropReason::UnknownServer,
                } => other = Some(id),
                Received::Dropped { reason, .. } => {
                    let (first, n) = unreadable.unwrap_or((reason, 0));
                    unreadable = Some((first, n + 1));
                }
                _ => {}
            },
            _ => {}
        }
    }
    match (other, unreadable) {
        (Some(actual), _) => Finding::OtherServer { actual },
        (None, Some((reason, count))) => Finding::Unreadable { reason, count },
        (None, None) => Finding::NoAnswer,
    }
}

/// The round that `elapsed` (since t0) falls in under `policy`.
pub fn round_at(policy: &RequestPolicy, elapsed: Duration) -> Round {
    let unit_us = policy.unit().as_micros();
    let at = elapsed.as_micros();
    let schedule = policy.schedule();
    let mut end = 0u128;
    for k in 0..=u32::from(policy.replays()) {
        end += unit_us * u128::from(schedule.units(k));
        if at < end {
            return Round::Round(k);
        }
    }
    if at <= u128::from(policy.horizon_ms()) * 1000 {
        Round::Final
    } else {
        Round::AfterDeadline
    }
}

/// The request's sockets: one per address family its endpoints use, error queue on.
struct Sockets {
    v4: Option<UdpSocket>,
    v6: Option<UdpSocket>,
}

impl Sockets {
    fn open(endpoints: &[Endpoint]) -> io::Result<Sockets> {
        let bind = |any: &str| -> io::Result<UdpSocket> {
            let s = UdpSocket::bind(any)?;
            s.set_nonblocking(true)?;
            errqueue::enable(&s)?;
            Ok(s)
        };
        let v4 = endpoints.iter().any(|e| e.addr.is_ipv4());
        let v6 = endpoints.iter().any(|e| e.addr.is_ipv6());
        Ok(Sockets {
            v4: v4.then(|| bind("0.0.0.0:0")).transpose()?,
            v6: v6.then(|| bind("[::]:0")).transpose()?,
        })
    }

    fn for_addr(&self, addr: &SocketAddr) -> Option<&UdpSocket> {
        if addr.is_ipv4() {
            self.v4.as_ref()
        } else {
            self.v6.as_ref()
        }
    }

    fn all(&self) -> impl Iterator<Item = &UdpSocket> {
        self.v4.iter().chain(self.v6.iter())
    }

    /// Waits until a socket is readable or has an error queued, or `until`.
    fn wait(&self, until: Instant) {
        let mut fds: Vec<libc::pollfd> = self
            .all()
            .map(|s| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let left = until.saturating_duration_since(Instant::now());
        // round up, so the deadline has passed when poll returns on its timeout
        let ms = left.as_micros().div_ceil(1000).min(60_000) as libc::c_int;
        // SAFETY: fds is a live, initialised Vec of fds.len() pollfd structs that poll only
        // reads and writes `revents` of; the fds are the request's open sockets.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }
}

/// The request's state while it runs.
struct Run<'a, F> {
    req: &'a TraceRequest<'a>,
    auth: Auth,
    machine: Delivery,
    plan: Plan,
    /// The response the machine keeps (retained in round 0, then the selected one).
    held: Option<Response>,
    datagram: Vec<u8>,
    unique_id: [u8; 16],
    sockets: Sockets,
    events: Vec<Event>,
    on_event: F,
    sends: u32,
    completion_sends: u32,
}

impl<F: FnMut(&Event)> Run<'_, F> {
    fn record(&mut self, now: Instant, what: What) {
        let at = now.saturating_duration_since(self.machine.started());
        let e = Event {
            at,
            round: round_at(self.req.policy, at),
            what,
        };
        (self.on_event)(&e);
        self.events.push(e);
    }

    fn send_pending(&mut self) {
        while let Some(t) = self.machine.poll_transmit() {
            let sock = self.sockets.for_addr(&t.addr);
            let r = match sock {
                Some(s) => s.send_to(&self.datagram, t.addr).map(|_| ()),
                None => Err(io::Error::from(io::ErrorKind::Unsupported)),
            };
            let endpoint = self.req.endpoints[t.endpoint];
            let error = r.err().map(|e| e.kind());
            if error.is_some() {
                self.machine.transmit_failed(t.endpoint, t.kind);
            } else {
                self.sends += 1;
                self.completion_sends += u32::from(t.kind == TransmitKind::Completion);
            }
            let len = self.datagram.len();
            self.record(
                Instant::now(),
                What::Transmit {
                    endpoint,
                    kind: t.kind,
                    len,
                    error,
                },
            );
        }
    }

    /// Reads everything the sockets hold: datagrams and queued ICMP errors.
    fn receive(&mut self) {
        let mut datagrams: Vec<(Instant, SocketAddr, Vec<u8>)> = Vec::new();
        let mut icmp: Vec<(Instant, IcmpError)> = Vec::new();
        let mut buf = [0u8; 2048];
        for s in self.sockets.all() {
            // bounded: a socket's queue is finite, and each pass takes one entry
            for _ in 0..1024 {
                match s.recv_from(&mut buf) {
                    Ok((n, from)) => datagrams.push((Instant::now(), from, buf[..n].to_vec())),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // an ICMP error pending on the socket: read from the queue below
                    Err(_) => {}
                }
            }
            while let Ok(Some(e)) = errqueue::take(s) {
                icmp.push((Instant::now(), e));
            }
        }
        for (at, from, mut data) in datagrams {
            self.datagram_in(at, from, &mut data);
        }
        for (at, e) in icmp {
            self.record(at, What::Icmp(e));
        }
    }

    fn datagram_in(&mut self, now: Instant, from: SocketAddr, data: &mut [u8]) {
        let len = data.len();
        let result = match TenantView::parse(data) {
            Err(reason) => Received::Dropped {
                server_id: None,
                reason,
            },
            Ok(t) if t.unique_id() != self.unique_id => Received::NotOurs { server_id: t.id() },
            Ok(t) => {
                let server_id = t.id();
                match self.take_response(now, data) {
                    Ok(()) => Received::Response { server_id },
                    Err(reason) => Received::Dropped {
                        server_id: Some(server_id),
                        reason,
                    },
                }
            }
        };
        self.record(now, What::Receive { from, len, result });
    }

    /// A datagram routed to this request, as the engine's core state takes it: the
    /// authentication and PDU checks, then the machine's server-id and timing rules; the
    /// response is built when the machine keeps it. `Err`: dropped, and why.
    fn take_response(&mut self, now: Instant, data: &mut [u8]) -> Result<(), DropReason> {
        let (tenant, resp) = wire::open_response(&self.auth, data)?;
        let (server_id, steering) = (tenant.id(), tenant.steering());
        match self
            .machine
            .handle_results(&self.plan, now, server_id, steering)
        {
            Ok(v) => {
                if v.keeps_response() {
                    let r = Response::from_view(server_id, steering, v.phase, &resp);
                    self.held = Some(r);
                }
                Ok(())
            }
            // a valid answer the machine does not use (a second one, a younger server's)
            Err(ignored) => ignored.drop_reason().map_or(Ok(()), Err),
        }
    }

    /// The outcome, once, after the queued transmits were drained: a decision is the
    /// held response with the machine's send counts.
    fn poll_outcome(&mut self) -> Option<Outcome> {
        let ended = self.machine.poll_outcome(&self.plan)?;
        kept_outcome(ended, self.held.take())
    }
}

/// Encodes the request once (fresh unique id and nonce, the wall clock as timestamp);
/// returns the datagram and its unique id.
fn encode(req: &TraceRequest<'_>, auth: &Auth) -> io::Result<(Vec<u8>, [u8; 16])> {
    let mut random = [0u8; DATAGRAM_RANDOM_LEN];
    wire::fill_random(&mut random).map_err(io::Error::other)?;
    let wall_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (tenant, nonce) = wire::request_tenant(req.key.key_id(), &random, wall_ms);
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let n = wire::encode_request(
        auth,
        &tenant,
        nonce,
        &mut buf,
        req.policy.horizon_ms(),
        req.guards,
        req.resources,
        req.label,
    )
    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    buf.truncate(n);
    Ok((buf, tenant.unique_id))
}

/// Runs the request to its outcome, calling `on_event` as each event happens. Fails
/// before sending anything if the request cannot be encoded or a socket cannot be
/// opened.
pub fn run(req: &TraceRequest<'_>, on_event: impl FnMut(&Event)) -> io::Result<Trace> {
    let auth = Auth::new(req.key);
    let (datagram, unique_id) = encode(req, &auth)?;
    let sockets = Sockets::open(req.endpoints)?;
    let snapshot: Arc<[Endpoint]> = req.endpoints.into();
    let t0 = Instant::now();
    let plan = Plan::new(req.policy);
    let machine = match Delivery::new(&plan, snapshot, t0) {
        Ok(m) => m,
        Err(f) => {
            return Ok(Trace {
                outcome: Err(f),
                sends: 0,
                completion_sends: 0,
                latency: Duration::ZERO,
                events: Vec::new(),
                endpoints: req.endpoints.to_vec(),
            });
        }
    };
    let mut run = Run {
        req,
        auth,
        machine,
        plan,
        held: None,
        datagram,
        unique_id,
        sockets,
        events: Vec::new(),
        on_event,
        sends: 0,
        completion_sends: 0,
    };
    // bounded: the machine ends by D at the latest; past D plus a margin the request is
    // over whatever it says
    let give_up = run.machine.deadline(&run.plan) + Duration::from_secs(1);
    let outcome = loop {
        run.send_pending();
        if let Some(o) = run.poll_outcome() {
            break o;
        }
        let now = Instant::now();
        if now >= give_up {
            break Err(Failure::Timeout {
                horizon_ms: req.policy.horizon_ms(),
            });
        }
        let next = run.machine.poll_timeout().unwrap_or(give_up).min(give_up);
        run.sockets.wait(next);
        run.receive();
        let now = Instant::now();
        if now >= next {
            run.machine.handle_timeout(&run.plan, now);
        }
    };
    let latency = t0.elapsed();
    // ICMP errors of the last sends may still be on their way (loopback: at once)
    run.receive();
    Ok(Trace {
        outcome,
        sends: run.sends,
        completion_sends: run.completion_sends,
        latency,
        events: run.events,
        endpoints: req.endpoints.to_vec(),
    })
}
