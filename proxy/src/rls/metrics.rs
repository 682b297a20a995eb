//! The rate limit service's own series: per configured rule, what its descriptors got
//! ([`RuleCounters`]), and per call, what the call was answered ([`RlsMetrics`]).
//!
//! ```text
//! rl_proxy_rls_descriptors_total{domain="D",rule="R",outcome="granted|over_limit|not_consumed|shadow_over_limit|failed"}
//! rl_proxy_rls_calls_total{answer="ok|over_limit|invalid_argument|unavailable"}
//! rl_proxy_rls_config_reloads_total{result="ok|refused"}
//! rl_proxy_rls_global_shadow_mode_total
//! ```
//!
//! `rule` is the rule's `rate_limit.name`, else its key path (`key_value.key2`), or
//! `(override)` for a request's `RateLimitOverride` on a descriptor no rule matches. The
//! series are made when a configuration is loaded, one set per rule: their number is
//! bounded by the configurations loaded (a reload keeps the counters of the labels it
//! still has, and the old ones stay). A rule with `detailed_metric` or `value_to_metric`
//! is counted under the key envoyproxy/ratelimit forms for its statistics (without the
//! domain, e.g. `path_/a/b.method_GET`): those labels hold the values clients send, so
//! calls make at most [`MAX_CALL_LABELS`] of them; past that, under the rule's label.
//!
//! Owns: the counters and their text. Must not touch: decisions, the engine.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

/// What one descriptor of a call got, in counter order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DescriptorOutcome {
    /// Its tokens were consumed (a shadow rule's too, while under its limit).
    Granted,
    /// Over its limit: the call was answered `OVER_LIMIT` and nothing was consumed.
    OverLimit,
    /// Under its limit, but another descriptor of the call was over: nothing consumed.
    NotConsumed,
    /// A `shadow_mode` rule over its limit (answered OK).
    ShadowOverLimit,
    /// No decision (the failure policy answered).
    Failed,
}

/// The `outcome` label values, in [`DescriptorOutcome`] order.
pub const DESCRIPTOR_OUTCOMES: [&str; 5] = [
    "granted",
    "over_limit",
    "not_consumed",
    "shadow_over_limit",
    "failed",
];

/// The `kind` label values of `rl_proxy_rls_descriptor_hits_total`: envoyproxy/ratelimit's
/// per-key statistics (`ratelimit.service.rate_limit.DOMAIN.KEY.total_hits`, ...).
pub const HIT_KINDS: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

/// `NEAR_LIMIT_RATIO` (the reference's default 0.8) as `f32` bits: one per process, set
/// at the start ([`set_near_limit_ratio`]).
static NEAR_LIMIT_RATIO: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(0x3f4c_cccd);

/// Sets the share of a limit above which hits count as `near_limit` (`NEAR_LIMIT_RATIO`).
pub fn set_near_limit_ratio(r: f32) {
    NEAR_LIMIT_RATIO.store(r.to_bits(), Relaxed);
}

/// The share of a limit above which hits count as `near_limit`.
pub fn near_limit_ratio() -> f32 {
    f32::from_bits(NEAR_LIMIT_RATIO.load(Relaxed))
}

/// One rule's counters.
#[derive(Debug, Default)]
pub struct RuleCounters {
    outcomes: [AtomicU64; 5],
    /// Hits by [`HIT_KINDS`].
    hits: [AtomicU64; 5],
}

impl RuleCounters {
    /// Counts one descriptor.
    pub fn record(&self, o: DescriptorOutcome) {
        self.outcomes[o as usize].fetch_add(1, Relaxed);
    }

    /// Counts `hits` of a descriptor with outcome `o` as envoyproxy/ratelimit counts them:
    /// all in `total_hits`; over its limit (the engine consumes all of a request or
    /// nothing, so all of them): `over_limit`, and `shadow_mode` for a shadow rule;
    /// otherwise `within_limit`, and those of them above the near-limit share of `limit`
    /// (`used`: the tokens used after the call) also `near_limit`. No decision: only
    /// `total_hits`.
    pub fn record_hits(&self, o: DescriptorOutcome, hits: u64, used: Option<u32>, limit: u32) {
        use DescriptorOutcome as O;
        let add = |k: usize, n: u64| {
            self.hits[k].fetch_add(n, Relaxed);
        };
        add(0, hits);
        match o {
            O::OverLimit => add(1, hits),
            O::ShadowOverLimit => {
                add(1, hits);
                add(4, hits);
            }
            O::Granted | O::NotConsumed => {
                add(3, hits);
                if let Some(used) = used {
                    let threshold =
                        (f64::from(near_limit_ratio()) * f64::from(limit)).floor() as u64;
                    let used = u64::from(used);
                    if used > threshold {
                        add(2, hits.min(used - threshold));
                    }
                }
            }
            O::Failed => {}
        }
    }

    /// The hits counted as `HIT_KINDS[kind]`.
    pub fn hits(&self, kind: usize) -> u64 {
        self.hits[kind].load(Relaxed)
    }

    /// The count of `o`.
    pub fn get(&self, o: DescriptorOutcome) -> u64 {
        self.outcomes[o as usize].load(Relaxed)
    }
}

/// How a call was answered, in counter order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallAnswer {
    /// `overall_code: OK`.
    Ok,
    /// `overall_code: OVER_LIMIT`.
    OverLimit,
    /// gRPC `INVALID_ARGUMENT`.
    InvalidArgument,
    /// gRPC `UNAVAILABLE` (no decision, no `--on-failure`).
    Unavailable,
}

/// The `answer` label values, in [`CallAnswer`] order.
pub const CALL_ANSWERS: [&str; 4] = ["ok", "over_limit", "invalid_argument", "unavailable"];

/// (domain, rule label) → the rule's counters.
type RuleRegistry = BTreeMap<(Arc<str>, Arc<str>), Arc<RuleCounters>>;

/// Labels made by calls (`detailed_metric`, `value_to_metric`) at most, all domains
/// together: past it, such a descriptor is counted under its rule's own label.
pub const MAX_CALL_LABELS: usize = 10_000;

/// The service's counters: per call, and a registry of per-rule counters.
#[derive(Debug, Default)]
pub struct RlsMetrics {
    calls: [AtomicU64; 4],
    /// Reloads (SIGHUP or a change of the files): applied, refused.
    reloads: [AtomicU64; 2],
    /// Calls over a limit answered OK by `SHADOW_MODE=true`.
    global_shadow: AtomicU64,
    rules: Series,
}

/// The registry of per-rule counters, shared by the rules that label by the request's
/// values ([`Series::by_call`]).
#[derive(Clone, Debug, Default)]
pub struct Series {
    rules: Arc<Mutex<RuleRegistry>>,
    /// Labels made by calls so far.
    made: Arc<std::sync::atomic::AtomicUsize>,
}

impl Series {
    /// The counters of `rule` in `domain`, made by a call: `None` once
    /// [`MAX_CALL_LABELS`] such labels exist and this one is not among the registered.
    pub fn by_call(&self, domain: &Arc<str>, rule: &str) -> Option<Arc<RuleCounters>> {
        let mut m = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let key = (domain.clone(), Arc::<str>::from(rule));
        if let Some(c) = m.get(&key) {
            return Some(c.clone());
        }
        if self.made.load(Relaxed) >= MAX_CALL_LABELS {
            return None;
        }
        self.made.fetch_add(1, Relaxed);
        Some(m.entry(key).or_default().clone())
    }
}

/// One series per rule and `names[i]` (label `key`) of `metric`, valued `counts(rule)[i]`.
fn per_rule<const N: usize>(
    out: &mut String,
    rules: &RuleRegistry,
    metric: &str,
    key: &str,
    names: &[&str; N],
    counts: impl Fn(&RuleCounters) -> &[AtomicU64; N],
) {
    for ((domain, rule), c) in rules.iter() {
        for (name, n) in names.iter().zip(counts(c)) {
            let _ = write!(out, "{metric}{{domain=\"");
            label(out, domain);
            out.push_str("\",rule=\"");
            label(out, rule);
            let _ = writeln!(out, "\",{key}=\"{name}\"}} {}", n.load(Relaxed));
        }
    }
}

/// `s` as a Prometheus label value (`\`, `"` and newlines escaped).
fn label(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

impl RlsMetrics {
    /// Fresh counters.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Counts one call.
    pub fn record_call(&self, a: CallAnswer) {
        self.calls[a as usize].fetch_add(1, Relaxed);
    }

    /// Calls answered `a`.
    pub fn calls(&self, a: CallAnswer) -> u64 {
        self.calls[a as usize].load(Relaxed)
    }

    /// Counts one reload: applied (`ok`) or refused.
    pub fn record_reload(&self, ok: bool) {
        self.reloads[usize::from(!ok)].fetch_add(1, Relaxed);
    }

    /// Counts a call answered OK by `SHADOW_MODE=true` while over a limit.
    pub fn record_global_shadow(&self) {
        self.global_shadow.fetch_add(1, Relaxed);
    }

    /// Reloads applied (`ok`) or refused.
    pub fn reloads(&self, ok: bool) -> u64 {
        self.reloads[usize::from(!ok)].load(Relaxed)
    }

    /// The counters of rule `rule` of `domain` (made on first use; configuration
    /// loading only).
    pub fn rule(&self, domain: &Arc<str>, rule: &Arc<str>) -> Arc<RuleCounters> {
        let mut m = self.rules.rules.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((domain.clone(), rule.clone())).or_default().clone()
    }

    /// The registry, for labels made by calls.
    pub fn series(&self) -> Series {
        self.rules.clone()
    }

    /// Appends the series in the Prometheus text format (before a trailing `# EOF`,
    /// which it keeps last).
    pub fn encode(&self, out: &mut String) {
        let eof = out.ends_with("# EOF\n");
        if eof {
            out.truncate(out.len() - "# EOF\n".len());
        }
        out.push_str(
            "# HELP rl_proxy_rls_calls_total ShouldRateLimit calls, by answer.\n\
             # TYPE rl_proxy_rls_calls_total counter\n",
        );
        for (i, a) in CALL_ANSWERS.iter().enumerate() {
            let _ = writeln!(
                out,
                "rl_proxy_rls_calls_total{{answer=\"{a}\"}} {}",
                self.calls[i].load(Relaxed)
            );
        }
        out.push_str(
            "# HELP rl_proxy_rls_config_reloads_total Configuration reloads (SIGHUP or a change of the files), by result.\n\
             # TYPE rl_proxy_rls_config_reloads_total counter\n",
        );
        for (i, r) in ["ok", "refused"].iter().enumerate() {
            let _ = writeln!(
                out,
                "rl_proxy_rls_config_reloads_total{{result=\"{r}\"}} {}",
                self.reloads[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP rl_proxy_rls_global_shadow_mode_total Calls over a limit answered OK by SHADOW_MODE=true.\n\
             # TYPE rl_proxy_rls_global_shadow_mode_total counter\n\
             rl_proxy_rls_global_shadow_mode_total {}",
            self.global_shadow.load(Relaxed)
        );
        out.push_str(
            "# HELP rl_proxy_rls_descriptors_total Descriptors with a limit, by configured rule and outcome.\n\
             # TYPE rl_proxy_rls_descriptors_total counter\n",
        );
        let rules = self.rules.rules.lock().unwrap_or_else(|e| e.into_inner());
        per_rule(
            out,
            &rules,
            "rl_proxy_rls_descriptors_total",
            "outcome",
            &DESCRIPTOR_OUTCOMES,
            |c| &c.outcomes,
        );
        out.push_str(
            "# HELP rl_proxy_rls_descriptor_hits_total Hits of descriptors with a limit, by configured rule, as envoyproxy/ratelimit's per-key statistics.\n\
             # TYPE rl_proxy_rls_descriptor_hits_total counter\n",
        );
        per_rule(
            out,
            &rules,
            "rl_proxy_rls_descriptor_hits_total",
            "kind",
            &HIT_KINDS,
            |c| &c.hits,
        );
        if eof {
            out.push_str("# EOF\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_per_rule_escaped_and_before_eof() {
        let m = RlsMetrics::new();
        let c = m.rule(&"edge".into(), &"a\"b".into());
        c.record(DescriptorOutcome::OverLimit);
        assert!(Arc::ptr_eq(&c, &m.rule(&"edge".into(), &"a\"b".into())));
        m.record_call(CallAnswer::OverLimit);
        let mut page = String::from("x 1\n# EOF\n");
        m.encode(&mut page);
        assert!(page.starts_with("x 1\n"));
        assert!(page.ends_with("# EOF\n"));
        assert!(page.contains(
            "rl_proxy_rls_descriptors_total{domain=\"edge\",rule=\"a\\\"b\",outcome=\"over_limit\"} 1\n"
        ));
        assert!(page.contains("rl_proxy_rls_calls_total{answer=\"over_limit\"} 1\n"));
        assert_eq!(page.matches("rl_proxy_rls_descriptors_total{").count(), 5);
        assert_eq!(
            page.matches("rl_proxy_rls_descriptor_hits_total{").count(),
            5
        );
    }

    #[test]
    fn hits_as_the_reference_counts_them() {
        let c = RuleCounters::default();
        // limit 10, near from 8 used: 7 -> 9 used by 2 hits: 1 near
        c.record_hits(DescriptorOutcome::Granted, 2, Some(9), 10);
        c.record_hits(DescriptorOutcome::OverLimit, 3, Some(10), 10);
        c.record_hits(DescriptorOutcome::ShadowOverLimit, 1, Some(10), 10);
        c.record_hits(DescriptorOutcome::Failed, 4, None, 10);
        assert_eq!(
            (0..5).map(|k| c.hits(k)).collect::<Vec<_>>(),
            [10, 4, 1, 2, 1]
        );
    }
}
