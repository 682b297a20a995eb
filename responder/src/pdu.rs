//! Responder-specific PDU rules on top of the codec's views (`ratelimitly_engine::proto::wire`).
//!
//! Owns: dispatch of an opened PDU by type to [`RateRequestView`] / [`ReportView`], and
//! the rules the codec leaves to servers (docs/protocol.md §2 "servers may require"): the PDU size
//! must equal the bytes present, a rate request must carry at least one guard or
//! resource, and its block counts must fit one datagram (so the response can be built in
//! fixed stack arrays of [`MAX_GUARDS`] / [`MAX_RESOURCES`]). Must not touch: byte
//! layouts and field offsets (the codec's), framing, auth, crypto, state, sockets, clocks.

use ratelimitly_engine::proto::key::AuthMode;
use ratelimitly_engine::proto::wire::{
    DropReason, GUARD_BLOCK_LEN, MAX_DATAGRAM, PDU_HEADER_LEN, RESOURCE_BLOCK_LEN, RateRequestView,
    ReportView, TENANT_LEN, auth_tlv_len, types,
};

/// Bytes of guard and resource blocks the largest request datagram can carry (40-byte
/// tenant, mode none, PDU header, 4 bytes of counts).
const MAX_BLOCK_BYTES: usize =
    MAX_DATAGRAM - TENANT_LEN - auth_tlv_len(AuthMode::None) - PDU_HEADER_LEN - 4;

/// Most guard blocks a request datagram can carry (31).
pub const MAX_GUARDS: usize = MAX_BLOCK_BYTES / GUARD_BLOCK_LEN;

/// Most resource blocks a request datagram can carry (40).
pub const MAX_RESOURCES: usize = MAX_BLOCK_BYTES / RESOURCE_BLOCK_LEN;

/// Why an opened PDU was refused (the datagram is dropped and counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduError {
    /// The codec refused it (type, size, missing blocks, label TLV).
    Codec(DropReason),
    /// Declared PDU size is smaller than the bytes present (trailing bytes).
    SizeNotExact,
    /// A rate request with neither guards nor resources.
    Empty,
    /// More guard or resource blocks than one datagram can carry.
    TooManyBlocks,
}

impl From<DropReason> for PduError {
    fn from(d: DropReason) -> Self {
        PduError::Codec(d)
    }
}

/// An opened PDU the responder acts on.
#[derive(Clone, Copy, Debug)]
pub enum Inbound<'a> {
    /// A rate request (answered).
    Request(RateRequestView<'a>),
    /// A latency report (never answered).
    Report(ReportView<'a>),
}

/// Parses an opened PDU (the plaintext from the PDU offset to the end of the datagram).
pub fn parse(pdu: &[u8]) -> Result<Inbound<'_>, PduError> {
    if pdu.len() < PDU_HEADER_LEN {
        return Err(PduError::Codec(DropReason::Truncated));
    }
    let ty = u16::from_le_bytes([pdu[0], pdu[1]]);
    let inbound = match ty {
        types::RATE_REQUEST => {
            let req = RateRequestView::parse(pdu)?;
            if req.guard_count() + req.resource_count() == 0 {
                return Err(PduError::Empty);
            }
            if req.guard_count() > MAX_GUARDS || req.resource_count() > MAX_RESOURCES {
                return Err(PduError::TooManyBlocks);
            }
            Inbound::Request(req)
        }
        types::LATENCY_REPORT => Inbound::Report(ReportView::parse(pdu)?),
        _ => return Err(PduError::Codec(DropReason::BadPduType)),
    };
    // the codec accepted size <= bytes present; the responder wants them equal
    if usize::from(u16::from_le_bytes([pdu[2], pdu[3]])) != pdu.len() {
        return Err(PduError::SizeNotExact);
    }
    Ok(inbound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratelimitly_engine::proto::wire::{
        GuardSpec, ResourceResultSpec, encode_rate_response_pdu, encode_report_pdu,
    };

    const VECTOR: &str = "525458003c000000010001006a17d07a424568304e50d28540f76e671027000064000000050000006400000000000000f5cf3ad8b8406854b596ba3614f16effe803000064000000010000004d4c0c000300617069000000";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn u32_at(b: &[u8], off: usize) -> u32 {
        u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
    }

    fn request(pdu: &[u8]) -> Result<RateRequestView<'_>, PduError> {
        match parse(pdu)? {
            Inbound::Request(r) => Ok(r),
            Inbound::Report(_) => panic!("not a request"),
        }
    }

    #[test]
    fn bounds() {
        assert_eq!((MAX_GUARDS, MAX_RESOURCES), (31, 40));
    }

    #[test]
    fn parses_vector_request() {
        let pdu = unhex(VECTOR);
        let r = request(&pdu).unwrap();
        assert_eq!(r.dedup_ttl_ms(), 60);
        assert_eq!((r.guard_count(), r.resource_count()), (1, 1));
        let g = r.guards().next().unwrap();
        assert_eq!(
            (
                g.ttl_ms(),
                g.max_samples(),
                g.min_samples(),
                g.threshold_ms()
            ),
            (10000, 100, 5, 100)
        );
        let res = r.resources().next().unwrap();
        assert_eq!(
            (res.window_ms(), res.rate_limit(), res.tokens()),
            (1000, 100, 1)
        );
        // every truncation is refused, never panics
        for n in 0..pdu.len() {
            assert!(parse(&pdu[..n]).is_err());
        }
    }

    #[test]
    fn responder_rules() {
        let pdu = unhex(VECTOR);
        // trailing byte after the declared size
        let mut long = pdu.clone();
        long.push(0);
        assert_eq!(request(&long).unwrap_err(), PduError::SizeNotExact);
        // size beyond the bytes present (codec)
        let mut big = pdu.clone();
        big[2] += 1;
        assert!(matches!(request(&big), Err(PduError::Codec(_))));
        // no guards, no resources
        let empty = [0x52, 0x54, 12, 0, 60, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(request(&empty).unwrap_err(), PduError::Empty);
        // wrong type
        let mut resp = pdu.clone();
        resp[0] = 0x52;
        resp[1] = 0x52;
        assert_eq!(
            parse(&resp).unwrap_err(),
            PduError::Codec(DropReason::BadPduType)
        );
        // more resources than a datagram carries (a PDU longer than any datagram)
        let n = MAX_RESOURCES + 1;
        let len = PDU_HEADER_LEN + 4 + n * RESOURCE_BLOCK_LEN;
        let mut many = vec![0u8; len];
        many[..4].copy_from_slice(&[0x52, 0x54, len as u8, (len >> 8) as u8]);
        many[10] = n as u8;
        assert_eq!(request(&many).unwrap_err(), PduError::TooManyBlocks);
    }

    #[test]
    fn parses_report() {
        let e = ratelimitly_engine::proto::wire::ReportEntry {
            tracker_id: [3; 16],
            ttl_ms: 1000,
            max_samples: 10,
            min_samples: 1,
            observed_ms: 42,
        };
        let mut b = [0u8; 128];
        let n = encode_report_pdu(&mut b, &[e, e]).unwrap();
        let Inbound::Report(rep) = parse(&b[..n]).unwrap() else {
            panic!("not a report");
        };
        assert_eq!(rep.len(), 2);
        assert_eq!(rep.entries().next().unwrap(), e);
        assert_eq!(parse(&b[..n + 1]).unwrap_err(), PduError::SizeNotExact);
        for k in 0..n {
            assert!(parse(&b[..k]).is_err());
        }
    }

    #[test]
    fn writes_response() {
        let pdu = unhex(VECTOR);
        let r = request(&pdu).unwrap();
        let g = r.guards().next().unwrap();
        let res = r.resources().next().unwrap();
        let mut out = [0u8; 200];
        let n = encode_rate_response_pdu(
            &mut out,
            &[GuardSpec {
                current_latency_ms: 42,
                ..g.spec()
            }],
            &[ResourceResultSpec {
                bucket_id: res.bucket_id(),
                window_ms: res.window_ms(),
                actual_rate: 37,
                deficit: 0,
            }],
        )
        .unwrap();
        assert_eq!(n, 12 + 36 + 28);
        assert_eq!(&out[..4], &[0x52, 0x52, 76, 0]);
        assert_eq!(u32_at(&out, 12 + 32), 42);
        assert_eq!(u32_at(&out, 12 + 36 + 20), 37);
    }
}
