//! What both backends share: the socket table, the send queue, the counters, the waker
//! and the configuration of one driver, and the glue both backends run the same way.
//!
//! Owns: [`Common`]. Must not touch: system calls (the backends make them), grouping
//! (gso.rs), socket creation (socket.rs).

use std::sync::Arc;

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
        if let Some(e) = self.table.entry_mut(id)
            && e.gso
        {
            e.gso = false;
            self.stats.gso_fallbacks += 1;
            tracing::warn!("UDP GSO refused by the kernel on a socket: per-datagram sends there");
        }
    }
}
