//! rlctl names why a request went unanswered (a closed port, a server that does not
//! know the key, another server id than the endpoint claims), traces a request with
//! `--verbose`, and names the domain a failed discovery queried. Against embedded
//! responders and closed ports on 127.0.0.1.

use std::net::UdpSocket;
use std::process::{Command, Output};

use rl_responder::Faults;
use serde_json::Value;

use rl_testkit::harness::{endpoint_arg, responder};
use rl_testkit::keys::{AES as AES_KEY, COOKIE as COOKIE_KEY};

fn rlctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rlctl"))
        .args(args)
        .env("RATELIMITLY_API_KEY", AES_KEY)
        .output()
        .expect("run rlctl")
}

fn json_error(o: &Output) -> String {
    let v: Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    v["error"].as_str().unwrap_or_default().to_owned()
}

fn request(endpoint: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "request",
        "--endpoint",
        endpoint,
        "--consume",
        "diag:1000:5",
    ];
    args.extend_from_slice(extra);
    rlctl(&args)
}

fn closed_port() -> String {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    drop(s);
    format!("1@127.0.0.1:{port}")
}

#[test]
fn a_closed_port_is_unreachable() {
    let ep = closed_port();
    let addr = ep.trim_start_matches("1@").to_owned();
    let o = request(&ep, &["--json"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = json_error(&o);
    assert!(
        err.starts_with("timeout: no valid response within the 60 ms horizon"),
        "{err}"
    );
    assert!(
        err.contains(&format!("port unreachable from {addr}")),
        "{err}"
    );
    // the same words in text mode
    let o = request(&ep, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(&format!("port unreachable from {addr}")),
        "{out}"
    );
}

#[test]
fn a_server_without_the_key_gives_no_answer() {
    let r = responder(COOKIE_KEY, 21 << 23, Faults::default());
    let o = request(&endpoint_arg(&r), &["--json"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = json_error(&o);
    assert!(
        err.contains("no answer from a reachable server")
            && err.contains("drops datagrams whose key id or authentication it does not know"),
        "{err}"
    );
    assert!(r.counters().drop_unknown_key >= 2);
}

#[test]
fn another_server_id_than_claimed_is_named() {
    let r = responder(AES_KEY, 22 << 23, Faults::default());
    let claimed = format!("{}@{}", 23u64 << 23, r.addr());
    let o = request(&claimed, &["--json"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let err = json_error(&o);
    assert!(
        err.contains(&format!("a datagram from server id {}", 22u64 << 23))
            && err.contains(&format!("claims server id {}", 23u64 << 23)),
        "{err}"
    );
}

#[test]
fn verbose_traces_every_transmit_and_receive_with_its_round() {
    let r = responder(AES_KEY, 24 << 23, Faults::default());
    let o = request(&endpoint_arg(&r), &["--json", "--verbose"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["outcome"], "granted");
    assert_eq!(v["sends"], 1);
    let log = String::from_utf8_lossy(&o.stderr);
    let send = log
        .lines()
        .find(|l| l.contains("send     ->"))
        .unwrap_or("");
    assert!(
        send.contains("round 0") && send.contains("initial"),
        "{log}"
    );
    let recv = log
        .lines()
        .find(|l| l.contains("receive  <-"))
        .unwrap_or("");
    assert!(
        recv.contains("round 0") && recv.contains(&format!("response of server {}", 24u64 << 23)),
        "{log}"
    );
    assert_eq!(r.counters().granted, 1);
    // a closed port, traced: the ICMP errors of both rounds
    let o = request(&closed_port(), &["--verbose"]);
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(
        log.contains("round 0  ICMP") && log.contains("round 1  send"),
        "{log}"
    );
}

#[test]
fn a_failed_discovery_names_the_domain_it_queried() {
    let dns = rl_responder::dns::spawn("known.test", vec![]).unwrap();
    let server = dns.addr().to_string();
    let args = ["--domain", "nope.test", "--dns-server", server.as_str()];
    let mut discover = vec!["discover", "--json"];
    discover.extend_from_slice(&args);
    let o = rlctl(&discover);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    assert!(
        json_error(&o).starts_with("discovery of _ratelimitly._udp.nope.test failed: "),
        "{o:?}"
    );
    let mut req = vec!["request", "--consume", "d:1000:5", "--json"];
    req.extend_from_slice(&args);
    let o = rlctl(&req);
    assert_eq!(o.status.code(), Some(4), "{o:?}");
    assert!(json_error(&o).starts_with("discovery of _ratelimitly._udp.nope.test failed: "));
    dns.stop();
}
