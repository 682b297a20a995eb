//! Configuration of a [`UdpIo`](super::UdpIo): the backend choice, the buffer and
//! batch sizes, and the kernel's GSO/GRO limits.
//!
//! Owns: the settings, their defaults and the backend names. Must not touch: sockets,
//! the backends' state (the driver clamps the values when it starts, see
//! [`UdpIo::new`](super::UdpIo::new)).

use std::fmt;
use std::str::FromStr;

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

/// Who calls a driver, which decides how its io_uring instance is set up (the mmsg
/// backend is the same for both; `src/udp/ring.rs` says how and why).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Caller {
    /// One thread makes every call and waits inside the driver
    /// ([`UdpIo::run_once`](super::UdpIo::run_once)): a pinned engine core, the
    /// responder, loadgen's raw client. io_uring: `SINGLE_ISSUER | DEFER_TASKRUN` and a
    /// registered ring fd.
    #[default]
    OneThread,
    /// Tasks of an async runtime call the driver from any worker thread and wait in the
    /// runtime for [`UdpIo::readiness_fd`](super::UdpIo::readiness_fd)
    /// ([`UdpIo::run_nowait`](super::UdpIo::run_nowait)): a hosted engine core.
    /// io_uring: `COOP_TASKRUN` (a task that moves between threads cannot be the single
    /// issuer that `DEFER_TASKRUN` needs).
    Runtime,
}

/// Which backend to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackendChoice {
    /// io_uring, falling back to mmsg where the kernel refuses it (EPERM, ENOSYS,
    /// EINVAL, EOPNOTSUPP, ENOMEM: seccomp, `io_uring_disabled`, old kernels,
    /// locked-memory limits).
    #[default]
    Auto,
    /// io_uring only ([`UdpIo::new`](super::UdpIo::new) fails where it is refused).
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
    /// [`UdpIo::new`](super::UdpIo::new) refuses it); `Auto` and `Mmsg` are always there.
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

/// Configuration of one [`UdpIo`](super::UdpIo).
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
    /// Most sockets open at once ([`UdpIo::bind`](super::UdpIo::bind) refuses more; default 64).
    pub max_sockets: usize,
    /// Datagrams handed to the caller per [`UdpIo::run_once`](super::UdpIo::run_once) at most (a GRO buffer
    /// is never split across two calls, so one call may exceed it by up to 63);
    /// also sizes the receive batch (default 256).
    pub batch: usize,
    /// Datagrams the send queue holds (default 1024; at least `batch + 64`).
    pub send_capacity: usize,
    /// Largest datagram sent or received without GRO in bytes (default 2048).
    pub max_datagram: usize,
    /// Who calls the driver (default [`Caller::OneThread`]): decides how io_uring is set
    /// up, and whether [`UdpIo::readiness_fd`](super::UdpIo::readiness_fd) is needed.
    pub caller: Caller,
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
            caller: Caller::OneThread,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
