//! Request policy: the time unit U, the replay count N, the replay-gap schedule B(k), the
//! final receive units F, completion delivery, and the horizon H = U × (B(0)+…+B(N)+F)
//! (docs/protocol.md §10).
//!
//! Owns: [`RequestPolicy`], its builder, [`Schedule`] and [`PolicyError`]; every check of
//! a policy that can be made before a send (including the key's dedup-TTL limit).
//! Must not touch: sockets, clocks, the wire format, or the API key's secret — a policy
//! error names the horizon and the limit, never the key.
//!
//! All arithmetic is overflow-free: schedule values saturate at their `max`, sums are
//! taken in `u64` and the horizon is refused when it does not fit a `u32` of milliseconds.

use std::time::Duration;

use crate::proto::key::ApiKey;

/// The number of units each transmission round lasts, B(k) for round k = 0..=N.
///
/// Every variant keeps `1 <= initial <= max` (or `b >= 1` for [`Schedule::Fixed`]);
/// values are computed without overflow and saturate at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// B(k) = b, with b >= 1.
    Fixed(u32),
    /// B(k) = min(initial + k·step, max), with step >= 1.
    Linear {
        /// B(0).
        initial: u32,
        /// Added per round.
        step: u32,
        /// The cap.
        max: u32,
    },
    /// B(k) = min(initial·factor^k, max), with factor >= 2.
    Exponential {
        /// B(0).
        initial: u32,
        /// Multiplied per round.
        factor: u32,
        /// The cap.
        max: u32,
    },
}

/// Which schedule rule a [`Schedule`] breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// `Fixed(0)`: a round must last at least one unit.
    #[error("fixed schedule needs b >= 1")]
    FixedZero,
    /// `initial` is 0: a round must last at least one unit.
    #[error("schedule initial must be >= 1")]
    InitialZero,
    /// `initial > max`.
    #[error("schedule initial ({initial}) must be <= max ({max})")]
    InitialAboveMax {
        /// The schedule's initial value.
        initial: u32,
        /// The schedule's cap.
        max: u32,
    },
    /// Linear schedule with `step == 0`.
    #[error("linear schedule needs step >= 1")]
    StepZero,
    /// Exponential schedule with `factor < 2`.
    #[error("exponential schedule needs factor >= 2 (got {0})")]
    FactorBelowTwo(u32),
}

impl Schedule {
    /// `Schedule::Fixed(units)`, under the official crate's constructor name.
    pub const fn fixed(units: u32) -> Schedule {
        Schedule::Fixed(units)
    }

    /// `Schedule::Linear { .. }`, as a constructor.
    pub const fn linear(initial: u32, step: u32, max: u32) -> Schedule {
        Schedule::Linear { initial, step, max }
    }

    /// `Schedule::Exponential { .. }`, as a constructor.
    pub const fn exponential(initial: u32, factor: u32, max: u32) -> Schedule {
        Schedule::Exponential {
            initial,
            factor,
            max,
        }
    }

    /// Checks the schedule's domain (docs/protocol.md §10).
    pub fn validate(&self) -> Result<(), ScheduleError> {
        let (initial, max) = match *self {
            Schedule::Fixed(b) => {
                return if b == 0 {
                    Err(ScheduleError::FixedZero)
                } else {
                    Ok(())
                };
            }
            Schedule::Linear { initial, step, max } => {
                if step == 0 {
                    return Err(ScheduleError::StepZero);
                }
                (initial, max)
            }
            Schedule::Exponential {
                initial,
                factor,
                max,
            } => {
                if factor < 2 {
                    return Err(ScheduleError::FactorBelowTwo(factor));
                }
                (initial, max)
            }
        };
        if initial == 0 {
            return Err(ScheduleError::InitialZero);
        }
        if initial > max {
            return Err(ScheduleError::InitialAboveMax { initial, max });
        }
        Ok(())
    }

    /// B(k): the number of units round `k` lasts. Never overflows (saturates at `max`).
    pub fn units(&self, k: u32) -> u32 {
        match *self {
            Schedule::Fixed(b) => b,
            Schedule::Linear { initial, step, max } => {
                let v = u64::from(initial) + u64::from(k) * u64::from(step);
                v.min(u64::from(max)) as u32
            }
            Schedule::Exponential { initial, max, .. } => {
                let mut v = initial.min(max);
                // factor >= 2 reaches max within 32 steps; factor < 2 (invalid) is bounded by k.
                for _ in 0..k.min(64) {
                    if v >= max {
                        break;
                    }
                    v = self.next_units(v);
                }
                v
            }
        }
    }

    /// B(k+1) given B(k): the O(1) step the request machine uses between rounds.
    pub fn next_units(&self, current: u32) -> u32 {
        match *self {
            Schedule::Fixed(b) => b,
            Schedule::Linear { step, max, .. } => current.saturating_add(step).min(max),
            Schedule::Exponential { factor, max, .. } => current.saturating_mul(factor).min(max),
        }
    }
}

/// Why a text is not a schedule (see [`Schedule`]'s [`FromStr`](std::str::FromStr)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleParseError {
    /// The kind before `:` is not `fixed`, `linear`, `exp` or `exponential`, or there is
    /// no `:`.
    #[error("expected fixed:B, linear:INIT,STEP,MAX or exp:INIT,FACTOR,MAX")]
    UnknownKind,
    /// The kind is known but its values are not the right count of decimal u32s.
    #[error("{expected}: each value a decimal number 0..=4294967295")]
    BadValues {
        /// The form the kind needs, e.g. `linear:INIT,STEP,MAX`.
        expected: &'static str,
    },
}

/// The one text form of a schedule, shared by every tool:
///
/// ```text
/// fixed:B | linear:INIT,STEP,MAX | exp:INIT,FACTOR,MAX   (exponential: is accepted for exp:)
/// ```
///
/// Values are plain decimal `u32` (ASCII digits only: no sign, no whitespace). Parsing
/// checks the syntax only; the domain (B >= 1, step >= 1, factor >= 2, 1 <= INIT <= MAX)
/// is [`Schedule::validate`]'s, which the policy builder runs and which names the rule
/// that fails. [`Display`](std::fmt::Display) writes the same form (`exp:` for
/// exponential), so display and parse round-trip.
impl std::str::FromStr for Schedule {
    type Err = ScheduleParseError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        fn number(s: &str) -> Option<u32> {
            let digits = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
            if digits { s.parse().ok() } else { None }
        }
        let (kind, rest) = text
            .split_once(':')
            .ok_or(ScheduleParseError::UnknownKind)?;
        let expected = match kind {
            "fixed" => "fixed:B",
            "linear" => "linear:INIT,STEP,MAX",
            "exp" | "exponential" => "exp:INIT,FACTOR,MAX",
            _ => return Err(ScheduleParseError::UnknownKind),
        };
        let bad = ScheduleParseError::BadValues { expected };
        let values = rest.split(',').map(number).collect::<Option<Vec<u32>>>();
        match (kind, values.as_deref().ok_or(bad)?) {
            ("fixed", &[b]) => Ok(Schedule::Fixed(b)),
            ("linear", &[initial, step, max]) => Ok(Schedule::Linear { initial, step, max }),
            ("exp" | "exponential", &[initial, factor, max]) => Ok(Schedule::Exponential {
                initial,
                factor,
                max,
            }),
            _ => Err(bad),
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Schedule::Fixed(b) => write!(f, "fixed:{b}"),
            Schedule::Linear { initial, step, max } => write!(f, "linear:{initial},{step},{max}"),
            Schedule::Exponential {
                initial,
                factor,
                max,
            } => write!(f, "exp:{initial},{factor},{max}"),
        }
    }
}

/// Why a policy is refused (found before any send).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// U < 1 ms.
    #[error("time unit must be at least 1 ms")]
    UnitTooSmall,
    /// U is not a whole number of milliseconds.
    #[error("time unit must be a whole number of milliseconds")]
    UnitNotWholeMs,
    /// The replay-gap schedule breaks its domain.
    #[error("bad replay-gap schedule: {0}")]
    BadSchedule(ScheduleError),
    /// H = U × (B(0)+…+B(N)+F) does not fit a u32 of milliseconds.
    #[error("policy horizon overflows u32 milliseconds")]
    HorizonOverflow,
    /// H exceeds the API key's dedup_ttl_ms_max.
    #[error("policy horizon {horizon_ms} ms exceeds the key's dedup TTL limit {limit_ms} ms")]
    HorizonOverKeyLimit {
        /// The policy's horizon.
        horizon_ms: u32,
        /// The key's dedup TTL limit.
        limit_ms: u32,
    },
    /// A request's endpoint snapshot holds more endpoints than one request can address.
    #[error("{count} endpoints exceed the per-request maximum of {max}")]
    TooManyEndpoints {
        /// Endpoints in the snapshot.
        count: usize,
        /// The per-request maximum.
        max: usize,
    },
}

/// A validated request policy. `Default` = U 20 ms, N 1, fixed(1), F 1, completion on
/// (H = 60 ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPolicy {
    unit_ms: u32,
    replays: u16,
    schedule: Schedule,
    final_units: u32,
    completion: bool,
    horizon_ms: u32,
}

impl Default for RequestPolicy {
    fn default() -> Self {
        RequestPolicy {
            unit_ms: 20,
            replays: 1,
            schedule: Schedule::Fixed(1),
            final_units: 1,
            completion: true,
            horizon_ms: 60,
        }
    }
}

impl RequestPolicy {
    /// A builder starting from the default policy.
    pub fn builder() -> RequestPolicyBuilder {
        RequestPolicyBuilder::default()
    }

    /// H as a duration.
    pub fn horizon(&self) -> Duration {
        Duration::from_millis(u64::from(self.horizon_ms))
    }

    /// H in milliseconds (sent as the request's dedup TTL).
    pub fn horizon_ms(&self) -> u32 {
        self.horizon_ms
    }

    /// U.
    pub fn unit(&self) -> Duration {
        Duration::from_millis(u64::from(self.unit_ms))
    }

    /// U in milliseconds.
    pub fn unit_ms(&self) -> u32 {
        self.unit_ms
    }

    /// N, the number of replay rounds after round 0.
    pub fn replays(&self) -> u16 {
        self.replays
    }

    /// The replay-gap schedule.
    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// F, the final receive phase in units (0 = no final phase).
    pub fn final_units(&self) -> u32 {
        self.final_units
    }

    /// Whether completion delivery is on.
    pub fn completion_delivery(&self) -> bool {
        self.completion
    }

    /// B(k), the units round `k` lasts.
    pub fn round_units(&self, k: u16) -> u32 {
        self.schedule.units(u32::from(k))
    }

    /// Checks H against the API key's dedup-TTL limit.
    pub fn check_key(&self, key: &ApiKey) -> Result<(), PolicyError> {
        self.check_dedup_limit(key.quotas().dedup_ttl_ms_max)
    }

    /// Checks H against a dedup-TTL limit in milliseconds (`check_key` without the key).
    pub fn check_dedup_limit(&self, limit_ms: u32) -> Result<(), PolicyError> {
        if self.horizon_ms > limit_ms {
            Err(PolicyError::HorizonOverKeyLimit {
                horizon_ms: self.horizon_ms,
                limit_ms,
            })
        } else {
            Ok(())
        }
    }
}

/// Builds a [`RequestPolicy`]; every setter starts from the default.
#[derive(Clone, Debug)]
pub struct RequestPolicyBuilder {
    unit: Duration,
    replays: u16,
    schedule: Schedule,
    final_units: u32,
    completion: bool,
}

impl Default for RequestPolicyBuilder {
    fn default() -> Self {
        RequestPolicyBuilder {
            unit: Duration::from_millis(20),
            replays: 1,
            schedule: Schedule::Fixed(1),
            final_units: 1,
            completion: true,
        }
    }
}

impl RequestPolicyBuilder {
    /// U (whole milliseconds, >= 1 ms).
    pub fn unit(mut self, unit: Duration) -> Self {
        self.unit = unit;
        self
    }

    /// N (0..=65535).
    pub fn replays(mut self, n: u16) -> Self {
        self.replays = n;
        self
    }

    /// B(k).
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// F (0 removes the final phase).
    pub fn final_units(mut self, f: u32) -> Self {
        self.final_units = f;
        self
    }

    /// The official crate's name for [`RequestPolicyBuilder::final_units`].
    pub fn final_receive_units(self, f: u32) -> Self {
        self.final_units(f)
    }

    /// The official crate's name for [`RequestPolicyBuilder::schedule`] (the replay-gap
    /// schedule B(k)).
    pub fn replay_gap(self, schedule: Schedule) -> Self {
        self.schedule(schedule)
    }

    /// Completion delivery on or off.
    pub fn completion_delivery(mut self, on: bool) -> Self {
        self.completion = on;
        self
    }

    /// Validates and computes H.
    pub fn build(self) -> Result<RequestPolicy, PolicyError> {
        if self.unit < Duration::from_millis(1) {
            return Err(PolicyError::UnitTooSmall);
        }
        if !self.unit.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(PolicyError::UnitNotWholeMs);
        }
        self.schedule.validate().map_err(PolicyError::BadSchedule)?;
        let unit_ms =
            u32::try_from(self.unit.as_millis()).map_err(|_| PolicyError::HorizonOverflow)?;
        let units = total_units(self.schedule, self.replays, self.final_units);
        let horizon = units
            .checked_mul(u64::from(unit_ms))
            .and_then(|h| u32::try_from(h).ok())
            .ok_or(PolicyError::HorizonOverflow)?;
        Ok(RequestPolicy {
            unit_ms,
            replays: self.replays,
            schedule: self.schedule,
            final_units: self.final_units,
            completion: self.completion,
            horizon_ms: horizon,
        })
    }
}

/// B(0)+…+B(N)+F in u64 (at most 65536 × u32::MAX + u32::MAX < 2^49: never overflows).
fn total_units(schedule: Schedule, replays: u16, final_units: u32) -> u64 {
    let mut sum = u64::from(final_units);
    let mut b = schedule.units(0);
    for k in 0..=u32::from(replays) {
        sum += u64::from(b);
        if k < u32::from(replays) {
            b = schedule.next_units(b);
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn official_crate_names_are_aliases() {
        let a = RequestPolicy::builder()
            .replays(2)
            .replay_gap(Schedule::fixed(2))
            .final_receive_units(3)
            .build()
            .unwrap();
        let b = RequestPolicy::builder()
            .replays(2)
            .schedule(Schedule::Fixed(2))
            .final_units(3)
            .build()
            .unwrap();
        assert_eq!(a, b);
        assert_eq!(
            Schedule::linear(1, 2, 5),
            Schedule::Linear {
                initial: 1,
                step: 2,
                max: 5
            }
        );
        assert_eq!(
            Schedule::exponential(1, 2, 8),
            Schedule::Exponential {
                initial: 1,
                factor: 2,
                max: 8
            }
        );
    }

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn default_policy_horizon_is_60ms() {
        let p = RequestPolicy::default();
        assert_eq!(p.horizon_ms(), 60);
        assert_eq!(RequestPolicy::builder().build().unwrap(), p);
    }

    #[test]
    fn worked_values() {
        let p = RequestPolicy::builder()
            .unit(ms(25))
            .replays(3)
            .final_units(0)
            .build()
            .unwrap();
        assert_eq!(p.horizon_ms(), 100);
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
        assert_eq!(
            (0..3).map(|k| p.round_units(k)).collect::<Vec<_>>(),
            [1, 2, 4]
        );
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
    }

    #[test]
    fn domain_errors() {
        let b = RequestPolicy::builder;
        assert_eq!(b().unit(ms(0)).build(), Err(PolicyError::UnitTooSmall));
        assert_eq!(
            b().unit(Duration::from_micros(1500)).build(),
            Err(PolicyError::UnitNotWholeMs)
        );
        assert_eq!(
            b().schedule(Schedule::Fixed(0)).build(),
            Err(PolicyError::BadSchedule(ScheduleError::FixedZero))
        );
        let lin0 = Schedule::Linear {
            initial: 1,
            step: 0,
            max: 3,
        };
        assert_eq!(
            b().schedule(lin0).build(),
            Err(PolicyError::BadSchedule(ScheduleError::StepZero))
        );
        let exp1 = Schedule::Exponential {
            initial: 1,
            factor: 1,
            max: 3,
        };
        assert_eq!(
            b().schedule(exp1).build(),
            Err(PolicyError::BadSchedule(ScheduleError::FactorBelowTwo(1)))
        );
        let above = Schedule::Linear {
            initial: 4,
            step: 1,
            max: 3,
        };
        assert_eq!(
            b().schedule(above).build(),
            Err(PolicyError::BadSchedule(ScheduleError::InitialAboveMax {
                initial: 4,
                max: 3
            }))
        );
        let zero = Schedule::Exponential {
            initial: 0,
            factor: 2,
            max: 3,
        };
        assert_eq!(
            b().schedule(zero).build(),
            Err(PolicyError::BadSchedule(ScheduleError::InitialZero))
        );
        assert_eq!(
            b().unit(ms(u64::from(u32::MAX))).build(),
            Err(PolicyError::HorizonOverflow)
        );
        assert_eq!(
            b().unit(ms(u64::MAX / 2)).build(),
            Err(PolicyError::HorizonOverflow)
        );
        assert_eq!(
            b().replays(u16::MAX)
                .schedule(Schedule::Fixed(u32::MAX))
                .build(),
            Err(PolicyError::HorizonOverflow)
        );
    }

    #[test]
    fn saturating_schedules() {
        let e = Schedule::Exponential {
            initial: 3,
            factor: u32::MAX,
            max: u32::MAX - 1,
        };
        assert_eq!(e.units(0), 3);
        assert_eq!(e.units(1), u32::MAX - 1);
        assert_eq!(e.units(u32::MAX), u32::MAX - 1);
        let l = Schedule::Linear {
            initial: 1,
            step: u32::MAX,
            max: u32::MAX,
        };
        assert_eq!(l.units(u32::MAX), u32::MAX);
    }

    #[test]
    fn key_limit_error_names_horizon_and_limit() {
        let p = RequestPolicy::builder().unit(ms(101)).build().unwrap();
        assert_eq!(p.horizon_ms(), 303);
        let e = p.check_dedup_limit(300).unwrap_err();
        assert_eq!(
            e,
            PolicyError::HorizonOverKeyLimit {
                horizon_ms: 303,
                limit_ms: 300
            }
        );
        assert!(e.to_string().contains("303") && e.to_string().contains("300"));
        assert!(RequestPolicy::default().check_dedup_limit(60).is_ok());
    }
}
