//! The warm-up's rehearsal: a fixed, short plan of the faults that grow buffers, run
//! before the measured window so that the memory sampled as it starts is the faults'
//! steady state.
//!
//! Owns the rehearsal's faults and timing. Must not touch responders, the DNS responder or
//! the clock (`control.rs` carries the plan out).

use std::time::Duration;

use super::schedule::{Burst, FaultKind, Op, Plan, Planned};

/// Load after the warm-up's last rehearsed fault before the window starts ([`rehearsal`]).
const SETTLE_AFTER_REHEARSAL: Duration = Duration::from_millis(1500);

/// The warm-up's rehearsal: each base server stopped for 0.5 s and restarted, one at a
/// time from 0.5 s on (1 s apart, so another is always up; none with a single server),
/// then one burst each of duplicates, delay and steering at the schedule's full strength
/// (80 %, 5 U + U jitter, every 2nd response) for 1 s, 0.2 s apart: each fault that
/// grows a server's or the engine's buffers has grown them once, on servers restarted
/// under load. What does not fit before `warmup` − 1.5 s is left out. The memory sampled
/// when the window starts is then that steady state, not a fresh start's.
pub fn rehearsal(servers: usize, warmup: Duration, unit: Duration) -> Plan {
    let mut plan = Plan {
        events: Vec::new(),
        ops: Vec::new(),
        added: 0,
    };
    let fits = |end: Duration| end + SETTLE_AFTER_REHEARSAL <= warmup;
    let mut t = Duration::from_millis(500);
    let down = Duration::from_millis(500);
    for server in (0..servers).filter(|_| servers >= 2) {
        if !fits(t + down) {
            return plan;
        }
        let event = plan.events.len();
        let kind = FaultKind::ServerRestart;
        plan.events.push(Planned {
            at: t,
            until: t + down,
            kind,
        });
        plan.ops.push((t, Op::Stop { event, server }));
        plan.ops.push((t + down, Op::Restart { event, server }));
        t += Duration::from_secs(1);
    }
    let bursts = [
        (FaultKind::DuplicateBurst, Burst::Duplicate(0.8)),
        (
            FaultKind::DelayBurst,
            Burst::Delay {
                delay: unit * 5,
                jitter: unit,
            },
        ),
        (FaultKind::SteeringStorm, Burst::Steer(2)),
    ];
    let len = Duration::from_secs(1);
    for (kind, burst) in bursts {
        if !fits(t + len) {
            break;
        }
        let event = plan.events.len();
        plan.events.push(Planned {
            at: t,
            until: t + len,
            kind,
        });
        plan.ops.push((t, Op::BurstOn { event, burst }));
        plan.ops.push((t + len, Op::BurstOff { event }));
        t += len + Duration::from_millis(200);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rehearsal_restarts_each_server_in_turn_then_bursts_within_the_warm_up() {
        let unit = Duration::from_millis(20);
        let r = rehearsal(2, Duration::from_secs_f64(7.5), unit);
        let kinds: Vec<FaultKind> = r.events.iter().map(|e| e.kind).collect();
        use FaultKind::*;
        assert_eq!(
            kinds,
            [
                ServerRestart,
                ServerRestart,
                DuplicateBurst,
                DelayBurst,
                SteeringStorm
            ]
        );
        assert!(
            r.events.windows(2).all(|w| w[0].until <= w[1].at),
            "one at a time"
        );
        assert!(
            r.events
                .iter()
                .all(|e| e.until + SETTLE_AFTER_REHEARSAL <= Duration::from_secs_f64(7.5))
        );
        assert!(
            r.ops.windows(2).all(|w| w[0].0 <= w[1].0),
            "ops in time order"
        );
        assert_eq!(
            rehearsal(1, Duration::from_secs(10), unit).events[0].kind,
            DuplicateBurst
        );
        assert!(rehearsal(2, Duration::from_secs(1), unit).events.is_empty());
    }
}
