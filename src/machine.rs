//! The request state machine: delivery and selection of one non-empty logical request
//! (client.md §3–§4), sans-IO.
//!
//! Owns: [`RequestMachine`], [`Endpoint`], [`Snapshot`], [`Transmit`]; the rules for
//! rounds, replays, the final phase, round-0 oldest-server preference, completion delivery,
//! send failures and response validity at the level of server ids.
//! Must not touch: sockets, clocks (every entry point takes `now: Instant`), the encoded
//! datagram (the caller holds it and sends the identical bytes for every [`Transmit`]),
//! the API key. Wire parsing and authentication belong to `wire`; this module only calls it.
//!
//! # Design
//! * Deadlines are absolute offsets in ms from `t0`: round k ends at U·(B(0)+…+B(k)), the
//!   final phase at D = H. The machine keeps the current phase's end and B(k) and steps
//!   them in O(1) ([`Schedule::next_units`]).
//! * Endpoint sets are `u64` bitmasks over snapshot indexes (≤ 64 endpoints): servers that
//!   supplied a valid response (all their addresses), queued transmits, failed round-0
//!   sends, endpoints already handed a later (replay/completion) transmit.
//! * The retained (round 0) or selected response is held inline as `Option<Response>`; no
//!   heap allocation happens in the machine (a response with more than two guards or two
//!   resources spills its `SmallVec` when it is built, not in the machine). On x86-64
//!   `size_of::<RequestMachine>()` is 280 bytes: 128 of state plus the 152-byte
//!   `Option<Response>` slot (`tests/conformance.rs` prints it).
//! * Time ordering at equal instants: [`RequestMachine::handle_results`] first applies
//!   deadlines strictly before `now`, so a response at exactly a deadline still belongs to
//!   the phase that ends there (a response exactly at D is accepted);
//!   [`RequestMachine::handle_timeout`] applies deadlines at or before `now`. Drivers
//!   should feed received datagrams before firing timers of the same instant.
//! * Transmits are queued by `handle_*` calls and must be drained with
//!   [`RequestMachine::poll_transmit`] right away; queued replays that a decision
//!   overtakes are replaced by the completion sends, and every queued transmit is dropped
//!   at D.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::discovery::DiscoveryError;
use crate::error::ConfigError;
use crate::outcome::{CommError, Failure, GuardResult, Outcome, Phase, ResourceResult, Response};
use crate::policy::{PolicyError, RequestPolicy, Schedule};
use crate::wire::{Auth, DropReason, RateResponseView, open};

/// Most endpoints one snapshot may hold (the machine's endpoint sets are `u64` masks).
pub const MAX_ENDPOINTS: usize = 64;

/// One address of one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The server's id (smallest = oldest).
    pub server_id: u64,
    /// Where to send.
    pub addr: SocketAddr,
}

/// The endpoints a request was started with; a dual-stack server has several endpoints
/// with the same id. At most [`MAX_ENDPOINTS`].
pub type Snapshot = Arc<[Endpoint]>;

/// Why a datagram was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransmitKind {
    /// Round 0.
    Initial,
    /// Start of a replay round.
    Replay,
    /// Completion delivery after the decision.
    Completion,
}

/// Send the request's datagram (identical bytes every time) to `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transmit {
    /// Index of the endpoint in the snapshot.
    pub endpoint: usize,
    /// The endpoint's address.
    pub addr: SocketAddr,
    /// Why.
    pub kind: TransmitKind,
}

/// Why a response did not take part in selection (the request is unaffected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ignored {
    /// The server id is not in the request's snapshot: invalid, count it as a drop.
    UnknownServer,
    /// The server already supplied a valid response to this request.
    Duplicate,
    /// It arrived after D.
    Late,
    /// The request is already decided or failed.
    Finished,
}

/// What a valid, in-time response did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Accepted {
    /// It is the decision.
    Selected,
    /// Round 0: kept as the candidate until the end of round 0 (or an older server).
    Retained,
    /// Round 0: an older server's response is already retained.
    NotRetained,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Rounds 0..=N; `round` says which.
    Rounds,
    /// Final receive phase (F > 0).
    Final,
    /// `retained` holds the selected response; completion transmits may be queued.
    Decided,
    /// No response by D.
    TimedOut,
    /// No datagram of round 0 could be sent.
    Unreachable,
    /// The outcome was taken.
    Done,
}

/// One logical request: emits transmits, reports its next deadline, takes responses, and
/// ends in exactly one [`Outcome`]. See the module docs for the rules.
#[derive(Debug)]
pub struct RequestMachine {
    snapshot: Snapshot,
    t0: Instant,
    schedule: Schedule,
    oldest_id: u64,
    /// Endpoints whose server supplied a valid response.
    responded: u64,
    /// Endpoints with a queued transmit of kind `pending_kind`.
    pending: u64,
    /// Endpoints whose round-0 send failed.
    failed0: u64,
    /// Endpoints that were handed a replay or completion transmit (a failure reported for
    /// one of them is not a round-0 failure).
    later: u64,
    unit_ms: u32,
    horizon_ms: u32,
    /// Offset (ms from t0) at which the current round or phase ends.
    phase_end_ms: u32,
    /// B(round).
    cur_units: u32,
    final_units: u32,
    sends: u32,
    completion_sends: u32,
    round: u16,
    replays: u16,
    state: State,
    pending_kind: TransmitKind,
    completion: bool,
    /// Steering byte of the latest valid response not yet polled.
    steering: Option<u8>,
    /// Round 0: the retained candidate; `Decided`: the selected response.
    retained: Option<Response>,
}

impl RequestMachine {
    /// Starts a request at `now` (t0): queues round 0 to every endpoint.
    /// An empty snapshot is a discovery failure; more than [`MAX_ENDPOINTS`] a
    /// configuration failure.
    pub fn new(policy: &RequestPolicy, snapshot: Snapshot, now: Instant) -> Result<Self, Failure> {
        let n = snapshot.len();
        if n == 0 {
            return Err(Failure::Discovery(DiscoveryError::NoServer));
        }
        if n > MAX_ENDPOINTS {
            return Err(Failure::Configuration(ConfigError::Policy(
                PolicyError::TooManyEndpoints {
                    count: n,
                    max: MAX_ENDPOINTS,
                },
            )));
        }
        let oldest_id = snapshot.iter().map(|e| e.server_id).min().unwrap_or(0);
        let schedule = policy.schedule();
        let cur_units = schedule.units(0);
        let unit_ms = policy.unit_ms();
        Ok(RequestMachine {
            snapshot,
            t0: now,
            schedule,
            oldest_id,
            responded: 0,
            pending: all_mask(n),
            failed0: 0,
            later: 0,
            unit_ms,
            horizon_ms: policy.horizon_ms(),
            phase_end_ms: unit_ms.saturating_mul(cur_units),
            cur_units,
            final_units: policy.final_units(),
            sends: 0,
            completion_sends: 0,
            round: 0,
            replays: policy.replays(),
            state: State::Rounds,
            pending_kind: TransmitKind::Initial,
            completion: policy.completion_delivery(),
            steering: None,
            retained: None,
        })
    }

    /// The endpoints this request sends to.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }

    /// t0.
    pub fn started(&self) -> Instant {
        self.t0
    }

    /// D = t0 + H, the dedup deadline.
    pub fn deadline(&self) -> Instant {
        self.at(self.horizon_ms)
    }

    /// The outcome was taken.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// A decision or failure is known (possibly with completion transmits still queued).
    pub fn is_finished(&self) -> bool {
        !matches!(self.state, State::Rounds | State::Final)
    }

    /// The next transmit to perform, if any. Send the stored datagram to `addr`; report a
    /// failed send at once with [`RequestMachine::transmit_failed`].
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.pending == 0 {
            return None;
        }
        let endpoint = self.pending.trailing_zeros() as usize;
        self.pending &= self.pending - 1;
        self.sends += 1;
        match self.pending_kind {
            TransmitKind::Initial => {}
            TransmitKind::Replay => self.later |= 1 << endpoint,
            TransmitKind::Completion => {
                self.later |= 1 << endpoint;
                self.completion_sends += 1;
            }
        }
        Some(Transmit {
            endpoint,
            addr: self.snapshot[endpoint].addr,
            kind: self.pending_kind,
        })
    }

    /// The send of the latest transmit polled for `endpoint` failed. If every datagram of
    /// round 0 failed, the request fails with a communication error (unless a valid
    /// response already arrived); failures of replays and completion sends only reduce
    /// the send counts. Report a failure before polling the endpoint's next transmit.
    pub fn transmit_failed(&mut self, endpoint: usize) {
        if endpoint >= self.snapshot.len() {
            return;
        }
        self.sends = self.sends.saturating_sub(1);
        let bit = 1u64 << endpoint;
        if self.later & bit != 0 {
            if self.pending_kind == TransmitKind::Completion {
                self.completion_sends = self.completion_sends.saturating_sub(1);
            }
            return;
        }
        self.failed0 |= bit;
        if self.failed0 == all_mask(self.snapshot.len())
            && matches!(self.state, State::Rounds | State::Final)
            && self.retained.is_none()
        {
            self.pending = 0;
            self.retained = None;
            self.state = State::Unreachable;
        }
    }

    /// The next deadline (end of the current round or of the final phase = D), while
    /// undecided.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Rounds | State::Final => Some(self.at(self.phase_end_ms)),
            _ => None,
        }
    }

    /// Applies every deadline at or before `now`: round ends (round-0 selection of the
    /// retained response, replays), the end of the final phase (timeout).
    pub fn handle_timeout(&mut self, now: Instant) {
        self.advance(now, true);
    }

    /// A response that passed the wire checks (tenant, auth, PDU) from `server_id` with
    /// steering byte `steering`, received at `now`. Applies the server-id and timing rules
    /// and, when it matters, builds the [`Response`] from the results.
    pub fn handle_results<G, R>(
        &mut self,
        now: Instant,
        server_id: u64,
        steering: u8,
        guards: G,
        resources: R,
    ) -> Result<Accepted, Ignored>
    where
        G: IntoIterator<Item = GuardResult>,
        R: IntoIterator<Item = ResourceResult>,
    {
        let mask = self.server_mask(server_id);
        if mask == 0 {
            return Err(Ignored::UnknownServer);
        }
        self.advance(now, false);
        match self.state {
            State::Rounds | State::Final => {}
            State::TimedOut if now > self.deadline() => return Err(Ignored::Late),
            _ => return Err(Ignored::Finished),
        }
        if self.responded & mask != 0 {
            return Err(Ignored::Duplicate);
        }
        self.responded |= mask;
        self.steering = Some(steering);
        let phase = match self.state {
            State::Final => Phase::Final,
            _ => Phase::Round(self.round),
        };
        if self.state == State::Rounds && self.round == 0 && server_id != self.oldest_id {
            if let Some(r) = &self.retained
                && r.server_id.is_some_and(|id| id < server_id)
            {
                return Ok(Accepted::NotRetained);
            }
            self.retained = Some(Response::from_results(
                server_id, steering, phase, guards, resources,
            ));
            return Ok(Accepted::Retained);
        }
        let resp = Response::from_results(server_id, steering, phase, guards, resources);
        self.select(now, resp);
        Ok(Accepted::Selected)
    }

    /// A received datagram for this request (the caller routed it by unique id): checks
    /// tenant and auth TLVs (decrypting in place in aes mode) and the rate response PDU,
    /// then applies [`RequestMachine::handle_response`]. The source address is not checked.
    /// `Err` = dropped: count it by reason; the request stays in flight.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        auth: &Auth,
        datagram: &mut [u8],
    ) -> Result<(), DropReason> {
        let opened = open(auth, datagram)?;
        let resp = RateResponseView::parse(opened.pdu)?;
        let (server_id, steering) = (opened.tenant.id(), opened.tenant.steering());
        self.handle_response(now, server_id, steering, &resp)
    }

    /// A response whose tenant, auth and PDU checks passed: applies the server-id and
    /// timing rules. `UnknownServer` (not in the snapshot) is an invalid response;
    /// `NotExpected` means it came after the decision or after D. A second response from
    /// an answered server, or a round-0 response from a server younger than the retained
    /// one, is valid but unused (`Ok`).
    pub fn handle_response(
        &mut self,
        now: Instant,
        server_id: u64,
        steering: u8,
        resp: &RateResponseView<'_>,
    ) -> Result<(), DropReason> {
        let guards = resp
            .guards()
            .map(|g| GuardResult::new(g.tracker_id(), g.threshold_ms(), g.current_latency_ms()));
        let resources = resp.resources().map(|r| ResourceResult {
            bucket_id: r.bucket_id(),
            actual_rate: r.actual_rate(),
            deficit: r.deficit(),
        });
        match self.handle_results(now, server_id, steering, guards, resources) {
            Ok(_) | Err(Ignored::Duplicate) => Ok(()),
            Err(Ignored::UnknownServer) => Err(DropReason::UnknownServer),
            Err(Ignored::Late | Ignored::Finished) => Err(DropReason::NotExpected),
        }
    }

    /// The steering byte of the latest valid response since the last call (0 = the server
    /// asks the client to move to another source port). Never changes the decision.
    pub fn poll_steering(&mut self) -> Option<u8> {
        self.steering.take()
    }

    /// The outcome, exactly once, after the queued completion transmits were drained.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        if self.pending != 0 {
            return None;
        }
        let out = match self.state {
            State::Decided => {
                let mut r = self.retained.take()?;
                r.sends = self.sends;
                r.completion_sends = self.completion_sends;
                Ok(r)
            }
            State::TimedOut => Err(Failure::Timeout {
                horizon_ms: self.horizon_ms,
            }),
            State::Unreachable => Err(Failure::Communication(CommError::AllSendsFailed {
                endpoints: self.snapshot.len() as u32,
            })),
            State::Rounds | State::Final | State::Done => return None,
        };
        self.state = State::Done;
        Some(out)
    }

    fn at(&self, offset_ms: u32) -> Instant {
        self.t0 + Duration::from_millis(u64::from(offset_ms))
    }

    /// Endpoints of `server_id` in the snapshot (0 = not in the snapshot).
    fn server_mask(&self, server_id: u64) -> u64 {
        self.snapshot
            .iter()
            .enumerate()
            .filter(|(_, e)| e.server_id == server_id)
            .fold(0, |m, (i, _)| m | 1 << i)
    }

    /// Applies deadlines before `now` (`inclusive`: at or before `now`).
    fn advance(&mut self, now: Instant, inclusive: bool) {
        let elapsed = now.saturating_duration_since(self.t0);
        let reached = |end_ms: u32| {
            let end = Duration::from_millis(u64::from(end_ms));
            if inclusive {
                elapsed >= end
            } else {
                elapsed > end
            }
        };
        let before_d = elapsed < Duration::from_millis(u64::from(self.horizon_ms));
        // Bounded: each pass ends a round (at most N + 1) or the final phase.
        while matches!(self.state, State::Rounds | State::Final) && reached(self.phase_end_ms) {
            if self.state == State::Final {
                self.time_out();
                return;
            }
            if self.round == 0
                && let Some(r) = self.retained.take()
            {
                self.select(now, r);
                return;
            }
            if self.round < self.replays {
                self.round += 1;
                self.cur_units = self.schedule.next_units(self.cur_units);
                self.phase_end_ms = self
                    .phase_end_ms
                    .saturating_add(self.unit_ms.saturating_mul(self.cur_units));
                if before_d {
                    self.pending = all_mask(self.snapshot.len()) & !self.responded;
                    self.pending_kind = TransmitKind::Replay;
                } else {
                    self.pending = 0;
                }
            } else if self.final_units > 0 && self.phase_end_ms < self.horizon_ms {
                self.state = State::Final;
                self.phase_end_ms = self.horizon_ms;
            } else {
                self.time_out();
                return;
            }
        }
    }

    fn time_out(&mut self) {
        self.state = State::TimedOut;
        self.pending = 0;
        self.retained = None;
    }

    /// Selects `resp` at `now`; queues completion delivery (only while now < D).
    fn select(&mut self, now: Instant, resp: Response) {
        self.retained = Some(resp);
        self.state = State::Decided;
        self.pending = 0;
        if self.completion && now < self.deadline() {
            self.pending = all_mask(self.snapshot.len()) & !self.responded;
            self.pending_kind = TransmitKind::Completion;
        }
    }
}

fn all_mask(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}
