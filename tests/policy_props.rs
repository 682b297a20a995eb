//! Property tests of the request policy and of the machine's timing on virtual time (the
//! machine the engine runs, `Delivery`, driven as its core state drives it):
//! the horizon equals the sum of the waits the machine actually makes with no responses,
//! it times out exactly at D, never sends at or after D, and schedules never overflow.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

mod delivery_common;

use delivery_common::Req;
use proptest::prelude::*;
use ratelimitly as official;
use ratelimitly_engine::proto::machine::{Endpoint, Snapshot, TransmitKind};
use ratelimitly_engine::proto::outcome::{Failure, FailureCategory, Phase};
use ratelimitly_engine::proto::policy::{PolicyError, RequestPolicy, Schedule};

fn schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        (1u32..=8).prop_map(Schedule::Fixed),
        (1u32..=4, 1u32..=3, 0u32..=8).prop_map(|(initial, step, extra)| Schedule::Linear {
            initial,
            step,
            max: initial + extra,
        }),
        (1u32..=4, 2u32..=5, 0u32..=40).prop_map(|(initial, factor, extra)| {
            Schedule::Exponential {
                initial,
                factor,
                max: initial + extra,
            }
        }),
    ]
}

fn any_schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        any::<u32>().prop_map(Schedule::Fixed),
        (any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(initial, step, max)| { Schedule::Linear { initial, step, max } }),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(initial, factor, max)| {
            Schedule::Exponential {
                initial,
                factor,
                max,
            }
        }),
    ]
}

/// Small values around the domain edges (0, 1, initial > max, factor 1).
fn small_any_schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        (0u32..=3).prop_map(Schedule::Fixed),
        (0u32..=3, 0u32..=2, 0u32..=3).prop_map(|(initial, step, max)| Schedule::Linear {
            initial,
            step,
            max
        }),
        (0u32..=3, 0u32..=3, 0u32..=3).prop_map(|(initial, factor, max)| {
            Schedule::Exponential {
                initial,
                factor,
                max,
            }
        }),
    ]
}

fn snapshot(n: usize) -> Snapshot {
    (0..n)
        .map(|i| Endpoint {
            server_id: 100 + i as u64,
            addr: SocketAddr::from(([127, 0, 0, 1], 2000 + i as u16)),
        })
        .collect::<Vec<_>>()
        .into()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// H = U·(B(0)+…+B(N)+F) equals the sum of the waits of a machine that gets no
    /// response; each round start (and only round starts before D) sends; Timeout at D.
    #[test]
    fn horizon_is_the_sum_of_the_waits(
        unit in 1u64..=50,
        replays in 0u16..=12,
        sched in schedule(),
        final_units in 0u32..=5,
        endpoints in 1usize..=4,
    ) {
        let p = RequestPolicy::builder()
            .unit(Duration::from_millis(unit))
            .replays(replays)
            .schedule(sched)
            .final_units(final_units)
            .build()
            .unwrap();
        let expected: u64 = (0..=replays).map(|k| u64::from(p.round_units(k))).sum::<u64>()
            + u64::from(final_units);
        prop_assert_eq!(u64::from(p.horizon_ms()), unit * expected);

        let t0 = Instant::now();
        let mut m = Req::new(&p, snapshot(endpoints), t0).unwrap();
        let mut sends = 0usize;
        while let Some(t) = m.poll_transmit() {
            prop_assert_eq!(t.kind, TransmitKind::Initial);
            sends += 1;
        }
        let mut last = t0;
        let mut waited = Duration::ZERO;
        let mut waits = 0u32;
        let limit = u32::from(replays) + 3;
        while let Some(at) = m.poll_timeout() {
            prop_assert!(at > last, "deadlines strictly increase");
            waited += at - last;
            last = at;
            waits += 1;
            prop_assert!(waits <= limit);
            m.handle_timeout(at);
            while let Some(t) = m.poll_transmit() {
                prop_assert!(at < m.deadline(), "sent at or after D");
                prop_assert_eq!(t.kind, TransmitKind::Replay);
                sends += 1;
            }
        }
        prop_assert_eq!(waited, p.horizon());
        prop_assert_eq!(last, m.deadline());
        prop_assert_eq!(waits, u32::from(replays) + 1 + u32::from(final_units > 0));
        prop_assert_eq!(sends, endpoints * (usize::from(replays) + 1));
        prop_assert_eq!(
            m.poll_outcome(),
            Some(Err(Failure::Timeout { horizon_ms: p.horizon_ms() }))
        );
    }

    /// A response at a random time: accepted iff at or before D; completion never at or
    /// after D; exactly one outcome.
    #[test]
    fn response_at_random_time(
        unit in 1u64..=30,
        replays in 0u16..=5,
        sched in schedule(),
        final_units in 0u32..=3,
        at_frac in 0u64..=1200,
        oldest in any::<bool>(),
    ) {
        let p = RequestPolicy::builder()
            .unit(Duration::from_millis(unit))
            .replays(replays)
            .schedule(sched)
            .final_units(final_units)
            .build()
            .unwrap();
        let h = u64::from(p.horizon_ms());
        let at_ms = h * at_frac / 1000;
        let t0 = Instant::now();
        let mut m = Req::new(&p, snapshot(3), t0).unwrap();
        while m.poll_transmit().is_some() {}
        let now = t0 + Duration::from_millis(at_ms);
        // Fire the timers that come strictly before the response.
        for _ in 0..(u32::from(replays) + 3) {
            match m.poll_timeout() {
                Some(d) if d < now => {
                    m.handle_timeout(d);
                    while m.poll_transmit().is_some() {}
                }
                _ => break,
            }
        }
        let server = if oldest { 100 } else { 102 };
        let r = m.handle_results(now, server, 1, [], []);
        prop_assert_eq!(r.is_ok(), at_ms <= h);
        if let Some(d) = m.poll_timeout() {
            m.handle_timeout(d);
        }
        let mut completions = 0;
        while let Some(t) = m.poll_transmit() {
            prop_assert_eq!(t.kind, TransmitKind::Completion);
            completions += 1;
        }
        let out = m.poll_outcome().unwrap();
        prop_assert!(m.poll_outcome().is_none());
        if at_ms <= h {
            let resp = out.unwrap();
            prop_assert_eq!(resp.server_id, Some(server));
            prop_assert_eq!(resp.completion_sends, completions);
            if at_ms >= h {
                prop_assert_eq!(completions, 0);
            }
        } else {
            prop_assert!(out.is_err());
        }
    }

    /// Any schedule: validation and B(k) never panic; B(k) of a valid schedule lies in
    /// 1..=max and the O(1) step agrees with the closed form.
    #[test]
    fn schedules_never_overflow(sched in any_schedule(), k in any::<u32>()) {
        let valid = sched.validate().is_ok();
        let b = sched.units(k);
        if valid {
            let max = match sched {
                Schedule::Fixed(b) => b,
                Schedule::Linear { max, .. } | Schedule::Exponential { max, .. } => max,
            };
            prop_assert!(b >= 1 && b <= max);
            let small = k % 70;
            let mut v = sched.units(0);
            for _ in 0..small {
                v = sched.next_units(v);
            }
            prop_assert_eq!(v, sched.units(small));
        }
    }

    /// Our policy validation and horizon agree with the official Rust client's
    /// (`ratelimitly` 0.1.0, used as a black box) on random policies, valid or not.
    #[test]
    fn horizon_matches_the_official_client(
        unit_ms in prop_oneof![0u64..=200, any::<u32>().prop_map(u64::from)],
        replays in prop_oneof![0u16..=20, any::<u16>()],
        sched in prop_oneof![schedule(), any_schedule(), small_any_schedule()],
        final_units in prop_oneof![0u32..=10, any::<u32>()],
    ) {
        let unit = Duration::from_millis(unit_ms);
        let ours = RequestPolicy::builder()
            .unit(unit)
            .replays(replays)
            .schedule(sched)
            .final_units(final_units)
            .build();
        let official_schedule = match sched {
            Schedule::Fixed(b) => official::Schedule::fixed(b),
            Schedule::Linear { initial, step, max } => official::Schedule::linear(initial, step, max),
            Schedule::Exponential { initial, factor, max } => {
                official::Schedule::exponential(initial, factor, max)
            }
        };
        let theirs = official::RequestPolicy::builder()
            .unit(unit)
            .replays(u32::from(replays))
            .replay_gap(official_schedule)
            .final_receive_units(final_units)
            .build();
        match (&ours, &theirs) {
            (Ok(p), Ok(q)) => prop_assert_eq!(p.horizon(), q.horizon()),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "ours {:?} vs official {:?}", ours, theirs),
        }
    }

    /// Any policy: build never panics; an Ok policy's H fits and equals its definition.
    #[test]
    fn any_policy_builds_or_fails_cleanly(
        unit_us in prop_oneof![any::<u64>(), (1u64..=100_000).prop_map(|m| m * 1000)],
        replays in any::<u16>(),
        sched in any_schedule(),
        final_units in any::<u32>(),
    ) {
        let r = RequestPolicy::builder()
            .unit(Duration::from_micros(unit_us))
            .replays(replays)
            .schedule(sched)
            .final_units(final_units)
            .build();
        match r {
            Ok(p) => {
                let mut sum = u64::from(p.final_units());
                let mut b = p.round_units(0);
                for _ in 0..=replays {
                    sum += u64::from(b);
                    b = sched.next_units(b);
                }
                prop_assert_eq!(p.round_units(replays), sched.units(u32::from(replays)));
                prop_assert_eq!(u64::from(p.horizon_ms()), sum * u64::from(p.unit_ms()));
            }
            Err(PolicyError::UnitTooSmall) => prop_assert!(unit_us < 1000),
            Err(PolicyError::UnitNotWholeMs) => prop_assert!(!unit_us.is_multiple_of(1000)),
            Err(PolicyError::BadSchedule(_)) => prop_assert!(sched.validate().is_err()),
            Err(PolicyError::HorizonOverflow) => {}
            Err(e) => prop_assert!(false, "unexpected {e:?}"),
        }
    }

    /// Random responses (from snapshot servers, dual-stack ones, and unknown servers) and
    /// random round-0 send failures, driven like a real driver (timers fired in order,
    /// responses at half-millisecond instants so they never tie with a deadline), against
    /// an independent model of docs/protocol.md §11–§12: same selected server and phase (or timeout
    /// / communication failure), completion sends exactly to unanswered endpoints and only
    /// before D, nothing sent at or after D, exactly one outcome.
    #[test]
    fn machine_matches_the_model(
        unit in 1u64..=10,
        replays in 0u16..=4,
        sched in schedule(),
        final_units in 0u32..=3,
        completion in any::<bool>(),
        ids in proptest::sample::subsequence(vec![3u64, 8, 20, 21, 40], 1..=4).prop_shuffle(),
        dual in any::<u8>(),
        fail_mask in any::<u64>(),
        fail_some in any::<bool>(),
        responses in proptest::collection::vec(
            (prop_oneof![0u64..400, 0u64..60], 0usize..6),
            0..8,
        ),
    ) {
        let p = RequestPolicy::builder()
            .unit(Duration::from_millis(unit))
            .replays(replays)
            .schedule(sched)
            .final_units(final_units)
            .completion_delivery(completion)
            .build()
            .unwrap();
        let h = u64::from(p.horizon_ms());
        // Endpoints: every server once, some twice (dual-stack), interleaved.
        let mut eps = Vec::new();
        for (i, &id) in ids.iter().enumerate() {
            eps.push(Endpoint { server_id: id, addr: SocketAddr::from(([127, 0, 0, 1], 3000 + i as u16)) });
        }
        for (i, &id) in ids.iter().enumerate() {
            if dual & (1 << i) != 0 {
                eps.push(Endpoint { server_id: id, addr: SocketAddr::from(([127, 0, 0, 2], 3000 + i as u16)) });
            }
        }
        let n = eps.len();
        let snap: Snapshot = eps.clone().into();
        let oldest = *ids.iter().min().unwrap();
        // Round ends (ms offsets).
        let mut ends = Vec::new();
        let mut acc = 0u64;
        for k in 0..=replays {
            acc += unit * u64::from(p.round_units(k));
            ends.push(acc);
        }
        // Responses at t + 0.5 ms, t scaled into 0..1.3·H; server 99 is unknown.
        let mut resp: Vec<(u64, u64)> = responses
            .iter()
            .map(|&(t, s)| ((t * h * 13 / 10) / 400, if s < ids.len() { ids[s] } else { 99 }))
            .collect();
        resp.sort_by_key(|r| r.0);
        let all_fail = fail_some && (fail_mask | !((1u64 << n) - 1)) == u64::MAX;

        // ---- model
        let valid: Vec<(u64, u64)> = resp.iter().copied().filter(|&(t, s)| s != 99 && t < h).collect();
        let mut expected: Option<(u64, Phase, u64)> = None; // (server, phase, decision time ms*2)
        if !all_fail {
            let r0 = ends[0];
            let round0: Vec<_> = valid.iter().filter(|&&(t, _)| t < r0).collect();
            if let Some(&&(t, s)) = round0.iter().find(|&&&(_, s)| s == oldest) {
                expected = Some((s, Phase::Round(0), 2 * t + 1));
            } else if let Some(&&(_, s)) = round0.iter().min_by_key(|&&&(_, s)| s) {
                expected = Some((s, Phase::Round(0), 2 * r0));
            } else if let Some(&(t, s)) = valid.iter().find(|&&(t, _)| t >= r0) {
                let k = ends.iter().position(|&e| t < e);
                let phase = match k {
                    Some(k) => Phase::Round(k as u16),
                    None => Phase::Final,
                };
                expected = Some((s, phase, 2 * t + 1));
            }
        }

        // ---- drive
        let t0 = Instant::now();
        let half = |x2: u64| t0 + Duration::from_micros(x2 * 500);
        let mut m = Req::new(&p, snap, t0).unwrap();
        let mut answered: u64 = 0; // endpoints of servers with a valid response, as seen
        let mut completions = 0u32;
        let mut check = |m: &mut Req, now_x2: u64, answered: u64| -> Result<(), TestCaseError> {
            while let Some(t) = m.poll_transmit() {
                prop_assert!(now_x2 < 2 * h, "transmit at or after D");
                if t.kind != TransmitKind::Initial {
                    prop_assert_eq!(answered & (1 << t.endpoint), 0, "sent to an answered server");
                }
                if t.kind == TransmitKind::Completion {
                    completions += 1;
                }
            }
            Ok(())
        };
        for i in 0..n {
            let t = m.poll_transmit().unwrap();
            prop_assert_eq!((t.endpoint, t.kind), (i, TransmitKind::Initial));
            if fail_some && fail_mask & (1 << i) != 0 {
                m.transmit_failed(&t);
            }
        }
        prop_assert!(m.poll_transmit().is_none());
        let mut ri = 0;
        for _ in 0..(resp.len() + usize::from(replays) + 4) {
            let next_timer = m.poll_timeout();
            let next_resp = resp.get(ri).map(|r| half(2 * r.0 + 1));
            match (next_timer, next_resp) {
                (Some(d), r) if r.is_none_or(|r| d < r) => {
                    m.handle_timeout(d);
                    let x2 = ((d - t0).as_micros() / 500) as u64;
                    check(&mut m, x2, answered)?;
                }
                (_, Some(at)) => {
                    let (t, s) = resp[ri];
                    ri += 1;
                    let r = m.handle_results(at, s, 1, [], []);
                    if r.is_ok() {
                        for (j, e) in eps.iter().enumerate() {
                            if e.server_id == s {
                                answered |= 1 << j;
                            }
                        }
                    }
                    check(&mut m, 2 * t + 1, answered)?;
                }
                (None, None) => break,
                _ => {}
            }
        }
        // Remaining responses are ignored; outcome exactly once.
        let out = m.poll_outcome();
        prop_assert!(m.poll_outcome().is_none());
        let out = out.expect("an outcome");
        match (expected, out) {
            (Some((s, phase, at_x2)), Ok(r)) => {
                prop_assert_eq!((r.server_id, r.phase), (Some(s), phase));
                let unanswered = (0..n).filter(|j| answered & (1 << j) == 0).count() as u32;
                let want = if completion && at_x2 < 2 * h { unanswered } else { 0 };
                prop_assert_eq!(r.completion_sends, want);
                prop_assert_eq!(completions, want);
            }
            (None, Err(f)) => {
                let want = if all_fail { FailureCategory::Communication } else { FailureCategory::Timeout };
                prop_assert_eq!(f.category(), want);
            }
            (e, o) => prop_assert!(false, "expected {:?}, got {:?}", e, o),
        }
    }
}
