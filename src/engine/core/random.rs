//! Buffered randomness for one core's unique ids and nonces.
//!
//! Owns: [`RandPool`] (a ChaCha20 keystream re-keyed from the injected [`Entropy`]).
//! Must not touch: anything but the bytes it hands out; the OS source is the runtime's
//! to inject.

use chacha20::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use zeroize::Zeroize;

use super::consts::{RESEED_BYTES, RNG_POOL};
use crate::proto::wire::{self, RngError};

/// A source of randomness (OS randomness in a running core, seeded in simulation).
pub type Entropy = Box<dyn FnMut(&mut [u8]) -> Result<(), RngError> + Send>;

/// Buffered randomness: a ChaCha20 keystream keyed with 32 bytes of the entropy source
/// and re-keyed every [`RESEED_BYTES`] (the construction of arc4random and of the
/// kernel's own generator), so a request costs no system call and no kernel ChaCha run.
pub(crate) struct RandPool {
    buf: Box<[u8; RNG_POOL]>,
    at: usize,
    source: Entropy,
    rng: Option<ChaCha20Rng>,
    since_seed: usize,
}

impl RandPool {
    /// A pool drawing its keys from `source` (nothing is drawn before the first fill).
    pub(crate) fn new(source: Entropy) -> RandPool {
        RandPool {
            buf: Box::new([0u8; RNG_POOL]),
            at: RNG_POOL,
            source,
            rng: None,
            since_seed: 0,
        }
    }

    fn refill(&mut self) -> Result<(), RngError> {
        if self.rng.is_none() || self.since_seed >= RESEED_BYTES {
            let mut seed = [0u8; 32];
            (self.source)(&mut seed)?;
            self.rng = Some(ChaCha20Rng::from_seed(seed));
            seed.zeroize();
            self.since_seed = 0;
        }
        if let Some(rng) = self.rng.as_mut() {
            rng.fill_bytes(&mut self.buf[..]);
        }
        self.since_seed += RNG_POOL;
        self.at = 0;
        Ok(())
    }

    pub(crate) fn fill(&mut self, out: &mut [u8]) -> Result<(), RngError> {
        if self.at + out.len() > RNG_POOL {
            self.refill()?;
        }
        out.copy_from_slice(&self.buf[self.at..self.at + out.len()]);
        // never hand out the same bytes twice
        self.buf[self.at..self.at + out.len()].fill(0);
        self.at += out.len();
        Ok(())
    }

    /// The random bytes of one datagram's unique id and nonce.
    pub(crate) fn datagram_random(&mut self) -> Result<[u8; wire::DATAGRAM_RANDOM_LEN], RngError> {
        let mut rnd = [0u8; wire::DATAGRAM_RANDOM_LEN];
        self.fill(&mut rnd)?;
        Ok(rnd)
    }
}
