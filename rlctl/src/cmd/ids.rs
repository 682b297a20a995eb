//! `rlctl ids`: bucket and tracker ids of the given definitions (no key needed).

use serde_json::{Value, json};

use crate::cli::IdsCmd;
use crate::output::{EXIT_CONFIG, EXIT_OK, hex16, print_json, simple_error};

/// Runs `rlctl ids`.
pub fn run(c: &IdsCmd) -> u8 {
    if c.resource.is_empty() && c.tracker.is_empty() {
        return simple_error(
            c.json,
            "give at least one --resource or --tracker",
            EXIT_CONFIG,
        );
    }
    if c.json {
        let rs: Vec<Value> = c
            .resource
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "window_ms": r.window_ms,
                    "rate_limit": r.rate_limit,
                    "bucket_id": hex16(&r.bucket_id()),
                })
            })
            .collect();
        let ts: Vec<Value> = c
            .tracker
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "ttl_ms": t.ttl_ms,
                    "max_samples": t.max_samples,
                    "min_samples": t.min_samples,
                    "tracker_id": hex16(&t.tracker_id()),
                })
            })
            .collect();
        print_json(&json!({ "resources": rs, "trackers": ts }));
        return EXIT_OK;
    }
    for r in &c.resource {
        println!(
            "resource {}:{}:{}  bucket_id {}",
            r.name,
            r.window_ms,
            r.rate_limit,
            hex16(&r.bucket_id())
        );
    }
    for t in &c.tracker {
        println!(
            "tracker {}:{}:{}:{}  tracker_id {}",
            t.name,
            t.ttl_ms,
            t.max_samples,
            t.min_samples,
            hex16(&t.tracker_id())
        );
    }
    EXIT_OK
}
