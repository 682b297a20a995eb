//! The request state machine: delivery and selection of one non-empty logical request
//! (docs/protocol.md §11–§12), sans-IO.
//!
//! Owns: [`Delivery`], [`Plan`], [`Endpoint`], [`Snapshot`], [`Transmit`], the one
//! assembly of a decision's outcome from the kept response ([`kept_outcome`]); the rules for
//! rounds, replays, the final phase, round-0 oldest-server preference, completion
//! delivery, send failures and response validity at the level of server ids. The engine's
//! core state (`engine::core::CoreState`) runs one [`Delivery`] per request in flight, and
//! the conformance and property suites drive the same type.
//! Must not touch: sockets, clocks (every entry point takes `now: Instant`), the encoded
//! datagram (the caller holds it and sends the identical bytes for every [`Transmit`]),
//! the API key. Wire parsing and authentication belong to `wire`; this module only calls it.
//!
//! # Design
//! * [`Delivery`] holds only the per-request state and takes the policy constants
//!   ([`Plan`], shared by every request of a policy) as a parameter; it decides *which*
//!   response is retained or selected but does not store it: the caller builds the
//!   [`Response`] when told to ([`Verdict`]) and keeps it where it likes (the engine's core
//!   state holds it in a pooled cell until the request ends).
//! * Deadlines are absolute offsets in ms from `t0`: round k ends at U·(B(0)+…+B(k)), the
//!   final phase at D = H. The core keeps the current phase's end and B(k) and steps
//!   them in O(1) ([`Schedule::next_units`]).
//! * Endpoint sets are `u64` bitmasks over snapshot indexes (≤ 64 endpoints): servers that
//!   supplied a valid response (all their addresses) and queued transmits. Round-0 send
//!   failures are a count (each initial send is reported failed at most once); the kind
//!   of a failed send is given by the caller.
//! * No heap allocation happens in the machine (a response with more than two guards or
//!   two resources spills its `SmallVec` when it is built, not in the machine). On x86-64
//!   `size_of::<Delivery>()` is 72 bytes (`tests/conformance.rs` prints it).
//! * Time ordering at equal instants: [`Delivery::handle_results`] first applies
//!   deadlines strictly before `now`, so a response at exactly a deadline still belongs to
//!   the phase that ends there (a response exactly at D is accepted);
//!   [`Delivery::handle_timeout`] applies deadlines at or before `now`. Drivers
//!   should feed received datagrams before firing timers of the same instant.
//! * Transmits are queued by `handle_*` calls and must be drained with
//!   [`Delivery::poll_transmit`] right away; queued replays that a decision
//!   overtakes are replaced by the completion sends, and every queued transmit is dropped
//!   at D.
//! * A send failure is reported with the endpoint and the kind of the transmit that
//!   failed ([`Delivery::transmit_failed`]), once per failed send: the engine carries
//!   both in the send's tag.

use std::borrow::BorrowMut;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::proto::error::{ConfigError, DiscoveryError};
use crate::proto::outcome::{CommError, Failure, Phase, Response};
use crate::proto::policy::{PolicyError, RequestPolicy, Schedule};
use crate::proto::wire::DropReason;

/// Most endpoints one snapshot may hold (the machine's endpoint sets are `u64` masks).
pub const MAX_ENDPOINTS: usize = 64;

/// One address of one server (owned by [`crate::proto::endpoint`], re-exported here).
pub use crate::proto::endpoint::Endpoint;

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

impl Ignored {
    /// How a driver accounts for a response that took no part in selection: the one
    /// classification of unknown-server, late and after-the-decision responses.
    /// * `UnknownServer` → `Some(DropReason::UnknownServer)`: an invalid response.
    /// * `Late` (after D) and `Finished` (after the decision or failure) →
    ///   `Some(DropReason::NotExpected)`: valid, but too late to take part.
    /// * `Duplicate` → `None`: a valid second answer of a server that already answered;
    ///   unused, not a drop.
    pub fn drop_reason(self) -> Option<DropReason> {
        match self {
            Ignored::UnknownServer => Some(DropReason::UnknownServer),
            Ignored::Late | Ignored::Finished => Some(DropReason::NotExpected),
            Ignored::Duplicate => None,
        }
    }
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
    /// A response is selected; completion transmits may be queued.
    Decided,
    /// No response by D.
    TimedOut,
    /// No datagram of round 0 could be sent.
    Unreachable,
    /// The outcome was taken.
    Done,
}

/// "No endpoint" in a `u8` snapshot index.
const NO_ENDPOINT: u8 = u8::MAX;

/// The policy constants a [`Delivery`] needs, shared by every request of one policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    schedule: Schedule,
    /// Round 0's units (`schedule.units(0)`), read by every new request.
    first_units: u32,
    unit_ms: u32,
    horizon_ms: u32,
    final_units: u32,
    replays: u16,
    completion: bool,
}

impl Plan {
    /// The constants of `policy`.
    pub fn new(policy: &RequestPolicy) -> Plan {
        let schedule = policy.schedule();
        Plan {
            schedule,
            first_units: schedule.units(0),
            unit_ms: policy.unit_ms(),
            horizon_ms: policy.horizon_ms(),
            final_units: policy.final_units(),
            replays: policy.replays(),
            completion: policy.completion_delivery(),
        }
    }

    /// H in ms.
    pub fn horizon_ms(&self) -> u32 {
        self.horizon_ms
    }
}

/// What a valid, in-time response did, and in which phase it arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Verdict {
    /// Selected / retained (build and keep the [`Response`], replacing a retained one) or
    /// not retained (drop it).
    pub accepted: Accepted,
    /// The phase to record in the [`Response`].
    pub phase: Phase,
}

impl Verdict {
    /// Build the [`Response`] and keep it (replacing a retained one): the response was
    /// selected or retained, not dropped as a younger round-0 candidate.
    pub fn keeps_response(&self) -> bool {
        self.accepted != Accepted::NotRetained
    }
}

/// Send counts of a decided request, to fill into its [`Response`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sends {
    /// Request datagrams handed to the network, completion deliveries included.
    pub sends: u32,
    /// Of `sends`, the completion deliveries.
    pub completion_sends: u32,
}

/// A request's outcome from how its machine ended ([`Delivery::poll_outcome`]) and the
/// response its driver kept, owned or in place (`R`: `Response` or `&mut Response`): a
/// decision is that response with the machine's send counts written into it; a failure
/// is itself, and what was kept goes with `kept`. `None` for a decision with no kept
/// response, which a driver that keeps what each [`Verdict`] tells it never sees (each
/// driver says what it means there). The one assembly of the engine's core state,
/// rl-toolkit's traced request and the test suites' driver.
#[inline]
pub fn kept_outcome<R: BorrowMut<Response>>(
    ended: Result<Sends, Failure>,
    kept: Option<R>,
) -> Option<Result<R, Failure>> {
    match ended {
        Ok(n) => {
            let mut kept = kept?;
            let r = kept.borrow_mut();
            r.sends = n.sends;
            r.completion_sends = n.completion_sends;
            Some(Ok(kept))
        }
        Err(f) => Some(Err(f)),
    }
}

/// One logical request: emits transmits, reports its next deadline, takes responses, and
/// ends in exactly one outcome. See the module docs for the rules. The policy constants
/// are passed in as a [`Plan`]; the caller stores the response a [`Verdict`] tells it to
/// build, and [`Delivery::poll_outcome`] then says to deliver it. No heap allocation;
/// 72 bytes on x86-64.
#[derive(Debug)]
pub struct Delivery {
    snapshot: Snapshot,
    t0: Instant,
    /// Endpoints whose server supplied a valid response.
    responded: u64,
    /// Endpoints with a queued transmit of kind `pending_kind`.
    pending: u64,
    /// Offset (ms from t0) at which the current round or phase ends.
    phase_end_ms: u32,
    /// B(round).
    cur_units: u32,
    sends: u32,
    round: u16,
    state: State,
    pending_kind: TransmitKind,
    /// Steering byte of the latest valid response not yet polled.
    steering: Option<u8>,
    /// Round 0: snapshot index of the retained response's server (`NO_ENDPOINT`: none).
    retained: u8,
    /// Round-0 sends reported failed.
    failed0: u8,
    /// Completion transmits handed out (<= 64).
    completion_sends: u8,
}

impl Delivery {
    /// Starts a request at `now` (t0): queues round 0 to every endpoint.
    /// An empty snapshot is a discovery failure; more than [`MAX_ENDPOINTS`] a
    /// configuration failure.
    pub fn new(plan: &Plan, snapshot: Snapshot, now: Instant) -> Result<Self, Failure> {
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
        let cur_units = plan.first_units;
        Ok(Delivery {
            snapshot,
            t0: now,
            responded: 0,
            pending: all_mask(n),
            phase_end_ms: plan.unit_ms.saturating_mul(cur_units),
            cur_units,
            sends: 0,
            round: 0,
            state: State::Rounds,
            pending_kind: TransmitKind::Initial,
            steering: None,
            retained: NO_ENDPOINT,
            failed0: 0,
            completion_sends: 0,
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
    pub fn deadline(&self, plan: &Plan) -> Instant {
        self.at(plan.horizon_ms)
    }

    /// The outcome was taken.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// A decision or failure is known (possibly with completion transmits still queued).
    pub fn is_finished(&self) -> bool {
        !matches!(self.state, State::Rounds | State::Final)
    }

    /// The caller holds a response for this request: a retained round-0 candidate or the
    /// selected response not yet delivered.
    pub fn holds_response(&self) -> bool {
        self.retained != NO_ENDPOINT || self.state == State::Decided
    }

    /// The next transmit to perform, if any. Send the request's datagram (the same bytes
    /// every time) to its `addr`; report a failed send with
    /// [`Delivery::transmit_failed`].
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.pending == 0 {
            return None;
        }
        let endpoint = self.pending.trailing_zeros() as usize;
        self.pending &= self.pending - 1;
        self.sends += 1;
        if self.pending_kind == TransmitKind::Completion {
            self.completion_sends = self.completion_sends.saturating_add(1);
        }
        Some(Transmit {
            endpoint,
            addr: self.snapshot[endpoint].addr,
            kind: self.pending_kind,
        })
    }

    /// The send of a transmit of `kind` to `endpoint` failed. Report each failed send
    /// once. If every datagram of round 0 failed, the request fails with a communication
    /// error (unless a valid response already arrived); failures of replays and
    /// completion sends only reduce the send counts.
    pub fn transmit_failed(&mut self, endpoint: usize, kind: TransmitKind) {
        let n = self.snapshot.len();
        if endpoint >= n {
            return;
        }
        self.sends = self.sends.saturating_sub(1);
        match kind {
            TransmitKind::Initial => {}
            TransmitKind::Replay => return,
            TransmitKind::Completion => {
                self.completion_sends = self.completion_sends.saturating_sub(1);
                return;
            }
        }
        self.failed0 = self.failed0.saturating_add(1);
        if usize::from(self.failed0) >= n
            && matches!(self.state, State::Rounds | State::Final)
            && self.retained == NO_ENDPOINT
        {
            self.pending = 0;
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
    pub fn handle_timeout(&mut self, plan: &Plan, now: Instant) {
        self.advance(plan, now, true);
    }

    /// A response that passed the wire checks from `server_id` with steering byte
    /// `steering`, received at `now`: applies the server-id and timing rules. On
    /// `Selected` or `Retained` the caller builds the [`Response`] (with the verdict's
    /// phase) and keeps it, replacing a previously retained one.
    pub fn handle_results(
        &mut self,
        plan: &Plan,
        now: Instant,
        server_id: u64,
        steering: u8,
    ) -> Result<Verdict, Ignored> {
        let mask = self.server_mask(server_id);
        if mask == 0 {
            return Err(Ignored::UnknownServer);
        }
        self.advance(plan, now, false);
        match self.state {
            State::Rounds | State::Final => {}
            State::TimedOut if now > self.deadline(plan) => return Err(Ignored::Late),
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
        let oldest = self.snapshot.iter().map(|e| e.server_id).min().unwrap_or(0);
        if self.state == State::Rounds && self.round == 0 && server_id != oldest {
            if self.retained != NO_ENDPOINT
                && self.snapshot[usize::from(self.retained)].server_id < server_id
            {
                return Ok(Verdict {
                    accepted: Accepted::NotRetained,
                    phase,
                });
            }
            self.retained = mask.trailing_zeros() as u8;
            return Ok(Verdict {
                accepted: Accepted::Retained,
                phase,
            });
        }
        self.select(plan, now);
        Ok(Verdict {
            accepted: Accepted::Selected,
            phase,
        })
    }

    /// Decided, with completion transmits queued and not yet handed out. A caller may
    /// hold them until the end of a receive batch, so that answers already received in
    /// that batch count ([`Delivery::answered_after_decision`]); it must then apply
    /// [`Delivery::expire_completion`] before draining them.
    pub fn completion_queued(&self) -> bool {
        self.state == State::Decided
            && self.pending != 0
            && self.pending_kind == TransmitKind::Completion
    }

    /// A valid response from `server_id` arrived after the decision while its completion
    /// transmits were still queued: that server has now supplied a response, so none goes
    /// to its endpoints. True when this removed any.
    pub fn answered_after_decision(&mut self, server_id: u64) -> bool {
        if !self.completion_queued() {
            return false;
        }
        let mask = self.server_mask(server_id) & self.pending;
        self.responded |= mask;
        self.pending &= !mask;
        mask != 0
    }

    /// Drops queued completion transmits once `now` has reached D: they leave only
    /// before D.
    pub fn expire_completion(&mut self, plan: &Plan, now: Instant) {
        if self.completion_queued() && now >= self.deadline(plan) {
            self.pending = 0;
        }
    }

    /// The steering byte of the latest valid response since the last call.
    pub fn poll_steering(&mut self) -> Option<u8> {
        self.steering.take()
    }

    /// The outcome, exactly once, after the queued completion transmits were drained:
    /// `Ok` = deliver the response the caller holds, with these send counts.
    pub fn poll_outcome(&mut self, plan: &Plan) -> Option<Result<Sends, Failure>> {
        if self.pending != 0 {
            return None;
        }
        let out = match self.state {
            State::Decided => Ok(Sends {
                sends: self.sends,
                completion_sends: u32::from(self.completion_sends),
            }),
            State::TimedOut => Err(Failure::Timeout {
                horizon_ms: plan.horizon_ms,
            }),
            State::Unreachable => Err(Failure::Communication(CommError::AllSendsFailed {
                endpoints: self.snapshot.len() as u32,
            })),
            State::Rounds | State::Final | State::Done => return None,
        };
        self.state = State::Done;
        Some(out)
    }

    /// [`poll_outcome`](Self::poll_outcome), with a decision's send counts written into
    /// `kept`, the response the caller holds for it ([`kept_outcome`]): `Ok(())` when
    /// that response is the outcome. A decision without one (only a guard: a decision
    /// always holds its response) ends as `Shutdown`.
    pub fn poll_outcome_kept(
        &mut self,
        plan: &Plan,
        kept: Option<&mut Response>,
    ) -> Option<Result<(), Failure>> {
        let ended = self.poll_outcome(plan)?;
        Some(match kept_outcome(ended, kept) {
            Some(Ok(_)) => Ok(()),
            Some(Err(f)) => Err(f),
            None => Err(Failure::Shutdown),
        })
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
    fn advance(&mut self, plan: &Plan, now: Instant, inclusive: bool) {
        let elapsed = now.saturating_duration_since(self.t0);
        let reached = |end_ms: u32| {
            let end = Duration::from_millis(u64::from(end_ms));
            if inclusive {
                elapsed >= end
            } else {
                elapsed > end
            }
        };
        let before_d = elapsed < Duration::from_millis(u64::from(plan.horizon_ms));
        // Bounded: each pass ends a round (at most N + 1) or the final phase.
        while matches!(self.state, State::Rounds | State::Final) && reached(self.phase_end_ms) {
            if self.state == State::Final {
                self.time_out();
                return;
            }
            if self.round == 0 && self.retained != NO_ENDPOINT {
                self.select(plan, now);
                return;
            }
            if self.round < plan.replays {
                self.round += 1;
                self.cur_units = plan.schedule.next_units(self.cur_units);
                self.phase_end_ms = self
                    .phase_end_ms
                    .saturating_add(plan.unit_ms.saturating_mul(self.cur_units));
                if before_d {
                    self.pending = all_mask(self.snapshot.len()) & !self.responded;
                    self.pending_kind = TransmitKind::Replay;
                } else {
                    self.pending = 0;
                }
            } else if plan.final_units > 0 && self.phase_end_ms < plan.horizon_ms {
                self.state = State::Final;
                self.phase_end_ms = plan.horizon_ms;
            } else {
                self.time_out();
                return;
            }
        }
    }

    fn time_out(&mut self) {
        self.state = State::TimedOut;
        self.pending = 0;
        self.retained = NO_ENDPOINT;
    }

    /// Selects the response being handled (or the retained one) at `now`; queues
    /// completion delivery (only while now < D).
    fn select(&mut self, plan: &Plan, now: Instant) {
        self.retained = NO_ENDPOINT;
        self.state = State::Decided;
        self.pending = 0;
        if plan.completion && now < self.deadline(plan) {
            self.pending = all_mask(self.snapshot.len()) & !self.responded;
            self.pending_kind = TransmitKind::Completion;
        }
    }
}

fn all_mask(n: usize) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignored_responses_are_classified_once() {
        assert_eq!(
            Ignored::UnknownServer.drop_reason(),
            Some(DropReason::UnknownServer)
        );
        assert_eq!(Ignored::Late.drop_reason(), Some(DropReason::NotExpected));
        assert_eq!(
            Ignored::Finished.drop_reason(),
            Some(DropReason::NotExpected)
        );
        assert_eq!(Ignored::Duplicate.drop_reason(), None);
    }

    fn three_servers(t0: Instant) -> (Plan, Delivery) {
        let plan = Plan::new(&RequestPolicy::default());
        let snap: Snapshot = (0..3u16)
            .map(|i| Endpoint {
                server_id: 10 + u64::from(i),
                addr: SocketAddr::from(([127, 0, 0, 1], 4000 + i)),
            })
            .collect::<Vec<_>>()
            .into();
        let mut d = Delivery::new(&plan, snap, t0).unwrap();
        while d.poll_transmit().is_some() {}
        (plan, d)
    }

    #[test]
    fn an_answer_after_the_decision_spares_its_queued_completion_send() {
        let t0 = Instant::now();
        let (plan, mut d) = three_servers(t0);
        let now = t0 + Duration::from_millis(1);
        assert!(d.handle_results(&plan, now, 10, 1).is_ok());
        assert!(d.completion_queued());
        assert!(d.answered_after_decision(12));
        assert!(!d.answered_after_decision(12), "once per server");
        assert!(!d.answered_after_decision(99), "unknown server");
        let t = d.poll_transmit().unwrap();
        assert_eq!((t.endpoint, t.kind), (1, TransmitKind::Completion));
        assert!(d.poll_transmit().is_none());
        assert!(!d.completion_queued());
        let sends = d.poll_outcome(&plan).unwrap().unwrap();
        assert_eq!((sends.sends, sends.completion_sends), (4, 1));
    }

    #[test]
    fn held_completion_sends_are_dropped_at_the_deadline() {
        let t0 = Instant::now();
        let (plan, mut d) = three_servers(t0);
        d.handle_results(&plan, t0 + Duration::from_millis(1), 10, 1)
            .unwrap();
        d.expire_completion(&plan, d.deadline(&plan) - Duration::from_millis(1));
        assert!(d.completion_queued(), "still before D");
        d.expire_completion(&plan, d.deadline(&plan));
        assert!(d.poll_transmit().is_none());
        let sends = d.poll_outcome(&plan).unwrap().unwrap();
        assert_eq!((sends.sends, sends.completion_sends), (3, 0));
    }
}
