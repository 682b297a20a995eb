//! The one way in: every request, batch and report a caller hands the engine passes here,
//! and the queue each core takes them from.
//!
//! Owns: [`Intake`] (the shutdown [`Gate`], one [`CoreQueue`] per core, the completion
//! slots and the overload counter), [`Msg`] (what a core receives), [`Submitter`] (a pass
//! through the gate, on the calling thread's core: requests queued through it, then one
//! wake-up of the core when it is dropped) and the thread-to-core affinity of submitters.
//! A request arrives as what its validation gave: why it is invalid, `None` for an empty
//! request (granted locally), or the source of its PDU; the PDU goes into the request's
//! completion slot, and the queue carries the slot's index. The queue is a lock-free
//! array; the wake protocol is the waker's (`udp::Waker`): a submitter writes the core's
//! eventfd only when the core announced it is about to park (one system call per park,
//! not per request); a busy core drains its queue in batches without any.
//! Must not touch: the encoding (the request builder's), the cores' turn, sockets, clocks
//! other than the submit timestamp.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use crossbeam_queue::ArrayQueue;

use super::completion::{Completion, PduSource, SlotPool};
use crate::engine::core::Stats;
use crate::proto::error::ConfigError;
use crate::proto::outcome::{Failure, Response};
use crate::proto::wire::ReportEntry;
use crate::sync::{AtomicBool as GateBool, AtomicUsize};
use crate::udp::Waker;

thread_local! {
    static CORE_HINT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The way into the cores, shared by the handle and the cores: the gate, the per-core
/// queues, the completion slots and the count of submissions refused for overload.
pub(crate) struct Intake {
    pub queues: Box<[CoreQueue]>,
    pub pool: Arc<SlotPool>,
    pub gate: Gate,
    pub queue_full: AtomicU64,
    next_thread: std::sync::atomic::AtomicUsize,
}

impl Intake {
    pub(crate) fn new(queues: Box<[CoreQueue]>, pool: Arc<SlotPool>) -> Intake {
        Intake {
            queues,
            pool,
            gate: Gate::new(),
            queue_full: AtomicU64::new(0),
            next_thread: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

/// A submitter inside the gate, on its thread's core. Dropping it wakes the core once
/// for everything it queued and leaves the gate.
pub(crate) struct Submitter<'a> {
    shared: &'a Intake,
    core: usize,
    queued: bool,
}

impl<'a> Submitter<'a> {
    /// Passes the gate; `None` once the engine shuts down (the caller then fails with
    /// `Shutdown`).
    pub(crate) fn enter(shared: &'a Intake) -> Option<Submitter<'a>> {
        if !shared.gate.enter() {
            return None;
        }
        let n = shared.queues.len();
        let core = CORE_HINT.with(|c| {
            let mut v = c.get();
            if v == usize::MAX {
                v = shared.next_thread.fetch_add(1, Ordering::Relaxed);
                c.set(v);
            }
            v % n
        });
        Some(Submitter {
            shared,
            core,
            queued: false,
        })
    }

    /// Queues one request: its outcome at once when validation decided it, else its PDU
    /// goes into the completion slot it takes (`SlotPool::start`).
    pub(crate) fn request(
        &mut self,
        req: Result<Option<PduSource<'_>>, ConfigError>,
    ) -> Completion {
        let src = match req {
            Err(e) => return Completion::ready(Err(Failure::Configuration(e))),
            Ok(None) => return Completion::ready(Ok(Response::local_grant())),
            Ok(Some(src)) => src,
        };
        let (sh, core) = (self.shared, self.core);
        if sh.queues[core].dead.load(Ordering::Relaxed) {
            return Completion::ready(Err(Failure::CoreFailed { core }));
        }
        let (slot, c) = match sh.pool.start(src) {
            Ok(started) => started,
            Err(f) => {
                if matches!(f, Failure::Overloaded) {
                    sh.queue_full.fetch_add(1, Ordering::Relaxed);
                }
                return Completion::ready(Err(f));
            }
        };
        let msg = Msg::Request {
            slot,
            submitted: Instant::now(),
        };
        if sh.queues[core].push(msg).is_err() {
            sh.queue_full.fetch_add(1, Ordering::Relaxed);
            sh.pool.complete(slot, Err(Failure::Overloaded));
        } else {
            self.queued = true;
        }
        c
    }

    /// Queues a latency report entry; `Overloaded` when the core's queue is full.
    pub(crate) fn report(&mut self, entry: ReportEntry) -> Result<(), Failure> {
        if self.shared.queues[self.core]
            .push(Msg::Report(entry))
            .is_err()
        {
            self.shared.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(Failure::Overloaded);
        }
        self.queued = true;
        Ok(())
    }
}

/// One request through the way in: passes the gate (`Shutdown` once it is closed, whatever
/// the request), queues it and wakes its core.
pub(crate) fn one(intake: &Intake, req: Result<Option<PduSource<'_>>, ConfigError>) -> Completion {
    match Submitter::enter(intake) {
        Some(mut s) => s.request(req),
        None => Completion::ready(Err(Failure::Shutdown)),
    }
}

impl Drop for Submitter<'_> {
    fn drop(&mut self) {
        if self.queued {
            self.shared.queues[self.core].wake();
        }
        self.shared.gate.leave();
    }
}

/// What a core receives.
pub(crate) enum Msg {
    /// A request whose PDU waits in its completion slot (`SlotPool::start`).
    Request {
        slot: u32,
        submitted: Instant,
    },
    Report(ReportEntry),
    /// Send the pending latency reports now, then answer with the statistics.
    FlushReports(Sender<Stats>),
    /// Test-only fault hook: the core panics when it takes this message.
    Fault,
}

/// One core's inbound queue: a bounded lock-free array (a push and a pop are one
/// compare-and-swap each; nobody ever blocks on it, so a channel's waiting machinery is
/// not needed).
pub(crate) struct CoreQueue {
    queue: ArrayQueue<Msg>,
    /// The core's I/O waker (set once by the core when it starts; unset in simulation).
    /// Waking costs a system call only while the core waits.
    pub waker: OnceLock<Arc<Waker>>,
    /// Set once by shutdown.
    pub stop: AtomicBool,
    /// Set once when the core failed: submitters fail at once with `CoreFailed`.
    pub dead: AtomicBool,
}

impl CoreQueue {
    pub(crate) fn new(capacity: usize) -> std::io::Result<CoreQueue> {
        Ok(CoreQueue {
            queue: ArrayQueue::new(capacity.max(1)),
            waker: OnceLock::new(),
            stop: AtomicBool::new(false),
            dead: AtomicBool::new(false),
        })
    }

    /// Queues without waking; `Err` gives the message back when the queue is full.
    #[allow(clippy::result_large_err)] // the message is handed back, not an error
    pub(crate) fn push(&self, msg: Msg) -> Result<(), Msg> {
        self.queue.push(msg)
    }

    /// The oldest queued message (the core's side).
    pub(crate) fn pop(&self) -> Option<Msg> {
        self.queue.pop()
    }

    /// True when nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Messages queued now.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// Wakes the core: a system call only if it is blocked in its wait.
    pub(crate) fn wake(&self) {
        if let Some(w) = self.waker.get() {
            w.wake();
        }
    }
}

/// The gate every submission passes (`EngineHandle::submit`, `submit_batch`, `report`)
/// and shutdown closes: after [`Gate::close`] returns, no submitter is between
/// [`Gate::enter`] and [`Gate::leave`], and none enters again, so the shutdown's final
/// drain of the queues sees every request accepted (the handshake is the waker's: the
/// submitter counts itself in, then reads `closed`; shutdown sets `closed`, then reads
/// the count; both `SeqCst`).
pub(crate) struct Gate {
    closed: GateBool,
    active: AtomicUsize,
}

impl Gate {
    pub(crate) fn new() -> Gate {
        Gate {
            closed: GateBool::new(false),
            active: AtomicUsize::new(0),
        }
    }

    /// A submitter comes in: false once closed (then it must not queue anything).
    pub(crate) fn enter(&self) -> bool {
        self.active.fetch_add(1, Ordering::SeqCst);
        crate::sync::seq_cst_point();
        if self.closed.load(Ordering::SeqCst) {
            self.active.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// The submitter that entered has queued (and woken) what it submits.
    pub(crate) fn leave(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// Refuses new submitters, then waits (at most `patience`) for those that entered
    /// before.
    pub(crate) fn close(&self, patience: Duration) {
        self.closed.store(true, Ordering::SeqCst);
        crate::sync::seq_cst_point();
        let t0 = Instant::now();
        while self.active.load(Ordering::SeqCst) != 0 && t0.elapsed() < patience {
            crate::sync::thread::yield_now();
        }
    }
}

/// Shutdown vs submit under loom (a model of [`crate::loom_models`]): two
/// submitters pass the real [`Gate`] and queue, as `EngineHandle::submit` does, while
/// shutdown closes the gate and then drains the queue for the last time (what
/// `Engine::shutdown` does once the cores are joined). No request may be accepted and
/// then missed by that drain.
#[cfg(feature = "loom")]
pub(crate) mod loom_models {
    use super::*;
    use crate::sync::loom_model;
    use loom::sync::{Arc, Mutex};

    const BOUND: usize = 3;

    fn shutdown_vs_two_submitters(patience: Duration) {
        let gate = Arc::new(Gate::new());
        let queue = Arc::new(Mutex::new(Vec::new()));
        let subs: Vec<_> = (0..2u32)
            .map(|i| {
                let (gate, queue) = (gate.clone(), queue.clone());
                loom::thread::spawn(move || {
                    if !gate.enter() {
                        return None; // refused: fails at once with Failure::Shutdown
                    }
                    queue.lock().unwrap().push(i);
                    gate.leave();
                    Some(i)
                })
            })
            .collect();
        gate.close(patience);
        let drained = std::mem::take(&mut *queue.lock().unwrap());
        for s in subs {
            if let Some(i) = s.join().unwrap() {
                assert!(
                    drained.contains(&i),
                    "request {i} accepted but never finished"
                );
            }
        }
        // nothing is queued after the last drain
        assert!(queue.lock().unwrap().is_empty());
        assert!(!gate.enter(), "closed for good");
    }

    pub(crate) fn loom_gate_shutdown_vs_submit() {
        loom_model("gate: shutdown vs two submitters", BOUND, || {
            shutdown_vs_two_submitters(Duration::MAX)
        });
    }

    /// The model can fail: a shutdown that does not wait for the submitters inside the
    /// gate (what happens once the 5 s patience has run out) loses requests.
    pub(crate) fn loom_gate_close_without_waiting_is_caught() {
        loom_model("gate: close without waiting (must fail)", BOUND, || {
            shutdown_vs_two_submitters(Duration::ZERO)
        });
    }
}
