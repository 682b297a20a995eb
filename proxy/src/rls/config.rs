//! envoyproxy/ratelimit's YAML configuration files, one domain per file, read into
//! [`Rules`].
//!
//! ```yaml
//! domain: edge                      # required, unique across the files
//! descriptors:
//!   - key: remote_address           # required
//!     rate_limit:
//!       unit: minute                # second | minute | hour | day | week
//!       requests_per_unit: 3
//!   - key: path
//!     value: /login                 # optional: a value rule wins over the key-only rule
//!     rate_limit:
//!       window: 10s                 # the extension: any window (ms, s, m, h, d) instead of unit
//!       requests_per_unit: 5
//!       name: login                 # optional: the metrics label and the policy name
//!     shadow_mode: true             # optional: decided and counted, always answered OK
//!   - key: tenant
//!     value: free*                  # each * matches any run of characters (bar*b, a*b*c too)
//!     descriptors:                  # nested: the request's next entry is matched here
//!       - key: user
//!         rate_limit: { unlimited: true }
//! ```
//!
//! Also the reference's other keys: `rate_limit.replaces: [{name: N}]`, and on a
//! descriptor `quota_mode`, `share_threshold` (a wildcard value only), `value_to_metric`,
//! `detailed_metric` and `metadata` (any YAML mapping, as a protobuf `Struct`); a
//! `rate_limit` without `requests_per_unit` is 0. Refused, with the line (and, through
//! [`load`], the file): unknown keys, a `unit` that is no fixed length (`month`, `year`:
//! Ratelimitly windows are whole milliseconds up to the key's `rate_window_size_ms_max`),
//! `unit` and `window` together, `unlimited` with a unit, a window longer than the API
//! key allows, `share_threshold` without a `*`, a `replaces` entry without a name or
//! naming its own rule, duplicate descriptors and duplicate domains.
//!
//! Owns: the file format. Must not touch: requests, the engine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value};
use saphyr::{LoadableYamlNode, MarkedYaml, Scalar, YamlData};

use super::metrics::RlsMetrics;
use super::rules::{Domain, KeyRules, Level, Limit, Node, Quota, Rule, Rules, Unit, Wildcard};

/// Nesting depth of `descriptors` at most (a bound on the recursion, not on real files).
const MAX_DEPTH: usize = 32;

/// What the files are checked against.
#[derive(Clone, Copy, Debug, Default)]
pub struct Bounds {
    /// The API key's longest window (`rate_window_size_ms_max`); `None` when no key is
    /// known (`--check`).
    pub window_max: Option<Duration>,
}

/// The files `paths` name: a file is itself; a directory is every `*.yaml` in it, by
/// name, symbolic links followed, names starting with `.` skipped: a Kubernetes
/// ConfigMap volume (`DIR/x.yaml -> ..data/x.yaml`, `..data -> ..2026_12_07_...`), read
/// again whole on a reload. A directory without one is refused.
pub fn files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        if !path.is_dir() {
            out.push(path.clone());
            continue;
        }
        let entries =
            std::fs::read_dir(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let mut found = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            // metadata follows links: the file a ConfigMap's link resolves to
            if name.starts_with('.') || !name.ends_with(".yaml") || !entry.path().is_file() {
                continue;
            }
            found.push(entry.path());
        }
        if found.is_empty() {
            return Err(format!(
                "{}: no *.yaml file in the directory",
                path.display()
            ));
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Reads and checks `paths` (one domain each; a directory: its `*.yaml` files,
/// [`files`]). Errors start with the file's path and name the line.
pub fn load(paths: &[PathBuf], bounds: Bounds, metrics: &RlsMetrics) -> Result<Rules, String> {
    let mut rules = Rules {
        window_max: bounds.window_max,
        ..Rules::default()
    };
    let paths = files(paths)?;
    let mut seen: Vec<(String, &PathBuf)> = Vec::new();
    for path in &paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let domain = parse(&text, bounds, metrics).map_err(|e| {
            let hint = if crate::config::looks_like_toml(&text) {
                " (this looks like TOML (rl-proxy's route file, for --mode proxy or \
                 forward-auth); --mode rls reads envoyproxy/ratelimit's YAML)"
            } else {
                ""
            };
            format!("{}: {e}{hint}", path.display())
        })?;
        if let Some((_, other)) = seen.iter().find(|(d, _)| **d == *domain.name) {
            return Err(format!(
                "{}: line {}: domain {:?} is also configured by {}",
                path.display(),
                domain.line,
                &*domain.name,
                other.display()
            ));
        }
        seen.push((domain.name.to_string(), path));
        rules.domains.insert(domain.name.to_string(), domain);
    }
    Ok(rules)
}

type Yaml<'a> = MarkedYaml<'a>;

fn at(n: &Yaml<'_>, msg: impl std::fmt::Display) -> String {
    format!("line {}: {msg}", n.span.start.line())
}

/// A scalar's text (`None` for null and non-scalars).
fn text(n: &Yaml<'_>) -> Option<String> {
    match &n.data {
        YamlData::Value(Scalar::String(s)) => Some(s.to_string()),
        YamlData::Value(Scalar::Integer(i)) => Some(i.to_string()),
        YamlData::Value(Scalar::Boolean(b)) => Some(b.to_string()),
        YamlData::Value(Scalar::FloatingPoint(f)) => Some(f.to_string()),
        YamlData::Representation(s, _, _) => Some(s.to_string()),
        YamlData::Tagged(_, inner) => text(inner),
        _ => None,
    }
}

fn string(n: &Yaml<'_>, field: &str) -> Result<String, String> {
    text(n).ok_or_else(|| at(n, format!("{field} must be a string")))
}

fn boolean(n: &Yaml<'_>, field: &str) -> Result<bool, String> {
    match &n.data {
        YamlData::Value(Scalar::Boolean(b)) => Ok(*b),
        _ => Err(at(n, format!("{field} must be true or false"))),
    }
}

/// The entries of mapping `n` (`what` names it in errors), each key one of `allowed`.
fn mapping<'n, 'a>(
    n: &'n Yaml<'a>,
    what: &str,
    allowed: &[&str],
) -> Result<Vec<(String, &'n Yaml<'a>)>, String> {
    let YamlData::Mapping(m) = &n.data else {
        return Err(at(n, format!("{what} must be a mapping")));
    };
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m.iter() {
        let key = match &k.data {
            YamlData::Value(Scalar::String(_)) | YamlData::Representation(..) => text(k),
            _ => None,
        }
        .ok_or_else(|| {
            let shown = text(k).map(|t| format!(", not {t}")).unwrap_or_default();
            at(k, format!("{what}: keys must be strings{shown}"))
        })?;
        if !allowed.contains(&key.as_str()) {
            return Err(at(
                k,
                format!(
                    "unknown key {key:?} in {what}; expected one of {}",
                    allowed.join(", ")
                ),
            ));
        }
        out.push((key, v));
    }
    Ok(out)
}

/// The items of sequence `n` (null: none).
fn sequence<'n, 'a>(n: &'n Yaml<'a>, what: &str) -> Result<&'n [Yaml<'a>], String> {
    match &n.data {
        YamlData::Sequence(s) => Ok(s),
        YamlData::Value(Scalar::Null) => Ok(&[]),
        _ => Err(at(n, format!("{what} must be a list"))),
    }
}

/// `WINDOW` of the `window:` extension: a whole number and `ms`, `s`, `m`, `h` or `d`.
pub fn parse_window(s: &str) -> Result<Duration, String> {
    let bad = || format!("window must look like 500ms, 10s, 5m, 2h or 1d, not {s:?}");
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
    let (num, unit) = s.split_at(split);
    let num: u64 = num.parse().map_err(|_| bad())?;
    let ms_per: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    let ms = num.checked_mul(ms_per).ok_or_else(bad)?;
    if ms == 0 || ms > u64::from(u32::MAX) {
        return Err(format!("window must be 1 ms to {} ms, not {s:?}", u32::MAX));
    }
    Ok(Duration::from_millis(ms))
}

/// A `unit` name (any case) as a fixed length; month and year refused.
fn unit_of(name: &str) -> Result<Unit, String> {
    match name.to_ascii_lowercase().as_str() {
        "second" => Ok(Unit::Second),
        "minute" => Ok(Unit::Minute),
        "hour" => Ok(Unit::Hour),
        "day" => Ok(Unit::Day),
        "week" => Ok(Unit::Week),
        u @ ("month" | "year") => Err(format!(
            "unit {u} cannot be carried: Ratelimitly windows are fixed lengths in whole \
             milliseconds, not calendar periods (use window:, e.g. window: 30d)"
        )),
        other => Err(format!(
            "unknown unit {other:?} (second, minute, hour, day or week; or window:)"
        )),
    }
}

/// One file's reader.
struct Reader<'m> {
    bounds: Bounds,
    metrics: &'m RlsMetrics,
    domain: Arc<str>,
    /// A rule with `metadata` was read.
    has_metadata: std::cell::Cell<bool>,
}

/// What a descriptor says about its `rate_limit` block.
struct Flags {
    shadow: bool,
    quota_mode: bool,
    detailed_metric: bool,
    metadata: Option<Struct>,
}

/// A YAML value as a protobuf `Value` (`metadata`): mappings are structs (keys as
/// text), sequences lists, numbers doubles; nested at most [`MAX_DEPTH`] deep.
fn proto_value(n: &Yaml<'_>, depth: usize) -> Result<Value, String> {
    if depth > MAX_DEPTH {
        return Err(at(n, format!("metadata nested deeper than {MAX_DEPTH}")));
    }
    let kind = match &n.data {
        YamlData::Mapping(_) => Kind::StructValue(proto_struct(n, depth + 1)?),
        YamlData::Sequence(items) => Kind::ListValue(ListValue {
            values: items
                .iter()
                .map(|v| proto_value(v, depth + 1))
                .collect::<Result<_, _>>()?,
        }),
        YamlData::Value(Scalar::Null) => Kind::NullValue(0),
        YamlData::Value(Scalar::Boolean(b)) => Kind::BoolValue(*b),
        YamlData::Value(Scalar::Integer(i)) => Kind::NumberValue(*i as f64),
        YamlData::Value(Scalar::FloatingPoint(f)) => Kind::NumberValue(**f),
        YamlData::Tagged(_, inner) => return proto_value(inner, depth + 1),
        _ => match text(n) {
            Some(t) => Kind::StringValue(t),
            None => return Err(at(n, "metadata: a value that is no YAML data")),
        },
    };
    Ok(Value { kind: Some(kind) })
}

fn proto_struct(n: &Yaml<'_>, depth: usize) -> Result<Struct, String> {
    let YamlData::Mapping(m) = &n.data else {
        return Err(at(n, "metadata must be a mapping"));
    };
    let mut fields = std::collections::HashMap::with_capacity(m.len());
    for (k, v) in m.iter() {
        let key = text(k).ok_or_else(|| at(k, "metadata: keys must be scalars"))?;
        fields.insert(key, proto_value(v, depth)?);
    }
    Ok(Struct { fields })
}

impl Reader<'_> {
    /// A `rate_limit` block, with the rule's label and the descriptor's flags.
    fn rate_limit(&self, n: &Yaml<'_>, path: &str, flags: Flags) -> Result<Rule, String> {
        const KEYS: [&str; 6] = [
            "unit",
            "requests_per_unit",
            "unlimited",
            "name",
            "window",
            "replaces",
        ];
        let (mut unit, mut rpu, mut unlimited, mut name, mut window) =
            (None, None, false, String::new(), None);
        let mut replaces: Vec<(String, &Yaml<'_>)> = Vec::new();
        for (k, v) in mapping(n, "rate_limit", &KEYS)? {
            match k.as_str() {
                "unit" => unit = Some((unit_of(&string(v, "unit")?).map_err(|e| at(v, e))?, v)),
                "requests_per_unit" => match &v.data {
                    YamlData::Value(Scalar::Integer(i)) => {
                        rpu = Some(
                            u32::try_from(*i)
                                .map_err(|_| at(v, "requests_per_unit must be 0 to 4294967295"))?,
                        )
                    }
                    _ => return Err(at(v, "requests_per_unit must be a whole number")),
                },
                "unlimited" => unlimited = boolean(v, "unlimited")?,
                "name" => name = string(v, "name")?,
                "replaces" => {
                    for r in sequence(v, "replaces")? {
                        let fields = mapping(r, "a replaces entry", &["name"])?;
                        let named = fields
                            .first()
                            .and_then(|(_, v)| text(v))
                            .filter(|t| !t.is_empty())
                            .ok_or_else(|| at(r, "a replaces entry needs a name"))?;
                        replaces.push((named, r));
                    }
                }
                _ => {
                    window = Some((
                        parse_window(&string(v, "window")?).map_err(|e| at(v, e))?,
                        v,
                    ))
                }
            }
        }
        if let Some((_, r)) = replaces.iter().find(|(r, _)| *r == name) {
            return Err(at(r, format!("a rule cannot replace itself ({name:?})")));
        }
        let quota = match (unlimited, unit, window) {
            (true, None, None) => Quota::Unlimited,
            (true, _, _) => {
                return Err(at(n, "unlimited: true takes no unit or window"));
            }
            (false, Some(_), Some((_, w))) => {
                return Err(at(w, "unit and window together: give one"));
            }
            (false, None, None) => return Err(at(n, "rate_limit needs a unit or a window")),
            (false, Some((u, v)), None) => self.limited(u.window(), u, rpu, v)?,
            (false, None, Some((w, v))) => self.limited(Some(w), Unit::of_window(w), rpu, v)?,
        };
        let label: Arc<str> = if name.is_empty() {
            path.into()
        } else {
            name.as_str().into()
        };
        Ok(Rule {
            quota,
            shadow: flags.shadow,
            counters: self.metrics.rule(&self.domain, &label),
            label,
            name: name.into(),
            path: path.into(),
            quota_mode: flags.quota_mode,
            replaces: replaces.into_iter().map(|(r, _)| r.into()).collect(),
            detailed_metric: flags.detailed_metric,
            metadata: flags.metadata,
        })
    }

    /// A limit of `rpu` (absent: 0, every request over it, as the reference reads it).
    fn limited(
        &self,
        window: Option<Duration>,
        unit: Unit,
        rpu: Option<u32>,
        at_window: &Yaml<'_>,
    ) -> Result<Quota, String> {
        let window = window.unwrap_or(Duration::ZERO);
        if let Some(max) = self.bounds.window_max
            && window > max
        {
            return Err(at(
                at_window,
                format!(
                    "a window of {} ms is longer than the API key allows ({} ms)",
                    window.as_millis(),
                    max.as_millis()
                ),
            ));
        }
        Ok(Quota::Limited(Limit {
            requests_per_unit: rpu.unwrap_or(0),
            window,
            unit,
        }))
    }

    /// The `descriptors` list `n` into `level`; `parent` is the key path above.
    fn descriptors(
        &self,
        n: &Yaml<'_>,
        level: &mut Level,
        parent: &str,
        depth: usize,
    ) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(at(n, format!("descriptors nested deeper than {MAX_DEPTH}")));
        }
        for d in sequence(n, "descriptors")? {
            self.descriptor(d, level, parent, depth)?;
        }
        Ok(())
    }

    fn descriptor(
        &self,
        d: &Yaml<'_>,
        level: &mut Level,
        parent: &str,
        depth: usize,
    ) -> Result<(), String> {
        const KEYS: [&str; 10] = [
            "key",
            "value",
            "rate_limit",
            "descriptors",
            "shadow_mode",
            "detailed_metric",
            "value_to_metric",
            "share_threshold",
            "quota_mode",
            "metadata",
        ];
        let fields = mapping(d, "a descriptor", &KEYS)?;
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let key = match get("key").map(|v| string(v, "key")) {
            Some(Ok(k)) if !k.is_empty() => k,
            Some(Err(e)) => return Err(e),
            _ => return Err(at(d, "a descriptor needs a key")),
        };
        let value = get("value").and_then(text).filter(|v| !v.is_empty());
        let flag = |name: &str| {
            get(name)
                .map(|v| boolean(v, name))
                .transpose()
                .map(|b| b.unwrap_or(false))
        };
        let share_threshold = flag("share_threshold")?;
        if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
            return Err(at(
                get("share_threshold").unwrap_or(d),
                "share_threshold needs a wildcard value (with a *)",
            ));
        }
        let metadata = match get("metadata") {
            Some(m) if matches!(m.data, YamlData::Value(Scalar::Null)) => None,
            Some(m) => Some(proto_struct(m, 0)?).filter(|s| !s.fields.is_empty()),
            None => None,
        };
        let flags = Flags {
            shadow: flag("shadow_mode")?,
            quota_mode: flag("quota_mode")?,
            detailed_metric: flag("detailed_metric")?,
            metadata,
        };
        if flags.metadata.is_some() {
            self.has_metadata.set(true);
        }
        let step = match &value {
            Some(v) => format!("{key}_{v}"),
            None => key.clone(),
        };
        let path = if parent.is_empty() {
            step
        } else {
            format!("{parent}.{step}")
        };
        let value_to_metric = flag("value_to_metric")?;
        let mut node = Node {
            rule: get("rate_limit")
                .map(|r| self.rate_limit(r, &path, flags))
                .transpose()?,
            share_threshold,
            value_to_metric,
            children: Level::default(),
        };
        if let Some(children) = get("descriptors") {
            self.descriptors(children, &mut node.children, &path, depth + 1)?;
        }
        let dup = || at(d, format!("duplicate descriptor {path:?}"));
        let rules: &mut KeyRules = level.keys.entry(key).or_default();
        match value {
            None if rules.any.is_some() => return Err(dup()),
            None => rules.any = Some(node),
            Some(v) => match Wildcard::new(&v) {
                Some(w) if rules.wildcards.iter().any(|(p, _)| *p == w) => return Err(dup()),
                Some(w) => rules.wildcards.push((w, node)),
                None if rules.by_value.contains_key(&v) => return Err(dup()),
                None => {
                    rules.by_value.insert(v, node);
                }
            },
        }
        Ok(())
    }
}

/// Checks the text of one file: its domain.
pub fn parse(text: &str, bounds: Bounds, metrics: &RlsMetrics) -> Result<Domain, String> {
    let docs = Yaml::load_from_str(text)
        .map_err(|e| format!("line {}: {}", e.marker().line(), e.info()))?;
    let [doc] = docs.as_slice() else {
        return Err(format!(
            "one YAML document per file (one domain), found {}",
            docs.len()
        ));
    };
    let fields = mapping(doc, "the file", &["domain", "descriptors"])?;
    let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
    let line = get("domain").map_or(1, |v| v.span.start.line());
    let domain = match get("domain").map(|v| string(v, "domain")) {
        Some(Ok(d)) if !d.is_empty() => d,
        Some(Err(e)) => return Err(e),
        Some(Ok(_)) => return Err(at(doc, "domain is empty")),
        None => return Err(at(doc, "domain is required")),
    };
    let reader = Reader {
        bounds,
        metrics,
        domain: domain.as_str().into(),
        has_metadata: std::cell::Cell::new(false),
    };
    let mut root = Level::default();
    if let Some(d) = get("descriptors") {
        reader.descriptors(d, &mut root, "", 0)?;
    }
    Ok(Domain {
        override_counters: metrics.rule(&reader.domain, &"(override)".into()),
        series: metrics.series(),
        has_metadata: reader.has_metadata.get(),
        line,
        name: reader.domain,
        root,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    const FILE: &str = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: path
    value: /login
    shadow_mode: true
    rate_limit:
      window: 10s
      requests_per_unit: 5
      name: login
  - key: path
    rate_limit:
      unit: SECOND
      requests_per_unit: 100
  - key: tenant
    value: free*
    descriptors:
      - key: user
        rate_limit:
          unit: hour
          requests_per_unit: 10
  - key: tenant
    value: gold
    descriptors:
      - key: user
        rate_limit: { unlimited: true }
  - key: generic_key
    value: two
    rate_limit: { unit: day, requests_per_unit: 2 }
    descriptors:
      - key: user
";

    fn e(k: &str, v: &str) -> Entry {
        Entry {
            key: k.into(),
            value: v.into(),
        }
    }

    fn domain() -> Domain {
        parse(FILE, Bounds::default(), &RlsMetrics::default()).unwrap()
    }

    fn limit(d: &Domain, entries: &[Entry]) -> Option<(u32, Duration, Unit, String)> {
        let r = d.find(entries)?;
        match r.quota {
            Quota::Limited(l) => Some((l.requests_per_unit, l.window, l.unit, r.label.to_string())),
            Quota::Unlimited => Some((0, Duration::ZERO, Unit::Other, "unlimited".into())),
        }
    }

    #[test]
    fn matching_follows_the_reference_server() {
        let d = domain();
        assert_eq!(&*d.name, "edge");
        let m = Duration::from_secs(60);
        assert_eq!(
            limit(&d, &[e("remote_address", "10.0.0.1")]),
            Some((3, m, Unit::Minute, "remote_address".into()))
        );
        // the value rule wins over the key-only rule
        assert_eq!(
            limit(&d, &[e("path", "/login")]),
            Some((5, Duration::from_secs(10), Unit::Other, "login".into()))
        );
        assert!(d.find(&[e("path", "/login")]).unwrap().shadow);
        assert_eq!(
            limit(&d, &[e("path", "/x")]).map(|l| l.3),
            Some("path".into())
        );
        // nested, through a prefix rule
        assert_eq!(
            limit(&d, &[e("tenant", "free-42"), e("user", "u")]),
            Some((
                10,
                Duration::from_secs(3600),
                Unit::Hour,
                "tenant_free*.user".into()
            ))
        );
        assert_eq!(
            limit(&d, &[e("tenant", "gold"), e("user", "u")]).map(|l| l.3),
            Some("unlimited".into())
        );
        // the entry stops at a node without a limit, or misses: no rule
        assert_eq!(limit(&d, &[e("tenant", "gold")]), None);
        assert_eq!(limit(&d, &[e("tenant", "silver"), e("user", "u")]), None);
        assert_eq!(limit(&d, &[e("unknown", "x")]), None);
        assert_eq!(limit(&d, &[]), None);
        // more entries than the rule's depth: no rule
        assert_eq!(limit(&d, &[e("remote_address", "a"), e("x", "y")]), None);
        // a rule that also has nested descriptors
        assert_eq!(limit(&d, &[e("generic_key", "two")]).map(|l| l.0), Some(2));
        assert_eq!(limit(&d, &[e("generic_key", "two"), e("user", "u")]), None);
        let rules = Rules {
            domains: [("edge".to_owned(), d)].into(),
            window_max: None,
        };
        assert_eq!(rules.rule_count(), 6);
    }

    #[test]
    fn errors_name_the_line() {
        let err = |text: &str| parse(text, Bounds::default(), &RlsMetrics::default()).unwrap_err();
        let e = err(&FILE.replace("unit: hour", "unit: month"));
        assert!(e.starts_with("line 23:") && e.contains("month"), "{e}");
        let e = err(&FILE.replace("unit: minute", "unit: year"));
        assert!(e.starts_with("line 5:") && e.contains("year"), "{e}");
        let e = err(&FILE.replace("unit: minute", "unit: fortnight"));
        assert!(e.starts_with("line 5:"), "{e}");
        let e = err(&FILE.replace("window: 10s", "window: 10x"));
        assert!(e.starts_with("line 11:"), "{e}");
        let e = err(&FILE.replace("shadow_mode", "shadow"));
        assert!(e.starts_with("line 9:") && e.contains("unknown key"), "{e}");
        let e = err(&FILE.replace(
            "      name: login\n",
            "      name: x\n      replaces: [{name: x}]\n",
        ));
        assert!(e.starts_with("line 14:") && e.contains("itself"), "{e}");
        let e = err(&FILE.replace("      name: login\n", "      replaces:\n        - name:\n"));
        assert!(
            e.starts_with("line 14:") && e.contains("needs a name"),
            "{e}"
        );
        let e = err(&FILE.replace("    shadow_mode: true\n", "    share_threshold: true\n"));
        assert!(e.starts_with("line 9:") && e.contains("wildcard"), "{e}");
        let e = err(&FILE.replace("value: gold", "value: free*"));
        assert!(e.contains("duplicate") && e.starts_with("line 25:"), "{e}");
        // no requests_per_unit: 0, as the reference reads it (every request over)
        let d = parse(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second}\n",
            Bounds::default(),
            &RlsMetrics::default(),
        )
        .unwrap();
        assert_eq!(
            limit(&d, &[super::tests::e("k", "v")]).map(|l| l.0),
            Some(0)
        );
        let e = err(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
        );
        assert!(e.starts_with("line 4:"), "{e}");
        let e = err(
            "domain: a\ndescriptors:\n  - key: k\n    rate_limit: {window: 1s, unit: second, requests_per_unit: 1}\n",
        );
        assert!(e.starts_with("line 4:") && e.contains("together"), "{e}");
        let e = err("descriptors: []\n");
        assert!(e.contains("domain is required"), "{e}");
        let e = err("domain: a\ndescriptors:\n  - key: k\n   bad: [\n");
        assert!(e.starts_with("line "), "{e}");
        let e = err("domain: a\ndescriptors:\n  - value: v\n");
        assert!(e.starts_with("line 3:") && e.contains("key"), "{e}");
        // the key's window limit
        let bounds = Bounds {
            window_max: Some(Duration::from_secs(3600)),
        };
        let e = parse(FILE, bounds, &RlsMetrics::default()).unwrap_err();
        assert!(e.starts_with("line 32:") && e.contains("API key"), "{e}");
        // an empty domain configuration is fine
        assert!(parse("domain: a\n", Bounds::default(), &RlsMetrics::default()).is_ok());
    }

    #[test]
    fn wildcards_in_the_middle_and_several() {
        let d = parse(
            "domain: w\ndescriptors:\n  - key: p\n    value: img*png\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: p\n    value: a*b*c\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: p\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 3}\n  - key: p\n    value: a*b*c\n",
            Bounds::default(),
            &RlsMetrics::default(),
        );
        let err = d.unwrap_err();
        assert!(
            err.starts_with("line 12:") && err.contains("duplicate"),
            "{err}"
        );
        let d = parse(
            "domain: w\ndescriptors:\n  - key: p\n    value: img*png\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: p\n    value: a*b*c\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: p\n    value: a*\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
            Bounds::default(),
            &RlsMetrics::default(),
        )
        .unwrap();
        let rpu = |v: &str| limit(&d, &[e("p", v)]).map(|l| l.0);
        assert_eq!(rpu("img/cat.png"), Some(1));
        assert_eq!(rpu("img/cat.jpg"), None);
        assert_eq!(rpu("a-b-c"), Some(2), "file order: a*b*c before a*");
        assert_eq!(rpu("a-c"), Some(3));
        assert_eq!(rpu("b"), None);
    }

    /// What the reference's own test files exercise, in files of ours: what it loads
    /// loads; what it refuses is refused naming the file, the line and the problem.
    #[test]
    fn the_reference_test_files_cases() {
        let dir = std::env::temp_dir().join(format!("rls-ref-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let load = |paths: &[PathBuf]| load(paths, Bounds::default(), &RlsMetrics::default());
        let loads = [
            // nested levels, key-only and value rules, a value without a limit, names,
            // unlimited, detailed_metric, shadow_mode, quota_mode
            "domain: d\ndescriptors:\n  - key: a\n    value: b\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 5}\n      - key: c\n        value: e\n        shadow_mode: true\n        rate_limit: {unit: second, requests_per_unit: 10}\n  - key: f\n    value: g\n  - key: h\n    detailed_metric: true\n    quota_mode: true\n    rate_limit: {name: hh, unit: day, requests_per_unit: 1}\n  - key: i\n    rate_limit: {unlimited: true}\n",
            // wildcards: trailing, in the middle, several, nested
            "domain: d\ndescriptors:\n  - key: w\n    value: x*\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: m\n    value: y*z\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: n\n    value: p*q*r\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: o\n    value: v\n    descriptors:\n      - key: w\n        value: s*\n        rate_limit: {unit: minute, requests_per_unit: 1}\n",
            // share_threshold at several levels, with value_to_metric and detailed_metric
            "domain: d\ndescriptors:\n  - key: f\n    value: top/*\n    share_threshold: true\n    value_to_metric: true\n    descriptors:\n      - key: f\n        value: in/*\n        share_threshold: true\n        detailed_metric: true\n        rate_limit: {unit: minute, requests_per_unit: 3}\n",
            // metadata: nested mappings, lists, numbers
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    metadata:\n      svc: {name: a, weights: [1, 2.5, true, null]}\n",
            // replaces naming another rule
            "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n      requests_per_unit: 1\n      name: mine\n      replaces:\n        - name: other\n",
        ];
        for (i, text) in loads.iter().enumerate() {
            let p = file(&format!("ok{i}.yaml"), text);
            if let Err(e) = load(std::slice::from_ref(&p)) {
                panic!("file {i} should load: {e}");
            }
        }
        let refused: [(&str, &str, &str); 12] = [
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
                "line 4",
                "unit",
            ),
            ("domain: d\ndescriptors:\n  - key: \"k\n", "line ", ""),
            (
                "domain: d\ndescriptors:\n  - key: k\n    value: v\n  - key: k\n    value: v\n",
                "line 5",
                "duplicate",
            ),
            ("domain: \"\"\ndescriptors: []\n", "line 1", "domain"),
            ("domain: d\ndescriptors:\n  - value: v\n", "line 3", "key"),
            (
                "domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day}\n",
                "line 4",
                "unknown key \"ratelimit\"",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: day, requestsperunit: 5}\n",
                "line 4",
                "unknown key \"requestsperunit\"",
            ),
            (
                "domain: d\ndescriptors:\n  - a\n  - b\n",
                "line 3",
                "mapping",
            ),
            (
                "0.25: d\ndescriptors: []\n",
                "line 1",
                "keys must be strings, not 0.25",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: day\n      replaces:\n        - name:\n",
                "line 8",
                "needs a name",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n      unit: day\n      replaces:\n        - name: me\n",
                "line 8",
                "itself",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day}\n",
                "line 4",
                "unlimited",
            ),
        ];
        for (i, (text, line, problem)) in refused.iter().enumerate() {
            let p = file(&format!("bad{i}.yaml"), text);
            let e = load(std::slice::from_ref(&p)).unwrap_err();
            let named = format!("{}: {line}", p.display());
            assert!(e.starts_with(&named) && e.contains(problem), "{i}: {e}");
        }
        // metadata nested without end
        let deep = format!(
            "domain: d\ndescriptors:\n  - key: k\n    metadata: {{a: {}1{}}}\n",
            "[".repeat(100),
            "]".repeat(100)
        );
        let p = file("deep.yaml", &deep);
        let e = load(std::slice::from_ref(&p)).unwrap_err();
        assert!(e.contains("line 4") && e.contains("deeper"), "{e}");
        // a domain twice, across files
        let (a, b) = (
            file("one.yaml", "domain: d\n"),
            file("two.yaml", "domain: d\n"),
        );
        let e = load(&[a, b.clone()]).unwrap_err();
        let named = format!(
            "{}: line 1: domain \"d\" is also configured by",
            b.display()
        );
        assert!(e.starts_with(&named), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn metric_labels_and_shared_entries_as_the_reference_forms_them() {
        let d = parse(
            "domain: m\ndescriptors:\n  - key: route\n    value: api/*\n    share_threshold: true\n    value_to_metric: true\n    descriptors:\n      - key: method\n        rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: svc\n    value: s*\n    share_threshold: true\n    descriptors:\n      - key: ep\n        detailed_metric: true\n        rate_limit: {unit: minute, requests_per_unit: 80}\n  - key: path\n    value: p*\n    value_to_metric: true\n    descriptors:\n      - key: verb\n        value_to_metric: true\n        rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: plain\n    value: x*\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
            Bounds::default(),
            &RlsMetrics::default(),
        )
        .unwrap();
        let found = |entries: &[Entry]| {
            let f = d.lookup(entries).expect("a rule");
            (f.shared.clone(), f.metric.clone())
        };
        // share_threshold with value_to_metric: the pattern, not the value (the rule's
        // own key path, so its own label)
        assert_eq!(
            found(&[e("route", "api/v1"), e("method", "GET")]),
            (vec![(0, "api/*")], None)
        );
        // share_threshold with detailed_metric: the pattern, then key_value
        assert_eq!(
            found(&[e("svc", "s1"), e("ep", "/x")]),
            (vec![(0, "s*")], Some("svc_s*.ep_/x".into()))
        );
        // value_to_metric on each level: the request's values
        assert_eq!(
            found(&[e("path", "p/a"), e("verb", "GET")]),
            (vec![], Some("path_p/a.verb_GET".into()))
        );
        // no flag: the rule's own label
        assert_eq!(found(&[e("plain", "x1")]), (vec![], None));
        // detailed_metric on a key-only rule: key_value
        assert_eq!(found(&[e("user", "u7")]), (vec![], Some("user_u7".into())));
    }

    proptest::proptest! {
        /// Files made of the format's own pieces, shuffled: parsed or refused, never a
        /// panic.
        #[test]
        fn any_arrangement_never_panics(pieces in proptest::collection::vec(0usize..16, 0..24)) {
            const PIECES: [&str; 16] = [
                "domain: d\n", "descriptors:\n", "  - key: k\n", "    value: a*b*\n",
                "    share_threshold: true\n", "    rate_limit:\n", "      unit: minute\n",
                "      replaces:\n", "        - name: x\n", "    metadata: {a: [1, {b: c}]}\n",
                "    descriptors:\n", "      - key: j\n", "      name: x\n",
                "    quota_mode: yes\n", "  - *\n", "    value_to_metric: true\n",
            ];
            let text: String = pieces.iter().map(|&i| PIECES[i]).collect();
            let _ = parse(&text, Bounds::default(), &RlsMetrics::default());
        }
    }

    #[test]
    fn windows() {
        assert_eq!(parse_window("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_window("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_window("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert!(parse_window("0s").is_err());
        assert!(parse_window("50d").is_err(), "over u32::MAX ms");
        assert!(parse_window("s").is_err());
        assert!(parse_window("10").is_err());
        assert_eq!(Unit::of_window(Duration::from_secs(60)), Unit::Minute);
        assert_eq!(Unit::of_window(Duration::from_secs(10)), Unit::Other);
    }
}
