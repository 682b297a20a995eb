//! The admin listener: `GET /metrics` (Prometheus text format) and `GET /healthz`.
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

/// Appends a mode's own series to the page (before its `# EOF`).
pub(crate) type AppendSeries = Arc<dyn Fn(&mut String) + Send + Sync>;

/// Serves the admin routes on `listener` until the task is aborted.
/// The page is the first exporter's, with the values of the same series in the others
/// added (several layers, one page), then the mode's own series (`own`).
pub(crate) async fn serve(listener: TcpListener, exporters: Vec<Exporter>, own: AppendSeries) {
    let exporters = Arc::new(exporters);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let exporter = exporters.clone();
        let own = own.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let exporter = exporter.clone();
                let own = own.clone();
                async move { Ok::<_, Infallible>(route(req, exporter, own).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

fn text(
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

async fn route(
    req: Request<Incoming>,
    exporters: Arc<Vec<Exporter>>,
    own: AppendSeries,
) -> Response<Full<Bytes>> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            // Reading the engine's statistics may block briefly: off the async workers.
            let encode = move || {
                let mut page = String::new();
                for (i, e) in exporters.iter().enumerate() {
                    page = if i == 0 {
                        e.encode()
                    } else {
                        sum_pages(&page, &e.encode())
                    };
                }
                own(&mut page);
                page
            };
            match tokio::task::spawn_blocking(encode).await {
                Ok(body) => text(StatusCode::OK, CONTENT_TYPE, body),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain; charset=utf-8",
                    "metrics unavailable\n",
                ),
            }
        }
        (&Method::GET, "/healthz") => text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            "not found\n",
        ),
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
