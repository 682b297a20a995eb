//! Submit-to-completion latency and decision throughput through ONE engine core on
//! loopback against an embedded responder (rl_responder, cookie key, no faults).
//!
//! `single_wait`: one request at a time (the core parks between requests: includes the
//! eventfd wake-up). `batch_256`: 256 requests per submit_batch (busy core; criterion
//! reports time per batch, throughput in elements/s = decisions/s).

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratelimitly_engine::engine::{Cores, Engine};
use ratelimitly_engine::ids::Resource;
use ratelimitly_engine::key::ApiKey;
use ratelimitly_engine::machine::Endpoint;
use rl_responder::ResponderConfig;

const COOKIE: &str =
    "rl-cookie1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqfgrrulczhg30p";

fn bench(c: &mut Criterion) {
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
    g.measurement_time(Duration::from_secs(5));
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

criterion_group!(benches, bench);
criterion_main!(benches);
