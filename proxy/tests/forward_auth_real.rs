//! `rl-proxy --mode forward-auth` behind a real nginx (`auth_request`) and a real Caddy
//! (`forward_auth`), configured by `proxy/conf/nginx.conf` and `proxy/conf/Caddyfile`
//! (the text `proxy/README.md` documents). Grants reach the upstream, rejections arrive
//! as 429 with `Retry-After` and the RateLimit fields, two client addresses (127.0.0.2,
//! 127.0.0.3) keep two buckets, routes match on the original URI (`/api/` limited,
//! `/health` off).
//!
//! A missing nginx or caddy binary skips its test with a message, unless
//! `RL_REQUIRE_PROXIES=1` (CI), where it fails.

mod common;

use std::net::{IpAddr, SocketAddr, TcpListener};
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

const NGINX_CONF: &str = include_str!("../conf/nginx.conf");
const CADDYFILE: &str = include_str!("../conf/Caddyfile");

/// A free loopback port (bound, then released for the server to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

/// A front proxy process, killed on drop (`kill_on_drop`), with its log.
struct Front {
    _child: Child,
    port: u16,
    log: PathBuf,
    _dir: TempDir,
}

impl Front {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Polls the port (at most 10 s) until it accepts.
    async fn wait_ready(mut self) -> Front {
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(self.addr()).await.is_ok() {
                return self;
            }
            if let Ok(Some(status)) = self._child.try_wait() {
                panic!("exited with {status}: {}", self.log_text());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("not listening within 10 s: {}", self.log_text());
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// `text` with the placeholders filled in.
fn fill(text: &str, dir: &Path, listen: u16, upstream: SocketAddr, rl: SocketAddr) -> String {
    text.replace("{TMP}", dir.to_str().unwrap())
        .replace("{LISTEN}", &format!("127.0.0.1:{listen}"))
        .replace("{UPSTREAM}", &upstream.to_string())
        .replace("{RL_PROXY}", &rl.to_string())
}

fn nginx(bin: &Path, upstream: SocketAddr, rl: SocketAddr) -> Front {
    let dir = TempDir::new("nginx");
    let port = free_port();
    let conf = dir.0.join("nginx.conf");
    std::fs::write(&conf, fill(NGINX_CONF, &dir.0, port, upstream, rl)).unwrap();
    let log = dir.0.join("error.log");
    let child = Command::new(bin)
        .arg("-p")
        .arg(&dir.0)
        .arg("-e")
        .arg(&log)
        .arg("-c")
        .arg(&conf)
        .args(["-g", "daemon off;"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nginx starts");
    Front {
        _child: child,
        port,
        log,
        _dir: dir,
    }
}

fn caddy(bin: &Path, upstream: SocketAddr, rl: SocketAddr) -> Front {
    let dir = TempDir::new("caddy");
    let port = free_port();
    let conf = dir.0.join("Caddyfile");
    std::fs::write(&conf, fill(CADDYFILE, &dir.0, port, upstream, rl)).unwrap();
    let log = dir.0.join("caddy.log");
    let child = Command::new(bin)
        .args(["run", "--adapter", "caddyfile", "--config"])
        .arg(&conf)
        .env("HOME", &dir.0)
        .env("XDG_DATA_HOME", &dir.0)
        .env("XDG_CONFIG_HOME", &dir.0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("caddy starts");
    Front {
        _child: child,
        port,
        log,
        _dir: dir,
    }
}

/// The routes: `/api/` 2 a minute per client IP, `/health` off, the rest off.
const ROUTES: &str = "[[route]]\npath = \"/api/\"\nlimit = \"2/60s\"\nkey_by = \"ip\"\nlabel = \"api\"\n\n[[route]]\npath = \"/health\"\nlimit = \"off\"\n";

/// rl-proxy as the decision service: trusts the front proxy (127.0.0.1) only.
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

/// GET `path` from a socket bound to `local`.
async fn get_from(local: &str, addr: SocketAddr, path: &str) -> Response<Bytes> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(local.parse::<IpAddr>().unwrap()));
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.get(format!("http://{addr}{path}").parse().unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .expect("HTTP exchange");
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// The checks through one front proxy at `front`.
async fn check_front(front: SocketAddr, name: &str) {
    for _ in 0..2 {
        let resp = get_from("127.0.0.2", front, "/api/orders").await;
        assert_eq!(resp.status(), StatusCode::OK, "{name}: granted");
        assert_eq!(
            resp.body().as_ref(),
            UPSTREAM_BODY,
            "{name}: reached the upstream"
        );
        assert!(
            resp.headers().contains_key("ratelimit-policy") || name == "caddy",
            "{name}: the fields on the grant"
        );
    }
    let resp = get_from("127.0.0.2", front, "/api/orders").await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS, "{name}");
    assert_eq!(retry_after(&resp), 60, "{name}: Retry-After");
    let policy = resp.headers().get("ratelimit-policy");
    assert!(
        policy.is_some_and(|v| v.to_str().unwrap().contains("q=2;w=60")),
        "{name}: RateLimit-Policy on the rejection: {:?}",
        resp.headers()
    );
    let state = resp.headers().get("ratelimit").map(|v| v.to_str().unwrap());
    assert!(
        state.is_some_and(|v| v.contains("r=0;t=60")),
        "{name}: RateLimit on the rejection: {state:?}"
    );
    assert_ne!(resp.body().as_ref(), UPSTREAM_BODY, "{name}: not forwarded");
    // another client address: another bucket
    let resp = get_from("127.0.0.3", front, "/api/orders").await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "{name}: 127.0.0.3's own bucket"
    );
    // routes match on the original URI: /health is off
    for _ in 0..4 {
        let resp = get_from("127.0.0.2", front, "/health").await;
        assert_eq!(resp.status(), StatusCode::OK, "{name}: /health is off");
        assert_eq!(resp.body().as_ref(), UPSTREAM_BODY);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_nginx_auth_request() {
    let Some(bin) = front_binary(FrontTool::Nginx) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let r = responder(501);
    let up = upstream().await;
    let routes = TempFile::new("nginx-routes.toml", ROUTES);
    let rl = decision_service(&endpoint(&r), &routes, "403").await;
    let front = nginx(&bin, up.addr(), rl.addr()).wait_ready().await;
    check_front(front.addr(), "nginx").await;
    drop(front);
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_caddy_forward_auth() {
    let Some(bin) = front_binary(FrontTool::Caddy) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let r = responder(502);
    let up = upstream().await;
    let routes = TempFile::new("caddy-routes.toml", ROUTES);
    let rl = decision_service(&endpoint(&r), &routes, "429").await;
    let front = caddy(&bin, up.addr(), rl.addr()).wait_ready().await;
    check_front(front.addr(), "caddy").await;
    drop(front);
    assert_eq!(rl.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// `proxy/README.md` shows the nginx and Caddy configurations exactly as tested.
#[test]
fn readme_shows_the_tested_configurations() {
    let readme = include_str!("../README.md");
    assert!(
        readme.contains(NGINX_CONF),
        "README's nginx block is conf/nginx.conf"
    );
    assert!(
        readme.contains(CADDYFILE),
        "README's Caddy block is conf/Caddyfile"
    );
}
