//! Engine against embedded responders on loopback: the docs/protocol.md §16 checklist on real
//! sockets and time (representative scenarios; exact timing is covered on virtual time
//! by the machine's tests).

mod engine_common;

use std::time::{Duration, Instant};

use engine_common::*;
use ratelimitly_engine::engine::{BuildError, Cores, Engine};
use ratelimitly_engine::proto::outcome::{Decision, Failure, Phase};
use ratelimitly_engine::proto::policy::RequestPolicy;
use rl_responder::{Faults, FixedDecision};

#[test]
fn grant_reject_and_local_grant() {
    let _serial = serial();
    for k in [COOKIE, AES, NONE] {
        let r = responder(k, 100, Faults::default());
        let e = engine(k, vec![ep(&r)], RequestPolicy::default());
        let h = e.handle();
        let res = resource("basic", 2);
        let out = h.request().consume(&res, 1).label("api").wait().unwrap();
        assert_eq!(out.decision, Decision::Granted);
        assert_eq!(out.server_id, Some(100));
        assert_eq!(out.phase, Phase::Round(0));
        assert_eq!(out.sends, 1);
        let out = h.request().consume(&res, 1).wait().unwrap();
        assert_eq!(out.decision, Decision::Granted);
        let out = h.request().consume(&res, 1).wait().unwrap();
        assert_eq!(out.decision, Decision::Rejected);
        assert_eq!(out.resources[0].deficit, 1);
        // empty request: local grant, nothing sent
        let out = h.request().wait().unwrap();
        assert_eq!(out.phase, Phase::Local);
        assert_eq!(out.server_id, None);
        let s = h.stats();
        assert_eq!(s.granted, 2);
        assert_eq!(s.rejected, 1);
        assert_eq!(s.sends, 3);
        e.shutdown();
    }
}

#[test]
fn async_future_on_tokio() {
    let _serial = serial();
    let r = responder(COOKIE, 7, Faults::default());
    let e = engine(COOKIE, vec![ep(&r)], RequestPolicy::default());
    let h = e.handle();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let res = resource("async", 1000);
    let outs = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..10 {
            v.push(h.request().consume(&res, 1).send().await);
        }
        let b = h
            .submit_batch(
                (0..5)
                    .map(|_| h.request().consume(&res, 1).build())
                    .collect(),
            )
            .await;
        v.extend(b);
        v
    });
    assert_eq!(outs.len(), 15);
    assert!(
        outs.iter()
            .all(|o| o.as_ref().unwrap().decision == Decision::Granted)
    );
    e.shutdown();
}

#[test]
fn oldest_answering_first_returns_at_once_younger_waits_round0() {
    let _serial = serial();
    let old = responder(COOKIE, 10, Faults::default());
    // The younger answers 10 ms late, so the oldest's answer is always the first valid one
    // and completion delivery deterministically goes to the younger server.
    let young = responder(
        COOKIE,
        20,
        Faults {
            delay: ms(10),
            ..Faults::default()
        },
    );
    let policy = RequestPolicy::builder().unit(ms(50)).build().unwrap();
    let e = engine(COOKIE, vec![ep(&old), ep(&young)], policy.clone());
    let h = e.handle();
    let res = resource("oldest", 1000);
    let t = Instant::now();
    let out = h.request().consume(&res, 1).wait().unwrap();
    assert_eq!(out.server_id, Some(10));
    assert!(t.elapsed() < ms(45), "oldest answers at once");
    // completion delivery went to the younger server only
    assert_eq!(out.completion_sends, 1);
    e.shutdown();

    // oldest is dead: round 0 waits until its end, then returns the younger (counted)
    let dead = dead_addr();
    let e = engine(
        COOKIE,
        vec![
            ratelimitly_engine::proto::machine::Endpoint {
                server_id: 5,
                addr: dead,
            },
            ep(&young),
        ],
        policy,
    );
    let h = e.handle();
    let t = Instant::now();
    let out = h.request().consume(&res, 1).wait().unwrap();
    let el = t.elapsed();
    assert_eq!(out.server_id, Some(20));
    assert_eq!(out.phase, Phase::Round(0));
    assert!(el >= ms(50), "waited for round 0 end: {el:?}");
    let s = h.stats();
    assert_eq!(s.oldest_fallbacks, 1);
    e.shutdown();
}

#[test]
fn timeout_unreachable_and_silent() {
    let _serial = serial();
    // silent server: timeout at H
    let r = responder(
        COOKIE,
        3,
        Faults {
            silent: true,
            ..Faults::default()
        },
    );
    let policy = RequestPolicy::builder().unit(ms(10)).build().unwrap();
    let e = engine(COOKIE, vec![ep(&r)], policy);
    let h = e.handle();
    let t = Instant::now();
    let out = h.request().consume(&resource("t", 5), 1).wait();
    assert!(
        matches!(out, Err(Failure::Timeout { horizon_ms: 30 })),
        "{out:?}"
    );
    assert!(t.elapsed() >= ms(30));
    assert_eq!(h.stats().timeouts, 1);
    e.shutdown();
}

#[test]
fn replay_after_loss_then_fixed_reject_and_broken_replies() {
    let _serial = serial();
    let r = responder(
        COOKIE,
        3,
        Faults {
            fixed: Some(FixedDecision::Reject),
            ..Faults::default()
        },
    );
    let e = engine(COOKIE, vec![ep(&r)], RequestPolicy::default());
    let h = e.handle();
    let out = h.request().consume(&resource("rej", 5), 1).wait().unwrap();
    assert_eq!(out.decision, Decision::Rejected);
    e.shutdown();

    // unauthenticated replies are dropped and counted; the request times out
    let r = responder(
        COOKIE,
        3,
        Faults {
            broken: Some(rl_responder::BrokenReply::BadAuth),
            ..Faults::default()
        },
    );
    let policy = RequestPolicy::builder().unit(ms(10)).build().unwrap();
    let e = engine(COOKIE, vec![ep(&r)], policy);
    let h = e.handle();
    let out = h.request().consume(&resource("br", 5), 1).wait();
    assert!(matches!(out, Err(Failure::Timeout { .. })), "{out:?}");
    let s = h.stats();
    assert!(s.total_drops() >= 2, "drops {:?}", s.drops);
    e.shutdown();
}

/// What `build` refuses for `b` on one core: these builders fail before any I/O.
fn build_error(b: ratelimitly_engine::engine::EngineBuilder) -> BuildError {
    b.cores(Cores::Count(1)).build().expect_err("rejected")
}

/// A static endpoint the refused builds never reach.
fn never_reached() -> Vec<ratelimitly_engine::proto::machine::Endpoint> {
    vec![ratelimitly_engine::proto::machine::Endpoint {
        server_id: 1,
        addr: "127.0.0.1:9".parse().unwrap(),
    }]
}

#[test]
fn policy_over_key_limit_is_rejected_before_io() {
    let _serial = serial();
    // 300 ms key: U = 101 with the default shape gives H = 303
    let policy = RequestPolicy::builder().unit(ms(101)).build().unwrap();
    let err = build_error(
        Engine::builder(key(COOKIE))
            .policy(policy)
            .endpoints(never_reached()),
    );
    let msg = err.to_string();
    assert!(msg.contains("303") && msg.contains("300"), "{msg}");
    assert!(!msg.contains(COOKIE) && !msg.contains("rl-cookie"), "{msg}");
}

#[cfg(not(feature = "dns"))]
#[test]
fn dns_discovery_without_the_dns_feature_fails_at_build() {
    let _serial = serial();
    let err = build_error(Engine::builder(key(COOKIE)));
    assert!(matches!(err, BuildError::DnsNotCompiled), "{err:?}");
}

#[cfg(not(feature = "io-uring"))]
#[test]
fn io_uring_by_name_without_the_io_uring_feature_fails_at_build() {
    let _serial = serial();
    let err = build_error(
        Engine::builder(key(COOKIE))
            .io_backend(ratelimitly_engine::udp::BackendChoice::Uring)
            .endpoints(never_reached()),
    );
    assert!(matches!(err, BuildError::UringNotCompiled), "{err:?}");
}

#[test]
fn unreachable_endpoint_does_not_abort_and_all_unreachable_fails() {
    let _serial = serial();
    let r = responder(COOKIE, 9, Faults::default());
    // an IPv6 address we cannot reach from an IPv4-only path still fails to send on
    // some hosts; use a port-0 destination, which the kernel refuses to send to.
    let bad = ratelimitly_engine::proto::machine::Endpoint {
        server_id: 1,
        addr: "127.0.0.1:0".parse().unwrap(),
    };
    let e = engine(COOKIE, vec![bad, ep(&r)], RequestPolicy::default());
    let h = e.handle();
    let out = h.request().consume(&resource("u", 5), 1).wait().unwrap();
    assert_eq!(out.server_id, Some(9));
    e.shutdown();
    let e = engine(COOKIE, vec![bad], RequestPolicy::default());
    let h = e.handle();
    let out = h.request().consume(&resource("u", 5), 1).wait();
    assert!(matches!(out, Err(Failure::Communication(_))), "{out:?}");
    e.shutdown();
}

#[test]
fn latency_report_goes_once_to_each_server() {
    let _serial = serial();
    let a = responder(COOKIE, 1, Faults::default());
    let b = responder(COOKIE, 2, Faults::default());
    let e = Engine::builder(key(COOKIE))
        .cores(Cores::Count(1))
        .endpoints(vec![ep(&a), ep(&b)])
        .report_interval(ms(2))
        .build()
        .unwrap();
    let h = e.handle();
    let t = tracker("lat");
    for i in 0..40 {
        h.report(&t, ms(10 + i)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let s = h.stats();
        if s.report_datagrams >= 4 || Instant::now() > deadline {
            // 40 entries: one full datagram of 34 + one of 6, each to both servers
            assert_eq!(s.report_entries, 40);
            assert_eq!(s.report_datagrams, 4);
            break;
        }
        std::thread::sleep(ms(5));
    }
    assert!(h.report(&t, Duration::from_micros(1500)).is_err());
    e.shutdown();
}

/// A panic inside a core (test-only fault hook) fails its in-flight and queued requests
/// with `CoreFailed`, new work fails at once, and stats report the dead core.
#[test]
fn a_failed_core_fails_its_requests_and_refuses_new_work() {
    let _serial = serial();
    let r = silent_responder(COOKIE, 1);
    let e = engine(COOKIE, vec![ep(&r)], RequestPolicy::default());
    fault_fails_held_queued_and_later(&e.handle());
    e.shutdown();
}

#[test]
fn wait_timeout_hands_the_completion_back() {
    let _serial = serial();
    let r = silent_responder(COOKIE, 1);
    let e = engine(COOKIE, vec![ep(&r)], RequestPolicy::default());
    let h = e.handle();
    let res = resource("wt", u32::MAX);
    let c = h.request().consume(&res, 1).send();
    let c = c.wait_timeout(Duration::from_millis(1)).unwrap_err();
    assert!(matches!(c.wait(), Err(Failure::Timeout { .. })));
    e.shutdown();
}

/// Defect 1 of the engine-core issue on real sockets: answers that ask for a new port
/// under heavy continuous load, from two and three servers, so several old sockets drain
/// at once and full receive batches arrive on a draining socket. On the previous core
/// this panicked the core thread ("index out of bounds" in the socket list) and hung
/// every waiter.
#[test]
fn overlapping_steering_drains_under_load_complete_every_request() {
    let _serial = serial();
    for servers in [2u64, 3] {
        let rs: Vec<_> = (0..servers)
            .map(|i| {
                responder(
                    COOKIE,
                    10 + i,
                    Faults {
                        steer_every: 40,
                        jitter: ms(3),
                        seed: i,
                        ..Faults::default()
                    },
                )
            })
            .collect();
        let e = engine(
            COOKIE,
            rs.iter().map(ep).collect(),
            RequestPolicy::default(),
        );
        let h = e.handle();
        let res = std::sync::Arc::new(resource("drains", u32::MAX));
        let threads: Vec<_> = (0..6)
            .map(|_| {
                let (h, res) = (h.clone(), res.clone());
                std::thread::spawn(move || {
                    for _ in 0..30 {
                        let b: Vec<_> = (0..300)
                            .map(|_| h.request().consume(&res, 1).build())
                            .collect();
                        let outs = h
                            .submit_batch(b)
                            .wait_timeout(Duration::from_secs(10))
                            .unwrap_or_else(|_| panic!("waiters hang"));
                        assert_eq!(outs.len(), 300);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = h.stats();
        assert_eq!(s.completions, 54_000);
        assert!(s.steering_rebinds >= 2, "{}", s.steering_rebinds);
        assert_eq!(s.dead_cores, 0);
        e.shutdown();
    }
}

/// The engine on each I/O backend, with GSO/GRO on and off: grants, a load burst, and
/// the backend reported in stats. (Where io_uring is refused, `Uring` fails to build and
/// the case is skipped with a message; `Mmsg` is forced even where io_uring works.)
#[test]
fn every_backend_with_gso_on_and_off() {
    use ratelimitly_engine::udp::{BackendChoice, BackendKind};
    let _serial = serial();
    let r = responder(COOKIE, 1, Faults::default());
    for (backend, kind) in [
        (BackendChoice::Mmsg, BackendKind::Mmsg),
        (BackendChoice::Uring, BackendKind::Uring),
    ] {
        for gso in [true, false] {
            let built = Engine::builder(key(COOKIE))
                .cores(Cores::Count(1))
                .endpoints(vec![ep(&r)])
                .io_backend(backend)
                .gso(gso)
                .build();
            let e = match built {
                Ok(e) => e,
                Err(err) if backend == BackendChoice::Uring => {
                    eprintln!("io_uring refused here ({err}); case skipped");
                    continue;
                }
                Err(err) => panic!("{err}"),
            };
            let h = e.handle();
            grant_batch(&h, "backends", 500);
            let s = h.stats();
            let io = s.io.expect("io stats");
            assert_eq!(io.backend, kind, "{backend:?} gso {gso}");
            assert!(io.datagrams_sent >= 500);
            if !gso {
                assert_eq!(io.gso_sends, 0);
            }
            e.shutdown();
        }
    }
}
