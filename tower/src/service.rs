//! The layer and its service: ask, then forward (grant), answer `429` (rejection), or
//! follow the failure policy; afterwards report the inner service's latency.
//!
//! Owns: [`AdmissionLayer`], [`AdmissionService`], the response body wrapper and the
//! local `429`/`503`/`500` answers, readiness (the pending-decision limit), the
//! `Retry-After` rule ([`RetryAfter`]) and the RateLimit fields on responses. Must not
//! touch: the engine's internals, sockets.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::PollSemaphore;
use tower_layer::Layer;
use tower_service::Service;

use crate::admission::{Admission, EngineAdmission, EngineRef, Verdict, whole_ms_up};
use crate::breaker::{Breaker, CircuitBreaker, FailureLog, Gate};
use crate::consumption::{Classify, Consumption};
use crate::failure::{FailureKind, FailurePolicy, OnFailure};
use crate::fields::{self, Name, Policy, PolicyCache, PolicyState, whole_secs_up};
use crate::metrics::LayerMetrics;
use ratelimitly_engine::{Resource, ResourceResult};

/// Default limit of admission decisions pending at once across all clones of one layer.
pub const DEFAULT_MAX_PENDING: usize = 4096;

/// `Retry-After` in whole seconds: the estimate rounded up, at least 1 (a rejection by
/// guards only, with no estimate, also gets 1).
pub fn retry_after_secs(estimate: Option<Duration>) -> u64 {
    estimate.map_or(1, whole_secs_up)
}

/// How `Retry-After` (and the RateLimit field's `t`) is derived from a rejection.
///
/// The service keeps a **sliding window** per bucket and does not say when the grants
/// in it were made, so the exact moment a token comes back is unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryAfter {
    /// The default, never too short: the window of the rejected resources (the longest,
    /// rounded up to whole seconds, at least 1). After it every token now in the window
    /// has left it, so an unchanged retry is admitted unless new consumption arrived in
    /// between. A burst that used the whole quota at once waits exactly this long.
    #[default]
    Window,
    /// The even-spread estimate ([`ratelimitly_engine::ResourceResult::retry_after`]):
    /// `window × deficit ÷ actual_rate`, assuming the window's tokens were consumed
    /// evenly. Shorter, and **too short after a burst**: a client that obeys it can be
    /// rejected again several times before the window has passed.
    EvenSpread,
}

/// What a rejection hook is told.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Rejection {
    /// The `Retry-After` the layer would send (whole seconds, at least 1).
    pub retry_after: Duration,
    /// Each resource's policy and state, in the request's order.
    pub policies: Vec<PolicyState>,
}

/// Builds the response of a rejection (see [`AdmissionLayer::on_rejection`]).
pub type RejectionHook = Arc<dyn Fn(&Rejection) -> Response<Bytes> + Send + Sync>;

/// The layer-wide settings shared by every service it makes.
struct Settings {
    failure: FailurePolicy,
    retry_after: RetryAfter,
    fields: bool,
    hook: Option<RejectionHook>,
}

/// The layer. Clones share the backend, the metrics, the circuit breaker and the
/// pending-decision limit.
///
/// Named so as not to collide with `tower::limit::RateLimitLayer` (a local
/// backpressure limiter that never answers `429`).
pub struct AdmissionLayer<A, C> {
    /// What each service it makes shares (in one `Arc` per service).
    parts: Shared<A, C>,
    permits: Arc<Semaphore>,
}

/// The former name of [`AdmissionLayer`].
#[deprecated(note = "renamed AdmissionLayer (tower::limit::RateLimitLayer is another thing)")]
pub type RateLimitLayer<A, C> = AdmissionLayer<A, C>;

/// The former name of [`AdmissionService`].
#[deprecated(note = "renamed AdmissionService")]
pub type RateLimit<S, A, C> = AdmissionService<S, A, C>;

impl<A: Clone, C> Clone for AdmissionLayer<A, C> {
    fn clone(&self) -> Self {
        AdmissionLayer {
            parts: self.parts.clone(),
            permits: self.permits.clone(),
        }
    }
}

impl<A, C> std::fmt::Debug for AdmissionLayer<A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("failure", &self.parts.settings.failure)
            .field("retry_after", &self.parts.settings.retry_after)
            .field("ratelimit_fields", &self.parts.settings.fields)
            .field("available_permits", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl<C> AdmissionLayer<EngineAdmission, C> {
    /// A layer asking `engine`, with `classify` mapping each request to its consumption.
    ///
    /// Pass the [`ratelimitly_engine::Engine`] itself or an `Arc<Engine>`: the layer
    /// then keeps the engine running as long as it is used. A bare
    /// [`ratelimitly_engine::EngineHandle`] also works but does not keep the engine
    /// alive: once the `Engine` is dropped every request fails with
    /// [`FailureKind::EngineStopped`] (logged at `error!`).
    pub fn new(engine: impl Into<EngineRef>, classify: C) -> Self {
        Self::with_admission(EngineAdmission::new(engine), classify)
    }
}

impl<A, C> AdmissionLayer<A, C> {
    /// A layer asking `admission` (any [`Admission`] backend).
    pub fn with_admission(admission: A, classify: C) -> Self {
        AdmissionLayer {
            parts: Shared {
                admission,
                classify: Arc::new(classify),
                settings: Arc::new(Settings {
                    failure: FailurePolicy::default(),
                    retry_after: RetryAfter::default(),
                    fields: true,
                    hook: None,
                }),
                metrics: LayerMetrics::new(),
                breaker: Arc::new(Breaker::new(CircuitBreaker::default())),
                log: Arc::default(),
            },
            permits: Arc::new(Semaphore::new(DEFAULT_MAX_PENDING)),
        }
    }

    fn settings_mut(&mut self) -> &mut Settings {
        let settings = &mut self.parts.settings;
        if Arc::get_mut(settings).is_none() {
            let s = &**settings;
            *settings = Arc::new(Settings {
                failure: s.failure,
                retry_after: s.retry_after,
                fields: s.fields,
                hook: s.hook.clone(),
            });
        }
        Arc::get_mut(settings).expect("unique")
    }

    /// What to do when no decision comes back (default: [`FailurePolicy::default`]).
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.settings_mut().failure = policy;
        self
    }

    /// How `Retry-After` is derived (default [`RetryAfter::Window`], never too short).
    pub fn retry_after(mut self, mode: RetryAfter) -> Self {
        self.settings_mut().retry_after = mode;
        self
    }

    /// Sends the IETF `RateLimit-Policy` and `RateLimit` fields on granted and rejected
    /// responses (default: on). See [`crate::fields`].
    pub fn ratelimit_fields(mut self, on: bool) -> Self {
        self.settings_mut().fields = on;
        self
    }

    /// Builds each `429` response with `hook` (a JSON body, extra headers, another
    /// status). `Retry-After` and the RateLimit fields are added unless the hook set
    /// them itself.
    pub fn on_rejection<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
    {
        self.settings_mut().hook = Some(Arc::new(hook));
        self
    }

    /// The circuit breaker's settings (default [`CircuitBreaker::default`]); a fresh
    /// breaker, closed.
    pub fn circuit_breaker(mut self, breaker: CircuitBreaker) -> Self {
        self.parts.breaker = Arc::new(Breaker::new(breaker));
        self
    }

    /// At most `n` decisions pending at once (default [`DEFAULT_MAX_PENDING`]); beyond
    /// it `poll_ready` answers `Pending` until one completes. `n` is at least 1.
    pub fn max_pending(mut self, n: usize) -> Self {
        self.permits = Arc::new(Semaphore::new(n.clamp(1, Semaphore::MAX_PERMITS)));
        self
    }

    /// The layer's counters (what the `Exporter` of feature `prometheus` renders).
    pub fn metrics(&self) -> Arc<LayerMetrics> {
        self.parts.metrics.clone()
    }

    /// The backend.
    pub fn admission(&self) -> &A {
        &self.parts.admission
    }
}

impl<S, A: Clone, C> Layer<S> for AdmissionLayer<A, C> {
    type Service = AdmissionService<S, A, C>;

    fn layer(&self, inner: S) -> AdmissionService<S, A, C> {
        AdmissionService {
            inner,
            shared: Arc::new(self.parts.clone()),
            semaphore: PollSemaphore::new(self.permits.clone()),
            permit: None,
            policy: PolicyCache::default(),
        }
    }
}

/// The service: admits each request before the inner service sees it.
///
/// Readiness: `poll_ready` answers `Pending` while the layer's limit of pending
/// decisions is reached (the engine would otherwise queue requests it cannot serve in
/// time, or refuse them as overloaded), and otherwise reports the inner service's
/// readiness.
pub struct AdmissionService<S, A, C> {
    inner: S,
    /// What a request's future needs besides the inner service: one reference count
    /// per request instead of one per part.
    shared: Arc<Shared<A, C>>,
    semaphore: PollSemaphore,
    permit: Option<OwnedSemaphorePermit>,
    policy: PolicyCache,
}

/// The layer's parts a service and its futures share.
struct Shared<A, C> {
    admission: A,
    classify: Arc<C>,
    settings: Arc<Settings>,
    metrics: Arc<LayerMetrics>,
    breaker: Arc<Breaker>,
    log: Arc<FailureLog>,
}

impl<A: Clone, C> Clone for Shared<A, C> {
    fn clone(&self) -> Self {
        Shared {
            admission: self.admission.clone(),
            classify: self.classify.clone(),
            settings: self.settings.clone(),
            metrics: self.metrics.clone(),
            breaker: self.breaker.clone(),
            log: self.log.clone(),
        }
    }
}

impl<S: Clone, A: Clone, C> Clone for AdmissionService<S, A, C> {
    fn clone(&self) -> Self {
        AdmissionService {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            semaphore: self.semaphore.clone(),
            // A permit belongs to the instance that was polled ready.
            permit: None,
            policy: PolicyCache::default(),
        }
    }
}

impl<S, A, C> std::fmt::Debug for AdmissionService<S, A, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionService")
            .field("failure", &self.shared.settings.failure)
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

    /// A local body of any bytes.
    pub fn bytes(body: Bytes) -> Self {
        ResponseBody {
            inner: None,
            local: Some(body),
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

/// The body text of the layer's `503` for a failure of `kind` under a fail-closed
/// policy (one line, ending in a newline).
pub fn unavailable_text(kind: FailureKind) -> &'static str {
    match kind {
        FailureKind::Timeout => "rate limit service timed out\n",
        FailureKind::Overload => "rate limiter overloaded\n",
        FailureKind::Discovery => "no rate limit service found\n",
        FailureKind::Communication => "rate limit service unreachable\n",
        FailureKind::EngineStopped => "rate limiter stopped\n",
        FailureKind::NoClientAddr => "no client address to rate limit by\n",
    }
}

fn unavailable<B>(kind: FailureKind) -> Response<ResponseBody<B>> {
    let mut r = local(StatusCode::SERVICE_UNAVAILABLE, unavailable_text(kind));
    // when to try again: the breaker's default probe interval
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// The service's future.
pub type ResponseFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The policy name of resource `i` of `c`: the consumption's label when it has one
/// ([`Consumption::label`]: a route's name), else its bucket name up to the first `:`
/// (the [`crate::Keyed`] prefix, so a client's key is never echoed; `default` when
/// empty); suffixed `-i` when an earlier resource has the same base.
fn policy_name(c: &Consumption, i: usize) -> Name<'_> {
    fn base_of<'a>(label: &'a str, r: &'a Resource) -> &'a str {
        if !label.is_empty() {
            return label;
        }
        match r.name().split(':').next() {
            Some("") | None => "default",
            Some(b) => b,
        }
    }
    let (label, resources) = (c.metrics_label(), c.resources());
    let base = base_of(label, &resources[i].0);
    let index = resources[..i]
        .iter()
        .any(|(r, _)| base_of(label, r) == base)
        .then_some(i);
    Name { base, index }
}

/// Resource `r`'s reset time under `mode` given its result.
fn reset_of(r: &Resource, res: &ResourceResult, mode: RetryAfter) -> Duration {
    let window = Duration::from_millis(u64::from(r.window_ms()));
    match mode {
        RetryAfter::Window => window.max(res.window()),
        RetryAfter::EvenSpread if res.deficit > 0 => res.retry_after(),
        RetryAfter::EvenSpread => window,
    }
}

/// The policies of `c`, in order, with what `verdict` says about each.
fn policies<'a>(
    c: &'a Consumption,
    verdict: &'a Verdict,
    mode: RetryAfter,
) -> impl Iterator<Item = Policy<'a>> + Clone {
    c.resources().iter().enumerate().map(move |(i, (r, _))| {
        let result = match verdict {
            Verdict::Decided(d) => d.result_of(r),
            _ => None,
        };
        Policy {
            name: policy_name(c, i),
            quota: r.rate_limit(),
            window: Duration::from_millis(u64::from(r.window_ms())),
            remaining: result.map(|res| r.rate_limit().saturating_sub(res.actual_rate)),
            reset: result.map(|res| reset_of(r, res, mode)),
        }
    })
}

/// The policies of a rejection of `c` by `verdict`, and the `Retry-After` (`None`: no
/// estimate, 1 s is sent).
/// The RateLimit fields' states of `c`'s resources under `verdict`, and the
/// `Retry-After` estimate of a rejection (`None` unless rejected): what the layer puts
/// on its answers, for front ends other than this crate's layer (e.g. a Pingora
/// `ProxyHttp`). Turn the states into header values with [`fields::policy_value`] and
/// [`fields::ratelimit_value`], the estimate into seconds with [`retry_after_secs`].
pub fn assess(
    c: &Consumption,
    verdict: &Verdict,
    mode: RetryAfter,
) -> (Vec<PolicyState>, Option<Duration>) {
    let mut retry: Option<Duration> = None;
    for (r, _) in c.resources() {
        match verdict {
            Verdict::Decided(d) if !d.granted => {
                if let Some(res) = d.result_of(r).filter(|res| res.deficit > 0) {
                    retry = retry.max(Some(reset_of(r, res, mode)));
                }
            }
            Verdict::Rejected { retry_after } => {
                retry = match mode {
                    RetryAfter::Window => {
                        retry.max(Some(Duration::from_millis(u64::from(r.window_ms()))))
                    }
                    RetryAfter::EvenSpread => *retry_after,
                };
            }
            _ => {}
        }
    }
    let states = policies(c, verdict, mode)
        .map(|p| PolicyState {
            name: p.name.to_string(),
            quota: p.quota,
            window: p.window,
            remaining: p.remaining,
            reset: p.reset,
        })
        .collect();
    (states, retry)
}

impl<S, A, C, ReqB, ResB> Service<http::Request<ReqB>> for AdmissionService<S, A, C>
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
                    self.shared.metrics.record_not_ready();
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
        let shared = self.shared.clone();
        let consumption = shared.classify.classify(&req);
        // No decision to wait for: a consumption that cannot be asked for, or an open
        // breaker. Otherwise ask (as the breaker's probe when it is open).
        let (gate, decision) = match consumption.failure() {
            Some(kind) => (Gate::Open(kind), None),
            None => match shared.breaker.gate(&shared.metrics) {
                Gate::Open(kind) => (Gate::Open(kind), None),
                g => (g, Some(shared.admission.admit(&consumption))),
            },
        };
        // The RateLimit-Policy value depends on the consumption only: made here, where
        // this service's cache of it is at hand.
        let policy = if shared.settings.fields {
            let mode = shared.settings.retry_after;
            self.policy
                .value(policies(&consumption, &Verdict::Granted, mode))
        } else {
            None
        };
        let asked = Instant::now();
        Box::pin(async move {
            let Shared {
                admission,
                settings,
                metrics,
                breaker,
                log,
                ..
            } = &*shared;
            let verdict = match decision {
                Some(d) => {
                    let v = d.await;
                    breaker.observe(&v, gate == Gate::Probe, metrics);
                    v
                }
                None => match gate {
                    Gate::Open(kind) => Verdict::Failed(kind),
                    _ => Verdict::Invalid,
                },
            };
            drop(permit);
            let latency = asked.elapsed();
            metrics.record(&verdict, latency);
            if let Some(m) = consumption.counted_in() {
                m.record(&verdict, latency);
            }
            // `fields`: whether the answer carries the RateLimit fields (a grant's, or
            // none when the decision failed open).
            let fields = match &verdict {
                Verdict::Failed(kind) => {
                    let closed = settings.failure.action(*kind) == OnFailure::Closed;
                    log.failure(*kind, decision_skipped(&gate), !closed);
                    if closed {
                        return Ok(unavailable(*kind));
                    }
                    false
                }
                Verdict::Invalid => {
                    tracing::warn!("request mapped to an invalid consumption");
                    return Ok(local(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "invalid rate limit request\n",
                    ));
                }
                v if v.is_rejected() => {
                    let (policies, retry) = assess(&consumption, v, settings.retry_after);
                    return Ok(rejection(settings, policies, retry));
                }
                _ => settings.fields,
            };
            // The clock is read for the guards' report only when there are guards.
            let started = (!consumption.guards().is_empty()).then(Instant::now);
            let mut resp = inner.call(req).await?;
            if let Some(started) = started {
                let observed = whole_ms_up(started.elapsed());
                for (tracker, _) in consumption.guards() {
                    admission.report(tracker, observed);
                }
            }
            if fields {
                let policies = policies(&consumption, &verdict, settings.retry_after);
                fields::insert_each(resp.headers_mut(), policy, policies);
            }
            Ok(resp.map(ResponseBody::inner))
        })
    }
}

fn decision_skipped(gate: &Gate) -> bool {
    matches!(gate, Gate::Open(_))
}

/// The `429` of one rejection: the hook's response or the plain one, with
/// `Retry-After` and (when on) the RateLimit fields unless already set.
fn rejection<B>(
    settings: &Settings,
    policies: Vec<PolicyState>,
    retry: Option<Duration>,
) -> Response<ResponseBody<B>> {
    let secs = retry_after_secs(retry);
    let mut resp = match &settings.hook {
        Some(hook) => {
            let info = Rejection {
                retry_after: Duration::from_secs(secs),
                policies,
            };
            let (parts, body) = hook(&info).into_parts();
            let policies = info.policies;
            let mut r = Response::from_parts(parts, ResponseBody::bytes(body));
            if settings.fields {
                fields::insert(r.headers_mut(), &policies);
            }
            r
        }
        None => {
            let mut r = local(StatusCode::TOO_MANY_REQUESTS, "rate limited\n");
            if settings.fields {
                fields::insert(r.headers_mut(), &policies);
            }
            r
        }
    };
    if !resp.headers().contains_key(header::RETRY_AFTER) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::admission::Decided;
    use ratelimitly_engine::{Resource, ResourceResult};

    #[test]
    fn assess_several_resources() {
        let a = Resource::new("api:10.0.0.1", Duration::from_secs(10), 5).unwrap();
        let b = Resource::new("api:global", Duration::from_secs(60), 100).unwrap();
        let c = Consumption::new()
            .consume(a.clone(), 1)
            .consume(b.clone(), 1);
        let result = |r: &Resource, actual_rate, deficit| ResourceResult {
            bucket_id: r.id(),
            window_ms: r.window_ms(),
            actual_rate,
            deficit,
        };
        let v = Verdict::Decided(Decided {
            granted: false,
            resources: smallvec::smallvec![result(&b, 40, 0), result(&a, 5, 1)],
        });
        let (ps, retry) = assess(&c, &v, RetryAfter::Window);
        assert_eq!(
            retry,
            Some(Duration::from_secs(10)),
            "the rejected one's window"
        );
        assert_eq!(ps[0].name, "api");
        assert_eq!(ps[1].name, "api-1");
        assert_eq!((ps[0].remaining, ps[1].remaining), (Some(0), Some(60)));
        assert_eq!(
            fields::policy_value(&ps).unwrap(),
            "\"api\";q=5;w=10, \"api-1\";q=100;w=60"
        );
        assert_eq!(
            fields::ratelimit_value(&ps).unwrap(),
            "\"api\";r=0;t=10, \"api-1\";r=60;t=60"
        );
        // the even-spread estimate: 10 s x 1 / 5 = 2 s
        let (ps, retry) = assess(&c, &v, RetryAfter::EvenSpread);
        assert_eq!(retry, Some(Duration::from_secs(2)));
        assert_eq!(ps[0].reset, Some(Duration::from_secs(2)));
        // a backend without results: the longest window, policies without state
        let v = Verdict::Rejected {
            retry_after: Some(Duration::from_secs(2)),
        };
        let (ps, retry) = assess(&c, &v, RetryAfter::Window);
        assert_eq!(retry, Some(Duration::from_secs(60)));
        assert!(fields::ratelimit_value(&ps).is_none());
        assert_eq!(
            assess(&c, &v, RetryAfter::EvenSpread).1,
            Some(Duration::from_secs(2))
        );
    }

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
