//! The per-core event loop (runs inside one pinned glommio executor).
//!
//! Owns, for its core: the in-flight table, the timer wheel, the socket set (steering),
//! the receive/send batches, report coalescing, randomness for unique ids and nonces,
//! and the core's statistics. One iteration: receive every queued datagram (recvmmsg),
//! drain submissions (a bounded batch, no syscall), fire due timers, flush reports,
//! flush sends (sendmmsg), apply steering. When idle it spins briefly on the queue, then
//! announces it is parking and blocks in `poll(2)` on its sockets and wake eventfd with
//! the next occupied wheel tick as the only timer.
//! Must not touch: other cores' state, the API key string; the decisions themselves are
//! the request machine's.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::Shared;
use super::inflight::{Entry, InFlight, Key};
use super::io::{RecvBatch, SendBatch, wait_fds};
use super::reports::Reports;
use super::stats::{ROUND_BUCKETS, Stats};
use super::steering::SocketSet;
use super::submit::{Msg, PduBuf};
use super::wheel::{TimerHandle, TimerWheel};
use crate::machine::{Accepted, Delivery, Ignored, Sends, TransmitKind};
use crate::outcome::{CommError, Failure, GuardResult, Outcome, Phase, ResourceResult, Response};
use crate::wire::{self, DropReason, RateResponseView, TenantFields, TenantView};

/// Datagrams per recvmmsg / sendmmsg.
const BATCH: usize = 64;
/// Submissions taken from the queue per iteration.
const DRAIN: usize = 256;
/// Receive batches per socket per iteration.
const RECV_ROUNDS: usize = 8;
/// Busy-poll of the queue before parking.
const SPIN: Duration = Duration::from_micros(20);
/// Send tag of latency reports.
const REPORT_TAG: u64 = u64::MAX;
/// Random bytes fetched per getrandom call.
const RNG_POOL: usize = 4096;

/// Buffered OS randomness (one getrandom call per ~146 requests).
struct RandPool {
    buf: Box<[u8; RNG_POOL]>,
    at: usize,
}

impl RandPool {
    fn new() -> RandPool {
        RandPool {
            buf: Box::new([0u8; RNG_POOL]),
            at: RNG_POOL,
        }
    }

    fn fill(&mut self, out: &mut [u8]) -> Result<(), wire::RngError> {
        if self.at + out.len() > RNG_POOL {
            wire::fill_random(&mut self.buf[..])?;
            self.at = 0;
        }
        out.copy_from_slice(&self.buf[self.at..self.at + out.len()]);
        // never hand out the same bytes twice
        self.buf[self.at..self.at + out.len()].fill(0);
        self.at += out.len();
        Ok(())
    }
}

/// One engine core.
pub(crate) struct Core {
    index: usize,
    shared: Arc<Shared>,
    inflight: InFlight,
    wheel: TimerWheel<u64>,
    socks: SocketSet,
    recv: Option<RecvBatch>,
    send: SendBatch,
    send_sock: u32,
    failed: Vec<u64>,
    fired: Vec<u64>,
    rng: RandPool,
    stats: Stats,
    reports: Reports,
    scratch: Box<[u8; wire::MAX_DATAGRAM]>,
    wall_ms: u64,
    fds: Vec<i32>,
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Core {
    pub(crate) fn new(index: usize, shared: Arc<Shared>) -> std::io::Result<Core> {
        let socks = SocketSet::new(shared.recv_buf, shared.send_buf)?;
        let mut rng = RandPool::new();
        let mut mask = [0u8; 5];
        rng.fill(&mut mask)
            .map_err(|_| std::io::Error::other("rng"))?;
        let limit = shared.in_flight_per_core;
        let mut send = SendBatch::new(BATCH);
        send.set_v6_socket(socks.is_v6());
        let max_reports = wire::max_report_entries(shared.auth.mode());
        Ok(Core {
            index,
            inflight: InFlight::new(limit, mask),
            wheel: TimerWheel::new(
                Instant::now(),
                Duration::from_millis(1),
                8192,
                limit.min(1 << 16),
            ),
            socks,
            recv: Some(RecvBatch::new(BATCH)),
            send,
            send_sock: 0,
            failed: Vec::with_capacity(BATCH * 4),
            fired: Vec::with_capacity(1024),
            rng,
            stats: Stats::new(),
            reports: Reports::new(max_reports, shared.report_interval),
            scratch: Box::new([0u8; wire::MAX_DATAGRAM]),
            wall_ms: wall_ms(),
            fds: Vec::with_capacity(8),
            shared,
        })
    }

    /// Local address of the socket new requests use (for tests).
    pub(crate) fn local_addr(&self) -> std::net::SocketAddr {
        self.socks.local_addr()
    }

    /// Runs until shutdown.
    pub(crate) async fn run(mut self) {
        loop {
            let now = Instant::now();
            self.wall_ms = wall_ms();
            let mut work = self.receive_all(now);
            work |= self.drain_queue(now);
            work |= self.fire_timers(Instant::now());
            if self.reports.is_due(Instant::now()) {
                self.flush_reports();
                work = true;
            }
            self.flush();
            self.process_failures(Instant::now());
            self.flush();
            let r = self.socks.apply();
            self.stats.steering_rebinds += r.rebinds;
            self.stats.rebind_failures += r.failures;
            if self.queue().stop.load(Ordering::Acquire) {
                self.shutdown();
                return;
            }
            if work {
                glommio::yield_if_needed().await;
            } else {
                self.park();
            }
        }
    }

    fn queue(&self) -> &super::submit::CoreQueue {
        &self.shared.queues[self.index]
    }

    fn park(&mut self) {
        let q = &self.shared.queues[self.index];
        let spin_until = Instant::now() + SPIN;
        while Instant::now() < spin_until {
            if !q.rx.is_empty() {
                return;
            }
            std::hint::spin_loop();
        }
        q.parked.store(true, Ordering::SeqCst);
        if !q.rx.is_empty() || q.stop.load(Ordering::SeqCst) {
            q.parked.store(false, Ordering::SeqCst);
            return;
        }
        let now = Instant::now();
        let next = match (self.wheel.next_deadline(), self.reports.due_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let timeout = next.map(|t| t.saturating_duration_since(now));
        self.fds.clear();
        self.fds.push(std::os::fd::AsRawFd::as_raw_fd(&q.wake));
        for i in 0..self.socks.len() {
            self.fds
                .push(std::os::fd::AsRawFd::as_raw_fd(&self.socks.by_index(i).io));
        }
        let _ = wait_fds(&self.fds, libc::POLLIN, timeout);
        q.parked.store(false, Ordering::SeqCst);
        q.wake.drain();
    }

    // ---------------------------------------------------------------- receive

    fn receive_all(&mut self, now: Instant) -> bool {
        let mut any = false;
        let mut recv = self.recv.take().expect("receive batch");
        let mut i = 0;
        while i < self.socks.len() {
            for _ in 0..RECV_ROUNDS {
                let n = self
                    .socks
                    .by_index(i)
                    .io
                    .recv_batch(&mut recv)
                    .unwrap_or_default();
                if n == 0 {
                    break;
                }
                any = true;
                for k in 0..n {
                    self.stats.received += 1;
                    match recv.datagram(k) {
                        Some(d) => self.on_datagram(now, d),
                        None => self.stats.drop(DropReason::TooLong),
                    }
                }
                if n < BATCH {
                    break;
                }
            }
            i += 1;
        }
        self.recv = Some(recv);
        any
    }

    fn on_datagram(&mut self, now: Instant, buf: &mut [u8]) {
        let uid = match TenantView::parse(buf) {
            Ok(t) => t.unique_id(),
            Err(r) => return self.stats.drop(r),
        };
        let Some(key) = self.inflight.route(&uid) else {
            return self.stats.drop(DropReason::UnknownRequest);
        };
        let opened = match wire::open(&self.shared.auth, buf) {
            Ok(o) => o,
            Err(r) => return self.stats.drop(r),
        };
        let resp = match RateResponseView::parse(opened.pdu) {
            Ok(r) => r,
            Err(r) => return self.stats.drop(r),
        };
        let Some(e) = self.inflight.get_mut(key) else {
            return;
        };
        let (server_id, steering) = (opened.tenant.id(), opened.tenant.steering());
        let res = e
            .req
            .handle_results(&self.shared.plan, now, server_id, steering);
        match res {
            Ok(v) => {
                if v.accepted != Accepted::NotRetained {
                    // built straight into the completion slot (replacing a retained one)
                    let r = Response::from_results(
                        server_id,
                        steering,
                        v.phase,
                        resp.guards().map(|g| {
                            GuardResult::new(
                                g.tracker_id(),
                                g.threshold_ms(),
                                g.current_latency_ms(),
                            )
                        }),
                        resp.resources().map(|r| ResourceResult {
                            bucket_id: r.bucket_id(),
                            window_ms: r.window_ms(),
                            actual_rate: r.actual_rate(),
                            deficit: r.deficit(),
                        }),
                    );
                    self.shared.pool.stage(e.slot, r);
                }
                if e.req.poll_steering() == Some(0) {
                    let sock = e.sock;
                    self.socks.hint(sock);
                }
            }
            Err(Ignored::UnknownServer) => self.stats.drop(DropReason::UnknownServer),
            Err(_) => self.stats.ignored_responses += 1,
        }
        self.drive(key, now);
    }

    // ---------------------------------------------------------------- submissions

    /// A queued message other than a request: a latency report entry, a statistics
    /// request, or a report flush (answered with the statistics after the flush).
    fn handle_control(&mut self, msg: Msg, now: Instant) {
        match msg {
            Msg::Report(e) => {
                self.stats.report_entries += 1;
                if self.reports.push(e, now) {
                    self.flush_reports();
                }
            }
            Msg::Stats(tx) => {
                let _ = tx.try_send(self.stats.clone());
            }
            Msg::FlushReports(tx) => {
                self.flush_reports();
                let _ = tx.try_send(self.stats.clone());
            }
            Msg::Request { .. } => unreachable!("requests are started or failed by the caller"),
        }
    }

    fn drain_queue(&mut self, now: Instant) -> bool {
        let mut n = 0;
        while n < DRAIN {
            let msg = match self.shared.queues[self.index].rx.try_recv() {
                Ok(m) => m,
                Err(_) => break,
            };
            n += 1;
            match msg {
                Msg::Request {
                    pdu,
                    slot,
                    submitted,
                } => self.start(now, &pdu, slot, submitted),
                other => self.handle_control(other, now),
            }
        }
        n > 0
    }

    fn complete(&mut self, slot: u32, out: Outcome) {
        self.stats.completions += 1;
        self.shared.pool.complete(slot, out);
    }

    fn fail_early(&mut self, slot: u32, f: Failure) {
        match &f {
            Failure::Discovery(_) => {
                self.stats.discovery_failures += 1;
                self.shared.membership.request_refresh();
            }
            Failure::Overloaded => self.stats.overloaded += 1,
            Failure::Communication(_) => self.stats.comm_failures += 1,
            _ => {}
        }
        self.complete(slot, Err(f));
    }

    fn start(&mut self, now: Instant, pdu: &PduBuf, slot: u32, submitted: Instant) {
        let Some(key) = self.inflight.reserve() else {
            return self.fail_early(slot, Failure::Overloaded);
        };
        let snapshot = self.shared.membership.snapshot();
        let req = match Delivery::new(&self.shared.plan, snapshot, now) {
            Ok(m) => m,
            Err(f) => {
                self.inflight.unreserve(key);
                return self.fail_early(slot, f);
            }
        };
        let mut rnd = [0u8; 28];
        if self.rng.fill(&mut rnd).is_err() {
            self.inflight.unreserve(key);
            return self.fail_early(slot, Failure::Communication(CommError::Rng));
        }
        let mut uid = [0u8; 16];
        uid.copy_from_slice(&rnd[..16]);
        self.inflight.stamp_unique_id(key, &mut uid);
        wire::shape_unique_id(&mut uid);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&rnd[16..]);
        let tenant = TenantFields {
            id: self.shared.auth.key_id(),
            unique_id: uid,
            timestamp_ms: self.wall_ms,
            steering: 0,
        };
        let pdu = pdu.as_slice();
        let p = self.shared.auth.pdu_offset();
        let total = p + pdu.len();
        let mut dgram = self.inflight.alloc_dgram(total);
        let bytes = self.inflight.bytes_mut(&mut dgram);
        let sealed = match bytes.get_mut(p..total) {
            Some(b) => {
                b.copy_from_slice(pdu);
                wire::seal(&self.shared.auth, &tenant, nonce, bytes, pdu.len())
            }
            None => Err(wire::EncodeError::TooLarge {
                needed: total,
                max: wire::MAX_DATAGRAM,
            }),
        };
        match sealed {
            Ok(n) => dgram.set_len(n),
            Err(_) => {
                // the size was checked when the request was built
                self.inflight.recycle(dgram);
                self.inflight.unreserve(key);
                return self.fail_early(
                    slot,
                    Failure::Configuration(
                        crate::error::RequestError::TooLarge {
                            needed: total,
                            max: wire::MAX_DATAGRAM,
                        }
                        .into(),
                    ),
                );
            }
        }
        let sock = self.socks.current_id();
        self.socks.acquire(sock);
        self.inflight.insert(
            key,
            Entry {
                req,
                timer: TimerHandle::NONE,
                slot,
                sock,
                queued_us: now
                    .saturating_duration_since(submitted)
                    .as_micros()
                    .min(u128::from(u32::MAX)) as u32,
                generation: 0,
                dgram,
            },
        );
        self.drive(key, now);
    }

    // ---------------------------------------------------------------- driving

    /// Sends what the machine queued, finishes it if it has an outcome, else re-arms its
    /// timer.
    fn drive(&mut self, key: Key, now: Instant) {
        loop {
            let Some(e) = self.inflight.get_mut(key) else {
                return;
            };
            let Some(t) = e.req.poll_transmit() else {
                break;
            };
            let sock = e.sock;
            if (!self.send.is_empty() && self.send_sock != sock) || self.send.is_full() {
                self.flush();
            }
            self.send_sock = sock;
            let dgram = self.inflight.datagram(key).expect("entry present");
            self.send.push(dgram, t.addr, key.tag(t.endpoint, t.kind));
            self.stats.sends += 1;
            if t.kind == TransmitKind::Completion {
                self.stats.completion_sends += 1;
            }
        }
        let Some(e) = self.inflight.get_mut(key) else {
            return;
        };
        if let Some(out) = e.req.poll_outcome(&self.shared.plan) {
            self.finish(key, out, now);
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

    /// Removes a finished request and delivers its outcome: `Ok` = the response staged
    /// in its completion slot, with these send counts.
    fn finish(&mut self, key: Key, out: Result<Sends, Failure>, now: Instant) {
        let Some(e) = self.inflight.remove(key) else {
            return;
        };
        self.wheel.cancel(e.timer);
        self.socks.release(e.sock);
        let pool = &self.shared.pool;
        let s = &mut self.stats;
        let delivered = match &out {
            Ok(n) => pool.complete_staged(e.slot, |r| {
                r.sends = n.sends;
                r.completion_sends = n.completion_sends;
                if r.is_granted() {
                    s.granted += 1;
                } else {
                    s.rejected += 1;
                }
                match r.phase {
                    Phase::Round(k) => {
                        s.decisions_by_round[(k as usize).min(ROUND_BUCKETS - 1)] += 1;
                        if k == 0 {
                            let oldest = e.req.snapshot().iter().map(|x| x.server_id).min();
                            if r.server_id != oldest {
                                s.oldest_fallbacks += 1;
                            }
                        }
                    }
                    Phase::Final => s.decisions_final += 1,
                    Phase::Local => {}
                }
            }),
            Err(f) => {
                match f {
                    Failure::Timeout { .. } => s.timeouts += 1,
                    Failure::Communication(_) => s.comm_failures += 1,
                    Failure::Shutdown => s.shutdown_failures += 1,
                    _ => {}
                }
                None
            }
        };
        let latency = now.saturating_duration_since(e.req.started())
            + Duration::from_micros(u64::from(e.queued_us));
        s.record_latency(latency, self.shared.policy.horizon());
        s.completions += 1;
        if delivered.is_none() {
            // a failure (a staged response, if any, is dropped); a decision always has
            // its response staged, so `Shutdown` here is only a guard
            let f = out.err().unwrap_or(Failure::Shutdown);
            self.shared.pool.complete(e.slot, Err(f));
        }
        self.inflight.recycle(e.dgram);
    }

    fn fire_timers(&mut self, now: Instant) -> bool {
        let mut fired = std::mem::take(&mut self.fired);
        self.wheel.expire(now, |v| fired.push(v));
        let any = !fired.is_empty();
        for v in fired.drain(..) {
            let key = Key::unpack(v);
            if let Some(e) = self.inflight.get_mut(key) {
                e.timer = TimerHandle::NONE;
                e.req.handle_timeout(&self.shared.plan, now);
                self.drive(key, now);
            }
        }
        self.fired = fired;
        any
    }

    // ---------------------------------------------------------------- sending

    fn flush(&mut self) {
        if self.send.is_empty() {
            return;
        }
        let failed = &mut self.failed;
        let sent = match self.socks.get(self.send_sock) {
            Some(io) => io.send_batch(&mut self.send, |tag| failed.push(tag)),
            None => {
                // the socket is gone (cannot happen: sockets close only when drained)
                self.send.len()
            }
        };
        let _ = sent;
    }

    fn process_failures(&mut self, now: Instant) {
        if self.failed.is_empty() {
            return;
        }
        let mut failed = std::mem::take(&mut self.failed);
        for tag in failed.drain(..) {
            self.stats.send_failures += 1;
            if tag == REPORT_TAG {
                continue;
            }
            let (key, ep, kind) = Key::from_tag(tag);
            if let Some(e) = self.inflight.get_mut(key) {
                self.stats.sends = self.stats.sends.saturating_sub(1);
                e.req.transmit_failed(ep, kind);
                self.drive(key, now);
            }
        }
        self.failed = failed;
    }

    fn flush_reports(&mut self) {
        if self.reports.is_empty() {
            return;
        }
        let snapshot = self.shared.membership.snapshot();
        let mut rnd = [0u8; 28];
        if snapshot.is_empty() || self.rng.fill(&mut rnd).is_err() {
            self.stats.report_failures += 1;
            self.reports.clear();
            return;
        }
        let mut uid = [0u8; 16];
        uid.copy_from_slice(&rnd[..16]);
        wire::shape_unique_id(&mut uid);
        let mut nonce = [0u8; 12];
        nonce.copy_from_slice(&rnd[16..]);
        let tenant = TenantFields {
            id: self.shared.auth.key_id(),
            unique_id: uid,
            timestamp_ms: self.wall_ms,
            steering: 0,
        };
        let n = match wire::encode_report(
            &self.shared.auth,
            &tenant,
            nonce,
            &mut self.scratch[..],
            self.reports.entries(),
        ) {
            Ok(n) => n,
            Err(_) => {
                self.stats.report_failures += 1;
                self.reports.clear();
                return;
            }
        };
        self.reports.clear();
        let sock = self.socks.current_id();
        if !self.send.is_empty() && self.send_sock != sock {
            self.flush();
        }
        let before = self.failed.len();
        for ep in snapshot.iter() {
            if self.send.is_full() {
                self.flush();
            }
            self.send_sock = sock;
            self.send.push(&self.scratch[..n], ep.addr, REPORT_TAG);
        }
        self.flush();
        let failures = self.failed[before..]
            .iter()
            .filter(|t| **t == REPORT_TAG)
            .count();
        self.stats.report_datagrams += (snapshot.len() - failures.min(snapshot.len())) as u64;
        if failures >= snapshot.len() {
            self.stats.report_failures += 1;
        }
    }

    // ---------------------------------------------------------------- shutdown

    fn shutdown(&mut self) {
        let now = Instant::now();
        // queued requests: never started
        while let Ok(msg) = self.shared.queues[self.index].rx.try_recv() {
            match msg {
                Msg::Request { slot, .. } => {
                    self.stats.shutdown_failures += 1;
                    self.complete(slot, Err(Failure::Shutdown));
                }
                other => self.handle_control(other, now),
            }
        }
        self.flush_reports();
        self.flush();
        self.process_failures(now);
        for key in self.inflight.keys() {
            self.finish(key, Err(Failure::Shutdown), now);
        }
    }
}
