//! `examples/axum.rs` run as a new user runs it: built with cargo, started as a child
//! process with the documented environment, against our responder on loopback. Checks
//! the example's contract: the ready line, a bucket per client address (5 per 10 s),
//! the 429 with `Retry-After` and both RateLimit fields, `/health` unlimited,
//! `/metrics`, and the logged fail-open once the service is gone.
#![cfg(all(feature = "axum", feature = "prometheus"))]

use std::io::{BufRead, BufReader, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{Answer, NONE_KEY, raw_get, responder_at};

/// The example binary, built first in the profile this test was built in.
fn build_example() -> PathBuf {
    // target/<profile>/deps/example_axum-HASH → target/<profile>
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let target_dir = profile_dir.parent().expect("target/<profile>");
    let mut cmd = Command::new(env!("CARGO"));
    // `--workspace`: the dependencies' features are unified as in `cargo test
    // --workspace`, so the build reuses that run's artifacts instead of compiling the
    // dependency graph once more (`-p ratelimitly-tower` alone resolves other features).
    cmd.args(["build", "--workspace", "--example", "axum"])
        .arg("--target-dir")
        .arg(target_dir);
    // Cargo's variables for this test process (CARGO_PKG_NAME, ...) are not the outer
    // build's: a build script that declares one as an input would rebuild.
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(|n| {
            n.starts_with("CARGO_PKG_")
                || n.starts_with("CARGO_MANIFEST_")
                || matches!(
                    n,
                    "CARGO_CRATE_NAME"
                        | "CARGO_BIN_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                )
        }) {
            cmd.env_remove(k);
        }
    }
    // the profile `cargo test` built this run's crates with (`test`, or `bench` under
    // `--release`): in another one the engine, the layer and the responder are compiled
    // again (20 s of a CI run)
    let profile = if profile_dir.file_name().is_some_and(|n| n == "release") {
        "bench"
    } else {
        "test"
    };
    cmd.args(["--profile", profile]);
    let status = cmd.status().expect("cargo runs");
    assert!(status.success(), "cargo build --example axum: {status}");
    let bin = profile_dir.join("examples").join("axum");
    assert!(bin.exists(), "{} after the build", bin.display());
    bin
}

/// The child, killed and reaped on drop; its stderr collected by a thread.
struct App {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl App {
    /// Starts `bin` and waits (at most 60 s) for its ready line; returns the address.
    fn start(bin: &PathBuf, endpoints: &str) -> (App, SocketAddr) {
        let mut child = Command::new(bin)
            .env("RATELIMITLY_API_KEY", NONE_KEY)
            .env("RATELIMITLY_ENDPOINTS", endpoints)
            .env("LISTEN", "127.0.0.1:0")
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("example starts");
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut err = child.stderr.take().unwrap();
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = tx.send(line);
        });
        let app = App { child, stderr };
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no ready line; stderr: {}", app.stderr()));
        (app, parse_ready(&line))
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }
}

/// `{"event":"ready","address":"127.0.0.1","port":N}` → the address.
fn parse_ready(line: &str) -> SocketAddr {
    let line = line.trim();
    let rest = line
        .strip_prefix("{\"event\":\"ready\",\"address\":\"127.0.0.1\",\"port\":")
        .and_then(|r| r.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not the ready line: {line:?}"));
    let port: u16 = rest.parse().expect("port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

const CLIENT_A: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const CLIENT_B: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const CLIENT_C: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4));

fn assert_limited(a: &Answer, remaining: u32) {
    assert_eq!(a.status, 200);
    let policy = a.header("ratelimit-policy").expect("RateLimit-Policy");
    assert!(policy.contains(";q=5;w=10"), "{policy}");
    let fields = a.header("ratelimit").expect("RateLimit");
    assert!(fields.contains(&format!(";r={remaining};")), "{fields}");
}

#[test]
fn the_axum_example_keeps_its_contract() {
    let bin = build_example();
    let responder = responder_at(401, None);
    let endpoints = format!("{}@{}", responder.server_id(), responder.addr());
    let (app, addr) = App::start(&bin, &endpoints);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let get = |from, path| rt.block_on(raw_get(from, addr, path, &[]));

    // A bucket per client address: five each, then 429 for each.
    for i in 0..5 {
        assert_limited(&get(CLIENT_A, "/api"), 4 - i);
        assert_limited(&get(CLIENT_B, "/api"), 4 - i);
    }
    for client in [CLIENT_A, CLIENT_B] {
        let a = get(client, "/api");
        assert_eq!(a.status, 429, "the sixth from {client}");
        let wait: u64 = a
            .header("retry-after")
            .expect("Retry-After")
            .parse()
            .unwrap();
        assert!((1..=10).contains(&wait), "Retry-After {wait}");
        let policy = a.header("ratelimit-policy").expect("RateLimit-Policy");
        assert!(policy.contains(";q=5;w=10"), "{policy}");
        let fields = a.header("ratelimit").expect("RateLimit");
        assert!(fields.contains(";r=0;"), "{fields}");
        assert!(fields.ends_with(&format!(";t={wait}")), "{fields}");
    }
    // /health is unlimited.
    for _ in 0..10 {
        let h = get(CLIENT_A, "/health");
        assert_eq!(h.status, 200);
        assert!(h.header("ratelimit").is_none());
    }
    // /metrics in the Prometheus text format, the 429s counted.
    let m = get(CLIENT_A, "/metrics");
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().starts_with("text/plain"));
    assert!(
        m.body
            .contains("ratelimitly_requests_total{outcome=\"rejected\"} 2"),
        "{}",
        m.body
    );

    // The service gone: requests are let through, and a warning says so.
    responder.stop();
    let before = app.stderr().len();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert_eq!(get(CLIENT_C, "/api").status, 200, "fail-open");
        let new = app.stderr()[before..].to_owned();
        let logged = new
            .lines()
            .any(|l| l.contains(" WARN ") && l.contains("fail-open"));
        if logged {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no warning logged: {}",
            app.stderr()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
