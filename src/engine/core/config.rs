//! What one core's sans-IO state is built from.
//!
//! Owns: [`CoreConfig`]. Must not touch: the engine's settings and their validation
//! (the runtime's), sockets.

use std::time::Duration;

use super::consts::{DEFAULT_IN_FLIGHT, DEFAULT_MAX_SOCKETS, DEFAULT_REPORT_INTERVAL};
use crate::proto::error::ConfigError;
use crate::proto::key::ApiKey;
use crate::proto::machine::Plan;
use crate::proto::policy::RequestPolicy;
use crate::proto::wire::Auth;

/// What one core's state is built from, as plain values: the key's authentication, the
/// request policy and the core's limits. The engine's runtime builds it from its validated
/// settings; a simulation or a fuzz target with [`CoreConfig::new`].
#[derive(Clone)]
pub struct CoreConfig {
    /// The core's index.
    pub(crate) index: usize,
    /// The key's authentication (seal and open).
    pub(crate) auth: Auth,
    /// The policy's constants as the request machines take them.
    pub(crate) plan: Plan,
    /// The request policy (its horizon bounds the latency histograms).
    pub(crate) policy: RequestPolicy,
    /// Requests in flight at once (1..=2^24; beyond it a request fails `Overloaded`).
    pub in_flight: usize,
    /// Most sockets open at once (steering; at least 2).
    pub max_sockets: usize,
    /// Latency-report flush interval.
    pub report_interval: Duration,
}

impl std::fmt::Debug for CoreConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // the authentication holds key material: never printed
        f.debug_struct("CoreConfig")
            .field("index", &self.index)
            .field("in_flight", &self.in_flight)
            .field("max_sockets", &self.max_sockets)
            .field("report_interval", &self.report_interval)
            .finish_non_exhaustive()
    }
}

impl CoreConfig {
    /// Core `index` for `key` under `policy`, with the engine's default limits; fails
    /// when the policy exceeds the key's limits (as `EngineBuilder::build` does).
    pub fn new(
        index: usize,
        key: &ApiKey,
        policy: RequestPolicy,
    ) -> Result<CoreConfig, ConfigError> {
        policy.check_key(key).map_err(ConfigError::Policy)?;
        Ok(CoreConfig {
            index,
            auth: Auth::new(key),
            plan: Plan::new(&policy),
            policy,
            in_flight: DEFAULT_IN_FLIGHT,
            max_sockets: DEFAULT_MAX_SOCKETS,
            report_interval: DEFAULT_REPORT_INTERVAL,
        })
    }
}
