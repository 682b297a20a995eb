//! Hosted cores (`EngineBuilder::runtime`): the engine core runs as a task on the
//! application's Tokio runtime. Same behaviour as a pinned core: decisions on both
//! runtime flavours, loss and replays, steering (sockets opened and closed while
//! registered with the reactor), every request completed exactly once at shutdown, and
//! a runtime that goes away first fails what the core held instead of hanging. Each
//! on both I/O backends (io_uring where this host allows it): the reactor watches the
//! sockets (mmsg) or the ring's fd (io_uring).

#[path = "engine_common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;
use ratelimitly_engine::engine::{Cores, Engine};
use ratelimitly_engine::proto::outcome::{Decision, Failure};
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::udp::{BackendChoice, BackendKind};
use rl_responder::Faults;

/// A runtime with `workers` worker threads (0: a current-thread runtime).
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    let mut b = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    b.enable_all().build().unwrap()
}

/// The backends every hosted test runs on.
const BACKENDS: [BackendChoice; 2] = [BackendChoice::Mmsg, BackendChoice::Uring];

/// A hosted engine on `backend`, or None (after a message) where this host refuses
/// io_uring.
fn hosted(
    rt: &tokio::runtime::Runtime,
    eps: Vec<ratelimitly_engine::proto::machine::Endpoint>,
    backend: BackendChoice,
) -> Option<Engine> {
    hosted_with(rt, eps, backend, RequestPolicy::default())
}

/// [`hosted`] with a request policy.
fn hosted_with(
    rt: &tokio::runtime::Runtime,
    eps: Vec<ratelimitly_engine::proto::machine::Endpoint>,
    backend: BackendChoice,
    policy: RequestPolicy,
) -> Option<Engine> {
    let built = Engine::builder(key(COOKIE))
        .cores(Cores::Count(1))
        .policy(policy)
        .endpoints(eps)
        .io_backend(backend)
        .runtime(rt.handle().clone())
        .build();
    match built {
        Ok(e) => Some(e),
        Err(e) if backend == BackendChoice::Uring => {
            eprintln!("skipped on io_uring: {e}");
            None
        }
        Err(e) => panic!("hosted engine builds: {e}"),
    }
}

/// `n` requests from `tasks` concurrent tasks on `rt`; returns the granted count and
/// every other outcome, printed (the first few) for the assertion's message.
fn grant_from_tasks(
    rt: &tokio::runtime::Runtime,
    e: &Engine,
    tasks: usize,
    n: usize,
) -> (usize, Vec<String>) {
    let h = e.handle();
    rt.block_on(async move {
        let res = resource("hosted", u32::MAX);
        let mut joins = Vec::new();
        for _ in 0..tasks {
            let (h, res) = (h.clone(), res.clone());
            joins.push(tokio::spawn(async move {
                let (mut granted, mut other) = (0, Vec::new());
                for i in 0..n / tasks {
                    match h.request().consume(&res, 1).send().await {
                        Ok(r) if r.decision == Decision::Granted => granted += 1,
                        o => other.push(format!("request {i}: {o:?}")),
                    }
                }
                (granted, other)
            }));
        }
        let (mut total, mut others) = (0, Vec::new());
        for j in joins {
            let (g, o) = j.await.unwrap();
            total += g;
            others.extend(o);
        }
        (total, others)
    })
}

#[test]
fn grants_on_current_thread_and_multi_thread_runtimes() {
    let _serial = serial();
    let r = responder(COOKIE, 1, Faults::default());
    let current = runtime(0);
    let multi = runtime(2);
    for (rt, backend) in [&current, &multi]
        .into_iter()
        .flat_map(|rt| BACKENDS.map(|b| (rt, b)))
    {
        // H = 300 ms (the fixture key's dedup limit): this is about grants on every
        // runtime and backend, not timing; a 2-CPU CI host busy with other work can hold
        // a first request past the default 60 ms
        let policy = RequestPolicy::builder().unit(ms(100)).build().unwrap();
        let Some(e) = hosted_with(rt, vec![ep(&r)], backend, policy) else {
            continue;
        };
        let (granted, others) = grant_from_tasks(rt, &e, 16, 2_000);
        assert_eq!(
            granted,
            2_000,
            "{backend:?} on {:?}: {} not granted, first: {:?}",
            rt.handle().runtime_flavor(),
            others.len(),
            &others[..others.len().min(3)]
        );
        // read on the runtime, stats do not wait for the core: an idle core has
        // published its last work within 10 ms
        let h = e.handle();
        let s = rt.block_on(async move {
            tokio::time::sleep(Duration::from_millis(40)).await;
            h.stats()
        });
        assert!(
            s.completions >= 2_000,
            "{} completions published",
            s.completions
        );
        if rt.handle().runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
            // a blocking caller on another thread is served too (a current-thread
            // runtime runs the core only while something drives it)
            grant_batch(&e.handle(), "hosted-batch", 300);
        }
        // the backend asked for, never another one in its place
        let want = match backend {
            BackendChoice::Uring => BackendKind::Uring,
            _ => BackendKind::Mmsg,
        };
        let s = e.handle().stats();
        assert_eq!(s.io.as_ref().map(|io| io.backend), Some(want));
        e.shutdown();
    }
}

#[test]
fn replays_through_loss_and_follows_steering() {
    let _serial = serial();
    let lossy = responder(
        COOKIE,
        1,
        Faults {
            drop_in: 0.2,
            steer_every: 97,
            seed: 7,
            ..Faults::default()
        },
    );
    for backend in BACKENDS {
        let rt = runtime(1);
        let Some(e) = hosted(&rt, vec![ep(&lossy)], backend) else {
            continue;
        };
        // one server, 20% of requests lost: a request fails only when its send and its
        // replay are both lost (4%, about 80 of 2000; 1850 is 8 standard deviations below)
        let (granted, _) = grant_from_tasks(&rt, &e, 8, 2_000);
        assert!(granted >= 1_850, "{granted} of 2000 granted");
        let s = e.handle().stats();
        assert!(
            s.decisions_by_round[1..].iter().sum::<u64>() > 0,
            "replays decided some"
        );
        assert!(
            s.steering_rebinds > 0,
            "steering moved the core to new sockets"
        );
        e.shutdown();
    }
}

#[test]
fn shutdown_on_the_runtime_completes_every_request_once() {
    let _serial = serial();
    let silent = silent_responder(COOKIE, 1);
    for backend in BACKENDS {
        let rt = runtime(0);
        let Some(e) = hosted(&rt, vec![ep(&silent)], backend) else {
            continue;
        };
        let h = e.handle();
        let outs = rt.block_on(async move {
            let res = resource("stuck", 10);
            let pending: Vec<_> = (0..50)
                .map(|_| tokio::spawn(h.request().consume(&res, 1).send()))
                .collect();
            tokio::time::sleep(Duration::from_millis(5)).await;
            // on the runtime: returns at once, the core stops at its next turn
            e.shutdown();
            let mut outs = Vec::new();
            for p in pending {
                outs.push(p.await.unwrap());
            }
            outs
        });
        assert_eq!(outs.len(), 50);
        assert!(outs.iter().all(|o| matches!(o, Err(Failure::Shutdown))));
    }
}

#[test]
fn a_dropped_runtime_fails_held_requests_and_later_submissions() {
    let _serial = serial();
    let silent = silent_responder(COOKIE, 1);
    for backend in BACKENDS {
        let rt = runtime(1);
        let Some(e) = hosted(&rt, vec![ep(&silent)], backend) else {
            continue;
        };
        let h = e.handle();
        let res = resource("orphan", 10);
        let held: Vec<_> = (0..20)
            .map(|_| h.request().consume(&res, 1).send())
            .collect();
        std::thread::sleep(Duration::from_millis(20));
        drop(rt);
        for c in held {
            let o = c
                .wait_timeout(Duration::from_secs(5))
                .expect("completed, not hanging");
            assert!(matches!(o, Err(Failure::Shutdown)), "{o:?}");
        }
        let later = h.request().consume(&res, 1).wait();
        assert!(later.is_err(), "a core whose runtime is gone fails at once");
        e.shutdown();
    }
}

/// `Engine::shutdown_graceful`, pinned and hosted: requests submitted before it finish
/// as they would have (granted by a slow server; timed out at the horizon by a silent
/// one), later ones fail at once with `Shutdown`, and the future completes.
#[test]
fn graceful_shutdown_lets_submitted_requests_finish() {
    let _serial = serial();
    let slow = responder(
        COOKIE,
        1,
        Faults {
            delay: Duration::from_millis(10),
            ..Faults::default()
        },
    );
    let silent = silent_responder(COOKIE, 2);
    let rt = runtime(1);
    for hosted in [false, true] {
        for (server, granted) in [(&slow, true), (&silent, false)] {
            let mut b = Engine::builder(key(COOKIE))
                .cores(Cores::Count(1))
                .endpoints(vec![ep(server)]);
            if hosted {
                b = b.runtime(rt.handle().clone());
            }
            let e = b.build().unwrap();
            let h = e.handle();
            let res = resource("graceful", u32::MAX);
            let pending: Vec<_> = (0..50)
                .map(|_| h.request().consume(&res, 1).send())
                .collect();
            rt.block_on(e.shutdown_graceful());
            for c in pending {
                let o = c.wait_timeout(Duration::from_secs(1)).expect("completed");
                if granted {
                    assert!(
                        o.as_ref().is_ok_and(|r| r.decision == Decision::Granted),
                        "hosted {hosted}: {o:?}"
                    );
                } else {
                    assert!(
                        matches!(o, Err(Failure::Timeout { .. })),
                        "hosted {hosted}: {o:?}"
                    );
                }
            }
            let late = h.request().consume(&res, 1).wait();
            assert!(matches!(late, Err(Failure::Shutdown)), "{late:?}");
        }
    }
}

/// A panic inside a hosted core's turn takes the same path as on a pinned core
/// (`a_failed_core_fails_its_requests_and_refuses_new_work` in engine_basic.rs): what it
/// held and what reaches its queue fails with `CoreFailed`, later submissions fail at
/// once, and the engine still shuts down.
#[test]
fn a_failed_hosted_core_fails_its_requests_and_refuses_new_work() {
    let _serial = serial();
    let silent = silent_responder(COOKIE, 1);
    for backend in BACKENDS {
        let rt = runtime(1);
        let Some(e) = hosted(&rt, vec![ep(&silent)], backend) else {
            continue;
        };
        fault_fails_held_queued_and_later(&e.handle());
        e.shutdown();
        drop(rt);
    }
}

/// A core held off its CPU past H (a loaded machine: the runtime's thread descheduled,
/// or a task that blocks it) counts the answers that reached its sockets meanwhile
/// before it fires the timers that passed: the requests are granted, not timed out.
/// Before, every request in flight timed out at once after such a stall (64 outcomes the
/// chaos run could not explain when builds ran beside it).
#[test]
fn answers_that_arrived_during_a_stall_count_before_the_timers() {
    let _serial = serial();
    let r = responder(COOKIE, 1, Faults::default());
    for backend in BACKENDS {
        let rt = runtime(0);
        let Some(e) = hosted(&rt, vec![ep(&r)], backend) else {
            continue;
        };
        let h = e.handle();
        let answered = r.counters().answered;
        let r = &r;
        let (granted, others) = rt.block_on(async move {
            let res = resource("stall", u32::MAX);
            let joins: Vec<_> = (0..16)
                .map(|_| {
                    let (h, res) = (h.clone(), res.clone());
                    tokio::spawn(async move { h.request().consume(&res, 1).send().await })
                })
                .collect();
            // the requests submit and the core sends them (its task runs after theirs);
            // then this thread stalls for twice H while the answers arrive
            let before = h.stats().sends;
            for _ in 0..100 {
                if h.stats().sends >= before + 16 {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert!(
                h.stats().sends >= before + 16,
                "the core sent before the stall"
            );
            // the stall: past H (60 ms), and until the responder has answered all 16 (a
            // busy host may hold it too), at most 2 s
            let t0 = std::time::Instant::now();
            while t0.elapsed() < Duration::from_millis(150)
                || (r.counters().answered < answered + 16 && t0.elapsed() < Duration::from_secs(2))
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            let (mut granted, mut others) = (0, Vec::new());
            for j in joins {
                match j.await.unwrap() {
                    Ok(r) if r.decision == Decision::Granted => granted += 1,
                    o => others.push(format!("{o:?}")),
                }
            }
            (granted, others)
        });
        assert_eq!(granted, 16, "{backend:?}: {others:?}");
        e.shutdown();
    }
}
