//! Where rlctl's servers come from: DNS discovery of `--domain` (or of the key's default
//! domain) through `--dns-server`, or the static `--endpoint` list.
//!
//! Owns: the choice between static endpoints and DNS, and the default domain rule. Must
//! not touch: output, the request policy; DNS itself is the engine's `discovery`.

use std::time::Duration;

use ratelimitly_engine::discovery::{self, Discovery, DiscoveryError};
use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::key::ApiKey;

use crate::cli::{DnsOpts, ServerOpts};

/// Why servers could not be determined.
#[derive(Debug)]
pub enum ServersError {
    /// No `--domain` and no key for the default domain.
    NoDomain,
    /// DNS discovery failed.
    Discovery(DiscoveryError),
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
    discovery::resolve(&domain, dns.dns_server, timeout)
        .map(|d| (domain, d))
        .map_err(ServersError::Discovery)
}

/// Endpoints from `--endpoint`, or from DNS.
pub fn endpoints_for(servers: &ServerOpts, key: &ApiKey) -> Result<Vec<Endpoint>, DiscoveryError> {
    if !servers.endpoint.is_empty() {
        return Ok(servers.endpoint.clone());
    }
    match discover(&servers.dns, Some(key)) {
        Ok((_, d)) => Ok(discovery::endpoints(&d)),
        Err(ServersError::Discovery(e)) => Err(e),
        Err(ServersError::NoDomain) => Err(DiscoveryError::NoServer),
    }
}
