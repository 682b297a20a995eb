//! Tenant TLV (40 bytes sent; responses may declare a larger size): key id or server id,
//! unique id, timestamp, steering. Owns its field offsets and the one setup of the tenant
//! of a datagram a client sends ([`request_tenant`]); nothing else.

use super::rng::{DATAGRAM_RANDOM_LEN, unique_id_and_nonce};
use super::{DropReason, NONCE_LEN, TENANT_LEN, get_id, get_u16, get_u64, put_u16, put_u64, types};

/// Tenant TLV field offsets.
pub(crate) mod off {
    pub const TYPE: usize = 0;
    pub const SIZE: usize = 2;
    pub const ID: usize = 4;
    pub const UNIQUE_ID: usize = 12;
    pub const TIMESTAMP: usize = 28;
    pub const STEERING: usize = 36;
    pub const RESERVED: usize = 37;
}

/// The values a sender puts into a tenant TLV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TenantFields {
    /// Key id in requests, server id in responses.
    pub id: u64,
    /// Unique id of the logical request.
    pub unique_id: [u8; 16],
    /// Sender wall clock, Unix epoch ms.
    pub timestamp_ms: u64,
    /// Steering byte: requests send 0; responses 1 = keep the port, 0 = change it.
    pub steering: u8,
}

impl TenantFields {
    /// Writes the 40-byte TLV into `out[..40]` (caller checked the length).
    pub(crate) fn write(&self, out: &mut [u8]) {
        put_u16(out, off::TYPE, types::TENANT);
        put_u16(out, off::SIZE, TENANT_LEN as u16);
        put_u64(out, off::ID, self.id);
        out[off::UNIQUE_ID..off::UNIQUE_ID + 16].copy_from_slice(&self.unique_id);
        put_u64(out, off::TIMESTAMP, self.timestamp_ms);
        out[off::STEERING] = self.steering;
        out[off::RESERVED..TENANT_LEN].fill(0);
    }
}

/// The tenant TLV and the AES-GCM nonce of a datagram a client sends (rate request or
/// latency report): key id `key_id`, a unique id made of `random[..16]` shaped as an RFC
/// 4122 v4 UUID, timestamp `wall_ms` (Unix epoch ms), steering 0; nonce `random[16..]`.
/// `random` must be fresh CSPRNG bytes ([`super::fill_random`]), never reused.
///
/// Shaping changes bytes 6 and 8 of the unique id only, so a driver that routes responses
/// by unique id may overwrite bytes 0..6 afterwards.
pub fn request_tenant(
    key_id: u64,
    random: &[u8; DATAGRAM_RANDOM_LEN],
    wall_ms: u64,
) -> (TenantFields, [u8; NONCE_LEN]) {
    let (unique_id, nonce) = unique_id_and_nonce(random);
    let tenant = TenantFields {
        id: key_id,
        unique_id,
        timestamp_ms: wall_ms,
        steering: 0,
    };
    (tenant, nonce)
}

/// A validated view of a tenant TLV at the start of a datagram.
#[derive(Clone, Copy, Debug)]
pub struct TenantView<'a> {
    bytes: &'a [u8],
}

impl<'a> TenantView<'a> {
    /// Validates type 0x4C52 and size: at least 40 and within `datagram`.
    pub fn parse(datagram: &'a [u8]) -> Result<TenantView<'a>, DropReason> {
        if datagram.len() < TENANT_LEN {
            return Err(DropReason::Truncated);
        }
        if get_u16(datagram, off::TYPE) != types::TENANT {
            return Err(DropReason::BadTenantType);
        }
        let size = usize::from(get_u16(datagram, off::SIZE));
        if size < TENANT_LEN || size > datagram.len() {
            return Err(DropReason::BadTenantSize);
        }
        Ok(TenantView {
            bytes: &datagram[..size],
        })
    }

    /// Key id (requests) or server id (responses).
    pub fn id(&self) -> u64 {
        get_u64(self.bytes, off::ID)
    }

    /// Unique id of the logical request.
    pub fn unique_id(&self) -> [u8; 16] {
        get_id(self.bytes, off::UNIQUE_ID)
    }

    /// Sender timestamp, Unix epoch ms.
    pub fn timestamp_ms(&self) -> u64 {
        get_u64(self.bytes, off::TIMESTAMP)
    }

    /// Steering byte (responses: 1 keep, 0 change source port).
    pub fn steering(&self) -> u8 {
        self.bytes[off::STEERING]
    }

    /// The view of a tenant TLV [`parse`](Self::parse) validated before: `bytes` are
    /// exactly its `size` bytes.
    pub(crate) fn parsed(bytes: &'a [u8]) -> TenantView<'a> {
        TenantView { bytes }
    }

    /// Declared TLV size (>= 40); the auth TLV starts here.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }

    /// The TLV bytes (size bytes).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The fields, copied out.
    pub fn fields(&self) -> TenantFields {
        TenantFields {
            id: self.id(),
            unique_id: self.unique_id(),
            timestamp_ms: self.timestamp_ms(),
            steering: self.steering(),
        }
    }
}
