//! Zero heap allocations per request in steady state on the engine path.
//!
//! A counting `#[global_allocator]` (this test binary only) counts every allocation in
//! the process. The peer is a minimal non-allocating responder on a std socket in this
//! process (the embedded rl-responder allocates per datagram for its own bookkeeping,
//! which would hide the engine's number). Also reports memory per in-flight request.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratelimitly_engine::engine::{Cores, Engine, EngineBuilder, EngineHandle};
use ratelimitly_engine::proto::ids::Resource;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::Endpoint;
use ratelimitly_engine::proto::outcome::Decision;
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::Auth;

#[path = "engine_common/grant_peer.rs"]
mod grant_peer;

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

use rl_testkit::keys::COOKIE;

fn run(h: &EngineHandle, res: &Resource, n: usize) {
    for _ in 0..n {
        let o = h.request().consume(res, 1).wait().expect("decided");
        assert_eq!(o.decision, Decision::Granted);
    }
}

/// The two tests count allocations of the whole process: one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A non-allocating granting peer on a thread, and an engine builder aimed at it; set
/// the flag to stop the peer.
fn with_peer() -> (EngineBuilder, Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let key: ApiKey = COOKIE.parse().unwrap();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = sock.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let auth = Auth::new(&key);
    let st = stop.clone();
    let peer = std::thread::spawn(move || grant_peer::grant_all(auth, sock, 42, st, |_, _| {}));
    let builder = Engine::builder(key)
        .cores(Cores::Count(1))
        .endpoints(vec![Endpoint {
            server_id: 42,
            addr,
        }])
        .in_flight_per_core(4096)
        // U = 100 ms (H = 300 ms, the fixture key's dedup limit): these tests count
        // allocations, not time; at the default 60 ms horizon one of 7,000 sequential
        // requests timed out now and then on a loaded 2-core host (1 in 10 runs beside two
        // busy loops), and `expect("decided")` failed the suite.
        .policy(
            RequestPolicy::builder()
                .unit(Duration::from_millis(100))
                .build()
                .unwrap(),
        );
    (builder, stop, peer)
}

#[test]
fn zero_allocations_per_request_in_steady_state() {
    let _serial = serial();
    let (builder, stop, peer) = with_peer();
    let e = builder.build().unwrap();
    let h = e.handle();
    let res = Resource::new("alloc", Duration::from_secs(60), 1_000_000).unwrap();
    run(&h, &res, 2000); // warm up: pools, histograms, thread-locals
    let before = ALLOCS.load(Ordering::SeqCst);
    const N: usize = 5000;
    run(&h, &res, N);
    let allocs = ALLOCS.load(Ordering::SeqCst) - before;
    let per_req = allocs as f64 / N as f64;
    println!("allocations during {N} requests: {allocs} ({per_req:.4} per request)");
    println!(
        "memory per in-flight request (slab entry): {} bytes",
        EngineHandle::entry_size()
    );
    println!(
        "memory per in-flight request, every structure: {} bytes",
        EngineHandle::bytes_per_in_flight()
    );
    // A per-request allocation would show as >= N. Measured: 0 (the core thread is a
    // plain pinned thread on the udp layer; statistics are published by copying into
    // preallocated histograms). A margin of 2 allows for a one-time growth of a
    // scratch vector on a slow machine.
    assert!(allocs <= 2, "{allocs} allocations for {N} requests");
    assert!(
        EngineHandle::entry_size() <= 256,
        "{} bytes per in-flight request",
        EngineHandle::entry_size()
    );
    stop.store(true, Ordering::Relaxed);
    e.shutdown();
    peer.join().unwrap();
}

/// The same with the core hosted on a Tokio runtime (`EngineBuilder::runtime`): the
/// requests are awaited one after another inside one task, so neither the core's task
/// (reactor readiness, its timer, its wake-ups) nor the caller's may allocate.
#[test]
fn zero_allocations_per_request_with_a_hosted_core() {
    let _serial = serial();
    let (builder, stop, peer) = with_peer();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let e = builder.runtime(rt.handle().clone()).build().unwrap();
    let h = e.handle();
    const N: usize = 5000;
    let allocs = rt.block_on(async move {
        let res = Resource::new("alloc", Duration::from_secs(60), 1_000_000).unwrap();
        let run = async |n: usize| {
            for _ in 0..n {
                let o = h.request().consume(&res, 1).send().await.expect("decided");
                assert_eq!(o.decision, Decision::Granted);
            }
        };
        run(2000).await; // warm up
        let before = ALLOCS.load(Ordering::SeqCst);
        run(N).await;
        ALLOCS.load(Ordering::SeqCst) - before
    });
    println!("hosted core: allocations during {N} requests: {allocs}");
    assert!(allocs <= 2, "{allocs} allocations for {N} requests");
    stop.store(true, Ordering::Relaxed);
    e.shutdown();
    drop(rt);
    peer.join().unwrap();
}
