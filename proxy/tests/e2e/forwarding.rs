//! Trusted forwarding end to end: clients bound to 127.0.0.2 (trusted) and 127.0.0.3
//! (not); from the trusted one only the source of `--client-ip-from` (default
//! `X-Forwarded-For`; `X-Real-IP` with `real-ip`, as nginx's realip module) is believed, the
//! same in both modes; the peer appended to the `X-Forwarded-For` the upstream receives.

use crate::common;

use std::net::SocketAddr;

use common::*;
use http::StatusCode;
use rl_responder::ResponderHandle;
use tokio::process::Command;

const TRUSTED: &str = "127.0.0.2";
const UNTRUSTED: &str = "127.0.0.3";

async fn status_from(local: &str, addr: SocketAddr, headers: &[(&str, &str)]) -> StatusCode {
    get_from(local, addr, "/", headers).await.status()
}

/// rl-proxy in front of `up`, asking `r`, `--limit LIMIT --key-by ip` and one
/// `--trust-forwarded` per CIDR of `trusted`.
async fn proxy_by_ip(up: &Proc, r: &ResponderHandle, limit: &str, trusted: &[&str]) -> Proc {
    let ep = endpoint(r);
    let mut args = vec!["--endpoint", &ep, "--limit", limit, "--key-by", "ip"];
    for cidr in trusted {
        args.extend(["--trust-forwarded", cidr]);
    }
    start(proxy_cmd(up, &args)).await
}

/// Proxy mode, `--limit 2/60s --key-by ip --trust-forwarded 127.0.0.2/32`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_count_from_trusted_peers_only() {
    let _s = SERIAL.lock().await;
    let r = responder(301);
    let up = upstream().await;
    let proxy = proxy_by_ip(&up, &r, "2/60s", &["127.0.0.2/32"]).await;
    let a = proxy.addr();
    // untrusted peer: two XFF values, one bucket (the peer's)
    let xff = |v| [("x-forwarded-for", v)];
    assert_eq!(
        status_from(UNTRUSTED, a, &xff("198.51.100.1")).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(UNTRUSTED, a, &xff("198.51.100.2")).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(UNTRUSTED, a, &xff("198.51.100.3")).await,
        StatusCode::TOO_MANY_REQUESTS,
        "an untrusted peer's X-Forwarded-For is ignored"
    );
    // trusted peer: the rightmost untrusted address is the client
    for _ in 0..2 {
        let h = xff("203.0.113.50, 198.51.100.9");
        assert_eq!(status_from(TRUSTED, a, &h).await, StatusCode::OK);
    }
    assert_eq!(
        status_from(TRUSTED, a, &xff("198.51.100.9")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_from(TRUSTED, a, &xff("198.51.100.10")).await,
        StatusCode::OK,
        "another forwarded client, another bucket"
    );
    // the trusted peer's own bucket is apart from its clients'
    assert_eq!(status_from(TRUSTED, a, &[]).await, StatusCode::OK);
    // X-Real-IP is not read in proxy mode
    let h = [
        ("x-real-ip", "192.0.2.1"),
        ("x-forwarded-for", "198.51.100.9"),
    ];
    assert_eq!(
        status_from(TRUSTED, a, &h).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));

    // the upstream receives X-Forwarded-For with the TCP peer appended
    let plain = plain_proxy(&up, &[]).await;
    let resp = get_from(UNTRUSTED, plain.addr(), "/echo/xff", &xff("198.51.100.1")).await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.body().as_ref(), b"198.51.100.1, 127.0.0.3");
    let resp = get_from(TRUSTED, plain.addr(), "/echo/xff", &[]).await;
    assert_eq!(resp.body().as_ref(), b"127.0.0.2");
    assert_eq!(plain.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// rl-proxy `--mode forward-auth --limit 1/60s --trust-forwarded 127.0.0.2` with `args`.
async fn decision_service(r: &ResponderHandle, args: &[&str]) -> Proc {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .args(["--mode", "forward-auth", "--endpoint", &endpoint(r)])
        .args(["--limit", "1/60s", "--trust-forwarded", "127.0.0.2"])
        .args(args);
    start(cmd).await
}

/// `--mode forward-auth` keys like proxy mode: by default `X-Forwarded-For` only, a
/// client's `X-Real-IP` ignored; with `--client-ip-from real-ip`, `X-Real-IP` (the
/// chain not read), the peer when there is none (counted); from an untrusted peer
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_auth_reads_only_what_the_source_names() {
    let _s = SERIAL.lock().await;
    let r = responder(302);
    let fa = decision_service(&r, &[]).await;
    let a = fa.addr();
    let real = |v| [("x-real-ip", v), ("x-forwarded-for", "198.51.100.77")];
    let first = real("192.0.2.1");
    let then = real("192.0.2.2");
    let why = "X-Real-IP is not read by default: the X-Forwarded-For client's bucket";
    one_bucket(TRUSTED, a, &first, &then, why).await;
    let first = real("192.0.2.3");
    let then = real("192.0.2.4");
    let why = "an untrusted peer's headers are ignored";
    one_bucket(UNTRUSTED, a, &first, &then, why).await;
    assert_eq!(fa.signal(libc::SIGTERM).await.code(), Some(0));

    let fa = decision_service(&r, &["--client-ip-from", "real-ip"]).await;
    let a = fa.addr();
    // nginx: X-Real-IP $remote_addr (X-Forwarded-For, if any, is not read)
    let first = [("x-real-ip", "192.0.2.1")];
    let then = [("x-real-ip", "192.0.2.1"), ("x-forwarded-for", "192.0.2.9")];
    one_bucket(TRUSTED, a, &first, &then, "X-Real-IP names the client").await;
    let other = [("x-real-ip", "192.0.2.2"), ("x-forwarded-for", "192.0.2.1")];
    let status = status_from(TRUSTED, a, &other).await;
    assert_eq!(status, StatusCode::OK, "another client, another bucket");
    // no X-Real-IP, or two (a client's passed on, and the proxy's): the peer's bucket
    let first = [("x-forwarded-for", "192.0.2.3")];
    let then = [("x-real-ip", "6.6.6.2"), ("x-real-ip", "192.0.2.4")];
    let why = "no single X-Real-IP: the peer's bucket";
    one_bucket(TRUSTED, a, &first, &then, why).await;
    let m = metrics_of(&fa).await;
    assert_eq!(m["rl_proxy_client_ip_unvouched_total"], 2.0);
    assert_eq!(fa.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// The config file's `trust_forwarded` list is honoured like the flag, and its
/// `client_ip_from` names the header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_forwarded_from_the_config_file() {
    let _s = SERIAL.lock().await;
    let r = responder(303);
    let up = upstream().await;
    let file = TempFile::new(
        "trust.toml",
        &format!(
            "upstream = \"http://{}\"\nlimit = \"1/60s\"\ntrust_forwarded = [\"127.0.0.2/32\"]\n\
             client_ip_from = \"forwarded\"\n",
            up.addr()
        ),
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--config",
        file.path(),
        "--endpoint",
        &endpoint(&r),
    ]);
    let proxy = start(cmd).await;
    let a = proxy.addr();
    let xff = |v| [("x-forwarded-for", v)];
    let fwd = |v| [("forwarded", v), ("x-forwarded-for", "198.51.100.9")];
    assert_eq!(
        status_from(TRUSTED, a, &fwd("for=198.51.100.1")).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(TRUSTED, a, &fwd("for=198.51.100.2")).await,
        StatusCode::OK,
        "two forwarded clients, two buckets"
    );
    assert_eq!(
        status_from(TRUSTED, a, &fwd("for=198.51.100.1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_from(UNTRUSTED, a, &xff("198.51.100.3")).await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(UNTRUSTED, a, &xff("198.51.100.4")).await,
        StatusCode::TOO_MANY_REQUESTS,
        "not trusted: keyed by the peer"
    );
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

/// With a limit of 1: `first` from `local` is granted, then `then` (the same client, by
/// `why`) is refused.
async fn one_bucket(
    local: &str,
    a: SocketAddr,
    first: &[(&str, &str)],
    then: &[(&str, &str)],
    why: &str,
) {
    assert_eq!(
        status_from(local, a, first).await,
        StatusCode::OK,
        "{why}: first"
    );
    assert_eq!(
        status_from(local, a, then).await,
        StatusCode::TOO_MANY_REQUESTS,
        "{why}"
    );
}

/// A chain through several trusted proxies, end to end: `--trust-forwarded` twice
/// (127.0.0.2/32 and 10.0.0.0/8). From the trusted peer the client is the rightmost
/// `X-Forwarded-For` address that is not itself trusted (`Forwarded` is not read by
/// default); from the untrusted peer `Forwarded` is ignored like `X-Forwarded-For`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_and_trusted_hops_end_to_end() {
    let _s = SERIAL.lock().await;
    let r = responder(304);
    let up = upstream().await;
    let proxy = proxy_by_ip(&up, &r, "1/60s", &["127.0.0.2/32", "10.0.0.0/8"]).await;
    let a = proxy.addr();
    // X-Forwarded-For: the trusted hop 10.1.2.3 is skipped, 198.51.100.20 is the client
    let first = [("x-forwarded-for", "203.0.113.7, 198.51.100.20, 10.1.2.3")];
    let then = [("x-forwarded-for", "198.51.100.20")];
    let why = "the same client without the trusted hop: the same bucket";
    one_bucket(TRUSTED, a, &first, &then, why).await;
    // Forwarded is not read by default (Caddy and Traefik pass a client's unchanged):
    // the X-Forwarded-For client, whose bucket is spent, is the key
    let forged = [
        ("forwarded", "for=198.51.100.30;proto=http, for=10.9.9.9"),
        ("x-forwarded-for", "198.51.100.20"),
    ];
    assert_eq!(
        status_from(TRUSTED, a, &forged).await,
        StatusCode::TOO_MANY_REQUESTS,
        "a forged Forwarded does not move the key"
    );
    // an untrusted peer's Forwarded is ignored: its own address is the key
    let first = [("forwarded", "for=198.51.100.40")];
    let then = [("forwarded", "for=198.51.100.41")];
    let why = "an untrusted peer's Forwarded is ignored";
    one_bucket(UNTRUSTED, a, &first, &then, why).await;
    // the upstream still gets X-Forwarded-For with the peer appended
    let resp = get_from(
        TRUSTED,
        a,
        "/echo/xff",
        &[("x-forwarded-for", "198.51.100.50, 10.1.2.3")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.body().as_ref(), b"198.51.100.50, 10.1.2.3, 127.0.0.2");
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}
