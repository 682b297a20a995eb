//! The encoded rate-request PDU of one request, and its encoder.
//!
//! Owns: [`PduInline`] (a PDU of at most [`PDU_INLINE`] bytes, the common case),
//! [`PduBuf`] (a built request's PDU, inline or on the heap) and [`check`] / [`encode`],
//! the request builder's validation and encoding. A request sent with
//! `RequestBuilder::send` is encoded straight into its completion slot
//! (`super::completion::SlotPool::write_pdu`, in the memory its outcome takes later); the
//! core seals it from there into the datagram it keeps in flight, so the queue between
//! them carries only the slot index (and, for a PDU too large to be inline, its heap
//! buffer).
//! Must not touch: the slots' synchronisation, sockets, the core.

use crate::proto::error::{ConfigError, RequestError};
use crate::proto::wire::{self, EncodeError, GuardSpec, ResourceSpec};

/// PDU bytes kept inline (a larger PDU is encoded into a heap buffer).
pub(crate) const PDU_INLINE: usize = 128;

/// A PDU of at most [`PDU_INLINE`] bytes.
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct PduInline {
    len: u16,
    bytes: [u8; PDU_INLINE],
}

impl PduInline {
    /// No bytes.
    pub(crate) const EMPTY: PduInline = PduInline {
        len: 0,
        bytes: [0u8; PDU_INLINE],
    };

    /// The encoded bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(PDU_INLINE)]
    }
}

/// A built request's PDU.
pub(crate) enum PduBuf {
    Inline(PduInline),
    Heap(Box<[u8]>),
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

/// Encodes a rate request of `len` bytes, the length [`check`] returned for it: into
/// `inline` when it fits (the encoder writes every byte of the PDU, so a reused store
/// needs no clearing), else into the heap buffer it returns.
pub(crate) fn encode(
    inline: &mut PduInline,
    len: usize,
    horizon_ms: u32,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> Result<Option<Box<[u8]>>, ConfigError> {
    if len <= PDU_INLINE {
        let n =
            wire::encode_rate_request_pdu(&mut inline.bytes, horizon_ms, guards, resources, label)
                .map_err(encode_error)?;
        inline.len = n as u16;
        return Ok(None);
    }
    let mut v = vec![0u8; len];
    let n = wire::encode_rate_request_pdu(&mut v, horizon_ms, guards, resources, label)
        .map_err(encode_error)?;
    v.truncate(n);
    Ok(Some(v.into_boxed_slice()))
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
            let enc = |store: &mut PduInline| {
                let len = check(1100, &[], &rs, label).unwrap();
                assert!(encode(store, len, 60, &[], &rs, label).unwrap().is_none());
            };
            let mut fresh = PduInline::EMPTY;
            enc(&mut fresh);
            let mut dirty = PduInline {
                len: 7,
                bytes: [0xAA; PDU_INLINE],
            };
            enc(&mut dirty);
            assert_eq!(fresh.as_slice(), dirty.as_slice(), "{n} resources");
            let len = wire::rate_request_pdu_len(0, n, label.len()).unwrap();
            assert_eq!(fresh.as_slice().len(), len);
        }
    }

    #[test]
    fn large_pdus_go_to_the_heap() {
        let rs: Vec<_> = (0..8).map(resource).collect();
        let mut inline = PduInline::EMPTY;
        let heap = encode(
            &mut inline,
            check(1100, &[], &rs, "").unwrap(),
            60,
            &[],
            &rs,
            "",
        )
        .unwrap()
        .unwrap();
        assert_eq!(heap.len(), wire::rate_request_pdu_len(0, 8, 0).unwrap());
        assert!(heap.len() > PDU_INLINE);
        assert!(
            inline.as_slice().is_empty(),
            "the inline store is untouched"
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
