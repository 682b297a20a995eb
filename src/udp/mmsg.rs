//! The mmsg backend: `sendmmsg` of the GSO groups, `recvmmsg` into fixed buffers (with
//! the `UDP_GRO` control message), and a `poll(2)` wait over every socket and the
//! waker's eventfd. Used where io_uring is refused, or when configured.
//!
//! Owns: the receive buffers and the poll set. Must not touch: grouping (gso.rs),
//! socket creation (socket.rs).
//!
//! While datagrams keep arriving it skips the `poll` and receives directly from every
//! socket (one `recvmmsg` each), polling at least every 8th loop so that no socket and
//! no wake-up waits behind a busy one.

use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

use super::gro::{self, CONTROL_LEN};
use super::gso::{GroupResult, MsgHeaders};
use super::shared::Common;
use super::socket::from_c;
use super::wake::Waker;
use super::{GRO_BUFFER, IoConfig, IoEvent, SendQueue};

/// Loops without a `poll` at most while busy.
const HOT_LOOPS: u32 = 8;
/// `sendmmsg` takes at most this many messages (UIO_MAXIOV).
const MAX_MSGS: usize = 1024;

struct RecvBufs {
    buf_size: usize,
    bufs: Box<[u8]>,
    addrs: Box<[libc::sockaddr_storage]>,
    ctrl: Box<[[u64; CONTROL_LEN / 8]]>,
    /// Point into `bufs`, `addrs` and `ctrl` once `prepare` ran.
    msgs: MsgHeaders,
}

impl RecvBufs {
    fn new(n: usize, buf_size: usize) -> RecvBufs {
        RecvBufs {
            buf_size,
            bufs: vec![0u8; n * buf_size].into_boxed_slice(),
            // SAFETY: all-zero is a valid value of these plain C structs.
            addrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            ctrl: vec![[0u64; CONTROL_LEN / 8]; n].into_boxed_slice(),
            // `prepare` points them at this batch's buffers before any syscall reads them
            msgs: MsgHeaders::new(n),
        }
    }

    fn prepare(&mut self, control: bool) {
        for i in 0..self.msgs.hdrs.len() {
            self.msgs.iovs[i] = libc::iovec {
                iov_base: self.bufs[i * self.buf_size..].as_mut_ptr().cast(),
                iov_len: self.buf_size,
            };
            let h = &mut self.msgs.hdrs[i];
            h.msg_len = 0;
            let m = &mut h.msg_hdr;
            m.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            m.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            m.msg_iov = &mut self.msgs.iovs[i];
            m.msg_iovlen = 1;
            if control {
                m.msg_control = self.ctrl[i].as_mut_ptr().cast();
                m.msg_controllen = CONTROL_LEN;
            } else {
                m.msg_control = std::ptr::null_mut();
                m.msg_controllen = 0;
            }
            m.msg_flags = 0;
        }
    }
}

/// Receive messages per `recvmmsg` and the size of each buffer.
pub(crate) fn recv_shape(cfg: &IoConfig) -> (usize, usize) {
    if cfg.gro {
        ((cfg.batch / 8).clamp(8, 64), GRO_BUFFER)
    } else {
        (cfg.batch.clamp(1, 1024), cfg.max_datagram)
    }
}

/// Messages of the last `recvmmsg` not yet handed to the caller.
#[derive(Clone, Copy)]
struct Backlog {
    id: super::SocketId,
    gro: bool,
    next: usize,
    len: usize,
}

pub(crate) struct Mmsg {
    rx: RecvBufs,
    backlog: Option<Backlog>,
    pollfds: Vec<libc::pollfd>,
    pollidx: Vec<usize>,
    hot: bool,
    /// The last `recvmmsg` filled every buffer: its socket may hold more.
    filled: bool,
    hot_loops: u32,
}

/// Poll timeout in ms, rounded up so the wait never ends before the deadline.
fn poll_ms(timeout: Option<Duration>) -> i32 {
    match timeout {
        None => -1,
        Some(d) => d.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32,
    }
}

impl Mmsg {
    pub(crate) fn new(cfg: &IoConfig) -> io::Result<(Mmsg, Arc<Waker>)> {
        let waker = Arc::new(Waker::new(true)?);
        let (n, size) = recv_shape(cfg);
        Ok((
            Mmsg {
                rx: RecvBufs::new(n, size),
                backlog: None,
                pollfds: Vec::with_capacity(cfg.max_sockets + 1),
                pollidx: Vec::with_capacity(cfg.max_sockets + 1),
                hot: false,
                filled: false,
                hot_loops: 0,
            },
            waker,
        ))
    }

    pub(crate) fn run_once(
        &mut self,
        c: &mut Common,
        timeout: Option<Duration>,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        let mut events = self.send_and_report(c, on_event);
        let batch = c.cfg.batch;
        // `may_have_more` speaks of this pass: a buffer filled by an earlier one does not
        // keep the caller from waiting once the socket was drained
        self.filled = false;
        // a wake-up that came while we were busy: reported without a system call
        events += usize::from(c.take_wake(on_event));
        // what the last loop received beyond its batch goes first, without a syscall
        let mut got = self.deliver(c, batch, on_event);
        if self.backlog.is_some() {
            self.hot = true;
            return Ok(());
        }
        if self.hot && self.hot_loops < HOT_LOOPS {
            self.hot_loops += 1;
            got += self.recv_all(c, batch.saturating_sub(got), on_event);
            let woken = c.take_wake(on_event);
            if got > 0 || woken {
                self.hot = got > 0;
                return Ok(());
            }
        }
        self.hot_loops = 0;
        let may_block = events == 0
            && got == 0
            && !matches!(timeout, Some(d) if d.is_zero())
            && !c.sendq.has_failures();
        if self.poll(c, may_block, timeout)? {
            c.report_woken(on_event);
        }
        let (received, writable) = self.handle_ready(c, batch.saturating_sub(got), on_event);
        got += received;
        c.take_wake(on_event);
        if writable && !c.sendq.is_empty() {
            self.send_all(c);
        }
        c.report_failures(on_event);
        self.hot = got > 0;
        Ok(())
    }

    /// Reports the failures recorded so far, sends what is queued, and reports what
    /// that sending failed. Returns the events reported.
    fn send_and_report(
        &mut self,
        c: &mut Common,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let events = c.report_failures(on_event);
        self.send_all(c);
        events + c.report_failures(on_event)
    }

    /// One `recvmmsg` on every open socket (the busy path, without `poll`), up to
    /// `budget` datagrams in all. Returns those delivered.
    fn recv_all(
        &mut self,
        c: &mut Common,
        budget: usize,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let mut got = 0;
        for i in 0..c.table.slots() {
            if c.table.get(i).is_some() {
                got += self.recv_from(c, i, budget.saturating_sub(got), on_event);
            }
        }
        got
    }

    /// Waits in `poll(2)` on the waker's eventfd and every socket (readable, and
    /// writable while its sends wait for room): until one is ready or `timeout` passed
    /// when `may_block` and no wake-up is pending, else without blocking. True when a
    /// wake-up was pending (cleared: the caller reports it).
    fn poll(
        &mut self,
        c: &mut Common,
        may_block: bool,
        timeout: Option<Duration>,
    ) -> io::Result<bool> {
        self.pollfds.clear();
        self.pollidx.clear();
        self.pollfds.push(libc::pollfd {
            fd: c.waker.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        self.pollidx.push(usize::MAX);
        for (i, _, e) in c.table.iter() {
            let mut events = libc::POLLIN;
            if e.want_write {
                events |= libc::POLLOUT;
            }
            self.pollfds.push(libc::pollfd {
                fd: e.sock.as_raw_fd(),
                events,
                revents: 0,
            });
            self.pollidx.push(i);
        }
        // blocks only if no wake-up is pending (see wake.rs for the handshake)
        let p = c
            .waker
            .poll(&mut self.pollfds, may_block, poll_ms(timeout))?;
        c.stats.waits += u64::from(p.blocked);
        Ok(p.woken)
    }

    /// After [`poll`](Self::poll): marks the writable sockets, and receives from the
    /// readable ones up to `budget` datagrams.
    /// Returns those delivered and whether a socket became writable.
    fn handle_ready(
        &mut self,
        c: &mut Common,
        budget: usize,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> (usize, bool) {
        let mut got = 0;
        let mut writable = false;
        for k in 1..self.pollfds.len() {
            let rev = self.pollfds[k].revents;
            if rev == 0 {
                continue;
            }
            let i = self.pollidx[k];
            if rev & libc::POLLOUT != 0
                && let Some(e) = c.table.get_mut(i)
            {
                e.want_write = false;
                writable = true;
            }
            if rev & (libc::POLLIN | libc::POLLERR) != 0 {
                got += self.recv_from(c, i, budget.saturating_sub(got), on_event);
            }
        }
        (got, writable)
    }

    /// `run_once` without the wait and without `poll(2)`: sends, reports a pending
    /// wake-up, delivers the backlog, then one `recvmmsg` on each socket `read` picks.
    pub(crate) fn run_nowait(
        &mut self,
        c: &mut Common,
        read: &dyn Fn(super::SocketId) -> bool,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) {
        self.send_and_report(c, on_event);
        c.take_wake(on_event);
        let batch = c.cfg.batch;
        self.filled = false;
        let mut got = self.deliver(c, batch, on_event);
        for i in 0..c.table.slots() {
            if self.backlog.is_some() {
                break;
            }
            if c.table.id_at(i).is_some_and(read) {
                got += self.recv_from(c, i, batch.saturating_sub(got), on_event);
            }
        }
    }

    /// True when the last pass ([`run_once`](Self::run_once) or
    /// [`run_nowait`](Self::run_nowait)) may have left datagrams in
    /// a socket or the backlog (a `recvmmsg` filled every buffer, or the budget ran
    /// out); false means every socket it read was drained.
    pub(crate) fn may_have_more(&self) -> bool {
        self.filled || self.backlog.is_some()
    }

    /// One `recvmmsg` on socket slot `i`, then delivers up to `budget` datagrams (whole
    /// messages; the rest stays as backlog for the next loop). Returns those delivered.
    fn recv_from(
        &mut self,
        c: &mut Common,
        i: usize,
        budget: usize,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        if self.backlog.is_some() || budget == 0 {
            return 0;
        }
        let Some(id) = c.table.id_at(i) else { return 0 };
        let Some(e) = c.table.get(i) else {
            return 0;
        };
        let (fd, gro) = (e.sock.as_raw_fd(), e.gro);
        self.rx.prepare(gro);
        // SAFETY: the headers point into buffers owned by `self.rx`, valid for the
        // lengths given; the kernel writes at most those lengths.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                self.rx.msgs.hdrs.as_mut_ptr(),
                self.rx.msgs.hdrs.len() as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::Interrupted
                | io::ErrorKind::ConnectionRefused => {}
                _ => c.stats.recv_errors += 1,
            }
            return 0;
        }
        if n == 0 {
            return 0;
        }
        c.stats.recv_calls += 1;
        self.filled |= n as usize == self.rx.msgs.hdrs.len();
        self.backlog = Some(Backlog {
            id,
            gro,
            next: 0,
            len: n as usize,
        });
        self.deliver(c, budget, on_event)
    }

    /// Delivers received messages of the backlog until `budget` datagrams went out
    /// (never splitting one GRO buffer). Returns the datagrams delivered.
    fn deliver(
        &mut self,
        c: &mut Common,
        budget: usize,
        on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> usize {
        let Some(b) = self.backlog else { return 0 };
        if !c.table.is_open(b.id) {
            self.backlog = None; // closed meanwhile
            return 0;
        }
        let mut total = 0;
        let mut k = b.next;
        while k < b.len && total < budget {
            let h = &self.rx.msgs.hdrs[k];
            let idx = k;
            k += 1;
            if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
                c.stats.recv_truncated += 1;
                continue;
            }
            let len = (h.msg_len as usize).min(self.rx.buf_size);
            let Some(from) = from_c(&self.rx.addrs[idx], h.msg_hdr.msg_namelen) else {
                continue;
            };
            let seg = if b.gro {
                let cl = h.msg_hdr.msg_controllen.min(CONTROL_LEN);
                // SAFETY: the control buffer is CONTROL_LEN plain bytes.
                let ctrl = unsafe {
                    std::slice::from_raw_parts(self.rx.ctrl[idx].as_ptr().cast::<u8>(), cl)
                };
                gro::segment_size(ctrl)
            } else {
                None
            };
            let at = idx * self.rx.buf_size;
            let data = &mut self.rx.bufs[at..at + len];
            total += c.deliver(b.id, from, data, seg, on_event);
        }
        self.backlog = if k < b.len {
            Some(Backlog { next: k, ..b })
        } else {
            None
        };
        total
    }

    /// Sends every queued datagram it can (GSO groups, one `sendmmsg` per socket and
    /// run of successes). EAGAIN keeps the rest of that socket's groups queued; a
    /// kernel refusing GSO re-queues the group and the socket sends per datagram from
    /// then on (a second pass does so at once).
    pub(crate) fn send_all(&mut self, c: &mut Common) {
        for _pass in 0..2 {
            if c.sendq.is_empty() {
                return;
            }
            let n = {
                let table = &c.table;
                c.sendq.build(|id| table.info(id))
            };
            let mut again = false;
            let mut g = 0;
            while g < n {
                let sock = c.sendq.group(g).sock;
                let mut h = g;
                while h < n && c.sendq.group(h).sock == sock {
                    h += 1;
                }
                // open: `build` failed the datagrams of closed sockets, and nothing
                // closes one during this pass
                let fd = c.sendq.group(g).fd;
                let mut at = g;
                while at < h {
                    let cnt = (h - at).min(MAX_MSGS);
                    let r = if c.fake_eagain() {
                        -1
                    } else {
                        // SAFETY: headers at..at+cnt point into the send queue's arena,
                        // addresses and control buffers, all alive and unchanged here.
                        unsafe {
                            libc::sendmmsg(
                                fd,
                                c.sendq.hdrs_from(at),
                                cnt as u32,
                                libc::MSG_DONTWAIT,
                            )
                        }
                    };
                    c.stats.send_calls += 1;
                    if r > 0 {
                        for k in at..at + r as usize {
                            c.sendq.sent(k, &mut c.stats);
                        }
                        at += r as usize;
                        continue;
                    }
                    let errno = if r == -1 && c.faked() {
                        libc::EAGAIN
                    } else {
                        io::Error::last_os_error()
                            .raw_os_error()
                            .unwrap_or(libc::EIO)
                    };
                    if errno == libc::EINTR {
                        continue;
                    }
                    match c.group_failed(at, errno) {
                        // the socket's buffer is full: its later groups wait too
                        GroupResult::Retry { eagain: true } => {
                            for k in at + 1..h {
                                c.sendq.finish(k, GroupResult::Retry { eagain: true });
                            }
                            at = h;
                        }
                        GroupResult::Retry { eagain: false } => {
                            again = true;
                            at += 1;
                        }
                        _ => at += 1,
                    }
                }
                g = h;
            }
            // the groups are forgotten by the next build
            if !again {
                return;
            }
        }
    }
}
