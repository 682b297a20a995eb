//! Shared helpers of the engine integration tests (keys, responders, engines).
#![allow(dead_code, unused_imports)]

use std::time::Duration;

use ratelimitly_engine::engine::{Cores, Engine};
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource};
use ratelimitly_engine::proto::machine::Endpoint;
use ratelimitly_engine::proto::policy::RequestPolicy;

pub use rl_testkit::endpoints::dead_addr;
pub use rl_testkit::harness::{endpoint as ep, responder};
pub use rl_testkit::keys::{AES, COOKIE, NONE, key};

/// A responder that receives and never answers (requests to it stay in flight).
pub fn silent_responder(k: &str, server_id: u64) -> rl_responder::ResponderHandle {
    let silent = rl_responder::Faults {
        silent: true,
        ..rl_responder::Faults::default()
    };
    responder(k, server_id, silent)
}

pub fn engine(k: &str, eps: Vec<Endpoint>, policy: RequestPolicy) -> Engine {
    Engine::builder(key(k))
        .cores(Cores::Count(1))
        .policy(policy)
        .endpoints(eps)
        .socket_buffers(1 << 20, 1 << 20)
        .in_flight_per_core(32_768)
        .build()
        .expect("engine builds")
}

pub fn resource(name: &str, limit: u32) -> Resource {
    Resource::new(name, Duration::from_secs(60), limit).unwrap()
}

pub fn tracker(name: &str) -> LatencyTracker {
    LatencyTracker::new(name, Duration::from_secs(60), 100, 1).unwrap()
}

/// Submits `n` one-unit requests on resource `name` (limit u32::MAX) as one batch and
/// asserts every one is granted.
pub fn grant_batch(h: &ratelimitly_engine::engine::EngineHandle, name: &str, n: usize) {
    let res = resource(name, u32::MAX);
    let b: Vec<_> = (0..n)
        .map(|_| h.request().consume(&res, 1).build())
        .collect();
    let outs = h.submit_batch(b).wait();
    assert!(
        outs.iter().all(|o| o.as_ref().is_ok_and(|r| {
            r.decision == ratelimitly_engine::proto::outcome::Decision::Granted
        }))
    );
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Runs the tests of one binary one at a time: each starts engines and responders that
/// use both cores of a CI machine, and running them together only measures contention.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Core 0 of `h`'s engine (one core, a silent server) fails after 10 requests were
/// sent: those, 10 submitted after the fault and one submitted later all fail with
/// `CoreFailed`, and the engine counts one dead core.
pub fn fault_fails_held_queued_and_later(h: &ratelimitly_engine::engine::EngineHandle) {
    use ratelimitly_engine::proto::outcome::Failure;
    let res = resource("fault", u32::MAX);
    let held: Vec<_> = (0..10)
        .map(|_| h.request().consume(&res, 1).send())
        .collect();
    h.inject_core_fault(0);
    let queued: Vec<_> = (0..10)
        .map(|_| h.request().consume(&res, 1).send())
        .collect();
    for c in held.into_iter().chain(queued) {
        let o = c
            .wait_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("a waiter of a failed core hangs"));
        assert!(matches!(o, Err(Failure::CoreFailed { core: 0 })), "{o:?}");
    }
    let later = h.request().consume(&res, 1).wait();
    assert!(
        matches!(later, Err(Failure::CoreFailed { core: 0 })),
        "{later:?}"
    );
    assert_eq!(h.stats().dead_cores, 1);
}
