//! The `parameters` object of the JSON report: what the run was (servers, key id, the
//! effective cores and horizon) plus every option recorded by the serde derive on
//! [`Args`] (the fields it does not `skip`).
//!
//! Owns the JSON keys of `parameters`. Must not touch clients or measurements.

use serde::Serialize;
use serde_json::Value;

use crate::cli::{Args, EngineCore, RawWait};
use crate::clients::RunContext;

/// `parameters` of the JSON report.
#[derive(Serialize)]
struct RunParams<'a> {
    /// Endpoints the run used (embedded or external).
    servers: usize,
    embedded: bool,
    /// The key's auth mode, `Aes` / `Cookie` / `None`.
    auth: String,
    key_id: u64,
    horizon_ms: u64,
    /// The client cores used (after defaults and filtering).
    client_cores: &'a [usize],
    /// The responder cores used.
    responder_cores: &'a [usize],
    /// Where the engine's core ran (`--engine-core auto` settled).
    engine_core: EngineCore,
    /// Open loop: the most requests a client keeps outstanding (null in closed loop).
    max_outstanding: Option<usize>,
    /// True when the raw client waits (`--raw-sleep`, the default) rather than polls.
    raw_sleep: bool,
    /// How the raw client waits, `sleep` or `busy-poll` ([`Args::raw_wait`]).
    raw_wait: RawWait,
    #[serde(flatten)]
    args: &'a Args,
}

/// The `parameters` value of a run.
pub fn params_json(ctx: &RunContext<'_>, responder_cores: &[usize]) -> Value {
    let p = RunParams {
        servers: ctx.servers.endpoints.len(),
        embedded: ctx.servers.embedded,
        auth: format!("{:?}", ctx.servers.key.mode()),
        key_id: ctx.servers.key.key_id(),
        horizon_ms: ctx.horizon.as_millis() as u64,
        client_cores: &ctx.client_cores,
        responder_cores,
        engine_core: ctx.args.placement(),
        max_outstanding: ctx.load().max_outstanding(),
        raw_sleep: ctx.args.raw_wait() == RawWait::Sleep,
        raw_wait: ctx.args.raw_wait(),
        args: ctx.args,
    };
    serde_json::to_value(&p).unwrap_or(Value::Null)
}
