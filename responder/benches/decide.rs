//! Decisions per second per core through the sans-IO logic (AES, one resource).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratelimitly_engine::proto::key::ApiKey;
use rl_responder::decide::{Capacities, Responder};
use rl_responder::frame::{KeyAuth, Tenant};

use rl_testkit::keys::{AES as AES_KEY, NONE as NONE_KEY};

fn request(key: &ApiKey, n: u64) -> Vec<u8> {
    request_at(key, n, 0)
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A request stamped `timestamp_ms` (the runner drops stale ones: docs/protocol.md §8).
fn request_at(key: &ApiKey, n: u64, timestamp_ms: u64) -> Vec<u8> {
    // one resource "bench" 1000 ms / 2^32-1 tokens, 1 token, dedup ttl 60 ms
    let mut pdu = vec![0x52, 0x54, 40, 0, 60, 0, 0, 0, 0, 0, 1, 0];
    pdu.extend_from_slice(&[0xBE; 16]);
    pdu.extend_from_slice(&1000u32.to_le_bytes());
    pdu.extend_from_slice(&u32::MAX.to_le_bytes());
    pdu.extend_from_slice(&[1, 0, 0, 0]);
    let auth = KeyAuth::new(key);
    let mut out = vec![0u8; 1200];
    let off = auth.pdu_offset();
    out[off..off + pdu.len()].copy_from_slice(&pdu);
    let mut uid = [0u8; 16];
    uid[..8].copy_from_slice(&n.to_le_bytes());
    let t = Tenant {
        id: key.key_id(),
        unique_id: uid,
        timestamp_ms,
        steering: 0,
    };
    let len = auth.seal(&t, [7; 12], &mut out, pdu.len()).unwrap();
    out.truncate(len);
    out
}

fn bench(c: &mut Criterion) {
    let src: SocketAddr = "127.0.0.1:9".parse().unwrap();
    for (name, key) in [("aes", AES_KEY), ("none", NONE_KEY)] {
        let key: ApiKey = key.parse().unwrap();
        let t0 = Instant::now();
        let mut r = Responder::new(
            std::slice::from_ref(&key),
            1 << 23,
            Capacities::default(),
            t0,
        )
        .unwrap();
        // a pool of distinct requests (fresh decisions, not dedup hits)
        let pool: Vec<Vec<u8>> = (0..4096).map(|i| request(&key, i)).collect();
        let mut g = c.benchmark_group("decide");
        g.throughput(Throughput::Elements(1));
        g.measurement_time(Duration::from_secs(3));
        let mut i = 0usize;
        let mut now = t0;
        let mut dg = vec![0u8; 1200];
        let mut out = [0u8; 1300];
        g.bench_function(format!("fresh_decision_{name}"), |b| {
            b.iter(|| {
                let src_dg = &pool[i % pool.len()];
                i += 1;
                if i.is_multiple_of(pool.len()) {
                    now += Duration::from_millis(100); // past the dedup ttl: fresh again
                }
                let d = &mut dg[..src_dg.len()];
                d.copy_from_slice(src_dg);
                r.handle(d, src, now, &mut out).unwrap()
            })
        });
        g.finish();
    }
}

/// Through the runner on loopback: one std client socket keeps 32 requests in flight
/// (send 32, receive 32) against a 1-core responder; exercises the runner's UDP driver
/// (io_uring multishot receive, GSO replies to the one client).
fn loopback(c: &mut Criterion) {
    let key: ApiKey = AES_KEY.parse().unwrap();
    let h = rl_responder::spawn(rl_responder::ResponderConfig::new(vec![key.clone()])).unwrap();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // re-stamped every 500 ms: the runner drops requests older than their 60 ms dedup
    // TTL plus 1 s of grace
    let fresh = || -> Vec<Vec<u8>> {
        (0..32)
            .map(|i| request_at(&key, 1_000_000 + i, unix_ms()))
            .collect()
    };
    let mut pool = fresh();
    let mut made = Instant::now();
    let mut g = c.benchmark_group("runner");
    g.throughput(Throughput::Elements(32));
    g.measurement_time(Duration::from_secs(3));
    let mut buf = [0u8; 2048];
    let mut lost = 0u64;
    g.bench_function("loopback_aes_32_in_flight", |b| {
        b.iter(|| {
            if made.elapsed() > Duration::from_millis(500) {
                pool = fresh();
                made = Instant::now();
            }
            for d in &pool {
                s.send_to(d, h.addr()).unwrap();
            }
            for _ in 0..pool.len() {
                if s.recv(&mut buf).is_err() {
                    lost += 1;
                }
            }
        })
    });
    g.finish();
    eprintln!(
        "runner: {lost} responses not received within 200 ms; {:?}",
        h.counters()
    );
    h.stop();
}

criterion_group!(benches, bench, loopback);
criterion_main!(benches);
