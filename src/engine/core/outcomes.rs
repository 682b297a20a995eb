//! What one core hands out as its requests end, as data, and the responses it holds until
//! then.
//!
//! Owns: [`SlotOutcome`] (a request's completion slot, its outcome, and on sampled
//! decisions when it was decided), the queue of them that the core's driver takes with
//! `CoreState::poll_outcome`, and the store of responses the core holds: a round-0
//! candidate retained until the round ends, a decision whose completion resends wait for
//! the end of a receive batch, and a decision not yet taken. A held response lives in one
//! pooled cell from its arrival until it is taken (an in-flight entry and a queued outcome
//! keep only the cell's index, [`Held`], so the entry stays at 256 bytes and the response
//! is moved once, into the value `poll_outcome` returns).
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

/// A request that ended: its slot, the cell of its response or its failure, and its
/// decision time when sampled.
struct Ended {
    slot: u32,
    result: Result<Held, Failure>,
    decided_at: Option<Instant>,
}

/// The responses held and the outcomes not yet taken, of one core.
pub(crate) struct Outcomes {
    cells: Vec<Option<Response>>,
    free: Vec<u32>,
    done: VecDeque<Ended>,
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

    /// The response held at `held`, to adjust in place.
    pub(crate) fn get_mut(&mut self, held: Held) -> Option<&mut Response> {
        self.cells.get_mut(held.0 as usize)?.as_mut()
    }

    /// The response held at `held`, if any; the cell is freed.
    pub(crate) fn take(&mut self, held: &mut Held) -> Option<Response> {
        let i = std::mem::replace(held, Held::NONE).0;
        let r = self.cells.get_mut(i as usize)?.take();
        self.free.push(i);
        r
    }

    /// A request the core started ended at `now`: decided with the response held at
    /// `held` (it stays there until taken), or failed.
    pub(crate) fn finish(&mut self, slot: u32, result: Result<Held, Failure>, now: Instant) {
        let sampled = self.finished.is_multiple_of(WAKE_SAMPLE_EVERY);
        self.finished = self.finished.wrapping_add(1);
        self.done.push_back(Ended {
            slot,
            result,
            decided_at: sampled.then_some(now),
        });
    }

    /// A request that ended without the core deciding it (refused, failed before its
    /// start, or failed with its core).
    pub(crate) fn fail(&mut self, slot: u32, f: Failure) {
        self.done.push_back(Ended {
            slot,
            result: Err(f),
            decided_at: None,
        });
    }

    /// The oldest outcome not yet taken (its response moves out of its cell).
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<SlotOutcome> {
        let e = self.done.pop_front()?;
        let outcome = match e.result {
            Ok(mut held) => self.take(&mut held).ok_or(Failure::Shutdown),
            Err(f) => Err(f),
        };
        Some(SlotOutcome {
            slot: e.slot,
            outcome,
            decided_at: e.decided_at,
        })
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
            + OUTCOMES_PREALLOC * std::mem::size_of::<Ended>()
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
    fn every_eighth_finish_carries_its_time_and_a_decision_its_response() {
        let mut o = Outcomes::new(4);
        let now = Instant::now();
        for slot in 0..16 {
            o.finish(slot, Err(Failure::Shutdown), now);
        }
        let mut h = Held::NONE;
        o.hold(&mut h, Response::local_grant());
        o.get_mut(h).unwrap().sends = 5;
        o.finish(16, Ok(h), now);
        o.fail(99, Failure::Overloaded);
        let all: Vec<SlotOutcome> = std::iter::from_fn(|| o.pop()).collect();
        let sampled: Vec<u32> = all
            .iter()
            .filter(|x| x.decided_at.is_some())
            .map(|x| x.slot)
            .collect();
        assert_eq!(sampled, [0, 8, 16]);
        let decided = all.iter().find(|x| x.slot == 16).unwrap();
        assert_eq!(decided.outcome.as_ref().map(|r| r.sends).ok(), Some(5));
        assert!(!o.any());
        assert_eq!(o.free, [0], "the decision's cell is freed when it is taken");
    }
}
