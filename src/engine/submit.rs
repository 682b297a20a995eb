//! Submission from any thread: the request builder, the encoded request, and the
//! per-core queues (a lock-free array queue + eventfd wake + parked flag).
//!
//! Owns: [`RequestBuilder`], [`Request`], [`Batch`], the message type cores receive, and
//! the wake protocol: a submitter writes the core's eventfd only when the core announced
//! it is about to park (one syscall per park, not per request); a busy core drains its
//! queue in batches without any syscall.
//! Must not touch: sockets, the request machine, clocks other than the submit timestamp.
//! The PDU is encoded on the caller's thread, once, into the request's completion slot
//! (`super::pdu`); the queue carries the slot's index, and the core seals the PDU from
//! the slot into the datagram it keeps in flight, adding the tenant/auth TLVs.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use crossbeam_queue::ArrayQueue;
use smallvec::SmallVec;

use super::EngineHandle;
use super::completion::Completion;
use super::pdu::{self, PduBuf, PduInline};
use super::stats::Stats;
use crate::proto::error::{ConfigError, RequestError};
use crate::proto::ids::{LatencyTracker, Resource};
use crate::proto::outcome::{Failure, Outcome, Response};
use crate::proto::wire::{GuardSpec, ReportEntry, ResourceSpec};
use crate::udp::Waker;

use crate::sync::{AtomicBool as GateBool, AtomicUsize};

/// What a core receives.
pub(crate) enum Msg {
    /// A request whose PDU waits in its completion slot (`SlotPool::write_pdu`), or in
    /// `heap` when it is too large to be inline.
    Request {
        slot: u32,
        submitted: Instant,
        heap: Option<Box<[u8]>>,
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

/// Builds one resource request. Obtained from [`EngineHandle::request`].
#[must_use = "a request does nothing until sent"]
pub struct RequestBuilder<'a> {
    handle: &'a EngineHandle,
    guards: SmallVec<[GuardSpec; 2]>,
    resources: SmallVec<[ResourceSpec; 2]>,
    label: &'a str,
    error: Option<ConfigError>,
    /// The PDU's length once [`pdu::check`] accepted it (the encoder trusts it).
    pdu_len: usize,
}

impl fmt::Debug for RequestBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("guards", &self.guards.len())
            .field("resources", &self.resources.len())
            .field("label", &self.label)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<'a> RequestBuilder<'a> {
    pub(crate) fn new(handle: &'a EngineHandle) -> Self {
        RequestBuilder {
            handle,
            guards: SmallVec::new(),
            resources: SmallVec::new(),
            label: "",
            error: None,
            pdu_len: 0,
        }
    }

    fn fail(&mut self, e: ConfigError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Consumes `tokens` (1..=65535) from `resource`.
    pub fn consume(mut self, resource: &Resource, tokens: u32) -> Self {
        let limit = self.handle.inner.window_limit_ms;
        if !(1..=65535).contains(&tokens) {
            self.fail(RequestError::TokensOutOfRange { tokens }.into());
        } else if resource.window_ms() > limit {
            self.fail(
                RequestError::WindowOverKeyLimit {
                    window_ms: resource.window_ms(),
                    limit_ms: limit,
                }
                .into(),
            );
        } else {
            self.resources.push(ResourceSpec {
                bucket_id: resource.id(),
                window_ms: resource.window_ms(),
                rate_limit: resource.rate_limit(),
                tokens: tokens as u16,
            });
        }
        self
    }

    /// Requires `tracker`'s current latency to be below `threshold` (a positive whole
    /// number of milliseconds, as the official client requires; anything else fails
    /// the request with a configuration error).
    pub fn guard(mut self, tracker: &LatencyTracker, threshold: Duration) -> Self {
        match crate::proto::ids::latency_ms(
            threshold,
            crate::proto::ids::LatencyField::GuardThreshold,
        ) {
            Ok(ms) => self.guards.push(GuardSpec {
                tracker_id: tracker.id(),
                ttl_ms: tracker.ttl_ms(),
                max_samples: tracker.max_samples(),
                min_samples: tracker.min_samples(),
                threshold_ms: ms,
                current_latency_ms: 0,
            }),
            Err(e) => self.fail(e.into()),
        }
        self
    }

    /// Metrics label (groups server-side metrics only).
    pub fn label(mut self, label: &'a str) -> Self {
        self.label = label;
        self
    }

    /// The official crate's name for [`RequestBuilder::label`].
    pub fn metrics_label(self, label: &'a str) -> Self {
        self.label(label)
    }

    /// The first configuration error (recorded by a builder method, or found by
    /// [`pdu::check`]), else what the request is.
    fn validate(&mut self) -> Result<Shape, ConfigError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.guards.is_empty() && self.resources.is_empty() {
            return Ok(Shape::Empty);
        }
        let sh = &self.handle.inner;
        let len = pdu::check(sh.max_pdu, &self.guards, &self.resources, self.label)?;
        Ok(Shape::Pdu(len))
    }

    /// Validates and encodes the request (for [`EngineHandle::submit_batch`]).
    pub fn build(mut self) -> Request {
        let kind = match self.validate() {
            Ok(Shape::Empty) => Kind::Empty,
            Err(e) => Kind::Invalid(e),
            Ok(Shape::Pdu(len)) => {
                self.pdu_len = len;
                let mut inline = PduInline::EMPTY;
                match self.write_pdu(&mut inline) {
                    Ok(None) => Kind::Encoded(PduBuf::Inline(inline)),
                    Ok(Some(heap)) => Kind::Encoded(PduBuf::Heap(heap)),
                    Err(e) => Kind::Invalid(e),
                }
            }
        };
        Request { kind }
    }

    /// Sends the request; the returned future (or its `wait()`) yields the outcome. The
    /// PDU is encoded straight into the request's completion slot, where its core
    /// takes it from.
    pub fn send(mut self) -> Completion {
        let h = self.handle;
        h.submit_one(&mut self)
    }

    /// Sends the request and blocks until its outcome.
    pub fn wait(self) -> Outcome {
        self.send().wait()
    }
}

/// A valid request: empty (granted locally) or with a PDU of this many bytes to send.
enum Shape {
    Empty,
    Pdu(usize),
}

pub(crate) enum Kind {
    Empty,
    Invalid(ConfigError),
    Encoded(PduBuf),
}

/// A validated, encoded request, ready for [`EngineHandle::submit_batch`].
pub struct Request {
    pub(crate) kind: Kind,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request").finish_non_exhaustive()
    }
}

/// What a submitter hands the engine: an outcome known without a core, or a PDU to
/// write into the request's completion slot.
pub(crate) trait Submission {
    /// The outcome known without a core (a configuration error, or the local grant of
    /// an empty request), if any; asked once, before a slot is taken.
    fn local_outcome(&mut self) -> Option<Outcome>;

    /// Writes the encoded PDU into `inline` (in the request's completion slot) when it
    /// fits; else returns it in a heap buffer.
    fn write_pdu(&mut self, inline: &mut PduInline) -> Result<Option<Box<[u8]>>, ConfigError>;
}

impl Submission for RequestBuilder<'_> {
    /// The outcome known without a core (a configuration error, or the local grant of
    /// an empty request), if any.
    fn local_outcome(&mut self) -> Option<Outcome> {
        match self.validate() {
            Ok(Shape::Empty) => Some(Ok(Response::local_grant())),
            Ok(Shape::Pdu(len)) => {
                self.pdu_len = len;
                None
            }
            Err(e) => Some(Err(Failure::Configuration(e))),
        }
    }

    /// Encodes the request (checked by `local_outcome`) into `inline`, or a heap buffer
    /// when it does not fit.
    fn write_pdu(&mut self, inline: &mut PduInline) -> Result<Option<Box<[u8]>>, ConfigError> {
        pdu::encode(
            inline,
            self.pdu_len,
            self.handle.inner.horizon_ms,
            &self.guards,
            &self.resources,
            self.label,
        )
    }
}

impl Submission for Request {
    fn local_outcome(&mut self) -> Option<Outcome> {
        match std::mem::replace(&mut self.kind, Kind::Empty) {
            Kind::Empty => Some(Ok(Response::local_grant())),
            Kind::Invalid(e) => Some(Err(Failure::Configuration(e))),
            k @ Kind::Encoded(_) => {
                self.kind = k;
                None
            }
        }
    }

    fn write_pdu(&mut self, inline: &mut PduInline) -> Result<Option<Box<[u8]>>, ConfigError> {
        Ok(match std::mem::replace(&mut self.kind, Kind::Empty) {
            Kind::Encoded(PduBuf::Inline(p)) => {
                *inline = p;
                None
            }
            Kind::Encoded(PduBuf::Heap(h)) => Some(h),
            _ => None,
        })
    }
}

/// Outcomes of a batch, in submission order: a future, or [`Batch::wait`].
pub struct Batch {
    pending: Vec<Completion>,
    done: Vec<Option<Outcome>>,
    next: usize,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("requests", &self.pending.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Batch {
    pub(crate) fn new(pending: Vec<Completion>) -> Batch {
        let n = pending.len();
        Batch {
            pending,
            done: (0..n).map(|_| None).collect(),
            next: 0,
        }
    }

    /// Blocks until every outcome is known.
    pub fn wait(self) -> Vec<Outcome> {
        self.pending.into_iter().map(Completion::wait).collect()
    }

    /// Blocks until every outcome is known or `timeout` passes; on timeout the batch is
    /// handed back (the outcomes known so far kept in it).
    pub fn wait_timeout(self, timeout: Duration) -> Result<Vec<Outcome>, Batch> {
        let deadline = Instant::now() + timeout;
        let mut outs = Vec::with_capacity(self.pending.len());
        let mut rest = self.pending.into_iter();
        while let Some(c) = rest.next() {
            match c.wait_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(o) => outs.push(o),
                Err(c) => {
                    let mut pending: Vec<Completion> =
                        outs.into_iter().map(Completion::ready).collect();
                    pending.push(c);
                    pending.extend(rest);
                    return Err(Batch::new(pending));
                }
            }
        }
        Ok(outs)
    }
}

impl Future for Batch {
    type Output = Vec<Outcome>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<Outcome>> {
        let this = &mut *self;
        while this.next < this.pending.len() {
            let i = this.next;
            match Pin::new(&mut this.pending[i]).poll(cx) {
                Poll::Ready(o) => {
                    this.done[i] = Some(o);
                    this.next += 1;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        this.pending.clear();
        Poll::Ready(
            this.done
                .drain(..)
                .map(|o| o.expect("every outcome"))
                .collect(),
        )
    }
}

#[cfg(test)]
mod threshold_tests {
    use super::*;
    use crate::proto::ids::{LatencyField, latency_ms};

    /// Guard thresholds follow the official crate (`ratelimitly` 0.1.0 refuses any
    /// duration that is zero or not a whole number of milliseconds): no rounding.
    #[test]
    fn thresholds_are_positive_whole_milliseconds() {
        let t = |d| latency_ms(d, LatencyField::GuardThreshold);
        assert_eq!(t(Duration::from_millis(100)), Ok(100));
        for bad in [
            Duration::from_micros(1),
            Duration::from_micros(1500),
            Duration::ZERO,
            Duration::from_secs(u64::MAX),
        ] {
            assert_eq!(t(bad), Err(RequestError::BadLatency));
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
