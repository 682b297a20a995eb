//! The encoded rate-request PDU of one request, and its encoder.
//!
//! Owns: [`PduBuf`] (a request's PDU: inline up to [`PDU_INLINE`] bytes, the common case,
//! else in a heap buffer it owns) and [`check`] / [`encode`], the request builder's
//! validation and its one encoder. A request sent with `RequestBuilder::send` is encoded
//! straight into its completion slot (`super::completion::SlotPool::write_pdu`, in the
//! memory its outcome takes later), a built `Request` into its own `PduBuf` that moves
//! into the slot when it is submitted; the core seals the PDU from the slot into the
//! datagram it keeps in flight, so the queue between them carries only the slot index.
//! Must not touch: the slots' synchronisation, sockets, the core.

use super::consts::PDU_INLINE;
use crate::proto::error::{ConfigError, RequestError};
use crate::proto::wire::{self, EncodeError, GuardSpec, ResourceSpec};

/// A request's encoded PDU: inline when it fits, else in a heap buffer.
pub(crate) enum PduBuf {
    /// At most [`PDU_INLINE`] bytes.
    Inline { len: u16, bytes: [u8; PDU_INLINE] },
    /// A larger PDU.
    Heap(Box<[u8]>),
}

impl PduBuf {
    /// No bytes.
    pub(crate) const EMPTY: PduBuf = PduBuf::Inline {
        len: 0,
        bytes: [0u8; PDU_INLINE],
    };

    /// The encoded bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            PduBuf::Inline { len, bytes } => &bytes[..usize::from(*len).min(PDU_INLINE)],
            PduBuf::Heap(b) => b,
        }
    }
}

/// The PDU length of a request, or the configuration error that refuses it (checked
/// before any completion slot is taken).
pub(crate) fn check(
    max_pdu: usize,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> Result<usize, ConfigError> {
    if wire::label_tlv_len(label.len()).is_none() {
        return Err(RequestError::LabelTooLong { len: label.len() }.into());
    }
    let len = wire::rate_request_pdu_len(guards.len(), resources.len(), label.len())
        .ok_or(ConfigError::Request(RequestError::TooManyBlocks))?;
    if len > max_pdu {
        return Err(RequestError::TooLarge {
            needed: len + (wire::MAX_DATAGRAM - max_pdu),
            max: wire::MAX_DATAGRAM,
        }
        .into());
    }
    Ok(len)
}

/// Encodes a rate request of `len` bytes, the length [`check`] returned for it, into
/// `dst`: inline when it fits (the encoder writes every byte of the PDU, so a reused
/// store needs no clearing), else into a heap buffer that `dst` then owns.
pub(crate) fn encode(
    dst: &mut PduBuf,
    len: usize,
    horizon_ms: u32,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> Result<(), ConfigError> {
    let enc = |out: &mut [u8]| {
        wire::encode_rate_request_pdu(out, horizon_ms, guards, resources, label)
            .map_err(encode_error)
    };
    if len > PDU_INLINE {
        let mut v = vec![0u8; len];
        let n = enc(&mut v)?;
        v.truncate(n);
        *dst = PduBuf::Heap(v.into_boxed_slice());
        return Ok(());
    }
    if let PduBuf::Heap(_) = dst {
        *dst = PduBuf::EMPTY;
    }
    if let PduBuf::Inline { len: l, bytes } = dst {
        *l = enc(&mut bytes[..])? as u16;
    }
    Ok(())
}

fn encode_error(e: EncodeError) -> ConfigError {
    match e {
        EncodeError::LabelTooLong { len } => RequestError::LabelTooLong { len }.into(),
        EncodeError::TooManyBlocks => RequestError::TooManyBlocks.into(),
        _ => RequestError::TooLarge {
            needed: wire::MAX_DATAGRAM + 1,
            max: wire::MAX_DATAGRAM,
        }
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(i: u8) -> ResourceSpec {
        ResourceSpec {
            bucket_id: [i; 16],
            window_ms: 1000,
            rate_limit: 10,
            tokens: 1,
        }
    }

    /// A reused store holds exactly what a fresh one would: the encoder writes every
    /// byte, whatever the store held before.
    #[test]
    fn reused_store_encodes_like_a_fresh_one() {
        for n in [1usize, 2, 3] {
            let rs: Vec<_> = (0..n as u8).map(resource).collect();
            let label = "a-label";
            let enc = |store: &mut PduBuf| {
                let len = check(1100, &[], &rs, label).unwrap();
                encode(store, len, 60, &[], &rs, label).unwrap();
                assert!(matches!(store, PduBuf::Inline { .. }));
            };
            let mut fresh = PduBuf::EMPTY;
            enc(&mut fresh);
            let mut dirty = PduBuf::Inline {
                len: 7,
                bytes: [0xAA; PDU_INLINE],
            };
            enc(&mut dirty);
            assert_eq!(fresh.as_slice(), dirty.as_slice(), "{n} resources");
            let len = wire::rate_request_pdu_len(0, n, label.len()).unwrap();
            assert_eq!(fresh.as_slice().len(), len);
        }
    }

    /// A large PDU is a case of the same store: a heap buffer it owns, and the store
    /// goes back to inline for a small one.
    #[test]
    fn large_pdus_go_to_a_heap_buffer_of_the_same_store() {
        let rs: Vec<_> = (0..8).map(resource).collect();
        let mut store = PduBuf::EMPTY;
        encode(
            &mut store,
            check(1100, &[], &rs, "").unwrap(),
            60,
            &[],
            &rs,
            "",
        )
        .unwrap();
        assert!(matches!(store, PduBuf::Heap(_)));
        let len = wire::rate_request_pdu_len(0, 8, 0).unwrap();
        assert_eq!(store.as_slice().len(), len);
        assert!(len > PDU_INLINE);
        let one = [resource(1)];
        encode(
            &mut store,
            check(1100, &[], &one, "").unwrap(),
            60,
            &[],
            &one,
            "",
        )
        .unwrap();
        assert!(matches!(store, PduBuf::Inline { .. }));
        assert_eq!(
            store.as_slice().len(),
            wire::rate_request_pdu_len(0, 1, 0).unwrap()
        );
    }

    #[test]
    fn refusals_name_the_rule() {
        let rs = [resource(1)];
        let long = "x".repeat(70_000);
        assert!(matches!(
            check(1100, &[], &rs, &long),
            Err(ConfigError::Request(RequestError::LabelTooLong { .. }))
        ));
        let many: Vec<_> = (0..200).map(|i| resource(i as u8)).collect();
        assert!(matches!(
            check(1100, &[], &many, ""),
            Err(ConfigError::Request(RequestError::TooLarge { .. }))
        ));
    }
}
