//! The traced request and the probe against embedded responders on 127.0.0.1: what each
//! says about a closed port, a server that answers, a server that does not know the key,
//! and a server whose id is not the one the endpoint names.

use std::net::UdpSocket;
use std::time::Duration;

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::machine::TransmitKind;
use ratelimitly_engine::proto::outcome::Failure;
use ratelimitly_engine::proto::policy::RequestPolicy;
use ratelimitly_engine::proto::wire::ResourceSpec;
use rl_responder::Faults;
use rl_testkit::harness::{endpoint, responder};
use rl_testkit::keys::{self, AES, COOKIE};
use rl_toolkit::errqueue::IcmpKind;
use rl_toolkit::probe::probe;
use rl_toolkit::trace::{self, Received, Round, TraceRequest, What};
use rl_toolkit::words::Finding;

fn policy() -> RequestPolicy {
    RequestPolicy::builder()
        .unit(Duration::from_millis(20))
        .build()
        .unwrap()
}

fn closed_port() -> Endpoint {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = s.local_addr().unwrap();
    drop(s);
    Endpoint { server_id: 1, addr }
}

#[test]
fn a_closed_port_is_named_unreachable() {
    let ep = closed_port();
    let findings = probe(&keys::aes(), &policy(), &[ep]).unwrap();
    assert_eq!(findings.len(), 1);
    match &findings[0].finding {
        Finding::Icmp(e) => assert_eq!(e.kind, IcmpKind::PortUnreachable),
        other => panic!("{other:?}"),
    }
    let text = findings[0].to_string();
    assert!(
        text.contains(&format!("port unreachable from {}", ep.addr)),
        "{text}"
    );
}

#[test]
fn a_request_is_traced_round_by_round() {
    let r = responder(AES, 7 << 23, Faults::default());
    let ep = endpoint(&r);
    let resources = [ResourceSpec {
        bucket_id: [7; 16],
        window_ms: 1000,
        rate_limit: 10,
        tokens: 1,
    }];
    let p = policy();
    let req = TraceRequest {
        key: &keys::aes(),
        policy: &p,
        endpoints: &[ep],
        guards: &[],
        resources: &resources,
        label: "",
    };
    let mut seen = 0;
    let t = trace::run(&req, |_| seen += 1).unwrap();
    let resp = t.outcome.clone().unwrap();
    assert_eq!(resp.server_id, Some(ep.server_id));
    assert_eq!(seen, t.events.len());
    // round 0 to the server, its answer, the completion delivery
    match t.events[0].what {
        What::Transmit { kind, error, .. } => {
            assert_eq!((kind, error), (TransmitKind::Initial, None));
        }
        ref other => panic!("{other:?}"),
    }
    assert_eq!(t.events[0].round, Round::Round(0));
    assert!(t.events.iter().any(|e| matches!(
        e.what,
        What::Receive { result: Received::Response { server_id }, .. } if server_id == ep.server_id
    )));
    assert_eq!(t.findings()[0].finding, Finding::Answered);
    assert_eq!((t.sends, t.completion_sends), (1, 0));
    assert_eq!(r.counters().granted, 1);
}

#[test]
fn a_server_without_the_key_is_silent_and_said_so() {
    // the server serves the cookie key only: it drops the AES key's datagrams
    let r = responder(COOKIE, 8 << 23, Faults::default());
    let findings = probe(&keys::aes(), &policy(), &[endpoint(&r)]).unwrap();
    assert_eq!(findings[0].finding, Finding::NoAnswer);
    assert!(
        findings[0]
            .to_string()
            .contains("the server drops datagrams whose key id or authentication it does not know")
    );
    assert_eq!(r.counters().drop_unknown_key, 2, "round 0 and the replay");
}

#[test]
fn another_server_id_than_the_endpoint_claims_is_named() {
    let r = responder(AES, 9 << 23, Faults::default());
    let claimed = Endpoint {
        server_id: 5 << 23,
        addr: r.addr(),
    };
    let p = policy();
    let resources = [ResourceSpec {
        bucket_id: [9; 16],
        window_ms: 1000,
        rate_limit: 10,
        tokens: 1,
    }];
    let req = TraceRequest {
        key: &keys::aes(),
        policy: &p,
        endpoints: &[claimed],
        guards: &[],
        resources: &resources,
        label: "",
    };
    let t = trace::run(&req, |_| {}).unwrap();
    assert!(matches!(
        t.outcome,
        Err(Failure::Timeout { horizon_ms: 60 })
    ));
    assert_eq!(
        t.findings()[0].finding,
        Finding::OtherServer { actual: 9 << 23 }
    );
    // round 0 decided, the replay answered from the dedup table
    let c = r.counters();
    assert_eq!((c.granted, c.dedup_hits), (1, 1), "{c:?}");
    let findings = probe(&keys::aes(), &p, &[claimed]).unwrap();
    assert_eq!(
        findings[0].finding,
        Finding::OtherServer { actual: 9 << 23 }
    );
    // the probe's guard consumed nothing
    let c = r.counters();
    assert_eq!((c.granted, c.rate_requests), (2, 4), "{c:?}");
}
