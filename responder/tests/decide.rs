//! Sans-IO decision logic on virtual time.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use rl_responder::decide::{Capacities, Responder};
use rl_responder::{BrokenReply, Faults, FixedDecision};

const SERVER: u64 = 0x0000_0018_1c80_0007;

fn src() -> SocketAddr {
    "127.0.0.1:40000".parse().unwrap()
}

fn responder(keys: &[&str], t0: Instant) -> Responder {
    let keys: Vec<_> = keys.iter().map(|k| key(k)).collect();
    Responder::new(&keys, SERVER, Capacities::default(), t0).unwrap()
}

fn send(r: &mut Responder, k: &str, dg: &[u8], now: Instant) -> Option<Resp> {
    let mut d = dg.to_vec();
    let mut out = [0u8; 1300];
    let n = r.handle(&mut d, src(), now, &mut out)?;
    Some(read_response(&key(k), &out[..n]).expect("valid response"))
}

const B1: R = R {
    bucket: [1; 16],
    window: 60_000,
    rate: 5,
    tokens: 1,
};
const B2: R = R {
    bucket: [2; 16],
    window: 60_000,
    rate: 1,
    tokens: 1,
};
const TR: G = G {
    tracker: [7; 16],
    ttl: 10_000,
    max: 10,
    min: 3,
    threshold: 100,
};

#[test]
fn grants_then_rejects_with_deficit_in_every_mode() {
    let t0 = Instant::now();
    for k in [AES_KEY, COOKIE_KEY, NONE_KEY] {
        let mut r = responder(&[AES_KEY, COOKIE_KEY, NONE_KEY], t0);
        for i in 0..5u64 {
            let dg = datagram(&key(k), uid(i), &request_pdu(60, &[], &[B1]));
            let resp = send(&mut r, k, &dg, t0 + Duration::from_millis(i)).unwrap();
            assert!(resp.granted());
            assert_eq!(resp.resources, vec![(i as u32 + 1, 0)]);
            assert_eq!(resp.server_id, SERVER);
            assert_eq!(resp.steering, 1);
            assert_eq!(resp.unique_id, uid(i));
            assert_eq!(resp.timestamp_ms, 1_767_225_600_000);
        }
        let big = R { tokens: 3, ..B1 };
        let dg = datagram(&key(k), uid(9), &request_pdu(60, &[], &[big]));
        let resp = send(&mut r, k, &dg, t0 + Duration::from_millis(10)).unwrap();
        assert!(!resp.granted());
        assert_eq!(resp.resources, vec![(5, 3)]);
        // the window slides: 60 s after the first grant one token is back
        let dg = datagram(&key(k), uid(10), &request_pdu(60, &[], &[B1]));
        let resp = send(&mut r, k, &dg, t0 + Duration::from_millis(60_000)).unwrap();
        assert!(resp.granted(), "{resp:?}");
    }
}

#[test]
fn duplicate_within_ttl_is_identical_and_not_debited() {
    let t0 = Instant::now();
    let mut r = responder(&[AES_KEY], t0);
    let dg = datagram(&key(AES_KEY), uid(1), &request_pdu(60, &[], &[B1]));
    let a = send(&mut r, AES_KEY, &dg, t0).unwrap();
    let b = send(&mut r, AES_KEY, &dg, t0 + Duration::from_millis(59)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.resources, vec![(1, 0)]);
    assert_eq!(r.counters().dedup_hits, 1);
    // one debit only: the next fresh request sees 1 consumed
    let dg2 = datagram(&key(AES_KEY), uid(2), &request_pdu(60, &[], &[B1]));
    let c = send(&mut r, AES_KEY, &dg2, t0 + Duration::from_millis(59)).unwrap();
    assert_eq!(c.resources, vec![(2, 0)]);
}

#[test]
fn duplicate_after_ttl_is_new() {
    let t0 = Instant::now();
    let mut r = responder(&[COOKIE_KEY], t0);
    let dg = datagram(&key(COOKIE_KEY), uid(1), &request_pdu(60, &[], &[B1]));
    let a = send(&mut r, COOKIE_KEY, &dg, t0).unwrap();
    let b = send(&mut r, COOKIE_KEY, &dg, t0 + Duration::from_millis(60)).unwrap();
    assert_eq!(a.resources, vec![(1, 0)]);
    assert_eq!(b.resources, vec![(2, 0)]);
    assert_eq!(r.counters().dedup_hits, 0);
}

#[test]
fn one_exhausted_resource_rejects_and_debits_neither() {
    let t0 = Instant::now();
    let mut r = responder(&[NONE_KEY], t0);
    let k = key(NONE_KEY);
    // exhaust B2 (rate 1)
    let g = send(
        &mut r,
        NONE_KEY,
        &datagram(&k, uid(1), &request_pdu(60, &[], &[B2])),
        t0,
    )
    .unwrap();
    assert!(g.granted());
    let both = request_pdu(60, &[], &[B1, B2]);
    let rej = send(&mut r, NONE_KEY, &datagram(&k, uid(2), &both), t0).unwrap();
    assert!(!rej.granted());
    assert_eq!(rej.resources, vec![(0, 0), (1, 1)]);
    // B1 untouched by the rejection
    let b1 = send(
        &mut r,
        NONE_KEY,
        &datagram(&k, uid(3), &request_pdu(60, &[], &[B1])),
        t0,
    )
    .unwrap();
    assert_eq!(b1.resources, vec![(1, 0)]);
    assert_eq!(r.counters().rejected, 1);
}

#[test]
fn guard_fails_once_reports_push_p90_over_threshold() {
    let t0 = Instant::now();
    let mut r = responder(&[AES_KEY], t0);
    let k = key(AES_KEY);
    let guarded = request_pdu(60, &[TR], &[B1]);
    let mut n = 100;
    let mut ask = |r: &mut Responder, at: u64| {
        n += 1;
        send(
            r,
            AES_KEY,
            &datagram(&k, uid(n), &guarded),
            t0 + Duration::from_millis(at),
        )
        .unwrap()
    };
    assert!(ask(&mut r, 0).granted(), "no samples: latency 0");
    // reports are never answered
    let mut d = datagram(&k, uid(1), &report_pdu(&[(TR, 20), (TR, 30)]));
    assert_eq!(r.handle(&mut d, src(), t0, &mut [0u8; 1300]), None);
    let resp = ask(&mut r, 1);
    assert_eq!(resp.guards, vec![(100, 0)], "below min samples");
    let mut d = datagram(&k, uid(2), &report_pdu(&[(TR, 150), (TR, 160), (TR, 170)]));
    assert_eq!(r.handle(&mut d, src(), t0, &mut [0u8; 1300]), None);
    let resp = ask(&mut r, 2);
    assert!(!resp.granted());
    assert_eq!(resp.guards, vec![(100, 170)]);
    assert_eq!(
        resp.resources,
        vec![(2, 0)],
        "rejection: no debit, actual = consumed"
    );
    assert_eq!(r.counters().report_entries, 5);
    // samples expire after their ttl
    assert!(ask(&mut r, 10_001).granted());
}

#[test]
fn every_drop_reason_is_counted() {
    let t0 = Instant::now();
    let mut r = responder(&[AES_KEY, COOKIE_KEY], t0);
    let pdu = request_pdu(60, &[], &[B1]);
    let mut out = [0u8; 1300];
    let mut go =
        |r: &mut Responder, mut d: Vec<u8>| assert_eq!(r.handle(&mut d, src(), t0, &mut out), None);
    go(&mut r, datagram(&key(NONE_KEY), uid(1), &pdu)); // unknown key id
    let mut wrong = datagram(&key(AES_KEY), uid(1), &pdu);
    wrong[4] = 2; // key id 2 (cookie) with an aes auth TLV
    go(&mut r, wrong);
    let mut cookie = datagram(&key(COOKIE_KEY), uid(1), &pdu);
    cookie[50] ^= 1;
    go(&mut r, cookie);
    let mut aes = datagram(&key(AES_KEY), uid(1), &pdu);
    aes[20] ^= 1; // unique id is AAD
    go(&mut r, aes);
    go(&mut r, vec![0u8; 1201]);
    go(&mut r, datagram(&key(AES_KEY), uid(1), &pdu)[..30].to_vec());
    let mut bad_pdu = pdu.clone();
    bad_pdu[2] += 1; // size disagrees
    go(&mut r, datagram(&key(AES_KEY), uid(1), &bad_pdu));
    let c = r.counters();
    assert_eq!(
        (
            c.drop_unknown_key,
            c.drop_wrong_mode,
            c.drop_bad_cookie,
            c.drop_auth_failed,
            c.drop_too_long,
            c.drop_malformed
        ),
        (1, 1, 1, 1, 1, 2)
    );
    assert_eq!(c.answered, 0);
    // random garbage never panics
    let mut x = 7u64;
    for len in 0..2000 {
        let mut d: Vec<u8> = (0..len % 1300)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        if d.len() > 40 && len % 2 == 0 {
            d[..2].copy_from_slice(&[0x52, 0x4C]);
            d[2..4].copy_from_slice(&[40, 0]);
            d[4..12].copy_from_slice(&2u64.to_le_bytes());
        }
        let _ = r.handle(&mut d, src(), t0, &mut out);
    }
}

#[test]
fn decision_faults() {
    let t0 = Instant::now();
    let k = key(AES_KEY);
    let pdu = request_pdu(60, &[TR], &[B1, B2]);
    let mut r = responder(&[AES_KEY], t0);
    let n = std::cell::Cell::new(0u64);
    let run = |r: &mut Responder, f: Faults| {
        r.set_faults(&f);
        n.set(n.get() + 1);
        let mut d = datagram(&k, uid(n.get()), &pdu);
        let mut out = [0u8; 1300];
        r.handle(&mut d, src(), t0, &mut out)
            .map(|len| out[..len].to_vec())
    };
    let fixed = |d| Faults {
        fixed: Some(d),
        ..Faults::default()
    };
    let resp = read_response(&k, &run(&mut r, fixed(FixedDecision::Grant)).unwrap()).unwrap();
    assert!(resp.granted());
    let resp = read_response(&k, &run(&mut r, fixed(FixedDecision::Reject)).unwrap()).unwrap();
    assert!(!resp.granted());
    assert_eq!(resp.resources[0].1, 1);
    let resp = read_response(&k, &run(&mut r, fixed(FixedDecision::GuardFail)).unwrap()).unwrap();
    assert_eq!(resp.guards, vec![(100, 100)]);
    assert!(resp.resources.iter().all(|&(_, d)| d == 0));
    // nothing was debited by fixed decisions
    let resp = read_response(&k, &run(&mut r, Faults::default()).unwrap()).unwrap();
    assert_eq!(resp.resources, vec![(1, 0), (1, 0)]);

    let broken = |b| Faults {
        broken: Some(b),
        ..Faults::default()
    };
    for b in [BrokenReply::BadAuth, BrokenReply::Truncated] {
        let dg = run(&mut r, broken(b)).unwrap();
        assert!(read_response(&k, &dg).is_none(), "{b:?}");
    }
    let resp = read_response(
        &k,
        &run(&mut r, broken(BrokenReply::WrongUniqueId)).unwrap(),
    )
    .unwrap();
    assert_ne!(resp.unique_id, uid(n.get()));
    let resp = read_response(
        &k,
        &run(&mut r, broken(BrokenReply::WrongServerId)).unwrap(),
    )
    .unwrap();
    assert_ne!(resp.server_id, SERVER);
    let resp = read_response(&k, &run(&mut r, broken(BrokenReply::FewerEntries)).unwrap()).unwrap();
    assert_eq!((resp.guards.len(), resp.resources.len()), (1, 1));
    let resp = read_response(&k, &run(&mut r, broken(BrokenReply::MoreEntries)).unwrap()).unwrap();
    assert_eq!((resp.guards.len(), resp.resources.len()), (1, 3));
    let resp = read_response(&k, &run(&mut r, broken(BrokenReply::ZeroEntries)).unwrap()).unwrap();
    assert_eq!((resp.guards.len(), resp.resources.len()), (0, 0));
    assert_eq!(r.counters().fault_broken, 7);

    r.set_faults(&Faults {
        steer_every: 3,
        ..Faults::default()
    });
    let steer: Vec<u8> = (0..6)
        .map(|i| {
            let mut d = datagram(&k, uid(1000 + i), &pdu);
            let mut out = [0u8; 1300];
            let len = r.handle(&mut d, src(), t0, &mut out).unwrap();
            read_response(&k, &out[..len]).unwrap().steering
        })
        .collect();
    assert_eq!(steer, vec![1, 1, 0, 1, 1, 0]);
}

#[test]
fn one_million_request_ids_keep_dedup_bounded() {
    let t0 = Instant::now();
    let k = key(NONE_KEY);
    let caps = Capacities {
        dedup: 10_000,
        ..Capacities::default()
    };
    let mut r = Responder::new(std::slice::from_ref(&k), SERVER, caps, t0).unwrap();
    let big = R {
        rate: u32::MAX,
        ..B1
    };
    let mut d = datagram(&k, uid(0), &request_pdu(300, &[], &[big]));
    let mut out = [0u8; 1300];
    let mut max_len = 0;
    for i in 0..1_000_000u64 {
        d[12..20].copy_from_slice(&i.to_le_bytes()); // new unique id, same request
        // 10 requests per virtual ms: ~3000 live entries per 300 ms TTL, then a burst
        let now = if i < 900_000 {
            t0 + Duration::from_micros(i * 100)
        } else {
            t0 + Duration::from_secs(90)
        };
        assert!(r.handle(&mut d.clone(), src(), now, &mut out).is_some());
        if i % 1000 == 0 {
            max_len = max_len.max(r.counters().dedup_len);
        }
    }
    let c = r.counters();
    assert!(c.dedup_len <= 10_000 && max_len <= 10_000, "{c:?}");
    // the 100k burst at one instant overflows, and so do the ~3000 entries still live
    // from before it; nothing overflowed while the TTL kept the table below capacity
    assert!((90_000..=93_001).contains(&c.dedup_overflow), "{c:?}");
    assert_eq!(c.granted, 1_000_000);
}

/// The request datagrams of tests/data/vectors.json (with a label TLV) are accepted and answered.
#[test]
fn spec_request_vectors_are_answered() {
    let t0 = Instant::now();
    let mut r = responder(&[AES_KEY, COOKIE_KEY], t0);
    for (k, hex) in [
        (
            AES_KEY,
            "524c2800030000000000000000112233445546778899aabbccddeeff00a8da769b0100000000000041452000000102030405060708090a0b6f726887b5a4796084d77543f333f09615e52e4cf3e05d0e30c567a68dfe578ffd95160e778f709d5e6a670d947a1b23017f219a3807790f3007500a3346217a41db85704bdda5a40ed22eee6b062175bc6886da0ca4e13cfa611bdf38dbb37267eecd2e9f3bffc2",
        ),
        (
            COOKIE_KEY,
            "524c2800020000000000000000112233445546778899aabbccddeeff00a8da769b01000000000000434124000202020202020202020202020202020202020202020202020202020202020202525458003c000000010001006a17d07a424568304e50d28540f76e671027000064000000050000006400000000000000f5cf3ad8b8406854b596ba3614f16effe803000064000000010000004d4c0c000300617069000000",
        ),
    ] {
        let dg: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let resp = send(&mut r, k, &dg, t0).expect("answered");
        assert!(resp.granted());
        assert_eq!(resp.unique_id[..4], [0x00, 0x11, 0x22, 0x33]);
        assert_eq!(resp.timestamp_ms, 1_767_225_600_000);
        assert_eq!(resp.guards, vec![(100, 0)]);
        assert_eq!(resp.resources.len(), 1);
    }
}

/// docs/protocol.md §8 on virtual wall time: a request is stale once older than its dedup TTL
/// plus the grace, or too far ahead; reports have a fixed age limit. Drops are counted
/// and nothing is debited.
#[test]
fn stale_timestamps_are_dropped_on_virtual_wall_time() {
    use rl_responder::decide::{MAX_FUTURE_MS, REPORT_MAX_AGE_MS, STALE_GRACE_MS, is_stale};
    let t0 = Instant::now();
    let mut r = responder(&[COOKIE_KEY], t0);
    let k = key(COOKIE_KEY);
    let ttl = 3_000u32;
    let dg = datagram(&k, uid(1), &request_pdu(ttl, &[], &[B1]));
    let mut out = [0u8; 1300];
    let limit = FIXED_TS_MS + u64::from(ttl) + STALE_GRACE_MS;
    // just past the limit: dropped
    assert_eq!(
        r.handle_at(&mut dg.clone(), src(), t0, limit + 1, &mut out),
        None
    );
    // in the future beyond the skew allowance: dropped
    let early = FIXED_TS_MS - MAX_FUTURE_MS - 1;
    assert_eq!(
        r.handle_at(&mut dg.clone(), src(), t0, early, &mut out),
        None
    );
    assert_eq!(r.counters().drop_stale, 2);
    assert_eq!(r.counters().granted, 0);
    // at the limit: answered; a duplicate within the TTL finds its dedup entry
    let n = r
        .handle_at(&mut dg.clone(), src(), t0, limit, &mut out)
        .unwrap();
    assert!(read_response(&k, &out[..n]).unwrap().granted());
    let later = t0 + Duration::from_millis(u64::from(ttl) / 2);
    assert!(
        r.handle_at(&mut dg.clone(), src(), later, limit, &mut out)
            .is_some()
    );
    let c = r.counters();
    assert_eq!((c.granted, c.dedup_hits, c.drop_stale), (1, 1, 2));
    // reports
    let rep = datagram(&k, uid(2), &report_pdu(&[]));
    assert_eq!(
        r.handle_at(
            &mut rep.clone(),
            src(),
            t0,
            FIXED_TS_MS + REPORT_MAX_AGE_MS + 1,
            &mut out
        ),
        None
    );
    assert_eq!(r.counters().drop_stale, 3);
    assert_eq!(r.counters().reports, 0);
    assert_eq!(
        r.handle_at(&mut rep.clone(), src(), t0, FIXED_TS_MS, &mut out),
        None
    );
    assert_eq!(r.counters().reports, 1);
    assert!(!is_stale(100, 100, 0));
    assert!(is_stale(100, 101, 0));
    assert!(!is_stale(100 + MAX_FUTURE_MS, 100, 0));
    assert!(is_stale(101 + MAX_FUTURE_MS, 100, 0));
}
