//! Fuzz target: an arbitrary received datagram through `wire::open` in each auth mode
//! (none, cookie, aes) and, when it opens, through the rate-response view and the grant
//! rule. Must never panic.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::wire::{self, Auth, RateResponseView, TenantView};

/// Public test-fixture keys (none, cookie, aes) from tests/data/vectors.json, via
/// rl-testkit (never real credentials).
const KEYS: [&str; 3] = rl_testkit::keys::ALL_MODES;

fn auths() -> &'static [Auth; 3] {
    static AUTHS: OnceLock<[Auth; 3]> = OnceLock::new();
    AUTHS.get_or_init(|| KEYS.map(|k| Auth::new(&k.parse::<ApiKey>().expect("fixture key"))))
}

fuzz_target!(|data: &[u8]| {
    let _ = TenantView::parse(data).map(|t| t.fields());
    let _ = RateResponseView::parse(data).map(|r| r.is_grant());
    let mut buf = [0u8; 2048];
    let n = data.len().min(buf.len());
    for auth in auths() {
        buf[..n].copy_from_slice(&data[..n]);
        if let Ok(opened) = wire::open(auth, &mut buf[..n]) {
            let _ = opened.tenant.fields();
            if let Ok(resp) = RateResponseView::parse(opened.pdu) {
                let _ = resp.is_grant();
                for g in resp.guards() {
                    let _ = g.spec();
                }
                for r in resp.resources() {
                    let _ = r.spec();
                }
            }
        }
    }
});
