//! Shared helpers of the engine integration tests (keys, responders, engines).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::engine::{Cores, Engine};
use ratelimitly_engine::ids::{LatencyTracker, Resource};
use ratelimitly_engine::key::ApiKey;
use ratelimitly_engine::machine::Endpoint;
use ratelimitly_engine::policy::RequestPolicy;
use rl_responder::{Faults, ResponderConfig, ResponderHandle};

pub const COOKIE: &str =
    "rl-cookie1qypqqqqqqqqqqqqzqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqgpqyqszqfgrrulczhg30p";
pub const AES: &str =
    "rl-aes1qypsqqqqqqqqqqqrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqvpsxqcrqdgrrulcvcn0x5";
pub const NONE: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";

pub fn key(s: &str) -> ApiKey {
    s.parse().expect("valid key")
}

/// A responder on 127.0.0.1 with `server_id` and `faults`.
pub fn responder(k: &str, server_id: u64, faults: Faults) -> ResponderHandle {
    let mut cfg = ResponderConfig::new(vec![key(k)]);
    cfg.server_id = Some(server_id);
    cfg.faults = faults;
    rl_responder::spawn(cfg).expect("responder starts")
}

pub fn ep(r: &ResponderHandle) -> Endpoint {
    Endpoint {
        server_id: r.server_id(),
        addr: r.addr(),
    }
}

pub fn engine(k: &str, eps: Vec<Endpoint>, policy: RequestPolicy) -> Engine {
    Engine::builder(key(k))
        .cores(Cores::Count(1))
        .policy(policy)
        .endpoints(eps)
        .socket_buffers(1 << 20, 1 << 20)
        .in_flight_per_core(32_768)
        .build()
        .expect("engine builds")
}

pub fn resource(name: &str, limit: u32) -> Resource {
    Resource::new(name, Duration::from_secs(60), limit).unwrap()
}

pub fn tracker(name: &str) -> LatencyTracker {
    LatencyTracker::new(name, Duration::from_secs(60), 100, 1).unwrap()
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn dead_addr() -> SocketAddr {
    // a bound socket that never answers
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let a = s.local_addr().unwrap();
    std::mem::forget(s);
    a
}

/// Runs the tests of one binary one at a time: each starts engines and responders that
/// use both cores of a CI machine, and running them together only measures contention.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
