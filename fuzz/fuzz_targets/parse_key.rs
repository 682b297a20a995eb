//! Fuzz target: arbitrary bytes (as UTF-8, lossy) through `ApiKey::from_str` and every
//! accessor / formatter of the result. Must never panic. (That output never echoes the key
//! is structural — `KeyError` carries no input — and is tested in tests/vectors.rs.)
#![no_main]

use libfuzzer_sys::fuzz_target;
use ratelimitly_engine::proto::key::ApiKey;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match text.parse::<ApiKey>() {
        Ok(key) => {
            let _ = (key.key_id(), key.mode(), key.quotas(), key.default_domain());
            let _ = format!("{key} {key:?}");
        }
        Err(e) => {
            let _ = format!("{e} {e:?}");
        }
    }
});
