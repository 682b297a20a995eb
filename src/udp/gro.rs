//! GRO receive: finding the `UDP_GRO` segment size in a received buffer's control
//! messages (the split of the buffer into its datagrams is `Common::deliver`'s, in
//! shared.rs).
//!
//! Owns: parsing control-message bytes (as the kernel wrote them, any alignment). Must
//! not touch: system calls, buffers' ownership.

use std::mem::size_of;

/// Bytes of the control buffer reserved per received message: room for the `UDP_GRO`
/// message (`CMSG_SPACE(sizeof(int))` = 24 on 64-bit Linux) with slack.
pub(crate) const CONTROL_LEN: usize = 64;

/// The segment size the kernel reported with `UDP_GRO` in `control` (the bytes of a
/// `msg_control` buffer), if any.
pub(crate) fn segment_size(control: &[u8]) -> Option<usize> {
    let hdr = size_of::<libc::cmsghdr>();
    let mut at = 0usize;
    while at + hdr <= control.len() {
        // SAFETY: `hdr` bytes are in range; read_unaligned copes with any alignment.
        let c: libc::cmsghdr = unsafe { std::ptr::read_unaligned(control[at..].as_ptr().cast()) };
        let len = c.cmsg_len as usize;
        if len < hdr || at + len > control.len() {
            return None;
        }
        if c.cmsg_level == libc::SOL_UDP && c.cmsg_type == libc::UDP_GRO {
            let data = &control[at + hdr..at + len];
            // the kernel writes an int; accept a u16 too
            return match data.len() {
                n if n >= 4 => {
                    Some(i32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize)
                }
                n if n >= 2 => Some(u16::from_ne_bytes([data[0], data[1]]) as usize),
                _ => None,
            }
            .filter(|&s| s > 0);
        }
        // next header: CMSG_ALIGN(len)
        let step = (len + size_of::<usize>() - 1) & !(size_of::<usize>() - 1);
        at += step;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmsg(level: i32, ty: i32, val: i32) -> Vec<u8> {
        let mut b = vec![0u8; 24];
        let len = (size_of::<libc::cmsghdr>() + 4) as u64;
        b[..8].copy_from_slice(&len.to_ne_bytes());
        b[8..12].copy_from_slice(&level.to_ne_bytes());
        b[12..16].copy_from_slice(&ty.to_ne_bytes());
        b[16..20].copy_from_slice(&val.to_ne_bytes());
        b
    }

    #[test]
    fn finds_the_gro_size() {
        let mut c = cmsg(libc::SOL_SOCKET, 99, 7);
        c.extend(cmsg(libc::SOL_UDP, libc::UDP_GRO, 200));
        assert_eq!(segment_size(&c), Some(200));
        assert_eq!(segment_size(&c[..30]), None);
        assert_eq!(segment_size(&[]), None);
    }

    #[test]
    fn garbage_control_never_panics() {
        for n in 0..64 {
            let c: Vec<u8> = (0..n).map(|i| (i * 37 % 251) as u8).collect();
            let _ = segment_size(&c);
        }
        let mut c = cmsg(libc::SOL_UDP, libc::UDP_GRO, 0);
        assert_eq!(segment_size(&c), None);
        c[0] = 0xFF; // absurd length
        assert_eq!(segment_size(&c), None);
    }
}
