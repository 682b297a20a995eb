//! Rate response PDU (0x5252): body = G u16 · R u16 · G guard result blocks (36) · R
//! resource result blocks (28: id, window echo, actual_rate at +20, deficit u16 at +24).
//! Bytes after the declared blocks are ignored. Owns the response layout, its encoder and
//! its view; the grant rule itself is stated once, in blocks.rs.

use super::blocks::{GuardSpec, GuardView, ResourceBlock, grants, put_guard, put_resource};
use super::{
    Auth, DropReason, EncodeError, GUARD_BLOCK_LEN, Opened, PDU_HEADER_LEN, RESOURCE_BLOCK_LEN,
    TenantView, check_room, count_u16, get_u16, open, open_at, parse_pdu, put_pdu_header, put_u16,
    types,
};

/// Body offsets: counts, then blocks.
const OFF_G: usize = 0;
const OFF_R: usize = 2;
const OFF_BLOCKS: usize = 4;

/// A resource result block's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResourceResultSpec {
    /// Bucket id.
    pub bucket_id: [u8; 16],
    /// Window echo.
    pub window_ms: u32,
    /// Tokens already consumed in the bucket's window.
    pub actual_rate: u32,
    /// 0 if the tokens were available, else the shortfall.
    pub deficit: u16,
}

/// PDU length of a response with the given counts.
pub const fn rate_response_pdu_len(guards: usize, resources: usize) -> usize {
    PDU_HEADER_LEN + OFF_BLOCKS + guards * GUARD_BLOCK_LEN + resources * RESOURCE_BLOCK_LEN
}

/// Writes a rate response PDU of exact length into `out`; returns its length.
pub fn encode_rate_response_pdu(
    out: &mut [u8],
    guards: &[GuardSpec],
    resources: &[ResourceResultSpec],
) -> Result<usize, EncodeError> {
    let g = count_u16(guards.len())?;
    let r = count_u16(resources.len())?;
    let size = rate_response_pdu_len(guards.len(), resources.len());
    check_room(out, size)?;
    put_pdu_header(out, types::RATE_RESPONSE, size, 0);
    put_u16(out, PDU_HEADER_LEN + OFF_G, g);
    put_u16(out, PDU_HEADER_LEN + OFF_R, r);
    let mut at = PDU_HEADER_LEN + OFF_BLOCKS;
    for spec in guards {
        put_guard(&mut out[at..at + GUARD_BLOCK_LEN], spec);
        at += GUARD_BLOCK_LEN;
    }
    for spec in resources {
        put_resource(
            &mut out[at..at + RESOURCE_BLOCK_LEN],
            &spec.bucket_id,
            spec.window_ms,
            spec.actual_rate,
            spec.deficit,
        );
        at += RESOURCE_BLOCK_LEN;
    }
    Ok(size)
}

/// A resource result block (its bytes read by the block reader the request shares).
#[derive(Clone, Copy, Debug)]
pub struct ResourceResultView<'a> {
    b: ResourceBlock<'a>,
}

impl<'a> ResourceResultView<'a> {
    /// Bucket id.
    pub fn bucket_id(&self) -> [u8; 16] {
        self.b.bucket_id()
    }
    /// Window echo.
    pub fn window_ms(&self) -> u32 {
        self.b.window_ms()
    }
    /// Tokens already consumed in the window.
    pub fn actual_rate(&self) -> u32 {
        self.b.rate()
    }
    /// Shortfall (0 = available).
    pub fn deficit(&self) -> u16 {
        self.b.tokens()
    }
    /// The values, copied out.
    pub fn spec(&self) -> ResourceResultSpec {
        ResourceResultSpec {
            bucket_id: self.bucket_id(),
            window_ms: self.window_ms(),
            actual_rate: self.actual_rate(),
            deficit: self.deficit(),
        }
    }
}

/// The checks of a received rate response after its tenant TLV routed it, in order: the
/// auth TLV (in aes mode the tag is verified and the PDU decrypted in place; the PDU bytes
/// of a datagram whose tag fails are wiped), then the rate response PDU. Every driver of the
/// request machine runs this one sequence (the engine's core state; rlctl's traced
/// request), then gives the machine the tenant's server id and steering byte.
pub fn open_response<'a>(
    auth: &Auth,
    datagram: &'a mut [u8],
) -> Result<(TenantView<'a>, RateResponseView<'a>), DropReason> {
    let opened = open(auth, datagram)?;
    let response = RateResponseView::parse(opened.pdu)?;
    Ok((opened.tenant, response))
}

/// [`open_response`] of a datagram whose tenant TLV of `tenant_size` bytes its caller
/// already validated with [`TenantView::parse`] (the engine's core, which routes by it).
pub(crate) fn open_response_at<'a>(
    auth: &Auth,
    datagram: &'a mut [u8],
    tenant_size: usize,
) -> Result<(TenantView<'a>, RateResponseView<'a>), DropReason> {
    let opened = open_at(auth, datagram, tenant_size)?;
    let response = RateResponseView::parse(opened.pdu)?;
    Ok((opened.tenant, response))
}

/// A validated rate response PDU.
#[derive(Clone, Copy, Debug)]
pub struct RateResponseView<'a> {
    guards: &'a [u8],
    resources: &'a [u8],
}

impl<'a> RateResponseView<'a> {
    /// Validates type, size (within `pdu`; later bytes ignored), body >= 4 and that all
    /// declared blocks are present; bytes after them are ignored.
    pub fn parse(pdu: &'a [u8]) -> Result<RateResponseView<'a>, DropReason> {
        let (_zero, body) = parse_pdu(pdu, types::RATE_RESPONSE)?;
        let gl = usize::from(get_u16(body, OFF_G)) * GUARD_BLOCK_LEN;
        let rl = usize::from(get_u16(body, OFF_R)) * RESOURCE_BLOCK_LEN;
        let rest = &body[OFF_BLOCKS..];
        if rest.len() < gl + rl {
            return Err(DropReason::MissingBlocks);
        }
        Ok(RateResponseView {
            guards: &rest[..gl],
            resources: &rest[gl..gl + rl],
        })
    }

    /// Parses an opened datagram's PDU.
    pub fn from_opened(o: &Opened<'a>) -> Result<RateResponseView<'a>, DropReason> {
        Self::parse(o.pdu)
    }

    /// Number of guard results.
    pub fn guard_count(&self) -> usize {
        self.guards.len() / GUARD_BLOCK_LEN
    }
    /// Number of resource results.
    pub fn resource_count(&self) -> usize {
        self.resources.len() / RESOURCE_BLOCK_LEN
    }
    /// Guard results, in the server's order.
    pub fn guards(&self) -> impl ExactSizeIterator<Item = GuardView<'a>> + Clone + 'a {
        self.guards
            .chunks_exact(GUARD_BLOCK_LEN)
            .map(GuardView::new)
    }
    /// Resource results, in the server's order.
    pub fn resources(&self) -> impl ExactSizeIterator<Item = ResourceResultView<'a>> + Clone + 'a {
        self.resources
            .chunks_exact(RESOURCE_BLOCK_LEN)
            .map(|b| ResourceResultView {
                b: ResourceBlock::new(b),
            })
    }
    /// Grant exactly when every guard passed (current < threshold) and every deficit is 0.
    /// Zero entries = grant.
    pub fn is_grant(&self) -> bool {
        grants(
            self.guards().map(|g| g.passed()),
            self.resources().map(|r| r.deficit()),
        )
    }
}
