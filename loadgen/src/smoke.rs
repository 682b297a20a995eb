//! Tests of the run (`main.rs`): core choice, the `parameters` keys, an end-to-end
//! `--compare` on loopback, and smoke tests of the I/O options: a short loopback run per
//! client with the mmsg backend, GSO off and reply batching off, a short open-loop
//! `--compare`, and `--raw-busy-poll`.

use super::*;
use clap::Parser;

/// Every key of the JSON report's `parameters`.
const PARAMETER_KEYS: [&str; 38] = [
    "servers",
    "embedded",
    "auth",
    "key_id",
    "unit_ms",
    "replays",
    "schedule",
    "final_units",
    "completion_delivery",
    "horizon_ms",
    "resources",
    "guards",
    "label",
    "report_share",
    "buckets",
    "rate_limit",
    "window_ms",
    "loss",
    "delay_ms",
    "jitter_ms",
    "dead_oldest",
    "client_cores",
    "responder_cores",
    "duration_s",
    "warmup_s",
    "in_flight",
    "rate",
    "batch",
    "socket_buffer",
    "raw_sleep",
    "raw_wait",
    "compare",
    "client",
    "io",
    "gso",
    "reply_batch",
    "engine_core",
    "max_outstanding",
];

#[test]
fn cores_default_to_client_0_responders_1() {
    let a = Args::try_parse_from(["loadgen"]).unwrap();
    assert_eq!(choose_cores(&a, 2), (vec![0], vec![1]));
    assert_eq!(choose_cores(&a, 1), (vec![0], vec![0]));
    let a = Args::try_parse_from(["loadgen", "--client-cores", "0-2"]).unwrap();
    assert_eq!(choose_cores(&a, 8), (vec![0, 1, 2], vec![3]));
    // the application's cores are apart from the responders' too
    let a = Args::try_parse_from(["loadgen", "--client-cores", "0-1", "--app-cores", "2"]);
    let a = a.unwrap();
    assert_eq!(choose_cores(&a, 8), (vec![0, 1], vec![3]));
    assert_eq!(app_cores(&a, 8, &[0, 1]), vec![2]);
    assert_eq!(
        app_cores(&a, 2, &[0, 1]),
        vec![0, 1],
        "no core 2: the client cores"
    );
}

/// A hosted engine with two client cores starts (its builder runs before the runtime's
/// driving thread is pinned to one core) and decides.
#[test]
fn hosted_engine_on_two_client_cores() {
    let doc = run_json(&["--client-cores", "0,1"], "hosted2");
    assert_eq!(doc["parameters"]["engine_core"], "hosted");
    assert!(doc["results"][0]["decisions"].as_u64().unwrap() > 0);
}

/// Engine cores pinned on their own cores, the application's workers apart, responders
/// with two threads each: a thread-per-core run (tuning/scaling.py) completes.
#[test]
fn pinned_engine_cores_with_the_application_apart() {
    let doc = run_json(
        &[
            "--engine-core",
            "pinned",
            "--client-cores",
            "0",
            "--app-cores",
            "1",
            "--responder-threads",
            "2",
        ],
        "apart",
    );
    assert_eq!(doc["parameters"]["engine_core"], "pinned");
    assert!(doc["results"][0]["decisions"].as_u64().unwrap() > 0);
}

/// End to end on loopback: every client for a fraction of a second, with guards,
/// a label and latency reports; every submitted operation must complete.
#[test]
fn compare_smoke_on_loopback() {
    let dir = std::env::temp_dir().join(format!("loadgen-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    let a = Args::try_parse_from([
        "loadgen",
        "--compare",
        "--duration",
        "0.4",
        "--warmup",
        "0.2",
        "--quiet",
        "--max-timeout-share",
        "1",
        "--in-flight",
        "8",
        "--guards",
        "1",
        "--label",
        "api",
        "--report-share",
        "0.1",
        "--json",
        json.to_str().unwrap(),
        "--hgrm",
        dir.join("h.hgrm").to_str().unwrap(),
        "--svg",
        dir.join("p.svg").to_str().unwrap(),
    ])
    .unwrap();
    assert_eq!(run(&a), Ok(Verdict::Trusted));
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let results = doc["results"].as_array().unwrap();
    let names: Vec<&str> = results
        .iter()
        .filter_map(|r| r["client"].as_str())
        .collect();
    assert_eq!(names, ["engine", "official", "raw"]);
    assert!(doc["ratios"]["engine_vs_official"].as_f64().is_some());
    assert!(doc["ratios"]["engine_vs_raw"].as_f64().is_some());
    for r in results {
        assert_eq!(r["balanced"], true);
        assert!(r["decisions"].as_u64().unwrap() > 0, "{}", r["client"]);
    }
    assert!(doc["machine"]["cores"].as_u64().unwrap() >= 1);
    // The parameters' keys are a contract (derived with serde from Args).
    let mut keys: Vec<&str> = doc["parameters"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    let mut expected = PARAMETER_KEYS.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert_eq!(doc["parameters"]["schedule"], "fixed:1");
    assert_eq!(doc["parameters"]["completion_delivery"], true);
    assert_eq!(doc["parameters"]["client"], "engine");
    assert_eq!(doc["parameters"]["duration_s"], 0.4);
    assert_eq!(doc["parameters"]["raw_wait"], "sleep");
    assert_eq!(doc["parameters"]["raw_sleep"], true);
    assert!(dir.join("p.svg").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hgrm_suffix() {
    let p = suffixed(Path::new("/tmp/x.hgrm"), "raw");
    assert_eq!(p, PathBuf::from("/tmp/x-raw.hgrm"));
}

fn run_json(extra: &[&str], tag: &str) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("loadgen-io-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("r.json");
    // a loaded CI host may time a few requests out: these tests are about other things
    let mut argv = vec!["loadgen", "--duration", "0.5", "--warmup", "0.2", "--quiet"];
    argv.extend_from_slice(&["--max-timeout-share", "1"]);
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let a = Args::try_parse_from(argv).unwrap();
    assert_eq!(run(&a), Ok(Verdict::Trusted), "{extra:?}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    for r in doc["results"].as_array().unwrap() {
        check_series(r);
    }
    for key in [
        "commit",
        "dirty",
        "cpu_model",
        "kernel",
        "time",
        "tool_version",
    ] {
        assert!(doc["machine"].get(key).is_some(), "machine.{key}");
    }
    doc
}

/// The series starts at the window: one point per second, the last one as long as what
/// is left of the window (0.5 s here), and the points' decisions sum to the result's.
fn check_series(r: &serde_json::Value) {
    let series = r["series"].as_array().unwrap();
    let window = r["window_s"].as_f64().unwrap();
    assert_eq!(series.len(), window.ceil() as usize, "{}", r["client"]);
    let sum: u64 = series
        .iter()
        .map(|p| p["decisions"].as_u64().unwrap())
        .sum();
    assert_eq!(sum, r["decisions"].as_u64().unwrap(), "{}", r["client"]);
    let last = series.last().unwrap();
    let expected = window - (series.len() - 1) as f64;
    assert!((last["length_s"].as_f64().unwrap() - expected).abs() < 1e-9);
    assert_eq!(series[0]["t_s"], 0.0);
}

/// Against a port nothing listens on, no decision is made: the run is untrusted (exit 3)
/// and the probe names the cause in rlctl's words.
#[test]
fn no_decision_against_a_closed_port_fails_and_names_the_cause() {
    let dir = std::env::temp_dir().join(format!("loadgen-closed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, rl_testkit::keys::AES).unwrap();
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let endpoint = format!("1@{addr}");
    let a = Args::try_parse_from([
        "loadgen",
        "--endpoint",
        &endpoint,
        "--key-file",
        key.to_str().unwrap(),
        "--duration",
        "0.3",
        "--warmup",
        "0",
        "--quiet",
    ])
    .unwrap();
    let verdict = run(&a);
    let _ = std::fs::remove_dir_all(&dir);
    let Ok(Verdict::Untrusted(causes)) = verdict else {
        panic!("{verdict:?}")
    };
    assert!(causes[0].starts_with("engine: no decision in the measurement window"));
    let unreachable = format!("probe: {endpoint}: port unreachable from {addr}");
    assert!(
        causes.iter().any(|c| c.starts_with(&unreachable)),
        "{causes:?}"
    );
}

/// `--io mmsg --gso off --reply-batch off`: every client finishes with submitted =
/// completed, the options are in `parameters`, and the engine and raw results carry
/// the I/O counters (and the engine its latency breakdown).
#[test]
fn mmsg_without_gso_or_reply_batch() {
    let doc = run_json(
        &[
            "--compare",
            "--in-flight",
            "8",
            "--io",
            "mmsg",
            "--gso",
            "off",
            "--reply-batch",
            "off",
        ],
        "mmsg",
    );
    let p = &doc["parameters"];
    assert_eq!(p["io"], "mmsg");
    assert_eq!(p["gso"], false);
    assert_eq!(p["reply_batch"], false);
    assert_eq!(p["engine_core"], "hosted", "auto, settled");
    for r in doc["results"].as_array().unwrap() {
        assert_eq!(r["balanced"], true, "{}", r["client"]);
        assert_eq!(r["submitted"], r["completed"]);
        assert!(r["datagrams_per_decision"].as_f64().is_some());
        assert!(r["client_cpu_us_per_decision"].as_f64().is_some());
        // Linux reports steal in /proc/stat (0 on bare metal)
        assert!(r["host_steal_ms"].as_f64().is_some_and(|ms| ms >= 0.0));
        assert_eq!(r["responder_io"]["backend"], "mmsg");
        // The engine reports `Stats::io` once its cores run on the udp layer.
        if r["client"] == "raw" || !r["io"].is_null() {
            assert_eq!(r["io"]["backend"], "mmsg", "{}", r["client"]);
            assert_eq!(r["io"]["gso_sends"], 0);
            assert!(r["io"]["datagrams_per_send"].as_f64().is_some());
        }
        if r["client"] == "engine" {
            for stage in ["queue_wait", "wire", "decision", "completion_wake"] {
                assert!(
                    r["breakdown_us"][stage]["p99"].as_u64().is_some(),
                    "{stage}"
                );
            }
        }
    }
    assert!(doc["ratios"]["engine_vs_raw"].as_f64().is_some());
}

/// `--compare --rate R` runs every client open loop and reports p50, p99 and CPU.
#[test]
fn compare_open_loop() {
    let doc = run_json(&["--compare", "--rate", "1000"], "open");
    assert_eq!(doc["parameters"]["rate"], 1000.0);
    // 1,000/s × (H + 0.5 s) + 1,024 with the default H = 60 ms.
    assert_eq!(
        doc["parameters"]["max_outstanding"],
        1000 * 560 / 1000 + 1024
    );
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    for r in results {
        assert_eq!(r["balanced"], true, "{}", r["client"]);
        assert!(r["decisions"].as_u64().unwrap() > 100, "{}", r["client"]);
        assert!(r["latency_us"]["p50"].as_f64().is_some());
        assert!(r["latency_us"]["p99"].as_f64().is_some());
        assert!(r["client_cpu_us_per_decision"].as_f64().is_some());
    }
}

/// `--raw-busy-poll`: the raw client polls closed loop, and the JSON says so (the
/// parameters and the raw result; `--compare` waits by default, `compare_smoke_on_loopback`).
#[test]
fn raw_busy_poll_is_recorded() {
    let doc = run_json(&["--client", "raw", "--raw-busy-poll"], "busy");
    assert_eq!(doc["parameters"]["raw_wait"], "busy-poll");
    assert_eq!(doc["parameters"]["raw_sleep"], false);
    let r = &doc["results"][0];
    assert_eq!(r["client"], "raw");
    assert_eq!(r["raw_wait"], "busy-poll");
    assert_eq!(r["balanced"], true);
}
