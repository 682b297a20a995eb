//! The diagnosis's shell: a task that reads the admission counters every
//! [`TICK`], runs the probes the [`Diagnosis`] asks for (rl-toolkit's probe, one
//! endpoint at a time, on the blocking pool: never on the data path), logs its notes,
//! and publishes what `/readyz` and `/metrics` read ([`Health`]).
//!
//! Owns: the task, the published snapshot. Must not touch: requests, the engine's
//! decisions.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ratelimitly_engine::{ApiKey, Endpoint, EngineHandle, RequestPolicy};
use ratelimitly_tower::LayerMetrics;
use rl_toolkit::probe::probe;

use super::state::{CAUSES, Cause, Diagnosis, Note, Readiness};

/// How often the counters are read.
pub const TICK: Duration = Duration::from_millis(250);

/// The outcomes that say the service could not be asked (timeouts, communication,
/// discovery; a short circuit of the open breaker counts as its kind).
const FAILED: [&str; 3] = ["timeout", "communication", "discovery"];

/// What `/readyz` and `/metrics` read: the last readiness and causes, published by the
/// monitor task (a short lock, never held across I/O).
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<Snapshot>,
}

#[derive(Debug, Default)]
struct Snapshot {
    /// `None`: no backend (no route is limited): always ready.
    readiness: Option<Readiness>,
    causes: Vec<(Endpoint, &'static str)>,
    probes: u64,
}

impl Health {
    /// A fresh, ready state.
    pub fn new() -> Arc<Self> {
        Arc::new(Health::default())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Snapshot> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Ok` while decisions can be made, else the one-line reason.
    pub fn ready(&self) -> Result<(), String> {
        match &self.lock().readiness {
            Some(Readiness::NotReady(why)) => Err(why.clone()),
            _ => Ok(()),
        }
    }

    fn publish(&self, d: &Diagnosis) {
        let mut s = self.lock();
        s.readiness = Some(d.readiness().clone());
        s.causes = d.causes().map(|(e, c)| (e, c.label())).collect();
        s.probes = d.probes();
    }

    /// Appends `rl_proxy_ready` and, per endpoint probed,
    /// `rl_proxy_endpoint_cause{endpoint,cause}` (1 for the last cause found, 0 for the
    /// others) and `rl_proxy_probes_total`.
    pub fn encode(&self, out: &mut String) {
        let s = self.lock();
        let ready = !matches!(s.readiness, Some(Readiness::NotReady(_)));
        let _ = write!(
            out,
            "# HELP rl_proxy_ready 1 while decisions can be made (GET /readyz answers 200).\n\
             # TYPE rl_proxy_ready gauge\nrl_proxy_ready {}\n",
            u8::from(ready)
        );
        let _ = write!(
            out,
            "# HELP rl_proxy_probes_total Diagnosis probes sent to the endpoints.\n\
             # TYPE rl_proxy_probes_total counter\nrl_proxy_probes_total {}\n",
            s.probes
        );
        if s.causes.is_empty() {
            return;
        }
        out.push_str(
            "# HELP rl_proxy_endpoint_cause What the last probe found of each endpoint (1: this cause).\n\
             # TYPE rl_proxy_endpoint_cause gauge\n",
        );
        for (ep, cause) in &s.causes {
            for c in CAUSES {
                let _ = writeln!(
                    out,
                    "rl_proxy_endpoint_cause{{endpoint=\"{ep}\",cause=\"{c}\"}} {}",
                    u8::from(c == *cause)
                );
            }
        }
    }
}

/// What the monitor watches and probes with.
pub struct Watch {
    /// The counters of every layer (or of the rls service) that asks the engine.
    pub layers: Vec<Arc<LayerMetrics>>,
    /// The engine (its endpoints: the configured ones, or those discovered).
    pub engine: EngineHandle,
    /// The key the probe is sealed with (never logged).
    pub key: ApiKey,
    /// Where the state is published.
    pub health: Arc<Health>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").finish_non_exhaustive()
    }
}

fn log(notes: Vec<Note>) {
    for n in notes {
        match n {
            Note::Warn(s) => tracing::warn!("{s}"),
            Note::Info(s) => tracing::info!("{s}"),
        }
    }
}

/// Probes every endpoint the engine knows, one at a time: at most the policy's horizon
/// (and a second's margin) each.
fn probe_all(key: &ApiKey, endpoints: &[Endpoint]) -> Result<Vec<(Endpoint, Cause)>, String> {
    tracing::debug!(endpoints = endpoints.len(), "probing the endpoints");
    let policy = RequestPolicy::default();
    let mut found = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let cause = match probe(key, &policy, std::slice::from_ref(ep)) {
            Ok(f) => match f.into_iter().next() {
                Some(f) => Cause::Finding(f.finding),
                None => Cause::Finding(rl_toolkit::words::Finding::NoAnswer),
            },
            Err(e) => Cause::ProbeFailed(e.to_string()),
        };
        found.push((*ep, cause));
    }
    Ok(found)
}

type Probe = tokio::task::JoinHandle<Result<Vec<(Endpoint, Cause)>, String>>;

/// Starts one probe of the engine's endpoints on the blocking pool.
fn spawn_probe(watch: &Watch) -> Probe {
    let key = watch.key.clone();
    let endpoints = watch.engine.endpoints();
    tokio::task::spawn_blocking(move || probe_all(&key, &endpoints))
}

/// What a finished probe found.
async fn found(p: Probe) -> Result<Vec<(Endpoint, Cause)>, String> {
    p.await
        .unwrap_or_else(|e| Err(format!("the probe task failed: {e}")))
}

fn counters(layers: &[Arc<LayerMetrics>]) -> (u64, u64) {
    layers.iter().fold((0, 0), |(d, f), m| {
        let failed: u64 = FAILED.iter().map(|o| m.outcome(o)).sum();
        (d + m.outcome("granted") + m.outcome("rejected"), f + failed)
    })
}

/// The probe at start: every endpoint once, logged, published. Bounded: the policy's
/// horizon per endpoint.
pub async fn probe_at_start(watch: &Watch, d: &mut Diagnosis) {
    d.probe_started();
    let f = found(spawn_probe(watch)).await;
    log(d.probed(Instant::now(), f));
    watch.health.publish(d);
}

/// Watches until the task is aborted: the counters every [`TICK`], a probe when the
/// diagnosis asks for one.
pub async fn watch(watch: Watch, mut d: Diagnosis) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probe: Option<Probe> = None;
    loop {
        tick.tick().await;
        if let Some(p) = probe.take_if(|p| p.is_finished()) {
            let f = found(p).await;
            log(d.probed(Instant::now(), f));
        }
        let (decided, failed) = counters(&watch.layers);
        let (start_probe, notes) = d.tick(Instant::now(), decided, failed);
        log(notes);
        if start_probe {
            probe = Some(spawn_probe(&watch));
        }
        watch.health.publish(&d);
    }
}

/// Starts the diagnosis of `w`: the probe at start (awaited, bounded), then the task.
pub async fn start(w: Watch) -> tokio::task::JoinHandle<()> {
    let mut d = Diagnosis::default();
    probe_at_start(&w, &mut d).await;
    tokio::spawn(watch(w, d))
}
