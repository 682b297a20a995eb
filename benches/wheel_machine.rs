//! Sans-IO benches on virtual time: the request machine (`Delivery`, as the engine's core
//! state drives it) through a full decision,
//! and the engine's timer wheel (insert / cancel / expire with 100k pending).
//!
//! Owns nothing but measurements; touches no socket and reads the clock only to
//! pick a virtual origin. Run: `cargo bench --bench wheel_machine`.

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ratelimitly_engine::engine::core::TimerWheel;
use ratelimitly_engine::proto::machine::{Delivery, Endpoint, Plan, Snapshot};
use ratelimitly_engine::proto::outcome::{GuardResult, ResourceResult, Response};
use ratelimitly_engine::proto::policy::RequestPolicy;

fn snapshot(n: usize) -> Snapshot {
    let v: Vec<Endpoint> = (0..n)
        .map(|i| Endpoint {
            server_id: 1000 + i as u64,
            addr: SocketAddr::from(([127, 0, 0, 1], 9000 + i as u16)),
        })
        .collect();
    Arc::from(v)
}

fn machine(c: &mut Criterion) {
    let plan = Plan::new(&RequestPolicy::default());
    let snap = snapshot(2);
    let t0 = Instant::now();
    let result = ResourceResult {
        bucket_id: [7; 16],
        window_ms: 60_000,
        actual_rate: 1,
        deficit: 0,
    };
    let mut g = c.benchmark_group("machine");
    g.throughput(Throughput::Elements(1));
    // Oldest server answers first: round 0 sends, selection, completion delivery, outcome.
    g.bench_function("decision_oldest_first_2_servers", |b| {
        b.iter(|| {
            let mut m = Delivery::new(&plan, Arc::clone(&snap), t0).expect("machine");
            let mut sends = 0;
            while let Some(t) = m.poll_transmit() {
                sends += t.endpoint + 1;
            }
            let now = t0 + Duration::from_micros(50);
            let held = respond(&mut m, &plan, now, 1000, result);
            while let Some(t) = m.poll_transmit() {
                sends += t.endpoint;
            }
            black_box(sends);
            black_box((m.poll_outcome(&plan), held))
        })
    });
    // Younger server answers in round 0, the oldest is dead: retained until the round ends.
    g.bench_function("decision_dead_oldest_round0_timeout", |b| {
        b.iter(|| {
            let mut m = Delivery::new(&plan, Arc::clone(&snap), t0).expect("machine");
            while m.poll_transmit().is_some() {}
            let held = respond(&mut m, &plan, t0 + Duration::from_micros(50), 1001, result);
            if let Some(d) = m.poll_timeout() {
                m.handle_timeout(&plan, d);
            }
            while m.poll_transmit().is_some() {}
            black_box((m.poll_outcome(&plan), held))
        })
    });
    // Nobody answers: round 0, one replay round, final phase, timeout.
    g.bench_function("timeout_full_horizon", |b| {
        b.iter(|| {
            let mut m = Delivery::new(&plan, Arc::clone(&snap), t0).expect("machine");
            let mut guard = 0;
            loop {
                while m.poll_transmit().is_some() {}
                if let Some(o) = m.poll_outcome(&plan) {
                    break black_box(o);
                }
                match m.poll_timeout() {
                    Some(d) => m.handle_timeout(&plan, d),
                    None => guard += 1,
                }
                assert!(guard < 4, "machine stalled");
            }
        })
    });
    g.finish();
}

/// A response from `server` at `now`, as the engine's core handles it: the machine's
/// verdict, and the response built when the verdict keeps it.
fn respond(
    m: &mut Delivery,
    plan: &Plan,
    now: Instant,
    server: u64,
    result: ResourceResult,
) -> Option<Response> {
    let v = m.handle_results(plan, now, server, 1).ok()?;
    v.keeps_response().then(|| {
        Response::from_results(
            server,
            1,
            v.phase,
            std::iter::empty::<GuardResult>(),
            [result],
        )
    })
}

fn wheel(c: &mut Criterion) {
    const PENDING: usize = 100_000;
    let origin = Instant::now();
    let tick = Duration::from_millis(1);
    let mut g = c.benchmark_group("wheel_100k_pending");
    g.throughput(Throughput::Elements(1));

    // Steady state: 100k timers spread over the next 60 ms (the default horizon);
    // insert one then cancel it.
    let mut w: TimerWheel<u32> = TimerWheel::new(origin, tick, 4096, PENDING + 16);
    for i in 0..PENDING {
        w.insert(
            origin + Duration::from_micros((i as u64 * 613) % 60_000 + 1),
            i as u32,
        );
    }
    let mut k: u64 = 0;
    g.bench_function("insert_then_cancel", |b| {
        b.iter(|| {
            k = k.wrapping_add(7919);
            let h = w.insert(origin + Duration::from_micros(k % 60_000 + 1), 1);
            black_box(w.cancel(h))
        })
    });
    assert_eq!(w.len(), PENDING);

    g.throughput(Throughput::Elements(PENDING as u64));
    // Expire: 100k pending; advance one 1 ms tick (≈1/60 of them fire), re-arm
    // the fired ones 60 ms later so the population stays at 100k.
    g.bench_function("expire_1ms_tick_reinsert", |b| {
        b.iter_batched_ref(
            || {
                let mut w: TimerWheel<u32> = TimerWheel::new(origin, tick, 4096, PENDING + 16);
                for i in 0..PENDING {
                    w.insert(
                        origin + Duration::from_micros((i as u64 * 613) % 60_000 + 1),
                        i as u32,
                    );
                }
                (w, 0u64)
            },
            |(w, now_ms)| {
                for _ in 0..60 {
                    *now_ms += 1;
                    let now = origin + Duration::from_millis(*now_ms);
                    let mut fired = Vec::with_capacity(2048);
                    w.expire(now, |v| fired.push(v));
                    for v in fired {
                        w.insert(now + Duration::from_millis(60), v);
                    }
                }
                black_box(w.len())
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

criterion_group!(benches, machine, wheel);
criterion_main!(benches);
