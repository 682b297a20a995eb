//! The io_uring backend (the `io-uring` crate).
//!
//! - Receives: one multishot `IORING_OP_RECVMSG` per socket, selecting buffers from one
//!   provided-buffer ring (`IORING_REGISTER_PBUF_RING`). Each completion holds one
//!   `io_uring_recvmsg_out` header, the source address, the control messages (the
//!   `UDP_GRO` segment size) and the payload; the buffer goes back to the ring as soon
//!   as the caller's callback returns. A multishot that ends (out of buffers, CQ
//!   overflow) is re-armed on the next loop.
//! - Sends: one `IORING_OP_SENDMSG` per GSO group with `MSG_DONTWAIT`, so a full socket
//!   buffer completes at once with `EAGAIN` (kept queued, and a one-shot `POLLOUT` poll
//!   ends a later wait when there is room) instead of parking the request in the kernel.
//! - Waiting: one `io_uring_enter` per loop submits the loop's SQEs and waits for one
//!   completion with the timeout as extended argument (`IORING_ENTER_EXT_ARG`).
//! - Wake-ups: an 8-byte read of the waker's (blocking) eventfd stays armed in the ring.
//!
//! The ring is created with `SINGLE_ISSUER | DEFER_TASKRUN` (completions are produced
//! only while this thread waits: no interrupts of the running loop) and disabled until
//! the first `run_once`, so the thread that runs the driver becomes its issuer. It needs
//! Linux 6.1; older kernels refuse with EINVAL and `Auto` falls back to mmsg.
//!
//! Owns: the ring (what is armed, submitted and in flight, the reaping of completions,
//! the wait) and, through bufring.rs, the provided-buffer ring and every byte the kernel
//! may write asynchronously. Must not touch: grouping (gso.rs), socket creation
//! (socket.rs), the glue both backends share (shared.rs). On drop it cancels everything
//! synchronously before freeing that memory, and leaks it if the kernel does not
//! confirm; `UdpIo`'s drop does the same before it frees the send queue.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use io_uring::types::{CancelBuilder, Fd, Fixed, Timespec};
use io_uring::{cqueue, opcode, squeue};

use super::Caller;
use super::bufring::{BGID, BufRing};
use super::gso::GroupResult;
use super::ring::Ring;
use super::shared::Common;
use super::wake::Waker;
use super::{IoConfig, IoEvent, SendQueue, SocketId};

const K_RECV: u64 = 1;
const K_SEND: u64 = 2;
const K_WAKE: u64 = 3;
const K_POLLOUT: u64 = 4;
const K_CANCEL: u64 = 5;

/// Completion queue entries.
const CQ_ENTRIES: u32 = 8192;
/// Loops of wait inside one `run_once` that produced nothing for the caller.
const MAX_ROUNDS: usize = 4;

fn ud(kind: u64, low: u32) -> u64 {
    (kind << 56) | u64::from(low)
}

pub(crate) struct Uring {
    ring: Ring,
    bufs: BufRing,
    /// Per socket slot: a multishot receive is armed for the current socket.
    recv_armed: Vec<bool>,
    /// Per socket slot: armed at least once (a new arm is a re-arm).
    armed_once: Vec<bool>,
    /// Per socket slot: a POLLOUT poll is armed.
    pollout_armed: Vec<bool>,
    /// The waker's eventfd read is armed (always "armed" for a runtime's caller, whose
    /// wake-ups wake its task instead).
    wake_armed: bool,
    need_arm: bool,
    /// Requests to cancel (closed sockets), submitted with the next enter.
    cancels: Vec<u64>,
    sends_in_flight: usize,
    /// Receive completions reaped by `flush` (socket id, buffer id, result), delivered
    /// by the next `run_once`; each holds one buffer, so the buffer count bounds it.
    deferred: Vec<(u32, u16, i32)>,
    /// A wake-up reaped by `flush`, reported by the next `run_once`.
    deferred_wake: bool,
    /// The last reap stopped at the caller's batch with completions left in the CQ.
    more: bool,
    /// The answer of [`shut_down`](Self::shut_down) once it ran.
    shut: Option<bool>,
}

impl Uring {
    pub(crate) fn new(cfg: &IoConfig) -> io::Result<(Uring, Arc<Waker>)> {
        let ring = Ring::new(cfg.caller, CQ_ENTRIES, cfg.max_sockets as u32)?;
        let bufs = BufRing::new(cfg, &ring.ring)?;
        let waker = Arc::new(Waker::new(false)?);
        let u = Uring {
            wake_armed: ring.caller() == Caller::Runtime,
            ring,
            deferred: Vec::with_capacity(bufs.count()),
            bufs,
            recv_armed: vec![false; cfg.max_sockets],
            armed_once: vec![false; cfg.max_sockets],
            pollout_armed: vec![false; cfg.max_sockets],
            need_arm: true,
            cancels: Vec::with_capacity(cfg.max_sockets * 2),
            sends_in_flight: 0,
            deferred_wake: false,
            more: false,
            shut: None,
        };
        Ok((u, waker))
    }

    /// Socket `fd` opened at `slot`: it becomes the ring's fixed file there.
    pub(crate) fn socket_added(&mut self, slot: usize, fd: RawFd) -> io::Result<()> {
        self.ring.set_file(slot, Some(fd))?;
        self.recv_armed[slot] = false;
        self.armed_once[slot] = false;
        self.pollout_armed[slot] = false;
        self.need_arm = true;
        Ok(())
    }

    /// The fd to wait on for readiness, for a caller that waits in a runtime.
    pub(crate) fn readiness_fd(&self) -> Option<RawFd> {
        (self.ring.caller() == Caller::Runtime).then(|| self.ring.fd())
    }

    pub(crate) fn socket_closed(&mut self, slot: usize, old: SocketId) {
        if self.recv_armed[slot] {
            self.cancels.push(ud(K_RECV, old.raw()));
        }
        if self.pollout_armed[slot] {
            self.cancels.push(ud(K_POLLOUT, old.raw()));
        }
        self.recv_armed[slot] = false;
        self.pollout_armed[slot] = false;
        self.need_arm = true;
        // the cancellations go with the next enter; submitted requests hold the file
        if let Err(e) = self.ring.set_file(slot, None) {
            tracing::warn!(error = %e, "io_uring: could not clear a closed socket's fixed file");
        }
    }

    /// Pushes one SQE, submitting what is queued when the SQ is full.
    ///
    /// # Safety
    ///
    /// Every buffer `e` points at (a message header with its iovecs, address, control
    /// message and payload; a read target; the receive template and the provided
    /// buffers) stays alive and unmoved, and Rust neither writes it nor (for what the
    /// kernel writes) reads it, until the completion of `e` is reaped, or until
    /// [`shut_down`](Self::shut_down) confirmed that the kernel cancelled it (without
    /// that confirmation the memory is leaked, never freed). The fd in `e` stays open
    /// until `e` is submitted (the kernel holds its own reference from then on).
    unsafe fn push(&mut self, e: &squeue::Entry, c: &mut Common) -> io::Result<()> {
        for _ in 0..3 {
            // SAFETY: what `e` points at stays valid until its completion, as this
            // function's caller guarantees.
            if unsafe { self.ring.ring.submission().push(e) }.is_ok() {
                return Ok(());
            }
            self.ring.enter(Some(Duration::ZERO))?;
            c.stats.send_calls += 1;
        }
        Err(io::Error::other("io_uring submission queue stays full"))
    }

    /// Builds the GSO groups and pushes one SENDMSG per group. Returns whether any was
    /// pushed. Only while no earlier group is in flight.
    fn queue_sends(&mut self, c: &mut Common) -> io::Result<bool> {
        if c.sendq.in_flight() || c.sendq.is_empty() {
            return Ok(false);
        }
        let n = {
            let table = &c.table;
            c.sendq.build(|id| table.info(id))
        };
        if n == 0 {
            c.sendq.clear_groups();
            return Ok(false);
        }
        let mut pushed = false;
        for g in 0..n {
            if c.fake_eagain() {
                c.group_failed(g, libc::EAGAIN);
                self.need_arm = true;
                continue;
            }
            // a closed socket's groups fail here, nothing is submitted for them
            if c.send_fd(g..g + 1).is_none() {
                continue;
            }
            let slot = c.sendq.group(g).sock.index() as u32;
            let sqe = opcode::SendMsg::new(Fixed(slot), c.sendq.msghdr(g))
                .flags(libc::MSG_DONTWAIT as u32)
                .build()
                .user_data(ud(K_SEND, g as u32));
            // SAFETY: the header, iovecs, address, control message and arena slots of
            // group `g` live in `c.sendq`, which `UdpIo` keeps in `Common` beside this
            // backend: boxed slices allocated once, so moving the driver moves none of
            // them. They are not rewritten until this send's completion is reaped: no
            // other build runs while a group is in flight, `clear_groups` waits until
            // `sends_in_flight` is zero, and an in-flight group's slots are neither free
            // nor pending, so nothing queued meanwhile reuses them. `UdpIo`'s drop shuts
            // this ring down before it frees the queue, and leaks the queue when the
            // kernel does not confirm. The socket is the open fixed file at its slot.
            unsafe { self.push(&sqe, c)? };
            self.sends_in_flight += 1;
            pushed = true;
        }
        if !pushed {
            c.sendq.clear_groups();
        }
        Ok(pushed)
    }

    /// Arms what is missing: multishot receives, POLLOUT polls, the eventfd read, and
    /// pushes pending cancellations.
    fn arm(&mut self, c: &mut Common) -> io::Result<()> {
        while let Some(target) = self.cancels.pop() {
            let sqe = opcode::AsyncCancel::new(target)
                .build()
                .user_data(ud(K_CANCEL, 0));
            // SAFETY: a cancellation points at no memory.
            unsafe { self.push(&sqe, c)? };
        }
        if !self.wake_armed {
            let buf: *mut u64 = match self.bufs.mem.as_mut() {
                Some(m) => &mut *m.wake_buf,
                None => return Err(io::Error::other("io_uring driver memory released")),
            };
            let sqe = opcode::Read::new(Fd(c.waker.as_raw_fd()), buf.cast(), 8)
                .build()
                .user_data(ud(K_WAKE, 0));
            // SAFETY: the 8-byte target is boxed in `self.bufs.mem`, freed only after
            // `shut_down` confirmed the cancellation (leaked otherwise); one read is armed
            // at a time (`wake_armed`) and Rust never reads the target.
            unsafe { self.push(&sqe, c)? };
            self.wake_armed = true;
        }
        if !self.need_arm {
            return Ok(());
        }
        self.need_arm = false;
        let hdr: *const libc::msghdr = match self.bufs.mem.as_ref() {
            Some(m) => m.recv_template(),
            None => return Err(io::Error::other("io_uring driver memory released")),
        };
        for i in 0..c.table.slots() {
            let Some(id) = c.table.id_at(i) else { continue };
            let want_write = match c.table.get(i) {
                Some(e) => e.want_write,
                None => continue,
            };
            let file = Fixed(i as u32);
            if !self.recv_armed[i] {
                let sqe = opcode::RecvMsgMulti::new(file, hdr, BGID)
                    .build()
                    .user_data(ud(K_RECV, id.raw()));
                // SAFETY: the template and the provided buffers live boxed in
                // `self.bufs.mem` (freed as the wake target is); Rust reads a buffer only
                // after a completion hands it over, and gives it back with `recycle`.
                unsafe { self.push(&sqe, c)? };
                self.recv_armed[i] = true;
                if self.armed_once[i] {
                    c.stats.recv_rearms += 1;
                }
                self.armed_once[i] = true;
            }
            if want_write && !self.pollout_armed[i] {
                let sqe = opcode::PollAdd::new(file, libc::POLLOUT as u32)
                    .build()
                    .user_data(ud(K_POLLOUT, id.raw()));
                // SAFETY: a poll points at no memory; the socket is the open fixed
                // file at its slot.
                unsafe { self.push(&sqe, c)? };
                self.pollout_armed[i] = true;
            }
        }
        Ok(())
    }

    /// Submits what is queued and, with `block`, waits for a completion or `wait`
    /// ([`Ring::enter`]); without it, collects what is ready without waiting, and makes
    /// no system call when nothing is to be submitted and the kernel flagged no
    /// completion work. Returns true when the wait timed out.
    fn enter(&mut self, c: &mut Common, block: bool, wait: Option<Duration>) -> io::Result<bool> {
        if block {
            c.stats.waits += 1;
            return self.ring.enter(wait);
        }
        if self.ring.ring.submission().is_empty() && !self.ring.kernel_has_work() {
            return Ok(false);
        }
        self.ring.enter(Some(Duration::ZERO))
    }

    /// One pass (see `UdpIo::run_once`): delivers what was kept, sends, arms, waits
    /// (when `timeout` allows and nothing is ready) for a completion, reaps.
    pub(crate) fn run_once(
        &mut self,
        c: &mut Common,
        timeout: Option<Duration>,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        let mut events = self.deliver_deferred(c, on_event);
        // a wake-up that came while we were busy: reported without a system call
        events += usize::from(c.take_wake(on_event));
        events += c.report_failures(on_event);
        let start = match timeout {
            Some(d) if !d.is_zero() => Some(Instant::now()),
            _ => None,
        };
        for round in 0..MAX_ROUNDS {
            let sent = self.queue_sends(c)?;
            self.arm(c)?;
            let wait = match (timeout, start) {
                (Some(d), Some(t0)) if round > 0 => Some(d.saturating_sub(t0.elapsed())),
                _ => timeout,
            };
            let ready = events > 0 || !self.ring.ring.completion().is_empty();
            let may_block = !ready && !wait.is_some_and(|w| w.is_zero());
            // block only if no wake-up is pending (see wake.rs for the handshake)
            let block = may_block && c.waker.park();
            let r = self.enter(c, block, wait);
            if may_block {
                c.waker.unpark();
            }
            let timed_out = r?;
            if sent {
                c.stats.send_calls += 1;
            }
            events += self.reap(c, on_event, true);
            events += c.report_failures(on_event);
            // a wake-up that kept us from blocking (or came meanwhile without a write)
            events += usize::from(c.take_wake(on_event));
            let expired = timed_out || wait.is_some_and(|w| w.is_zero());
            if events > 0 || expired {
                break;
            }
        }
        // A receive that ended (its buffers ran out) is re-armed before the caller may
        // wait elsewhere: a hosted core parks until the ring has a completion.
        if self.need_arm {
            self.arm(c)?;
            self.enter(c, false, Some(Duration::ZERO))?;
        }
        Ok(())
    }

    /// Sends what is queued without waiting; reports whatever completed meanwhile.
    pub(crate) fn flush(
        &mut self,
        c: &mut Common,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        if self.queue_sends(c)? {
            c.stats.send_calls += 1;
        }
        self.arm(c)?;
        self.enter(c, false, Some(Duration::ZERO))?;
        self.reap(c, on_event, false);
        c.report_failures(on_event);
        Ok(())
    }

    /// Delivers what `flush` reaped but kept back. Returns the events delivered.
    fn deliver_deferred(
        &mut self,
        c: &mut Common,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let mut events = 0;
        if std::mem::take(&mut self.deferred_wake) {
            c.report_woken(on_event);
            events += 1;
        }
        let mut got = 0;
        for &(low, bid, res) in &self.deferred {
            let id = SocketId::from_raw(low);
            if res >= 0 && c.table.is_open(id) {
                got += self.bufs.deliver(c, id, bid, res as usize, on_event);
            }
            self.bufs.recycle(bid);
        }
        self.deferred.clear();
        self.bufs.publish();
        if got > 0 {
            c.stats.recv_calls += 1;
        }
        events + got
    }

    /// Handles completions until the CQ is empty or a batch of datagrams went to the
    /// caller. Returns the events delivered. Without `deliver_now` (flush), datagrams and
    /// wake-ups are kept for the next `run_once`; send results are handled at once.
    fn reap(
        &mut self,
        c: &mut Common,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
        deliver_now: bool,
    ) -> usize {
        let batch = c.cfg.batch;
        let mut datagrams = 0usize;
        let mut events = 0usize;
        let mut woken = false;
        let Uring {
            ring,
            bufs,
            recv_armed,
            pollout_armed,
            wake_armed,
            need_arm,
            sends_in_flight,
            deferred,
            deferred_wake,
            more,
            ..
        } = self;
        let mut cq = ring.ring.completion();
        while datagrams < batch {
            let Some(cqe) = cq.next() else { break };
            let low = cqe.user_data() as u32;
            match cqe.user_data() >> 56 {
                K_RECV => {
                    let id = SocketId::from_raw(low);
                    let current = c.table.is_open(id);
                    let received = if deliver_now {
                        recv_done(c, bufs, &cqe, on_event)
                    } else {
                        recv_kept(c, deferred, &cqe);
                        0
                    };
                    datagrams += received;
                    events += received;
                    if !cqueue::more(cqe.flags()) && current {
                        recv_armed[id.index()] = false; // the multishot ended: re-arm
                        *need_arm = true;
                    }
                }
                K_SEND => {
                    *sends_in_flight = sends_in_flight.saturating_sub(1);
                    send_done(c, low as usize, cqe.result(), need_arm);
                    if *sends_in_flight == 0 {
                        c.sendq.clear_groups();
                    }
                }
                K_WAKE => {
                    *wake_armed = false;
                    if !deliver_now {
                        *deferred_wake |= c.waker.clear();
                    } else if !woken && c.take_wake(on_event) {
                        woken = true;
                        events += 1;
                    }
                }
                K_POLLOUT => {
                    let id = SocketId::from_raw(low);
                    if let Some(e) = c.table.entry_mut(id) {
                        pollout_armed[id.index()] = false;
                        e.want_write = false;
                        *need_arm = true;
                    }
                }
                _ => {} // K_CANCEL and anything stale
            }
        }
        *more = datagrams >= batch && !cq.is_empty();
        drop(cq);
        if datagrams > 0 {
            c.stats.recv_calls += 1;
        }
        bufs.publish();
        events
    }

    /// True when completions are known to wait without a new wake-up: the last reap
    /// stopped at the caller's batch with the CQ not empty, or `flush` kept datagrams or
    /// a wake-up for the next `run_once`. False otherwise: what arrives later completes
    /// into the CQ and ends the next wait (or, hosted, makes the ring readable).
    pub(crate) fn may_have_more(&self) -> bool {
        self.more || !self.deferred.is_empty() || self.deferred_wake
    }
}

/// A receive completion while datagrams go to the caller: delivers its buffer (unless
/// its socket was closed meanwhile) and recycles it. Returns the datagrams delivered.
fn recv_done(
    c: &mut Common,
    bufs: &mut BufRing,
    cqe: &cqueue::Entry,
    on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
) -> usize {
    let (id, res) = (SocketId::from_raw(cqe.user_data() as u32), cqe.result());
    count_recv_error(c, res);
    let Some(bid) = cqueue::buffer_select(cqe.flags()) else {
        return 0;
    };
    let n = if res >= 0 && c.table.is_open(id) {
        bufs.deliver(c, id, bid, res as usize, on_event)
    } else {
        0
    };
    bufs.recycle(bid);
    n
}

/// A receive completion reaped by `flush`: its buffer is kept for the next `run_once`.
fn recv_kept(c: &mut Common, deferred: &mut Vec<(u32, u16, i32)>, cqe: &cqueue::Entry) {
    count_recv_error(c, cqe.result());
    if let Some(bid) = cqueue::buffer_select(cqe.flags()) {
        deferred.push((cqe.user_data() as u32, bid, cqe.result()));
    }
}

/// Counts a receive error other than running out of buffers or a cancellation.
fn count_recv_error(c: &mut Common, res: i32) {
    if res < 0 && res != -libc::ENOBUFS && res != -libc::ECANCELED {
        c.stats.recv_errors += 1;
    }
}

/// The completion of group `g`'s SENDMSG (result `res`); an EAGAIN arms a POLLOUT poll.
fn send_done(c: &mut Common, g: usize, res: i32, need_arm: &mut bool) {
    if g >= c.sendq.group_count() {
        return;
    }
    if res >= 0 {
        c.group_sent(g);
    } else if c.group_failed(g, -res) == (GroupResult::Retry { eagain: true }) {
        *need_arm = true;
    }
}

impl Uring {
    /// Cancels every request synchronously (the first call does; later calls repeat
    /// its answer). False when the kernel did not confirm: it may still read or write
    /// what the requests point at, so this backend leaks its own memory and the caller
    /// must leak the send queue (it lives in `Common`).
    pub(crate) fn shut_down(&mut self) -> bool {
        if self.ring.never_used() {
            return true; // nothing was ever submitted
        }
        if let Some(ok) = self.shut {
            return ok;
        }
        let ok = match self.ring.ring.submitter().register_sync_cancel(
            Some(Timespec::from(Duration::from_secs(1))),
            CancelBuilder::any(),
        ) {
            Ok(()) => true,
            Err(e) => e.raw_os_error() == Some(libc::ENOENT),
        };
        if !ok {
            tracing::warn!(
                "io_uring did not confirm the cancellation of its requests: leaking its buffers"
            );
            // The kernel may still write into these buffers: never free them.
            std::mem::forget(self.bufs.mem.take());
        }
        self.shut = Some(ok);
        ok
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.shut_down();
    }
}
