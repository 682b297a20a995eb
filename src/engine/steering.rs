//! Source-port steering for one core (docs/protocol.md §14): the set of sockets a core owns.
//!
//! Owns: the current socket (new requests are sent from it), older sockets still
//! draining their in-flight requests (they keep receiving, then close), per-socket
//! coalescing of steering hints, and the monotonic port cursor through 49152..=65535.
//! A hint binds the replacement socket first; a failed rebind keeps the old socket and is
//! counted — never a request failure.
//! Must not touch: request state or the decision (steering never changes it), clocks.

use std::io;

use super::io::UdpIo;

/// One socket of a core.
pub(crate) struct SockSlot {
    pub io: UdpIo,
    pub id: u32,
    pub inflight: u32,
    pub steered: bool,
}

/// The sockets of one core.
pub(crate) struct SocketSet {
    socks: Vec<SockSlot>,
    current: u32,
    next_id: u32,
    v6: bool,
    recv_buf: usize,
    send_buf: usize,
    last_port: u16,
    pending: bool,
}

/// What a steering pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct SteerResult {
    pub rebinds: u64,
    pub failures: u64,
}

impl SocketSet {
    /// Binds the first socket: dual-stack IPv6 when available, else IPv4.
    pub(crate) fn new(recv_buf: usize, send_buf: usize) -> io::Result<SocketSet> {
        let (io, v6) = match UdpIo::bind_for(true, 0, recv_buf, send_buf) {
            Ok(s) => (s, true),
            Err(_) => (UdpIo::bind_for(false, 0, recv_buf, send_buf)?, false),
        };
        Ok(SocketSet {
            socks: vec![SockSlot {
                io,
                id: 0,
                inflight: 0,
                steered: false,
            }],
            current: 0,
            next_id: 1,
            v6,
            recv_buf,
            send_buf,
            last_port: 0,
            pending: false,
        })
    }

    pub(crate) fn is_v6(&self) -> bool {
        self.v6
    }

    /// Id of the socket new requests use.
    pub(crate) fn current_id(&self) -> u32 {
        self.current
    }

    pub(crate) fn len(&self) -> usize {
        self.socks.len()
    }

    pub(crate) fn by_index(&self, i: usize) -> &SockSlot {
        &self.socks[i]
    }

    pub(crate) fn get(&self, id: u32) -> Option<&UdpIo> {
        self.socks.iter().find(|s| s.id == id).map(|s| &s.io)
    }

    /// Local address of the current socket.
    pub(crate) fn local_addr(&self) -> std::net::SocketAddr {
        self.get(self.current).expect("current socket").local_addr()
    }

    pub(crate) fn acquire(&mut self, id: u32) {
        if let Some(s) = self.socks.iter_mut().find(|s| s.id == id) {
            s.inflight += 1;
        }
    }

    /// A request sent from socket `id` ended; a drained old socket closes.
    pub(crate) fn release(&mut self, id: u32) {
        if let Some(i) = self.socks.iter().position(|s| s.id == id) {
            let s = &mut self.socks[i];
            s.inflight = s.inflight.saturating_sub(1);
            if s.inflight == 0 && s.id != self.current {
                self.socks.swap_remove(i);
            }
        }
    }

    /// A valid response to a request sent from socket `id` asked for another port.
    /// Coalesced: one rebind per socket.
    pub(crate) fn hint(&mut self, id: u32) {
        if id != self.current {
            return;
        }
        if let Some(s) = self.socks.iter_mut().find(|s| s.id == id)
            && !s.steered
        {
            s.steered = true;
            self.pending = true;
        }
    }

    /// Performs a pending rebind.
    pub(crate) fn apply(&mut self) -> SteerResult {
        let mut r = SteerResult::default();
        if !self.pending {
            return r;
        }
        self.pending = false;
        let cur_port = self.local_addr().port();
        let from = if self.last_port != 0 {
            self.last_port
        } else {
            cur_port
        };
        match UdpIo::rebind_next(self.v6, from, self.recv_buf, self.send_buf) {
            Ok(io) => {
                self.last_port = io.local_addr().port();
                let id = self.next_id;
                self.next_id = self.next_id.wrapping_add(1);
                let old = self.current;
                self.socks.push(SockSlot {
                    io,
                    id,
                    inflight: 0,
                    steered: false,
                });
                self.current = id;
                if let Some(i) = self.socks.iter().position(|s| s.id == old)
                    && self.socks[i].inflight == 0
                {
                    self.socks.swap_remove(i);
                }
                r.rebinds = 1;
            }
            Err(_) => {
                // keep the old socket; a later hint may try again
                if let Some(s) = self.socks.iter_mut().find(|s| s.id == self.current) {
                    s.steered = false;
                }
                r.failures = 1;
            }
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebind_keeps_draining_socket_until_released() {
        let mut s = SocketSet::new(0, 0).unwrap();
        let first = s.current_id();
        s.acquire(first);
        s.hint(first);
        s.hint(first); // coalesced
        let r = s.apply();
        assert_eq!(r.rebinds, 1);
        assert_ne!(s.current_id(), first);
        assert!(s.local_addr().port() >= 49152);
        assert_eq!(s.len(), 2);
        assert_eq!(s.apply().rebinds, 0);
        s.release(first);
        assert_eq!(s.len(), 1);
        let p1 = s.local_addr().port();
        s.hint(s.current_id());
        s.apply();
        assert_eq!(s.len(), 1);
        assert_ne!(s.local_addr().port(), p1);
    }
}
