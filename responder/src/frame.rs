//! Datagram framing for the responder: tenant TLV + auth TLV + PDU (wire.md §1), with
//! opening (cookie check in constant time, AES-256-GCM verify + decrypt in place) and
//! sealing (cookie echo, AES-256-GCM with the responder's own fresh nonce).
//!
//! Owns: the per-key prepared [`KeyAuth`] (mode, key id, secret, AES key schedule) and
//! the tenant/auth TLV field offsets. Must not touch: PDU contents (see `pdu`), state,
//! sockets, clocks. The secret never appears in any `Debug` or error output.
//!
//! This is the responder's private adapter, kept small; the client side uses the
//! engine's `wire` codec.

use aes_gcm::aead::AeadInPlace;
use aes_gcm::{Aes256Gcm, KeyInit, Nonce, Tag};
use ratelimitly_engine::key::{ApiKey, AuthMode};

/// Largest datagram of wire v2.
pub const MAX_DATAGRAM: usize = 1200;
/// Tenant TLV length.
pub const TENANT_LEN: usize = 40;

const TLV_TENANT: u16 = 0x4C52;
const TLV_AUTH_NONE: u16 = 0x414E;
const TLV_AUTH_COOKIE: u16 = 0x4143;
const TLV_AUTH_AES: u16 = 0x4541;

// Tenant TLV offsets.
const T_TYPE: usize = 0;
const T_SIZE: usize = 2;
const T_ID: usize = 4;
const T_UNIQUE: usize = 12;
const T_TIMESTAMP: usize = 28;
const T_STEERING: usize = 36;

/// Why an inbound datagram was dropped at the framing level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Longer than [`MAX_DATAGRAM`].
    TooLong,
    /// Too short for the tenant TLV, the auth TLV or a PDU header.
    Truncated,
    /// Tenant TLV type or size wrong.
    BadTenant,
    /// Auth TLV type is not the key's mode.
    WrongAuthMode,
    /// Auth TLV size is not the mode's size.
    BadAuthSize,
    /// Cookie differs from the key's secret.
    CookieMismatch,
    /// AES-GCM verification failed.
    AuthFailed,
    /// AES mode with an empty ciphertext.
    EmptyCiphertext,
    /// The output buffer is too small.
    OutputTooSmall,
}

/// Tenant TLV fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// Key id (requests) or server id (responses).
    pub id: u64,
    /// Logical request id.
    pub unique_id: [u8; 16],
    /// Sender wall clock, Unix ms.
    pub timestamp_ms: u64,
    /// Steering byte.
    pub steering: u8,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

/// Reads the tenant TLV of a request; returns the fields and the auth TLV offset.
pub fn tenant(datagram: &[u8]) -> Result<(Tenant, usize), FrameError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(FrameError::TooLong);
    }
    if datagram.len() < TENANT_LEN {
        return Err(FrameError::Truncated);
    }
    if u16_at(datagram, T_TYPE) != TLV_TENANT {
        return Err(FrameError::BadTenant);
    }
    if usize::from(u16_at(datagram, T_SIZE)) != TENANT_LEN {
        return Err(FrameError::BadTenant);
    }
    let mut unique_id = [0u8; 16];
    unique_id.copy_from_slice(&datagram[T_UNIQUE..T_UNIQUE + 16]);
    Ok((
        Tenant {
            id: u64_at(datagram, T_ID),
            unique_id,
            timestamp_ms: u64_at(datagram, T_TIMESTAMP),
            steering: datagram[T_STEERING],
        },
        TENANT_LEN,
    ))
}

/// A key prepared for opening and sealing.
#[derive(Clone)]
pub struct KeyAuth {
    mode: AuthMode,
    key_id: u64,
    secret: [u8; 32],
    cipher: Option<Aes256Gcm>,
}

impl std::fmt::Debug for KeyAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyAuth {{ id: {}, mode: {} }}", self.key_id, self.mode)
    }
}

impl KeyAuth {
    /// Prepares `key` (AES key schedule computed once).
    pub fn new(key: &ApiKey) -> Self {
        let secret = *key.secret();
        let cipher = (key.mode() == AuthMode::Aes)
            .then(|| Aes256Gcm::new_from_slice(&secret).expect("32-byte key"));
        Self {
            mode: key.mode(),
            key_id: key.key_id(),
            secret,
            cipher,
        }
    }

    /// The key's mode.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The key id.
    pub fn key_id(&self) -> u64 {
        self.key_id
    }

    /// Where the PDU starts in a datagram of this mode (40-byte tenant TLV).
    pub fn pdu_offset(&self) -> usize {
        TENANT_LEN + self.auth_len()
    }

    fn auth_len(&self) -> usize {
        match self.mode {
            AuthMode::None => 4,
            AuthMode::Cookie => 36,
            AuthMode::Aes => 32,
        }
    }

    fn auth_type(&self) -> u16 {
        match self.mode {
            AuthMode::None => TLV_AUTH_NONE,
            AuthMode::Cookie => TLV_AUTH_COOKIE,
            AuthMode::Aes => TLV_AUTH_AES,
        }
    }

    /// Checks the auth TLV at `auth_off` and decrypts the PDU in place; returns the
    /// PDU byte range.
    pub fn open(
        &self,
        datagram: &mut [u8],
        auth_off: usize,
    ) -> Result<std::ops::Range<usize>, FrameError> {
        if datagram.len() < auth_off + 4 {
            return Err(FrameError::Truncated);
        }
        let ty = u16_at(datagram, auth_off);
        let size = usize::from(u16_at(datagram, auth_off + 2));
        if !matches!(ty, TLV_AUTH_NONE | TLV_AUTH_COOKIE | TLV_AUTH_AES) || ty != self.auth_type()
        {
            return Err(FrameError::WrongAuthMode);
        }
        if size != self.auth_len() {
            return Err(FrameError::BadAuthSize);
        }
        let pdu_off = auth_off + size;
        if datagram.len() < pdu_off {
            return Err(FrameError::Truncated);
        }
        match self.mode {
            AuthMode::None => {}
            AuthMode::Cookie => {
                let got = &datagram[auth_off + 4..pdu_off];
                if !ct_eq(got, &self.secret) {
                    return Err(FrameError::CookieMismatch);
                }
            }
            AuthMode::Aes => {
                if datagram.len() == pdu_off {
                    return Err(FrameError::EmptyCiphertext);
                }
                let nonce_end = auth_off + 4 + 12;
                let mut nonce = [0u8; 12];
                nonce.copy_from_slice(&datagram[auth_off + 4..nonce_end]);
                let mut tag = [0u8; 16];
                tag.copy_from_slice(&datagram[nonce_end..pdu_off]);
                let (head, ct) = datagram.split_at_mut(pdu_off);
                let cipher = self.cipher.as_ref().ok_or(FrameError::AuthFailed)?;
                cipher
                    .decrypt_in_place_detached(
                        Nonce::from_slice(&nonce),
                        &head[..nonce_end],
                        ct,
                        Tag::from_slice(&tag),
                    )
                    .map_err(|_| FrameError::AuthFailed)?;
            }
        }
        Ok(pdu_off..datagram.len())
    }

    /// The caller wrote a PDU of `pdu_len` bytes at `out[pdu_offset()..]`; writes the
    /// tenant and auth TLVs and encrypts the PDU (aes). Returns the datagram length.
    pub fn seal(
        &self,
        tenant: &Tenant,
        nonce: [u8; 12],
        out: &mut [u8],
        pdu_len: usize,
    ) -> Result<usize, FrameError> {
        let pdu_off = self.pdu_offset();
        let total = pdu_off + pdu_len;
        if total > out.len() || total > MAX_DATAGRAM {
            return Err(FrameError::OutputTooSmall);
        }
        out[T_TYPE..T_TYPE + 2].copy_from_slice(&TLV_TENANT.to_le_bytes());
        out[T_SIZE..T_SIZE + 2].copy_from_slice(&(TENANT_LEN as u16).to_le_bytes());
        out[T_ID..T_ID + 8].copy_from_slice(&tenant.id.to_le_bytes());
        out[T_UNIQUE..T_UNIQUE + 16].copy_from_slice(&tenant.unique_id);
        out[T_TIMESTAMP..T_TIMESTAMP + 8].copy_from_slice(&tenant.timestamp_ms.to_le_bytes());
        out[T_STEERING] = tenant.steering;
        out[T_STEERING + 1..TENANT_LEN].fill(0);
        let a = TENANT_LEN;
        out[a..a + 2].copy_from_slice(&self.auth_type().to_le_bytes());
        out[a + 2..a + 4].copy_from_slice(&(self.auth_len() as u16).to_le_bytes());
        match self.mode {
            AuthMode::None => {}
            AuthMode::Cookie => out[a + 4..pdu_off].copy_from_slice(&self.secret),
            AuthMode::Aes => {
                let nonce_end = a + 4 + 12;
                out[a + 4..nonce_end].copy_from_slice(&nonce);
                let (head, rest) = out.split_at_mut(pdu_off);
                let cipher = self.cipher.as_ref().ok_or(FrameError::AuthFailed)?;
                let tag = cipher
                    .encrypt_in_place_detached(
                        Nonce::from_slice(&nonce),
                        &head[..nonce_end],
                        &mut rest[..pdu_len],
                    )
                    .map_err(|_| FrameError::AuthFailed)?;
                head[nonce_end..pdu_off].copy_from_slice(&tag);
            }
        }
        Ok(total)
    }
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut d = 0u8;
    for (x, y) in a.iter().zip(b) {
        d |= x ^ y;
    }
    std::hint::black_box(d) == 0
}
