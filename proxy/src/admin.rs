//! The admin listener: `GET /metrics` (Prometheus text format), `GET /healthz` (liveness:
//! `200 ok` while the process serves; `GET /healthcheck`, envoyproxy/ratelimit's path,
//! the same with `OK`) and `GET /readyz` (readiness: `200 ready` while
//! decisions can be made, `503` with a one-line reason while none can: the diagnosis's
//! state, `crate::health`). Each answers from state and never waits on the service.
//! A mode may add routes of its own (`Extra`: `--mode rls`'s `POST /json` and
//! `GET /rlconfig`).
//!
//! Owns: the admin routes. Must not touch: proxied traffic, admission.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ratelimitly_tower::{CONTENT_TYPE, Exporter};
use tokio::net::TcpListener;

use crate::health::Health;

/// Appends a mode's own series to the page (before its `# EOF`).
pub(crate) type AppendSeries = Arc<dyn Fn(&mut String) + Send + Sync>;

/// The answer to a request of the admin listener.
pub(crate) type Answer = Response<Full<Bytes>>;

/// Bodies read by [`Extra`] routes at most (larger: `413`).
pub(crate) const MAX_BODY: usize = 1 << 20;

/// A mode's own admin routes.
pub(crate) trait Extra: Send + Sync {
    /// Whether `method path` is one of them (its body is then read, at most
    /// [`MAX_BODY`] bytes).
    fn serves(&self, method: &Method, path: &str) -> bool;
    /// The answer to `method path` with `body`.
    fn answer(
        &self,
        method: Method,
        path: String,
        body: Bytes,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Answer> + Send>>;
}

/// What the admin routes answer from.
pub(crate) struct Page {
    /// The layers' exporters: the metrics page is the first one's, with the values of
    /// the same series in the others added (several layers, one page).
    pub(crate) exporters: Vec<Exporter>,
    /// The mode's own series, appended.
    pub(crate) own: AppendSeries,
    /// Readiness and the diagnosis's series.
    pub(crate) health: Arc<Health>,
    /// The mode's own routes, if any.
    pub(crate) extra: Option<Arc<dyn Extra>>,
}

/// Serves the admin routes on `listener` until the task is aborted.
pub(crate) async fn serve(listener: TcpListener, page: Page) {
    let page = Arc::new(page);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let page = page.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let page = page.clone();
                async move { Ok::<_, Infallible>(route(req, page).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

pub(crate) fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

pub(crate) const PLAIN: &str = "text/plain; charset=utf-8";

async fn route(req: Request<Incoming>, page: Arc<Page>) -> Response<Full<Bytes>> {
    if let Some(extra) = &page.extra
        && extra.serves(req.method(), req.uri().path())
    {
        use http_body_util::BodyExt;
        let (parts, body) = req.into_parts();
        let body = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return text(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    PLAIN,
                    format!("the body is larger than {MAX_BODY} bytes\n"),
                );
            }
            Err(e) => return text(StatusCode::BAD_REQUEST, PLAIN, format!("{e}\n")),
        };
        return extra
            .answer(parts.method, parts.uri.path().to_owned(), body)
            .await;
    }
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            // Reading the engine's statistics may block briefly: off the async workers.
            let encode = move || {
                let mut out = String::new();
                for (i, e) in page.exporters.iter().enumerate() {
                    out = if i == 0 {
                        e.encode()
                    } else {
                        sum_pages(&out, &e.encode())
                    };
                }
                (page.own)(&mut out);
                page.health.encode(&mut out);
                out
            };
            match tokio::task::spawn_blocking(encode).await {
                Ok(body) => text(StatusCode::OK, CONTENT_TYPE, body),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    PLAIN,
                    "metrics unavailable\n",
                ),
            }
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, PLAIN, "ok\n"),
        // envoyproxy/ratelimit's liveness path, for health checks written for it
        (&Method::GET, "/healthcheck") => text(StatusCode::OK, PLAIN, "OK\n"),
        (&Method::GET, "/readyz") => match page.health.ready() {
            Ok(()) => text(StatusCode::OK, PLAIN, "ready\n"),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                PLAIN,
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, PLAIN, "not found\n"),
    }
}

/// `a` with the value of each sample line that `b` also has added to it.
fn sum_pages(a: &str, b: &str) -> String {
    let sample = |l: &str| -> Option<(String, f64)> {
        if l.starts_with('#') {
            return None;
        }
        let (name, value) = l.rsplit_once(' ')?;
        Some((name.to_owned(), value.parse().ok()?))
    };
    let other: std::collections::HashMap<String, f64> = b.lines().filter_map(sample).collect();
    let mut out = String::with_capacity(a.len());
    for line in a.lines() {
        match sample(line) {
            Some((name, v)) if other.contains_key(&name) => {
                out.push_str(&format!("{name} {}", v + other[&name]));
            }
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn pages_add_up() {
        let a = "# TYPE x counter\nx_total{o=\"g\"} 2\ny 0.5\nz 1\n";
        let b = "# TYPE x counter\nx_total{o=\"g\"} 3\ny 0.25\n";
        assert_eq!(
            super::sum_pages(a, b),
            "# TYPE x counter\nx_total{o=\"g\"} 5\ny 0.75\nz 1\n"
        );
    }
}
