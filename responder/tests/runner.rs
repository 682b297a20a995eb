//! The thread-per-core runner over loopback sockets (std UdpSocket clients and the
//! engine's UDP driver as a batching client).

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::*;
use rl_responder::{Faults, ResponderConfig, spawn};

const B: R = R {
    bucket: [5; 16],
    window: 60_000,
    rate: 5,
    tokens: 1,
};

fn client() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    s
}

fn recv(s: &UdpSocket) -> Option<Vec<u8>> {
    let mut buf = [0u8; 2048];
    s.recv(&mut buf).ok().map(|n| buf[..n].to_vec())
}

#[test]
fn same_datagram_twice_two_identical_decisions_one_debit() {
    let k = key(AES_KEY);
    let h = spawn(ResponderConfig::new(vec![k.clone(), key(COOKIE_KEY)])).unwrap();
    let s = client();
    let dg = datagram_now(&k, uid(1), &request_pdu(200, &[], &[B]));
    s.send_to(&dg, h.addr()).unwrap();
    let a = read_response(&k, &recv(&s).unwrap()).unwrap();
    s.send_to(&dg, h.addr()).unwrap();
    let b = read_response(&k, &recv(&s).unwrap()).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.resources, vec![(1, 0)]);
    assert_eq!(a.server_id, h.server_id());
    // a fresh request shows a single debit so far
    s.send_to(
        &datagram_now(&k, uid(2), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    let c = read_response(&k, &recv(&s).unwrap()).unwrap();
    assert_eq!(c.resources, vec![(2, 0)]);
    let n = h.counters();
    assert_eq!((n.dedup_hits, n.granted, n.answered), (1, 2, 3));
    h.stop();
}

#[test]
fn multi_core_shares_limits_and_faults_apply_at_run_time() {
    let k = key(COOKIE_KEY);
    let mut cfg = ResponderConfig::new(vec![k.clone()]);
    cfg.cores = 2;
    cfg.server_id = Some(42);
    let h = spawn(cfg).unwrap();
    // many source ports spread over both sockets; the bucket allows 5 in total
    let mut granted = 0;
    for i in 0..12u64 {
        let s = client();
        s.send_to(
            &datagram_now(&k, uid(10 + i), &request_pdu(200, &[], &[B])),
            h.addr(),
        )
        .unwrap();
        let r = read_response(&k, &recv(&s).unwrap()).unwrap();
        assert_eq!(r.server_id, 42);
        granted += usize::from(r.granted());
    }
    assert_eq!(granted, 5);
    // silence, then recovery
    h.set_faults(Faults {
        silent: true,
        ..Faults::default()
    });
    std::thread::sleep(Duration::from_millis(60));
    let s = client();
    s.set_read_timeout(Some(Duration::from_millis(150)))
        .unwrap();
    s.send_to(
        &datagram_now(&k, uid(100), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    assert!(recv(&s).is_none());
    assert!(h.counters().fault_silent_drops >= 1);
    h.set_faults(Faults {
        delay: Duration::from_millis(40),
        duplicate: 1.0,
        ..Faults::default()
    });
    std::thread::sleep(Duration::from_millis(60));
    let t = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    s.send_to(
        &datagram_now(&k, uid(101), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    let a = recv(&s).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(35));
    let b = recv(&s).unwrap();
    assert_eq!(a, b, "duplicate response is byte-identical");
    let c = h.counters();
    assert!(c.fault_delayed >= 1 && c.fault_duplicated >= 1, "{c:?}");
    h.set_faults(Faults {
        drop_out: 1.0,
        ..Faults::default()
    });
    std::thread::sleep(Duration::from_millis(60));
    s.set_read_timeout(Some(Duration::from_millis(150)))
        .unwrap();
    s.send_to(
        &datagram_now(&k, uid(102), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    assert!(recv(&s).is_none());
    h.set_faults(Faults::default());
    std::thread::sleep(Duration::from_millis(60));
    s.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    s.send_to(
        &datagram_now(&k, uid(103), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    assert!(read_response(&k, &recv(&s).unwrap()).is_some());
    h.stop();
}

#[test]
fn burst_of_requests_all_answered() {
    let k = key(NONE_KEY);
    let h = spawn(ResponderConfig::new(vec![k.clone()])).unwrap();
    let s = client();
    let big = R {
        rate: 1_000_000,
        ..B
    };
    let n = 500u64;
    let mut got = 0;
    // batches of 50 in flight: the client's own receive buffer is the limit here
    for i in 0..n {
        s.send_to(
            &datagram_now(&k, uid(i), &request_pdu(200, &[], &[big])),
            h.addr(),
        )
        .unwrap();
        if i % 50 == 49 {
            while got < i + 1 && recv(&s).is_some() {
                got += 1;
            }
        }
    }
    assert_eq!(got, n, "{:?}", h.counters());
    h.stop();
}

/// docs/protocol.md §8: requests older than their dedup TTL (plus the grace) or too far in the
/// future are dropped silently and counted; fresh ones are answered.
#[test]
fn stale_and_future_timestamps_are_dropped_and_counted() {
    let k = key(AES_KEY);
    let h = spawn(ResponderConfig::new(vec![k.clone()])).unwrap();
    let s = client();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let ttl = 2_000u32;
    let pdu = request_pdu(ttl, &[], &[B]);
    let old = now_ms() - u64::from(ttl) - rl_responder::decide::STALE_GRACE_MS - 5_000;
    s.send_to(&datagram_at(&k, uid(1), &pdu, old), h.addr())
        .unwrap();
    assert!(recv(&s).is_none(), "stale request answered");
    let future = now_ms() + rl_responder::decide::MAX_FUTURE_MS + 60_000;
    s.send_to(&datagram_at(&k, uid(2), &pdu, future), h.addr())
        .unwrap();
    assert!(recv(&s).is_none(), "future request answered");
    // within the TTL: answered
    let recent = now_ms() - u64::from(ttl) / 2;
    s.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    s.send_to(&datagram_at(&k, uid(3), &pdu, recent), h.addr())
        .unwrap();
    assert!(read_response(&k, &recv(&s).unwrap()).unwrap().granted());
    let c = h.counters();
    assert_eq!((c.drop_stale, c.answered, c.granted), (2, 1, 1), "{c:?}");
    h.stop();
}

/// Two answers to one request (a dedup replay) carry different random nonces.
#[test]
fn every_response_has_a_fresh_nonce() {
    let k = key(AES_KEY);
    let h = spawn(ResponderConfig::new(vec![k.clone()])).unwrap();
    let s = client();
    let dg = datagram_now(&k, uid(7), &request_pdu(5_000, &[], &[B]));
    s.send_to(&dg, h.addr()).unwrap();
    let a = recv(&s).unwrap();
    s.send_to(&dg, h.addr()).unwrap();
    let b = recv(&s).unwrap();
    // AES auth TLV at 40: type/size (4), then the 12-byte nonce
    assert_ne!(a[44..56], b[44..56]);
    assert_eq!(read_response(&k, &a), read_response(&k, &b));
    h.stop();
}

/// A batching client (the engine's UDP driver: GSO out, GRO in) sends bursts; every
/// request gets exactly one correct answer with reply batching on and off, on both
/// backends. With batching on the responder sends GSO batches and the client receives
/// coalesced buffers; with it off, one datagram per send.
#[test]
fn reply_batching_on_and_off_every_answer_arrives() {
    use ratelimitly_engine::udp::{BackendChoice, IoConfig, IoEvent, UdpIo};
    use std::collections::HashSet;
    for io in [BackendChoice::Uring, BackendChoice::Mmsg] {
        for reply_batch in [true, false] {
            let k = key(COOKIE_KEY);
            let mut cfg = ResponderConfig::new(vec![k.clone()]);
            cfg.reply_batch = reply_batch;
            cfg.io = io;
            let h = match spawn(cfg) {
                Ok(h) => h,
                Err(e) if io == BackendChoice::Uring => {
                    eprintln!("io_uring refused here ({e}); skipping");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let mut d = UdpIo::new(&IoConfig::default()).unwrap();
            let sock = d.bind("127.0.0.1:0".parse().unwrap()).unwrap();
            let big = R {
                rate: 1_000_000,
                ..B
            };
            let n = 600u64;
            let mut answered = HashSet::new();
            let t0 = Instant::now();
            for burst in 0..(n / 200) {
                for i in burst * 200..(burst + 1) * 200 {
                    let dg = datagram_now(&k, uid(i), &request_pdu(5_000, &[], &[big]));
                    assert!(d.queue_send(sock, h.addr(), &dg, i));
                }
                let want = (burst + 1) * 200;
                while (answered.len() as u64) < want && t0.elapsed() < Duration::from_secs(5) {
                    d.run_once(Some(Duration::from_millis(20)), &mut |_, ev| match ev {
                        IoEvent::Datagram { data, from, .. } => {
                            assert_eq!(from, h.addr());
                            let r = read_response(&k, data).expect("verifies");
                            assert!(r.granted());
                            assert!(answered.insert(r.unique_id), "answered twice");
                        }
                        IoEvent::SendFailed { tag, error } => {
                            panic!("send {tag} failed: {error:?}")
                        }
                        IoEvent::Woken => {}
                    })
                    .unwrap();
                }
            }
            assert_eq!(answered.len() as u64, n, "{io:?} reply_batch={reply_batch}");
            for i in 0..n {
                assert!(answered.contains(&uid(i)));
            }
            let client = d.stats().clone();
            let c = h.counters();
            assert_eq!((c.answered, c.send_errors), (n, 0), "{c:?}");
            let server = h.stop();
            let label =
                format!("{io:?} reply_batch={reply_batch}: server {server:?} client {client:?}");
            assert_eq!(server.datagrams_sent, n, "{label}");
            if reply_batch {
                assert!(server.gso_sends > 0, "{label}");
                assert!(client.gro_buffers > 0, "{label}");
            } else {
                assert_eq!(server.gso_sends, 0, "{label}");
                assert_eq!(server.send_ops, n, "{label}");
            }
            assert!(
                server.gro_buffers > 0,
                "the client's GSO bursts arrive coalesced: {label}"
            );
        }
    }
}
