//! The layer as an axum or hyper app meets it: Retry-After after a burst, the RateLimit
//! fields, ConnectInfo keying, forwarded headers, the missing address, the circuit
//! breaker, the engine kept alive, the rejection hook and the endpoint check — against
//! our responder on loopback.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use hyper::body::Incoming;
use ratelimitly_tower::{
    AdmissionLayer, CircuitBreaker, ClientIpFrom, Endpoint, EndpointProblem, FailurePolicy, KeyBy,
    LayerMetrics, Limit, TrustedProxies, keyed, verify,
};
use tower::{Layer, Service, ServiceExt};

mod common;
use common::{engine, key, listen, raw_get, responder_at};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const LOCAL1: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
#[cfg(feature = "axum")]
const LOCAL2: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// An axum app: `/api` behind `layer`, `/health` unlimited, with ConnectInfo (read by
/// the layer with feature `axum` only).
#[cfg(feature = "axum")]
async fn axum_app<C>(
    layer: AdmissionLayer<ratelimitly_tower::EngineAdmission, C>,
) -> std::net::SocketAddr
where
    C: ratelimitly_tower::Classify<axum::body::Body>,
{
    let app = axum::Router::new()
        .route("/api", axum::routing::get(|| async { "ok" }).layer(layer))
        .route("/health", axum::routing::get(|| async { "healthy" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await;
    });
    addr
}

#[cfg(feature = "axum")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_connect_info_keying_retry_after_and_fields() {
    let _s = SERIAL.lock().await;
    let r = responder_at(301, None);
    let e = engine(&r);
    let layer = AdmissionLayer::new(
        e,
        keyed(
            Limit::new(5, Duration::from_secs(2)).unwrap(),
            KeyBy::ClientIp,
        ),
    );
    let metrics = layer.metrics();
    let addr = axum_app(layer).await;
    // A burst of five from one address.
    for i in 0..5u32 {
        let a = raw_get(LOCAL1, addr, "/api", &[]).await;
        assert_eq!(a.status, 200, "request {i}");
        assert_eq!(a.body, "ok");
        assert_eq!(a.header("ratelimit-policy"), Some("\"http\";q=5;w=2"));
        // actual_rate on a grant includes the request's own token
        let want = format!("\"http\";r={};t=2", 4 - i);
        assert_eq!(a.header("ratelimit"), Some(want.as_str()));
    }
    let a = raw_get(LOCAL1, addr, "/api", &[]).await;
    assert_eq!(a.status, 429);
    let wait: u64 = a.header("retry-after").unwrap().parse().unwrap();
    assert_eq!(wait, 2, "the window, not an even-spread estimate");
    assert_eq!(a.header("ratelimit"), Some("\"http\";r=0;t=2"));
    assert_eq!(a.header("ratelimit-policy"), Some("\"http\";q=5;w=2"));
    // Another client address has its own bucket.
    let b = raw_get(LOCAL2, addr, "/api", &[]).await;
    assert_eq!(b.status, 200, "127.0.0.2 is another bucket");
    // The unlimited route.
    for _ in 0..8 {
        assert_eq!(raw_get(LOCAL1, addr, "/health", &[]).await.status, 200);
    }
    // A client that waits Retry-After is admitted.
    tokio::time::sleep(Duration::from_secs(wait) + Duration::from_millis(50)).await;
    let a = raw_get(LOCAL1, addr, "/api", &[]).await;
    assert_eq!(a.status, 200, "admitted after Retry-After");
    assert_eq!(metrics.outcome("rejected"), 1);
    assert_eq!(metrics.outcome("no_client_addr"), 0);
    r.stop();
}

async fn ok(_req: Request<Incoming>) -> Result<Response<Empty<Bytes>>, Infallible> {
    Ok(Response::new(Empty::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_only_from_trusted_peers() {
    let _s = SERIAL.lock().await;
    let r = responder_at(302, None);
    let e = Arc::new(engine(&r));
    let limit = Limit::new(1, Duration::from_secs(60)).unwrap();
    // The peer (127.0.0.1) is trusted: the forwarded client is the key.
    let trusted = AdmissionLayer::new(
        &e,
        keyed(limit, KeyBy::ClientIp)
            .prefix("trusted")
            .trusted_proxies(TrustedProxies::loopback()),
    );
    let addr = listen(trusted.layer(tower::service_fn(ok))).await;
    let xff = |v| [("X-Forwarded-For", v)];
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &xff("6.6.6.6, 198.51.100.1"))
            .await
            .status,
        200
    );
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &xff("198.51.100.1"))
            .await
            .status,
        429
    );
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &xff("198.51.100.2"))
            .await
            .status,
        200
    );
    // Forwarded (which Caddy and Traefik pass from the client unchanged) and X-Real-IP
    // are not read by default: with neither XFF, both requests are the peer's
    let fwd = |v| [("Forwarded", v), ("X-Real-IP", v)];
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &fwd("for=6.6.6.1")).await.status,
        200
    );
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &fwd("for=6.6.6.2")).await.status,
        429
    );
    // ... unless the app says its proxy writes Forwarded
    let from_forwarded = AdmissionLayer::new(
        &e,
        keyed(limit, KeyBy::ClientIp)
            .prefix("fwd")
            .trusted_proxies(TrustedProxies::loopback())
            .client_ip_from(ClientIpFrom::Forwarded),
    );
    let addr = listen(from_forwarded.layer(tower::service_fn(ok))).await;
    let fwd = [("Forwarded", "for=\"198.51.100.3:99\";proto=http")];
    assert_eq!(raw_get(LOCAL1, addr, "/", &fwd).await.status, 200);
    let same = [
        ("Forwarded", "for=198.51.100.3"),
        ("X-Forwarded-For", "198.51.100.9"),
    ];
    assert_eq!(raw_get(LOCAL1, addr, "/", &same).await.status, 429);
    // The peer is not trusted: headers are ignored, the peer is the key.
    let untrusted = AdmissionLayer::new(
        &e,
        keyed(limit, KeyBy::ClientIp)
            .prefix("untrusted")
            .trusted_proxies("10.0.0.0/8".parse().unwrap()),
    );
    let addr = listen(untrusted.layer(tower::service_fn(ok))).await;
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &xff("198.51.100.4"))
            .await
            .status,
        200
    );
    assert_eq!(
        raw_get(LOCAL1, addr, "/", &xff("198.51.100.5"))
            .await
            .status,
        429
    );
    drop(e);
    r.stop();
}

/// A writer collecting log output.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_an_address_warns_and_gets_the_failure_policy() {
    let _s = SERIAL.lock().await;
    let r = responder_at(303, None);
    let e = engine(&r);
    let limit = Limit::new(1, Duration::from_secs(60)).unwrap();
    let layer = AdmissionLayer::new(e, keyed(limit, KeyBy::ClientIp));
    let metrics = layer.metrics();
    let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    }));
    let cap = Capture::default();
    let sub = tracing_subscriber::fmt()
        .with_writer({
            let cap = cap.clone();
            move || cap.clone()
        })
        .with_ansi(false)
        .finish();
    let dispatch = tracing::Dispatch::new(sub);
    // No extension at all: fail-open (the default), three times — never a shared
    // bucket of limit 1, which would reject the second.
    for _ in 0..3 {
        let mut one = svc.clone();
        one.ready().await.unwrap();
        // classification (and its warning) happens in `call`
        let fut = tracing::dispatcher::with_default(&dispatch, || {
            one.call(Request::get("/").body(()).unwrap())
        });
        let resp = fut.await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
    }
    assert_eq!(metrics.outcome("no_client_addr"), 3);
    let text = cap.text();
    assert_eq!(
        text.matches("found no client address").count(),
        1,
        "warned once: {text}"
    );
    // Fail-closed answers 503.
    let closed = AdmissionLayer::new(engine(&r), keyed(limit, KeyBy::ClientIp))
        .failure_policy(FailurePolicy::closed());
    let svc = closed.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    }));
    let resp = svc
        .oneshot(Request::get("/").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    r.stop();
}

/// The breaker's state and one transition `to` in the counters and, with the exporter
/// (feature `prometheus`), in the `/metrics` text.
fn assert_breaker(metrics: &Arc<LayerMetrics>, open: bool, to: &str) {
    assert_eq!(metrics.breaker_is_open(), open);
    let (opened, closed) = metrics.breaker_transitions();
    assert_eq!(if to == "open" { opened } else { closed }, 1);
    #[cfg(feature = "prometheus")]
    {
        let text = ratelimitly_tower::Exporter::new(metrics.clone()).encode();
        let gauge = format!("ratelimitly_breaker_open {}", u8::from(open));
        assert!(text.contains(&gauge), "{text}");
        let series = format!("ratelimitly_breaker_transitions_total{{to=\"{to}\"}} 1");
        assert!(text.contains(&series), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn circuit_breaker_opens_and_closes() {
    let _s = SERIAL.lock().await;
    // The layer's logs go to a capture (the only global subscriber of this binary).
    let cap = Capture::default();
    let sub = tracing_subscriber::fmt()
        .with_writer({
            let cap = cap.clone();
            move || cap.clone()
        })
        .with_ansi(false)
        .finish();
    let global = tracing::subscriber::set_global_default(sub).is_ok();
    let r = responder_at(304, None);
    let at = r.addr();
    let e = engine(&r);
    let layer = AdmissionLayer::new(
        e,
        keyed(Limit::new(2, Duration::from_secs(60)).unwrap(), KeyBy::Path),
    )
    .circuit_breaker(CircuitBreaker::new(3, Duration::from_millis(200)));
    let metrics = layer.metrics();
    let addr = listen(layer.layer(tower::service_fn(ok))).await;
    assert_eq!(raw_get(LOCAL1, addr, "/a", &[]).await.status, 200);
    r.stop();
    // Three timeouts (each waits the horizon, fail-open) open the breaker.
    for _ in 0..3 {
        assert_eq!(raw_get(LOCAL1, addr, "/b", &[]).await.status, 200);
    }
    assert!(metrics.breaker_is_open());
    assert_eq!(metrics.outcome("timeout"), 3);
    // Now decisions come at once: no horizon wait, the failure policy applies.
    let before = metrics.short_circuits();
    let t0 = Instant::now();
    assert_eq!(raw_get(LOCAL1, addr, "/b", &[]).await.status, 200);
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(metrics.short_circuits(), before + 1);
    assert_breaker(&metrics, true, "open");
    if global {
        // The first timeout is logged at warn!, the next ones (within 10 s) are not; the
        // breaker's opening is logged.
        let logs = cap.text();
        let timeouts = logs
            .lines()
            .filter(|l| {
                l.contains("WARN") && l.contains("admission failed") && l.contains("kind=timeout")
            })
            .count();
        assert_eq!(timeouts, 1, "{logs}");
        assert!(logs.contains("fail-open"), "{logs}");
        assert!(logs.contains("circuit breaker open"), "{logs}");
    }
    // The responder comes back on the same address: a probe closes the breaker.
    let r = responder_at(304, Some(at));
    let mut closed = false;
    for _ in 0..50 {
        raw_get(LOCAL1, addr, "/probe", &[]).await;
        if !metrics.breaker_is_open() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(closed, "breaker closed after the responder returned");
    // Limiting resumes.
    assert_eq!(raw_get(LOCAL1, addr, "/c", &[]).await.status, 200);
    assert_eq!(raw_get(LOCAL1, addr, "/c", &[]).await.status, 200);
    assert_eq!(raw_get(LOCAL1, addr, "/c", &[]).await.status, 429);
    assert_breaker(&metrics, false, "closed");
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_keeps_its_engine_alive() {
    let _s = SERIAL.lock().await;
    let r = responder_at(305, None);
    let e = Arc::new(engine(&r));
    let layer = AdmissionLayer::new(
        e.clone(),
        keyed(Limit::new(1, Duration::from_secs(60)).unwrap(), KeyBy::Path),
    );
    assert!(layer.admission().owns_engine());
    let metrics = layer.metrics();
    drop(e); // the application's own reference
    let addr = listen(layer.layer(tower::service_fn(ok))).await;
    assert_eq!(raw_get(LOCAL1, addr, "/k", &[]).await.status, 200);
    assert_eq!(raw_get(LOCAL1, addr, "/k", &[]).await.status, 429);
    assert_eq!(metrics.outcome("stopped"), 0);
    r.stop();
}

/// The other half of the engine kept alive: a bare handle does not keep it, and a
/// stopped engine is logged at `error!` (not a silent fail-open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_engine_is_logged_at_error() {
    use tracing::instrument::WithSubscriber as _;
    let _s = SERIAL.lock().await;
    let r = responder_at(308, None);
    let e = engine(&r);
    let layer = AdmissionLayer::new(
        e.handle(),
        keyed(Limit::new(1, Duration::from_secs(60)).unwrap(), KeyBy::Path),
    );
    assert!(!layer.admission().owns_engine());
    let metrics = layer.metrics();
    e.shutdown();
    let cap = Capture::default();
    let sub = tracing_subscriber::fmt()
        .with_writer({
            let cap = cap.clone();
            move || cap.clone()
        })
        .with_ansi(false)
        .finish();
    let dispatch = tracing::Dispatch::new(sub);
    let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    }));
    for _ in 0..2 {
        let resp = svc
            .clone()
            .oneshot(Request::get("/s").body(()).unwrap())
            .with_subscriber(dispatch.clone())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "fail-open by default");
    }
    assert_eq!(metrics.outcome("stopped"), 2);
    let text = cap.text();
    let errors = text
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("engine stopped"))
        .count();
    assert_eq!(errors, 1, "logged once (rate-limited): {text}");
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rejection_hook_shapes_the_429() {
    let _s = SERIAL.lock().await;
    let r = responder_at(306, None);
    let e = Arc::new(engine(&r));
    let limit = Limit::new(1, Duration::from_secs(3)).unwrap();
    let layer = AdmissionLayer::new(&e, keyed(limit, KeyBy::Path)).on_rejection(|rej| {
        Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header("content-type", "application/json")
            .body(Bytes::from(format!(
                "{{\"error\":\"slow down\",\"retry_after\":{}}}",
                rej.retry_after.as_secs()
            )))
            .unwrap()
    });
    let addr = listen(layer.layer(tower::service_fn(ok))).await;
    assert_eq!(raw_get(LOCAL1, addr, "/h", &[]).await.status, 200);
    let a = raw_get(LOCAL1, addr, "/h", &[]).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("content-type"), Some("application/json"));
    assert_eq!(a.body, "{\"error\":\"slow down\",\"retry_after\":3}");
    assert_eq!(a.header("retry-after"), Some("3"));
    assert_eq!(a.header("ratelimit"), Some("\"http\";r=0;t=3"));
    assert_eq!(a.header("ratelimit-policy"), Some("\"http\";q=1;w=3"));
    // A hook's own Retry-After and fields are kept; the fields can be turned off.
    let own = AdmissionLayer::new(&e, keyed(limit, KeyBy::Path).prefix("own"))
        .ratelimit_fields(false)
        .on_rejection(|_| {
            Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .header("retry-after", "99")
                .body(Bytes::new())
                .unwrap()
        });
    let addr = listen(own.layer(tower::service_fn(ok))).await;
    let g = raw_get(LOCAL1, addr, "/h", &[]).await;
    assert_eq!(g.status, 200);
    assert_eq!(g.header("ratelimit"), None);
    let a = raw_get(LOCAL1, addr, "/h", &[]).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("retry-after"), Some("99"));
    assert_eq!(a.header("ratelimit"), None);
    drop(e);
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_bad_endpoints() {
    let _s = SERIAL.lock().await;
    let r = responder_at(307, None);
    let unused = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead = unused.local_addr().unwrap();
    drop(unused);
    let eps = [
        Endpoint {
            server_id: 307,
            addr: r.addr(),
        },
        Endpoint {
            server_id: 999,
            addr: r.addr(),
        },
        Endpoint {
            server_id: 307,
            addr: dead,
        },
    ];
    let checks = verify(&key(), &eps).await;
    assert_eq!(checks.len(), 3);
    assert!(checks[0].is_ok(), "{:?}", checks[0]);
    assert_eq!(
        checks[1].problem,
        Some(EndpointProblem::WrongServerId),
        "{:?}",
        checks[1]
    );
    assert_eq!(
        checks[2].problem,
        Some(EndpointProblem::NoAnswer),
        "{:?}",
        checks[2]
    );
    let _ = std::io::stderr().flush();
    r.stop();
}
