//! The state shared by the application-facing handle and the cores.
//!
//! Owns: [`Shared`] (the intake: per-core queues and completion pool; the membership, the
//! validated settings the handle and the cores read), its allocation from a validated
//! configuration (every per-core structure, before any I/O), and each core's
//! [`Published`] statistics with their publication. Must not touch: sockets, threads, clocks.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::completion::SlotPool;
use super::config::{BuildError, CoreSettings, Source, Validated};
use super::consts::{GATE_PATIENCE, QUEUE_MAX};
use super::membership::Membership;
use super::submit::{CoreQueue, Intake};
use crate::engine::core::{CoreState, Stats};
use crate::proto::machine::Plan;
use crate::proto::policy::RequestPolicy;
use crate::proto::wire::Auth;

/// State shared by the handle and the cores.
pub(crate) struct Shared {
    /// The gate, the per-core queues and the completion slots.
    pub intake: Intake,
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
}

/// One core's published statistics.
pub(super) struct Published {
    pub(super) stats: Mutex<Stats>,
    /// Bumped at every publication.
    pub(super) generation: AtomicU64,
    /// A reader wants a fresh snapshot.
    pub(super) wanted: AtomicBool,
}

impl Shared {
    /// Allocates every per-core structure of a validated configuration, starting no
    /// thread and opening no socket: the state the handle and the cores share.
    pub(super) fn new(cfg: &Validated) -> Result<Arc<Shared>, BuildError> {
        let auth = Auth::new(&cfg.key);
        let n = cfg.cpus.len();
        let queue_cap = cfg.core.in_flight_per_core.min(QUEUE_MAX);
        let mut queues = Vec::new();
        queues
            .try_reserve_exact(n)
            .map_err(|_| BuildError::OutOfMemory)?;
        for _ in 0..n {
            queues.push(CoreQueue::new(queue_cap).map_err(|e| BuildError::Socket(e.kind()))?);
        }
        let slots = n
            .checked_mul(cfg.core.in_flight_per_core + queue_cap)
            .ok_or(BuildError::OutOfMemory)?;
        let pool = SlotPool::new(slots).ok_or(BuildError::OutOfMemory)?;
        let membership = match &cfg.source {
            Source::Static(eps) => Membership::new(eps.clone()),
            #[cfg(feature = "dns")]
            Source::Dns { .. } => Membership::new(Vec::new()),
        };
        let published = (0..n)
            .map(|_| Published {
                stats: Mutex::new(Stats::new()),
                generation: AtomicU64::new(0),
                wanted: AtomicBool::new(false),
            })
            .collect();
        Ok(Arc::new(Shared {
            intake: Intake::new(queues.into_boxed_slice(), pool),
            membership,
            max_pdu: auth.max_pdu_len(),
            auth,
            horizon_ms: cfg.policy.horizon_ms(),
            window_limit_ms: cfg.key.quotas().rate_window_size_ms_max,
            plan: Plan::new(&cfg.policy),
            policy: cfg.policy.clone(),
            settings: cfg.core,
            published,
        }))
    }

    /// Refuses new submissions (they fail with `Shutdown`), then waits (at most
    /// [`GATE_PATIENCE`]) for the submitters that passed the closed check before it.
    pub(super) fn close_to_submitters(&self) {
        self.intake.gate.close(GATE_PATIENCE);
    }

    /// True when a reader asked core `i` for a fresh snapshot (the core checks once per
    /// turn; it also publishes unasked every
    /// [`PUBLISH_EVERY`](super::consts::PUBLISH_EVERY) by its own clock).
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
