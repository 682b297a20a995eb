//! The layer and its service: ask, then forward (grant), answer `429` (rejection), or
//! follow the failure policy; afterwards report the inner service's latency.
//!
//! Owns: [`RateLimitLayer`], [`RateLimit`], the response body wrapper and the local
//! `429`/`503`/`500` answers, readiness (the pending-decision limit), the `Retry-After`
//! rule. Must not touch: the engine's internals, sockets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use ratelimitly_engine::EngineHandle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tower_layer::Layer;
use tower_service::Service;

use crate::admission::{Admission, EngineAdmission, Verdict, whole_ms_up};
use crate::consumption::Classify;
use crate::failure::{FailureKind, FailurePolicy, OnFailure};
use crate::metrics::LayerMetrics;

/// Default limit of admission decisions pending at once across all clones of one layer.
pub const DEFAULT_MAX_PENDING: usize = 4096;

/// `Retry-After` in whole seconds: the estimate rounded up, at least 1 (a rejection by
/// guards only, with no estimate, also gets 1).
pub fn retry_after_secs(estimate: Option<Duration>) -> u64 {
    estimate.map_or(1, |d| d.as_nanos().div_ceil(1_000_000_000).max(1) as u64)
}

/// The layer. Clones share the backend, the metrics and the pending-decision limit.
pub struct RateLimitLayer<A, C> {
    admission: A,
    classify: Arc<C>,
    failure: FailurePolicy,
    metrics: Arc<LayerMetrics>,
    permits: Arc<Semaphore>,
}

impl<A: Clone, C> Clone for RateLimitLayer<A, C> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            admission: self.admission.clone(),
            classify: self.classify.clone(),
            failure: self.failure,
            metrics: self.metrics.clone(),
            permits: self.permits.clone(),
        }
    }
}

impl<A, C> std::fmt::Debug for RateLimitLayer<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("failure", &self.failure)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl<C> RateLimitLayer<EngineAdmission, C> {
    /// A layer asking `engine`, with `classify` mapping each request to its consumption.
    pub fn new(engine: EngineHandle, classify: C) -> Self {
        Self::with_admission(EngineAdmission::new(engine), classify)
    }
}

impl<A, C> RateLimitLayer<A, C> {
    /// A layer asking `admission` (any [`Admission`] backend).
    pub fn with_admission(admission: A, classify: C) -> Self {
        RateLimitLayer {
            admission,
            classify: Arc::new(classify),
            failure: FailurePolicy::default(),
            metrics: LayerMetrics::new(),
            permits: Arc::new(Semaphore::new(DEFAULT_MAX_PENDING)),
        }
    }

    /// What to do when no decision comes back (default: [`FailurePolicy::default`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure = policy;
        self
    }

    /// At most `n` decisions pending at once (default [`DEFAULT_MAX_PENDING`]); beyond
    /// it `poll_ready` answers `Pending` until one completes. `n` is at least 1.
    pub fn max_pending(mut self, n: usize) -> Self {
        self.permits = Arc::new(Semaphore::new(n.clamp(1, Semaphore::MAX_PERMITS)));
        self
    }

    /// The layer's counters (for [`crate::Exporter`]).
    pub fn metrics(&self) -> Arc<LayerMetrics> {
        self.metrics.clone()
    }
}

impl<S, A: Clone, C> Layer<S> for RateLimitLayer<A, C> {
    type Service = RateLimit<S, A, C>;

    fn layer(&self, inner: S) -> RateLimit<S, A, C> {
        RateLimit {
            inner,
            admission: self.admission.clone(),
            classify: self.classify.clone(),
            failure: self.failure,
            metrics: self.metrics.clone(),
            semaphore: PollSemaphore::new(self.permits.clone()),
            permit: None,
        }
    }
}

/// The service: admits each request before the inner service sees it.
///
/// Readiness: `poll_ready` answers `Pending` while the layer's limit of pending
/// decisions is reached (the engine would otherwise queue requests it cannot serve in
/// time, or refuse them as overloaded), and otherwise reports the inner service's
/// readiness.
pub struct RateLimit<S, A, C> {
    inner: S,
    admission: A,
    classify: Arc<C>,
    failure: FailurePolicy,
    metrics: Arc<LayerMetrics>,
    semaphore: PollSemaphore,
    permit: Option<OwnedSemaphorePermit>,
}

impl<S: Clone, A: Clone, C> Clone for RateLimit<S, A, C> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            admission: self.admission.clone(),
            classify: self.classify.clone(),
            failure: self.failure,
            metrics: self.metrics.clone(),
            semaphore: self.semaphore.clone(),
            // A permit belongs to the instance that was polled ready.
            permit: None,
        }
    }
}

impl<S, A, C> std::fmt::Debug for RateLimit<S, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("failure", &self.failure)
            .field("ready", &self.permit.is_some())
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The response body: the inner service's body, or a short local answer.
    pub struct ResponseBody<B> {
        #[pin]
        inner: Option<B>,
        local: Option<Bytes>,
    }
}

impl<B> std::fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseBody")
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

impl<B> ResponseBody<B> {
    /// Wraps the inner service's body.
    pub fn inner(body: B) -> Self {
        ResponseBody {
            inner: Some(body),
            local: None,
        }
    }

    /// A local body.
    pub fn local(text: &'static str) -> Self {
        ResponseBody {
            inner: None,
            local: Some(Bytes::from_static(text.as_bytes())),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        match this.inner.as_pin_mut() {
            Some(b) => b.poll_frame(cx),
            None => Poll::Ready(this.local.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Some(b) => b.is_end_stream(),
            None => self.local.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) => b.size_hint(),
            None => SizeHint::with_exact(self.local.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}

fn local<B>(status: StatusCode, text: &'static str) -> Response<ResponseBody<B>> {
    let mut r = Response::new(ResponseBody::local(text));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The `429 Too Many Requests` answer with `Retry-After`.
pub fn too_many_requests<B>(retry_after: Option<Duration>) -> Response<ResponseBody<B>> {
    let mut r = local(StatusCode::TOO_MANY_REQUESTS, "rate limited\n");
    r.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_secs(retry_after)),
    );
    r
}

fn unavailable<B>(kind: FailureKind) -> Response<ResponseBody<B>> {
    let text = match kind {
        FailureKind::Timeout => "rate limit service timed out\n",
        FailureKind::Overload => "rate limiter overloaded\n",
        FailureKind::Discovery => "no rate limit service found\n",
        FailureKind::Communication => "rate limit service unreachable\n",
        FailureKind::EngineStopped => "rate limiter stopped\n",
    };
    local(StatusCode::SERVICE_UNAVAILABLE, text)
}

/// The service's future.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, A, C, ReqB, ResB> Service<http::Request<ReqB>> for RateLimit<S, A, C>
where
    S: Service<http::Request<ReqB>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    A: Admission,
    C: Classify<ReqB>,
    ReqB: Send + 'static,
    ResB: Send + 'static,
{
    type Response = Response<ResponseBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        if self.permit.is_none() {
            match self.semaphore.poll_acquire(cx) {
                Poll::Ready(p) => self.permit = p,
                Poll::Pending => {
                    self.metrics.record_not_ready();
                    return Poll::Pending;
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        let permit = self.permit.take();
        // The instance that was polled ready goes into the future.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let consumption = self.classify.classify(&req);
        let admission = self.admission.clone();
        let decision = admission.admit(&consumption);
        let failure = self.failure;
        let metrics = self.metrics.clone();
        let asked = Instant::now();
        Box::pin(async move {
            let verdict = decision.await;
            drop(permit);
            metrics.record(verdict, asked.elapsed());
            match verdict {
                Verdict::Granted => {}
                Verdict::Rejected { retry_after } => return Ok(too_many_requests(retry_after)),
                Verdict::Failed(kind) => {
                    tracing::debug!(%kind, "admission failed");
                    if failure.action(kind) == OnFailure::Closed {
                        return Ok(unavailable(kind));
                    }
                }
                Verdict::Invalid => {
                    tracing::warn!("request mapped to an invalid consumption");
                    return Ok(local(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "invalid rate limit request\n",
                    ));
                }
            }
            let started = Instant::now();
            let resp = inner.call(req).await?;
            if !consumption.guards().is_empty() {
                let observed = whole_ms_up(started.elapsed());
                for (tracker, _) in consumption.guards() {
                    admission.report(tracker, observed);
                }
            }
            Ok(resp.map(ResponseBody::inner))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_whole_seconds() {
        assert_eq!(retry_after_secs(None), 1);
        assert_eq!(retry_after_secs(Some(Duration::ZERO)), 1);
        assert_eq!(retry_after_secs(Some(Duration::from_millis(1))), 1);
        assert_eq!(retry_after_secs(Some(Duration::from_millis(1000))), 1);
        assert_eq!(retry_after_secs(Some(Duration::from_millis(1001))), 2);
        assert_eq!(retry_after_secs(Some(Duration::from_secs(60))), 60);
    }
}
