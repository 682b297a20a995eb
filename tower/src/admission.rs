//! Where decisions come from: the [`Admission`] backend trait, its [`Verdict`], and the
//! engine backend ([`EngineAdmission`]).
//!
//! Owns: turning a [`Consumption`] into one engine request and its outcome into a
//! verdict, and forwarding observed latencies to the engine's coalesced reports.
//! Must not touch: HTTP (requests, responses, status codes) and the failure policy.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use ratelimitly_engine::{Completion, EngineHandle, LatencyTracker, Outcome};

use crate::consumption::Consumption;
use crate::failure::FailureKind;

/// The answer for one consumption.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Everything was consumed: forward the request.
    Granted,
    /// Nothing was consumed. `retry_after` is the service's estimate of when the missing
    /// tokens come back (`None` when only guards failed).
    Rejected {
        /// When to try again.
        retry_after: Option<Duration>,
    },
    /// No decision.
    Failed(FailureKind),
    /// The consumption itself is invalid (a bug of the mapping function).
    Invalid,
}

impl Verdict {
    /// The verdict of an engine outcome.
    pub fn of(outcome: &Outcome) -> Verdict {
        match outcome {
            Ok(r) if r.is_granted() => Verdict::Granted,
            Ok(r) => Verdict::Rejected {
                retry_after: r.retry_after(),
            },
            Err(f) => match FailureKind::of(f) {
                Some(kind) => Verdict::Failed(kind),
                None => Verdict::Invalid,
            },
        }
    }
}

/// A source of decisions. Implemented by [`EngineAdmission`]; `rl-proxy` also implements
/// it over the official `ratelimitly` crate for its benchmark.
pub trait Admission: Clone + Send + Sync + 'static {
    /// The pending decision.
    type Future: Future<Output = Verdict> + Send + 'static;

    /// Asks for `consumption`.
    fn admit(&self, consumption: &Consumption) -> Self::Future;

    /// Reports one observed latency of the protected service to `tracker` (whole
    /// milliseconds, at least 1 ms). Best effort: a report that cannot be queued is
    /// dropped.
    fn report(&self, tracker: &LatencyTracker, observed: Duration);
}

/// The engine as an [`Admission`] backend.
#[derive(Clone)]
pub struct EngineAdmission {
    handle: EngineHandle,
}

impl std::fmt::Debug for EngineAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineAdmission").finish_non_exhaustive()
    }
}

impl EngineAdmission {
    /// Decisions from `handle`'s engine.
    pub fn new(handle: EngineHandle) -> Self {
        EngineAdmission { handle }
    }

    /// The engine handle.
    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }
}

impl Admission for EngineAdmission {
    type Future = EngineDecision;

    fn admit(&self, c: &Consumption) -> EngineDecision {
        let mut b = self.handle.request().metrics_label(c.metrics_label());
        for (r, n) in c.resources() {
            b = b.consume(r, *n);
        }
        for (t, th) in c.guards() {
            b = b.guard(t, *th);
        }
        EngineDecision {
            completion: b.send(),
        }
    }

    fn report(&self, tracker: &LatencyTracker, observed: Duration) {
        if let Err(e) = self.handle.report(tracker, observed) {
            tracing::debug!(error = %e, "latency report not queued");
        }
    }
}

/// A pending engine decision (the engine's [`Completion`], mapped to a [`Verdict`]).
pub struct EngineDecision {
    completion: Completion,
}

impl std::fmt::Debug for EngineDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineDecision").finish_non_exhaustive()
    }
}

impl Future for EngineDecision {
    type Output = Verdict;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Verdict> {
        Pin::new(&mut self.completion)
            .poll(cx)
            .map(|o| Verdict::of(&o))
    }
}

/// `d` in whole milliseconds, rounded up, at least 1 ms (what latency reports carry).
pub fn whole_ms_up(d: Duration) -> Duration {
    let ms = d
        .as_nanos()
        .div_ceil(1_000_000)
        .clamp(1, u128::from(u32::MAX));
    Duration::from_millis(ms as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_up() {
        assert_eq!(whole_ms_up(Duration::ZERO), Duration::from_millis(1));
        assert_eq!(
            whole_ms_up(Duration::from_micros(1)),
            Duration::from_millis(1)
        );
        assert_eq!(
            whole_ms_up(Duration::from_micros(1001)),
            Duration::from_millis(2)
        );
        assert_eq!(
            whole_ms_up(Duration::from_millis(7)),
            Duration::from_millis(7)
        );
    }
}
