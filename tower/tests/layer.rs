//! The layer behind a real hyper listener, asked through a real HTTP client, deciding
//! through the engine against our responder on loopback.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ratelimitly_engine::LatencyTracker;
#[cfg(feature = "prometheus")]
use ratelimitly_tower::Exporter;
use ratelimitly_tower::{
    AdmissionLayer as RateLimitLayer, FailurePolicy, KeyBy, Limit, OnFailure, RetryAfter, keyed,
};
use rl_responder::Faults;
use tower::{Layer, Service, ServiceExt};

mod common;
use common::{engine, listen, responder};

/// One test at a time: each starts an engine core and a responder core.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The protected application: `200 ok`, after MS milliseconds for `/slow/MS`.
async fn app(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    if let Some(ms) = req.uri().path().strip_prefix("/slow/") {
        let ms: u64 = ms.parse().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

async fn get(
    c: &Client<HttpConnector, Empty<Bytes>>,
    addr: SocketAddr,
    path: &str,
) -> Response<Bytes> {
    let uri = format!("http://{addr}{path}");
    let resp = tokio::time::timeout(Duration::from_secs(10), c.get(uri.parse().unwrap()))
        .await
        .expect("answer within 10 s")
        .expect("HTTP exchange");
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Response::from_parts(parts, body)
}

fn retry_after(r: &Response<Bytes>) -> u64 {
    r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_then_429_with_retry_after() {
    let _s = SERIAL.lock().await;
    let r = responder(101, Faults::default());
    let e = engine(&r);
    let layer = RateLimitLayer::new(
        e.handle(),
        keyed(Limit::new(3, Duration::from_secs(60)).unwrap(), KeyBy::Path),
    )
    .retry_after(RetryAfter::EvenSpread);
    let metrics = layer.metrics();
    let addr = listen(layer.layer(tower::service_fn(app))).await;
    let c = client();
    for _ in 0..3 {
        let resp = get(&c, addr, "/checkout").await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.body().as_ref(), b"ok");
    }
    let resp = get(&c, addr, "/checkout").await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // The even-spread estimate: 3 tokens used in a 60 s window, 1 missing: one token
    // leaves in 60 s / 3 = 20 s (if they were used evenly; they were not).
    assert_eq!(retry_after(&resp), 20);
    assert_eq!(resp.headers()["ratelimit"], "\"http\";r=0;t=20");
    // Another path has its own bucket.
    assert_eq!(get(&c, addr, "/other").await.status(), StatusCode::OK);
    assert_eq!(metrics.outcome("granted"), 4);
    assert_eq!(metrics.outcome("rejected"), 1);
    drop(e);
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_and_fail_closed_with_the_responder_stopped() {
    let _s = SERIAL.lock().await;
    let r = responder(102, Faults::default());
    let e = engine(&r);
    r.stop();
    let limit = Limit::new(100, Duration::from_secs(1)).unwrap();
    let open = RateLimitLayer::new(e.handle(), keyed(limit, KeyBy::ClientIp))
        .failure_policy(FailurePolicy::open());
    let closed = RateLimitLayer::new(e.handle(), keyed(limit, KeyBy::ClientIp))
        .failure_policy(FailurePolicy::closed());
    let (open_m, closed_m) = (open.metrics(), closed.metrics());
    let open_addr = listen(open.layer(tower::service_fn(app))).await;
    let closed_addr = listen(closed.layer(tower::service_fn(app))).await;
    let c = client();
    let resp = get(&c, open_addr, "/").await;
    assert_eq!(resp.status(), StatusCode::OK, "fail-open forwards");
    assert_eq!(resp.body().as_ref(), b"ok");
    let resp = get(&c, closed_addr, "/").await;
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "fail-closed answers 503"
    );
    // No answer within the horizon: a timeout, counted as such.
    assert_eq!(open_m.outcome("timeout"), 1);
    assert_eq!(closed_m.outcome("timeout"), 1);

    // A stopped engine is a failure of its own kind.
    let h = e.handle();
    e.shutdown();
    let stopped = RateLimitLayer::new(h, keyed(limit, KeyBy::ClientIp)).failure_policy(
        FailurePolicy::open().set(
            ratelimitly_tower::FailureKind::EngineStopped,
            OnFailure::Closed,
        ),
    );
    let m = stopped.metrics();
    let addr = listen(stopped.layer(tower::service_fn(app))).await;
    assert_eq!(
        get(&c, addr, "/").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(m.outcome("stopped"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observed_latency_feeds_the_guard() {
    let _s = SERIAL.lock().await;
    let r = responder(103, Faults::default());
    let e = engine(&r);
    let tracker = LatencyTracker::new("upstream", Duration::from_secs(60), 100, 1).unwrap();
    let layer = RateLimitLayer::new(
        e.handle(),
        keyed(
            Limit::new(1000, Duration::from_secs(1)).unwrap(),
            KeyBy::Path,
        )
        .guard(tracker, Duration::from_millis(100)),
    );
    let addr = listen(layer.layer(tower::service_fn(app))).await;
    let c = client();
    // No sample yet: the guard passes. The upstream takes 150 ms, which is reported.
    assert_eq!(get(&c, addr, "/slow/150").await.status(), StatusCode::OK);
    let h = e.handle();
    tokio::task::spawn_blocking(move || h.flush_reports())
        .await
        .unwrap();
    // The tracker's current latency (p90 of its few samples) is now 150 ms >= 100 ms:
    // a later guarded request is rejected. Bounded: a report and the next request take
    // separate datagrams, so allow a few tries.
    let mut status = StatusCode::OK;
    for _ in 0..5 {
        let resp = get(&c, addr, "/fast").await;
        status = resp.status();
        if status == StatusCode::TOO_MANY_REQUESTS {
            // Rejected by a guard only: no estimate, so the minimum of 1 s.
            assert_eq!(retry_after(&resp), 1);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(r.counters().report_entries >= 1, "{:?}", r.counters());
    drop(e);
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_ready_is_pending_at_the_pending_limit() {
    let _s = SERIAL.lock().await;
    let r = responder(
        104,
        Faults {
            delay: Duration::from_millis(30),
            ..Faults::default()
        },
    );
    let e = engine(&r);
    let layer = RateLimitLayer::new(
        e.handle(),
        keyed(
            Limit::new(1000, Duration::from_secs(1)).unwrap(),
            KeyBy::Path,
        ),
    )
    .max_pending(1);
    let metrics = layer.metrics();
    let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    }));
    let mut first = svc.clone();
    let mut second = svc.clone();
    first.ready().await.unwrap();
    let pending = first.call(Request::get("/a").body(()).unwrap());
    // The only permit is held by the pending decision.
    let polled = std::future::poll_fn(|cx| Poll::Ready(second.poll_ready(cx))).await;
    assert!(polled.is_pending(), "poll_ready must not claim readiness");
    assert_eq!(pending.await.unwrap().status(), StatusCode::OK);
    // Woken and ready once the decision completed.
    tokio::time::timeout(Duration::from_secs(5), second.ready())
        .await
        .expect("ready after the first decision")
        .unwrap();
    assert_eq!(metrics.not_ready(), 1);
    #[cfg(feature = "prometheus")]
    assert!(
        Exporter::new(metrics)
            .encode()
            .contains("ratelimitly_not_ready_total 1")
    );
    drop(e);
    r.stop();
}

use std::task::Poll;

/// The exporter's text, parsed line by line: every required series is there with the
/// values the traffic implies.
#[cfg(feature = "prometheus")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse() {
    let _s = SERIAL.lock().await;
    let r = responder(105, Faults::default());
    let e = engine(&r);
    let layer = RateLimitLayer::new(
        e.handle(),
        keyed(Limit::new(2, Duration::from_secs(60)).unwrap(), KeyBy::Path),
    );
    let exporter = Exporter::new(layer.metrics()).with_engine(e.handle());
    let addr = listen(layer.layer(tower::service_fn(app))).await;
    let c = client();
    for _ in 0..3 {
        get(&c, addr, "/m").await;
    }
    let text = tokio::task::spawn_blocking(move || exporter.encode())
        .await
        .unwrap();
    let series = parse_prometheus(&text);
    let v = |k: &str| {
        *series
            .get(k)
            .unwrap_or_else(|| panic!("missing {k} in\n{text}"))
    };
    assert_eq!(v("ratelimitly_requests_total{outcome=\"granted\"}"), 2.0);
    assert_eq!(v("ratelimitly_requests_total{outcome=\"rejected\"}"), 1.0);
    for o in [
        "timeout",
        "overloaded",
        "discovery",
        "communication",
        "stopped",
    ] {
        assert_eq!(
            v(&format!("ratelimitly_requests_total{{outcome=\"{o}\"}}")),
            0.0
        );
    }
    assert_eq!(v("ratelimitly_decision_latency_seconds_count"), 3.0);
    assert_eq!(
        v("ratelimitly_decision_latency_seconds_bucket{le=\"+Inf\"}"),
        3.0
    );
    assert!(v("ratelimitly_decision_latency_seconds_sum") > 0.0);
    // Three requests, each sent once at least (plus completion deliveries).
    assert!(v("ratelimitly_datagrams_sent_total") >= 3.0);
    assert_eq!(
        v("ratelimitly_responses_dropped_total{reason=\"auth_failed\"}"),
        0.0
    );
    assert!(series.contains_key("ratelimitly_in_flight{core=\"0\"}"));
    drop(e);
    r.stop();
}

#[cfg(feature = "prometheus")]
/// `name{labels} value` lines into a map (comments skipped); panics on a malformed line.
fn parse_prometheus(text: &str) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = line.rsplit_once(' ').expect("name value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().expect("numeric value"),
        };
        assert!(
            name.chars().next().unwrap().is_ascii_alphabetic(),
            "bad name {name}"
        );
        out.insert(name.to_owned(), value);
    }
    out
}
