//! The raw client's shared configuration: the key's auth, the request templates
//! (pre-encoded rate-request PDUs, one per bucket pattern), the servers (oldest first)
//! and the I/O settings.
//!
//! Owns encoding the templates once per run. Must not touch sockets or threads.

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::proto::wire::{self, Auth, GuardSpec, ResourceSpec};
use ratelimitly_engine::udp::BackendChoice;

use crate::workload::{self, Workload};

/// What every raw thread shares.
pub struct RawConfig {
    pub auth: Auth,
    pub key_id: u64,
    /// Encoded rate-request PDUs; request `j` uses `templates[j % len]`.
    pub templates: Vec<Vec<u8>>,
    /// Every endpoint (at most 64); each request goes to all, in this order, the
    /// decider last. The order sets how many completion resends follow when the
    /// responders share a CPU (loopback runs): the responder woken last by a send tends
    /// to answer first, and every answer in before the decider's spares a resend.
    /// Decider first, raw made about 0.5 resends per decision in some runs, while the
    /// engine made 0.8–0.9 in most runs whichever server it sent to first
    /// (`loadgen --compare`, two servers); decider last, raw makes the engine's.
    pub targets: Vec<SocketAddr>,
    /// Index in `targets` of the server whose answer decides: the oldest live one.
    pub decider: usize,
    pub horizon: Duration,
    pub io: IoSettings,
}

/// How a raw thread moves datagrams (the engine's settings of the run).
#[derive(Clone, Debug)]
pub struct IoSettings {
    pub backend: BackendChoice,
    pub gso: bool,
    pub batch: usize,
    pub socket_buffer: usize,
    /// Busy-poll (true) or sleep in the driver's wait (false) while waiting for answers.
    pub spin: bool,
    /// Resend to the servers that had not answered when the decision came.
    pub completion_delivery: bool,
    /// After this long without the decider's answer, the request is sent once more to
    /// every server (the policy's first replay) and any server's answer decides.
    pub fallback: Duration,
    /// Whether the policy replays at all (without replays only the decider decides).
    pub replay: bool,
}

/// Why the raw client could not be prepared.
#[derive(Debug)]
pub enum RawError {
    /// A template PDU did not encode.
    Encode(wire::EncodeError),
    /// A bucket or tracker definition was refused.
    Config(ratelimitly_engine::proto::error::ConfigError),
    /// Every endpoint is dead.
    NoLiveEndpoint,
}

impl std::fmt::Display for RawError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RawError::Encode(e) => write!(f, "request template does not encode: {e}"),
            RawError::Config(e) => write!(f, "bad bucket or tracker: {e}"),
            RawError::NoLiveEndpoint => write!(f, "no live endpoint"),
        }
    }
}

impl RawConfig {
    pub fn new(
        key: &ratelimitly_engine::proto::key::ApiKey,
        work: &Workload,
        (targets, decider): (Vec<SocketAddr>, Option<usize>),
        horizon: Duration,
        io: IoSettings,
    ) -> Result<Self, RawError> {
        let Some(decider) = decider.filter(|d| *d < targets.len().min(64)) else {
            return Err(RawError::NoLiveEndpoint);
        };
        // The decider last: see `targets`.
        let mut targets = targets;
        let last = targets.remove(decider);
        targets.push(last);
        let decider = targets.len() - 1;
        let auth = Auth::new(key);
        let resources: Vec<ResourceSpec> = (0..work.buckets.min(4096))
            .map(|i| {
                let r = ratelimitly_engine::proto::ids::Resource::new(
                    Workload::bucket_name(i),
                    Duration::from_millis(u64::from(work.window_ms)),
                    work.rate_limit,
                )
                .map_err(RawError::Config)?;
                Ok(ResourceSpec {
                    bucket_id: r.id(),
                    window_ms: r.window_ms(),
                    rate_limit: r.rate_limit(),
                    tokens: 1,
                })
            })
            .collect::<Result<_, RawError>>()?;
        let guards: Vec<GuardSpec> = (0..work.guards)
            .map(|i| {
                let t = ratelimitly_engine::proto::ids::LatencyTracker::new(
                    Workload::tracker_name(i),
                    Duration::from_millis(u64::from(workload::TRACKER_TTL_MS)),
                    workload::TRACKER_MAX_SAMPLES,
                    workload::TRACKER_MIN_SAMPLES,
                )
                .map_err(RawError::Config)?;
                Ok(GuardSpec {
                    tracker_id: t.id(),
                    ttl_ms: t.ttl_ms(),
                    max_samples: t.max_samples(),
                    min_samples: t.min_samples(),
                    threshold_ms: workload::GUARD_THRESHOLD_MS,
                    current_latency_ms: 0,
                })
            })
            .collect::<Result<_, RawError>>()?;
        let mut templates = Vec::with_capacity(resources.len());
        let mut specs = Vec::with_capacity(work.resources_per_request);
        let mut out = [0u8; wire::MAX_DATAGRAM];
        for t in 0..resources.len() as u64 {
            specs.clear();
            specs.extend(work.buckets_of(t).map(|b| resources[b % resources.len()]));
            // Bounded so every sealed request fits one datagram.
            let n = wire::encode_rate_request_pdu(
                &mut out[..auth.max_pdu_len()],
                horizon.as_millis() as u32,
                &guards,
                &specs,
                &work.label,
            )
            .map_err(RawError::Encode)?;
            templates.push(out[..n].to_vec());
        }
        Ok(RawConfig {
            auth,
            key_id: key.key_id(),
            templates,
            targets,
            decider,
            horizon,
            io,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decider_is_sent_to_last() {
        let work = Workload {
            buckets: 1,
            resources_per_request: 1,
            guards: 0,
            label: String::new(),
            report_share: 0.0,
            window_ms: 1000,
            rate_limit: 100,
        };
        let io = IoSettings {
            backend: BackendChoice::Auto,
            gso: true,
            batch: 64,
            socket_buffer: 1 << 20,
            spin: false,
            completion_delivery: true,
            fallback: Duration::from_millis(20),
            replay: true,
        };
        let a = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let key = rl_testkit::keys::aes();
        let horizon = Duration::from_millis(60);
        let cfg = RawConfig::new(&key, &work, (vec![a(1), a(2), a(3)], Some(1)), horizon, io)
            .expect("config");
        assert_eq!(cfg.targets, vec![a(1), a(3), a(2)]);
        assert_eq!(cfg.decider, 2);
    }
}
