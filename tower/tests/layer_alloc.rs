//! What the layer allocates per admitted request, on the calling thread.
//!
//! A counting `#[global_allocator]` (this test binary only) counts the allocations of
//! the thread that marks itself: the test's, which calls the layer and polls its future
//! on a current-thread runtime. The engine core runs pinned on a thread of its own and
//! the responder on its own threads, so neither is counted (the engine's own zero per
//! request is `tests/engine_alloc.rs`'s).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Empty;
use ratelimitly_tower::{AdmissionLayer, ClientAddr, KeyBy, Limit, keyed};
use rl_responder::Faults;
use tower::{Layer, Service, ServiceExt};

mod common;
use common::{engine, responder};

struct Counting;

thread_local! {
    /// Allocations of this thread while counting; `None` when not counting.
    static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
}

fn count_one() {
    // `try_with`: the allocator runs during thread teardown too
    let _ = COUNT.try_with(|c| {
        if let Some(n) = c.get() {
            c.set(Some(n + 1));
        }
    });
}

// SAFETY: every call forwards to `System` with the caller's arguments unchanged; the
// counter is a thread-local `Cell` with a const initialiser (no allocation, no
// destructor), so counting cannot re-enter the allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count_one();
        // SAFETY: the caller's contract for `GlobalAlloc::alloc`, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System` through this allocator with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        count_one();
        // SAFETY: as `dealloc`, and the caller's contract for `realloc`.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Most allocations per admitted request: the boxed response future, the `RateLimit`
/// field's value (the `RateLimit-Policy` value is the service's cached one), and the
/// response's header map growing for the two fields (its index and its entries). The
/// layer before this test (HEAD 657d8f8) made 18.
const MOST_PER_REQUEST: u64 = 4;

#[test]
fn an_admitted_request_allocates_only_its_future_and_a_field() {
    let r = responder(1, Faults::default());
    let engine = engine(&r);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let limit = Limit::new(4_000_000_000, std::time::Duration::from_secs(1)).unwrap();
    let layer = AdmissionLayer::new(engine, keyed(limit, KeyBy::ClientIp));
    let inner = tower::service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
    });
    let mut svc = layer.layer(inner);
    let peer: SocketAddr = "10.0.0.7:4000".parse().unwrap();
    let request = || {
        let mut req = Request::new(Empty::<Bytes>::new());
        req.extensions_mut().insert(ClientAddr(peer));
        req
    };
    let mut one = |count: bool| {
        let req = request();
        rt.block_on(async {
            let svc = svc.ready().await.unwrap();
            if count {
                COUNT.with(|c| c.set(Some(0)));
            }
            let resp = svc.call(req).await.unwrap();
            let n = COUNT.with(|c| c.take()).unwrap_or(0);
            assert!(resp.status().is_success());
            assert!(resp.headers().contains_key("ratelimit"));
            n
        })
    };
    // warm-up: the bucket cache, the engine's first exchanges, the runtime's buffers
    for _ in 0..200 {
        one(false);
    }
    const N: u64 = 500;
    let total: u64 = (0..N).map(|_| one(true)).sum();
    let per = total as f64 / N as f64;
    println!("allocations per admitted request on the caller's thread: {per:.2}");
    assert!(
        total <= MOST_PER_REQUEST * N,
        "{per:.2} allocations per request, more than {MOST_PER_REQUEST}"
    );
}
