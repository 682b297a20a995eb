//! The layer's circuit breaker and its failure log.
//!
//! After [`CircuitBreaker::threshold`] consecutive timeouts or communication failures
//! the breaker opens: requests get the failure policy at once instead of waiting the
//! engine's horizon each, and one request per [`CircuitBreaker::probe_interval`] goes
//! to the service as a probe. The first probe that gets a decision closes the breaker.
//! State and transitions are in the layer's metrics (`ratelimitly_breaker_open`,
//! `ratelimitly_breaker_transitions_total`, `ratelimitly_breaker_short_circuits_total`)
//! and logged at `warn!` both ways (an operator who saw it open sees it close).
//!
//! Failures are logged at `warn!` (`EngineStopped` at `error!`), at most once per
//! [`FAILURE_LOG_INTERVAL`] per kind, with the number left unlogged in between.
//!
//! Owns: the breaker's state machine and the failure log. Must not touch: responses,
//! the engine.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::admission::Verdict;
use crate::failure::FailureKind;
use crate::metrics::LayerMetrics;

/// Failures of one kind are logged at most once per this interval.
pub const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The breaker's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CircuitBreaker {
    threshold: u32,
    probe_interval: Duration,
}

impl Default for CircuitBreaker {
    /// Opens after 5 consecutive timeouts or communication failures, probes every 1 s.
    fn default() -> Self {
        CircuitBreaker {
            threshold: 5,
            probe_interval: Duration::from_secs(1),
        }
    }
}

impl CircuitBreaker {
    /// Opens after `threshold` consecutive failures (at least 1), probes every
    /// `probe_interval`.
    pub fn new(threshold: u32, probe_interval: Duration) -> Self {
        CircuitBreaker {
            threshold: threshold.max(1),
            probe_interval,
        }
    }

    /// Never opens: every request waits for its own decision or failure.
    pub fn disabled() -> Self {
        CircuitBreaker {
            threshold: u32::MAX,
            probe_interval: Duration::from_secs(1),
        }
    }

    /// Consecutive failures that open the breaker.
    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    /// Time between probes while open.
    pub fn probe_interval(&self) -> Duration {
        self.probe_interval
    }
}

/// What to do with one request ([`Breaker::gate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Ask the service (breaker closed).
    Ask,
    /// Ask the service as the breaker's probe.
    Probe,
    /// Don't ask: apply the failure policy for this kind now.
    Open(FailureKind),
}

#[derive(Debug)]
struct State {
    open_kind: Option<FailureKind>,
    next_probe: Instant,
}

/// One breaker's state, shared by the clones of the layer (or the service) that owns it:
/// [`Breaker::gate`] before asking the service, [`Breaker::observe`] with the verdict.
/// The layer runs one of its own; a service that asks the engine without the layer
/// (rl-proxy's rate limit service) runs this one.
#[derive(Debug)]
pub struct Breaker {
    config: CircuitBreaker,
    open: AtomicBool,
    /// Consecutive tripping failures (reset by any decision).
    consecutive: AtomicU32,
    state: Mutex<State>,
}

fn trips(kind: FailureKind) -> bool {
    matches!(
        kind,
        FailureKind::Timeout | FailureKind::Communication | FailureKind::Discovery
    )
}

impl Breaker {
    /// A closed breaker with `config`'s settings.
    pub fn new(config: CircuitBreaker) -> Self {
        Breaker {
            config,
            open: AtomicBool::new(false),
            consecutive: AtomicU32::new(0),
            state: Mutex::new(State {
                open_kind: None,
                next_probe: Instant::now(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether to ask the service for this request: closed, ask; open, answer with the
    /// failure policy at once (counted in `metrics` as a short circuit), except one
    /// request per probe interval, the probe.
    pub fn gate(&self, metrics: &LayerMetrics) -> Gate {
        if !self.open.load(Ordering::Acquire) {
            return Gate::Ask;
        }
        let mut s = self.lock();
        let Some(kind) = s.open_kind else {
            return Gate::Ask;
        };
        let now = Instant::now();
        if now >= s.next_probe {
            s.next_probe = now + self.config.probe_interval;
            return Gate::Probe;
        }
        metrics.record_short_circuit();
        Gate::Open(kind)
    }

    /// Feeds one verdict of a request that was asked (`probe`: as the probe); the
    /// transitions are counted in `metrics` and logged at `warn`.
    pub fn observe(&self, verdict: &Verdict, probe: bool, metrics: &LayerMetrics) {
        if self.config.threshold == u32::MAX {
            return; // disabled
        }
        let failed = match verdict {
            Verdict::Failed(k) if trips(*k) => Some(*k),
            Verdict::Failed(_) | Verdict::Invalid => return,
            _ => None,
        };
        if failed.is_none() && !self.open.load(Ordering::Acquire) {
            // the fast path: a decision with the breaker closed, no lock
            if self.consecutive.load(Ordering::Relaxed) != 0 {
                self.consecutive.store(0, Ordering::Relaxed);
            }
            return;
        }
        let mut s = self.lock();
        match failed {
            Some(kind) => {
                let n = self
                    .consecutive
                    .fetch_add(1, Ordering::Relaxed)
                    .saturating_add(1);
                if s.open_kind.is_none() && n >= self.config.threshold {
                    s.open_kind = Some(kind);
                    s.next_probe = Instant::now() + self.config.probe_interval;
                    self.open.store(true, Ordering::Release);
                    metrics.record_breaker(true);
                    tracing::warn!(
                        failures = n,
                        %kind,
                        probe_every_ms = self.config.probe_interval.as_millis() as u64,
                        "ratelimitly circuit breaker open: the failure policy applies at once until a probe gets a decision"
                    );
                } else if probe {
                    tracing::debug!(%kind, "ratelimitly circuit breaker probe failed");
                }
            }
            None => {
                self.consecutive.store(0, Ordering::Relaxed);
                if s.open_kind.take().is_some() {
                    self.open.store(false, Ordering::Release);
                    metrics.record_breaker(false);
                    tracing::warn!(
                        probe,
                        "ratelimitly circuit breaker closed: the service answers again"
                    );
                }
            }
        }
    }
}

/// Rate-limited failure logging, one slot per kind: at most one line per
/// [`FAILURE_LOG_INTERVAL`] per [`FailureKind`], with the count of unlogged ones.
#[derive(Debug)]
pub struct FailureLog {
    base: Instant,
    /// Per kind: ms since `base` of the last log + 1 (0 = never).
    last: [AtomicU64; FailureKind::ALL.len()],
    suppressed: [AtomicU64; FailureKind::ALL.len()],
}

impl Default for FailureLog {
    fn default() -> Self {
        FailureLog {
            base: Instant::now(),
            last: Default::default(),
            suppressed: Default::default(),
        }
    }
}

impl FailureLog {
    /// Logs one failure of `kind` (rate-limited); `short_circuited`: decided without
    /// asking (an open breaker); `open`: the request is let through.
    pub fn failure(&self, kind: FailureKind, short_circuited: bool, open: bool) {
        let i = FailureKind::ALL
            .iter()
            .position(|k| *k == kind)
            .unwrap_or(0);
        let now = self.base.elapsed().as_millis() as u64 + 1;
        let last = self.last[i].load(Ordering::Relaxed);
        let due = last == 0 || now >= last + FAILURE_LOG_INTERVAL.as_millis() as u64;
        if !due
            || self.last[i]
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            self.suppressed[i].fetch_add(1, Ordering::Relaxed);
            return;
        }
        let unlogged = self.suppressed[i].swap(0, Ordering::Relaxed);
        let action = if open {
            "fail-open: requests are let through unlimited"
        } else {
            "fail-closed: requests are answered 503"
        };
        if kind == FailureKind::EngineStopped {
            tracing::error!(
                %kind,
                unlogged,
                "ratelimitly engine stopped (was the Engine dropped or shut down?); {action}"
            );
        } else {
            tracing::warn!(
                %kind,
                unlogged,
                short_circuited,
                "ratelimitly admission failed (service unreachable or not answering); {action}"
            );
        }
    }
}
