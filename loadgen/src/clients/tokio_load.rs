//! Drives a future-based client (the engine or the official client) on a Tokio runtime
//! limited to the application's cores (`--app-cores`, by default the client cores; worker
//! threads pinned), closed loop (N in flight) or open
//! loop (a pacer thread at a fixed rate; latency from each request's intended send time).
//!
//! Owns the load shape for the future-based clients. Must not set up servers or
//! print results.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Load, PhaseSpec, Ready, wait_gate};
use crate::stats::{Kind, Phase};

/// A future-based client: one operation (request or latency report) at a time per task.
pub trait AsyncClient: Send + Sync + 'static {
    /// Runs operation `j`; returns its kind and, when known, its datagram count.
    fn op(&self, j: u64) -> impl Future<Output = (Kind, Option<u32>)> + Send;
    /// Shuts the client down after its phase.
    fn finish(self);
}

/// A Tokio runtime with one worker per client core, each pinned to its core.
fn runtime(cores: &[usize]) -> std::io::Result<tokio::runtime::Runtime> {
    let cores: Arc<Vec<usize>> = Arc::new(cores.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let c2 = Arc::clone(&cores);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores.len().max(1))
        .max_blocking_threads(2)
        .enable_all()
        .on_thread_start(move || {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = c2.get(i % c2.len().max(1)) {
                crate::cpu::pin(*c);
            }
        })
        .build()
}

/// Shortest sleep of the open-loop pacer: about four request intervals, between 50 and
/// 250 µs, so that it wakes at most 20,000 times a second and releases a few requests per
/// wake-up (Tokio's own timer ticks in whole milliseconds, which released requests in
/// 1 ms bursts up to 1 ms late; a fixed 250 µs tick put ~125 µs of release delay into
/// every open-loop p50 at high rates).
fn pacer_tick(rate: f64) -> Duration {
    let four = if rate > 0.0 { 4.0 / rate } else { 1.0 };
    Duration::from_secs_f64(four).clamp(Duration::from_micros(50), Duration::from_micros(250))
}

/// The open-loop pacer: on its own thread (pinned to `core`, 1 µs timer slack), it spawns
/// operation tasks onto the runtime at `rate` per second, each at its intended time; an
/// operation due while `max_outstanding` are outstanding is recorded as overloaded instead.
fn pace<C: AsyncClient>(
    target: Arc<C>,
    phase: Arc<Phase>,
    (rate, max_outstanding): (f64, usize),
    core: Option<usize>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let rt = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("lg-pacer".into())
        .spawn(move || {
            if let Some(c) = core {
                crate::cpu::pin(c);
            }
            // SAFETY: prctl with PR_SET_TIMERSLACK takes a plain integer (nanoseconds) and
            // no pointer; it changes only this thread's timer slack.
            unsafe {
                libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong, 0, 0, 0);
            }
            let stop_at = phase.window_end;
            let tick = pacer_tick(rate);
            let start = Instant::now();
            let mut i: u64 = 0;
            loop {
                let now = Instant::now();
                let mut intended = start + Duration::from_secs_f64(i as f64 / rate);
                if intended >= stop_at {
                    break;
                }
                while intended <= now {
                    phase.submit();
                    if phase.outstanding() > max_outstanding as u64 {
                        phase.record(intended, now, Kind::Overloaded, Some(0));
                    } else {
                        let (target, phase) = (Arc::clone(&target), Arc::clone(&phase));
                        let (at, j) = (intended, i);
                        rt.spawn(async move {
                            let (k, s) = target.op(j).await;
                            phase.record(at, Instant::now(), k, s);
                        });
                    }
                    i += 1;
                    intended = start + Duration::from_secs_f64(i as f64 / rate);
                }
                let wake = intended.max(now + tick);
                std::thread::sleep(wake.saturating_duration_since(Instant::now()));
            }
        })
}

/// Runs `target` under `load` until the phase's window ends, then waits (at most
/// `drain`) for every submitted operation to complete. The open-loop pacer runs on
/// `pacer_core`.
async fn drive<C: AsyncClient>(
    target: Arc<C>,
    phase: Arc<Phase>,
    load: Load,
    drain: Duration,
    pacer_core: Option<usize>,
) {
    let next = Arc::new(AtomicU64::new(0));
    let stop_at = phase.window_end;
    match load {
        Load::Closed { in_flight } => {
            let mut tasks = Vec::with_capacity(in_flight);
            for _ in 0..in_flight {
                let (target, phase, next) =
                    (Arc::clone(&target), Arc::clone(&phase), Arc::clone(&next));
                tasks.push(tokio::spawn(async move {
                    // One clock read per operation, as the raw client reads one per
                    // batch: an operation's end is the next one's start.
                    let mut t0 = Instant::now();
                    while t0 < stop_at {
                        let j = next.fetch_add(1, Ordering::Relaxed);
                        phase.submit();
                        let (k, s) = target.op(j).await;
                        let done = Instant::now();
                        phase.record(t0, done, k, s);
                        t0 = done;
                    }
                }));
            }
            let all = async {
                for t in tasks {
                    let _ = t.await;
                }
            };
            let _ = tokio::time::timeout(
                stop_at.saturating_duration_since(Instant::now()) + drain,
                all,
            )
            .await;
        }
        Load::Open {
            rate,
            max_outstanding,
        } => {
            let load = (rate, max_outstanding);
            match pace(Arc::clone(&target), Arc::clone(&phase), load, pacer_core) {
                Ok(pacer) => {
                    while !pacer.is_finished() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let _ = pacer.join();
                }
                Err(e) => eprintln!("loadgen: open-loop pacer thread: {e}"),
            }
            let deadline = Instant::now() + drain;
            while phase.completed.load(Ordering::Relaxed) < phase.submitted.load(Ordering::Relaxed)
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }
}

/// Runs `make`'s client for one phase on a Tokio runtime pinned to the application's
/// cores: the client is built inside the runtime, before this thread is pinned (an engine
/// may only put its cores on CPUs its builder's thread may run on), the phase starts once
/// it is ready, and the client is finished after the drain and the gate.
pub fn run_phase<C, F, Fut>(spec: PhaseSpec, ready: Ready, make: F)
where
    C: AsyncClient,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<C, String>>,
{
    let rt = match runtime(&spec.app_cores) {
        Ok(rt) => rt,
        Err(e) => {
            let _ = ready.send(Err(format!("runtime: {e}")));
            return;
        }
    };
    rt.block_on(async {
        let client = match make().await {
            Ok(c) => Arc::new(c),
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        crate::cpu::pin(spec.app_cores[0]);
        let phase = Phase::new(Instant::now(), spec.warmup, spec.duration);
        let _ = ready.send(Ok(Arc::clone(&phase)));
        let pacer_core = spec.app_cores.first().copied();
        drive(
            Arc::clone(&client),
            phase,
            spec.load,
            spec.drain,
            pacer_core,
        )
        .await;
        wait_gate(&spec.gate);
        if let Ok(c) = Arc::try_unwrap(client) {
            c.finish();
        }
    });
    rt.shutdown_timeout(Duration::from_secs(2));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_tick_is_four_intervals_within_bounds() {
        assert_eq!(pacer_tick(1_000.0), Duration::from_micros(250));
        assert_eq!(pacer_tick(10_000.0), Duration::from_micros(250));
        assert_eq!(pacer_tick(40_000.0), Duration::from_micros(100));
        assert_eq!(pacer_tick(1e6), Duration::from_micros(50));
        assert_eq!(pacer_tick(0.0), Duration::from_micros(250));
    }

    /// An operation that takes 20 ms.
    struct Slow;

    impl AsyncClient for Slow {
        async fn op(&self, _j: u64) -> (Kind, Option<u32>) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            (Kind::Granted, Some(1))
        }
        fn finish(self) {}
    }

    #[test]
    fn open_loop_sheds_beyond_the_outstanding_bound_and_completes_the_rest() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let phase = Phase::new(Instant::now(), Duration::ZERO, Duration::from_millis(200));
        let load = Load::Open {
            rate: 2_000.0,
            max_outstanding: 8,
        };
        let drain = Duration::from_secs(2);
        rt.block_on(drive(Arc::new(Slow), Arc::clone(&phase), load, drain, None));
        let r = phase.merged();
        let (granted, shed) = (r.all(Kind::Granted), r.all(Kind::Overloaded));
        // 400 due in 200 ms; at most 8 at a time for 20 ms each were sent.
        assert!((8..=8 * 11).contains(&granted), "granted {granted}");
        assert!(shed > 0, "nothing shed");
        assert_eq!(phase.outstanding(), 0, "everything sent completed");
        assert_eq!(
            phase.submitted.load(Ordering::Relaxed),
            granted + shed,
            "every due operation was submitted"
        );
    }
}
