//! Randomness for the wire: unique ids (RFC 4122 v4 shape) and AES-GCM nonces, straight
//! from the operating system CSPRNG (getrandom), no buffering (so a fork can never repeat a
//! nonce), and how a datagram's random bytes split into its unique id and nonce. Owns
//! nothing else.

use super::NONCE_LEN;

/// The operating system's random number generator failed; nothing must be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("system random number generator failed: {0}")]
pub struct RngError(pub getrandom::Error);

/// Fills `buf` from the OS CSPRNG (one system call for the whole buffer).
pub fn fill_random(buf: &mut [u8]) -> Result<(), RngError> {
    getrandom::fill(buf).map_err(RngError)
}

/// Shapes 16 random bytes as an RFC 4122 version-4 UUID in place.
pub fn shape_unique_id(id: &mut [u8; 16]) {
    id[6] = (id[6] & 0x0F) | 0x40;
    id[8] = (id[8] & 0x3F) | 0x80;
}

/// A fresh unique id (16 CSPRNG bytes, v4-shaped).
pub fn new_unique_id() -> Result<[u8; 16], RngError> {
    let mut id = [0u8; 16];
    fill_random(&mut id)?;
    shape_unique_id(&mut id);
    Ok(id)
}

/// A fresh 12-byte AES-GCM nonce.
pub fn new_nonce() -> Result<[u8; NONCE_LEN], RngError> {
    let mut n = [0u8; NONCE_LEN];
    fill_random(&mut n)?;
    Ok(n)
}

/// Random bytes one datagram we send needs: 16 for its unique id, 12 for its nonce.
pub const DATAGRAM_RANDOM_LEN: usize = 16 + NONCE_LEN;

/// Splits [`DATAGRAM_RANDOM_LEN`] random bytes into a v4-shaped unique id (bytes 0..16)
/// and a nonce (bytes 16..28). Shaping changes bytes 6 and 8 of the id only.
pub fn unique_id_and_nonce(random: &[u8; DATAGRAM_RANDOM_LEN]) -> ([u8; 16], [u8; NONCE_LEN]) {
    let mut id = [0u8; 16];
    id.copy_from_slice(&random[..16]);
    shape_unique_id(&mut id);
    let mut nonce = [0u8; NONCE_LEN];
    nonce.copy_from_slice(&random[16..]);
    (id, nonce)
}

/// A fresh unique id and nonce from one system call (the per-request hot path).
pub fn new_unique_id_and_nonce() -> Result<([u8; 16], [u8; NONCE_LEN]), RngError> {
    let mut b = [0u8; DATAGRAM_RANDOM_LEN];
    fill_random(&mut b)?;
    Ok(unique_id_and_nonce(&b))
}
