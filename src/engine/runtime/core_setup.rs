//! The cold side of a core's turn: its construction, its faults and its end.
//!
//! Owns: `Core::new` (the core's I/O layer, its first socket and its state, built from the
//! engine's settings), the shutdown of the core's state (`Core::stop`: what is still
//! queued is refused, what is in flight completes with `Shutdown`), fault containment's
//! bookkeeping (`Core::fault`, the turns of a dead core, `Core::abandon`), the failing of
//! messages no core will handle ([`fail_msg`]), the backend's log line and the accessors
//! the schedulers use. The turn itself, and everything on a request's path, is
//! `super::turn`'s. Must not touch: the order of a turn, the request path.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::config::BuildError;
use super::consts::{
    DEAD_POLL, DRAIN, FAILED_PREALLOC, RECV_BATCH, RECV_DATAGRAM_MAX, SEND_CAPACITY,
};
use super::shared::Shared;
use super::sink::{IoSink, flush};
use super::submit::Msg;
use super::turn::{Core, Scheduler, Turn, WallClock, feed};
use crate::engine::core::{CoreConfig, CoreState, Entropy, TransmitSink};
use crate::proto::outcome::Failure;
use crate::proto::wire::{self, RngError};
use crate::udp::{BackendChoice, Caller, IoConfig, SocketId, UdpIo};

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
            max_datagram: RECV_DATAGRAM_MAX,
            caller: if shared.settings.hosted {
                Caller::Runtime
            } else {
                Caller::OneThread
            },
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
        let entropy: Entropy = Box::new(wire::fill_random);
        let state = new_state(&shared, index, Instant::now(), first, port, entropy)
            .map_err(|_| BuildError::NoRandomness)?;
        let _ = shared.intake.queues[index].waker.set(io.waker());
        log_backend(index, shared.settings.io_backend, &io);
        let now = Instant::now();
        Ok(Core {
            state,
            io,
            open: vec![first],
            failed: Vec::with_capacity(FAILED_PREALLOC),
            wakes: Vec::with_capacity(DRAIN),
            v6,
            read_all: true,
            published_at: now,
            counters_dirty: true,
            dirty: true,
            idle_since: None,
            dead: false,
            wall: WallClock::new(),
            turn_at: now,
            passed_at: now,
            shared,
            index,
        })
    }

    /// The engine is shutting down: what is queued is refused, what is in flight
    /// completes with `Shutdown`, the last datagrams leave, the figures are published.
    pub(super) fn stop(&mut self) -> Turn {
        let mut sink = IoSink {
            io: &mut self.io,
            failed: &mut self.failed,
        };
        shutdown(
            &self.shared,
            self.index,
            &mut self.state,
            Instant::now(),
            &mut sink,
        );
        self.deliver();
        flush(&mut self.io, &mut self.failed);
        self.publish(Instant::now());
        Turn::Stopped
    }

    /// A panic inside a turn: marks the core dead (submitters fail at once) and fails
    /// every request it holds with [`Failure::CoreFailed`].
    pub(super) fn fault(&mut self) {
        self.dead = true;
        let q = &self.shared.intake.queues[self.index];
        q.dead.store(true, Ordering::SeqCst);
        tracing::error!(
            core = self.index,
            "engine core failed; its requests fail with CoreFailed"
        );
        let f = Failure::CoreFailed { core: self.index };
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.state.fail_in_flight(&f);
            self.deliver();
        }));
    }

    /// A turn of a failed core: fails what reached the queue since; stopped once the
    /// engine is shutting down (nothing more will be queued), else idle for
    /// [`DEAD_POLL`] (a blocking scheduler sleeps it here).
    pub(super) fn dead_turn<S: Scheduler>(&mut self) -> Turn {
        let q = &self.shared.intake.queues[self.index];
        let f = Failure::CoreFailed { core: self.index };
        while let Some(msg) = q.pop() {
            fail_msg(&self.shared, msg, &f);
        }
        if q.stop.load(Ordering::SeqCst) {
            return Turn::Stopped;
        }
        // a submitter's wake-up is answered here, not by the I/O layer
        if let Some(w) = q.waker.get() {
            w.clear();
        }
        if S::BLOCKS {
            std::thread::sleep(DEAD_POLL);
        }
        Turn::Idle {
            until: Some(Instant::now() + DEAD_POLL),
        }
    }

    /// The core's task went away before it stopped (its runtime shut down first): fails
    /// every request it holds and what is queued with [`Failure::Shutdown`], and marks
    /// the core dead so that later submissions fail at once instead of waiting.
    pub(crate) fn abandon(&mut self) {
        let shared = self.shared.clone();
        let q = &shared.intake.queues[self.index];
        q.dead.store(true, Ordering::SeqCst);
        let _ = catch_unwind(AssertUnwindSafe(|| {
            self.state.fail_in_flight(&Failure::Shutdown);
            self.deliver();
        }));
        while let Some(msg) = q.pop() {
            fail_msg(&shared, msg, &Failure::Shutdown);
        }
    }

    /// Local address of the socket new requests use.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.io
            .local_addr(self.state.current_socket())
            .expect("current socket is open")
    }

    /// The I/O layer's cross-thread waker.
    pub(crate) fn waker(&self) -> Arc<crate::udp::Waker> {
        self.io.waker()
    }

    /// The core's open sockets, for a scheduler that watches their readiness.
    pub(crate) fn sockets(&self) -> &[SocketId] {
        &self.open
    }

    /// The fd a task watches instead of the sockets (io_uring's ring), if any.
    pub(crate) fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        self.io.readiness_fd()
    }

    /// Counts a park of the core's task as a wait of its I/O layer.
    pub(crate) fn count_wait(&mut self) {
        self.io.count_wait();
    }

    /// The descriptor of open socket `id`, for a readiness registration.
    pub(crate) fn socket_fd(&self, id: SocketId) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.io.socket(id).map(|s| s.as_raw_fd())
    }

    /// Sends on `id` wait for room in its send buffer: watch it for writability.
    pub(crate) fn wants_write(&self, id: SocketId) -> bool {
        self.io.wants_write(id)
    }

    /// `id` became writable: the waiting sends go on the next pass.
    pub(crate) fn writable(&mut self, id: SocketId) {
        self.io.writable(id);
    }

    /// The core's index.
    pub(crate) fn index(&self) -> usize {
        self.index
    }
}

/// The state of this core, its first socket `first` bound on `port`.
fn new_state(
    shared: &Shared,
    index: usize,
    now: Instant,
    first: SocketId,
    port: u16,
    entropy: Entropy,
) -> Result<CoreState, RngError> {
    let sh = shared;
    let cfg = CoreConfig {
        index,
        auth: sh.auth.clone(),
        plan: sh.plan,
        policy: sh.policy.clone(),
        in_flight: sh.settings.in_flight_per_core,
        max_sockets: sh.settings.max_sockets,
        report_interval: sh.settings.report_interval,
    };
    CoreState::new(cfg, sh.membership.snapshot(), now, first, port, entropy)
}

/// Shuts the core's state down: what is still queued is refused (requests fail
/// with `Shutdown`, control messages are answered), then every in-flight request
/// completes with `Shutdown` (the caller delivers the outcomes).
fn shutdown(
    sh: &Shared,
    index: usize,
    state: &mut CoreState,
    now: Instant,
    out: &mut dyn TransmitSink,
) {
    let queue = &sh.intake.queues[index];
    while let Some(msg) = queue.pop() {
        match msg {
            Msg::Request { slot, .. } => state.refuse(slot),
            other => feed(sh, index, state, now, other, out),
        }
    }
    state.shutdown(now, out);
}

/// Says which I/O backend a core runs: at info when `Auto` chose it (with io_uring's
/// refusal when it fell back to mmsg), at debug when it was asked for by name.
fn log_backend(core: usize, asked: BackendChoice, io: &UdpIo) {
    if asked != BackendChoice::Auto {
        tracing::debug!(core, backend = %io.kind(), "engine core started");
    } else if let Some(e) = io.uring_refusal() {
        tracing::info!(core, backend = %io.kind(), refusal = %e,
            "engine core started: io_uring refused here, the auto I/O backend runs mmsg");
    } else {
        tracing::info!(core, backend = %io.kind(), "engine core started: the auto I/O backend chose io_uring");
    }
}

/// Completes a message that no core will handle.
pub(crate) fn fail_msg(shared: &Shared, msg: Msg, f: &Failure) {
    match msg {
        Msg::Request { slot, .. } => shared.intake.pool.complete(slot, Err(f.clone())),
        Msg::FlushReports(tx) => {
            let _ = tx.try_send(crate::engine::core::Stats::new());
        }
        Msg::Report(_) | Msg::Fault => {}
    }
}
