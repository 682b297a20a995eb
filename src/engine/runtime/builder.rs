//! The engine builder: its options.
//!
//! Owns: [`EngineBuilder`] and its setters, each writing the one `Settings` value
//! (`super::config`). `Engine::builder` makes one; `EngineBuilder::build` is the
//! lifecycle's (`super::lifecycle`): it validates the settings and starts the engine they
//! describe. Must not touch: validation, the shared state, the cores, the handle.

use std::fmt;
use std::time::Duration;

use super::config::{Cores, DnsConfig, Settings};
use crate::proto::key::ApiKey;
use crate::proto::machine::Endpoint;
use crate::proto::policy::RequestPolicy;

/// Builds an [`Engine`](crate::Engine). See docs/ARCHITECTURE.md.
pub struct EngineBuilder {
    pub(super) settings: Settings,
    pub(super) runtime: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for EngineBuilder {
    /// The settings, never the key's secret (only its id).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.settings;
        f.debug_struct("EngineBuilder")
            .field("key_id", &s.key.key_id())
            .field("policy", &s.policy)
            .field("cores", &s.cores)
            .field("endpoints", &s.endpoints)
            .field("dns", &s.dns)
            .field("in_flight_per_core", &s.core.in_flight_per_core)
            .field("hosted", &self.runtime.is_some())
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// The defaults for `key` ([`Engine::builder`](crate::Engine::builder)).
    pub(crate) fn new(key: ApiKey) -> EngineBuilder {
        EngineBuilder {
            settings: Settings::new(key),
            runtime: None,
        }
    }

    /// The cores' UDP I/O backend, on pinned and hosted cores alike (default
    /// [`DEFAULT_IO_BACKEND`](super::DEFAULT_IO_BACKEND), `Mmsg`; `Auto` is io_uring,
    /// falling back to `recvmmsg`/`sendmmsg` where the kernel refuses io_uring, and says
    /// which at info; `Uring` fails the build there).
    pub fn io_backend(mut self, b: crate::udp::BackendChoice) -> Self {
        self.settings.core.io_backend = b;
        self
    }

    /// UDP GSO sends and GRO receives (default on; a kernel that refuses either falls
    /// back per socket, counted in `Stats::io`).
    pub fn gso(mut self, on: bool) -> Self {
        self.settings.core.gso = on;
        self
    }

    /// Most sockets one core may hold open at once: the current one plus those still
    /// draining after steering rebinds (default 16, 2..=1024). A steering hint beyond it
    /// is refused and counted in `Stats::steering_refused`.
    pub fn max_sockets_per_core(mut self, n: usize) -> Self {
        self.settings.core.max_sockets = n;
        self
    }

    /// Runs the cores as tasks on the Tokio runtime `rt` instead of on pinned threads of
    /// their own ("hosted" cores; [`Cores`] then gives only their number).
    ///
    /// Choose it when the application already runs on Tokio and its CPUs are busy: a
    /// submitting task wakes the core's task on its own worker without a system call,
    /// the worker's one `epoll_wait` covers the answers, and the core completes the
    /// caller's future on that worker, so a decision costs one wake instead of the
    /// four context switches of a pinned core sharing a CPU with the application
    /// (measured in docs/benchmarks.md, "Hosted and pinned cores"). A pinned core is still the faster choice
    /// for throughput when it has a CPU of its own.
    ///
    /// Hosted cores run either I/O backend (`io_backend`): with mmsg the runtime's
    /// reactor watches each socket; with io_uring it watches the ring's fd, and the
    /// ring is set up for calls from any worker thread (`udp::Caller::Runtime`:
    /// `COOP_TASKRUN`, since a task that moves between workers cannot be the single
    /// issuer that `DEFER_TASKRUN` needs). They never spin, and yield to the runtime
    /// after every turn with work (a turn takes at most 256 submissions and 256
    /// datagrams).
    /// `EngineHandle::stats` called from inside a runtime does not wait for a fresh
    /// publication (it would block the worker the core needs): a hosted core publishes
    /// its counters whenever it pauses, its latency histograms within 10 ms of its last
    /// work, and everything every 100 ms while busy.
    /// `EngineHandle::flush_reports` waits for the cores: call it from outside the
    /// runtime (`spawn_blocking`). `build()` does not block on a hosted core (it binds
    /// the sockets and spawns the tasks), so it may run on a runtime thread.
    pub fn runtime(mut self, rt: tokio::runtime::Handle) -> Self {
        self.runtime = Some(rt);
        self
    }

    /// Busy-polls the submission queue for `d` before a core parks (default: off, the
    /// core parks at once). Spinning trades CPU for wake-up latency.
    pub fn spin_before_park(mut self, d: Option<Duration>) -> Self {
        self.settings.core.spin = d;
        self
    }

    /// Request policy (default: `RequestPolicy::default()`).
    pub fn policy(mut self, p: RequestPolicy) -> Self {
        self.settings.policy = p;
        self
    }

    /// The official crate's name for [`EngineBuilder::policy`].
    pub fn request_policy(self, p: RequestPolicy) -> Self {
        self.policy(p)
    }

    /// Cores (default: one core, on the last CPU of the process's affinity set; see
    /// [`Cores`]).
    pub fn cores(mut self, c: Cores) -> Self {
        self.settings.cores = Some(c);
        self
    }

    /// Static endpoints (bypasses DNS).
    pub fn endpoints(mut self, eps: Vec<Endpoint>) -> Self {
        self.settings.endpoints = Some(eps);
        self
    }

    /// DNS discovery options (the default when no static endpoints are given).
    pub fn dns(mut self, d: DnsConfig) -> Self {
        self.settings.dns = Some(d);
        self
    }

    /// SO_RCVBUF / SO_SNDBUF of every core socket (0 = system default).
    pub fn socket_buffers(mut self, recv: usize, send: usize) -> Self {
        self.settings.core.recv_buf = recv;
        self.settings.core.send_buf = send;
        self
    }

    /// Requests in flight per core; beyond it requests fail at once with `Overloaded`.
    pub fn in_flight_per_core(mut self, n: usize) -> Self {
        self.settings.core.in_flight_per_core = n;
        self
    }

    /// Latency-report flush interval.
    pub fn report_interval(mut self, d: Duration) -> Self {
        self.settings.core.report_interval = d;
        self
    }
}
