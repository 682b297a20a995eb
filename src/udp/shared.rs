//! What both backends share: the socket table, the send queue, the counters, the waker
//! and the configuration of one driver, and the glue both backends run the same way,
//! written once here so that each backend file holds only its system calls and ring
//! mechanics:
//!
//! - wake-ups: [`Common::take_wake`] / [`Common::report_woken`] (counted, one event);
//! - send results: [`Common::group_sent`] and [`Common::group_failed`], which classify
//!   a send's errno (`EAGAIN`: kept queued and the socket waits for writability;
//!   `EIO`/`EINVAL`/`EMSGSIZE` on a GSO group: the kernel refuses GSO there, re-queued
//!   per datagram; anything else: its datagrams fail with the kernel's error);
//! - closed sockets: [`Common::send_fd`] fails the groups of a closed socket with
//!   `NotConnected` before anything is submitted (io_uring, whose groups outlive a
//!   close; mmsg sends on the descriptor each group carries from `SendQueue::build`,
//!   which fails a closed socket's datagrams), and a receive for a socket that was
//!   closed meanwhile is dropped (`SockTable::is_open`);
//! - received datagrams: [`Common::deliver`] splits a GRO buffer (`split`), hands out
//!   the datagrams and counts them;
//! - failure reports: [`Common::report_failures`].
//!
//! Owns: [`Common`] and that glue. Must not touch: system calls (the backends make
//! them), grouping (gso.rs), socket creation (socket.rs).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use super::gso::GroupResult;
use super::table::SockTable;
use super::wake::Waker;
use super::{IoConfig, IoEvent, IoStats, SendQueue, SocketId};

/// State shared by both backends: sockets, send queue, stats, waker, configuration.
pub(crate) struct Common {
    pub(crate) cfg: IoConfig,
    pub(crate) table: SockTable,
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
    /// The shared state of a driver on `stats.backend` with configuration `cfg`
    /// (already clamped).
    pub(crate) fn new(cfg: IoConfig, stats: IoStats, waker: Arc<Waker>) -> Common {
        Common {
            sendq: SendQueue::new(cfg.send_capacity, cfg.max_datagram),
            table: SockTable::new(cfg.max_sockets),
            stats,
            waker,
            cfg,
            #[cfg(test)]
            fake_eagain: 0,
            #[cfg(test)]
            faked: false,
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

    /// Reports a pending wake-up (and clears it); true when there was one. Several
    /// wakes before the driver notices make one event.
    pub(crate) fn take_wake(
        &mut self,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> bool {
        if !self.waker.clear() {
            return false;
        }
        self.report_woken(on_event);
        true
    }

    /// Reports one wake-up that was already cleared (counted).
    pub(crate) fn report_woken(&mut self, on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>)) {
        self.stats.wakes += 1;
        on_event(&mut self.sendq, IoEvent::Woken);
    }

    /// Hands the datagrams of one received buffer from `from` on `sock` to the caller
    /// (split every `seg` bytes when GRO coalesced them) and counts them. Returns how
    /// many.
    pub(crate) fn deliver(
        &mut self,
        sock: SocketId,
        from: SocketAddr,
        data: &mut [u8],
        seg: Option<usize>,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let sendq = &mut self.sendq;
        let n = split(data, seg, |d| {
            on_event(
                sendq,
                IoEvent::Datagram {
                    sock,
                    from,
                    data: d,
                },
            )
        });
        self.stats.count_recv_op(n);
        n
    }

    /// The fd to send groups `groups` on (built groups of one socket), or None when
    /// that socket is closed: then those groups fail with `NotConnected` (reported by
    /// [`report_failures`](Self::report_failures)) and nothing is to be submitted.
    #[cfg(feature = "io-uring")]
    pub(crate) fn send_fd(&mut self, groups: std::ops::Range<usize>) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        let sock = self.sendq.group(groups.start).sock;
        if let Some(e) = self.table.entry(sock) {
            return Some(e.sock.as_raw_fd());
        }
        for g in groups {
            self.sendq
                .finish(g, GroupResult::Failed(io::ErrorKind::NotConnected));
        }
        None
    }

    /// Group `g` went to the kernel whole: counted, its slots freed.
    #[cfg(feature = "io-uring")]
    pub(crate) fn group_sent(&mut self, g: usize) {
        self.sendq.sent(g, &mut self.stats);
    }

    /// Group `g`'s send failed with `errno`: classifies it, records the outcome and
    /// returns it. `EAGAIN`: kept queued for a retry and its socket waits for
    /// writability (counted in `eagain_waits`); `EIO`/`EINVAL`/`EMSGSIZE` on a GSO
    /// group: the socket sends per datagram from now on and the group is re-queued;
    /// anything else: its datagrams fail with the kernel's error.
    pub(crate) fn group_failed(&mut self, g: usize, errno: i32) -> GroupResult {
        let grp = self.sendq.group(g);
        let outcome = match errno {
            libc::EAGAIN => {
                self.stats.eagain_waits += 1;
                if let Some(e) = self.table.entry_mut(grp.sock) {
                    e.want_write = true;
                }
                GroupResult::Retry { eagain: true }
            }
            libc::EIO | libc::EINVAL | libc::EMSGSIZE if grp.count > 1 => {
                self.gso_refused(grp.sock);
                GroupResult::Retry { eagain: false }
            }
            e => GroupResult::Failed(io::Error::from_raw_os_error(e).kind()),
        };
        self.sendq.finish(g, outcome);
        outcome
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
    fn gso_refused(&mut self, id: SocketId) {
        if let Some(e) = self.table.entry_mut(id)
            && e.gso
        {
            e.gso = false;
            self.stats.gso_fallbacks += 1;
            tracing::warn!("UDP GSO refused by the kernel on a socket: per-datagram sends there");
        }
    }
}

/// Splits `data` into datagrams of `seg` bytes (the last may be shorter) and calls `f`
/// with each; without a segment size, `data` is one datagram. Returns the count.
fn split(data: &mut [u8], seg: Option<usize>, mut f: impl FnMut(&mut [u8])) -> usize {
    match seg {
        Some(s) if s < data.len() => {
            let mut n = 0;
            for chunk in data.chunks_mut(s) {
                f(chunk);
                n += 1;
            }
            n
        }
        _ => {
            f(data);
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_a_gro_buffer() {
        let mut data = vec![0u8; 450];
        let mut lens = Vec::new();
        assert_eq!(split(&mut data, Some(200), |d| lens.push(d.len())), 3);
        assert_eq!(lens, vec![200, 200, 50]);
        assert_eq!(split(&mut data, None, |_| {}), 1);
    }
}
