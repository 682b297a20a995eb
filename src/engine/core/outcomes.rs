//! What one core hands out as its requests end, as data, and the responses it holds until
//! then.
//!
//! Owns: [`SlotOutcome`] (a request's completion slot, its outcome, and on sampled
//! decisions when it was decided), the queue of them that the core's driver takes with
//! `CoreState::poll_outcome`, and the store of responses the core holds for requests not
//! finished yet: a round-0 candidate retained until the round ends, or a decision whose
//! completion resends wait for the end of a receive batch. A held response lives in one
//! pooled cell; an in-flight entry keeps only the cell's index ([`Held`]), so the entry
//! stays at 256 bytes.
//! Must not touch: the completion slots themselves (the runtime writes each outcome into
//! its slot and wakes the caller), request state, clocks (instants are parameters).

use std::collections::VecDeque;
use std::time::Instant;

use super::consts::{HELD_PREALLOC, OUTCOMES_PREALLOC, WAKE_SAMPLE_EVERY};
use crate::proto::outcome::{Failure, Outcome, Response};

/// A request that ended on this core: the runtime writes `outcome` into completion slot
/// `slot` and wakes its caller; a simulation or a fuzz target reads it as it is.
#[derive(Debug)]
pub struct SlotOutcome {
    /// The request's completion slot (as given to `CoreState::submit` or `refuse`).
    pub slot: u32,
    /// The decision or the failure.
    pub outcome: Outcome,
    /// When the core finished the request, on one finish in [`WAKE_SAMPLE_EVERY`] (the
    /// caller measures its completion wake from it); `None` on the others and on
    /// requests the core never started.
    pub decided_at: Option<Instant>,
}

/// Index of the cell holding a request's response ([`Held::NONE`]: none held).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Held(u32);

impl Held {
    /// No response held.
    pub(crate) const NONE: Held = Held(u32::MAX);
}

/// The responses held and the outcomes not yet taken, of one core.
pub(crate) struct Outcomes {
    cells: Vec<Option<Response>>,
    free: Vec<u32>,
    done: VecDeque<SlotOutcome>,
    /// Requests finished so far: every [`WAKE_SAMPLE_EVERY`]th carries its time.
    finished: u64,
}

impl Outcomes {
    pub(crate) fn new(in_flight: usize) -> Outcomes {
        let held = in_flight.min(HELD_PREALLOC);
        Outcomes {
            cells: Vec::with_capacity(held),
            free: Vec::with_capacity(held),
            done: VecDeque::with_capacity(OUTCOMES_PREALLOC),
            finished: 0,
        }
    }

    /// Holds `response` for the request whose cell index is `held`, replacing the
    /// response it held (a younger round-0 candidate).
    pub(crate) fn hold(&mut self, held: &mut Held, response: Response) {
        if let Some(cell) = self.cells.get_mut(held.0 as usize) {
            *cell = Some(response);
            return;
        }
        let i = match self.free.pop() {
            Some(i) => {
                self.cells[i as usize] = Some(response);
                i
            }
            None => {
                self.cells.push(Some(response));
                (self.cells.len() - 1) as u32
            }
        };
        *held = Held(i);
    }

    /// The response held at `held`, if any; the cell is freed.
    pub(crate) fn take(&mut self, held: &mut Held) -> Option<Response> {
        let i = std::mem::replace(held, Held::NONE).0;
        let r = self.cells.get_mut(i as usize)?.take();
        self.free.push(i);
        r
    }

    /// A request the core started ended at `now` with `outcome`.
    pub(crate) fn finish(&mut self, slot: u32, outcome: Outcome, now: Instant) {
        let sampled = self.finished.is_multiple_of(WAKE_SAMPLE_EVERY);
        self.finished = self.finished.wrapping_add(1);
        self.done.push_back(SlotOutcome {
            slot,
            outcome,
            decided_at: sampled.then_some(now),
        });
    }

    /// A request that ended without the core deciding it (refused, failed before its
    /// start, or failed with its core).
    pub(crate) fn fail(&mut self, slot: u32, f: Failure) {
        self.done.push_back(SlotOutcome {
            slot,
            outcome: Err(f),
            decided_at: None,
        });
    }

    /// The oldest outcome not yet taken.
    pub(crate) fn pop(&mut self) -> Option<SlotOutcome> {
        self.done.pop_front()
    }

    /// True when outcomes wait to be taken.
    pub(crate) fn any(&self) -> bool {
        !self.done.is_empty()
    }

    /// Bytes one held response takes at most (its cell and its free-list place).
    pub(crate) fn cell_size() -> usize {
        std::mem::size_of::<Option<Response>>() + std::mem::size_of::<u32>()
    }

    /// Bytes reserved up front for an in-flight limit of `in_flight`.
    pub(crate) fn reserved(in_flight: usize) -> usize {
        in_flight.min(HELD_PREALLOC) * Self::cell_size()
            + OUTCOMES_PREALLOC * std::mem::size_of::<SlotOutcome>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_cells_are_replaced_freed_and_reused() {
        let mut o = Outcomes::new(4);
        let (mut a, mut b) = (Held::NONE, Held::NONE);
        o.hold(&mut a, Response::local_grant());
        let mut r = Response::local_grant();
        r.sends = 3;
        o.hold(&mut a, r);
        o.hold(&mut b, Response::local_grant());
        assert_ne!(a, b);
        assert_eq!(o.take(&mut a).map(|r| r.sends), Some(3));
        assert_eq!(a, Held::NONE);
        assert!(o.take(&mut a).is_none(), "nothing held twice");
        let mut c = Held::NONE;
        o.hold(&mut c, Response::local_grant());
        assert_eq!(o.cells.len(), 2, "the freed cell is reused");
    }

    #[test]
    fn every_eighth_finish_carries_its_time() {
        let mut o = Outcomes::new(4);
        let now = Instant::now();
        for slot in 0..16 {
            o.finish(slot, Err(Failure::Shutdown), now);
        }
        o.fail(99, Failure::Overloaded);
        let sampled: Vec<u32> = std::iter::from_fn(|| o.pop())
            .filter(|x| x.decided_at.is_some())
            .map(|x| x.slot)
            .collect();
        assert_eq!(sampled, [0, 8]);
        assert!(!o.any());
    }
}
