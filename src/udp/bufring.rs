//! The io_uring backend's provided-buffer ring (`IORING_REGISTER_PBUF_RING`) and every
//! byte the kernel may write asynchronously: the receive buffers, the ring of their
//! addresses, the eventfd read's target and the receive template; and the parsing of a
//! filled buffer (`io_uring_recvmsg_out` header, source address, control messages,
//! payload) into datagrams for the caller.
//!
//! Owns: that memory, its sizes and the ring's tail. Must not touch: the submission and
//! completion queues (uring.rs), grouping (gso.rs). The memory is freed only once the
//! ring's requests are cancelled (uring.rs `shut_down`), and leaked where the kernel
//! does not confirm.

use std::io;
use std::mem::{size_of, zeroed};
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::IoUring;
use io_uring::types::BufRingEntry;

use super::gro::{self, CONTROL_LEN};
use super::shared::Common;
use super::socket::from_c_bytes;
use super::{GRO_BUFFER, IoConfig, IoEvent, SendQueue, SocketId};

/// Buffer group id of the receive buffers.
pub(crate) const BGID: u16 = 0;
/// Size of `io_uring_recvmsg_out` at the start of every receive buffer.
const RECVMSG_OUT: usize = 16;
/// Address room reserved per receive buffer.
const NAME_LEN: usize = size_of::<libc::sockaddr_storage>();

/// The mapping that holds the provided-buffer ring's entries (unmapped on drop).
struct RingMap {
    ptr: *mut BufRingEntry,
    bytes: usize,
}

// SAFETY: the mapping is private and anonymous, owned by this value alone; only the
// driver's thread writes it (`recycle`, `publish`) and only the kernel's side of the
// ring that this driver owns reads it. Moving the driver to another thread moves the
// sole owner of the pointer; nothing is left behind that another thread could reach.
unsafe impl Send for RingMap {}

impl Drop for RingMap {
    fn drop(&mut self) {
        // SAFETY: `ptr` was mapped with this length in `BufRing::new`, and the ring that
        // used it is gone (or never got it): `KernelMem` is leaked instead of dropped
        // while the kernel may still use it.
        unsafe { libc::munmap(self.ptr.cast(), self.bytes) };
    }
}

/// The `msghdr` template of the multishot receives: only its lengths matter (the
/// kernel lays out every buffer by them); its pointers stay null.
struct RecvTemplate(libc::msghdr);

// SAFETY: its pointers are null and never set; it is plain data.
unsafe impl Send for RecvTemplate {}

/// Memory the kernel reads or writes asynchronously.
pub(crate) struct KernelMem {
    ring: RingMap,
    bufs: Box<[u8]>,
    pub(crate) wake_buf: Box<u64>,
    recv_hdr: Box<RecvTemplate>,
}

impl KernelMem {
    /// The template every multishot receive of this ring lays its buffers out by.
    pub(crate) fn recv_template(&self) -> &libc::msghdr {
        &self.recv_hdr.0
    }
}

/// `len` zeroed bytes, every page of them resident now: the kernel fills the buffers
/// in ring order, so a lazily mapped allocation would grow the process's resident
/// memory for as long as traffic takes to reach the last buffer.
fn resident(len: usize) -> Box<[u8]> {
    let mut b = vec![0u8; len].into_boxed_slice();
    // the allocator may hand out zeroed pages it never touched: writing them (through
    // a reference the optimiser cannot see through) maps them
    std::hint::black_box(&mut b[..]).fill(0);
    b
}

/// The provided-buffer ring: the kernel's memory (None once leaked) and our tail.
pub(crate) struct BufRing {
    pub(crate) mem: Option<KernelMem>,
    buf_size: usize,
    mask: u16,
    tail: u16,
    /// Buffers were recycled since the last publication.
    dirty: bool,
}

impl BufRing {
    /// The buffers for `cfg` (one GRO run or one datagram each, with room for the
    /// header, address and control messages), registered with `ring` as group
    /// [`BGID`] and all handed to the kernel.
    pub(crate) fn new(cfg: &IoConfig, ring: &IoUring) -> io::Result<BufRing> {
        let payload = if cfg.gro {
            GRO_BUFFER
        } else {
            cfg.max_datagram
        };
        // With GRO every buffer holds a whole coalesced run (up to 64 KiB), but a peer
        // that answers one datagram at a time fills one buffer per datagram: half a
        // batch of buffers (128 for the engine's 256, 8 MiB) keeps the multishot
        // receive armed through the datagrams that arrive between two passes (a quarter
        // ran out and re-armed every few passes with 64 answers in flight).
        let count: usize = if cfg.gro {
            (cfg.batch / 2).next_power_of_two().clamp(16, 256)
        } else {
            (cfg.batch * 2).next_power_of_two().clamp(16, 4096)
        };
        let control = if cfg.gro { CONTROL_LEN } else { 0 };
        let buf_size = RECVMSG_OUT + NAME_LEN + control + payload;
        let page = 4096;
        let ring_bytes = (count * size_of::<BufRingEntry>()).div_ceil(page) * page;
        // SAFETY: anonymous private mapping; checked below.
        let ring_mem = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ring_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ring_mem == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: all-zero is a valid msghdr.
        let mut recv_hdr = Box::new(RecvTemplate(unsafe { zeroed() }));
        recv_hdr.0.msg_namelen = NAME_LEN as u32;
        recv_hdr.0.msg_controllen = control;
        let mem = KernelMem {
            ring: RingMap {
                ptr: ring_mem.cast(),
                bytes: ring_bytes,
            },
            bufs: resident(count * buf_size),
            wake_buf: Box::new(0),
            recv_hdr,
        };
        // SAFETY: the ring memory is page aligned, `count` entries long, and lives in
        // `mem` until the ring is gone (the backend's `shut_down`, or leaked).
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                mem.ring.ptr as u64,
                count as u16,
                BGID,
                0,
            )?;
        }
        let mut b = BufRing {
            mem: Some(mem),
            buf_size,
            mask: (count - 1) as u16,
            tail: 0,
            dirty: false,
        };
        for bid in 0..count {
            b.recycle(bid as u16);
        }
        b.publish();
        Ok(b)
    }

    /// Number of buffers.
    pub(crate) fn count(&self) -> usize {
        usize::from(self.mask) + 1
    }

    /// Puts buffer `bid` back at the ring's tail (published by [`publish`](Self::publish)).
    pub(crate) fn recycle(&mut self, bid: u16) {
        let Some(mem) = self.mem.as_mut() else { return };
        let addr = mem.bufs[bid as usize * self.buf_size..].as_mut_ptr() as u64;
        // SAFETY: the index is masked into the ring's entries; the kernel reads entries
        // only between its head and our published tail, and this one is past the tail.
        unsafe {
            let e = mem.ring.ptr.add((self.tail & self.mask) as usize);
            (*e).set_addr(addr);
            (*e).set_len(self.buf_size as u32);
            (*e).set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
        self.dirty = true;
    }

    /// Hands the recycled buffers to the kernel (when there are any).
    pub(crate) fn publish(&mut self) {
        let Some(mem) = self.mem.as_ref() else { return };
        if !std::mem::take(&mut self.dirty) {
            return;
        }
        // SAFETY: the tail field lives in the first ring entry, inside our mapping; the
        // kernel reads it concurrently, hence the atomic release store.
        unsafe {
            let tail = BufRingEntry::tail(mem.ring.ptr) as *mut u16;
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }

    /// Delivers the datagrams of buffer `bid`, which a receive on `id` filled with
    /// `len` bytes. Returns how many.
    pub(crate) fn deliver(
        &mut self,
        c: &mut Common,
        id: SocketId,
        bid: u16,
        len: usize,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let Some(mem) = self.mem.as_mut() else {
            return 0;
        };
        let at = bid as usize * self.buf_size;
        let buf = &mut mem.bufs[at..at + len.min(self.buf_size)];
        deliver(c, id, buf, &mem.recv_hdr.0, on_event)
    }
}

/// Parses one multishot receive buffer and hands its datagrams to the caller.
fn deliver(
    c: &mut Common,
    id: SocketId,
    buf: &mut [u8],
    hdr: &libc::msghdr,
    on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
) -> usize {
    let (from, seg, payload_len, truncated) = match io_uring::types::RecvMsgOut::parse(buf, hdr) {
        Ok(out) => (
            from_c_bytes(out.name_data()),
            gro::segment_size(out.control_data()),
            out.payload_data().len(),
            out.is_payload_truncated(),
        ),
        Err(()) => return 0,
    };
    if truncated {
        c.stats.recv_truncated += 1;
        return 0;
    }
    let Some(from) = from else { return 0 };
    let start = RECVMSG_OUT + hdr.msg_namelen as usize + hdr.msg_controllen;
    let Some(data) = buf.get_mut(start..start + payload_len) else {
        return 0;
    };
    c.deliver(id, from, data, seg, on_event)
}
