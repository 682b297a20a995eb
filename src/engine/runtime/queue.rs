//! The way from submitters to a core: the messages a core receives, its queue, and the
//! gate shutdown closes.
//!
//! Owns: [`Msg`], [`CoreQueue`] (a lock-free array queue, the core's waker, its stop and
//! dead flags) and [`Gate`]. The wake protocol is the waker's (`udp::Waker`): a submitter
//! writes the core's eventfd only when the core announced it is about to park (one system
//! call per park, not per request); a busy core drains its queue in batches without any.
//! Must not touch: sockets, requests' contents (a request is its slot's index: its PDU
//! waits in its completion slot), clocks other than the submit timestamp.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use crossbeam_queue::ArrayQueue;

use crate::engine::core::Stats;
use crate::proto::wire::ReportEntry;
use crate::sync::{AtomicBool as GateBool, AtomicUsize};
use crate::udp::Waker;

/// What a core receives.
pub(crate) enum Msg {
    /// A request whose PDU waits in its completion slot (`SlotPool::write_pdu`).
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

/// Shutdown vs submit under loom (`cargo test --features loom --lib loom`): two
/// submitters pass the real [`Gate`] and queue, as `EngineHandle::submit` does, while
/// shutdown closes the gate and then drains the queue for the last time (what
/// `Engine::shutdown` does once the cores are joined). No request may be accepted and
/// then missed by that drain.
#[cfg(all(test, feature = "loom"))]
mod loom_tests {
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

    #[test]
    fn loom_gate_shutdown_vs_submit() {
        loom_model("gate: shutdown vs two submitters", BOUND, || {
            shutdown_vs_two_submitters(Duration::MAX)
        });
    }

    /// The model can fail: a shutdown that does not wait for the submitters inside the
    /// gate (what happens once the 5 s patience has run out) loses requests.
    #[test]
    #[should_panic(expected = "accepted but never finished")]
    fn loom_gate_close_without_waiting_is_caught() {
        loom_model("gate: close without waiting (must fail)", BOUND, || {
            shutdown_vs_two_submitters(Duration::ZERO)
        });
    }
}
