//! AES-256-GCM for the auth TLV: seal and open in place with a detached tag.
//!
//! Owns the in-place contract: a datagram whose tag fails is wiped, never left holding
//! unauthenticated plaintext (AWS-LC writes plaintext before it compares the tag). Must not
//! touch TLV layout (`auth.rs`).
//!
//! Why aws-lc-rs (benches/README.md, "AES-256-GCM"): at our 40–300-byte PDUs it is the
//! fastest of aws-lc-rs, ring, RustCrypto's aes-gcm and graviola on the machines measured,
//! and its key context (round keys, GHASH table) lives in one `OPENSSL_malloc` allocation
//! that AWS-LC's `OPENSSL_free` overwrites with zeros before freeing.

use aws_lc_rs::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};
use zeroize::Zeroize;

use super::{NONCE_LEN, TAG_LEN};

/// A prepared AES-256-GCM key (the expanded schedule and GHASH key).
pub(crate) struct Aes256Gcm(LessSafeKey);

impl Aes256Gcm {
    /// Expands `key`.
    pub(crate) fn new(key: &[u8; 32]) -> Aes256Gcm {
        Aes256Gcm(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte key is a valid AES-256 key"),
        ))
    }

    /// Encrypts `in_out` in place; returns the tag.
    pub(crate) fn seal(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
    ) -> [u8; TAG_LEN] {
        let tag = self
            .0
            .seal_in_place_separate_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad), in_out)
            // Only fails for plaintexts over 2^36 bytes; a datagram is < 1200.
            .expect("AES-GCM seals any datagram");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Verifies `tag` (16 bytes; any other length fails) and decrypts `in_out` in place (no scratch buffer, no copy back). On
    /// a failed tag `in_out` is wiped (zeros).
    pub(crate) fn open(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        in_out: &mut [u8],
        tag: &[u8],
    ) -> bool {
        let ok = self
            .0
            .open_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                tag,
                in_out,
            )
            .is_ok();
        if !ok {
            in_out.zeroize();
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_what_it_sealed_at_every_size_and_ring_agrees() {
        let key = [7u8; 32];
        let k = Aes256Gcm::new(&key);
        let rg = ring::aead::LessSafeKey::new(
            ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &key).expect("key"),
        );
        let aad = [1u8; 60];
        for len in [1usize, 15, 16, 17, 40, 150, 300, 1128] {
            let plain: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut buf = plain.clone();
            let tag = k.seal([9; NONCE_LEN], &aad, &mut buf);
            let mut other = plain.clone();
            let n = ring::aead::Nonce::assume_unique_for_key([9; NONCE_LEN]);
            let t = rg
                .seal_in_place_separate_tag(n, ring::aead::Aad::from(&aad), &mut other)
                .expect("seal");
            assert_eq!((other.as_slice(), t.as_ref()), (buf.as_slice(), &tag[..]));
            assert!(k.open([9; NONCE_LEN], &aad, &mut buf, &tag), "len {len}");
            assert_eq!(buf, plain);
        }
    }

    #[test]
    fn a_failed_tag_wipes_the_buffer() {
        let k = Aes256Gcm::new(&[7; 32]);
        let aad = [1u8; 60];
        let mut buf = vec![5u8; 150];
        let mut tag = k.seal([3; NONCE_LEN], &aad, &mut buf);
        tag[0] ^= 1;
        assert!(!k.open([3; NONCE_LEN], &aad, &mut buf, &tag));
        assert_eq!(buf, vec![0u8; 150]);
    }
}
