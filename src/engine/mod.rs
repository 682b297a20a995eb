//! The engine, in two layers: a sans-IO core state per core ([`core`]) and the runtime
//! around it (`runtime`: builder, handle, submission, completion slots, the turn and its
//! two schedulers, lifecycle, membership).
//!
//! Owns: nothing but this map and the re-exports. The runtime owns the threads, queues,
//! slots and sockets; the core owns one core's requests and decides nothing itself (the
//! rules are `proto::machine`'s and `proto::wire`'s). The API key string never appears
//! in any output.
//!
//! ```text
//!  application threads (any runtime)               runtime: core i (pinned thread or hosted task)
//!  ──────────────────────────────────              ──────────────────────────────────────────────
//!  RequestBuilder::send ─ encode PDU into slot ─┐
//!  EngineHandle::submit / submit_batch / report ┼─▶ lock-free queue + udp::Waker (eventfd written
//!   (runtime::submit: the one way in)           │   only while the core waits)
//!                                               │        │ turn: ≤256 per turn
//!        ▲                                      │        ▼
//!        │ Completion: slot's atomic state      │   core::CoreState (sans-IO): submit(pdu from
//!        │ + waker, woken once per turn         │   the slot) ─▶ transmits ─▶ UdpIo (GSO) ─▶ net
//!        │                                      │   UdpIo (GRO) ─▶ handle_datagram ─▶ Delivery
//!        └── turn: each outcome → slot, wake ◀──┴── outcomes as data (slot, outcome)
//!  rl-discovery thread: DNS every ≤300 s ─▶ ArcSwap<Snapshot> ◀─ each turn clones the Arc
//! ```

pub mod core;
mod runtime;

pub use self::core::{DEFAULT_IN_FLIGHT, DEFAULT_REPORT_INTERVAL};
pub use self::core::{LatencyHistogram, Stats};
pub use self::runtime::{
    Batch, BuildError, Completion, Cores, DEFAULT_IO_BACKEND, DEFAULT_SOCKET_BUFFER, DnsConfig,
    Engine, EngineBuilder, EngineHandle, MAX_SOCKETS_PER_CORE, OptionError, Request,
    RequestBuilder,
};
#[cfg(feature = "loom")]
pub(crate) use self::runtime::{completion_models, submit_models};
