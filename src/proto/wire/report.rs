//! Latency report PDU (0x524C): body = n u16 · 2 zero bytes · n blocks of 32 (tracker id ·
//! ttl · max_samples · min_samples · observed ms). Fire-and-forget. Owns this layout.

use super::{
    Auth, DropReason, EncodeError, MAX_DATAGRAM, PDU_HEADER_LEN, REPORT_BLOCK_LEN, TENANT_LEN,
    TenantFields, auth_tlv_len, check_room, count_u16, get_id, get_u16, get_u32, parse_pdu,
    put_pdu_header, put_u16, put_u32, types,
};
use crate::proto::key::AuthMode;

const OFF_COUNT: usize = 0;
const OFF_RESERVED: usize = 2;
const OFF_BLOCKS: usize = 4;

/// Report block offsets.
mod block {
    pub const TRACKER_ID: usize = 0;
    pub const TTL: usize = 16;
    pub const MAX_SAMPLES: usize = 20;
    pub const MIN_SAMPLES: usize = 24;
    pub const OBSERVED: usize = 28;
}

/// One observed latency for a tracker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReportEntry {
    /// Tracker id.
    pub tracker_id: [u8; 16],
    /// Max sample age.
    pub ttl_ms: u32,
    /// Max samples.
    pub max_samples: u32,
    /// Warm-up population.
    pub min_samples: u32,
    /// Observed latency, whole ms.
    pub observed_ms: u32,
}

/// PDU length of a report with `n` entries.
pub const fn report_pdu_len(n: usize) -> usize {
    PDU_HEADER_LEN + OFF_BLOCKS + n * REPORT_BLOCK_LEN
}

/// Most report entries one datagram carries in `mode` (none 35, cookie 34, aes 34).
pub const fn max_report_entries(mode: AuthMode) -> usize {
    (MAX_DATAGRAM - TENANT_LEN - auth_tlv_len(mode) - PDU_HEADER_LEN - OFF_BLOCKS)
        / REPORT_BLOCK_LEN
}

/// Report entries per datagram in cookie and aes mode (the smaller of the two).
pub const MAX_REPORT_ENTRIES: usize = max_report_entries(AuthMode::Cookie);

/// Writes a latency report PDU of exact length into `out`; returns its length.
pub fn encode_report_pdu(out: &mut [u8], entries: &[ReportEntry]) -> Result<usize, EncodeError> {
    let n = count_u16(entries.len())?;
    let size = report_pdu_len(entries.len());
    check_room(out, size)?;
    put_pdu_header(out, types::LATENCY_REPORT, size, 0);
    put_u16(out, PDU_HEADER_LEN + OFF_COUNT, n);
    put_u16(out, PDU_HEADER_LEN + OFF_RESERVED, 0);
    let mut at = PDU_HEADER_LEN + OFF_BLOCKS;
    for e in entries {
        let b = &mut out[at..at + REPORT_BLOCK_LEN];
        b[block::TRACKER_ID..block::TTL].copy_from_slice(&e.tracker_id);
        put_u32(b, block::TTL, e.ttl_ms);
        put_u32(b, block::MAX_SAMPLES, e.max_samples);
        put_u32(b, block::MIN_SAMPLES, e.min_samples);
        put_u32(b, block::OBSERVED, e.observed_ms);
        at += REPORT_BLOCK_LEN;
    }
    Ok(size)
}

/// Encodes a report PDU at `out[auth.pdu_offset()..]` and seals the datagram.
pub fn encode_report(
    auth: &Auth,
    tenant: &TenantFields,
    nonce: [u8; 12],
    out: &mut [u8],
    entries: &[ReportEntry],
) -> Result<usize, EncodeError> {
    let p = auth.pdu_offset();
    if out.len() < p {
        return Err(EncodeError::BufferTooSmall {
            needed: p,
            available: out.len(),
        });
    }
    let end = out.len().min(MAX_DATAGRAM);
    let pdu_len =
        encode_report_pdu(&mut out[p..end], entries).map_err(|e| super::request::shift(e, p))?;
    super::seal(auth, tenant, nonce, out, pdu_len)
}

/// A validated latency report PDU.
#[derive(Clone, Copy, Debug)]
pub struct ReportView<'a> {
    blocks: &'a [u8],
}

impl<'a> ReportView<'a> {
    /// Validates type, size (within `pdu`), body >= 4 and that all n blocks are present.
    pub fn parse(pdu: &'a [u8]) -> Result<ReportView<'a>, DropReason> {
        let (_zero, body) = parse_pdu(pdu, types::LATENCY_REPORT)?;
        let len = usize::from(get_u16(body, OFF_COUNT)) * REPORT_BLOCK_LEN;
        let rest = &body[OFF_BLOCKS..];
        if rest.len() < len {
            return Err(DropReason::MissingBlocks);
        }
        Ok(ReportView {
            blocks: &rest[..len],
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.blocks.len() / REPORT_BLOCK_LEN
    }

    /// True when the report has no entries.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The entries, in order.
    pub fn entries(&self) -> impl ExactSizeIterator<Item = ReportEntry> + Clone + 'a {
        self.blocks
            .chunks_exact(REPORT_BLOCK_LEN)
            .map(|b| ReportEntry {
                tracker_id: get_id(b, block::TRACKER_ID),
                ttl_ms: get_u32(b, block::TTL),
                max_samples: get_u32(b, block::MAX_SAMPLES),
                min_samples: get_u32(b, block::MIN_SAMPLES),
                observed_ms: get_u32(b, block::OBSERVED),
            })
    }
}
