//! The socket table of a driver: one slot per socket, a generation per slot so that a
//! closed socket's [`SocketId`] never matches a later socket's, and what grouping needs
//! to know of each open socket.
//!
//! Owns: the slots, their generations and the open count. Must not touch: socket
//! creation (socket.rs), the backends' per-slot state (uring.rs keeps its own).

use std::net::SocketAddr;
use std::os::fd::AsRawFd;

use socket2::Socket;

use super::gso::SockInfo;

/// One socket of a driver (index and generation: a closed socket's id never matches a
/// later socket's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketId(u32);

impl SocketId {
    fn new(index: usize, generation: u16) -> SocketId {
        SocketId(((generation as u32) << 16) | index as u32)
    }

    /// The id whose [`raw`](Self::raw) value is `raw`: io_uring's user data carries it,
    /// and a simulation or a test that drives a core's state without sockets chooses its
    /// own ids with it.
    pub fn from_raw(raw: u32) -> SocketId {
        SocketId(raw)
    }

    /// Slot of this socket in its driver (below
    /// [`IoConfig::max_sockets`](super::IoConfig::max_sockets)).
    pub fn index(self) -> usize {
        (self.0 & 0xFFFF) as usize
    }

    fn generation(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// The raw value (index and generation), e.g. for logs.
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// One open socket of a driver.
pub(crate) struct SockEntry {
    pub(crate) sock: Socket,
    pub(crate) local: SocketAddr,
    pub(crate) v6: bool,
    /// GSO allowed (configured and not refused by the kernel).
    pub(crate) gso: bool,
    /// GRO enabled on the socket.
    pub(crate) gro: bool,
    /// A send met EAGAIN: also wait for writability.
    pub(crate) want_write: bool,
}

/// The sockets of one driver by slot.
pub(crate) struct SockTable {
    socks: Vec<Option<SockEntry>>,
    gens: Vec<u16>,
    open: usize,
}

impl SockTable {
    /// A table of `max` empty slots.
    pub(crate) fn new(max: usize) -> SockTable {
        SockTable {
            socks: (0..max).map(|_| None).collect(),
            gens: vec![0; max],
            open: 0,
        }
    }

    /// Number of slots (open or not).
    pub(crate) fn slots(&self) -> usize {
        self.socks.len()
    }

    /// Number of open sockets.
    pub(crate) fn open(&self) -> usize {
        self.open
    }

    /// The entry of `id` when it is still open.
    pub(crate) fn entry(&self, id: SocketId) -> Option<&SockEntry> {
        let i = id.index();
        if self.gens.get(i) != Some(&id.generation()) {
            return None;
        }
        self.socks.get(i)?.as_ref()
    }

    /// [`entry`](Self::entry), mutable.
    pub(crate) fn entry_mut(&mut self, id: SocketId) -> Option<&mut SockEntry> {
        let i = id.index();
        if self.gens.get(i) != Some(&id.generation()) {
            return None;
        }
        self.socks.get_mut(i)?.as_mut()
    }

    /// True while socket `id` is open (false once closed, even if its slot was reused).
    pub(crate) fn is_open(&self, id: SocketId) -> bool {
        self.entry(id).is_some()
    }

    /// The entry in slot `index` when one is open there.
    pub(crate) fn get(&self, index: usize) -> Option<&SockEntry> {
        self.socks.get(index)?.as_ref()
    }

    /// [`get`](Self::get), mutable.
    pub(crate) fn get_mut(&mut self, index: usize) -> Option<&mut SockEntry> {
        self.socks.get_mut(index)?.as_mut()
    }

    /// The id of the open socket in slot `index`.
    pub(crate) fn id_at(&self, index: usize) -> Option<SocketId> {
        match self.socks.get(index) {
            Some(Some(_)) => Some(SocketId::new(index, self.gens[index])),
            _ => None,
        }
    }

    /// The open sockets: slot, id and entry.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, SocketId, &SockEntry)> {
        self.socks
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|e| (i, SocketId::new(i, self.gens[i]), e)))
    }

    /// How socket `id` stands for grouping (None: closed).
    pub(crate) fn info(&self, id: SocketId) -> Option<SockInfo> {
        self.entry(id).map(|e| SockInfo {
            v6: e.v6,
            gso: e.gso,
            fd: e.sock.as_raw_fd(),
        })
    }

    /// The first free slot.
    pub(crate) fn free_slot(&self) -> Option<usize> {
        self.socks.iter().position(Option::is_none)
    }

    /// Puts `entry` into the free slot `slot`; returns its id.
    pub(crate) fn insert(&mut self, slot: usize, entry: SockEntry) -> SocketId {
        debug_assert!(self.socks[slot].is_none());
        self.socks[slot] = Some(entry);
        self.open += 1;
        SocketId::new(slot, self.gens[slot])
    }

    /// Takes socket `id` out of the table (None when it is not open); its slot's
    /// generation moves on, so `id` never matches again.
    pub(crate) fn remove(&mut self, id: SocketId) -> Option<SockEntry> {
        self.entry(id)?;
        let i = id.index();
        self.gens[i] = self.gens[i].wrapping_add(1);
        self.open -= 1;
        self.socks[i].take()
    }
}
