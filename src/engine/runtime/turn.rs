//! The turn of one engine core ([`Core::turn`]): its I/O shell around [`CoreState`],
//! written once for both schedulers.
//!
//! Owns: the order of a turn, the core's [`UdpIo`] (mmsg or io_uring backend,
//! GSO/GRO, the sockets), the clock, the drain of the core's queue into its state (a
//! request's PDU read in its completion slot, reports, report flushes, the test fault;
//! the membership snapshot each turn), the delivery of the outcomes (each written into its
//! slot, then the callers woken once), the publication of the core's statistics, and
//! fault containment (the catch; the bookkeeping after it, the core's construction and
//! its shutdown are `super::core_setup`'s; the transmit sinks `super::sink`'s). Must not
//! touch: request state, the wire format, decisions (all in [`CoreState`]), threads and
//! tasks (the schedulers: `super::pinned` runs [`Core::run`] on a pinned thread,
//! `super::hosted` turns from a task on the application's runtime).
//!
//! # A turn
//!
//! 0. **Catch-up after a stall:** when a timer is due and the last receive is older than
//!    [`STALL`](super::consts::STALL) (the core could not run: a loaded machine, a task
//!    blocking a hosted core's thread), one I/O pass runs first, so the answers that
//!    arrived meanwhile decide their requests before the timers time them out.
//! 1. **Submissions and timers:** the queue is drained into the state (at most
//!    [`DRAIN`](super::consts::DRAIN) messages) and due timers fire; their transmits are
//!    queued on the I/O layer.
//! 2. **Fault feedback:** sends that failed are handed back to the state (it retries on
//!    another server or fails the request).
//! 3. **Socket operations:** steering opens a socket or closes one (a `Close` after a
//!    flush, so a closing socket's last datagrams leave first; the scheduler hears of it
//!    before, [`Scheduler::unwatch`]).
//! 4. **Publication** when a reader asked or every [`PUBLISH_EVERY`].
//! 5. **I/O:** one pass of the I/O layer: it sends what is queued (GSO-grouped, one
//!    `sendmmsg` or one ring submission) and receives; each datagram goes straight to
//!    the state, whose answers are queued for the next pass. A scheduler that
//!    [blocks](Scheduler::BLOCKS) lets the pass wait (up to the core's next deadline,
//!    for a datagram or a submitter's wake-up) when no work is certain and no outcome
//!    waits to be delivered; the other never waits and receives only where the runtime
//!    reported readiness.
//! 6. **Delivery**, once: every outcome the state handed out this turn
//!    (`CoreState::poll_outcome`) is written into its completion slot, then the callers
//!    are woken.
//! 7. **Result:** [`Turn::Busy`] when more work is certain (a receive filled its
//!    buffers, submissions or failures wait, a deadline passed), else
//!    [`Turn::Idle`] until the next deadline. Before it idles the core publishes its
//!    counters, and its histograms once the pause lasts [`PUBLISH_IDLE_EVERY`], so
//!    readers see an idle core's figures without asking. [`Turn::Stopped`] once the
//!    engine shut down and every request completed.
//!
//! **The wake order**, the same under both schedulers: callers are woken at step 6
//! only, after the turn's sends. A decision reached by a datagram that queued no
//! completion resends is delivered at step 6 of the turn that received it; one that
//! queued some is held until the next turn's `handle_timeout` (step 1) sends them and
//! hands it out, so they leave in that turn's I/O pass before the caller is woken.
//! A submitter wakes an idle core with at most one `write(2)` or task wake (see
//! `udp::Waker`).
//!
//! # Faults
//!
//! A panic inside a turn is contained here, the same for both schedulers: every request
//! the core holds fails with [`Failure::CoreFailed`], the core is marked dead
//! (submitters then fail at once), the scheduler unwatches its sockets, and every later
//! turn only fails what still reaches the queue (the I/O layer may be the part that
//! failed, so it is not used again), idling a millisecond between turns, until the
//! engine shuts down.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::consts::{
    DRAIN, FAILURE_ROUNDS, PUBLISH_EVERY, PUBLISH_IDLE_EVERY, REBIND_TRIES, STALL, WALL_RESYNC,
};
use super::shared::Shared;
use super::sink::{IoSink, QueueSink, flush};
use super::submit::Msg;
use crate::engine::core::{CoreState, SocketOp, TransmitSink};
use crate::udp::{IoEvent, SendQueue, SocketId, UdpIo};

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The wall clock in milliseconds (the requests' timestamps), derived from the turn's
/// monotonic reading and read afresh every [`WALL_RESYNC`]: one clock read per turn
/// instead of two.
pub(super) struct WallClock {
    at: Instant,
    ms: u64,
}

impl WallClock {
    pub(super) fn new() -> WallClock {
        WallClock {
            at: Instant::now(),
            ms: wall_ms(),
        }
    }

    fn ms(&mut self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.at);
        if since >= WALL_RESYNC {
            *self = WallClock::new();
            return self.ms;
        }
        self.ms + since.as_millis() as u64
    }
}

/// What runs a core's turns: the pinned thread or the hosted task.
pub(crate) trait Scheduler {
    /// The turn's I/O pass may block the thread (until the next deadline, a datagram or
    /// a submitter's wake-up) when no work is certain. When false it never waits and
    /// receives only on the sockets [`readable`](Self::readable) names.
    const BLOCKS: bool;

    /// The runtime reported `sock` readable since the last turn (asked only when
    /// [`BLOCKS`](Self::BLOCKS) is false).
    fn readable(&self, sock: SocketId) -> bool;

    /// The core stops using `sock` (it is about to close, or the core failed): what
    /// watches it must go first.
    fn unwatch(&mut self, sock: SocketId);
}

/// What a turn leaves: more work is certain, nothing to do until a datagram, a
/// submission or `until`, or the core has stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    Busy,
    Idle { until: Option<Instant> },
    Stopped,
}

/// One engine core: its state and its I/O (built, failed and abandoned in
/// `super::core_setup`).
pub(crate) struct Core {
    pub(super) state: CoreState,
    pub(super) io: UdpIo,
    /// The sockets open now (the first, then steering's).
    pub(super) open: Vec<SocketId>,
    pub(super) failed: Vec<u64>,
    /// Slots whose callers are woken at the end of the delivery.
    pub(super) wakes: Vec<u32>,
    pub(super) v6: bool,
    /// The last pass filled its receive buffers: the next one receives on every socket.
    pub(super) read_all: bool,
    /// When this core last published its statistics (histograms included).
    pub(super) published_at: Instant,
    /// Some turn did work since the last publication: counters are due at the pause.
    pub(super) counters_dirty: bool,
    /// Some turn did work since the histograms were last published.
    pub(super) dirty: bool,
    /// When the current pause began (`None` while turns find work). Under load pauses
    /// are short and end at the next turn: the histograms, whose copy costs tens of µs,
    /// are then published every [`PUBLISH_EVERY`], not at each pause.
    pub(super) idle_since: Option<Instant>,
    /// A turn panicked (see the module docs).
    pub(super) dead: bool,
    pub(super) wall: WallClock,
    /// When the current turn began.
    pub(super) turn_at: Instant,
    /// When the last I/O pass ended (its receive), for step 0.
    pub(super) passed_at: Instant,
    pub(super) shared: Arc<Shared>,
    pub(super) index: usize,
}

impl Core {
    /// Runs turns until the core stops (a pinned thread's whole life).
    pub(crate) fn run<S: Scheduler>(&mut self, s: &mut S) {
        while self.turn(s) != Turn::Stopped {}
    }

    /// One turn (see the module docs), contained: a panic fails the core's requests
    /// and marks it dead instead of unwinding into the scheduler.
    pub(crate) fn turn<S: Scheduler>(&mut self, s: &mut S) -> Turn {
        if self.dead {
            return self.dead_turn::<S>();
        }
        match catch_unwind(AssertUnwindSafe(|| self.live_turn(s))) {
            Ok(t) => t,
            Err(_) => {
                for &id in &self.open {
                    s.unwatch(id);
                }
                self.fault();
                self.dead_turn::<S>()
            }
        }
    }

    fn live_turn<S: Scheduler>(&mut self, s: &mut S) -> Turn {
        let now = Instant::now();
        self.turn_at = now;
        let caught_up = self.catch_up::<S>(now);
        let found = self.take_work(now) | caught_up;
        self.socket_ops(&mut |id| s.unwatch(id));
        if self.shared.stats_wanted(self.index)
            || now.saturating_duration_since(self.published_at) >= PUBLISH_EVERY
        {
            self.publish(now);
        }
        if self.shared.intake.queues[self.index]
            .stop
            .load(Ordering::Acquire)
        {
            return self.stop();
        }
        let got = if S::BLOCKS {
            // outcomes are not kept waiting for the pass: no wait then
            let idle = if self.state.has_outcomes() {
                Turn::Busy
            } else {
                self.outcome()
            };
            let timeout = match idle {
                Turn::Idle { until } => {
                    self.spin();
                    until.map(|t| t.saturating_duration_since(Instant::now()))
                }
                _ => Some(Duration::ZERO),
            };
            self.io_pass(Wait::Upto(timeout), None)
        } else {
            let read_all = self.read_all;
            self.io_pass(Wait::Never(&|id| read_all || s.readable(id)), None)
        };
        self.deliver();
        if found || got {
            self.dirty = true;
            self.counters_dirty = true;
            self.idle_since = None;
        }
        self.outcome()
    }

    /// Step 0: after a stall, one pass that never waits before the timers fire; true when
    /// datagrams arrived. The core cannot tell when, within the stall, an answer reached
    /// its socket: it hands each to the state as of the stall's start (the end of its
    /// last pass), before any timer that passed since, so the answers count by the
    /// protocol's timing rules as they would have had the core run. It receives on every
    /// socket: a hosted core's runtime may run the timer's wake-up before it reports the
    /// sockets readable. The pass also sends what an earlier turn left queued.
    fn catch_up<S: Scheduler>(&mut self, now: Instant) -> bool {
        if now.saturating_duration_since(self.passed_at) <= STALL
            || self.state.poll_timeout().is_none_or(|d| d > now)
        {
            return false;
        }
        let at = Some(self.passed_at);
        let got = if S::BLOCKS {
            self.io_pass(Wait::Upto(Some(Duration::ZERO)), at)
        } else {
            self.io_pass(Wait::Never(&|_| true), at)
        };
        self.passed_at = now;
        got
    }

    /// Steps 1 and 2: submissions, due timers, send failures; true when any was found.
    fn take_work(&mut self, now: Instant) -> bool {
        let wall = self.wall.ms(now);
        self.state.set_wall_ms(wall);
        let mut sink = IoSink {
            io: &mut self.io,
            failed: &mut self.failed,
        };
        let mut work = submissions(&self.shared, self.index, &mut self.state, now, &mut sink);
        work |= self.state.handle_timeout(now, &mut sink);
        work |= !self.failed.is_empty();
        self.feed_failures(now);
        work
    }

    /// Step 6: writes every outcome the state handed out into its completion slot, then
    /// wakes those callers (a caller on the core's CPU runs only after every slot is
    /// written).
    pub(super) fn deliver(&mut self) {
        let pool = &self.shared.intake.pool;
        while let Some(o) = self.state.outcomes().pop() {
            pool.complete_deferred(o.slot, o.outcome, o.decided_at, &mut self.wakes);
        }
        for idx in self.wakes.drain(..) {
            pool.wake(idx);
        }
    }

    /// Step 7: the turn's result, and the publication before a pause.
    fn outcome(&mut self) -> Turn {
        if self.read_all
            || !self.failed.is_empty()
            || !self.shared.intake.queues[self.index].is_empty()
        {
            return Turn::Busy;
        }
        let deadline = self.state.poll_timeout();
        // a fresh clock reading, not the turn's: a deadline that passed during the turn
        // is due now, not at the scheduler's next timer tick
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return Turn::Busy;
        }
        let publish_at = self.pause();
        let until = [deadline, publish_at].into_iter().flatten().min();
        Turn::Idle { until }
    }

    /// The publication policy at a pause: counters now (when some turn did work since
    /// the last publication), the histograms once the pause lasts [`PUBLISH_IDLE_EVERY`];
    /// returns when that is due.
    fn pause(&mut self) -> Option<Instant> {
        if !self.dirty {
            return None;
        }
        let now = self.turn_at;
        // a pause lasts from the first turn without work; a turn with work ends it
        let due = *self.idle_since.get_or_insert(now) + PUBLISH_IDLE_EVERY;
        if due <= now {
            self.publish(now);
            return None;
        }
        if std::mem::take(&mut self.counters_dirty) {
            self.shared
                .publish(self.index, &self.state, Some(self.io.stats()), false);
        }
        Some(due)
    }

    /// Publishes this core's statistics (a reader holding the lock defers it a turn).
    pub(super) fn publish(&mut self, now: Instant) {
        if self
            .shared
            .publish_stats(self.index, &self.state, Some(self.io.stats()))
        {
            self.published_at = now;
            self.dirty = false;
            self.counters_dirty = false;
        }
    }

    /// Step 5: one pass of the I/O layer; true when datagrams arrived. Each datagram is
    /// handed to the state at the clock read after the first one arrived, or at `at`
    /// (step 0). Sets [`Core::passed_at`].
    fn io_pass(&mut self, wait: Wait<'_>, at: Option<Instant>) -> bool {
        let state = &mut self.state;
        let failed = &mut self.failed;
        let now: Cell<Option<Instant>> = Cell::new(at);
        let mut any = false;
        let mut on_event = |q: &mut SendQueue, ev: IoEvent<'_>| match ev {
            IoEvent::Datagram { sock, data, .. } => {
                any = true;
                let t = now.get().unwrap_or_else(|| {
                    let t = Instant::now();
                    now.set(Some(t));
                    t
                });
                let mut sink = QueueSink { q, failed };
                state.handle_datagram(t, sock, data, &mut sink);
            }
            IoEvent::SendFailed { tag, .. } => failed.push(tag),
            IoEvent::Woken => {}
        };
        let (r, waited) = match wait {
            Wait::Upto(timeout) => (
                self.io.run_once(timeout, &mut on_event),
                timeout != Some(Duration::ZERO),
            ),
            Wait::Never(read) => (self.io.run_nowait(read, &mut on_event), false),
        };
        if let Err(e) = r {
            tracing::warn!(core = self.index, error = %e, "engine core I/O wait failed");
        }
        self.read_all = self.io.may_have_more();
        // the pass received when its first datagram came (it read the clock then, or took
        // step 0's `at`); one that waited for nothing ended now; one that did not wait, at
        // the turn's clock reading
        self.passed_at = match now.get() {
            Some(t) => t,
            None if waited => Instant::now(),
            None => self.turn_at,
        };
        any
    }

    fn spin(&self) {
        let Some(d) = self.shared.settings.spin else {
            return;
        };
        let q = &self.shared.intake.queues[self.index];
        let until = Instant::now() + d;
        while Instant::now() < until && q.is_empty() {
            std::hint::spin_loop();
        }
    }

    fn feed_failures(&mut self, now: Instant) {
        for _ in 0..FAILURE_ROUNDS {
            if self.failed.is_empty() {
                return;
            }
            let mut failed = std::mem::take(&mut self.failed);
            let mut sink = IoSink {
                io: &mut self.io,
                failed: &mut self.failed,
            };
            for tag in failed.drain(..) {
                self.state.handle_send_failed(now, tag, &mut sink);
            }
            // keep the allocation; failures raised meanwhile stay queued
            failed.append(&mut self.failed);
            self.failed = failed;
        }
    }

    fn socket_ops(&mut self, unwatch: &mut dyn FnMut(SocketId)) {
        while let Some(op) = self.state.poll_socket_op() {
            match op {
                SocketOp::Open { after_port } => {
                    let opened = self.io.bind_steering(self.v6, after_port, REBIND_TRIES);
                    let new = match opened {
                        Ok(s) => {
                            self.open.push(s);
                            let port = self.io.local_addr(s).map_or(0, |a| a.port());
                            tracing::debug!(core = self.index, port, "steering: new source port");
                            Some((s, port))
                        }
                        Err(e) => {
                            tracing::warn!(core = self.index, error = %e, "steering rebind failed");
                            None
                        }
                    };
                    self.state.socket_opened(new);
                }
                SocketOp::Close(id) => {
                    // its last datagrams leave before it closes
                    flush(&mut self.io, &mut self.failed);
                    if let Some(i) = self.open.iter().position(|&s| s == id) {
                        self.open.swap_remove(i);
                        unwatch(id);
                        self.io.close(id);
                    }
                }
            }
        }
    }
}

/// Step 1's intake: gives the state the current endpoint set, then up to [`DRAIN`] queued
/// submissions; true when there were any.
fn submissions(
    sh: &Shared,
    index: usize,
    state: &mut CoreState,
    now: Instant,
    out: &mut dyn TransmitSink,
) -> bool {
    state.set_membership(sh.membership.snapshot());
    let queue = &sh.intake.queues[index];
    let mut n = 0;
    while n < DRAIN {
        let Some(msg) = queue.pop() else { break };
        n += 1;
        feed(sh, index, state, now, msg, out);
    }
    if state.take_refresh_request() {
        sh.membership.request_refresh();
    }
    n > 0
}

/// Hands one message of core `index`'s queue to its state: a request's PDU is read in
/// its completion slot, where its submitter wrote it.
pub(super) fn feed(
    sh: &Shared,
    index: usize,
    state: &mut CoreState,
    now: Instant,
    msg: Msg,
    out: &mut dyn TransmitSink,
) {
    match msg {
        Msg::Request { slot, submitted } => {
            // SAFETY: this core popped `slot` from its own queue, so its submitter's PDU
            // is visible and nobody else touches the slot; the state seals the bytes into
            // its own datagram and keeps no borrow, and the slot is completed only later
            // (`Core::deliver`, or `CoreState::refuse` / the fault paths, all after this
            // call returns).
            let pdu = unsafe { sh.intake.pool.pdu(slot) };
            state.submit(now, pdu, slot, submitted, out);
        }
        Msg::Report(e) => state.submit_report(now, e, out),
        Msg::FlushReports(tx) => {
            state.flush_reports_now(out);
            let _ = tx.try_send(state.stats().clone());
        }
        Msg::Fault => panic!("fault injected into engine core {index}"),
    }
}

/// How a pass of the I/O layer waits.
enum Wait<'a> {
    /// Blocks in the I/O layer until an event or the timeout (`None`: no limit).
    Upto(Option<Duration>),
    /// Never blocks or polls: receives only on the sockets the function picks.
    Never(&'a dyn Fn(SocketId) -> bool),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_wall_clock_follows_the_monotonic_one_and_resyncs() {
        let mut w = WallClock::new();
        let (at, ms) = (w.at, w.ms);
        assert_eq!(w.ms(at + Duration::from_millis(42)), ms + 42);
        assert_eq!(w.ms(at), ms, "read again only after WALL_RESYNC");
        let later = w.ms(at + WALL_RESYNC);
        assert!(w.at > at, "resynced from the system clock");
        assert!(later.abs_diff(wall_ms()) <= 1_000);
    }
}
