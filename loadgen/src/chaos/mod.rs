//! `loadgen --chaos`: the engine, closed loop, against the embedded responders while a
//! seeded schedule of faults ([`schedule`], from `--seed`) runs over the measured window
//! (`--duration`; the warm-up before it, at least [`MIN_WARMUP_S`], runs the fixed
//! [`rehearsal::rehearsal`] so that the window starts from the faults' steady state). The
//! engine discovers the servers
//! through the embedded DNS responder (1 s TTL), so membership changes reach it the way
//! they reach a deployment.
//!
//! Fault kinds, and what the engine does on each (docs/protocol.md; H = the horizon,
//! U = the unit, the retry interval):
//! - `server_restart`: a server stopped for 0.5–2 s, then restarted on the same address
//!   with the same id and fresh state. Requests keep going to it (it stays in the DNS
//!   zone); while it is down they are answered by the other server, or, when the stopped
//!   one is the oldest, after round 0 by the younger one (an oldest fallback). Requests
//!   it had taken when it stopped are replayed every U and time out at H at worst; once
//!   back, it answers from empty buckets (fresh state is not a fault the client sees).
//! - `steering_storm`: every server steers every 2–8 responses for 1–2 s; the engine
//!   moves the steered flow to a fresh socket (rebind) and loses nothing.
//! - `loss_burst`: 30–70 % of the responses dropped for 1–2 s; the engine replays after
//!   each unit and gives up at H (a timeout, explained by the burst).
//! - `delay_burst`: responses delayed by 2–5 U (+ up to U jitter) for 1–2 s, longer than
//!   the retry interval: the engine replays before the answer arrives, takes the first
//!   answer, drops the late duplicates; answers later than H end as timeouts.
//! - `duplicate_burst`: 30–80 % of the responses sent twice for 1–2 s; the engine
//!   completes each request once and drops the duplicate.
//! - `membership_add`: a new (youngest) server started and published in the DNS zone;
//!   the engine picks it up at its next refresh (TTL 1 s) and sends to it too.
//! - `membership_remove`: that server withdrawn from the zone and stopped 1.5 s later; the
//!   engine drops it at its next refresh; requests sent to it before are answered by the
//!   others (it is never the oldest).
//!
//! The verdict (exit 1 when it fails): submitted = completed; no completion later than
//! its start + H + [`SLACK`](verdict::SLACK); and every outcome explained by the
//! schedule: grants always, timeouts (and communication failures) only in a second that a
//! fault which can cost a request ([`schedule::FaultKind::explains_timeouts`]) overlaps,
//! from its start to its end + H + slack; shutdown failures only after the window; any
//! other outcome (a rejection, a discovery, configuration or overload failure) never.
//! Also measured (bars the summary and the CI test check; not exit conditions): resident
//! memory after the warm-up (at least [`MIN_WARMUP_S`]) and at the end of the window, and
//! open descriptors before the client starts and after it has shut down with every fault
//! undone.
//!
//! Owns the chaos run and its report (`chaos` in the result), in `run.rs` (the run and the
//! controller thread), `verdict.rs` (the judgement), `report.rs` (the JSON and the summary)
//! and `measure.rs` (resident memory and descriptors). Must not touch the responders
//! directly (`control.rs`) or plan (`schedule.rs`, `rehearsal.rs`).

mod control;
mod measure;
mod rehearsal;
mod report;
mod run;
pub mod schedule;
mod verdict;

pub use report::ChaosReport;
pub use run::{MIN_WARMUP_S, run};
