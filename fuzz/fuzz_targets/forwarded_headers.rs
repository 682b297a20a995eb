//! Fuzz target: who the client is (`ratelimitly_tower::forwarded`) over arbitrary
//! `X-Forwarded-For`, `Forwarded` and `X-Real-IP` values from a trusted and an untrusted
//! peer, in every source, and the two chain parsers on the raw bytes. Must never panic;
//! from the untrusted peer the answer is that peer, and from the trusted one an address
//! taken from a header is one the headers hold.
#![no_main]

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;
use ratelimitly_tower::forwarded::{
    ClientIp, ClientIpFrom, ClientIpRule, parse_forwarded, parse_x_forwarded_for,
};

fuzz_target!(|data: &[u8]| {
    let _ = parse_forwarded(data);
    let _ = parse_x_forwarded_for(data);
    // three values, split at the first two 0xff bytes (never valid in a header)
    let mut parts = data.splitn(3, |&b| b == 0xff);
    let mut headers = HeaderMap::new();
    for name in ["x-forwarded-for", "forwarded", "x-real-ip"] {
        if let Some(v) = parts.next().and_then(|p| HeaderValue::from_bytes(p).ok()) {
            headers.append(name, v);
        }
    }
    let mut written: Vec<IpAddr> = Vec::new();
    for v in headers.get_all("x-forwarded-for") {
        written.extend(parse_x_forwarded_for(v.as_bytes()).into_iter().flatten());
    }
    for v in headers.get_all("forwarded") {
        written.extend(parse_forwarded(v.as_bytes()).into_iter().flatten());
    }
    let trusted = IpAddr::from([127, 0, 0, 1]);
    let stranger = IpAddr::from([192, 0, 2, 1]);
    for source in ClientIpFrom::ALL {
        let rule = ClientIpRule::new("127.0.0.0/8, ::1".parse().unwrap(), source);
        assert_eq!(rule.client_ip(stranger, &headers), ClientIp::Peer(stranger));
        if let ClientIp::Forwarded(a) = rule.client_ip(trusted, &headers) {
            assert!(written.contains(&a), "{a} is in no header");
        }
    }
});
