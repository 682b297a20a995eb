//! Routes from a file at run time: the router that sends each request to its route's
//! service (straight to the upstream, or through the layer with the route's failure
//! policy), and the SIGHUP reload that replaces the table.
//!
//! Owns: `Router`, `RouteClassify`, the reload. Must not touch: the file format
//! (`config`), listeners.

use std::convert::Infallible;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http::{Request, Response};
use hyper::body::Incoming;
use ratelimitly_tower::{
    AdmissionService, Classify, ClientIpRule, Consumption, EngineAdmission, OnFailure, ResponseBody,
};
use tower::ServiceExt;

use crate::cli::ClientFlags;
use crate::config;
use crate::http_modes::route_metrics::RouteMetrics;
use crate::http_modes::upstream::Upstream;

/// What a SIGHUP replaces.
pub(crate) struct Reload {
    pub(crate) path: PathBuf,
    pub(crate) table: Arc<ArcSwap<config::Table>>,
    /// An admission backend was started.
    pub(crate) backend: bool,
    /// The connections' client rule: the flags' and the file's.
    pub(crate) client_rule: Arc<ArcSwap<ClientIpRule>>,
    pub(crate) client_flags: ClientFlags,
    /// The per-route counters, kept across reloads.
    pub(crate) route_metrics: Arc<RouteMetrics>,
}

/// Reloads the routes (and the file's `trust_forwarded`, `client_ip_from`) on every SIGHUP; a file that
/// is refused leaves the running ones in place: logged at `warn`, a reload at `info`.
pub(crate) async fn reload_on_hangup(mut hup: tokio::signal::unix::Signal, r: Reload) {
    let Reload {
        path,
        table,
        backend,
        client_rule,
        client_flags,
        route_metrics,
    } = r;
    while hup.recv().await.is_some() {
        let refused = "config reload refused, the running routes are kept";
        match config::load(&path) {
            Err(e) => tracing::warn!("{refused}: {e}"),
            Ok(t) if t.upstream != table.load().upstream => {
                tracing::warn!("{refused}: upstream cannot change on reload (restart to change it)")
            }
            Ok(t) if t.limited() && !backend => tracing::warn!(
                "{refused}: no admission backend was started (the file at start limited no route)"
            ),
            Ok(mut t) => {
                t.count_routes_in(&route_metrics);
                tracing::info!(routes = t.route_count(), file = %path.display(), "config reloaded");
                client_rule.store(Arc::new(client_flags.rule(Some(&t))));
                table.store(Arc::new(t));
            }
        }
    }
}

/// A limited route's service: the layer over the upstream.
pub(crate) type Limited = AdmissionService<Upstream, EngineAdmission, RouteClassify>;

/// The body of a routed response.
pub(crate) type RoutedBody = ResponseBody<ResponseBody<Incoming>>;

/// Routes each request by the current table (`--config`): an `off` route straight to
/// the upstream, a limited one through the layer whose failure policy it names.
#[derive(Clone)]
pub(crate) struct Router {
    pub(crate) table: Arc<ArcSwap<config::Table>>,
    pub(crate) upstream: Upstream,
    /// (fail-open, fail-closed); `None` when no admission backend was started.
    pub(crate) layers: Option<(Limited, Limited)>,
}

/// The route a request matched, set by [`Router`] for [`RouteClassify`].
#[derive(Clone)]
pub(crate) struct Matched(Arc<config::Route>);

/// What a routed request consumes: its route's limits, one token each, in one request.
pub(crate) struct RouteClassify;

impl<B> Classify<B> for RouteClassify {
    fn classify(&self, request: &Request<B>) -> Consumption {
        match request.extensions().get::<Matched>() {
            Some(m) => m.0.consumption(request),
            None => Consumption::new(),
        }
    }
}

impl tower_service::Service<Request<Incoming>> for Router {
    type Response = Response<RoutedBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RoutedBody>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<Incoming>) -> Self::Future {
        let route = self
            .table
            .load()
            .find(req.method(), req.uri().path())
            .clone();
        if !route.limited() {
            let up = self.upstream.clone();
            return Box::pin(async move {
                let resp = up.oneshot(req).await?;
                Ok(resp.map(ResponseBody::inner))
            });
        }
        let Some((open, closed)) = &self.layers else {
            // not reached: a limited table is refused without a backend
            let mut r = Response::new(ResponseBody::local("no admission backend\n"));
            *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
            return Box::pin(async move { Ok(r) });
        };
        let svc = if route.on_failure == OnFailure::Closed {
            closed.clone()
        } else {
            open.clone()
        };
        req.extensions_mut().insert(Matched(route));
        Box::pin(svc.oneshot(req))
    }
}
