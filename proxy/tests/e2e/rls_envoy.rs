//! `rl-proxy --mode rls` behind a real Envoy 1.40 (the HTTP rate limit filter with a
//! `remote_address` action), configured by `proxy/conf/envoy-rls.yaml` and
//! `proxy/conf/rls-edge.yaml` (the text `proxy/README.md` documents): 3 × 200 then 429
//! with `Retry-After` and the RateLimit fields, another client address (127.0.0.3) with
//! a bucket of its own, and `failure_mode_deny` both ways with the responder stopped
//! (the shipped `true`: 503 with `Retry-After`; `false`, the test's own edit: forwarded).
//! The failure matrix's row (`failure_matrix_envoy_rate_limit_filter`): Ratelimitly down
//! with `--on-failure open` forwards, `closed` is 429, rl-proxy down is 503.
//!
//! A missing Envoy binary skips the test with a message, unless `RL_REQUIRE_PROXIES=1`
//! (CI), where it fails.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::*;
use http::StatusCode;
use tokio::process::{Child, Command};

const ENVOY_CONF: &str = include_str!("../../conf/envoy-rls.yaml");
const RULES: &str = include_str!("../../conf/rls-edge.yaml");

/// An Envoy process, killed on drop, with its log.
struct Envoy {
    child: Child,
    port: u16,
    log: PathBuf,
    conf: PathBuf,
}

impl Envoy {
    fn start(bin: &Path, upstream: SocketAddr, rl: SocketAddr, deny: bool) -> Envoy {
        let port = free_port();
        let tag = format!("{}-{deny}", std::process::id());
        let conf = std::env::temp_dir().join(format!("rl-proxy-envoy-{tag}.yaml"));
        let log = std::env::temp_dir().join(format!("rl-proxy-envoy-{tag}.log"));
        let text = ENVOY_CONF
            .replace("{LISTEN_PORT}", &port.to_string())
            .replace("{UPSTREAM_PORT}", &upstream.port().to_string())
            .replace("{RL_PROXY_PORT}", &rl.port().to_string());
        // the shipped file fails closed; the other value is the test's own edit
        let shipped = "failure_mode_deny: true";
        assert!(text.contains(shipped), "envoy-rls.yaml: {shipped}");
        let text = text.replace(shipped, &format!("failure_mode_deny: {deny}"));
        std::fs::write(&conf, text).unwrap();
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .args([
                "--concurrency",
                "1",
                "-l",
                "warning",
                "--disable-hot-restart",
            ])
            .arg("--log-path")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("envoy starts");
        Envoy {
            child,
            port,
            log,
            conf,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Polls the port (at most 20 s) until it accepts.
    async fn wait_ready(mut self) -> Envoy {
        for _ in 0..400 {
            if tokio::net::TcpStream::connect(self.addr()).await.is_ok() {
                return self;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("envoy exited with {status}: {}", self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("envoy not listening within 20 s: {}", self.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.conf);
        let _ = std::fs::remove_file(&self.log);
    }
}

fn header<'a>(r: &'a http::Response<bytes::Bytes>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_real_envoy() {
    let Some(bin) = front_binary(FrontTool::Envoy) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let r = responder(611);
    let up = upstream().await;
    let rules = TempFile::new("rls-edge.yaml", RULES);
    // no --on-failure: a call without a decision is UNAVAILABLE, Envoy's
    // failure_mode_deny decides
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--mode",
        "rls",
        "--config",
        rules.path(),
        "--endpoint",
        &endpoint(&r),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    let rl = start(cmd).await;
    let open = Envoy::start(&bin, up.addr(), rl.addr(), false)
        .wait_ready()
        .await;
    let closed = Envoy::start(&bin, up.addr(), rl.addr(), true)
        .wait_ready()
        .await;

    for left in [2, 1, 0] {
        let resp = get_from("127.0.0.2", open.addr(), "/orders", &[]).await;
        assert_eq!(resp.status(), StatusCode::OK, "{}", open.log_text());
        assert_eq!(resp.body().as_ref(), UPSTREAM_BODY, "reached the upstream");
        assert_eq!(
            header(&resp, "ratelimit-policy"),
            Some("\"remote_address\";q=3;w=60")
        );
        let want = format!("\"remote_address\";r={left};t=60");
        assert_eq!(header(&resp, "ratelimit"), Some(want.as_str()));
    }
    let resp = get_from("127.0.0.2", open.addr(), "/orders", &[]).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&resp), 60);
    assert_eq!(
        header(&resp, "ratelimit"),
        Some("\"remote_address\";r=0;t=60")
    );
    assert_eq!(
        header(&resp, "ratelimit-policy"),
        Some("\"remote_address\";q=3;w=60")
    );
    assert_ne!(resp.body().as_ref(), UPSTREAM_BODY, "not forwarded");
    // another downstream address: its own bucket (through the other Envoy too)
    let resp = get_from("127.0.0.3", open.addr(), "/orders", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let resp = get_from("127.0.0.3", closed.addr(), "/orders", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        header(&resp, "ratelimit"),
        Some("\"remote_address\";r=1;t=60")
    );

    // the service gone: failure_mode_deny false lets requests through, true refuses them
    r.stop();
    let resp = get_from("127.0.0.4", open.addr(), "/orders", &[]).await;
    assert_eq!(resp.status(), StatusCode::OK, "fail open");
    assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    let resp = get_from("127.0.0.4", closed.addr(), "/orders", &[]).await;
    // status_on_error: 503, not Envoy's 500, with Retry-After (local_reply_config)
    assert_eq!(
        resp.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "fail closed"
    );
    assert_eq!(retry_after(&resp), 1);
    let m = metrics_of(&rl).await;
    assert_eq!(m["rl_proxy_rls_calls_total{answer=\"unavailable\"}"], 2.0);

    // no field of envoy-rls.yaml is deprecated (Envoy warns at start)
    assert!(
        !open.log_text().contains("deprecated"),
        "{}",
        open.log_text()
    );
    drop(open);
    drop(closed);
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
}

/// A loopback UDP port where nothing listens: an endpoint there is "Ratelimitly down".
fn dead_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// `rl-proxy --mode rls` on `port` with `--on-failure on_failure` and a dead endpoint.
async fn failing_rls(port: u16, rules: &TempFile, on_failure: &str) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .env("RUST_LOG", "error")
        .args([
            "--mode",
            "rls",
            "--config",
            rules.path(),
            "--endpoint",
            &format!("612@127.0.0.1:{}", dead_udp_port()),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--admin-listen",
            "127.0.0.1:0",
            "--on-failure",
            on_failure,
        ]);
    start(cmd).await
}

/// 8 requests (more than the 5 failures that open rl-proxy's circuit breaker) through
/// `envoy`: each must be `want` (with `Retry-After` for a 503) within 5 s; reports the
/// statuses and the waits on standard error (the README's failure matrix).
async fn matrix_cell(envoy: &Envoy, scenario: &str, want: StatusCode) {
    let mut waits = Vec::new();
    let mut first_retry = None;
    for i in 0..8 {
        let t0 = std::time::Instant::now();
        let resp = get_from("127.0.0.2", envoy.addr(), "/orders", &[]).await;
        let wait = t0.elapsed();
        assert_eq!(
            resp.status(),
            want,
            "{scenario}, request {i}: {}",
            envoy.log_text()
        );
        assert!(wait < Duration::from_secs(5), "{scenario}: {wait:?}");
        if want == StatusCode::OK {
            assert_eq!(resp.body().as_ref(), UPSTREAM_BODY, "{scenario}: forwarded");
        } else {
            assert_ne!(resp.body().as_ref(), UPSTREAM_BODY, "{scenario}: refused");
        }
        if want == StatusCode::SERVICE_UNAVAILABLE {
            assert!(resp.headers().contains_key("retry-after"), "{scenario}");
        }
        if i == 0 {
            first_retry = header(&resp, "retry-after").map(str::to_owned);
        }
        waits.push(wait.as_secs_f64() * 1000.0);
    }
    let later = waits[5..].iter().copied().fold(0.0, f64::max);
    let max = waits.iter().copied().fold(0.0, f64::max);
    eprintln!(
        "failure matrix | Envoy rate limit filter | {scenario} | {want} retry-after {first_retry:?} | first {:.1} ms, max {max:.1} ms, after the 5th at most {later:.1} ms",
        waits[0]
    );
}

/// The failure matrix through the shipped envoy-rls.yaml (failure_mode_deny: true):
/// Ratelimitly down with `--on-failure open` (forwarded) and `closed` (429), then
/// rl-proxy itself down (503 with Retry-After, status_on_error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix_envoy_rate_limit_filter() {
    let Some(bin) = front_binary(FrontTool::Envoy) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let rules = TempFile::new("rls-edge-matrix.yaml", RULES);
    let port = free_port();
    let rl_addr = SocketAddr::from(([127, 0, 0, 1], port));
    let rl = failing_rls(port, &rules, "open").await;
    let envoy = Envoy::start(&bin, up.addr(), rl_addr, true)
        .wait_ready()
        .await;
    matrix_cell(&envoy, "Ratelimitly down, open", StatusCode::OK).await;
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));

    let rl = failing_rls(port, &rules, "closed").await;
    // Envoy's connection to the previous rl-proxy is gone: a first call may fail
    // (failure_mode_deny) until it has reconnected
    for _ in 0..50 {
        let resp = get_from("127.0.0.9", envoy.addr(), "/orders", &[]).await;
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    matrix_cell(
        &envoy,
        "Ratelimitly down, closed",
        StatusCode::TOO_MANY_REQUESTS,
    )
    .await;
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));

    matrix_cell(&envoy, "rl-proxy down", StatusCode::SERVICE_UNAVAILABLE).await;
    drop(envoy);
    up.signal(libc::SIGTERM).await;
}

/// `proxy/README.md` shows the Envoy and rule configurations exactly as tested.
#[test]
fn readme_shows_the_tested_configurations() {
    let readme = include_str!("../../README.md");
    assert!(
        readme.contains(ENVOY_CONF),
        "README's Envoy block is conf/envoy-rls.yaml"
    );
    assert!(
        readme.contains(RULES),
        "README's rule block is conf/rls-edge.yaml"
    );
}
