//! Hashed timer wheel for one engine core.
//!
//! Owns: the per-core set of pending deadlines (round ends, final phases, horizons),
//! stored as an intrusive doubly linked list per slot over one node slab, so insert and
//! cancel are O(1) and expiry handles a whole slot at once. Each node keeps its absolute
//! tick, so deadlines further away than one turn of the wheel stay in their slot until
//! their turn comes. An occupancy bitmap gives the next occupied tick, which the core
//! uses to arm its single timer.
//!
//! Must not touch: sockets, clocks (time is a parameter) or request state; the values it
//! stores are opaque `Copy` keys.

use std::time::{Duration, Instant};

const NIL: u32 = u32::MAX;

/// Handle of one pending timer: a node index plus the generation it had when inserted,
/// so a stale handle (after expiry or cancel) never cancels someone else's timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerHandle {
    idx: u32,
    generation: u32,
}

impl TimerHandle {
    /// A handle that refers to no timer (cancelling it does nothing).
    pub const NONE: TimerHandle = TimerHandle {
        idx: NIL,
        generation: 0,
    };

    /// True for [`TimerHandle::NONE`].
    pub fn is_none(&self) -> bool {
        self.idx == NIL
    }
}

#[derive(Clone, Copy)]
struct Node<T> {
    tick: u64,
    prev: u32,
    next: u32,
    generation: u32,
    /// `Some` while linked into a slot; `None` while on the free list.
    value: Option<T>,
}

/// Timer wheel with a fixed tick (at most 1 ms in the engine).
pub struct TimerWheel<T: Copy> {
    origin: Instant,
    tick_ns: u64,
    mask: u64,
    heads: Box<[u32]>,
    occupied: Box<[u64]>,
    nodes: Vec<Node<T>>,
    free: u32,
    /// Every tick `<= processed` has been expired.
    processed: u64,
    len: usize,
}

impl<T: Copy> std::fmt::Debug for TimerWheel<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerWheel")
            .field("tick_ns", &self.tick_ns)
            .field("slots", &self.heads.len())
            .finish_non_exhaustive()
    }
}

impl<T: Copy> TimerWheel<T> {
    /// A wheel starting at `origin` with `slots` slots (rounded up to a power of two,
    /// at least 64) of `tick` each, with node storage reserved for `capacity` timers.
    pub fn new(origin: Instant, tick: Duration, slots: usize, capacity: usize) -> Self {
        let slots = slots.max(64).next_power_of_two();
        let tick_ns = (tick.as_nanos() as u64).max(1);
        TimerWheel {
            origin,
            tick_ns,
            mask: slots as u64 - 1,
            heads: vec![NIL; slots].into_boxed_slice(),
            occupied: vec![0u64; slots / 64].into_boxed_slice(),
            nodes: Vec::with_capacity(capacity),
            free: NIL,
            processed: 0,
            len: 0,
        }
    }

    /// Bytes preallocated for `slots` slots and `capacity` timers.
    pub fn footprint(slots: usize, capacity: usize) -> usize {
        let slots = slots.max(64).next_power_of_two();
        slots * 4 + slots / 8 + capacity * std::mem::size_of::<Node<T>>()
    }

    /// Number of pending timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no timer is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The tick that covers `at`, rounded up (a timer never fires before its deadline).
    fn tick_of(&self, at: Instant) -> u64 {
        let ns = at.saturating_duration_since(self.origin).as_nanos() as u64;
        ns.div_ceil(self.tick_ns)
    }

    /// The tick fully elapsed at `now` (rounded down).
    fn tick_at(&self, now: Instant) -> u64 {
        let ns = now.saturating_duration_since(self.origin).as_nanos() as u64;
        ns / self.tick_ns
    }

    /// The instant at which `tick` has elapsed.
    pub fn instant_of(&self, tick: u64) -> Instant {
        self.origin + Duration::from_nanos(tick.saturating_mul(self.tick_ns))
    }

    /// Schedules `value` at `deadline` (a deadline already passed fires at the next
    /// expiry). O(1); allocates only when the node storage grows past its capacity.
    pub fn insert(&mut self, deadline: Instant, value: T) -> TimerHandle {
        let tick = self.tick_of(deadline).max(self.processed + 1);
        let slot = (tick & self.mask) as usize;
        let head = self.heads[slot];
        let idx = if self.free != NIL {
            let idx = self.free;
            let node = &mut self.nodes[idx as usize];
            self.free = node.next;
            node.tick = tick;
            node.prev = NIL;
            node.next = head;
            node.value = Some(value);
            idx
        } else {
            let idx = self.nodes.len() as u32;
            self.nodes.push(Node {
                tick,
                prev: NIL,
                next: head,
                generation: 0,
                value: Some(value),
            });
            idx
        };
        if head != NIL {
            self.nodes[head as usize].prev = idx;
        }
        self.heads[slot] = idx;
        self.occupied[slot / 64] |= 1u64 << (slot % 64);
        self.len += 1;
        TimerHandle {
            idx,
            generation: self.nodes[idx as usize].generation,
        }
    }

    fn unlink(&mut self, idx: u32) -> T {
        let (tick, prev, next) = {
            let n = &self.nodes[idx as usize];
            (n.tick, n.prev, n.next)
        };
        let slot = (tick & self.mask) as usize;
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            self.heads[slot] = next;
            if next == NIL {
                self.occupied[slot / 64] &= !(1u64 << (slot % 64));
            }
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        }
        let node = &mut self.nodes[idx as usize];
        let value = node.value.take().expect("linked node has a value");
        node.generation = node.generation.wrapping_add(1);
        node.next = self.free;
        node.prev = NIL;
        self.free = idx;
        self.len -= 1;
        value
    }

    /// True when `handle` is pending and fires at the tick `deadline` would get if it
    /// were inserted now (re-inserting it would change nothing).
    pub fn is_armed_at(&self, handle: TimerHandle, deadline: Instant) -> bool {
        match self.nodes.get(handle.idx as usize) {
            Some(n) if n.generation == handle.generation && n.value.is_some() => {
                n.tick == self.tick_of(deadline).max(self.processed + 1)
            }
            _ => false,
        }
    }

    /// Cancels a pending timer. Returns its value, or `None` for a stale handle.
    pub fn cancel(&mut self, handle: TimerHandle) -> Option<T> {
        let node = self.nodes.get(handle.idx as usize)?;
        if node.generation != handle.generation || node.value.is_none() {
            return None;
        }
        Some(self.unlink(handle.idx))
    }

    /// Index of the next occupied slot at distance 1..=slots from `from`, as a distance.
    fn next_occupied_distance(&self, from: u64) -> Option<u64> {
        let slots = self.mask + 1;
        let start = (from + 1) & self.mask;
        let words = self.occupied.len();
        let mut word = (start / 64) as usize;
        let mut bits = self.occupied[word] & (!0u64 << (start % 64));
        // Visit every word once, plus the first word again for its low bits.
        for _ in 0..=words {
            if bits != 0 {
                let slot = word as u64 * 64 + bits.trailing_zeros() as u64;
                let dist = (slot.wrapping_sub(start) & self.mask) + 1;
                return Some(dist.min(slots));
            }
            word = (word + 1) % words;
            bits = self.occupied[word];
        }
        None
    }

    /// The earliest instant at which an occupied slot comes due (never later than the
    /// earliest pending deadline; may be earlier for timers more than one turn away).
    pub fn next_deadline(&self) -> Option<Instant> {
        if self.len == 0 {
            return None;
        }
        let dist = self.next_occupied_distance(self.processed)?;
        Some(self.instant_of(self.processed + dist))
    }

    /// Fires every timer whose tick has elapsed at `now`, in slot order, calling
    /// `fire(value)` for each. Bounded by one turn of the wheel.
    pub fn expire(&mut self, now: Instant, mut fire: impl FnMut(T)) -> usize {
        let now_tick = self.tick_at(now);
        if now_tick <= self.processed {
            return 0;
        }
        let mut fired = 0;
        let mut cursor = self.processed;
        let span = self.mask + 1;
        let mut visited = 0u64;
        while self.len > 0 && visited < span {
            let Some(dist) = self.next_occupied_distance(cursor) else {
                break;
            };
            if cursor + dist > now_tick {
                break;
            }
            cursor += dist;
            visited += dist;
            let slot = (cursor & self.mask) as usize;
            let mut idx = self.heads[slot];
            while idx != NIL {
                let next = self.nodes[idx as usize].next;
                if self.nodes[idx as usize].tick <= now_tick {
                    let value = self.unlink(idx);
                    fire(value);
                    fired += 1;
                }
                idx = next;
            }
        }
        self.processed = now_tick;
        fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn fires_at_or_after_deadline_in_order_of_slots() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1), 256, 16);
        w.insert(t0 + ms(5), 5u32);
        w.insert(t0 + ms(2), 2u32);
        w.insert(t0 + Duration::from_micros(2500), 3u32);
        assert_eq!(w.next_deadline(), Some(t0 + ms(2)));
        let mut out = Vec::new();
        w.expire(t0 + Duration::from_micros(1999), |v| out.push(v));
        assert!(out.is_empty());
        w.expire(t0 + ms(2), |v| out.push(v));
        assert_eq!(out, vec![2]);
        w.expire(t0 + ms(3), |v| out.push(v));
        assert_eq!(out, vec![2, 3]);
        assert_eq!(w.next_deadline(), Some(t0 + ms(5)));
        w.expire(t0 + ms(100), |v| out.push(v));
        assert_eq!(out, vec![2, 3, 5]);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
    }

    #[test]
    fn cancel_is_generation_checked() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1), 64, 4);
        let a = w.insert(t0 + ms(3), 1u8);
        assert_eq!(w.cancel(a), Some(1));
        assert_eq!(w.cancel(a), None);
        let b = w.insert(t0 + ms(3), 2u8); // reuses the node
        assert_eq!(w.cancel(a), None);
        assert_eq!(w.len(), 1);
        let mut out = Vec::new();
        w.expire(t0 + ms(10), |v| out.push(v));
        assert_eq!(out, vec![2]);
        assert_eq!(w.cancel(b), None);
    }

    #[test]
    fn deadlines_beyond_one_turn_wait_for_their_turn() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1), 64, 4);
        w.insert(t0 + ms(70), 70u32); // same slot as tick 6
        w.insert(t0 + ms(6), 6u32);
        let mut out = Vec::new();
        w.expire(t0 + ms(10), |v| out.push(v));
        assert_eq!(out, vec![6]);
        assert!(w.next_deadline().unwrap() <= t0 + ms(70));
        w.expire(t0 + ms(69), |v| out.push(v));
        assert_eq!(out, vec![6]);
        w.expire(t0 + ms(70), |v| out.push(v));
        assert_eq!(out, vec![6, 70]);
    }

    #[test]
    fn long_idle_gap_and_past_deadlines() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1), 64, 4);
        w.expire(t0 + ms(1000), |_: u32| {});
        w.insert(t0 + ms(5), 1u32); // already passed: fires at the next tick
        let mut out = Vec::new();
        w.expire(t0 + ms(1000), |v| out.push(v));
        assert!(out.is_empty());
        w.expire(t0 + ms(1001), |v| out.push(v));
        assert_eq!(out, vec![1]);
        w.insert(t0 + ms(5000), 2u32);
        w.expire(t0 + ms(9000), |v| out.push(v));
        assert_eq!(out, vec![1, 2]);
    }

    #[test]
    fn hundred_thousand_pending() {
        let t0 = Instant::now();
        let mut w = TimerWheel::new(t0, ms(1), 8192, 100_000);
        let mut handles = Vec::with_capacity(100_000);
        for i in 0..100_000u32 {
            handles.push(w.insert(t0 + ms(1 + (i as u64 * 7919) % 10_000), i));
        }
        assert_eq!(w.len(), 100_000);
        for h in handles.iter().step_by(2) {
            assert!(w.cancel(*h).is_some());
        }
        let mut seen = vec![false; 100_000];
        let mut n = 0;
        let mut t = t0;
        for _ in 0..20 {
            t += ms(600);
            n += w.expire(t, |v| {
                assert!(!seen[v as usize]);
                seen[v as usize] = true;
            });
        }
        assert_eq!(n, 50_000);
        assert!(w.is_empty());
        assert!(seen.iter().enumerate().all(|(i, s)| *s == (i % 2 == 1)));
    }
}
