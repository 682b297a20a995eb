//! A minimal peer for engine measurements: a std UDP socket that grants every rate
//! request, without allocating (so a counting allocator sees only the engine), and
//! reports each request's arrival instant and first bucket id to an observer.
//! Shared by `tests/engine_alloc.rs` and `benches/engine_submit.rs`.

use std::net::UdpSocket;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimitly_engine::proto::wire::{
    self, Auth, RateRequestView, ResourceResultSpec, TenantFields, encode_rate_response_pdu,
};

/// Answers every rate request on `sock` with a grant from `server_id` (its first resource
/// echoed with deficit 0) until `stop`; calls `observe(arrival, bucket id)` first.
pub fn grant_all(
    auth: Auth,
    sock: UdpSocket,
    server_id: u64,
    stop: Arc<AtomicBool>,
    mut observe: impl FnMut(Instant, [u8; 16]),
) {
    let mut buf = [0u8; 2048];
    let mut out = [0u8; 1200];
    sock.set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, from)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let at = Instant::now();
        let Ok(o) = wire::open(&auth, &mut buf[..n]) else {
            continue;
        };
        let Ok(req) = RateRequestView::parse(o.pdu) else {
            continue;
        };
        let Some(r) = req.resources().next() else {
            continue;
        };
        observe(at, r.bucket_id());
        let res = [ResourceResultSpec {
            bucket_id: r.bucket_id(),
            window_ms: r.window_ms(),
            actual_rate: 0,
            deficit: 0,
        }];
        let p = auth.pdu_offset();
        let Ok(len) = encode_rate_response_pdu(&mut out[p..], &[], &res) else {
            continue;
        };
        let t = TenantFields {
            id: server_id,
            unique_id: o.tenant.unique_id(),
            timestamp_ms: 0,
            steering: 1,
        };
        if let Ok(total) = wire::seal(&auth, &t, [0; 12], &mut out, len) {
            let _ = sock.send_to(&out[..total], from);
        }
    }
}
