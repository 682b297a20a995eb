//! What connects one core's sans-IO state to the engine's shared parts.
//!
//! Owns: [`CoreFeed`]: the drain of the core's submission queue into its
//! [`CoreState`] (requests, reports, report flushes, the test fault), the membership
//! snapshot the state is given each turn and the refresh it asks for, the wake-up of
//! the callers whose requests completed, and the refusal of what is still queued at
//! shutdown. The core's turn (`super::turn`) uses it, so the state
//! itself names no channel, no shared engine state and no waker.
//! Must not touch: sockets, clocks (instants are parameters), the request path.

use std::sync::Arc;
use std::time::Instant;

use super::shared::Shared;
use super::state::{CoreState, DRAIN, TransmitSink};
use super::submit::Msg;

/// One core's connection to the engine's queue, completion slots and membership.
pub(crate) struct CoreFeed {
    index: usize,
    shared: Arc<Shared>,
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
        CoreFeed { index, shared }
    }

    /// The state of this core, its first socket `first` bound on `port`.
    pub(crate) fn new_state(
        &self,
        now: Instant,
        first: crate::udp::SocketId,
        port: u16,
        entropy: super::state::Entropy,
    ) -> Result<CoreState, crate::proto::wire::RngError> {
        let sh = &self.shared;
        let cfg = super::config::CoreConfig {
            index: self.index,
            auth: sh.auth.clone(),
            plan: sh.plan,
            policy: sh.policy.clone(),
            in_flight: sh.settings.in_flight_per_core,
            max_sockets: sh.settings.max_sockets,
            report_interval: sh.settings.report_interval,
        };
        CoreState::new(
            cfg,
            sh.pool.clone(),
            sh.membership.snapshot(),
            now,
            first,
            port,
            entropy,
        )
    }

    /// Gives the state the current endpoint set, then up to [`DRAIN`] queued
    /// submissions; true when there were any.
    pub fn submissions(
        &self,
        state: &mut CoreState,
        now: Instant,
        out: &mut dyn TransmitSink,
    ) -> bool {
        state.set_membership(self.shared.membership.snapshot());
        let queue = &self.shared.queues[self.index];
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
            Msg::Request {
                slot,
                submitted,
                heap: None,
            } => state.submit_queued(now, slot, submitted, out),
            Msg::Request {
                slot,
                submitted,
                heap: Some(pdu),
            } => state.submit(now, &pdu, slot, submitted, out),
            Msg::Report(e) => state.submit_report(now, e, out),
            Msg::FlushReports(tx) => {
                state.flush_reports_now(out);
                let _ = tx.try_send(state.stats().clone());
            }
            Msg::Fault => panic!("fault injected into engine core {}", self.index),
        }
    }

    /// Wakes the callers whose requests completed since the last call.
    pub fn wake_callers(&self, state: &mut CoreState) {
        for idx in state.take_wakes() {
            self.shared.pool.wake(idx);
        }
    }

    /// Shuts the core's state down: what is still queued is refused (requests fail
    /// with `Shutdown`, control messages are answered), then every in-flight request
    /// completes with `Shutdown`, and the callers are woken.
    pub fn shutdown(&self, state: &mut CoreState, now: Instant, out: &mut dyn TransmitSink) {
        let queue = &self.shared.queues[self.index];
        while let Some(msg) = queue.pop() {
            match msg {
                Msg::Request { slot, .. } => state.refuse(slot),
                other => self.feed(state, now, other, out),
            }
        }
        state.shutdown(now, out);
        self.wake_callers(state);
    }
}
