//! rl-proxy says what is wrong, as a black box: the cause of failing decisions in the log
//! (once, at warn, naming what the probe found: another server id with both ids, a
//! closed port), `GET /readyz` (503 with the reason while no decision can be made, 200
//! with the right endpoint), the cause per endpoint in `/metrics`, the log's directives
//! (`RUST_LOG`) and format (`--log-format json`), and per-route observability (a route's
//! label names its `RateLimit-Policy` and its series).

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use http::StatusCode;
use tokio::process::Command;

fn body(r: &http::Response<bytes::Bytes>) -> String {
    String::from_utf8_lossy(r.body()).into_owned()
}

/// rl-proxy in front of `up` asking `ep`, closed on failure, its log in `log`, with
/// `env` set.
async fn proxy_logging(
    up: &Proc,
    ep: &str,
    log: &TempFile,
    env: &[(&str, &str)],
    args: &[&str],
) -> Proc {
    let mut cmd = proxy_cmd(up, &["--endpoint", ep, "--on-failure", "closed"]);
    cmd.env_remove("RUST_LOG").args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    start_with_stderr(cmd, std::fs::File::create(log.path()).unwrap().into()).await
}

fn read(log: &TempFile) -> String {
    std::fs::read_to_string(log.path()).unwrap()
}

/// A UDP port nothing listens on (bound, then closed).
fn closed_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// The README's mistake: an endpoint id that is not the server's. The start probe names
/// both ids at warn, `/readyz` is 503 with that reason (while `/healthz` stays ok), and
/// the metrics say `other_server_id`; the right id is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_server_id_is_named_and_not_ready() {
    let _s = SERIAL.lock().await;
    let r = responder(701);
    let up = upstream().await;
    let wrong = format!("12345@{}", r.addr());
    let log = TempFile::new("diag-wrong-id.log", "");
    let p = proxy_logging(&up, &wrong, &log, &[], &[]).await;
    let ready = get(p.admin(), "/readyz").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    let why = body(&ready);
    assert!(
        why.contains("server id 701") && why.contains("claims server id 12345"),
        "{why}"
    );
    assert_eq!(body(&ready).lines().count(), 1, "one line: {why}");
    assert_eq!(get(p.admin(), "/healthz").await.status(), StatusCode::OK);
    let text = read(&log);
    let line = text
        .lines()
        .find(|l| l.contains("server id 701"))
        .unwrap_or_else(|| panic!("the cause is logged: {text}"));
    assert!(line.contains("WARN") && line.contains("12345"), "{line}");
    // closed: the client is refused, never forwarded
    assert_eq!(
        get(p.addr(), "/x").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let m = metrics_of(&p).await;
    assert_eq!(m["rl_proxy_ready"], 0.0);
    let series =
        format!("rl_proxy_endpoint_cause{{endpoint=\"{wrong}\",cause=\"other_server_id\"}}");
    assert_eq!(m[&series], 1.0, "{m:?}");
    // failing requests do not repeat the cause in the log
    for _ in 0..3 {
        get(p.addr(), "/x").await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        read(&log).matches("claims server id 12345").count(),
        2,
        "{}",
        read(&log)
    );
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));

    let right = TempFile::new("diag-right-id.log", "");
    let p = proxy_logging(&up, &endpoint(&r), &right, &[], &[]).await;
    assert_eq!(get(p.admin(), "/readyz").await.status(), StatusCode::OK);
    assert_eq!(get(p.addr(), "/x").await.status(), StatusCode::OK);
    let m = metrics_of(&p).await;
    assert_eq!(m["rl_proxy_ready"], 1.0);
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// A closed port is named as such (ICMP port unreachable), and the service says so
/// again when it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_is_named() {
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let ep = format!("9@127.0.0.1:{}", closed_udp_port());
    let log = TempFile::new("diag-closed.log", "");
    let p = proxy_logging(&up, &ep, &log, &[], &[]).await;
    let ready = get(p.admin(), "/readyz").await;
    assert_eq!(ready.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        body(&ready).contains("port unreachable"),
        "{}",
        body(&ready)
    );
    assert!(read(&log).contains("port unreachable"), "{}", read(&log));
    let m = metrics_of(&p).await;
    let series = format!("rl_proxy_endpoint_cause{{endpoint=\"{ep}\",cause=\"port_unreachable\"}}");
    assert_eq!(m[&series], 1.0, "{m:?}");
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
}

/// `RUST_LOG` takes directives (`rl_proxy=debug` shows rl-proxy's debug lines);
/// `--log-format json` writes only JSON objects with timestamp, level, target and
/// message; a bad format or directive exits 2 naming what is valid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_directives_and_json_lines() {
    let _s = SERIAL.lock().await;
    let r = responder(702);
    let up = upstream().await;
    let wrong = format!("1@{}", r.addr());
    let log = TempFile::new("diag-debug.log", "");
    let env = [("RUST_LOG", "rl_proxy=debug")];
    let p = proxy_logging(&up, &wrong, &log, &env, &[]).await;
    p.signal(libc::SIGTERM).await;
    let text = read(&log);
    assert!(
        text.lines()
            .any(|l| l.contains("DEBUG") && l.contains("rl_proxy")),
        "{text}"
    );
    assert!(
        !text.lines().any(|l| l.contains("DEBUG ratelimitly_engine")),
        "{text}"
    );

    let log = TempFile::new("diag-json.log", "");
    let env = [("RUST_LOG", "debug")];
    let p = proxy_logging(&up, &wrong, &log, &env, &["--log-format", "json"]).await;
    get(p.addr(), "/x").await;
    p.signal(libc::SIGTERM).await;
    let text = read(&log);
    assert!(text.lines().count() >= 3, "{text}");
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        for k in ["timestamp", "level", "target", "message"] {
            assert!(v.get(k).is_some(), "{k} in {line}");
        }
    }
    assert!(
        text.contains("\"level\":\"WARN\"") && text.contains("server id 702"),
        "{text}"
    );

    let mut bad = proxy_cmd(&up, &["--endpoint", &wrong, "--log-format", "yaml"]);
    bad.stdout(Stdio::null());
    let (code, err) = run_to_exit(bad).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("text") && err.contains("json"), "{err}");
    let mut bad = proxy_cmd(&up, &["--endpoint", &wrong]);
    bad.env("RUST_LOG", "rl_proxy=loud");
    let (code, err) = run_to_exit(bad).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("RUST_LOG"), "{err}");
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// A route's label names its policy in `RateLimit-Policy`, and `/metrics` has its
/// series (decisions by outcome, decision latency), in proxy and forward-auth modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_have_their_own_policy_name_and_series() {
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let routes = "[[route]]\npath = \"/api/\"\nlimit = \"2/60s\"\nlabel = \"api\"\n\n\
                  [[route]]\npath = \"/\"\nlimit = \"off\"\n";
    for (mode, id) in [("proxy", 703), ("forward-auth", 704)] {
        // a responder each: the same route's buckets
        let r = responder(id);
        let file = TempFile::new(
            &format!("diag-routes-{mode}.toml"),
            &if mode == "proxy" {
                format!("upstream = \"http://{}\"\n{routes}", up.addr())
            } else {
                routes.to_owned()
            },
        );
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
        cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
            "--mode",
            mode,
            "--endpoint",
            &endpoint(&r),
            "--config",
            file.path(),
        ]);
        let p = start(cmd).await;
        for want in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let resp = get(p.addr(), "/api/x").await;
            assert_eq!(resp.status(), want, "{mode}");
            let policy = resp.headers()["ratelimit-policy"].to_str().unwrap();
            assert!(policy.starts_with("\"api\";q=2;w=60"), "{mode}: {policy}");
        }
        let m = metrics_of(&p).await;
        let n =
            |o: &str| m[&format!("rl_proxy_route_requests_total{{route=\"api\",outcome=\"{o}\"}}")];
        assert_eq!((n("granted"), n("rejected")), (2.0, 1.0), "{mode}");
        assert_eq!(
            m["rl_proxy_route_decision_latency_seconds_count{route=\"api\"}"],
            3.0
        );
        assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
        r.stop();
    }
    up.signal(libc::SIGTERM).await;
}
