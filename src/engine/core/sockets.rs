//! Source-port steering for one core (docs/protocol.md §14), as sans-IO bookkeeping.
//!
//! Owns: which of the core's sockets is current (new requests are sent from it), the
//! older sockets still draining their in-flight requests (they keep receiving, then
//! close when the in-flight table says their last request ended), per-socket coalescing of steering hints, the bound on how many sockets a core
//! may hold, and the queue of socket operations the core must perform.
//! A hint asks the core to open the replacement socket first; only when the core
//! reports it open does it become current. A failed open keeps the old socket and is
//! counted — never a request failure.
//! Must not touch: sockets themselves (the core binds and closes them), request state
//! or the decision (steering never changes it), clocks.

use std::collections::VecDeque;

use crate::udp::SocketId;

/// A socket operation the core must perform, in order, after it has sent every
/// transmit handed to it so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketOp {
    /// Bind a replacement socket on the next free port after `after_port` in the
    /// steering range, then report it with `CoreState::socket_opened`.
    Open {
        /// The current socket's port.
        after_port: u16,
    },
    /// Close this socket: no request uses it any more.
    Close(SocketId),
}

struct Slot {
    id: SocketId,
    port: u16,
    steered: bool,
}

/// The sockets of one core.
pub(crate) struct SocketTable {
    socks: Vec<Slot>,
    current: SocketId,
    ops: VecDeque<SocketOp>,
    /// An `Open` was handed out and not yet answered.
    opening: bool,
    max: usize,
}

impl SocketTable {
    /// A table whose first (current) socket is `first`, bound on `port`; at most `max`
    /// sockets open at once (at least 2, so one rebind is always possible).
    pub(crate) fn new(first: SocketId, port: u16, max: usize) -> SocketTable {
        let max = max.max(2);
        let mut socks = Vec::with_capacity(max);
        socks.push(Slot {
            id: first,
            port,
            steered: false,
        });
        SocketTable {
            socks,
            current: first,
            ops: VecDeque::with_capacity(max + 1),
            opening: false,
            max,
        }
    }

    /// The socket new requests use.
    pub(crate) fn current(&self) -> SocketId {
        self.current
    }

    /// Sockets open (current and draining).
    pub(crate) fn len(&self) -> usize {
        self.socks.len()
    }

    fn find(&mut self, id: SocketId) -> Option<usize> {
        self.socks.iter().position(|s| s.id == id)
    }

    /// The last request sent from `id` ended (the in-flight table counts them): a
    /// draining old socket is queued for closing.
    pub(crate) fn drained(&mut self, id: SocketId) {
        if id == self.current {
            return;
        }
        if let Some(i) = self.find(id) {
            self.socks.swap_remove(i);
            self.ops.push_back(SocketOp::Close(id));
        }
    }

    /// A valid response to a request sent from `id` asked for another port. Coalesced:
    /// one rebind per socket. Returns false when the hint was refused because the core
    /// already holds its maximum of sockets (counted by the caller).
    pub(crate) fn hint(&mut self, id: SocketId) -> bool {
        if id != self.current || self.opening {
            return true;
        }
        let Some(i) = self.find(id) else {
            return true;
        };
        if self.socks[i].steered {
            return true;
        }
        if self.socks.len() >= self.max {
            return false;
        }
        self.socks[i].steered = true;
        self.opening = true;
        self.ops.push_back(SocketOp::Open {
            after_port: self.socks[i].port,
        });
        true
    }

    /// The next operation for the core.
    pub(crate) fn poll_op(&mut self) -> Option<SocketOp> {
        self.ops.pop_front()
    }

    /// The core's answer to an `Open`: the new socket and its port, or `None` when no
    /// port could be bound (the old socket stays current; a later hint may try again).
    /// `old_busy`: requests are in flight on the old current socket (it drains first).
    pub(crate) fn opened(&mut self, new: Option<(SocketId, u16)>, old_busy: bool) {
        self.opening = false;
        let old = self.current;
        match new {
            Some((id, port)) => {
                self.socks.push(Slot {
                    id,
                    port,
                    steered: false,
                });
                self.current = id;
                if !old_busy && let Some(i) = self.find(old) {
                    self.socks.swap_remove(i);
                    self.ops.push_back(SocketOp::Close(old));
                }
            }
            None => {
                if let Some(i) = self.find(old) {
                    self.socks[i].steered = false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebind_keeps_draining_socket_until_released() {
        let mut s = SocketTable::new(SocketId::from_raw(0), 50000, 4);
        assert!(s.hint(SocketId::from_raw(0)));
        assert!(s.hint(SocketId::from_raw(0))); // coalesced
        assert_eq!(s.poll_op(), Some(SocketOp::Open { after_port: 50000 }));
        assert_eq!(s.poll_op(), None);
        s.opened(Some((SocketId::from_raw(1), 50001)), true);
        assert_eq!(s.current(), SocketId::from_raw(1));
        assert_eq!(s.len(), 2);
        s.drained(SocketId::from_raw(0));
        assert_eq!(s.poll_op(), Some(SocketOp::Close(SocketId::from_raw(0))));
        assert_eq!(s.len(), 1);
        // an idle current socket closes as soon as its replacement is open
        assert!(s.hint(SocketId::from_raw(1)));
        assert_eq!(s.poll_op(), Some(SocketOp::Open { after_port: 50001 }));
        s.opened(Some((SocketId::from_raw(2), 50002)), false);
        assert_eq!(s.poll_op(), Some(SocketOp::Close(SocketId::from_raw(1))));
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn bounded_and_failed_opens() {
        let mut s = SocketTable::new(SocketId::from_raw(0), 50000, 2);
        assert!(s.hint(SocketId::from_raw(0)));
        s.poll_op();
        s.opened(None, true);
        assert_eq!(s.current(), SocketId::from_raw(0));
        assert!(s.hint(SocketId::from_raw(0)));
        s.poll_op();
        s.opened(Some((SocketId::from_raw(1), 50001)), true);
        // two sockets open, both busy: the bound refuses a third
        assert!(!s.hint(SocketId::from_raw(1)));
        assert_eq!(s.poll_op(), None);
    }
}
