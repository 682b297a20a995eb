//! Where a core's transmits go: the two [`TransmitSink`]s a turn hands its state.
//!
//! Owns: [`IoSink`] (between passes: straight onto the I/O layer's send queue, flushed
//! when it is full) and [`QueueSink`] (inside a pass's callback: the send queue the pass
//! hands out), and [`flush`], the send of what is queued with its failures collected. The
//! state calls these, never the turn: a transmit goes from `CoreState` here and on to the
//! I/O layer. Must not touch: the state, the queues, the completion slots.

use std::net::SocketAddr;

use crate::engine::core::TransmitSink;
use crate::udp::{IoEvent, SendQueue, SocketId, UdpIo};

/// Transmits queued on the I/O layer's send queue inside a pass's callback.
pub(crate) struct QueueSink<'a> {
    pub q: &'a mut SendQueue,
    pub failed: &'a mut Vec<u64>,
}

impl TransmitSink for QueueSink<'_> {
    fn transmit(&mut self, sock: SocketId, to: SocketAddr, datagram: &[u8], tag: u64) {
        if !self.q.push(sock, to, datagram, tag) {
            self.failed.push(tag);
        }
    }
}

/// Transmits queued on the I/O layer between passes (flushes when full).
pub(crate) struct IoSink<'a> {
    pub io: &'a mut UdpIo,
    pub failed: &'a mut Vec<u64>,
}

impl TransmitSink for IoSink<'_> {
    fn transmit(&mut self, sock: SocketId, to: SocketAddr, datagram: &[u8], tag: u64) {
        if self.io.send_queue().push(sock, to, datagram, tag) {
            return;
        }
        flush(self.io, self.failed);
        if !self.io.send_queue().push(sock, to, datagram, tag) {
            self.failed.push(tag);
        }
    }
}

/// Sends what is queued now (send failures are collected, fed back next turn).
pub(crate) fn flush(io: &mut UdpIo, failed: &mut Vec<u64>) {
    let _ = io.flush(&mut |_, ev| {
        if let IoEvent::SendFailed { tag, .. } = ev {
            failed.push(tag);
        }
    });
}
