//! One measured phase of one client: builds the client ([`clients::build`]), runs it on
//! its own threads, and measures the window around it — client and responder CPU
//! snapshots, responder datagram counts, the live progress line.
//!
//! Owns the measurement window and CPU accounting. Must not know how a client sends
//! (that is the [`clients::Target`]'s) or format results (`output.rs`).

use std::collections::HashSet;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cli::ClientKind;
use crate::clients::{self, PhaseSpec, RunContext};
use crate::cpu;
use crate::extra::ExtraSlot;
use crate::output::PhaseResult;
use crate::stats::Phase;

/// The live progress line on stderr, once per second, until `stop`.
struct Progress {
    stop: Arc<AtomicBool>,
    slot: Arc<OnceLock<Arc<Phase>>>,
    thread: Option<JoinHandle<()>>,
}

impl Progress {
    fn start(kind: ClientKind, quiet: bool) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let slot: Arc<OnceLock<Arc<Phase>>> = Arc::new(OnceLock::new());
        let thread = (!quiet).then(|| {
            let (stop, slot) = (Arc::clone(&stop), Arc::clone(&slot));
            std::thread::spawn(move || progress_loop(kind, &slot, &stop))
        });
        Progress { stop, slot, thread }
    }

    fn finish(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Sleeps ~1 s in small steps so the phase end is not delayed; false once stopped.
fn tick(stop: &AtomicBool) -> bool {
    for _ in 0..20 {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    !stop.load(Ordering::Relaxed)
}

fn progress_loop(kind: ClientKind, slot: &OnceLock<Arc<Phase>>, stop: &AtomicBool) {
    let tty = std::io::stderr().is_terminal();
    let mut last = (Instant::now(), 0u64);
    let mut printed = false;
    while tick(stop) {
        let Some(p) = slot.get() else { continue };
        let now = Instant::now();
        let done = p.completed.load(Ordering::Relaxed);
        let sub = p.submitted.load(Ordering::Relaxed);
        let dec = p.decided.load(Ordering::Relaxed);
        let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
        last = (now, done);
        let t = now.saturating_duration_since(p.start).as_secs_f64();
        let stage = if now < p.window_start {
            "warm-up"
        } else {
            "measure"
        };
        let line = format!(
            "[{}] {t:5.1}s {stage}  {rate:>10.0} ops/s  in flight {:>6}  decided {dec}  other {}",
            kind.name(),
            sub.saturating_sub(done),
            done - dec
        );
        if tty {
            eprint!("\r{line}\x1b[K");
        } else {
            eprintln!("{line}");
        }
        printed = true;
    }
    if tty && printed {
        eprintln!();
    }
}

fn spec_of(ctx: &RunContext<'_>) -> PhaseSpec {
    let args = ctx.args;
    PhaseSpec {
        warmup: Duration::from_secs_f64(args.warmup),
        duration: Duration::from_secs_f64(args.duration),
        drain: ctx.horizon + Duration::from_secs(2),
        load: ctx.load(),
        cores: ctx.client_cores.clone(),
        app_cores: ctx.app_cores.clone(),
        gate: Arc::new(AtomicBool::new(false)),
        extra: ExtraSlot::default(),
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Runs client `kind` for one phase and measures it.
pub fn run_phase(ctx: &RunContext<'_>, kind: ClientKind) -> Result<PhaseResult, String> {
    run_phase_with(ctx, kind, |_| {})
}

/// [`run_phase`], handing the phase to `on_start` once the client's load has started
/// (`--chaos` times its schedule from it).
pub fn run_phase_with(
    ctx: &RunContext<'_>,
    kind: ClientKind,
    on_start: impl FnOnce(&Arc<Phase>),
) -> Result<PhaseResult, String> {
    let progress = Progress::start(kind, ctx.args.quiet);
    // Threads that exist now (main, progress, responders) are not the client's.
    let infra: HashSet<u32> = cpu::thread_ids();
    let spec = spec_of(ctx);
    let target = match clients::build(kind, ctx) {
        Ok(t) => t,
        Err(e) => {
            progress.finish();
            return Err(e);
        }
    };
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let client_spec = spec.clone();
    std::thread::spawn(move || {
        target.run(client_spec, ready_tx);
        let _ = done_tx.send(());
    });
    let phase = match ready_rx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(p)) => p,
        failed => {
            spec.gate.store(true, Ordering::Release);
            progress.finish();
            return Err(match failed {
                Ok(Err(e)) => e,
                _ => "client did not start within 30 s".into(),
            });
        }
    };
    let _ = progress.slot.set(Arc::clone(&phase));
    on_start(&phase);
    let result = measure(ctx, kind, &spec, &phase, &infra, &done_rx);
    progress.finish();
    Ok(result)
}

/// Takes the snapshots around the window, opens the gate, waits for the drain.
fn measure(
    ctx: &RunContext<'_>,
    kind: ClientKind,
    spec: &PhaseSpec,
    phase: &Phase,
    infra: &HashSet<u32>,
    done: &mpsc::Receiver<()>,
) -> PhaseResult {
    sleep_until(phase.window_start);
    let cpu0 = cpu::cpu_snapshot(infra);
    let srv0 = cpu::cpu_of(&ctx.servers.server_threads);
    let dg0 = ctx.servers.received_datagrams();
    let steal0 = cpu::host_steal_ms();
    sleep_until(phase.window_end);
    let steal1 = cpu::host_steal_ms();
    let cpu1 = cpu::cpu_snapshot(infra);
    let srv1 = cpu::cpu_of(&ctx.servers.server_threads);
    spec.gate.store(true, Ordering::Release);
    let dg1 = ctx.servers.received_datagrams();
    if done
        .recv_timeout(spec.drain + Duration::from_secs(5))
        .is_err()
    {
        eprintln!("loadgen: {} client did not finish draining", kind.name());
    }
    let used = cpu::cpu_delta(&cpu0, &cpu1);
    let mut extra = spec.extra.lock().unwrap_or_else(|p| p.into_inner()).clone();
    extra.responder_io = ctx.servers.responder_io();
    PhaseResult {
        client: kind,
        rec: phase.merged(),
        window_s: phase
            .window_end
            .duration_since(phase.window_start)
            .as_secs_f64(),
        cpu_ns: used.cpu_ns,
        server_cpu_ns: srv1.saturating_sub(srv0),
        client_threads: cpu1.len(),
        client_switches: used.switches,
        submitted: phase.submitted.load(Ordering::Relaxed),
        completed: phase.completed.load(Ordering::Relaxed),
        responder_datagrams: match (dg0, dg1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        },
        host_steal_ms: steal0.zip(steal1).map(|(a, b)| (b - a).max(0.0)),
        extra,
    }
}
