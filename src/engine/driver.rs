//! The I/O driver of one engine core: a thin shell around [`CoreState`].
//!
//! Owns: the core's thread (pinned with `core_affinity`), its UDP sockets, the clock,
//! the send batch and the park/wake protocol with submitters, and fault containment: a
//! panic inside the core fails every request it holds or is queued to it with
//! [`Failure::CoreFailed`], marks the core dead (submitters then fail at once), and keeps
//! failing whatever still reaches its queue until the engine shuts down.
//! Must not touch: request state, the wire format, decisions (all in [`CoreState`]).
//!
//! One iteration: receive every queued datagram, drain submissions, fire due timers,
//! send what the state handed out (grouped per socket), feed send failures back, then
//! perform socket operations (after the sends, so a closing socket's last datagrams
//! leave first). When idle it announces it parks and blocks on its sockets and wake fd
//! until the state's next deadline.

use std::net::SocketAddr;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::Shared;
use super::io::{RecvBatch, SendBatch, UdpIo, wait_fds};
use super::sockets::{SockId, SocketOp};
use super::state::{CoreState, TransmitSink, os_entropy};
use super::submit::Msg;
use crate::outcome::Failure;

/// Datagrams per recvmmsg / sendmmsg.
const BATCH: usize = 64;
/// Receive batches per socket per iteration.
const RECV_ROUNDS: usize = 8;
/// Ports tried per steering rebind (each a bind(2)); never an unbounded scan.
pub(crate) const REBIND_TRIES: u16 = 32;
/// Rounds of feeding send failures back per iteration (each may queue replays).
const FAILURE_ROUNDS: usize = 4;

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The core's sockets and its send batch: what the state's transmits go into.
struct Net {
    socks: Vec<(SockId, UdpIo)>,
    next_id: u32,
    v6: bool,
    recv_buf: usize,
    send_buf: usize,
    send: SendBatch,
    send_sock: SockId,
    failed: Vec<u64>,
}

impl Net {
    fn io(&self, id: SockId) -> Option<&UdpIo> {
        self.socks.iter().find(|(i, _)| *i == id).map(|(_, s)| s)
    }

    fn flush(&mut self) {
        if self.send.is_empty() {
            return;
        }
        let failed = &mut self.failed;
        match self.socks.iter().find(|(i, _)| *i == self.send_sock) {
            Some((_, io)) => {
                io.send_batch(&mut self.send, |tag| failed.push(tag));
            }
            None => {
                // the socket is gone: every datagram of the batch failed
                self.send.drain_tags(|tag| failed.push(tag));
            }
        }
    }

    fn add(&mut self, io: UdpIo) -> (SockId, u16) {
        let id = SockId(self.next_id);
        self.next_id = self.next_id.wrapping_add(1);
        let port = io.local_addr().port();
        self.socks.push((id, io));
        (id, port)
    }
}

impl TransmitSink for Net {
    fn transmit(&mut self, sock: SockId, to: SocketAddr, datagram: &[u8], tag: u64) {
        if (!self.send.is_empty() && self.send_sock != sock) || self.send.is_full() {
            self.flush();
        }
        if !self.send.is_empty() && self.send_sock != sock {
            // the other socket's send buffer is full: its backlog fails
            self.send.drain_tags(|t| self.failed.push(t));
        }
        self.send_sock = sock;
        if !self.send.push(datagram, to, tag) {
            self.failed.push(tag);
        }
    }
}

/// One engine core: its state and its I/O.
pub(crate) struct Driver {
    state: CoreState,
    net: Net,
    recv: RecvBatch,
    shared: Arc<Shared>,
    index: usize,
    fds: Vec<i32>,
}

impl Driver {
    /// Binds the core's first socket (dual-stack IPv6 when available, else IPv4) and
    /// builds its state.
    pub(crate) fn new(index: usize, shared: Arc<Shared>) -> std::io::Result<Driver> {
        let (rb, sb) = (shared.recv_buf, shared.send_buf);
        let (io, v6) = match UdpIo::bind_for(true, 0, rb, sb) {
            Ok(s) => (s, true),
            Err(_) => (UdpIo::bind_for(false, 0, rb, sb)?, false),
        };
        let mut send = SendBatch::new(BATCH);
        send.set_v6_socket(v6);
        let mut net = Net {
            socks: Vec::with_capacity(shared.max_sockets),
            next_id: 0,
            v6,
            recv_buf: rb,
            send_buf: sb,
            send,
            send_sock: SockId(0),
            failed: Vec::with_capacity(BATCH * 4),
        };
        let (first, port) = net.add(io);
        let state = CoreState::new(
            index,
            shared.clone(),
            Instant::now(),
            first,
            port,
            os_entropy(),
        )
        .map_err(|_| std::io::Error::other("no OS randomness"))?;
        Ok(Driver {
            state,
            net,
            recv: RecvBatch::new(BATCH),
            fds: Vec::with_capacity(shared.max_sockets + 1),
            shared,
            index,
        })
    }

    /// Local address of the socket new requests use.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        let cur = self.state.current_socket();
        self.net
            .io(cur)
            .map(|s| s.local_addr())
            .expect("current socket is open")
    }

    /// Runs until shutdown; contains a panic of the core (see the module docs).
    pub(crate) fn run(mut self) {
        let r = catch_unwind(AssertUnwindSafe(|| self.run_loop()));
        if r.is_err() {
            self.after_fault();
        }
    }

    fn run_loop(&mut self) {
        loop {
            let now = Instant::now();
            self.state.set_wall_ms(wall_ms());
            self.net.flush();
            let mut work = self.receive_all(now);
            work |= self.state.handle_queue(now, &mut self.net);
            work |= self.state.handle_timeout(Instant::now(), &mut self.net);
            self.net.flush();
            self.feed_failures();
            self.socket_ops();
            self.shared.publish_stats(self.index, &self.state);
            if self.queue().stop.load(Ordering::Acquire) {
                self.state.shutdown(Instant::now(), &mut self.net);
                self.net.flush();
                self.shared.publish_stats_now(self.index, &self.state);
                return;
            }
            if !work {
                self.park();
            }
        }
    }

    fn queue(&self) -> &super::submit::CoreQueue {
        &self.shared.queues[self.index]
    }

    fn feed_failures(&mut self) {
        for _ in 0..FAILURE_ROUNDS {
            if self.net.failed.is_empty() {
                return;
            }
            let mut failed = std::mem::take(&mut self.net.failed);
            let now = Instant::now();
            for tag in failed.drain(..) {
                self.state.handle_send_failed(now, tag, &mut self.net);
            }
            self.net.failed = failed;
            self.net.flush();
        }
    }

    fn socket_ops(&mut self) {
        while let Some(op) = self.state.poll_socket_op() {
            match op {
                SocketOp::Open { after_port } => {
                    let n = &self.net;
                    let opened =
                        UdpIo::rebind_next(n.v6, after_port, REBIND_TRIES, n.recv_buf, n.send_buf);
                    let new = opened.ok().map(|io| self.net.add(io));
                    self.state.socket_opened(new);
                }
                SocketOp::Close(id) => {
                    self.net.flush();
                    self.net.socks.retain(|(i, _)| *i != id);
                }
            }
        }
    }

    fn receive_all(&mut self, now: Instant) -> bool {
        let mut any = false;
        for i in 0..self.net.socks.len() {
            let id = self.net.socks[i].0;
            for _ in 0..RECV_ROUNDS {
                let n = self.net.socks[i]
                    .1
                    .recv_batch(&mut self.recv)
                    .unwrap_or_default();
                if n == 0 {
                    break;
                }
                any = true;
                for k in 0..n {
                    match self.recv.datagram(k) {
                        Some(d) => self.state.handle_datagram(now, id, d, &mut self.net),
                        None => self.state.count_oversized(),
                    }
                }
                if n < BATCH {
                    break;
                }
            }
        }
        any
    }

    fn park(&mut self) {
        let q = &self.shared.queues[self.index];
        if self.shared.spin.is_some() {
            let until = Instant::now() + self.shared.spin.unwrap_or_default();
            while Instant::now() < until {
                if !q.rx.is_empty() {
                    return;
                }
                std::hint::spin_loop();
            }
        }
        q.parked.store(true, Ordering::SeqCst);
        if !q.rx.is_empty() || q.stop.load(Ordering::SeqCst) {
            q.parked.store(false, Ordering::SeqCst);
            return;
        }
        let mut timeout = self
            .state
            .poll_timeout()
            .map(|t| t.saturating_duration_since(Instant::now()));
        if !self.net.send.is_empty() {
            // a send backlog (full send buffer): come back soon to retry it
            let retry = std::time::Duration::from_micros(200);
            timeout = Some(timeout.map_or(retry, |t| t.min(retry)));
        }
        self.fds.clear();
        self.fds.push(std::os::fd::AsRawFd::as_raw_fd(&q.wake));
        for (_, s) in &self.net.socks {
            self.fds.push(std::os::fd::AsRawFd::as_raw_fd(s));
        }
        let _ = wait_fds(&self.fds, libc::POLLIN, timeout);
        q.parked.store(false, Ordering::SeqCst);
        q.wake.drain();
    }

    /// After a panic: fail everything, mark the core dead, then keep failing what still
    /// reaches the queue until shutdown.
    fn after_fault(&mut self) {
        let q = &self.shared.queues[self.index];
        q.dead.store(true, Ordering::SeqCst);
        tracing::error!(
            core = self.index,
            "engine core failed; its requests fail with CoreFailed"
        );
        let f = Failure::CoreFailed { core: self.index };
        let _ = catch_unwind(AssertUnwindSafe(|| self.state.fail_in_flight(&f)));
        loop {
            while let Ok(msg) = q.rx.try_recv() {
                fail_msg(&self.shared, msg, &f);
            }
            if q.stop.load(Ordering::SeqCst) {
                return;
            }
            q.parked.store(true, Ordering::SeqCst);
            if q.rx.is_empty() && !q.stop.load(Ordering::SeqCst) {
                let fds = [std::os::fd::AsRawFd::as_raw_fd(&q.wake)];
                let _ = wait_fds(
                    &fds,
                    libc::POLLIN,
                    Some(std::time::Duration::from_millis(50)),
                );
            }
            q.parked.store(false, Ordering::SeqCst);
            q.wake.drain();
        }
    }
}

/// Completes a message that no core will handle.
pub(crate) fn fail_msg(shared: &Shared, msg: Msg, f: &Failure) {
    match msg {
        Msg::Request { slot, .. } => shared.pool.complete(slot, Err(f.clone())),
        Msg::FlushReports(tx) => {
            let _ = tx.try_send(super::stats::Stats::new());
        }
        Msg::Report(_) | Msg::Fault => {}
    }
}
