//! End-to-end tests of the rlctl binary against embedded responders on 127.0.0.1.
//!
//! Each test runs the built binary with std::process::Command, passes the key through
//! RATELIMITLY_API_KEY (or --key-file), parses `--json` output key by key, and checks the
//! responders' counters. Keys, responders and endpoints come from `rl-testkit` (the public
//! fixtures of tests/data/vectors.json).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rl_responder::Faults;
use serde_json::Value;

use rl_testkit::harness::{endpoint_arg, responder};
use rl_testkit::keys::{AES as AES_KEY, BAD_CHECKSUM as BAD_KEY, COOKIE as COOKIE_KEY};

fn rlctl(key: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rlctl"));
    cmd.args(args).env_remove("RATELIMITLY_API_KEY");
    if let Some(k) = key {
        cmd.env("RATELIMITLY_API_KEY", k);
    }
    cmd.output().expect("run rlctl")
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

fn json_of(o: &Output) -> Value {
    let text = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one JSON line expected, got {text:?}"
    );
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("bad JSON {text:?}: {e}"))
}

/// Polls `cond` every 10 ms for at most 2 s.
fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(2);
    for _ in 0..200 {
        if cond() {
            return true;
        }
        if Instant::now() >= end {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    cond()
}

fn hex(id: [u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Keys of the request JSON object, all required.
const REQUEST_KEYS: [&str; 11] = [
    "outcome",
    "failure",
    "server_id",
    "round",
    "latency_us",
    "horizon_ms",
    "sends",
    "completion_sends",
    "resources",
    "guards",
    "error",
];

fn check_request_shape(v: &Value) {
    let obj = v.as_object().expect("object");
    for k in REQUEST_KEYS {
        assert!(obj.contains_key(k), "missing key {k} in {v}");
    }
    assert_eq!(obj.len(), REQUEST_KEYS.len(), "unexpected keys in {v}");
}

#[test]
fn key_json_decodes_vector_keys() {
    let o = rlctl(Some(AES_KEY), &["key", "--json"]);
    assert_eq!(code(&o), 0);
    let v = json_of(&o);
    assert_eq!(v["mode"], "aes");
    assert_eq!(v["key_id"], 3);
    assert_eq!(v["quotas"]["rate_buckets_max"], 65536);
    assert_eq!(v["quotas"]["latency_services_max"], 1024);
    assert_eq!(v["quotas"]["metrics_labels_max"], 4096);
    assert_eq!(v["quotas"]["latency_buffer_size_max"], 64);
    assert_eq!(v["quotas"]["dedup_ttl_ms_max"], 300);
    assert_eq!(v["quotas"]["rate_window_size_ms_max"], 4294967295u64);
    assert_eq!(v["default_domain"], "c-3.p0.ratelimitly.com");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains(AES_KEY));
    assert!(
        !all.contains(&"03".repeat(32)),
        "secret must not be printed"
    );

    // From a key file, cookie mode, readable output.
    let path = std::env::temp_dir().join(format!("rlctl-test-key-{}", std::process::id()));
    std::fs::write(&path, format!("{COOKIE_KEY}\n")).unwrap();
    let o = rlctl(None, &["key", "--key-file", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(code(&o), 0);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("cookie") && text.contains("c-2.p0.ratelimitly.com"),
        "{text}"
    );
    assert!(!text.contains(COOKIE_KEY));
}

#[test]
fn key_missing_or_invalid_exits_2_without_echo() {
    let o = rlctl(None, &["key", "--json"]);
    assert_eq!(code(&o), 2);
    assert!(
        json_of(&o)["error"]
            .as_str()
            .unwrap()
            .contains("RATELIMITLY_API_KEY")
    );
    let o = rlctl(Some(BAD_KEY), &["key"]);
    assert_eq!(code(&o), 2);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains(BAD_KEY), "key echoed: {all}");
    assert!(all.contains("checksum"), "{all}");
}

#[test]
fn ids_match_vectors() {
    let o = rlctl(
        None,
        &[
            "ids",
            "--json",
            "--resource",
            "checkout:1000:100",
            "--resource",
            "café:60000:25",
            "--tracker",
            "inventory-backend:10000:100:5",
            "--tracker",
            "café:60000:200:3",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let v = json_of(&o);
    assert_eq!(
        v["resources"][0]["bucket_id"],
        "f5cf3ad8b8406854b596ba3614f16eff"
    );
    assert_eq!(
        v["resources"][1]["bucket_id"],
        "732b120606917c683e37433fa00a60dc"
    );
    assert_eq!(v["resources"][1]["name"], "café");
    assert_eq!(
        v["trackers"][0]["tracker_id"],
        "6a17d07a424568304e50d28540f76e67"
    );
    assert_eq!(
        v["trackers"][1]["tracker_id"],
        "0f04bcd0fa9d655ca40dd204f50196f7"
    );
    let o = rlctl(None, &["ids", "--resource", "checkout:1000:100"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("f5cf3ad8b8406854b596ba3614f16eff"));
    // Malformed spec: clap usage error, exit 2.
    assert_eq!(
        code(&rlctl(None, &["ids", "--resource", "checkout:x:100"])),
        2
    );
}

#[test]
fn help_is_complete() {
    let o = rlctl(None, &["--help"]);
    assert_eq!(code(&o), 0);
    let t = String::from_utf8_lossy(&o.stdout);
    for word in [
        "RATELIMITLY_API_KEY",
        "Exit status",
        "request",
        "report",
        "discover",
        "ids",
    ] {
        assert!(t.contains(word), "--help lacks {word}");
    }
    let o = rlctl(None, &["request", "--help"]);
    let t = String::from_utf8_lossy(&o.stdout);
    for word in [
        "--consume",
        "--guard",
        "--schedule",
        "exp:INIT,FACTOR,MAX",
        "completion_sends",
        "--endpoint",
    ] {
        assert!(t.contains(word), "request --help lacks {word}");
    }
}

#[test]
fn discover_against_test_dns() {
    let old = (1000u64 << 23) | 5;
    let young = (2000u64 << 23) | 9;
    let dns = rl_responder::dns::spawn(
        "disc.test",
        vec![
            (young, vec!["127.0.0.1:4300".parse().unwrap()]),
            (old, vec!["127.0.0.2:4301".parse().unwrap()]),
        ],
    )
    .unwrap();
    let dns_arg = dns.addr().to_string();
    let o = rlctl(
        None,
        &[
            "discover",
            "--domain",
            "disc.test",
            "--dns-server",
            &dns_arg,
            "--json",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let v = json_of(&o);
    assert_eq!(v["oldest_server_id"], old);
    let servers = v["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 2);
    assert_eq!(servers[0]["server_id"], old);
    assert_eq!(servers[0]["oldest"], true);
    assert_eq!(servers[0]["target"], format!("s-{old}.disc.test"));
    assert_eq!(servers[0]["addresses"][0], "127.0.0.2:4301");
    assert_eq!(servers[0]["start_time_unix_s"], 1_735_689_600u64 + 1000);
    assert_eq!(servers[0]["start_time_utc"], "2025-01-01T00:16:40Z");
    assert_eq!(servers[1]["server_id"], young);
    assert_eq!(servers[1]["oldest"], false);
    assert!(servers[1]["ttl_s"].as_u64().unwrap() > 0);

    let o = rlctl(
        None,
        &[
            "discover",
            "--domain",
            "disc.test",
            "--dns-server",
            &dns_arg,
        ],
    );
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("(oldest)") && t.contains("127.0.0.1:4300"),
        "{t}"
    );

    // Unknown domain: discovery failure, exit 4.
    let o = rlctl(
        None,
        &[
            "discover",
            "--domain",
            "nope.test",
            "--dns-server",
            &dns_arg,
            "--json",
        ],
    );
    assert_eq!(code(&o), 4);
    dns.stop();
}

#[test]
fn request_grant_then_rejection_with_deficit() {
    let r = responder(AES_KEY, 77 << 23, Faults::default());
    let ep = endpoint_arg(&r);
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--endpoint",
            &ep,
            "--consume",
            "cli-grant:60000:3:2",
            "--label",
            "cli",
            "--json",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    let bucket = hex(ratelimitly_engine::proto::ids::bucket_id(
        b"cli-grant",
        60000,
        3,
    ));
    assert_eq!(v["outcome"], "granted");
    assert_eq!(v["failure"], Value::Null);
    assert_eq!(v["server_id"], 77u64 << 23);
    assert_eq!(v["round"], 0);
    assert_eq!(v["horizon_ms"], 300);
    assert_eq!(v["sends"], 1);
    assert_eq!(v["completion_sends"], 0);
    assert_eq!(v["error"], Value::Null);
    assert!(v["latency_us"].as_u64().is_some());
    assert_eq!(v["resources"][0]["bucket_id"], bucket.as_str());
    assert_eq!(v["resources"][0]["deficit"], 0);
    assert_eq!(v["guards"], serde_json::json!([]));

    // 2 of 3 consumed: asking 2 more is short by 1.
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--endpoint",
            &ep,
            "--consume",
            "cli-grant:60000:3:2",
            "--json",
        ],
    );
    assert_eq!(code(&o), 1, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "rejected");
    assert_eq!(v["failure"], Value::Null);
    assert_eq!(v["resources"][0]["bucket_id"], bucket.as_str());
    assert_eq!(v["resources"][0]["actual_rate"], 2);
    assert_eq!(v["resources"][0]["deficit"], 1);

    // Readable output of a rejection.
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--endpoint",
            &ep,
            "--consume",
            "cli-grant:60000:3:2",
        ],
    );
    assert_eq!(code(&o), 1);
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(
        t.contains("rejected") && t.contains("cli-grant") && t.contains("deficit 1"),
        "{t}"
    );
    let c = r.counters();
    assert_eq!((c.granted, c.rejected), (1, 2));
}

#[test]
fn guard_fails_after_reports() {
    let r = responder(COOKIE_KEY, 5 << 23, Faults::default());
    let ep = endpoint_arg(&r);
    let o = rlctl(
        Some(COOKIE_KEY),
        &[
            "report",
            "--endpoint",
            &ep,
            "--json",
            "--tracker",
            "cli-db:60000:10:2",
            "--observed",
            "400",
            "--tracker",
            "cli-db:60000:10:2",
            "--observed",
            "500",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let v = json_of(&o);
    assert_eq!(
        v,
        serde_json::json!({"datagrams": 1, "endpoints": 1, "error": null})
    );
    assert!(
        eventually(|| r.counters().report_entries >= 2),
        "reports not received"
    );

    let o = rlctl(
        Some(COOKIE_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--endpoint",
            &ep,
            "--guard",
            "cli-db:60000:10:2:100",
            "--json",
        ],
    );
    assert_eq!(code(&o), 1, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "rejected");
    let g = &v["guards"][0];
    assert_eq!(
        g["tracker_id"],
        hex(ratelimitly_engine::proto::ids::tracker_id(
            b"cli-db", 60000, 10, 2
        ))
        .as_str()
    );
    assert_eq!(g["threshold_ms"], 100);
    assert!(g["current_latency_ms"].as_u64().unwrap() >= 400, "{g}");
    assert_eq!(g["passed"], false);

    // A guard on an unreported tracker passes (0 while warming up).
    let o = rlctl(
        Some(COOKIE_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--endpoint",
            &ep,
            "--guard",
            "cli-cold:60000:10:2:100",
            "--json",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    assert_eq!(json_of(&o)["guards"][0]["passed"], true);
}

#[test]
fn silent_responder_times_out_after_horizon() {
    let faults = Faults {
        silent: true,
        ..Faults::default()
    };
    let r = responder(AES_KEY, 9 << 23, faults);
    let ep = endpoint_arg(&r);
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--endpoint",
            &ep,
            "--consume",
            "cli-t:1000:5",
            "--json",
        ],
    );
    assert_eq!(code(&o), 3, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["failure"], "timeout");
    assert_eq!(v["horizon_ms"], 60);
    assert_eq!(v["server_id"], Value::Null);
    assert_eq!(v["round"], Value::Null);
    // Round 0 plus one replay, nothing after D.
    assert_eq!(v["sends"], 2);
    assert_eq!(v["completion_sends"], 0);
    // The failure comes at D = t0 + H (never before it).
    assert!(v["latency_us"].as_u64().unwrap() >= 60_000, "{v}");
    assert!(v["error"].as_str().unwrap().contains("60"));
    assert!(
        eventually(|| r.counters().fault_silent_drops >= 2),
        "{:?}",
        r.counters()
    );
}

#[test]
fn policy_over_key_limit_sends_nothing() {
    let r = responder(AES_KEY, 11 << 23, Faults::default());
    let ep = endpoint_arg(&r);
    // 300 ms key: U = 101 with the default shape gives H = 303.
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--endpoint",
            &ep,
            "--unit-ms",
            "101",
            "--consume",
            "cli-p:1000:5",
            "--json",
        ],
    );
    assert_eq!(code(&o), 2, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["failure"], "configuration");
    assert_eq!(v["sends"], 0);
    let err = v["error"].as_str().unwrap();
    assert!(err.contains("303") && err.contains("300"), "{err}");
    // A bad schedule is a configuration error too.
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--endpoint",
            &ep,
            "--schedule",
            "exp:1,1,4",
            "--consume",
            "cli-p:1000:5",
            "--json",
        ],
    );
    assert_eq!(code(&o), 2, "{o:?}");
    assert_eq!(json_of(&o)["failure"], "configuration");
    std::thread::sleep(Duration::from_millis(50));
    let c = r.counters();
    assert_eq!(c.received, 0, "{c:?}");
}

#[test]
fn invalid_key_is_configuration_error_not_echoed() {
    let r = responder(AES_KEY, 12 << 23, Faults::default());
    let ep = endpoint_arg(&r);
    let o = rlctl(
        Some(BAD_KEY),
        &[
            "request",
            "--endpoint",
            &ep,
            "--consume",
            "cli-k:1000:5",
            "--json",
        ],
    );
    assert_eq!(code(&o), 2, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "failed");
    assert_eq!(v["failure"], "configuration");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!all.contains(BAD_KEY));
    assert!(
        !all.contains("qvpsxqcrqvpsxqcr"),
        "part of the key echoed: {all}"
    );
    // No key at all.
    let o = rlctl(
        None,
        &["request", "--endpoint", &ep, "--consume", "cli-k:1000:5"],
    );
    assert_eq!(code(&o), 2);
    // Key file that does not exist.
    let missing = PathBuf::from("/nonexistent/rlctl-key");
    let o = rlctl(
        None,
        &[
            "request",
            "--key-file",
            missing.to_str().unwrap(),
            "--endpoint",
            &ep,
            "--consume",
            "x:1:1",
        ],
    );
    assert_eq!(code(&o), 2);
    assert_eq!(r.counters().received, 0);
}

#[test]
fn slow_oldest_younger_decides_then_completion_to_oldest() {
    // Oldest server answers after 60 ms (> U = 20 ms); the younger answers at once.
    let slow = Faults {
        delay: Duration::from_millis(60),
        ..Faults::default()
    };
    let oldest = responder(AES_KEY, 100 << 23, slow);
    let younger = responder(AES_KEY, 200 << 23, Faults::default());
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--unit-ms",
            "50",
            "--endpoint",
            &endpoint_arg(&younger),
            "--endpoint",
            &endpoint_arg(&oldest),
            "--consume",
            "cli-two:60000:100",
            "--json",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "granted");
    assert_eq!(v["server_id"], 200u64 << 23);
    assert_eq!(v["round"], 0);
    assert_eq!(v["sends"], 3);
    assert_eq!(v["completion_sends"], 1);
    // Decided at the end of round 0, not earlier.
    assert!(v["latency_us"].as_u64().unwrap() >= 50_000, "{v}");
    // The oldest got the request twice: the initial send and the completion delivery
    // (answered from its dedup table without a second debit).
    assert!(
        eventually(|| oldest.counters().rate_requests >= 2),
        "{:?}",
        oldest.counters()
    );
    let c = oldest.counters();
    assert_eq!(c.granted, 1, "{c:?}");
    assert_eq!(c.dedup_hits, 1, "{c:?}");
    assert_eq!(younger.counters().rate_requests, 1);
}

#[test]
fn request_through_dns_discovery() {
    let r = responder(AES_KEY, 300 << 23, Faults::default());
    let dns = rl_responder::dns::spawn("req.test", vec![(r.server_id(), vec![r.addr()])]).unwrap();
    let dns_arg = dns.addr().to_string();
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--domain",
            "req.test",
            "--dns-server",
            &dns_arg,
            "--consume",
            "cli-dns:1000:5",
            "--json",
        ],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    assert_eq!(json_of(&o)["server_id"], 300u64 << 23);
    // Discovery failure: exit 4.
    let o = rlctl(
        Some(AES_KEY),
        &[
            "request",
            "--unit-ms",
            "100",
            "--domain",
            "none.test",
            "--dns-server",
            &dns_arg,
            "--consume",
            "cli-dns:1000:5",
            "--json",
        ],
    );
    assert_eq!(code(&o), 4, "{o:?}");
    assert_eq!(json_of(&o)["failure"], "discovery");
    dns.stop();
}

#[test]
fn empty_request_grants_locally() {
    let o = rlctl(
        Some(AES_KEY),
        &["request", "--endpoint", "1@127.0.0.1:9", "--json"],
    );
    assert_eq!(code(&o), 0, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["outcome"], "granted");
    assert_eq!(v["server_id"], Value::Null);
    assert_eq!(v["round"], Value::Null);
    assert_eq!(v["sends"], 0);
}

#[test]
fn report_batches_count_datagrams_per_endpoint() {
    let a = responder(COOKIE_KEY, 11 << 23, Faults::default());
    let b = responder(COOKIE_KEY, 12 << 23, Faults::default());
    let (ea, eb) = (endpoint_arg(&a), endpoint_arg(&b));
    // 40 entries: two datagrams in cookie mode (at most 34 entries each)
    let mut args = vec![
        "report".to_string(),
        "--endpoint".into(),
        ea,
        "--endpoint".into(),
        eb,
        "--json".into(),
    ];
    for i in 0..40 {
        args.extend([
            "--tracker".into(),
            format!("cli-batch-{i}:60000:10:2"),
            "--observed".into(),
            format!("{}", 10 + i),
        ]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = rlctl(Some(COOKIE_KEY), &args);
    assert_eq!(code(&o), 0, "{o:?}");
    assert_eq!(
        json_of(&o),
        serde_json::json!({"datagrams": 4, "endpoints": 2, "error": null})
    );
    for r in [&a, &b] {
        assert!(
            eventually(|| r.counters().report_entries >= 40),
            "reports not received"
        );
        let c = r.counters();
        assert_eq!((c.reports, c.report_entries), (2, 40));
    }
}

/// An engine that cannot start on this host (here: no file descriptor left for its
/// sockets, `ulimit -n 4`) is a configuration failure, exit 2, with nothing sent: not a
/// communication failure.
#[test]
fn engine_start_failure_is_a_configuration_error() {
    let r = responder(AES_KEY, 13 << 23, Faults::default());
    let ep = endpoint_arg(&r);
    let without_fds = |args: &[&str]| {
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 4 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_rlctl"))
            .args(args)
            .env("RATELIMITLY_API_KEY", AES_KEY)
            .output()
            .expect("run rlctl under sh")
    };
    let o = without_fds(&[
        "request",
        "--endpoint",
        &ep,
        "--consume",
        "cli-m:1000:5",
        "--json",
    ]);
    assert_eq!(code(&o), 2, "{o:?}");
    let v = json_of(&o);
    check_request_shape(&v);
    assert_eq!(v["failure"], "configuration");
    assert_eq!(v["sends"], 0);
    assert!(v["error"].as_str().unwrap().contains("cannot start"), "{v}");
    let o = without_fds(&[
        "report",
        "--endpoint",
        &ep,
        "--tracker",
        "db:10000:100:5",
        "--observed",
        "7",
        "--json",
    ]);
    assert_eq!(code(&o), 2, "{o:?}");
    assert!(
        json_of(&o)["error"]
            .as_str()
            .unwrap()
            .contains("cannot start")
    );
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(r.counters().received, 0);
}
