//! Auth TLV and datagram sealing / opening: none (no check), cookie (secret in clear,
//! compared in constant time), aes (AES-256-GCM in place, detached tag, AAD = bytes
//! 0..tenant size + 16). Owns the prepared cipher; must not touch PDU contents.

use std::fmt;

use std::sync::Arc;

use subtle::ConstantTimeEq;
use zeroize::Zeroize;

use super::aead::Aes256Gcm;

use super::tenant::TenantFields;
use super::{
    DropReason, EncodeError, MAX_DATAGRAM, NONCE_LEN, TAG_LEN, TENANT_LEN, TLV_HEADER_LEN,
    TenantView, get_u16, put_u16, types,
};
use crate::proto::key::{ApiKey, AuthMode, SECRET_LEN};

/// Auth TLV field offsets, from the start of the auth TLV.
pub(crate) mod off {
    pub const TYPE: usize = 0;
    pub const SIZE: usize = 2;
    pub const COOKIE: usize = 4;
    pub const NONCE: usize = 4;
    pub const TAG: usize = 16;
}

/// Length of the auth TLV of a mode (none 4, cookie 36, aes 32).
pub const fn auth_tlv_len(mode: AuthMode) -> usize {
    match mode {
        AuthMode::None => TLV_HEADER_LEN,
        AuthMode::Cookie => TLV_HEADER_LEN + SECRET_LEN,
        AuthMode::Aes => TLV_HEADER_LEN + NONCE_LEN + TAG_LEN,
    }
}

const fn auth_type(mode: AuthMode) -> u16 {
    match mode {
        AuthMode::None => types::AUTH_NONE,
        AuthMode::Cookie => types::AUTH_COOKIE,
        AuthMode::Aes => types::AUTH_AES,
    }
}

/// Per-key authentication state, prepared once: mode, key id, cookie, AES key schedule.
/// `Debug` shows the key id and mode only. Secret material is wiped on drop: the cookie by
/// this type; the AES-256 round keys and the GHASH key H = AES_K(0) by AWS-LC (`aead.rs`)
/// when the last clone of this `Auth` is dropped.
#[derive(Clone)]
pub struct Auth {
    mode: AuthMode,
    key_id: u64,
    prepared: Prepared,
}

/// Mode-specific material.
#[derive(Clone)]
enum Prepared {
    None,
    /// The cookie (the key's secret), wiped on drop.
    Cookie([u8; SECRET_LEN]),
    /// The expanded AES-256-GCM key, shared by clones (wiped on drop, see [`Auth`]).
    Aes(Arc<Aes256Gcm>),
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if let Prepared::Cookie(cookie) = self {
            cookie.zeroize();
        }
    }
}

impl Auth {
    /// Prepares the auth state of a key (expands the AES key schedule once).
    pub fn new(key: &ApiKey) -> Auth {
        let mode = key.mode();
        let prepared = match mode {
            AuthMode::None => Prepared::None,
            AuthMode::Cookie => Prepared::Cookie(*key.secret()),
            AuthMode::Aes => Prepared::Aes(Arc::new(Aes256Gcm::new(key.secret()))),
        };
        Auth {
            mode,
            key_id: key.key_id(),
            prepared,
        }
    }

    /// The key's auth mode.
    pub fn mode(&self) -> AuthMode {
        self.mode
    }

    /// The key id.
    pub fn key_id(&self) -> u64 {
        self.key_id
    }

    /// Where the PDU starts in datagrams we send: 44 none, 76 cookie, 72 aes.
    pub fn pdu_offset(&self) -> usize {
        TENANT_LEN + auth_tlv_len(self.mode)
    }

    /// Largest PDU that fits one datagram in this mode.
    pub fn max_pdu_len(&self) -> usize {
        MAX_DATAGRAM - self.pdu_offset()
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("id", &self.key_id)
            .field("mode", &self.mode)
            .finish()
    }
}

/// Writes the tenant TLV and the auth TLV around a PDU the caller already wrote at
/// `out[auth.pdu_offset()..][..pdu_len]`, encrypting it in place in aes mode (the nonce is
/// used for aes only). Returns the datagram length.
pub fn seal(
    auth: &Auth,
    tenant: &TenantFields,
    nonce: [u8; NONCE_LEN],
    out: &mut [u8],
    pdu_len: usize,
) -> Result<usize, EncodeError> {
    if pdu_len == 0 {
        return Err(EncodeError::EmptyPdu);
    }
    let a = TENANT_LEN;
    let p = auth.pdu_offset();
    let total = p + pdu_len;
    super::check_room(out, total)?;
    tenant.write(&mut out[..TENANT_LEN]);
    put_u16(out, a + off::TYPE, auth_type(auth.mode));
    put_u16(out, a + off::SIZE, auth_tlv_len(auth.mode) as u16);
    match &auth.prepared {
        Prepared::None => {}
        Prepared::Cookie(cookie) => {
            out[a + off::COOKIE..p].copy_from_slice(cookie);
        }
        Prepared::Aes(cipher) => {
            out[a + off::NONCE..a + off::TAG].copy_from_slice(&nonce);
            let (head, body) = out.split_at_mut(p);
            let tag = cipher.seal(nonce, &head[..a + off::TAG], &mut body[..pdu_len]);
            head[a + off::TAG..p].copy_from_slice(&tag);
        }
    }
    Ok(total)
}

/// A datagram that passed the tenant and auth checks: the tenant TLV and the plaintext
/// PDU bytes (decrypted in place in aes mode; everything after the auth TLV).
#[derive(Clone, Copy, Debug)]
pub struct Opened<'b> {
    /// The tenant TLV.
    pub tenant: TenantView<'b>,
    /// The PDU bytes (not yet validated as a PDU).
    pub pdu: &'b [u8],
}

/// Validates the tenant TLV and the auth TLV of `datagram` against `auth` and, in aes
/// mode, verifies and decrypts the PDU in place (when the tag does not verify, the PDU's
/// bytes are wiped: zeros, never unauthenticated plaintext). The auth TLV starts at the tenant TLV's declared size.
pub fn open<'b>(auth: &Auth, datagram: &'b mut [u8]) -> Result<Opened<'b>, DropReason> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(DropReason::TooLong);
    }
    let a = TenantView::parse(datagram)?.size();
    open_at(auth, datagram, a)
}

/// [`open`] of a datagram whose tenant TLV its caller already validated with
/// [`TenantView::parse`] on these bytes: `a` is that TLV's size (decryption never touches
/// it, so it is not parsed again).
pub(crate) fn open_at<'b>(
    auth: &Auth,
    datagram: &'b mut [u8],
    a: usize,
) -> Result<Opened<'b>, DropReason> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(DropReason::TooLong);
    }
    if datagram.len() < a + TLV_HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    if get_u16(datagram, a + off::TYPE) != auth_type(auth.mode) {
        return Err(DropReason::WrongAuthMode);
    }
    let tlv_len = auth_tlv_len(auth.mode);
    if usize::from(get_u16(datagram, a + off::SIZE)) != tlv_len || datagram.len() < a + tlv_len {
        return Err(DropReason::BadAuthSize);
    }
    let p = a + tlv_len;
    let (head, body) = datagram.split_at_mut(p);
    match &auth.prepared {
        Prepared::None => {}
        Prepared::Cookie(cookie) => {
            let got = &head[a + off::COOKIE..p];
            if !bool::from(got.ct_eq(&cookie[..])) {
                return Err(DropReason::CookieMismatch);
            }
        }
        Prepared::Aes(cipher) => {
            if body.is_empty() {
                return Err(DropReason::EmptyCiphertext);
            }
            let (aad, tag) = head.split_at(a + off::TAG);
            let mut nonce = [0u8; NONCE_LEN];
            nonce.copy_from_slice(&aad[a + off::NONCE..]);
            // In place; a forged datagram's trial decryption is wiped.
            if !cipher.open(nonce, aad, body, tag) {
                return Err(DropReason::AuthFailed);
            }
        }
    }
    let head: &'b [u8] = head;
    Ok(Opened {
        tenant: TenantView::parsed(&head[..a]),
        pdu: body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookie_is_wiped_on_drop() {
        let key: ApiKey =
            "rl-cookie1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqfgrrulczhg30p"
                .parse()
                .unwrap();
        let auth = Auth::new(&key);
        let mut slot = std::mem::ManuallyDrop::new(auth.prepared.clone());
        let p: *mut Prepared = &mut *slot;
        // SAFETY: `p` points to a live value that is dropped exactly once here and never
        // used again; afterwards only the plain cookie bytes (still allocated inside
        // `slot`, which is never dropped) are read.
        let cookie = unsafe {
            std::ptr::drop_in_place(p);
            match &*p {
                Prepared::Cookie(c) => std::ptr::read(c),
                _ => unreachable!("a cookie key prepares a cookie"),
            }
        };
        assert_eq!(cookie, [0u8; SECRET_LEN]);
        assert!(matches!(&auth.prepared, Prepared::Cookie(c) if c == &[2u8; SECRET_LEN]));
    }
}
