//! What a caller builds and gets back: a request ([`RequestBuilder`], [`Request`]) and
//! the outcomes of a batch ([`Batch`]).
//!
//! Owns: the validation of a request ([`check`]: the PDU's length, or the rule that refuses
//! it) and the source of its one encoder call (`RequestBuilder::source`, a
//! `super::completion::PduSource`): [`RequestBuilder::send`] has it encoded straight into
//! the request's completion slot, [`RequestBuilder::build`] into a [`Request`] whose PDU
//! moves into its slot when it is submitted; a large PDU is a case of the same store
//! (`super::completion::PduBuf`). Both go through the one way in (`super::submit`).
//! Must not touch: the queues, the slots' synchronisation, sockets, the core.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use super::completion::{Completion, PduBuf, PduSource};
use super::handle::EngineHandle;
use super::shared::Shared;
use super::submit::{self, Submitter};
use crate::proto::error::{ConfigError, RequestError};
use crate::proto::ids::{LatencyTracker, Resource};
use crate::proto::outcome::{Failure, Outcome};
use crate::proto::wire::{self, GuardSpec, ResourceSpec};

/// The handle's requests (declared here, beside the builder: a request starts, is built
/// and is submitted in this file).
impl EngineHandle {
    /// Starts a resource request.
    pub fn request(&self) -> RequestBuilder<'_> {
        RequestBuilder::new(&self.inner)
    }

    /// Submits one built request.
    pub fn submit(&self, req: Request) -> Completion {
        match Submitter::enter(&self.inner.intake) {
            Some(mut s) => req.submit(&mut s),
            None => Completion::ready(Err(Failure::Shutdown)),
        }
    }

    /// Submits several requests at once (one wake per core); outcomes in order.
    pub fn submit_batch(&self, reqs: Vec<Request>) -> Batch {
        let Some(mut s) = Submitter::enter(&self.inner.intake) else {
            return Batch::new(
                reqs.into_iter()
                    .map(|_| Completion::ready(Err(Failure::Shutdown)))
                    .collect(),
            );
        };
        Batch::new(reqs.into_iter().map(|r| r.submit(&mut s)).collect())
    }
}

/// Builds one resource request. Obtained from
/// [`EngineHandle::request`](crate::EngineHandle::request).
#[must_use = "a request does nothing until sent"]
pub struct RequestBuilder<'a> {
    shared: &'a Shared,
    guards: SmallVec<[GuardSpec; 2]>,
    resources: SmallVec<[ResourceSpec; 2]>,
    label: &'a str,
    error: Option<ConfigError>,
}

impl fmt::Debug for RequestBuilder<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RequestBuilder")
            .field("guards", &self.guards.len())
            .field("resources", &self.resources.len())
            .field("label", &self.label)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<'a> RequestBuilder<'a> {
    pub(crate) fn new(shared: &'a Shared) -> Self {
        RequestBuilder {
            shared,
            guards: SmallVec::new(),
            resources: SmallVec::new(),
            label: "",
            error: None,
        }
    }

    fn fail(&mut self, e: ConfigError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Consumes `tokens` (1..=65535) from `resource`.
    pub fn consume(mut self, resource: &Resource, tokens: u32) -> Self {
        let limit = self.shared.window_limit_ms;
        if !(1..=65535).contains(&tokens) {
            self.fail(RequestError::TokensOutOfRange { tokens }.into());
        } else if resource.window_ms() > limit {
            self.fail(
                RequestError::WindowOverKeyLimit {
                    window_ms: resource.window_ms(),
                    limit_ms: limit,
                }
                .into(),
            );
        } else {
            self.resources.push(ResourceSpec {
                bucket_id: resource.id(),
                window_ms: resource.window_ms(),
                rate_limit: resource.rate_limit(),
                tokens: tokens as u16,
            });
        }
        self
    }

    /// Requires `tracker`'s current latency to be below `threshold` (a positive whole
    /// number of milliseconds, as the official client requires; anything else fails
    /// the request with a configuration error).
    pub fn guard(mut self, tracker: &LatencyTracker, threshold: Duration) -> Self {
        match crate::proto::ids::latency_ms(
            threshold,
            crate::proto::ids::LatencyField::GuardThreshold,
        ) {
            Ok(ms) => self.guards.push(GuardSpec {
                tracker_id: tracker.id(),
                ttl_ms: tracker.ttl_ms(),
                max_samples: tracker.max_samples(),
                min_samples: tracker.min_samples(),
                threshold_ms: ms,
                current_latency_ms: 0,
            }),
            Err(e) => self.fail(e.into()),
        }
        self
    }

    /// Metrics label (groups server-side metrics only).
    pub fn label(mut self, label: &'a str) -> Self {
        self.label = label;
        self
    }

    /// The official crate's name for [`RequestBuilder::label`].
    pub fn metrics_label(self, label: &'a str) -> Self {
        self.label(label)
    }

    /// The first configuration error (recorded by a builder method, or found by
    /// [`check`]), else the length of the request's PDU (`None`: the request is
    /// empty and granted locally).
    fn validate(&mut self) -> Result<Option<usize>, ConfigError> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.guards.is_empty() && self.resources.is_empty() {
            return Ok(None);
        }
        let len = check(
            self.shared.max_pdu,
            &self.guards,
            &self.resources,
            self.label,
        )?;
        Ok(Some(len))
    }

    /// The source of the request's PDU of `len` bytes (as [`validate`](Self::validate)
    /// found it): the one encoder call, whether into its completion slot
    /// ([`send`](Self::send)) or into a [`Request`] ([`build`](Self::build)).
    fn source(&self, len: usize) -> PduSource<'_> {
        PduSource::Encode {
            len,
            horizon_ms: self.shared.horizon_ms,
            guards: &self.guards,
            resources: &self.resources,
            label: self.label,
        }
    }

    /// Validates and encodes the request (for
    /// [`EngineHandle::submit_batch`](crate::EngineHandle::submit_batch)).
    pub fn build(mut self) -> Request {
        let pdu = self.validate().and_then(|len| {
            len.map(|len| {
                let mut p = PduBuf::EMPTY;
                self.source(len).write(&mut p).map(|()| p)
            })
            .transpose()
        });
        Request { pdu }
    }

    /// Sends the request; the returned future (or its `wait()`) yields the outcome. The
    /// PDU is encoded straight into the request's completion slot, where its core
    /// takes it from. A closed engine fails it with `Shutdown` whatever it holds
    /// (validation only computes).
    pub fn send(mut self) -> Completion {
        let valid = self.validate();
        submit::one(
            &self.shared.intake,
            valid.map(|len| len.map(|len| self.source(len))),
        )
    }

    /// Sends the request and blocks until its outcome.
    pub fn wait(self) -> Outcome {
        self.send().wait()
    }
}

/// The PDU length of a request, or the configuration error that refuses it (checked
/// before any completion slot is taken).
pub(crate) fn check(
    max_pdu: usize,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> Result<usize, ConfigError> {
    if wire::label_tlv_len(label.len()).is_none() {
        return Err(RequestError::LabelTooLong { len: label.len() }.into());
    }
    let len = wire::rate_request_pdu_len(guards.len(), resources.len(), label.len())
        .ok_or(ConfigError::Request(RequestError::TooManyBlocks))?;
    if len > max_pdu {
        return Err(RequestError::TooLarge {
            needed: len + (wire::MAX_DATAGRAM - max_pdu),
            max: wire::MAX_DATAGRAM,
        }
        .into());
    }
    Ok(len)
}

/// A validated, encoded request, ready for [`EngineHandle::submit`](crate::EngineHandle::submit) or
/// [`EngineHandle::submit_batch`](crate::EngineHandle::submit_batch).
pub struct Request {
    /// Its PDU, `None` when it is empty (granted locally), or why it is invalid.
    pdu: Result<Option<PduBuf>, ConfigError>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request").finish_non_exhaustive()
    }
}

impl Request {
    /// Submits the request through `s`: its PDU moves into its completion slot.
    pub(crate) fn submit(self, s: &mut Submitter<'_>) -> Completion {
        s.request(self.pdu.map(|p| p.map(PduSource::Built)))
    }
}

/// Outcomes of a batch, in submission order: a future, or [`Batch::wait`].
pub struct Batch {
    pending: Vec<Completion>,
    done: Vec<Option<Outcome>>,
    next: usize,
}

impl fmt::Debug for Batch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("requests", &self.pending.len())
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Batch {
    pub(crate) fn new(pending: Vec<Completion>) -> Batch {
        let n = pending.len();
        Batch {
            pending,
            done: (0..n).map(|_| None).collect(),
            next: 0,
        }
    }

    /// Blocks until every outcome is known.
    pub fn wait(self) -> Vec<Outcome> {
        self.pending.into_iter().map(Completion::wait).collect()
    }

    /// Blocks until every outcome is known or `timeout` passes; on timeout the batch is
    /// handed back (the outcomes known so far kept in it).
    pub fn wait_timeout(self, timeout: Duration) -> Result<Vec<Outcome>, Batch> {
        let deadline = Instant::now() + timeout;
        let mut outs = Vec::with_capacity(self.pending.len());
        let mut rest = self.pending.into_iter();
        while let Some(c) = rest.next() {
            match c.wait_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(o) => outs.push(o),
                Err(c) => {
                    let mut pending: Vec<Completion> =
                        outs.into_iter().map(Completion::ready).collect();
                    pending.push(c);
                    pending.extend(rest);
                    return Err(Batch::new(pending));
                }
            }
        }
        Ok(outs)
    }
}

impl Future for Batch {
    type Output = Vec<Outcome>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Vec<Outcome>> {
        let this = &mut *self;
        while this.next < this.pending.len() {
            let i = this.next;
            match Pin::new(&mut this.pending[i]).poll(cx) {
                Poll::Ready(o) => {
                    this.done[i] = Some(o);
                    this.next += 1;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        this.pending.clear();
        Poll::Ready(
            this.done
                .drain(..)
                .map(|o| o.expect("every outcome"))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ids::{LatencyField, latency_ms};

    /// Guard thresholds follow the official crate (`ratelimitly` 0.1.0 refuses any
    /// duration that is zero or not a whole number of milliseconds): no rounding.
    #[test]
    fn thresholds_are_positive_whole_milliseconds() {
        let t = |d| latency_ms(d, LatencyField::GuardThreshold);
        assert_eq!(t(Duration::from_millis(100)), Ok(100));
        for bad in [
            Duration::from_micros(1),
            Duration::from_micros(1500),
            Duration::ZERO,
            Duration::from_secs(u64::MAX),
        ] {
            assert_eq!(t(bad), Err(RequestError::BadLatency));
        }
    }

    #[test]
    fn refusals_name_the_rule() {
        let resource = |i: u8| ResourceSpec {
            bucket_id: [i; 16],
            window_ms: 1000,
            rate_limit: 10,
            tokens: 1,
        };
        let rs = [resource(1)];
        let long = "x".repeat(70_000);
        assert!(matches!(
            check(1100, &[], &rs, &long),
            Err(ConfigError::Request(RequestError::LabelTooLong { .. }))
        ));
        let many: Vec<_> = (0..200).map(|i| resource(i as u8)).collect();
        assert!(matches!(
            check(1100, &[], &many, ""),
            Err(ConfigError::Request(RequestError::TooLarge { .. }))
        ));
    }
}
