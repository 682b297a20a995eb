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
//! * `loopback_echo_128`: 128 datagrams of 112 bytes client -> echo -> client on one
//!   thread, glommio 0.9 `UdpSocket` (`send_to`/`recv_from`, one datagram per await)
//!   versus the engine's raw non-blocking `sendmmsg`/`recvmmsg` path (`engine::io`), see
//!   DataDog/glommio#672.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratelimitly_engine::engine::io::{RecvBatch, SendBatch, UdpIo};
use ratelimitly_engine::engine::{Cores, Engine, EngineHandle};
use ratelimitly_engine::ids::Resource;
use ratelimitly_engine::key::ApiKey;
use ratelimitly_engine::machine::Endpoint;
use ratelimitly_engine::wire::Auth;
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
            // let the core park (its spin is 20 us) before each probe
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

const ECHO_N: usize = 128;
const ECHO_LEN: usize = 112;

fn raw_echo(a: &UdpIo, b: &UdpIo, rb: &mut RecvBatch, sb: &mut SendBatch) {
    let payload = [7u8; ECHO_LEN];
    for i in 0..ECHO_N {
        sb.push(&payload, b.local_addr(), i as u64);
        if sb.is_full() {
            a.send_batch(sb, |_| {});
        }
    }
    a.send_batch(sb, |_| {});
    let mut echoed = 0;
    let mut spins = 0;
    while echoed < ECHO_N && spins < 1_000_000 {
        let n = b.recv_batch(rb).unwrap();
        spins += 1;
        for k in 0..n {
            let from = rb.source(k).unwrap();
            let d = rb.datagram(k).unwrap();
            sb.push(d, from, k as u64);
        }
        b.send_batch(sb, |_| {});
        echoed += n;
    }
    let mut back = 0;
    spins = 0;
    while back < ECHO_N && spins < 1_000_000 {
        back += a.recv_batch(rb).unwrap();
        spins += 1;
    }
    assert_eq!(back, ECHO_N);
}

async fn glommio_echo(a: &glommio::net::UdpSocket, b: &glommio::net::UdpSocket, to_b: SocketAddr) {
    let payload = [7u8; ECHO_LEN];
    let mut buf = [0u8; 2048];
    for _ in 0..ECHO_N {
        a.send_to(&payload, to_b).await.unwrap();
    }
    for _ in 0..ECHO_N {
        let (n, from) = b.recv_from(&mut buf).await.unwrap();
        b.send_to(&buf[..n], from).await.unwrap();
    }
    for _ in 0..ECHO_N {
        a.recv_from(&mut buf).await.unwrap();
    }
}

fn loopback_echo(c: &mut Criterion) {
    let mut g = c.benchmark_group("loopback_echo_128");
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(20);
    g.throughput(Throughput::Elements(ECHO_N as u64));
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    {
        let a = UdpIo::bind(any, 4 << 20, 4 << 20).unwrap();
        let b = UdpIo::bind(any, 4 << 20, 4 << 20).unwrap();
        let mut rb = RecvBatch::new(64);
        let mut sb = SendBatch::new(64);
        g.bench_function("engine_raw_mmsg", |bn| {
            bn.iter(|| raw_echo(&a, &b, &mut rb, &mut sb))
        });
    }
    let ex = glommio::LocalExecutorBuilder::default()
        .io_memory(128 << 10)
        .make()
        .unwrap();
    g.bench_function("glommio_udpsocket", |bn| {
        bn.iter_custom(|iters| {
            ex.run(async move {
                let a = glommio::net::UdpSocket::bind(any).unwrap();
                let b = glommio::net::UdpSocket::bind(any).unwrap();
                for s in [&a, &b] {
                    let fd = std::os::fd::AsRawFd::as_raw_fd(s);
                    // SAFETY: the socket outlives this borrow of its descriptor.
                    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
                    let r = socket2::SockRef::from(&fd);
                    let _ = r.set_recv_buffer_size(4 << 20);
                    let _ = r.set_send_buffer_size(4 << 20);
                }
                let to_b = b.local_addr().unwrap();
                let t = Instant::now();
                for _ in 0..iters {
                    glommio_echo(&a, &b, to_b).await;
                }
                t.elapsed()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, submit_to_send, loopback_echo, engine_one_core);
criterion_main!(benches);
