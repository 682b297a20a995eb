//! The RateLimit fields (`RateLimit-Policy`, `RateLimit`) and an honest `Retry-After`
//! through the proxy: on 200 and 429, `t` equal to `Retry-After`, on a route with two
//! limits, in `--mode forward-auth` (the grant and the deny answer); a client that waits
//! `Retry-After` after a burst is admitted.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Response, StatusCode};
use tokio::process::Command;

/// One member of a structured-field list: (name, parameters).
type Member = (String, Vec<(String, u64)>);

/// The members of `RateLimit-Policy` or `RateLimit` (`"name";k=v;k=v, ...`).
fn members(resp: &Response<Bytes>, field: &str) -> Vec<Member> {
    let Some(v) = resp.headers().get(field) else {
        panic!("no {field} on a {} answer", resp.status());
    };
    v.to_str()
        .unwrap()
        .split(',')
        .map(|m| {
            let mut parts = m.trim().split(';');
            let name = parts.next().unwrap().trim_matches('"').to_owned();
            let params = parts
                .map(|p| {
                    let (k, v) = p.split_once('=').expect("k=v");
                    (k.to_owned(), v.parse().expect("a number"))
                })
                .collect();
            (name, params)
        })
        .collect()
}

fn param(m: &Member, k: &str) -> u64 {
    m.1.iter()
        .find(|(n, _)| n == k)
        .unwrap_or_else(|| panic!("no {k} in {m:?}"))
        .1
}

/// Asserts the fields of one answer: one policy per limit (`q`, `w` as given), a
/// remaining count `r` each; on a rejection `Retry-After` equal to the largest `t` of
/// the exhausted policies.
fn check_fields(resp: &Response<Bytes>, limits: &[(u64, u64)]) {
    let policy = members(resp, "ratelimit-policy");
    let state = members(resp, "ratelimit");
    assert_eq!(policy.len(), limits.len(), "{policy:?}");
    assert_eq!(state.len(), limits.len(), "{state:?}");
    for ((p, s), (q, w)) in policy.iter().zip(&state).zip(limits) {
        assert_eq!(p.0, s.0, "the same policies in the same order");
        assert_eq!((param(p, "q"), param(p, "w")), (*q, *w), "{p:?}");
        assert!(param(s, "r") <= *q, "{s:?}");
    }
    if resp.status() != StatusCode::OK {
        // the exhausted policies (r=0) are the ones to wait for
        let t = state
            .iter()
            .filter(|s| param(s, "r") == 0)
            .map(|s| param(s, "t"))
            .max()
            .unwrap_or_else(|| panic!("no exhausted policy in {state:?}"));
        assert_eq!(
            retry_after(resp),
            t,
            "Retry-After is the exhausted policies' t"
        );
    }
}

/// A burst that takes the whole quota, a 429 whose `Retry-After` (and `t`) is the
/// window, then a client that waits that long and is admitted.
async fn burst_wait_admitted(proxy: &Proc, path: &str, limits: &[(u64, u64)], burst: u64) {
    for _ in 0..burst {
        let resp = get(proxy.addr(), path).await;
        assert_eq!(resp.status(), StatusCode::OK);
        check_fields(&resp, limits);
    }
    let resp = get(proxy.addr(), path).await;
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    check_fields(&resp, limits);
    let wait = retry_after(&resp);
    assert!((1..=2).contains(&wait), "the 2 s window, not more: {wait}");
    // one bounded wait of Retry-After, then the retry: never too short
    tokio::time::sleep(Duration::from_secs(wait)).await;
    let resp = get(proxy.addr(), path).await;
    assert_eq!(
        resp.status(),
        StatusCode::OK,
        "admitted after waiting Retry-After"
    );
    check_fields(&resp, limits);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_and_retry_after_through_the_proxy() {
    let _s = SERIAL.lock().await;
    let r = responder(401);
    let up = upstream().await;
    let ep = endpoint(&r);
    let proxy = start(proxy_cmd(
        &up,
        &["--endpoint", &ep, "--limit", "3/2s", "--key-by", "path"],
    ))
    .await;
    burst_wait_admitted(&proxy, "/burst", &[(3, 2)], 3).await;
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));

    // a config-file route with two limits: two policies on every answer
    let file = TempFile::new(
        "fields.toml",
        &format!(
            "upstream = \"http://{}\"\n\n[[route]]\npath = \"/api/\"\nlimit = [\"50/60s\", \"2/2s\"]\nlabel = \"api\"\n\n[[route]]\npath = \"/health\"\nlimit = \"off\"\n",
            up.addr()
        ),
    );
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .args(["--config", file.path(), "--endpoint", &ep]);
    let proxy = start(cmd).await;
    burst_wait_admitted(&proxy, "/api/x", &[(50, 60), (2, 2)], 2).await;
    let resp = get(proxy.addr(), "/health").await;
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        resp.headers().get("ratelimit").is_none(),
        "an off route has no fields"
    );
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fields_on_forward_auth_grants_and_denials() {
    let _s = SERIAL.lock().await;
    let r = responder(402);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY).args([
        "--mode",
        "forward-auth",
        "--deny-status",
        "403",
        "--endpoint",
        &endpoint(&r),
        "--limit",
        "2/2s",
        "--key-by",
        "path",
    ]);
    let fa = start(cmd).await;
    let orig = [("x-original-uri", "/fa")];
    for _ in 0..2 {
        let resp = get_full(fa.addr(), "/auth", &orig).await;
        assert_eq!(resp.status(), StatusCode::OK);
        check_fields(&resp, &[(2, 2)]);
    }
    let resp = get_full(fa.addr(), "/auth", &orig).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    check_fields(&resp, &[(2, 2)]);
    tokio::time::sleep(Duration::from_secs(retry_after(&resp))).await;
    let resp = get_full(fa.addr(), "/auth", &orig).await;
    assert_eq!(resp.status(), StatusCode::OK, "admitted after Retry-After");
    assert_eq!(fa.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// A route's `latency_guard` is fed by the upstream's latency on that route: a slow
/// upstream (`/slow/300`, 300 ms) trips a 100 ms guard once it has its samples, a quick
/// route with its own tracker keeps admitting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_guard_follows_the_upstream() {
    let _s = SERIAL.lock().await;
    let r = responder(403);
    let up = upstream().await;
    let file = TempFile::new(
        "guard.toml",
        &format!(
            "upstream = \"http://{}\"\n\n[[route]]\npath = \"/slow/\"\nlimit = \"off\"\nlatency_guard = \"100ms\"\nlatency_min_samples = 2\n\n[[route]]\npath = \"/quick/\"\nlimit = \"100/60s\"\nlatency_guard = \"2s\"\nlatency_min_samples = 1\n",
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
    let mut granted = 0;
    let mut rejected = None;
    // bounded: the reports travel beside the decisions, give them a few requests
    for _ in 0..8 {
        let resp = get(proxy.addr(), "/slow/300").await;
        if resp.status() == StatusCode::TOO_MANY_REQUESTS {
            rejected = Some(resp);
            break;
        }
        assert_eq!(resp.status(), StatusCode::OK);
        granted += 1;
    }
    let resp = rejected.expect("the guard rejects once the upstream is seen slow");
    assert!(granted >= 2, "no rejection before the minimum samples");
    assert_eq!(retry_after(&resp), 1);
    for _ in 0..5 {
        assert_eq!(get(proxy.addr(), "/quick/x").await.status(), StatusCode::OK);
    }
    assert_eq!(proxy.signal(libc::SIGTERM).await.code(), Some(0));
    up.signal(libc::SIGTERM).await;
    r.stop();
}
