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

use super::metrics::RuleCounters;

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
    /// This rule's counters (shared by the rules of one domain with the same label).
    pub counters: Arc<RuleCounters>,
}

/// One descriptor entry of the configuration, and what lies under it.
#[derive(Debug, Default)]
pub struct Node {
    /// Its `rate_limit` block, if any.
    pub rule: Option<Rule>,
    /// The nested `descriptors`.
    pub children: Level,
}

/// The rules of one key at one level.
#[derive(Debug, Default)]
pub struct KeyRules {
    /// `value: V` rules.
    pub by_value: HashMap<String, Node>,
    /// `value: PREFIX*` rules, in file order.
    pub prefixes: Vec<(String, Node)>,
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
    /// matching `PREFIX*` rule, else the key-only rule.
    pub fn get(&self, entry: &Entry) -> Option<&Node> {
        let k = self.keys.get(&entry.key)?;
        k.by_value
            .get(&entry.value)
            .or_else(|| {
                k.prefixes
                    .iter()
                    .find(|(p, _)| entry.value.starts_with(p.as_str()))
                    .map(|(_, n)| n)
            })
            .or(k.any.as_ref())
    }

    /// No rule at all.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
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
}

impl Domain {
    /// The rule of a request descriptor, as envoyproxy/ratelimit finds it: entry by
    /// entry, down the tree (a value rule before a `PREFIX*` rule before a key-only
    /// rule); the rule of the node the last entry reaches, if any. An entry that
    /// reaches nothing, or a node with no nested descriptors while entries remain, ends
    /// the walk without a rule.
    pub fn find(&self, entries: &[Entry]) -> Option<&Rule> {
        let mut level = &self.root;
        let mut found = None;
        for (i, e) in entries.iter().enumerate() {
            let Some(node) = level.get(e) else { break };
            if i + 1 == entries.len() {
                found = node.rule.as_ref();
            }
            if node.children.is_empty() {
                break;
            }
            level = &node.children;
        }
        found
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

impl Rules {
    /// The configuration of `domain`, if configured.
    pub fn domain(&self, domain: &str) -> Option<&Domain> {
        self.domains.get(domain)
    }

    /// Rules with a `rate_limit` block, all domains together.
    pub fn rule_count(&self) -> usize {
        fn count(l: &Level) -> usize {
            l.keys
                .values()
                .flat_map(|k| {
                    k.by_value
                        .values()
                        .chain(k.prefixes.iter().map(|(_, n)| n))
                        .chain(k.any.iter())
                })
                .map(|n| usize::from(n.rule.is_some()) + count(&n.children))
                .sum()
        }
        self.domains.values().map(|d| count(&d.root)).sum()
    }
}
