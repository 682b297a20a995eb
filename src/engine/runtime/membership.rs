//! Membership: the current endpoint set, and the background discovery thread.
//!
//! Owns: the atomically swapped endpoint snapshot (`ArcSwap`; a request clones the
//! `Arc`, never the endpoints), and the discovery thread that resolves DNS (one
//! `discovery::Resolver`, kept for the thread's life so its cache and nameserver
//! failover state carry over) every 300 s or sooner by the smallest SRV TTL, keeps the
//! last good set when a refresh fails or finds nothing, and refreshes at once (at most
//! once a second, bypassing the cache) when a core finds the set empty. Changes and
//! failures are `tracing` events (target `ratelimitly_engine::engine::runtime::membership`).
//! Must not touch: the request path (cores only load the snapshot and may ask for a
//! refresh), sockets of the cores.

#[cfg(feature = "dns")]
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
#[cfg(feature = "dns")]
use std::thread::JoinHandle;
use std::thread::Thread;
#[cfg(feature = "dns")]
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

#[cfg(feature = "dns")]
use super::consts::{DNS_TIMEOUT, FORCE_GAP, REFRESH, RETRY_AFTER_FAILURE};
#[cfg(feature = "dns")]
use crate::discovery;
#[cfg(feature = "dns")]
use crate::proto::machine::MAX_ENDPOINTS;
use crate::proto::machine::{Endpoint, Snapshot};

/// The current endpoint set, shared by every core.
pub(crate) struct Membership {
    current: ArcSwap<Snapshot>,
    stop: AtomicBool,
    force: AtomicBool,
    thread: Mutex<Option<Thread>>,
    /// Successful resolutions (for tests and stats).
    pub refreshes: AtomicU64,
    /// Failed or empty resolutions.
    pub refresh_failures: AtomicU64,
}

impl Membership {
    pub(crate) fn new(initial: Vec<Endpoint>) -> Arc<Membership> {
        Arc::new(Membership {
            current: ArcSwap::from_pointee(Arc::from(initial)),
            stop: AtomicBool::new(false),
            force: AtomicBool::new(false),
            thread: Mutex::new(None),
            refreshes: AtomicU64::new(0),
            refresh_failures: AtomicU64::new(0),
        })
    }

    /// The current snapshot (one `Arc` clone).
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot::clone(&self.current.load())
    }

    pub(crate) fn store(&self, eps: Vec<Endpoint>) {
        self.current.store(Arc::new(Arc::from(eps)));
    }

    /// Asks the discovery thread for an early refresh (throttled there).
    pub(crate) fn request_refresh(&self) {
        if !self.force.swap(true, Ordering::AcqRel)
            && let Ok(t) = self.thread.lock()
            && let Some(t) = t.as_ref()
        {
            t.unpark();
        }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Ok(t) = self.thread.lock()
            && let Some(t) = t.as_ref()
        {
            t.unpark();
        }
    }
}

/// Starts the discovery thread; returns once the first resolution finished (success or
/// not), so a fresh engine has endpoints when DNS works.
#[cfg(feature = "dns")]
pub(crate) fn spawn_discovery(
    m: Arc<Membership>,
    domain: String,
    server: Option<SocketAddr>,
) -> std::io::Result<JoinHandle<()>> {
    let (ready_tx, ready_rx) = crossbeam_channel::bounded::<()>(1);
    let m2 = m.clone();
    let h = std::thread::Builder::new()
        .name("rl-discovery".into())
        .spawn(move || discovery_loop(m2, domain, server, ready_tx))?;
    *m.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(h.thread().clone());
    let _ = ready_rx.recv_timeout(DNS_TIMEOUT * (discovery::TOTAL_TIME_FACTOR + 1));
    Ok(h)
}

#[cfg(feature = "dns")]
fn discovery_loop(
    m: Arc<Membership>,
    domain: String,
    server: Option<SocketAddr>,
    ready: crossbeam_channel::Sender<()>,
) {
    let mut resolver = None;
    let mut last_attempt;
    let mut failed_before = false;
    loop {
        if m.stop.load(Ordering::Acquire) {
            return;
        }
        last_attempt = Instant::now();
        let forced = m.force.swap(false, Ordering::AcqRel);
        if resolver.is_none() {
            match discovery::Resolver::new(server, DNS_TIMEOUT) {
                Ok(r) => resolver = Some(r),
                Err(e) => tracing::warn!(error = %e, "DNS resolver could not be set up"),
            }
        }
        let result = match &resolver {
            Some(r) => {
                // A forced refresh (no endpoint) or a retry after a failure must ask the
                // nameservers, not the cache (which may hold the failed answer).
                if forced || failed_before {
                    r.clear_cache();
                }
                r.resolve(&domain)
            }
            None => Err(discovery::DiscoveryError::NoDnsServer),
        };
        let next = match result {
            Ok(d) if !d.servers.is_empty() => {
                failed_before = false;
                apply(&m, &domain, &d)
            }
            other => {
                failed_before = true;
                keep_after_failure(&m, &domain, other.err())
            }
        };
        let _ = ready.try_send(());
        if !wait_for_next(&m, &domain, last_attempt, last_attempt + next) {
            return;
        }
    }
}

/// Stores a good answer's endpoints (at most [`MAX_ENDPOINTS`]); returns when to ask again.
#[cfg(feature = "dns")]
fn apply(m: &Membership, domain: &str, d: &discovery::Discovery) -> Duration {
    let mut eps = discovery::endpoints(d);
    if eps.len() > MAX_ENDPOINTS {
        tracing::warn!(
            endpoints = eps.len(),
            kept = MAX_ENDPOINTS,
            "discovery found more endpoints than a request addresses"
        );
        eps.truncate(MAX_ENDPOINTS);
    }
    let old = m.snapshot();
    if old[..] != eps[..] {
        tracing::info!(
            %domain,
            servers = d.servers.len(),
            endpoints = eps.len(),
            previous = old.len(),
            oldest = d.oldest().map(|s| s.server_id),
            "discovery: endpoint set changed"
        );
    }
    m.store(eps);
    m.refreshes.fetch_add(1, Ordering::Relaxed);
    REFRESH.min(Duration::from_secs(u64::from(d.min_ttl_s.max(1))))
}

/// A failed discovery (`e`), or one that found no server (`None`): the last good set
/// stays; returns when to ask again (soon when there is none).
#[cfg(feature = "dns")]
fn keep_after_failure(
    m: &Membership,
    domain: &str,
    e: Option<discovery::DiscoveryError>,
) -> Duration {
    m.refresh_failures.fetch_add(1, Ordering::Relaxed);
    let kept = m.snapshot().len();
    match e {
        Some(e) => tracing::warn!(
            %domain, error = %e, kept_endpoints = kept,
            "discovery failed; keeping the last good endpoint set"
        ),
        None => tracing::warn!(
            %domain, kept_endpoints = kept,
            "discovery found no server; keeping the last good endpoint set"
        ),
    }
    if kept == 0 {
        FORCE_GAP
    } else {
        REFRESH.min(RETRY_AFTER_FAILURE)
    }
}

/// Sleeps until `due`, or until a forced refresh is allowed ([`FORCE_GAP`] after
/// `last_attempt`); false when the engine stops meanwhile.
#[cfg(feature = "dns")]
fn wait_for_next(m: &Membership, domain: &str, last_attempt: Instant, due: Instant) -> bool {
    loop {
        if m.stop.load(Ordering::Acquire) {
            return false;
        }
        let now = Instant::now();
        if now >= due {
            return true;
        }
        if m.force.load(Ordering::Acquire) && now >= last_attempt + FORCE_GAP {
            tracing::debug!(%domain, "discovery: forced refresh (no endpoint)");
            return true;
        }
        let wake = if m.force.load(Ordering::Acquire) {
            (last_attempt + FORCE_GAP).min(due)
        } else {
            due
        };
        std::thread::park_timeout(wake.saturating_duration_since(now));
    }
}
