//! The internal UDP I/O layer shared by the engine, the responder (`rl-responder`) and
//! loadgen's raw client: one single-threaded, batch-oriented driver per thread with two
//! interchangeable backends behind one interface.
//!
//! - **io_uring** ([`BackendKind::Uring`], the `io-uring` crate, cargo feature
//!   `io-uring`, on by default; without it `src/udp/uring_off.rs` stands in, `Auto` is mmsg
//!   and `Uring` fails at [`UdpIo::new`] with [`io::ErrorKind::Unsupported`]): one multishot
//!   `IORING_OP_RECVMSG` per socket into a provided-buffer ring, and each
//!   [`UdpIo::run_once`] does one `io_uring_enter` that carries the loop's sends and
//!   waits until a completion arrives or the timeout passes (the timeout travels as the
//!   enter's extended argument, so no timeout SQE has to be reaped or cancelled).
//!   Cross-thread wake-ups arrive as the completion of a read on an eventfd.
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
//! [`IoEvent::SendFailed`] with [`io::ErrorKind::WouldBlock`]; when every queued datagram
//! is fresh, [`UdpIo::queue_send`] returns `false` and the caller decides.
//!
//! Threading: a driver is used by one thread. With io_uring it binds itself to the
//! first thread that calls [`UdpIo::run_once`] (`IORING_SETUP_SINGLE_ISSUER`); it may
//! be created on another thread and moved before that. Other threads reach it only
//! through its [`Waker`].

mod gro;
mod gso;
mod mmsg;
mod socket;
#[cfg(feature = "io-uring")]
mod uring;
#[cfg(not(feature = "io-uring"))]
#[path = "uring_off.rs"]
mod uring;
mod wake;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use socket2::Socket;

pub use gso::SendQueue;
pub use socket::{BindOptions, STEER_PORT_FIRST, STEER_PORT_LAST};
pub use wake::Waker;

/// Most segments the kernel accepts in one GSO send (`UDP_MAX_SEGMENTS`).
pub const GSO_MAX_SEGMENTS: usize = 64;
/// Most payload bytes of one GSO send (one IP datagram's worth).
pub const GSO_MAX_BYTES: usize = 65_507;
/// Size of one receive buffer while GRO is on (a coalesced run of datagrams).
pub const GRO_BUFFER: usize = 65_536;

/// The backend a driver runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// io_uring: multishot receives into a provided-buffer ring, one enter per loop.
    Uring,
    /// `sendmmsg`/`recvmmsg` with a `poll(2)` wait.
    Mmsg,
}

impl BackendKind {
    /// "uring" or "mmsg".
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Uring => "uring",
            BackendKind::Mmsg => "mmsg",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackendChoice {
    /// io_uring, falling back to mmsg where the kernel refuses it (EPERM, ENOSYS,
    /// EINVAL, EOPNOTSUPP, ENOMEM: seccomp, `io_uring_disabled`, old kernels,
    /// locked-memory limits).
    #[default]
    Auto,
    /// io_uring only ([`UdpIo::new`] fails where it is refused).
    Uring,
    /// mmsg only.
    Mmsg,
}

impl BackendChoice {
    /// "auto", "uring" or "mmsg".
    pub fn as_str(self) -> &'static str {
        match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Uring => "uring",
            BackendChoice::Mmsg => "mmsg",
        }
    }

    /// False for `Uring` in a build without the `io-uring` cargo feature (where
    /// [`UdpIo::new`] refuses it); `Auto` and `Mmsg` are always there.
    pub fn compiled(self) -> bool {
        self != BackendChoice::Uring || cfg!(feature = "io-uring")
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not "auto", "uring" ("io_uring") or "mmsg".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown I/O backend {0:?} (expected auto, uring or mmsg)")]
pub struct UnknownBackend(pub String);

impl FromStr for BackendChoice {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "uring" | "io_uring" | "io-uring" => Ok(BackendChoice::Uring),
            "mmsg" => Ok(BackendChoice::Mmsg),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

/// Configuration of one [`UdpIo`].
#[derive(Clone, Debug)]
pub struct IoConfig {
    /// Backend (default [`BackendChoice::Auto`]).
    pub backend: BackendChoice,
    /// Send equal-size datagrams to one destination as GSO super-buffers (default on).
    pub gso: bool,
    /// Receive coalesced runs with `UDP_GRO` (default on).
    pub gro: bool,
    /// `SO_RCVBUF` of every socket in bytes (0 keeps the system default; default 4 MiB).
    pub recv_buf: usize,
    /// `SO_SNDBUF` of every socket in bytes (0 keeps the system default; default 4 MiB).
    pub send_buf: usize,
    /// Most sockets open at once ([`UdpIo::bind`] refuses more; default 64).
    pub max_sockets: usize,
    /// Datagrams handed to the caller per [`UdpIo::run_once`] at most (a GRO buffer
    /// is never split across two calls, so one call may exceed it by up to 63);
    /// also sizes the receive batch (default 256).
    pub batch: usize,
    /// Datagrams the send queue holds (default 1024; at least `batch + 64`).
    pub send_capacity: usize,
    /// Largest datagram sent or received without GRO in bytes (default 2048).
    pub max_datagram: usize,
}

impl Default for IoConfig {
    fn default() -> Self {
        IoConfig {
            backend: BackendChoice::Auto,
            gso: true,
            gro: true,
            recv_buf: 4 << 20,
            send_buf: 4 << 20,
            max_sockets: 64,
            batch: 256,
            send_capacity: 1024,
            max_datagram: 2048,
        }
    }
}

/// One socket of a driver (index and generation: a closed socket's id never matches a
/// later socket's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketId(u32);

impl SocketId {
    fn new(index: usize, generation: u16) -> SocketId {
        SocketId(((generation as u32) << 16) | index as u32)
    }

    /// Slot of this socket in its driver (below [`IoConfig::max_sockets`]).
    pub fn index(self) -> usize {
        (self.0 & 0xFFFF) as usize
    }

    fn generation(self) -> u16 {
        (self.0 >> 16) as u16
    }

    /// The raw value (index and generation), e.g. for logs.
    pub fn raw(self) -> u32 {
        self.0
    }

    /// The id whose [`raw`](Self::raw) value is `raw`: for a simulation or a test that
    /// drives a core's state without sockets and chooses the ids itself.
    pub fn from_raw(raw: u32) -> SocketId {
        SocketId(raw)
    }
}

/// What [`UdpIo::run_once`] reports.
#[derive(Debug)]
pub enum IoEvent<'a> {
    /// One datagram (a GRO buffer arrives as one event per segment). `data` is mutable
    /// so the caller can decrypt in place; it is valid for this call only.
    Datagram {
        /// The socket it arrived on.
        sock: SocketId,
        /// Its source address.
        from: SocketAddr,
        /// Its bytes.
        data: &'a mut [u8],
    },
    /// A queued datagram could not be sent (`tag` as given to `queue_send`).
    /// `WouldBlock`: the send buffer stayed full and the queue overflowed;
    /// `NotConnected`: its socket was closed first; anything else: the kernel's error.
    SendFailed {
        /// The caller's tag.
        tag: u64,
        /// Why.
        error: io::ErrorKind,
    },
    /// Another thread called [`Waker::wake`] (several calls before the driver notices
    /// make one event).
    Woken,
}

/// Number of buckets of the per-operation histograms: datagrams 1, 2–3, 4–7, 8–15,
/// 16–31, 32–63, 64–127, 128 and more.
pub const HIST_BUCKETS: usize = 8;

fn hist_bucket(n: usize) -> usize {
    (usize::BITS - 1 - n.max(1).leading_zeros()).min(HIST_BUCKETS as u32 - 1) as usize
}

/// Send errors by kind (each counts datagrams).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendErrors {
    /// Dropped after `EAGAIN` because the queue overflowed.
    pub would_block: u64,
    /// Dropped because their socket was closed while they were queued.
    pub closed: u64,
    /// `EMSGSIZE`.
    pub too_big: u64,
    /// `ECONNREFUSED`, `ENETUNREACH`, `EHOSTUNREACH`, `EACCES`, `EPERM`.
    pub unreachable: u64,
    /// Anything else.
    pub other: u64,
}

/// Counters of one driver (single writer; read with [`UdpIo::stats`]).
#[derive(Clone, Debug)]
pub struct IoStats {
    /// The backend in use.
    pub backend: BackendKind,
    /// Calls of `run_once`.
    pub loops: u64,
    /// System calls that carried sends (`sendmmsg` calls; `io_uring_enter` calls with
    /// send SQEs).
    pub send_calls: u64,
    /// Send operations (message headers / SQEs); one GSO super-buffer is one.
    pub send_ops: u64,
    /// Datagrams handed to the kernel successfully.
    pub datagrams_sent: u64,
    /// Send operations that carried more than one datagram (GSO).
    pub gso_sends: u64,
    /// Send operations by datagrams carried (see [`HIST_BUCKETS`]).
    pub send_hist: [u64; HIST_BUCKETS],
    /// Receive system calls that returned data (`recvmmsg`; `io_uring_enter` calls
    /// whose completions held datagrams).
    pub recv_calls: u64,
    /// Received buffers (messages / completions); one GRO buffer is one.
    pub recv_ops: u64,
    /// Datagrams delivered to the caller.
    pub datagrams_received: u64,
    /// Received buffers that held more than one datagram (GRO).
    pub gro_buffers: u64,
    /// Received buffers by datagrams held (see [`HIST_BUCKETS`]).
    pub recv_hist: [u64; HIST_BUCKETS],
    /// Sockets that fell back from GSO to per-datagram sends (kernel refused GSO).
    pub gso_fallbacks: u64,
    /// Sockets on which `UDP_GRO` could not be enabled.
    pub gro_fallbacks: u64,
    /// Send errors by kind.
    pub send_errors: SendErrors,
    /// Times a send met a full socket buffer (`EAGAIN`) and was kept for a retry.
    pub eagain_waits: u64,
    /// Wake-ups delivered.
    pub wakes: u64,
    /// Received datagrams dropped because they did not fit the buffer.
    pub recv_truncated: u64,
    /// Receive errors other than "nothing there".
    pub recv_errors: u64,
    /// io_uring: multishot receives re-armed (after running out of buffers, etc.).
    pub recv_rearms: u64,
}

impl IoStats {
    /// Zeroed counters of a driver on `backend`.
    pub fn new(backend: BackendKind) -> IoStats {
        IoStats {
            backend,
            loops: 0,
            send_calls: 0,
            send_ops: 0,
            datagrams_sent: 0,
            gso_sends: 0,
            send_hist: [0; HIST_BUCKETS],
            recv_calls: 0,
            recv_ops: 0,
            datagrams_received: 0,
            gro_buffers: 0,
            recv_hist: [0; HIST_BUCKETS],
            gso_fallbacks: 0,
            gro_fallbacks: 0,
            send_errors: SendErrors::default(),
            eagain_waits: 0,
            wakes: 0,
            recv_truncated: 0,
            recv_errors: 0,
            recv_rearms: 0,
        }
    }

    /// Average datagrams per send operation.
    pub fn datagrams_per_send(&self) -> f64 {
        ratio(self.datagrams_sent, self.send_ops)
    }

    /// Average datagrams per send system call.
    pub fn datagrams_per_send_call(&self) -> f64 {
        ratio(self.datagrams_sent, self.send_calls)
    }

    /// Average datagrams per received buffer.
    pub fn datagrams_per_recv(&self) -> f64 {
        ratio(self.datagrams_received, self.recv_ops)
    }

    /// Average datagrams per receive system call.
    pub fn datagrams_per_recv_call(&self) -> f64 {
        ratio(self.datagrams_received, self.recv_calls)
    }

    /// Adds `o` counter by counter (the backend stays this one's).
    pub fn merge(&mut self, o: &IoStats) {
        self.loops += o.loops;
        self.send_calls += o.send_calls;
        self.send_ops += o.send_ops;
        self.datagrams_sent += o.datagrams_sent;
        self.gso_sends += o.gso_sends;
        self.recv_calls += o.recv_calls;
        self.recv_ops += o.recv_ops;
        self.datagrams_received += o.datagrams_received;
        self.gro_buffers += o.gro_buffers;
        for i in 0..HIST_BUCKETS {
            self.send_hist[i] += o.send_hist[i];
            self.recv_hist[i] += o.recv_hist[i];
        }
        self.gso_fallbacks += o.gso_fallbacks;
        self.gro_fallbacks += o.gro_fallbacks;
        let (a, b) = (&mut self.send_errors, &o.send_errors);
        a.would_block += b.would_block;
        a.closed += b.closed;
        a.too_big += b.too_big;
        a.unreachable += b.unreachable;
        a.other += b.other;
        self.eagain_waits += o.eagain_waits;
        self.wakes += o.wakes;
        self.recv_truncated += o.recv_truncated;
        self.recv_errors += o.recv_errors;
        self.recv_rearms += o.recv_rearms;
    }

    fn count_send_op(&mut self, datagrams: usize) {
        self.send_ops += 1;
        self.datagrams_sent += datagrams as u64;
        if datagrams > 1 {
            self.gso_sends += 1;
        }
        self.send_hist[hist_bucket(datagrams)] += 1;
    }

    fn count_recv_op(&mut self, datagrams: usize) {
        self.recv_ops += 1;
        if datagrams > 1 {
            self.gro_buffers += 1;
        }
        self.recv_hist[hist_bucket(datagrams)] += 1;
    }

    fn count_send_error(&mut self, kind: io::ErrorKind, n: u64) {
        let e = &mut self.send_errors;
        match kind {
            io::ErrorKind::WouldBlock => e.would_block += n,
            io::ErrorKind::NotConnected => e.closed += n,
            io::ErrorKind::ConnectionRefused
            | io::ErrorKind::NetworkUnreachable
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::PermissionDenied => e.unreachable += n,
            _ if kind == io::Error::from_raw_os_error(libc::EMSGSIZE).kind() => e.too_big += n,
            _ => e.other += n,
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// One open socket of a driver.
pub(crate) struct SockEntry {
    pub(crate) sock: Socket,
    pub(crate) local: SocketAddr,
    pub(crate) v6: bool,
    /// GSO allowed (configured and not refused by the kernel).
    pub(crate) gso: bool,
    /// GRO enabled on the socket.
    pub(crate) gro: bool,
    /// A send met EAGAIN: also wait for writability.
    pub(crate) want_write: bool,
}

/// How socket `id` stands for grouping (None: closed).
pub(crate) fn sock_info(
    socks: &[Option<SockEntry>],
    gens: &[u16],
    id: SocketId,
) -> Option<gso::SockInfo> {
    if gens.get(id.index()) != Some(&id.generation()) {
        return None;
    }
    socks.get(id.index())?.as_ref().map(|e| gso::SockInfo {
        v6: e.v6,
        gso: e.gso,
    })
}

/// State shared by both backends: sockets, send queue, stats, waker, configuration.
pub(crate) struct Common {
    pub(crate) cfg: IoConfig,
    pub(crate) socks: Vec<Option<SockEntry>>,
    pub(crate) gens: Vec<u16>,
    pub(crate) open: usize,
    pub(crate) sendq: SendQueue,
    pub(crate) stats: IoStats,
    pub(crate) waker: Arc<Waker>,
    /// Test hook: send operations still to fail with a simulated EAGAIN.
    #[cfg(test)]
    pub(crate) fake_eagain: u32,
    #[cfg(test)]
    faked: bool,
}

impl Common {
    /// The entry of `id` when it is still open.
    pub(crate) fn entry(&self, id: SocketId) -> Option<&SockEntry> {
        let i = id.index();
        if self.gens.get(i) != Some(&id.generation()) {
            return None;
        }
        self.socks.get(i)?.as_ref()
    }

    pub(crate) fn entry_mut(&mut self, id: SocketId) -> Option<&mut SockEntry> {
        let i = id.index();
        if self.gens.get(i) != Some(&id.generation()) {
            return None;
        }
        self.socks.get_mut(i)?.as_mut()
    }

    /// The id of the open socket in slot `index`.
    pub(crate) fn id_at(&self, index: usize) -> Option<SocketId> {
        match self.socks.get(index) {
            Some(Some(_)) => Some(SocketId::new(index, self.gens[index])),
            _ => None,
        }
    }

    /// Reports the failures recorded since the last call; returns how many.
    pub(crate) fn report_failures(
        &mut self,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let mut n = 0;
        while let Some((tag, error)) = self.sendq.take_failure() {
            self.stats.count_send_error(error, 1);
            on_event(&mut self.sendq, IoEvent::SendFailed { tag, error });
            n += 1;
        }
        n
    }

    /// Test hook: true when this send operation is to fail with a simulated EAGAIN
    /// (loopback never fills a send buffer: the kernel orphans its skbs at once).
    #[cfg(test)]
    pub(crate) fn fake_eagain(&mut self) -> bool {
        self.faked = self.fake_eagain > 0;
        if self.faked {
            self.fake_eagain -= 1;
        }
        self.faked
    }

    #[cfg(not(test))]
    #[inline(always)]
    pub(crate) fn fake_eagain(&mut self) -> bool {
        false
    }

    #[cfg(test)]
    pub(crate) fn faked(&self) -> bool {
        self.faked
    }

    #[cfg(not(test))]
    #[inline(always)]
    pub(crate) fn faked(&self) -> bool {
        false
    }

    /// Marks socket `id` as refusing GSO (first time only: counted).
    pub(crate) fn gso_refused(&mut self, id: SocketId) {
        if let Some(e) = self.entry_mut(id)
            && e.gso
        {
            e.gso = false;
            self.stats.gso_fallbacks += 1;
            tracing::warn!("UDP GSO refused by the kernel on a socket: per-datagram sends there");
        }
    }
}

enum Backend {
    Uring(Box<uring::Uring>),
    Mmsg(mmsg::Mmsg),
}

/// One thread's UDP driver: owns its sockets, its io_uring or poll set, its send arena
/// and receive buffers. See the module docs.
pub struct UdpIo {
    // the backend drops first: io_uring cancels its requests before the sockets close
    backend: Backend,
    common: Common,
}

// SAFETY: the raw pointers inside (io_uring's mapped rings, the buffer ring, message
// headers pointing into the driver's own boxes) all point into memory the driver owns;
// nothing is shared with another thread except the `Arc<Waker>`, which is Sync.
unsafe impl Send for UdpIo {}

/// True for the errors with which a kernel or sandbox refuses io_uring, or a build
/// without the `io-uring` feature does (`Unsupported`).
fn uring_refused(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
        || matches!(
            e.raw_os_error(),
            Some(
                libc::EPERM
                    | libc::ENOSYS
                    | libc::EINVAL
                    | libc::EOPNOTSUPP
                    | libc::ENOMEM
                    | libc::EACCES
            )
        )
}

impl UdpIo {
    /// A driver with no sockets yet. Fails only when the chosen backend cannot start
    /// (with `Auto`, only when mmsg cannot either: no eventfd).
    pub fn new(cfg: &IoConfig) -> io::Result<UdpIo> {
        let mut cfg = cfg.clone();
        cfg.batch = cfg.batch.clamp(1, 4096);
        cfg.max_sockets = cfg.max_sockets.clamp(1, 0xFFFF);
        cfg.max_datagram = cfg.max_datagram.clamp(64, GRO_BUFFER);
        cfg.send_capacity = cfg
            .send_capacity
            .clamp(cfg.batch + GSO_MAX_SEGMENTS, 1 << 20);
        let backend = match cfg.backend {
            BackendChoice::Mmsg => None,
            BackendChoice::Uring => Some(uring::Uring::new(&cfg)?),
            BackendChoice::Auto => match uring::Uring::new(&cfg) {
                Ok(u) => Some(u),
                Err(e) if uring_refused(&e) => None,
                Err(e) => return Err(e),
            },
        };
        let (backend, waker) = match backend {
            Some((u, w)) => (Backend::Uring(Box::new(u)), w),
            None => {
                let (m, w) = mmsg::Mmsg::new(&cfg)?;
                (Backend::Mmsg(m), w)
            }
        };
        let kind = match backend {
            Backend::Uring(_) => BackendKind::Uring,
            Backend::Mmsg(_) => BackendKind::Mmsg,
        };
        let max = cfg.max_sockets;
        Ok(UdpIo {
            common: Common {
                sendq: SendQueue::new(cfg.send_capacity, cfg.max_datagram),
                socks: (0..max).map(|_| None).collect(),
                gens: vec![0; max],
                open: 0,
                stats: IoStats::new(kind),
                waker,
                cfg,
                #[cfg(test)]
                fake_eagain: 0,
                #[cfg(test)]
                faked: false,
            },
            backend,
        })
    }

    /// The backend in use.
    pub fn kind(&self) -> BackendKind {
        self.common.stats.backend
    }

    /// The configuration in force (after clamping).
    pub fn config(&self) -> &IoConfig {
        &self.common.cfg
    }

    /// A handle other threads use to end this driver's wait.
    pub fn waker(&self) -> Arc<Waker> {
        self.common.waker.clone()
    }

    /// Binds a UDP socket on `addr` (IPv6: dual stack) and registers it for receiving.
    pub fn bind(&mut self, addr: SocketAddr) -> io::Result<SocketId> {
        self.bind_with(addr, BindOptions::default())
    }

    /// [`bind`](Self::bind) with options (e.g. `SO_REUSEPORT`).
    pub fn bind_with(&mut self, addr: SocketAddr, opts: BindOptions) -> io::Result<SocketId> {
        let slot = self.free_slot()?;
        let sock = socket::open(addr, &self.common.cfg, opts)?;
        Ok(self.adopt(slot, sock))
    }

    /// Steering rebind (docs/protocol.md §14): binds the "any" address (IPv6 dual stack when
    /// `v6`) on the next free port after `after_port` in 49152..=65535 (from 49152 when
    /// `after_port` is outside the range), wrapping, skipping ports in use, trying at
    /// most `max_tries` ports. The caller keeps its old socket until it has drained.
    pub fn bind_steering(
        &mut self,
        v6: bool,
        after_port: u16,
        max_tries: u16,
    ) -> io::Result<SocketId> {
        let slot = self.free_slot()?;
        let sock = socket::bind_steering(v6, after_port, max_tries, &self.common.cfg)?;
        Ok(self.adopt(slot, sock))
    }

    fn free_slot(&self) -> io::Result<usize> {
        self.common
            .socks
            .iter()
            .position(Option::is_none)
            .ok_or_else(|| {
                io::Error::other(format!(
                    "UDP driver already has its maximum of {} sockets",
                    self.common.cfg.max_sockets
                ))
            })
    }

    fn adopt(&mut self, slot: usize, opened: socket::Opened) -> SocketId {
        let c = &mut self.common;
        if c.cfg.gro && !opened.gro {
            c.stats.gro_fallbacks += 1;
            tracing::warn!("UDP GRO unavailable on a socket: per-datagram receives there");
        }
        c.socks[slot] = Some(SockEntry {
            v6: opened.local.is_ipv6(),
            local: opened.local,
            sock: opened.sock,
            gso: c.cfg.gso,
            gro: opened.gro,
            want_write: false,
        });
        c.open += 1;
        let id = SocketId::new(slot, c.gens[slot]);
        if let Backend::Uring(u) = &mut self.backend {
            u.socket_added(slot);
        }
        id
    }

    /// Closes socket `id`. Datagrams still queued for it are reported as
    /// [`IoEvent::SendFailed`] with `NotConnected` on the next `run_once`; sends the
    /// kernel already has complete normally. Unknown or closed ids are ignored.
    pub fn close(&mut self, id: SocketId) {
        let c = &mut self.common;
        if c.entry(id).is_none() {
            return;
        }
        let i = id.index();
        let entry = c.socks[i].take();
        c.gens[i] = c.gens[i].wrapping_add(1);
        c.open -= 1;
        c.sendq.fail_socket(id);
        if let Backend::Uring(u) = &mut self.backend {
            u.socket_closed(i, id);
        }
        drop(entry);
    }

    /// The local address of socket `id` (None once closed).
    pub fn local_addr(&self, id: SocketId) -> Option<SocketAddr> {
        self.common.entry(id).map(|e| e.local)
    }

    /// The socket behind `id` (to read or set options the driver does not manage).
    pub fn socket(&self, id: SocketId) -> Option<&Socket> {
        self.common.entry(id).map(|e| &e.sock)
    }

    /// Number of open sockets.
    pub fn socket_count(&self) -> usize {
        self.common.open
    }

    /// True while GSO is in use on socket `id` (configured and not refused).
    pub fn gso_active(&self, id: SocketId) -> bool {
        self.common.entry(id).is_some_and(|e| e.gso)
    }

    /// True while GRO is enabled on socket `id`.
    pub fn gro_active(&self, id: SocketId) -> bool {
        self.common.entry(id).is_some_and(|e| e.gro)
    }

    /// Copies `bytes` into the send arena for `to` on `sock`; sent by the next
    /// `run_once` (or [`flush`](Self::flush)). Returns false when nothing was queued:
    /// the queue holds only fresh datagrams and is full (flush first), or `bytes` is
    /// longer than [`IoConfig::max_datagram`]. A datagram for a closed socket is queued
    /// and then reported as failed.
    pub fn queue_send(&mut self, sock: SocketId, to: SocketAddr, bytes: &[u8], tag: u64) -> bool {
        self.common.sendq.push(sock, to, bytes, tag)
    }

    /// The send queue (the same one `run_once` hands to its callback).
    pub fn send_queue(&mut self) -> &mut SendQueue {
        &mut self.common.sendq
    }

    /// Sends what is queued (GSO-grouped), then waits until datagrams arrive, a send
    /// fails, a wake-up comes or `timeout` passes (`None`: no limit; `Some(ZERO)`: do not
    /// block), and calls `on_event` for every event. The callback may queue sends on the
    /// [`SendQueue`] it is given; they go out on the next call. No allocation.
    pub fn run_once(
        &mut self,
        timeout: Option<Duration>,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        self.common.stats.loops += 1;
        match &mut self.backend {
            Backend::Uring(u) => u.run_once(&mut self.common, timeout, on_event),
            Backend::Mmsg(m) => m.run_once(&mut self.common, timeout, on_event),
        }
    }

    /// Sends what is queued, then receives without waiting and without `poll(2)`: the
    /// datagrams a previous call left over first, then one `recvmmsg` on each socket
    /// for which `read` says so. For a driver whose readiness is tracked by someone
    /// else (a hosted engine core waits in its async runtime, see
    /// `engine::hosted`); the io_uring backend does one non-blocking `run_once`.
    pub fn run_nowait(
        &mut self,
        read: &dyn Fn(SocketId) -> bool,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        self.common.stats.loops += 1;
        match &mut self.backend {
            Backend::Uring(u) => u.run_once(&mut self.common, Some(Duration::ZERO), on_event),
            Backend::Mmsg(m) => {
                m.run_nowait(&mut self.common, read, on_event);
                Ok(())
            }
        }
    }

    /// After [`run_nowait`](Self::run_nowait): true when datagrams may be left to
    /// receive without a new readiness event (a `recvmmsg` filled every buffer or the
    /// batch budget ran out); false when every socket it read was drained. Always
    /// true with io_uring.
    pub fn may_have_more(&self) -> bool {
        match &self.backend {
            Backend::Uring(_) => true,
            Backend::Mmsg(m) => m.may_have_more(),
        }
    }

    /// True while sends on socket `id` wait for room in its send buffer (EAGAIN): a
    /// driver that waits elsewhere waits for the socket to become writable, then
    /// calls [`writable`](Self::writable).
    pub fn wants_write(&self, id: SocketId) -> bool {
        self.common.entry(id).is_some_and(|e| e.want_write)
    }

    /// Socket `id` has room again: its waiting sends go out on the next call.
    pub fn writable(&mut self, id: SocketId) {
        if let Some(e) = self.common.entry_mut(id) {
            e.want_write = false;
        }
    }

    /// Sends what is queued without waiting. Only [`IoEvent::SendFailed`] reaches
    /// `on_event`; datagrams and wake-ups that arrive meanwhile are kept for the next
    /// `run_once`.
    pub fn flush(
        &mut self,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        match &mut self.backend {
            Backend::Uring(u) => u.flush(&mut self.common, on_event),
            Backend::Mmsg(m) => {
                m.send_all(&mut self.common);
                self.common.report_failures(on_event);
                Ok(())
            }
        }
    }

    /// The counters.
    pub fn stats(&self) -> &IoStats {
        &self.common.stats
    }
}

impl fmt::Debug for UdpIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpIo")
            .field("backend", &self.kind())
            .field("sockets", &self.common.open)
            .field("queued", &self.common.sendq.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drivers(backend: BackendChoice, batch: usize) -> Option<(UdpIo, SocketId, UdpIo, SocketId)> {
        let cfg = IoConfig {
            backend,
            batch,
            ..IoConfig::default()
        };
        let mut a = UdpIo::new(&cfg).ok()?;
        let mut b = UdpIo::new(&cfg).ok()?;
        let sa = a.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let sb = b.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        Some((a, sa, b, sb))
    }

    fn drain(d: &mut UdpIo, want: usize) -> usize {
        let mut n = 0;
        for _ in 0..100 {
            d.run_once(Some(Duration::from_millis(10)), &mut |_, ev| {
                if let IoEvent::Datagram { .. } = ev {
                    n += 1;
                }
            })
            .unwrap();
            if n >= want {
                break;
            }
        }
        n
    }

    /// EAGAIN keeps datagrams queued and retries them on later loops (the wait also
    /// ends on writability); nothing is lost or reported.
    #[test]
    fn eagain_keeps_datagrams_queued_and_retries() {
        for backend in [BackendChoice::Uring, BackendChoice::Mmsg] {
            let Some((mut a, sa, mut b, sb)) = drivers(backend, 256) else {
                continue;
            };
            let to = b.local_addr(sb).unwrap();
            for i in 0..300u64 {
                assert!(a.queue_send(sa, to, &[i as u8; 200], i));
            }
            a.common.fake_eagain = 3;
            let mut loops = 0;
            while !a.send_queue().is_empty() && loops < 50 {
                a.run_once(Some(Duration::from_millis(5)), &mut |_, ev| {
                    panic!("unexpected {ev:?}")
                })
                .unwrap();
                loops += 1;
            }
            assert!(a.send_queue().is_empty(), "{backend:?}");
            assert_eq!(a.stats().eagain_waits, 3, "{backend:?}");
            assert_eq!(a.stats().datagrams_sent, 300);
            assert_eq!(drain(&mut b, 300), 300, "{backend:?}");
        }
    }

    /// A queue full of datagrams that met EAGAIN drops the oldest of them, reported as
    /// WouldBlock, to make room; fresh datagrams are never dropped that way.
    #[test]
    fn eagain_overflow_reports_would_block() {
        for backend in [BackendChoice::Uring, BackendChoice::Mmsg] {
            let Some((mut a, sa, mut b, sb)) = drivers(backend, 1) else {
                continue;
            };
            let to = b.local_addr(sb).unwrap();
            let cap = a.send_queue().capacity();
            for i in 0..cap as u64 {
                assert!(a.queue_send(sa, to, &[1; 100], i));
            }
            assert!(
                !a.queue_send(sa, to, &[1; 100], 999),
                "full of fresh datagrams"
            );
            a.common.fake_eagain = u32::MAX;
            a.run_once(Some(Duration::ZERO), &mut |_, ev| {
                panic!("unexpected {ev:?}")
            })
            .unwrap();
            assert_eq!(a.send_queue().len(), cap, "{backend:?}: all kept");
            for i in 0..10u64 {
                assert!(a.queue_send(sa, to, &[2; 100], 1000 + i));
            }
            a.common.fake_eagain = 0;
            let mut failed = Vec::new();
            for _ in 0..20 {
                a.run_once(Some(Duration::from_millis(1)), &mut |_, ev| {
                    if let IoEvent::SendFailed { tag, error } = ev {
                        assert_eq!(error, io::ErrorKind::WouldBlock);
                        failed.push(tag);
                    }
                })
                .unwrap();
                if a.send_queue().is_empty() {
                    break;
                }
            }
            assert_eq!(
                failed,
                (0..10).collect::<Vec<u64>>(),
                "{backend:?}: the oldest went"
            );
            assert_eq!(a.stats().send_errors.would_block, 10);
            assert_eq!(a.stats().datagrams_sent, cap as u64);
            assert_eq!(drain(&mut b, cap), cap);
        }
    }

    #[test]
    fn hist_buckets() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(2), 1);
        assert_eq!(hist_bucket(3), 1);
        assert_eq!(hist_bucket(4), 2);
        assert_eq!(hist_bucket(63), 5);
        assert_eq!(hist_bucket(64), 6);
        assert_eq!(hist_bucket(1000), 7);
    }

    #[test]
    fn refusals_that_fall_back_to_mmsg() {
        for e in [
            libc::EPERM,
            libc::ENOSYS,
            libc::EINVAL,
            libc::EOPNOTSUPP,
            libc::ENOMEM,
        ] {
            assert!(uring_refused(&io::Error::from_raw_os_error(e)));
        }
        assert!(!uring_refused(&io::Error::from_raw_os_error(libc::EMFILE)));
        // what the stand-in of a build without the `io-uring` feature answers
        assert!(uring_refused(&io::Error::from(io::ErrorKind::Unsupported)));
    }

    #[test]
    fn backend_choice_parses() {
        assert_eq!("uring".parse::<BackendChoice>(), Ok(BackendChoice::Uring));
        assert_eq!(
            "io_uring".parse::<BackendChoice>(),
            Ok(BackendChoice::Uring)
        );
        assert_eq!("mmsg".parse::<BackendChoice>(), Ok(BackendChoice::Mmsg));
        assert_eq!("auto".parse::<BackendChoice>(), Ok(BackendChoice::Auto));
        assert!("epoll".parse::<BackendChoice>().is_err());
    }
}
