//! Interoperability with the official Rust client `ratelimitly` 0.1.0, discovering our
//! responder through our DNS responder on loopback.

mod common;

use std::time::Duration;

use ratelimitly::{ApiKey, Client, Decision, LatencyTracker, Resource};
use rl_responder::{ResponderConfig, ResponderHandle, dns, spawn};

const DOMAIN: &str = "interop.test";

fn responder(keys: &[&str], server_id: u64) -> ResponderHandle {
    let mut cfg = ResponderConfig::new(keys.iter().map(|k| common::key(k)).collect());
    cfg.server_id = Some(server_id);
    spawn(cfg).expect("responder starts")
}

async fn client(key: &str, dns: &dns::DnsHandle) -> Client {
    let k: ApiKey = key.parse().expect("official client accepts the key");
    Client::builder(k)
        .service_domain(DOMAIN)
        .unwrap()
        .dns_server(dns.addr())
        .build()
        .await
        .expect("client builds")
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(5), f)
        .await
        .expect("bounded in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_rejections_in_every_mode() {
    let keys = [common::AES_KEY, common::COOKIE_KEY, common::NONE_KEY];
    let r = responder(&keys, 1_000_001);
    let d = dns::spawn(DOMAIN, vec![(r.server_id(), vec![r.addr()])]).unwrap();
    for key in keys {
        let c = client(key, &d).await;
        let res = Resource::new(format!("checkout-{key:.9}"), Duration::from_secs(60), 5).unwrap();
        for i in 1..=5u32 {
            let resp = within(c.request().consume(&res, 1).unwrap().send())
                .await
                .unwrap();
            assert_eq!(resp.decision(), Decision::Granted, "{key:.9} request {i}");
            assert_eq!(resp.selected_server_id(), Some(1_000_001));
            assert_eq!(resp.resource_results()[0].actual_rate(), i);
        }
        let resp = within(c.request().consume(&res, 2).unwrap().send())
            .await
            .unwrap();
        assert_eq!(resp.decision(), Decision::Rejected);
        assert_eq!(resp.resource_results()[0].tokens_deficit(), 2);
        let resp = within(c.request().consume(&res, 1).unwrap().send())
            .await
            .unwrap();
        assert_eq!(resp.decision(), Decision::Rejected);
        assert_eq!(resp.resource_results()[0].tokens_deficit(), 1);
        assert_eq!(resp.resource_results()[0].actual_rate(), 5);
    }
    let c = r.counters();
    assert_eq!(c.granted, 15, "{c:?}");
    assert!(c.rejected >= 6);
    d.stop();
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_reports_make_a_guard_fail() {
    let r = responder(&[common::AES_KEY], 2_000_002);
    let d = dns::spawn(DOMAIN, vec![(r.server_id(), vec![r.addr()])]).unwrap();
    let c = client(common::AES_KEY, &d).await;
    let tracker = LatencyTracker::builder("inventory")
        .sample_ttl(Duration::from_secs(10))
        .max_samples(20)
        .min_samples(3)
        .build()
        .unwrap();
    let ok = within(
        c.request()
            .guard(&tracker, Duration::from_millis(100))
            .unwrap()
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(ok.decision(), Decision::Granted);
    for ms in [150, 160, 170, 180] {
        within(c.report_latency(&tracker, Duration::from_millis(ms)))
            .await
            .unwrap();
    }
    // reports are fire-and-forget: wait (bounded) until the responder has them
    for _ in 0..100 {
        if r.counters().report_entries >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(r.counters().report_entries, 4);
    let resp = within(
        c.request()
            .guard(&tracker, Duration::from_millis(100))
            .unwrap()
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.decision(), Decision::Rejected);
    let g = &resp.guard_results()[0];
    assert!(!g.passed());
    assert_eq!(g.current_latency(), Duration::from_millis(180));
    d.stop();
    r.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_responders_the_oldest_is_selected() {
    let old = responder(&[common::COOKIE_KEY], 5_000);
    let young = responder(&[common::COOKIE_KEY], 9_000);
    let d = dns::spawn(
        DOMAIN,
        vec![
            (young.server_id(), vec![young.addr()]),
            (old.server_id(), vec![old.addr()]),
        ],
    )
    .unwrap();
    let c = client(common::COOKIE_KEY, &d).await;
    let res = Resource::new("two", Duration::from_secs(60), 100).unwrap();
    for _ in 0..3 {
        let resp = within(c.request().consume(&res, 1).unwrap().send())
            .await
            .unwrap();
        assert_eq!(resp.decision(), Decision::Granted);
        assert_eq!(resp.selected_server_id(), Some(5_000));
    }
    // round 0 goes to both servers; the young one's copies may still be in flight
    for _ in 0..100 {
        if young.counters().received >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (o, y) = (old.counters(), young.counters());
    assert!(o.answered >= 3 && y.received >= 3, "old {o:?} young {y:?}");
    d.stop();
    old.stop();
    young.stop();
}
