//! [`UdpIo`], one thread's UDP I/O: it dispatches to its backend and owns the socket
//! table, the send queue and the counters through `Common` (shared.rs); [`IoEvent`] is
//! what it reports.
//!
//! Owns: the public API, the choice of backend at start, the clamping of the
//! configuration, and the drop order (the backend's requests are cancelled before the
//! send queue they point into is freed). Must not touch: system calls (the backends
//! make them).

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use socket2::Socket;

use super::shared::Common;
use super::table::SockEntry;
use super::{
    BackendChoice, BackendKind, BindOptions, GRO_BUFFER, GSO_MAX_SEGMENTS, IoConfig, IoStats,
    SendQueue, SocketId, Waker, mmsg, socket, uring,
};

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
    /// Why `Auto` runs mmsg (None otherwise).
    uring_refusal: Option<io::Error>,
}

// `UdpIo` is `Send` by derivation: the fields that hold raw pointers assert it each
// with its own reason (gso.rs `Headers`, mmsg.rs `RecvBufs`, uring.rs `KernelMem`).
const _: fn() = || {
    fn is_send<T: Send>() {}
    is_send::<UdpIo>();
};

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
        let mut uring_refusal = None;
        let backend = match cfg.backend {
            BackendChoice::Mmsg => None,
            BackendChoice::Uring => Some(uring::Uring::new(&cfg)?),
            BackendChoice::Auto => match uring::Uring::new(&cfg) {
                Ok(u) => Some(u),
                Err(e) if uring_refused(&e) => {
                    uring_refusal = Some(e);
                    None
                }
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
        Ok(UdpIo {
            common: Common::new(cfg, IoStats::new(kind), waker),
            backend,
            uring_refusal,
        })
    }

    /// With [`BackendChoice::Auto`] on mmsg: why io_uring was refused (the kernel's or
    /// the sandbox's error, or `Unsupported` in a build without the `io-uring`
    /// feature).
    pub fn uring_refusal(&self) -> Option<&io::Error> {
        self.uring_refusal.as_ref()
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
        self.adopt(slot, sock)
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
        self.adopt(slot, sock)
    }

    fn free_slot(&self) -> io::Result<usize> {
        self.common.table.free_slot().ok_or_else(|| {
            io::Error::other(format!(
                "UDP driver already has its maximum of {} sockets",
                self.common.cfg.max_sockets
            ))
        })
    }

    fn adopt(&mut self, slot: usize, opened: socket::Opened) -> io::Result<SocketId> {
        if let Backend::Uring(u) = &mut self.backend {
            u.socket_added(slot, std::os::fd::AsRawFd::as_raw_fd(&opened.sock))?;
        }
        let c = &mut self.common;
        if c.cfg.gro && !opened.gro {
            c.stats.gro_fallbacks += 1;
            tracing::warn!("UDP GRO unavailable on a socket: per-datagram receives there");
        }
        let id = c.table.insert(
            slot,
            SockEntry {
                v6: opened.local.is_ipv6(),
                local: opened.local,
                sock: opened.sock,
                gso: c.cfg.gso,
                gro: opened.gro,
                want_write: false,
            },
        );
        Ok(id)
    }

    /// Closes socket `id`. Datagrams still queued for it are reported as
    /// [`IoEvent::SendFailed`] with `NotConnected` on the next `run_once`; sends the
    /// kernel already has complete normally. Unknown or closed ids are ignored.
    pub fn close(&mut self, id: SocketId) {
        let c = &mut self.common;
        let Some(entry) = c.table.remove(id) else {
            return;
        };
        c.sendq.fail_socket(id);
        if let Backend::Uring(u) = &mut self.backend {
            u.socket_closed(id.index(), id);
        }
        drop(entry);
    }

    /// The local address of socket `id` (None once closed).
    pub fn local_addr(&self, id: SocketId) -> Option<SocketAddr> {
        self.common.table.entry(id).map(|e| e.local)
    }

    /// The socket behind `id` (to read or set options the driver does not manage).
    pub fn socket(&self, id: SocketId) -> Option<&Socket> {
        self.common.table.entry(id).map(|e| &e.sock)
    }

    /// Number of open sockets.
    pub fn socket_count(&self) -> usize {
        self.common.table.open()
    }

    /// True while GSO is in use on socket `id` (configured and not refused).
    pub fn gso_active(&self, id: SocketId) -> bool {
        self.common.table.entry(id).is_some_and(|e| e.gso)
    }

    /// True while GRO is enabled on socket `id`.
    pub fn gro_active(&self, id: SocketId) -> bool {
        self.common.table.entry(id).is_some_and(|e| e.gro)
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
    /// `engine::runtime::hosted`); the io_uring backend does one non-blocking `run_once`.
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

    /// After a pass: true when datagrams may be left to receive without a new readiness
    /// event (mmsg: a `recvmmsg` filled every buffer or the batch budget ran out;
    /// io_uring: the pass stopped at the batch with completions left, or a flush kept
    /// some for the next pass); false when everything that had arrived was handed out,
    /// so the next pass may wait.
    pub fn may_have_more(&self) -> bool {
        match &self.backend {
            Backend::Uring(u) => u.may_have_more(),
            Backend::Mmsg(m) => m.may_have_more(),
        }
    }

    /// True while sends on socket `id` wait for room in its send buffer (EAGAIN): a
    /// driver that waits elsewhere waits for the socket to become writable, then
    /// calls [`writable`](Self::writable).
    pub fn wants_write(&self, id: SocketId) -> bool {
        self.common.table.entry(id).is_some_and(|e| e.want_write)
    }

    /// Socket `id` has room again: its waiting sends go out on the next call.
    pub fn writable(&mut self, id: SocketId) {
        if let Some(e) = self.common.table.entry_mut(id) {
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

    /// For a caller that waits in an async runtime
    /// ([`Caller::Runtime`](super::Caller::Runtime)): the fd to
    /// watch for readability, which replaces watching the sockets. io_uring: the ring's
    /// fd (readable while completions are ready). mmsg: `None` (watch each socket).
    pub fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        match &self.backend {
            Backend::Uring(u) => u.readiness_fd(),
            Backend::Mmsg(_) => None,
        }
    }

    /// Counts one wait of a caller that waits elsewhere (a runtime's reactor) in
    /// [`IoStats::waits`].
    pub fn count_wait(&mut self) {
        self.common.stats.waits += 1;
    }
}

impl Drop for UdpIo {
    fn drop(&mut self) {
        // io_uring may read the send queue's buffers until its sends complete (see
        // uring.rs `push`): its requests are cancelled before `common` is freed, and
        // where the kernel does not confirm, the queue is leaked with the ring's memory.
        if let Backend::Uring(u) = &mut self.backend
            && !u.shut_down()
        {
            let q = std::mem::replace(&mut self.common.sendq, SendQueue::new(1, 64));
            std::mem::forget(q);
        }
    }
}

impl fmt::Debug for UdpIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UdpIo")
            .field("backend", &self.kind())
            .field("sockets", &self.common.table.open())
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
}
