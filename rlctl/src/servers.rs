//! Where rlctl's servers come from: DNS discovery of `--domain` (or of the key's default
//! domain) through `--dns-server`, or the static `--endpoint` list.
//!
//! Owns: the choice between static endpoints and DNS, and the default domain rule. Must
//! not touch: output, the request policy; DNS itself is the engine's `discovery`, the
//! text of its failures `rl_toolkit::words`.

use std::fmt;
use std::time::Duration;

use ratelimitly_engine::discovery::{self, Discovery, DiscoveryError, SRV_PREFIX};
use ratelimitly_engine::key_source::KeyLoadError;
use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::key::ApiKey;

use crate::cli::{DnsOpts, ServerOpts};

/// Why servers could not be determined.
#[derive(Debug)]
pub enum ServersError {
    /// No `--domain` and no key for the default domain.
    NoDomain,
    /// DNS discovery of `domain` failed.
    Discovery {
        /// The domain queried (its SRV name is `_ratelimitly._udp.<domain>`).
        domain: String,
        /// Why.
        error: DiscoveryError,
    },
}

impl fmt::Display for ServersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoDomain => KeyLoadError::Missing.fmt(f),
            Self::Discovery { domain, error } => f.write_str(&rl_toolkit::words::discovery_failed(
                &format!("{SRV_PREFIX}{domain}"),
                error,
            )),
        }
    }
}

/// Resolves `--domain`, else the key's default domain; returns the domain and what DNS
/// gave.
pub fn discover(dns: &DnsOpts, key: Option<&ApiKey>) -> Result<(String, Discovery), ServersError> {
    let domain = match (&dns.domain, key) {
        (Some(d), _) => d.clone(),
        (None, Some(k)) => k.default_domain(),
        (None, None) => return Err(ServersError::NoDomain),
    };
    let timeout = Duration::from_millis(dns.dns_timeout_ms);
    match discovery::resolve(&domain, dns.dns_server, timeout) {
        Ok(d) => Ok((domain, d)),
        Err(error) => Err(ServersError::Discovery { domain, error }),
    }
}

/// Endpoints from `--endpoint`, or from DNS.
pub fn endpoints_for(servers: &ServerOpts, key: &ApiKey) -> Result<Vec<Endpoint>, ServersError> {
    if !servers.endpoint.is_empty() {
        return Ok(servers.endpoint.clone());
    }
    discover(&servers.dns, Some(key)).map(|(_, d)| discovery::endpoints(&d))
}
