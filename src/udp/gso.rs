//! The send arena and GSO grouping shared by both backends.
//!
//! Owns: the fixed send arena (one slot of `max_datagram` bytes per queued datagram,
//! allocated once), the queue order, the grouping of queued datagrams by (socket,
//! destination, length) into GSO super-buffers (at most [`GSO_MAX_SEGMENTS`] segments and
//! [`GSO_MAX_BYTES`] bytes; a group may end in one shorter datagram; groups leave in the
//! order their (socket, destination) pair was first queued, so the caller decides which
//! destination hears first), the message headers
//! (`mmsghdr` + iovecs + destination + `UDP_SEGMENT` control message) of each group, and
//! the bookkeeping of what became of each group. Must not touch: system calls (the
//! backends send the groups and report each group's outcome here).

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::RawFd;

use super::socket::to_c;
use super::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS, IoStats, SocketId};

/// (socket, destination) pairs a build orders by first appearance; beyond them, by
/// address, so the linear search per datagram stays short when a responder answers
/// many clients at once.
const RANKED_FLOWS: usize = 16;

// A rank (0..=RANKED_FLOWS, the last one for every pair past them) fits a byte.
const _: () = assert!(RANKED_FLOWS < u8::MAX as usize);

/// One GSO group (or a single datagram) built for sending.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Group {
    pub(crate) sock: SocketId,
    /// The socket's descriptor when the group was built (open then: `build` fails the
    /// datagrams of closed sockets).
    pub(crate) fd: RawFd,
    /// Segment size (length of the group's first datagram).
    pub(crate) seg: u32,
    /// First entry in the group's slot list.
    pub(crate) start: u32,
    /// Datagrams in the group.
    pub(crate) count: u32,
    /// Payload bytes of the group.
    pub(crate) bytes: u32,
    /// The group's first datagram: set while a group ends in a shorter one.
    closed: bool,
    dest: SocketAddr,
}

/// What became of a group handed to the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GroupResult {
    /// Sent.
    Sent,
    /// Not sent; queue its datagrams again. `eagain`: the socket buffer was full (they
    /// become the first to be dropped when the queue overflows).
    Retry { eagain: bool },
    /// Not sent; report every datagram as failed.
    Failed(io::ErrorKind),
}

/// Where each socket stands for grouping: `None` = closed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SockInfo {
    pub(crate) v6: bool,
    pub(crate) gso: bool,
    /// The socket's descriptor (what a group built for it is sent on).
    pub(crate) fd: RawFd,
}

/// `n` message headers with their iovecs (zeroed: null pointers, zero lengths), as
/// `sendmmsg`, `recvmmsg` and io_uring's `SENDMSG` read them.
pub(crate) struct MsgHeaders {
    pub(crate) hdrs: Box<[libc::mmsghdr]>,
    pub(crate) iovs: Box<[libc::iovec]>,
}

// SAFETY: the raw pointers in these C structs are never dereferenced by Rust code; the
// kernel follows them during a system call of the owning driver's thread (or, for an
// io_uring SQE, until its completion; see uring.rs `push`). Each owner (`SendQueue`,
// mmsg.rs `RecvBufs`) points them only into heap buffers it owns itself, which move
// with it, and rewrites them before each use, so moving the owner to another thread
// moves everything they reach and leaves nothing behind that another thread could touch.
unsafe impl Send for MsgHeaders {}

impl MsgHeaders {
    pub(crate) fn new(n: usize) -> MsgHeaders {
        MsgHeaders {
            // SAFETY: all-zero is a valid mmsghdr (null pointers, zero lengths).
            hdrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            iovs: (0..n)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
        }
    }
}

/// The queue of datagrams waiting to be sent (see the `udp` module docs for its bound).
/// Handed to `UdpIo::run_once`'s callback so replies can be queued while events are
/// being handled.
pub struct SendQueue {
    slot_size: usize,
    data: Box<[u8]>,
    lens: Box<[u32]>,
    socks: Box<[SocketId]>,
    dests: Box<[SocketAddr]>,
    tags: Box<[u64]>,
    retried: Box<[bool]>,
    free: Vec<u32>,
    pending: Vec<u32>,
    failures: VecDeque<(u64, io::ErrorKind)>,
    /// Per build, by position queued: the rank of the datagram's (socket, destination)
    /// pair.
    ranks: Vec<u8>,
    /// Per build: (position queued, slot) in sending order.
    order: Vec<(u32, u32)>,
    /// Per build: the (socket, destination) pairs in the order first queued.
    flows: Vec<(SocketId, SocketAddr)>,
    groups: Vec<Group>,
    group_slots: Vec<u32>,
    /// Per group: its header and, per datagram of the built groups, an iovec.
    msgs: MsgHeaders,
    addrs: Box<[libc::sockaddr_storage]>,
    ctrl: Box<[[u64; 4]]>,
}

impl std::fmt::Debug for SendQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendQueue")
            .field("queued", &self.pending.len())
            .field("in_flight", &self.group_slots.len())
            .field("capacity", &self.lens.len())
            .finish()
    }
}

impl SendQueue {
    pub(crate) fn new(capacity: usize, slot_size: usize) -> SendQueue {
        let n = capacity.max(1);
        SendQueue {
            slot_size,
            data: vec![0u8; n * slot_size].into_boxed_slice(),
            lens: vec![0; n].into_boxed_slice(),
            socks: vec![SocketId::from_raw(0); n].into_boxed_slice(),
            dests: vec![SocketAddr::from(([0, 0, 0, 0], 0)); n].into_boxed_slice(),
            tags: vec![0; n].into_boxed_slice(),
            retried: vec![false; n].into_boxed_slice(),
            free: (0..n as u32).rev().collect(),
            pending: Vec::with_capacity(n),
            failures: VecDeque::with_capacity(n),
            ranks: Vec::with_capacity(n),
            order: Vec::with_capacity(n),
            flows: Vec::with_capacity(RANKED_FLOWS),
            groups: Vec::with_capacity(n),
            group_slots: Vec::with_capacity(n),
            msgs: MsgHeaders::new(n),
            // SAFETY: all-zero is a valid (unspecified-family) sockaddr_storage.
            addrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![[0u64; 4]; n].into_boxed_slice(),
        }
    }

    /// Queues a copy of `bytes` for `to` on `sock` (see `UdpIo::queue_send`).
    pub fn push(&mut self, sock: SocketId, to: SocketAddr, bytes: &[u8], tag: u64) -> bool {
        if bytes.len() > self.slot_size {
            return false;
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None => match self.evict_retried() {
                Some(s) => s,
                None => return false,
            },
        } as usize;
        let at = slot * self.slot_size;
        self.data[at..at + bytes.len()].copy_from_slice(bytes);
        self.lens[slot] = bytes.len() as u32;
        self.socks[slot] = sock;
        self.dests[slot] = to;
        self.tags[slot] = tag;
        self.retried[slot] = false;
        self.pending.push(slot as u32);
        true
    }

    /// Drops the oldest queued datagram that already met EAGAIN (reported as
    /// `WouldBlock`); returns its slot.
    fn evict_retried(&mut self) -> Option<u32> {
        let pos = self
            .pending
            .iter()
            .position(|&s| self.retried[s as usize])?;
        let slot = self.pending.remove(pos);
        self.failures
            .push_back((self.tags[slot as usize], io::ErrorKind::WouldBlock));
        Some(slot)
    }

    /// Datagrams waiting to be sent (not counting those the kernel has now).
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// True when nothing waits to be sent.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Most datagrams the queue holds.
    pub fn capacity(&self) -> usize {
        self.lens.len()
    }

    /// Largest datagram accepted by [`push`](Self::push).
    pub fn max_datagram(&self) -> usize {
        self.slot_size
    }

    /// True when a fresh datagram would find no free slot.
    pub fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    pub(crate) fn take_failure(&mut self) -> Option<(u64, io::ErrorKind)> {
        self.failures.pop_front()
    }

    pub(crate) fn has_failures(&self) -> bool {
        !self.failures.is_empty()
    }

    /// Fails every queued datagram of `sock` (closed) with `NotConnected`.
    pub(crate) fn fail_socket(&mut self, sock: SocketId) {
        let mut i = 0;
        while i < self.pending.len() {
            let s = self.pending[i] as usize;
            if self.socks[s] == sock {
                self.pending.remove(i);
                self.failures
                    .push_back((self.tags[s], io::ErrorKind::NotConnected));
                self.free.push(s as u32);
            } else {
                i += 1;
            }
        }
    }

    /// True while groups are built and not yet finished.
    #[cfg(feature = "io-uring")]
    pub(crate) fn in_flight(&self) -> bool {
        !self.groups.is_empty()
    }

    /// Groups the queued datagrams for sending (`info` tells each socket's family and
    /// whether it may use GSO; datagrams of closed sockets fail here) and builds their
    /// message headers. Returns the number of groups. Only while none is in flight; the
    /// groups of the last build (every one finished) are forgotten first.
    ///
    /// Groups go out in the order their (socket, destination) pair was first queued
    /// (past [`RANKED_FLOWS`] pairs, the rest follow in address order); within a pair,
    /// longest datagrams first, then in queue order.
    pub(crate) fn build(&mut self, mut info: impl FnMut(SocketId) -> Option<SockInfo>) -> usize {
        self.clear_groups();
        self.order_pending();
        let mut cur_info: Option<(SocketId, Option<SockInfo>)> = None;
        for k in 0..self.order.len() {
            let slot = self.order[k].1 as usize;
            let sock = self.socks[slot];
            let si = match cur_info {
                Some((s, i)) if s == sock => i,
                _ => {
                    let i = info(sock);
                    cur_info = Some((sock, i));
                    i
                }
            };
            let Some(si) = si else {
                self.failures
                    .push_back((self.tags[slot], io::ErrorKind::NotConnected));
                self.free.push(slot as u32);
                continue;
            };
            let len = self.lens[slot];
            let dest = self.dests[slot];
            let joins = si.gso
                && self.groups.last().is_some_and(|g| {
                    g.sock == sock
                        && g.dest == dest
                        && !g.closed
                        && (g.count as usize) < GSO_MAX_SEGMENTS
                        && (g.bytes + len) as usize <= GSO_MAX_BYTES
                        && len <= g.seg
                        && len > 0
                });
            if joins {
                let g = self.groups.last_mut().expect("checked above");
                g.count += 1;
                g.bytes += len;
                g.closed = len < g.seg;
            } else {
                self.groups.push(Group {
                    sock,
                    fd: si.fd,
                    seg: len,
                    start: self.group_slots.len() as u32,
                    count: 1,
                    bytes: len,
                    closed: false,
                    dest,
                });
            }
            self.group_slots.push(slot as u32);
        }
        for g in 0..self.groups.len() {
            let grp = self.groups[g];
            let v6 = info(grp.sock).is_some_and(|i| i.v6);
            self.build_header(g, &grp, v6);
        }
        self.groups.len()
    }

    /// Moves the pending datagrams into `order` in sending order (see [`Self::build`]):
    /// a counting sort by the rank of their (socket, destination) pair, O(n) unless a
    /// pair's lengths differ or more than [`RANKED_FLOWS`] pairs are queued.
    fn order_pending(&mut self) {
        // A counting sort by rank: each datagram's rank first, counting each rank's
        // datagrams and noting whether a ranked pair's lengths differ.
        self.ranks.clear();
        self.flows.clear();
        let mut bounds = [0u32; RANKED_FLOWS + 2];
        let mut first_len = [0u32; RANKED_FLOWS];
        let mut mixed = [false; RANKED_FLOWS];
        for &slot in &self.pending {
            let s = slot as usize;
            let (flow, len) = ((self.socks[s], self.dests[s]), self.lens[s]);
            let rank = match self.flows.iter().position(|f| *f == flow) {
                Some(i) => {
                    mixed[i] |= len != first_len[i];
                    i
                }
                None if self.flows.len() < RANKED_FLOWS => {
                    first_len[self.flows.len()] = len;
                    self.flows.push(flow);
                    self.flows.len() - 1
                }
                None => RANKED_FLOWS,
            };
            self.ranks.push(rank as u8);
            bounds[rank + 1] += 1;
        }
        // bounds[r]..bounds[r + 1]: where rank r's datagrams go
        for r in 1..bounds.len() {
            bounds[r] += bounds[r - 1];
        }
        // placed in queue order, so each rank's run is in queue order
        let mut next = bounds;
        self.order.clear();
        self.order.resize(self.pending.len(), (0, 0));
        for (pos, (&slot, &rank)) in self.pending.iter().zip(&self.ranks).enumerate() {
            let at = &mut next[rank as usize];
            self.order[*at as usize] = (pos as u32, slot);
            *at += 1;
        }
        self.pending.clear();
        {
            let (socks, dests, lens) = (&self.socks, &self.dests, &self.lens);
            let run = |r: usize| bounds[r] as usize..bounds[r + 1] as usize;
            // within a ranked pair: longest first, then in queue order (a run of equal
            // lengths is already in order)
            for r in (0..self.flows.len()).filter(|&r| mixed[r]) {
                self.order[run(r)]
                    .sort_unstable_by_key(|&(pos, slot)| (Reverse(lens[slot as usize]), pos));
            }
            // past the ranked pairs: by address, then as within a pair
            self.order[run(RANKED_FLOWS)].sort_unstable_by(|&(p, x), &(q, y)| {
                let (x, y) = (x as usize, y as usize);
                socks[x]
                    .cmp(&socks[y])
                    .then_with(|| dests[x].cmp(&dests[y]))
                    .then_with(|| Reverse(lens[x]).cmp(&Reverse(lens[y])))
                    .then_with(|| p.cmp(&q))
            });
        }
    }

    fn build_header(&mut self, g: usize, grp: &Group, v6: bool) {
        let start = grp.start as usize;
        for i in 0..grp.count as usize {
            let slot = self.group_slots[start + i] as usize;
            self.msgs.iovs[start + i] = libc::iovec {
                iov_base: self.data[slot * self.slot_size..].as_mut_ptr().cast(),
                iov_len: self.lens[slot] as usize,
            };
        }
        let addr_len = to_c(grp.dest, v6, &mut self.addrs[g]);
        let h = &mut self.msgs.hdrs[g];
        h.msg_len = 0;
        let m = &mut h.msg_hdr;
        m.msg_name = (&mut self.addrs[g] as *mut libc::sockaddr_storage).cast();
        m.msg_namelen = addr_len;
        m.msg_iov = &mut self.msgs.iovs[start];
        m.msg_iovlen = grp.count as usize;
        m.msg_flags = 0;
        if grp.count > 1 {
            m.msg_control = self.ctrl[g].as_mut_ptr().cast();
            // SAFETY: CMSG_* compute sizes and pointers inside the 32-byte, 8-aligned
            // control buffer of this group, which fits CMSG_SPACE(2).
            unsafe {
                m.msg_controllen = libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                let c = libc::CMSG_FIRSTHDR(m);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), grp.seg as u16);
            }
        } else {
            m.msg_control = std::ptr::null_mut();
            m.msg_controllen = 0;
        }
    }

    /// Number of groups built.
    #[cfg(feature = "io-uring")]
    pub(crate) fn group_count(&self) -> usize {
        self.groups.len()
    }

    pub(crate) fn group(&self, g: usize) -> Group {
        self.groups[g]
    }

    /// The message headers of groups `g..` (contiguous, for `sendmmsg`).
    pub(crate) fn hdrs_from(&mut self, g: usize) -> *mut libc::mmsghdr {
        self.msgs.hdrs[g..].as_mut_ptr()
    }

    /// The message header of group `g` (stable until [`clear_groups`](Self::clear_groups)).
    #[cfg(feature = "io-uring")]
    pub(crate) fn msghdr(&self, g: usize) -> *const libc::msghdr {
        &self.msgs.hdrs[g].msg_hdr
    }

    /// Records what became of group `g`.
    pub(crate) fn finish(&mut self, g: usize, outcome: GroupResult) {
        let grp = self.groups[g];
        let slots = grp.start as usize..(grp.start + grp.count) as usize;
        for i in slots {
            let slot = self.group_slots[i];
            match outcome {
                GroupResult::Sent => self.free.push(slot),
                GroupResult::Retry { eagain } => {
                    self.retried[slot as usize] |= eagain;
                    self.pending.push(slot);
                }
                GroupResult::Failed(kind) => {
                    self.failures.push_back((self.tags[slot as usize], kind));
                    self.free.push(slot);
                }
            }
        }
    }

    /// Group `g` went to the kernel whole: counted in `stats`, its slots freed.
    pub(crate) fn sent(&mut self, g: usize, stats: &mut IoStats) {
        stats.count_send_op(self.groups[g].count as usize);
        self.finish(g, GroupResult::Sent);
    }

    /// Forgets the built groups (every one must have been finished).
    pub(crate) fn clear_groups(&mut self) {
        self.groups.clear();
        self.group_slots.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn info(_: SocketId) -> Option<SockInfo> {
        Some(SockInfo {
            v6: false,
            gso: true,
            fd: -1,
        })
    }

    #[test]
    fn groups_by_socket_destination_and_length() {
        let mut q = SendQueue::new(512, 2048);
        let s0 = SocketId::from_raw(0);
        let s1 = SocketId::from_raw(1);
        // 130 equal datagrams to one destination: 64 + 64 + 2
        for i in 0..130 {
            assert!(q.push(s0, a(1), &[1; 200], i));
        }
        // a longer one starts the first group and takes one 200 as its shorter end;
        // a shorter one ends the last 200 group
        assert!(q.push(s0, a(1), &[2; 100], 1000));
        assert!(q.push(s0, a(1), &[3; 300], 1001));
        // other destination, other socket
        assert!(q.push(s0, a(2), &[4; 200], 1002));
        assert!(q.push(s1, a(1), &[5; 200], 1003));
        let n = q.build(info);
        let groups: Vec<(u32, u32, u32)> = (0..n)
            .map(|g| {
                let x = q.group(g);
                (x.sock.raw(), x.count, x.seg)
            })
            .collect();
        assert_eq!(
            groups,
            vec![
                (0, 2, 300),
                (0, 64, 200),
                (0, 64, 200),
                (0, 2, 200),
                (0, 1, 200),
                (1, 1, 200)
            ]
        );
        for g in 0..n {
            q.finish(g, GroupResult::Sent);
        }
        q.clear_groups();
        assert!(q.is_empty());
        assert_eq!(q.free.len(), 512);
    }

    #[test]
    fn groups_leave_in_the_order_their_destination_was_first_queued() {
        let mut q = SendQueue::new(256, 2048);
        // interleaved, the higher address first: its group leaves first
        for i in 0..6 {
            assert!(q.push(
                SocketId::from_raw(0),
                a(9 - (i % 2) as u16 * 8),
                &[0; 100],
                i
            ));
        }
        // past RANKED_FLOWS pairs, the rest follow in address order
        for p in 0..RANKED_FLOWS as u16 + 3 {
            assert!(q.push(
                SocketId::from_raw(0),
                a(1000 - p),
                &[0; 100],
                100 + u64::from(p)
            ));
        }
        let n = q.build(info);
        let dests: Vec<u16> = (0..n).map(|g| q.group(g).dest.port()).collect();
        let mut want = vec![9, 1];
        want.extend((0..RANKED_FLOWS as u16 - 2).map(|p| 1000 - p));
        want.extend((0..5).map(|p| 1000 - RANKED_FLOWS as u16 - 2 + p));
        assert_eq!(dests, want);
        assert_eq!((q.group(0).count, q.group(1).count), (3, 3));
    }

    #[test]
    fn byte_limit_splits_groups() {
        let mut q = SendQueue::new(256, 2048);
        for i in 0..60 {
            q.push(SocketId::from_raw(0), a(1), &[0; 1500], i);
        }
        let n = q.build(info);
        // 43 * 1500 = 64500 <= 65507 < 44 * 1500
        assert_eq!(q.group(0).count, 43);
        assert_eq!(q.group(1).count, 17);
        assert_eq!(n, 2);
    }

    #[test]
    fn no_gso_means_one_datagram_per_group() {
        let mut q = SendQueue::new(64, 2048);
        for i in 0..5 {
            q.push(SocketId::from_raw(0), a(1), &[0; 100], i);
        }
        let n = q.build(|_| {
            Some(SockInfo {
                v6: false,
                gso: false,
                fd: -1,
            })
        });
        assert_eq!(n, 5);
    }

    #[test]
    fn full_queue_evicts_retried_datagrams_only() {
        let mut q = SendQueue::new(4, 64);
        for i in 0..4 {
            assert!(q.push(SocketId::from_raw(0), a(1), &[0; 10], i));
        }
        assert!(!q.push(SocketId::from_raw(0), a(1), &[0; 10], 9));
        assert!(
            !q.push(SocketId::from_raw(0), a(1), &[0; 65], 9),
            "too long"
        );
        let n = q.build(info);
        assert_eq!(n, 1);
        q.finish(0, GroupResult::Retry { eagain: true });
        q.clear_groups();
        assert_eq!(q.len(), 4);
        assert!(q.push(SocketId::from_raw(0), a(1), &[0; 10], 10));
        assert_eq!(q.take_failure(), Some((0, io::ErrorKind::WouldBlock)));
        assert_eq!(q.take_failure(), None);
        // closed socket: queued datagrams fail
        q.fail_socket(SocketId::from_raw(0));
        assert_eq!(q.len(), 0);
        let mut tags: Vec<u64> = std::iter::from_fn(|| q.take_failure().map(|f| f.0)).collect();
        tags.sort();
        assert_eq!(tags, vec![1, 2, 3, 10]);
    }

    /// The sending order of the queued datagrams' slots as the comparison sort that
    /// `build` once used gave it: the oracle for the counting sort.
    fn oracle_order(q: &SendQueue) -> Vec<u32> {
        let mut flows: Vec<(SocketId, SocketAddr)> = Vec::new();
        let mut order: Vec<(u32, u32, u32)> = Vec::new();
        for (pos, &slot) in q.pending.iter().enumerate() {
            let flow = (q.socks[slot as usize], q.dests[slot as usize]);
            let rank = match flows.iter().position(|f| *f == flow) {
                Some(i) => i,
                None if flows.len() < RANKED_FLOWS => {
                    flows.push(flow);
                    flows.len() - 1
                }
                None => RANKED_FLOWS,
            };
            order.push((rank as u32, pos as u32, slot));
        }
        let (socks, dests, lens) = (&q.socks, &q.dests, &q.lens);
        order.sort_unstable_by(|a, b| {
            let (x, y) = (a.2 as usize, b.2 as usize);
            a.0.cmp(&b.0)
                .then_with(|| match a.0 as usize {
                    RANKED_FLOWS => socks[x]
                        .cmp(&socks[y])
                        .then_with(|| dests[x].cmp(&dests[y])),
                    _ => std::cmp::Ordering::Equal,
                })
                .then_with(|| Reverse(lens[x]).cmp(&Reverse(lens[y])))
                .then_with(|| a.1.cmp(&b.1))
        });
        order.into_iter().map(|o| o.2).collect()
    }

    /// (flow, length) per datagram: `flows` pairs of 3 sockets and v4 or v6
    /// destinations, few distinct lengths (ties and mixed runs both common).
    fn datagrams() -> impl proptest::strategy::Strategy<Value = Vec<(usize, usize)>> {
        use proptest::prelude::*;
        (1usize..3 * RANKED_FLOWS).prop_flat_map(|flows| {
            let len = prop_oneof![
                4 => Just(200usize),
                1 => Just(0usize),
                1 => Just(100usize),
                1 => 1usize..1500,
            ];
            proptest::collection::vec((0..flows, len), 0..160)
        })
    }

    fn flow(f: usize) -> (SocketId, SocketAddr) {
        let port = 5000 - (f * 7919 % 97) as u16;
        let dest = if f.is_multiple_of(5) {
            SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port))
        } else {
            a(port)
        };
        (SocketId::from_raw((f % 3) as u32), dest)
    }

    proptest::proptest! {
        #[test]
        fn build_orders_as_the_comparison_sort(
            rounds in proptest::collection::vec((datagrams(), proptest::bits::u64::ANY), 1..4)
        ) {
            let mut q = SendQueue::new(512, 2048);
            let mut tag = 0;
            for (pushes, retry) in rounds {
                for (f, len) in pushes {
                    let (sock, dest) = flow(f);
                    tag += 1;
                    q.push(sock, dest, &vec![0; len], tag);
                }
                let want = oracle_order(&q);
                let n = q.build(info);
                proptest::prop_assert_eq!(&q.group_slots, &want);
                // some groups back into the queue, in a slot order unlike queue order
                for g in 0..n {
                    let outcome = if retry >> (g % 64) & 1 == 1 {
                        GroupResult::Retry { eagain: false }
                    } else {
                        GroupResult::Sent
                    };
                    q.finish(g, outcome);
                }
                q.clear_groups();
            }
        }
    }
}
