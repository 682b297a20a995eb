//! The application-facing handle: submit, report, statistics, memory arithmetic.
//!
//! Owns: [`EngineHandle`]: reports through the one way in (`super::submit`), the
//! statistics readers, membership for tests, memory arithmetic (its request methods,
//! `request`, `submit` and `submit_batch`, are `super::request`'s). Must not touch: the
//! cores' turn, sockets, the encoding of requests.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::completion::SlotPool;
use super::consts::{FLUSH_WAIT, QUEUE_MAX, STATS_POLL, STATS_WAIT};
use super::shared::Shared;
use super::submit::Msg;
use super::submit::Submitter;
use crate::engine::core::{CoreState, Stats};
use crate::proto::ids::LatencyTracker;
use crate::proto::machine::Endpoint;
use crate::proto::outcome::{Failure, Outcome};
use crate::proto::wire::{self, ReportEntry};

/// Submits requests and reports to the engine from any thread or runtime.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) inner: Arc<Shared>,
}

impl fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineHandle")
            .field("cores", &self.inner.intake.queues.len())
            .finish_non_exhaustive()
    }
}

impl EngineHandle {
    /// Reports an observed latency for `tracker` (whole ms), coalesced per core and sent
    /// once to every endpoint of the current membership.
    pub fn report(&self, tracker: &LatencyTracker, observed: Duration) -> Result<(), Failure> {
        let observed_ms =
            crate::proto::ids::latency_ms(observed, crate::proto::ids::LatencyField::Observed)
                .map_err(|e| Failure::Configuration(e.into()))?;
        let mut s = Submitter::enter(&self.inner.intake).ok_or(Failure::Shutdown)?;
        s.report(ReportEntry {
            tracker_id: tracker.id(),
            ttl_ms: tracker.ttl_ms(),
            max_samples: tracker.max_samples(),
            min_samples: tracker.min_samples(),
            observed_ms,
        })
    }

    /// Merged statistics of every core. Never goes through a core's queue: each core
    /// publishes its statistics; this asks for a fresh publication and waits up to
    /// 100 ms for it (a dead or stuck core's last publication is used).
    pub fn stats(&self) -> Stats {
        let mut total = Stats::new();
        for s in self.core_stats() {
            total.merge(&s);
        }
        total.overloaded += self.inner.intake.queue_full.load(Ordering::Relaxed);
        self.inner
            .intake
            .pool
            .wake_us
            .add_to(&mut total.completion_wake_us);
        total
    }

    /// The statistics of each core, as in [`EngineHandle::stats`] (index = core).
    pub fn core_stats(&self) -> Vec<Stats> {
        let sh = &self.inner;
        let before: Vec<u64> = sh
            .published
            .iter()
            .map(|p| p.generation.load(Ordering::Acquire))
            .collect();
        for (p, q) in sh.published.iter().zip(sh.intake.queues.iter()) {
            p.wanted.store(true, Ordering::Relaxed);
            q.wake();
        }
        // a hosted core cannot publish while this blocks the runtime it needs
        let wait = if sh.settings.hosted && tokio::runtime::Handle::try_current().is_ok() {
            Duration::ZERO
        } else {
            STATS_WAIT
        };
        let deadline = Instant::now() + wait;
        for (i, p) in sh.published.iter().enumerate() {
            let q = &sh.intake.queues[i];
            while p.generation.load(Ordering::Acquire) == before[i]
                && !q.dead.load(Ordering::Relaxed)
                && !q.stop.load(Ordering::Relaxed)
                && Instant::now() < deadline
            {
                q.wake();
                std::thread::sleep(STATS_POLL);
            }
        }
        sh.published
            .iter()
            .zip(sh.intake.queues.iter())
            .map(|(p, q)| {
                let mut s = match p.stats.lock() {
                    Ok(g) => g.clone(),
                    Err(e) => e.into_inner().clone(),
                };
                s.dead_cores = u64::from(q.dead.load(Ordering::Relaxed));
                s
            })
            .collect()
    }

    /// Sends every latency report queued so far (by any thread, before this call) at
    /// once instead of at the flush interval, then returns the merged statistics, whose
    /// `report_datagrams` and `report_failures` include those sends.
    pub fn flush_reports(&self) -> Stats {
        let mut total = Stats::new();
        for q in self.inner.intake.queues.iter() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            if q.push(Msg::FlushReports(tx)).is_ok() {
                q.wake();
                if let Ok(s) = rx.recv_timeout(FLUSH_WAIT) {
                    total.merge(&s);
                }
            }
        }
        total.overloaded += self.inner.intake.queue_full.load(Ordering::Relaxed);
        total
    }

    /// Test-only fault hook: makes core `core` panic when it takes the message, as a
    /// bug inside it would. Its requests then fail with `Failure::CoreFailed`.
    #[doc(hidden)]
    pub fn inject_core_fault(&self, core: usize) {
        if let Some(q) = self.inner.intake.queues.get(core) {
            let _ = q.push(Msg::Fault);
            q.wake();
        }
    }

    /// Replaces the endpoint set (as a DNS refresh would). For simulation and tests
    /// with static endpoints.
    #[doc(hidden)]
    pub fn set_endpoints(&self, eps: Vec<Endpoint>) {
        self.inner.membership.store(eps);
    }

    /// Successful DNS refreshes so far (0 with static endpoints).
    pub fn discovery_refreshes(&self) -> u64 {
        self.inner.membership.refreshes.load(Ordering::Relaxed)
    }

    /// DNS refreshes that failed or found no server so far (0 with static endpoints).
    pub fn discovery_refresh_failures(&self) -> u64 {
        self.inner
            .membership
            .refresh_failures
            .load(Ordering::Relaxed)
    }

    /// The current endpoint set.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.inner.membership.snapshot().to_vec()
    }

    /// Memory per in-flight request (bytes of one slab entry).
    pub fn entry_size() -> usize {
        CoreState::entry_size()
    }

    /// Bytes one core preallocates at build for an in-flight limit of `in_flight`: its
    /// state's reservations (slab cells and timer nodes up to 65,536, beyond which they
    /// grow on demand up to the limit; the timer wheel; held responses; outcomes),
    /// completion slots (one per in-flight request and one per queue place) and the
    /// submission queue. Excludes fixed per-core buffers (receive/send batches, about
    /// 200 KiB).
    pub fn memory_per_core(in_flight: usize) -> usize {
        let queue = in_flight.min(QUEUE_MAX);
        CoreState::reserved_bytes(in_flight)
            + (in_flight + queue) * SlotPool::slot_size()
            + queue * (std::mem::size_of::<Msg>() + 8)
    }

    /// Memory per in-flight request counting every structure sized by the in-flight
    /// limit: its slab entry and a held response's cell, its completion slot (the pool
    /// holds one per in-flight request plus one per queue place) and its queue place (a
    /// submission message).
    pub fn bytes_per_in_flight() -> usize {
        CoreState::bytes_per_request() + 2 * SlotPool::slot_size() + std::mem::size_of::<Msg>()
    }
}

const _: () = {
    // The report batch fits one datagram in every mode.
    assert!(wire::MAX_REPORT_ENTRIES <= 34);
};

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync + Clone>() {}
    is::<EngineHandle>();
    let _: fn(Outcome) = |_| {};
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::DEFAULT_IN_FLIGHT;

    #[test]
    fn memory_figures_at_defaults() {
        let per = EngineHandle::bytes_per_in_flight();
        let core = EngineHandle::memory_per_core(DEFAULT_IN_FLIGHT);
        println!(
            "bytes per in-flight request: {per} (slab cell and held response {}, 2 completion \
             slots of {}, queue message {}); memory per core at the default limit of \
             {DEFAULT_IN_FLIGHT}: {core} bytes ({:.1} MiB)",
            CoreState::bytes_per_request(),
            SlotPool::slot_size(),
            std::mem::size_of::<Msg>(),
            core as f64 / (1 << 20) as f64
        );
        assert!(per <= 1024, "{per}");
        assert!(core <= 64 << 20, "{core}");
    }
}
