//! The io_uring backend's stand-in when the `io-uring` cargo feature is off. [`Uring`]
//! has no values, so the driver's arms for it compile unchanged and none of them runs;
//! [`Uring::new`] is the one place that says io_uring is not compiled in (`Auto` takes
//! that as a refusal and runs on mmsg; `Uring` by name fails with it).

use std::io;
use std::sync::Arc;
use std::time::Duration;

use super::shared::Common;
use super::wake::Waker;
use super::{IoConfig, IoEvent, SendQueue, SocketId};

/// No io_uring driver exists in this build.
pub(crate) enum Uring {}

impl Uring {
    pub(crate) fn new(_cfg: &IoConfig) -> io::Result<(Uring, Arc<Waker>)> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the io_uring backend is not compiled in (cargo feature `io-uring` is off); use mmsg or auto",
        ))
    }

    pub(crate) fn shut_down(&mut self) -> bool {
        match *self {}
    }

    pub(crate) fn may_have_more(&self) -> bool {
        match *self {}
    }

    pub(crate) fn socket_added(&mut self, _slot: usize, _fd: std::os::fd::RawFd) -> io::Result<()> {
        match *self {}
    }

    pub(crate) fn readiness_fd(&self) -> Option<std::os::fd::RawFd> {
        match *self {}
    }

    pub(crate) fn socket_closed(&mut self, _slot: usize, _old: SocketId) {
        match *self {}
    }

    pub(crate) fn run_once(
        &mut self,
        _c: &mut Common,
        _timeout: Option<Duration>,
        _on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        match *self {}
    }

    pub(crate) fn flush(
        &mut self,
        _c: &mut Common,
        _on_event: &mut dyn FnMut(&mut SendQueue, IoEvent<'_>),
    ) -> io::Result<()> {
        match *self {}
    }
}
