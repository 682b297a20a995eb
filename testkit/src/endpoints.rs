//! Endpoints for tests: loopback addresses that never answer, and `ID@IP:PORT` text.

use std::net::{SocketAddr, UdpSocket};

use ratelimitly_engine::proto::endpoint::Endpoint;

/// A bound loopback UDP address that never answers (the socket is leaked on purpose so
/// the port stays taken for the rest of the test process).
pub fn dead_addr() -> SocketAddr {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind a loopback socket");
    let a = s.local_addr().expect("local address");
    std::mem::forget(s);
    a
}

/// An endpoint of server `server_id` that never answers.
pub fn dead_endpoint(server_id: u64) -> Endpoint {
    Endpoint {
        server_id,
        addr: dead_addr(),
    }
}
