//! One call's decision, with no network and no engine handle (it counts into the rules'
//! shared atomic counters): which descriptors have a limit ([`Plan::new`]), the
//! Ratelimitly requests they make, and the answer from those requests' verdicts
//! ([`Plan::answer`]).
//!
//! - Every descriptor with an enforced limit is a resource of **one** request, decided
//!   atomically: `OVER_LIMIT` if any one is over, and then nothing is consumed on the
//!   others. Descriptors that reach the same bucket (same domain, entries and limit) are
//!   one resource with their hits added.
//! - `shadow_mode` rules are a second request, sent at the same time: decided and counted
//!   on their own, so that a shadow rule over its limit never holds back the enforced
//!   ones; their statuses are always OK.
//! - A bucket is the domain and every entry of the descriptor (keys and values), with the
//!   limit: `remote_address` keys one bucket per address, as envoyproxy/ratelimit's cache
//!   key does.
//! - Each status of a limited descriptor carries `current_limit`, `limit_remaining` (the
//!   limit minus the tokens in the window after the decision) and `duration_until_reset`:
//!   the window, in whole seconds rounded up, the tower layer's `Retry-After` rule
//!   (`RetryAfter::Window`): never too short, since the service does not say when the
//!   window's tokens were consumed.
//! - `response_headers_to_add`: `RateLimit-Policy` and `RateLimit` (the tower layer's
//!   writers) for the enforced limits, and on `OVER_LIMIT` `Retry-After` (the longest
//!   reset of the descriptors over their limit), which Envoy keeps as it is.
//!
//! Owns: the mapping between descriptors and resources and the answer's content. Must
//! not touch: the network, the engine's handle, gRPC statuses.

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use ratelimitly_engine::Resource;
use ratelimitly_tower::fields::{policy_value, ratelimit_value, whole_secs_up};
use ratelimitly_tower::{OnFailure, PolicyState, Verdict};

use super::metrics::{DescriptorOutcome, RuleCounters};
use super::request::{Call, Invalid, MAX_BUCKETS, MAX_HITS};
use super::rules::{Limit, Quota, Rules};

/// A descriptor with a limit.
#[derive(Debug)]
struct Limited<'r> {
    limit: Limit,
    shadow: bool,
    /// `current_limit.name`.
    name: &'r str,
    /// The policy name of the RateLimit fields.
    label: &'r str,
    counters: &'r RuleCounters,
    bucket: [u8; 16],
}

/// What one descriptor of the call is.
#[derive(Debug)]
enum Slot<'r> {
    /// No rule (or an unconfigured domain): OK, no current limit.
    NoRule,
    /// `unlimited: true`: OK.
    Unlimited,
    Limited(Limited<'r>),
}

/// A call's descriptors and the requests they make.
#[derive(Debug)]
pub struct Plan<'r> {
    slots: Vec<Slot<'r>>,
    /// The enforced limits' resources and tokens: one request.
    pub enforced: Vec<(Resource, u32)>,
    /// The shadow rules' resources and tokens: another request.
    pub shadow: Vec<(Resource, u32)>,
}

/// No decision, and no `--on-failure`: the call is answered gRPC `UNAVAILABLE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoDecision(pub String);

/// The bucket name of a descriptor of `domain`: every part length-prefixed, so that no
/// two descriptors share a name.
fn bucket_name(domain: &str, entries: &[Entry]) -> String {
    use std::fmt::Write as _;
    let len = 16
        + domain.len()
        + entries
            .iter()
            .map(|e| e.key.len() + e.value.len() + 16)
            .sum::<usize>();
    let mut s = String::with_capacity(len);
    let _ = write!(s, "rls:{}:{domain}", domain.len());
    for e in entries {
        let _ = write!(
            s,
            ":{}:{}:{}:{}",
            e.key.len(),
            e.key,
            e.value.len(),
            e.value
        );
    }
    s
}

/// Adds `hits` of `r` to `list`: to its resource when the bucket is already there.
fn add(list: &mut Vec<(Resource, u32)>, r: Resource, hits: u16, i: usize) -> Result<(), Invalid> {
    if let Some((_, n)) = list.iter_mut().find(|(x, _)| x.id() == r.id()) {
        *n += u32::from(hits);
        if u64::from(*n) > MAX_HITS {
            return Err(Invalid::TooManyHits(i, u64::from(*n)));
        }
        return Ok(());
    }
    if list.len() == MAX_BUCKETS {
        return Err(Invalid::TooManyBuckets(MAX_BUCKETS + 1));
    }
    list.push((r, u32::from(hits)));
    Ok(())
}

impl<'r> Plan<'r> {
    /// The plan of `call` under `rules`.
    pub fn new(rules: &'r Rules, call: &Call<'_>) -> Result<Plan<'r>, Invalid> {
        let mut plan = Plan {
            slots: Vec::with_capacity(call.descriptors.len()),
            enforced: Vec::new(),
            shadow: Vec::new(),
        };
        let Some(domain) = rules.domain(call.domain) else {
            plan.slots
                .extend(call.descriptors.iter().map(|_| Slot::NoRule));
            return Ok(plan);
        };
        for (i, d) in call.descriptors.iter().enumerate() {
            let rule = domain.find(d.entries);
            // A request's override sets the limit (enforced, as envoyproxy/ratelimit does),
            // matched rule or not.
            let (limit, shadow, name, label, counters) = match (d.limit, rule) {
                (Some(l), Some(r)) => (l, false, "", &*r.label, &*r.counters),
                (Some(l), None) => (l, false, "", "override", &*domain.override_counters),
                (None, None) => {
                    plan.slots.push(Slot::NoRule);
                    continue;
                }
                (None, Some(r)) => match r.quota {
                    Quota::Unlimited => {
                        plan.slots.push(Slot::Unlimited);
                        continue;
                    }
                    Quota::Limited(l) => (l, r.shadow, &*r.name, &*r.label, &*r.counters),
                },
            };
            if let Some(max) = rules.window_max
                && limit.window > max
            {
                return Err(Invalid::OverrideTooLong(
                    i,
                    limit.window.as_millis(),
                    max.as_millis(),
                ));
            }
            // Cannot fail: the name is never empty and windows are checked whole
            // milliseconds; refused as an override would be, were it to.
            let resource = Resource::new(
                bucket_name(call.domain, d.entries),
                limit.window,
                limit.requests_per_unit,
            )
            .map_err(|_| Invalid::BadOverrideUnit(i, limit.unit.proto()))?;
            let bucket = resource.id();
            let list = if shadow {
                &mut plan.shadow
            } else {
                &mut plan.enforced
            };
            add(list, resource, d.hits, i)?;
            plan.slots.push(Slot::Limited(Limited {
                limit,
                shadow,
                name,
                label,
                counters,
                bucket,
            }));
        }
        Ok(plan)
    }

    /// The answer, given the verdicts of the enforced and the shadow request (`None`
    /// for a request that was not sent: no resources), under the failure policy
    /// `on_failure`. Counts each limited descriptor in its rule's counters.
    pub fn answer(
        &self,
        enforced: Option<&Verdict>,
        shadow: Option<&Verdict>,
        on_failure: Option<OnFailure>,
    ) -> Result<RateLimitResponse, NoDecision> {
        if let Some(v @ (Verdict::Failed(_) | Verdict::Invalid)) = enforced
            && on_failure.is_none()
        {
            self.count_failed(false);
            return Err(NoDecision(match v {
                Verdict::Failed(k) => format!("no decision from Ratelimitly: {k:?}"),
                _ => "the request could not be sent to Ratelimitly".into(),
            }));
        }
        let mut out = RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses: Vec::with_capacity(self.slots.len()),
            ..Default::default()
        };
        let mut policies: Vec<(PolicyState, [u8; 16])> = Vec::new();
        let mut retry: Option<Duration> = None;
        for slot in &self.slots {
            let status = match slot {
                Slot::NoRule => DescriptorStatus {
                    code: Code::Ok as i32,
                    ..Default::default()
                },
                Slot::Unlimited => DescriptorStatus {
                    code: Code::Ok as i32,
                    limit_remaining: u32::MAX,
                    ..Default::default()
                },
                Slot::Limited(l) => {
                    let verdict = if l.shadow { shadow } else { enforced };
                    let s = Assessed::of(l, verdict, on_failure);
                    l.counters.record(s.outcome);
                    if s.over {
                        out.overall_code = Code::OverLimit as i32;
                        if let Some(r) = s.reset.filter(|_| s.deficit) {
                            retry = retry.max(Some(r));
                        }
                    }
                    if !l.shadow && !policies.iter().any(|(_, b)| *b == l.bucket) {
                        policies.push((s.policy(l), l.bucket));
                    }
                    s.status(l)
                }
            };
            out.statuses.push(status);
        }
        out.response_headers_to_add = headers(policies, retry, out.overall_code);
        Ok(out)
    }

    fn count_failed(&self, shadow: bool) {
        for s in &self.slots {
            if let Slot::Limited(l) = s
                && l.shadow == shadow
            {
                l.counters.record(DescriptorOutcome::Failed);
            }
        }
    }
}

/// A limited descriptor's state after the verdict.
struct Assessed {
    outcome: DescriptorOutcome,
    /// Answered `OVER_LIMIT`.
    over: bool,
    /// Its own bucket was short of tokens.
    deficit: bool,
    remaining: Option<u32>,
    reset: Option<Duration>,
}

impl Assessed {
    fn of(l: &Limited<'_>, verdict: Option<&Verdict>, on_failure: Option<OnFailure>) -> Assessed {
        use DescriptorOutcome as O;
        let mut a = Assessed {
            outcome: O::Granted,
            over: false,
            deficit: false,
            remaining: None,
            reset: None,
        };
        match verdict {
            Some(Verdict::Decided(d)) => {
                let res = d.resources.iter().find(|r| r.bucket_id == l.bucket);
                a.deficit = res.is_some_and(|r| r.deficit > 0);
                a.remaining = res.map(|r| l.limit.requests_per_unit.saturating_sub(r.actual_rate));
                a.reset = res.map(|r| l.limit.window.max(r.window()));
                a.outcome = match (l.shadow, d.granted, a.deficit) {
                    (true, _, true) => O::ShadowOverLimit,
                    (_, true, _) => O::Granted,
                    (false, false, true) => O::OverLimit,
                    (_, false, false) => O::NotConsumed,
                };
                // a rejection without this bucket's result: over, to be safe
                a.over = !l.shadow && !d.granted && (a.deficit || res.is_none());
            }
            Some(Verdict::Granted) | None => {}
            Some(Verdict::Rejected { .. }) => {
                a.outcome = if l.shadow {
                    O::ShadowOverLimit
                } else {
                    O::OverLimit
                };
                a.over = !l.shadow;
            }
            Some(_) => {
                a.outcome = O::Failed;
                a.over = !l.shadow && on_failure == Some(OnFailure::Closed);
            }
        }
        a
    }

    fn status(&self, l: &Limited<'_>) -> DescriptorStatus {
        DescriptorStatus {
            code: (if self.over { Code::OverLimit } else { Code::Ok }) as i32,
            current_limit: Some(RateLimit {
                name: l.name.to_owned(),
                requests_per_unit: l.limit.requests_per_unit,
                unit: l.limit.unit.proto(),
            }),
            limit_remaining: self.remaining.unwrap_or(0),
            duration_until_reset: self
                .reset
                .map(|r| envoy_types::pb::google::protobuf::Duration {
                    seconds: whole_secs_up(r) as i64,
                    nanos: 0,
                }),
            quota: None,
        }
    }

    fn policy(&self, l: &Limited<'_>) -> PolicyState {
        PolicyState {
            name: l.label.to_owned(),
            quota: l.limit.requests_per_unit,
            window: l.limit.window,
            remaining: self.remaining,
            reset: self.reset,
        }
    }
}

/// `RateLimit-Policy` and `RateLimit` of `policies` (a name repeated gets `-i`, `i` its
/// index), and `Retry-After` on `OVER_LIMIT` when a reset is known.
fn headers(
    policies: Vec<(PolicyState, [u8; 16])>,
    retry: Option<Duration>,
    overall: i32,
) -> Vec<HeaderValue> {
    let mut states: Vec<PolicyState> = Vec::with_capacity(policies.len());
    for (i, (mut p, _)) in policies.into_iter().enumerate() {
        if states.iter().any(|s| s.name == p.name) {
            p.name = format!("{}-{i}", p.name);
        }
        states.push(p);
    }
    let header = |key: &str, v: Option<http::HeaderValue>| {
        v.and_then(|v| v.to_str().ok().map(str::to_owned))
            .map(|value| HeaderValue {
                key: key.to_owned(),
                value,
                raw_value: Vec::new(),
            })
    };
    let mut out: Vec<HeaderValue> = [
        header("RateLimit-Policy", policy_value(&states)),
        header("RateLimit", ratelimit_value(&states)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if overall == Code::OverLimit as i32
        && let Some(r) = retry
    {
        out.push(HeaderValue {
            key: "Retry-After".to_owned(),
            value: whole_secs_up(r).to_string(),
            raw_value: Vec::new(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rls::config::{Bounds, parse};
    use crate::rls::metrics::RlsMetrics;
    use crate::rls::rules::Unit;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use ratelimitly_engine::ResourceResult;
    use ratelimitly_tower::{Decided, FailureKind};

    const FILE: &str = "\
domain: edge
descriptors:
  - key: ip
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: user
    rate_limit: { window: 10s, requests_per_unit: 5, name: per_user }
  - key: probe
    shadow_mode: true
    rate_limit: { unit: second, requests_per_unit: 1 }
  - key: free
    rate_limit: { unlimited: true }
";

    fn rules(m: &RlsMetrics) -> Rules {
        let d = parse(FILE, Bounds::default(), m).unwrap();
        Rules {
            domains: [("edge".to_owned(), d)].into(),
            window_max: None,
        }
    }

    fn request(descs: &[(&str, &str)]) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: descs
                .iter()
                .map(|(k, v)| RateLimitDescriptor {
                    entries: vec![Entry {
                        key: (*k).into(),
                        value: (*v).into(),
                    }],
                    ..Default::default()
                })
                .collect(),
            hits_addend: 0,
        }
    }

    /// The engine's verdict on `list`: each resource with `used` tokens in its window
    /// before the request, granted when every one fits.
    fn decided(list: &[(Resource, u32)], used: &[u32]) -> Verdict {
        let results: Vec<ResourceResult> = list
            .iter()
            .zip(used)
            .map(|((r, n), u)| {
                let fits = u + n <= r.rate_limit();
                ResourceResult {
                    bucket_id: r.id(),
                    window_ms: r.window_ms(),
                    actual_rate: *u,
                    deficit: if fits {
                        0
                    } else {
                        (u + n - r.rate_limit()) as u16
                    },
                }
            })
            .collect();
        let granted = results.iter().all(|r| r.deficit == 0);
        let resources = results
            .into_iter()
            .zip(list)
            .map(|(mut r, (_, n))| {
                if granted {
                    r.actual_rate += n;
                }
                r
            })
            .collect();
        Verdict::Decided(Decided { granted, resources })
    }

    fn header<'a>(r: &'a RateLimitResponse, key: &str) -> Option<&'a str> {
        r.response_headers_to_add
            .iter()
            .find(|h| h.key == key)
            .map(|h| h.value.as_str())
    }

    #[test]
    fn one_request_for_every_enforced_descriptor() {
        let m = RlsMetrics::default();
        let rules = rules(&m);
        let req = request(&[
            ("ip", "1.2.3.4"),
            ("user", "u1"),
            ("nothing", "x"),
            ("free", "y"),
        ]);
        let call = Call::check(&req).unwrap();
        let plan = Plan::new(&rules, &call).unwrap();
        assert_eq!(plan.enforced.len(), 2);
        assert!(plan.shadow.is_empty());
        // granted: remaining counts down, the window is the reset
        let v = decided(&plan.enforced, &[0, 4]);
        let a = plan.answer(Some(&v), None, None).unwrap();
        assert_eq!(a.overall_code, Code::Ok as i32);
        let s = &a.statuses;
        assert_eq!(s.len(), 4);
        assert_eq!((s[0].limit_remaining, s[1].limit_remaining), (2, 0));
        assert_eq!(s[0].duration_until_reset.unwrap().seconds, 60);
        assert_eq!(s[1].duration_until_reset.unwrap().seconds, 10);
        let cl = s[1].current_limit.as_ref().unwrap();
        assert_eq!((cl.requests_per_unit, cl.name.as_str()), (5, "per_user"));
        assert_eq!(cl.unit, Unit::Other.proto(), "10 s is no proto unit");
        assert!(
            s[2].current_limit.is_none() && s[2].limit_remaining == 0,
            "no rule"
        );
        assert_eq!(s[3].limit_remaining, u32::MAX, "unlimited");
        assert_eq!(
            header(&a, "RateLimit-Policy"),
            Some("\"ip\";q=3;w=60, \"per_user\";q=5;w=10")
        );
        assert_eq!(
            header(&a, "RateLimit"),
            Some("\"ip\";r=2;t=60, \"per_user\";r=0;t=10")
        );
        assert_eq!(header(&a, "Retry-After"), None);
        // one over: OVER_LIMIT, the other not consumed
        let v = decided(&plan.enforced, &[0, 5]);
        let a = plan.answer(Some(&v), None, None).unwrap();
        assert_eq!(a.overall_code, Code::OverLimit as i32);
        assert_eq!(a.statuses[0].code, Code::Ok as i32);
        assert_eq!(a.statuses[0].limit_remaining, 3, "nothing consumed");
        assert_eq!(a.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(header(&a, "Retry-After"), Some("10"));
        let ip = m.rule(&"edge".into(), &"ip".into());
        let user = m.rule(&"edge".into(), &"per_user".into());
        assert_eq!(ip.get(DescriptorOutcome::Granted), 1);
        assert_eq!(ip.get(DescriptorOutcome::NotConsumed), 1);
        assert_eq!(user.get(DescriptorOutcome::OverLimit), 1);
    }

    #[test]
    fn shadow_is_its_own_request_and_always_ok() {
        let m = RlsMetrics::default();
        let rules = rules(&m);
        let req = request(&[("probe", "p"), ("ip", "a")]);
        let plan = Plan::new(&rules, &Call::check(&req).unwrap()).unwrap();
        assert_eq!((plan.enforced.len(), plan.shadow.len()), (1, 1));
        let shadow = decided(&plan.shadow, &[1]);
        let a = plan
            .answer(Some(&decided(&plan.enforced, &[0])), Some(&shadow), None)
            .unwrap();
        assert_eq!(a.overall_code, Code::Ok as i32);
        assert_eq!(a.statuses[0].code, Code::Ok as i32);
        let probe = m.rule(&"edge".into(), &"probe".into());
        assert_eq!(probe.get(DescriptorOutcome::ShadowOverLimit), 1);
        // the fields list enforced limits only
        assert_eq!(header(&a, "RateLimit-Policy"), Some("\"ip\";q=3;w=60"));
    }

    #[test]
    fn same_bucket_twice_is_one_resource_and_overrides_apply() {
        let m = RlsMetrics::default();
        let rules = rules(&m);
        let mut req = request(&[("ip", "a"), ("ip", "a"), ("other", "z")]);
        req.hits_addend = 2;
        req.descriptors[2].limit = Some(RateLimitOverride {
            requests_per_unit: 7,
            unit: envoy_types::pb::envoy::r#type::v3::RateLimitUnit::Hour as i32,
        });
        let plan = Plan::new(&rules, &Call::check(&req).unwrap()).unwrap();
        assert_eq!(plan.enforced.len(), 2);
        assert_eq!(plan.enforced[0].1, 4, "hits added");
        assert_eq!(plan.enforced[1].0.rate_limit(), 7);
        assert_eq!(plan.enforced[1].0.window_ms(), 3_600_000);
        let a = plan
            .answer(Some(&decided(&plan.enforced, &[0, 0])), None, None)
            .unwrap();
        assert_eq!(
            a.statuses[2]
                .current_limit
                .as_ref()
                .unwrap()
                .requests_per_unit,
            7
        );
        assert_eq!(
            header(&a, "RateLimit-Policy"),
            Some("\"ip\";q=3;w=60, \"override\";q=7;w=3600")
        );
    }

    #[test]
    fn failures_follow_the_policy() {
        let m = RlsMetrics::default();
        let rules = rules(&m);
        let req = request(&[("ip", "a"), ("probe", "p")]);
        let plan = Plan::new(&rules, &Call::check(&req).unwrap()).unwrap();
        let failed = Verdict::Failed(FailureKind::Timeout);
        assert!(
            plan.answer(Some(&failed), None, None).is_err(),
            "UNAVAILABLE"
        );
        let open = plan
            .answer(Some(&failed), Some(&failed), Some(OnFailure::Open))
            .unwrap();
        assert_eq!(open.overall_code, Code::Ok as i32);
        let closed = plan
            .answer(Some(&failed), Some(&failed), Some(OnFailure::Closed))
            .unwrap();
        assert_eq!(closed.overall_code, Code::OverLimit as i32);
        assert_eq!(closed.statuses[1].code, Code::Ok as i32, "shadow");
        assert_eq!(header(&closed, "RateLimit-Policy"), Some("\"ip\";q=3;w=60"));
        assert_eq!(header(&closed, "RateLimit"), None, "no state known");
        assert_eq!(header(&closed, "Retry-After"), None, "no estimate");
        let ip = m.rule(&"edge".into(), &"ip".into());
        assert_eq!(ip.get(DescriptorOutcome::Failed), 3);
        // an unconfigured domain: OK, nothing asked
        let mut req = request(&[("ip", "a")]);
        req.domain = "elsewhere".into();
        let plan = Plan::new(&rules, &Call::check(&req).unwrap()).unwrap();
        assert!(plan.enforced.is_empty());
        let a = plan.answer(None, None, None).unwrap();
        assert_eq!(a.overall_code, Code::Ok as i32);
        assert!(a.response_headers_to_add.is_empty());
    }

    #[test]
    fn bucket_names_do_not_collide() {
        let e = |k: &str, v: &str| Entry {
            key: k.into(),
            value: v.into(),
        };
        assert_ne!(
            bucket_name("d", &[e("a:1", "b")]),
            bucket_name("d", &[e("a", "1:b")])
        );
        assert_ne!(bucket_name("d:a", &[]), bucket_name("d", &[e("a", "")]));
    }
}
