//! Statistics of a [`UdpIo`](super::UdpIo): operation and datagram counters, the
//! per-operation histograms and the send errors by kind.
//!
//! Owns: the counters and how a send error is classified. Must not touch: sockets or
//! the backends' state (the backends count through the `count_*` methods).

use std::io;

use super::BackendKind;

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

/// Counters of one driver (single writer; read with [`UdpIo::stats`](super::UdpIo::stats)).
#[derive(Clone, Debug)]
pub struct IoStats {
    /// The backend in use.
    pub backend: BackendKind,
    /// Passes: calls of `run_once`, `run_once_for` and `run_nowait`.
    pub loops: u64,
    /// Waits: passes that slept in the kernel until an event or their timeout (a
    /// blocking `poll(2)` or `io_uring_enter`), and the parks of a caller that waits
    /// in a runtime instead ([`UdpIo::count_wait`](super::UdpIo::count_wait)). A core
    /// that loops without ever waiting spins.
    pub waits: u64,
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
            waits: 0,
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
        self.waits += o.waits;
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

    pub(crate) fn count_send_op(&mut self, datagrams: usize) {
        self.send_ops += 1;
        self.datagrams_sent += datagrams as u64;
        if datagrams > 1 {
            self.gso_sends += 1;
        }
        self.send_hist[hist_bucket(datagrams)] += 1;
    }

    /// One received buffer that held `datagrams` datagrams, all delivered.
    pub(crate) fn count_recv_op(&mut self, datagrams: usize) {
        self.recv_ops += 1;
        self.datagrams_received += datagrams as u64;
        if datagrams > 1 {
            self.gro_buffers += 1;
        }
        self.recv_hist[hist_bucket(datagrams)] += 1;
    }

    pub(crate) fn count_send_error(&mut self, kind: io::ErrorKind, n: u64) {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
