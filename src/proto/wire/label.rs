//! Metrics-label TLV: type 0x4C4D · size u16 (multiple of 4) · length L u16 · L bytes of
//! UTF-8 · zero padding. An empty label is omitted entirely. Owns this layout only.

use super::{DropReason, EncodeError, TLV_HEADER_LEN, get_u16, put_u16, types};

/// Offset of the label length inside the TLV.
const OFF_LEN: usize = TLV_HEADER_LEN;
/// Offset of the label bytes inside the TLV.
const OFF_BYTES: usize = TLV_HEADER_LEN + 2;

/// Encoded TLV length of a label of `len` bytes (0 for the empty label), or `None` when
/// it does not fit a u16 size.
pub const fn label_tlv_len(len: usize) -> Option<usize> {
    if len == 0 {
        return Some(0);
    }
    let n = (OFF_BYTES + len + 3) & !3;
    if n > u16::MAX as usize { None } else { Some(n) }
}

/// Writes the TLV of `label` into `out` (nothing for the empty label); returns its length.
pub fn encode_label_tlv(out: &mut [u8], label: &str) -> Result<usize, EncodeError> {
    let len = label.len();
    let n = label_tlv_len(len).ok_or(EncodeError::LabelTooLong { len })?;
    if n == 0 {
        return Ok(0);
    }
    if out.len() < n {
        return Err(EncodeError::BufferTooSmall {
            needed: n,
            available: out.len(),
        });
    }
    put_u16(out, 0, types::LABEL);
    put_u16(out, 2, n as u16);
    put_u16(out, OFF_LEN, len as u16);
    out[OFF_BYTES..OFF_BYTES + len].copy_from_slice(label.as_bytes());
    out[OFF_BYTES + len..n].fill(0);
    Ok(n)
}

/// Parses a label TLV that must span exactly `tlv` (it ends the request body): type, size
/// equal to `tlv.len()` and to the padded length, zero padding, UTF-8. Returns the label.
pub fn decode_label_tlv(tlv: &[u8]) -> Result<&str, DropReason> {
    if tlv.len() < OFF_BYTES {
        return Err(DropReason::BadLabel);
    }
    if get_u16(tlv, 0) != types::LABEL || usize::from(get_u16(tlv, 2)) != tlv.len() {
        return Err(DropReason::BadLabel);
    }
    let len = usize::from(get_u16(tlv, OFF_LEN));
    if len == 0 && tlv.len() == 8 {
        // An empty label is normally omitted; accept its TLV as official encoders would write it.
        return if tlv[OFF_BYTES..].iter().all(|&b| b == 0) {
            Ok("")
        } else {
            Err(DropReason::BadLabel)
        };
    }
    if label_tlv_len(len) != Some(tlv.len()) {
        return Err(DropReason::BadLabel);
    }
    let (bytes, pad) = tlv[OFF_BYTES..].split_at(len);
    if pad.iter().any(|&b| b != 0) {
        return Err(DropReason::BadLabel);
    }
    std::str::from_utf8(bytes).map_err(|_| DropReason::BadLabel)
}
