//! What one admission came to ([`Verdict`]): a decision with its evidence ([`Decided`]), a
//! grant or rejection without it, or a failure of a [`FailureKind`].
//!
//! Owns: the verdict and the mapping from the engine's outcome to it. Must not touch:
//! backends, HTTP, counters.

use std::time::Duration;

use smallvec::SmallVec;

use ratelimitly_engine::{Outcome, Resource, ResourceResult};

use crate::failure::FailureKind;

/// The answer for one consumption.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// Everything was consumed: forward the request. (A backend without per-resource
    /// results; the engine answers [`Verdict::Decided`].)
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
    /// A decision with the service's per-resource results (what the engine answers):
    /// the layer derives `Retry-After` and the RateLimit fields from them.
    Decided(Decided),
}

/// A decision with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decided {
    /// Everything was consumed.
    pub granted: bool,
    /// The per-resource results, in the server's order (match them by bucket id);
    /// inline up to two, so a decision needs no allocation.
    pub resources: SmallVec<[ResourceResult; 2]>,
}

impl Decided {
    /// The result for `resource`, if the server sent one.
    pub fn result_of(&self, resource: &Resource) -> Option<&ResourceResult> {
        let id = resource.id();
        self.resources.iter().find(|r| r.bucket_id == id)
    }
}

impl Verdict {
    /// A grant (either form).
    pub fn is_granted(&self) -> bool {
        matches!(
            self,
            Verdict::Granted | Verdict::Decided(Decided { granted: true, .. })
        )
    }

    /// A rejection (either form).
    pub fn is_rejected(&self) -> bool {
        matches!(
            self,
            Verdict::Rejected { .. } | Verdict::Decided(Decided { granted: false, .. })
        )
    }

    /// The verdict of an engine outcome.
    pub fn of(outcome: &Outcome) -> Verdict {
        match outcome {
            Ok(r) => Verdict::Decided(Decided {
                granted: r.is_granted(),
                resources: r.resource_results().into(),
            }),
            Err(f) => match FailureKind::of(f) {
                Some(kind) => Verdict::Failed(kind),
                None => Verdict::Invalid,
            },
        }
    }
}
