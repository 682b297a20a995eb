//! The glommio runner over loopback sockets (std UdpSocket clients).

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
    let dg = datagram(&k, uid(1), &request_pdu(200, &[], &[B]));
    s.send_to(&dg, h.addr()).unwrap();
    let a = read_response(&k, &recv(&s).unwrap()).unwrap();
    s.send_to(&dg, h.addr()).unwrap();
    let b = read_response(&k, &recv(&s).unwrap()).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.resources, vec![(1, 0)]);
    assert_eq!(a.server_id, h.server_id());
    // a fresh request shows a single debit so far
    s.send_to(
        &datagram(&k, uid(2), &request_pdu(200, &[], &[B])),
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
            &datagram(&k, uid(10 + i), &request_pdu(200, &[], &[B])),
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
        &datagram(&k, uid(100), &request_pdu(200, &[], &[B])),
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
        &datagram(&k, uid(101), &request_pdu(200, &[], &[B])),
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
        &datagram(&k, uid(102), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    assert!(recv(&s).is_none());
    h.set_faults(Faults::default());
    std::thread::sleep(Duration::from_millis(60));
    s.set_read_timeout(Some(Duration::from_millis(1000)))
        .unwrap();
    s.send_to(
        &datagram(&k, uid(103), &request_pdu(200, &[], &[B])),
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
            &datagram(&k, uid(i), &request_pdu(200, &[], &[big])),
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
