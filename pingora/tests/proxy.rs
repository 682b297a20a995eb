//! The example proxy (`examples/proxy.rs`, a real Pingora server) end to end, with
//! rl-responder as the Ratelimitly service and a tiny HTTP/1.1 upstream in the test.
//! Loopback only; every wait is bounded.
//!
//! The binary is the one `cargo test` builds next to the test (`target/*/examples/`):
//! run the whole suite (`cargo test --target-dir ../target/pingora`), not `--test proxy`
//! alone, or build the examples first.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use ratelimitly_tower::ApiKey;
use rl_responder::{ResponderConfig, ResponderHandle};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpSocket};
use tokio::process::{Child, Command};

const NONE_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";
const WAIT: Duration = Duration::from_secs(10);

fn responder(server_id: u64) -> ResponderHandle {
    let key: ApiKey = NONE_KEY.parse().unwrap();
    let mut cfg = ResponderConfig::new(vec![key]);
    cfg.server_id = Some(server_id);
    rl_responder::spawn(cfg).expect("responder starts")
}

fn endpoint(r: &ResponderHandle) -> String {
    format!("{}@{}", r.server_id(), r.addr())
}

/// An endpoint where nothing answers: a UDP port bound and released.
fn silent_endpoint() -> String {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    drop(s);
    format!("7@{addr}")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn example() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap()
        .join("examples/proxy");
    assert!(
        bin.exists(),
        "{} missing: run the whole suite (cargo test builds the examples)",
        bin.display()
    );
    bin
}

/// The upstream: answers every request `200` with body `upstream` (after 1.5 s for
/// `/slow`); counts the requests it saw.
struct Upstream {
    addr: SocketAddr,
    seen: Arc<AtomicUsize>,
}

async fn upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut reader = BufReader::new(stream);
                // one connection: at most 100 requests
                for _ in 0..100 {
                    let mut head = Vec::new();
                    loop {
                        let mut line = String::new();
                        match reader.read_line(&mut line).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => head.push(line),
                        }
                    }
                    counter.fetch_add(1, Ordering::SeqCst);
                    if head.first().is_some_and(|l| l.contains(" /slow ")) {
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                    let resp = "HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\nupstream";
                    if reader.get_mut().write_all(resp.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Upstream { addr, seen }
}

struct Proxy {
    child: Child,
    addr: SocketAddr,
}

async fn proxy(upstream: &Upstream, endpoint: &str, extra: &[&str]) -> Proxy {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut child = Command::new(example())
        .env("RATELIMITLY_API_KEY", NONE_KEY)
        .args([
            "--listen",
            &listen,
            "--upstream",
            &upstream.addr.to_string(),
        ])
        .args(["--endpoint", endpoint, "--grace-period", "3"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the example");
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(20),
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line),
    )
    .await
    .expect("ready line within 20 s")
    .unwrap();
    assert_eq!(
        line.trim(),
        format!(r#"{{"event":"ready","address":"127.0.0.1","port":{port}}}"#)
    );
    Proxy {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    }
}

/// A response: status, headers (names lowercase), body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One request on a fresh connection from `from`, with `extra` header lines.
async fn get_from(proxy: SocketAddr, from: Ipv4Addr, path: &str, extra: &[&str]) -> Reply {
    let exchange = async {
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
        let mut stream = socket.connect(proxy).await.unwrap();
        let mut req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
        for h in extra {
            req.push_str(h);
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        stream.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.unwrap();
        String::from_utf8(raw).unwrap()
    };
    let text = tokio::time::timeout(WAIT, exchange)
        .await
        .expect("answer within 10 s");
    let (head, body) = text.split_once("\r\n\r\n").expect("a response head");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap();
    Reply {
        status: status.parse().unwrap(),
        headers: lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect(),
        body: body.to_owned(),
    }
}

async fn get(proxy: SocketAddr, path: &str) -> Reply {
    get_from(proxy, Ipv4Addr::LOCALHOST, path, &[]).await
}

/// One test at a time: each starts a Pingora server, an engine (pinned cores in some)
/// and a responder; side by side on a 2-CPU machine their first decisions could pass the
/// 60 ms horizon and fail open.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

async fn three_then_429(engine: &str) {
    let r = responder(41);
    let up = upstream().await;
    let p = proxy(
        &up,
        &endpoint(&r),
        &["--limit", "3/60s", "--engine", engine],
    )
    .await;
    for i in 0..3 {
        let reply = get(p.addr, "/a").await;
        assert_eq!(reply.status, 200, "request {i}: {reply:?}");
        assert_eq!(reply.body, "upstream");
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"pingora\";q=3;w=60"),
            "{reply:?}"
        );
        let want = format!("\"pingora\";r={};t=60", 2 - i);
        assert_eq!(reply.header("ratelimit"), Some(want.as_str()), "{reply:?}");
    }
    assert_eq!(up.seen.load(Ordering::SeqCst), 3);
    let reply = get(p.addr, "/a").await;
    assert_eq!(reply.status, 429, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("60"), "{reply:?}");
    assert_eq!(reply.header("ratelimit"), Some("\"pingora\";r=0;t=60"));
    assert!(reply.header("ratelimit-policy").is_some());
    assert_eq!(up.seen.load(Ordering::SeqCst), 3, "a rejection stays local");
}

#[tokio::test]
async fn grants_carry_fields_and_the_fourth_gets_429_hosted() {
    let _serial = SERIAL.lock().await;
    three_then_429("hosted").await;
}

#[tokio::test]
async fn grants_carry_fields_and_the_fourth_gets_429_pinned() {
    let _serial = SERIAL.lock().await;
    three_then_429("pinned").await;
}

#[tokio::test]
async fn two_clients_two_buckets() {
    let _serial = SERIAL.lock().await;
    let r = responder(42);
    let up = upstream().await;
    let p = proxy(&up, &endpoint(&r), &["--limit", "1/60s"]).await;
    assert_eq!(get_from(p.addr, A, "/", &[]).await.status, 200);
    assert_eq!(get_from(p.addr, A, "/", &[]).await.status, 429);
    assert_eq!(get_from(p.addr, B, "/", &[]).await.status, 200);
    assert_eq!(get_from(p.addr, B, "/", &[]).await.status, 429);
}

/// The point of a global limiter: two proxy processes asking the same service share a
/// client's limit (3 a minute: two grants through one, the third through the other, the
/// fourth refused by either).
#[tokio::test]
async fn two_processes_share_one_limit() {
    let _serial = SERIAL.lock().await;
    let r = responder(48);
    let up = upstream().await;
    let p1 = proxy(&up, &endpoint(&r), &["--limit", "3/60s"]).await;
    let p2 = proxy(&up, &endpoint(&r), &["--limit", "3/60s"]).await;
    assert_eq!(get_from(p1.addr, A, "/", &[]).await.status, 200);
    assert_eq!(get_from(p1.addr, A, "/", &[]).await.status, 200);
    assert_eq!(get_from(p2.addr, A, "/", &[]).await.status, 200);
    assert_eq!(get_from(p2.addr, A, "/", &[]).await.status, 429);
    assert_eq!(get_from(p1.addr, A, "/", &[]).await.status, 429);
    assert_eq!(
        get_from(p2.addr, B, "/", &[]).await.status,
        200,
        "another client"
    );
}

#[tokio::test]
async fn forged_forwarding_headers_from_an_untrusted_peer_are_ignored() {
    let _serial = SERIAL.lock().await;
    let r = responder(43);
    let up = upstream().await;
    let p = proxy(&up, &endpoint(&r), &["--limit", "2/60s"]).await;
    for i in 0..3u8 {
        let xff = format!("x-forwarded-for: 10.0.0.{i}");
        let real = format!("x-real-ip: 10.0.1.{i}");
        let fwd = format!("forwarded: for=10.0.2.{i}");
        let reply = get_from(p.addr, A, "/", &[&xff, &real, &fwd]).await;
        let want = if i < 2 { 200 } else { 429 };
        assert_eq!(reply.status, want, "request {i}: one bucket, the peer's");
    }
    // B's bucket is its own
    assert_eq!(get_from(p.addr, B, "/", &[]).await.status, 200);
}

#[tokio::test]
async fn a_trusted_peer_forwards_the_client_address() {
    let _serial = SERIAL.lock().await;
    let r = responder(44);
    let up = upstream().await;
    let args = ["--limit", "1/60s", "--trust-forwarded", "127.0.0.2/32"];
    let p = proxy(&up, &endpoint(&r), &args).await;
    let one = ["x-forwarded-for: 192.0.2.1"];
    let two = ["x-forwarded-for: 192.0.2.2"];
    assert_eq!(get_from(p.addr, A, "/", &one).await.status, 200);
    assert_eq!(get_from(p.addr, A, "/", &one).await.status, 429);
    assert_eq!(get_from(p.addr, A, "/", &two).await.status, 200);
}

#[tokio::test]
async fn silent_service_fails_open() {
    let _serial = SERIAL.lock().await;
    let up = upstream().await;
    let args = ["--limit", "1/60s", "--on-failure", "open"];
    let p = proxy(&up, &silent_endpoint(), &args).await;
    for _ in 0..2 {
        let reply = get(p.addr, "/").await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.body, "upstream");
        assert_eq!(reply.header("ratelimit"), None, "no decision, no fields");
    }
    assert_eq!(up.seen.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn silent_service_fails_closed() {
    let _serial = SERIAL.lock().await;
    let up = upstream().await;
    let args = ["--limit", "1/60s", "--on-failure", "closed"];
    let p = proxy(&up, &silent_endpoint(), &args).await;
    let reply = get(p.addr, "/").await;
    assert_eq!(reply.status, 503, "{reply:?}");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(up.seen.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn sigterm_finishes_the_request_in_flight_then_exits() {
    let _serial = SERIAL.lock().await;
    let r = responder(45);
    let up = upstream().await;
    let mut p = proxy(&up, &endpoint(&r), &["--limit", "10/60s"]).await;
    let addr = p.addr;
    let slow = tokio::spawn(async move { get(addr, "/slow").await });
    // the request reached the upstream before the signal (bounded: 5 s)
    for _ in 0..500 {
        if up.seen.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.seen.load(Ordering::SeqCst), 1);
    let pid = p.child.id().unwrap() as i32;
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let reply = slow.await.unwrap();
    assert_eq!(reply.status, 200, "{reply:?}");
    assert_eq!(reply.body, "upstream");
    let status = tokio::time::timeout(Duration::from_secs(15), p.child.wait())
        .await
        .expect("exits within 15 s of SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

async fn exit_of(args: &[&str], key: Option<&str>) -> (Option<i32>, String) {
    let mut cmd = Command::new(example());
    cmd.env_remove("RATELIMITLY_API_KEY");
    if let Some(k) = key {
        cmd.env("RATELIMITLY_API_KEY", k);
    }
    let out = tokio::time::timeout(WAIT, cmd.args(args).kill_on_drop(true).output())
        .await
        .expect("exits within 10 s")
        .unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    (out.status.code(), stderr)
}

#[tokio::test]
async fn bad_input_exits_2_naming_the_flag() {
    let _serial = SERIAL.lock().await;
    let base = |limit: &'static str, ep: &'static str| {
        vec![
            "--listen",
            "127.0.0.1:1",
            "--upstream",
            "127.0.0.1:2",
            "--endpoint",
            ep,
            "--limit",
            limit,
        ]
    };
    let (code, err) = exit_of(&base("3/minute", "1@127.0.0.1:3"), Some(NONE_KEY)).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--limit"), "{err}");
    let (code, err) = exit_of(&base("3/60s", "127.0.0.1:3"), Some(NONE_KEY)).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--endpoint"), "{err}");
    let (code, err) = exit_of(&base("3/60s", "1@127.0.0.1:3"), None).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("RATELIMITLY_API_KEY"), "{err}");
    let (code, err) = exit_of(&base("3/60s", "1@127.0.0.1:3"), Some("rl-not-a-key")).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        !err.contains("rl-not-a-key"),
        "the key is never echoed: {err}"
    );
}

#[tokio::test]
async fn limit_off_is_plain_pingora() {
    let _serial = SERIAL.lock().await;
    let up = upstream().await;
    // the endpoint is never asked: nothing listens there
    let p = proxy(&up, &silent_endpoint(), &["--limit", "off"]).await;
    for _ in 0..3 {
        let reply = get(p.addr, "/").await;
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.header("ratelimit"), None);
    }
    assert_eq!(up.seen.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn limiter_local_counts_per_client_without_the_service() {
    let _serial = SERIAL.lock().await;
    let up = upstream().await;
    // pingora-limits' `Rate` in the process: the endpoint is never asked
    let p = proxy(
        &up,
        &silent_endpoint(),
        &["--limit", "2/60s", "--limiter", "local"],
    )
    .await;
    for _ in 0..2 {
        assert_eq!(get_from(p.addr, A, "/", &[]).await.status, 200);
    }
    assert_eq!(get_from(p.addr, A, "/", &[]).await.status, 429);
    assert_eq!(get_from(p.addr, B, "/", &[]).await.status, 200);
    assert_eq!(up.seen.load(Ordering::SeqCst), 3);
    let (code, err) = exit_of(&["--limiter", "global"], None).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--limiter"), "{err}");
}
