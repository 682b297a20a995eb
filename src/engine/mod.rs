//! The engine: one I/O shell per core (a pinned thread or a task hosted on the application's
//! Tokio runtime) around the sans-IO core state.
//!
//! Owns: the builder and its validation, the per-core threads and their lifecycle, the
//! application-facing handle (request, batch, report, stats), published statistics and
//! the discovery thread. Must not touch: wire encoding rules, delivery/selection rules
//! (those are `proto::wire` and `proto::machine`); the API key string never appears in
//! any output.
//!
//! ```text
//!  application threads (any runtime)          core i (pinned std thread)
//!  ─────────────────────────────────          ─────────────────────────────────────────
//!  RequestBuilder::send() ─ PDU → slot ──┐
//!   (thread → core affinity)              │  lock-free array queue + udp::Waker
//!  EngineHandle::submit_batch()  ─────────┼─▶ (eventfd written only while the core waits)
//!  EngineHandle::report()  ───────────────┘       │ turn::Core: ≤256/turn into CoreState
//!        ▲                                        ▼
//!        │  Completion: pooled one-shot   state: in-flight slab, timer wheel, sockets
//!        │  slot, atomic state + waker    (sans-IO) ─▶ transmits ─▶ UdpIo (GSO)
//!        └── woken once per turn ◀─────── UdpIo::run_once (GRO) ─▶ state.handle_datagram
//!  rl-discovery thread: DNS every ≤300 s ─▶ ArcSwap<Snapshot> ◀─ each request clones Arc
//! ```

mod builder;
pub mod completion;
pub mod config;
mod feed;
mod handle;
mod hosted;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod inflight;
mod lifecycle;
mod membership;
mod pdu;
mod pinned;
mod random;
mod reports;
mod shared;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod sockets;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod state;
pub mod stats;
pub mod submit;
mod turn;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod wheel;

use std::time::Duration;

pub use self::builder::EngineBuilder;
pub use self::completion::Completion;
pub use self::config::{BuildError, Cores, DnsConfig, OptionError};
pub use self::handle::EngineHandle;
pub use self::lifecycle::Engine;
pub(crate) use self::shared::PUBLISH_EVERY;
pub use self::stats::{LatencyHistogram, Stats};
pub use self::submit::{Batch, Request, RequestBuilder};

/// Default in-flight limit per core.
pub const DEFAULT_IN_FLIGHT: usize = 65_536;
/// Default socket buffer size (each direction).
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;
/// The engine cores' default I/O backend: `recvmmsg`/`sendmmsg` with GSO/GRO. Measured
/// side by side (docs/benchmarks.md, "Backends"), io_uring costs the same on a pinned core
/// and less where servers answer one datagram at a time, but 4–9% more CPU per decision on
/// a hosted core with batched answers, the placement rl-proxy and loadgen use by default;
/// io_uring is one `.io_backend(BackendChoice::Auto)` or `Uring` away.
pub const DEFAULT_IO_BACKEND: crate::udp::BackendChoice = crate::udp::BackendChoice::Mmsg;
/// Most sockets a core may be configured to hold (`max_sockets_per_core`).
pub const MAX_SOCKETS_PER_CORE: usize = 1024;
/// Default latency-report flush interval.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_millis(5);
