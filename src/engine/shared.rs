//! The state shared by the application-facing handle and the cores.
//!
//! Owns: [`Shared`] (the per-core queues, the completion pool, the membership, the
//! validated settings the handle and the cores read) and each core's [`Published`]
//! statistics with their publication. Must not touch: sockets, threads, clocks.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::completion::SlotPool;
use super::config::CoreSettings;
use super::membership::Membership;
use super::state::CoreState;
use super::stats::Stats;
use super::submit::{CoreQueue, Gate};
use crate::proto::machine::Plan;
use crate::proto::policy::RequestPolicy;
use crate::proto::wire::Auth;

/// State shared by the handle and the cores.
pub(crate) struct Shared {
    pub queues: Box<[CoreQueue]>,
    pub pool: Arc<SlotPool>,
    pub membership: Arc<Membership>,
    pub auth: Auth,
    pub policy: RequestPolicy,
    /// The policy's constants as the cores' request machines take them.
    pub plan: Plan,
    pub horizon_ms: u32,
    pub window_limit_ms: u32,
    pub max_pdu: usize,
    /// The validated settings the cores and the handle read.
    pub settings: CoreSettings,
    /// The statistics each core published last (read without asking the core).
    pub(super) published: Box<[Published]>,
    pub(super) gate: Gate,
    pub(super) queue_full: AtomicU64,
    pub(super) next_thread: AtomicUsize,
}

/// One core's published statistics.
pub(super) struct Published {
    pub(super) stats: Mutex<Stats>,
    /// Bumped at every publication.
    pub(super) generation: AtomicU64,
    /// A reader wants a fresh snapshot.
    pub(super) wanted: AtomicBool,
}

/// How often a busy core publishes its statistics unasked.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

impl Shared {
    /// Refuses new submissions (they fail with `Shutdown`), then waits (at most 5 s) for
    /// the submitters that passed the closed check before it.
    pub(super) fn close_to_submitters(&self) {
        self.gate.close(Duration::from_secs(5));
    }

    /// True when a reader asked core `i` for a fresh snapshot (the core checks once per
    /// turn; it also publishes unasked every [`PUBLISH_EVERY`] by its own clock).
    pub(crate) fn stats_wanted(&self, i: usize) -> bool {
        self.published[i].wanted.load(Ordering::Relaxed)
    }

    /// Publishes core `i`'s statistics now; false when a reader held the lock (the core
    /// tries again next turn, never waits).
    pub(crate) fn publish_stats(
        &self,
        i: usize,
        state: &CoreState,
        io: Option<&crate::udp::IoStats>,
    ) -> bool {
        self.publish(i, state, io, true)
    }

    /// [`publish_stats`](Self::publish_stats), the histograms only when `histograms`.
    pub(crate) fn publish(
        &self,
        i: usize,
        state: &CoreState,
        io: Option<&crate::udp::IoStats>,
        histograms: bool,
    ) -> bool {
        let p = &self.published[i];
        if let Ok(mut s) = p.stats.try_lock() {
            if histograms {
                s.copy_from(state.stats());
            } else {
                s.copy_counters_from(state.stats());
            }
            match (&mut s.io, io) {
                (Some(a), Some(b)) => a.clone_from(b),
                (a, b) => *a = b.cloned(),
            }
            s.in_flight = state.in_flight() as u64;
            s.sockets = state.sockets() as u64;
            drop(s);
            p.wanted.store(false, Ordering::Relaxed);
            p.generation.fetch_add(1, Ordering::Release);
            return true;
        }
        false
    }
}
