//! Engine measurements on loopback (run: `cargo bench -p ratelimitly-engine --bench
//! engine_submit`; each group runs ~2 s with 10-20 samples).
//!
//! * `engine_one_core`: submit-to-completion through ONE engine core against an embedded
//!   responder (rl_responder, cookie key, no faults). `single_wait`: one request at a time
//!   (the core parks between requests: includes the eventfd wake-up). `batch_256`: 256
//!   requests per submit_batch (busy core; throughput in elements/s = decisions/s).
//! * `submit_to_send`: time from just before `send()` to the arrival of the request's
//!   first datagram at a raw std UDP socket acting as the server (blocking `recv_from`,
//!   so the probe server's own wake-up is included). `parked`: the core is idle and
//!   parked; `busy`: a background thread keeps batches of 64 requests in flight on the
//!   same core while the probe is measured.

use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratelimitly_engine::engine::{Cores, Engine, EngineHandle};
use ratelimitly_engine::proto::ids::Resource;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::Endpoint;
use ratelimitly_engine::proto::wire::Auth;
use rl_responder::ResponderConfig;

#[path = "../tests/engine_common/grant_peer.rs"]
mod grant_peer;

use rl_testkit::keys::COOKIE;

fn engine_one_core(c: &mut Criterion) {
    let key: ApiKey = COOKIE.parse().unwrap();
    let mut cfg = ResponderConfig::new(vec![key.clone()]);
    cfg.server_id = Some(1);
    let r = rl_responder::spawn(cfg).unwrap();
    let e = Engine::builder(key)
        .cores(Cores::Count(1))
        .endpoints(vec![Endpoint {
            server_id: 1,
            addr: r.addr(),
        }])
        .build()
        .unwrap();
    let h = e.handle();
    let res = Resource::new("bench", Duration::from_secs(1), u32::MAX).unwrap();
    let mut g = c.benchmark_group("engine_one_core");
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(20);
    g.throughput(Throughput::Elements(1));
    g.bench_function("single_wait", |b| {
        b.iter(|| h.request().consume(&res, 1).wait().unwrap())
    });
    g.throughput(Throughput::Elements(256));
    g.bench_function("batch_256", |b| {
        b.iter(|| {
            let reqs = (0..256)
                .map(|_| h.request().consume(&res, 1).build())
                .collect();
            let outs = h.submit_batch(reqs).wait();
            assert!(outs.iter().all(|o| o.is_ok()));
        })
    });
    g.finish();
    let s = h.stats();
    eprintln!(
        "decisions {} p50 {} us p99 {} us p99.9 {} us; drops {}",
        s.decisions(),
        s.latency_us.value_at_quantile(0.5),
        s.latency_us.value_at_quantile(0.99),
        s.latency_us.value_at_quantile(0.999),
        s.total_drops()
    );
    e.shutdown();
}

/// Total submit-to-arrival time of `iters` probe requests.
fn probe(
    h: &EngineHandle,
    res: &Resource,
    arrivals: &crossbeam_channel::Receiver<Instant>,
    iters: u64,
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let t0 = Instant::now();
        let c = h.request().consume(res, 1).send();
        let at = arrivals
            .recv_timeout(Duration::from_secs(1))
            .expect("probe arrived");
        total += at.saturating_duration_since(t0);
        let _ = c.wait();
    }
    total
}

fn submit_to_send(c: &mut Criterion) {
    let key: ApiKey = COOKIE.parse().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let probe_res = Resource::new("probe", Duration::from_secs(1), u32::MAX).unwrap();
    let load_res = Resource::new("load", Duration::from_secs(1), u32::MAX).unwrap();
    let (tx, rx) = crossbeam_channel::bounded(1024);
    let stop = Arc::new(AtomicBool::new(false));
    let (auth, st, id) = (Auth::new(&key), stop.clone(), probe_res.id());
    let server = std::thread::spawn(move || {
        grant_peer::grant_all(auth, sock, 1, st, |at, bucket| {
            if bucket == id {
                let _ = tx.try_send(at);
            }
        })
    });
    let e = Engine::builder(key)
        .cores(Cores::Count(1))
        .endpoints(vec![Endpoint { server_id: 1, addr }])
        .build()
        .unwrap();
    let h = e.handle();
    let mut g = c.benchmark_group("submit_to_send");
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(20);
    g.bench_function("parked", |b| {
        b.iter_custom(|iters| {
            // let the core park before each probe
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                std::thread::sleep(Duration::from_micros(200));
                total += probe(&h, &probe_res, &rx, 1);
            }
            total
        })
    });
    let busy = Arc::new(AtomicBool::new(true));
    let load = {
        let (h, busy, res) = (h.clone(), busy.clone(), load_res.clone());
        std::thread::spawn(move || {
            while busy.load(Ordering::Relaxed) {
                let reqs = (0..64)
                    .map(|_| h.request().consume(&res, 1).build())
                    .collect();
                let _ = h.submit_batch(reqs).wait();
            }
        })
    };
    g.bench_function("busy", |b| {
        b.iter_custom(|iters| probe(&h, &probe_res, &rx, iters))
    });
    busy.store(false, Ordering::Relaxed);
    load.join().unwrap();
    g.finish();
    e.shutdown();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}

criterion_group!(benches, submit_to_send, engine_one_core);
criterion_main!(benches);
