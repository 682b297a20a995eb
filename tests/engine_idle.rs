//! Guards against a core that loops without waiting (the io_uring core once did, at 4×
//! the CPU, while only mmsg was measured): for each I/O backend and each placement, a
//! core must sleep whenever it has nothing to do. Counters, not time: serving requests
//! one at a time, the core waits (`io.waits`: a blocking wait in the kernel, or a park
//! of the hosted task) for at least every fourth request and makes a bounded number of
//! passes per request; over an idle second that follows, its passes (`io.loops`) stay
//! few and the process's CPU stays under 5% of one CPU. One test in this binary, so
//! nothing else shares its process. A loaded host may stall the core or the responder
//! past a request's 60 ms horizon: a few timed-out requests are tolerated (they are
//! served one at a time all the same), and the statistics are asked for again until the
//! core has published them.
//! (`cargo test -p ratelimitly-engine --test engine_idle`.)

mod engine_common;

use std::time::{Duration, Instant};

use engine_common::*;
use ratelimitly_engine::engine::{Cores, Engine, EngineHandle};
use ratelimitly_engine::proto::outcome::Failure;
use ratelimitly_engine::udp::{BackendChoice, BackendKind};
use rl_responder::Faults;

/// Passes an idle core may make in a second: publications at the start of the pause
/// and the timers of the requests that just finished; a spinning core makes tens of
/// thousands.
const IDLE_LOOPS: u64 = 100;
/// CPU of the whole process over the idle second, in µs (5% of one CPU).
const IDLE_CPU_US: u64 = 50_000;

/// User + system CPU time of this process so far, in µs.
fn process_cpu_us() -> u64 {
    // SAFETY: `getrusage` writes one `rusage` we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// Requests served one at a time.
const SEQUENTIAL: u64 = 200;
/// Waits required over them: a spinning core waits almost never; a sleeping one made
/// 168–601 waits for 200 requests here, and a hosted io_uring core on a loaded host
/// once 97.
const WAITS_REQUIRED: u64 = SEQUENTIAL / 4;
/// Passes a core may make per sequential request (the submission, the answer, the
/// completion's resend and timers; a spinning core makes hundreds).
const LOOPS_PER_REQUEST: u64 = 12;

/// Timed-out requests tolerated of the [`SEQUENTIAL`] ones (a stalled host, not a
/// spinning core: a spinning core answers everything, at a CPU's cost).
const TIMEOUTS_TOLERATED: u64 = SEQUENTIAL / 10;

/// The I/O counters of the engine's only core: backend, passes, waits. `stats` waits
/// 100 ms for a publication; a loaded host may delay the core's first one beyond that.
fn counters(h: &EngineHandle) -> (BackendKind, u64, u64) {
    // bounded: 50 tries of at most 100 ms each
    for _ in 0..50 {
        if let Some(io) = h.stats().io {
            return (io.backend, io.loops, io.waits);
        }
    }
    panic!("the core published no I/O counters in 5 s");
}

/// What one engine did: its backend, and passes and waits over the sequential
/// requests, then passes and CPU µs per second over the idle second.
struct Measured {
    backend: BackendKind,
    busy_loops: u64,
    busy_waits: u64,
    idle_loops: u64,
    idle_cpu: u64,
}

/// Serves [`SEQUENTIAL`] requests one at a time, lets the core settle, then measures
/// an idle second.
fn measure(h: &EngineHandle, name: &str) -> Measured {
    let res = resource("idle", u32::MAX);
    let (_, l0, w0) = counters(h);
    let mut timeouts = 0;
    for _ in 0..SEQUENTIAL {
        match h.request().consume(&res, 1).wait() {
            Ok(_) => {}
            Err(Failure::Timeout { .. }) if timeouts < TIMEOUTS_TOLERATED => timeouts += 1,
            Err(f) => panic!("{name}: {f:?} ({timeouts} timeouts before)"),
        }
    }
    let (_, l1, w1) = counters(h);
    // the last requests' timers and the pause's publications
    std::thread::sleep(Duration::from_millis(300));
    let (_, l2, _) = counters(h);
    let c0 = process_cpu_us();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let cpu = process_cpu_us() - c0;
    let (backend, l3, _) = counters(h);
    Measured {
        backend,
        busy_loops: l1 - l0,
        busy_waits: w1 - w0,
        idle_loops: l3 - l2,
        idle_cpu: cpu * 1_000_000 / t0.elapsed().as_micros().max(1) as u64,
    }
}

#[test]
fn an_idle_core_sleeps_on_every_backend_and_placement() {
    let r = responder(COOKIE, 7, Faults::default());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    for backend in [BackendChoice::Mmsg, BackendChoice::Uring] {
        for hosted in [false, true] {
            let mut b = Engine::builder(key(COOKIE))
                .cores(Cores::Count(1))
                .endpoints(vec![ep(&r)])
                .io_backend(backend);
            if hosted {
                b = b.runtime(rt.handle().clone());
            }
            let e = match b.build() {
                Ok(e) => e,
                // io_uring refused on this host (seccomp, io_uring_disabled)
                Err(err) if backend == BackendChoice::Uring => {
                    eprintln!("skipped {backend} (hosted: {hosted}): {err}");
                    continue;
                }
                Err(err) => panic!("{backend} (hosted: {hosted}): {err}"),
            };
            let what = format!("{backend} (hosted: {hosted})");
            let m = measure(&e.handle(), &what);
            let what = format!("{what}, ran {}", m.backend);
            assert!(
                m.busy_waits >= WAITS_REQUIRED,
                "{what}: {} waits for {SEQUENTIAL} requests served one at a time: the core spins",
                m.busy_waits
            );
            assert!(
                m.busy_loops <= SEQUENTIAL * LOOPS_PER_REQUEST,
                "{what}: {} passes for {SEQUENTIAL} requests served one at a time",
                m.busy_loops
            );
            assert!(
                m.idle_loops <= IDLE_LOOPS,
                "{what}: {} passes in an idle second: the core spins",
                m.idle_loops
            );
            assert!(
                m.idle_cpu <= IDLE_CPU_US,
                "{what}: {} µs of CPU in an idle second: the core spins",
                m.idle_cpu
            );
            eprintln!(
                "{what}: {} waits and {} passes for {SEQUENTIAL} requests; idle: {} passes, {} µs CPU/s",
                m.busy_waits, m.busy_loops, m.idle_loops, m.idle_cpu
            );
            e.shutdown();
        }
    }
}
