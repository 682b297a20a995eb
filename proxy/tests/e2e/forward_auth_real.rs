//! `rl-proxy --mode forward-auth` behind the five front proxies people run, each the
//! real binary with the configuration shipped in `proxy/conf/` (the text
//! `proxy/README.md` shows): nginx (`auth_request`), Caddy (`forward_auth`), Traefik
//! (ForwardAuth, file provider), HAProxy (a Lua action) and Envoy (HTTP `ext_authz`).
//!
//! For each: grants reach the upstream (with the RateLimit fields where the proxy can
//! pass them), the 4th request on a 3-per-minute route is a 429 with `Retry-After` and
//! the fields, another client address has its own bucket, the original method and URI
//! select the route, and a client that forges new `X-Real-IP`, `X-Forwarded-For`,
//! `Forwarded` and original-request headers on every request still gets 429 on the
//! 4th, while a second forger naming the first one's address keeps its own bucket.
//! nginx and Caddy are then reloaded with the README's command and still decide.
//!
//! The failure matrix (`failure_matrix_*`): through each proxy, Ratelimitly down (an
//! endpoint on a UDP port where nothing listens) with `on_failure = "open"` forwards,
//! with `"closed"` is 503 with `Retry-After`, and rl-proxy down is the proxy's own
//! answer (503 with `Retry-After`; Traefik: 500), never forwarded; HAProxy answers it
//! within 1 s and logs it. The waits are printed (`--nocapture`) for the README.
//!
//! Clients are bound to 127.0.0.2 to 127.0.0.5, never 127.0.0.1: Envoy appends its
//! host's own address to `X-Forwarded-For` for a peer of exactly 127.0.0.1. rl-proxy
//! trusts 127.0.0.1 only, where the front proxies connect from.
//!
//! A missing binary skips its test with a message, unless `RL_REQUIRE_PROXIES=1`
//! (CI), where it fails. One test at a time (`SERIAL`).

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tokio::process::{Child, Command};

const NGINX_CONF: &str = include_str!("../../conf/nginx.conf");
const CADDYFILE: &str = include_str!("../../conf/Caddyfile");
const TRAEFIK_STATIC: &str = include_str!("../../conf/traefik.yml");
const TRAEFIK_DYNAMIC: &str = include_str!("../../conf/traefik-dynamic.yml");
const HAPROXY_CFG: &str = include_str!("../../conf/haproxy.cfg");
const HAPROXY_LUA: &str = include_str!("../../conf/ratelimitly.lua");
const ENVOY_YAML: &str = include_str!("../../conf/envoy.yaml");

/// The client whose bucket is spent, another client, and two forgers.
const CLIENT: &str = "127.0.0.2";
const OTHER: &str = "127.0.0.3";
const FORGER: &str = "127.0.0.4";
const FORGER2: &str = "127.0.0.5";

/// A directory of its own under the temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("rl-proxy-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A front proxy process, killed on drop (`kill_on_drop`), with its logs.
struct Front {
    child: Child,
    port: u16,
    dir: TempDir,
    /// The command that reloads the running proxy's configuration, where it has one.
    reload: Option<std::process::Command>,
}

impl Drop for Front {
    /// SIGTERM, then up to 5 s for the process to exit (nginx's master stops its
    /// workers first; `kill_on_drop`'s SIGKILL would leave them running).
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            for _ in 0..100 {
                if !matches!(self.child.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

impl Front {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Every log file of the process.
    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["stderr.log", "error.log", "envoy.log"] {
            if let Ok(t) = std::fs::read_to_string(self.dir.0.join(name)) {
                out += &format!("--- {name}\n{t}");
            }
        }
        out
    }

    /// Polls `/health` (a route without a limit, through the whole chain) until it is
    /// answered 200: at most 100 tries, 15 s.
    async fn wait_ready_ref(&mut self) -> &mut Front {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        for _ in 0..100 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("exited with {status}: {}", self.logs());
            }
            let probe = send(CLIENT, self.addr(), "GET", "/health", &[]);
            if let Ok(Some(r)) = tokio::time::timeout(Duration::from_secs(2), probe).await
                && r.status() == StatusCode::OK
            {
                return self;
            }
            if tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("/health not answered 200 within 15 s: {}", self.logs());
    }

    /// [`Front::wait_ready_ref`], by value.
    async fn wait_ready(mut self) -> Front {
        self.wait_ready_ref().await;
        self
    }
}

/// `text` with the placeholders filled in.
fn fill(text: &str, dir: &Path, listen: u16, upstream: SocketAddr, rl: SocketAddr) -> String {
    text.replace("{TMP}", dir.to_str().unwrap())
        .replace("{LISTEN}", &format!("127.0.0.1:{listen}"))
        .replace("{LISTEN_PORT}", &listen.to_string())
        .replace("{UPSTREAM}", &upstream.to_string())
        .replace("{UPSTREAM_PORT}", &upstream.port().to_string())
        .replace("{RL_PROXY}", &rl.to_string())
        .replace("{RL_PROXY_PORT}", &rl.port().to_string())
}

/// Starts `tool` from `bin` with its shipped configuration, in front of `upstream` and
/// asking `rl`.
fn front(tool: FrontTool, bin: &Path, upstream: SocketAddr, rl: SocketAddr) -> Front {
    let dir = TempDir::new(&format!("{tool:?}"));
    let port = free_port();
    let write = |name: &str, text: &str| {
        let path = dir.0.join(name);
        std::fs::write(&path, fill(text, &dir.0, port, upstream, rl)).unwrap();
        path
    };
    let mut cmd = Command::new(bin);
    let mut reload = None;
    match tool {
        FrontTool::Nginx => {
            let conf = write("nginx.conf", NGINX_CONF);
            cmd.arg("-p")
                .arg(&dir.0)
                .arg("-e")
                .arg(dir.0.join("error.log"));
            cmd.arg("-c").arg(&conf).args(["-g", "daemon off;"]);
            // the documented reload: the master re-reads the file, new workers start
            let mut r = std::process::Command::new(bin);
            r.arg("-p")
                .arg(&dir.0)
                .arg("-e")
                .arg(dir.0.join("error.log"));
            r.arg("-c").arg(&conf).args(["-s", "reload"]);
            reload = Some(r);
        }
        FrontTool::Caddy => {
            // a free admin port: other Caddys may run on this host
            let text = CADDYFILE.replace(
                "admin localhost:2019",
                &format!("admin 127.0.0.1:{}", free_port()),
            );
            assert_ne!(text, CADDYFILE, "the Caddyfile's admin line");
            let conf = write("Caddyfile", &text);
            cmd.args(["run", "--adapter", "caddyfile", "--config"])
                .arg(&conf);
            // the documented reload, through the admin endpoint the file names
            let mut r = std::process::Command::new(bin);
            r.args(["reload", "--adapter", "caddyfile", "--config"])
                .arg(&conf);
            for var in ["HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"] {
                cmd.env(var, &dir.0);
                r.env(var, &dir.0);
            }
            reload = Some(r);
        }
        FrontTool::Traefik => {
            write("traefik-dynamic.yml", TRAEFIK_DYNAMIC);
            let conf = write("traefik.yml", TRAEFIK_STATIC);
            cmd.arg(format!("--configFile={}", conf.display()));
        }
        FrontTool::Haproxy => {
            write("ratelimitly.lua", HAPROXY_LUA);
            let conf = write("haproxy.cfg", HAPROXY_CFG);
            cmd.arg("-db").arg("-f").arg(conf);
        }
        FrontTool::Envoy => {
            let conf = write("envoy.yaml", ENVOY_YAML);
            cmd.arg("-c")
                .arg(conf)
                .args(["--disable-hot-restart", "-l", "warning"]);
            cmd.arg("--log-path").arg(dir.0.join("envoy.log"));
        }
    }
    let stderr = std::fs::File::create(dir.0.join("stderr.log")).unwrap();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{tool:?} starts: {e}"));
    Front {
        child,
        port,
        dir,
        reload,
    }
}

/// The routes: `GET /api/` 3 a minute per client IP, any other method on `/api/` and
/// `/health` off.
const ROUTES: &str = "[[route]]\npath = \"/api/\"\nmethods = [\"GET\"]\nlimit = \"3/60s\"\n\
    key_by = \"ip\"\nlabel = \"api\"\n\n[[route]]\npath = \"/api/\"\nlimit = \"off\"\n\n\
    [[route]]\npath = \"/health\"\nlimit = \"off\"\n";

/// rl-proxy as the decision service, with the default client source (`xff`): trusts
/// the front proxy (127.0.0.1) only.
async fn decision_service(ep: &str, routes: &TempFile, deny_status: &str) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--mode",
        "forward-auth",
        "--deny-status",
        deny_status,
        "--trust-forwarded",
        "127.0.0.1/32",
        "--endpoint",
        ep,
        "--config",
        routes.path(),
    ]);
    start(cmd).await
}

/// `METHOD path` with `headers` from a socket bound to `local`; `None` when the
/// exchange fails or takes over 10 s.
async fn send(
    local: &str,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
) -> Option<Response<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(local.parse::<IpAddr>().unwrap()));
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    let exchange = client.request(req.body(Empty::new()).unwrap());
    let resp = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .ok()?
        .ok()?;
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    Some(Response::from_parts(parts, body))
}

async fn must_send(
    local: &str,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
) -> Response<Bytes> {
    send(local, addr, method, path, headers)
        .await
        .unwrap_or_else(|| panic!("{method} {path} from {local}: no answer within 10 s"))
}

fn field<'a>(r: &'a Response<Bytes>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}

/// Request `n` of a forger: new addresses in every header that names a client, and
/// original-request headers that name a route without a limit. `spoof` also goes in
/// every one (the address of the client whose bucket is spent).
fn forged(n: u8, spoof: &str) -> Vec<(&'static str, String)> {
    vec![
        ("x-real-ip", format!("203.0.113.{n}")),
        ("x-forwarded-for", format!("198.51.100.{n}, {spoof}")),
        ("forwarded", format!("for=192.0.2.{n}, for={spoof}")),
        ("x-original-uri", "/health".into()),
        ("x-original-method", "POST".into()),
        ("x-forwarded-uri", "/health".into()),
        ("x-forwarded-method", "POST".into()),
    ]
}

/// The checks through one front proxy at `front`.
async fn check_front(front: SocketAddr, tool: FrontTool) {
    let name = format!("{tool:?}");
    // Traefik sends a grant's authResponseHeaders upstream only
    let fields_on_grants = tool != FrontTool::Traefik;
    for left in (0..3).rev() {
        let r = must_send(CLIENT, front, "GET", "/api/orders", &[]).await;
        assert_eq!(r.status(), StatusCode::OK, "{name}: granted");
        assert_eq!(
            r.body().as_ref(),
            UPSTREAM_BODY,
            "{name}: reached the upstream"
        );
        if fields_on_grants {
            let state = field(&r, "ratelimit").unwrap_or_default();
            assert!(
                state.contains(&format!("r={left};")),
                "{name}: {:?}",
                r.headers()
            );
            let policy = field(&r, "ratelimit-policy").unwrap_or_default();
            assert!(policy.contains("q=3;w=60"), "{name}: {:?}", r.headers());
        }
    }
    let r = must_send(CLIENT, front, "GET", "/api/orders", &[]).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "{name}: the 4th");
    assert_eq!(retry_after(&r), 60, "{name}: Retry-After");
    let policy = field(&r, "ratelimit-policy").unwrap_or_default();
    assert!(policy.contains("q=3;w=60"), "{name}: {:?}", r.headers());
    let state = field(&r, "ratelimit").unwrap_or_default();
    assert!(state.contains("r=0;t=60"), "{name}: {:?}", r.headers());
    assert_ne!(r.body().as_ref(), UPSTREAM_BODY, "{name}: not forwarded");

    let r = must_send(OTHER, front, "GET", "/api/orders", &[]).await;
    assert_eq!(r.status(), StatusCode::OK, "{name}: {OTHER}'s own bucket");

    // the original method and URI select the route: POST /api/ and /health are off
    for (method, path) in [("POST", "/api/orders"), ("GET", "/health")] {
        for _ in 0..2 {
            let r = must_send(CLIENT, front, method, path, &[]).await;
            assert_eq!(r.status(), StatusCode::OK, "{name}: {method} {path} is off");
            assert_eq!(r.body().as_ref(), UPSTREAM_BODY);
        }
    }

    // forgers: new headers on every request, and naming the spent client
    for (forger, first) in [(FORGER, 10), (FORGER2, 20)] {
        for n in first..first + 4 {
            let r = must_send(forger, front, "GET", "/api/orders", &forged(n, CLIENT)).await;
            let want = if n < first + 3 {
                StatusCode::OK
            } else {
                StatusCode::TOO_MANY_REQUESTS
            };
            assert_eq!(r.status(), want, "{name}: forger {forger}, request {n}");
        }
    }
}

/// Starts everything for `tool`, runs the checks, stops everything.
async fn behind(tool: FrontTool, server_id: u64, deny_status: &str) {
    let Some(bin) = front_binary(tool) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let r = responder(server_id);
    let up = upstream().await;
    let routes = TempFile::new(&format!("{tool:?}-routes.toml"), ROUTES);
    let rl = decision_service(&endpoint(&r), &routes, deny_status).await;
    let mut front = front(tool, &bin, up.addr(), rl.addr()).wait_ready().await;
    check_front(front.addr(), tool).await;
    if let Some(mut reload) = front.reload.take() {
        // the reload of the README works on the shipped file, and the proxy still
        // forwards and decides: the spent client stays refused
        let out = tokio::task::spawn_blocking(move || reload.output())
            .await
            .unwrap()
            .expect("the reload command runs");
        assert!(
            out.status.success(),
            "{tool:?} reload: {}{}",
            String::from_utf8_lossy(&out.stderr),
            front.logs()
        );
        let front = front.wait_ready_ref().await;
        let r = must_send(CLIENT, front.addr(), "GET", "/api/orders", &[]).await;
        assert_eq!(
            r.status(),
            StatusCode::TOO_MANY_REQUESTS,
            "{tool:?} reloaded"
        );
    }
    if tool == FrontTool::Envoy {
        // no field of envoy.yaml is deprecated (Envoy warns at start)
        let logs = front.logs();
        assert!(!logs.contains("deprecated"), "{logs}");
    }
    drop(front);
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// nginx `auth_request` knows 2xx, 401 and 403 only: rl-proxy denies with 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_auth_request() {
    behind(FrontTool::Nginx, 501, "403").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_caddy_forward_auth() {
    behind(FrontTool::Caddy, 502, "429").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_traefik_forward_auth() {
    behind(FrontTool::Traefik, 503, "429").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_haproxy_lua() {
    behind(FrontTool::Haproxy, 504, "429").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_envoy_ext_authz() {
    behind(FrontTool::Envoy, 505, "429").await;
}

/// A loopback UDP port where nothing listens: an endpoint there is "Ratelimitly down"
/// (every datagram answered by ICMP port unreachable, or by nothing).
fn dead_udp_port() -> u16 {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.local_addr().unwrap().port()
}

/// rl-proxy as the decision service on `port`, its routes failing `on_failure`
/// (`open` or `closed`) and its one endpoint dead.
async fn failing_decision_service(
    port: u16,
    on_failure: &str,
    deny_status: &str,
) -> (Proc, TempFile) {
    let routes = TempFile::new(
        &format!("failing-{on_failure}-routes.toml"),
        &format!("on_failure = \"{on_failure}\"\n{ROUTES}"),
    );
    let ep = format!("700@127.0.0.1:{}", dead_udp_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .env("RUST_LOG", "error")
        .args([
            "--mode",
            "forward-auth",
            "--deny-status",
            deny_status,
            "--trust-forwarded",
            "127.0.0.1/32",
            "--endpoint",
            &ep,
            "--config",
            routes.path(),
            "--listen",
            &format!("127.0.0.1:{port}"),
        ]);
    (start(cmd).await, routes)
}

/// Polls `/health` (no limit: no decision needed) through `front` until it is 200, at
/// most 50 tries: the front proxy's connections to the previous rl-proxy are gone.
async fn settle(front: &Front) {
    for _ in 0..50 {
        if let Some(r) = send(CLIENT, front.addr(), "GET", "/health", &[]).await
            && r.status() == StatusCode::OK
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/health never 200 again: {}", front.logs());
}

/// One answer of a failure-matrix cell, and how long the client waited for it.
struct Cell {
    status: StatusCode,
    retry_after: Option<String>,
    body: Bytes,
    wait: Duration,
}

/// Requests per cell: more than the 5 failures that open rl-proxy's circuit breaker.
const MATRIX_REQUESTS: usize = 8;

/// `MATRIX_REQUESTS` sequential `GET /api/orders` of one client through `front`.
async fn cell(front: &Front) -> Vec<Cell> {
    let mut out = Vec::new();
    for _ in 0..MATRIX_REQUESTS {
        let t0 = std::time::Instant::now();
        let r = must_send(CLIENT, front.addr(), "GET", "/api/orders", &[]).await;
        out.push(Cell {
            status: r.status(),
            retry_after: field(&r, "retry-after").map(str::to_owned),
            body: r.body().clone(),
            wait: t0.elapsed(),
        });
    }
    out
}

/// `tool scenario status first-wait max-wait-after-the-5th` on standard error: the
/// figures of the README's failure matrix.
fn report(tool: FrontTool, scenario: &str, cells: &[Cell]) {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let first = ms(cells[0].wait);
    let later = cells[5..].iter().map(|c| ms(c.wait)).fold(0.0, f64::max);
    let max = cells.iter().map(|c| ms(c.wait)).fold(0.0, f64::max);
    let statuses: Vec<u16> = cells.iter().map(|c| c.status.as_u16()).collect();
    eprintln!(
        "failure matrix | {tool:?} | {scenario} | {statuses:?} retry-after {:?} | first {first:.1} ms, max {max:.1} ms, after the 5th at most {later:.1} ms",
        cells[0].retry_after
    );
}

/// Every answer of `cells` is `want` (with `Retry-After` for a 503), never the
/// upstream's for a refusal, each within 5 s.
fn expect(tool: FrontTool, scenario: &str, cells: &[Cell], want: StatusCode, front: &Front) {
    for (i, c) in cells.iter().enumerate() {
        assert_eq!(
            c.status,
            want,
            "{tool:?}, {scenario}, request {i}: {}",
            front.logs()
        );
        assert!(
            c.wait < Duration::from_secs(5),
            "{tool:?}, {scenario}, request {i}: {:?}",
            c.wait
        );
        if want == StatusCode::OK {
            assert_eq!(
                c.body.as_ref(),
                UPSTREAM_BODY,
                "{tool:?}, {scenario}: forwarded"
            );
        } else {
            assert_ne!(
                c.body.as_ref(),
                UPSTREAM_BODY,
                "{tool:?}, {scenario}: refused"
            );
        }
        if want == StatusCode::SERVICE_UNAVAILABLE {
            assert!(
                c.retry_after.is_some(),
                "{tool:?}, {scenario}, request {i}: Retry-After"
            );
        }
    }
}

/// The failure matrix for `tool` with its shipped configuration: Ratelimitly down with
/// `on_failure = "open"` (forwarded), with `"closed"` (503 with `Retry-After`), then
/// rl-proxy itself down (`rl_down`: the front proxy's own answer, never forwarded).
async fn failure_matrix(tool: FrontTool, deny_status: &str, rl_down: StatusCode) {
    let Some(bin) = front_binary(tool) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let up = upstream().await;
    let port = free_port();
    let rl_addr = SocketAddr::from(([127, 0, 0, 1], port));

    let (rl, _routes) = failing_decision_service(port, "open", deny_status).await;
    let front = front(tool, &bin, up.addr(), rl_addr).wait_ready().await;
    let cells = cell(&front).await;
    report(tool, "Ratelimitly down, open", &cells);
    expect(
        tool,
        "Ratelimitly down, open",
        &cells,
        StatusCode::OK,
        &front,
    );
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));

    let (rl, _routes) = failing_decision_service(port, "closed", deny_status).await;
    settle(&front).await;
    let cells = cell(&front).await;
    report(tool, "Ratelimitly down, closed", &cells);
    expect(
        tool,
        "Ratelimitly down, closed",
        &cells,
        StatusCode::SERVICE_UNAVAILABLE,
        &front,
    );
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));

    let cells = cell(&front).await;
    report(tool, "rl-proxy down", &cells);
    expect(tool, "rl-proxy down", &cells, rl_down, &front);
    if tool == FrontTool::Haproxy {
        // the bound: at once, and logged
        for c in &cells {
            assert!(c.wait < Duration::from_secs(1), "HAProxy: {:?}", c.wait);
        }
        let logs = front.logs();
        assert!(
            logs.contains("ratelimitly: no answer from rl-proxy at"),
            "HAProxy logged the failure: {logs}"
        );
    }
    drop(front);
    up.signal(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix_nginx() {
    failure_matrix(FrontTool::Nginx, "403", StatusCode::SERVICE_UNAVAILABLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix_caddy() {
    failure_matrix(FrontTool::Caddy, "429", StatusCode::SERVICE_UNAVAILABLE).await;
}

/// Traefik's ForwardAuth answers a connection failure 500 itself (no setting for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix_traefik() {
    failure_matrix(FrontTool::Traefik, "429", StatusCode::INTERNAL_SERVER_ERROR).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix_haproxy() {
    failure_matrix(FrontTool::Haproxy, "429", StatusCode::SERVICE_UNAVAILABLE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_matrix_envoy() {
    failure_matrix(FrontTool::Envoy, "429", StatusCode::SERVICE_UNAVAILABLE).await;
}

/// `proxy/README.md` shows every shipped configuration exactly as tested.
#[test]
fn readme_shows_the_tested_configurations() {
    let readme = include_str!("../../README.md");
    for (file, text) in [
        ("nginx.conf", NGINX_CONF),
        ("Caddyfile", CADDYFILE),
        ("traefik.yml", TRAEFIK_STATIC),
        ("traefik-dynamic.yml", TRAEFIK_DYNAMIC),
        ("haproxy.cfg", HAPROXY_CFG),
        ("ratelimitly.lua", HAPROXY_LUA),
        ("envoy.yaml", ENVOY_YAML),
    ] {
        assert!(
            readme.contains(text),
            "README's block of conf/{file} is the file"
        );
    }
}
