//! The one wording of each failure the tools name, so that rlctl and loadgen say the same
//! thing about the same cause.
//!
//! Owns: [`Finding`] (what a tool saw, or did not see, of one endpoint when answers did
//! not come) and its text, the text of a discovery failure ([`discovery_failed`]) and of
//! a run without a decision ([`no_decision`]). Must not touch: sockets, the request
//! machine; the engine's own error texts (`Failure`, `DiscoveryError`) are quoted, not
//! rewritten.

use std::fmt;
use std::net::SocketAddr;

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::wire::DropReason;

use crate::errqueue::{IcmpError, IcmpKind};

/// What a tool saw of one endpoint (`ID@IP:PORT`) while its requests went unanswered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// An ICMP error answered the datagrams sent to the endpoint.
    Icmp(IcmpError),
    /// Neither an answer nor an ICMP error came back.
    NoAnswer,
    /// A response came from the endpoint's address with another server id than the
    /// endpoint names (the engine drops it: the request only believes the ids it was
    /// given).
    OtherServer {
        /// The server id in the response.
        actual: u64,
    },
    /// Datagrams came back that this key cannot open or parse (`count` of them; the first
    /// one's reason).
    Unreadable {
        /// Why the first one was dropped.
        reason: DropReason,
        /// How many.
        count: u32,
    },
    /// A valid response came back: the endpoint answers this key.
    Answered,
}

/// A [`Finding`] about one endpoint, as printed: `ID@IP:PORT: what`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointFinding {
    /// The endpoint as given (its server id is the one it claims).
    pub endpoint: Endpoint,
    /// What was seen.
    pub finding: Finding,
}

impl fmt::Display for EndpointFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ep, addr) = (&self.endpoint, self.endpoint.addr);
        write!(f, "{ep}: ")?;
        match &self.finding {
            Finding::Icmp(e) => write_icmp(f, e, addr),
            Finding::NoAnswer => write!(
                f,
                "no answer from a reachable server at {addr}: the server drops datagrams \
                 whose key id or authentication it does not know"
            ),
            Finding::OtherServer { actual } => write!(
                f,
                "a datagram from server id {actual} at {addr}, but the endpoint claims server \
                 id {}: answers of a server id the request was not given are dropped",
                ep.server_id
            ),
            Finding::Unreadable { reason, count } => write!(
                f,
                "{count} datagram(s) from {addr} that this key cannot read ({reason}): \
                 another key or a broken server"
            ),
            Finding::Answered => write!(f, "server {} at {addr} answers", ep.server_id),
        }
    }
}

impl fmt::Display for IcmpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IcmpKind::PortUnreachable => f.write_str("port unreachable"),
            IcmpKind::HostUnreachable => f.write_str("host unreachable"),
            IcmpKind::NetUnreachable => f.write_str("network unreachable"),
            IcmpKind::Other(errno) => write!(
                f,
                "ICMP error ({})",
                std::io::Error::from_raw_os_error(*errno)
            ),
        }
    }
}

/// The text of an ICMP error about datagrams sent to `addr`.
fn write_icmp(f: &mut fmt::Formatter<'_>, e: &IcmpError, addr: SocketAddr) -> fmt::Result {
    write!(f, "{} from {addr}", e.kind)?;
    if e.kind == IcmpKind::PortUnreachable {
        f.write_str(" (ICMP: nothing listens on that port, connection refused)")?;
    }
    match e.reporter {
        Some(ip) if ip != addr.ip() => write!(f, ", reported by {ip}"),
        _ => Ok(()),
    }
}

/// The findings, one per line, each line starting with `indent`.
pub fn lines(findings: &[EndpointFinding], indent: &str) -> String {
    findings
        .iter()
        .map(|x| format!("{indent}{x}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The findings on one line, `; `-separated (for one-line errors and JSON).
pub fn one_line(findings: &[EndpointFinding]) -> String {
    findings
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// A DNS discovery of `domain` that failed with `error` (the engine's `DiscoveryError`).
pub fn discovery_failed(domain: &str, error: &impl fmt::Display) -> String {
    format!("discovery of {domain} failed: {error}")
}

/// A run of `client` in which no request was decided; `what` says what the requests
/// ended in instead (e.g. `1280 timed out`).
pub fn no_decision(client: &str, what: &str) -> String {
    format!("{client}: no decision in the measurement window ({what})")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep() -> Endpoint {
        "7@127.0.0.1:4000".parse().unwrap()
    }

    #[test]
    fn each_finding_names_the_endpoint_and_the_cause() {
        let text = |finding| {
            EndpointFinding {
                endpoint: ep(),
                finding,
            }
            .to_string()
        };
        let icmp = Finding::Icmp(IcmpError {
            dest: Some(ep().addr),
            kind: IcmpKind::PortUnreachable,
            reporter: None,
        });
        assert_eq!(
            text(icmp),
            "7@127.0.0.1:4000: port unreachable from 127.0.0.1:4000 (ICMP: nothing listens \
             on that port, connection refused)"
        );
        assert!(text(Finding::NoAnswer).contains(
            "no answer from a reachable server at 127.0.0.1:4000: the server drops datagrams \
             whose key id or authentication it does not know"
        ));
        let other = text(Finding::OtherServer { actual: 9 });
        assert!(other.contains("server id 9") && other.contains("claims server id 7"));
        let bad = text(Finding::Unreadable {
            reason: DropReason::AuthFailed,
            count: 2,
        });
        assert!(bad.contains("2 datagram(s)") && bad.contains("AES-GCM authentication failed"));
    }
}
