//! Lock-free one-shot completion slots, pooled per engine, and the caller's end of them.
//!
//! Owns: a fixed pool of slots (allocated once at build), each carrying one request from
//! its submitter to its core and its `Outcome` back: the request's encoded PDU ([`PduBuf`],
//! written by [`SlotPool::start`] from a [`PduSource`]: the one encoder call) until the
//! core takes it, then the outcome the core's turn writes (`CoreState::poll_outcome`
//! hands it out as data); an atomic state and an `AtomicWaker` (a task waker, or a
//! thread unparker for blocking waits). Slots are reused through a lock-free free list,
//! so a request costs no heap allocation here. Also [`Completion`] (the caller's future or
//! blocking wait) and `AtomicHist`, the lock-free histogram the callers record their
//! completion-wake times into.
//!
//! Must not touch: request state, sockets, clocks other than the callers' wake
//! measurement. A core completes a slot exactly once; a caller that gives up (drops its
//! future) abandons the slot and the core frees it. The pool's memory is freed where its
//! last reference goes, except on an async runtime's thread: there `SlotPool`'s `Drop`
//! hands the slots to that runtime's blocking pool, so that no worker stalls on freeing
//! tens of MiB.

use std::fmt;
use std::future::Future;
use std::mem::size_of;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::sync::thread;
use crate::sync::{ArrayQueue, AtomicU8, AtomicWaker, UnsafeCell};

use crate::engine::core::LatencyHistogram;
use crate::proto::error::{ConfigError, RequestError};
use crate::proto::outcome::{Failure, Outcome};
use crate::proto::wire::{self, EncodeError, GuardSpec, ResourceSpec};

/// PDU bytes kept inline in a completion slot, within the room its outcome takes later: a
/// request with two resources and a guard (104 bytes) and a short label fits; a larger
/// PDU is written to a heap buffer the slot owns.
pub(crate) const PDU_INLINE: usize = 128;

/// A request's encoded PDU: inline when it fits, else in a heap buffer.
pub(crate) enum PduBuf {
    /// At most [`PDU_INLINE`] bytes.
    Inline { len: u16, bytes: [u8; PDU_INLINE] },
    /// A larger PDU.
    Heap(Box<[u8]>),
}

impl PduBuf {
    /// No bytes.
    pub(crate) const EMPTY: PduBuf = PduBuf::Inline {
        len: 0,
        bytes: [0u8; PDU_INLINE],
    };

    /// The encoded bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            PduBuf::Inline { len, bytes } => &bytes[..usize::from(*len).min(PDU_INLINE)],
            PduBuf::Heap(b) => b,
        }
    }
}

/// Where a request's PDU comes from: its builder's parts, encoded straight into its
/// completion slot (`RequestBuilder::send`, `len` as validation found it), or a
/// [`PduBuf`] encoded before (`Request`, moved into the slot).
pub(crate) enum PduSource<'a> {
    Encode {
        len: usize,
        horizon_ms: u32,
        guards: &'a [GuardSpec],
        resources: &'a [ResourceSpec],
        label: &'a str,
    },
    Built(PduBuf),
}

impl PduSource<'_> {
    /// Writes the PDU into `dst`: a built one is moved; a rate request of `len` bytes is
    /// encoded inline when it fits (the encoder writes every byte of the PDU, so a reused
    /// store needs no clearing), else into a heap buffer that `dst` then owns.
    pub(crate) fn write(self, dst: &mut PduBuf) -> Result<(), ConfigError> {
        let (len, horizon_ms, guards, resources, label) = match self {
            PduSource::Built(p) => {
                *dst = p;
                return Ok(());
            }
            PduSource::Encode {
                len,
                horizon_ms,
                guards,
                resources,
                label,
            } => (len, horizon_ms, guards, resources, label),
        };
        let enc = |out: &mut [u8]| {
            wire::encode_rate_request_pdu(out, horizon_ms, guards, resources, label)
                .map_err(encode_error)
        };
        if len > PDU_INLINE {
            let mut v = vec![0u8; len];
            let n = enc(&mut v)?;
            v.truncate(n);
            *dst = PduBuf::Heap(v.into_boxed_slice());
            return Ok(());
        }
        if let PduBuf::Heap(_) = dst {
            *dst = PduBuf::EMPTY;
        }
        if let PduBuf::Inline { len: l, bytes } = dst {
            *l = enc(&mut bytes[..])? as u16;
        }
        Ok(())
    }
}

fn encode_error(e: EncodeError) -> ConfigError {
    match e {
        EncodeError::LabelTooLong { len } => RequestError::LabelTooLong { len }.into(),
        EncodeError::TooManyBlocks => RequestError::TooManyBlocks.into(),
        _ => RequestError::TooLarge {
            needed: wire::MAX_DATAGRAM + 1,
            max: wire::MAX_DATAGRAM,
        }
        .into(),
    }
}

const FREE: u8 = 0;
const PENDING: u8 = 1;
const READY: u8 = 2;
const ABANDONED: u8 = 3;

/// What a slot holds: nothing, the request's PDU (from its submitter to its core), or
/// its outcome (from its core to its caller).
enum Content {
    Empty,
    Pdu(PduBuf),
    Done(Outcome),
}

struct Slot {
    state: AtomicU8,
    content: UnsafeCell<Content>,
    /// When the core decided (for the completion-wake measurement).
    decided: UnsafeCell<Option<Instant>>,
    waker: AtomicWaker,
}

// SAFETY: `content` and `decided` are written by one side at a time, the one the state
// and the request's progress name: the submitter between `acquire` and queueing the
// request (the PDU), the core from taking the request until its Release store of READY
// (reading and dropping the PDU, writing the outcome), and the caller after it observed
// READY with Acquire ordering (taking the outcome), or whoever frees the slot. The
// queue's push happens-before its pop, so the submitter's writes are visible to the core.
unsafe impl Sync for Slot {}
// SAFETY: as for `Sync`: the cells hold plain data owned by whichever side the state names.
unsafe impl Send for Slot {}

/// The engine-wide pool of completion slots: where submitters write requests' PDUs and
/// the cores' turns write their outcomes.
pub(crate) struct SlotPool {
    slots: Box<[Slot]>,
    free: ArrayQueue<u32>,
    /// Decision to caller-running times (µs), recorded by the callers.
    pub(crate) wake_us: AtomicHist,
}

impl std::fmt::Debug for SlotPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPool")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

impl SlotPool {
    /// A pool of `capacity` slots, or `None` when the memory cannot be had (the
    /// engine reports `BuildError::OutOfMemory` instead of aborting).
    pub(crate) fn new(capacity: usize) -> Option<Arc<SlotPool>> {
        let capacity = capacity.clamp(1, u32::MAX as usize);
        let mut slots = Vec::new();
        slots.try_reserve_exact(capacity).ok()?;
        slots.extend((0..capacity).map(|_| Slot {
            state: AtomicU8::new(FREE),
            content: UnsafeCell::new(Content::Empty),
            decided: UnsafeCell::new(None),
            waker: AtomicWaker::new(),
        }));
        // the free list (16 bytes a slot, allocated infallibly by ArrayQueue) is a
        // fraction of the slots just reserved fallibly above
        let free = ArrayQueue::new(capacity);
        for i in 0..capacity as u32 {
            let _ = free.push(i);
        }
        Some(Arc::new(SlotPool {
            slots: slots.into_boxed_slice(),
            free,
            wake_us: AtomicHist::new(),
        }))
    }

    /// Bytes of one slot (the completion half of an in-flight request's memory).
    pub(crate) fn slot_size() -> usize {
        size_of::<Slot>() + 2 * size_of::<u64>()
    }

    /// Takes a free slot, or `None` when every slot is in use (the engine is overloaded).
    fn acquire(&self) -> Option<u32> {
        let idx = self.free.pop()?;
        self.slots[idx as usize]
            .state
            .store(PENDING, Ordering::Relaxed);
        Some(idx)
    }

    /// Submitter side: takes a free slot, writes the request's PDU from `src` into it and
    /// returns the slot with the caller's end of it (the request is to be queued next).
    /// `Overloaded` when every slot is in use; a refusal of the encoder (after the checks
    /// of validation: not expected) frees the slot again.
    pub(crate) fn start(
        self: &Arc<Self>,
        src: PduSource<'_>,
    ) -> Result<(u32, Completion), Failure> {
        let idx = self.acquire().ok_or(Failure::Overloaded)?;
        let slot = &self.slots[idx as usize];
        // SAFETY: the slot was just acquired by this submitter and its request is not
        // queued yet: nobody else touches the cell.
        let written = slot.content.with_mut(|c| unsafe {
            *c = Content::Pdu(PduBuf::EMPTY);
            match &mut *c {
                Content::Pdu(p) => src.write(p),
                _ => unreachable!("written just above"),
            }
        });
        if let Err(e) = written {
            self.release(idx);
            return Err(Failure::Configuration(e));
        }
        Ok((idx, Completion::new(self.clone(), idx)))
    }

    /// Core side: the PDU of slot `idx` (empty if none was written), whose request this
    /// core took from its queue. The PDU stays in the slot until the outcome replaces it
    /// ([`publish`](Self::publish) drops it there).
    ///
    /// # Safety
    ///
    /// Only the core that popped `idx` from its queue may call this, and only before it
    /// completes the slot: the returned bytes must be dropped before any call that
    /// completes or frees slot `idx` ([`complete`](Self::complete),
    /// [`complete_deferred`](Self::complete_deferred)).
    pub(crate) unsafe fn pdu(&self, idx: u32) -> &[u8] {
        let slot = &self.slots[idx as usize];
        // The access is checked (under loom: recorded) here, where it begins.
        let c: *const Content = slot.content.with_mut(|c| c.cast_const());
        // SAFETY: the submitter wrote the PDU before queueing the request, and the
        // queue's pop made that write visible here; until this core completes the slot,
        // nobody else touches the cell (the caller's contract), and the borrow ends
        // before that.
        match unsafe { &*c } {
            Content::Pdu(p) => p.as_slice(),
            _ => &[],
        }
    }

    /// Frees slot `idx`; its owner calls this (the caller that took or dropped the
    /// outcome, or the core that completed an abandoned slot).
    fn release(&self, idx: u32) {
        let slot = &self.slots[idx as usize];
        // SAFETY: the releasing side is the slot's only user now. A decision time that
        // nobody read (an abandoned request's) must not reach the slot's next use, whose
        // outcome may come without one (queue full, shutdown); the content is dropped.
        slot.decided.with_mut(|d| unsafe { *d = None });
        // SAFETY: as above.
        slot.content.with_mut(|c| unsafe { *c = Content::Empty });
        slot.state.store(FREE, Ordering::Release);
        // Cannot fail: the queue holds every slot index at most once.
        let _ = self.free.push(idx);
    }

    /// Delivers the outcome of slot `idx` (exactly once per acquire) and wakes its caller
    /// now: for the submitter's own refusals and what no core will take.
    pub(crate) fn complete(&self, idx: u32, outcome: Outcome) {
        if self.publish(idx, outcome, None) {
            self.wake(idx);
        }
    }

    /// A core's turn: delivers the outcome of slot `idx` (exactly once per acquire), with
    /// the time its core decided when sampled, and records the slot in `wakes`: the turn
    /// wakes the callers once, after its sends ([`SlotPool::wake`]).
    #[inline]
    pub(crate) fn complete_deferred(
        &self,
        idx: u32,
        outcome: Outcome,
        decided: Option<Instant>,
        wakes: &mut Vec<u32>,
    ) {
        if self.publish(idx, outcome, decided) {
            wakes.push(idx);
        }
    }

    /// Wakes the caller of slot `idx` (a deferred wake-up). If the caller already took
    /// the outcome and the slot serves another request, that caller is woken
    /// spuriously, which futures and blocking waits tolerate (they poll again).
    pub(crate) fn wake(&self, idx: u32) {
        self.slots[idx as usize].waker.wake();
    }

    /// Writes the outcome (dropping a PDU still there) and marks it READY; false when
    /// the caller had left (the outcome is dropped and the slot freed instead).
    #[inline]
    fn publish(&self, idx: u32, outcome: Outcome, decided: Option<Instant>) -> bool {
        let slot = &self.slots[idx as usize];
        // SAFETY: only the completing side writes while the slot is PENDING/ABANDONED;
        // the caller reads after observing READY (Acquire).
        slot.content
            .with_mut(|c| unsafe { *c = Content::Done(outcome) });
        // SAFETY: as above.
        slot.decided.with_mut(|d| unsafe { *d = decided });
        if slot.state.swap(READY, Ordering::AcqRel) == ABANDONED {
            // the caller left: drop the outcome and recycle the slot
            self.release(idx);
            return false;
        }
        true
    }

    /// Caller side: takes the outcome if ready, registering `waker` otherwise.
    fn poll_take(&self, idx: u32, waker: &Waker) -> Poll<Outcome> {
        let slot = &self.slots[idx as usize];
        if slot.state.load(Ordering::Acquire) != READY {
            slot.waker.register(waker);
            if slot.state.load(Ordering::Acquire) != READY {
                return Poll::Pending;
            }
        }
        // SAFETY: READY observed with Acquire: the core wrote the outcome and no longer
        // touches the cell; the caller takes it exactly once (the handle is consumed).
        let content = slot
            .content
            .with_mut(|c| unsafe { std::mem::replace(&mut *c, Content::Empty) });
        let Content::Done(out) = content else {
            unreachable!("a READY slot holds its outcome");
        };
        // SAFETY: as above; reset for the slot's next use.
        if let Some(t) = slot.decided.with_mut(|d| unsafe { (*d).take() }) {
            self.wake_us.record(t.elapsed().as_micros() as u64);
        }
        self.release(idx);
        Poll::Ready(out)
    }

    /// Caller side: gives up on slot `idx`.
    fn abandon(&self, idx: u32) {
        let slot = &self.slots[idx as usize];
        if slot.state.swap(ABANDONED, Ordering::AcqRel) == READY {
            // READY: the core wrote it and left; nobody else will read it
            self.release(idx);
        }
    }
}

/// The caller's end of one request: a runtime-agnostic future, or [`Completion::wait`].
/// Dropping it before the outcome arrives abandons the request's result (the request
/// itself still runs to its end on the core).
pub struct Completion {
    inner: Inner,
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").finish_non_exhaustive()
    }
}

enum Inner {
    Slot {
        pool: Arc<SlotPool>,
        idx: u32,
        done: bool,
    },
    Ready(Option<Outcome>),
}

impl Completion {
    /// The caller's end of slot `idx`, just acquired.
    fn new(pool: Arc<SlotPool>, idx: u32) -> Self {
        Completion {
            inner: Inner::Slot {
                pool,
                idx,
                done: false,
            },
        }
    }

    /// An outcome known without involving a core (local grant, configuration error,
    /// overload, shutdown).
    pub(crate) fn ready(outcome: Outcome) -> Self {
        Completion {
            inner: Inner::Ready(Some(outcome)),
        }
    }

    /// Blocks the calling thread until the outcome arrives.
    pub fn wait(mut self) -> Outcome {
        if let Inner::Ready(out) = &mut self.inner {
            return out.take().expect("outcome taken once");
        }
        let waker = crate::sync::thread_waker();
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = Pin::new(&mut self).poll(&mut cx) {
                return out;
            }
            thread::park();
        }
    }

    /// Blocks the calling thread until the outcome arrives or `timeout` passes; on
    /// timeout the completion is handed back (wait again, or drop it to abandon).
    #[allow(clippy::result_large_err)] // the completion is handed back, not an error
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<Outcome, Completion> {
        if let Inner::Ready(out) = &mut self.inner {
            return Ok(out.take().expect("outcome taken once"));
        }
        let deadline = Instant::now() + timeout;
        let waker = crate::sync::thread_waker();
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = Pin::new(&mut self).poll(&mut cx) {
                return Ok(out);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self);
            }
            thread::park_timeout(deadline - now);
        }
    }

    /// The outcome if it has arrived, without blocking; else the completion back.
    #[allow(clippy::result_large_err)] // the completion is handed back, not an error
    pub fn try_take(self) -> Result<Outcome, Completion> {
        self.wait_timeout(Duration::ZERO)
    }
}

impl Future for Completion {
    type Output = Outcome;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        match &mut self.inner {
            Inner::Ready(out) => {
                Poll::Ready(out.take().expect("Completion polled after it returned"))
            }
            Inner::Slot { pool, idx, done } => {
                assert!(!*done, "Completion polled after it returned its outcome");
                match pool.poll_take(*idx, cx.waker()) {
                    Poll::Ready(out) => {
                        *done = true;
                        Poll::Ready(out)
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// The slots of a default engine are tens of MiB: freeing them took 55–95 ms on a busy
/// 2-CPU host. Where the last reference goes on an async runtime's thread (a hosted
/// core's task that outlived its `Engine`, an application task dropping its `Engine` or
/// a last `Completion`), they are freed on that runtime's blocking pool instead, so that
/// no worker stalls the tasks behind it (on a current-thread runtime, another engine's
/// first requests timed out at the 60 ms horizon).
impl Drop for SlotPool {
    fn drop(&mut self) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let slots = std::mem::take(&mut self.slots);
            drop(rt.spawn_blocking(move || drop(slots)));
        }
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if let Inner::Slot {
            pool,
            idx,
            done: false,
        } = &self.inner
        {
            pool.abandon(*idx);
        }
    }
}

/// A lock-free histogram of microsecond values (log-linear, 8 sub-buckets per power of
/// two: about 12% resolution), recorded by caller threads without a lock.
pub(crate) struct AtomicHist {
    buckets: Box<[AtomicU64]>,
}

/// 8 exact values, then 8 sub-buckets for each power of two up to 2^37 µs (38 h).
const HIST_BUCKETS: usize = 8 + 34 * 8;

impl AtomicHist {
    pub(crate) fn new() -> AtomicHist {
        AtomicHist {
            buckets: (0..HIST_BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn index(v: u64) -> usize {
        let v = v.min((1 << 37) - 1);
        if v < 8 {
            return v as usize;
        }
        let e = 63 - v.leading_zeros() as usize; // >= 3
        8 + (e - 3) * 8 + ((v >> (e - 3)) & 7) as usize
    }

    fn value(i: usize) -> u64 {
        if i < 8 {
            return i as u64;
        }
        let (e, sub) = ((i - 8) / 8 + 3, ((i - 8) % 8) as u64);
        (8 | sub) << (e - 3)
    }

    pub(crate) fn record(&self, us: u64) {
        self.buckets[Self::index(us)].fetch_add(1, Ordering::Relaxed);
    }

    /// Values recorded so far.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    /// Adds the recorded values into `h` (each at its bucket's lower bound, at least 1).
    pub(crate) fn add_to(&self, h: &mut LatencyHistogram) {
        for (i, b) in self.buckets.iter().enumerate() {
            let n = b.load(Ordering::Relaxed);
            if n > 0 {
                h.record_n(Self::value(i), n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::outcome::{Failure, Response};

    fn heap(v: Vec<u8>) -> PduSource<'static> {
        PduSource::Built(PduBuf::Heap(v.into_boxed_slice()))
    }

    fn pdu(pool: &SlotPool, idx: u32) -> Vec<u8> {
        // SAFETY: the test is the slot's core and reads before completing it.
        unsafe { pool.pdu(idx) }.to_vec()
    }

    fn resource(i: u8) -> ResourceSpec {
        ResourceSpec {
            bucket_id: [i; 16],
            window_ms: 1000,
            rate_limit: 10,
            tokens: 1,
        }
    }

    /// A reused store holds exactly what a fresh one would: the encoder writes every
    /// byte, whatever the store held before.
    #[test]
    fn reused_store_encodes_like_a_fresh_one() {
        for n in [1usize, 2, 3] {
            let rs: Vec<_> = (0..n as u8).map(resource).collect();
            let label = "a-label";
            let enc = |store: &mut PduBuf| {
                let len = wire::rate_request_pdu_len(0, rs.len(), label.len()).unwrap();
                encode(store, len, &rs, label);
                assert!(matches!(store, PduBuf::Inline { .. }));
            };
            let mut fresh = PduBuf::EMPTY;
            enc(&mut fresh);
            let mut dirty = PduBuf::Inline {
                len: 7,
                bytes: [0xAA; PDU_INLINE],
            };
            enc(&mut dirty);
            assert_eq!(fresh.as_slice(), dirty.as_slice(), "{n} resources");
            let len = wire::rate_request_pdu_len(0, n, label.len()).unwrap();
            assert_eq!(fresh.as_slice().len(), len);
        }
    }

    /// A large PDU is a case of the same store: a heap buffer it owns, and the store
    /// goes back to inline for a small one.
    #[test]
    fn large_pdus_go_to_a_heap_buffer_of_the_same_store() {
        let rs: Vec<_> = (0..8).map(resource).collect();
        let mut store = PduBuf::EMPTY;
        encode(
            &mut store,
            wire::rate_request_pdu_len(0, 8, 0).unwrap(),
            &rs,
            "",
        );
        assert!(matches!(store, PduBuf::Heap(_)));
        let len = wire::rate_request_pdu_len(0, 8, 0).unwrap();
        assert_eq!(store.as_slice().len(), len);
        assert!(len > PDU_INLINE);
        let one = [resource(1)];
        encode(
            &mut store,
            wire::rate_request_pdu_len(0, 1, 0).unwrap(),
            &one,
            "",
        );
        assert!(matches!(store, PduBuf::Inline { .. }));
        assert_eq!(
            store.as_slice().len(),
            wire::rate_request_pdu_len(0, 1, 0).unwrap()
        );
    }

    fn encode(dst: &mut PduBuf, len: usize, resources: &[ResourceSpec], label: &str) {
        let src = PduSource::Encode {
            len,
            horizon_ms: 60,
            guards: &[],
            resources,
            label,
        };
        src.write(dst).unwrap();
    }

    #[test]
    fn complete_then_wait_and_reuse() {
        let pool = SlotPool::new(2).unwrap();
        for _ in 0..10 {
            let idx = pool.acquire().unwrap();
            let c = Completion::new(pool.clone(), idx);
            pool.complete(idx, Err(Failure::Overloaded));
            assert!(matches!(c.wait(), Err(Failure::Overloaded)));
        }
        assert_eq!(pool.free.len(), 2);
    }

    /// The PDU travels in the slot: written by the submitter, read in place by the core,
    /// and dropped when the outcome replaces it (a heap PDU too), whether or not the core
    /// read it (a refused request).
    #[test]
    fn the_pdu_travels_in_the_slot_and_is_dropped_once() {
        let pool = SlotPool::new(2).unwrap();
        let (idx, c) = pool.start(heap(vec![1, 2, 3])).unwrap();
        assert_eq!(pdu(&pool, idx), [1, 2, 3]);
        assert_eq!(pdu(&pool, idx), [1, 2, 3], "read in place, not taken");
        let mut wakes = Vec::new();
        pool.complete_deferred(idx, Ok(Response::local_grant()), None, &mut wakes);
        assert_eq!(wakes, [idx]);
        assert!(c.wait().is_ok());
        // refused before its core took it: the outcome replaces the PDU
        let (idx, c) = pool.start(heap(vec![9; 300])).unwrap();
        pool.complete(idx, Err(Failure::Shutdown));
        assert!(matches!(c.wait(), Err(Failure::Shutdown)));
        assert_eq!(pool.free.len(), 2);
    }

    /// Regression: a slot abandoned after the core marked its decision time kept that
    /// time, and its next request, completed without one (queue full, shutdown),
    /// recorded a completion-wake time measured from the old request's decision.
    #[test]
    fn abandoned_decision_time_does_not_reach_the_next_use() {
        let pool = SlotPool::new(1).unwrap();
        let idx = pool.acquire().unwrap();
        drop(Completion::new(pool.clone(), idx));
        let long_ago = Instant::now() - Duration::from_secs(3);
        pool.complete_deferred(idx, Err(Failure::Shutdown), Some(long_ago), &mut Vec::new());
        let idx = pool.acquire().unwrap();
        let c = Completion::new(pool.clone(), idx);
        pool.complete(idx, Err(Failure::Overloaded));
        assert!(matches!(c.wait(), Err(Failure::Overloaded)));
        assert_eq!(pool.wake_us.count(), 0, "no wake time without a decision");
    }

    #[test]
    fn wait_across_threads_and_abandon() {
        let pool = SlotPool::new(4).unwrap();
        let idx = pool.acquire().unwrap();
        let c = Completion::new(pool.clone(), idx);
        let p2 = pool.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            p2.complete(idx, Err(Failure::Shutdown));
        });
        assert!(matches!(c.wait(), Err(Failure::Shutdown)));
        t.join().unwrap();
        // abandoned before completion: the core's completion frees the slot
        let idx = pool.acquire().unwrap();
        drop(Completion::new(pool.clone(), idx));
        assert_eq!(pool.free.len(), 3);
        pool.complete(idx, Err(Failure::Shutdown));
        assert_eq!(pool.free.len(), 4);
        // exhausted pool
        let all: Vec<u32> = (0..4).map(|_| pool.acquire().unwrap()).collect();
        assert!(pool.acquire().is_none());
        for i in all {
            pool.complete(i, Err(Failure::Shutdown));
            pool.abandon(i);
        }
        assert_eq!(pool.free.len(), 4);
    }
}

#[cfg(feature = "loom")]
pub(crate) mod loom_models {
    use super::*;
    use crate::proto::outcome::{Failure, Response};
    use crate::sync::loom_model;

    const BOUND: usize = 3;

    /// One slot acquired from a pool of two; `caller` and `core` run on two threads
    /// (the model's main thread only joins them: loom's `join` must not see the
    /// unpark of a thread waker).
    fn slot_model(
        name: &str,
        core: impl Fn(&SlotPool, u32) + Sync + Send + 'static,
        caller: impl Fn(&Arc<SlotPool>, Completion) + Sync + Send + 'static,
    ) {
        let (core, caller) = (Arc::new(core), Arc::new(caller));
        loom_model(name, BOUND, move || {
            let pool = SlotPool::new(2).unwrap();
            // the submitter writes the PDU before it queues the request (here: before
            // the core's thread starts, an edge as the queue's push and pop)
            let src = PduSource::Built(PduBuf::Heap(vec![7; 200].into_boxed_slice()));
            let (idx, c) = pool.start(src).unwrap();
            let (p2, core) = (pool.clone(), core.clone());
            let t = loom::thread::spawn(move || core(&p2, idx));
            let (p3, caller) = (pool.clone(), caller.clone());
            let w = loom::thread::spawn(move || caller(&p3, c));
            w.join().unwrap();
            t.join().unwrap();
            assert_eq!(pool.free.len(), 2, "the slot is back on the free list once");
            assert_eq!(pool.slots[idx as usize].state.load(Ordering::Relaxed), FREE);
        });
    }

    fn complete(pool: &SlotPool, idx: u32) {
        pool.complete(idx, Err(Failure::Overloaded));
    }

    /// The core's turn: it reads the PDU (starting the request), later writes the
    /// outcome it polled from its state, and wakes the caller at the end of the turn.
    fn take_then_complete_deferred(pool: &SlotPool, idx: u32) {
        // SAFETY: this thread is the slot's core (the request reached it through the
        // model's spawn edge) and the borrow ends before it completes the slot.
        assert_eq!(unsafe { pool.pdu(idx) }.len(), 200);
        let mut r = Response::local_grant();
        r.sends = 3;
        let mut wakes = Vec::new();
        pool.complete_deferred(idx, Ok(r), Some(Instant::now()), &mut wakes);
        for i in wakes {
            pool.wake(i);
        }
    }

    pub(crate) fn loom_completion_complete_vs_wait() {
        slot_model("complete vs wait", complete, |_, c| {
            assert!(matches!(c.wait(), Err(Failure::Overloaded)));
        });
    }

    pub(crate) fn loom_completion_deferred_wake_vs_wait() {
        slot_model(
            "read PDU, complete, deferred wake vs wait",
            take_then_complete_deferred,
            |_, c| assert_eq!(c.wait().unwrap().sends, 3),
        );
    }

    pub(crate) fn loom_completion_complete_vs_drop() {
        slot_model("complete vs drop", complete, |_, c| drop(c));
    }

    pub(crate) fn loom_completion_deferred_vs_drop() {
        slot_model(
            "read PDU, complete, deferred wake vs drop",
            take_then_complete_deferred,
            |_, c| drop(c),
        );
    }

    pub(crate) fn loom_completion_complete_vs_timeout_then_wait() {
        slot_model("complete vs timeout, then wait", complete, |_, c| {
            let out = match c.try_take() {
                Ok(out) => out,
                Err(c) => c.wait(),
            };
            assert!(matches!(out, Err(Failure::Overloaded)));
        });
    }

    pub(crate) fn loom_completion_complete_vs_timeout_then_drop() {
        slot_model("complete vs timeout, then drop", complete, |_, c| {
            if let Err(c) = c.try_take() {
                drop(c);
            }
        });
    }

    /// The caller takes the outcome and reuses the slot for a second request while the
    /// core's deferred wake-up of the first may still be under way (a spurious wake-up
    /// of the second, which must not lose or duplicate anything).
    pub(crate) fn loom_completion_reuse_vs_late_wake() {
        loom_model("reuse vs late deferred wake", BOUND, || {
            let pool = SlotPool::new(1).unwrap();
            let idx = pool.acquire().unwrap();
            let c = Completion::new(pool.clone(), idx);
            let p2 = pool.clone();
            let t = loom::thread::spawn(move || {
                let mut wakes = Vec::new();
                p2.complete_deferred(idx, Err(Failure::Overloaded), None, &mut wakes);
                for i in wakes {
                    p2.wake(i);
                }
            });
            let p3 = pool.clone();
            let w = loom::thread::spawn(move || {
                assert!(matches!(c.wait(), Err(Failure::Overloaded)));
                let again = p3.acquire().expect("the slot was released");
                assert_eq!(again, idx);
                let c = Completion::new(p3.clone(), again);
                p3.complete(again, Err(Failure::Shutdown));
                assert!(matches!(c.wait(), Err(Failure::Shutdown)));
            });
            w.join().unwrap();
            t.join().unwrap();
            assert_eq!(pool.free.len(), 1);
        });
    }
}
