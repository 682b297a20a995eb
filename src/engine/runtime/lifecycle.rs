//! The running engine: started pinned or hosted (by the builder), drained, shut down.
//!
//! Owns: [`Engine`] (the cores' threads or tasks, the discovery thread), graceful and
//! immediate shutdown, and `Drop`. Must not touch: the cores' turn, submissions.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::builder::EngineBuilder;
use super::config::{BuildError, Source};
use super::consts::{GRACE_MARGIN, HOSTED_STOP_WAIT, STOP_POLL};
use super::handle::EngineHandle;
#[cfg(feature = "dns")]
use super::membership;
use super::shared::Shared;
use super::{core_setup, turn};
use super::{hosted, pinned};
use crate::proto::key::ApiKey;
use crate::proto::outcome::Failure;

/// The running engine. Dropping it shuts it down.
pub struct Engine {
    pub(super) shared: Arc<Shared>,
    pub(super) threads: Vec<JoinHandle<()>>,
    /// Hosted cores' tasks.
    pub(super) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// The hosted cores' runtime runs tasks on worker threads of its own (multi-thread):
    /// shutdown from outside it can wait for them. A current-thread runtime runs them only
    /// while some thread drives it, so waiting there would only wait out the bound.
    pub(super) tasks_run_alone: bool,
    pub(super) local_addrs: Vec<SocketAddr>,
    pub(super) discovery: Option<JoinHandle<()>>,
    pub(super) stopped: bool,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("cores", &self.shared.intake.queues.len())
            .field("hosted", &self.shared.settings.hosted)
            .field("local_addrs", &self.local_addrs)
            .field("stopped", &self.stopped)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Starts building an engine for `key`.
    pub fn builder(key: ApiKey) -> EngineBuilder {
        EngineBuilder::new(key)
    }

    /// A handle for submitting requests (Clone + Send + Sync).
    pub fn handle(&self) -> EngineHandle {
        EngineHandle {
            inner: self.shared.clone(),
        }
    }

    /// Number of cores.
    pub fn cores(&self) -> usize {
        self.shared.intake.queues.len()
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
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("rl-shutdown".into())
            .spawn(move || {
                self.drain();
                self.shutdown_inner();
                let _ = tx.send(());
            });
        if let Err(e) = spawned {
            // no thread: the engine (moved into the closure) was dropped, which shuts it
            // down, and the channel's sender with it: the future completes at once
            tracing::warn!(error = %e, "graceful shutdown thread failed to start; stopped at once");
        }
        async move {
            let _ = rx.await;
        }
    }

    /// Refuses new submissions, then waits until every core has no request in flight and
    /// none queued, for at most the horizon plus 100 ms.
    fn drain(&mut self) {
        let sh = self.shared.clone();
        sh.close_to_submitters();
        let t0 = Instant::now();
        let until = t0 + Duration::from_millis(u64::from(sh.horizon_ms)) + GRACE_MARGIN;
        let handle = EngineHandle { inner: sh.clone() };
        while Instant::now() < until {
            let queued: usize = sh.intake.queues.iter().map(|q| q.len()).sum();
            let in_flight: u64 = handle
                .core_stats()
                .iter()
                .zip(sh.intake.queues.iter())
                .filter(|(_, q)| !q.dead.load(Ordering::Relaxed))
                .map(|(s, _)| s.in_flight)
                .sum();
            if queued == 0 && in_flight == 0 {
                return;
            }
            std::thread::sleep(STOP_POLL);
        }
    }

    /// Completes every in-flight and queued request exactly once (`Failure::Shutdown`
    /// when undecided), stops the cores and discovery, and joins them. Hosted cores stop
    /// on their runtime: called outside a multi-thread runtime, this waits for them (at
    /// most 2 s); called on the runtime, or outside a current-thread one (whose tasks
    /// run only while it is driven), it returns at once and they stop at their next turn
    /// (or fail what they hold when the runtime is dropped first).
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    pub(super) fn shutdown_inner(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let sh = &self.shared;
        sh.close_to_submitters();
        for q in sh.intake.queues.iter() {
            q.stop.store(true, Ordering::SeqCst);
            q.wake();
        }
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
        if self.tasks_run_alone && tokio::runtime::Handle::try_current().is_err() {
            let t0 = Instant::now();
            while !self.tasks.iter().all(|t| t.is_finished()) && t0.elapsed() < HOSTED_STOP_WAIT {
                std::thread::sleep(STOP_POLL);
            }
        }
        self.tasks.clear();
        // anything a core could not take (it never started)
        for q in sh.intake.queues.iter() {
            while let Some(m) = q.pop() {
                core_setup::fail_msg(sh, m, &Failure::Shutdown);
            }
        }
        sh.membership.stop();
        if let Some(h) = self.discovery.take() {
            let _ = h.join();
        }
    }

    /// Starts the cores of a prepared engine: tasks on `runtime` when given (hosted),
    /// else one pinned thread per CPU of `cpus`, each returning once its socket is bound.
    /// On a failure the cores already started are shut down.
    pub(super) fn start(
        shared: Arc<Shared>,
        cpus: &[usize],
        runtime: Option<tokio::runtime::Handle>,
        discovery: Option<JoinHandle<()>>,
    ) -> Result<Engine, BuildError> {
        let n = cpus.len();
        let mut engine = Engine {
            shared: shared.clone(),
            threads: Vec::with_capacity(n),
            tasks: Vec::new(),
            tasks_run_alone: runtime.as_ref().is_some_and(|rt| {
                rt.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread
            }),
            local_addrs: Vec::with_capacity(n),
            discovery,
            stopped: false,
        };
        if let Some(rt) = runtime {
            for i in 0..n {
                match turn::Core::new(i, shared.clone()) {
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
        for (i, cpu) in cpus.iter().copied().enumerate() {
            match pinned::spawn(i, cpu, shared.clone()) {
                Ok((thread, addr)) => {
                    engine.threads.push(thread);
                    engine.local_addrs.push(addr);
                }
                Err(e) => {
                    engine.shutdown_inner();
                    return Err(e);
                }
            }
        }
        tracing::info!(cores = n, "engine started");
        Ok(engine)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}

impl EngineBuilder {
    /// Validates everything (before any I/O), then starts discovery and the cores.
    /// Blocks the calling thread until every core has bound its socket (milliseconds);
    /// from an async runtime call it through `spawn_blocking` or use
    /// [`EngineBuilder::build_async`].
    pub fn build(mut self) -> Result<Engine, BuildError> {
        let runtime = self.runtime.take();
        self.settings.core.hosted = runtime.is_some();
        let cfg = self.settings.validate()?;
        let shared = Shared::new(&cfg)?;
        let discovery = match &cfg.source {
            Source::Static(_) => None,
            #[cfg(feature = "dns")]
            Source::Dns { domain, server } => Some(
                membership::spawn_discovery(shared.membership.clone(), domain.clone(), *server)
                    .map_err(|e| BuildError::Socket(e.kind()))?,
            ),
        };
        Engine::start(shared, &cfg.cpus, runtime, discovery)
    }

    /// [`EngineBuilder::build`] without blocking an async runtime: the blocking part
    /// runs on a helper thread and the returned future completes when it is done
    /// (runtime-agnostic).
    pub fn build_async(self) -> impl std::future::Future<Output = Result<Engine, BuildError>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let _ = tx.send(self.build());
        });
        async move {
            // the helper thread always sends, unless it panicked building
            rx.await.unwrap_or(Err(BuildError::Executor {
                core: 0,
                kind: std::io::ErrorKind::Other,
            }))
        }
    }
}
