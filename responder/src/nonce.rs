//! Fresh AES-GCM nonces for responses: 12 bytes from the OS CSPRNG per encryption
//! (docs/protocol.md §1, "servers draw their own"), fetched 4 KiB at a time so that one
//! `getrandom` call serves about 340 responses.
//!
//! Owns: the buffered random bytes (each handed out once, then zeroed). Must not touch:
//! sealing, sockets, clocks.

/// Random bytes fetched per `getrandom` call.
const POOL: usize = 4096;
/// Nonce length (AES-GCM).
pub const NONCE_LEN: usize = 12;

/// The OS random source failed; nothing must be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("OS random source failed")]
pub struct RngFailed;

/// Buffered OS randomness, one per responder core.
pub struct NoncePool {
    buf: Box<[u8; POOL]>,
    at: usize,
}

impl Default for NoncePool {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for NoncePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoncePool { .. }")
    }
}

impl NoncePool {
    /// An empty pool (filled on first use).
    pub fn new() -> Self {
        Self {
            buf: Box::new([0u8; POOL]),
            at: POOL,
        }
    }

    /// The next fresh nonce.
    pub fn draw(&mut self) -> Result<[u8; NONCE_LEN], RngFailed> {
        if self.at + NONCE_LEN > POOL {
            getrandom::fill(&mut self.buf[..]).map_err(|_| RngFailed)?;
            self.at = 0;
        }
        let mut n = [0u8; NONCE_LEN];
        n.copy_from_slice(&self.buf[self.at..self.at + NONCE_LEN]);
        // never hand out the same bytes twice
        self.buf[self.at..self.at + NONCE_LEN].fill(0);
        self.at += NONCE_LEN;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn nonces_are_distinct_across_refills() {
        let mut p = NoncePool::new();
        let mut seen = HashSet::new();
        for _ in 0..2000 {
            assert!(seen.insert(p.draw().unwrap()));
        }
    }
}
