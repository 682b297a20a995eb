//! The raw UDP client as a loadgen [`Target`]: the ceiling, doing the protocol's
//! unavoidable work and nothing more. Per decision it seals one request (pre-encoded PDU,
//! fresh unique id and nonce), sends it to every server, opens the deciding answer (the
//! oldest live server's), resends once to each server that had not answered by then (as
//! completion delivery does) and receives and discards every other answer; all on one
//! `udp::UdpIo` per thread with the engine's backend and GSO/GRO setting. No policy
//! machine, slab, wheel or cross-thread hand-off; a lost answer is a timeout after the
//! horizon.
//!
//! Owns one thread per client core (the request templates are `raw_config`, the thread
//! loop `raw_thread`, the requests in flight `raw_flight`). Latency reports are not
//! generated (the raw client measures decisions only). Must not touch the engine.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::raw_config::{IoSettings, RawConfig};
use super::raw_thread::{self, RawLoad};
use super::{Load, PhaseSpec, Ready, RunContext, Target, wait_gate};
use crate::cli::RawWait;
use crate::stats::Phase;

/// The raw client, its templates encoded, ready to run.
pub struct RawTarget {
    cfg: Arc<RawConfig>,
    wait: RawWait,
}

impl RawTarget {
    /// Encodes the templates for the run's live (not silent) endpoints.
    pub fn build(ctx: &RunContext<'_>) -> Result<Self, String> {
        let eps = &ctx.servers.endpoints;
        let targets: Vec<SocketAddr> = eps.iter().take(64).map(|e| e.addr).collect();
        let decider = eps
            .iter()
            .take(64)
            .position(|e| !ctx.servers.dead.contains(&e.server_id));
        let args = ctx.args;
        let io = IoSettings {
            backend: args.io,
            gso: args.gso,
            batch: args.batch,
            socket_buffer: args.socket_buffer,
            spin: args.raw_wait() == RawWait::BusyPoll,
            completion_delivery: !args.no_completion_delivery,
            fallback: Duration::from_millis(u64::from(args.unit_ms)),
            replay: args.replays > 0,
        };
        let cfg = RawConfig::new(
            &ctx.servers.key,
            &ctx.work,
            (targets, decider),
            ctx.horizon,
            io,
        )
        .map_err(|e| format!("raw client: {e}"))?;
        Ok(RawTarget {
            cfg: Arc::new(cfg),
            wait: args.raw_wait(),
        })
    }
}

/// Thread `i` of `n`'s share of the load.
fn share(load: Load, i: usize, n: usize) -> RawLoad {
    match load {
        Load::Open {
            rate,
            max_outstanding,
        } => RawLoad::Open {
            rate: rate / n as f64,
            max_outstanding: (max_outstanding / n).max(1),
        },
        Load::Closed { in_flight } => RawLoad::Closed {
            in_flight: (in_flight / n + usize::from(i < in_flight % n)).max(1),
        },
    }
}

impl Target for RawTarget {
    fn run(self: Box<Self>, spec: PhaseSpec, ready: Ready) {
        let phase = Phase::new(Instant::now(), spec.warmup, spec.duration);
        spec.extra
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .raw_wait = Some(self.wait);
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
                let extra = spec.extra.clone();
                std::thread::spawn(move || {
                    crate::cpu::pin(core);
                    let r = raw_thread::run_thread(cfg, phase, load, drain, &extra);
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
