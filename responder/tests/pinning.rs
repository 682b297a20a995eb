//! Pinning of the responder's core threads (its own test binary: it inspects every
//! thread of the process).

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::*;
use rl_responder::{ResponderConfig, spawn};

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

/// `cpus` pins the core threads where asked (here: every core on the last CPU).
#[test]
fn cores_are_pinned_to_the_cpus_asked_for() {
    let k = key(NONE_KEY);
    let ids = core_affinity::get_core_ids().unwrap_or_default();
    let Some(last) = ids.last().map(|c| c.id) else {
        return;
    };
    let mut cfg = ResponderConfig::new(vec![k.clone()]);
    cfg.cores = 2;
    cfg.cpus = vec![last];
    let h = spawn(cfg).unwrap();
    // every rl-resp-* thread of this process runs on `last` only
    let mut checked = 0;
    for t in std::fs::read_dir("/proc/self/task").unwrap() {
        let dir = t.unwrap().path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        if !comm.starts_with("rl-resp-") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap();
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap()
            .trim()
            .to_string();
        assert_eq!(list, last.to_string(), "{comm}");
        checked += 1;
    }
    assert!(checked >= 2);
    let s = client();
    s.send_to(
        &datagram_now(&k, uid(1), &request_pdu(200, &[], &[B])),
        h.addr(),
    )
    .unwrap();
    assert!(read_response(&k, &recv(&s).unwrap()).is_some());
    h.stop();
}
