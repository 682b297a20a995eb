//! Responder-side views of the rate request and latency report PDUs, and the rate
//! response PDU writer, over plaintext PDU bytes (after `wire::open`).
//!
//! Owns: bounds-checked field reads at the named offsets of wire.md §2–§4, and writing
//! response blocks straight into the caller's output buffer (no intermediate slices, no
//! allocation). Must not touch: framing, auth, crypto (the codec in
//! `ratelimitly_engine::wire` does those), state, sockets, clocks.

/// Rate request PDU type.
pub const PDU_RATE_REQUEST: u16 = 0x5452;
/// Rate response PDU type.
pub const PDU_RATE_RESPONSE: u16 = 0x5252;
/// Latency report PDU type.
pub const PDU_REPORT: u16 = 0x524C;
/// Metrics-label TLV type.
pub const TLV_LABEL: u16 = 0x4C4D;

/// PDU header length (type, size, dedup ttl / zero).
pub const PDU_HEADER: usize = 8;
/// Guard block length (request and response).
pub const GUARD_LEN: usize = 36;
/// Resource block length (request and response).
pub const RESOURCE_LEN: usize = 28;
/// Report entry length.
pub const REPORT_ENTRY_LEN: usize = 32;

// Guard block offsets.
const G_TRACKER: usize = 0;
const G_TTL: usize = 16;
const G_MAX: usize = 20;
const G_MIN: usize = 24;
const G_THRESHOLD: usize = 28;
const G_CURRENT: usize = 32;
// Resource block offsets.
const R_BUCKET: usize = 0;
const R_WINDOW: usize = 16;
const R_RATE: usize = 20;
const R_TOKENS: usize = 24;
const R_ACTUAL: usize = 20;
const R_DEFICIT: usize = 24;

/// Why a PDU was refused (the datagram is dropped and counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduError {
    /// Shorter than its header, its declared size, or its declared blocks.
    Truncated,
    /// Declared size disagrees with the bytes present.
    BadSize,
    /// Type is not the one expected.
    BadType,
    /// Bytes after the blocks are not exactly one well-formed label TLV.
    BadLabel,
    /// A rate request with neither guards nor resources.
    Empty,
    /// Response would not fit the output buffer.
    OutputTooSmall,
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// PDU type of `pdu`, if it has a header.
pub fn pdu_type(pdu: &[u8]) -> Option<u16> {
    (pdu.len() >= PDU_HEADER).then(|| u16_at(pdu, 0))
}

/// Checks header type and size == bytes present; returns the body.
fn body_of(pdu: &[u8], ty: u16) -> Result<&[u8], PduError> {
    if pdu.len() < PDU_HEADER + 4 {
        return Err(PduError::Truncated);
    }
    if u16_at(pdu, 0) != ty {
        return Err(PduError::BadType);
    }
    if usize::from(u16_at(pdu, 2)) != pdu.len() {
        return Err(PduError::BadSize);
    }
    Ok(&pdu[PDU_HEADER..])
}

/// A request guard block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    /// Tracker id.
    pub tracker_id: [u8; 16],
    /// Sample ttl ms.
    pub ttl_ms: u32,
    /// Newest samples considered.
    pub max_samples: u32,
    /// Warm-up population.
    pub min_samples: u32,
    /// Latency threshold ms.
    pub threshold_ms: u32,
}

/// A request resource block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Bucket id.
    pub bucket_id: [u8; 16],
    /// Window ms.
    pub window_ms: u32,
    /// Tokens per window.
    pub rate_limit: u32,
    /// Tokens asked for.
    pub tokens: u16,
}

fn id16(b: &[u8]) -> [u8; 16] {
    let mut id = [0u8; 16];
    id.copy_from_slice(&b[..16]);
    id
}

/// View of a rate request PDU (wire.md §2).
#[derive(Clone, Copy, Debug)]
pub struct RateRequest<'a> {
    pdu: &'a [u8],
    guards: usize,
    resources: usize,
}

impl<'a> RateRequest<'a> {
    /// Validates header, counts, blocks and the optional label TLV.
    pub fn parse(pdu: &'a [u8]) -> Result<Self, PduError> {
        let body = body_of(pdu, PDU_RATE_REQUEST)?;
        let guards = usize::from(u16_at(body, 0));
        let resources = usize::from(u16_at(body, 2));
        if guards + resources == 0 {
            return Err(PduError::Empty);
        }
        let blocks = 4 + guards * GUARD_LEN + resources * RESOURCE_LEN;
        if body.len() < blocks {
            return Err(PduError::Truncated);
        }
        let rest = &body[blocks..];
        if !rest.is_empty() {
            if rest.len() < 6 || u16_at(rest, 0) != TLV_LABEL {
                return Err(PduError::BadLabel);
            }
            let size = usize::from(u16_at(rest, 2));
            let len = usize::from(u16_at(rest, 4));
            if size != rest.len() || size % 4 != 0 || 6 + len > size || size - (6 + len) >= 4 {
                return Err(PduError::BadLabel);
            }
        }
        Ok(Self {
            pdu,
            guards,
            resources,
        })
    }

    /// Dedup TTL in ms (the client's horizon).
    pub fn dedup_ttl_ms(&self) -> u32 {
        u32_at(self.pdu, 4)
    }

    /// Number of guard blocks.
    pub fn guard_count(&self) -> usize {
        self.guards
    }

    /// Number of resource blocks.
    pub fn resource_count(&self) -> usize {
        self.resources
    }

    /// Guard block `i` (< guard_count).
    pub fn guard(&self, i: usize) -> Guard {
        let b = &self.pdu[PDU_HEADER + 4 + i * GUARD_LEN..];
        Guard {
            tracker_id: id16(&b[G_TRACKER..]),
            ttl_ms: u32_at(b, G_TTL),
            max_samples: u32_at(b, G_MAX),
            min_samples: u32_at(b, G_MIN),
            threshold_ms: u32_at(b, G_THRESHOLD),
        }
    }

    /// Resource block `i` (< resource_count).
    pub fn resource(&self, i: usize) -> Resource {
        let b = &self.pdu[PDU_HEADER + 4 + self.guards * GUARD_LEN + i * RESOURCE_LEN..];
        Resource {
            bucket_id: id16(&b[R_BUCKET..]),
            window_ms: u32_at(b, R_WINDOW),
            rate_limit: u32_at(b, R_RATE),
            tokens: u16_at(b, R_TOKENS),
        }
    }
}

/// One latency report entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReportItem {
    /// Tracker id.
    pub tracker_id: [u8; 16],
    /// Sample ttl ms.
    pub ttl_ms: u32,
    /// Newest samples considered.
    pub max_samples: u32,
    /// Warm-up population.
    pub min_samples: u32,
    /// Observed latency ms.
    pub observed_ms: u32,
}

/// View of a latency report PDU (wire.md §4).
#[derive(Clone, Copy, Debug)]
pub struct Report<'a> {
    pdu: &'a [u8],
    n: usize,
}

impl<'a> Report<'a> {
    /// Validates header and entry count.
    pub fn parse(pdu: &'a [u8]) -> Result<Self, PduError> {
        let body = body_of(pdu, PDU_REPORT)?;
        let n = usize::from(u16_at(body, 0));
        if body.len() < 4 + n * REPORT_ENTRY_LEN {
            return Err(PduError::Truncated);
        }
        Ok(Self { pdu, n })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.n
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Entry `i` (< len).
    pub fn entry(&self, i: usize) -> ReportItem {
        let b = &self.pdu[PDU_HEADER + 4 + i * REPORT_ENTRY_LEN..];
        ReportItem {
            tracker_id: id16(b),
            ttl_ms: u32_at(b, 16),
            max_samples: u32_at(b, 20),
            min_samples: u32_at(b, 24),
            observed_ms: u32_at(b, 28),
        }
    }
}

/// Writes a rate response PDU into `out` block by block.
pub struct ResponseWriter<'o> {
    out: &'o mut [u8],
    pos: usize,
    guards: u16,
    resources: u16,
}

impl<'o> ResponseWriter<'o> {
    /// Starts a response for up to `guards` guard and `resources` resource blocks.
    pub fn new(out: &'o mut [u8], guards: usize, resources: usize) -> Result<Self, PduError> {
        let need = PDU_HEADER + 4 + guards * GUARD_LEN + resources * RESOURCE_LEN;
        if out.len() < need {
            return Err(PduError::OutputTooSmall);
        }
        out[..PDU_HEADER + 4].fill(0);
        out[0..2].copy_from_slice(&PDU_RATE_RESPONSE.to_le_bytes());
        Ok(Self {
            out,
            pos: PDU_HEADER + 4,
            guards: 0,
            resources: 0,
        })
    }

    /// Appends a guard result (call all guards before any resource).
    pub fn guard(&mut self, g: &Guard, current_ms: u32) {
        let b = &mut self.out[self.pos..self.pos + GUARD_LEN];
        b[G_TRACKER..G_TRACKER + 16].copy_from_slice(&g.tracker_id);
        b[G_TTL..G_TTL + 4].copy_from_slice(&g.ttl_ms.to_le_bytes());
        b[G_MAX..G_MAX + 4].copy_from_slice(&g.max_samples.to_le_bytes());
        b[G_MIN..G_MIN + 4].copy_from_slice(&g.min_samples.to_le_bytes());
        b[G_THRESHOLD..G_THRESHOLD + 4].copy_from_slice(&g.threshold_ms.to_le_bytes());
        b[G_CURRENT..G_CURRENT + 4].copy_from_slice(&current_ms.to_le_bytes());
        self.pos += GUARD_LEN;
        self.guards += 1;
    }

    /// Appends a resource result.
    pub fn resource(&mut self, r: &Resource, actual_rate: u32, deficit: u16) {
        let b = &mut self.out[self.pos..self.pos + RESOURCE_LEN];
        b[R_BUCKET..R_BUCKET + 16].copy_from_slice(&r.bucket_id);
        b[R_WINDOW..R_WINDOW + 4].copy_from_slice(&r.window_ms.to_le_bytes());
        b[R_ACTUAL..R_ACTUAL + 4].copy_from_slice(&actual_rate.to_le_bytes());
        b[R_DEFICIT..R_DEFICIT + 2].copy_from_slice(&deficit.to_le_bytes());
        b[R_DEFICIT + 2..R_DEFICIT + 4].fill(0);
        self.pos += RESOURCE_LEN;
        self.resources += 1;
    }

    /// Writes counts and size; returns the PDU length.
    pub fn finish(self) -> usize {
        self.out[2..4].copy_from_slice(&(self.pos as u16).to_le_bytes());
        self.out[PDU_HEADER..PDU_HEADER + 2].copy_from_slice(&self.guards.to_le_bytes());
        self.out[PDU_HEADER + 2..PDU_HEADER + 4].copy_from_slice(&self.resources.to_le_bytes());
        self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR: &str = "525458003c000000010001006a17d07a424568304e50d28540f76e671027000064000000050000006400000000000000f5cf3ad8b8406854b596ba3614f16effe803000064000000010000004d4c0c000300617069000000";

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn parses_vector_request() {
        let pdu = unhex(VECTOR);
        let r = RateRequest::parse(&pdu).unwrap();
        assert_eq!(r.dedup_ttl_ms(), 60);
        assert_eq!((r.guard_count(), r.resource_count()), (1, 1));
        let g = r.guard(0);
        assert_eq!(
            (g.ttl_ms, g.max_samples, g.min_samples, g.threshold_ms),
            (10000, 100, 5, 100)
        );
        let res = r.resource(0);
        assert_eq!((res.window_ms, res.rate_limit, res.tokens), (1000, 100, 1));
        // every truncation is refused, never panics
        for n in 0..pdu.len() {
            assert!(RateRequest::parse(&pdu[..n]).is_err());
        }
    }

    #[test]
    fn writes_response() {
        let pdu = unhex(VECTOR);
        let r = RateRequest::parse(&pdu).unwrap();
        let mut out = [0u8; 200];
        let mut w = ResponseWriter::new(&mut out, 1, 1).unwrap();
        w.guard(&r.guard(0), 42);
        w.resource(&r.resource(0), 37, 0);
        let n = w.finish();
        assert_eq!(n, 12 + 36 + 28);
        assert_eq!(&out[..4], &[0x52, 0x52, 76, 0]);
        assert_eq!(u32_at(&out, 12 + 32), 42);
        assert_eq!(u32_at(&out, 12 + 36 + 20), 37);
    }
}
