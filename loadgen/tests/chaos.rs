//! The bounded chaos soak that CI runs: `loadgen --chaos --duration 12 --seed 1` (after
//! its 7.5 s warm-up), the engine against embedded responders under every fault kind of
//! the schedule, checked through the JSON report: exactly-once accounting, no late
//! completion, every outcome explained, the memory bar, no descriptor left open.

use std::process::Command;

#[test]
fn chaos_soak_of_twelve_seconds_completes_everything_in_time() {
    let dir = std::env::temp_dir().join(format!("loadgen-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("chaos.json");
    let out = Command::new(env!("CARGO_BIN_EXE_loadgen"))
        .args([
            "--chaos",
            "--duration",
            "12",
            "--seed",
            "1",
            "--quiet",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("loadgen runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("chaos: passed"), "{stdout}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let r = &doc["results"][0];
    assert_eq!(r["client"], "engine");
    assert_eq!(r["submitted"], r["completed"]);
    assert!(r["decisions"].as_u64().unwrap() > 0);
    let c = &r["chaos"];
    assert_eq!(c["seed"], 1);
    assert_eq!(c["late_completions"], 0);
    assert_eq!(c["passed"], true);
    let events = c["events"].as_array().unwrap();
    assert!(events.len() >= 4, "{} events", events.len());
    let mut kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    assert!(kinds.len() >= 5, "{kinds:?}");
    let mut last = 0.0;
    for e in events {
        let at = e["at_s"].as_f64().unwrap();
        assert!(at >= last && at <= 12.0, "{e}");
        assert!(e["until_s"].as_f64().unwrap() <= 12.0, "{e}");
        last = at;
    }
    // The memory bar (end <= 1.1 x after warm-up + 4 MiB), after a warm-up that rehearsed
    // restarts and bursts, and no descriptor left open once the client shut down.
    let rss = &c["rss_kib"];
    let (after, end) = (
        rss["after_warmup"].as_u64().unwrap(),
        rss["end"].as_u64().unwrap(),
    );
    assert!(after > 0 && end > 0, "{rss}");
    assert_eq!(rss["bound"].as_u64().unwrap(), after * 11 / 10 + 4096);
    assert!(end <= after * 11 / 10 + 4096, "{rss}");
    // Descriptors: exactly as many at the end as at the start, none left open (two
    // sockets that once outlived the client were Tokio's signal-driver socket pair, opened
    // for the process by its first runtime; the run now opens it before the first sample).
    let fds = &c["fds"];
    assert_eq!(fds["end"], fds["start"], "{fds}");
    assert_eq!(fds["leaked"].as_array().map(Vec::len), Some(0), "{fds}");
    assert_eq!(fds["opened"].as_array().map(Vec::len), Some(0), "{fds}");
    assert!(c["fds"]["start"].as_u64().unwrap() > 0);
    let warm = c["warmup_events"].as_array().unwrap();
    let kinds: Vec<&str> = warm.iter().filter_map(|e| e["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "server_restart",
            "server_restart",
            "duplicate_burst",
            "delay_burst",
            "steering_storm"
        ]
    );
    for e in warm {
        assert!(e["at_s"].as_f64().unwrap() < 0.0, "{e}");
        assert!(e["until_s"].as_f64().unwrap() < 0.0, "{e}");
    }
    assert_eq!(doc["parameters"]["warmup_s"], 7.5);
    assert!(c["outcomes_unexplained"].as_object().unwrap().is_empty());
}
