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

use std::sync::Arc;

use ratelimitly_engine::{Completion, Engine, EngineHandle, LatencyTracker};

use crate::consumption::Consumption;
pub use crate::verdict::{Decided, Verdict};

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
///
/// Built from an [`Engine`] or an `Arc<Engine>`, it owns the engine: the engine runs
/// as long as a layer (or a clone) uses it, whatever happens to the application's own
/// value. Built from a bare [`EngineHandle`] it does not, and stops deciding (every
/// request fails with `EngineStopped`) once the engine is dropped.
#[derive(Clone)]
pub struct EngineAdmission {
    handle: EngineHandle,
    _owner: Option<Arc<Engine>>,
}

/// What an engine-backed layer is built from: an [`Engine`] or `Arc<Engine>` (kept
/// alive by the layer), or an [`EngineHandle`] (not kept alive).
#[derive(Clone, Debug)]
pub struct EngineRef {
    handle: EngineHandle,
    owner: Option<Arc<Engine>>,
}

impl EngineRef {
    /// The layer keeps the engine alive.
    pub fn owns(&self) -> bool {
        self.owner.is_some()
    }
}

impl From<Engine> for EngineRef {
    fn from(e: Engine) -> Self {
        Arc::new(e).into()
    }
}

impl From<Arc<Engine>> for EngineRef {
    fn from(e: Arc<Engine>) -> Self {
        EngineRef {
            handle: e.handle(),
            owner: Some(e),
        }
    }
}

impl From<&Arc<Engine>> for EngineRef {
    fn from(e: &Arc<Engine>) -> Self {
        e.clone().into()
    }
}

impl From<EngineHandle> for EngineRef {
    fn from(handle: EngineHandle) -> Self {
        EngineRef {
            handle,
            owner: None,
        }
    }
}

impl std::fmt::Debug for EngineAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineAdmission").finish_non_exhaustive()
    }
}

impl EngineAdmission {
    /// Decisions from `engine` (an [`Engine`] or `Arc<Engine>`, kept alive, or an
    /// [`EngineHandle`], not kept alive).
    pub fn new(engine: impl Into<EngineRef>) -> Self {
        let r = engine.into();
        EngineAdmission {
            handle: r.handle,
            _owner: r.owner,
        }
    }

    /// The layer keeps its engine alive (built from an `Engine` or `Arc<Engine>`).
    pub fn owns_engine(&self) -> bool {
        self._owner.is_some()
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
