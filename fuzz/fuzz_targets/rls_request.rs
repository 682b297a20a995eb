//! Fuzz target: arbitrary bytes as a `ShouldRateLimit` request message (protobuf), through
//! rl-proxy's request check (`Call::check`), the plan under a fixed rule set
//! (`Plan::new`: matching, buckets, the requests) and an answer without a
//! decision (`Plan::answer` under each failure policy). Must never panic; a checked call
//! never has more descriptors than the bound.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rl_proxy::rls::decide::Plan;
use rl_proxy::rls::request::{Call, MAX_DESCRIPTORS, decode};
use rl_proxy::rls::{Bounds, OnFailure, RlsMetrics, Rules};

const RULES: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: { window: 10s, requests_per_unit: 5 }
  - key: tenant
    value: a*
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 10 }
  - key: free
    rate_limit: { unlimited: true }
";

fn rules() -> &'static Rules {
    static R: OnceLock<Rules> = OnceLock::new();
    R.get_or_init(|| {
        let d = rl_proxy::rls::config::parse(RULES, Bounds::default(), &RlsMetrics::default())
            .expect("the fixed rules parse");
        Rules {
            domains: [(d.name.to_string(), d)].into(),
            window_max: Some(std::time::Duration::from_secs(86_400)),
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(req) = decode(data) else { return };
    let Ok(call) = Call::check(&req) else { return };
    assert!(call.descriptors.len() <= MAX_DESCRIPTORS);
    if let Ok(plan) = Plan::new(rules(), &call) {
        for on_failure in [None, Some(OnFailure::Open), Some(OnFailure::Closed)] {
            let _ = plan.answer(&[], on_failure);
        }
    }
});
