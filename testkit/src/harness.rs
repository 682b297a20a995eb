//! Responder harness: embedded `rl-responder` instances on 127.0.0.1 for the test suites.

use ratelimitly_engine::proto::endpoint::Endpoint;
use rl_responder::{Faults, ResponderConfig, ResponderHandle};

use crate::keys::key;

/// A responder on 127.0.0.1 (one core) serving the fixture key `key_text`, with
/// `server_id` and `faults`.
pub fn responder(key_text: &str, server_id: u64, faults: Faults) -> ResponderHandle {
    let mut cfg = ResponderConfig::new(vec![key(key_text)]);
    cfg.server_id = Some(server_id);
    cfg.faults = faults;
    rl_responder::spawn(cfg).expect("responder starts")
}

/// The endpoint of a running responder.
pub fn endpoint(r: &ResponderHandle) -> Endpoint {
    Endpoint {
        server_id: r.server_id(),
        addr: r.addr(),
    }
}

/// `ID@IP:PORT` of a running responder, as the tools' `--endpoint` takes it.
pub fn endpoint_arg(r: &ResponderHandle) -> String {
    endpoint(r).to_string()
}
