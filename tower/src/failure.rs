//! What the layer does when the service gives no decision: the failure kinds and the
//! per-layer policy (forward = fail-open, `503` = fail-closed).
//!
//! Owns: [`FailureKind`], [`OnFailure`], [`FailurePolicy`] and the mapping from the
//! engine's [`Failure`] to a kind. Must not touch: responses, the engine.
//!
//! # The default, and why
//!
//! [`FailurePolicy::default()`] forwards (fail-open) on timeout, discovery,
//! communication, engine-stopped and no-client-address failures, and answers `503` (fail-closed) on
//! overload:
//!
//! - A timeout, a discovery or a communication failure says that the rate-limit service
//!   could not be asked, not that the limit was reached. Answering `503` would turn an
//!   outage of the limiter into an outage of every service behind the proxy, while the
//!   limiter exists to protect those services from excess, not to be a second point of
//!   failure. The same holds for an engine that was stopped (a proxy draining at
//!   shutdown keeps serving what it already accepted).
//! - Overload is different: the local engine refused the request because its queue or
//!   in-flight table is full. That only happens under a burst far above what the engine
//!   is sized for, which is exactly the traffic a limiter must not wave through; shedding
//!   it with `503` keeps the upstream and the proxy itself alive.
//!
//! Any kind can be changed per layer ([`FailurePolicy::set`]); [`FailurePolicy::open`]
//! and [`FailurePolicy::closed`] set all kinds at once (what `rl-proxy --on-failure`
//! does).

use std::fmt;
use std::str::FromStr;

use ratelimitly_engine::{Failure, FailureCategory};

/// Why no decision came back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// No valid response within the request policy's horizon.
    Timeout,
    /// The engine refused the request (queue or in-flight table full).
    Overload,
    /// No service endpoint is known (DNS failed or found nothing).
    Discovery,
    /// Nothing could be sent (socket or random-number failure).
    Communication,
    /// The engine was shut down.
    EngineStopped,
    /// The request has no client address to key its bucket by ([`crate::KeyBy::ClientIp`]
    /// found no `ConnectInfo`, `ClientAddr` or `SocketAddr` extension). The service is
    /// not asked: such requests never share one bucket.
    NoClientAddr,
}

impl FailureKind {
    /// Every kind, in a fixed order.
    pub const ALL: [FailureKind; 6] = [
        FailureKind::Timeout,
        FailureKind::Overload,
        FailureKind::Discovery,
        FailureKind::Communication,
        FailureKind::EngineStopped,
        FailureKind::NoClientAddr,
    ];

    /// The kind of an engine failure; `None` for a configuration failure (an invalid
    /// request is a bug of the mapping function, answered `500` whatever the policy).
    pub fn of(failure: &Failure) -> Option<FailureKind> {
        match failure.category() {
            FailureCategory::Timeout => Some(FailureKind::Timeout),
            FailureCategory::Overloaded => Some(FailureKind::Overload),
            FailureCategory::Discovery => Some(FailureKind::Discovery),
            FailureCategory::Shutdown => Some(FailureKind::EngineStopped),
            FailureCategory::Configuration => None,
            // a category added later: the service could not be asked
            _ => Some(FailureKind::Communication),
        }
    }

    /// Short lowercase name (used as the metrics `outcome` label).
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::Timeout => "timeout",
            FailureKind::Overload => "overloaded",
            FailureKind::Discovery => "discovery",
            FailureKind::Communication => "communication",
            FailureKind::EngineStopped => "stopped",
            FailureKind::NoClientAddr => "no_client_addr",
        }
    }
}

impl fmt::Display for FailureKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What to do with a request whose admission failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OnFailure {
    /// Forward it to the inner service (fail-open).
    Open,
    /// Answer `503 Service Unavailable` (fail-closed).
    Closed,
}

impl FromStr for OnFailure {
    type Err = String;

    /// `open` or `closed`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "open" => Ok(OnFailure::Open),
            "closed" => Ok(OnFailure::Closed),
            _ => Err("on-failure must be open or closed".to_owned()),
        }
    }
}

/// The action for each [`FailureKind`]. See the module docs for the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FailurePolicy {
    actions: [OnFailure; 6],
}

impl Default for FailurePolicy {
    fn default() -> Self {
        FailurePolicy::open().set(FailureKind::Overload, OnFailure::Closed)
    }
}

impl FailurePolicy {
    /// Every kind forwards.
    pub const fn open() -> Self {
        FailurePolicy {
            actions: [OnFailure::Open; 6],
        }
    }

    /// Every kind answers `503`.
    pub const fn closed() -> Self {
        FailurePolicy {
            actions: [OnFailure::Closed; 6],
        }
    }

    /// Every kind does `action`.
    pub const fn all(action: OnFailure) -> Self {
        FailurePolicy {
            actions: [action; 6],
        }
    }

    /// Sets the action of one kind.
    pub fn set(mut self, kind: FailureKind, action: OnFailure) -> Self {
        self.actions[Self::index(kind)] = action;
        self
    }

    /// The action of one kind.
    pub fn action(&self, kind: FailureKind) -> OnFailure {
        self.actions[Self::index(kind)]
    }

    fn index(kind: FailureKind) -> usize {
        match kind {
            FailureKind::Timeout => 0,
            FailureKind::Overload => 1,
            FailureKind::Discovery => 2,
            FailureKind::Communication => 3,
            FailureKind::EngineStopped => 4,
            FailureKind::NoClientAddr => 5,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_open_except_overload() {
        let p = FailurePolicy::default();
        for k in FailureKind::ALL {
            let want = if k == FailureKind::Overload {
                OnFailure::Closed
            } else {
                OnFailure::Open
            };
            assert_eq!(p.action(k), want, "{k}");
        }
        let c = FailurePolicy::closed().set(FailureKind::Timeout, OnFailure::Open);
        assert_eq!(c.action(FailureKind::Timeout), OnFailure::Open);
        assert_eq!(c.action(FailureKind::Discovery), OnFailure::Closed);
        assert_eq!(
            FailureKind::of(&Failure::Timeout { horizon_ms: 60 }),
            Some(FailureKind::Timeout)
        );
        assert_eq!(
            FailureKind::of(&Failure::Shutdown),
            Some(FailureKind::EngineStopped)
        );
        assert_eq!("closed".parse::<OnFailure>(), Ok(OnFailure::Closed));
        assert!("maybe".parse::<OnFailure>().is_err());
    }
}
