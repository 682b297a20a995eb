//! The cross-thread waker of one driver: an eventfd plus two flags, so that
//! [`Waker::wake`] makes a system call only when it is needed: no wake-up is pending
//! yet *and* the driver is blocked (or about to block) in its wait. A driver that is
//! busy finds the pending flag at the start of its next loop without any system call.
//!
//! The handshake (all `SeqCst`): the waker sets `pending`, then reads `parked`; the
//! driver sets `parked`, then reads `pending` before it blocks. Whichever comes second
//! sees the other's flag, so a wake-up is never lost: either the driver does not block,
//! or the waker writes the eventfd.
//!
//! A driver run as a task on an async runtime (a hosted engine core) waits in the
//! runtime instead of in `poll(2)`: after [`Waker::host`], a wake-up wakes the
//! registered task instead of writing the eventfd (no system call when the submitter
//! runs on the same runtime worker). The handshake is the same: the task registers,
//! then parks, then reads `pending`.
//!
//! Owns: the eventfd and the flags, and the mmsg driver's whole wait ([`Waker::poll`]:
//! park, `poll(2)` over the fds it is given, unpark, drain, clear). Must not touch: the
//! driver's sockets or ring (the driver builds the poll set; io_uring reads the eventfd
//! through a read SQE).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;

use crate::sync::{AtomicBool, AtomicWaker};

/// Ends a driver's wait from any thread. Obtained from `UdpIo::waker`.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
    pending: AtomicBool,
    parked: AtomicBool,
    /// Set once: wake the registered task instead of writing the eventfd.
    hosted: AtomicBool,
    task: AtomicWaker,
}

impl Waker {
    /// `nonblocking`: the mmsg backend drains the eventfd with plain reads; io_uring
    /// reads it through the ring and wants a blocking fd (so the read waits in the
    /// kernel instead of failing with EAGAIN).
    pub(crate) fn new(nonblocking: bool) -> io::Result<Waker> {
        let flags = libc::EFD_CLOEXEC | if nonblocking { libc::EFD_NONBLOCK } else { 0 };
        // SAFETY: plain syscall; the fd is owned by the returned value.
        let fd = unsafe { libc::eventfd(0, flags) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Waker {
            // SAFETY: `fd` is a fresh eventfd nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            pending: AtomicBool::new(false),
            parked: AtomicBool::new(false),
            hosted: AtomicBool::new(false),
            task: AtomicWaker::new(),
        })
    }

    /// Wakes the driver: its current or next wait ends and it reports `IoEvent::Woken`.
    /// Work published before this call is visible to the driver's caller when it sees
    /// the event. One `write(2)` per wake-up at most, and only while the driver waits.
    pub fn wake(&self) {
        if self.pending.swap(true, Ordering::SeqCst) {
            return;
        }
        crate::sync::seq_cst_point();
        if !self.parked.load(Ordering::SeqCst) {
            return; // the driver sees `pending` before it next blocks
        }
        if self.hosted.load(Ordering::SeqCst) {
            return self.task.wake();
        }
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd. It cannot block: the
        // pending flag keeps the counter far below its maximum.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// From now on the driver waits as a task: wake-ups wake the task last passed to
    /// [`register`](Self::register) instead of writing the eventfd.
    pub(crate) fn host(&self) {
        self.hosted.store(true, Ordering::SeqCst);
    }

    /// The hosted driver's task (register before [`park`](Self::park), then check
    /// [`is_pending`](Self::is_pending), as a future's poll does).
    pub(crate) fn register(&self, task: &std::task::Waker) {
        self.task.register(task);
    }

    /// True while a wake-up is pending (not yet reported by the driver).
    pub fn is_pending(&self) -> bool {
        self.pending.load(Ordering::SeqCst)
    }

    /// Clears the pending flag (the driver, before it reports `Woken`); returns whether
    /// it was set.
    pub(crate) fn clear(&self) -> bool {
        self.pending.swap(false, Ordering::SeqCst)
    }

    /// The driver is about to block: returns false when a wake-up is already pending
    /// (then it must not block). Pair with [`unpark`](Self::unpark).
    pub(crate) fn park(&self) -> bool {
        self.parked.store(true, Ordering::SeqCst);
        crate::sync::seq_cst_point();
        !self.pending.load(Ordering::SeqCst)
    }

    /// The driver's wait is over.
    pub(crate) fn unpark(&self) {
        self.parked.store(false, Ordering::SeqCst);
    }

    /// The mmsg driver's wait, whole: `poll(2)` over `fds`, whose first entry is this
    /// waker's eventfd. It blocks (up to `ms`; -1: no limit) only when `may_block` and no
    /// wake-up is pending, announced with the park handshake ([`park`](Self::park) before,
    /// [`unpark`](Self::unpark) after); then it drains the eventfd when it was readable
    /// and clears the pending flag. The same system calls as the steps one by one.
    pub(crate) fn poll(
        &self,
        fds: &mut [libc::pollfd],
        may_block: bool,
        ms: i32,
    ) -> io::Result<Polled> {
        let ms = if may_block && self.park() { ms } else { 0 };
        // SAFETY: `fds` is a valid array of that many pollfd entries.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        let err = (r < 0).then(io::Error::last_os_error);
        if may_block {
            self.unpark();
        }
        if let Some(e) = err
            && e.kind() != io::ErrorKind::Interrupted
        {
            return Err(e);
        }
        if fds.first().is_some_and(|f| f.revents & libc::POLLIN != 0) {
            self.drain();
        }
        Ok(Polled {
            blocked: ms != 0,
            woken: self.clear(),
        })
    }

    /// Reads the eventfd counter back to zero (non-blocking fd only).
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}

/// What [`Waker::poll`] saw.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Polled {
    /// The poll could block (a wait with a timeout other than zero).
    pub blocked: bool,
    /// A wake-up was pending: it is cleared, the driver reports it.
    pub woken: bool,
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The pending/parked handshake under loom (a model of [`crate::loom_models`]):
/// the driver's side as the mmsg/io_uring backends and the hosted core run it, against
/// submitters that publish work and wake. A lost wake-up shows as a driver that blocks
/// for ever (a deadlock loom reports) or spins without end.
#[cfg(feature = "loom")]
pub(crate) mod loom_models {
    use super::*;
    use crate::sync::loom_model;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize;

    const BOUND: usize = 3;

    /// One nonblocking read of the eventfd: true when a wake-up was written.
    fn eventfd_readable(w: &Waker) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from the waker's (nonblocking) eventfd.
        let n = unsafe { libc::read(w.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        n == 8
    }

    /// The eventfd driver (mmsg's `poll`, io_uring's read SQE): park; if that says
    /// block, wait until the eventfd is written; unpark; report the wake-up.
    pub(crate) fn loom_waker_wake_vs_park_eventfd() {
        loom_model("waker: wake vs park (eventfd)", BOUND, || {
            let w = Arc::new(Waker::new(true).unwrap());
            let w2 = w.clone();
            let t = loom::thread::spawn(move || w2.wake());
            if w.park() {
                // blocked in poll(2): only the eventfd ends the wait
                while !eventfd_readable(&w) {
                    loom::thread::yield_now();
                }
            }
            w.unpark();
            assert!(w.clear(), "the wake-up is reported");
            t.join().unwrap();
        });
    }

    /// The hosted driver (a task on a runtime): two submitters publish one item each
    /// and wake; the driver takes work, registers its task, parks and waits as a
    /// future (woken through the task waker, never the eventfd) until it has both.
    pub(crate) fn loom_waker_two_submitters_vs_hosted_driver() {
        loom_model("waker: two wakes vs hosted driver loop", BOUND, || {
            let w = Arc::new(Waker::new(true).unwrap());
            w.host();
            let work = Arc::new(AtomicUsize::new(0));
            let subs: Vec<_> = (0..2)
                .map(|_| {
                    let (w, work) = (w.clone(), work.clone());
                    loom::thread::spawn(move || {
                        work.fetch_add(1, Ordering::SeqCst);
                        w.wake();
                    })
                })
                .collect();
            let (w2, work2) = (w.clone(), work.clone());
            // the driver on its own thread: the main thread's `join` must not see the
            // task waker's unpark
            let driver = loom::thread::spawn(move || {
                let (w, work) = (w2, work2);
                let task = crate::sync::thread_waker();
                let mut seen = 0;
                loop {
                    seen += work.swap(0, Ordering::SeqCst);
                    if seen == 2 {
                        break;
                    }
                    // the wait future of `engine::runtime::hosted`: each poll registers the
                    // task first; the first one parks
                    let mut parked = false;
                    loop {
                        w.register(&task);
                        if !parked {
                            parked = true;
                            if !w.park() {
                                break;
                            }
                        }
                        if w.is_pending() {
                            break;
                        }
                        loom::thread::park(); // Poll::Pending until the task is woken
                    }
                    w.unpark();
                    w.clear();
                }
            });
            driver.join().unwrap();
            for s in subs {
                s.join().unwrap();
            }
            assert!(
                !eventfd_readable(&w),
                "a hosted waker never writes the eventfd"
            );
        });
    }
}
