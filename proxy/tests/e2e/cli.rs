//! The `rl-proxy` binary end to end: real processes, real listeners, a real HTTP client,
//! our responder as the Ratelimitly service and `rl-upstream` as the upstream.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::process::Command;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_rejects_metrics_healthz_and_sigterm() {
    let _s = SERIAL.lock().await;
    let r = responder(201);
    let up = upstream().await;
    let ep = endpoint(&r);
    let proxy = start(proxy_cmd(
        &up,
        &["--endpoint", &ep, "--limit", "2/60s", "--key-by", "path"],
    ))
    .await;
    for _ in 0..2 {
        let resp = get(proxy.addr(), "/orders?id=1").await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.body().as_ref(), UPSTREAM_BODY, "proxied unchanged");
    }
    let resp = get(proxy.addr(), "/orders?id=1").await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    // The service's window slides and it does not say when its grants leave it: an
    // unchanged retry is certain to be admitted only after the whole 60 s window.
    assert_eq!(retry_after(&resp), 60);

    let health = get(proxy.admin(), "/healthz").await;
    assert_eq!(health.status(), StatusCode::OK);
    let metrics = get(proxy.admin(), "/metrics").await;
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = String::from_utf8(metrics.body().to_vec()).unwrap();
    let m = parse_prometheus(&text);
    let v = |k: &str| *m.get(k).unwrap_or_else(|| panic!("missing {k} in\n{text}"));
    assert_eq!(v("ratelimitly_requests_total{outcome=\"granted\"}"), 2.0);
    assert_eq!(v("ratelimitly_requests_total{outcome=\"rejected\"}"), 1.0);
    assert_eq!(v("ratelimitly_decision_latency_seconds_count"), 3.0);
    assert!(v("ratelimitly_datagrams_sent_total") >= 3.0);
    assert!(m.contains_key("ratelimitly_responses_dropped_total{reason=\"truncated\"}"));
    assert!(m.contains_key("ratelimitly_in_flight{core=\"0\"}"));
    assert_eq!(
        get(proxy.admin(), "/nope").await.status(),
        StatusCode::NOT_FOUND
    );

    let status = proxy.signal(libc::SIGTERM).await;
    assert_eq!(status.code(), Some(0), "SIGTERM exits 0");
    assert_eq!(up.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_failure_open_forwards_and_closed_answers_503() {
    let _s = SERIAL.lock().await;
    let r = responder(202);
    let ep = endpoint(&r);
    r.stop();
    let up = upstream().await;
    let open = start(proxy_cmd(&up, &["--endpoint", &ep, "--on-failure", "open"])).await;
    let closed = start(proxy_cmd(
        &up,
        &["--endpoint", &ep, "--on-failure", "closed"],
    ))
    .await;
    let resp = get(open.addr(), "/").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    assert_eq!(
        get(closed.addr(), "/").await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    let text = String::from_utf8(get(closed.admin(), "/metrics").await.body().to_vec()).unwrap();
    assert_eq!(
        parse_prometheus(&text)["ratelimitly_requests_total{outcome=\"timeout\"}"],
        1.0
    );
    assert_eq!(
        open.signal(libc::SIGINT).await.code(),
        Some(0),
        "SIGINT exits 0"
    );
    assert_eq!(closed.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_key_or_arguments_exit_2_without_echoing_the_key() {
    let _s = SERIAL.lock().await;
    let secret = "rl-aes1qypsqqqqqqqqqqqrSECRETSECRETqvpsxqcrqvpsxqcrq";
    let base = |key: Option<&str>, args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
        cmd.env_remove("RATELIMITLY_API_KEY");
        if let Some(k) = key {
            cmd.env("RATELIMITLY_API_KEY", k);
        }
        cmd.args([
            "--upstream",
            "http://127.0.0.1:9",
            "--endpoint",
            "7@127.0.0.1:9",
        ])
        .args(args);
        cmd
    };
    let (code, err) = run_to_exit(base(Some(secret), &[])).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(!err.contains("SECRET"), "the key is echoed: {err}");
    assert!(err.contains("invalid API key"), "{err}");
    let (code, err) = run_to_exit(base(None, &[])).await;
    assert_eq!(code, Some(2), "{err}");
    for bad in [
        &["--limit", "0/1s"][..],
        &["--limit", "10"],
        &["--key-by", "cookie"],
        &["--on-failure", "maybe"],
        &["--admission", "other"],
        &["--listen", "nowhere"],
        &["--header-timeout", "10"],
        &["--idle-timeout", "0s"],
        &["--upstream-timeout", "soon"],
        &["--max-connections", "0"],
    ] {
        let (code, err) = run_to_exit(base(Some(NONE_KEY), bad)).await;
        assert_eq!(code, Some(2), "{bad:?}: {err}");
    }
    // Neither --endpoint nor --domain.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .args(["--upstream", "http://127.0.0.1:9"]);
    assert_eq!(run_to_exit(cmd).await.0, Some(2));
    // Not an http upstream.
    let mut cmd = base(Some(NONE_KEY), &[]);
    cmd.args(["--upstream", "ftp://x"]);
    assert_eq!(run_to_exit(cmd).await.0, Some(2));
}

/// The CPUs this test process may use (sched_getaffinity).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: plain-data set filled by the kernel.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Under `taskset -c N` with N > 0 (a CPU set not starting at CPU 0), the engine takes
/// its core from that set and the proxy serves, with the core pinned or hosted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_inside_a_cpu_set_not_starting_at_zero() {
    let _s = SERIAL.lock().await;
    let Some(cpu) = allowed_cpus().into_iter().find(|&c| c > 0) else {
        eprintln!("skipped: this process may only run on CPU 0");
        return;
    };
    if std::process::Command::new("taskset")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: taskset is not installed");
        return;
    }
    let r = responder(203);
    let up = upstream().await;
    // a pinned core takes its CPU from the set; a hosted one runs on the proxy's runtime
    for core in ["pinned", "hosted"] {
        let mut cmd = Command::new("taskset");
        cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
            .args(["-c", &cpu.to_string()])
            .arg(env!("CARGO_BIN_EXE_rl-proxy"))
            .args(["--upstream", &format!("http://{}", up.addr())])
            .args(["--endpoint", &endpoint(&r), "--limit", "5/60s"])
            .args(["--engine-core", core]);
        let proxy = start(cmd).await;
        let resp = get(proxy.addr(), "/").await;
        assert_eq!(resp.status(), StatusCode::OK, "{core}");
        assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
        let text = String::from_utf8(get(proxy.admin(), "/metrics").await.body().to_vec()).unwrap();
        assert_eq!(
            parse_prometheus(&text)["ratelimitly_requests_total{outcome=\"granted\"}"],
            1.0,
            "{core}: decided by the engine, not failed open"
        );
        assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    }
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// Discovery through DNS (hickory-resolver against our test DNS responder), for the
/// engine and for the official crate behind the same layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_through_dns_with_either_admission() {
    let _s = SERIAL.lock().await;
    let r = responder(204);
    let dns = rl_responder::dns::spawn("proxy.test", vec![(r.server_id(), vec![r.addr()])])
        .expect("dns responder");
    let up = upstream().await;
    let dns_addr = dns.addr().to_string();
    for (admission, path) in [("engine", "/e"), ("official", "/o")] {
        let proxy = start(proxy_cmd(
            &up,
            &[
                "--domain",
                "proxy.test",
                "--dns-server",
                &dns_addr,
                "--limit",
                "1/60s",
                "--key-by",
                "path",
                "--admission",
                admission,
                "--on-failure",
                "closed",
            ],
        ))
        .await;
        assert_eq!(
            get(proxy.addr(), path).await.status(),
            StatusCode::OK,
            "{admission}"
        );
        let resp = get(proxy.addr(), path).await;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{admission}");
        assert_eq!(retry_after(&resp), 60, "{admission}");
        assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    }
    up.signal(libc::SIGTERM).await;
    dns.stop();
    r.stop();
}

/// `--limit off` is the baseline: no admission, no key needed, requests proxied as is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_off_proxies_without_a_key() {
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env_remove("RATELIMITLY_API_KEY").args([
        "--upstream",
        &format!("http://{}", up.addr()),
        "--limit",
        "off",
    ]);
    let proxy = start(cmd).await;
    for _ in 0..3 {
        let resp = get(proxy.addr(), "/x").await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    }
    let text = String::from_utf8(get(proxy.admin(), "/metrics").await.body().to_vec()).unwrap();
    assert_eq!(
        parse_prometheus(&text)["ratelimitly_requests_total{outcome=\"granted\"}"],
        0.0
    );
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    let dead = up.addr();
    up.signal(libc::SIGTERM).await;

    // An upstream that is gone: 502 Bad Gateway, and the proxy keeps serving.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env_remove("RATELIMITLY_API_KEY").args([
        "--upstream",
        &format!("http://{dead}"),
        "--limit",
        "off",
    ]);
    let proxy = start(cmd).await;
    for _ in 0..2 {
        assert_eq!(
            get(proxy.addr(), "/").await.status(),
            StatusCode::BAD_GATEWAY
        );
    }
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
}

/// When the peer closed `s`, measured from `since`; `None` when still open at
/// `since + limit`. Data read before the end is ignored.
async fn closed_by(
    s: &mut (impl AsyncRead + Unpin),
    since: Instant,
    limit: Duration,
) -> Option<Duration> {
    let mut buf = [0u8; 1024];
    // bounded by the deadline: every read is cut at it
    loop {
        match tokio::time::timeout_at(since + limit, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(since.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}

/// Reads from `s` until `needle` has been seen (within 10 s); returns all read.
async fn read_until(s: &mut TcpStream, needle: &[u8]) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(needle.len()).any(|w| w == needle) {
        let n = tokio::time::timeout_at(deadline, s.read(&mut buf))
            .await
            .expect("answer within 10 s")
            .expect("read");
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// One request on an open connection; asserts a 200 with the upstream's body.
async fn request_on(s: &mut TcpStream, path: &str) {
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: proxy.test\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let got = read_until(s, UPSTREAM_BODY).await;
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
}

/// `--header-timeout 1s`: a silent connection and one trickling an unfinished head are
/// closed within 1 s plus 2 s. `--idle-timeout 3s`: a keep-alive connection idle past
/// the header timeout still serves, and is closed after 3 s without traffic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_and_idle_timeouts_close_connections() {
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let proxy = plain_proxy(&up, &["--header-timeout", "1s", "--idle-timeout", "3s"]).await;

    let silent_since = Instant::now();
    let mut silent = TcpStream::connect(proxy.addr()).await.unwrap();
    let slow_since = Instant::now();
    let slow = TcpStream::connect(proxy.addr()).await.unwrap();
    let (mut slow_rd, mut slow_wr) = slow.into_split();
    let trickle = tokio::spawn(async move {
        if slow_wr
            .write_all(b"GET / HTTP/1.1\r\nHost: proxy.test\r\nX-Slow: ")
            .await
            .is_err()
        {
            return;
        }
        // a byte every 200 ms, at most 30 (6 s), until the proxy closes
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if slow_wr.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    let limit = Duration::from_secs(3);
    let t = closed_by(&mut silent, silent_since, limit).await;
    assert!(t.is_some(), "a silent connection is open after 3 s");
    assert!(t.unwrap() >= Duration::from_millis(900), "{t:?}");
    let t = closed_by(&mut slow_rd, slow_since, limit).await;
    assert!(t.is_some(), "a trickling head is open after 3 s");
    assert!(t.unwrap() >= Duration::from_millis(900), "{t:?}");
    trickle.abort();

    // keep-alive: idle past the header timeout, within the idle timeout, still serves
    let mut ka = TcpStream::connect(proxy.addr()).await.unwrap();
    request_on(&mut ka, "/a").await;
    tokio::time::sleep(Duration::from_millis(1600)).await;
    request_on(&mut ka, "/b").await;
    let idle_since = Instant::now();
    let t = closed_by(&mut ka, idle_since, Duration::from_secs(5)).await;
    assert!(t.is_some(), "an idle connection is open after 5 s");
    assert!(t.unwrap() >= Duration::from_millis(2500), "{t:?}");

    let m = metrics_of(&proxy).await;
    assert_eq!(
        m["rl_proxy_connections_timed_out_total{timeout=\"header\"}"],
        2.0
    );
    assert_eq!(
        m["rl_proxy_connections_timed_out_total{timeout=\"idle\"}"],
        1.0
    );
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
}

/// `--upstream-timeout 1s`: an upstream that takes 5 s is answered 504 within 1 s plus
/// 1.5 s; a quick one still 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_upstream_is_answered_504() {
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let proxy = plain_proxy(&up, &["--upstream-timeout", "1s"]).await;
    let t = Instant::now();
    let resp = get(proxy.addr(), "/slow/5000").await;
    let took = t.elapsed();
    assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(took >= Duration::from_millis(900), "{took:?}");
    assert!(took <= Duration::from_millis(2500), "{took:?}");
    let resp = get(proxy.addr(), "/slow/100").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    assert_eq!(
        metrics_of(&proxy).await["rl_proxy_upstream_timeouts_total"],
        1.0
    );
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
}

/// `--max-connections 2`: a third connection is accepted and closed at once, counted;
/// the open ones keep serving, and once one closes a new one is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_maximum_are_closed_at_once() {
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let proxy = plain_proxy(&up, &["--max-connections", "2", "--header-timeout", "30s"]).await;
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    let b = TcpStream::connect(proxy.addr()).await.unwrap();
    wait_metric(&proxy, "rl_proxy_connections_open", 2.0).await;

    let since = Instant::now();
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    let _ = c
        .write_all(b"GET / HTTP/1.1\r\nHost: proxy.test\r\n\r\n")
        .await;
    let t = closed_by(&mut c, since, Duration::from_secs(2)).await;
    assert!(
        t.is_some(),
        "the connection beyond the maximum is open after 2 s"
    );
    let m = metrics_of(&proxy).await;
    assert_eq!(m["rl_proxy_connections_refused_total"], 1.0);
    assert_eq!(m["rl_proxy_connections_open"], 2.0);

    request_on(&mut a, "/still-served").await;
    drop(b);
    wait_metric(&proxy, "rl_proxy_connections_open", 1.0).await;
    let resp = get(proxy.addr(), "/").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    drop(a);
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
}

fn routes_file(up: SocketAddr, free_limit: &str) -> String {
    format!(
        r#"# routes for the test
upstream = "http://{}"
limit = "1/60s"
key_by = "path"

[[route]]
path = "/api/"
limit = "2/60s"
key_by = "ip"
label = "api"

[[route]]
path = "/api/free"
limit = {free_limit}

[[route]]
path = "/two"
limit = ["5/60s", "1/60s"]
"#,
        up
    )
}

/// `--config FILE --check`: 0 for a good file, 2 naming the line for a bad one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_check_names_the_line() {
    let _s = SERIAL.lock().await;
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let good = TempFile::new("check-good.toml", &routes_file(up, "\"off\""));
    let check = |path: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
        cmd.env_remove("RATELIMITLY_API_KEY")
            .args(["--config", path, "--check"]);
        cmd
    };
    let (code, err) = run_to_exit(check(good.path())).await;
    assert_eq!(code, Some(0), "{err}");
    // a limit that is not one, on line 14
    let bad = TempFile::new("check-bad.toml", &routes_file(up, "\"3/1x\""));
    let (code, err) = run_to_exit(check(bad.path())).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 14"), "{err}");
    // not TOML at all, on line 3
    let bad = TempFile::new(
        "check-syntax.toml",
        "upstream = \"http://127.0.0.1:9\"\n\n[[route]\n",
    );
    let (code, err) = run_to_exit(check(bad.path())).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 3"), "{err}");
    // --config conflicts with the one-route flags
    let mut cmd = check(good.path());
    cmd.args(["--limit", "1/1s"]);
    assert_eq!(run_to_exit(cmd).await.0, Some(2));
}

/// Routes from a file: a prefix keyed by IP, the longest match (`off`), two limits in
/// one request, the top-level default; SIGHUP applies a good file and refuses a bad one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_from_a_file_and_sighup_reload() {
    let _s = SERIAL.lock().await;
    let r = responder(205);
    let up = upstream().await;
    let file = TempFile::new("routes.toml", &routes_file(up.addr(), "\"off\""));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--config",
        file.path(),
        "--endpoint",
        &endpoint(&r),
    ]);
    let proxy = start(cmd).await;
    let status = |p: &'static str| {
        let addr = proxy.addr();
        async move { get(addr, p).await.status() }
    };
    // /api/: 2 a minute per client IP, whatever the path
    assert_eq!(status("/api/a").await, StatusCode::OK);
    assert_eq!(status("/api/b").await, StatusCode::OK);
    assert_eq!(status("/api/c").await, StatusCode::TOO_MANY_REQUESTS);
    // /api/free: the longer prefix wins, off
    for _ in 0..4 {
        let resp = get(proxy.addr(), "/api/free/x").await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    }
    // /two: 5/60s and 1/60s in one request: the second is rejected by the tighter one
    assert_eq!(status("/two").await, StatusCode::OK);
    let resp = get(proxy.addr(), "/two").await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&resp), 60);
    // no route: the top-level default, 1/60s per path
    assert_eq!(status("/other").await, StatusCode::OK);
    assert_eq!(status("/other").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/other2").await, StatusCode::OK);

    // SIGHUP with /api/free limited to 1 a minute (keyed by path, the top-level key)
    file.write(&routes_file(up.addr(), "\"1/60s\""));
    proxy.hangup();
    let mut reloaded = false;
    for _ in 0..50 {
        if status("/api/free/y").await == StatusCode::TOO_MANY_REQUESTS {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "the new routes apply after SIGHUP");
    // a bad file is refused: the running routes stay, the proxy keeps serving
    file.write("upstream = \"http://127.0.0.1:9\"\nlimit = \"many\"\n");
    proxy.hangup();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(status("/api/free/y").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status("/api/free/z").await, StatusCode::OK);
    assert_eq!(status("/api/free/z").await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// `--mode forward-auth`: no upstream; 200 when granted, the deny status with
/// Retry-After when rejected, keyed and routed by the original request's URI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_decides_on_the_original_request() {
    let _s = SERIAL.lock().await;
    let r = responder(206);
    let ep = endpoint(&r);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--mode",
        "forward-auth",
        "--endpoint",
        &ep,
        "--limit",
        "2/60s",
        "--key-by",
        "path",
    ]);
    let fa = start(cmd).await;
    let orig = |uri: &'static str| [("x-original-uri", uri), ("x-original-method", "POST")];
    for _ in 0..2 {
        let (st, _) = get_with(fa.addr(), "/auth", &orig("/a?x=1")).await;
        assert_eq!(st, StatusCode::OK);
    }
    let (st, ra) = get_with(fa.addr(), "/auth", &orig("/a?x=2")).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(ra, Some(60));
    // another original path: another bucket, whatever path the check itself has
    let (st, _) = get_with(fa.addr(), "/auth", &[("x-forwarded-uri", "/b")]).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(fa.signal(libc::SIGTERM).await.code(), Some(0));

    // with routes from a file, matched on the original URI, and --deny-status 403
    let file = TempFile::new(
        "forward-auth.toml",
        "[[route]]\npath = \"/api/\"\nlimit = \"1/60s\"\nkey_by = \"path\"\n",
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--mode",
        "forward-auth",
        "--deny-status",
        "403",
        "--endpoint",
        &ep,
        "--config",
        file.path(),
    ]);
    let fa = start(cmd).await;
    let api = [("x-forwarded-uri", "/api/x"), ("x-forwarded-method", "GET")];
    assert_eq!(get_with(fa.addr(), "/", &api).await.0, StatusCode::OK);
    let (st, ra) = get_with(fa.addr(), "/", &api).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    assert_eq!(ra, Some(60));
    for _ in 0..3 {
        let free = [("x-forwarded-uri", "/free")];
        assert_eq!(get_with(fa.addr(), "/api/x", &free).await.0, StatusCode::OK);
    }
    assert_eq!(fa.signal(libc::SIGTERM).await.code(), Some(0));
    // forward-auth takes no upstream
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--mode",
        "forward-auth",
        "--upstream",
        "http://127.0.0.1:9",
        "--limit",
        "off",
    ]);
    assert_eq!(run_to_exit(cmd).await.0, Some(2));
    r.stop();
}

/// `method path` on a new connection: the status.
async fn status_of(addr: SocketAddr, method: &str, path: &str) -> StatusCode {
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .body(http_body_util::Empty::new())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), client().request(req))
        .await
        .expect("answer within 10 s")
        .expect("HTTP exchange")
        .status()
}

/// Polls `log` (at most 5 s) until it contains `needle`; returns the text.
async fn wait_log(log: &TempFile, needle: &str) -> String {
    for _ in 0..50 {
        let text = std::fs::read_to_string(&log.0).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{needle:?} not logged: {}",
        std::fs::read_to_string(&log.0).unwrap_or_default()
    );
}

/// SIGHUP's two outcomes are both logged: a good file "config reloaded" at info (and
/// applied), a bad one "config reload refused" naming the line at warn (and the running
/// routes kept). A
/// route's `methods` restrict it end to end: POST /m limited, GET /m the default (off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_outcomes_are_logged_and_methods_restrict_a_route() {
    let _s = SERIAL.lock().await;
    let r = responder(207);
    let up = upstream().await;
    let text = |limit: &str| {
        format!(
            "upstream = \"http://{}\"\nkey_by = \"path\"\n\n[[route]]\npath = \"/m\"\nmethods = [\"POST\"]\nlimit = {limit}\n",
            up.addr()
        )
    };
    let file = TempFile::new("methods.toml", &text("\"1/60s\""));
    let log = TempFile::new("reload.log", "");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .env("RUST_LOG", "info")
        .args(["--config", file.path(), "--endpoint", &endpoint(&r)]);
    let stderr = std::fs::File::create(&log.0).unwrap();
    let proxy = start_with_stderr(cmd, stderr.into()).await;
    let a = proxy.addr();
    assert_eq!(status_of(a, "POST", "/m").await, StatusCode::OK);
    assert_eq!(
        status_of(a, "POST", "/m").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..3 {
        assert_eq!(
            status_of(a, "GET", "/m").await,
            StatusCode::OK,
            "GET is not the route's method: the default, off"
        );
    }

    // a good file: applied and logged
    file.write(&text("\"off\""));
    proxy.hangup();
    wait_log(&log, "config reloaded").await;
    for _ in 0..3 {
        assert_eq!(status_of(a, "POST", "/m").await, StatusCode::OK);
    }
    // a bad file: refused, logged with its line, the running routes kept
    file.write(&text("\"many\""));
    proxy.hangup();
    let logged = wait_log(&log, "config reload refused").await;
    assert!(logged.contains("line 7"), "{logged}");
    for _ in 0..3 {
        assert_eq!(status_of(a, "POST", "/m").await, StatusCode::OK);
    }
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// `--check` checks what each mode needs (proxy mode an upstream in the file,
/// forward-auth none) and says when a file is in the other format: exit 2 naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_knows_each_mode_and_the_other_format() {
    let _s = SERIAL.lock().await;
    let check = |mode: &str, path: &str| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
        cmd.env_remove("RATELIMITLY_API_KEY")
            .args(["--mode", mode, "--config", path, "--check"]);
        cmd
    };
    let no_upstream = TempFile::new(
        "check-no-upstream.toml",
        "limit = \"10/1s\"\n\n[[route]]\npath = \"/api/\"\nlimit = \"5/1s\"\n",
    );
    let (code, err) = run_to_exit(check("proxy", no_upstream.path())).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("proxy mode needs an upstream") && err.contains(no_upstream.path()),
        "{err}"
    );
    let (code, err) = run_to_exit(check("forward-auth", no_upstream.path())).await;
    assert_eq!(code, Some(0), "forward-auth needs no upstream: {err}");
    assert!(err.contains("ok (1 routes)"), "{err}");

    // envoyproxy/ratelimit's YAML given to proxy mode
    let yaml = TempFile::new(
        "check-envoy.yaml",
        "domain: api\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n",
    );
    for mode in ["proxy", "forward-auth"] {
        let (code, err) = run_to_exit(check(mode, yaml.path())).await;
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains("this looks like YAML (envoyproxy/ratelimit's format, for --mode rls)"),
            "{mode}: {err}"
        );
    }
    // rl-proxy's route file given to --mode rls
    let toml = TempFile::new(
        "check-routes.toml",
        "upstream = \"http://127.0.0.1:9\"\nlimit = \"5/1s\"\n\n[[route]]\npath = \"/a\"\nlimit = \"off\"\n",
    );
    let (code, err) = run_to_exit(check("rls", toml.path())).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(
            "this looks like TOML (rl-proxy's route file, for --mode proxy or forward-auth)"
        ),
        "{err}"
    );
    // and each in its own mode passes
    let (code, err) = run_to_exit(check("rls", yaml.path())).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run_to_exit(check("proxy", toml.path())).await;
    assert_eq!(code, Some(0), "{err}");
    // the same words when starting, not only with --check
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--config",
        no_upstream.path(),
        "--endpoint",
        "7@127.0.0.1:9",
    ]);
    let (code, err) = run_to_exit(cmd).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("proxy mode needs an upstream"), "{err}");
}

/// `--help` ends with examples, the exit codes, `--on-failure` against the file's
/// `on_failure`, and the environment variables read.
#[test]
fn help_names_examples_exit_codes_and_environment() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rl-proxy"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "Examples:",
        "rl-proxy --config routes.toml --check",
        "Exit codes:",
        "0  stopped by SIGINT or SIGTERM, or --check passed",
        "2  bad arguments, a bad file (--config) or a bad or missing API key",
        "1  starting failed otherwise",
        "Environment:",
        "RATELIMITLY_API_KEY",
        "RUST_LOG",
        "the file's on_failure",
    ] {
        assert!(help.contains(needle), "--help lacks {needle:?}:\n{help}");
    }
    // -h too (clap's after_help is shown by both)
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rl-proxy"))
        .arg("-h")
        .output()
        .unwrap();
    assert!(
        String::from_utf8(out.stdout)
            .unwrap()
            .contains("Exit codes:")
    );
}

/// The rows of the route file reference table in proxy/README.md: (key, where, default).
fn reference_rows(readme: &str) -> Vec<(String, String, String)> {
    let start = readme
        .find("### Route file reference")
        .expect("proxy/README.md has a route file reference");
    readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect();
            assert_eq!(cells.len(), 5, "a row of 5 cells: {l}");
            (
                cells[0].trim_matches('`').to_owned(),
                cells[1].clone(),
                cells[2].clone(),
            )
        })
        .collect()
}

/// proxy/README.md's reference table names every key the route file parser accepts
/// (`rl_proxy::config::FILE_KEYS`, `ROUTE_KEYS`: the parser's own lists, checked against
/// it in config.rs), each with a default, and no key the parser refuses.
#[test]
fn readme_lists_every_route_file_key() {
    use rl_proxy::config::{
        DEFAULT_LATENCY_MIN_SAMPLES, DEFAULT_LATENCY_WINDOW, FILE_KEYS, ROUTE_KEYS,
    };
    let rows = reference_rows(include_str!("../../README.md"));
    let row = |key: &str, route: bool| {
        rows.iter()
            .find(|(k, w, _)| k == key && (w == "`[[route]]`") == route)
            .unwrap_or_else(|| panic!("no row for {key} (route: {route}) in {rows:?}"))
    };
    for key in FILE_KEYS {
        let (_, _, default) = row(key, false);
        assert!(!default.is_empty(), "{key} has no default");
    }
    for key in ROUTE_KEYS {
        let (_, _, default) = row(key, true);
        assert!(!default.is_empty(), "{key} has no default");
    }
    for (k, w, _) in &rows {
        let listed = if w == "`[[route]]`" {
            ROUTE_KEYS
        } else {
            FILE_KEYS
        };
        assert!(
            listed.contains(&k.as_str()),
            "{k} ({w}) is no key of the parser"
        );
    }
    // the defaults the code names
    let default_of = |key: &str, route: bool| row(key, route).2.clone();
    assert_eq!(default_of("limit", false), "`\"off\"`");
    assert_eq!(
        default_of("client_ip_from", false),
        format!("`\"{}\"`", ratelimitly_tower::ClientIpFrom::default())
    );
    assert_eq!(
        default_of("latency_window", true),
        format!("`\"{DEFAULT_LATENCY_WINDOW}\"`")
    );
    assert_eq!(
        default_of("latency_min_samples", true),
        format!("`{DEFAULT_LATENCY_MIN_SAMPLES}`")
    );
    assert_eq!(default_of("key_by", false), "`\"ip\"`");
    assert_eq!(default_of("on_failure", false), "`\"open\"`");
}

/// The first ```sh block of proxy/README.md's Quickstart section.
fn quickstart_block(readme: &str) -> &str {
    let section = &readme[readme.find("## Quickstart").expect("a Quickstart section")..];
    let start = section.find("```sh\n").expect("a ```sh block") + "```sh\n".len();
    let len = section[start..].find("```\n").expect("the block ends");
    &section[start..start + len]
}

/// Whether `name` is an executable in a directory of PATH.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// `rl-responder`'s binary next to rl-proxy's (same target directory and profile),
/// brought up to date by the README's test build, `cargo test --workspace --all-targets
/// --no-run` (a dev dependency's binaries are not built for rl-proxy's tests, and one left
/// from an older build could lack `--dev`; at most 10 minutes). Inside the README's test
/// command that has just built it, this finds nothing to do; `cargo build -p rl-responder`
/// would resolve features for one package (no dev-dependencies' features) and rebuild
/// the responder and its dependencies beside the test build's (78 s of a cold CI run).
fn responder_binary(bins: &std::path::Path, root: &std::path::Path) -> std::path::PathBuf {
    let exe = bins.join("rl-responder");
    let mut cmd = std::process::Command::new(env!("CARGO"));
    cmd.current_dir(root)
        .args(["test", "--workspace", "--all-targets", "--no-run"]);
    // Cargo gives this test process its package's variables (CARGO_PKG_NAME, ...); build
    // scripts that declare them as inputs (ring's) would see them change and rebuild,
    // with everything above them (37 s of a CI run). The outer build had none of them.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(cargo_set_for_tests) {
            cmd.env_remove(k);
        }
    }
    if bins.ends_with("release") {
        cmd.arg("--release");
    }
    if let Some(target) = bins.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let mut child = cmd.spawn().expect("cargo starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(
                status.success(),
                "cargo test --workspace --all-targets --no-run: {status}"
            );
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("cargo test --workspace --all-targets --no-run took over 10 minutes");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(exe.exists(), "{} after the build", exe.display());
    exe
}

/// The variables cargo sets for a test process (not for itself).
fn cargo_set_for_tests(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_BIN_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR"
        )
}

/// proxy/README.md's quickstart, exactly as it stands in the README: its first ```sh
/// block, run by `bash -euo pipefail` from the repository root. The one change: the
/// block's first line `bin=target/release` names this test's binaries instead (the
/// directory of `CARGO_BIN_EXE_rl-proxy`, which holds rl-upstream too; rl-responder
/// is built there by cargo). It must end with exit 0 after a 429, and leave nothing
/// running: the script runs in a process group of its own, which must be empty when it
/// has exited (what is left is killed, and the test fails). Needs curl (skipped without
/// it unless RL_REQUIRE_PROXIES=1).
#[test]
fn quickstart_runs_verbatim() {
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    if !on_path("curl") || !on_path("bash") {
        assert_ne!(
            std::env::var("RL_REQUIRE_PROXIES").as_deref(),
            Ok("1"),
            "curl or bash is missing and RL_REQUIRE_PROXIES=1"
        );
        eprintln!("skipped: the quickstart needs curl and bash");
        return;
    }
    let _s = SERIAL.blocking_lock();
    let block = quickstart_block(include_str!("../../README.md"));
    let bins = std::path::Path::new(env!("CARGO_BIN_EXE_rl-proxy"))
        .parent()
        .unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    responder_binary(bins, root);
    let first = "bin=target/release\n";
    assert!(block.starts_with(first), "the block starts with {first:?}");
    let script = format!("bin='{}'\n{}", bins.display(), &block[first.len()..]);
    let mut child = std::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .current_dir(root)
        .env_remove("RATELIMITLY_API_KEY")
        .env_remove("RL_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash starts");
    let group = child.id() as i32;
    let read = |mut r: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    // what is left of the group, within 2 s of the script's end
    let mut left = true;
    for _ in 0..20 {
        // SAFETY: kill(2) with signal 0 on our own child's process group only checks
        if unsafe { libc::kill(-group, 0) } != 0 {
            left = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    if left || status.is_none() {
        // SAFETY: kill(2) on the process group this test started
        unsafe { libc::kill(-group, libc::SIGKILL) };
        let _ = child.wait();
    }
    let (out, err) = (out.join().unwrap(), err.join().unwrap());
    let status = status.unwrap_or_else(|| panic!("over 60 s:\n{out}\n{err}"));
    assert!(status.success(), "{status}:\n{out}\n{err}");
    assert!(
        !left,
        "the quickstart left processes running:\n{out}\n{err}"
    );
    assert!(out.contains(": 429\n"), "no 429:\n{out}\n{err}");
    assert!(out.contains("request 1: 200\n"), "{out}");
    assert!(out.to_ascii_lowercase().contains("retry-after:"), "{out}");
    assert!(
        !out.contains(NONE_KEY) && !err.contains(NONE_KEY),
        "the key is echoed"
    );
}
