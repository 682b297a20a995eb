//! The per-core table of requests in flight, and the unique ids that route their
//! responses back.
//!
//! Owns: a generation-checked slab of `Entry` (request delivery state, sealed datagram
//! bytes, completion slot index, timer handle, source socket, held response's cell); the
//! admission of a request (`InFlight::admit`: its unique id and nonce minted from buffered
//! randomness, [`RandPool`], a ChaCha20 keystream re-keyed from the injected [`Entropy`];
//! its cell; its datagram store, written in place); the O(1) routing of a response by the
//! slab index and generation written into bytes 0..5 of the unique id (masked with a
//! per-core random value; the remaining bytes stay random and v4-shaped); the count of
//! requests in flight per socket (steering's drain: `discard` says when a socket's last
//! one ended); and the pool of large datagram buffers.
//! Must not touch: sockets, clocks, the completion protocol, the OS randomness (the
//! runtime injects it); capacity is fixed at start so the steady state never allocates.

use chacha20::ChaCha20Rng;
use rand_core::{Rng, SeedableRng};
use zeroize::Zeroize;

use super::consts::{DGRAM_INLINE, MAX_IN_FLIGHT, PREALLOC_MAX, RESEED_BYTES, RNG_POOL};
use super::outcomes::Held;
use super::wheel::TimerHandle;
use crate::proto::machine::{Delivery, TransmitKind};
use crate::proto::outcome::{CommError, Failure};
use crate::proto::wire::{self, MAX_DATAGRAM, NONCE_LEN, RngError, TenantFields};
use crate::udp::SocketId;

/// Offset of the unique id in a datagram (tenant TLV offset 12).
const UID_OFF: usize = 12;

/// Free-list end / "reserved, not inserted" marker.
const NIL: u32 = u32::MAX;

/// Flag in `Dgram::len`: the bytes are in a pooled buffer.
const POOLED: u16 = 0x8000;

/// The sealed request datagram (identical for every send): inline when it fits, else in
/// the pooled buffer whose index is kept in the first four inline bytes.
pub(crate) struct Dgram {
    len: u16,
    bytes: [u8; DGRAM_INLINE],
}

impl Dgram {
    /// No bytes yet (an entry's store before [`InFlight::admit`] gives it one).
    pub(crate) const EMPTY: Dgram = Dgram {
        len: 0,
        bytes: [0u8; DGRAM_INLINE],
    };

    fn pool_index(&self) -> Option<usize> {
        if self.len & POOLED != 0 {
            let b = &self.bytes;
            Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
        } else {
            None
        }
    }

    /// Records the sealed length.
    fn set_len(&mut self, len: usize) {
        debug_assert!(len <= MAX_DATAGRAM);
        self.len = (self.len & POOLED) | (len.min(MAX_DATAGRAM) as u16);
    }

    fn len(&self) -> usize {
        usize::from(self.len & !POOLED)
    }
}

/// One request in flight.
pub(crate) struct Entry {
    /// The request's delivery state.
    pub req: Delivery,
    /// Its armed timer (`TimerHandle::NONE` when none).
    pub timer: TimerHandle,
    /// Its completion slot (the runtime's: the core only names it in the outcome).
    pub slot: u32,
    /// The response the core holds for it: a retained round-0 candidate, or the decision
    /// until its completion resends leave.
    pub held: Held,
    /// The socket it sends from.
    pub sock: SocketId,
    /// Microseconds from submission to t0 (saturating).
    pub queued_us: u32,
    /// Microseconds from t0 to the arrival of the response kept as the decision so far
    /// (`u32::MAX`: none yet).
    pub answered_us: u32,
    /// Generation of the cell (set by [`InFlight::insert`]).
    pub generation: u32,
    /// The sealed datagram.
    pub dgram: Dgram,
}

/// A slab cell: an entry, or a free / reserved cell (intrusive free list, so a free
/// cell costs no extra memory).
#[allow(clippy::large_enum_variant)] // entries live inline in the slab by design
enum Cell {
    Vacant { generation: u32, next: u32 },
    Occupied(Entry),
}

impl Cell {
    fn generation(&self) -> u32 {
        match self {
            Cell::Vacant { generation, .. } => *generation,
            Cell::Occupied(e) => e.generation,
        }
    }
}

/// Key of an entry: slab index and generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Key {
    pub idx: u32,
    pub generation: u32,
}

impl Key {
    /// Packs the key with an endpoint index (< 64) and the transmit's kind into a send
    /// tag: index bits 0..24, generation 24..56, endpoint 56..62, kind 62..64.
    pub(crate) fn tag(self, endpoint: usize, kind: TransmitKind) -> u64 {
        let k = match kind {
            TransmitKind::Initial => 0u64,
            TransmitKind::Replay => 1,
            TransmitKind::Completion => 2,
        };
        (self.idx as u64)
            | ((self.generation as u64) << 24)
            | ((endpoint as u64 & 0x3F) << 56)
            | (k << 62)
    }

    /// Unpacks a send tag.
    pub(crate) fn from_tag(tag: u64) -> (Key, usize, TransmitKind) {
        let kind = match tag >> 62 {
            0 => TransmitKind::Initial,
            1 => TransmitKind::Replay,
            _ => TransmitKind::Completion,
        };
        (
            Key {
                idx: (tag & 0xFF_FFFF) as u32,
                generation: ((tag >> 24) & 0xFFFF_FFFF) as u32,
            },
            ((tag >> 56) & 0x3F) as usize,
            kind,
        )
    }

    /// Wheel value.
    pub(crate) fn pack(self) -> u64 {
        self.tag(0, TransmitKind::Initial)
    }

    pub(crate) fn unpack(v: u64) -> Key {
        Key::from_tag(v).0
    }
}

/// The in-flight table of one core.
pub(crate) struct InFlight {
    cells: Vec<Cell>,
    free: u32,
    limit: usize,
    len: usize,
    mask: [u8; 5],
    #[allow(clippy::vec_box)] // boxes stay put; entries refer to them by index
    big: Vec<Box<[u8; MAX_DATAGRAM]>>,
    big_free: Vec<u32>,
    /// Requests in flight per socket (the sockets with any; at most the core's bound on
    /// sockets, reserved at start).
    per_sock: Vec<(SocketId, u32)>,
    /// The randomness of the unique ids and nonces the table mints.
    rng: RandPool,
}

/// A request admitted into the table ([`InFlight::admit`]): its key, its tenant TLV and
/// nonce (a fresh random unique id carrying the cell's routing bytes) and the writable
/// bytes of its datagram store.
pub(crate) struct Admitted<'a> {
    pub key: Key,
    pub tenant: TenantFields,
    pub nonce: [u8; NONCE_LEN],
    pub bytes: &'a mut [u8],
}

impl InFlight {
    /// A table for `limit` requests on at most `max_sockets` sockets, its randomness drawn
    /// from `entropy` (the first draw is the mask that hides the routing bytes of unique
    /// ids).
    pub(crate) fn new(
        limit: usize,
        max_sockets: usize,
        entropy: Entropy,
    ) -> Result<InFlight, RngError> {
        let mut rng = RandPool::new(entropy);
        let mut mask = [0u8; 5];
        rng.fill(&mut mask)?;
        let limit = limit.clamp(1, MAX_IN_FLIGHT);
        let prealloc = limit.min(PREALLOC_MAX);
        Ok(InFlight {
            rng,
            per_sock: Vec::with_capacity(max_sockets.max(2)),
            cells: Vec::with_capacity(prealloc),
            free: NIL,
            limit,
            len: 0,
            mask,
            big: Vec::new(),
            big_free: Vec::new(),
        })
    }

    /// Requests in the table.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_full(&self) -> bool {
        self.len >= self.limit
    }

    /// Admits a new request: mints its unique id (fresh random bytes shaped as a v4 UUID,
    /// the cell's routing bytes in bytes 0..5) and nonce into its tenant TLV for key
    /// `key_id` at `wall_ms`, reserves its cell, stores `entry` there with a datagram store
    /// for `len` bytes (inline, or a pooled buffer when larger) and returns all that with
    /// the store's writable bytes, in place: seal the datagram into them, then
    /// [`set_len`](Self::set_len) (or [`discard`](Self::discard) the entry).
    pub(crate) fn admit(
        &mut self,
        entry: Entry,
        len: usize,
        key_id: u64,
        wall_ms: u64,
    ) -> Result<Admitted<'_>, Failure> {
        let rnd = self
            .rng
            .datagram_random()
            .map_err(|_| Failure::Communication(CommError::Rng))?;
        let (mut tenant, nonce) = wire::request_tenant(key_id, &rnd, wall_ms);
        let key = self.reserve().ok_or(Failure::Overloaded)?;
        self.count_on(entry.sock);
        // the routing bytes (0..5) are untouched by the id's v4 shaping (bytes 6, 8)
        self.stamp_unique_id(key, &mut tenant.unique_id);
        let dgram = self.alloc_dgram(len);
        self.insert(key, Entry { dgram, ..entry });
        let Cell::Occupied(e) = &mut self.cells[key.idx as usize] else {
            unreachable!("inserted just above");
        };
        let bytes = match e.dgram.pool_index() {
            Some(i) => &mut self.big[i][..],
            None => &mut e.dgram.bytes[..],
        };
        Ok(Admitted {
            key,
            tenant,
            nonce,
            bytes,
        })
    }

    /// The random bytes of one datagram's unique id and nonce (a report's).
    pub(crate) fn datagram_random(&mut self) -> Result<[u8; wire::DATAGRAM_RANDOM_LEN], RngError> {
        self.rng.datagram_random()
    }

    /// Records the sealed length of entry `key`'s datagram.
    pub(crate) fn set_len(&mut self, key: Key, len: usize) {
        if let Some(e) = self.get_mut(key) {
            e.dgram.set_len(len);
        }
    }

    /// Reserves a key for a new entry (insert it with [`InFlight::insert`]).
    fn reserve(&mut self) -> Option<Key> {
        if self.is_full() {
            return None;
        }
        let idx = if self.free != NIL {
            let idx = self.free;
            let c = &mut self.cells[idx as usize];
            if let Cell::Vacant { next, .. } = c {
                self.free = *next;
                *next = NIL;
            }
            idx
        } else {
            self.cells.push(Cell::Vacant {
                generation: 0,
                next: NIL,
            });
            (self.cells.len() - 1) as u32
        };
        self.len += 1;
        Some(Key {
            idx,
            generation: self.cells[idx as usize].generation(),
        })
    }

    /// Puts cell `idx` (now vacant with `generation`) on the free list.
    fn push_free(&mut self, idx: u32, generation: u32) {
        self.cells[idx as usize] = Cell::Vacant {
            generation,
            next: self.free,
        };
        self.free = idx;
        self.len -= 1;
    }

    /// Gives back a reserved key that was never inserted.
    #[cfg(test)]
    fn unreserve(&mut self, key: Key) {
        let c = &self.cells[key.idx as usize];
        debug_assert!(matches!(c, Cell::Vacant { .. }));
        let g = c.generation().wrapping_add(1);
        self.push_free(key.idx, g);
    }

    fn insert(&mut self, key: Key, mut entry: Entry) {
        let c = &mut self.cells[key.idx as usize];
        debug_assert!(matches!(c, Cell::Vacant { .. }));
        debug_assert_eq!(c.generation(), key.generation);
        entry.generation = key.generation;
        *c = Cell::Occupied(entry);
    }

    /// Writes the routing bytes for `key` into a fresh random unique id.
    fn stamp_unique_id(&self, key: Key, uid: &mut [u8; 16]) {
        let i = key.idx.to_le_bytes();
        let g = (key.generation as u16).to_le_bytes();
        let route = [i[0], i[1], i[2], g[0], g[1]];
        for k in 0..5 {
            uid[k] = route[k] ^ self.mask[k];
        }
    }

    /// Finds the entry a response's unique id belongs to (O(1)), checking the whole id.
    pub(crate) fn route(&self, uid: &[u8; 16]) -> Option<Key> {
        let mut r = [0u8; 5];
        for k in 0..5 {
            r[k] = uid[k] ^ self.mask[k];
        }
        let idx = u32::from_le_bytes([r[0], r[1], r[2], 0]);
        let g16 = u16::from_le_bytes([r[3], r[4]]);
        let Some(Cell::Occupied(e)) = self.cells.get(idx as usize) else {
            return None;
        };
        let d = self.bytes(&e.dgram);
        if e.generation as u16 != g16 || d.get(UID_OFF..UID_OFF + 16) != Some(&uid[..]) {
            return None;
        }
        Some(Key {
            idx,
            generation: e.generation,
        })
    }

    pub(crate) fn get_mut(&mut self, key: Key) -> Option<&mut Entry> {
        match self.cells.get_mut(key.idx as usize)? {
            Cell::Occupied(e) if e.generation == key.generation => Some(e),
            _ => None,
        }
    }

    /// Removes an entry in place (nothing is moved out) and gives its datagram back;
    /// returns its socket and the requests still in flight on it.
    pub(crate) fn discard(&mut self, key: Key) -> Option<(SocketId, u32)> {
        let (pooled, sock) = match self.cells.get(key.idx as usize) {
            Some(Cell::Occupied(e)) if e.generation == key.generation => {
                (e.dgram.pool_index(), e.sock)
            }
            _ => return None,
        };
        if let Some(i) = pooled {
            self.big_free.push(i as u32);
        }
        self.push_free(key.idx, key.generation.wrapping_add(1));
        Some((sock, self.uncount_on(sock)))
    }

    /// Requests in flight on `sock`.
    pub(crate) fn on_socket(&self, sock: SocketId) -> u32 {
        self.per_sock
            .iter()
            .find(|p| p.0 == sock)
            .map_or(0, |p| p.1)
    }

    fn count_on(&mut self, sock: SocketId) {
        match self.per_sock.iter_mut().find(|p| p.0 == sock) {
            Some(p) => p.1 += 1,
            None => self.per_sock.push((sock, 1)),
        }
    }

    /// One request fewer on `sock`; returns how many remain.
    fn uncount_on(&mut self, sock: SocketId) -> u32 {
        let Some(i) = self.per_sock.iter().position(|p| p.0 == sock) else {
            return 0;
        };
        self.per_sock[i].1 -= 1;
        let left = self.per_sock[i].1;
        if left == 0 {
            self.per_sock.swap_remove(i);
        }
        left
    }

    /// A datagram store for `len` bytes: inline, or a pooled buffer when larger.
    fn alloc_dgram(&mut self, len: usize) -> Dgram {
        let mut d = Dgram {
            len: 0,
            bytes: [0u8; DGRAM_INLINE],
        };
        if len > DGRAM_INLINE {
            let idx = match self.big_free.pop() {
                Some(i) => i,
                None => {
                    self.big.push(Box::new([0u8; MAX_DATAGRAM]));
                    (self.big.len() - 1) as u32
                }
            };
            d.bytes[..4].copy_from_slice(&idx.to_le_bytes());
            d.len = POOLED;
        }
        d
    }

    /// The writable bytes of a datagram store (its whole capacity).
    #[cfg(test)]
    fn bytes_mut<'a>(&'a mut self, d: &'a mut Dgram) -> &'a mut [u8] {
        match d.pool_index() {
            Some(i) => &mut self.big[i][..],
            None => &mut d.bytes[..],
        }
    }

    /// The sealed bytes of a datagram.
    pub(crate) fn bytes<'a>(&'a self, d: &'a Dgram) -> &'a [u8] {
        let len = d.len();
        match d.pool_index() {
            Some(i) => &self.big[i][..len],
            None => &d.bytes[..len],
        }
    }

    /// The sealed datagram of entry `key`.
    pub(crate) fn datagram(&self, key: Key) -> Option<&[u8]> {
        match self.cells.get(key.idx as usize)? {
            Cell::Occupied(e) if e.generation == key.generation => Some(self.bytes(&e.dgram)),
            _ => None,
        }
    }

    /// Returns a datagram's pooled buffer (if any) to the pool.
    #[cfg(test)]
    fn recycle(&mut self, d: Dgram) {
        if let Some(i) = d.pool_index() {
            self.big_free.push(i as u32);
        }
    }

    /// Keys of every entry (for shutdown).
    pub(crate) fn keys(&self) -> Vec<Key> {
        self.cells
            .iter()
            .enumerate()
            .filter_map(|(i, c)| match c {
                Cell::Occupied(e) => Some(Key {
                    idx: i as u32,
                    generation: e.generation,
                }),
                Cell::Vacant { .. } => None,
            })
            .collect()
    }
}

/// A source of randomness (OS randomness in a running core, seeded in simulation).
pub type Entropy = Box<dyn FnMut(&mut [u8]) -> Result<(), RngError> + Send>;

/// Buffered randomness: a ChaCha20 keystream keyed with 32 bytes of the entropy source
/// and re-keyed every [`RESEED_BYTES`] (the construction of arc4random and of the
/// kernel's own generator), so a request costs no system call and no kernel ChaCha run.
pub(crate) struct RandPool {
    buf: Box<[u8; RNG_POOL]>,
    at: usize,
    source: Entropy,
    rng: Option<ChaCha20Rng>,
    since_seed: usize,
}

impl RandPool {
    /// A pool drawing its keys from `source` (nothing is drawn before the first fill).
    pub(crate) fn new(source: Entropy) -> RandPool {
        RandPool {
            buf: Box::new([0u8; RNG_POOL]),
            at: RNG_POOL,
            source,
            rng: None,
            since_seed: 0,
        }
    }

    fn refill(&mut self) -> Result<(), RngError> {
        if self.rng.is_none() || self.since_seed >= RESEED_BYTES {
            let mut seed = [0u8; 32];
            (self.source)(&mut seed)?;
            self.rng = Some(ChaCha20Rng::from_seed(seed));
            seed.zeroize();
            self.since_seed = 0;
        }
        if let Some(rng) = self.rng.as_mut() {
            rng.fill_bytes(&mut self.buf[..]);
        }
        self.since_seed += RNG_POOL;
        self.at = 0;
        Ok(())
    }

    pub(crate) fn fill(&mut self, out: &mut [u8]) -> Result<(), RngError> {
        if self.at + out.len() > RNG_POOL {
            self.refill()?;
        }
        out.copy_from_slice(&self.buf[self.at..self.at + out.len()]);
        // never hand out the same bytes twice
        self.buf[self.at..self.at + out.len()].fill(0);
        self.at += out.len();
        Ok(())
    }

    /// The random bytes of one datagram's unique id and nonce.
    pub(crate) fn datagram_random(&mut self) -> Result<[u8; wire::DATAGRAM_RANDOM_LEN], RngError> {
        let mut rnd = [0u8; wire::DATAGRAM_RANDOM_LEN];
        self.fill(&mut rnd)?;
        Ok(rnd)
    }
}

/// Size in bytes of one in-flight entry: the slab cell (free cells link through
/// themselves, so there is no separate free list). Excludes the shared snapshot, the
/// pooled buffers of datagrams over `DGRAM_INLINE` bytes and the cell of a held response
/// (`super::outcomes`).
pub fn entry_size() -> usize {
    std::mem::size_of::<Cell>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_fits_256_bytes() {
        let cell = entry_size();
        println!(
            "in-flight entry: size_of::<Entry>() = {} bytes, slab cell = {cell} bytes \
             (Delivery {} + inline datagram {DGRAM_INLINE}), no other per-request storage",
            std::mem::size_of::<Entry>(),
            std::mem::size_of::<Delivery>(),
        );
        assert!(cell <= 256, "{cell}");
    }

    #[test]
    fn slab_reuses_cells_and_checks_generations() {
        let entropy: Entropy = Box::new(|b: &mut [u8]| {
            b.fill(7);
            Ok(())
        });
        let mut t = InFlight::new(2, 4, entropy).unwrap();
        let a = t.reserve().unwrap();
        let b = t.reserve().unwrap();
        assert!(t.reserve().is_none());
        t.unreserve(b);
        let b2 = t.reserve().unwrap();
        assert_eq!(b2.idx, b.idx);
        assert_ne!(b2.generation, b.generation);
        t.unreserve(a);
        t.unreserve(b2);
        assert!(t.keys().is_empty());
        // pooled datagrams come back to the pool
        let mut d = t.alloc_dgram(500);
        t.bytes_mut(&mut d)[..3].copy_from_slice(b"abc");
        d.set_len(500);
        assert_eq!(&t.bytes(&d)[..3], b"abc");
        assert_eq!(t.bytes(&d).len(), 500);
        t.recycle(d);
        let d2 = t.alloc_dgram(1200);
        assert_eq!(d2.pool_index(), Some(0));
        let d3 = t.alloc_dgram(100);
        assert_eq!(d3.pool_index(), None);
    }
}
