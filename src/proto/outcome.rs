//! Outcomes of one logical request: a decision ([`Response`], granted or rejected) or a
//! [`Failure`] (no decision), as docs/protocol.md §9 defines them.
//!
//! Owns: [`Decision`], [`Response`] with its per-resource and per-guard results,
//! [`Phase`], [`Failure`] with its [`FailureCategory`], [`CommError`] and the [`Outcome`]
//! alias; building a [`Response`] from a validated response view
//! ([`Response::from_view`], the one place that does). The grant rule itself, "grant
//! exactly when every guard's current latency < threshold and every deficit is 0"
//! (docs/protocol.md §3), is stated once in `wire` ([`wire::grants`], [`wire::guard_passes`]) and
//! applied here.
//! Must not touch: sockets, clocks, wire parsing (callers hand in views that already
//! passed the wire checks, or decoded results), the API key. No error here is string-typed
//! or ever carries key material.

use std::fmt;

use smallvec::SmallVec;

use crate::proto::error::{ConfigError, DiscoveryError};
use crate::proto::wire::{self, GuardView, RateResponseView, ResourceResultView};

/// What Ratelimitly decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Decision {
    /// Everything was consumed.
    Granted,
    /// Nothing was consumed.
    Rejected,
}

/// One resource's result, in the server's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResourceResult {
    /// Bucket id (match it against `Resource::id()`).
    pub bucket_id: [u8; 16],
    /// The bucket's window as echoed by the server, in milliseconds.
    pub window_ms: u32,
    /// Tokens already consumed in the bucket's window.
    pub actual_rate: u32,
    /// 0 if the tokens were available, else the shortfall.
    pub deficit: u16,
}

impl ResourceResult {
    /// The result of one resource result block.
    pub fn from_view(r: &ResourceResultView<'_>) -> Self {
        ResourceResult {
            bucket_id: r.bucket_id(),
            window_ms: r.window_ms(),
            actual_rate: r.actual_rate(),
            deficit: r.deficit(),
        }
    }

    /// The official crate's name for [`ResourceResult::deficit`].
    pub fn tokens_deficit(&self) -> u16 {
        self.deficit
    }

    /// The bucket's window.
    pub fn window(&self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::from(self.window_ms))
    }

    /// How long until `deficit` tokens are expected back, or zero when nothing is
    /// missing.
    ///
    /// The server keeps a sliding window and does not say when its oldest grants leave it,
    /// so the estimate assumes the `actual_rate` tokens of the window were consumed evenly:
    /// `deficit` of them leave the window within `window × deficit / actual_rate`. The
    /// result is never more than one window (after a whole window every token of the
    /// current one has left it) and never less than 1 ms when a deficit exists.
    pub fn retry_after(&self) -> std::time::Duration {
        if self.deficit == 0 {
            return std::time::Duration::ZERO;
        }
        let window = u64::from(self.window_ms.max(1));
        let used = u64::from(self.actual_rate.max(1));
        let ms = (window * u64::from(self.deficit))
            .div_ceil(used)
            .clamp(1, window);
        std::time::Duration::from_millis(ms)
    }
}

/// One latency guard's result, in the server's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GuardResult {
    /// Tracker id (match it against `LatencyTracker::id()`).
    pub tracker_id: [u8; 16],
    /// The threshold as echoed by the server.
    pub threshold_ms: u32,
    /// The tracker's current latency.
    pub current_latency_ms: u32,
    /// `current_latency_ms < threshold_ms` (strict).
    pub passed: bool,
}

impl GuardResult {
    /// A guard result with `passed` computed by the strict rule.
    pub fn new(tracker_id: [u8; 16], threshold_ms: u32, current_latency_ms: u32) -> Self {
        GuardResult {
            tracker_id,
            threshold_ms,
            current_latency_ms,
            passed: wire::guard_passes(threshold_ms, current_latency_ms),
        }
    }

    /// The result of one guard result block (`passed` by the strict rule).
    pub fn from_view(g: &GuardView<'_>) -> Self {
        GuardResult::new(g.tracker_id(), g.threshold_ms(), g.current_latency_ms())
    }
}

/// When the selected response was received.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// During round `k` (0 = the initial round, 1..=N = replay rounds).
    Round(u16),
    /// During the final receive phase.
    Final,
    /// Decided locally without any send (empty request).
    Local,
}

/// A response's per-resource or per-guard results, in the server's order: a slice (it
/// derefs to `[T]`), stored inline for up to two entries.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Results<T>(SmallVec<[T; 2]>);

impl<T> Results<T> {
    /// No results.
    pub fn new() -> Self {
        Results(SmallVec::new())
    }
}

impl<T> std::ops::Deref for Results<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> FromIterator<T> for Results<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Results(iter.into_iter().collect())
    }
}

impl<'a, T> IntoIterator for &'a Results<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T: fmt::Debug> fmt::Debug for Results<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.0.iter()).finish()
    }
}

/// A decision with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// Granted or rejected.
    pub decision: Decision,
    /// The server whose response was selected; `None` for a local grant.
    pub server_id: Option<u64>,
    /// When the selected response arrived.
    pub phase: Phase,
    /// Per-resource results in the server's order.
    pub resources: Results<ResourceResult>,
    /// Per-guard results in the server's order.
    pub guards: Results<GuardResult>,
    /// Request datagrams handed to the network, completion deliveries included (sends
    /// reported failed through `transmit_failed` are not counted).
    pub sends: u32,
    /// Of `sends`, the completion deliveries.
    pub completion_sends: u32,
    /// The selected response's steering byte was 1 ("keep the source port"); `true` for a
    /// local grant.
    pub steering_keep: bool,
}

impl Response {
    /// The outcome of an empty request (no resources, no guards): granted locally, nothing
    /// sent, no server id.
    pub fn local_grant() -> Self {
        Response {
            decision: Decision::Granted,
            server_id: None,
            phase: Phase::Local,
            resources: Results::new(),
            guards: Results::new(),
            sends: 0,
            completion_sends: 0,
            steering_keep: true,
        }
    }

    /// A response from a server's results. The decision is a grant exactly when every
    /// guard passed and every deficit is 0 (zero entries = grant). `sends` and
    /// `completion_sends` start at 0 (the request machine fills them in).
    pub fn from_results(
        server_id: u64,
        steering: u8,
        phase: Phase,
        guards: impl IntoIterator<Item = GuardResult>,
        resources: impl IntoIterator<Item = ResourceResult>,
    ) -> Self {
        let guards: Results<GuardResult> = guards.into_iter().collect();
        let resources: Results<ResourceResult> = resources.into_iter().collect();
        let granted = wire::grants(
            guards.iter().map(|g| g.passed),
            resources.iter().map(|r| r.deficit),
        );
        Response {
            decision: if granted {
                Decision::Granted
            } else {
                Decision::Rejected
            },
            server_id: Some(server_id),
            phase,
            resources,
            guards,
            sends: 0,
            completion_sends: 0,
            steering_keep: steering != 0,
        }
    }

    /// The response a server sent, from its validated rate response view: server id and
    /// steering byte from its tenant TLV, `phase` from the request machine's verdict.
    /// Results keep the server's order; the decision follows the grant rule. `sends` and
    /// `completion_sends` start at 0. The one place a view becomes a [`Response`].
    pub fn from_view(
        server_id: u64,
        steering: u8,
        phase: Phase,
        view: &RateResponseView<'_>,
    ) -> Self {
        Response::from_results(
            server_id,
            steering,
            phase,
            view.guards().map(|g| GuardResult::from_view(&g)),
            view.resources().map(|r| ResourceResult::from_view(&r)),
        )
    }

    /// `decision == Granted`.
    pub fn is_granted(&self) -> bool {
        self.decision == Decision::Granted
    }

    /// The decision (accessor named as in the official crate).
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The server whose response was selected (accessor named as in the official crate).
    pub fn selected_server_id(&self) -> Option<u64> {
        self.server_id
    }

    /// Per-resource results (accessor named as in the official crate).
    pub fn resource_results(&self) -> &[ResourceResult] {
        &self.resources
    }

    /// Per-guard results (accessor named as in the official crate).
    pub fn guard_results(&self) -> &[GuardResult] {
        &self.guards
    }

    /// How long a rejected caller should wait before trying again: the largest
    /// [`ResourceResult::retry_after`] of the resources with a deficit. `None` for a grant,
    /// and for a rejection by guards only (the server says nothing about when latency
    /// recovers).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        if self.is_granted() {
            return None;
        }
        self.resources
            .iter()
            .filter(|r| r.deficit > 0)
            .map(ResourceResult::retry_after)
            .max()
    }
}

/// Why no datagram could be sent.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum CommError {
    /// Every datagram of round 0 failed to send (`endpoints` endpoints were tried).
    #[error("no datagram of round 0 could be sent ({endpoints} endpoints tried)")]
    AllSendsFailed {
        /// Endpoints tried.
        endpoints: u32,
    },
    /// The operating system's random number generator failed, so nothing was sent.
    #[error("random number generator failed; nothing was sent")]
    Rng,
    /// A socket could not be created or bound.
    #[error("socket error: {0:?}")]
    Socket(std::io::ErrorKind),
}

/// No decision was made. A failure is not a rejection and does not prove that nothing
/// was consumed.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Key, request, tracker or policy invalid; found before any send.
    #[error("configuration failure: {0}")]
    Configuration(#[from] ConfigError),
    /// No server is known.
    #[error("discovery failure: {0}")]
    Discovery(#[from] DiscoveryError),
    /// No datagram could be sent at all.
    #[error("communication failure: {0}")]
    Communication(#[from] CommError),
    /// The horizon passed without a valid response.
    #[error("timeout: no valid response within the {horizon_ms} ms horizon")]
    Timeout {
        /// The horizon H in milliseconds.
        horizon_ms: u32,
    },
    /// The engine refused the request (in-flight limit / queue full).
    #[error("engine overloaded: request not admitted")]
    Overloaded,
    /// The engine shut down before the request was decided.
    #[error("engine shut down before a decision")]
    Shutdown,
    /// The engine core that held the request stopped after an internal fault (a bug):
    /// its requests fail with this, and it takes no new work. Category `Shutdown`
    /// (the engine, or that part of it, is stopped).
    #[error("engine core {core} failed before a decision")]
    CoreFailed {
        /// Index of the failed core.
        core: usize,
    },
}

/// The category of a [`Failure`].
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureCategory {
    /// [`Failure::Configuration`].
    Configuration,
    /// [`Failure::Discovery`].
    Discovery,
    /// [`Failure::Communication`].
    Communication,
    /// [`Failure::Timeout`].
    Timeout,
    /// [`Failure::Overloaded`].
    Overloaded,
    /// [`Failure::Shutdown`] and [`Failure::CoreFailed`]: the engine is stopped.
    Shutdown,
}

impl Failure {
    /// The failure's category.
    pub fn category(&self) -> FailureCategory {
        match self {
            Failure::Configuration(_) => FailureCategory::Configuration,
            Failure::Discovery(_) => FailureCategory::Discovery,
            Failure::Communication(_) => FailureCategory::Communication,
            Failure::Timeout { .. } => FailureCategory::Timeout,
            Failure::Overloaded => FailureCategory::Overloaded,
            Failure::Shutdown | Failure::CoreFailed { .. } => FailureCategory::Shutdown,
        }
    }
}

/// The result of one logical request.
pub type Outcome = Result<Response, Failure>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_rule() {
        let g = |t, c| GuardResult::new([1; 16], t, c);
        let r = |d| ResourceResult {
            bucket_id: [2; 16],
            window_ms: 1000,
            actual_rate: 5,
            deficit: d,
        };
        let none: [GuardResult; 0] = [];
        let no_res: [ResourceResult; 0] = [];
        assert!(Response::from_results(1, 1, Phase::Final, none, no_res).is_granted());
        assert!(Response::from_results(1, 1, Phase::Final, [g(10, 9)], [r(0)]).is_granted());
        assert!(!Response::from_results(1, 1, Phase::Final, [g(10, 10)], [r(0)]).is_granted());
        assert!(!Response::from_results(1, 1, Phase::Final, [g(10, 9)], [r(1)]).is_granted());
        let resp = Response::from_results(7, 0, Phase::Round(1), [g(10, 9)], [r(0), r(0)]);
        assert_eq!(resp.server_id, Some(7));
        assert!(!resp.steering_keep);
        assert_eq!(resp.resources.len(), 2);
        let local = Response::local_grant();
        assert_eq!(
            (local.phase, local.server_id, local.sends),
            (Phase::Local, None, 0)
        );
    }

    #[test]
    fn retry_after_from_window_and_deficit() {
        let r = |window_ms, actual_rate, deficit| ResourceResult {
            bucket_id: [2; 16],
            window_ms,
            actual_rate,
            deficit,
        };
        assert_eq!(r(1000, 10, 0).retry_after(), std::time::Duration::ZERO);
        // 10 tokens per 60 s consumed evenly: 1 token back after 6 s.
        assert_eq!(r(60_000, 10, 1).retry_after().as_millis(), 6000);
        // A deficit larger than what was consumed: at most one window.
        assert_eq!(r(1000, 2, 5).retry_after().as_millis(), 1000);
        // Nothing consumed (request larger than the limit): one window.
        assert_eq!(r(1000, 0, 3).retry_after().as_millis(), 1000);
        assert_eq!(r(0, 0, 3).retry_after().as_millis(), 1);
        let resp =
            Response::from_results(1, 1, Phase::Final, [], [r(60_000, 10, 1), r(1000, 5, 5)]);
        assert_eq!(resp.retry_after().map(|d| d.as_millis()), Some(6000));
        assert_eq!(resp.decision(), Decision::Rejected);
        assert_eq!(resp.selected_server_id(), Some(1));
        assert_eq!(resp.resource_results()[1].tokens_deficit(), 5);
        let ok = Response::from_results(1, 1, Phase::Final, [], [r(1000, 1, 0)]);
        assert_eq!(ok.retry_after(), None);
    }

    #[test]
    fn categories_and_display() {
        let f = Failure::Timeout { horizon_ms: 60 };
        assert_eq!(f.category(), FailureCategory::Timeout);
        assert!(f.to_string().contains("60 ms"));
        let c = Failure::from(CommError::AllSendsFailed { endpoints: 2 });
        assert_eq!(c.category(), FailureCategory::Communication);
        assert_eq!(Failure::Shutdown.category(), FailureCategory::Shutdown);
        assert_eq!(Failure::Overloaded.category(), FailureCategory::Overloaded);
        let e: &dyn std::error::Error = &c;
        assert!(e.source().is_some());
    }
}
