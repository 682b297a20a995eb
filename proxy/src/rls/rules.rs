//! The loaded configuration: per domain, a tree of descriptor rules ([`Rules`]), and how
//! a request's descriptor finds its rule ([`Domain::find`]), as envoyproxy/ratelimit
//! finds it.
//!
//! Owns: the rule tree and the matching order. Must not touch: the YAML text (`config`),
//! requests on the wire, the engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::google::protobuf::Struct;

use super::metrics::{RuleCounters, Series};

/// The time unit of a limit, as the proto's `RateLimitResponse.RateLimit.Unit` names it
/// (`current_limit.unit` in a status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// 1 s.
    Second,
    /// 60 s.
    Minute,
    /// 3600 s.
    Hour,
    /// 86 400 s.
    Day,
    /// 7 days.
    Week,
    /// A window of the `window:` extension that is not one whole unit (the proto's
    /// `UNKNOWN`).
    Other,
}

impl Unit {
    /// The unit's window (`None` for [`Unit::Other`]).
    pub fn window(self) -> Option<Duration> {
        let secs = match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Other => return None,
        };
        Some(Duration::from_secs(secs))
    }

    /// The unit whose window is exactly `window`, else [`Unit::Other`].
    pub fn of_window(window: Duration) -> Unit {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
        ]
        .into_iter()
        .find(|u| u.window() == Some(window))
        .unwrap_or(Unit::Other)
    }

    /// The proto's enum value (`RateLimitResponse.RateLimit.Unit`).
    pub fn proto(self) -> i32 {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as P;
        let p = match self {
            Unit::Second => P::Second,
            Unit::Minute => P::Minute,
            Unit::Hour => P::Hour,
            Unit::Day => P::Day,
            Unit::Week => P::Week,
            Unit::Other => P::Unknown,
        };
        p as i32
    }
}

/// `requests_per_unit` tokens per `window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// Tokens per window (0: every request is over the limit).
    pub requests_per_unit: u32,
    /// The sliding window Ratelimitly keeps (whole milliseconds).
    pub window: Duration,
    /// The unit reported in `current_limit`.
    pub unit: Unit,
}

/// What a rule's `rate_limit` block says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quota {
    /// `unlimited: true`: always OK, nothing asked.
    Unlimited,
    /// A limit decided by Ratelimitly.
    Limited(Limit),
}

/// A descriptor rule with a `rate_limit` block.
#[derive(Debug)]
pub struct Rule {
    /// The limit, or unlimited.
    pub quota: Quota,
    /// `shadow_mode: true`: decided and counted, always answered OK.
    pub shadow: bool,
    /// `rate_limit.name`, or the key path (`key_value.key2`, as envoyproxy/ratelimit names
    /// its statistics): the metrics label and the RateLimit fields' policy name.
    pub label: Arc<str>,
    /// `rate_limit.name` as written ("" when absent): `current_limit.name`.
    pub name: Arc<str>,
    /// The key path (`key_value.key2`, wildcards as written).
    pub path: Arc<str>,
    /// This rule's counters (shared by the rules of one domain with the same label).
    pub counters: Arc<RuleCounters>,
    /// `quota_mode: true`: over its limit, its status is `OVER_LIMIT` but the call is
    /// only when every quota descriptor of it is over.
    pub quota_mode: bool,
    /// `rate_limit.replaces`: the `name`s of the rules this one replaces in a call it
    /// matches.
    pub replaces: Vec<Arc<str>>,
    /// `detailed_metric: true`: counted under the request's key path, values included.
    pub detailed_metric: bool,
    /// `metadata`: merged into the answer's `dynamic_metadata` when the descriptor
    /// passes.
    pub metadata: Option<Struct>,
}

/// One descriptor entry of the configuration, and what lies under it.
#[derive(Debug, Default)]
pub struct Node {
    /// Its `rate_limit` block, if any.
    pub rule: Option<Rule>,
    /// `share_threshold: true` (a wildcard value): every value it matches is one bucket.
    pub share_threshold: bool,
    /// `value_to_metric: true`: the request's value goes into the metrics label.
    pub value_to_metric: bool,
    /// The nested `descriptors`.
    pub children: Level,
}

/// A `value` with `*` in it: each `*` matches any run of characters (none included),
/// anywhere in the value (`foo*`, `bar*b`, `foo*bar*baz`), as envoyproxy/ratelimit's
/// wildcard matching.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wildcard {
    /// The pattern as written.
    pattern: String,
    /// The pattern split on `*` (at least two parts).
    parts: Vec<String>,
}

impl Wildcard {
    /// The pattern of `value`, if it has a `*`.
    pub fn new(value: &str) -> Option<Wildcard> {
        value.contains('*').then(|| Wildcard {
            pattern: value.to_owned(),
            parts: value.split('*').map(str::to_owned).collect(),
        })
    }

    /// The pattern as written.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether `value` matches: it starts with the first part, ends with the last, and
    /// holds the middle parts in order between them, without overlaps.
    pub fn matches(&self, value: &str) -> bool {
        let (first, last) = match (self.parts.first(), self.parts.last()) {
            (Some(f), Some(l)) if self.parts.len() >= 2 => (f.as_str(), l.as_str()),
            _ => return self.pattern == value,
        };
        if first.len() + last.len() > value.len()
            || !value.starts_with(first)
            || !value.ends_with(last)
        {
            return false;
        }
        // both ends are whole characters: they matched the value's own
        let mut rest = &value[first.len()..value.len() - last.len()];
        for part in &self.parts[1..self.parts.len() - 1] {
            match rest.find(part.as_str()) {
                Some(i) => rest = &rest[i + part.len()..],
                None => return false,
            }
        }
        true
    }
}

/// The rules of one key at one level.
#[derive(Debug, Default)]
pub struct KeyRules {
    /// `value: V` rules.
    pub by_value: HashMap<String, Node>,
    /// `value:` rules with a `*` ([`Wildcard`]), in file order.
    pub wildcards: Vec<(Wildcard, Node)>,
    /// The key-only rule (no `value`).
    pub any: Option<Node>,
}

/// The descriptors of one level, by key.
#[derive(Debug, Default)]
pub struct Level {
    /// Key → its rules.
    pub keys: HashMap<String, KeyRules>,
}

impl Level {
    /// The node an entry reaches at this level: its value's rule, else the first
    /// matching wildcard rule (file order), else the key-only rule.
    pub fn get(&self, entry: &Entry) -> Option<&Node> {
        self.reach(entry).map(|(n, _)| n)
    }

    /// [`Level::get`], and how the node was reached.
    fn reach(&self, entry: &Entry) -> Option<(&Node, Via<'_>)> {
        let k = self.keys.get(&entry.key)?;
        if let Some(n) = k.by_value.get(&entry.value) {
            return Some((n, Via::Value));
        }
        if let Some((w, n)) = k.wildcards.iter().find(|(w, _)| w.matches(&entry.value)) {
            return Some((n, Via::Wildcard(w.pattern())));
        }
        k.any.as_ref().map(|n| (n, Via::Key))
    }

    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// How an entry reached its node.
#[derive(Clone, Copy)]
enum Via<'a> {
    Value,
    Wildcard(&'a str),
    Key,
}

/// The rule a request descriptor reaches ([`Domain::find`]).
#[derive(Debug)]
pub struct Found<'a> {
    /// The rule.
    pub rule: &'a Rule,
    /// `(entry index, pattern)` of the entries matched by a `share_threshold` wildcard:
    /// in the bucket, the pattern stands for the value.
    pub shared: Vec<(usize, &'a str)>,
    /// The metrics label as envoyproxy/ratelimit forms the statistic's key under
    /// `detailed_metric` or `value_to_metric` (without the domain), when it differs
    /// from the rule's own.
    pub metric: Option<String>,
}

/// One domain's configuration.
#[derive(Debug)]
pub struct Domain {
    /// The `domain`.
    pub name: Arc<str>,
    /// The top-level descriptors.
    pub root: Level,
    /// The counters of limits that a request's override (`RateLimitOverride`) sets on a
    /// descriptor no rule matches.
    pub override_counters: Arc<RuleCounters>,
    /// The registry of counters, for the labels calls make (`detailed_metric`,
    /// `value_to_metric`).
    pub series: Series,
    /// Some rule has `metadata`: answers carry `dynamic_metadata`.
    pub has_metadata: bool,
    /// The line of `domain:` in its file.
    pub line: usize,
}

impl Domain {
    /// The rule of a request descriptor, as envoyproxy/ratelimit finds it: entry by
    /// entry, down the tree (a value rule before a wildcard rule before a key-only
    /// rule); the rule of the node the last entry reaches, if any. An entry that
    /// reaches nothing, or a node with no nested descriptors while entries remain, ends
    /// the walk without a rule.
    pub fn find(&self, entries: &[Entry]) -> Option<&Rule> {
        self.lookup(entries).map(|f| f.rule)
    }

    /// [`Domain::find`], with the entries a `share_threshold` wildcard matched and the
    /// metrics label of `detailed_metric` and `value_to_metric`.
    pub fn lookup(&self, entries: &[Entry]) -> Option<Found<'_>> {
        let mut level = &self.root;
        let mut found = None;
        let mut shared = Vec::new();
        // whether a node asks for value_to_metric (its key is made only then)
        let mut any_valued = false;
        for (i, e) in entries.iter().enumerate() {
            let Some((node, via)) = level.reach(e) else {
                break;
            };
            if let Via::Wildcard(p) = via
                && node.share_threshold
            {
                shared.push((i, p));
            }
            any_valued |= node.value_to_metric;
            if i + 1 == entries.len() {
                found = node.rule.as_ref();
            }
            if node.children.is_empty() {
                break;
            }
            level = &node.children;
        }
        let rule = found?;
        let metric = if rule.detailed_metric {
            let mut key = String::new();
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    key.push('.');
                }
                key.push_str(&e.key);
                match shared.iter().find(|(j, _)| *j == i) {
                    Some((_, p)) => {
                        key.push('_');
                        key.push_str(p);
                    }
                    None if shared.is_empty() || !e.value.is_empty() => {
                        key.push('_');
                        key.push_str(&e.value);
                    }
                    None => {}
                }
            }
            Some(key)
        } else {
            let valued = any_valued.then(|| self.valued_key(entries, &shared));
            valued.filter(|v| *v != *rule.path)
        };
        Some(Found {
            rule,
            shared,
            metric,
        })
    }
}

impl Domain {
    /// The statistic's key under `value_to_metric`, as the reference forms it: per entry
    /// its key, and the value the rule matched with (the request's where the node has
    /// `value_to_metric` or the rule names the value, the pattern of a wildcard or of a
    /// `share_threshold`, none for a key-only rule).
    fn valued_key(&self, entries: &[Entry], shared: &[(usize, &str)]) -> String {
        let mut key = String::new();
        let mut level = &self.root;
        for (i, e) in entries.iter().enumerate() {
            let Some((node, via)) = level.reach(e) else {
                break;
            };
            let value = match via {
                Via::Wildcard(p) => match shared.iter().find(|(j, _)| *j == i) {
                    Some((_, pattern)) => pattern,
                    None if node.value_to_metric => e.value.as_str(),
                    None => p,
                },
                Via::Value => &e.value,
                Via::Key if node.value_to_metric => &e.value,
                Via::Key => "",
            };
            if i > 0 {
                key.push('.');
            }
            key.push_str(&e.key);
            if !value.is_empty() {
                key.push('_');
                key.push_str(value);
            }
            if node.children.is_empty() {
                break;
            }
            level = &node.children;
        }
        key
    }
}

/// Every configured domain.
#[derive(Debug, Default)]
pub struct Rules {
    /// By name.
    pub domains: HashMap<String, Domain>,
    /// The API key's longest window, when known: a request's override may not exceed it.
    pub window_max: Option<Duration>,
}

impl Unit {
    /// The proto's name of the unit (`MINUTE`; `UNKNOWN` for [`Unit::Other`]).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Other => "UNKNOWN",
        }
    }
}

impl Rules {
    /// The configuration of `domain`, if configured.
    pub fn domain(&self, domain: &str) -> Option<&Domain> {
        self.domains.get(domain)
    }

    /// The rules in force as text, one line a rule with a `rate_limit` block, sorted, as
    /// envoyproxy/ratelimit's debug listener prints them at `/rlconfig`:
    /// `DOMAIN.KEY_PATH: unit=MINUTE requests_per_unit=10, shadow_mode: false`
    /// (`unlimited: true`: `unlimited`; the `window:` extension adds `window=10s`).
    pub fn dump(&self) -> String {
        fn walk(domain: &str, l: &Level, out: &mut Vec<String>) {
            for k in l.keys.values() {
                let nodes = k
                    .by_value
                    .values()
                    .chain(k.wildcards.iter().map(|(_, n)| n))
                    .chain(k.any.iter());
                for n in nodes {
                    if let Some(r) = &n.rule {
                        let limit = match r.quota {
                            Quota::Unlimited => "unlimited".to_owned(),
                            Quota::Limited(l) if l.unit == Unit::Other => format!(
                                "unit={} requests_per_unit={} window={}ms",
                                l.unit.name(),
                                l.requests_per_unit,
                                l.window.as_millis()
                            ),
                            Quota::Limited(l) => format!(
                                "unit={} requests_per_unit={}",
                                l.unit.name(),
                                l.requests_per_unit
                            ),
                        };
                        out.push(format!(
                            "{domain}.{}: {limit}, shadow_mode: {}",
                            r.path, r.shadow
                        ));
                    }
                    walk(domain, &n.children, out);
                }
            }
        }
        let mut lines = Vec::new();
        for (name, d) in &self.domains {
            walk(name, &d.root, &mut lines);
        }
        lines.sort();
        let mut out = lines.join("\n");
        if !out.is_empty() {
            out.push('\n');
        }
        out
    }

    /// Rules with a `rate_limit` block, all domains together.
    pub fn rule_count(&self) -> usize {
        fn count(l: &Level) -> usize {
            l.keys
                .values()
                .flat_map(|k| {
                    k.by_value
                        .values()
                        .chain(k.wildcards.iter().map(|(_, n)| n))
                        .chain(k.any.iter())
                })
                .map(|n| usize::from(n.rule.is_some()) + count(&n.children))
                .sum()
        }
        self.domains.values().map(|d| count(&d.root)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    fn m(p: &str, v: &str) -> bool {
        Wildcard::new(p).expect("a pattern").matches(v)
    }

    #[test]
    fn wildcards_anywhere() {
        assert!(m("foo*", "foo") && m("foo*", "foobar") && !m("foo*", "fo"));
        assert!(m("bar*b", "barb") && m("bar*b", "bar-xyz-b") && !m("bar*b", "bar-x"));
        assert!(!m("bar*b", "bab"), "the ends may not overlap");
        assert!(m("foo*bar*baz", "foobarbaz") && m("foo*bar*baz", "foo1bar2baz"));
        assert!(!m("foo*bar*baz", "foobazbar") && !m("foo*bar*baz", "foo-baz"));
        assert!(m("*", "") && m("*", "anything") && m("**", "x"));
        assert!(m("*.pdf", "a.pdf") && !m("*.pdf", "a.pdfx"));
        assert!(m("a*a*a", "aaa") && !m("a*a*a", "aa"));
        assert!(m("é*ü", "éxü") && !m("é*ü", "é"));
        assert!(Wildcard::new("plain").is_none());
    }

    /// Glob matching by backtracking over characters: the specification.
    fn glob(p: &[char], v: &[char]) -> bool {
        match p.split_first() {
            None => v.is_empty(),
            Some(('*', rest)) => (0..=v.len()).any(|i| glob(rest, &v[i..])),
            Some((c, rest)) => v.first() == Some(c) && glob(rest, &v[1..]),
        }
    }

    proptest::proptest! {
        /// Any pattern and value: the matcher agrees with backtracking, and never panics.
        #[test]
        fn matches_like_a_glob(p in "[ab*é]{0,8}", v in "[abé]{0,10}") {
            if let Some(w) = Wildcard::new(&p) {
                let pc: Vec<char> = p.chars().collect();
                let vc: Vec<char> = v.chars().collect();
                proptest::prop_assert_eq!(w.matches(&v), glob(&pc, &vc));
            }
        }

        /// Arbitrary text never panics.
        #[test]
        fn arbitrary_text_never_panics(p in "\\PC{0,12}", v in "\\PC{0,12}") {
            if let Some(w) = Wildcard::new(&p) {
                let _ = w.matches(&v);
            }
        }
    }
}
