//! Engine under load and disruption, against embedded responders on loopback: every
//! request completes exactly once (outcomes are counted).

mod engine_common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use engine_common::*;
#[cfg(feature = "dns")]
use ratelimitly_engine::engine::DnsConfig;
use ratelimitly_engine::engine::{Cores, Engine};
use ratelimitly_engine::proto::outcome::{Decision, Failure};
use ratelimitly_engine::proto::policy::RequestPolicy;
use rl_responder::Faults;

#[test]
fn hundred_thousand_requests_from_eight_threads_complete_once() {
    let _serial = serial();
    let r = responder(NONE, 1, Faults::default());
    // U = 100 ms (H = 300 ms, the fixture key's dedup limit): 8 submitting threads, the
    // core and the responder share 2 CPUs, and with the default 60 ms horizon a CI host
    // busy with other work timed out about 1% of them (the assertion below is about
    // completing exactly once, not about timing)
    let policy = RequestPolicy::builder()
        .unit(Duration::from_millis(100))
        .build()
        .unwrap();
    let e = engine(NONE, vec![ep(&r)], policy);
    let h = e.handle();
    let res = Arc::new(resource("load", u32::MAX));
    let ok = Arc::new(AtomicU64::new(0));
    let other = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (h, res, ok, other) = (h.clone(), res.clone(), ok.clone(), other.clone());
            std::thread::spawn(move || {
                // batches of 250 keep ~2000 requests in flight overall
                for _ in 0..50 {
                    let b: Vec<_> = (0..250)
                        .map(|_| h.request().consume(&res, 1).build())
                        .collect();
                    for o in h.submit_batch(b).wait() {
                        match o {
                            Ok(r) if r.decision == Decision::Granted => {
                                ok.fetch_add(1, Ordering::Relaxed)
                            }
                            _ => other.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = h.stats();
    assert_eq!(
        ok.load(Ordering::Relaxed) + other.load(Ordering::Relaxed),
        100_000
    );
    assert_eq!(s.completions, 100_000);
    // What is under test is completing exactly once, not timing. Loopback without faults
    // leaves the horizon as the only way not to be granted: a stall of the host longer
    // than H (CI once timed out 1,007 of the ~2,000 in flight) may time requests out, and
    // nothing else may go wrong. How many are decided in time is a benchmark figure
    // (loadgen), not a pass/fail bar here.
    let granted = ok.load(Ordering::Relaxed);
    let counts = (s.comm_failures, s.overloaded, s.send_failures);
    assert_eq!(
        granted + s.timeouts,
        100_000,
        "granted {granted}, {counts:?}"
    );
    assert_eq!(
        counts,
        (0, 0, 0),
        "comm failures, overloaded, send failures"
    );
    assert!(
        granted >= 50_000,
        "granted {granted}: {:?}",
        s.decisions_by_round
    );
    e.shutdown();
}

#[test]
fn shutdown_with_ten_thousand_in_flight_completes_each_once() {
    let _serial = serial();
    let r = responder(
        COOKIE,
        1,
        Faults {
            silent: true,
            ..Faults::default()
        },
    );
    let policy = RequestPolicy::builder().unit(ms(100)).build().unwrap();
    let e = engine(COOKIE, vec![ep(&r)], policy);
    let h = e.handle();
    let res = resource("sd", 10);
    let b: Vec<_> = (0..10_000)
        .map(|_| h.request().consume(&res, 1).build())
        .collect();
    let batch = h.submit_batch(b);
    std::thread::sleep(ms(20));
    e.shutdown();
    let outs = batch.wait();
    assert_eq!(outs.len(), 10_000);
    assert!(outs.iter().all(|o| matches!(o, Err(Failure::Shutdown))));
    // after shutdown: refused at once
    assert!(matches!(
        h.request().consume(&res, 1).wait(),
        Err(Failure::Shutdown)
    ));
}

#[test]
fn thirty_percent_loss_on_two_servers() {
    let _serial = serial();
    let f = |seed| Faults {
        drop_in: 0.3,
        drop_out: 0.3,
        seed,
        ..Faults::default()
    };
    let a = responder(COOKIE, 1, f(1));
    let b = responder(COOKIE, 2, f(2));
    let policy = RequestPolicy::builder()
        .unit(ms(10))
        .replays(3)
        .build()
        .unwrap();
    let e = engine(COOKIE, vec![ep(&a), ep(&b)], policy);
    let h = e.handle();
    let res = resource("loss", u32::MAX);
    // bursts of 100: a larger burst overflows the responder's default receive buffer,
    // which would add loss beyond the 30 % under test
    let mut outs = Vec::new();
    for _ in 0..20 {
        outs.extend(
            h.submit_batch(
                (0..100)
                    .map(|_| h.request().consume(&res, 1).build())
                    .collect(),
            )
            .wait(),
        );
    }
    let granted = outs.iter().filter(|o| o.is_ok()).count();
    // per server per round: 0.7 * 0.7 = 0.49 success; 4 rounds x 2 servers: ~99.5 %
    // (about 10 of 2000 time out). Round 0 alone would grant 1 - 0.51^2 = 74 %. The bar
    // leaves room for one burst of 100 timed out by a stall of the host longer than H.
    let timeouts = outs
        .iter()
        .filter(|o| matches!(o, Err(Failure::Timeout { .. })))
        .count();
    let s = h.stats();
    assert!(
        granted >= 1850,
        "granted {granted} timeouts {timeouts} {:?} drops {:?}",
        s.decisions_by_round,
        s.drops
    );
    let s = h.stats();
    assert_eq!(s.completions, 2000);
    assert!(s.decisions_by_round[1] > 0, "replays decided some");
    e.shutdown();
}

#[test]
fn steering_under_thousand_concurrent_loses_nothing() {
    let _serial = serial();
    let r = responder(
        COOKIE,
        1,
        Faults {
            steer_every: 50,
            ..Faults::default()
        },
    );
    // A longer horizon (U 50 ms, 3 replays: H = 250 ms) so that a loaded CI machine still
    // decides every request of a 1000-request burst; what is under test is that steering
    // neither loses nor duplicates a completion.
    let policy = RequestPolicy::builder()
        .unit(Duration::from_millis(50))
        .replays(3)
        .build()
        .unwrap();
    let e = engine(COOKIE, vec![ep(&r)], policy);
    let h = e.handle();
    let res = resource("steer", u32::MAX);
    let mut total = 0;
    for _ in 0..5 {
        let outs = h
            .submit_batch(
                (0..1000)
                    .map(|_| h.request().consume(&res, 1).build())
                    .collect(),
            )
            .wait();
        assert_eq!(outs.len(), 1000, "every request of the burst completed");
        total += outs.iter().filter(|o| o.is_ok()).count();
    }
    let s = h.stats();
    assert_eq!(s.completions, 5000, "each request completed exactly once");
    // a stall of the host longer than H may time requests out; nothing else may fail
    assert_eq!(
        total as u64 + s.timeouts,
        5000,
        "granted {total}: {:?}",
        s.drops
    );
    assert!(total >= 2500, "granted {total} of 5000: {:?}", s.drops);
    assert!(s.steering_rebinds >= 1, "rebinds {}", s.steering_rebinds);
    assert_eq!(s.rebind_failures, 0);
    e.shutdown();
}

#[test]
fn responder_restarted_mid_run() {
    let _serial = serial();
    let r = responder(COOKIE, 1, Faults::default());
    let addr = r.addr();
    // H = 300 ms. With a 10 ms unit (H = 30 ms) a first request failed about one run
    // in 25 on a busy 2-CPU host, before and after the restart alike: the responder
    // received and answered both datagrams, and they arrived after the horizon (dropped
    // as `UnknownRequest` and `NotExpected`). Nothing was lost; the horizon was shorter
    // than a loaded host's scheduling delay. This test is about the restart, not latency.
    let policy = RequestPolicy::builder().unit(ms(100)).build().unwrap();
    let e = engine(COOKIE, vec![ep(&r)], policy);
    let h = e.handle();
    let res = resource("restart", u32::MAX);
    assert!(h.request().consume(&res, 1).wait().is_ok());
    r.stop();
    let out = h.request().consume(&res, 1).wait();
    assert!(out.is_err(), "{out:?}");
    // restart on the same address and id
    let mut cfg = rl_responder::ResponderConfig::new(vec![key(COOKIE)]);
    cfg.server_id = Some(1);
    cfg.listen = addr;
    let r2 = rl_responder::spawn(cfg).expect("restart on same port");
    let out = h.request().consume(&res, 1).wait();
    assert!(out.is_ok(), "{out:?}");
    e.shutdown();
    r2.stop();
}

#[cfg(feature = "dns")]
#[test]
fn dns_discovery_and_change_mid_run() {
    let _serial = serial();
    let a = responder(
        COOKIE,
        1 << 23,
        Faults {
            delay: ms(30),
            ..Faults::default()
        },
    );
    let b = responder(COOKIE, 2 << 23, Faults::default());
    let dns = rl_responder::dns::spawn_with(
        "t.example",
        vec![(a.server_id(), vec![a.addr()])],
        rl_responder::dns::DnsOptions {
            ttl_s: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let e = Engine::builder(key(COOKIE))
        .cores(Cores::Count(1))
        .dns(DnsConfig {
            domain: Some("t.example".into()),
            server: Some(dns.addr()),
        })
        .build()
        .unwrap();
    let h = e.handle();
    assert_eq!(h.endpoints().len(), 1);
    let res = resource("dns", u32::MAX);
    // in flight on the old snapshot (a answers after 30 ms)
    let inflight = h.request().consume(&res, 1).send();
    dns.set_servers(vec![(b.server_id(), vec![b.addr()])]);
    let out = inflight.wait().unwrap();
    assert_eq!(out.server_id, Some(a.server_id()), "kept its snapshot");
    // the refresh happens by the 1 s TTL: wait (bounded) for the new membership
    let deadline = Instant::now() + Duration::from_secs(5);
    while h.endpoints().first().map(|e| e.server_id) != Some(b.server_id()) {
        assert!(Instant::now() < deadline, "membership did not change");
        std::thread::sleep(ms(50));
    }
    let out = h.request().consume(&res, 1).wait().unwrap();
    assert_eq!(out.server_id, Some(b.server_id()));
    e.shutdown();
}

#[cfg(feature = "dns")]
#[test]
fn empty_membership_forces_a_throttled_refresh() {
    let _serial = serial();
    let r = responder(COOKIE, 3 << 23, Faults::default());
    // no servers at first, and a TTL far beyond the test: only forced refreshes (or the
    // retry after a failed one) can find the responder
    let dns = rl_responder::dns::spawn_with(
        "empty.example",
        Vec::new(),
        rl_responder::dns::DnsOptions {
            ttl_s: 300,
            ..Default::default()
        },
    )
    .unwrap();
    let e = Engine::builder(key(COOKIE))
        .cores(Cores::Count(1))
        .dns(DnsConfig {
            domain: Some("empty.example".into()),
            server: Some(dns.addr()),
        })
        .build()
        .unwrap();
    let h = e.handle();
    assert!(h.endpoints().is_empty());
    let res = resource("empty-dns", u32::MAX);
    let out = h.request().consume(&res, 1).wait();
    assert!(matches!(out, Err(Failure::Discovery(_))), "{out:?}");

    dns.set_servers(vec![(r.server_id(), vec![r.addr()])]);
    let t0 = Instant::now();
    let bound = Duration::from_secs(5);
    let mut granted = None;
    let mut failed = 0u32;
    // each failed request asks for a refresh: ten asks a second
    while t0.elapsed() < bound {
        match h.request().consume(&res, 1).wait() {
            Ok(o) if o.decision == Decision::Granted => {
                granted = Some(o);
                break;
            }
            Err(Failure::Discovery(_)) => failed += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
        std::thread::sleep(ms(100));
    }
    let elapsed = t0.elapsed();
    let granted = granted.expect("granted once the DNS serves the responder");
    assert_eq!(granted.server_id, Some(r.server_id()));
    assert_eq!(h.endpoints().len(), 1);
    // throttled: the initial resolution plus at most one attempt a second
    let attempts = h.discovery_refreshes() + h.discovery_refresh_failures();
    assert!(h.discovery_refreshes() >= 1);
    assert!(
        attempts <= elapsed.as_secs() + 2,
        "{attempts} DNS attempts in {elapsed:?} ({failed} discovery failures)"
    );
    e.shutdown();
    dns.stop();
    r.stop();
}

#[test]
fn flush_reports_sends_pending_reports_at_once() {
    let _serial = serial();
    let a = responder(COOKIE, 4 << 23, Faults::default());
    let b = responder(COOKIE, 5 << 23, Faults::default());
    // a flush interval far beyond the test: only flush_reports sends
    let e = Engine::builder(key(COOKIE))
        .cores(Cores::Count(1))
        .endpoints(vec![ep(&a), ep(&b)])
        .report_interval(Duration::from_secs(10))
        .build()
        .unwrap();
    let h = e.handle();
    let t = tracker("flush");
    for i in 0..3 {
        h.report(&t, ms(10 + i)).unwrap();
    }
    let s = h.flush_reports();
    assert_eq!(s.report_entries, 3);
    assert_eq!(s.report_datagrams, 2, "one batch to each endpoint");
    assert_eq!(s.report_failures, 0);
    // nothing pending: a second flush sends nothing
    assert_eq!(h.flush_reports().report_datagrams, 2);
    for r in [&a, &b] {
        let end = Instant::now() + Duration::from_secs(2);
        while r.counters().report_entries < 3 && Instant::now() < end {
            std::thread::sleep(ms(10));
        }
        let c = r.counters();
        assert_eq!((c.reports, c.report_entries), (1, 3));
    }
    e.shutdown();
}
