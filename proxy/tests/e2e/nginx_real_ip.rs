//! `--client-ip-from real-ip` behind a real nginx with the classic configuration:
//! `proxy_set_header X-Real-IP $remote_addr;` and no `X-Forwarded-For`. rl-proxy (proxy
//! mode) trusts 127.0.0.1 only, where nginx connects from, and reads `X-Real-IP`.
//!
//! Two clients (sockets bound to 127.0.0.2 and 127.0.0.3) get a bucket each; a client
//! (127.0.0.4) forging `X-Real-IP`, `X-Forwarded-For` and `Forwarded` (naming the spent
//! client, or a new address each time) gets its own bucket, never another's: nginx
//! overwrites `X-Real-IP`. The same nginx with rl-proxy's default source (`xff`) puts
//! every client in nginx's one bucket, and says so (`rl_proxy_client_ip_unvouched_total`).
//!
//! A missing nginx skips the test with a message, unless `RL_REQUIRE_PROXIES=1`, where
//! it fails.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use http::StatusCode;
use tokio::process::{Child, Command};

/// nginx's classic reverse proxy: X-Real-IP overwritten with the client's address, no
/// X-Forwarded-For. `{TMP}`, `{LISTEN}` and `{RL_PROXY}` are filled in below.
const NGINX_CLASSIC: &str = "\
worker_processes 1;
master_process off;
pid {TMP}/nginx.pid;
error_log {TMP}/error.log warn;
events {
    worker_connections 64;
}
http {
    access_log off;
    client_body_temp_path {TMP}/client_body;
    proxy_temp_path {TMP}/proxy;
    fastcgi_temp_path {TMP}/fastcgi;
    uwsgi_temp_path {TMP}/uwsgi;
    scgi_temp_path {TMP}/scgi;
    server {
        listen {LISTEN};
        location / {
            proxy_pass http://{RL_PROXY};
            proxy_set_header X-Real-IP $remote_addr;
        }
    }
}
";

const CLIENT: &str = "127.0.0.2";
const OTHER: &str = "127.0.0.3";
const FORGER: &str = "127.0.0.4";

/// nginx and its directory, both gone on drop.
struct Nginx {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl Nginx {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts nginx in front of `rl`; returns once it accepts connections (at most 10 s;
/// probed with bare connections, so no bucket is touched).
async fn nginx(bin: &std::path::Path, rl: SocketAddr, name: &str) -> Nginx {
    let dir = std::env::temp_dir().join(format!("rl-proxy-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let port = free_port();
    let conf = NGINX_CLASSIC
        .replace("{TMP}", dir.to_str().unwrap())
        .replace("{LISTEN}", &format!("127.0.0.1:{port}"))
        .replace("{RL_PROXY}", &rl.to_string());
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(&dir)
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .args(["-g", "daemon off;"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("nginx starts");
    let mut n = Nginx { child, dir, port };
    for _ in 0..100 {
        if let Ok(Some(status)) = n.child.try_wait() {
            panic!("nginx exited with {status}: {}", n.log());
        }
        if tokio::net::TcpStream::connect(n.addr()).await.is_ok() {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nginx not listening within 10 s: {}", n.log());
}

async fn status(local: &str, addr: SocketAddr, headers: &[(&str, &str)]) -> StatusCode {
    get_from(local, addr, "/", headers).await.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_ip_behind_nginx_keys_each_client_and_ignores_forgers() {
    let Some(bin) = front_binary(FrontTool::Nginx) else {
        return;
    };
    let _s = SERIAL.lock().await;
    let r = responder(461);
    let up = upstream().await;
    let ep = endpoint(&r);
    let proxy = start(proxy_cmd(
        &up,
        &[
            "--endpoint",
            &ep,
            "--limit",
            "2/60s",
            "--trust-forwarded",
            "127.0.0.1",
            "--client-ip-from",
            "real-ip",
        ],
    ))
    .await;
    let front = nginx(&bin, proxy.addr(), "nginx-real-ip").await;
    let a = front.addr();
    for n in 1..=2 {
        assert_eq!(status(CLIENT, a, &[]).await, StatusCode::OK, "request {n}");
    }
    assert_eq!(
        status(CLIENT, a, &[]).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the 3rd in a minute: {}",
        front.log()
    );
    assert_eq!(
        status(OTHER, a, &[]).await,
        StatusCode::OK,
        "another client, another bucket"
    );
    // a forger: naming the spent client, then another address each time
    let forged = |ip: &'static str| {
        [
            ("x-real-ip", ip),
            ("x-forwarded-for", ip),
            ("forwarded", "for=203.0.113.9"),
        ]
    };
    assert_eq!(
        status(FORGER, a, &forged(CLIENT)).await,
        StatusCode::OK,
        "not the spent client's bucket"
    );
    assert_eq!(
        status(FORGER, a, &forged("198.51.100.1")).await,
        StatusCode::OK
    );
    assert_eq!(
        status(FORGER, a, &forged("198.51.100.2")).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the forger's own bucket, whatever it names"
    );
    assert_eq!(
        status(OTHER, a, &forged(FORGER)).await,
        StatusCode::OK,
        "the other client still has its own"
    );
    let m = metrics_of(&proxy).await;
    assert_eq!(m["rl_proxy_client_ip_unvouched_total"], 0.0);
    drop(front);
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));

    // the same nginx, rl-proxy reading the default source (xff): nginx's one bucket
    // for every client, counted and warned about
    let proxy = start(proxy_cmd(
        &up,
        &[
            "--endpoint",
            &ep,
            "--limit",
            "2/60s",
            "--trust-forwarded",
            "127.0.0.1",
        ],
    ))
    .await;
    let front = nginx(&bin, proxy.addr(), "nginx-xff").await;
    let a = front.addr();
    assert_eq!(status(CLIENT, a, &[]).await, StatusCode::OK);
    assert_eq!(status(OTHER, a, &[]).await, StatusCode::OK);
    assert_eq!(
        status(FORGER, a, &[]).await,
        StatusCode::TOO_MANY_REQUESTS,
        "xff with X-Real-IP only: one bucket"
    );
    let m = metrics_of(&proxy).await;
    assert_eq!(m["rl_proxy_client_ip_unvouched_total"], 3.0);
    drop(front);
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}
