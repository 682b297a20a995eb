//! The clients loadgen drives, behind one [`Target`] abstraction: our engine
//! ([`engine`]), the official `ratelimitly` 0.1.0 client ([`official`]) and the raw-UDP
//! ceiling ([`raw`]). The engine and the official client are future-based and share one
//! Tokio load driver (`tokio_load`); the raw client runs its own threads
//! (`raw_thread`).
//!
//! Owns: building a client for a run and running it for one phase on its own threads.
//! Must not touch: measurement windows, CPU accounting or output (`phase.rs`,
//! `output.rs`), server setup (`setup.rs`).

pub mod engine;
pub mod official;
pub mod raw;
mod raw_config;
mod raw_flight;
mod raw_thread;
mod tokio_load;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use crate::cli::{Args, ClientKind};
use crate::extra::ExtraSlot;
use crate::setup::Servers;
use crate::stats::Phase;
use crate::workload::Workload;

/// Everything a client needs to know about the run.
pub struct RunContext<'a> {
    pub args: &'a Args,
    pub servers: &'a Servers,
    pub work: Workload,
    pub client_cores: Vec<usize>,
    /// Where the future-based clients' Tokio workers run (`--app-cores`, else the
    /// client cores).
    pub app_cores: Vec<usize>,
    pub horizon: Duration,
}

impl RunContext<'_> {
    /// The run's load shape: closed loop, or open loop at `--rate` with the outstanding
    /// bound of [`open_loop_capacity`].
    pub fn load(&self) -> Load {
        match self.args.rate {
            Some(rate) => Load::Open {
                rate,
                max_outstanding: open_loop_capacity(rate, self.horizon),
            },
            None => Load::Closed {
                in_flight: self.args.in_flight,
            },
        }
    }
}

/// Load shape.
#[derive(Clone, Copy, Debug)]
pub enum Load {
    /// N operations in flight at all times.
    Closed { in_flight: usize },
    /// A fixed rate (operations/s); latency from each operation's intended send time.
    /// At most `max_outstanding` operations are outstanding at once: one due beyond that
    /// is counted as overloaded at its intended time and not sent (every client alike).
    Open { rate: f64, max_outstanding: usize },
}

impl Load {
    /// The open-loop outstanding bound (`None` in closed loop).
    pub fn max_outstanding(self) -> Option<usize> {
        match self {
            Load::Open {
                max_outstanding, ..
            } => Some(max_outstanding),
            Load::Closed { .. } => None,
        }
    }
}

/// The outstanding bound of an open-loop run: everything `rate` opens within the horizon
/// plus half a second, plus 1,024, and at most 2^18. A client slower than the rate then
/// sheds the excess instead of queueing it: its backlog, and the memory the backlog
/// holds, stay bounded, and everything it did accept completes within the phase's drain
/// (why that matters here: docs/benchmarks.md, "Host steal").
fn open_loop_capacity(rate: f64, horizon: Duration) -> usize {
    ((rate * (horizon.as_secs_f64() + 0.5)) as usize + 1024).min(1 << 18)
}

/// How one phase runs.
#[derive(Clone, Debug)]
pub struct PhaseSpec {
    pub warmup: Duration,
    pub duration: Duration,
    /// How long, after the window, operations in flight may take to complete.
    pub drain: Duration,
    pub load: Load,
    /// The client cores (at least one).
    pub cores: Vec<usize>,
    /// The application's cores: the Tokio workers of the future-based clients (at least
    /// one).
    pub app_cores: Vec<usize>,
    /// Opened by the measuring thread once it has taken its end-of-window CPU snapshot;
    /// client threads stay alive until then, so the snapshot never misses their time.
    pub gate: Arc<AtomicBool>,
    /// Where the client leaves what only it can report (I/O counters, breakdown).
    pub extra: ExtraSlot,
}

/// Where a client reports that load has started (with the phase it records into), or
/// why it could not start.
pub type Ready = mpsc::Sender<Result<Arc<Phase>, String>>;

/// A client under test, built for a run and driven for one phase.
pub trait Target: Send {
    /// Runs one phase on the client's own threads and returns once they are done (every
    /// operation completed or the drain time passed, and the gate opened). Sends the
    /// phase on `ready` when load starts, or the error when the client cannot start.
    fn run(self: Box<Self>, spec: PhaseSpec, ready: Ready);
}

/// Builds the client `kind` for the run (the official client finishes building inside
/// its runtime, in [`Target::run`]).
pub fn build(kind: ClientKind, ctx: &RunContext<'_>) -> Result<Box<dyn Target>, String> {
    Ok(match kind {
        ClientKind::Engine => Box::new(engine::EngineTarget::build(ctx)?),
        ClientKind::Official => Box::new(official::OfficialTarget::new(ctx)?),
        ClientKind::Raw => Box::new(raw::RawTarget::build(ctx)?),
    })
}

/// Waits (at most 30 s) until `gate` opens.
pub fn wait_gate(gate: &AtomicBool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !gate.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}
