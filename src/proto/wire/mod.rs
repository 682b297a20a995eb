//! Wire v2 codec (docs/protocol.md §1–§4): zero-copy views over received bytes, encoders that write exact
//! lengths into caller-owned buffers, and datagram `seal` / `open` for the three auth modes.
//!
//! Datagram layout (both directions, little-endian, at most [`MAX_DATAGRAM`] bytes):
//!
//! ```text
//!  0            40 (= tenant size; responses may say more)
//!  +------------+-----------------------------+--------------------------------------+
//!  | tenant TLV | auth TLV                    | one PDU                              |
//!  | 52 4C 28 00| none:   4E 41 04 00         | plaintext (starts at 44)             |
//!  | id, uid,   | cookie: 43 41 24 00 secret32| plaintext (starts at 76)             |
//!  | ts, steer  | aes:    41 45 20 00 nonce12 | AES-256-GCM ciphertext (starts at 72)|
//!  |            |         tag16               | AAD = bytes 0..56 (tenant+hdr+nonce) |
//!  +------------+-----------------------------+--------------------------------------+
//!  PDU = type u16 · size u16 · u32 (dedup TTL in requests, else 0) · body
//! ```
//!
//! Owns: byte layouts, field offsets, TLV / PDU validation, AES-GCM and cookie checks, the
//! RNG for unique ids and nonces, the setup of a sent datagram's tenant and nonce
//! ([`request_tenant`]) and the grant rule over result blocks ([`grants`]). Must not touch: sockets, clocks, request state or policy
//! (the caller supplies timestamps, nonces and unique ids), heap allocation on the hot path.
//! Untrusted input never panics: every view checks lengths before it reads.

mod aead;
mod auth;
mod blocks;
mod label;
mod report;
mod request;
mod response;
mod rng;
mod tenant;

use auth::open_at;
pub use auth::{Auth, Opened, auth_tlv_len, open, seal};
pub use blocks::{GuardSpec, GuardView, grants, guard_passes};
pub use label::{decode_label_tlv, encode_label_tlv, label_tlv_len};
pub use report::{
    MAX_REPORT_ENTRIES, ReportEntry, ReportView, encode_report, encode_report_pdu,
    max_report_entries, report_pdu_len,
};
pub use request::{
    RateRequestView, ResourceSpec, ResourceView, encode_rate_request_pdu, encode_request,
    rate_request_pdu_len,
};
pub(crate) use response::open_response_at;
pub use response::{
    RateResponseView, ResourceResultSpec, ResourceResultView, encode_rate_response_pdu,
    open_response, rate_response_pdu_len,
};
pub use rng::{
    DATAGRAM_RANDOM_LEN, RngError, fill_random, new_nonce, new_unique_id, new_unique_id_and_nonce,
    shape_unique_id, unique_id_and_nonce,
};
pub use tenant::{TenantFields, TenantView, request_tenant};

/// Largest datagram either side sends or accepts.
pub const MAX_DATAGRAM: usize = 1200;
/// Length of the tenant TLV we send (responses may declare more).
pub const TENANT_LEN: usize = 40;
/// TLV header: type u16, size u16.
pub const TLV_HEADER_LEN: usize = 4;
/// PDU header: type u16, size u16, u32 word (dedup TTL in requests).
pub const PDU_HEADER_LEN: usize = 8;
/// Guard block (request and response).
pub const GUARD_BLOCK_LEN: usize = 36;
/// Resource block (request and response).
pub const RESOURCE_BLOCK_LEN: usize = 28;
/// Latency report block.
pub const REPORT_BLOCK_LEN: usize = 32;
/// AES-GCM nonce length.
pub const NONCE_LEN: usize = 12;
/// AES-GCM tag length (never truncated).
pub const TAG_LEN: usize = 16;

/// TLV and PDU type values (u16, little-endian on the wire).
pub mod types {
    /// Tenant TLV (`52 4C`).
    pub const TENANT: u16 = 0x4C52;
    /// Auth TLV, mode none (`4E 41`).
    pub const AUTH_NONE: u16 = 0x414E;
    /// Auth TLV, mode cookie (`43 41`).
    pub const AUTH_COOKIE: u16 = 0x4143;
    /// Auth TLV, mode AES-256-GCM (`41 45`).
    pub const AUTH_AES: u16 = 0x4541;
    /// Metrics-label TLV (`4D 4C`).
    pub const LABEL: u16 = 0x4C4D;
    /// Rate request PDU (`52 54`).
    pub const RATE_REQUEST: u16 = 0x5452;
    /// Rate response PDU (`52 52`).
    pub const RATE_RESPONSE: u16 = 0x5252;
    /// Latency report PDU (`4C 52`).
    pub const LATENCY_REPORT: u16 = 0x524C;
}

/// Why a received datagram (or PDU) was dropped. One variant per rule, so drops can be
/// counted per reason; none carries received bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum DropReason {
    /// Shorter than a header or block it must contain (tenant, auth TLV, PDU header).
    #[error("datagram truncated")]
    Truncated,
    /// Longer than MAX_DATAGRAM.
    #[error("datagram longer than 1200 bytes")]
    TooLong,
    /// Tenant TLV type is not 0x4C52.
    #[error("tenant TLV type is wrong")]
    BadTenantType,
    /// Tenant TLV size below 40 or beyond the datagram.
    #[error("tenant TLV size is below 40 or beyond the datagram")]
    BadTenantSize,
    /// Auth TLV type is not the key's mode.
    #[error("auth TLV is not of the key's mode")]
    WrongAuthMode,
    /// Auth TLV size is not exactly the mode's size, or goes beyond the datagram.
    #[error("auth TLV size is wrong")]
    BadAuthSize,
    /// Cookie differs from the key's secret.
    #[error("cookie does not match")]
    CookieMismatch,
    /// AES-GCM tag does not verify.
    #[error("AES-GCM authentication failed")]
    AuthFailed,
    /// AES mode with nothing after the auth TLV.
    #[error("empty ciphertext")]
    EmptyCiphertext,
    /// PDU type is not the one expected.
    #[error("PDU type is wrong")]
    BadPduType,
    /// PDU size below header + 4-byte body, or beyond the datagram.
    #[error("PDU size is wrong")]
    BadPduSize,
    /// Fewer bytes than the declared guard / resource / report blocks need.
    #[error("declared blocks are missing")]
    MissingBlocks,
    /// Metrics-label TLV malformed (type, size, padding, UTF-8, not ending the body).
    #[error("metrics label TLV is malformed")]
    BadLabel,
    /// Unique id of no request in flight (used by the request machine / engine).
    #[error("unique id of no request in flight")]
    UnknownRequest,
    /// Server id not in the request's endpoint snapshot (used by the request machine).
    #[error("server id not in the request's snapshot")]
    UnknownServer,
    /// The request is already decided or past its deadline (used by the request machine).
    #[error("request already decided or past its deadline")]
    NotExpected,
}

impl DropReason {
    /// Every variant, in declaration order (for per-reason counters).
    pub const ALL: [DropReason; 16] = [
        DropReason::Truncated,
        DropReason::TooLong,
        DropReason::BadTenantType,
        DropReason::BadTenantSize,
        DropReason::WrongAuthMode,
        DropReason::BadAuthSize,
        DropReason::CookieMismatch,
        DropReason::AuthFailed,
        DropReason::EmptyCiphertext,
        DropReason::BadPduType,
        DropReason::BadPduSize,
        DropReason::MissingBlocks,
        DropReason::BadLabel,
        DropReason::UnknownRequest,
        DropReason::UnknownServer,
        DropReason::NotExpected,
    ];

    /// Index of this variant in [`DropReason::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// Short snake_case name, for counters and metrics.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::TooLong => "too_long",
            DropReason::BadTenantType => "bad_tenant_type",
            DropReason::BadTenantSize => "bad_tenant_size",
            DropReason::WrongAuthMode => "wrong_auth_mode",
            DropReason::BadAuthSize => "bad_auth_size",
            DropReason::CookieMismatch => "cookie_mismatch",
            DropReason::AuthFailed => "auth_failed",
            DropReason::EmptyCiphertext => "empty_ciphertext",
            DropReason::BadPduType => "bad_pdu_type",
            DropReason::BadPduSize => "bad_pdu_size",
            DropReason::MissingBlocks => "missing_blocks",
            DropReason::BadLabel => "bad_label",
            DropReason::UnknownRequest => "unknown_request",
            DropReason::UnknownServer => "unknown_server",
            DropReason::NotExpected => "not_expected",
        }
    }
}

/// Why an encoder refused to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
pub enum EncodeError {
    /// The PDU or datagram would exceed MAX_DATAGRAM.
    #[error("encoding needs {needed} bytes, the maximum is {max}")]
    TooLarge {
        /// Bytes needed.
        needed: usize,
        /// The limit.
        max: usize,
    },
    /// The caller's buffer is shorter than the encoding.
    #[error("buffer of {available} bytes, {needed} needed")]
    BufferTooSmall {
        /// Bytes needed.
        needed: usize,
        /// Bytes available.
        available: usize,
    },
    /// More guards, resources or report entries than a u16 count allows.
    #[error("too many blocks for a u16 count")]
    TooManyBlocks,
    /// The label does not fit a u16-sized TLV.
    #[error("label of {len} bytes is too long")]
    LabelTooLong {
        /// Label length.
        len: usize,
    },
    /// seal was asked to send an empty PDU.
    #[error("empty PDU")]
    EmptyPdu,
}

// ---- little-endian field helpers (callers have checked lengths) ----

#[inline]
pub(crate) fn get_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub(crate) fn get_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
pub(crate) fn get_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}

#[inline]
pub(crate) fn get_id(b: &[u8], off: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    a
}

#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    b[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    b[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// PDU header field offsets.
pub(crate) mod pdu {
    pub const TYPE: usize = 0;
    pub const SIZE: usize = 2;
    pub const WORD: usize = 4;
}

/// Checks a PDU header and returns (header word, body) where body = pdu[8..size].
/// Bytes after the declared size are ignored.
pub(crate) fn parse_pdu(pdu: &[u8], ty: u16) -> Result<(u32, &[u8]), DropReason> {
    if pdu.len() < PDU_HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    if get_u16(pdu, pdu::TYPE) != ty {
        return Err(DropReason::BadPduType);
    }
    let size = usize::from(get_u16(pdu, pdu::SIZE));
    if size < PDU_HEADER_LEN + 4 || size > pdu.len() {
        return Err(DropReason::BadPduSize);
    }
    Ok((get_u32(pdu, pdu::WORD), &pdu[PDU_HEADER_LEN..size]))
}

/// Checks that `needed` bytes may be written: <= MAX_DATAGRAM and <= out.len().
pub(crate) fn check_room(out: &[u8], needed: usize) -> Result<(), EncodeError> {
    if needed > MAX_DATAGRAM {
        return Err(EncodeError::TooLarge {
            needed,
            max: MAX_DATAGRAM,
        });
    }
    if out.len() < needed {
        return Err(EncodeError::BufferTooSmall {
            needed,
            available: out.len(),
        });
    }
    Ok(())
}

/// Writes a PDU header.
pub(crate) fn put_pdu_header(out: &mut [u8], ty: u16, size: usize, word: u32) {
    put_u16(out, pdu::TYPE, ty);
    // size <= MAX_DATAGRAM was checked by the caller.
    put_u16(out, pdu::SIZE, size as u16);
    put_u32(out, pdu::WORD, word);
}

/// `n` as a u16 block count.
pub(crate) fn count_u16(n: usize) -> Result<u16, EncodeError> {
    u16::try_from(n).map_err(|_| EncodeError::TooManyBlocks)
}
