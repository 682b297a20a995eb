//! The synchronisation primitives of the engine's lock-free code, from one place, so
//! that a model checker can stand in for them.
//!
//! In a normal build every item here is a plain re-export of the type the code used
//! before (`std::sync::atomic`, `std::thread`, `atomic_waker::AtomicWaker`,
//! `crossbeam_queue::ArrayQueue`) or, for [`UnsafeCell`], a `#[repr(transparent)]`
//! wrapper over `std::cell::UnsafeCell` whose `with`/`with_mut` are inlined closures over
//! `get()`: the code compiles to what it was, with no overhead.
//!
//! With the cargo feature `loom` they are [loom]'s instead, and the models in the
//! `loom_models` modules explore every interleaving (up to a preemption bound) of the
//! real code:
//!
//! - `engine::runtime::completion`: one completion slot, complete vs wait vs drop vs
//!   timeout;
//! - `udp::wake`: the waker's pending/parked handshake, wake vs park (no lost wake-up);
//! - `engine::runtime::submit::Gate`: shutdown vs submit (no request accepted after close
//!   and left unfinished).
//!
//! [`crate::loom_models`] lists them; the crate in `loom/` (a workspace of its own, so
//! that the feature reaches only its build) runs them all. Run them with (this is the
//! line in `.ci/run`):
//!
//! ```text
//! cd loom && CARGO_TARGET_DIR=../target cargo test
//! ```
//!
//! ## Why a cargo feature and not `--cfg loom`
//!
//! `--cfg loom` in `RUSTFLAGS` applies to every crate of the build: tokio, crossbeam,
//! atomic-waker and others switch their own code paths on it (tokio then expects to
//! run under loom and does not build that way from outside), and changing `RUSTFLAGS`
//! invalidates the whole build cache, so CI would compile every dependency twice. A
//! feature of this crate changes only this crate; `loom/` builds it without default
//! features, the dependencies built with the same features for the tests are reused,
//! and loom itself is an optional dependency that a normal build never compiles.
//!
//! The feature is for the models only: under it the slots, wakers and gates only work
//! inside `loom::model`, so the rest of the test suite (and `--all-features`) is not
//! meant to run with it on. Loom does not model time: in that build
//! [`thread::park_timeout`] is a yield (a spurious wake-up, which every caller
//! tolerates), and the models time out with a zero timeout (`Completion::try_take`).
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(feature = "loom"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};

#[cfg(feature = "loom")]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};

#[cfg(not(feature = "loom"))]
pub(crate) use atomic_waker::AtomicWaker;

#[cfg(not(feature = "loom"))]
pub(crate) use crossbeam_queue::ArrayQueue;

/// Threads: park/unpark and yields of the lock-free code.
pub(crate) mod thread {
    #[cfg(not(feature = "loom"))]
    pub(crate) use std::thread::{Thread, current, park, park_timeout, yield_now};

    #[cfg(feature = "loom")]
    pub(crate) use loom::thread::{Thread, current, park, yield_now};

    /// Loom has no time: a timed park is a yield (a spurious wake-up).
    #[cfg(feature = "loom")]
    pub(crate) fn park_timeout(_: std::time::Duration) {
        yield_now();
    }
}

/// A task waker that unparks the current thread: what a blocking wait (`Completion::wait`)
/// polls its future with.
struct ThreadWaker(thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker that unparks the current thread, built once per thread.
#[cfg(not(feature = "loom"))]
pub(crate) fn thread_waker() -> std::task::Waker {
    thread_local! {
        static WAKER: std::task::Waker =
            std::task::Waker::from(std::sync::Arc::new(ThreadWaker(thread::current())));
    }
    WAKER.with(|w| w.clone())
}

/// A waker that unparks the current (loom) thread; loom threads do not outlive a model's
/// iteration, so it is built per call.
#[cfg(feature = "loom")]
pub(crate) fn thread_waker() -> std::task::Waker {
    std::task::Waker::from(std::sync::Arc::new(ThreadWaker(thread::current())))
}

/// `std::cell::UnsafeCell` with loom's access API (`with_mut`; the engine's cells are
/// only ever accessed by their one owner at a time, so every access is a `with_mut`),
/// so that loom can check each access against the happens-before order.
#[cfg(not(feature = "loom"))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(feature = "loom"))]
impl<T> UnsafeCell<T> {
    #[inline(always)]
    pub(crate) const fn new(v: T) -> UnsafeCell<T> {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// Writes through the pointer (the caller upholds the aliasing rules).
    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(feature = "loom")]
pub(crate) use loom::cell::UnsafeCell;

/// `atomic_waker::AtomicWaker`'s API over loom's.
#[cfg(feature = "loom")]
#[derive(Debug, Default)]
pub(crate) struct AtomicWaker(loom::future::AtomicWaker);

#[cfg(feature = "loom")]
impl AtomicWaker {
    pub(crate) fn new() -> AtomicWaker {
        AtomicWaker(loom::future::AtomicWaker::new())
    }

    pub(crate) fn register(&self, waker: &std::task::Waker) {
        self.0.register_by_ref(waker);
    }

    pub(crate) fn wake(&self) {
        self.0.wake();
    }
}

/// `crossbeam_queue::ArrayQueue`'s API (the part the engine uses) over a loom mutex:
/// the same release/acquire edges from a push to the pop that takes the value.
#[cfg(feature = "loom")]
#[derive(Debug)]
pub(crate) struct ArrayQueue<T> {
    q: loom::sync::Mutex<std::collections::VecDeque<T>>,
    cap: usize,
}

#[cfg(feature = "loom")]
impl<T> ArrayQueue<T> {
    pub(crate) fn new(cap: usize) -> ArrayQueue<T> {
        ArrayQueue {
            q: loom::sync::Mutex::new(std::collections::VecDeque::with_capacity(cap)),
            cap,
        }
    }

    /// The engine's free lists never fill up (each index is in at most once): a push
    /// into a full one is a slot released twice, which the models must see.
    pub(crate) fn push(&self, v: T) -> Result<(), T> {
        let mut q = self.q.lock().unwrap();
        assert!(
            q.len() < self.cap,
            "free list overflow: a slot released twice"
        );
        q.push_back(v);
        Ok(())
    }

    pub(crate) fn pop(&self) -> Option<T> {
        self.q.lock().unwrap().pop_front()
    }

    #[allow(dead_code)] // used by the tests
    pub(crate) fn len(&self) -> usize {
        self.q.lock().unwrap().len()
    }
}

/// Runs one model over every interleaving within `preemption_bound` preemptions and
/// prints how many executions loom explored, and in what time.
#[cfg(feature = "loom")]
pub(crate) fn loom_model(
    name: &str,
    preemption_bound: usize,
    f: impl Fn() + Sync + Send + 'static,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemption_bound);
    let t0 = std::time::Instant::now();
    b.check(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        f();
    });
    eprintln!(
        "loom model {name}: {} executions, preemption bound {preemption_bound}, {:.2?}",
        runs.load(Ordering::Relaxed),
        t0.elapsed()
    );
}

/// A point of the single total order of `SeqCst` operations, between a `SeqCst` store
/// (or read-modify-write) and a `SeqCst` load of another atomic, as in the handshakes
/// of `udp::wake` and `engine::runtime::submit::Gate` (each side writes its flag, then reads the
/// other's).
///
/// A no-op in a normal build: the two `SeqCst` accesses are already in that order, so
/// whichever side comes second sees the other's write. Loom regards `SeqCst` accesses
/// as `AcqRel` (its documented limitation, a source of false alarms for exactly this
/// pattern) but models `fence(SeqCst)`; under the `loom` feature this is that fence,
/// which gives the models the guarantee the real memory model gives the code.
#[inline(always)]
pub(crate) fn seq_cst_point() {
    #[cfg(feature = "loom")]
    loom::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}
