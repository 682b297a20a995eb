//! The sans-IO state of one engine core.
//!
//! Owns, for its core: the in-flight table (with the buffered randomness of unique ids
//! and nonces), the timer wheel, the socket bookkeeping (steering), report coalescing, the
//! responses it holds and the core's statistics. Inputs: submissions handed to it one by
//! one ([`CoreState::submit`], [`CoreState::submit_report`], [`CoreState::refuse`]), the
//! endpoint set ([`CoreState::set_membership`]), received datagrams `(now, socket,
//! bytes)`, timeouts and send failures. Outputs, all as data: transmits `(socket,
//! destination, bytes, tag)` through a caller-supplied [`TransmitSink`], socket
//! operations ([`CoreState::poll_socket_op`]), ended requests with their outcomes
//! ([`CoreState::poll_outcome`]), a refresh request when it found no endpoint
//! ([`CoreState::take_refresh_request`]) and the next deadline
//! ([`CoreState::poll_timeout`]).
//!
//! Must not touch: sockets, queues, the completion slots or anything shared with the
//! callers, clocks (every instant is a parameter; the wall clock for the tenant timestamp
//! is set with [`CoreState::set_wall_ms`]), system calls (randomness comes from the
//! injected [`Entropy`]). The decisions themselves are the request machine's
//! ([`Delivery`]); the datagram checks are here, once.
//!
//! Ordering contract for whoever drives the state (the runtime's turn, the simulation):
//! hand every transmit to the network before performing the socket operations polled
//! after it (a `Close` follows the last transmit of its socket), and handle received
//! datagrams before timers of the same instant. A request decided by a datagram keeps its
//! completion transmits until the next [`CoreState::handle_timeout`] (which
//! [`CoreState::poll_timeout`] asks for at once), so that answers from other servers later
//! in the same receive batch spare their resends: call `handle_timeout` after each batch
//! of datagrams.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::config::CoreConfig;
use super::consts::{FIRED_PREALLOC, PREALLOC_MAX, REPORT_TAG, WHEEL_SLOTS, WHEEL_TICK};
use super::inflight::{self, Dgram, Entropy, Entry, InFlight, Key};
use super::outcomes::{Held, Outcomes, SlotOutcome};
use super::reports::Reports;
use super::sockets::{SocketOp, SocketTable};
use super::stats::Stats;
use super::wheel::{TimerHandle, TimerWheel};
use crate::proto::error::RequestError;
use crate::proto::machine::{Delivery, Ignored, Snapshot, TransmitKind};
use crate::proto::outcome::{Failure, Response};
use crate::proto::wire::{self, DropReason, ReportEntry, RngError, TenantView};
use crate::udp::SocketId;

/// Where a core's transmits go: the core's send batch, or a simulated network.
/// The datagram bytes are only borrowed: copy them.
pub trait TransmitSink {
    /// Sends `datagram` from socket `sock` to `to`; a failure is reported back later
    /// with [`CoreState::handle_send_failed`] and this `tag`.
    fn transmit(&mut self, sock: SocketId, to: SocketAddr, datagram: &[u8], tag: u64);
}

/// Whole microseconds of `d`, saturating at `u32::MAX - 1`.
fn micros(d: Duration) -> u32 {
    d.as_micros().min(u128::from(u32::MAX - 1)) as u32
}

/// The state of one engine core.
pub struct CoreState {
    index: usize,
    /// What the core reads of the configuration (plain values).
    cfg: CoreConfig,
    /// The endpoint set new requests and reports use ([`CoreState::set_membership`]).
    snapshot: Snapshot,
    /// A request found no endpoint: the core asks discovery for a refresh.
    refresh_wanted: bool,
    inflight: InFlight,
    wheel: TimerWheel<u64>,
    socks: SocketTable,
    fired: Vec<u64>,
    stats: Stats,
    reports: Reports,
    scratch: Box<[u8; wire::MAX_DATAGRAM]>,
    wall_ms: u64,
    /// The responses held and the outcomes not yet taken.
    outcomes: Outcomes,
    /// Requests decided by a datagram whose completion transmits wait for the end of the
    /// receive batch (sent by the next `handle_timeout`), each key once.
    completing: Vec<Key>,
    /// When the oldest of `completing` was decided.
    completing_since: Option<Instant>,
}

impl std::fmt::Debug for CoreState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreState")
            .field("index", &self.index)
            .field("in_flight", &self.inflight.len())
            .field("sockets", &self.socks.len())
            .finish_non_exhaustive()
    }
}

impl CoreState {
    /// The state of core `cfg.index`, whose first socket `first` is bound on `port`;
    /// requests go to the endpoints of `snapshot`.
    pub fn new(
        cfg: CoreConfig,
        snapshot: Snapshot,
        now: Instant,
        first: SocketId,
        port: u16,
        entropy: Entropy,
    ) -> Result<CoreState, RngError> {
        let limit = cfg.in_flight;
        let max_reports = wire::max_report_entries(cfg.auth.mode());
        Ok(CoreState {
            index: cfg.index,
            inflight: InFlight::new(limit, cfg.max_sockets, entropy)?,
            wheel: TimerWheel::new(now, WHEEL_TICK, WHEEL_SLOTS, limit.min(PREALLOC_MAX)),
            socks: SocketTable::new(first, port, cfg.max_sockets),
            fired: Vec::with_capacity(FIRED_PREALLOC),
            stats: Stats::new(),
            reports: Reports::new(max_reports, cfg.report_interval),
            scratch: Box::new([0u8; wire::MAX_DATAGRAM]),
            wall_ms: 0,
            outcomes: Outcomes::new(limit),
            completing: Vec::with_capacity(limit),
            completing_since: None,
            cfg,
            snapshot,
            refresh_wanted: false,
        })
    }

    /// Bytes a core's state reserves when it starts, for an in-flight limit of
    /// `in_flight`: slab cells and timer nodes (up to 65,536; beyond, they grow on demand
    /// up to the limit), the wheel, the held-response store and the outcome queue.
    pub fn reserved_bytes(in_flight: usize) -> usize {
        let prealloc = in_flight.min(PREALLOC_MAX);
        prealloc * inflight::entry_size()
            + TimerWheel::<u64>::footprint(WHEEL_SLOTS, prealloc)
            + in_flight * std::mem::size_of::<Key>()
            + Outcomes::reserved(in_flight)
    }

    /// Bytes of one in-flight entry (a slab cell: the request's machine, its sealed
    /// datagram when it fits inline, its timer, slot and socket).
    pub fn entry_size() -> usize {
        inflight::entry_size()
    }

    /// Bytes one in-flight request takes in its core at most: its slab cell and the cell
    /// of a response held for it.
    pub fn bytes_per_request() -> usize {
        inflight::entry_size() + Outcomes::cell_size()
    }

    /// Index of this core.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Sets the endpoint set that requests started and reports sent from now on use
    /// (the core passes the current one each turn).
    pub fn set_membership(&mut self, snapshot: Snapshot) {
        self.snapshot = snapshot;
    }

    /// True once after a request found no endpoint: the core asks discovery for an
    /// early refresh.
    pub fn take_refresh_request(&mut self) -> bool {
        std::mem::take(&mut self.refresh_wanted)
    }

    /// Sets the wall clock (Unix ms) written into the tenant timestamp of new datagrams.
    pub fn set_wall_ms(&mut self, ms: u64) {
        self.wall_ms = ms;
    }

    /// This core's statistics so far.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Requests in flight on this core.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// Sockets this core holds open (current and draining).
    pub fn sockets(&self) -> usize {
        self.socks.len()
    }

    /// The socket new requests use.
    pub fn current_socket(&self) -> SocketId {
        self.socks.current()
    }

    /// The next instant at which [`CoreState::handle_timeout`] has work.
    pub fn poll_timeout(&self) -> Option<Instant> {
        [
            self.wheel.next_deadline(),
            self.reports.due_at(),
            self.completing_since,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next socket operation for the core (perform it after sending every
    /// transmit handed out so far).
    pub fn poll_socket_op(&mut self) -> Option<SocketOp> {
        self.socks.poll_op()
    }

    /// The core's answer to [`SocketOp::Open`]: the new socket and its port, or `None`
    /// when no port could be bound.
    pub fn socket_opened(&mut self, new: Option<(SocketId, u16)>) {
        if new.is_some() {
            self.stats.steering_rebinds += 1;
        } else {
            self.stats.rebind_failures += 1;
        }
        let old_busy = self.inflight.on_socket(self.socks.current()) > 0;
        self.socks.opened(new, old_busy);
    }

    /// The next request that ended, with its completion slot and outcome, oldest first.
    /// The runtime writes each into its slot and wakes the caller once per turn, after
    /// the turn's sends, so a caller on the same CPU does not preempt the core in the
    /// middle of its turn.
    pub fn poll_outcome(&mut self) -> Option<SlotOutcome> {
        self.outcomes.pop()
    }

    /// The ended requests waiting to be taken: the runtime's delivery pops them here
    /// ([`poll_outcome`](Self::poll_outcome) without the hop).
    pub(crate) fn outcomes(&mut self) -> &mut Outcomes {
        &mut self.outcomes
    }

    /// True when ended requests wait for [`poll_outcome`](Self::poll_outcome).
    pub fn has_outcomes(&self) -> bool {
        self.outcomes.any()
    }

    // ---------------------------------------------------------------- receive

    /// One datagram arrived on socket `sock` (the bytes are decrypted in place). The
    /// datagram checks, in order: tenant TLV, routing by unique id, then
    /// `wire::open_response_at` (authentication, the rate response PDU; the tenant TLV is
    /// not parsed again), then the request
    /// machine's server-id and timing rules. A
    /// datagram that fails one is counted by its [`DropReason`] and changes nothing.
    pub fn handle_datagram(
        &mut self,
        now: Instant,
        sock: SocketId,
        buf: &mut [u8],
        out: &mut dyn TransmitSink,
    ) {
        let _ = sock;
        self.stats.received += 1;
        let (uid, tenant_size) = match TenantView::parse(buf) {
            Ok(t) => (t.unique_id(), t.size()),
            Err(r) => return self.stats.drop(r),
        };
        let Some(key) = self.inflight.route(&uid) else {
            return self.stats.drop(DropReason::UnknownRequest);
        };
        let (tenant, resp) = match wire::open_response_at(&self.cfg.auth, buf, tenant_size) {
            Ok(o) => o,
            Err(r) => return self.stats.drop(r),
        };
        let Some(e) = self.inflight.get_mut(key) else {
            return;
        };
        let (server_id, steering) = (tenant.id(), tenant.steering());
        match e
            .req
            .handle_results(&self.cfg.plan, now, server_id, steering)
        {
            Err(Ignored::Finished) if e.req.answered_after_decision(server_id) => {
                // decided earlier in this batch: its completion send to this server is off
                self.stats.ignored_responses += 1;
                return;
            }
            Ok(v) => {
                if v.keeps_response() {
                    // replaces a retained one
                    let r = Response::from_view(server_id, steering, v.phase, &resp);
                    self.outcomes.hold(&mut e.held, r);
                    e.answered_us = micros(now.saturating_duration_since(e.req.started()));
                }
                if e.req.poll_steering() == Some(0) && !self.socks.hint(e.sock) {
                    self.stats.steering_refused += 1;
                }
                // A decision's completion transmits wait for the end of this receive
                // batch, so that the other servers' answers already in it spare their
                // resends.
                if e.req.completion_queued() {
                    self.wheel.cancel(e.timer);
                    e.timer = TimerHandle::NONE;
                    self.completing.push(key);
                    self.completing_since.get_or_insert(now);
                    return;
                }
            }
            Err(i) => match i.drop_reason() {
                Some(r) => self.stats.drop(r),
                None => self.stats.ignored_responses += 1,
            },
        }
        self.drive(key, now, out);
    }

    // ---------------------------------------------------------------- submissions

    /// A submitted request: its encoded rate-request PDU, its completion slot and when it
    /// was submitted. The PDU is sealed into the datagram the core keeps in flight (its
    /// one copy); the request ends in exactly one [`SlotOutcome`] for `slot`.
    pub fn submit(
        &mut self,
        now: Instant,
        pdu: &[u8],
        slot: u32,
        submitted: Instant,
        out: &mut dyn TransmitSink,
    ) {
        if self.inflight.is_full() {
            return self.fail_early(slot, Failure::Overloaded);
        }
        let req = match Delivery::new(&self.cfg.plan, self.snapshot.clone(), now) {
            Ok(m) => m,
            Err(f) => return self.fail_early(slot, f),
        };
        let sock = self.socks.current();
        let entry = Entry {
            req,
            timer: TimerHandle::NONE,
            slot,
            held: Held::NONE,
            sock,
            queued_us: micros(now.saturating_duration_since(submitted)),
            answered_us: u32::MAX,
            generation: 0,
            dgram: Dgram::EMPTY,
        };
        let key = match self.seal(entry, pdu) {
            Ok(k) => k,
            Err(f) => return self.fail_early(slot, f),
        };
        self.drive(key, now, out);
    }

    /// Admits `entry` into the in-flight table and seals `pdu` into its datagram, in
    /// place: fresh random unique id (with the entry's routing bytes) and nonce.
    fn seal(&mut self, entry: Entry, pdu: &[u8]) -> Result<Key, Failure> {
        let p = self.cfg.auth.pdu_offset();
        let total = p + pdu.len();
        let key_id = self.cfg.auth.key_id();
        let a = self.inflight.admit(entry, total, key_id, self.wall_ms)?;
        let (key, bytes) = (a.key, a.bytes);
        let sealed = match bytes.get_mut(p..total) {
            Some(b) => {
                b.copy_from_slice(pdu);
                wire::seal(&self.cfg.auth, &a.tenant, a.nonce, bytes, pdu.len()).ok()
            }
            None => None,
        };
        let Some(n) = sealed else {
            // the size was checked when the request was built
            self.inflight.discard(key);
            let e = RequestError::TooLarge {
                needed: total,
                max: wire::MAX_DATAGRAM,
            };
            return Err(Failure::Configuration(e.into()));
        };
        self.inflight.set_len(key, n);
        Ok(key)
    }

    /// A latency report entry for the next report datagram.
    pub fn submit_report(&mut self, now: Instant, e: ReportEntry, out: &mut dyn TransmitSink) {
        self.stats.report_entries += 1;
        if self.reports.push(e, now) {
            self.flush_reports(out);
        }
    }

    /// Sends the pending latency reports now.
    pub fn flush_reports_now(&mut self, out: &mut dyn TransmitSink) {
        self.flush_reports(out);
    }

    /// A request this core will not start (the engine is shutting down): it ends with
    /// [`Failure::Shutdown`].
    pub fn refuse(&mut self, slot: u32) {
        self.stats.shutdown_failures += 1;
        self.stats.completions += 1;
        self.outcomes.fail(slot, Failure::Shutdown);
    }

    /// A request that ends before its start.
    fn fail_early(&mut self, slot: u32, f: Failure) {
        match &f {
            Failure::Discovery(_) => {
                self.stats.discovery_failures += 1;
                self.refresh_wanted = true;
            }
            Failure::Overloaded => {
                self.stats.overloaded += 1;
                // logged at 1, 2, 4, 8, ... refusals: visible, never a flood
                if self.stats.overloaded.is_power_of_two() {
                    tracing::warn!(
                        core = self.index,
                        refused = self.stats.overloaded,
                        "engine core overloaded: in-flight limit reached"
                    );
                }
            }
            Failure::Communication(_) => self.stats.comm_failures += 1,
            _ => {}
        }
        self.stats.completions += 1;
        self.outcomes.fail(slot, f);
    }

    // ---------------------------------------------------------------- driving

    /// Hands out what the machine queued, finishes it if it has an outcome, else
    /// re-arms its timer.
    fn drive(&mut self, key: Key, now: Instant, out: &mut dyn TransmitSink) {
        loop {
            let Some(e) = self.inflight.get_mut(key) else {
                return;
            };
            let Some(t) = e.req.poll_transmit() else {
                break;
            };
            let sock = e.sock;
            let dgram = self.inflight.datagram(key).expect("entry present");
            out.transmit(sock, t.addr, dgram, key.tag(t.endpoint, t.kind));
            self.stats.sends += 1;
            if t.kind == TransmitKind::Completion {
                self.stats.completion_sends += 1;
            }
        }
        let Some(e) = self.inflight.get_mut(key) else {
            return;
        };
        let kept = self.outcomes.get_mut(e.held);
        if let Some(res) = e.req.poll_outcome_kept(&self.cfg.plan, kept) {
            self.finish(key, res, now);
            return;
        }
        let next = e.req.poll_timeout();
        let cur = e.timer;
        match next {
            Some(n) if self.wheel.is_armed_at(cur, n) => {}
            _ => {
                self.wheel.cancel(cur);
                let timer = match next {
                    Some(n) => self.wheel.insert(n, key.pack()),
                    None => TimerHandle::NONE,
                };
                if let Some(e) = self.inflight.get_mut(key) {
                    e.timer = timer;
                }
            }
        }
    }

    /// Removes a finished request and queues its outcome: `Ok` = the held response (its
    /// send counts written by `Delivery::poll_outcome_kept`).
    fn finish(&mut self, key: Key, res: Result<(), Failure>, now: Instant) {
        let Some(e) = self.inflight.get_mut(key) else {
            return;
        };
        self.wheel.cancel(e.timer);
        let s = &mut self.stats;
        let elapsed = micros(now.saturating_duration_since(e.req.started()));
        if res.is_ok() && e.answered_us != u32::MAX {
            s.record_breakdown(
                u64::from(e.queued_us),
                u64::from(e.answered_us),
                u64::from(elapsed.saturating_sub(e.answered_us)),
            );
        }
        // a decision's response stays in its cell until it is taken (moved once)
        let result = match res {
            Ok(()) => {
                if let Some(r) = self.outcomes.get_mut(e.held) {
                    s.count_decision(r, e.req.snapshot());
                }
                Ok(std::mem::replace(&mut e.held, Held::NONE))
            }
            Err(f) => {
                drop(self.outcomes.take(&mut e.held));
                s.count_failure(&f);
                Err(f)
            }
        };
        let latency = now.saturating_duration_since(e.req.started())
            + Duration::from_micros(u64::from(e.queued_us));
        s.record_latency(latency, self.cfg.policy.horizon());
        s.completions += 1;
        let slot = e.slot;
        // a draining socket closes once its last request ended
        if let Some((sock, 0)) = self.inflight.discard(key)
            && sock != self.socks.current()
        {
            self.socks.drained(sock);
        }
        self.outcomes.finish(slot, result, now);
    }

    /// Sends the completion transmits held back since the last receive batch (only
    /// before each request's D) and finishes those decisions; true when there were any.
    fn flush_completing(&mut self, now: Instant, out: &mut dyn TransmitSink) -> bool {
        if self.completing_since.take().is_none() {
            return false;
        }
        let mut keys = std::mem::take(&mut self.completing);
        for key in keys.drain(..) {
            if let Some(e) = self.inflight.get_mut(key) {
                e.req.expire_completion(&self.cfg.plan, now);
                self.drive(key, now, out);
            }
        }
        self.completing = keys;
        true
    }

    /// Sends the completion transmits held back during the last receive batch, fires due
    /// timers and flushes due reports; true when anything happened.
    pub fn handle_timeout(&mut self, now: Instant, out: &mut dyn TransmitSink) -> bool {
        let completed = self.flush_completing(now, out);
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.expire(now, |v| fired.push(v));
        let mut any = completed || !fired.is_empty();
        for v in fired.drain(..) {
            let key = Key::unpack(v);
            if let Some(e) = self.inflight.get_mut(key) {
                e.timer = TimerHandle::NONE;
                e.req.handle_timeout(&self.cfg.plan, now);
                self.drive(key, now, out);
            }
        }
        self.fired = fired;
        if self.reports.is_due(now) {
            self.flush_reports(out);
            any = true;
        }
        any
    }

    // ---------------------------------------------------------------- sending

    /// A transmit handed out with `tag` could not be sent.
    pub fn handle_send_failed(&mut self, now: Instant, tag: u64, out: &mut dyn TransmitSink) {
        self.stats.send_failures += 1;
        if tag == REPORT_TAG {
            self.stats.report_datagrams = self.stats.report_datagrams.saturating_sub(1);
            return;
        }
        let (key, ep, kind) = Key::from_tag(tag);
        // nothing is counted that was not sent, whether or not the request is still live
        self.stats.sends = self.stats.sends.saturating_sub(1);
        if kind == TransmitKind::Completion {
            self.stats.completion_sends = self.stats.completion_sends.saturating_sub(1);
        }
        // the tag may name a request that has finished since (its slab cell is reused
        // only with a new generation, so this check is exact)
        if let Some(e) = self.inflight.get_mut(key) {
            e.req.transmit_failed(ep, kind);
            self.drive(key, now, out);
        }
    }

    fn flush_reports(&mut self, out: &mut dyn TransmitSink) {
        if self.reports.is_empty() {
            return;
        }
        let snapshot = self.snapshot.clone();
        let (Ok(rnd), false) = (self.inflight.datagram_random(), snapshot.is_empty()) else {
            self.stats.report_failures += 1;
            self.reports.clear();
            return;
        };
        let (tenant, nonce) = wire::request_tenant(self.cfg.auth.key_id(), &rnd, self.wall_ms);
        let encoded = wire::encode_report(
            &self.cfg.auth,
            &tenant,
            nonce,
            &mut self.scratch[..],
            self.reports.entries(),
        );
        self.reports.clear();
        let Ok(n) = encoded else {
            self.stats.report_failures += 1;
            return;
        };
        let sock = self.socks.current();
        for ep in snapshot.iter() {
            out.transmit(sock, ep.addr, &self.scratch[..n], REPORT_TAG);
            self.stats.report_datagrams += 1;
        }
    }

    // ---------------------------------------------------------------- shutdown

    /// Ends every in-flight request with `Failure::Shutdown` (exactly once), after
    /// sending the pending reports. The core first refuses what is still queued
    /// ([`CoreState::refuse`]).
    pub fn shutdown(&mut self, now: Instant, out: &mut dyn TransmitSink) {
        self.flush_completing(now, out);
        self.flush_reports(out);
        for key in self.inflight.keys() {
            self.finish(key, Err(Failure::Shutdown), now);
        }
    }

    /// After a fault inside this core: ends every in-flight request with `f` without
    /// touching the network (queued requests are the runtime's to fail).
    pub fn fail_in_flight(&mut self, f: &Failure) {
        for key in self.inflight.keys() {
            if let Some(e) = self.inflight.get_mut(key) {
                self.stats.completions += 1;
                drop(self.outcomes.take(&mut e.held));
                let slot = e.slot;
                self.inflight.discard(key);
                self.outcomes.fail(slot, f.clone());
            }
        }
    }
}
