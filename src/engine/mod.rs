//! The engine: a glommio thread-per-core driver of the sans-IO request machine.
//!
//! Owns: the builder and its validation, the per-core executors and their lifecycle,
//! the application-facing handle (request, batch, report, stats), and the discovery
//! thread. Must not touch: wire encoding rules, delivery/selection rules (those are
//! `wire` and `machine`); the API key string never appears in any output.
//!
//! ```text
//!  application threads (any runtime)          core i (pinned glommio executor, one task)
//!  ─────────────────────────────────          ─────────────────────────────────────────
//!  RequestBuilder::send() ── encode PDU ──┐
//!   (thread → core affinity)              │  crossbeam bounded queue + eventfd (written
//!  EngineHandle::submit_batch()  ─────────┼─▶ only when the core announced it parks)
//!  EngineHandle::report()  ───────────────┘       │ drain ≤256/iteration
//!        ▲                                        ▼
//!        │  Completion: pooled one-shot   in-flight slab (delivery state + datagram)
//!        │  slot, atomic state + waker    timer wheel (1 ms) ─ one poll timeout
//!        └──────────── complete() ◀────── recvmmsg ─▶ route by unique id ─▶ machine
//!                                          sendmmsg ◀─ transmits / reports
//!  rl-discovery thread: DNS every ≤300 s ─▶ ArcSwap<Snapshot> ◀─ each request clones Arc
//! ```

pub mod completion;
pub mod config;
mod core;
pub mod inflight;
pub mod io;
mod membership;
mod reports;
pub mod stats;
mod steering;
pub mod submit;
pub mod wheel;

use std::cell::Cell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};

pub use self::completion::Completion;
use self::completion::SlotPool;
pub use self::config::{BuildError, Cores, DnsConfig, OptionError};
use self::config::{EngineConfig, Source};
use self::membership::Membership;
pub use self::stats::Stats;
pub use self::submit::{Batch, Request, RequestBuilder};
use self::submit::{CoreQueue, Msg};
use crate::error::{ConfigError, RequestError};
use crate::ids::LatencyTracker;
use crate::key::ApiKey;
use crate::machine::{Endpoint, Plan};
use crate::outcome::{Failure, Outcome};
use crate::policy::RequestPolicy;
use crate::wire::{self, Auth, ReportEntry};

/// Default in-flight limit per core.
pub const DEFAULT_IN_FLIGHT: usize = 65_536;
/// Default socket buffer size (each direction).
pub const DEFAULT_SOCKET_BUFFER: usize = 4 << 20;
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
    closed: AtomicBool,
    active: AtomicUsize,
    queue_full: AtomicU64,
    next_thread: AtomicUsize,
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
}

impl EngineBuilder {
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
        config::check_memlock(cpus.len())?;
        Ok(EngineConfig {
            key: self.key,
            policy: self.policy,
            cpus,
            source,
            recv_buf: self.recv_buf,
            send_buf: self.send_buf,
            in_flight_per_core: self.in_flight,
            report_interval: self.report_interval,
        })
    }

    /// Validates everything (before any I/O), then starts discovery and the cores.
    pub fn build(self) -> Result<Engine, BuildError> {
        let cfg = self.validate()?;
        let auth = Auth::new(&cfg.key);
        let n = cfg.cpus.len();
        let queue_cap = cfg.in_flight_per_core.min(1 << 16);
        let mut queues = Vec::with_capacity(n);
        for _ in 0..n {
            queues.push(CoreQueue::new(queue_cap).map_err(|e| BuildError::Socket(e.kind()))?);
        }
        let pool = SlotPool::new(n * (cfg.in_flight_per_core.min(1 << 20) + queue_cap));
        let (membership, discovery) = match &cfg.source {
            Source::Static(eps) => (Membership::new(eps.clone()), None),
            Source::Dns { domain, server } => {
                let m = Membership::new(Vec::new());
                let h = membership::spawn_discovery(m.clone(), domain.clone(), *server)
                    .map_err(|e| BuildError::Socket(e.kind()))?;
                (m, Some(h))
            }
        };
        let shared = Arc::new(Shared {
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
            closed: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            queue_full: AtomicU64::new(0),
            next_thread: AtomicUsize::new(0),
        });
        let mut engine = Engine {
            shared: shared.clone(),
            executors: Vec::with_capacity(n),
            local_addrs: Vec::with_capacity(n),
            discovery,
            stopped: false,
        };
        for (i, cpu) in cfg.cpus.iter().copied().enumerate() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            let sh = shared.clone();
            let spawned = LocalExecutorBuilder::new(Placement::Fixed(cpu))
                .name(&format!("rl-core-{i}"))
                .io_memory(config::IO_MEMORY)
                .ring_depth(config::RING_DEPTH)
                .spawn(move || async move {
                    match core::Core::new(i, sh) {
                        Ok(c) => {
                            let _ = tx.send(Ok(c.local_addr()));
                            c.run().await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e.kind()));
                        }
                    }
                });
            let handle = match spawned {
                Ok(h) => h,
                Err(e) => {
                    let kind = std::io::Error::from(e).kind();
                    engine.shutdown_inner();
                    return Err(BuildError::Executor { core: i, kind });
                }
            };
            let ready = rx.recv_timeout(Duration::from_secs(10));
            engine.executors.push(handle);
            match ready {
                Ok(Ok(addr)) => engine.local_addrs.push(addr),
                Ok(Err(kind)) => {
                    engine.shutdown_inner();
                    return Err(BuildError::Socket(kind));
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
        Ok(engine)
    }
}

/// The running engine. Dropping it shuts it down.
pub struct Engine {
    shared: Arc<Shared>,
    executors: Vec<glommio::ExecutorJoinHandle<()>>,
    local_addrs: Vec<SocketAddr>,
    discovery: Option<JoinHandle<()>>,
    stopped: bool,
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

    /// Completes every in-flight and queued request exactly once (`Failure::Shutdown`
    /// when undecided), stops the cores and discovery, and joins them.
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    fn shutdown_inner(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let sh = &self.shared;
        sh.closed.store(true, Ordering::SeqCst);
        // wait for submitters that passed the closed check
        let t0 = Instant::now();
        while sh.active.load(Ordering::SeqCst) != 0 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        for q in sh.queues.iter() {
            q.stop.store(true, Ordering::SeqCst);
            q.wake_now();
        }
        for h in self.executors.drain(..) {
            let _ = h.join();
        }
        // anything a core could not take (it never started)
        for q in sh.queues.iter() {
            while let Ok(m) = q.rx.try_recv() {
                if let Msg::Request { slot, .. } = m {
                    sh.pool.complete(slot, Err(Failure::Shutdown));
                }
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
        let sh = &self.inner;
        sh.active.fetch_add(1, Ordering::SeqCst);
        if sh.closed.load(Ordering::SeqCst) {
            sh.active.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    fn leave(&self) {
        self.inner.active.fetch_sub(1, Ordering::SeqCst);
    }

    /// Submits one built request.
    pub fn submit(&self, req: Request) -> Completion {
        if !self.enter() {
            return Completion::ready(Err(Failure::Shutdown));
        }
        let core = self.core_for_thread();
        let c = self.enqueue(core, req);
        self.inner.queues[core].wake_if_parked();
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
        self.inner.queues[core].wake_if_parked();
        self.leave();
        Batch::new(out)
    }

    /// Reports an observed latency for `tracker` (whole ms), coalesced per core and sent
    /// once to every endpoint of the current membership.
    pub fn report(&self, tracker: &LatencyTracker, observed: Duration) -> Result<(), Failure> {
        if !observed.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Failure::Configuration(RequestError::BadLatency.into()));
        }
        let observed_ms = u32::try_from(observed.as_millis())
            .map_err(|_| Failure::Configuration(RequestError::BadLatency.into()))?;
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
            self.inner.queues[core].wake_if_parked();
            Ok(())
        } else {
            self.inner.queue_full.fetch_add(1, Ordering::Relaxed);
            Err(Failure::Overloaded)
        };
        self.leave();
        r
    }

    /// Merged statistics of every core (asks each core for a snapshot).
    pub fn stats(&self) -> Stats {
        self.collect_stats(Msg::Stats)
    }

    /// Statistics of each core, in core order (one snapshot per core).
    // LEAD-MERGE: minimal version over the existing per-core stats request.
    pub fn core_stats(&self) -> Vec<Stats> {
        self.inner
            .queues
            .iter()
            .map(|q| {
                let (tx, rx) = crossbeam_channel::bounded(1);
                if q.push(Msg::Stats(tx)).is_ok() {
                    q.wake_now();
                    if let Ok(s) = rx.recv_timeout(Duration::from_secs(2)) {
                        return s;
                    }
                }
                Stats::new()
            })
            .collect()
    }

    /// Sends every latency report queued so far (by any thread, before this call) at
    /// once instead of at the flush interval, then returns the merged statistics, whose
    /// `report_datagrams` and `report_failures` include those sends.
    pub fn flush_reports(&self) -> Stats {
        self.collect_stats(Msg::FlushReports)
    }

    /// Asks every core for a statistics snapshot with `msg` (in queue order, after what
    /// was queued before) and merges the answers.
    fn collect_stats(&self, msg: fn(crossbeam_channel::Sender<Stats>) -> Msg) -> Stats {
        let mut total = Stats::new();
        for q in self.inner.queues.iter() {
            let (tx, rx) = crossbeam_channel::bounded(1);
            if q.push(msg(tx)).is_ok() {
                q.wake_now();
                if let Ok(s) = rx.recv_timeout(Duration::from_secs(2)) {
                    total.merge(&s);
                }
            }
        }
        total.overloaded += self.inner.queue_full.load(Ordering::Relaxed);
        total
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
