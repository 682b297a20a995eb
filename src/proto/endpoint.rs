//! Server endpoints: one address of one server, and its one text form `ID@IP:PORT`
//! (docs/protocol.md §7 for server ids, §13 for static endpoint lists).
//!
//! Owns: [`Endpoint`], its [`FromStr`] / [`Display`](fmt::Display) grammar and
//! [`EndpointParseError`]. Every tool that takes an endpoint on its command line (rlctl,
//! loadgen, the proxy) parses it here, so they all accept exactly the same text.
//! Must not touch: sockets, DNS, the request machine (it only stores endpoints).
//!
//! # Grammar
//!
//! ```text
//! endpoint  = server-id "@" address
//! server-id = nonzero-digit *digit      ; canonical decimal u64, 1..=18446744073709551615
//! address   = ipv4 ":" port | "[" ipv6 "]" ":" port
//! port      = decimal u16, 1..=65535
//! ```
//!
//! * The server id is canonical decimal, as in discovery target names (`s-<id>`): ASCII
//!   digits only, no sign (`+5` is refused), no leading zero (`07` is refused), no
//!   whitespace, and never 0 (id 0 is never a valid server).
//! * The address is what [`SocketAddr`]'s parser accepts for IPv4 and bracketed IPv6;
//!   port 0 is refused (nothing can be sent to it).
//! * [`Display`](fmt::Display) writes `ID@` followed by the address's own display form,
//!   so `text.parse::<Endpoint>()?.to_string()` gives back canonical text that parses
//!   to the same endpoint.
//!
//! The grammar is tested once, in `tests/text_forms.rs` (cases and a proptest round trip).

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

/// One address of one server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The server's id (smallest = oldest).
    pub server_id: u64,
    /// Where to send.
    pub addr: SocketAddr,
}

/// Why a text is not an `ID@IP:PORT` endpoint. Each variant names the rule that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointParseError {
    /// There is no `@` between the server id and the address.
    #[error("expected ID@IP:PORT (e.g. 7@127.0.0.1:4000 or 7@[::1]:4000)")]
    MissingAt,
    /// The server id is not canonical decimal in 1..=u64::MAX (empty, a sign, a leading
    /// zero, a non-digit, 0, or too large).
    #[error("server ID must be a decimal number > 0 (no sign, no leading zero)")]
    BadServerId,
    /// The address is not `IPv4:PORT` or `[IPv6]:PORT`.
    #[error("address must be IP:PORT, IPv6 as [::1]:PORT")]
    BadAddress,
    /// The port is 0.
    #[error("port must be 1..=65535")]
    PortZero,
}

/// Parses a canonical decimal server id (see the module docs).
fn parse_server_id(text: &str) -> Option<u64> {
    let canonical =
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && !text.starts_with('0');
    if canonical { text.parse().ok() } else { None }
}

impl FromStr for Endpoint {
    type Err = EndpointParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (id, addr) = text.split_once('@').ok_or(EndpointParseError::MissingAt)?;
        let server_id = parse_server_id(id).ok_or(EndpointParseError::BadServerId)?;
        let addr: SocketAddr = addr.parse().map_err(|_| EndpointParseError::BadAddress)?;
        if addr.port() == 0 {
            return Err(EndpointParseError::PortZero);
        }
        Ok(Endpoint { server_id, addr })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.server_id, self.addr)
    }
}
