//! Stateful fuzz target: the engine core's datagram handling with live requests in
//! flight. The input is a little program: each byte pair is an operation (submit
//! requests, advance virtual time, a datagram built from fuzz bytes with the unique id
//! of a live request spliced in so routing passes, a raw datagram, a send failure of a
//! handed-out transmit). The core runs on virtual time in "none" auth mode, so fuzz
//! bytes reach the response parser and the request machine. Must never panic, and
//! every submitted request must end exactly once (its outcome taken as data with
//! `poll_outcome`) by the end of the shutdown.
#![no_main]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use ratelimitly_engine::engine::core::{CoreConfig, CoreState, SocketOp, TransmitSink};
use ratelimitly_engine::proto::ids::Resource;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::Endpoint;
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::{self, ResourceSpec};
use ratelimitly_engine::udp::SocketId;

/// Public test-fixture key (never a real credential).
const NONE_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";

struct Sink(Vec<(Vec<u8>, u64)>);

impl TransmitSink for Sink {
    fn transmit(&mut self, _sock: SocketId, _to: SocketAddr, datagram: &[u8], tag: u64) {
        if self.0.len() < 4096 {
            self.0.push((datagram.to_vec(), tag));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let key: ApiKey = NONE_KEY.parse().expect("fixture key");
    let eps = vec![
        Endpoint {
            server_id: 1 << 23,
            addr: "127.0.0.1:7000".parse().unwrap(),
        },
        Endpoint {
            server_id: 2 << 23,
            addr: "127.0.0.1:7001".parse().unwrap(),
        },
    ];
    let t0 = Instant::now();
    let mut seed = 7u8;
    let entropy = Box::new(move |b: &mut [u8]| {
        for x in b.iter_mut() {
            seed = seed.wrapping_mul(31).wrapping_add(17);
            *x = seed;
        }
        Ok(())
    });
    let policy = RequestPolicy::default();
    let mut cfg = CoreConfig::new(0, &key, policy.clone()).expect("default policy");
    cfg.in_flight = 64;
    cfg.max_sockets = 4;
    let snapshot: Arc<[Endpoint]> = Arc::from(eps);
    let mut state =
        CoreState::new(cfg, snapshot, t0, SocketId::from_raw(0), 50_000, entropy).expect("state");
    let core = &mut state;
    let res = Resource::new("fuzz", Duration::from_secs(60), 100).expect("resource");
    let spec = ResourceSpec {
        bucket_id: res.id(),
        window_ms: res.window_ms(),
        rate_limit: res.rate_limit(),
        tokens: 1,
    };
    let mut pdu = [0u8; 256];
    let pdu_len = wire::encode_rate_request_pdu(&mut pdu, policy.horizon_ms(), &[], &[spec], "")
        .expect("request encodes");
    let mut sink = Sink(Vec::new());
    // slots submitted and not ended; at most 128 at once, as a small slot pool allows
    let mut pending: Vec<u32> = Vec::new();
    let mut next_slot = 0u32;
    let mut now = t0;
    let mut next_sock = 1u32;
    let mut ops = data.chunks(2);
    while let Some(op) = ops.next() {
        let (code, arg) = (op[0] % 6, *op.get(1).unwrap_or(&0) as usize);
        match code {
            0 => {
                for _ in 0..=(arg % 4) {
                    // as an engine core takes a request from its queue
                    if pending.len() >= 128 {
                        break;
                    }
                    let slot = next_slot;
                    next_slot += 1;
                    pending.push(slot);
                    core.submit(now, &pdu[..pdu_len], slot, now, &mut sink);
                }
            }
            1 => {
                now += Duration::from_micros(arg as u64 * 500);
                core.handle_timeout(now, &mut sink);
            }
            2 | 3 => {
                // a datagram of the next `arg` input bytes, with a live unique id
                let mut d: Vec<u8> = ops
                    .by_ref()
                    .take(arg.div_ceil(2))
                    .flatten()
                    .copied()
                    .collect();
                if code == 2 && d.len() >= 28 && !sink.0.is_empty() {
                    let (sent, _) = &sink.0[arg % sink.0.len()];
                    if sent.len() >= 28 {
                        d[12..28].copy_from_slice(&sent[12..28]);
                    }
                }
                core.handle_datagram(now, SocketId::from_raw(0), &mut d, &mut sink);
            }
            4 if !sink.0.is_empty() => {
                let tag = sink.0[arg % sink.0.len()].1;
                core.handle_send_failed(now, tag, &mut sink);
            }
            _ => {}
        }
        take_outcomes(core, &mut pending);
        while let Some(op) = core.poll_socket_op() {
            if let SocketOp::Open { .. } = op {
                let id = SocketId::from_raw(next_sock);
                next_sock += 1;
                core.socket_opened(if arg % 3 == 0 {
                    None
                } else {
                    Some((id, 50_000 + next_sock as u16))
                });
            }
        }
    }
    core.shutdown(now, &mut sink);
    take_outcomes(core, &mut pending);
    assert!(pending.is_empty(), "{} requests never ended", pending.len());
});

/// Takes the requests the core ended: each submitted one exactly once.
fn take_outcomes(core: &mut CoreState, pending: &mut Vec<u32>) {
    while let Some(o) = core.poll_outcome() {
        let i = pending.iter().position(|&s| s == o.slot);
        let i = i.unwrap_or_else(|| panic!("slot {} ended twice or never ran", o.slot));
        pending.swap_remove(i);
    }
}
