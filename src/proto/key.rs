//! API keys: parsing of format-1 Bech32 key strings (`rl-aes1…`, `rl-cookie1…`,
//! `rl-none1…`, docs/protocol.md §6) into an [`ApiKey`] holding the key id, the auth mode, the
//! 32-byte secret and the decoded [`Quotas`].
//!
//! Owns: key text decoding, the quota word and [`KeyError`] (re-exported by `error`, which
//! depends on this module, never the reverse). Must not touch: I/O, wire framing, the
//! cipher (see `wire::Auth`). The key string and the secret are credentials: no `Debug`,
//! `Display` or error output of this module ever contains them — only the key id and mode.
//! The secret is wiped when an [`ApiKey`] (or the parser's scratch copy) is dropped, and
//! [`ApiKey`] equality runs in constant time over it. The caller owns the key text and
//! wipes it if it must.

use std::fmt;
use std::str::FromStr;

use bech32::Bech32;
use bech32::primitives::decode::{
    CharError, CheckedHrpstring, ChecksumError, PaddingError, UncheckedHrpstring,
    UncheckedHrpstringError,
};
use subtle::ConstantTimeEq;
use thiserror::Error;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Why an API key string was rejected. Each variant names the rule that failed; none
/// carries any part of the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Error)]
pub enum KeyError {
    /// The string is empty.
    #[error("API key is empty")]
    Empty,
    /// A character is outside printable ASCII, or outside the Bech32 alphabet in the data part.
    #[error("API key contains a character outside printable ASCII / the Bech32 alphabet")]
    InvalidCharacter,
    /// Upper- and lower-case letters are mixed.
    #[error("API key mixes upper and lower case")]
    MixedCase,
    /// No `1` separator between the human-readable part and the data.
    #[error("API key has no '1' separator")]
    MissingSeparator,
    /// The human-readable part is empty or longer than 83 characters.
    #[error("API key human-readable part is empty or too long")]
    BadHrp,
    /// The human-readable part is not `rl-aes`, `rl-cookie` or `rl-none`.
    #[error("API key method is not rl-aes, rl-cookie or rl-none")]
    UnknownMethod,
    /// The data part is shorter than the 6-character checksum.
    #[error("API key data part is shorter than its checksum")]
    TooShort,
    /// The whole string is longer than a Bech32 code allows (1023 characters).
    #[error("API key is longer than 1023 characters")]
    TooLong,
    /// The Bech32 (BIP-173, constant 1) checksum does not verify.
    #[error("API key checksum does not verify")]
    BadChecksum,
    /// The 5-to-8-bit regrouping leaves 5 or more bits, or non-zero leftover bits.
    #[error("API key payload has invalid padding bits")]
    BadPadding,
    /// The payload has the wrong length for its method (45 bytes aes/cookie, 13 none).
    #[error("API key payload is {actual} bytes, {mode:?} keys have {expected}")]
    BadLength {
        /// The key's method.
        mode: AuthMode,
        /// Required payload length.
        expected: usize,
        /// Decoded payload length.
        actual: usize,
    },
    /// The format version byte is not 0x01.
    #[error("API key format version {found} is not supported (only 1)")]
    BadVersion {
        /// The version byte found.
        found: u8,
    },
    /// Quota word: rate-bucket exponent above 24.
    #[error("API key quota word has a reserved rate-bucket exponent")]
    ReservedRateExponent,
    /// Quota word: latency-tracker exponent above 24.
    #[error("API key quota word has a reserved latency-tracker exponent")]
    ReservedLatencyExponent,
    /// Quota word: dedup code outside 1..=200.
    #[error("API key quota word has a dedup code outside 1..=200")]
    BadDedupCode,
}

/// Authentication mode of a key (and of every datagram sent with it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AuthMode {
    /// No authentication (`rl-none`): tests and protocol-cost measurements only.
    None,
    /// The secret travels in clear and is echoed (`rl-cookie`).
    Cookie,
    /// AES-256-GCM over the PDU with the secret as key (`rl-aes`).
    Aes,
}

impl AuthMode {
    /// The key's human-readable part for this mode.
    pub const fn hrp(self) -> &'static str {
        match self {
            AuthMode::None => "rl-none",
            AuthMode::Cookie => "rl-cookie",
            AuthMode::Aes => "rl-aes",
        }
    }

    /// Payload length of a format-1 key of this mode.
    pub const fn payload_len(self) -> usize {
        match self {
            AuthMode::None => NONE_PAYLOAD_LEN,
            AuthMode::Cookie | AuthMode::Aes => SECRET_PAYLOAD_LEN,
        }
    }
}

impl fmt::Display for AuthMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AuthMode::None => "none",
            AuthMode::Cookie => "cookie",
            AuthMode::Aes => "aes",
        })
    }
}

/// Per-key limits decoded from the quota word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Quotas {
    /// 2^r rate buckets (r <= 24).
    pub rate_buckets_max: u64,
    /// 2^e latency trackers (e <= 24).
    pub latency_services_max: u64,
    /// 2^e metrics labels (e <= 31).
    pub metrics_labels_max: u64,
    /// 2^e samples per tracker buffer (e <= 15).
    pub latency_buffer_size_max: u64,
    /// 10 * d ms, d in 1..=200: the largest dedup TTL (policy horizon) allowed.
    pub dedup_ttl_ms_max: u32,
    /// 2^w ms, or 0xFFFF_FFFF when w = 31: the largest resource window allowed.
    pub rate_window_size_ms_max: u32,
}

/// Format version byte of every supported key.
pub const FORMAT_VERSION: u8 = 1;
/// Payload length of an `rl-none` key: version, key id, quota word.
pub const NONE_PAYLOAD_LEN: usize = 13;
/// Payload length of an `rl-aes` / `rl-cookie` key: version, key id, secret, quota word.
pub const SECRET_PAYLOAD_LEN: usize = 45;
/// Secret length in bytes.
pub const SECRET_LEN: usize = 32;

const OFF_VERSION: usize = 0;
const OFF_KEY_ID: usize = 1;
const OFF_SECRET: usize = 9;

// Quota word bit fields (bit 0 = LSB): (shift, width).
const Q_RATE: (u32, u32) = (0, 5);
const Q_LATENCY: (u32, u32) = (5, 5);
const Q_LABELS: (u32, u32) = (10, 5);
const Q_BUFFER: (u32, u32) = (15, 4);
const Q_DEDUP: (u32, u32) = (19, 8);
const Q_WINDOW: (u32, u32) = (27, 5);
const MAX_RATE_EXP: u32 = 24;
const MAX_LATENCY_EXP: u32 = 24;
const MAX_DEDUP_CODE: u32 = 200;

const fn field(word: u32, (shift, width): (u32, u32)) -> u32 {
    (word >> shift) & ((1 << width) - 1)
}

impl Quotas {
    /// Decodes a quota word, rejecting reserved exponents and dedup codes.
    pub fn from_word(word: u32) -> Result<Quotas, KeyError> {
        let r = field(word, Q_RATE);
        let l = field(word, Q_LATENCY);
        let d = field(word, Q_DEDUP);
        let w = field(word, Q_WINDOW);
        if r > MAX_RATE_EXP {
            return Err(KeyError::ReservedRateExponent);
        }
        if l > MAX_LATENCY_EXP {
            return Err(KeyError::ReservedLatencyExponent);
        }
        if d == 0 || d > MAX_DEDUP_CODE {
            return Err(KeyError::BadDedupCode);
        }
        Ok(Quotas {
            rate_buckets_max: 1u64 << r,
            latency_services_max: 1u64 << l,
            metrics_labels_max: 1u64 << field(word, Q_LABELS),
            latency_buffer_size_max: 1u64 << field(word, Q_BUFFER),
            dedup_ttl_ms_max: 10 * d,
            rate_window_size_ms_max: if w == 31 { u32::MAX } else { 1u32 << w },
        })
    }
}

/// A validated API key. Cheap to clone (no heap). Its `Debug` and `Display` show
/// `ApiKey { id: N, mode: .. }` only. The secret is wiped (zeroized) when a key is
/// dropped, and keys compare in constant time over the secret.
#[derive(Clone)]
pub struct ApiKey {
    mode: AuthMode,
    key_id: u64,
    secret: [u8; SECRET_LEN],
    quotas: Quotas,
}

impl ApiKey {
    /// The auth mode fixed by the key's human-readable part.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The key id (not a secret; sent in every request's tenant TLV).
    pub fn key_id(&self) -> u64 {
        self.key_id
    }

    /// The decoded quotas.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The default discovery domain, `c-<key id>.p0.ratelimitly.com`.
    pub fn default_domain(&self) -> String {
        format!("c-{}.p0.ratelimitly.com", self.key_id)
    }

    /// The 32-byte secret (all zeros for `rl-none`). A credential: never print it.
    pub fn secret(&self) -> &[u8; SECRET_LEN] {
        &self.secret
    }
}

impl Drop for ApiKey {
    fn drop(&mut self) {
        self.secret.zeroize();
    }
}

impl ZeroizeOnDrop for ApiKey {}

impl PartialEq for ApiKey {
    /// Constant time in the secret: every byte is compared whatever the others hold (the
    /// public fields, mode, key id and quotas, are compared as usual).
    fn eq(&self, other: &ApiKey) -> bool {
        let secret_eq: bool = self.secret.ct_eq(&other.secret).into();
        secret_eq
            & (self.mode == other.mode)
            & (self.key_id == other.key_id)
            & (self.quotas == other.quotas)
    }
}

impl Eq for ApiKey {}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiKey")
            .field("id", &self.key_id)
            .field("mode", &self.mode)
            .finish()
    }
}

impl fmt::Display for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

fn mode_of_hrp(hrp: &str) -> Option<AuthMode> {
    [AuthMode::Aes, AuthMode::Cookie, AuthMode::None]
        .into_iter()
        .find(|m| hrp.eq_ignore_ascii_case(m.hrp()))
}

fn map_unchecked(e: UncheckedHrpstringError) -> KeyError {
    match e {
        UncheckedHrpstringError::Char(CharError::MixedCase) => KeyError::MixedCase,
        UncheckedHrpstringError::Char(CharError::MissingSeparator) => KeyError::MissingSeparator,
        UncheckedHrpstringError::Char(CharError::NothingAfterSeparator) => KeyError::TooShort,
        UncheckedHrpstringError::Char(_) => KeyError::InvalidCharacter,
        UncheckedHrpstringError::Hrp(bech32::primitives::hrp::Error::MixedCase) => {
            KeyError::MixedCase
        }
        UncheckedHrpstringError::Hrp(
            bech32::primitives::hrp::Error::Empty | bech32::primitives::hrp::Error::TooLong(_),
        ) => KeyError::BadHrp,
        UncheckedHrpstringError::Hrp(_) => KeyError::InvalidCharacter,
        #[allow(unreachable_patterns)]
        _ => KeyError::InvalidCharacter,
    }
}

impl FromStr for ApiKey {
    type Err = KeyError;

    fn from_str(s: &str) -> Result<ApiKey, KeyError> {
        if s.is_empty() {
            return Err(KeyError::Empty);
        }
        // Printable ASCII only (33..=126), over the whole string.
        if !s.bytes().all(|b| (33..=126).contains(&b)) {
            return Err(KeyError::InvalidCharacter);
        }
        if !s.contains('1') {
            return Err(KeyError::MissingSeparator);
        }
        let unchecked = UncheckedHrpstring::new(s).map_err(map_unchecked)?;
        let mode = mode_of_hrp(unchecked.hrp().as_str()).ok_or(KeyError::UnknownMethod)?;
        unchecked
            .validate_checksum::<Bech32>()
            .map_err(|e| match e {
                ChecksumError::CodeLength(_) => KeyError::TooLong,
                ChecksumError::InvalidLength => KeyError::TooShort,
                _ => KeyError::BadChecksum,
            })?;
        let checked: CheckedHrpstring<'_> = unchecked.remove_checksum::<Bech32>();
        // Generic BIP-173 rule despite the name: leftover < 5 bits, all zero.
        checked
            .validate_segwit_padding()
            .map_err(|e: PaddingError| match e {
                PaddingError::TooMuch | PaddingError::NonZero => KeyError::BadPadding,
                #[allow(unreachable_patterns)]
                _ => KeyError::BadPadding,
            })?;

        let expected = mode.payload_len();
        let bytes = checked.byte_iter();
        let actual = bytes.len();
        if actual != expected {
            return Err(KeyError::BadLength {
                mode,
                expected,
                actual,
            });
        }
        // The payload holds the secret: a wiped-on-drop buffer, and the secret is copied
        // straight into the key (no other stack copy).
        let mut payload = zeroize::Zeroizing::new([0u8; SECRET_PAYLOAD_LEN]);
        for (dst, b) in payload.iter_mut().zip(bytes) {
            *dst = b;
        }
        let payload = &payload[..expected];

        if payload[OFF_VERSION] != FORMAT_VERSION {
            return Err(KeyError::BadVersion {
                found: payload[OFF_VERSION],
            });
        }
        let key_id = u64::from_le_bytes(le_array(&payload[OFF_KEY_ID..]));
        let quota_off = if mode == AuthMode::None {
            OFF_SECRET
        } else {
            OFF_SECRET + SECRET_LEN
        };
        let quotas = Quotas::from_word(u32::from_le_bytes(le_array(&payload[quota_off..])))?;
        let mut key = ApiKey {
            mode,
            key_id,
            secret: [0u8; SECRET_LEN],
            quotas,
        };
        if mode != AuthMode::None {
            key.secret
                .copy_from_slice(&payload[OFF_SECRET..OFF_SECRET + SECRET_LEN]);
        }
        Ok(key)
    }
}

/// First N bytes of `b` as an array (caller guarantees the length).
fn le_array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&b[..N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_none_fixture() {
        let k: ApiKey = rl_testkit::keys::NONE.parse().unwrap();
        assert_eq!(k.mode(), AuthMode::None);
        assert_eq!(k.key_id(), 0x0102_0304_0506_0708);
        assert_eq!(k.quotas().dedup_ttl_ms_max, 300);
        assert_eq!(k.secret(), &[0u8; 32]);
        assert_eq!(k.default_domain(), "c-72623859790382856.p0.ratelimitly.com");
    }

    #[test]
    fn upper_case_accepted() {
        let k: ApiKey = "RL-NONE1QYYQWPS9QSPSYQ2SK8E0SFDP3YS".parse().unwrap();
        assert_eq!(k.key_id(), 0x0102_0304_0506_0708);
    }

    #[test]
    fn simple_rejections() {
        assert_eq!("".parse::<ApiKey>(), Err(KeyError::Empty));
        assert_eq!("rl-none".parse::<ApiKey>(), Err(KeyError::MissingSeparator));
        assert_eq!(
            "rl-none1 qq".parse::<ApiKey>(),
            Err(KeyError::InvalidCharacter)
        );
        assert_eq!("rl-none1qq".parse::<ApiKey>(), Err(KeyError::TooShort));
    }

    const COOKIE_2: &str =
        "rl-cookie1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqfgrrulczhg30p";
    const AES_2: &str =
        "rl-aes1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqghjmu4scddmk3";

    #[test]
    fn equality_compares_every_field() {
        let k: ApiKey = COOKIE_2.parse().unwrap();
        assert_eq!(k, COOKIE_2.parse::<ApiKey>().unwrap());
        assert_eq!(k, COOKIE_2.to_ascii_uppercase().parse::<ApiKey>().unwrap());
        assert_eq!(k, k.clone());
        // same id and secret, other mode
        assert_ne!(k, AES_2.parse::<ApiKey>().unwrap());
        for i in [0, 17, 31] {
            let mut other = k.clone();
            other.secret[i] ^= 1;
            assert_ne!(k, other);
        }
        let mut other = k.clone();
        other.key_id += 1;
        assert_ne!(k, other);
        let mut other = k.clone();
        other.quotas.dedup_ttl_ms_max += 10;
        assert_ne!(k, other);
    }

    #[test]
    fn secret_is_wiped_on_drop() {
        let key: ApiKey = AES_2.parse().unwrap();
        assert_eq!(key.secret(), &[2u8; SECRET_LEN]);
        let mut slot = std::mem::ManuallyDrop::new(key);
        let p: *mut ApiKey = &mut *slot;
        // SAFETY: `p` points to a live key that is dropped exactly once here and never
        // used as a key again; afterwards only its plain bytes (still allocated inside
        // `slot`, which is never dropped) are read.
        let secret = unsafe {
            std::ptr::drop_in_place(p);
            std::ptr::read(std::ptr::addr_of!((*p).secret))
        };
        assert_eq!(secret, [0u8; SECRET_LEN]);
    }
}
