//! One call's decision, with no network and no engine handle (it counts into the rules'
//! shared atomic counters): which descriptors have a limit ([`Plan::new`]), the
//! Ratelimitly requests they make ([`Plan::parts`]), and the answer from those requests'
//! verdicts ([`Plan::answer`]).
//!
//! - Every descriptor with an enforced limit is a resource of **one** request, decided
//!   atomically: `OVER_LIMIT` if any one is over, and then nothing is consumed on the
//!   others. Descriptors that reach the same bucket (same domain, entries and limit) are
//!   one resource with their hits added. A request carries at most [`MAX_PER_REQUEST`]
//!   resources (the protocol's datagram): a call with more distinct enforced limits is
//!   split into several requests, each atomic on its own: a call answered `OVER_LIMIT`
//!   then may have consumed in the parts that were granted.
//! - `shadow_mode` rules are a request of their own, sent at the same time: decided and
//!   counted on their own, so that a shadow rule over its limit never holds back the
//!   enforced ones; their statuses are always OK.
//! - `quota_mode` rules: each bucket a request of its own, so that one quota over its
//!   limit holds back no other. Its status is `OVER_LIMIT` when over, and the call is
//!   `OVER_LIMIT` when an enforced limit is over or **every** quota descriptor is.
//! - `replaces`: a matched rule whose `name` another matched rule of the call replaces
//!   is not applied (status OK, no current limit), as the reference does.
//! - A bucket is the domain and every entry of the descriptor (keys and values), with the
//!   limit: `remote_address` keys one bucket per address, as envoyproxy/ratelimit's cache
//!   key does. An entry matched by a `share_threshold` wildcard is the pattern, not its
//!   value: every value it matches shares the bucket.
//! - Each status of a limited descriptor carries `current_limit`, `limit_remaining` (the
//!   limit minus the tokens in the window after the decision; 0 on `OVER_LIMIT`) and
//!   `duration_until_reset`: the time until the limit admits the descriptor's hits
//!   again: 0 when it would now, else the window in whole seconds rounded up (the
//!   service keeps a sliding window and does not say when its tokens were consumed, so
//!   only after a whole window is the request sure to fit; the tower layer's
//!   `RetryAfter::Window`).
//! - `response_headers_to_add`: `RateLimit-Policy` and `RateLimit` (the tower layer's
//!   writers) for the enforced and quota limits, and on `OVER_LIMIT` `Retry-After` (the
//!   longest reset of the descriptors over their limit), which Envoy keeps as it is.
//! - `dynamic_metadata`, when a rule of the domain has `metadata`: the reference's
//!   layout (`domain`, `descriptors` with their `entries` as `key=value`, `hitsAddend`,
//!   and `metadata`: the rules' `metadata` of the descriptors answered OK, merged).
//!
//! Owns: the mapping between descriptors and resources and the answer's content. Must
//! not touch: the network, the engine's handle, gRPC statuses.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use ratelimitly_engine::Resource;
use ratelimitly_tower::fields::{policy_value, ratelimit_value, whole_secs_up};
use ratelimitly_tower::{OnFailure, PolicyState, Verdict};

use super::metrics::{DescriptorOutcome, RuleCounters};
use super::request::{Call, Invalid, MAX_HITS};
use super::rules::{Limit, Quota, Rules};

/// Resources of one Ratelimitly request at most: one request datagram (1200 bytes)
/// carries 39 in the cookie mode, the largest framing.
pub const MAX_PER_REQUEST: usize = 32;

/// What a descriptor's limit is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// Enforced: the call is `OVER_LIMIT` when it is over.
    Enforced,
    /// `shadow_mode`: decided and counted, answered OK.
    Shadow,
    /// `quota_mode`: the call is `OVER_LIMIT` when every quota descriptor is over.
    Quota,
}

/// One Ratelimitly request of a call.
#[derive(Debug)]
pub struct Part {
    /// Its descriptors' kind.
    pub kind: LimitKind,
    /// Its resources and their tokens.
    pub resources: Vec<(Resource, u32)>,
}

/// A descriptor with a limit.
#[derive(Debug)]
struct Limited<'r> {
    limit: Limit,
    kind: LimitKind,
    /// `current_limit.name`.
    name: &'r str,
    /// The policy name of the RateLimit fields.
    label: &'r str,
    counters: Arc<RuleCounters>,
    bucket: [u8; 16],
    /// Its request in [`Plan::parts`].
    part: usize,
    hits: u16,
    metadata: Option<&'r Struct>,
}

/// What one descriptor of the call is.
#[derive(Debug)]
enum Slot<'r> {
    /// No rule (or an unconfigured domain, or a replaced rule): OK, no current limit.
    NoRule,
    /// `unlimited: true`: OK.
    Unlimited,
    Limited(Limited<'r>),
}

/// A call's descriptors and the requests they make.
#[derive(Debug)]
pub struct Plan<'r> {
    slots: Vec<Slot<'r>>,
    /// The requests: every one is sent, at the same time; their verdicts go to
    /// [`Plan::answer`] in this order.
    pub parts: Vec<Part>,
    /// The `dynamic_metadata` without the merged `metadata`, when the domain has some.
    meta: Option<Struct>,
}

/// No decision, and no `--on-failure`: the call is answered gRPC `UNAVAILABLE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoDecision(pub String);

/// The bucket name of a descriptor of `domain`: every part length-prefixed, so that no
/// two descriptors share a name; an entry in `shared` is its pattern instead of its
/// value.
fn bucket_name(domain: &str, entries: &[Entry], shared: &[(usize, &str)]) -> String {
    use std::fmt::Write as _;
    let len = 16
        + domain.len()
        + entries
            .iter()
            .map(|e| e.key.len() + e.value.len() + 16)
            .sum::<usize>();
    let mut s = String::with_capacity(len);
    let _ = write!(s, "rls:{}:{domain}", domain.len());
    for (i, e) in entries.iter().enumerate() {
        let value = shared
            .iter()
            .find(|(j, _)| *j == i)
            .map_or(e.value.as_str(), |(_, p)| p);
        let _ = write!(s, ":{}:{}:{}:{}", e.key.len(), e.key, value.len(), value);
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
    list.push((r, u32::from(hits)));
    Ok(())
}

fn text(s: impl Into<String>) -> Value {
    Value {
        kind: Some(Kind::StringValue(s.into())),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

/// The reference's `dynamic_metadata` of `call`, without `metadata`.
fn call_metadata(call: &Call<'_>) -> Struct {
    let descriptors = call
        .descriptors
        .iter()
        .map(|d| {
            let mut f = HashMap::new();
            let entries = d
                .entries
                .iter()
                .map(|e| text(format!("{}={}", e.key, e.value)))
                .collect();
            f.insert(
                "entries".to_owned(),
                Value {
                    kind: Some(Kind::ListValue(ListValue { values: entries })),
                },
            );
            if let Some((rpu, unit)) = d.sent_limit {
                let unit = envoy_types::pb::envoy::r#type::v3::RateLimitUnit::try_from(unit)
                    .map(|u| u.as_str_name().to_owned())
                    .unwrap_or_else(|_| unit.to_string());
                f.insert(
                    "limit".to_owned(),
                    text(format!("requests_per_unit:{rpu} unit:{unit}")),
                );
            }
            if let Some(h) = d.sent_hits {
                f.insert("hitsAddend".to_owned(), number(h as f64));
            }
            Value {
                kind: Some(Kind::StructValue(Struct { fields: f })),
            }
        })
        .collect();
    let mut fields = HashMap::new();
    fields.insert("domain".to_owned(), text(call.domain));
    fields.insert(
        "descriptors".to_owned(),
        Value {
            kind: Some(Kind::ListValue(ListValue {
                values: descriptors,
            })),
        },
    );
    if call.hits_addend != 0 {
        fields.insert("hitsAddend".to_owned(), number(f64::from(call.hits_addend)));
    }
    Struct { fields }
}

/// Merges `src` into `dest` as the reference does: structs on both sides merge, else
/// the first value stays.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match dest.fields.get_mut(k) {
            Some(Value {
                kind: Some(Kind::StructValue(d)),
            }) => {
                if let Some(Kind::StructValue(s)) = &v.kind {
                    merge(d, s);
                }
            }
            Some(_) => {}
            None => {
                dest.fields.insert(k.clone(), v.clone());
            }
        }
    }
}

impl<'r> Plan<'r> {
    /// The plan of `call` under `rules`.
    pub fn new(rules: &'r Rules, call: &Call<'_>) -> Result<Plan<'r>, Invalid> {
        let mut plan = Plan {
            slots: Vec::with_capacity(call.descriptors.len()),
            parts: Vec::new(),
            meta: None,
        };
        let Some(domain) = rules.domain(call.domain) else {
            plan.slots
                .extend(call.descriptors.iter().map(|_| Slot::NoRule));
            return Ok(plan);
        };
        if domain.has_metadata {
            plan.meta = Some(call_metadata(call));
        }
        // the rules matched (an override's descriptor has none), and what they replace
        let found: Vec<_> = call
            .descriptors
            .iter()
            .map(|d| domain.lookup(d.entries))
            .collect();
        let replaced = |name: &str| {
            !name.is_empty()
                && found
                    .iter()
                    .zip(&call.descriptors)
                    .filter(|(_, d)| d.limit.is_none())
                    .filter_map(|(f, _)| f.as_ref())
                    .any(|f| f.rule.replaces.iter().any(|r| &**r == name))
        };
        let (mut enforced, mut shadow) = (Vec::new(), Vec::new());
        let mut quotas: Vec<Vec<(Resource, u32)>> = Vec::new();
        for (i, (d, f)) in call.descriptors.iter().zip(&found).enumerate() {
            // A request's override sets the limit (enforced, as envoyproxy/ratelimit does),
            // matched rule or not.
            let (limit, kind, name, label, counters, metadata) = match (d.limit, f) {
                (Some(l), Some(f)) => (
                    l,
                    LimitKind::Enforced,
                    "",
                    &*f.rule.label,
                    f.rule.counters.clone(),
                    None,
                ),
                (Some(l), None) => (
                    l,
                    LimitKind::Enforced,
                    "",
                    "override",
                    domain.override_counters.clone(),
                    None,
                ),
                (None, None) => {
                    plan.slots.push(Slot::NoRule);
                    continue;
                }
                (None, Some(f)) => {
                    let r = f.rule;
                    let l = match r.quota {
                        _ if replaced(&r.name) => {
                            plan.slots.push(Slot::NoRule);
                            continue;
                        }
                        Quota::Unlimited => {
                            plan.slots.push(Slot::Unlimited);
                            continue;
                        }
                        Quota::Limited(l) => l,
                    };
                    let kind = match (r.shadow, r.quota_mode) {
                        (true, _) => LimitKind::Shadow,
                        (false, true) => LimitKind::Quota,
                        (false, false) => LimitKind::Enforced,
                    };
                    let counters = f
                        .metric
                        .as_deref()
                        .and_then(|m| domain.series.by_call(&domain.name, m))
                        .unwrap_or_else(|| r.counters.clone());
                    (l, kind, &*r.name, &*r.label, counters, r.metadata.as_ref())
                }
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
            let shared = match (d.limit, f) {
                (None, Some(f)) => f.shared.as_slice(),
                _ => &[],
            };
            // Cannot fail: the name is never empty and windows are checked whole
            // milliseconds; refused as an override would be, were it to.
            let resource = Resource::new(
                bucket_name(call.domain, d.entries, shared),
                limit.window,
                limit.requests_per_unit,
            )
            .map_err(|_| Invalid::BadOverrideUnit(i, limit.unit.proto()))?;
            let bucket = resource.id();
            match kind {
                LimitKind::Enforced => add(&mut enforced, resource, d.hits, i)?,
                LimitKind::Shadow => add(&mut shadow, resource, d.hits, i)?,
                LimitKind::Quota => match quotas.iter_mut().find(|q| q[0].0.id() == bucket) {
                    Some(q) => add(q, resource, d.hits, i)?,
                    None => quotas.push(vec![(resource, u32::from(d.hits))]),
                },
            }
            plan.slots.push(Slot::Limited(Limited {
                limit,
                kind,
                name,
                label,
                counters,
                bucket,
                part: 0,
                hits: d.hits,
                metadata,
            }));
        }
        for (kind, list) in [(LimitKind::Enforced, enforced), (LimitKind::Shadow, shadow)] {
            let mut list = list.into_iter().peekable();
            while list.peek().is_some() {
                plan.parts.push(Part {
                    kind,
                    resources: list.by_ref().take(MAX_PER_REQUEST).collect(),
                });
            }
        }
        plan.parts.extend(quotas.into_iter().map(|resources| Part {
            kind: LimitKind::Quota,
            resources,
        }));
        for slot in &mut plan.slots {
            if let Slot::Limited(l) = slot {
                l.part = plan
                    .parts
                    .iter()
                    .position(|p| {
                        p.kind == l.kind && p.resources.iter().any(|(r, _)| r.id() == l.bucket)
                    })
                    .unwrap_or(0);
            }
        }
        Ok(plan)
    }

    /// The answer, given the verdicts of [`Plan::parts`] in their order (a missing one:
    /// not sent, as for no resources), under the failure policy `on_failure`. Counts
    /// each limited descriptor in its rule's counters.
    pub fn answer(
        &self,
        verdicts: &[Verdict],
        on_failure: Option<OnFailure>,
    ) -> Result<RateLimitResponse, NoDecision> {
        let failed = self
            .parts
            .iter()
            .zip(verdicts)
            .filter(|(p, _)| p.kind != LimitKind::Shadow)
            .find_map(|(_, v)| match v {
                Verdict::Failed(_) | Verdict::Invalid => Some(v),
                _ => None,
            });
        if let Some(v) = failed
            && on_failure.is_none()
        {
            self.count_failed();
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
        let (mut over, mut quotas, mut quotas_over) = (false, 0, 0);
        let mut resets: Vec<Duration> = Vec::new();
        let mut passed = Struct::default();
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
                    let s = Assessed::of(l, verdicts.get(l.part), on_failure);
                    l.counters.record(s.outcome);
                    l.counters.record_hits(
                        s.outcome,
                        u64::from(l.hits),
                        s.remaining
                            .map(|r| l.limit.requests_per_unit.saturating_sub(r)),
                        l.limit.requests_per_unit,
                    );
                    if l.kind == LimitKind::Quota {
                        quotas += 1;
                        quotas_over += usize::from(s.over);
                    } else if s.over {
                        over = true;
                    }
                    if s.over
                        && let Some(r) = s.reset.filter(|_| s.deficit)
                    {
                        resets.push(r);
                    }
                    if !s.over
                        && let Some(m) = l.metadata
                    {
                        merge(&mut passed, m);
                    }
                    if l.kind != LimitKind::Shadow && !policies.iter().any(|(_, b)| *b == l.bucket)
                    {
                        policies.push((s.policy(l), l.bucket));
                    }
                    s.status(l)
                }
            };
            out.statuses.push(status);
        }
        if over || (quotas > 0 && quotas == quotas_over) {
            out.overall_code = Code::OverLimit as i32;
        }
        let retry = resets.into_iter().max();
        out.response_headers_to_add = headers(policies, retry, out.overall_code);
        if let Some(meta) = &self.meta {
            let mut meta = meta.clone();
            if !passed.fields.is_empty() {
                meta.fields.insert(
                    "metadata".to_owned(),
                    Value {
                        kind: Some(Kind::StructValue(passed)),
                    },
                );
            }
            out.dynamic_metadata = Some(meta);
        }
        Ok(out)
    }

    fn count_failed(&self) {
        for s in &self.slots {
            if let Slot::Limited(l) = s
                && l.kind != LimitKind::Shadow
            {
                l.counters.record(DescriptorOutcome::Failed);
                l.counters.record_hits(
                    DescriptorOutcome::Failed,
                    u64::from(l.hits),
                    None,
                    l.limit.requests_per_unit,
                );
            }
        }
    }
}

/// A limited descriptor's state after the verdict.
struct Assessed {
    outcome: DescriptorOutcome,
    /// Answered `OVER_LIMIT` (for a quota descriptor: its status).
    over: bool,
    /// Its own bucket was short of tokens.
    deficit: bool,
    remaining: Option<u32>,
    reset: Option<Duration>,
}

impl Assessed {
    fn of(l: &Limited<'_>, verdict: Option<&Verdict>, on_failure: Option<OnFailure>) -> Assessed {
        use DescriptorOutcome as O;
        let shadow = l.kind == LimitKind::Shadow;
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
                a.outcome = match (shadow, d.granted, a.deficit) {
                    (true, _, true) => O::ShadowOverLimit,
                    (_, true, _) => O::Granted,
                    (false, false, true) => O::OverLimit,
                    (_, false, false) => O::NotConsumed,
                };
                // a rejection without this bucket's result: over, to be safe
                a.over = !shadow && !d.granted && (a.deficit || res.is_none());
            }
            Some(Verdict::Granted) | None => {}
            Some(Verdict::Rejected { .. }) => {
                a.outcome = if shadow {
                    O::ShadowOverLimit
                } else {
                    O::OverLimit
                };
                a.over = !shadow;
            }
            Some(_) => {
                a.outcome = O::Failed;
                a.over = !shadow && on_failure == Some(OnFailure::Closed);
            }
        }
        if a.over && a.remaining.is_some() {
            a.remaining = Some(0);
        }
        a
    }

    fn status(&self, l: &Limited<'_>) -> DescriptorStatus {
        // 0 when the limit would admit the same hits now
        let reset = match (self.over, self.remaining) {
            (false, Some(r)) if r >= u32::from(l.hits) => Some(Duration::ZERO),
            _ => self.reset,
        };
        DescriptorStatus {
            code: (if self.over { Code::OverLimit } else { Code::Ok }) as i32,
            current_limit: Some(RateLimit {
                name: l.name.to_owned(),
                requests_per_unit: l.limit.requests_per_unit,
                unit: l.limit.unit.proto(),
            }),
            limit_remaining: self.remaining.unwrap_or(0),
            duration_until_reset: reset.map(|r| envoy_types::pb::google::protobuf::Duration {
                seconds: if r.is_zero() {
                    0
                } else {
                    whole_secs_up(r) as i64
                },
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

    /// The resources of the parts of `kind`, in order.
    fn of(plan: &Plan<'_>, kind: LimitKind) -> Vec<(Resource, u32)> {
        plan.parts
            .iter()
            .filter(|p| p.kind == kind)
            .flat_map(|p| p.resources.iter().cloned())
            .collect()
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
        assert_eq!(plan.parts.len(), 1);
        let enforced = of(&plan, LimitKind::Enforced);
        assert_eq!(enforced.len(), 2);
        // granted: remaining counts down; the reset is 0 while the hits fit, else the window
        let v = decided(&enforced, &[0, 4]);
        let a = plan.answer(&[v], None).unwrap();
        assert_eq!(a.overall_code, Code::Ok as i32);
        let s = &a.statuses;
        assert_eq!(s.len(), 4);
        assert_eq!((s[0].limit_remaining, s[1].limit_remaining), (2, 0));
        assert_eq!(s[0].duration_until_reset.unwrap().seconds, 0);
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
        let v = decided(&enforced, &[0, 5]);
        let a = plan.answer(&[v], None).unwrap();
        assert_eq!(a.overall_code, Code::OverLimit as i32);
        assert_eq!(a.statuses[0].code, Code::Ok as i32);
        assert_eq!(a.statuses[0].limit_remaining, 3, "nothing consumed");
        assert_eq!(a.statuses[0].duration_until_reset.unwrap().seconds, 0);
        assert_eq!(a.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(a.statuses[1].limit_remaining, 0, "0 on OVER_LIMIT");
        assert_eq!(a.statuses[1].duration_until_reset.unwrap().seconds, 10);
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
        let (enforced, shadow) = (of(&plan, LimitKind::Enforced), of(&plan, LimitKind::Shadow));
        assert_eq!((enforced.len(), shadow.len()), (1, 1));
        assert_eq!(plan.parts[0].kind, LimitKind::Enforced);
        let a = plan
            .answer(&[decided(&enforced, &[0]), decided(&shadow, &[1])], None)
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
        let enforced = of(&plan, LimitKind::Enforced);
        assert_eq!(enforced.len(), 2);
        assert_eq!(enforced[0].1, 4, "hits added");
        assert_eq!(enforced[1].0.rate_limit(), 7);
        assert_eq!(enforced[1].0.window_ms(), 3_600_000);
        let a = plan.answer(&[decided(&enforced, &[0, 0])], None).unwrap();
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
            plan.answer(std::slice::from_ref(&failed), None).is_err(),
            "UNAVAILABLE"
        );
        let both = [failed.clone(), failed.clone()];
        let open = plan.answer(&both, Some(OnFailure::Open)).unwrap();
        assert_eq!(open.overall_code, Code::Ok as i32);
        let closed = plan.answer(&both, Some(OnFailure::Closed)).unwrap();
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
        assert!(plan.parts.is_empty());
        let a = plan.answer(&[], None).unwrap();
        assert_eq!(a.overall_code, Code::Ok as i32);
        assert!(a.response_headers_to_add.is_empty());
    }

    #[test]
    fn a_call_over_one_request_is_split_and_each_part_atomic() {
        let m = RlsMetrics::default();
        let rules = rules(&m);
        let names: Vec<String> = (0..40).map(|i| format!("10.0.0.{i}")).collect();
        let descs: Vec<(&str, &str)> = names.iter().map(|n| ("ip", n.as_str())).collect();
        let plan = Plan::new(&rules, &Call::check(&request(&descs)).unwrap()).unwrap();
        let sizes: Vec<usize> = plan.parts.iter().map(|p| p.resources.len()).collect();
        assert_eq!(sizes, [MAX_PER_REQUEST, 40 - MAX_PER_REQUEST]);
        // the second part over: OVER_LIMIT, and the first part's grants stand
        let first = decided(&plan.parts[0].resources, &[0; 32]);
        let mut used = vec![0; 8];
        used[3] = 3;
        let second = decided(&plan.parts[1].resources, &used);
        let a = plan.answer(&[first, second], None).unwrap();
        assert_eq!(a.overall_code, Code::OverLimit as i32);
        assert_eq!(a.statuses[0].limit_remaining, 2, "consumed");
        assert_eq!(a.statuses[35].code, Code::OverLimit as i32);
        assert_eq!(a.statuses[36].limit_remaining, 3, "not consumed");
        let ip = m.rule(&"edge".into(), &"ip".into());
        assert_eq!(ip.get(DescriptorOutcome::Granted), 32);
        assert_eq!(ip.get(DescriptorOutcome::NotConsumed), 7);
    }

    #[test]
    fn bucket_names_do_not_collide() {
        let e = |k: &str, v: &str| Entry {
            key: k.into(),
            value: v.into(),
        };
        assert_ne!(
            bucket_name("d", &[e("a:1", "b")], &[]),
            bucket_name("d", &[e("a", "1:b")], &[])
        );
        assert_ne!(
            bucket_name("d:a", &[], &[]),
            bucket_name("d", &[e("a", "")], &[])
        );
        assert_eq!(
            bucket_name("d", &[e("f", "x1"), e("u", "1")], &[(0, "x*")]),
            bucket_name("d", &[e("f", "x2"), e("u", "1")], &[(0, "x*")]),
            "a shared wildcard is its pattern"
        );
    }
}
