//! The sans-IO layer's constants, in one place, each with its reason.
//!
//! Owns: the defaults and bounds of one core's state (in-flight requests, sockets, the
//! report interval), what it reserves up front, the sizes of its inline storage and its
//! send tags. Encodings (free-list markers, flag bits, wire offsets) stay beside the code
//! that reads them. Must not touch: the runtime's constants (`runtime::consts`: queues,
//! batches, waits).

use std::time::Duration;

/// Default in-flight limit per core: a busy core decides about a million requests a second,
/// and each stays in flight up to the horizon H (60 ms by default), so 64 Ki leaves room
/// for bursts and slow servers without the table's memory (16 MiB) mattering.
pub const DEFAULT_IN_FLIGHT: usize = 65_536;

/// Largest in-flight limit: an entry's index travels in 24 bits of the unique id's routing
/// bytes and of the send tag.
pub const MAX_IN_FLIGHT: usize = 1 << 24;

/// In-flight entries (slab cells, timer nodes) reserved when a core starts; beyond it the
/// table grows on demand up to the limit, so a large limit does not cost its whole memory
/// up front.
pub const PREALLOC_MAX: usize = 1 << 16;

/// Sockets a core may hold by default: the current one and those still draining after
/// steering rebinds (a server asks for a rebind at most once per socket).
pub const DEFAULT_MAX_SOCKETS: usize = 16;

/// Default latency-report flush interval: short against the trackers' windows (seconds),
/// long enough that a busy core sends one datagram per endpoint for many reports.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_millis(5);

/// Send tag of latency reports: its kind bits (62..64) are 3, which no request's tag uses
/// (`Key::tag` writes 0, 1 or 2 there).
pub const REPORT_TAG: u64 = u64::MAX;

/// One decision in this many carries its decision time to its caller
/// ([`SlotOutcome::decided_at`](super::SlotOutcome::decided_at)), so that the completion
/// wake is measured with a clock read per sampled completion instead of one per
/// completion.
pub const WAKE_SAMPLE_EVERY: u64 = 8;

/// Datagram bytes stored inline in an in-flight entry; larger datagrams use a pooled
/// buffer. Sized for the common request in aes mode: one resource and one guard
/// (72 + 8 + 4 + 28 + 36 = 148 bytes), or two resources (140 bytes), with the entry at
/// 256 bytes.
pub(crate) const DGRAM_INLINE: usize = 148;

/// The timer wheel's tick: deadlines are whole milliseconds from t0 (the policy's unit).
pub(crate) const WHEEL_TICK: Duration = Duration::from_millis(1);

/// The timer wheel's slots: one revolution lasts 8.2 s, far longer than the horizons in
/// use (tens to hundreds of ms), so a deadline is almost always found on its first pass
/// (a farther one waits in its slot for its turn).
pub(crate) const WHEEL_SLOTS: usize = 8192;

/// Random bytes generated at a time: 4 KiB of ChaCha20 keystream serve about 146
/// datagrams (28 bytes each: a unique id and a nonce).
pub(crate) const RNG_POOL: usize = 4096;

/// Bytes of ChaCha20 keystream generated under one key before it is re-keyed from the
/// entropy source (as arc4random and the kernel's generator do).
pub(crate) const RESEED_BYTES: usize = 1 << 20;

/// Outcomes a core reserves room for between two deliveries (a busy turn completes a few
/// hundred; a burst beyond grows the queue once, and it keeps its room).
pub(crate) const OUTCOMES_PREALLOC: usize = 1024;

/// Responses held at once (round-0 candidates and decisions waiting for the end of a
/// receive batch) reserved up front; the store grows on demand up to the in-flight limit.
pub(crate) const HELD_PREALLOC: usize = 1024;

/// Timers expired in one call reserved up front (the list is reused).
pub(crate) const FIRED_PREALLOC: usize = 1024;

/// Rounds counted individually in `Stats::decisions_by_round`; later rounds share the
/// last bucket (the default policy has two rounds, a long schedule rarely more than 8).
pub const ROUND_BUCKETS: usize = 8;
