//! The internal UDP I/O layer shared by the engine, the responder (`rl-responder`) and
//! loadgen's raw client: one single-threaded, batch-oriented driver per thread with two
//! interchangeable backends behind one interface.
//!
//! - **io_uring** ([`BackendKind::Uring`], the `io-uring` crate, cargo feature
//!   `io-uring`, on by default; without it `src/udp/uring_off.rs` stands in, `Auto` is mmsg
//!   and `Uring` fails at [`UdpIo::new`] with [`std::io::ErrorKind::Unsupported`]): one multishot
//!   `IORING_OP_RECVMSG` per socket into a provided-buffer ring, and each
//!   [`UdpIo::run_once`] does one `io_uring_enter` that carries the loop's sends and
//!   waits until a completion arrives or the timeout passes (the timeout travels as the
//!   enter's extended argument, so no timeout SQE has to be reaped or cancelled).
//!   Cross-thread wake-ups arrive as the completion of a read on an eventfd (a
//!   runtime's caller is woken as a task instead). Sockets are fixed files; the ring's
//!   setup depends on [`Caller`] (`ring.rs`).
//! - **mmsg** ([`BackendKind::Mmsg`]): `sendmmsg`/`recvmmsg` plus `poll(2)`; chosen
//!   automatically where io_uring is refused (seccomp profiles of container runtimes:
//!   `EPERM`/`ENOSYS`; old kernels: `EINVAL`), or by configuration.
//!
//! Both backends use **UDP GSO** (`UDP_SEGMENT`): queued transmits are grouped by
//! (socket, destination, length) into super-buffers of up to 64 segments / 64 KiB, and a
//! group may end in one shorter datagram; groups leave in the order their (socket,
//! destination) pair was first queued, so the caller decides which server hears first.
//! Both use **UDP GRO** (`UDP_GRO`): a received
//! buffer is split by the segment-size control message. A kernel that refuses GSO
//! (`EIO`/`EINVAL`) or GRO on a socket makes that socket fall back to per-datagram I/O;
//! the fallbacks are counted in [`IoStats`].
//!
//! Owns: socket creation (buffers, dual stack, `SO_REUSEPORT`, steering-range rebinds),
//! the send arena (datagrams are copied in once; no allocation per datagram), the
//! receive buffers, the wait for readiness, and the I/O statistics. Must not touch: the
//! wire format, request state, timers or clocks of its callers (it measures nothing but
//! the remaining wait of one `run_once`). It moves opaque bytes and reports per-datagram
//! send failures through a caller-supplied tag.
//!
//! A full socket send buffer (`EAGAIN`) never blocks the thread: the datagrams stay
//! queued and are retried on the next loop (the wait then also ends when the socket
//! becomes writable). The queue is bounded ([`IoConfig::send_capacity`]); when it is
//! full, the oldest datagram that already met `EAGAIN` is dropped and reported as
//! [`IoEvent::SendFailed`] with [`std::io::ErrorKind::WouldBlock`]; when every queued datagram
//! is fresh, [`UdpIo::queue_send`] returns `false` and the caller decides.
//!
//! Threading: a driver is used by one caller at a time, and [`IoConfig::caller`] says
//! which. [`Caller::OneThread`] (the default): with io_uring the driver binds itself to
//! the first thread that calls [`UdpIo::run_once`] (`IORING_SETUP_SINGLE_ISSUER`); it
//! may be created on another thread and moved before that. [`Caller::Runtime`]: tasks
//! of an async runtime call [`UdpIo::run_nowait`] from any worker thread and wait for
//! [`UdpIo::readiness_fd`] (io_uring) or the sockets (mmsg) in the runtime's reactor.
//! Other threads reach a driver only through its [`Waker`].
//!
//! | File | Holds |
//! |---|---|
//! | `config.rs` | [`IoConfig`], [`BackendChoice`], [`BackendKind`], the GSO/GRO limits |
//! | `stats.rs` | [`IoStats`], [`SendErrors`], the histogram buckets |
//! | `table.rs` | the socket table and [`SocketId`] |
//! | `io.rs` | [`UdpIo`] (the public API, dispatch to a backend) and [`IoEvent`] |
//! | `shared.rs` | the state and glue both backends share (wake-ups, send results, datagram accounting, failure reports, closed sockets) |
//! | `gso.rs` | [`SendQueue`]: the send arena and the GSO grouping |
//! | `gro.rs` | splitting a GRO buffer by its segment size |
//! | `socket.rs` | socket creation, [`BindOptions`], steering rebinds |
//! | `wake.rs` | [`Waker`] and its handshake |
//! | `mmsg.rs`, `uring.rs` | the two backends: their system calls and ring mechanics only (`uring_off.rs` stands in for `uring.rs` without the `io-uring` feature) |
//! | `ring.rs` | io_uring's instance: setup flags per [`Caller`], registrations (ring fd, fixed files), the enter system call |
//! | `bufring.rs` | io_uring's provided-buffer ring: the memory the kernel writes, and parsing a filled buffer |

#[cfg(feature = "io-uring")]
mod bufring;
mod config;
mod gro;
mod gso;
mod io;
mod mmsg;
#[cfg(feature = "io-uring")]
mod ring;
mod shared;
mod socket;
mod stats;
mod table;
#[cfg(feature = "io-uring")]
mod uring;
#[cfg(not(feature = "io-uring"))]
#[path = "uring_off.rs"]
mod uring;
mod wake;

pub use config::{
    BackendChoice, BackendKind, Caller, GRO_BUFFER, GSO_MAX_BYTES, GSO_MAX_SEGMENTS, IoConfig,
    UnknownBackend,
};
pub use gso::SendQueue;
pub use io::{IoEvent, UdpIo};
pub use socket::{BindOptions, STEER_PORT_FIRST, STEER_PORT_LAST, set_int_option};
pub use stats::{HIST_BUCKETS, IoStats, SendErrors};
pub use table::SocketId;
pub use wake::Waker;
#[cfg(feature = "loom")]
pub(crate) use wake::loom_models as wake_models;
