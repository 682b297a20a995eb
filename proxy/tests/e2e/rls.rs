//! `rl-proxy --mode rls` end to end, as a black box: the binary started as
//! `rl-proxy --mode rls --config FILE.yaml --endpoint ID@IP:PORT --listen 127.0.0.1:0
//! --admin-listen 127.0.0.1:0 --on-failure closed`, our responder as the Ratelimitly
//! service, and a gRPC client (the `envoy-types` tonic client) calling
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit::Unit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tokio::process::Command;
use tonic::transport::Channel;

/// Every rule kind of the format, one domain.
const RULES: &str = "\
domain: bb
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /login
    rate_limit: { window: 10s, requests_per_unit: 2, name: login }
  - key: path
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: tenant
    value: acme
    descriptors:
      - key: user
        rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: free
    rate_limit: { unlimited: true }
  - key: probe
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: a
    rate_limit: { unit: minute, requests_per_unit: 5 }
  - key: b
    rate_limit: { unit: minute, requests_per_unit: 1 }
";

fn rls_cmd(files: &[&TempFile], ep: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .args(["--mode", "rls"]);
    for f in files {
        cmd.args(["--config", f.path()]);
    }
    cmd.args([
        "--endpoint",
        ep,
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .args(extra);
    cmd
}

async fn client(p: &Proc) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", p.addr()))
        .await
        .expect("connects")
}

/// A responder (`id`), [`RULES`] in `file`, `rl-proxy --mode rls ... --on-failure closed`
/// over them, and a client of it.
async fn service(
    id: u64,
    file: &str,
) -> (
    rl_responder::ResponderHandle,
    TempFile,
    Proc,
    RateLimitServiceClient<Channel>,
) {
    let r = responder(id);
    let rules = TempFile::new(file, RULES);
    let p = start(rls_cmd(
        &[&rules],
        &endpoint(&r),
        &["--on-failure", "closed"],
    ))
    .await;
    let c = client(&p).await;
    (r, rules, p, c)
}

/// A request of `domain` with one descriptor per `&[(key, value)]`.
fn req(domain: &str, descs: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descs
            .iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .iter()
                    .map(|(k, v)| Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    }
}

async fn call(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> RateLimitResponse {
    tokio::time::timeout(Duration::from_secs(10), c.should_rate_limit(r))
        .await
        .expect("answer within 10 s")
        .expect("gRPC OK")
        .into_inner()
}

async fn refused(c: &mut RateLimitServiceClient<Channel>, r: RateLimitRequest) -> tonic::Status {
    tokio::time::timeout(Duration::from_secs(10), c.should_rate_limit(r))
        .await
        .expect("answer within 10 s")
        .expect_err("a gRPC error")
}

fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(key))
        .map(|h| h.value.as_str())
}

/// (code, requests_per_unit, unit, remaining, reset seconds) of a status.
fn st(s: &DescriptorStatus) -> (i32, Option<u32>, Option<i32>, u32, Option<i64>) {
    (
        s.code,
        s.current_limit.as_ref().map(|l| l.requests_per_unit),
        s.current_limit.as_ref().map(|l| l.unit),
        s.limit_remaining,
        s.duration_until_reset.map(|d| d.seconds),
    )
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;
const MINUTE: Option<i32> = Some(Unit::Minute as i32);

async fn metrics_text(p: &Proc) -> String {
    String::from_utf8(get(p.admin(), "/metrics").await.body().to_vec()).unwrap()
}

/// Per-descriptor limits and statuses, hits_addend, nested descriptors, unknown keys and
/// domains, unlimited, shadow_mode, atomicity, the RateLimit fields, the metrics (and no
/// key in them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_black_box_list() {
    let _s = SERIAL.lock().await;
    let (r, _rules, p, mut c) = service(601, "rls-bb.yaml").await;

    // per-descriptor limit: remaining counts down; the reset is 0 while another
    // request fits, then the window
    for (left, reset) in [(2, 0), (1, 0), (0, 60)] {
        let a = call(&mut c, req("bb", &[&[("user", "u1")]])).await;
        assert_eq!(a.overall_code, OK);
        assert_eq!(st(&a.statuses[0]), (OK, Some(3), MINUTE, left, Some(reset)));
        assert_eq!(header(&a, "RateLimit-Policy"), Some("\"user\";q=3;w=60"));
        assert_eq!(
            header(&a, "RateLimit"),
            Some(format!("\"user\";r={left};t=60").as_str())
        );
    }
    let a = call(&mut c, req("bb", &[&[("user", "u1")]])).await;
    assert_eq!(a.overall_code, OVER);
    assert_eq!(st(&a.statuses[0]), (OVER, Some(3), MINUTE, 0, Some(60)));
    assert_eq!(header(&a, "Retry-After"), Some("60"));
    assert_eq!(header(&a, "RateLimit"), Some("\"user\";r=0;t=60"));
    // another value, another bucket
    let a = call(&mut c, req("bb", &[&[("user", "u9")]])).await;
    assert_eq!(st(&a.statuses[0]).3, 2);

    // hits_addend: the token count (the request's, or a descriptor's own)
    let mut h = req("bb", &[&[("user", "u2")]]);
    h.hits_addend = 2;
    assert_eq!(call(&mut c, h.clone()).await.statuses[0].limit_remaining, 1);
    assert_eq!(
        call(&mut c, h.clone()).await.overall_code,
        OVER,
        "2 > 1 left"
    );
    h.hits_addend = 0;
    h.descriptors[0].hits_addend = Some(UInt64Value { value: 1 });
    assert_eq!(st(&call(&mut c, h).await.statuses[0]).3, 0);

    // a value rule before the key-only rule; the window extension
    let a = call(&mut c, req("bb", &[&[("path", "/login")]])).await;
    let l = a.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((l.requests_per_unit, l.name.as_str()), (2, "login"));
    assert_eq!(a.statuses[0].duration_until_reset.unwrap().seconds, 0);
    let a = call(&mut c, req("bb", &[&[("path", "/login")]])).await;
    assert_eq!(a.statuses[0].duration_until_reset.unwrap().seconds, 10);
    let a = call(&mut c, req("bb", &[&[("path", "/other")]])).await;
    assert_eq!(st(&a.statuses[0]).1, Some(100));

    // nested descriptors
    let nested: &[(&str, &str)] = &[("tenant", "acme"), ("user", "n")];
    assert_eq!(call(&mut c, req("bb", &[nested])).await.overall_code, OK);
    assert_eq!(call(&mut c, req("bb", &[nested])).await.overall_code, OVER);
    let other: &[(&str, &str)] = &[("tenant", "other"), ("user", "n")];
    let a = call(&mut c, req("bb", &[other])).await;
    assert_eq!(st(&a.statuses[0]), (OK, None, None, 0, None), "no rule");

    // unknown keys and domains: OK, nothing asked
    let a = call(&mut c, req("bb", &[&[("nope", "x")]])).await;
    assert_eq!(st(&a.statuses[0]), (OK, None, None, 0, None));
    assert!(a.response_headers_to_add.is_empty());
    let a = call(&mut c, req("elsewhere", &[&[("user", "u1")]])).await;
    assert_eq!((a.overall_code, a.statuses.len()), (OK, 1));

    // unlimited
    let a = call(&mut c, req("bb", &[&[("free", "x")]])).await;
    assert_eq!(st(&a.statuses[0]), (OK, None, None, u32::MAX, None));

    // shadow_mode: decided, counted, always OK
    for _ in 0..3 {
        let a = call(&mut c, req("bb", &[&[("probe", "p")]])).await;
        assert_eq!(a.overall_code, OK);
    }

    // atomicity: b over its limit holds a back; a's tokens were not consumed
    let ab: &[&[(&str, &str)]] = &[&[("a", "k")], &[("b", "k")]];
    let a = call(&mut c, req("bb", ab)).await;
    assert_eq!(a.overall_code, OK);
    assert_eq!(
        (a.statuses[0].limit_remaining, a.statuses[1].limit_remaining),
        (4, 0)
    );
    let a = call(&mut c, req("bb", ab)).await;
    assert_eq!(a.overall_code, OVER);
    assert_eq!(st(&a.statuses[0]).0, OK);
    assert_eq!(st(&a.statuses[0]).3, 4, "a: nothing consumed");
    assert_eq!(st(&a.statuses[1]).0, OVER);
    assert_eq!(
        header(&a, "RateLimit-Policy"),
        Some("\"a\";q=5;w=60, \"b\";q=1;w=60")
    );
    let a = call(&mut c, req("bb", &[&[("a", "k")]])).await;
    assert_eq!(st(&a.statuses[0]).3, 3, "only the grants consumed a");

    // the metrics: per rule and per call, never the key
    let text = metrics_text(&p).await;
    assert!(
        !text.contains(NONE_KEY),
        "the API key is not on the metrics page"
    );
    assert!(!text.contains("qyyqwps9"), "nor a part of it");
    let m = parse_prometheus(&text);
    let v = |k: &str| *m.get(k).unwrap_or_else(|| panic!("missing {k} in\n{text}"));
    let d = |rule: &str, o: &str| {
        v(&format!(
            "rl_proxy_rls_descriptors_total{{domain=\"bb\",rule=\"{rule}\",outcome=\"{o}\"}}"
        ))
    };
    assert_eq!(d("probe", "shadow_over_limit"), 2.0);
    assert_eq!(d("probe", "granted"), 1.0);
    assert_eq!(d("b", "over_limit"), 1.0);
    assert_eq!(d("a", "not_consumed"), 1.0);
    assert_eq!(d("login", "granted"), 2.0);
    assert!(v("rl_proxy_rls_calls_total{answer=\"over_limit\"}") >= 4.0);
    assert_eq!(
        v("ratelimitly_decision_latency_seconds_count"),
        19.0,
        "one per call with limits"
    );
    assert_eq!(get(p.admin(), "/healthz").await.status(), 200);
    // no series carries a value only a client sent (acme is the configuration's)
    for sent in ["u1", "u9", "/other", "nope", "elsewhere"] {
        assert!(!text.contains(sent), "{sent} in\n{text}");
    }
    assert_eq!(d("tenant_acme.user", "over_limit"), 1.0);

    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// Bad input gets INVALID_ARGUMENT with the reason, and the service goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_invalid_argument() {
    let _s = SERIAL.lock().await;
    let (r, _rules, p, mut c) = service(602, "rls-bad.yaml").await;
    let bad = |s: &tonic::Status, what: &str| {
        assert_eq!(s.code(), tonic::Code::InvalidArgument, "{what}: {s:?}");
        assert!(!s.message().is_empty(), "{what}: a reason");
    };
    let s = refused(&mut c, req("", &[&[("user", "x")]])).await;
    bad(&s, "empty domain");
    assert!(s.message().contains("domain"), "{s:?}");
    let many: Vec<&[(&str, &str)]> = (0..10_000).map(|_| &[("user", "x")][..]).collect();
    let s = refused(&mut c, req("bb", &many)).await;
    bad(&s, "10,000 descriptors");
    assert!(s.message().contains("10000 descriptors"), "{s:?}");
    let big = "v".repeat(1 << 20);
    let s = refused(&mut c, req("bb", &[&[("user", &big)]])).await;
    bad(&s, "a 1 MiB value");
    let mut unit = req("bb", &[&[("user", "x")]]);
    unit.descriptors[0].limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 5, // MONTH
    });
    bad(&refused(&mut c, unit.clone()).await, "month");
    unit.descriptors[0].limit.as_mut().unwrap().unit = 42;
    bad(&refused(&mut c, unit).await, "unknown unit");
    let mut hits = req("bb", &[&[("user", "x")]]);
    hits.hits_addend = 70_000;
    bad(&refused(&mut c, hits).await, "70000 hits");
    // over the message limit: refused before decoding
    let huge = "v".repeat(3 << 20);
    let s = refused(&mut c, req("bb", &[&[("user", &huge)]])).await;
    assert_eq!(s.code(), tonic::Code::OutOfRange, "{s:?}");
    // and the service still answers
    let a = call(&mut c, req("bb", &[&[("user", "after")]])).await;
    assert_eq!(a.statuses[0].limit_remaining, 2);
    let m = parse_prometheus(&metrics_text(&p).await);
    assert_eq!(
        m["rl_proxy_rls_calls_total{answer=\"invalid_argument\"}"],
        6.0
    );
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// The configuration language as the reference reads it, our own file: wildcards
/// anywhere, `share_threshold`, `replaces`, `quota_mode`, `metadata` (the answer's
/// `dynamic_metadata`), `value_to_metric` and `detailed_metric` (the metrics' labels), a
/// `rate_limit` without `requests_per_unit`, and a call with more distinct limits than
/// one Ratelimitly request carries.
const LANGUAGE: &str = "\
domain: lang
descriptors:
  - key: img
    value: /img/*.png
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: cat
    value: read
    rate_limit: { unit: minute, requests_per_unit: 1, name: read }
  - key: endpoint
    value: /special
    rate_limit:
      unit: minute
      requests_per_unit: 5
      replaces:
        - name: read
  - key: svc
    value: one
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
    metadata:
      route: { cluster: one }
  - key: svc
    value: two
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 2 }
    metadata:
      route: { cluster: two }
  - key: method
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: client
    detailed_metric: true
    rate_limit: { unit: minute, requests_per_unit: 100 }
  - key: closed
    rate_limit: { unit: minute }
  - key: many
    rate_limit: { unit: minute, requests_per_unit: 1 }
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_language() {
    let _s = SERIAL.lock().await;
    let r = responder(607);
    let rules = TempFile::new("rls-lang.yaml", LANGUAGE);
    let p = start(rls_cmd(
        &[&rules],
        &endpoint(&r),
        &["--on-failure", "closed"],
    ))
    .await;
    let mut c = client(&p).await;

    // a wildcard in the middle
    let a = call(&mut c, req("lang", &[&[("img", "/img/cat.png")]])).await;
    assert_eq!(st(&a.statuses[0]).1, Some(1));
    let a = call(&mut c, req("lang", &[&[("img", "/img/cat.jpg")]])).await;
    assert_eq!(st(&a.statuses[0]).1, None, "no match");

    // share_threshold: every value matching files/* draws on one bucket
    assert_eq!(
        call(&mut c, req("lang", &[&[("files", "files/a")]]))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        call(&mut c, req("lang", &[&[("files", "files/b")]]))
            .await
            .overall_code,
        OK
    );
    let a = call(&mut c, req("lang", &[&[("files", "files/c")]])).await;
    assert_eq!(a.overall_code, OVER, "shared");

    // replaces: with endpoint /special matched, the rule named read is not applied
    let both: &[&[(&str, &str)]] = &[&[("cat", "read")], &[("endpoint", "/special")]];
    for _ in 0..3 {
        let a = call(&mut c, req("lang", both)).await;
        assert_eq!(a.overall_code, OK);
        assert_eq!(st(&a.statuses[0]), (OK, None, None, 0, None), "replaced");
    }
    assert_eq!(
        call(&mut c, req("lang", &[&[("cat", "read")]]))
            .await
            .overall_code,
        OK
    );
    assert_eq!(
        call(&mut c, req("lang", &[&[("cat", "read")]]))
            .await
            .overall_code,
        OVER
    );

    // quota_mode: over only when every quota descriptor is; the metadata of those that
    // passed routes
    let quota: &[&[(&str, &str)]] = &[&[("svc", "one")], &[("svc", "two")]];
    let routes = |a: &RateLimitResponse| {
        use envoy_types::pb::google::protobuf::value::Kind;
        let m = a.dynamic_metadata.as_ref().expect("dynamic_metadata");
        assert!(matches!(&m.fields["domain"].kind, Some(Kind::StringValue(d)) if d == "lang"));
        let Some(Kind::StructValue(passed)) = m.fields.get("metadata").and_then(|v| v.kind.clone())
        else {
            return String::new();
        };
        let Some(Kind::StructValue(route)) = &passed.fields["route"].kind else {
            panic!("{passed:?}")
        };
        match &route.fields["cluster"].kind {
            Some(Kind::StringValue(c)) => c.clone(),
            k => panic!("{k:?}"),
        }
    };
    let a = call(&mut c, req("lang", quota)).await;
    assert_eq!(
        (a.overall_code, routes(&a)),
        (OK, "one".to_owned()),
        "both passed: the first wins"
    );
    let a = call(&mut c, req("lang", quota)).await;
    assert_eq!(a.overall_code, OK, "two still has quota");
    assert_eq!((st(&a.statuses[0]).0, st(&a.statuses[0]).3), (OVER, 0));
    assert_eq!(routes(&a), "two");
    let a = call(&mut c, req("lang", quota)).await;
    assert_eq!(a.overall_code, OVER, "every quota descriptor over");
    assert_eq!(routes(&a), "");

    // value_to_metric and detailed_metric label by the request's values
    call(&mut c, req("lang", &[&[("method", "GET")]])).await;
    call(&mut c, req("lang", &[&[("client", "c7")]])).await;

    // no requests_per_unit: 0, every call over
    let a = call(&mut c, req("lang", &[&[("closed", "x")]])).await;
    assert_eq!(a.overall_code, OVER);
    assert_eq!(st(&a.statuses[0]), (OVER, Some(0), MINUTE, 0, Some(60)));

    // 40 distinct limits: more than one request carries, split, all answered
    let names: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    let many: Vec<Vec<(&str, &str)>> = names.iter().map(|n| vec![("many", n.as_str())]).collect();
    let many: Vec<&[(&str, &str)]> = many.iter().map(|v| v.as_slice()).collect();
    let a = call(&mut c, req("lang", &many)).await;
    assert_eq!(a.overall_code, OK);
    assert_eq!(a.statuses.len(), 40);
    assert!(
        a.statuses
            .iter()
            .all(|s| s.code == OK && s.limit_remaining == 0)
    );
    let a = call(&mut c, req("lang", &many)).await;
    assert_eq!(a.overall_code, OVER);
    assert!(a.statuses.iter().all(|s| s.code == OVER));

    let m = parse_prometheus(&metrics_text(&p).await);
    let series = |rule: &str| {
        m[&format!(
            "rl_proxy_rls_descriptors_total{{domain=\"lang\",rule=\"{rule}\",outcome=\"granted\"}}"
        )]
    };
    assert_eq!(series("method_GET"), 1.0);
    assert_eq!(series("client_c7"), 1.0);
    assert_eq!(series("img_/img/*.png"), 1.0);
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// `--config DIR` as a Kubernetes ConfigMap volume lays it out (`DIR/x.yaml ->
/// ..data/x.yaml`, `..data -> ..TIMESTAMP`), one domain a file; an update re-points
/// `..data` and SIGHUP reads it; `GET /healthcheck` is 200 OK.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_directory_and_healthcheck() {
    use std::os::unix::fs::symlink;
    let _s = SERIAL.lock().await;
    let dir = std::env::temp_dir().join(format!("rl-proxy-{}-configmap", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let version = |name: &str, limit: u32| {
        let v = dir.join(name);
        std::fs::create_dir_all(&v).unwrap();
        for d in ["one", "two"] {
            let text = format!(
                "domain: {d}\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: {limit} }}\n"
            );
            std::fs::write(v.join(format!("{d}.yaml")), text).unwrap();
        }
        // the kubelet's swap: a new link renamed over ..data
        let tmp = dir.join("..data_tmp");
        symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    };
    version("..2026_12_07_10_00_00.1", 1);
    for d in ["one", "two"] {
        symlink(format!("..data/{d}.yaml"), dir.join(format!("{d}.yaml"))).unwrap();
    }
    std::fs::write(dir.join("README.txt"), "not a rule file").unwrap();

    let r = responder(608);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .args(["--mode", "rls", "--config", dir.to_str().unwrap()])
        .args(["--endpoint", &endpoint(&r)])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
    let p = start(cmd).await;
    let mut c = client(&p).await;
    for d in ["one", "two"] {
        let a = call(&mut c, req(d, &[&[("k", "v")]])).await;
        assert_eq!(st(&a.statuses[0]).1, Some(1), "{d}");
    }
    let h = get(p.admin(), "/healthcheck").await;
    assert_eq!(h.status(), 200);
    assert_eq!(&h.body()[..], b"OK\n");

    version("..2026_12_07_10_05_00.2", 7);
    p.hangup();
    let mut reloaded = false;
    for _ in 0..50 {
        let a = call(&mut c, req("two", &[&[("k", "w")]])).await;
        if st(&a.statuses[0]).1 == Some(7) {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "the new version applies");
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// No decision (the service is gone): `--on-failure closed` is OVER_LIMIT, `open` is OK,
/// neither is gRPC UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_follow_on_failure() {
    let _s = SERIAL.lock().await;
    let r = responder(603);
    let ep = endpoint(&r);
    r.stop();
    let rules = TempFile::new("rls-fail.yaml", RULES);
    for (flags, want) in [
        (&["--on-failure", "closed"][..], Some(OVER)),
        (&["--on-failure", "open"][..], Some(OK)),
        (&[][..], None),
    ] {
        let p = start(rls_cmd(&[&rules], &ep, flags)).await;
        let mut c = client(&p).await;
        let r = req("bb", &[&[("user", "x")], &[("nope", "y")]]);
        match want {
            Some(code) => {
                let a = call(&mut c, r).await;
                assert_eq!(a.overall_code, code, "{flags:?}");
                assert_eq!(st(&a.statuses[1]).0, OK, "no rule: OK");
            }
            None => {
                let s = refused(&mut c, r).await;
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
            }
        }
        // an unknown domain needs no decision
        let a = call(&mut c, req("elsewhere", &[&[("user", "x")]])).await;
        assert_eq!(a.overall_code, OK);
        let m = parse_prometheus(&metrics_text(&p).await);
        assert_eq!(
            m["rl_proxy_rls_descriptors_total{domain=\"bb\",rule=\"user\",outcome=\"failed\"}"],
            1.0
        );
        assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    }
}

/// `--check` names the file and line; SIGHUP applies a good file and keeps the running
/// rules on a bad one, saying why; the mode's flags.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reload_and_flags() {
    let _s = SERIAL.lock().await;
    let good = TempFile::new("rls-check.yaml", RULES);
    let month = TempFile::new(
        "rls-month.yaml",
        &RULES.replace(
            "{ unit: hour, requests_per_unit: 100 }",
            "{ unit: month, requests_per_unit: 100 }",
        ),
    );
    let check = |files: &[&TempFile]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
        cmd.env_remove("RATELIMITLY_API_KEY")
            .args(["--mode", "rls", "--check"]);
        for f in files {
            cmd.args(["--config", f.path()]);
        }
        cmd
    };
    let (code, err) = run_to_exit(check(&[&good])).await;
    assert_eq!(code, Some(0), "{err}");
    let (code, err) = run_to_exit(check(&[&good, &month])).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains(month.path()) && err.contains("line 9:") && err.contains("month"),
        "{err}"
    );
    let (code, err) = run_to_exit(check(&[&good, &good])).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("domain \"bb\""), "one domain, one file: {err}");
    // --mode rls needs --config; --on-failure goes with it
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .args(["--mode", "rls", "--endpoint", "1@127.0.0.1:9"]);
    let (code, err) = run_to_exit(cmd).await;
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--config"), "{err}");

    let r = responder(604);
    let file = TempFile::new(
        "rls-reload.yaml",
        "domain: rl\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    let log = TempFile::new("rls-reload.log", "");
    let stderr = std::fs::File::create(&log.0).unwrap();
    let p = start_with_stderr(
        rls_cmd(&[&file], &endpoint(&r), &["--on-failure", "closed"]),
        Stdio::from(stderr),
    )
    .await;
    let mut c = client(&p).await;
    let one = || req("rl", &[&[("k", "v")]]);
    assert_eq!(call(&mut c, one()).await.overall_code, OK);
    assert_eq!(call(&mut c, one()).await.overall_code, OVER);
    // a good file: the new limit (another bucket) from the next call on
    file.write("domain: rl\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n");
    p.hangup();
    let mut reloaded = false;
    for _ in 0..50 {
        let a = call(&mut c, one()).await;
        if a.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit)
            == Some(5)
        {
            reloaded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(reloaded, "the reloaded limit applies");
    // a bad file: refused, logged with the line, the running rules kept
    file.write("domain: rl\ndescriptors:\n  - key: k\n    rate_limit: { unit: year, requests_per_unit: 9 }\n");
    p.hangup();
    let mut logged = String::new();
    for _ in 0..50 {
        logged = std::fs::read_to_string(&log.0).unwrap();
        if logged.contains("reload refused") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        logged.contains("reload refused") && logged.contains("line 4:"),
        "{logged}"
    );
    let a = call(&mut c, one()).await;
    assert_eq!(st(&a.statuses[0]).1, Some(5), "the running rules kept");
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// With Ratelimitly down the breaker opens after 5 failed calls: each call is then
/// answered at once under the failure policy (counted as a short circuit, not waiting the
/// horizon), `ratelimitly_breaker_open` says so, and both transitions are logged at warn
/// (the default level); a responder back on the same address closes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn breaker_opens_answers_at_once_and_closes() {
    let _s = SERIAL.lock().await;
    let r = responder(604);
    let (ep, addr) = (endpoint(&r), r.addr());
    r.stop();
    let rules = TempFile::new("rls-breaker.yaml", RULES);
    let log = TempFile::new("rls-breaker.log", "");
    let mut cmd = rls_cmd(&[&rules], &ep, &["--on-failure", "closed"]);
    cmd.env_remove("RUST_LOG");
    let p = start_with_stderr(cmd, std::fs::File::create(log.path()).unwrap().into()).await;
    let mut c = client(&p).await;
    let user = || req("bb", &[&[("user", "x")]]);
    for _ in 0..5 {
        assert_eq!(call(&mut c, user()).await.overall_code, OVER);
    }
    let m = parse_prometheus(&metrics_text(&p).await);
    assert_eq!(m["ratelimitly_breaker_open"], 1.0);
    let before = m["ratelimitly_breaker_short_circuits_total"];
    let mut took = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        assert_eq!(call(&mut c, user()).await.overall_code, OVER, "closed");
        took.push(t.elapsed());
    }
    eprintln!("calls with the breaker open took {took:?}");
    let m = parse_prometheus(&metrics_text(&p).await);
    // the probe (at most one a second) may be among them
    assert!(
        m["ratelimitly_breaker_short_circuits_total"] - before >= 4.0,
        "{m:?}"
    );
    assert!(
        std::fs::read_to_string(log.path())
            .unwrap()
            .contains("circuit breaker open")
    );

    // the service is back: the next probe closes the breaker
    let key: ratelimitly_engine::ApiKey = NONE_KEY.parse().unwrap();
    let mut cfg = rl_responder::ResponderConfig::new(vec![key]);
    cfg.server_id = Some(604);
    cfg.listen = addr;
    let r = rl_responder::spawn(cfg).expect("responder starts again on its address");
    let mut closed = false;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if call(&mut c, user()).await.overall_code == OK {
            closed = true;
            break;
        }
    }
    assert!(closed, "a probe got a decision within 4 s");
    let m = parse_prometheus(&metrics_text(&p).await);
    assert_eq!(m["ratelimitly_breaker_open"], 0.0);
    let text = std::fs::read_to_string(log.path()).unwrap();
    let closed_line = text
        .lines()
        .find(|l| l.contains("circuit breaker closed"))
        .unwrap_or_else(|| panic!("the closing is logged: {text}"));
    assert!(closed_line.contains("WARN"), "{closed_line}");
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// The files are watched, without a signal: envoyproxy/ratelimit's layout (no
/// `--config`: `$RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/config`) as a ConfigMap volume; a
/// `..data` swap applies within 5 s, a broken file is refused (logged with its file and
/// line, counted, the running rules kept), a new file applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_directory_is_watched() {
    use std::os::unix::fs::symlink;
    let _s = SERIAL.lock().await;
    let root = std::env::temp_dir().join(format!("rl-proxy-{}-watched", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = root.join("ratelimit").join("config");
    std::fs::create_dir_all(&dir).unwrap();
    let rule = |limit: u32| {
        format!(
            "domain: w\ndescriptors:\n  - key: k\n    rate_limit: {{ unit: minute, requests_per_unit: {limit} }}\n"
        )
    };
    let version = |name: &str, text: &str| {
        let v = dir.join(name);
        std::fs::create_dir_all(&v).unwrap();
        std::fs::write(v.join("w.yaml"), text).unwrap();
        let tmp = dir.join("..data_tmp");
        symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, dir.join("..data")).unwrap();
    };
    version("..1", &rule(1));
    symlink("..data/w.yaml", dir.join("w.yaml")).unwrap();

    let r = responder(611);
    let log = TempFile::new("rls-watched.log", "");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
    cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
        .env("RUNTIME_ROOT", &root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .args(["--mode", "rls", "--endpoint", &endpoint(&r)])
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
    let p = start_with_stderr(cmd, Stdio::from(std::fs::File::create(&log.0).unwrap())).await;
    let mut c = client(&p).await;
    let limit_of = |a: &RateLimitResponse| st(&a.statuses[0]).1;
    assert_eq!(
        limit_of(&call(&mut c, req("w", &[&[("k", "v")]])).await),
        Some(1)
    );

    // applied within 5 s of the swap (polled every 100 ms, 60 times at most)
    async fn until(mut f: impl AsyncFnMut() -> bool) -> bool {
        for _ in 0..60 {
            if f().await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
    version("..2", &rule(7));
    let t = std::time::Instant::now();
    let ok =
        until(async || limit_of(&call(&mut c, req("w", &[&[("k", "v")]])).await) == Some(7)).await;
    assert!(
        ok && t.elapsed() < Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );

    // a broken version: refused, logged with file and line, counted; the rules kept
    version(
        "..3",
        "domain: w\ndescriptors:\n  - key: k\n    rate_limit: { unit: year }\n",
    );
    let ok = until(async || {
        metrics_of(&p).await["rl_proxy_rls_config_reloads_total{result=\"refused\"}"] >= 1.0
    })
    .await;
    assert!(ok, "the refusal is counted");
    let logged = std::fs::read_to_string(&log.0).unwrap();
    assert!(
        logged.contains("WARN") && logged.contains("w.yaml: line 4:"),
        "{logged}"
    );
    assert_eq!(
        limit_of(&call(&mut c, req("w", &[&[("k", "v")]])).await),
        Some(7)
    );

    // fixed, and a new file with a new domain
    version("..4", &rule(9));
    std::fs::write(
        dir.join("n.yaml"),
        "domain: n\ndescriptors:\n  - key: k\n    rate_limit: { unit: minute, requests_per_unit: 4 }\n",
    )
    .unwrap();
    let ok = until(async || {
        let a = call(&mut c, req("n", &[&[("k", "v")]])).await;
        limit_of(&a) == Some(4)
    })
    .await;
    assert!(ok, "the new file applies");
    assert_eq!(
        limit_of(&call(&mut c, req("w", &[&[("k", "v")]])).await),
        Some(9)
    );
    assert!(metrics_of(&p).await["rl_proxy_rls_config_reloads_total{result=\"ok\"}"] >= 2.0);
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
    let _ = std::fs::remove_dir_all(&root);
}

/// POST `body` to `path`: the whole answer.
async fn post(
    addr: std::net::SocketAddr,
    path: &str,
    body: Vec<u8>,
) -> http::Response<bytes::Bytes> {
    use http_body_util::{BodyExt, Full};
    let c = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let req = http::Request::post(format!("http://{addr}{path}"))
        .body(Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), c.request(req))
        .await
        .expect("answer within 10 s")
        .expect("HTTP exchange");
    let (parts, body) = resp.into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

/// `grpc.health.v1.Health` on the gRPC listener: `SERVING` with Ratelimitly answering,
/// `NOT_SERVING` while no decision can be made (a closed port).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_follows_readiness() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let _s = SERIAL.lock().await;
    let rules = TempFile::new("rls-health.yaml", RULES);
    let status = async |p: &Proc, service: &str| {
        let channel = Channel::from_shared(format!("http://{}", p.addr()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut h = HealthClient::new(channel);
        h.check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(|r| r.into_inner().status)
    };
    let r = responder(612);
    let p = start(rls_cmd(&[&rules], &endpoint(&r), &[])).await;
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        assert_eq!(
            status(&p, service).await.unwrap(),
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
    let unknown = status(&p, "no.such.Service").await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
    // ShouldRateLimit still answers on the same listener
    let mut c = client(&p).await;
    assert_eq!(
        call(&mut c, req("bb", &[&[("user", "h")]]))
            .await
            .overall_code,
        OK
    );
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();

    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let ep = format!("9@127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let p = start(rls_cmd(&[&rules], &ep, &[])).await;
    let mut seen = None;
    for _ in 0..50 {
        seen = Some(status(&p, "").await.unwrap());
        if seen == Some(ServingStatus::NotServing as i32) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, Some(ServingStatus::NotServing as i32));
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
}

/// The admin listener's `POST /json` (the reference's JSON form of ShouldRateLimit:
/// 200 OK, 429 OVER_LIMIT, 400 on a bad body, 413 past 1 MiB) and `GET /rlconfig` (the
/// rules in force, one line each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_and_rlconfig() {
    let _s = SERIAL.lock().await;
    let (r, _rules, p, _c) = service(613, "rls-json.yaml").await;
    let body = br#"{"domain": "bb", "descriptors": [{"entries": [{"key": "tenant", "value": "acme"}, {"key": "user", "value": "j"}]}]}"#;
    let a = post(p.admin(), "/json", body.to_vec()).await;
    assert_eq!(a.status(), 200);
    assert_eq!(a.headers()["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_slice(a.body()).unwrap();
    assert_eq!(v["overallCode"], "OK", "{v}");
    assert_eq!(v["statuses"][0]["code"], "OK");
    assert_eq!(v["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    assert_eq!(v["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    let a = post(p.admin(), "/json", body.to_vec()).await;
    assert_eq!(a.status(), 429);
    let v: serde_json::Value = serde_json::from_slice(a.body()).unwrap();
    assert_eq!(v["overallCode"], "OVER_LIMIT", "{v}");
    assert!(
        v["statuses"][0]["durationUntilReset"]
            .as_str()
            .unwrap()
            .ends_with('s')
    );
    for bad in [
        &b"{"[..],
        b"{\"domain\": 5}",
        b"{\"domain\": \"bb\", \"nope\": 1}",
        b"",
        b"{}",
    ] {
        let a = post(p.admin(), "/json", bad.to_vec()).await;
        assert_eq!(a.status(), 400, "{}", String::from_utf8_lossy(bad));
    }
    let a = post(p.admin(), "/json", vec![b' '; (1 << 20) + 1]).await;
    assert_eq!(a.status(), 413);
    // GET /json is not a route
    assert_eq!(get(p.admin(), "/json").await.status(), 404);

    let a = get(p.admin(), "/rlconfig").await;
    assert_eq!(a.status(), 200);
    let text = String::from_utf8(a.body().to_vec()).unwrap();
    for line in [
        "bb.user: unit=MINUTE requests_per_unit=3, shadow_mode: false",
        "bb.tenant_acme.user: unit=MINUTE requests_per_unit=1, shadow_mode: false",
        "bb.probe: unit=MINUTE requests_per_unit=1, shadow_mode: true",
        "bb.free: unlimited, shadow_mode: false",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in\n{text}");
    }
    assert_eq!(text.lines().count(), 8, "{text}");
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    r.stop();
}

/// envoyproxy/ratelimit's environment variables: GRPC_HOST/GRPC_PORT, HOST/PORT,
/// LOG_FORMAT, SHADOW_MODE, NEAR_LIMIT_RATIO (the per-key hit counters),
/// LIMIT_RESPONSE_HEADERS_ENABLED; a flag given wins; the
/// reference's variables without effect are logged at warn; a bad value is exit 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_references_environment_variables() {
    let _s = SERIAL.lock().await;
    let rules = TempFile::new("rls-env.yaml", RULES);
    let r = responder(614);
    let (gp, hp) = (free_port(), free_port());
    let cmd = |extra: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rl-proxy"));
        cmd.env("RATELIMITLY_API_KEY", NONE_KEY)
            .env_remove("RUST_LOG")
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", gp.to_string())
            .env("HOST", "127.0.0.1")
            .env("PORT", hp.to_string())
            .env("LOG_FORMAT", "json")
            .env("LOG_LEVEL", "warn")
            .env("SHADOW_MODE", "true")
            .env("NEAR_LIMIT_RATIO", "0.5")
            .env("LIMIT_RESPONSE_HEADERS_ENABLED", "false")
            .env("REDIS_URL", "redis:6379")
            .env("USE_STATSD", "false")
            .args(["--mode", "rls", "--config", rules.path()])
            .args(["--endpoint", &endpoint(&r)])
            .args(extra);
        cmd
    };
    let log = TempFile::new("rls-env.log", "");
    let p = start_with_stderr(
        cmd(&[]),
        Stdio::from(std::fs::File::create(&log.0).unwrap()),
    )
    .await;
    assert_eq!((p.addr().port(), p.admin().port()), (gp, hp));
    let mut c = client(&p).await;
    let user = || req("bb", &[&[("user", "env")]]);
    for _ in 0..3 {
        assert_eq!(call(&mut c, user()).await.overall_code, OK);
    }
    // over the limit: the status says so, the call is OK (SHADOW_MODE), no headers
    let a = call(&mut c, user()).await;
    assert_eq!((a.overall_code, a.statuses[0].code), (OK, OVER));
    assert!(a.response_headers_to_add.is_empty(), "{a:?}");
    let m = metrics_of(&p).await;
    assert_eq!(m["rl_proxy_rls_global_shadow_mode_total"], 1.0);
    // the reference's per-key statistics: 3 of 3 within (the 2nd and 3rd above half of
    // the limit: near), the 4th over
    for (kind, n) in [
        ("total_hits", 4.0),
        ("within_limit", 3.0),
        ("near_limit", 2.0),
        ("over_limit", 1.0),
        ("shadow_mode", 0.0),
    ] {
        let k = format!(
            "rl_proxy_rls_descriptor_hits_total{{domain=\"bb\",rule=\"user\",kind=\"{kind}\"}}"
        );
        assert_eq!(m[&k], n, "{k}");
    }
    let logged = std::fs::read_to_string(&log.0).unwrap();
    for var in ["REDIS_URL", "USE_STATSD"] {
        let line = logged
            .lines()
            .find(|l| l.contains(&format!("{var} is set")))
            .unwrap_or_else(|| panic!("{var} in {logged}"));
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        assert_eq!(v["level"], "WARN", "{line}");
    }
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));

    // the flags given win over the variables
    let log = TempFile::new("rls-env-flags.log", "");
    let p = start_with_stderr(
        cmd(&["--listen", "127.0.0.1:0", "--log-format", "text"]),
        Stdio::from(std::fs::File::create(&log.0).unwrap()),
    )
    .await;
    assert_ne!(p.addr().port(), gp);
    assert_eq!(p.admin().port(), hp);
    assert_eq!(p.signal(libc::SIGTERM).await.code(), Some(0));
    let logged = std::fs::read_to_string(&log.0).unwrap();
    assert!(
        logged.contains("WARN") && logged.contains("REDIS_URL is set") && !logged.starts_with('{'),
        "{logged}"
    );

    // a value that does not parse: exit 2, naming the variable
    let mut bad = cmd(&[]);
    bad.env("GRPC_PORT", "eighty");
    let (code, err) = run_to_exit(bad).await;
    assert_eq!(code, Some(2));
    assert!(err.contains("GRPC_PORT=\"eighty\""), "{err}");
    r.stop();
}
