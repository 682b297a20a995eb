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
//! Turns are `Core::turn`'s, as on a pinned core; this task never lets the I/O pass
//! wait ([`Scheduler::BLOCKS`] is false). With the mmsg backend the runtime's reactor
//! watches every socket and the pass receives on those it reported readable; with
//! io_uring it watches the ring's fd alone (readable while completions are ready: the
//! ring receives on every socket and waits for writability itself), and the ring is
//! set up for calls from any worker thread (`udp::Caller::Runtime`). While more work is certain ([`Turn::Busy`]) the task re-queues itself
//! behind the tasks that are ready, so the callers it completed run before its next
//! turn. Otherwise ([`Turn::Idle`]) it parks: it waits until a socket is readable (or
//! writable while sends wait for room), a submitter wakes it, or the turn's deadline
//! passes. A submitter's wake-up re-queues it once more before the turn, so every task
//! already ready submits first and one `sendmmsg` carries all their requests.
//!
//! If the runtime drops the task before the core stopped, its requests fail with
//! `Failure::Shutdown` and the core is marked dead (see `Core::abandon`).

use std::future::{Future, poll_fn};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::time::Sleep;

use super::turn::{Core, Scheduler, Turn};
use crate::udp::{SocketId, Waker};

/// A socket's descriptor as Tokio's reactor registers it. The registration is dropped
/// before the core closes the socket (the turn unwatches it first), so a reused
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

/// The task's watch over the core's I/O: what the runtime reported readable.
#[derive(Default)]
struct Watch {
    /// mmsg: each socket, registered with the reactor.
    regs: Vec<Reg>,
    /// Sockets the reactor refused to register: received from every turn.
    unregistered: Vec<SocketId>,
    /// io_uring: the ring's fd instead of the sockets (readable while completions are
    /// ready; the ring itself receives on every socket and waits for writability).
    ring: Option<AsyncFd<Fd>>,
}

impl Scheduler for Watch {
    const BLOCKS: bool = false;

    fn readable(&self, sock: SocketId) -> bool {
        self.unregistered.contains(&sock) || self.regs.iter().any(|r| r.id == sock && r.ready)
    }

    fn unwatch(&mut self, sock: SocketId) {
        self.regs.retain(|r| r.id != sock);
        self.unregistered.retain(|&id| id != sock);
    }
}

/// The hosted core: registrations first, so they are dropped before the core's
/// sockets close.
struct Hosted {
    watch: Watch,
    core: Core,
    waker: Arc<Waker>,
    sleep: Pin<Box<Sleep>>,
    /// When `sleep` fires (`None`: not armed, or fired).
    armed: Option<Instant>,
    finished: bool,
}

/// Runs `core` as a task until the engine shuts down. Spawned on the runtime
/// given to `EngineBuilder::runtime`.
pub(crate) async fn run(core: Core) {
    let waker = core.waker();
    waker.host();
    let mut h = Hosted {
        watch: Watch::default(),
        core,
        waker,
        sleep: Box::pin(tokio::time::sleep(Duration::ZERO)),
        armed: None,
        finished: false,
    };
    h.watch_ring();
    loop {
        h.take_readiness();
        let turn = h.core.turn(&mut h.watch);
        // sockets steering opened in this turn: watched before the task parks
        for r in &mut h.watch.regs {
            r.ready = false;
        }
        let registered = h.register_new();
        match turn {
            Turn::Busy => requeue().await,
            Turn::Idle { .. } if registered => requeue().await,
            Turn::Idle { until } => {
                if h.park(until).await {
                    // woken by a submitter: let the other ready tasks submit too, so
                    // that one turn sends them all
                    requeue().await;
                }
            }
            Turn::Stopped => break,
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
    /// Registers the sockets the core opened since the last turn (a new socket is
    /// rare: steering); true when it registered any.
    fn register_new(&mut self) -> bool {
        let w = &mut self.watch;
        if w.ring.is_some() || self.core.sockets().len() == w.regs.len() + w.unregistered.len() {
            return false;
        }
        let mut any = false;
        for &id in self.core.sockets() {
            if w.regs.iter().any(|r| r.id == id) || w.unregistered.contains(&id) {
                continue;
            }
            let Some(raw) = self.core.socket_fd(id) else {
                continue;
            };
            any = true;
            let interest = Interest::READABLE | Interest::WRITABLE;
            // SAFETY: `raw` is the open socket `id` of the core. The registration is
            // dropped before that socket closes: the turn unwatches a socket before
            // closing it, and `Hosted` drops `watch` before `core`.
            match unsafe { AsyncFd::register_with_interest(Fd(raw), interest) } {
                Ok(fd) => w.regs.push(Reg {
                    id,
                    fd,
                    ready: true,
                }),
                Err(e) => {
                    tracing::error!(core = self.core.index(), error = %e,
                        "hosted engine core: socket registration failed; receiving from it every turn");
                    w.unregistered.push(id);
                }
            }
        }
        any
    }

    /// io_uring: watches the ring's fd instead of the sockets. A reactor that refuses it
    /// leaves the sockets watched (the ring receives on them all the same, so their
    /// readiness stands in for its completions).
    fn watch_ring(&mut self) {
        let Some(raw) = self.core.readiness_fd() else {
            return;
        };
        // SAFETY: `raw` is the ring's fd, owned by the core's I/O layer; the
        // registration is dropped before it (`Hosted` drops `watch` before `core`).
        match unsafe { AsyncFd::register_with_interest(Fd(raw), Interest::READABLE) } {
            Ok(fd) => self.watch.ring = Some(fd),
            Err(e) => tracing::error!(core = self.core.index(), error = %e,
                "hosted engine core: io_uring registration failed; watching its sockets"),
        }
    }

    /// Takes (and clears) the readiness the runtime reported since the last turn,
    /// without registering for more: the task is running.
    fn take_readiness(&mut self) {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        if let Some(ring) = &self.watch.ring
            && let Poll::Ready(Ok(mut g)) = ring.poll_read_ready(&mut cx)
        {
            g.clear_ready();
        }
        for r in &mut self.watch.regs {
            if let Poll::Ready(Ok(mut g)) = r.fd.poll_read_ready(&mut cx) {
                g.clear_ready();
                r.ready = true;
            }
        }
    }

    /// Waits until a socket is ready, a submitter wakes the core or `deadline` passes;
    /// true when only a submitter's wake-up ended the wait.
    async fn park(&mut self, deadline: Option<Instant>) -> bool {
        let now = Instant::now();
        // Re-arming Tokio's timer takes its lock: only when the wake-up must come
        // sooner, or the armed one has passed (a later deadline than armed costs one
        // early turn instead).
        if let Some(d) = deadline
            && self.armed.is_none_or(|a| d < a || a <= now)
        {
            self.sleep.as_mut().reset(tokio::time::Instant::from_std(d));
            self.armed = Some(d);
        }
        let waker = self.waker.clone();
        let (mut parked, mut waited) = (false, false);
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
            if let Some(ring) = &self.watch.ring
                && let Poll::Ready(Ok(mut g)) = ring.poll_read_ready(cx)
            {
                g.clear_ready();
                ready = true;
            }
            for r in &mut self.watch.regs {
                if let Poll::Ready(Ok(mut g)) = r.fd.poll_read_ready(cx) {
                    g.clear_ready();
                    r.ready = true;
                    ready = true;
                }
                if self.core.wants_write(r.id)
                    && let Poll::Ready(Ok(mut g)) = r.fd.poll_write_ready(cx)
                {
                    g.clear_ready();
                    self.core.writable(r.id);
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
                waited = true;
                Poll::Pending
            }
        })
        .await;
        waker.unpark();
        if waited {
            self.core.count_wait();
        }
        submitted
    }
}

impl Drop for Hosted {
    fn drop(&mut self) {
        if !self.finished {
            self.watch = Watch::default();
            self.core.abandon();
        }
    }
}
