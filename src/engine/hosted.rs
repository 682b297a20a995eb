//! A hosted core: one engine core run as a task on the application's Tokio runtime
//! instead of on a pinned thread of its own (`EngineBuilder::runtime`).
//!
//! Owns: the task's loop, the readiness registrations of the core's sockets (Tokio
//! `AsyncFd`), its timer (a Tokio `Sleep`) and the task's side of the wake protocol
//! (`udp::Waker::host`). Must not touch: request state, the wire, decisions, socket
//! operations: the [`Core`] and its `CoreState` do all of that exactly as on a
//! pinned core; this module only decides when a turn runs.
//!
//! Why: a decision on a pinned core costs four context switches when the machine has
//! no idle CPU for it (the core wakes for the submit, parks, wakes for the answer; the
//! caller's worker wakes for the outcome). Hosted, a submitting task wakes the core's
//! task on its own worker without a system call, the worker's one `epoll_wait` covers
//! the answers, and the core completes the caller's future on that worker: one wake
//! per decision, as a plain Tokio client pays, with the engine's batching kept (each
//! turn sends every transmit queued since the last one, GSO-grouped, in one
//! `sendmmsg`).
//!
//! A turn is a pinned core's turn (`Core::prelude`, then the I/O layer without a
//! wait: `UdpIo::run_nowait`). While more work is certain (a receive filled its
//! buffers, submissions are queued, a deadline has passed) the task re-queues itself
//! behind the tasks that are ready, so the callers it completed run before its next
//! turn. Otherwise it parks: it waits until a socket is readable (or writable while
//! sends wait for room), a submitter wakes it, or the state's next deadline passes. A
//! submitter's wake-up re-queues it once more before the turn, so every task already
//! ready submits first and one `sendmmsg` carries all their requests. `recvmmsg` runs
//! only on sockets the runtime reported readable since the last turn, or on every
//! socket after a receive that filled its buffers.
//!
//! A panic inside a turn is contained as on a pinned core (`Core::fault`). If the
//! runtime drops the task before the core stopped, its requests fail with
//! `Failure::Shutdown` and the core is marked dead (see `Core::abandon`).

use std::future::{Future, poll_fn};
use std::os::fd::{AsRawFd, RawFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Sleep;

use super::turn::{Core, Turn, Wait};
use crate::udp::{SocketId, Waker};

/// A socket's descriptor as Tokio's reactor registers it. The registration is dropped
/// before the core closes the socket (`Core::prelude`'s close hook), so a reused
/// descriptor number is never deregistered by mistake.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// One registered socket.
struct Reg {
    id: SocketId,
    fd: AsyncFd<Fd>,
    /// The runtime reported it readable since the last receive.
    ready: bool,
}

/// The hosted core: registrations first, so they are dropped before the core's
/// sockets close.
struct Hosted {
    regs: Vec<Reg>,
    /// Sockets the reactor refused to register: received from every turn.
    unregistered: Vec<SocketId>,
    core: Core,
    waker: Arc<Waker>,
    sleep: Pin<Box<Sleep>>,
    /// When `sleep` fires (`None`: not armed, or fired).
    armed: Option<Instant>,
    /// The last turn received datagrams: receive on every socket next turn.
    read_all: bool,
    /// Some turn did work since the histograms were last published.
    dirty: bool,
    finished: bool,
}

/// Least time between two publications of an idle hosted core's histograms (its
/// counters are published at every pause).
const PUBLISH_IDLE_EVERY: Duration = Duration::from_millis(10);

/// Runs `core` as a task until the engine shuts down. Spawned on the runtime
/// given to `EngineBuilder::runtime`.
pub(crate) async fn run(core: Core) {
    let waker = core.waker();
    waker.host();
    let mut h = Hosted {
        regs: Vec::new(),
        unregistered: Vec::new(),
        core,
        waker,
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        armed: None,
        read_all: true,
        dirty: true,
        finished: false,
    };
    loop {
        match catch_unwind(AssertUnwindSafe(|| h.turn())) {
            Ok(Turn::Busy) => requeue().await,
            Ok(Turn::Idle { until: deadline }) => {
                if h.park(deadline).await {
                    // woken by a submitter: let the other ready tasks submit too, so
                    // that one turn sends them all
                    requeue().await;
                }
            }
            Ok(Turn::Stopped) => break,
            Err(_) => {
                h.regs.clear();
                h.core.fault();
                while !h.core.fail_queued() {
                    h.wait_fault().await;
                }
                break;
            }
        }
    }
    h.finished = true;
}

/// Lets every task that is ready run before the next turn: the task wakes itself and
/// returns `Pending` once, which Tokio's scheduler treats as a yield (the back of the
/// worker's run queue, behind the callers just completed). Unlike `yield_now`, whose
/// wake-up Tokio defers until the worker's next reactor poll (an `epoll_wait` per
/// turn), it makes no system call.
async fn requeue() {
    let mut first = true;
    poll_fn(|cx| {
        if std::mem::take(&mut first) {
            cx.waker().wake_by_ref();
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await
}

impl Hosted {
    /// One turn: bookkeeping, sends, receives on the ready sockets, completions.
    fn turn(&mut self) -> Turn {
        let (regs, unregistered) = (&mut self.regs, &mut self.unregistered);
        let Some(work) = self.core.prelude(&mut |closing| {
            regs.retain(|r| r.id != closing);
            unregistered.retain(|&id| id != closing);
        }) else {
            return Turn::Stopped;
        };
        self.register_new();
        self.take_readiness();
        let read_all = self.read_all || !self.unregistered.is_empty();
        let regs = &self.regs;
        let read = |id: SocketId| read_all || regs.iter().any(|r| r.id == id && r.ready);
        let got = self.core.io_turn(Wait::Never(&read));
        for r in &mut self.regs {
            r.ready = false;
        }
        self.read_all = self.core.io().may_have_more();
        self.core.wake_callers();
        self.dirty |= work || got;
        // Parked, the task still runs again as soon as a caller it completed submits
        // (the submitter wakes it); it stays queued only while work is certain.
        // A fresh clock reading, not the turn's: a deadline that passed during the turn
        // (a completion flush) must re-queue now, not wait for Tokio's millisecond timer.
        match self.core.idle() {
            Some(deadline) if !self.read_all && deadline.is_none_or(|d| d > Instant::now()) => {
                Turn::Idle { until: deadline }
            }
            _ => Turn::Busy,
        }
    }

    /// Registers the sockets the core opened since the last turn (counted without
    /// allocating; a new socket is rare: steering).
    fn register_new(&mut self) {
        if self.core.socket_ids().count() == self.regs.len() + self.unregistered.len() {
            return;
        }
        let ids: Vec<SocketId> = self.core.socket_ids().collect();
        for id in ids {
            if self.regs.iter().any(|r| r.id == id) || self.unregistered.contains(&id) {
                continue;
            }
            let Some(raw) = self.core.io().socket(id).map(|s| s.as_raw_fd()) else {
                continue;
            };
            let interest = Interest::READABLE | Interest::WRITABLE;
            // SAFETY: `raw` is the open socket `id` of the core. The registration is
            // dropped before that socket closes: the close hook of `turn` removes it
            // first, and `Hosted` drops `regs` before `core`.
            match unsafe { AsyncFd::register_with_interest(Fd(raw), interest) } {
                Ok(fd) => self.regs.push(Reg {
                    id,
                    fd,
                    ready: true,
                }),
                Err(e) => {
                    tracing::error!(core = self.core.index(), error = %e,
                        "hosted engine core: socket registration failed; receiving from it every turn");
                    self.unregistered.push(id);
                }
            }
        }
    }

    /// Takes (and clears) the readiness the runtime reported since the last turn,
    /// without registering for more: the task is running.
    fn take_readiness(&mut self) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        for r in &mut self.regs {
            if let Poll::Ready(Ok(mut g)) = r.fd.poll_read_ready(&mut cx) {
                g.clear_ready();
                r.ready = true;
            }
        }
    }

    /// Waits until a socket is ready, a submitter wakes the core or `deadline` passes;
    /// true when only a submitter's wake-up ended the wait.
    async fn park(&mut self, deadline: Option<Instant>) -> bool {
        let now = self.core.turn_at();
        let mut publish_at = None;
        if self.dirty {
            let due = self.core.published_at() + PUBLISH_IDLE_EVERY;
            if due <= now {
                self.core.publish(now);
                self.dirty = false;
            } else {
                // counters now; the histograms once the pause lasts
                self.core.publish_counters();
                publish_at = Some(due);
            }
        }
        // Re-arming Tokio's timer takes its lock: only when the wake-up must come
        // sooner, or the armed one has passed (a later deadline than armed costs one
        // early turn instead).
        let wake_at = [deadline, publish_at].into_iter().flatten().min();
        if let Some(d) = wake_at
            && self.armed.is_none_or(|a| d < a || a <= now)
        {
            self.sleep.as_mut().reset(tokio::time::Instant::from_std(d));
            self.armed = Some(d);
        }
        let waker = self.waker.clone();
        let mut parked = false;
        let submitted = poll_fn(|cx| {
            waker.register(cx.waker());
            if !parked {
                parked = true;
                if !waker.park() {
                    return Poll::Ready(true);
                }
            }
            let woken = waker.is_pending();
            let mut ready = false;
            for r in &mut self.regs {
                if let Poll::Ready(Ok(mut g)) = r.fd.poll_read_ready(cx) {
                    g.clear_ready();
                    r.ready = true;
                    ready = true;
                }
                if self.core.io().wants_write(r.id)
                    && let Poll::Ready(Ok(mut g)) = r.fd.poll_write_ready(cx)
                {
                    g.clear_ready();
                    self.core.io().writable(r.id);
                    ready = true;
                }
            }
            if self.armed.is_some() && self.sleep.as_mut().poll(cx).is_ready() {
                self.armed = None;
                ready = true;
            }
            if ready || woken {
                Poll::Ready(woken && !ready)
            } else {
                Poll::Pending
            }
        })
        .await;
        waker.unpark();
        submitted
    }

    /// After a fault: waits for a wake-up or a millisecond (the I/O layer may be the
    /// part that failed, so it is not used again).
    async fn wait_fault(&mut self) {
        let waker = self.waker.clone();
        let mut parked = false;
        let sleep = tokio::time::sleep(Duration::from_millis(1));
        tokio::pin!(sleep);
        poll_fn(|cx| {
            waker.register(cx.waker());
            if !parked {
                parked = true;
                if !waker.park() {
                    return Poll::Ready(());
                }
            }
            if waker.is_pending() || sleep.as_mut().poll(cx).is_ready() {
                return Poll::Ready(());
            }
            Poll::Pending
        })
        .await;
        waker.unpark();
        waker.clear();
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        if !self.finished {
            self.regs.clear();
            self.core.abandon();
        }
    }
}
