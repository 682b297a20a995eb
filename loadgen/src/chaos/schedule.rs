//! The seeded chaos schedule: which fault starts and ends when, planned in full before
//! the run from `--seed`, `--duration`, the policy unit U and the number of servers.
//!
//! Owns the fault kinds, their parameters and their timing (the warm-up's fixed
//! rehearsal is `rehearsal.rs`). Must not touch responders,
//! the DNS responder or the clock (`control.rs` carries the plan out).

use std::time::Duration;

use rl_responder::FaultRng;

/// One kind of fault of the schedule (the `kind` of `chaos.events[]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    /// A server stopped for 0.5–2 s and restarted on the same address and id, with fresh
    /// state (empty buckets and dedup table).
    ServerRestart,
    /// Every server steers (asks the client to move to a new source port) every few
    /// responses, for 1–2 s.
    SteeringStorm,
    /// Every server drops 30–70 % of its responses, for 1–2 s.
    LossBurst,
    /// Every server delays its responses by 2–5 U plus up to U of jitter, for 1–2 s.
    DelayBurst,
    /// Every server sends 30–80 % of its responses twice, for 1–2 s.
    DuplicateBurst,
    /// A new (youngest) server started and published in the DNS zone.
    MembershipAdd,
    /// That server withdrawn from the DNS zone, then stopped 1.5 s later.
    MembershipRemove,
}

/// Every kind, in the order the summary lists them.
pub const FAULT_KINDS: [FaultKind; 7] = [
    FaultKind::ServerRestart,
    FaultKind::SteeringStorm,
    FaultKind::LossBurst,
    FaultKind::DelayBurst,
    FaultKind::DuplicateBurst,
    FaultKind::MembershipAdd,
    FaultKind::MembershipRemove,
];

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ServerRestart => "server_restart",
            FaultKind::SteeringStorm => "steering_storm",
            FaultKind::LossBurst => "loss_burst",
            FaultKind::DelayBurst => "delay_burst",
            FaultKind::DuplicateBurst => "duplicate_burst",
            FaultKind::MembershipAdd => "membership_add",
            FaultKind::MembershipRemove => "membership_remove",
        }
    }

    /// True when requests may time out while this fault lasts (and up to H after): a
    /// server down or lost to the client, responses lost or later than H. Steering,
    /// duplicates and a new member must not cost a request.
    pub fn explains_timeouts(self) -> bool {
        matches!(
            self,
            FaultKind::ServerRestart
                | FaultKind::LossBurst
                | FaultKind::DelayBurst
                | FaultKind::MembershipRemove
        )
    }
}

/// What a burst does to every responder while it lasts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Burst {
    /// Every n-th response steers.
    Steer(u32),
    /// Response drop probability.
    Loss(f64),
    /// Response delay and jitter.
    Delay { delay: Duration, jitter: Duration },
    /// Response duplicate probability.
    Duplicate(f64),
}

/// One step of the plan. `event` indexes [`Plan::events`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Stop base server `server` (index in start order, oldest first).
    Stop {
        event: usize,
        server: usize,
    },
    /// Restart it on the same address with the same id and fresh state.
    Restart {
        event: usize,
        server: usize,
    },
    BurstOn {
        event: usize,
        burst: Burst,
    },
    BurstOff {
        event: usize,
    },
    /// Start added server `slot` and publish it in the DNS zone.
    Add {
        event: usize,
        slot: usize,
    },
    /// Withdraw added server `slot` from the DNS zone.
    Withdraw {
        event: usize,
        slot: usize,
    },
    /// Stop added server `slot`.
    Retire {
        event: usize,
        slot: usize,
    },
}

/// One planned event: when it starts and ends (since the schedule start) and its kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Planned {
    pub at: Duration,
    pub until: Duration,
    pub kind: FaultKind,
}

/// The whole schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub events: Vec<Planned>,
    /// Every step, in time order.
    pub ops: Vec<(Duration, Op)>,
    /// Servers the plan adds (slots `0..added`).
    pub added: usize,
}

/// Longest gap between two event starts (the bar is one event every 3 s).
const MAX_GAP_S: f64 = 2.5;
/// How long a withdrawn server keeps answering (past the DNS TTL of 1 s).
const RETIRE_AFTER: Duration = Duration::from_millis(1500);

fn between(rng: &mut FaultRng, lo: f64, hi: f64) -> f64 {
    lo + (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * (hi - lo)
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

struct Planner {
    rng: FaultRng,
    plan: Plan,
    /// When each base server is back up.
    down_until: Vec<Duration>,
    unit: Duration,
    end: Duration,
}

impl Planner {
    fn event(&mut self, at: Duration, until: Duration, kind: FaultKind) -> usize {
        self.plan.events.push(Planned { at, until, kind });
        self.plan.events.len() - 1
    }

    /// A base server that may go down at `t` (at least one other stays up), if any.
    fn restart_candidate(&mut self, t: Duration) -> Option<usize> {
        let up: Vec<usize> = (0..self.down_until.len())
            .filter(|i| self.down_until[*i] <= t)
            .collect();
        if up.is_empty() || (self.down_until.len() > 1 && up.len() < 2) {
            return None;
        }
        Some(up[(self.rng.next_u64() % up.len() as u64) as usize])
    }

    /// Plans one event of `kind` at `t`; false when it does not fit there.
    fn add(&mut self, kind: FaultKind, t: Duration) -> bool {
        let len = secs(between(&mut self.rng, 1.0, 2.0)).min(self.end.saturating_sub(t));
        let burst = match kind {
            FaultKind::ServerRestart => return self.restart(t),
            FaultKind::MembershipAdd | FaultKind::MembershipRemove => return self.member(t),
            FaultKind::SteeringStorm => Burst::Steer(2 + (self.rng.next_u64() % 7) as u32),
            FaultKind::LossBurst => Burst::Loss(between(&mut self.rng, 0.3, 0.7)),
            FaultKind::DelayBurst => Burst::Delay {
                delay: self.unit.mul_f64(between(&mut self.rng, 2.0, 5.0)),
                jitter: self.unit,
            },
            FaultKind::DuplicateBurst => Burst::Duplicate(between(&mut self.rng, 0.3, 0.8)),
        };
        let event = self.event(t, t + len, kind);
        self.plan.ops.push((t, Op::BurstOn { event, burst }));
        self.plan.ops.push((t + len, Op::BurstOff { event }));
        true
    }

    fn restart(&mut self, t: Duration) -> bool {
        let Some(server) = self.restart_candidate(t) else {
            return false;
        };
        let down = secs(between(&mut self.rng, 0.5, 2.0)).min(self.end.saturating_sub(t));
        self.down_until[server] = t + down;
        let event = self.event(t, t + down, FaultKind::ServerRestart);
        self.plan.ops.push((t, Op::Stop { event, server }));
        self.plan
            .ops
            .push((t + down, Op::Restart { event, server }));
        true
    }

    fn member(&mut self, t: Duration) -> bool {
        let keep = secs(between(&mut self.rng, 1.5, 3.0));
        if t + keep + RETIRE_AFTER > self.end {
            return false;
        }
        let slot = self.plan.added;
        self.plan.added += 1;
        let added = self.event(t, t + keep, FaultKind::MembershipAdd);
        let removed = self.event(
            t + keep,
            t + keep + RETIRE_AFTER,
            FaultKind::MembershipRemove,
        );
        self.plan.ops.push((t, Op::Add { event: added, slot }));
        let withdraw = Op::Withdraw {
            event: removed,
            slot,
        };
        self.plan.ops.push((t + keep, withdraw));
        let retire = Op::Retire {
            event: removed,
            slot,
        };
        self.plan.ops.push((t + keep + RETIRE_AFTER, retire));
        true
    }
}

/// Plans the schedule for a run of `duration` with policy unit `unit` and `servers` base
/// servers. The first six events are the six fault families in a seeded order; then
/// families are drawn at random. Events start 0.5–2.5 s apart; every fault has ended
/// 0.3 s before `duration`.
pub fn plan(seed: u64, duration: Duration, unit: Duration, servers: usize) -> Plan {
    let mut p = Planner {
        rng: FaultRng::new(seed ^ 0xc4a0_5eed),
        plan: Plan {
            events: Vec::new(),
            ops: Vec::new(),
            added: 0,
        },
        down_until: vec![Duration::ZERO; servers.max(1)],
        unit,
        end: duration.saturating_sub(Duration::from_millis(300)),
    };
    // Every kind but the last: a removal follows its add, so it is no family of its own.
    let mut families: [FaultKind; 6] = FAULT_KINDS[..6].try_into().expect("six families");
    for i in (1..families.len()).rev() {
        families.swap(i, (p.rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut t = Duration::from_millis(500);
    let mut n = 0usize;
    while t + Duration::from_millis(500) < p.end {
        let first = if n < families.len() {
            families[n]
        } else {
            families[(p.rng.next_u64() % families.len() as u64) as usize]
        };
        // a kind that does not fit at t (no server may go down, no room to add one)
        // gives way to the next family
        let start = families.iter().position(|k| *k == first).unwrap_or(0);
        let _ = (0..families.len()).any(|k| p.add(families[(start + k) % families.len()], t));
        n += 1;
        t += secs(between(&mut p.rng, 0.5, MAX_GAP_S));
    }
    p.plan.ops.sort_by_key(|(at, _)| *at);
    p.plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_is_seeded_dense_and_varied() {
        let d = Duration::from_secs(60);
        let a = plan(1, d, Duration::from_millis(20), 2);
        assert_eq!(a, plan(1, d, Duration::from_millis(20), 2));
        assert_ne!(a, plan(2, d, Duration::from_millis(20), 2));
        assert!(a.events.len() >= 20, "{}", a.events.len());
        let mut starts: Vec<Duration> = a.events.iter().map(|e| e.at).collect();
        starts.sort();
        starts.insert(0, Duration::ZERO);
        starts.push(d);
        assert!(
            starts
                .windows(2)
                .all(|w| w[1] - w[0] <= Duration::from_secs(3))
        );
        let kinds: std::collections::BTreeSet<_> = a.events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds.len(), FAULT_KINDS.len());
        assert!(a.events.iter().all(|e| e.until <= d));
        // never both base servers down at once
        let short = plan(7, Duration::from_secs(12), Duration::from_millis(20), 2);
        assert!(short.events.len() >= 5);
    }
}
