//! Conformance checklist of docs/protocol.md §16 (and the rules of §10–§12) as named scenario tests
//! of the request machine the engine runs (`Delivery`, driven as the engine's core state
//! drives it: `delivery_common`), and of the datagram checks of the engine's core state
//! itself (`CoreState::handle_datagram`), on virtual time: an `Instant` base plus
//! `Duration`s. No sockets, no sleeping.

mod delivery_common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use delivery_common::Req;
use ratelimitly_engine::engine::core::{CoreConfig, CoreState, SocketOp, TransmitSink};
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::machine::{
    Accepted, Delivery, Endpoint, Ignored, Snapshot, Transmit, TransmitKind,
};
use ratelimitly_engine::proto::outcome::{
    Decision, Failure, FailureCategory, GuardResult, Outcome, Phase, ResourceResult, Response,
};
use ratelimitly_engine::proto::policy::{PolicyError, RequestPolicy, Schedule};
use ratelimitly_engine::proto::wire::{
    self, Auth, DropReason, GuardSpec, ResourceResultSpec, ResourceSpec, TenantFields,
    encode_rate_response_pdu, seal,
};
use ratelimitly_engine::udp::SocketId;

/// Counts heap allocations per thread, to show the machine's hot path allocates nothing.
struct CountingAlloc;

thread_local! {
    static ALLOCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only bumps a thread-local counter.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocs() -> u64 {
    ALLOCS.with(|c| c.get())
}

/// Public test fixture key (vectors.json `rust_none_fixture`): dedup_ttl_ms_max = 300.
use rl_testkit::keys::NONE as KEY_300MS;
/// Public test fixture keys (vectors.json `cookie_key_id_2`, `aes_key_id_3`,
/// `free_plan_aes` = key id 2 with another secret).
use rl_testkit::keys::{AES as AES_KEY, COOKIE as COOKIE_KEY};

fn auth(key: &str) -> Auth {
    Auth::new(&key.parse::<ApiKey>().unwrap())
}

/// A sealed rate-response datagram from `server_id` to the request with `unique_id`: one
/// guard (threshold 100 ms, current `latency`) and one resource with `deficit`.
fn response_datagram(
    auth: &Auth,
    unique_id: [u8; 16],
    server_id: u64,
    steering: u8,
    latency: u32,
    deficit: u16,
) -> Vec<u8> {
    let mut out = vec![0u8; 1200];
    let guard = GuardSpec {
        tracker_id: [7; 16],
        ttl_ms: 1000,
        max_samples: 10,
        min_samples: 1,
        threshold_ms: 100,
        current_latency_ms: latency,
    };
    let res = ResourceResultSpec {
        bucket_id: [9; 16],
        window_ms: 1000,
        actual_rate: 3,
        deficit,
    };
    let off = auth.pdu_offset();
    let pdu_len = encode_rate_response_pdu(&mut out[off..], &[guard], &[res]).unwrap();
    let tenant = TenantFields {
        id: server_id,
        unique_id,
        timestamp_ms: 1_700_000_000_000,
        steering,
    };
    let len = seal(auth, &tenant, [5; 12], &mut out, pdu_len).unwrap();
    out.truncate(len);
    out
}

fn ms(v: u64) -> Duration {
    Duration::from_millis(v)
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// One endpoint per (id, port).
fn snapshot(eps: &[(u64, u16)]) -> Snapshot {
    eps.iter()
        .map(|&(server_id, port)| Endpoint {
            server_id,
            addr: addr(port),
        })
        .collect::<Vec<_>>()
        .into()
}

fn drain(m: &mut Req) -> Vec<Transmit> {
    let mut out = Vec::new();
    for _ in 0..200 {
        match m.poll_transmit() {
            Some(t) => out.push(t),
            None => return out,
        }
    }
    panic!("more than 200 transmits queued");
}

fn endpoints_of(ts: &[Transmit], kind: TransmitKind) -> Vec<usize> {
    assert!(ts.iter().all(|t| t.kind == kind), "{ts:?} not all {kind:?}");
    ts.iter().map(|t| t.endpoint).collect()
}

fn grant(m: &mut Req, now: Instant, server: u64) -> Result<Accepted, Ignored> {
    let guards = [GuardResult::new([7; 16], 100, 10)];
    let res = [ResourceResult {
        bucket_id: [9; 16],
        window_ms: 60_000,
        actual_rate: 1,
        deficit: 0,
    }];
    m.handle_results(now, server, 1, guards, res)
}

fn reject(m: &mut Req, now: Instant, server: u64) -> Result<Accepted, Ignored> {
    let res = [ResourceResult {
        bucket_id: [9; 16],
        window_ms: 60_000,
        actual_rate: 10,
        deficit: 1,
    }];
    m.handle_results(now, server, 1, [], res)
}

fn outcome(m: &mut Req) -> Outcome {
    assert!(
        m.poll_transmit().is_none(),
        "transmits left before the outcome"
    );
    let out = m.poll_outcome().expect("an outcome");
    assert!(m.poll_outcome().is_none(), "outcome given twice");
    assert!(m.is_done());
    out
}

fn response(m: &mut Req) -> Response {
    outcome(m).expect("a decision")
}

/// Drives a machine with no responses: returns the offsets (ms from t0) of each deadline
/// and the transmits at each.
fn run_silent(m: &mut Req, t0: Instant) -> Vec<(u64, Vec<Transmit>)> {
    let mut log = vec![(0, drain(m))];
    for _ in 0..1000 {
        let Some(at) = m.poll_timeout() else {
            return log;
        };
        m.handle_timeout(at);
        log.push(((at - t0).as_millis() as u64, drain(m)));
    }
    panic!("machine did not finish");
}

fn default_machine(eps: &[(u64, u16)]) -> (Req, Instant) {
    let t0 = Instant::now();
    let m = Req::new(&RequestPolicy::default(), snapshot(eps), t0).unwrap();
    (m, t0)
}

#[test]
fn default_policy_sends_at_0_and_20_then_final_phase_to_60_then_timeout() {
    let (mut m, t0) = default_machine(&[(1, 1001), (2, 1002)]);
    assert_eq!(m.deadline(), t0 + ms(60));
    let log = run_silent(&mut m, t0);
    let offsets: Vec<u64> = log.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, [0, 20, 40, 60]);
    assert_eq!(endpoints_of(&log[0].1, TransmitKind::Initial), [0, 1]);
    assert_eq!(endpoints_of(&log[1].1, TransmitKind::Replay), [0, 1]);
    assert!(log[2].1.is_empty() && log[3].1.is_empty());
    assert_eq!(
        m.poll_outcome(),
        Some(Err(Failure::Timeout { horizon_ms: 60 }))
    );
}

#[test]
fn round0_waits_for_the_oldest_then_returns_the_oldest_responder_seen() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2), (30, 3)]);
    drain(&mut m);
    assert_eq!(grant(&mut m, t0 + ms(2), 30), Ok(Accepted::Retained));
    assert_eq!(reject(&mut m, t0 + ms(5), 20), Ok(Accepted::Retained));
    assert_eq!(grant(&mut m, t0 + ms(6), 30), Err(Ignored::Duplicate));
    assert!(m.poll_outcome().is_none());
    assert_eq!(m.poll_timeout(), Some(t0 + ms(20)));
    m.handle_timeout(t0 + ms(19));
    assert!(m.poll_outcome().is_none() && m.poll_transmit().is_none());
    m.handle_timeout(t0 + ms(20));
    // Completion goes only to the server without a valid response (the oldest).
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Completion), [0]);
    let r = response(&mut m);
    assert_eq!(r.server_id, Some(20));
    assert_eq!(r.decision, Decision::Rejected);
    assert_eq!(r.phase, Phase::Round(0));
    assert_eq!((r.sends, r.completion_sends), (4, 1));
}

#[test]
fn round0_younger_response_does_not_replace_an_older_retained_one() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2), (30, 3)]);
    drain(&mut m);
    assert_eq!(grant(&mut m, t0 + ms(2), 20), Ok(Accepted::Retained));
    assert_eq!(reject(&mut m, t0 + ms(3), 30), Ok(Accepted::NotRetained));
    m.handle_timeout(t0 + ms(20));
    drain(&mut m);
    let r = response(&mut m);
    assert_eq!((r.server_id, r.decision), (Some(20), Decision::Granted));
}

#[test]
fn oldest_answering_first_returns_at_once() {
    let (mut m, t0) = default_machine(&[(30, 3), (10, 1), (20, 2)]);
    drain(&mut m);
    assert_eq!(grant(&mut m, t0 + ms(1), 10), Ok(Accepted::Selected));
    assert_eq!(m.poll_timeout(), None);
    assert_eq!(
        endpoints_of(&drain(&mut m), TransmitKind::Completion),
        [0, 2]
    );
    let r = response(&mut m);
    assert_eq!(r.server_id, Some(10));
    assert_eq!(r.phase, Phase::Round(0));
    assert_eq!((r.sends, r.completion_sends), (5, 2));
    // Later responses are ignored: the result never changes.
    assert_eq!(reject(&mut m, t0 + ms(2), 20), Err(Ignored::Finished));
}

#[test]
fn replay_round_returns_the_first_valid_response_from_any_server() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2), (30, 3)]);
    drain(&mut m);
    m.handle_timeout(t0 + ms(20));
    assert_eq!(
        endpoints_of(&drain(&mut m), TransmitKind::Replay),
        [0, 1, 2]
    );
    assert_eq!(grant(&mut m, t0 + ms(25), 30), Ok(Accepted::Selected));
    assert_eq!(
        endpoints_of(&drain(&mut m), TransmitKind::Completion),
        [0, 1]
    );
    assert_eq!(grant(&mut m, t0 + ms(26), 10), Err(Ignored::Finished));
    let r = response(&mut m);
    assert_eq!((r.server_id, r.phase), (Some(30), Phase::Round(1)));
    assert_eq!((r.sends, r.completion_sends), (8, 2));
}

/// Rounds 1..=N go to endpoints whose server has not answered. Any round-0 answer is
/// retained and selected at the end of round 0 and any later answer decides, so the replay
/// set is every endpoint; an answer from a server outside the snapshot must not shrink it.
#[test]
fn unknown_server_answer_does_not_shrink_the_replay_set() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    drain(&mut m);
    assert_eq!(grant(&mut m, t0 + ms(3), 99), Err(Ignored::UnknownServer));
    m.handle_timeout(t0 + ms(20));
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Replay), [0, 1]);
}

#[test]
fn final_phase_response_completes_without_more_sends() {
    let p = RequestPolicy::builder()
        .completion_delivery(false)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(10, 1), (20, 2)]), t0).unwrap();
    assert_eq!(drain(&mut m).len(), 2);
    m.handle_timeout(t0 + ms(20));
    assert_eq!(drain(&mut m).len(), 2);
    m.handle_timeout(t0 + ms(40));
    assert!(drain(&mut m).is_empty());
    assert_eq!(m.poll_timeout(), Some(t0 + ms(60)));
    assert_eq!(grant(&mut m, t0 + ms(50), 20), Ok(Accepted::Selected));
    let r = response(&mut m);
    assert_eq!((r.server_id, r.phase), (Some(20), Phase::Final));
    assert_eq!((r.sends, r.completion_sends), (4, 0));
}

#[test]
fn final_phase_response_with_completion_delivery_sends_only_completions() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    let log_start = drain(&mut m).len();
    m.handle_timeout(t0 + ms(20));
    let replays = drain(&mut m).len();
    m.handle_timeout(t0 + ms(40));
    assert_eq!(grant(&mut m, t0 + ms(59), 20), Ok(Accepted::Selected));
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Completion), [0]);
    let r = response(&mut m);
    assert_eq!(r.phase, Phase::Final);
    assert_eq!(r.sends as usize, log_start + replays + 1);
}

#[test]
fn completion_delivery_covers_grants() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    drain(&mut m);
    grant(&mut m, t0 + ms(1), 10).unwrap();
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Completion), [1]);
    let r = response(&mut m);
    assert_eq!((r.decision, r.completion_sends), (Decision::Granted, 1));
}

#[test]
fn completion_delivery_covers_rejections() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    drain(&mut m);
    reject(&mut m, t0 + ms(1), 10).unwrap();
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Completion), [1]);
    let r = response(&mut m);
    assert_eq!((r.decision, r.completion_sends), (Decision::Rejected, 1));
    assert_eq!(r.resources[0].deficit, 1);
}

#[test]
fn completion_delivery_can_be_disabled() {
    let p = RequestPolicy::builder()
        .completion_delivery(false)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(10, 1), (20, 2)]), t0).unwrap();
    drain(&mut m);
    grant(&mut m, t0 + ms(1), 10).unwrap();
    let r = response(&mut m);
    assert_eq!((r.sends, r.completion_sends), (2, 0));
}

#[test]
fn completion_delivery_never_at_or_after_d_but_a_response_exactly_at_d_is_accepted() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    drain(&mut m);
    m.handle_timeout(t0 + ms(20));
    drain(&mut m);
    m.handle_timeout(t0 + ms(40));
    assert_eq!(m.poll_timeout(), Some(t0 + ms(60)));
    assert_eq!(grant(&mut m, t0 + ms(60), 20), Ok(Accepted::Selected));
    assert!(drain(&mut m).is_empty(), "no completion at D");
    let r = response(&mut m);
    assert_eq!((r.server_id, r.phase), (Some(20), Phase::Final));
    assert_eq!((r.sends, r.completion_sends), (4, 0));
}

#[test]
fn round0_selection_by_a_timer_firing_at_or_after_d_sends_no_completion() {
    // Round 0 lasts the whole horizon (N = 0, F = 0): the retained answer is selected at D.
    let p = RequestPolicy::builder()
        .replays(0)
        .final_units(0)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(10, 1), (20, 2)]), t0).unwrap();
    drain(&mut m);
    assert_eq!(grant(&mut m, t0 + ms(20), 20), Ok(Accepted::Retained));
    m.handle_timeout(t0 + ms(20));
    assert!(drain(&mut m).is_empty());
    let r = response(&mut m);
    assert_eq!((r.server_id, r.completion_sends), (Some(20), 0));
}

#[test]
fn completion_delivery_skips_every_address_of_an_answered_server() {
    // Server 10 dual-stack (endpoints 0 and 2), server 20 dual-stack (1 and 3), server 30.
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2), (10, 3), (20, 4), (30, 5)]);
    assert_eq!(drain(&mut m).len(), 5);
    assert_eq!(grant(&mut m, t0 + ms(4), 20), Ok(Accepted::Retained));
    // A second answer from the same server through its other address is a duplicate.
    assert_eq!(grant(&mut m, t0 + ms(5), 20), Err(Ignored::Duplicate));
    assert_eq!(grant(&mut m, t0 + ms(6), 10), Ok(Accepted::Selected));
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Completion), [4]);
    let r = response(&mut m);
    assert_eq!((r.server_id, r.sends, r.completion_sends), (Some(10), 6, 1));
}

#[test]
fn replay_goes_to_every_address_of_a_dual_stack_server() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2), (10, 3)]);
    assert_eq!(
        endpoints_of(&drain(&mut m), TransmitKind::Initial),
        [0, 1, 2]
    );
    m.handle_timeout(t0 + ms(20));
    assert_eq!(
        endpoints_of(&drain(&mut m), TransmitKind::Replay),
        [0, 1, 2]
    );
}

#[test]
fn response_one_ms_after_d_is_ignored() {
    let (mut m, t0) = default_machine(&[(10, 1)]);
    drain(&mut m);
    m.handle_timeout(t0 + ms(20));
    drain(&mut m);
    // No timer fired at D; the response at D + 1 ms is late.
    assert_eq!(grant(&mut m, t0 + ms(61), 10), Err(Ignored::Late));
    assert_eq!(outcome(&mut m), Err(Failure::Timeout { horizon_ms: 60 }));
}

#[test]
fn late_timer_never_replays_at_or_after_d() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    drain(&mut m);
    m.handle_timeout(t0 + ms(60));
    assert!(drain(&mut m).is_empty());
    assert_eq!(outcome(&mut m), Err(Failure::Timeout { horizon_ms: 60 }));
    // Queued replays are dropped if D has passed before they were drained.
    let (mut m, t0) = default_machine(&[(10, 1)]);
    drain(&mut m);
    m.handle_timeout(t0 + ms(20));
    m.handle_timeout(t0 + ms(70));
    assert!(drain(&mut m).is_empty());
    assert!(outcome(&mut m).is_err());
}

#[test]
fn late_timer_skipping_rounds_replays_once() {
    let p = RequestPolicy::builder().replays(3).build().unwrap();
    assert_eq!(p.horizon_ms(), 100);
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(10, 1)]), t0).unwrap();
    drain(&mut m);
    m.handle_timeout(t0 + ms(65)); // rounds 1, 2 and 3 have started
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Replay), [0]);
    assert_eq!(m.poll_timeout(), Some(t0 + ms(80)));
}

#[test]
fn unknown_server_reply_is_ignored_and_the_request_replays() {
    // Stand-in until wire lands: a response whose server id is not in the snapshot.
    let (mut m, t0) = default_machine(&[(10, 1)]);
    drain(&mut m);
    assert_eq!(grant(&mut m, t0 + ms(1), 11), Err(Ignored::UnknownServer));
    assert!(m.poll_outcome().is_none());
    m.handle_timeout(t0 + ms(20));
    assert_eq!(endpoints_of(&drain(&mut m), TransmitKind::Replay), [0]);
    assert_eq!(grant(&mut m, t0 + ms(21), 10), Ok(Accepted::Selected));
    assert_eq!(response(&mut m).phase, Phase::Round(1));
}

/// Transmits handed out by the engine's core state: (destination, bytes, tag).
#[derive(Default)]
struct Sent(Vec<(SocketAddr, Vec<u8>, u64)>);

impl TransmitSink for Sent {
    fn transmit(&mut self, _sock: SocketId, to: SocketAddr, datagram: &[u8], tag: u64) {
        self.0.push((to, datagram.to_vec(), tag));
    }
}

impl Sent {
    /// The destinations and kinds (the tag's bits 62..64) handed out since the last call.
    fn take(&mut self) -> Vec<(SocketAddr, TransmitKind)> {
        self.0
            .drain(..)
            .map(|(to, _, tag)| {
                let kind = match tag >> 62 {
                    0 => TransmitKind::Initial,
                    1 => TransmitKind::Replay,
                    _ => TransmitKind::Completion,
                };
                (to, kind)
            })
            .collect()
    }
}

/// The engine's core state for `key` and endpoints `eps`, with one request of one
/// resource submitted at `t0`; returns it, its sink and the request's unique id (what a
/// server echoes).
fn core_with_one_request(
    key: &str,
    eps: &[(u64, u16)],
    t0: Instant,
) -> (CoreState, Sent, [u8; 16]) {
    let key: ApiKey = key.parse().unwrap();
    let policy = RequestPolicy::default();
    let cfg = CoreConfig::new(0, &key, policy.clone()).unwrap();
    let mut seed = 1u8;
    let entropy = Box::new(move |b: &mut [u8]| {
        for x in b.iter_mut() {
            seed = seed.wrapping_mul(31).wrapping_add(7);
            *x = seed;
        }
        Ok(())
    });
    let mut state = CoreState::new(
        cfg,
        snapshot(eps),
        t0,
        SocketId::from_raw(0),
        40_000,
        entropy,
    )
    .unwrap();
    state.set_wall_ms(1_700_000_000_000);
    let spec = ResourceSpec {
        bucket_id: [9; 16],
        window_ms: 1000,
        rate_limit: 10,
        tokens: 1,
    };
    let mut pdu = [0u8; 128];
    let n = wire::encode_rate_request_pdu(&mut pdu, policy.horizon_ms(), &[], &[spec], "").unwrap();
    let mut sent = Sent::default();
    state.submit(t0, &pdu[..n], 7, t0, &mut sent);
    let mut uid = [0u8; 16];
    uid.copy_from_slice(&sent.0[0].1[12..28]);
    let first = sent.take();
    assert_eq!(first.len(), eps.len());
    assert!(first.iter().all(|&(_, k)| k == TransmitKind::Initial));
    (state, sent, uid)
}

/// Feeds `d` to the core state at `now`: the reason it was dropped for, if it was.
fn feed(state: &mut CoreState, sent: &mut Sent, now: Instant, d: &mut [u8]) -> Option<DropReason> {
    let before: Vec<u64> = DropReason::ALL
        .iter()
        .map(|&r| state.stats().drops_of(r))
        .collect();
    state.handle_datagram(now, SocketId::from_raw(0), d, sent);
    DropReason::ALL
        .iter()
        .zip(before)
        .find(|&(&r, b)| state.stats().drops_of(r) > b)
        .map(|(&r, _)| r)
}

/// The datagram checks of the engine's core state, in every auth mode with a key: a
/// malformed, unauthenticated, wrong-mode, garbage or unknown-server answer is dropped by
/// its reason and the request replays; a valid one decides, its steering byte asks for a
/// rebind, and a later one of the deciding server is not expected.
#[test]
fn malformed_and_unauthenticated_replies_are_ignored_and_the_request_replays() {
    for key in [COOKIE_KEY, AES_KEY] {
        let a = auth(key);
        let t0 = Instant::now();
        let (mut core, mut sent, uid) = core_with_one_request(key, &[(10, 1), (20, 2)], t0);
        // Truncated PDU: a declared block is missing.
        let mut d = response_datagram(&a, uid, 10, 1, 5, 0);
        let len = d.len();
        let mut cut = d[..len - 10].to_vec();
        if key == AES_KEY {
            // Re-seal so that the tag verifies and the PDU check is what fails.
            cut = {
                let mut out = vec![0u8; 1200];
                let off = a.pdu_offset();
                let pdu_len = encode_rate_response_pdu(&mut out[off..], &[], &[]).unwrap();
                out[off + 8] = 1; // declares one guard block that is absent
                let tenant = TenantFields {
                    id: 10,
                    unique_id: uid,
                    timestamp_ms: 0,
                    steering: 1,
                };
                let n = seal(&a, &tenant, [6; 12], &mut out, pdu_len).unwrap();
                out.truncate(n);
                out
            };
        }
        let r = feed(&mut core, &mut sent, t0 + ms(1), &mut cut);
        assert!(
            matches!(r, Some(DropReason::BadPduSize | DropReason::MissingBlocks)),
            "{r:?}"
        );
        // Unauthenticated: one byte of the cookie / ciphertext flipped.
        let flip = a.pdu_offset() - 1;
        d[flip] ^= 1;
        let r = feed(&mut core, &mut sent, t0 + ms(2), &mut d);
        assert!(
            matches!(r, Some(DropReason::CookieMismatch | DropReason::AuthFailed)),
            "{r:?}"
        );
        // Wrong auth mode.
        let other = if key == COOKIE_KEY {
            AES_KEY
        } else {
            COOKIE_KEY
        };
        let mut d = response_datagram(&auth(other), uid, 10, 1, 5, 0);
        let r = feed(&mut core, &mut sent, t0 + ms(3), &mut d);
        assert_eq!(r, Some(DropReason::WrongAuthMode));
        // Garbage.
        let mut junk = [0xAAu8; 64];
        assert!(feed(&mut core, &mut sent, t0 + ms(4), &mut junk).is_some());
        // A valid answer from a server outside the snapshot.
        let mut d = response_datagram(&a, uid, 11, 1, 5, 0);
        let r = feed(&mut core, &mut sent, t0 + ms(5), &mut d);
        assert_eq!(r, Some(DropReason::UnknownServer));
        core.handle_timeout(t0 + ms(5), &mut sent);
        assert!(core.poll_outcome().is_none());
        core.handle_timeout(t0 + ms(20), &mut sent);
        let replays = sent.take();
        assert_eq!(replays.len(), 2);
        assert!(replays.iter().all(|&(_, k)| k == TransmitKind::Replay));
        // Server 20 decides; its steering byte 0 asks the core for another port.
        let mut d = response_datagram(&a, uid, 20, 0, 150, 0);
        assert_eq!(feed(&mut core, &mut sent, t0 + ms(21), &mut d), None);
        assert!(matches!(core.poll_socket_op(), Some(SocketOp::Open { .. })));
        let mut dup = response_datagram(&a, uid, 20, 1, 5, 0);
        let r = feed(&mut core, &mut sent, t0 + ms(22), &mut dup);
        assert_eq!(r, Some(DropReason::NotExpected));
        core.handle_timeout(t0 + ms(22), &mut sent);
        assert_eq!(sent.take(), [(addr(1), TransmitKind::Completion)]);
        let o = core.poll_outcome().expect("an outcome");
        assert_eq!(o.slot, 7);
        let r = o.outcome.expect("a decision");
        assert_eq!((r.server_id, r.phase), (Some(20), Phase::Round(1)));
        // Guard current 150 >= threshold 100: rejected.
        assert_eq!(r.decision, Decision::Rejected);
        assert!(!r.guards[0].passed && !r.steering_keep);
        assert_eq!(r.resources[0].actual_rate, 3);
        assert!(core.poll_outcome().is_none(), "one outcome");
    }
}

#[test]
fn datagram_round0_oldest_grant() {
    let a = auth(AES_KEY);
    let t0 = Instant::now();
    let (mut core, mut sent, uid) = core_with_one_request(AES_KEY, &[(10, 1), (20, 2)], t0);
    let mut d = response_datagram(&a, uid, 20, 1, 5, 2);
    assert_eq!(feed(&mut core, &mut sent, t0 + ms(1), &mut d), None);
    let mut d = response_datagram(&a, uid, 10, 1, 5, 0);
    assert_eq!(feed(&mut core, &mut sent, t0 + ms(2), &mut d), None);
    core.handle_timeout(t0 + ms(2), &mut sent);
    assert!(
        sent.take().is_empty(),
        "both servers answered: no completion"
    );
    let r = core.poll_outcome().expect("an outcome").outcome.unwrap();
    assert_eq!((r.server_id, r.decision), (Some(10), Decision::Granted));
    assert_eq!((r.sends, r.completion_sends), (2, 0));
}

#[test]
fn policy_over_the_key_limit_is_rejected_with_zero_sends() {
    let key: ApiKey = KEY_300MS.parse().unwrap();
    assert_eq!(key.quotas().dedup_ttl_ms_max, 300);
    let p = RequestPolicy::builder().unit(ms(101)).build().unwrap();
    assert_eq!(p.horizon_ms(), 303);
    let err = p.check_key(&key).unwrap_err();
    assert_eq!(
        err,
        PolicyError::HorizonOverKeyLimit {
            horizon_ms: 303,
            limit_ms: 300
        }
    );
    let text = format!("{err} {err:?}");
    assert!(text.contains("303") && text.contains("300"));
    assert!(!text.contains(KEY_300MS) && !text.contains("rl-none"));
    // The check is made before a machine exists: nothing can be sent. U = 100 fits.
    let ok = RequestPolicy::builder().unit(ms(100)).build().unwrap();
    assert_eq!(ok.check_key(&key), Ok(()));
}

#[test]
fn empty_request_grants_locally() {
    let r = Response::local_grant();
    assert_eq!(r.decision, Decision::Granted);
    assert_eq!((r.server_id, r.phase), (None, Phase::Local));
    assert_eq!((r.sends, r.completion_sends), (0, 0));
    assert!(r.resources.is_empty() && r.guards.is_empty());
}

#[test]
fn exponential_schedule_deadlines() {
    let p = RequestPolicy::builder()
        .unit(ms(10))
        .replays(2)
        .schedule(Schedule::Exponential {
            initial: 1,
            factor: 2,
            max: 4,
        })
        .final_units(1)
        .build()
        .unwrap();
    assert_eq!(p.horizon_ms(), 80);
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(1, 1)]), t0).unwrap();
    let log = run_silent(&mut m, t0);
    let offsets: Vec<u64> = log.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, [0, 10, 30, 70, 80]);
    let sends: Vec<usize> = log.iter().map(|(_, t)| t.len()).collect();
    assert_eq!(sends, [1, 1, 1, 0, 0]);
    assert!(matches!(
        m.poll_outcome(),
        Some(Err(Failure::Timeout { horizon_ms: 80 }))
    ));
}

#[test]
fn linear_schedule_deadlines() {
    let p = RequestPolicy::builder()
        .unit(ms(10))
        .replays(2)
        .schedule(Schedule::Linear {
            initial: 1,
            step: 1,
            max: 3,
        })
        .final_units(0)
        .build()
        .unwrap();
    assert_eq!(p.horizon_ms(), 60);
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(1, 1)]), t0).unwrap();
    let log = run_silent(&mut m, t0);
    let offsets: Vec<u64> = log.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, [0, 10, 30, 60]);
    assert!(matches!(
        m.poll_outcome(),
        Some(Err(Failure::Timeout { horizon_ms: 60 }))
    ));
}

#[test]
fn fixed_schedule_without_final_phase_worked_value() {
    let p = RequestPolicy::builder()
        .unit(ms(25))
        .replays(3)
        .final_units(0)
        .build()
        .unwrap();
    assert_eq!(p.horizon_ms(), 100);
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(1, 1)]), t0).unwrap();
    let offsets: Vec<u64> = run_silent(&mut m, t0).iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, [0, 25, 50, 75, 100]);
}

#[test]
fn all_endpoints_unreachable_is_a_communication_failure() {
    let (mut m, _t0) = default_machine(&[(10, 1), (20, 2), (20, 3)]);
    for t in drain(&mut m) {
        m.transmit_failed(&t);
    }
    assert_eq!(m.poll_timeout(), None);
    let f = outcome(&mut m).unwrap_err();
    assert_eq!(f.category(), FailureCategory::Communication);
}

#[test]
fn round0_send_failures_reported_late_still_make_a_communication_failure() {
    // N = 0, F = 1: round 0 ends (no replays) before the failures are reported.
    let p = RequestPolicy::builder().replays(0).build().unwrap();
    let t0 = Instant::now();
    let mut m = Req::new(&p, snapshot(&[(10, 1), (20, 2)]), t0).unwrap();
    let ts = drain(&mut m);
    m.handle_timeout(t0 + ms(20));
    assert!(drain(&mut m).is_empty());
    for t in ts {
        m.transmit_failed(&t);
    }
    let f = outcome(&mut m).unwrap_err();
    assert_eq!(f.category(), FailureCategory::Communication);
}

#[test]
fn replay_send_failures_are_not_round0_failures() {
    let (mut m, t0) = default_machine(&[(10, 1)]);
    drain(&mut m);
    m.handle_timeout(t0 + ms(20));
    let replays = drain(&mut m);
    m.transmit_failed(&replays[0]);
    assert!(m.poll_outcome().is_none());
    assert_eq!(grant(&mut m, t0 + ms(30), 10), Ok(Accepted::Selected));
    assert_eq!(response(&mut m).sends, 1);
}

#[test]
fn one_unreachable_endpoint_does_not_abort_the_request() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    let ts = drain(&mut m);
    m.transmit_failed(&ts[0]);
    assert!(m.poll_outcome().is_none());
    m.handle_timeout(t0 + ms(20));
    let replays = drain(&mut m);
    m.transmit_failed(&replays[0]);
    assert_eq!(grant(&mut m, t0 + ms(22), 20), Ok(Accepted::Selected));
    let completions = drain(&mut m);
    assert_eq!(endpoints_of(&completions, TransmitKind::Completion), [0]);
    m.transmit_failed(&completions[0]);
    let r = response(&mut m);
    assert_eq!(r.server_id, Some(20));
    // 2 initial + 2 replays + 1 completion, 3 of them failed.
    assert_eq!((r.sends, r.completion_sends), (2, 0));
}

#[test]
fn snapshot_limits() {
    let t0 = Instant::now();
    let p = RequestPolicy::default();
    let empty: Snapshot = Arc::from(Vec::<Endpoint>::new());
    let f = Req::new(&p, empty, t0).unwrap_err();
    assert_eq!(f.category(), FailureCategory::Discovery);
    let many: Vec<(u64, u16)> = (0..65).map(|i| (i + 1, 1000 + i as u16)).collect();
    let f = Req::new(&p, snapshot(&many), t0).unwrap_err();
    assert_eq!(f.category(), FailureCategory::Configuration);
    let max: Vec<(u64, u16)> = (0..64).map(|i| (i + 1, 1000 + i as u16)).collect();
    let mut m = Req::new(&p, snapshot(&max), t0).unwrap();
    assert_eq!(drain(&mut m).len(), 64);
    assert_eq!(grant(&mut m, t0 + ms(3), 64), Ok(Accepted::Retained));
    m.handle_timeout(t0 + ms(20));
    assert_eq!(drain(&mut m).len(), 63);
    assert_eq!(response(&mut m).server_id, Some(64));
}

#[test]
fn steering_byte_is_surfaced_and_never_changes_the_decision() {
    let (mut m, t0) = default_machine(&[(10, 1), (20, 2)]);
    drain(&mut m);
    assert_eq!(m.poll_steering(), None);
    m.handle_results(t0 + ms(1), 20, 0, [], []).unwrap();
    assert_eq!(m.poll_steering(), Some(0));
    assert_eq!(m.poll_steering(), None);
    m.handle_timeout(t0 + ms(20));
    drain(&mut m);
    let r = response(&mut m);
    assert_eq!((r.decision, r.steering_keep), (Decision::Granted, false));
}

#[test]
fn machine_hot_path_does_not_allocate() {
    let snap = snapshot(&[(10, 1), (20, 2), (30, 3)]);
    let policy = RequestPolicy::default();
    let t0 = Instant::now();
    let before = allocs();
    let mut sent = 0;
    for i in 0..100u64 {
        let mut m = Req::new(&policy, snap.clone(), t0).unwrap();
        while m.poll_transmit().is_some() {
            sent += 1;
        }
        let server = [20, 30][i as usize % 2];
        let _ = grant(&mut m, t0 + ms(3), server);
        m.handle_timeout(t0 + ms(20));
        while m.poll_transmit().is_some() {
            sent += 1;
        }
        let out = m.poll_outcome();
        assert!(matches!(out, Some(Ok(_))));
    }
    assert_eq!(allocs() - before, 0, "heap allocations on the hot path");
    assert_eq!(sent, 100 * 5); // 3 initial + 2 completion each
}

#[test]
fn print_machine_size() {
    let machine = std::mem::size_of::<Delivery>();
    let response = std::mem::size_of::<Response>();
    println!(
        "size_of::<Delivery>() = {machine} bytes (a response, held apart while needed: \
         {response} bytes)"
    );
    assert!(machine <= 80, "{machine}");
}
