//! Stateful fuzz target: the engine core's datagram handling with live requests in
//! flight. The input is a little program: each byte pair is an operation (submit
//! requests, advance virtual time, a datagram built from fuzz bytes with the unique id
//! of a live request spliced in so routing passes, a raw datagram, a send failure of a
//! handed-out transmit). The core runs on virtual time in "none" auth mode, so fuzz
//! bytes reach the response parser and the request machine. Must never panic, and
//! every submitted request must complete exactly once after shutdown.
#![no_main]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use ratelimitly_engine::engine::sockets::SocketOp;
use ratelimitly_engine::udp::SocketId;
use ratelimitly_engine::engine::state::TransmitSink;
use ratelimitly_engine::engine::{Completion, Cores, Engine};
use ratelimitly_engine::proto::ids::Resource;
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::Endpoint;

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
        Endpoint { server_id: 1 << 23, addr: "127.0.0.1:7000".parse().unwrap() },
        Endpoint { server_id: 2 << 23, addr: "127.0.0.1:7001".parse().unwrap() },
    ];
    let t0 = Instant::now();
    let mut seed = 7u8;
    let (h, mut states) = Engine::builder(key)
        .cores(Cores::Count(1))
        .endpoints(eps)
        .in_flight_per_core(64)
        .max_sockets_per_core(4)
        .build_states(t0, 50_000, move |_| {
            Box::new(move |b: &mut [u8]| {
                for x in b.iter_mut() {
                    seed = seed.wrapping_mul(31).wrapping_add(17);
                    *x = seed;
                }
                Ok(())
            })
        })
        .expect("states");
    let (feed, core) = &mut states[0];
    let res = Resource::new("fuzz", Duration::from_secs(60), 100).expect("resource");
    let mut sink = Sink(Vec::new());
    let mut pending: Vec<Completion> = Vec::new();
    let mut now = t0;
    let mut next_sock = 1u32;
    let mut ops = data.chunks(2);
    while let Some(op) = ops.next() {
        let (code, arg) = (op[0] % 6, *op.get(1).unwrap_or(&0) as usize);
        match code {
            0 => {
                for _ in 0..=(arg % 4) {
                    pending.push(h.request().consume(&res, 1).send());
                }
                feed.submissions(core, now, &mut sink);
            }
            1 => {
                now += Duration::from_micros(arg as u64 * 500);
                core.handle_timeout(now, &mut sink);
            }
            2 | 3 => {
                // a datagram of the next `arg` input bytes, with a live unique id
                let mut d: Vec<u8> = ops.by_ref().take(arg.div_ceil(2)).flatten().copied().collect();
                if code == 2 && d.len() >= 28 && !sink.0.is_empty() {
                    let (sent, _) = &sink.0[arg % sink.0.len()];
                    if sent.len() >= 28 {
                        d[12..28].copy_from_slice(&sent[12..28]);
                    }
                }
                core.handle_datagram(now, SocketId::from_raw(0), &mut d, &mut sink);
            }
            4 => {
                if !sink.0.is_empty() {
                    let tag = sink.0[arg % sink.0.len()].1;
                    core.handle_send_failed(now, tag, &mut sink);
                }
            }
            _ => {}
        }
        while let Some(op) = core.poll_socket_op() {
            if let SocketOp::Open { .. } = op {
                let id = SocketId::from_raw(next_sock);
                next_sock += 1;
                core.socket_opened(if arg % 3 == 0 { None } else { Some((id, 50_000 + next_sock as u16)) });
            }
        }
    }
    feed.shutdown(core, now, &mut sink);
    for c in pending {
        assert!(c.try_take().is_ok(), "a request never completed");
    }
});
