//! Drives the request machine the engine runs, [`Delivery`] with its policy's [`Plan`],
//! as the engine's core state drives it: the response a verdict keeps is held beside the
//! machine, the outcome is that response with the machine's send counts, and a failed
//! send is reported with the endpoint and kind of the transmit that failed (what the
//! engine's send tag carries). Shared by the conformance and property suites.
#![allow(dead_code)]

use std::time::Instant;

use ratelimitly_engine::proto::machine::{
    Accepted, Delivery, Ignored, Plan, Snapshot, Transmit, kept_outcome,
};
use ratelimitly_engine::proto::outcome::{Failure, GuardResult, Outcome, ResourceResult, Response};
use ratelimitly_engine::proto::policy::RequestPolicy;

/// One request: its machine, its policy's constants and the response held for it.
#[derive(Debug)]
pub struct Req {
    pub d: Delivery,
    pub plan: Plan,
    held: Option<Response>,
}

impl Req {
    pub fn new(policy: &RequestPolicy, snapshot: Snapshot, now: Instant) -> Result<Req, Failure> {
        let plan = Plan::new(policy);
        Ok(Req {
            d: Delivery::new(&plan, snapshot, now)?,
            plan,
            held: None,
        })
    }

    pub fn deadline(&self) -> Instant {
        self.d.deadline(&self.plan)
    }

    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.d.poll_transmit()
    }

    pub fn poll_timeout(&self) -> Option<Instant> {
        self.d.poll_timeout()
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.d.handle_timeout(&self.plan, now);
    }

    /// The send of `t` failed (reported once per failed send).
    pub fn transmit_failed(&mut self, t: &Transmit) {
        self.d.transmit_failed(t.endpoint, t.kind);
    }

    /// A response that passed the wire checks; the [`Response`] is built when the
    /// machine keeps it (replacing a retained one).
    pub fn handle_results<G, R>(
        &mut self,
        now: Instant,
        server_id: u64,
        steering: u8,
        guards: G,
        resources: R,
    ) -> Result<Accepted, Ignored>
    where
        G: IntoIterator<Item = GuardResult>,
        R: IntoIterator<Item = ResourceResult>,
    {
        let v = self
            .d
            .handle_results(&self.plan, now, server_id, steering)?;
        if v.keeps_response() {
            let r = Response::from_results(server_id, steering, v.phase, guards, resources);
            self.held = Some(r);
        }
        Ok(v.accepted)
    }

    pub fn poll_steering(&mut self) -> Option<u8> {
        self.d.poll_steering()
    }

    /// The outcome, exactly once, after the queued transmits were drained.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        let ended = self.d.poll_outcome(&self.plan)?;
        Some(kept_outcome(ended, self.held.take()).expect("a decision holds its response"))
    }

    pub fn is_done(&self) -> bool {
        self.d.is_done()
    }
}
