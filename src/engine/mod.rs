//! The engine: one I/O shell per core (a pinned thread or a task hosted on the application's
//! Tokio runtime) around the sans-IO core state.
//!
//! Owns: the builder and its validation, the per-core threads and their lifecycle, the
//! application-facing handle (request, batch, report, stats), published statistics and
//! the discovery thread. Must not touch: wire encoding rules, delivery/selection rules
//! (those are `proto::wire` and `proto::machine`); the API key string never appears in
//! any output.
//!
//! ```text
//!  application threads (any runtime)          core i (pinned std thread)
//!  ─────────────────────────────────          ─────────────────────────────────────────
//!  RequestBuilder::send() ── encode PDU ──┐
//!   (thread → core affinity)              │  crossbeam bounded queue + udp::Waker
//!  EngineHandle::submit_batch()  ─────────┼─▶ (eventfd written only while the core waits)
//!  EngineHandle::report()  ───────────────┘       │ driver: drain ≤256/turn into CoreState
//!        ▲                                        ▼
//!        │  Completion: pooled one-shot   state: in-flight slab, timer wheel, sockets
//!        │  slot, atomic state + waker    (sans-IO) ─▶ transmits ─▶ UdpIo (GSO)
//!        └── woken once per turn ◀─────── UdpIo::run_once (GRO) ─▶ state.handle_datagram
//!  rl-discovery thread: DNS every ≤300 s ─▶ ArcSwap<Snapshot> ◀─ each request clones Arc
//! ```

pub mod completion;
pub mod config;
mod driver;
mod hosted;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod inflight;
mod membership;
mod reports;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod sockets;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod state;
pub mod stats;
pub mod submit;
#[doc(hidden)] // internal: for the simulation, the fuzz target and the benches
pub mod wheel;

use std::cell::Cell;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::sync::Mutex;

pub use self::completion::Completion;
use self::completion::SlotPool;
pub use self::config::{BuildError, Cores, DnsConfig, OptionError};
use self::config::{EngineConfig, Source};
use self::membership::Membership;
pub use self::stats::{LatencyHistogram, Stats};
pub use self::submit::{Batch, Request, RequestBuilder};
use self::submit::{CoreQueue, Msg};
use crate::proto::error::ConfigError;
use crate::proto::ids::LatencyTracker;
use crate::proto::key::ApiKey;
use crate::proto::machine::{Endpoint, Plan};
use crate::proto::outcome::{Failure, Outcome};
use crate::proto::policy::RequestPolicy;
use crate::proto::wire::{self, Auth, ReportEntry};

/// Default in-flight limit per core.
pub const DEFAULT_IN_FLIGHT: usize = 65_536;
/// Default socket buffer size (each direction).
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;
/// The engine cores' default I/O backend: `recvmmsg`/`sendmmsg` with GSO/GRO. Measured
/// side by side on this project's machines (`loadgen --client engine --io mmsg|uring`),
/// it costs less client CPU per decision than the io_uring backend (2.3 vs 3.2–3.6 µs:
/// io_uring's multishot completions wake the core for smaller batches); io_uring is one
/// `.io_backend(BackendChoice::Auto)` or `Uring` away (see tuning/README.md).
pub const DEFAULT_IO_BACKEND: crate::udp::BackendChoice = crate::udp::BackendChoice::Mmsg;
/// Most sockets a core may be configured to hold (`max_sockets_per_core`).
pub const MAX_SOCKETS_PER_CORE: usize = 1024;
/// Default latency-report flush interval.
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_millis(5);

/// State shared by the handle and the cores.
pub(crate) struct Shared {
    pub queues: Box<[CoreQueue]>,
    pub pool: Arc<SlotPool>,
    pub membership: Arc<Membership>,
    pub auth: Auth,
    pub policy: RequestPolicy,
    /// The policy's constants as the cores' request machines take them.
    pub plan: Plan,
    pub horizon_ms: u32,
    pub window_limit_ms: u32,
    pub max_pdu: usize,
    pub recv_buf: usize,
    pub send_buf: usize,
    pub in_flight_per_core: usize,
    pub report_interval: Duration,
    /// Most sockets one core holds open (steering).
    pub max_sockets: usize,
    /// Busy-poll of the queue before a core parks (`None` = park at once).
    pub spin: Option<Duration>,
    /// The cores' I/O backend choice.
    pub io_backend: crate::udp::BackendChoice,
    /// GSO sends / GRO receives on.
    pub gso: bool,
    /// The cores run as tasks on the application's runtime (`EngineBuilder::runtime`).
    pub hosted: bool,
    /// The statistics each core published last (read without asking the core).
    published: Box<[Published]>,
    gate: submit::Gate,
    queue_full: AtomicU64,
    next_thread: AtomicUsize,
}

/// One core's published statistics.
struct Published {
    stats: Mutex<Stats>,
    /// Bumped at every publication.
    generation: AtomicU64,
    /// A reader wants a fresh snapshot.
    wanted: AtomicBool,
}

/// How often a busy core publishes its statistics unasked.
pub(crate) const PUBLISH_EVERY: Duration = Duration::from_millis(100);

impl Shared {
    /// Refuses new submissions (they fail with `Shutdown`), then waits (at most 5 s) for
    /// the submitters that passed the closed check before it.
    fn close_to_submitters(&self) {
        self.gate.close(Duration::from_secs(5));
    }

    /// True when a reader asked core `i` for a fresh snapshot (the core checks once per
    /// turn; it also publishes unasked every [`PUBLISH_EVERY`] by its own clock).
    pub(crate) fn stats_wanted(&self, i: usize) -> bool {
        self.published[i].wanted.load(Ordering::Relaxed)
    }

    /// Publishes core `i`'s statistics now; false when a reader held the lock (the core
    /// tries again next turn, never waits).
    pub(crate) fn publish_stats(
        &self,
        i: usize,
        state: &state::CoreState,
        io: Option<&crate::udp::IoStats>,
    ) -> bool {
        self.publish(i, state, io, true)
    }

    /// [`publish_stats`](Self::publish_stats), the histograms only when `histograms`.
    pub(crate) fn publish(
        &self,
        i: usize,
        state: &state::CoreState,
        io: Option<&crate::udp::IoStats>,
        histograms: bool,
    ) -> bool {
        let p = &self.published[i];
        if let Ok(mut s) = p.stats.try_lock() {
            if histograms {
                s.copy_from(state.stats());
            } else {
                s.copy_counters_from(state.stats());
            }
            match (&mut s.io, io) {
                (Some(a), Some(b)) => a.clone_from(b),
                (a, b) => *a = b.cloned(),
            }
            s.in_flight = state.in_flight() as u64;
            s.sockets = state.sockets() as u64;
            drop(s);
            p.wanted.store(false, Ordering::Relaxed);
            p.generation.fetch_add(1, Ordering::Release);
            return true;
        }
        false
    }
}

/// Builds an [`Engine`]. See docs/ARCHITECTURE.md.
pub struct EngineBuilder {
    key: ApiKey,
    policy: RequestPolicy,
    cores: Option<Cores>,
    endpoints: Option<Vec<Endpoint>>,
    dns: Option<DnsConfig>,
    recv_buf: usize,
    send_buf: usize,
    in_flight: usize,
    report_interval: Duration,
    max_sockets: usize,
    spin: Option<Duration>,
    io_backend: crate::udp::BackendChoice,
    gso: bool,
    runtime: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for EngineBuilder {
    /// The settings, never the key's secret (only its id).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineBuilder")
            .field("key_id", &self.key.key_id())
            .field("policy", &self.policy)
            .field("cores", &self.cores)
            .field("endpoints", &self.endpoints)
            .field("dns", &self.dns)
            .field("in_flight_per_core", &self.in_flight)
            .field("hosted", &self.runtime.is_some())
            .finish_non_exhaustive()
    }
}

impl EngineBuilder {
    /// The cores' UDP I/O backend (default [`DEFAULT_IO_BACKEND`], `Mmsg`, the faster one
    /// measured here; `Auto` is io_uring, falling back to `recvmmsg`/`sendmmsg` where the
    /// kernel refuses io_uring).
    pub fn io_backend(mut self, b: crate::udp::BackendChoice) -> Self {
        self.io_backend = b;
        self
    }

    /// UDP GSO sends and GRO receives (default on; a kernel that refuses either falls
    /// back per socket, counted in `Stats::io`).
    pub fn gso(mut self, on: bool) -> Self {
        self.gso = on;
        self
    }

    /// Most sockets one core may hold open at once: the current one plus those still
    /// draining after steering rebinds (default 16, 2..=1024). A steering hint beyond it
    /// is refused and counted in `Stats::steering_refused`.
    pub fn max_sockets_per_core(mut self, n: usize) -> Self {
        self.max_sockets = n;
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
    /// Hosted cores use the mmsg I/O backend (their readiness comes from the runtime's
    /// reactor; `io_backend` is ignored), never spin, and yield to the runtime after
    /// every turn with work (a turn takes at most 256 submissions and 256 datagrams).
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
        self.spin = d;
        self
    }

    /// Request policy (default: `RequestPolicy::default()`).
    pub fn policy(mut self, p: RequestPolicy) -> Self {
        self.policy = p;
        self
    }

    /// The official crate's name for [`EngineBuilder::policy`].
    pub fn request_policy(self, p: RequestPolicy) -> Self {
        self.policy(p)
    }

    /// Cores (default: one core, on the last CPU of the process's affinity set; see
    /// [`Cores`]).
    pub fn cores(mut self, c: Cores) -> Self {
        self.cores = Some(c);
        self
    }

    /// Static endpoints (bypasses DNS).
    pub fn endpoints(mut self, eps: Vec<Endpoint>) -> Self {
        self.endpoints = Some(eps);
        self
    }

    /// DNS discovery options (the default when no static endpoints are given).
    pub fn dns(mut self, d: DnsConfig) -> Self {
        self.dns = Some(d);
        self
    }

    /// SO_RCVBUF / SO_SNDBUF of every core socket (0 = system default).
    pub fn socket_buffers(mut self, recv: usize, send: usize) -> Self {
        self.recv_buf = recv;
        self.send_buf = send;
        self
    }

    /// Requests in flight per core; beyond it requests fail at once with `Overloaded`.
    pub fn in_flight_per_core(mut self, n: usize) -> Self {
        self.in_flight = n;
        self
    }

    /// Latency-report flush interval.
    pub fn report_interval(mut self, d: Duration) -> Self {
        self.report_interval = d;
        self
    }

    fn validate(self) -> Result<EngineConfig, BuildError> {
        self.policy
            .check_key(&self.key)
            .map_err(|e| BuildError::Config(ConfigError::Policy(e)))?;
        let cpus = config::resolve_cores(self.cores.as_ref())?;
        let source = match (self.endpoints, self.dns) {
            (Some(eps), _) => {
                config::check_endpoints(&eps)?;
                Source::Static(eps)
            }
            (None, dns) => {
                let dns = dns.unwrap_or_default();
                let domain = dns.domain.unwrap_or_else(|| self.key.default_domain());
                Source::Dns {
                    domain,
                    server: dns.server,
                }
            }
        };
        if self.in_flight == 0 || self.in_flight > inflight::MAX_IN_FLIGHT {
            return Err(OptionError::BadInFlight(self.in_flight).into());
        }
        if self.report_interval < Duration::from_millis(1)
            || self.report_interval > Duration::from_secs(10)
        {
            return Err(OptionError::BadReportInterval.into());
        }
        if !(2..=MAX_SOCKETS_PER_CORE).contains(&self.max_sockets) {
            return Err(OptionError::BadMaxSockets(self.max_sockets).into());
        }
        Ok(EngineConfig {
            key: self.key,
            policy: self.policy,
            cpus,
            source,
            recv_buf: self.recv_buf,
            send_buf: self.send_buf,
            in_flight_per_core: self.in_flight,
            report_interval: self.report_interval,
            max_sockets: self.max_sockets,
            spin: self.spin,
            io_backend: self.io_backend,
            gso: self.gso,
            hosted: false,
        })
    }

    /// Validates everything and allocates every per-core structure, starting no
    /// thread and opening no socket: the handle and the engine's shared state.
    fn prepare(cfg: &EngineConfig) -> Result<Arc<Shared>, BuildError> {
        let auth = Auth::new(&cfg.key);
        let n = cfg.cpus.len();
        let queue_cap = cfg.in_flight_per_core.min(1 << 16);
        let mut queues = Vec::new();
        queues
            .try_reserve_exact(n)
            .map_err(|_| BuildError::OutOfMemory)?;
        for _ in 0..n {
            queues.push(CoreQueue::new(queue_cap).map_err(|e| BuildError::Socket(e.kind()))?);
        }
        let slots = n
            .checked_mul(cfg.in_flight_per_core + queue_cap)
            .ok_or(BuildError::OutOfMemory)?;
        let pool = SlotPool::new(slots).ok_or(BuildError::OutOfMemory)?;
        let membership = match &cfg.source {
            Source::Static(eps) => Membership::new(eps.clone()),
            Source::Dns { .. } => Membership::new(Vec::new()),
        };
        let published = (0..n)
            .map(|_| Published {
                stats: Mutex::new(Stats::new()),
                generation: AtomicU64::new(0),
                wanted: AtomicBool::new(false),
            })
            .collect();
        Ok(Arc::new(Shared {
            queues: queues.into_boxed_slice(),
            pool,
            membership,
            max_pdu: auth.max_pdu_len(),
            auth,
            horizon_ms: cfg.policy.horizon_ms(),
            window_limit_ms: cfg.key.quotas().rate_window_size_ms_max,
            plan: Plan::new(&cfg.policy),
            policy: cfg.policy.clone(),
            recv_buf: cfg.recv_buf,
            send_buf: cfg.send_buf,
            in_flight_per_core: cfg.in_flight_per_core,
            report_interval: cfg.report_interval,
            max_sockets: cfg.max_sockets,
            spin: cfg.spin,
            io_backend: cfg.io_backend,
            gso: cfg.gso,
            hosted: cfg.hosted,
            published,
            gate: submit::Gate::new(),
            queue_full: AtomicU64::new(0),
            next_thread: AtomicUsize::new(0),
        }))
    }

    /// For deterministic simulation (tests): validates like [`EngineBuilder::build`] and
    /// returns the handle with one sans-IO [`state::CoreState`] per configured core,
    /// starting no thread, opening no socket and running no discovery. The caller
    /// drives each state (see `tests/simulation.rs`); socket ids are the caller's, the
    /// first being `SockId(0)` on `port`.
    #[doc(hidden)]
    pub fn build_states(
        self,
        now: Instant,
        port: u16,
        entropy: impl Fn(usize) -> state::Entropy,
    ) -> Result<(EngineHandle, Vec<state::CoreState>), BuildError> {
        let cfg = self.validate()?;
        let shared = Self::prepare(&cfg)?;
        let mut states = Vec::with_capacity(cfg.cpus.len());
        for i in 0..cfg.cpus.len() {
            let st =
                state::CoreState::new(i, shared.clone(), now, sockets::SockId(0), port, entropy(i))
                    .map_err(|_| BuildError::NoRandomness)?;
            states.push(st);
        }
        Ok((EngineHandle { inner: shared }, states))
    }

    /// Validates everything (before any I/O), then starts discovery and the cores.
    /// Blocks the calling thread until every core has bound its socket (milliseconds);
    /// from an async runtime call it through `spawn_blocking` or use
    /// [`EngineBuilder::build_async`].
    pub fn build(mut self) -> Result<Engine, BuildError> {
        let runtime = self.runtime.take();
        let mut cfg = self.validate()?;
        if runtime.is_some() {
            cfg.hosted = true;
            cfg.io_backend = crate::udp::BackendChoice::Mmsg;
            cfg.spin = None;
        }
        let shared = Self::prepare(&cfg)?;
        let n = cfg.cpus.len();
        let discovery = match &cfg.source {
            Source::Static(_) => None,
            Source::Dns { domain, server } => Some(
                membership::spawn_discovery(shared.membership.clone(), domain.clone(), *server)
                    .map_err(|e| BuildError::Socket(e.kind()))?,
            ),
        };
        let mut engine = Engine {
            shared: shared.clone(),
            threads: Vec::with_capacity(n),
            tasks: Vec::new(),
            local_addrs: Vec::with_capacity(n),
            discovery,
            stopped: false,
        };
        if let Some(rt) = runtime {
            for i in 0..n {
                match driver::Driver::new(i, shared.clone()) {
                    Ok(d) => {
                        engine.local_addrs.push(d.local_addr());
                        engine.tasks.push(rt.spawn(hosted::run(d)));
                    }
                    Err(e) => {
                        engine.shutdown_inner();
                        return Err(e);
                    }
                }
            }
            tracing::info!(cores = n, "engine started (hosted cores)");
            return Ok(engine);
        }
        for (i, cpu) in cfg.cpus.iter().copied().enumerate() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let sh = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("rl-core-{i}"))
                .spawn(move || {
                    let _ = core_affinity::set_for_current(core_affinity::CoreId { id: cpu });
                    match driver::Driver::new(i, sh) {
                        Ok(d) => {
                            let _ = tx.send(Ok(d.local_addr()));
                            d.run();
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            let handle = match spawned {
                Ok(h) => h,
                Err(e) => {
                    engine.shutdown_inner();
                    return Err(BuildError::Executor {
                        core: i,
                        kind: e.kind(),
                    });
                }
            };
            let ready = rx.recv_timeout(Duration::from_secs(10));
            engine.threads.push(handle);
            match ready {
                Ok(Ok(addr)) => engine.local_addrs.push(addr),
                Ok(Err(e)) => {
                    engine.shutdown_inner();
                    return Err(e);
                }
                Err(_) => {
                    engine.shutdown_inner();
                    return Err(BuildError::Executor {
                        core: i,
                        kind: std::io::ErrorKind::TimedOut,
                    });
                }
            }
        }
        tracing::info!(cores = n, "engine started");
        Ok(engine)
    }

    /// [`EngineBuilder::build`] without blocking an async runtime: the blocking part
    /// runs on a helper thread and the returned future completes when it is done
    /// (runtime-agnostic).
    pub fn build_async(self) -> impl std::future::Future<Output = Result<Engine, BuildError>> {
        let (tx, rx) = futures_oneshot();
        std::thread::spawn(move || tx.send(self.build()));
        rx
    }
}

/// A one-shot channel whose receiver is a future (no runtime needed).
fn futures_oneshot<T: Send + 'static>() -> (OneshotTx<T>, OneshotRx<T>) {
    let inner = Arc::new(OneshotInner {
        value: Mutex::new(None),
        waker: atomic_waker::AtomicWaker::new(),
    });
    (OneshotTx(inner.clone()), OneshotRx(inner))
}

struct OneshotInner<T> {
    value: Mutex<Option<T>>,
    waker: atomic_waker::AtomicWaker,
}

struct OneshotTx<T>(Arc<OneshotInner<T>>);
struct OneshotRx<T>(Arc<OneshotInner<T>>);

impl<T> OneshotTx<T> {
    fn send(self, v: T) {
        if let Ok(mut g) = self.0.value.lock() {
            *g = Some(v);
        }
        self.0.waker.wake();
    }
}

impl<T> std::future::Future for OneshotRx<T> {
    type Output = T;
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<T> {
        self.0.waker.register(cx.waker());
        match self.0.value.lock().ok().and_then(|mut g| g.take()) {
            Some(v) => std::task::Poll::Ready(v),
            None => std::task::Poll::Pending,
        }
    }
}

/// The running engine. Dropping it shuts it down.
pub struct Engine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// Hosted cores' tasks.
    tasks: Vec<tokio::task::JoinHandle<()>>,
    local_addrs: Vec<SocketAddr>,
    discovery: Option<JoinHandle<()>>,
    stopped: bool,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("cores", &self.shared.queues.len())
            .field("hosted", &self.shared.hosted)
            .field("local_addrs", &self.local_addrs)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts building an engine for `key`.
    pub fn builder(key: ApiKey) -> EngineBuilder {
        EngineBuilder {
            key,
            policy: RequestPolicy::default(),
            cores: None,
            endpoints: None,
            dns: None,
            recv_buf: DEFAULT_SOCKET_BUFFER,
            send_buf: DEFAULT_SOCKET_BUFFER,
            in_flight: DEFAULT_IN_FLIGHT,
            report_interval: DEFAULT_REPORT_INTERVAL,
            max_sockets: sockets::DEFAULT_MAX_SOCKETS,
            spin: None,
            io_backend: DEFAULT_IO_BACKEND,
            gso: true,
            runtime: None,
        }
    }

    /// A handle for submitting requests (Clone + Send + Sync).
    pub fn handle(&self) -> EngineHandle {
        EngineHandle {
            inner: self.shared.clone(),
        }
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.shared.queues.len()
    }

    /// Local address of each core's first socket (port 0 = ephemeral at start).
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.local_addrs
    }

    /// Shuts down gracefully: from the call on, new submissions fail with
    /// `Failure::Shutdown`; every request already submitted finishes as it would have
    /// (decided, or failed at the latest at its horizon H = the policy's dedup window);
    /// then the engine stops as [`shutdown`](Self::shutdown) does. The returned future
    /// completes once it has stopped; it needs no runtime (a helper thread waits), and
    /// the engine stops even if the future is dropped. At most H plus 100 ms pass before
    /// whatever is still undecided is completed with `Failure::Shutdown`.
    pub fn shutdown_graceful(mut self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (tx, rx) = futures_oneshot();
        let spawned = std::thread::Builder::new()
            .name("rl-shutdown".into())
            .spawn(move || {
                self.drain();
                self.shutdown_inner();
                tx.send(());
            });
        if let Err(e) = spawned {
            // no thread: the engine (moved into the closure) was dropped, which shuts it down
            tracing::warn!(error = %e, "graceful shutdown thread failed to start; stopped at once");
        }
        rx
    }

    /// Refuses new submissions, then waits until every core has no request in flight and
    /// none queued, for at most the horizon plus 100 ms.
    fn drain(&mut self) {
        let sh = self.shared.clone();
        sh.close_to_submitters();
        let t0 = Instant::now();
        let until =
            t0 + Duration::from_millis(u64::from(sh.horizon_ms)) + Duration::from_millis(100);
        let handle = EngineHandle { inner: sh.clone() };
        while Instant::now() < until {
            let queued: usize = sh.queues.iter().map(|q| q.rx.len()).sum();
            let in_flight: u64 = handle
                .core_stats()
                .iter()
                .zip(sh.queues.iter())
                .filter(|(_, q)| !q.dead.load(Ordering::Relaxed))
                .map(|(s, _)| s.in_flight)
                .sum();
            if queued == 0 && in_flight == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Completes every in-flight and queued request exactly once (`Failure::Shutdown`
    /// when undecided), stops the cores and discovery, and joins them. Hosted cores stop
    /// on their runtime: called outside it, this waits for them (at most 2 s); called
    /// on it, it returns at once and they stop at their next turn.
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    fn shutdown_inner(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let sh = &self.shared;
        sh.close_to_submitters();
        for q in sh.queues.iter() {
            q.stop.store(true, Ordering::SeqCst);
            q.wake();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        if tokio::runtime::Handle::try_current().is_err() {
            let t0 = Instant::now();
            while !self.tasks.iter().all(|t| t.is_finished())
                && t0.elapsed() < Duration::from_secs(2)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        self.tasks.clear();
        // anything a core could not take (it never started)
        for q in sh.queues.iter() {
            while let Ok(m) = q.rx.try_recv() {
                driver::fail_msg(sh, m, &Failure::Shutdown);
            }
        }
        sh.membership.stop();
        if let Some(h) = self.discovery.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}

/// Submits requests and reports to the engine from any thread or runtime.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) inner: Arc<Shared>,
}

impl fmt::Debug for EngineHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineHandle")
            .field("cores", &self.inner.queues.len())
            .finish_non_exhaustive()
    }
}

thread_local! {
    static CORE_HINT: Cell<usize> = const { Cell::new(usize::MAX) };
}

impl EngineHandle {
    /// Starts a resource request.
    pub fn request(&self) -> RequestBuilder<'_> {
        RequestBuilder::new(self)
    }

    fn core_for_thread(&self) -> usize {
        let n = self.inner.queues.len();
        CORE_HINT.with(|c| {
            let mut v = c.get();
            if v == usize::MAX {
                v = self.inner.next_thread.fetch_add(1, Ordering::Relaxed);
                c.set(v);
            }
            v % n
        })
    }

    /// Queues one request on `core` without waking it.
    fn enqueue(&self, core: usize, req: Request) -> Completion {
        let pdu = match Request::local_outcome(req.kind) {
            Ok(p) => p,
            Err(out) => return Completion::ready(out),
        };
        let sh = &self.inner;
        if sh.queues[core].dead.load(Ordering::Relaxed) {
            return Completion::ready(Err(Failure::CoreFailed { core }));
        }
        let Some(slot) = sh.pool.acquire() else {
            sh.queue_full.fetch_add(1, Ordering::Relaxed);
            return Completion::ready(Err(Failure::Overloaded));
        };
        let msg = Msg::Request {
            pdu,
            slot,
            submitted: Instant::now(),
        };
        if sh.queues[core].push(msg).is_err() {
            sh.queue_full.fetch_add(1, Ordering::Relaxed);
            sh.pool.complete(slot, Err(Failure::Overloaded));
        }
        Completion::new(sh.pool.clone(), slot)
    }

    fn enter(&self) -> bool {
        self.inner.gate.enter()
    }

    fn leave(&self) {
        self.inner.gate.leave();
    }

    /// Submits one built request.
    pub fn submit(&self, req: Request) -> Completion {
        if !self.enter() {
            return Completion::ready(Err(Failure::Shutdown));
        }
        let core = self.core_for_thread();
        let c = self.enqueue(core, req);
        self.inner.queues[core].wake();
        self.leave();
        c
    }

    /// Submits several requests at once (one wake per core); outcomes in order.
    pub fn submit_batch(&self, reqs: Vec<Request>) -> Batch {
        if !self.enter() {
            return Batch::new(
                reqs.into_iter()
                    .map(|_| Completion::ready(Err(Failure::Shutdown)))
                    .collect(),
            );
        }
        let core = self.core_for_thread();
        let out = reqs.into_iter().map(|r| self.enqueue(core, r)).collect();
        self.inner.queues[core].wake();
        self.leave();
        Batch::new(out)
    }

    /// Reports an observed latency for `tracker` (whole ms), coalesced per core and sent
    /// once to every endpoint of the current membership.
    pub fn report(&self, tracker: &LatencyTracker, observed: Duration) -> Result<(), Failure> {
        let observed_ms =
            crate::proto::ids::latency_ms(observed, crate::proto::ids::LatencyField::Observed)
                .map_err(|e| Failure::Configuration(e.into()))?;
        if !self.enter() {
            return Err(Failure::Shutdown);
        }
        let core = self.core_for_thread();
        let entry = ReportEntry {
            tracker_id: tracker.id(),
            ttl_ms: tracker.ttl_ms(),
            max_samples: tracker.max_samples(),
            min_samples: tracker.min_samples(),
            observed_ms,
        };
        let r = if self.inner.queues[core].push(Msg::Report(entry)).is_ok() {
            self.inner.queues[core].wake();
            Ok(())
        } else {
            self.inner.queue_full.fetch_add(1, Ordering::Relaxed);
            Err(Failure::Overloaded)
        };
        self.leave();
        r
    }

    /// Merged statistics of every core. Never goes through a core's queue: each core
    /// publishes its statistics; this asks for a fresh publication and waits up to
    /// 100 ms for it (a dead or stuck core's last publication is used).
    pub fn stats(&self) -> Stats {
        let mut total = Stats::new();
        for s in self.core_stats() {
            total.merge(&s);
        }
        total.overloaded += self.inner.queue_full.load(Ordering::Relaxed);
        self.inner
            .pool
            .wake_us
            .add_to(&mut total.completion_wake_us);
        total
    }

    /// The statistics of each core, as in [`EngineHandle::stats`] (index = core).
    pub fn core_stats(&self) -> Vec<Stats> {
        let sh = &self.inner;
        let before: Vec<u64> = sh
            .published
            .iter()
            .map(|p| p.generation.load(Ordering::Acquire))
            .collect();
        for (p, q) in sh.published.iter().zip(sh.queues.iter()) {
            p.wanted.store(true, Ordering::Relaxed);
            q.wake();
        }
        // a hosted core cannot publish while this blocks the runtime it needs
        let wait = if sh.hosted && tokio::runtime::Handle::try_current().is_ok() {
            Duration::ZERO
        } else {
            Duration::from_millis(100)
        };
        let deadline = Instant::now() + wait;
        for (i, p) in sh.published.iter().enumerate() {
            let q = &sh.queues[i];
            while p.generation.load(Ordering::Acquire) == before[i]
                && !q.dead.load(Ordering::Relaxed)
                && !q.stop.load(Ordering::Relaxed)
                && Instant::now() < deadline
            {
                q.wake();
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        sh.published
            .iter()
            .zip(sh.queues.iter())
            .map(|(p, q)| {
                let mut s = match p.stats.lock() {
                    Ok(g) => g.clone(),
                    Err(e) => e.into_inner().clone(),
                };
                s.dead_cores = u64::from(q.dead.load(Ordering::Relaxed));
                s
            })
            .collect()
    }

    /// Sends every latency report queued so far (by any thread, before this call) at
    /// once instead of at the flush interval, then returns the merged statistics, whose
    /// `report_datagrams` and `report_failures` include those sends.
    pub fn flush_reports(&self) -> Stats {
        let mut total = Stats::new();
        for q in self.inner.queues.iter() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            if q.push(Msg::FlushReports(tx)).is_ok() {
                q.wake();
                if let Ok(s) = rx.recv_timeout(Duration::from_secs(2)) {
                    total.merge(&s);
                }
            }
        }
        total.overloaded += self.inner.queue_full.load(Ordering::Relaxed);
        total
    }

    /// Test-only fault hook: makes core `core` panic when it takes the message, as a
    /// bug inside it would. Its requests then fail with `Failure::CoreFailed`.
    #[doc(hidden)]
    pub fn inject_core_fault(&self, core: usize) {
        if let Some(q) = self.inner.queues.get(core) {
            let _ = q.push(Msg::Fault);
            q.wake();
        }
    }

    /// Replaces the endpoint set (as a DNS refresh would). For simulation and tests
    /// with static endpoints.
    #[doc(hidden)]
    pub fn set_endpoints(&self, eps: Vec<Endpoint>) {
        self.inner.membership.store(eps);
    }

    /// Successful DNS refreshes so far (0 with static endpoints).
    pub fn discovery_refreshes(&self) -> u64 {
        self.inner.membership.refreshes.load(Ordering::Relaxed)
    }

    /// DNS refreshes that failed or found no server so far (0 with static endpoints).
    pub fn discovery_refresh_failures(&self) -> u64 {
        self.inner
            .membership
            .refresh_failures
            .load(Ordering::Relaxed)
    }

    /// The current endpoint set.
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.inner.membership.snapshot().to_vec()
    }

    /// Memory per in-flight request (bytes of one slab entry).
    pub fn entry_size() -> usize {
        inflight::entry_size()
    }

    /// Bytes one core preallocates at build for an in-flight limit of `in_flight`:
    /// slab cells (preallocated up to 65,536; beyond, the slab grows on demand up to the
    /// limit), completion slots (one per in-flight request and one per queue place),
    /// the submission queue, and the timer wheel. Excludes fixed per-core buffers
    /// (receive/send batches, about 200 KiB).
    pub fn memory_per_core(in_flight: usize) -> usize {
        let prealloc = in_flight.min(1 << 16);
        let queue = in_flight.min(1 << 16);
        prealloc * inflight::entry_size()
            + (in_flight + queue) * SlotPool::slot_size()
            + queue * (std::mem::size_of::<Msg>() + 8)
            + wheel::TimerWheel::<u64>::footprint(8192, prealloc)
    }

    /// Memory per in-flight request counting every structure sized by the in-flight
    /// limit: its slab entry, its completion slot (the pool holds one per in-flight
    /// request plus one per queue place) and its queue place (a submission message).
    pub fn bytes_per_in_flight() -> usize {
        inflight::entry_size() + 2 * SlotPool::slot_size() + std::mem::size_of::<Msg>()
    }
}

const _: () = {
    // The report batch fits one datagram in every mode.
    assert!(wire::MAX_REPORT_ENTRIES <= 34);
};

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync + Clone>() {}
    is::<EngineHandle>();
    let _: fn(Outcome) = |_| {};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_figures_at_defaults() {
        let per = EngineHandle::bytes_per_in_flight();
        let core = EngineHandle::memory_per_core(DEFAULT_IN_FLIGHT);
        println!(
            "bytes per in-flight request: {per} (slab cell {}, 2 completion slots of {}, \
             queue message {}); memory per core at the default limit of {DEFAULT_IN_FLIGHT}: \
             {core} bytes ({:.1} MiB)",
            inflight::entry_size(),
            SlotPool::slot_size(),
            std::mem::size_of::<Msg>(),
            core as f64 / (1 << 20) as f64
        );
        assert!(per <= 1024, "{per}");
        assert!(core <= 64 << 20, "{core}");
    }
}
