//! A pinned core: one engine core on a thread of its own, pinned to one CPU with
//! `core_affinity` (the default placement; `EngineBuilder::runtime` hosts cores on the
//! application's Tokio runtime instead, see `super::hosted`).
//!
//! Owns: the core's thread, its CPU pinning, and the scheduling of its turns: it runs
//! [`Core::run`] (turns until the core stops), letting the turn's I/O pass block the thread
//! ([`Scheduler::BLOCKS`]) when no work is certain. Must not touch: anything a turn
//! does (the order of a turn, wakes, publication and faults are `super::turn`'s).

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use super::config::BuildError;
use super::consts::START_WAIT;
use super::shared::Shared;
use super::turn::{Core, Scheduler};
use crate::udp::SocketId;

/// The pinned thread: the I/O layer waits in the kernel, for every socket at once.
struct Pinned;

impl Scheduler for Pinned {
    const BLOCKS: bool = true;

    fn readable(&self, _: SocketId) -> bool {
        true
    }

    fn unwatch(&mut self, _: SocketId) {}
}

/// Starts core `index` on a thread pinned to CPU `cpu`; returns once its first socket
/// is bound (or it failed to start), with the socket's local address.
pub(crate) fn spawn(
    index: usize,
    cpu: usize,
    shared: Arc<Shared>,
) -> Result<(JoinHandle<()>, SocketAddr), BuildError> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let spawned = std::thread::Builder::new()
        .name(format!("rl-core-{index}"))
        .spawn(move || {
            let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
            match Core::new(index, shared) {
                Ok(mut core) => {
                    let _ = tx.send(Ok(core.local_addr()));
                    core.run(&mut Pinned);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        });
    let thread = spawned.map_err(|e| BuildError::Executor {
        core: index,
        kind: e.kind(),
    })?;
    match rx.recv_timeout(START_WAIT) {
        Ok(Ok(addr)) => Ok((thread, addr)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(BuildError::Executor {
            core: index,
            kind: std::io::ErrorKind::TimedOut,
        }),
    }
}
