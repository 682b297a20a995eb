//! Engine configuration: the builder's options, their validation, and the errors of
//! `EngineBuilder::build()`.
//!
//! Owns: [`Cores`], [`DnsConfig`], [`BuildError`], the one declaration of the settings
//! (`Settings`, the cores' part `CoreSettings`), their one validation into `Validated`,
//! and the core selection. The plain values one core's sans-IO state is built from are
//! `core::CoreConfig`, made from these by `super::core_setup`.
//! Must not touch: sockets, threads (`builder.rs` starts them only after validation
//! succeeded). Errors never contain the API key.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use super::consts::{
    DEFAULT_IO_BACKEND, DEFAULT_SOCKET_BUFFER, MAX_SOCKETS_PER_CORE, REPORT_INTERVAL_RANGE,
};
use crate::engine::core::{
    DEFAULT_IN_FLIGHT, DEFAULT_MAX_SOCKETS, DEFAULT_REPORT_INTERVAL, MAX_IN_FLIGHT,
};
use crate::proto::error::ConfigError;
use crate::proto::key::ApiKey;
use crate::proto::machine::{Endpoint, MAX_ENDPOINTS};
use crate::proto::policy::RequestPolicy;

/// Which CPUs run engine cores. CPUs are always taken from the process's own affinity
/// set (`sched_getaffinity`), so a cpuset, `taskset` or a Kubernetes static CPU policy
/// that hands the process CPUs 6-7 is honoured; ids are never assumed to start at 0.
/// Without this option the engine runs one core, on the last CPU of that set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cores {
    /// `n` cores, pinned to the last `n` CPUs of the affinity set (the first ones are
    /// left to the application when possible). More cores than allowed CPUs wrap around
    /// (useful for tests on small machines).
    Count(usize),
    /// One core per listed CPU id; every id must be in the affinity set.
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
#[non_exhaustive]
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
    /// A core's I/O backend could not start: with `Uring`, io_uring is refused here
    /// (seccomp profiles of container runtimes block it: choose `Auto` or `Mmsg`).
    #[error(
        "engine core {core}: the {backend} I/O backend could not start ({kind:?}); where io_uring is refused, use the auto or mmsg backend"
    )]
    IoBackend {
        /// The core.
        core: usize,
        /// The backend asked for.
        backend: crate::udp::BackendChoice,
        /// The system's error.
        kind: io::ErrorKind,
    },
    /// The OS gave no randomness to seed a core's unique ids and nonces.
    #[error("no OS randomness for unique ids and nonces")]
    NoRandomness,
    /// DNS SRV discovery was configured (a domain, or no static endpoints), but the
    /// engine was built without the `dns` feature: give static endpoints instead.
    #[error("DNS discovery was configured, but the engine was built without the `dns` feature")]
    DnsNotCompiled,
    /// The io_uring backend was asked for by name (`BackendChoice::Uring`, on a pinned
    /// core), but the engine was built without the `io-uring` feature: choose `Auto` or
    /// `Mmsg`, or enable the feature.
    #[error(
        "the io_uring backend was asked for, but the engine was built without the `io-uring` feature"
    )]
    UringNotCompiled,
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
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    /// Zero cores, or a CPU id outside the process's affinity set.
    #[error("bad core selection (count {count}, cpus available {available})")]
    BadCores {
        /// Cores asked for.
        count: usize,
        /// CPUs in the process's affinity set.
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
    /// Sockets per core outside 2..=1024.
    #[error("sockets per core must be 2..=1024, is {0}")]
    BadMaxSockets(usize),
}

/// Where endpoints come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    Static(Vec<Endpoint>),
    #[cfg(feature = "dns")]
    Dns {
        domain: String,
        server: Option<SocketAddr>,
    },
}

/// The engine's settings, declared once: [`EngineBuilder`](super::EngineBuilder) holds
/// and mutates one, and [`Settings::validate`] checks it once, before any I/O, into the
/// [`Validated`] value the engine is prepared from.
#[derive(Clone)]
pub(crate) struct Settings {
    pub key: ApiKey,
    pub policy: RequestPolicy,
    /// `None` = one core on the last CPU of the affinity set.
    pub cores: Option<Cores>,
    /// Static endpoints (bypass DNS).
    pub endpoints: Option<Vec<Endpoint>>,
    /// DNS discovery options (used when `endpoints` is `None`).
    pub dns: Option<DnsConfig>,
    /// What each core reads.
    pub core: CoreSettings,
}

/// The settings every core (and the handle) reads, kept as they are in
/// `Shared` (`super::shared`) once validated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CoreSettings {
    /// SO_RCVBUF of every core socket (0 = system default).
    pub recv_buf: usize,
    /// SO_SNDBUF of every core socket (0 = system default).
    pub send_buf: usize,
    /// Requests in flight per core (1..=2^24).
    pub in_flight_per_core: usize,
    /// Latency-report flush interval (1 ms..=10 s).
    pub report_interval: Duration,
    /// Most sockets one core holds open (steering; 2..=1024).
    pub max_sockets: usize,
    /// Busy-poll of the queue before a core parks (`None` = park at once).
    pub spin: Option<Duration>,
    /// The cores' I/O backend choice.
    pub io_backend: crate::udp::BackendChoice,
    /// GSO sends / GRO receives on.
    pub gso: bool,
    /// The cores run as tasks on the application's runtime (`EngineBuilder::runtime`);
    /// validation then turns spinning off.
    pub hosted: bool,
}

/// Settings that passed [`Settings::validate`]: the key and policy, the resolved CPUs
/// and endpoint source, and the cores' settings.
#[derive(Clone)]
pub(crate) struct Validated {
    pub key: ApiKey,
    pub policy: RequestPolicy,
    pub cpus: Vec<usize>,
    pub source: Source,
    pub core: CoreSettings,
}

impl Settings {
    /// The defaults for `key`.
    pub(crate) fn new(key: ApiKey) -> Settings {
        Settings {
            key,
            policy: RequestPolicy::default(),
            cores: None,
            endpoints: None,
            dns: None,
            core: CoreSettings {
                recv_buf: DEFAULT_SOCKET_BUFFER,
                send_buf: DEFAULT_SOCKET_BUFFER,
                in_flight_per_core: DEFAULT_IN_FLIGHT,
                report_interval: DEFAULT_REPORT_INTERVAL,
                max_sockets: DEFAULT_MAX_SOCKETS,
                spin: None,
                io_backend: DEFAULT_IO_BACKEND,
                gso: true,
                hosted: false,
            },
        }
    }

    /// Checks every setting (no I/O): the policy against the key's limits, the core
    /// selection, the endpoints or the DNS source, and the cores' ranges.
    pub(crate) fn validate(self) -> Result<Validated, BuildError> {
        self.policy
            .check_key(&self.key)
            .map_err(|e| BuildError::Config(ConfigError::Policy(e)))?;
        let cpus = resolve_cores(self.cores.as_ref())?;
        let source = match (self.endpoints, self.dns) {
            (Some(eps), _) => {
                check_endpoints(&eps)?;
                Source::Static(eps)
            }
            #[cfg(not(feature = "dns"))]
            (None, _) => return Err(BuildError::DnsNotCompiled),
            #[cfg(feature = "dns")]
            (None, dns) => {
                let dns = dns.unwrap_or_default();
                let domain = dns.domain.unwrap_or_else(|| self.key.default_domain());
                Source::Dns {
                    domain,
                    server: dns.server,
                }
            }
        };
        let mut core = self.core;
        if core.in_flight_per_core == 0 || core.in_flight_per_core > MAX_IN_FLIGHT {
            return Err(OptionError::BadInFlight(core.in_flight_per_core).into());
        }
        let (shortest, longest) = REPORT_INTERVAL_RANGE;
        if core.report_interval < shortest || core.report_interval > longest {
            return Err(OptionError::BadReportInterval.into());
        }
        if !(2..=MAX_SOCKETS_PER_CORE).contains(&core.max_sockets) {
            return Err(OptionError::BadMaxSockets(core.max_sockets).into());
        }
        if !core.io_backend.compiled() {
            return Err(BuildError::UringNotCompiled);
        }
        if core.hosted {
            core.spin = None;
        }
        Ok(Validated {
            key: self.key,
            policy: self.policy,
            cpus,
            source,
            core,
        })
    }
}

/// The CPU ids this process may run on (its `sched_getaffinity` set), ascending.
/// Falls back to `0..available_parallelism` when the set cannot be read.
pub(crate) fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set. sched_getaffinity writes at
    // most size_of::<cpu_set_t>() bytes into the set we own.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above: the pointer and length describe the set we own.
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc == 0 {
        let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: CPU_ISSET reads the set we own; every index is below its capacity.
        let cpus: Vec<usize> = (0..max)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect();
        if !cpus.is_empty() {
            return cpus;
        }
    }
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (0..n).collect()
}

/// Resolves the core selection to CPU ids of the process's affinity set.
pub(crate) fn resolve_cores(cores: Option<&Cores>) -> Result<Vec<usize>, OptionError> {
    select_cores(cores, &allowed_cpus())
}

/// [`resolve_cores`] against a given affinity set (ascending, non-empty).
fn select_cores(cores: Option<&Cores>, allowed: &[usize]) -> Result<Vec<usize>, OptionError> {
    let available = allowed.len();
    let count = match cores {
        None => 1,
        Some(Cores::Count(n)) => *n,
        Some(Cores::List(list)) => {
            if list.is_empty() || list.iter().any(|c| !allowed.contains(c)) {
                return Err(OptionError::BadCores {
                    count: list.len(),
                    available,
                });
            }
            return Ok(list.clone());
        }
    };
    if count == 0 || available == 0 {
        return Err(OptionError::BadCores { count, available });
    }
    // The last `count` CPUs of the set; more than the set holds wraps around.
    let first = available.saturating_sub(count);
    Ok((0..count)
        .map(|i| allowed[(first + i) % available])
        .collect())
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
        let allowed = allowed_cpus();
        let last = *allowed.last().unwrap();
        // Default: one core, on the last CPU the process may use.
        assert_eq!(resolve_cores(None).unwrap(), vec![last]);
        assert!(resolve_cores(Some(&Cores::Count(0))).is_err());
        assert_eq!(resolve_cores(Some(&Cores::Count(3))).unwrap().len(), 3);
        assert!(
            resolve_cores(Some(&Cores::Count(3)))
                .unwrap()
                .iter()
                .all(|c| allowed.contains(c))
        );
        assert!(resolve_cores(Some(&Cores::List(vec![last + 1]))).is_err());
        assert!(resolve_cores(Some(&Cores::List(vec![]))).is_err());
        assert_eq!(
            resolve_cores(Some(&Cores::List(vec![allowed[0]]))).unwrap(),
            vec![allowed[0]]
        );
    }

    /// A cpuset that does not start at CPU 0 (e.g. `taskset -c 6,7` or a Kubernetes
    /// static CPU policy): every choice stays inside it.
    #[test]
    fn core_selection_in_a_set_not_starting_at_zero() {
        let set = [6, 7];
        assert_eq!(select_cores(None, &set).unwrap(), vec![7]);
        assert_eq!(
            select_cores(Some(&Cores::Count(2)), &set).unwrap(),
            vec![6, 7]
        );
        assert_eq!(
            select_cores(Some(&Cores::Count(3)), &set).unwrap(),
            vec![6, 7, 6]
        );
        assert_eq!(
            select_cores(Some(&Cores::List(vec![6])), &set).unwrap(),
            vec![6]
        );
        assert!(select_cores(Some(&Cores::List(vec![0])), &set).is_err());
        assert!(select_cores(Some(&Cores::Count(1)), &[]).is_err());
    }

    /// The process's real affinity set is what the engine reads.
    #[test]
    fn allowed_cpus_matches_the_affinity_mask() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        assert!(cpus.windows(2).all(|w| w[0] < w[1]));
        assert!(cpus.len() <= std::thread::available_parallelism().unwrap().get());
    }
}
