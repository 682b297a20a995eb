//! The turn of one engine core ([`Core`]): its I/O shell around [`CoreState`].
//!
//! Owns: the core's thread (pinned with `core_affinity`), its [`UdpIo`] (io_uring
//! or mmsg backend, GSO/GRO, the sockets), the clock, and fault containment: a panic
//! inside the core fails every request it holds or is queued to it with
//! [`Failure::CoreFailed`], marks the core dead (submitters then fail at once), and keeps
//! failing whatever still reaches its queue until the engine shuts down.
//! Must not touch: request state, the wire format, decisions (all in [`CoreState`]).
//!
//! A pinned core runs [`Core::run`] on its thread. A hosted core (`super::hosted`)
//! runs the same turn from a task: [`Core::prelude`], then [`Core::io_turn`] with
//! [`Wait::Never`], waiting in its runtime instead of in the I/O layer.
//!
//! One iteration: drain submissions and fire due timers (their transmits are queued on
//! the I/O layer), feed send failures back, perform socket operations (a `Close` after
//! flushing, so a closing socket's last datagrams leave first), publish statistics, then
//! one `run_once` of the I/O layer: it sends what is queued (GSO-grouped) and waits
//! for datagrams, a wake-up from a submitter or the state's next deadline; received
//! datagrams go straight to the state, whose answers are queued for the next turn.
//! A busy core never blocks (`run_once` with a zero timeout) and submitters wake an
//! idle one with at most one `write(2)` (see `udp::Waker`).

use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::config::BuildError;
use super::feed::CoreFeed;
use super::shared::Shared;
use super::sockets::{SockId, SocketOp};
use super::state::{CoreState, TransmitSink, os_entropy};
use super::submit::Msg;
use crate::proto::outcome::Failure;
use crate::udp::{IoConfig, IoEvent, SendQueue, SocketId, UdpIo};

/// Ports tried per steering rebind (each a bind(2)); never an unbounded scan.
pub(crate) const REBIND_TRIES: u16 = 32;
/// Rounds of feeding send failures back per iteration (each may queue replays).
const FAILURE_ROUNDS: usize = 4;
/// Datagrams handed to the state per `run_once`.
const RECV_BATCH: usize = 256;
/// Datagrams the send queue holds (a turn's transmits, grouped by GSO when flushed).
const SEND_CAPACITY: usize = 8192;

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// How long the wall clock is derived from the monotonic one before it is read again.
const WALL_RESYNC: Duration = Duration::from_millis(100);

/// The wall clock in milliseconds (the requests' timestamps), derived from the turn's
/// monotonic reading and read afresh every [`WALL_RESYNC`]: one clock read per turn
/// instead of two.
struct WallClock {
    at: Instant,
    ms: u64,
}

impl WallClock {
    fn new() -> WallClock {
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

/// The core's open sockets, indexed by the I/O layer's slot ([`SocketId::index`]):
/// the state's id of a socket is `slot | opened << 16` (`opened` counts the sockets this
/// core bound), so a transmit and a datagram each find their socket by one index, never
/// by a search, and a closed socket's state id never names a later one.
struct SockMap {
    slots: Vec<Option<(SockId, SocketId)>>,
    opened: u32,
}

impl SockMap {
    /// The map of a core's first socket, and that socket's state id.
    fn new(first: SocketId) -> (SockMap, SockId) {
        let mut m = SockMap {
            slots: Vec::new(),
            opened: 0,
        };
        let id = m.insert(first);
        (m, id)
    }

    /// Records a socket just bound; returns the state's id for it.
    fn insert(&mut self, s: SocketId) -> SockId {
        let slot = s.index();
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, None);
        }
        let id = SockId(slot as u32 & 0xFFFF | (self.opened & 0xFFFF) << 16);
        self.opened = self.opened.wrapping_add(1);
        self.slots[slot] = Some((id, s));
        id
    }

    /// Forgets a socket about to close; returns the I/O layer's id.
    fn remove(&mut self, id: SockId) -> Option<SocketId> {
        let s = self.io(id)?;
        self.slots[s.index()] = None;
        Some(s)
    }

    fn io(&self, id: SockId) -> Option<SocketId> {
        match self.slots.get((id.0 & 0xFFFF) as usize) {
            Some(Some((sid, s))) if *sid == id => Some(*s),
            _ => None,
        }
    }

    fn state(&self, id: SocketId) -> Option<SockId> {
        match self.slots.get(id.index()) {
            Some(Some((sid, s))) if *s == id => Some(*sid),
            _ => None,
        }
    }

    fn ids(&self) -> impl Iterator<Item = SocketId> + '_ {
        self.slots.iter().flatten().map(|(_, s)| *s)
    }
}

/// Transmits queued on the I/O layer's send queue inside a `run_once` callback.
struct QueueSink<'a> {
    q: &'a mut SendQueue,
    map: &'a SockMap,
    failed: &'a mut Vec<u64>,
}

impl TransmitSink for QueueSink<'_> {
    fn transmit(&mut self, sock: SockId, to: SocketAddr, datagram: &[u8], tag: u64) {
        let ok = self
            .map
            .io(sock)
            .is_some_and(|s| self.q.push(s, to, datagram, tag));
        if !ok {
            self.failed.push(tag);
        }
    }
}

/// Transmits queued on the I/O layer between `run_once` calls (flushes when full).
struct IoSink<'a> {
    io: &'a mut UdpIo,
    map: &'a SockMap,
    failed: &'a mut Vec<u64>,
}

impl TransmitSink for IoSink<'_> {
    fn transmit(&mut self, sock: SockId, to: SocketAddr, datagram: &[u8], tag: u64) {
        let Some(s) = self.map.io(sock) else {
            return self.failed.push(tag);
        };
        if self.io.queue_send(s, to, datagram, tag) {
            return;
        }
        let failed = &mut *self.failed;
        let _ = self.io.flush(&mut |_, ev| {
            if let IoEvent::SendFailed { tag, .. } = ev {
                failed.push(tag);
            }
        });
        if !self.io.queue_send(s, to, datagram, tag) {
            self.failed.push(tag);
        }
    }
}

/// One engine core: its state and its I/O.
pub(crate) struct Core {
    state: CoreState,
    feed: CoreFeed,
    io: UdpIo,
    map: SockMap,
    failed: Vec<u64>,
    v6: bool,
    /// When this core last published its statistics.
    published_at: Instant,
    wall: WallClock,
    /// When the last turn began ([`Core::prelude`]).
    turn_at: Instant,
    shared: Arc<Shared>,
    index: usize,
}

impl Core {
    /// Starts the core's I/O layer, binds its first socket (dual-stack IPv6 when
    /// available, else IPv4) and builds its state. Runs on the core's own thread.
    pub(crate) fn new(index: usize, shared: Arc<Shared>) -> Result<Core, BuildError> {
        let cfg = IoConfig {
            backend: shared.settings.io_backend,
            gso: shared.settings.gso,
            gro: shared.settings.gso,
            recv_buf: shared.settings.recv_buf,
            send_buf: shared.settings.send_buf,
            max_sockets: shared.settings.max_sockets,
            batch: RECV_BATCH,
            send_capacity: SEND_CAPACITY,
            max_datagram: 2048,
        };
        let mut io = UdpIo::new(&cfg).map_err(|e| BuildError::IoBackend {
            core: index,
            backend: shared.settings.io_backend,
            kind: e.kind(),
        })?;
        let any6 = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);
        let any4 = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);
        let (first, v6) = match io.bind(any6) {
            Ok(s) => (s, true),
            Err(_) => (
                io.bind(any4).map_err(|e| BuildError::Socket(e.kind()))?,
                false,
            ),
        };
        let port = io.local_addr(first).map_or(0, |a| a.port());
        let (map, first_id) = SockMap::new(first);
        let feed = CoreFeed::new(index, shared.clone());
        let state = feed
            .new_state(Instant::now(), first_id, port, os_entropy())
            .map_err(|_| BuildError::NoRandomness)?;
        let _ = shared.queues[index].waker.set(io.waker());
        tracing::debug!(core = index, backend = %io.kind(), "engine core started");
        Ok(Core {
            state,
            feed,
            io,
            map,
            failed: Vec::with_capacity(1024),
            v6,
            published_at: Instant::now(),
            wall: WallClock::new(),
            turn_at: Instant::now(),
            shared,
            index,
        })
    }

    /// Local address of the socket new requests use.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.map
            .io(self.state.current_socket())
            .and_then(|s| self.io.local_addr(s))
            .expect("current socket is open")
    }

    /// Runs until shutdown; contains a panic of the core (see the module docs).
    pub(crate) fn run(mut self) {
        let r = catch_unwind(AssertUnwindSafe(|| self.run_loop()));
        if r.is_err() {
            self.after_fault();
        }
    }

    fn sink(&mut self) -> (&mut CoreState, &CoreFeed, IoSink<'_>) {
        (
            &mut self.state,
            &self.feed,
            IoSink {
                io: &mut self.io,
                map: &self.map,
                failed: &mut self.failed,
            },
        )
    }

    fn run_loop(&mut self) {
        let mut work = true;
        loop {
            let Some(found) = self.prelude(&mut |_| {}) else {
                return;
            };
            work |= found;
            let timeout = if work {
                Some(Duration::ZERO)
            } else {
                self.spin();
                if self.shared.queues[self.index].rx.is_empty() {
                    self.state
                        .poll_timeout()
                        .map(|t| t.saturating_duration_since(Instant::now()))
                } else {
                    Some(Duration::ZERO)
                }
            };
            self.feed.wake_callers(&mut self.state);
            work = self.io_turn(Wait::Upto(timeout));
        }
    }

    /// The part of a turn before the I/O layer runs: takes submissions and due timers
    /// (their transmits are queued), feeds send failures back, performs socket
    /// operations (`before_close` hears of each socket just before it closes) and
    /// publishes statistics when asked or due. Returns whether it found work, or `None`
    /// once the core has stopped (every request completed, the last datagrams sent).
    pub(crate) fn prelude(&mut self, before_close: &mut dyn FnMut(SocketId)) -> Option<bool> {
        let now = Instant::now();
        self.turn_at = now;
        let wall = self.wall.ms(now);
        let (state, feed, mut sink) = self.sink();
        state.set_wall_ms(wall);
        let mut work = feed.submissions(state, now, &mut sink);
        work |= state.handle_timeout(now, &mut sink);
        self.feed_failures(now);
        self.socket_ops(before_close);
        if self.shared.stats_wanted(self.index)
            || now.saturating_duration_since(self.published_at) >= super::PUBLISH_EVERY
        {
            self.publish(now);
        }
        if self.shared.queues[self.index].stop.load(Ordering::Acquire) {
            let (state, feed, mut sink) = self.sink();
            feed.shutdown(state, Instant::now(), &mut sink);
            self.flush();
            self.publish(Instant::now());
            return None;
        }
        Some(work)
    }

    /// Publishes this core's statistics (a reader holding the lock defers it a turn).
    pub(crate) fn publish(&mut self, now: Instant) {
        if self
            .shared
            .publish_stats(self.index, &self.state, Some(self.io.stats()))
        {
            self.published_at = now;
        }
    }

    /// Publishes this core's counters without the histograms (cheap).
    pub(crate) fn publish_counters(&mut self) {
        self.shared
            .publish(self.index, &self.state, Some(self.io.stats()), false);
    }

    /// When this core last published its statistics.
    pub(crate) fn published_at(&self) -> Instant {
        self.published_at
    }

    /// One pass of the I/O layer: received datagrams go straight to the state; true
    /// when any arrived.
    pub(crate) fn io_turn(&mut self, wait: Wait<'_>) -> bool {
        let state = &mut self.state;
        let map = &self.map;
        let failed = &mut self.failed;
        let now: Cell<Option<Instant>> = Cell::new(None);
        let mut any = false;
        let mut on_event = |q: &mut SendQueue, ev: IoEvent<'_>| match ev {
            IoEvent::Datagram { sock, data, .. } => {
                any = true;
                let t = now.get().unwrap_or_else(|| {
                    let t = Instant::now();
                    now.set(Some(t));
                    t
                });
                let Some(id) = map.state(sock) else { return };
                let mut sink = QueueSink { q, map, failed };
                state.handle_datagram(t, id, data, &mut sink);
            }
            IoEvent::SendFailed { tag, .. } => failed.push(tag),
            IoEvent::Woken => {}
        };
        let r = match wait {
            Wait::Upto(timeout) => self.io.run_once(timeout, &mut on_event),
            Wait::Never(read) => self.io.run_nowait(read, &mut on_event),
        };
        if let Err(e) = r {
            tracing::warn!(core = self.index, error = %e, "engine core I/O wait failed");
        }
        any
    }

    /// When the last turn began: a clock reading for the decisions made right after it.
    pub(crate) fn turn_at(&self) -> Instant {
        self.turn_at
    }

    /// Wakes the callers whose requests completed since the last call.
    pub(crate) fn wake_callers(&mut self) {
        self.feed.wake_callers(&mut self.state);
    }

    /// True when the core has nothing to do until a datagram, a submission or its
    /// next deadline ([`CoreState::poll_timeout`], returned) arrives.
    pub(crate) fn idle(&self) -> Option<Option<Instant>> {
        (self.failed.is_empty() && self.shared.queues[self.index].rx.is_empty())
            .then(|| self.state.poll_timeout())
    }

    /// The I/O layer's cross-thread waker.
    pub(crate) fn waker(&self) -> Arc<crate::udp::Waker> {
        self.io.waker()
    }

    /// The core's open sockets (the I/O layer's ids).
    pub(crate) fn socket_ids(&self) -> impl Iterator<Item = SocketId> + '_ {
        self.map.ids()
    }

    /// The I/O layer.
    pub(crate) fn io(&mut self) -> &mut UdpIo {
        &mut self.io
    }

    /// The core's index.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    fn spin(&self) {
        let Some(d) = self.shared.settings.spin else {
            return;
        };
        let q = &self.shared.queues[self.index];
        let until = Instant::now() + d;
        while Instant::now() < until && q.rx.is_empty() {
            std::hint::spin_loop();
        }
    }

    /// Sends what is queued now (send failures are collected, fed back next turn).
    fn flush(&mut self) {
        let failed = &mut self.failed;
        let _ = self.io.flush(&mut |_, ev| {
            if let IoEvent::SendFailed { tag, .. } = ev {
                failed.push(tag);
            }
        });
    }

    fn feed_failures(&mut self, now: Instant) {
        for _ in 0..FAILURE_ROUNDS {
            if self.failed.is_empty() {
                return;
            }
            let mut failed = std::mem::take(&mut self.failed);
            let (state, _, mut sink) = self.sink();
            for tag in failed.drain(..) {
                state.handle_send_failed(now, tag, &mut sink);
            }
            // keep the allocation; failures raised meanwhile stay queued
            failed.append(&mut self.failed);
            self.failed = failed;
        }
    }

    fn socket_ops(&mut self, before_close: &mut dyn FnMut(SocketId)) {
        while let Some(op) = self.state.poll_socket_op() {
            match op {
                SocketOp::Open { after_port } => {
                    let opened = self.io.bind_steering(self.v6, after_port, REBIND_TRIES);
                    let new = match opened {
                        Ok(s) => {
                            let id = self.map.insert(s);
                            let port = self.io.local_addr(s).map_or(0, |a| a.port());
                            tracing::debug!(core = self.index, port, "steering: new source port");
                            Some((id, port))
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
                    self.flush();
                    if let Some(s) = self.map.remove(id) {
                        before_close(s);
                        self.io.close(s);
                    }
                }
            }
        }
    }

    /// After a panic: fail everything, mark the core dead, then keep failing what still
    /// reaches the queue until shutdown (polling every millisecond: the I/O layer may
    /// be the part that failed, so it is not used again).
    fn after_fault(&mut self) {
        self.fault();
        while !self.fail_queued() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A panic inside the core: marks it dead (submitters fail at once) and fails every
    /// request it holds with [`Failure::CoreFailed`].
    pub(crate) fn fault(&mut self) {
        let q = &self.shared.queues[self.index];
        q.dead.store(true, Ordering::SeqCst);
        tracing::error!(
            core = self.index,
            "engine core failed; its requests fail with CoreFailed"
        );
        let f = Failure::CoreFailed { core: self.index };
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.feed.wake_callers(&mut self.state);
            self.state.fail_in_flight(&f);
            self.feed.wake_callers(&mut self.state);
        }));
    }

    /// After [`fault`](Self::fault): fails what reached the queue since; true once
    /// the engine is shutting down (nothing more will be queued).
    pub(crate) fn fail_queued(&self) -> bool {
        let q = &self.shared.queues[self.index];
        let f = Failure::CoreFailed { core: self.index };
        while let Ok(msg) = q.rx.try_recv() {
            fail_msg(&self.shared, msg, &f);
        }
        q.stop.load(Ordering::SeqCst)
    }

    /// The core's task went away before it stopped (its runtime shut down first): fails
    /// every request it holds and what is queued with [`Failure::Shutdown`], and marks
    /// the core dead so that later submissions fail at once instead of waiting.
    pub(crate) fn abandon(&mut self) {
        let q = &self.shared.queues[self.index];
        q.dead.store(true, Ordering::SeqCst);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.feed.wake_callers(&mut self.state);
            self.state.fail_in_flight(&Failure::Shutdown);
            self.feed.wake_callers(&mut self.state);
        }));
        while let Ok(msg) = q.rx.try_recv() {
            fail_msg(&self.shared, msg, &Failure::Shutdown);
        }
    }
}

/// What a turn found: more work is certain, nothing to do until a datagram, a
/// submission or `until` (the state's next deadline), or the core has stopped.
pub(crate) enum Turn {
    Busy,
    Idle { until: Option<Instant> },
    Stopped,
}

/// How a pass of the I/O layer waits.
pub(crate) enum Wait<'a> {
    /// Blocks in the I/O layer until an event or the timeout (`None`: no limit).
    Upto(Option<Duration>),
    /// Never blocks or polls: receives only on the sockets the function picks (a
    /// hosted core learns readiness from its runtime).
    Never(&'a dyn Fn(SocketId) -> bool),
}

/// Completes a message that no core will handle.
pub(crate) fn fail_msg(shared: &Shared, msg: Msg, f: &Failure) {
    match msg {
        Msg::Request { slot, .. } => shared.pool.complete(slot, Err(f.clone())),
        Msg::FlushReports(tx) => {
            let _ = tx.try_send(super::stats::Stats::new());
        }
        Msg::Report(_) | Msg::Fault => {}
    }
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
