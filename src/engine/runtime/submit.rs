//! The one way in: every request, batch and report a caller hands the engine passes here.
//!
//! Owns: [`Submitter`] (a pass through the shutdown gate, on the calling thread's core:
//! requests queued through it, then one wake-up of the core when it is dropped) and the
//! thread-to-core affinity of submitters. A request arrives as what its validation gave:
//! why it is invalid, `None` for an empty request (granted locally), or the writer of its
//! PDU; the writer puts the PDU into the request's completion slot, and the queue carries
//! the slot's index.
//! Must not touch: the encoding (the request builder's), the cores' turn, sockets.

use std::cell::Cell;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::completion::Completion;
use super::pdu::PduBuf;
use super::queue::Msg;
use super::shared::Shared;
use crate::proto::error::ConfigError;
use crate::proto::outcome::{Failure, Response};
use crate::proto::wire::ReportEntry;

thread_local! {
    static CORE_HINT: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// A submitter inside the gate, on its thread's core. Dropping it wakes the core once
/// for everything it queued and leaves the gate.
pub(crate) struct Submitter<'a> {
    shared: &'a Shared,
    core: usize,
    queued: bool,
}

impl<'a> Submitter<'a> {
    /// Passes the gate; `None` once the engine shuts down (the caller then fails with
    /// `Shutdown`).
    pub(crate) fn enter(shared: &'a Shared) -> Option<Submitter<'a>> {
        if !shared.gate.enter() {
            return None;
        }
        let n = shared.queues.len();
        let core = CORE_HINT.with(|c| {
            let mut v = c.get();
            if v == usize::MAX {
                v = shared.next_thread.fetch_add(1, Ordering::Relaxed);
                c.set(v);
            }
            v % n
        });
        Some(Submitter {
            shared,
            core,
            queued: false,
        })
    }

    /// Queues one request: its outcome at once when validation decided it, else `write`
    /// puts its PDU into the completion slot it takes.
    pub(crate) fn request<W>(&mut self, req: Result<Option<W>, ConfigError>) -> Completion
    where
        W: FnOnce(&mut PduBuf) -> Result<(), ConfigError>,
    {
        let write = match req {
            Err(e) => return Completion::ready(Err(Failure::Configuration(e))),
            Ok(None) => return Completion::ready(Ok(Response::local_grant())),
            Ok(Some(write)) => write,
        };
        let (sh, core) = (self.shared, self.core);
        if sh.queues[core].dead.load(Ordering::Relaxed) {
            return Completion::ready(Err(Failure::CoreFailed { core }));
        }
        let Some(slot) = sh.pool.acquire() else {
            sh.queue_full.fetch_add(1, Ordering::Relaxed);
            return Completion::ready(Err(Failure::Overloaded));
        };
        let c = Completion::new(sh.pool.clone(), slot);
        if let Err(e) = sh.pool.write_pdu(slot, write) {
            // refused by the encoder after the checks of validation (not expected)
            sh.pool.complete(slot, Err(Failure::Configuration(e)));
            return c;
        }
        let msg = Msg::Request {
            slot,
            submitted: Instant::now(),
        };
        if sh.queues[core].push(msg).is_err() {
            sh.queue_full.fetch_add(1, Ordering::Relaxed);
            sh.pool.complete(slot, Err(Failure::Overloaded));
        } else {
            self.queued = true;
        }
        c
    }

    /// Queues a latency report entry; `Overloaded` when the core's queue is full.
    pub(crate) fn report(&mut self, entry: ReportEntry) -> Result<(), Failure> {
        if self.shared.queues[self.core]
            .push(Msg::Report(entry))
            .is_err()
        {
            self.shared.queue_full.fetch_add(1, Ordering::Relaxed);
            return Err(Failure::Overloaded);
        }
        self.queued = true;
        Ok(())
    }
}

impl Drop for Submitter<'_> {
    fn drop(&mut self) {
        if self.queued {
            self.shared.queues[self.core].wake();
        }
        self.shared.gate.leave();
    }
}
