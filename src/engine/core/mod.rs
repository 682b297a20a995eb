//! The engine's sans-IO layer: the state of one core, with no I/O, no clock and nothing
//! shared.
//!
//! [`CoreState`] takes submissions, datagrams, timeouts and send failures with the instant
//! as a parameter, and hands out everything as data: transmits through a [`TransmitSink`],
//! socket operations ([`SocketOp`]), ended requests ([`SlotOutcome`]: a completion slot's
//! index and its outcome) and its next deadline. The runtime (`super::runtime`) drives it
//! from a core's turn, writes each outcome into its slot and wakes the caller; the
//! simulation (`tests/simulation.rs`) and the stateful fuzz target drive it directly on
//! virtual time. This folder imports nothing of the runtime: no thread, no queue, no
//! completion slot, no task wake-up, no async runtime.
//!
//! | module | owns |
//! |---|---|
//! | `state` | [`CoreState`]: its inputs and outputs, the datagram checks, the ordering contract |
//! | `config` | [`CoreConfig`]: the plain values a state is built from |
//! | `inflight` | the generation-checked slab of requests in flight, the unique ids it mints (buffered randomness from an injected [`Entropy`]), routing by unique id |
//! | `wheel` | [`TimerWheel`]: the core's pending deadlines |
//! | `sockets` | source-port steering as bookkeeping ([`SocketOp`]) |
//! | `reports` | latency-report coalescing |
//! | `outcomes` | held responses, and the ended requests waiting to be taken |
//! | `stats` | [`Stats`], [`LatencyHistogram`]: the core's counters and histograms |
//! | `consts` | the layer's constants, each with its reason |
//!
//! The rules of a request (rounds, replays, selection) are `proto::machine`'s
//! [`Delivery`](crate::proto::machine::Delivery); the wire rules are `proto::wire`'s.

mod config;
mod consts;
mod inflight;
mod outcomes;
mod reports;
mod sockets;
mod state;
mod stats;
mod wheel;

pub use self::config::CoreConfig;
pub use self::consts::{
    DEFAULT_IN_FLIGHT, DEFAULT_MAX_SOCKETS, DEFAULT_REPORT_INTERVAL, MAX_IN_FLIGHT, REPORT_TAG,
    ROUND_BUCKETS, WAKE_SAMPLE_EVERY,
};
pub use self::inflight::Entropy;
pub use self::outcomes::SlotOutcome;
pub use self::sockets::SocketOp;
pub use self::state::{CoreState, TransmitSink};
pub use self::stats::{DROP_REASONS, LatencyHistogram, Stats};
pub use self::wheel::{TimerHandle, TimerWheel};
