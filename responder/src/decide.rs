//! Sans-IO decision logic: one inbound datagram + the time in, at most one response
//! datagram out (written into a caller-owned buffer).
//!
//! Owns: key lookup by the tenant TLV's key id, the drop rules (each counted), dedup
//! replay, atomic evaluation of guards and resources, latency report intake, response
//! sealing with a fresh random nonce (OS CSPRNG, buffered: [`crate::nonce`]), the
//! timestamp freshness check (docs/protocol.md §8, [`is_stale`]), and the decision-level faults (steering, fixed decisions,
//! broken replies). Must not touch: sockets, clocks (time is the `now` parameter), threads;
//! drops/delays/duplicates on the network are the runner's.
//!
//! State (dedup, buckets, trackers) lives in a [`Shared`] behind one mutex so that several
//! cores of one responder enforce one set of limits; the lock is held only for the
//! evaluation, never for crypto. Counters are per [`Responder`] (one writer).

use ratelimitly_engine::discovery::SERVER_ID_EPOCH_UNIX_S;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use ratelimitly_engine::proto::key::{ApiKey, AuthMode};
use ratelimitly_engine::proto::wire::{
    GUARD_BLOCK_LEN, GuardSpec, PDU_HEADER_LEN, RESOURCE_BLOCK_LEN, RateRequestView,
    ResourceResultSpec, encode_rate_response_pdu,
};

use crate::buckets::BucketTable;
use crate::dedup::{DedupStats, DedupTable};
use crate::faults::{BrokenReply, Faults, FixedDecision};
use crate::frame::{FrameError, KeyAuth, MAX_DATAGRAM, Tenant, tenant};
use crate::nonce::NoncePool;
use crate::pdu::{Inbound, MAX_GUARDS, MAX_RESOURCES};
use crate::trackers::{TrackerDef, TrackerTable};

macro_rules! counters {
    ($($(#[doc = $d:literal])* $name:ident,)*) => {
        /// Snapshot of a responder's counters (every drop reason and fault has one).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Counters { $($(#[doc = $d])* pub $name: u64,)* }

        /// Live counters of one core (single writer, any reader).
        #[derive(Debug, Default)]
        pub struct CounterSet { $($(#[doc = $d])* pub $name: AtomicU64,)* }

        impl CounterSet {
            /// Reads every counter.
            pub fn snapshot(&self) -> Counters {
                Counters { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }

        impl Counters {
            /// Adds `o` field by field.
            pub fn merge(&mut self, o: &Counters) { $(self.$name += o.$name;)* }
        }
    };
}

counters! {
    /// Datagrams received (every one, also those dropped by faults or rules).
    received,
    /// Rate requests decided (fresh or replayed from dedup).
    rate_requests,
    /// Response datagrams produced.
    answered,
    /// Fresh decisions that granted.
    granted,
    /// Fresh decisions that rejected.
    rejected,
    /// Duplicates answered from the dedup table without a second debit.
    dedup_hits,
    /// Latency report datagrams accepted (never answered).
    reports,
    /// Latency samples recorded.
    report_entries,
    /// Dropped: longer than 1200 bytes.
    drop_too_long,
    /// Dropped: tenant TLV, auth TLV or PDU malformed / truncated / wrong PDU type.
    drop_malformed,
    /// Dropped: key id not configured.
    drop_unknown_key,
    /// Dropped: auth TLV of another mode than the key's.
    drop_wrong_mode,
    /// Dropped: cookie does not match.
    drop_bad_cookie,
    /// Dropped: AES-GCM verification failed (or empty ciphertext).
    drop_auth_failed,
    /// Dropped: bucket table full of busy buckets.
    drop_bucket_table_full,
    /// Dropped: stale timestamp (docs/protocol.md §8): older than the request's dedup TTL plus
    /// [`STALE_GRACE_MS`] (reports: [`REPORT_MAX_AGE_MS`]), or more than
    /// [`MAX_FUTURE_MS`] ahead of the responder's clock.
    drop_stale,
    /// Dropped: the OS random source failed (no nonce, nothing sent).
    drop_rng_failed,
    /// Report samples dropped: tracker table full.
    tracker_table_full,
    /// Dedup entries evicted before their TTL (table full).
    dedup_overflow,
    /// Dedup entries currently held.
    dedup_len,
    /// Fault: responses sent with steering 0.
    fault_steered,
    /// Fault: decisions forced by a fixed decision.
    fault_fixed,
    /// Fault: broken replies produced.
    fault_broken,
    /// Fault: inbound datagrams dropped at random.
    fault_drop_in,
    /// Fault: responses dropped at random.
    fault_drop_out,
    /// Fault: responses delayed.
    fault_delayed,
    /// Fault: responses sent twice.
    fault_duplicated,
    /// Fault: inbound datagrams dropped while silent.
    fault_silent_drops,
    /// Delayed responses dropped because the delay queue was full.
    delay_queue_full,
    /// Receive errors other than "would block".
    recv_errors,
    /// Send errors (datagram lost).
    send_errors,
}

/// Clock-skew allowance added to a request's dedup TTL before its timestamp counts as
/// stale. (A duplicate that arrives within the grace but after its dedup entry expired
/// is decided again: dedup is best effort, docs/protocol.md §8.)
pub const STALE_GRACE_MS: u64 = 1_000;
/// Oldest latency report accepted.
pub const REPORT_MAX_AGE_MS: u64 = 10_000;
/// Furthest a timestamp may be ahead of the responder's clock.
pub const MAX_FUTURE_MS: u64 = 5_000;

/// True when a datagram stamped `ts_ms` is stale at `unix_ms` with age limit `max_age_ms`.
pub fn is_stale(ts_ms: u64, unix_ms: u64, max_age_ms: u64) -> bool {
    unix_ms.saturating_sub(ts_ms) > max_age_ms || ts_ms.saturating_sub(unix_ms) > MAX_FUTURE_MS
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Counts a dropped datagram under `counter` and logs it at debug with its reason (`why`),
/// its source and, once the tenant TLV was read, its key id. Returns `None` (nothing to
/// send). The drop counters of [`Counters`] are the totals of these reasons.
fn dropped(
    counter: &AtomicU64,
    source: SocketAddr,
    key_id: Option<u64>,
    why: &'static str,
) -> Option<usize> {
    inc(counter);
    tracing::debug!(%source, key_id, why, "datagram dropped");
    None
}

/// Sizes of the shared state.
#[derive(Clone, Copy, Debug)]
pub struct Capacities {
    /// Dedup entries.
    pub dedup: usize,
    /// Buckets.
    pub buckets: usize,
    /// Trackers.
    pub trackers: usize,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            dedup: 65_536,
            buckets: 1 << 20,
            trackers: 1 << 16,
        }
    }
}

struct State {
    dedup: DedupTable,
    buckets: BucketTable,
    trackers: TrackerTable,
}

/// State shared by every core of one responder.
pub struct Shared {
    state: Mutex<State>,
    epoch: Instant,
}

impl Shared {
    /// Fresh state; `epoch` is the origin of the millisecond clock used by the tables.
    pub fn new(caps: Capacities, epoch: Instant) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                dedup: DedupTable::new(caps.dedup),
                buckets: BucketTable::new(caps.buckets),
                trackers: TrackerTable::new(caps.trackers),
            }),
            epoch,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Dedup table counters.
    pub fn dedup_stats(&self) -> DedupStats {
        self.lock().dedup.stats()
    }

    fn ms(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.epoch).as_millis() as u64
    }
}

/// Default server id per docs/protocol.md §7: start time in seconds since 2025-01-01 in the upper
/// 41 bits, `low` (23 bits) below; never 0.
pub fn default_server_id(unix_s: u64, low: u64) -> u64 {
    let id = (unix_s.saturating_sub(SERVER_ID_EPOCH_UNIX_S) << 23) | (low & 0x7F_FFFF);
    id.max(1)
}

/// The decision logic of one core.
pub struct Responder {
    keys: Vec<KeyAuth>,
    by_id: HashMap<u64, usize>,
    shared: Arc<Shared>,
    counters: Arc<CounterSet>,
    server_id: u64,
    faults: Faults,
    responses: u64,
    nonces: NoncePool,
}

/// Configuration error of [`Responder::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// No key configured.
    #[error("no API key configured")]
    NoKeys,
    /// Two keys with one key id.
    #[error("two keys share key id {0}")]
    DuplicateKeyId(u64),
    /// Server id 0 is never valid.
    #[error("server id 0 is not valid")]
    ZeroServerId,
}

impl Responder {
    /// A single-core responder with its own state.
    pub fn new(
        keys: &[ApiKey],
        server_id: u64,
        caps: Capacities,
        epoch: Instant,
    ) -> Result<Self, DecideError> {
        Self::with_shared(
            keys,
            server_id,
            Shared::new(caps, epoch),
            Arc::new(CounterSet::default()),
        )
    }

    /// A responder core over `shared` state, counting into `counters`.
    pub fn with_shared(
        keys: &[ApiKey],
        server_id: u64,
        shared: Arc<Shared>,
        counters: Arc<CounterSet>,
    ) -> Result<Self, DecideError> {
        if keys.is_empty() {
            return Err(DecideError::NoKeys);
        }
        if server_id == 0 {
            return Err(DecideError::ZeroServerId);
        }
        let mut by_id = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            if by_id.insert(k.key_id(), i).is_some() {
                return Err(DecideError::DuplicateKeyId(k.key_id()));
            }
        }
        Ok(Self {
            keys: keys.iter().map(KeyAuth::new).collect(),
            by_id,
            shared,
            counters,
            server_id,
            faults: Faults::default(),
            responses: 0,
            nonces: NoncePool::new(),
        })
    }

    /// This responder's server id.
    pub fn server_id(&self) -> u64 {
        self.server_id
    }

    /// The live counters (shared handle).
    pub fn counter_set(&self) -> Arc<CounterSet> {
        self.counters.clone()
    }

    /// The shared state.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    /// Counter snapshot including the dedup table's.
    pub fn counters(&self) -> Counters {
        let mut c = self.counters.snapshot();
        let d = self.shared.dedup_stats();
        c.dedup_len = d.len as u64;
        c.dedup_overflow = d.overflow;
        c
    }

    /// Replaces the decision-level faults (steering, fixed decisions, broken replies;
    /// all deterministic) and restarts the steering count.
    pub fn set_faults(&mut self, faults: &Faults) {
        self.faults = faults.clone();
        self.responses = 0;
    }

    /// Handles one datagram received at `now` from `source`, without a wall clock: the
    /// timestamp check is skipped (tests with fixed timestamps). See [`handle_at`].
    ///
    /// [`handle_at`]: Self::handle_at
    pub fn handle(
        &mut self,
        datagram: &mut [u8],
        source: SocketAddr,
        now: Instant,
        out: &mut [u8],
    ) -> Option<usize> {
        self.handle_inner(datagram, source, now, None, out)
    }

    /// Handles one datagram received at `now` (monotonic, for the tables) and `unix_ms`
    /// (wall clock, for the timestamp check) from `source`. Returns the length of the
    /// response written to `out` (at least 1228 bytes long), or `None` when nothing is
    /// to be sent (report, or a drop — counted; stale timestamps are dropped).
    pub fn handle_at(
        &mut self,
        datagram: &mut [u8],
        source: SocketAddr,
        now: Instant,
        unix_ms: u64,
        out: &mut [u8],
    ) -> Option<usize> {
        self.handle_inner(datagram, source, now, Some(unix_ms), out)
    }

    fn handle_inner(
        &mut self,
        datagram: &mut [u8],
        source: SocketAddr,
        now: Instant,
        unix_ms: Option<u64>,
        out: &mut [u8],
    ) -> Option<usize> {
        let c = &*self.counters;
        inc(&c.received);
        let (t, auth_off) = match tenant(datagram) {
            Ok(v) => v,
            Err(FrameError::TooLong) => {
                return dropped(&c.drop_too_long, source, None, "longer than 1200 bytes");
            }
            Err(_) => return dropped(&c.drop_malformed, source, None, "malformed tenant TLV"),
        };
        let Some(&ki) = self.by_id.get(&t.id) else {
            return dropped(&c.drop_unknown_key, source, Some(t.id), "unknown key id");
        };
        let auth = &self.keys[ki];
        let range = match auth.open(datagram, auth_off) {
            Ok(r) => r,
            Err(e) => {
                let (counter, why) = match e {
                    FrameError::WrongAuthMode => (
                        &c.drop_wrong_mode,
                        "auth TLV of another mode than the key's",
                    ),
                    FrameError::CookieMismatch => (&c.drop_bad_cookie, "cookie does not match"),
                    FrameError::AuthFailed | FrameError::EmptyCiphertext => {
                        (&c.drop_auth_failed, "AES-GCM authentication failed")
                    }
                    _ => (&c.drop_malformed, "malformed auth TLV"),
                };
                return dropped(counter, source, Some(t.id), why);
            }
        };
        let pdu = &datagram[range];
        let Ok(inbound) = crate::pdu::parse(pdu) else {
            return dropped(&c.drop_malformed, source, Some(t.id), "malformed PDU");
        };
        match inbound {
            Inbound::Report(rep) => {
                if unix_ms.is_some_and(|u| is_stale(t.timestamp_ms, u, REPORT_MAX_AGE_MS)) {
                    return dropped(&c.drop_stale, source, Some(t.id), "stale timestamp");
                }
                inc(&c.reports);
                let now_ms = self.shared.ms(now);
                let mut st = self.shared.lock();
                for e in rep.entries() {
                    let def = TrackerDef {
                        ttl_ms: e.ttl_ms,
                        max_samples: e.max_samples,
                        min_samples: e.min_samples,
                    };
                    if st
                        .trackers
                        .report(&(t.id, e.tracker_id), def, now_ms, e.observed_ms)
                    {
                        inc(&c.report_entries);
                    } else {
                        inc(&c.tracker_table_full);
                    }
                }
                None
            }
            Inbound::Request(req) => {
                let max_age = u64::from(req.dedup_ttl_ms()) + STALE_GRACE_MS;
                if unix_ms.is_some_and(|u| is_stale(t.timestamp_ms, u, max_age)) {
                    return dropped(&c.drop_stale, source, Some(t.id), "stale timestamp");
                }
                self.rate(ki, &t, req, now, out)
            }
        }
    }

    fn rate(
        &mut self,
        ki: usize,
        t: &Tenant,
        req: RateRequestView<'_>,
        now: Instant,
        out: &mut [u8],
    ) -> Option<usize> {
        let c = &*self.counters;
        // drawn first: if the RNG fails, nothing is decided or sent
        let Ok(nonce) = self.nonces.draw() else {
            tracing::warn!("OS random source failed: request dropped");
            inc(&c.drop_rng_failed);
            return None;
        };
        let auth = &self.keys[ki];
        let pdu_off = auth.pdu_offset();
        if out.len() < MAX_DATAGRAM + RESOURCE_BLOCK_LEN {
            return None;
        }
        let body = &mut out[pdu_off..MAX_DATAGRAM + RESOURCE_BLOCK_LEN];
        let now_ms = self.shared.ms(now);
        let key = (t.id, t.unique_id);
        let mut pdu_len = {
            let mut st = self.shared.lock();
            if let Some(cached) = st.dedup.get(&key, now_ms) {
                inc(&c.dedup_hits);
                body[..cached.len()].copy_from_slice(cached);
                cached.len()
            } else {
                let st = &mut *st;
                let (len, grant) = evaluate(st, t.id, &req, now_ms, self.faults.fixed, body)
                    .or_else(|| {
                        tracing::debug!(
                            key_id = t.id,
                            why = "bucket table full",
                            "request dropped"
                        );
                        inc(&c.drop_bucket_table_full);
                        None
                    })?;
                if self.faults.fixed.is_some() {
                    inc(&c.fault_fixed);
                }
                inc(if grant { &c.granted } else { &c.rejected });
                st.dedup
                    .insert(key, &body[..len], now_ms, req.dedup_ttl_ms());
                len
            }
        };
        inc(&c.rate_requests);
        let broken = self.faults.broken;
        if let Some(kind) = broken {
            pdu_len = mangle_pdu(body, pdu_len, kind);
        }
        self.responses += 1;
        let steer = self.faults.steer_every;
        let steering = if steer > 0 && self.responses.is_multiple_of(u64::from(steer)) {
            inc(&c.fault_steered);
            0
        } else {
            1
        };
        let mut tf = Tenant {
            id: self.server_id,
            unique_id: t.unique_id,
            timestamp_ms: t.timestamp_ms,
            steering,
        };
        match broken {
            Some(BrokenReply::WrongUniqueId) => tf.unique_id.iter_mut().for_each(|b| *b ^= 0xA5),
            Some(BrokenReply::WrongServerId) => tf.id = !self.server_id,
            _ => {}
        }
        let auth = &self.keys[ki];
        let mut len = auth.seal(&tf, nonce, out, pdu_len).ok()?;
        match broken {
            Some(BrokenReply::BadAuth) => match auth.mode() {
                AuthMode::Aes => out[pdu_off - 1] ^= 0x01,
                AuthMode::Cookie => out[pdu_off - 1] ^= 0x01,
                AuthMode::None => out[0] ^= 0x01,
            },
            Some(BrokenReply::Truncated) => len = pdu_off + pdu_len / 2,
            _ => {}
        }
        if broken.is_some() {
            inc(&c.fault_broken);
        }
        inc(&c.answered);
        Some(len)
    }
}

/// Evaluates `req` atomically against the state and writes the response PDU into
/// `body` through the codec (result blocks built in stack arrays, no allocation).
/// Returns (PDU length, granted), or None when a bucket cannot be created.
fn evaluate(
    st: &mut State,
    key_id: u64,
    req: &RateRequestView<'_>,
    now_ms: u64,
    fixed: Option<FixedDecision>,
    body: &mut [u8],
) -> Option<(usize, bool)> {
    // counts were bounded by `pdu::parse`; `min` keeps a bad caller from panicking
    let ng = req.guard_count().min(MAX_GUARDS);
    let nr = req.resource_count().min(MAX_RESOURCES);
    let mut guards = [GuardSpec {
        tracker_id: [0; 16],
        ttl_ms: 0,
        max_samples: 0,
        min_samples: 0,
        threshold_ms: 0,
        current_latency_ms: 0,
    }; MAX_GUARDS];
    let mut res = [ResourceResultSpec {
        bucket_id: [0; 16],
        window_ms: 0,
        actual_rate: 0,
        deficit: 0,
    }; MAX_RESOURCES];
    let mut grant = true;
    for (slot, g) in guards.iter_mut().zip(req.guards()) {
        let spec = g.spec();
        let cur = match fixed {
            Some(FixedDecision::Grant) => 0,
            Some(FixedDecision::Reject | FixedDecision::GuardFail) => spec.threshold_ms,
            None => st.trackers.current(
                &(key_id, spec.tracker_id),
                TrackerDef {
                    ttl_ms: spec.ttl_ms,
                    max_samples: spec.max_samples,
                    min_samples: spec.min_samples,
                },
                now_ms,
            ),
        };
        grant &= cur < spec.threshold_ms;
        *slot = GuardSpec {
            current_latency_ms: cur,
            ..spec
        };
    }
    for (i, (slot, r)) in res.iter_mut().zip(req.resources()).enumerate() {
        let (bucket_id, window_ms) = (r.bucket_id(), r.window_ms());
        let (actual, deficit) = match fixed {
            Some(FixedDecision::Grant | FixedDecision::GuardFail) => (0, 0),
            Some(FixedDecision::Reject) => (r.rate_limit(), r.tokens().max(1)),
            None => {
                let k = (key_id, bucket_id);
                if !st.buckets.reserve(&k, now_ms, window_ms) {
                    return None;
                }
                let pending: u64 = req
                    .resources()
                    .take(i)
                    .filter(|p| p.bucket_id() == bucket_id)
                    .map(|p| u64::from(p.tokens()))
                    .sum();
                let used = st.buckets.consumed(&k, now_ms, window_ms) + pending;
                let avail = u64::from(r.rate_limit()).saturating_sub(used);
                let want = u64::from(r.tokens());
                let deficit = want.saturating_sub(avail).min(u64::from(u16::MAX)) as u16;
                (used.min(u64::from(u32::MAX)) as u32, deficit)
            }
        };
        grant &= deficit == 0;
        *slot = ResourceResultSpec {
            bucket_id,
            window_ms,
            actual_rate: actual,
            deficit,
        };
    }
    if grant && fixed.is_none() {
        for (slot, r) in res[..nr].iter_mut().zip(req.resources()) {
            let tokens = u32::from(r.tokens());
            st.buckets.debit(&(key_id, slot.bucket_id), now_ms, tokens);
            // actual_rate on a grant includes this request's tokens
            slot.actual_rate = slot.actual_rate.saturating_add(tokens);
        }
    }
    let len = encode_rate_response_pdu(body, &guards[..ng], &res[..nr]).ok()?;
    Some((len, grant))
}

/// Applies the block-count breakages to a plaintext response PDU; returns its new length.
fn mangle_pdu(body: &mut [u8], len: usize, kind: BrokenReply) -> usize {
    let g = usize::from(u16::from_le_bytes([
        body[PDU_HEADER_LEN],
        body[PDU_HEADER_LEN + 1],
    ]));
    let r = usize::from(u16::from_le_bytes([
        body[PDU_HEADER_LEN + 2],
        body[PDU_HEADER_LEN + 3],
    ]));
    let (g2, r2, new_len) = match kind {
        BrokenReply::FewerEntries if r > 0 => (g, r - 1, len - RESOURCE_BLOCK_LEN),
        BrokenReply::FewerEntries if g > 0 => (g - 1, r, len - GUARD_BLOCK_LEN),
        BrokenReply::MoreEntries if len + RESOURCE_BLOCK_LEN <= body.len() => {
            let b = &mut body[len..len + RESOURCE_BLOCK_LEN];
            b.fill(0);
            b[..16].fill(0xEE);
            (g, r + 1, len + RESOURCE_BLOCK_LEN)
        }
        BrokenReply::ZeroEntries => (0, 0, PDU_HEADER_LEN + 4),
        _ => return len,
    };
    body[2..4].copy_from_slice(&(new_len as u16).to_le_bytes());
    body[PDU_HEADER_LEN..PDU_HEADER_LEN + 2].copy_from_slice(&(g2 as u16).to_le_bytes());
    body[PDU_HEADER_LEN + 2..PDU_HEADER_LEN + 4].copy_from_slice(&(r2 as u16).to_le_bytes());
    new_len
}
