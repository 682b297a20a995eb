//! Datagram framing for the responder: tenant TLV + auth TLV + PDU (docs/protocol.md §1).
//!
//! Owns: the per-key prepared [`KeyAuth`] and the mapping of the codec's drop reasons to
//! the responder's [`FrameError`]. Opening (cookie check in constant time, AES-256-GCM
//! verify + decrypt in place) and sealing (cookie echo, AES-256-GCM with the responder's
//! own fresh nonce) are the engine codec's `ratelimitly_engine::proto::wire::{open, seal}`.
//! Must not touch: PDU contents (see `pdu`), state, sockets, clocks. The secret never
//! appears in any `Debug` or error output.

use ratelimitly_engine::proto::key::{ApiKey, AuthMode};
use ratelimitly_engine::proto::wire::{self, Auth, DropReason, TenantFields, TenantView};

/// Largest datagram of wire v2.
pub const MAX_DATAGRAM: usize = wire::MAX_DATAGRAM;
/// Tenant TLV length.
pub const TENANT_LEN: usize = wire::TENANT_LEN;

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

fn map_drop(e: DropReason) -> FrameError {
    match e {
        DropReason::TooLong => FrameError::TooLong,
        DropReason::BadTenantType | DropReason::BadTenantSize => FrameError::BadTenant,
        DropReason::WrongAuthMode => FrameError::WrongAuthMode,
        DropReason::BadAuthSize => FrameError::BadAuthSize,
        DropReason::CookieMismatch => FrameError::CookieMismatch,
        DropReason::AuthFailed => FrameError::AuthFailed,
        DropReason::EmptyCiphertext => FrameError::EmptyCiphertext,
        _ => FrameError::Truncated,
    }
}

/// Reads the tenant TLV of a request (codec view); returns the fields and the auth TLV
/// offset (the tenant TLV's declared size).
pub fn tenant(datagram: &[u8]) -> Result<(Tenant, usize), FrameError> {
    if datagram.len() > MAX_DATAGRAM {
        return Err(FrameError::TooLong);
    }
    let v = TenantView::parse(datagram).map_err(map_drop)?;
    Ok((
        Tenant {
            id: v.id(),
            unique_id: v.unique_id(),
            timestamp_ms: v.timestamp_ms(),
            steering: v.steering(),
        },
        v.size(),
    ))
}

/// A key prepared for opening and sealing (the codec's [`Auth`]).
#[derive(Clone)]
pub struct KeyAuth {
    auth: Auth,
}

impl std::fmt::Debug for KeyAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "KeyAuth {{ id: {}, mode: {} }}",
            self.auth.key_id(),
            self.auth.mode()
        )
    }
}

impl KeyAuth {
    /// Prepares `key` (AES key schedule computed once).
    pub fn new(key: &ApiKey) -> Self {
        Self {
            auth: Auth::new(key),
        }
    }

    /// The key's mode.
    pub fn mode(&self) -> AuthMode {
        self.auth.mode()
    }

    /// The key id.
    pub fn key_id(&self) -> u64 {
        self.auth.key_id()
    }

    /// Where the PDU starts in a datagram of this mode (40-byte tenant TLV).
    pub fn pdu_offset(&self) -> usize {
        self.auth.pdu_offset()
    }

    /// Checks the tenant and auth TLVs and decrypts the PDU in place; returns the PDU
    /// byte range.
    pub fn open(
        &self,
        datagram: &mut [u8],
        _auth_off: usize,
    ) -> Result<std::ops::Range<usize>, FrameError> {
        let len = datagram.len();
        let opened = wire::open(&self.auth, datagram).map_err(map_drop)?;
        Ok(len - opened.pdu.len()..len)
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
        let t = TenantFields {
            id: tenant.id,
            unique_id: tenant.unique_id,
            timestamp_ms: tenant.timestamp_ms,
            steering: tenant.steering,
        };
        wire::seal(&self.auth, &t, nonce, out, pdu_len).map_err(|_| FrameError::OutputTooSmall)
    }
}
