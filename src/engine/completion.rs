//! Lock-free one-shot completion slots, pooled per engine.
//!
//! Owns: a fixed pool of slots (allocated once at build), each carrying one `Outcome`
//! from the owning core back to the caller (the core may build the response in the slot
//! before it is delivered: a retained round-0 candidate, so the in-flight entry need not
//! hold one): an atomic state, the outcome cell and an
//! `AtomicWaker` (a task waker, or a thread unparker for blocking waits). Slots are
//! reused through a lock-free free list, so a request costs no heap allocation here.
//!
//! Must not touch: request state, sockets, clocks. A core completes a slot exactly once;
//! a caller that gives up (drops its future) abandons the slot and the core frees it.

use std::fmt;
use std::future::Future;
use std::mem::{MaybeUninit, align_of, size_of};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Wake, Waker};

use crate::sync::thread::{self, Thread};
use crate::sync::{ArrayQueue, AtomicU8, AtomicWaker, UnsafeCell};

use super::pdu::PduInline;
use crate::proto::outcome::{Outcome, Response};

const FREE: u8 = 0;
const PENDING: u8 = 1;
const READY: u8 = 2;
const ABANDONED: u8 = 3;

struct Slot {
    state: AtomicU8,
    /// Core side only: `outcome` holds a staged `Ok(Response)` not yet published.
    staged: UnsafeCell<bool>,
    outcome: UnsafeCell<MaybeUninit<Outcome>>,
    /// When the core decided (for the completion-wake measurement).
    decided: UnsafeCell<Option<std::time::Instant>>,
    waker: AtomicWaker,
}

// The request's inline PDU (`super::pdu::PduInline`) lives in the outcome's memory until
// its core starts the request: written by the submitter between `acquire` and queueing
// the request, read by the core when it starts it (the queue's push and pop order the
// two), overwritten by the outcome after. It is plain bytes (no drop), so writing the
// outcome over it needs no care.
const _: () = {
    assert!(size_of::<PduInline>() <= size_of::<Outcome>());
    assert!(align_of::<PduInline>() <= align_of::<Outcome>());
};

// SAFETY: `outcome` and `staged` are written only by the completing core while the state
// is PENDING or ABANDONED (one owner), and `outcome` is read only by the caller after it
// observed READY with Acquire ordering (the core's write happens-before its Release store
// of READY). Before that, the same cell holds the request's PDU, written only by the
// submitter that acquired the slot, before it queues the request, and read only by the
// core that took the request from the queue (the queue's push happens-before its pop).
unsafe impl Sync for Slot {}
// SAFETY: as for `Sync`: the cells hold plain data owned by whichever side the state names.
unsafe impl Send for Slot {}

/// The engine-wide pool of completion slots: where a core's state writes outcomes
/// ([`CoreState`](super::state::CoreState) completes into it; whoever drives the state
/// wakes the callers it names). Public for the simulation and the fuzz target only.
#[doc(hidden)]
pub struct SlotPool {
    slots: Box<[Slot]>,
    free: ArrayQueue<u32>,
    /// Decision to caller-running times (µs), recorded by the callers.
    pub(crate) wake_us: super::stats::AtomicHist,
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
    pub fn new(capacity: usize) -> Option<Arc<SlotPool>> {
        let capacity = capacity.clamp(1, u32::MAX as usize);
        let mut slots = Vec::new();
        slots.try_reserve_exact(capacity).ok()?;
        slots.extend((0..capacity).map(|_| Slot {
            state: AtomicU8::new(FREE),
            staged: UnsafeCell::new(false),
            outcome: UnsafeCell::new(MaybeUninit::uninit()),
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
            wake_us: super::stats::AtomicHist::new(),
        }))
    }

    /// Bytes of one slot (the completion half of an in-flight request's memory).
    pub(crate) fn slot_size() -> usize {
        size_of::<Slot>() + 2 * size_of::<u64>()
    }

    /// Takes a free slot, or `None` when every slot is in use (the engine is overloaded).
    pub fn acquire(&self) -> Option<u32> {
        let idx = self.free.pop()?;
        self.slots[idx as usize]
            .state
            .store(PENDING, Ordering::Relaxed);
        Some(idx)
    }

    /// Submitter side: writes the request's PDU into slot `idx`, which it has just
    /// acquired and not yet queued.
    pub(crate) fn write_pdu<R>(&self, idx: u32, write: impl FnOnce(&mut PduInline) -> R) -> R {
        let slot = &self.slots[idx as usize];
        slot.outcome.with_mut(|o| {
            let p = o.cast::<PduInline>();
            // SAFETY: the slot was acquired by this submitter and its request is not
            // queued yet: nobody else touches the cell (no outcome is in it). The cell
            // is large and aligned enough for a `PduInline` (asserted above), which is
            // written whole first, so the reference below points to initialised bytes.
            unsafe {
                p.write(PduInline::EMPTY);
                write(&mut *p)
            }
        })
    }

    /// Core side: reads the PDU of slot `idx`, whose request this core took from its
    /// queue and has not completed.
    pub(crate) fn with_pdu<R>(&self, idx: u32, read: impl FnOnce(&[u8]) -> R) -> R {
        let slot = &self.slots[idx as usize];
        // SAFETY: the submitter wrote a whole `PduInline` into the cell before queueing
        // the request, and the queue's pop made that write visible here; the cell is
        // overwritten only by this core's outcome for the request, after this read.
        slot.outcome
            .with(|o| read(unsafe { (*o.cast::<PduInline>()).as_slice() }))
    }

    /// Frees slot `idx`; its owner calls this (the caller that took or dropped the
    /// outcome, or the core that completed an abandoned slot).
    fn release(&self, idx: u32) {
        let slot = &self.slots[idx as usize];
        // SAFETY: the releasing side is the slot's only user now. A decision time that
        // nobody read (an abandoned request's) must not reach the slot's next use, whose
        // outcome may come without one (queue full, shutdown).
        slot.decided.with_mut(|d| unsafe { *d = None });
        slot.state.store(FREE, Ordering::Release);
        // Cannot fail: the queue holds every slot index at most once.
        let _ = self.free.push(idx);
    }

    /// Core side: delivers the outcome of slot `idx` (exactly once per acquire). A
    /// response staged earlier is dropped first.
    pub(crate) fn complete(&self, idx: u32, outcome: Outcome) {
        self.complete_to(idx, outcome, None);
    }

    /// [`SlotPool::complete`], with the caller's wake-up deferred into `wakes` when given
    /// (the core wakes its callers once per turn, after its sends: see
    /// [`SlotPool::wake`]).
    pub(crate) fn complete_to(&self, idx: u32, outcome: Outcome, wakes: Option<&mut Vec<u32>>) {
        self.unstage(idx);
        let slot = &self.slots[idx as usize];
        // SAFETY: only the core writes while the slot is PENDING/ABANDONED.
        slot.outcome.with_mut(|o| unsafe { (*o).write(outcome) });
        self.publish(slot, idx, wakes);
    }

    /// Wakes the caller of slot `idx` (a deferred wake-up). If the caller already took
    /// the outcome and the slot serves another request, that caller is woken
    /// spuriously, which futures and blocking waits tolerate (they poll again).
    pub fn wake(&self, idx: u32) {
        self.slots[idx as usize].waker.wake();
    }

    /// Core side: builds the request's response in place, before it is delivered (a
    /// retained round-0 candidate or the selected response), replacing one staged
    /// earlier. The caller does not see it until [`SlotPool::complete_staged`].
    #[cfg(test)]
    pub(crate) fn stage(&self, idx: u32, response: Response) {
        self.stage_with(idx, || response);
    }

    /// [`SlotPool::stage`], the response built by `build` straight into the slot.
    #[inline]
    pub(crate) fn stage_with(&self, idx: u32, build: impl FnOnce() -> Response) {
        self.unstage(idx);
        let slot = &self.slots[idx as usize];
        // SAFETY: only the owning core touches `staged`/`outcome` while PENDING/ABANDONED.
        slot.outcome
            .with_mut(|o| unsafe { (*o).write(Ok(build())) });
        // SAFETY: only the owning core touches this cell while PENDING/ABANDONED (see `stage`).
        slot.staged.with_mut(|st| unsafe { *st = true });
    }

    /// Core side: drops the staged response of slot `idx`, if any.
    pub(crate) fn unstage(&self, idx: u32) {
        let slot = &self.slots[idx as usize];
        // SAFETY: as in `stage`; `staged` says the cell is initialised.
        if slot
            .staged
            // SAFETY: only the owning core touches this cell while PENDING/ABANDONED (see `stage`).
            .with_mut(|st| unsafe { std::mem::replace(&mut *st, false) })
        {
            slot.outcome
                // SAFETY: only the owning core touches this cell while PENDING/ABANDONED (see `stage`).
                .with_mut(|o| unsafe { (*o).assume_init_drop() });
        }
    }

    /// Core side: lets `finish` adjust the staged response, then delivers it. `None`
    /// (nothing delivered) when no response is staged.
    pub(crate) fn complete_staged<R>(
        &self,
        idx: u32,
        wakes: Option<&mut Vec<u32>>,
        finish: impl FnOnce(&mut Response) -> R,
    ) -> Option<R> {
        let slot = &self.slots[idx as usize];
        // SAFETY: as in `stage`; `staged` says the cell holds `Ok(response)`.
        if !slot
            .staged
            // SAFETY: only the owning core touches this cell while PENDING/ABANDONED (see `stage`).
            .with_mut(|st| unsafe { std::mem::replace(&mut *st, false) })
        {
            return None;
        }
        let r = slot
            .outcome
            // SAFETY: only the owning core touches this cell while PENDING/ABANDONED (see `stage`).
            .with_mut(|o| match unsafe { (*o).assume_init_mut() } {
                Ok(resp) => finish(resp),
                Err(_) => unreachable!("only responses are staged"),
            });
        self.publish(slot, idx, wakes);
        Some(r)
    }

    /// Core side: records when the decision was made (`now`, the core's clock), for the
    /// completion-wake measurement; call before completing.
    pub(crate) fn mark_decided(&self, idx: u32, now: std::time::Instant) {
        let slot = &self.slots[idx as usize];
        // SAFETY: only the owning core writes while PENDING/ABANDONED; the caller reads
        // it after observing READY (Acquire).
        slot.decided.with_mut(|d| unsafe { *d = Some(now) });
    }

    /// Marks the written outcome READY and wakes the caller now, or records the slot in
    /// `defer` for a later [`SlotPool::wake`] (an abandoned slot is freed instead).
    fn publish(&self, slot: &Slot, idx: u32, defer: Option<&mut Vec<u32>>) {
        match slot.state.swap(READY, Ordering::AcqRel) {
            ABANDONED => {
                // The caller left: drop the outcome and recycle the slot.
                // SAFETY: written just above, never read by anyone.
                slot.outcome
                    .with_mut(|o| unsafe { (*o).assume_init_drop() });
                self.release(idx);
            }
            _ => match defer {
                Some(w) => w.push(idx),
                None => slot.waker.wake(),
            },
        }
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
        let out = slot.outcome.with(|o| unsafe { (*o).assume_init_read() });
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
            // SAFETY: READY: the core wrote it; nobody else will read it.
            slot.outcome
                .with_mut(|o| unsafe { (*o).assume_init_drop() });
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
    #[doc(hidden)] // for the simulation and the fuzz target: slot `idx`, just acquired
    pub fn new(pool: Arc<SlotPool>, idx: u32) -> Self {
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
        let waker = thread_waker();
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = Pin::new(&mut self).poll(&mut cx) {
                return out;
            }
            thread::park();
        }
    }
}

impl Completion {
    /// Blocks the calling thread until the outcome arrives or `timeout` passes; on
    /// timeout the completion is handed back (wait again, or drop it to abandon).
    #[allow(clippy::result_large_err)] // the completion is handed back, not an error
    pub fn wait_timeout(mut self, timeout: std::time::Duration) -> Result<Outcome, Completion> {
        if let Inner::Ready(out) = &mut self.inner {
            return Ok(out.take().expect("outcome taken once"));
        }
        let deadline = std::time::Instant::now() + timeout;
        let waker = thread_waker();
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(out) = Pin::new(&mut self).poll(&mut cx) {
                return Ok(out);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(self);
            }
            thread::park_timeout(deadline - now);
        }
    }

    /// The outcome if it has arrived, without blocking; else the completion back.
    #[allow(clippy::result_large_err)] // the completion is handed back, not an error
    pub fn try_take(self) -> Result<Outcome, Completion> {
        self.wait_timeout(std::time::Duration::ZERO)
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

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker that unparks the current thread, built once per thread.
#[cfg(not(feature = "loom"))]
pub(crate) fn thread_waker() -> Waker {
    thread_local! {
        static WAKER: Waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    }
    WAKER.with(|w| w.clone())
}

/// A waker that unparks the current (loom) thread; loom threads do not outlive a model's
/// iteration, so it is built per call.
#[cfg(feature = "loom")]
pub(crate) fn thread_waker() -> Waker {
    Waker::from(Arc::new(ThreadWaker(thread::current())))
}

// ---------------------------------------------------------------- oneshot

/// A one-shot channel whose receiver is a future (no runtime needed).
pub(crate) fn futures_oneshot<T: Send + 'static>() -> (OneshotTx<T>, OneshotRx<T>) {
    let inner = Arc::new(OneshotInner {
        value: std::sync::Mutex::new(None),
        waker: atomic_waker::AtomicWaker::new(),
    });
    (OneshotTx(inner.clone()), OneshotRx(inner))
}

struct OneshotInner<T> {
    value: std::sync::Mutex<Option<T>>,
    waker: atomic_waker::AtomicWaker,
}

pub(crate) struct OneshotTx<T>(Arc<OneshotInner<T>>);
pub(crate) struct OneshotRx<T>(Arc<OneshotInner<T>>);

impl<T> OneshotTx<T> {
    pub(crate) fn send(self, v: T) {
        if let Ok(mut g) = self.0.value.lock() {
            *g = Some(v);
        }
        self.0.waker.wake();
    }
}

impl<T> std::future::Future for OneshotRx<T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        self.0.waker.register(cx.waker());
        match self.0.value.lock().ok().and_then(|mut g| g.take()) {
            Some(v) => std::task::Poll::Ready(v),
            None => std::task::Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::outcome::Failure;

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

    #[test]
    fn staged_response_is_replaced_dropped_or_delivered() {
        let pool = SlotPool::new(1).unwrap();
        for abandon in [false, true] {
            let idx = pool.acquire().unwrap();
            let c = Completion::new(pool.clone(), idx);
            pool.stage(idx, Response::local_grant());
            let mut r = Response::local_grant();
            r.sends = 7;
            pool.stage(idx, r);
            if abandon {
                drop(c);
                assert_eq!(pool.complete_staged(idx, None, |r| r.sends), Some(7));
                continue;
            }
            assert!(
                pool.complete_staged(idx, None, |r| {
                    r.completion_sends = 2;
                    r.sends
                }) == Some(7)
            );
            let got = c.wait().unwrap();
            assert_eq!((got.sends, got.completion_sends), (7, 2));
        }
        assert_eq!(pool.free.len(), 1);
        // a staged response dropped by a failure
        let idx = pool.acquire().unwrap();
        let c = Completion::new(pool.clone(), idx);
        pool.stage(idx, Response::local_grant());
        pool.complete(idx, Err(Failure::Shutdown));
        assert!(matches!(c.wait(), Err(Failure::Shutdown)));
        assert!(
            pool.complete_staged(pool.acquire().unwrap(), None, |_| ())
                .is_none()
        );
    }

    /// Regression: a slot abandoned after the core marked its decision time kept that
    /// time, and its next request, completed without one (queue full, shutdown),
    /// recorded a completion-wake time measured from the old request's decision.
    #[test]
    fn abandoned_decision_time_does_not_reach_the_next_use() {
        let pool = SlotPool::new(1).unwrap();
        let idx = pool.acquire().unwrap();
        drop(Completion::new(pool.clone(), idx));
        pool.mark_decided(
            idx,
            std::time::Instant::now() - std::time::Duration::from_secs(3),
        );
        pool.complete(idx, Err(Failure::Shutdown));
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
            std::thread::sleep(std::time::Duration::from_millis(5));
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

/// The slot state machine under loom (`cargo test --features loom --lib loom`): a core
/// thread completes while the caller waits, gives up, or times out and then waits or
/// gives up. After every interleaving the slot is free exactly once and its outcome
/// reached the caller or was dropped.
#[cfg(all(test, feature = "loom"))]
mod loom_tests {
    use super::*;
    use crate::proto::outcome::Failure;
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
            let idx = pool.acquire().unwrap();
            let c = Completion::new(pool.clone(), idx);
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

    /// The core's turn: a staged response finished and published, its wake-up deferred
    /// to the end of the turn.
    fn complete_staged_deferred(pool: &SlotPool, idx: u32) {
        pool.stage(idx, Response::local_grant());
        let mut wakes = Vec::new();
        assert_eq!(
            pool.complete_staged(idx, Some(&mut wakes), |r| {
                r.sends = 3;
            }),
            Some(())
        );
        for i in wakes {
            pool.wake(i);
        }
    }

    #[test]
    fn loom_completion_complete_vs_wait() {
        slot_model("complete vs wait", complete, |_, c| {
            assert!(matches!(c.wait(), Err(Failure::Overloaded)));
        });
    }

    #[test]
    fn loom_completion_deferred_wake_vs_wait() {
        slot_model(
            "staged complete + deferred wake vs wait",
            complete_staged_deferred,
            |_, c| assert_eq!(c.wait().unwrap().sends, 3),
        );
    }

    #[test]
    fn loom_completion_complete_vs_drop() {
        slot_model("complete vs drop", complete, |_, c| drop(c));
    }

    #[test]
    fn loom_completion_staged_vs_drop() {
        slot_model(
            "staged complete + deferred wake vs drop",
            complete_staged_deferred,
            |_, c| drop(c),
        );
    }

    #[test]
    fn loom_completion_complete_vs_timeout_then_wait() {
        slot_model("complete vs timeout, then wait", complete, |_, c| {
            let out = match c.try_take() {
                Ok(out) => out,
                Err(c) => c.wait(),
            };
            assert!(matches!(out, Err(Failure::Overloaded)));
        });
    }

    #[test]
    fn loom_completion_complete_vs_timeout_then_drop() {
        slot_model("complete vs timeout, then drop", complete, |_, c| {
            if let Err(c) = c.try_take() {
                drop(c);
            }
        });
    }

    /// The caller takes the outcome and reuses the slot for a second request while the
    /// core's deferred wake-up of the first may still be under way (a spurious wake-up
    /// of the second, which must not lose or duplicate anything).
    #[test]
    fn loom_completion_reuse_vs_late_wake() {
        loom_model("reuse vs late deferred wake", BOUND, || {
            let pool = SlotPool::new(1).unwrap();
            let idx = pool.acquire().unwrap();
            let c = Completion::new(pool.clone(), idx);
            let p2 = pool.clone();
            let t = loom::thread::spawn(move || {
                let mut wakes = Vec::new();
                p2.complete_to(idx, Err(Failure::Overloaded), Some(&mut wakes));
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
