//! The raw client's requests in flight: a ring of slots indexed by sequence number, each
//! holding its sealed datagram (sent again unchanged by the completion resend) and the
//! servers that have answered; plus buffered randomness for unique ids and nonces.
//!
//! Owns the per-request state. Must not touch sockets, the wire format or clocks (times
//! are passed in).

use std::sync::Arc;
use std::time::Instant;

use ratelimitly_engine::proto::wire::{self, DATAGRAM_RANDOM_LEN, RngError};

use crate::stats::{Kind, Phase};

/// One request in flight.
#[derive(Clone, Copy, Debug)]
pub struct Slot {
    pub seq: u64,
    /// When it should have been sent (open loop) or was submitted (closed loop).
    pub intended: Instant,
    /// When it was sealed and queued.
    pub sent: Instant,
    /// Bit i: server i answered (before the decision, or in the batch that decided).
    pub answered: u64,
    len: u16,
    live: bool,
    /// Decided and recorded; its completion resends wait for the end of the batch.
    pub decided: bool,
}

/// The ring of requests in flight.
pub struct Flight {
    pub phase: Arc<Phase>,
    slots: Vec<Slot>,
    bytes: Vec<u8>,
    stride: usize,
    mask: u64,
    pub outstanding: usize,
}

impl Flight {
    /// A ring of at least `capacity` slots (a power of two) of `stride` bytes each.
    pub fn new(phase: Arc<Phase>, capacity: usize, stride: usize, now: Instant) -> Flight {
        let cap = capacity.next_power_of_two().max(64);
        let empty = Slot {
            seq: u64::MAX,
            intended: now,
            sent: now,
            answered: 0,
            len: 0,
            live: false,
            decided: false,
        };
        Flight {
            phase,
            slots: vec![empty; cap],
            bytes: vec![0; cap * stride],
            stride,
            mask: cap as u64 - 1,
            outstanding: 0,
        }
    }

    fn idx(&self, seq: u64) -> usize {
        (seq & self.mask) as usize
    }

    /// True when request `seq`'s slot is free.
    pub fn is_free(&self, seq: u64) -> bool {
        !self.slots[self.idx(seq)].live
    }

    /// The buffer request `seq` is sealed into.
    pub fn buffer(&mut self, seq: u64) -> &mut [u8] {
        let at = self.idx(seq) * self.stride;
        &mut self.bytes[at..at + self.stride]
    }

    /// Marks request `seq` in flight with `len` sealed bytes in its buffer.
    pub fn start(&mut self, seq: u64, intended: Instant, now: Instant, len: usize) {
        let i = self.idx(seq);
        self.slots[i] = Slot {
            seq,
            intended,
            sent: now,
            answered: 0,
            len: len as u16,
            live: true,
            decided: false,
        };
        self.outstanding += 1;
    }

    /// Request `seq` while it is in flight.
    pub fn get(&self, seq: u64) -> Option<Slot> {
        let s = self.slots[self.idx(seq)];
        (s.live && s.seq == seq).then_some(s)
    }

    /// Records that server `server` answered request `seq`.
    pub fn mark_answered(&mut self, seq: u64, server: usize) {
        let i = self.idx(seq);
        if self.slots[i].live && self.slots[i].seq == seq {
            self.slots[i].answered |= 1 << server;
        }
    }

    /// The sealed datagram of request `seq` (valid while it is in flight).
    pub fn sealed(&self, seq: u64) -> &[u8] {
        let i = self.idx(seq);
        let at = i * self.stride;
        &self.bytes[at..at + usize::from(self.slots[i].len)]
    }

    /// Completes request `seq` with `kind` if it is still in flight and undecided.
    pub fn complete(&mut self, seq: u64, now: Instant, kind: Kind) {
        if self.decide(seq, now, kind) {
            self.release(seq);
        }
    }

    /// Records the decision `kind` of request `seq` if it is in flight and undecided
    /// (true then); its slot stays in flight, collecting answers, until [`Flight::release`].
    pub fn decide(&mut self, seq: u64, now: Instant, kind: Kind) -> bool {
        let i = self.idx(seq);
        let s = self.slots[i];
        if !s.live || s.seq != seq || s.decided {
            return false;
        }
        self.slots[i].decided = true;
        self.phase.record(s.intended, now, kind, Some(1));
        true
    }

    /// Frees the slot of request `seq`.
    pub fn release(&mut self, seq: u64) {
        let i = self.idx(seq);
        if self.slots[i].live && self.slots[i].seq == seq {
            self.slots[i].live = false;
            self.outstanding -= 1;
        }
    }
}

/// Datagrams' worth of randomness fetched per entropy call.
const RANDOM_BATCH: usize = 146;

/// Buffered OS randomness: one entropy call per [`RANDOM_BATCH`] requests.
pub struct Random {
    buf: Box<[u8; RANDOM_BATCH * DATAGRAM_RANDOM_LEN]>,
    pos: usize,
}

impl Random {
    pub fn new() -> Random {
        Random {
            buf: Box::new([0; RANDOM_BATCH * DATAGRAM_RANDOM_LEN]),
            pos: RANDOM_BATCH,
        }
    }

    /// The random bytes of one datagram's unique id and nonce.
    pub fn next(&mut self) -> Result<[u8; DATAGRAM_RANDOM_LEN], RngError> {
        if self.pos == RANDOM_BATCH {
            wire::fill_random(&mut self.buf[..])?;
            self.pos = 0;
        }
        let at = self.pos * DATAGRAM_RANDOM_LEN;
        self.pos += 1;
        let mut out = [0u8; DATAGRAM_RANDOM_LEN];
        out.copy_from_slice(&self.buf[at..at + DATAGRAM_RANDOM_LEN]);
        Ok(out)
    }
}
