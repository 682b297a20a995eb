//! `rlctl key`: decodes the API key (mode, key id, quotas, default domain); never prints
//! the secret or the key text.

use serde_json::json;

use ratelimitly_engine::key_source;
use ratelimitly_engine::proto::key::AuthMode;

use crate::cli::KeyCmd;
use crate::output::{EXIT_CONFIG, EXIT_OK, print_json, simple_error};

/// The mode's name in output.
pub fn mode_name(m: AuthMode) -> &'static str {
    match m {
        AuthMode::None => "none",
        AuthMode::Cookie => "cookie",
        AuthMode::Aes => "aes",
    }
}

/// Runs `rlctl key`.
pub fn run(c: &KeyCmd) -> u8 {
    let key = match key_source::load_key(c.key.key_file.as_deref()) {
        Ok(k) => k,
        Err(e) => return simple_error(c.json, &e.to_string(), EXIT_CONFIG),
    };
    let q = key.quotas();
    if c.json {
        print_json(&json!({
            "mode": mode_name(key.mode()),
            "key_id": key.key_id(),
            "quotas": {
                "rate_buckets_max": q.rate_buckets_max,
                "latency_services_max": q.latency_services_max,
                "metrics_labels_max": q.metrics_labels_max,
                "latency_buffer_size_max": q.latency_buffer_size_max,
                "dedup_ttl_ms_max": q.dedup_ttl_ms_max,
                "rate_window_size_ms_max": q.rate_window_size_ms_max,
            },
            "default_domain": key.default_domain(),
        }));
    } else {
        println!("mode:                     {}", mode_name(key.mode()));
        println!("key id:                   {}", key.key_id());
        println!("rate buckets max:         {}", q.rate_buckets_max);
        println!("latency trackers max:     {}", q.latency_services_max);
        println!("metrics labels max:       {}", q.metrics_labels_max);
        println!("latency buffer size max:  {}", q.latency_buffer_size_max);
        println!("dedup TTL max (ms):       {}", q.dedup_ttl_ms_max);
        println!("rate window max (ms):     {}", q.rate_window_size_ms_max);
        println!("default domain:           {}", key.default_domain());
    }
    EXIT_OK
}
