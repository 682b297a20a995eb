//! The service diagnoses itself: when decisions fail, it finds out why, as `rlctl`'s
//! probe does (rl-toolkit's probe: a guard-only request that consumes nothing), and says
//! so once per change, at `warn`: a closed port or unreachable host (ICMP), a server
//! answering with another server id (both ids named), datagrams the key cannot open (a
//! wrong key), silence, a probe that could not be sent. At start every endpoint is
//! probed once (bounded by the policy's horizon per endpoint) and what was found is
//! logged.
//!
//! Readiness (`GET /readyz` on the admin listener): 200 while decisions are made (a
//! decision in the last 10 s, or the last probe answered), 503 with a one-line reason
//! while none can be (every endpoint failing the probe: its causes). `GET /healthz` is
//! liveness only. Both answer from state, never waiting.
//!
//! Series: `rl_proxy_ready`, `rl_proxy_endpoint_cause{endpoint,cause}` (one of
//! [`CAUSES`]), `rl_proxy_probes_total`.
//!
//! Owns: nothing of its own (docs and re-exports): the rule is [`state`]'s, the task
//! [`monitor`]'s. Must not touch: the data path.

pub mod monitor;
pub mod state;

pub use monitor::{Health, Watch, start};
pub use state::{CAUSES, Cause, Diagnosis, Readiness};
