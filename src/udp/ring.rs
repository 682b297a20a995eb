//! The io_uring instance of the io_uring backend: its setup flags for the caller it
//! serves, its fixed-file table (the sockets) and the one system call that submits and
//! waits.
//!
//! **Setup by caller** ([`Caller`]):
//!
//! - [`Caller::OneThread`] (a pinned engine core, the responder, loadgen's raw client):
//!   `SINGLE_ISSUER | DEFER_TASKRUN`, created disabled so that the first thread that
//!   runs the driver becomes its issuer. Completions are produced only while that
//!   thread is in [`Ring::enter`], never by interrupting its loop.
//! - [`Caller::Runtime`] (a hosted engine core): the driver is called from whichever
//!   worker thread runs its task, and the task waits in the runtime's reactor for the
//!   ring's fd to become readable. `SINGLE_ISSUER` would refuse the second thread and
//!   `DEFER_TASKRUN` needs it, so the ring gets `COOP_TASKRUN`: a completion is
//!   produced at the next kernel entry of the thread that armed it (a sleeping thread
//!   is woken for it, a running one is not interrupted).
//!
//!   Even on a current-thread runtime, where one thread runs the task, the one-thread
//!   setup does not serve: a `DEFER_TASKRUN` ring never wakes a poller of its own fd for
//!   the work it defers, and a registered eventfd (`IORING_REGISTER_EVENTFD`) tells
//!   `epoll` of an arrived datagram 16 ms late (median of 9 rounds, Linux 6.18; a
//!   `COOP_TASKRUN` ring's own fd: 5 µs; `cargo bench --bench uring_eventfd`). A hosted
//!   core would sleep through its answers (built and measured: 7.7 ms per sequential
//!   request against 0.2 with mmsg).
//!
//! Both set `TASKRUN_FLAG`, so a pass that neither submits nor waits makes no system
//! call unless the kernel flagged completion work to run, and `NO_SQARRAY` where the
//! kernel has it (6.6; refused with `EINVAL` before, then the ring is built without it).
//! The sockets are fixed files at their slot in the socket table: a request names its
//! socket by index, so the kernel takes no reference per operation (1–2% of the CPU
//! per decision, benches/README.md). A registered ring fd and min-wait batching were
//! measured too and left out (same page).
//!
//! Owns: the `IoUring`, its setup, its fixed files and the enter system call. Must
//! not touch: what is armed, reaped or delivered (uring.rs), the memory the kernel
//! writes into (bufring.rs).

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use io_uring::IoUring;
use io_uring::types::{SubmitArgs, Timespec};

use super::Caller;

/// Submission queue entries.
const SQ_ENTRIES: u32 = 256;

/// The io_uring instance of one driver. See the module docs.
pub(crate) struct Ring {
    pub(crate) ring: IoUring,
    caller: Caller,
    /// Created disabled (one thread): enabled by the first [`enter`](Self::enter).
    disabled: bool,
    /// The timeout of the current wait (the kernel reads it during the enter).
    ts: Timespec,
}

fn build(caller: Caller, cq: u32, no_sqarray: bool) -> io::Result<IoUring> {
    let mut b = IoUring::builder();
    b.setup_cqsize(cq).setup_taskrun_flag();
    if no_sqarray {
        b.setup_no_sqarray();
    }
    match caller {
        Caller::OneThread => b
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_r_disabled(),
        Caller::Runtime => b.setup_coop_taskrun(),
    };
    b.build(SQ_ENTRIES)
}

impl Ring {
    /// A ring for `caller` with `cq` completion entries and a table of `files` fixed
    /// files (all empty). Fails with `EINVAL` where the kernel lacks what this backend
    /// needs (`DEFER_TASKRUN` or `COOP_TASKRUN` with `TASKRUN_FLAG`, extended enter
    /// arguments, no-drop completions, sparse file tables: Linux 6.1), which
    /// `BackendChoice::Auto` takes as a refusal.
    pub(crate) fn new(caller: Caller, cq: u32, files: u32) -> io::Result<Ring> {
        let ring = match build(caller, cq, true) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => build(caller, cq, false)?,
            r => r?,
        };
        let p = ring.params();
        if !p.is_feature_ext_arg() || !p.is_feature_nodrop() {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        ring.submitter().register_files_sparse(files)?;
        Ok(Ring {
            ring,
            caller,
            disabled: caller == Caller::OneThread,
            ts: Timespec::new(),
        })
    }

    /// The fd that becomes readable when completions are ready (for a caller that waits
    /// in a runtime's reactor).
    pub(crate) fn fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }

    /// True while the ring was never enabled: nothing was ever submitted.
    pub(crate) fn never_used(&self) -> bool {
        self.disabled
    }

    /// Puts `fd` (or nothing) at fixed-file slot `slot`. Requests already submitted on
    /// the old file keep their own reference to it.
    pub(crate) fn set_file(&self, slot: usize, fd: Option<RawFd>) -> io::Result<()> {
        self.ring
            .submitter()
            .register_files_update(slot as u32, &[fd.unwrap_or(-1)])
            .map(drop)
    }

    /// True when an enter has work even without submissions or a wait: the kernel
    /// flagged task work (completions to produce) or a CQ overflow to flush.
    pub(crate) fn kernel_has_work(&mut self) -> bool {
        let sq = self.ring.submission();
        sq.taskrun() || sq.cq_overflow()
    }

    /// Submits what is queued and waits until a completion is ready (the first call
    /// enables a one-thread ring on the calling thread: its issuer from now on).
    /// `timeout`: `None` waits without limit, zero does not wait (completion work the
    /// kernel flagged is still produced). Returns true when the timeout passed.
    pub(crate) fn enter(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        if self.disabled {
            self.ring.submitter().register_enable_rings()?;
            self.disabled = false;
        }
        let r = match timeout {
            None => self.ring.submit_and_wait(1),
            Some(d) if d.is_zero() => self.ring.submit(),
            Some(d) => {
                self.ts = Timespec::from(d);
                let args = SubmitArgs::new().timespec(&self.ts);
                self.ring.submitter().submit_with_args(1, &args)
            }
        };
        match r {
            Ok(_) => Ok(false),
            Err(e) => match e.raw_os_error() {
                Some(libc::ETIME) => Ok(true),
                Some(libc::EINTR | libc::EBUSY | libc::EAGAIN) => Ok(false),
                _ => Err(e),
            },
        }
    }

    /// The caller this ring was set up for.
    pub(crate) fn caller(&self) -> Caller {
        self.caller
    }
}
