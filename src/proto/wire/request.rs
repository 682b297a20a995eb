//! Rate request PDU (0x5452): header word = dedup TTL; body = G u16 · R u16 · G guard
//! blocks (36) · R resource blocks (28) · optional metrics-label TLV ending the body.
//! Owns the request layout, its encoder and its view.

use super::blocks::{GuardSpec, GuardView, ResourceBlock, put_guard, put_resource};
use super::{Auth, label};
use super::{
    DropReason, EncodeError, GUARD_BLOCK_LEN, Opened, PDU_HEADER_LEN, RESOURCE_BLOCK_LEN,
    TenantFields, check_room, count_u16, get_u16, parse_pdu, put_pdu_header, put_u16, types,
};

/// Body offsets: counts.
pub(crate) mod body {
    pub const GUARDS: usize = 0;
    pub const RESOURCES: usize = 2;
    pub const BLOCKS: usize = 4;
}

/// A request resource block's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ResourceSpec {
    /// Bucket id.
    pub bucket_id: [u8; 16],
    /// Window in ms.
    pub window_ms: u32,
    /// Tokens per window.
    pub rate_limit: u32,
    /// Tokens requested (1..=65535 for valid requests).
    pub tokens: u16,
}

/// PDU length of a request with `guards`, `resources` and a label of `label_len` bytes, or
/// `None` when a count or the label does not fit its u16 field.
pub fn rate_request_pdu_len(guards: usize, resources: usize, label_len: usize) -> Option<usize> {
    if guards > usize::from(u16::MAX) || resources > usize::from(u16::MAX) {
        return None;
    }
    Some(
        PDU_HEADER_LEN
            + body::BLOCKS
            + guards * GUARD_BLOCK_LEN
            + resources * RESOURCE_BLOCK_LEN
            + label::label_tlv_len(label_len)?,
    )
}

/// Writes a rate request PDU of exact length into `out`; returns its length.
pub fn encode_rate_request_pdu(
    out: &mut [u8],
    dedup_ttl_ms: u32,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> Result<usize, EncodeError> {
    let g = count_u16(guards.len())?;
    let r = count_u16(resources.len())?;
    let label_len =
        label::label_tlv_len(label.len()).ok_or(EncodeError::LabelTooLong { len: label.len() })?;
    let blocks = PDU_HEADER_LEN + body::BLOCKS;
    let size =
        blocks + guards.len() * GUARD_BLOCK_LEN + resources.len() * RESOURCE_BLOCK_LEN + label_len;
    check_room(out, size)?;
    put_pdu_header(out, types::RATE_REQUEST, size, dedup_ttl_ms);
    put_u16(out, PDU_HEADER_LEN + body::GUARDS, g);
    put_u16(out, PDU_HEADER_LEN + body::RESOURCES, r);
    let mut at = blocks;
    for spec in guards {
        put_guard(&mut out[at..at + GUARD_BLOCK_LEN], spec);
        at += GUARD_BLOCK_LEN;
    }
    for spec in resources {
        put_resource(
            &mut out[at..at + RESOURCE_BLOCK_LEN],
            &spec.bucket_id,
            spec.window_ms,
            spec.rate_limit,
            spec.tokens,
        );
        at += RESOURCE_BLOCK_LEN;
    }
    at += label::encode_label_tlv(&mut out[at..size], label)?;
    debug_assert_eq!(at, size);
    Ok(size)
}

/// Encodes a rate request PDU at `out[auth.pdu_offset()..]` and seals the datagram.
/// Returns the datagram length.
#[allow(clippy::too_many_arguments)]
pub fn encode_request(
    auth: &Auth,
    tenant: &TenantFields,
    nonce: [u8; 12],
    out: &mut [u8],
    dedup_ttl_ms: u32,
    guards: &[GuardSpec],
    resources: &[ResourceSpec],
    label: &str,
) -> Result<usize, EncodeError> {
    let p = auth.pdu_offset();
    if out.len() < p {
        return Err(EncodeError::BufferTooSmall {
            needed: p,
            available: out.len(),
        });
    }
    let end = out.len().min(super::MAX_DATAGRAM);
    let pdu_len = encode_rate_request_pdu(&mut out[p..end], dedup_ttl_ms, guards, resources, label)
        .map_err(|e| shift(e, p))?;
    super::seal(auth, tenant, nonce, out, pdu_len)
}

/// Turns a PDU-relative size error into a datagram-relative one.
pub(crate) fn shift(e: EncodeError, p: usize) -> EncodeError {
    match e {
        EncodeError::TooLarge { needed, max } => EncodeError::TooLarge {
            needed: needed + p,
            max,
        },
        EncodeError::BufferTooSmall { needed, available } => {
            if needed + p > super::MAX_DATAGRAM {
                EncodeError::TooLarge {
                    needed: needed + p,
                    max: super::MAX_DATAGRAM,
                }
            } else {
                EncodeError::BufferTooSmall {
                    needed: needed + p,
                    available: available + p,
                }
            }
        }
        other => other,
    }
}

/// A request resource block (its bytes read by the block reader the response shares).
#[derive(Clone, Copy, Debug)]
pub struct ResourceView<'a> {
    b: ResourceBlock<'a>,
}

impl<'a> ResourceView<'a> {
    /// Bucket id.
    pub fn bucket_id(&self) -> [u8; 16] {
        self.b.bucket_id()
    }
    /// Window in ms.
    pub fn window_ms(&self) -> u32 {
        self.b.window_ms()
    }
    /// Tokens per window.
    pub fn rate_limit(&self) -> u32 {
        self.b.rate()
    }
    /// Tokens requested.
    pub fn tokens(&self) -> u16 {
        self.b.tokens()
    }
    /// The values, copied out.
    pub fn spec(&self) -> ResourceSpec {
        ResourceSpec {
            bucket_id: self.bucket_id(),
            window_ms: self.window_ms(),
            rate_limit: self.rate_limit(),
            tokens: self.tokens(),
        }
    }
}

/// A validated rate request PDU.
#[derive(Clone, Copy, Debug)]
pub struct RateRequestView<'a> {
    dedup_ttl_ms: u32,
    guards: &'a [u8],
    resources: &'a [u8],
    label: Option<&'a str>,
}

impl<'a> RateRequestView<'a> {
    /// Validates type, size (within `pdu`; later bytes ignored), body >= 4, all declared
    /// blocks present, and that whatever follows them is one well-formed label TLV ending
    /// exactly at the end of the body.
    pub fn parse(pdu: &'a [u8]) -> Result<RateRequestView<'a>, DropReason> {
        let (dedup_ttl_ms, body) = parse_pdu(pdu, types::RATE_REQUEST)?;
        let g = usize::from(get_u16(body, body::GUARDS));
        let r = usize::from(get_u16(body, body::RESOURCES));
        let gl = g * GUARD_BLOCK_LEN;
        let rl = r * RESOURCE_BLOCK_LEN;
        let rest = &body[body::BLOCKS..];
        if rest.len() < gl + rl {
            return Err(DropReason::MissingBlocks);
        }
        let (guards, rest) = rest.split_at(gl);
        let (resources, rest) = rest.split_at(rl);
        let label = if rest.is_empty() {
            None
        } else {
            Some(label::decode_label_tlv(rest)?)
        };
        Ok(RateRequestView {
            dedup_ttl_ms,
            guards,
            resources,
            label,
        })
    }

    /// Parses an opened datagram's PDU.
    pub fn from_opened(o: &Opened<'a>) -> Result<RateRequestView<'a>, DropReason> {
        Self::parse(o.pdu)
    }

    /// The dedup TTL (the client's horizon).
    pub fn dedup_ttl_ms(&self) -> u32 {
        self.dedup_ttl_ms
    }
    /// Number of guard blocks.
    pub fn guard_count(&self) -> usize {
        self.guards.len() / GUARD_BLOCK_LEN
    }
    /// Number of resource blocks.
    pub fn resource_count(&self) -> usize {
        self.resources.len() / RESOURCE_BLOCK_LEN
    }
    /// The guard blocks, in order.
    pub fn guards(&self) -> impl ExactSizeIterator<Item = GuardView<'a>> + Clone + 'a {
        self.guards
            .chunks_exact(GUARD_BLOCK_LEN)
            .map(GuardView::new)
    }
    /// The resource blocks, in order.
    pub fn resources(&self) -> impl ExactSizeIterator<Item = ResourceView<'a>> + Clone + 'a {
        self.resources
            .chunks_exact(RESOURCE_BLOCK_LEN)
            .map(|b| ResourceView {
                b: ResourceBlock::new(b),
            })
    }
    /// The label bytes, if a label TLV is present (always valid UTF-8).
    pub fn label(&self) -> Option<&'a [u8]> {
        self.label.map(str::as_bytes)
    }
    /// The label, if present.
    pub fn label_str(&self) -> Option<&'a str> {
        self.label
    }
}
