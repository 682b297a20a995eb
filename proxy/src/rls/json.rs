//! `POST /json`: envoyproxy/ratelimit's JSON form of `ShouldRateLimit`, for clients that
//! cannot speak gRPC: the request and the answer as protobuf's JSON mapping writes them
//! (`{"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}` in,
//! `{"overallCode": "OK", "statuses": [...]}` out), answered by the same service.
//!
//! Field names are read in both spellings the mapping accepts (`hits_addend`,
//! `hitsAddend`) and written in lowerCamelCase; enums as their names (a number is read
//! too); 64-bit and wrapper numbers as a number or a string; default values are left
//! out of the answer. An unknown field, a wrong type or a body that is not JSON is a
//! `400` with the reason, as the reference's parser refuses them.
//!
//! Owns: the JSON mapping of the two messages. Must not touch: decisions (`service`).

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value};
use serde_json::{Map, Value as Json};

/// The largest body read (larger: `413`).
pub const MAX_BODY: usize = 1 << 20;

/// The fields of `v` (an object), each one of `allowed` (either spelling).
fn object<'a>(
    v: &'a Json,
    what: &str,
    allowed: &[(&'static str, &str)],
) -> Result<Vec<(&'static str, &'a Json)>, String> {
    let Json::Object(m) = v else {
        return Err(format!("{what} must be an object"));
    };
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let Some((name, _)) = allowed.iter().find(|(a, b)| k == a || k == b) else {
            return Err(format!("unknown field {k:?} in {what}"));
        };
        if !v.is_null() {
            out.push((*name, v));
        }
    }
    Ok(out)
}

fn string(v: &Json, what: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what} must be a string"))
}

/// A protobuf integer in JSON: a number, or a string holding one.
fn number(v: &Json, what: &str) -> Result<u64, String> {
    match v {
        Json::Number(n) => n.as_u64(),
        Json::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("{what} must be a non-negative integer"))
}

fn u32_of(v: &Json, what: &str) -> Result<u32, String> {
    u32::try_from(number(v, what)?).map_err(|_| format!("{what} is larger than 4294967295"))
}

fn unit(v: &Json) -> Result<i32, String> {
    match v {
        Json::String(s) => Unit::from_str_name(s)
            .map(|u| u as i32)
            .ok_or_else(|| format!("unit {s:?} is not one of the proto's units")),
        Json::Number(_) => Ok(u32_of(v, "unit")? as i32),
        _ => Err("unit must be a string".into()),
    }
}

fn descriptor(v: &Json) -> Result<RateLimitDescriptor, String> {
    let mut d = RateLimitDescriptor::default();
    let fields = [
        ("entries", "entries"),
        ("limit", "limit"),
        ("hits_addend", "hitsAddend"),
        ("is_negative_hits", "isNegativeHits"),
    ];
    for (name, v) in object(v, "a descriptor", &fields)? {
        match name {
            "entries" => {
                let Json::Array(a) = v else {
                    return Err("entries must be a list".into());
                };
                for e in a {
                    let mut entry = Entry::default();
                    for (name, v) in object(e, "an entry", &[("key", "key"), ("value", "value")])? {
                        match name {
                            "key" => entry.key = string(v, "key")?,
                            _ => entry.value = string(v, "value")?,
                        }
                    }
                    d.entries.push(entry);
                }
            }
            "limit" => {
                let mut l = RateLimitOverride::default();
                let fields = [("requests_per_unit", "requestsPerUnit"), ("unit", "unit")];
                for (name, v) in object(v, "limit", &fields)? {
                    match name {
                        "unit" => l.unit = unit(v)?,
                        _ => l.requests_per_unit = u32_of(v, "requests_per_unit")?,
                    }
                }
                d.limit = Some(l);
            }
            "hits_addend" => {
                d.hits_addend = Some(UInt64Value {
                    value: number(v, "hits_addend")?,
                })
            }
            _ => {
                d.is_negative_hits = v
                    .as_bool()
                    .ok_or("is_negative_hits must be true or false")?
            }
        }
    }
    Ok(d)
}

/// The request in `body`, or why not.
pub fn request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let v: Json = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    let mut r = RateLimitRequest::default();
    let fields = [
        ("domain", "domain"),
        ("descriptors", "descriptors"),
        ("hits_addend", "hitsAddend"),
    ];
    for (name, v) in object(&v, "the request", &fields)? {
        match name {
            "domain" => r.domain = string(v, "domain")?,
            "descriptors" => {
                let Json::Array(a) = v else {
                    return Err("descriptors must be a list".into());
                };
                r.descriptors = a.iter().map(descriptor).collect::<Result<_, _>>()?;
            }
            _ => r.hits_addend = u32_of(v, "hits_addend")?,
        }
    }
    Ok(r)
}

fn code(c: i32) -> Json {
    Code::try_from(c)
        .map(|c| Json::from(c.as_str_name()))
        .unwrap_or(Json::from(c))
}

fn value(v: &Value) -> Json {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::NumberValue(n)) => serde_json::Number::from_f64(*n)
            .map(Json::Number)
            .unwrap_or(Json::Null),
        Some(Kind::StringValue(s)) => Json::from(s.as_str()),
        Some(Kind::BoolValue(b)) => Json::from(*b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => Json::Array(l.values.iter().map(value).collect()),
    }
}

fn structure(s: &Struct) -> Json {
    Json::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value(v)))
            .collect(),
    )
}

/// `r` in protobuf's JSON mapping (lowerCamelCase, enums by name, defaults left out).
pub fn response(r: &RateLimitResponse) -> Json {
    let mut out = Map::new();
    if r.overall_code != 0 {
        out.insert("overallCode".into(), code(r.overall_code));
    }
    let statuses: Vec<Json> = r
        .statuses
        .iter()
        .map(|s| {
            let mut o = Map::new();
            if s.code != 0 {
                o.insert("code".into(), code(s.code));
            }
            if let Some(l) = &s.current_limit {
                let mut m = Map::new();
                if !l.name.is_empty() {
                    m.insert("name".into(), Json::from(l.name.as_str()));
                }
                if l.requests_per_unit != 0 {
                    m.insert("requestsPerUnit".into(), Json::from(l.requests_per_unit));
                }
                if l.unit != 0 {
                    let name = Unit::try_from(l.unit)
                        .map(|u| Json::from(u.as_str_name()))
                        .unwrap_or(Json::from(l.unit));
                    m.insert("unit".into(), name);
                }
                o.insert("currentLimit".into(), Json::Object(m));
            }
            if s.limit_remaining != 0 {
                o.insert("limitRemaining".into(), Json::from(s.limit_remaining));
            }
            if let Some(d) = &s.duration_until_reset {
                let text = if d.nanos == 0 {
                    format!("{}s", d.seconds)
                } else {
                    let t = format!("{}.{:09}", d.seconds, d.nanos.unsigned_abs());
                    format!("{}s", t.trim_end_matches('0'))
                };
                o.insert("durationUntilReset".into(), Json::from(text));
            }
            Json::Object(o)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), Json::Array(statuses));
    }
    for (field, headers) in [
        ("responseHeadersToAdd", &r.response_headers_to_add),
        ("requestHeadersToAdd", &r.request_headers_to_add),
    ] {
        if headers.is_empty() {
            continue;
        }
        let list = headers
            .iter()
            .map(|h| {
                let mut m = Map::new();
                m.insert("key".into(), Json::from(h.key.as_str()));
                if !h.value.is_empty() {
                    m.insert("value".into(), Json::from(h.value.as_str()));
                }
                Json::Object(m)
            })
            .collect();
        out.insert(field.into(), Json::Array(list));
    }
    if let Some(m) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".into(), structure(m));
    }
    Json::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_in_both_spellings_and_refusals() {
        let r = request(
            br#"{"domain":"d","hits_addend":2,"descriptors":[{"entries":[{"key":"k","value":"v"},{"key":"x"}],"hitsAddend":"3","limit":{"requestsPerUnit":5,"unit":"MINUTE"}}]}"#,
        )
        .unwrap();
        assert_eq!(r.domain, "d");
        assert_eq!(r.hits_addend, 2);
        let d = &r.descriptors[0];
        assert_eq!(d.entries.len(), 2);
        assert_eq!(d.entries[1].value, "");
        assert_eq!(d.hits_addend.as_ref().unwrap().value, 3);
        assert_eq!(d.limit.as_ref().unwrap().unit, Unit::Minute as i32);
        for bad in [
            &b"{"[..],
            b"[]",
            b"{\"domian\":\"d\"}",
            b"{\"domain\":1}",
            b"{\"descriptors\":[{\"entries\":[{\"key\":\"k\",\"v\":1}]}]}",
            b"{\"hits_addend\":-1}",
            b"{\"hits_addend\":99999999999}",
            b"{\"descriptors\":[{\"limit\":{\"unit\":\"EON\"}}]}",
        ] {
            assert!(request(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn responses_as_protojson() {
        use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
            DescriptorStatus, RateLimit,
        };
        use envoy_types::pb::google::protobuf::Duration;
        let r = RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: vec![DescriptorStatus {
                code: Code::OverLimit as i32,
                current_limit: Some(RateLimit {
                    name: String::new(),
                    requests_per_unit: 1,
                    unit: Unit::Minute as i32,
                }),
                limit_remaining: 0,
                duration_until_reset: Some(Duration {
                    seconds: 59,
                    nanos: 500_000_000,
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            response(&r).to_string(),
            r#"{"overallCode":"OVER_LIMIT","statuses":[{"code":"OVER_LIMIT","currentLimit":{"requestsPerUnit":1,"unit":"MINUTE"},"durationUntilReset":"59.5s"}]}"#
        );
    }
}
