//! Public fixture keys (entries of `keys_valid` / `keys_invalid` in
//! `tests/data/vectors.json`). Synthetic test values, never credentials.

use ratelimitly_engine::proto::key::ApiKey;

/// `aes_key_id_3`: AES-256-GCM, key id 3, secret 32 × 0x03, dedup TTL limit 300 ms.
pub const AES: &str =
    "rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5";

/// `cookie_key_id_2`: cookie, key id 2, secret 32 × 0x02, dedup TTL limit 300 ms.
pub const COOKIE: &str =
    "rl-cookie1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqfgrrulczhg30p";

/// `rust_none_fixture`: no authentication, key id 72623859790382856, dedup TTL limit
/// 300 ms.
pub const NONE: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";

/// `keys_invalid` `bad_checksum`: [`AES`] with its last character changed.
pub const BAD_CHECKSUM: &str =
    "rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x6";

/// The three valid fixtures, one per auth mode: none, cookie, aes.
pub const ALL_MODES: [&str; 3] = [NONE, COOKIE, AES];

/// Parses a fixture key (panics on an invalid one: fixtures are known good).
pub fn key(text: &str) -> ApiKey {
    text.parse().expect("fixture key is valid")
}

/// [`AES`], parsed.
pub fn aes() -> ApiKey {
    key(AES)
}

/// [`COOKIE`], parsed.
pub fn cookie() -> ApiKey {
    key(COOKIE)
}

/// [`NONE`], parsed.
pub fn none() -> ApiKey {
    key(NONE)
}
