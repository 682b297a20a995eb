//! Engine configuration: the builder's options, their validation, and the errors of
//! `EngineBuilder::build()`.
//!
//! Owns: [`Cores`], [`DnsConfig`], [`BuildError`], the validated [`EngineConfig`] and the
//! core selection.
//! Must not touch: sockets, threads (build() starts them in `mod.rs` only after
//! validation succeeded). Errors never contain the API key.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::key::ApiKey;
use crate::machine::{Endpoint, MAX_ENDPOINTS};
use crate::policy::RequestPolicy;

/// Which CPUs run engine cores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cores {
    /// `n` cores, pinned to the last `n` CPUs (CPU 0 is left to the application when
    /// possible).
    Count(usize),
    /// One core per listed CPU id.
    List(Vec<usize>),
}

/// Discovery through DNS (docs/protocol.md §13).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsConfig {
    /// Service domain; `None` = the key's default domain.
    pub domain: Option<String>,
    /// DNS server; `None` = the system resolver's first nameserver.
    pub server: Option<SocketAddr>,
}

/// Why the engine could not be built. Configuration errors are found before any I/O.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The key, policy or an option is invalid.
    #[error("invalid configuration: {0}")]
    Config(#[from] ConfigError),
    /// An option is out of range.
    #[error("invalid engine option: {0}")]
    Option(#[from] OptionError),
    /// The per-core structures sized from the configured limits (completion slots,
    /// queues) could not be allocated: lower `in_flight_per_core` or the core count.
    #[error("not enough memory for the configured in-flight limits")]
    OutOfMemory,
    /// A core's socket could not be created or bound.
    #[error("engine socket setup failed: {0:?}")]
    Socket(io::ErrorKind),
    /// A core's thread could not start.
    #[error("engine core {core} could not start: {kind:?}")]
    Executor {
        /// Core index.
        core: usize,
        /// The underlying error.
        kind: io::ErrorKind,
    },
}

/// An engine option out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// Zero cores, or a CPU id that does not exist.
    #[error("bad core selection (count {count}, cpus available {available})")]
    BadCores {
        /// Cores asked for.
        count: usize,
        /// CPUs on this machine.
        available: usize,
    },
    /// Static endpoints: none, or more than 64.
    #[error("static endpoint list must hold 1..=64 endpoints, has {0}")]
    BadEndpointCount(usize),
    /// Static endpoint with server id 0.
    #[error("server id 0 is not valid")]
    ZeroServerId,
    /// In-flight limit per core of 0 or above 2^24.
    #[error("in-flight limit per core must be 1..=16777216, is {0}")]
    BadInFlight(usize),
    /// Report interval 0 or above 10 s.
    #[error("report interval must be 1 ms..=10 s")]
    BadReportInterval,
    /// Sockets per core outside 2..=63.
    #[error("sockets per core must be 2..=63, is {0}")]
    BadMaxSockets(usize),
}

/// Where endpoints come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Static(Vec<Endpoint>),
    Dns {
        domain: String,
        server: Option<SocketAddr>,
    },
}

/// Validated configuration.
#[derive(Clone, Debug)]
pub(crate) struct EngineConfig {
    pub key: ApiKey,
    pub policy: RequestPolicy,
    pub cpus: Vec<usize>,
    pub source: Source,
    pub recv_buf: usize,
    pub send_buf: usize,
    pub in_flight_per_core: usize,
    pub report_interval: Duration,
    pub max_sockets: usize,
    pub spin: Option<Duration>,
}

/// Number of CPUs this process may run on.
pub(crate) fn available_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// Resolves the core selection to CPU ids.
pub(crate) fn resolve_cores(cores: Option<&Cores>) -> Result<Vec<usize>, OptionError> {
    let available = available_cpus();
    match cores {
        None => {
            let n = available.saturating_sub(1).max(1);
            Ok((available - n..available).collect())
        }
        Some(Cores::Count(n)) => {
            if *n == 0 {
                return Err(OptionError::BadCores {
                    count: 0,
                    available,
                });
            }
            // More cores than CPUs: wrap around (useful for tests on small machines).
            let first = available.saturating_sub(*n);
            Ok((0..*n).map(|i| (first + i) % available).collect())
        }
        Some(Cores::List(list)) => {
            if list.is_empty() || list.iter().any(|c| *c >= available) {
                return Err(OptionError::BadCores {
                    count: list.len(),
                    available,
                });
            }
            Ok(list.clone())
        }
    }
}

/// Validates a static endpoint list.
pub(crate) fn check_endpoints(eps: &[Endpoint]) -> Result<(), OptionError> {
    if eps.is_empty() || eps.len() > MAX_ENDPOINTS {
        return Err(OptionError::BadEndpointCount(eps.len()));
    }
    if eps.iter().any(|e| e.server_id == 0) {
        return Err(OptionError::ZeroServerId);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn core_selection() {
        let n = available_cpus();
        let d = resolve_cores(None).unwrap();
        assert_eq!(d.len(), n.saturating_sub(1).max(1));
        assert!(resolve_cores(Some(&Cores::Count(0))).is_err());
        assert_eq!(resolve_cores(Some(&Cores::Count(3))).unwrap().len(), 3);
        assert!(resolve_cores(Some(&Cores::List(vec![n]))).is_err());
        assert_eq!(resolve_cores(Some(&Cores::List(vec![0]))).unwrap(), vec![0]);
    }
}
