//! Figures that only some clients report, filled in by the client itself at the end of
//! its phase: the UDP I/O layer's counters (backend, datagrams per send and per receive
//! buffer, GSO/GRO fallbacks) of the engine and the raw client, the engine's latency
//! breakdown (queue wait, wire, decision, completion wake), and the embedded responders'
//! I/O counters.
//!
//! Owns these figures' JSON keys (`io`, `responder_io`, `breakdown_us`, `raw_wait`) and their summary
//! lines. Must not touch clients, sockets or the measurement window.

use std::io::Write;
use std::sync::{Arc, Mutex};

use ratelimitly_engine::LatencyHistogram;
use ratelimitly_engine::udp::IoStats;
use serde_json::{Map, Value, json};

use crate::cli::RawWait;

/// One stage of the engine's per-decision latency breakdown (µs).
#[derive(Clone, Debug)]
pub struct Stage {
    pub name: &'static str,
    pub p50_us: u64,
    pub p99_us: u64,
    pub count: u64,
}

impl Stage {
    /// The stage `name` of histogram `h` (µs values).
    pub fn of(name: &'static str, h: &LatencyHistogram) -> Stage {
        Stage {
            name,
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            count: h.len(),
        }
    }
}

/// What a client reports beyond the common figures.
#[derive(Clone, Debug, Default)]
pub struct ClientExtra {
    /// The client's I/O counters (engine cores merged, or raw threads merged).
    pub io: Option<IoStats>,
    /// The embedded responders' I/O counters over the phase's lifetime.
    pub responder_io: Option<IoStats>,
    /// The engine's latency breakdown over the whole phase (warm-up included).
    pub breakdown: Vec<Stage>,
    /// The raw client: how it waited for answers (`raw_wait`).
    pub raw_wait: Option<RawWait>,
    /// `--chaos`: the schedule that ran and its verdict.
    pub chaos: Option<crate::chaos::ChaosReport>,
}

/// Where a client leaves its [`ClientExtra`] before it finishes.
pub type ExtraSlot = Arc<Mutex<ClientExtra>>;

/// Merges `io` into the slot's client I/O counters.
pub fn add_io(slot: &ExtraSlot, io: &IoStats) {
    let mut e = slot.lock().unwrap_or_else(|p| p.into_inner());
    match &mut e.io {
        Some(sum) => sum.merge(io),
        None => e.io = Some(io.clone()),
    }
}

fn io_json(io: &IoStats) -> Value {
    json!({
        "backend": io.backend.as_str(),
        "datagrams_per_send": io.datagrams_per_send(),
        "datagrams_per_send_call": io.datagrams_per_send_call(),
        "datagrams_per_recv": io.datagrams_per_recv(),
        "datagrams_per_recv_call": io.datagrams_per_recv_call(),
        "datagrams_sent": io.datagrams_sent,
        "datagrams_received": io.datagrams_received,
        "gso_sends": io.gso_sends,
        "gro_buffers": io.gro_buffers,
        "gso_fallbacks": io.gso_fallbacks,
        "gro_fallbacks": io.gro_fallbacks,
        "eagain_waits": io.eagain_waits,
        "wakes": io.wakes,
        "loops": io.loops,
        "waits": io.waits,
        "recv_calls": io.recv_calls,
        "recv_rearms": io.recv_rearms,
    })
}

impl ClientExtra {
    /// Adds the new keys to a result object (`io`, `responder_io`, `breakdown_us`; each
    /// only when known).
    pub fn add_json(&self, out: &mut Map<String, Value>) {
        if let Some(io) = &self.io {
            out.insert("io".into(), io_json(io));
        }
        if let Some(io) = &self.responder_io {
            out.insert("responder_io".into(), io_json(io));
        }
        if !self.breakdown.is_empty() {
            let b: Map<String, Value> = self
                .breakdown
                .iter()
                .map(|s| {
                    let v = json!({ "p50": s.p50_us, "p99": s.p99_us, "count": s.count });
                    (s.name.to_string(), v)
                })
                .collect();
            out.insert("breakdown_us".into(), Value::Object(b));
        }
        if let Some(w) = self.raw_wait {
            out.insert("raw_wait".into(), json!(w.name()));
        }
        if let Some(c) = &self.chaos {
            out.insert("chaos".into(), c.to_json());
        }
    }

    /// The summary lines (nothing when nothing is known).
    pub fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        match self.raw_wait {
            Some(RawWait::Sleep) => writeln!(
                out,
                "  raw wait: sleep (waits in its I/O layer until an answer arrives or work is due)"
            )?,
            Some(RawWait::BusyPoll) => writeln!(
                out,
                "  raw wait: busy-poll (--raw-busy-poll: its CPU per decision includes the polling)"
            )?,
            None => {}
        }
        for (who, io) in [("client", &self.io), ("responders", &self.responder_io)] {
            if let Some(io) = io {
                writeln!(
                    out,
                    "  {who} I/O {}: datagrams/send {:.1} (/call {:.1})  datagrams/recv buffer {:.1} (/call {:.1})  GSO/GRO fallbacks {}/{}",
                    io.backend,
                    io.datagrams_per_send(),
                    io.datagrams_per_send_call(),
                    io.datagrams_per_recv(),
                    io.datagrams_per_recv_call(),
                    io.gso_fallbacks,
                    io.gro_fallbacks,
                )?;
            }
        }
        if !self.breakdown.is_empty() {
            write!(out, "  breakdown µs p50/p99:")?;
            for s in &self.breakdown {
                write!(out, " {} {}/{}", s.name, s.p50_us, s.p99_us)?;
            }
            writeln!(out)?;
        }
        if let Some(c) = &self.chaos {
            c.print(out)?;
        }
        Ok(())
    }
}
