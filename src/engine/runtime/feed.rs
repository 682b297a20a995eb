//! What connects one core's sans-IO state to the engine's shared parts.
//!
//! Owns: [`CoreFeed`]: the state's construction from the engine's settings, the drain of
//! the core's submission queue into it (a request's PDU taken from its completion slot,
//! reports, report flushes, the test fault), the membership snapshot the state is given
//! each turn and the refresh it asks for, the delivery of the outcomes the state hands out
//! (each written into its completion slot, then the callers woken once), and the refusal
//! of what is still queued at shutdown. The core's turn (`super::turn`) uses it, so the
//! state itself names no queue, no slot and no waker.
//! Must not touch: sockets, clocks (instants are parameters), the request path.

use std::sync::Arc;
use std::time::Instant;

use super::consts::DRAIN;
use super::shared::Shared;
use super::submit::Msg;
use crate::engine::core::{CoreConfig, CoreState, Entropy, TransmitSink};
use crate::proto::wire::RngError;
use crate::udp::SocketId;

/// One core's connection to the engine's queue, completion slots and membership.
pub(crate) struct CoreFeed {
    index: usize,
    shared: Arc<Shared>,
    /// Slots whose callers are to be woken at the end of the delivery.
    wakes: Vec<u32>,
}

impl std::fmt::Debug for CoreFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreFeed")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl CoreFeed {
    pub(crate) fn new(index: usize, shared: Arc<Shared>) -> CoreFeed {
        CoreFeed {
            index,
            shared,
            wakes: Vec::with_capacity(DRAIN),
        }
    }

    /// The state of this core, its first socket `first` bound on `port`.
    pub(crate) fn new_state(
        &self,
        now: Instant,
        first: SocketId,
        port: u16,
        entropy: Entropy,
    ) -> Result<CoreState, RngError> {
        let sh = &self.shared;
        let cfg = CoreConfig {
            index: self.index,
            auth: sh.auth.clone(),
            plan: sh.plan,
            policy: sh.policy.clone(),
            in_flight: sh.settings.in_flight_per_core,
            max_sockets: sh.settings.max_sockets,
            report_interval: sh.settings.report_interval,
        };
        CoreState::new(cfg, sh.membership.snapshot(), now, first, port, entropy)
    }

    /// Gives the state the current endpoint set, then up to [`DRAIN`] queued
    /// submissions; true when there were any.
    pub(crate) fn submissions(
        &self,
        state: &mut CoreState,
        now: Instant,
        out: &mut dyn TransmitSink,
    ) -> bool {
        state.set_membership(self.shared.membership.snapshot());
        let queue = &self.shared.intake.queues[self.index];
        let mut n = 0;
        while n < DRAIN {
            let Some(msg) = queue.pop() else { break };
            n += 1;
            self.feed(state, now, msg, out);
        }
        if state.take_refresh_request() {
            self.shared.membership.request_refresh();
        }
        n > 0
    }

    fn feed(&self, state: &mut CoreState, now: Instant, msg: Msg, out: &mut dyn TransmitSink) {
        match msg {
            Msg::Request { slot, submitted } => {
                let pool = &self.shared.intake.pool;
                pool.take_pdu(slot, |pdu| state.submit(now, pdu, slot, submitted, out));
            }
            Msg::Report(e) => state.submit_report(now, e, out),
            Msg::FlushReports(tx) => {
                state.flush_reports_now(out);
                let _ = tx.try_send(state.stats().clone());
            }
            Msg::Fault => panic!("fault injected into engine core {}", self.index),
        }
    }

    /// Writes every outcome the state handed out into its completion slot, then wakes
    /// those callers (a caller on the core's CPU runs only after every slot is written).
    pub(crate) fn deliver(&mut self, state: &mut CoreState) {
        let pool = &self.shared.intake.pool;
        while let Some(o) = state.poll_outcome() {
            pool.complete_deferred(o.slot, o.outcome, o.decided_at, &mut self.wakes);
        }
        for idx in self.wakes.drain(..) {
            pool.wake(idx);
        }
    }

    /// Shuts the core's state down: what is still queued is refused (requests fail
    /// with `Shutdown`, control messages are answered), then every in-flight request
    /// completes with `Shutdown`, and the outcomes are delivered.
    pub(crate) fn shutdown(
        &mut self,
        state: &mut CoreState,
        now: Instant,
        out: &mut dyn TransmitSink,
    ) {
        let queue = &self.shared.intake.queues[self.index];
        while let Some(msg) = queue.pop() {
            match msg {
                Msg::Request { slot, .. } => state.refuse(slot),
                other => self.feed(state, now, other, out),
            }
        }
        state.shutdown(now, out);
        self.deliver(state);
    }
}
