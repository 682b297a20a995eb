//! The raw UDP client as a loadgen [`Target`]: the ceiling. Valid requests pre-encoded
//! with our wire codec (one PDU template per bucket pattern), sealed per request with a
//! fresh unique id and nonce, sent once to one live endpoint with `sendmmsg`, responses
//! received with `recvmmsg`, authenticated and decoded. No policy: no replays, no
//! selection, no completion delivery; a lost response is a timeout after the horizon.
//!
//! Owns one thread per client core (the request templates are `raw_config`, the thread
//! loop `raw_thread`). Latency reports are not generated (the raw client measures decisions
//! only). Must not touch the engine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use super::raw_config::RawConfig;
use super::raw_thread::{self, RawLoad};
use super::{Load, PhaseSpec, Ready, RunContext, Target, wait_gate};
use crate::stats::Phase;

/// The raw client, its templates encoded, ready to run.
pub struct RawTarget {
    cfg: Arc<RawConfig>,
}

impl RawTarget {
    /// Encodes the templates for the run's live (not silent) endpoints.
    pub fn build(ctx: &RunContext<'_>) -> Result<Self, String> {
        let live: Vec<SocketAddr> = ctx
            .servers
            .endpoints
            .iter()
            .filter(|e| !ctx.servers.dead.contains(&e.server_id))
            .map(|e| e.addr)
            .collect();
        let args = ctx.args;
        let cfg = RawConfig::new(
            &ctx.servers.key,
            &ctx.work,
            live,
            ctx.horizon,
            args.batch,
            args.socket_buffer,
            !args.raw_sleep,
        )
        .map_err(|e| format!("raw client: {e}"))?;
        Ok(RawTarget { cfg: Arc::new(cfg) })
    }
}

/// Thread `i` of `n`'s share of the load.
fn share(load: Load, i: usize, n: usize) -> RawLoad {
    match load {
        Load::Open { rate } => RawLoad::Open {
            rate: rate / n as f64,
        },
        Load::Closed { in_flight } => RawLoad::Closed {
            in_flight: (in_flight / n + usize::from(i < in_flight % n)).max(1),
        },
    }
}

impl Target for RawTarget {
    fn run(self: Box<Self>, spec: PhaseSpec, ready: Ready) {
        let phase = Phase::new(Instant::now(), spec.warmup, spec.duration);
        let n = spec.cores.len();
        let threads: Vec<_> = spec
            .cores
            .iter()
            .copied()
            .enumerate()
            .map(|(i, core)| {
                let (cfg, phase, gate) = (
                    Arc::clone(&self.cfg),
                    Arc::clone(&phase),
                    Arc::clone(&spec.gate),
                );
                let (load, drain) = (share(spec.load, i, n), spec.drain);
                std::thread::spawn(move || {
                    crate::stats::pin(core);
                    let r = raw_thread::run_thread(cfg, phase, load, drain);
                    wait_gate(&gate);
                    r
                })
            })
            .collect();
        let _ = ready.send(Ok(phase));
        for h in threads {
            match h.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => eprintln!("loadgen: raw thread: {e}"),
                Err(_) => eprintln!("loadgen: raw thread panicked"),
            }
        }
    }
}
