//! Guards against a core that loops without waiting (the io_uring core once did, at 4×
//! the CPU, while only mmsg was measured): for each I/O backend and each placement, an
//! engine that served some traffic and then has none must sleep. Counters, not time:
//! the core's passes (`io.loops`) over an idle second stay few, and the process's CPU
//! over that second stays under 5% of one CPU. One test in this binary, so nothing else
//! shares its process. (`cargo test -p ratelimitly-engine --test engine_idle`.)

mod engine_common;

use std::time::{Duration, Instant};

use engine_common::*;
use ratelimitly_engine::engine::{Cores, Engine, EngineHandle};
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

/// The I/O counters of the engine's only core.
fn loops(h: &EngineHandle) -> (BackendKind, u64) {
    let io = h.stats().io.expect("a core publishes its I/O counters");
    (io.backend, io.loops)
}

/// Serves `n` sequential requests, lets the core settle, then measures an idle second.
fn idle_second(h: &EngineHandle, name: &str) -> (BackendKind, u64, u64) {
    let res = resource(name, u32::MAX);
    for _ in 0..200 {
        assert!(h.request().consume(&res, 1).wait().is_ok());
    }
    // the last requests' timers and the pause's publications
    std::thread::sleep(Duration::from_millis(300));
    let (_, l0) = loops(h);
    let c0 = process_cpu_us();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let cpu = process_cpu_us() - c0;
    let (backend, l1) = loops(h);
    let cpu_per_s = cpu * 1_000_000 / t0.elapsed().as_micros().max(1) as u64;
    (backend, l1 - l0, cpu_per_s)
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
            let h = e.handle();
            let (kind, loops, cpu) = idle_second(&h, "idle");
            let what = format!("{backend} (hosted: {hosted}, ran {kind})");
            assert!(
                loops <= IDLE_LOOPS,
                "{what}: {loops} passes in an idle second: the core spins"
            );
            assert!(
                cpu <= IDLE_CPU_US,
                "{what}: {cpu} µs of CPU in an idle second: the core spins"
            );
            e.shutdown();
        }
    }
}
