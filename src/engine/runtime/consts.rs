//! The runtime layer's constants, in one place, each with its reason.
//!
//! Owns: the engine's public defaults that are not a core state's (socket buffers, the
//! I/O backend, the socket bound), and the runtime's batches, queues and waits. The core
//! state's defaults and bounds are `core::consts`. Encodings (slot states and layout,
//! histogram buckets) stay beside the code that reads them.

use std::time::Duration;

use crate::udp::BackendChoice;

/// Default socket buffer size (each direction): room for a few thousand datagrams, so a
/// burst of answers waits in the kernel while a core finishes its turn.
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;

/// The engine cores' default I/O backend: `recvmmsg`/`sendmmsg` with GSO/GRO. Measured
/// side by side (docs/benchmarks.md, "Backends", has the figures), io_uring costs the same
/// on a pinned core and less where servers answer one datagram at a time, but more CPU per
/// decision on a hosted core with batched answers, the placement rl-proxy and loadgen use
/// by default; io_uring is one `.io_backend(BackendChoice::Auto)` or `Uring` away.
pub const DEFAULT_IO_BACKEND: BackendChoice = BackendChoice::Mmsg;

/// Most sockets a core may be configured to hold (`max_sockets_per_core`): a bound on the
/// descriptors and receive buffers one core may own.
pub const MAX_SOCKETS_PER_CORE: usize = 1024;

/// Shortest and longest latency-report flush intervals accepted: below 1 ms a report
/// datagram would carry a handful of entries; above 10 s the trackers' windows pass.
pub(crate) const REPORT_INTERVAL_RANGE: (Duration, Duration) =
    (Duration::from_millis(1), Duration::from_secs(10));

/// Queue places (and the completion slots beside them) per core, at most: the queue is
/// sized from the in-flight limit up to this bound, which a core drains in 256 turns.
pub(crate) const QUEUE_MAX: usize = 1 << 16;

/// A turn that finds a timer due and no receive for longer than this (the core was held
/// off its CPU: a loaded machine, a task blocking the runtime's thread) receives first,
/// so answers that reached the sockets while it could not run decide their requests
/// before those requests time out. A core that waits for its deadline in the I/O pass
/// comes back within the timer's slack (tens of µs; Tokio's timer rounds to 1 ms), so
/// this costs nothing at the usual pace.
pub(crate) const STALL: Duration = Duration::from_millis(2);

/// Submissions a core takes from its queue per turn: bounds a turn's work, so received
/// datagrams and timers are served between batches of submissions.
pub(crate) const DRAIN: usize = 256;

/// Datagrams handed to the state per I/O pass (the receive batch of one `recvmmsg` or of
/// the ring's completions): the same bound as for submissions.
pub(crate) const RECV_BATCH: usize = 256;

/// Datagrams the send queue holds: a turn's transmits (256 submissions to a few servers,
/// their replays and completion resends), grouped by GSO when flushed.
pub(crate) const SEND_CAPACITY: usize = 8192;

/// Largest datagram a core receives: above the protocol's 1,200 bytes, so a longer one is
/// seen (and dropped by its checks) instead of truncated.
pub(crate) const RECV_DATAGRAM_MAX: usize = 2048;

/// Send failures reported back to the state, reserved up front (the list is reused).
pub(crate) const FAILED_PREALLOC: usize = 1024;

/// Rounds of feeding send failures back per turn (each may queue replays that fail in
/// turn): bounds the work when every send fails.
pub(crate) const FAILURE_ROUNDS: usize = 4;

/// Ports tried per steering rebind (each a bind(2)): never an unbounded scan.
pub(crate) const REBIND_TRIES: u16 = 32;

/// How long the wall clock (the requests' timestamps) is derived from the monotonic one
/// before it is read again: one clock read per turn instead of two, and a step of the
/// wall clock is followed within 100 ms.
pub(crate) const WALL_RESYNC: Duration = Duration::from_millis(100);

/// How often a busy core publishes its statistics unasked: readers see figures at most
/// this old, at the cost of one histogram copy (tens of µs) per interval.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Least time between two publications of an idle core's histograms (its counters are
/// published at every pause that follows work): a core that pauses often does not copy
/// its histograms at each pause.
pub(crate) const PUBLISH_IDLE_EVERY: Duration = Duration::from_millis(10);

/// How long `EngineHandle::stats` waits for a fresh publication (outside a hosted core's
/// runtime): a busy core answers within a turn, a parked one within its wake-up.
pub(crate) const STATS_WAIT: Duration = Duration::from_millis(100);

/// How often `EngineHandle::stats` looks for the fresh publication it waits for (waking
/// the core again each time): a fraction of a parked core's wake-up.
pub(crate) const STATS_POLL: Duration = Duration::from_micros(200);

/// How often shutdown looks whether the cores are drained (graceful) or stopped (hosted
/// cores, waited for from outside their runtime).
pub(crate) const STOP_POLL: Duration = Duration::from_millis(1);

/// How long a failed core waits between the turns that fail what reaches its queue.
pub(crate) const DEAD_POLL: Duration = Duration::from_millis(1);

/// How long `EngineHandle::flush_reports` waits for each core's answer.
pub(crate) const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long shutdown waits for the submitters already inside the gate: each is between
/// two atomic operations, so only a descheduled thread takes longer.
pub(crate) const GATE_PATIENCE: Duration = Duration::from_secs(5);

/// Graceful shutdown waits the horizon H plus this for the submitted requests to finish:
/// a request ends at the latest at H, and the margin covers the core's last turn.
pub(crate) const GRACE_MARGIN: Duration = Duration::from_millis(100);

/// How long `build` waits for a pinned core to bind its socket (milliseconds normally).
pub(crate) const START_WAIT: Duration = Duration::from_secs(10);

/// How long shutdown, called outside their multi-thread runtime, waits for hosted cores
/// to stop.
pub(crate) const HOSTED_STOP_WAIT: Duration = Duration::from_secs(2);

/// The discovery thread's refresh period (docs/protocol.md §13), sooner by the smallest
/// SRV TTL.
#[cfg(feature = "dns")]
pub(crate) const REFRESH: Duration = Duration::from_secs(300);

/// Least time between two forced refreshes (a core found no endpoint): a core without
/// endpoints asks at every request, DNS is asked at most once a second.
#[cfg(feature = "dns")]
pub(crate) const FORCE_GAP: Duration = Duration::from_secs(1);

/// When discovery asks again after a failure while it still has endpoints: soon enough
/// that a lasting change is seen, far enough apart not to load a failing nameserver.
#[cfg(feature = "dns")]
pub(crate) const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(30);

/// Timeout of one DNS exchange.
#[cfg(feature = "dns")]
pub(crate) const DNS_TIMEOUT: Duration = Duration::from_millis(1000);
