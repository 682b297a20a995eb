//! Every entry of `tests/data/vectors.json` (see `tests/data/README.md`): ids, label TLVs, valid and invalid keys,
//! datagrams decoded to their fields, must-drop datagrams rejected, and our encoders
//! reproducing the vectors' exact bytes from their inputs.

use std::time::Duration;

use ratelimitly_engine::proto::error::{ConfigError, KeyError};
use ratelimitly_engine::proto::ids::{LatencyTracker, Resource, bucket_id, tracker_id};
use ratelimitly_engine::proto::key::{ApiKey, AuthMode};
use ratelimitly_engine::proto::wire::{
    self, Auth, DropReason, GuardSpec, RateRequestView, RateResponseView, ReportEntry, ReportView,
    ResourceResultSpec, ResourceSpec, TenantFields, TenantView, types,
};
use serde_json::Value;

const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/vectors.json");

fn vectors() -> Value {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| {
        panic!(
            "cannot read the test vectors at {VECTORS} ({e}); they are part of the \
             repository (tests/data/vectors.json)"
        )
    });
    serde_json::from_str(&text).expect("vectors.json is valid JSON")
}

fn arr<'a>(v: &'a Value, k: &str) -> &'a Vec<Value> {
    v[k].as_array()
        .unwrap_or_else(|| panic!("vectors.json: {k} is not an array"))
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str()
        .unwrap_or_else(|| panic!("vectors.json: {k} is not a string in {v}"))
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("vectors.json: {k} is not an integer in {v}"))
}

fn u32_(v: &Value, k: &str) -> u32 {
    u32::try_from(u(v, k)).expect("fits u32")
}

fn hx(v: &Value, k: &str) -> Vec<u8> {
    hex::decode(s(v, k)).expect("hex")
}

fn id16(v: &Value, k: &str) -> [u8; 16] {
    hx(v, k).try_into().expect("16-byte id")
}

#[test]
fn bucket_ids() {
    let v = vectors();
    let list = arr(&v, "bucket_ids");
    assert!(!list.is_empty());
    for e in list {
        let name = hx(e, "name_hex");
        let (w, r) = (u32_(e, "window_size_ms"), u32_(e, "rate_limit"));
        let want = id16(e, "id");
        assert_eq!(bucket_id(&name, w, r), want, "{e}");
        let name = String::from_utf8(name).expect("vector names are UTF-8");
        let res = Resource::new(name.clone(), Duration::from_millis(w.into()), r).unwrap();
        assert_eq!(res.id(), want);
        assert_eq!(res.name(), name);
        assert_eq!((res.window_ms(), res.rate_limit()), (w, r));
    }
}

#[test]
fn tracker_ids() {
    let v = vectors();
    let list = arr(&v, "tracker_ids");
    assert!(!list.is_empty());
    for e in list {
        let name = hx(e, "name_hex");
        let (t, mx, mn) = (
            u32_(e, "ttl_ms"),
            u32_(e, "max_samples"),
            u32_(e, "min_sample_threshold"),
        );
        let want = id16(e, "id");
        assert_eq!(tracker_id(&name, t, mx, mn), want, "{e}");
        let name = String::from_utf8(name).expect("vector names are UTF-8");
        let tr = LatencyTracker::new(name, Duration::from_millis(t.into()), mx, mn).unwrap();
        assert_eq!(tr.id(), want);
        assert_eq!(
            (tr.ttl_ms(), tr.max_samples(), tr.min_samples()),
            (t, mx, mn)
        );
    }
}

#[test]
fn label_tlvs() {
    let v = vectors();
    let list = arr(&v, "metrics_label_tlv");
    assert!(!list.is_empty());
    for e in list {
        let label = s(e, "label");
        let want = hx(e, "tlv");
        let mut buf = [0xAAu8; 64];
        let n = wire::encode_label_tlv(&mut buf, label).unwrap();
        assert_eq!(&buf[..n], &want[..], "{label}");
        assert_eq!(wire::label_tlv_len(label.len()), Some(want.len()));
        assert_eq!(wire::decode_label_tlv(&want), Ok(label));
    }
    // The empty label is omitted.
    assert_eq!(wire::encode_label_tlv(&mut [0u8; 4], ""), Ok(0));
}

fn mode_of(name: &str) -> AuthMode {
    match name {
        "none" => AuthMode::None,
        "cookie" => AuthMode::Cookie,
        "aes" => AuthMode::Aes,
        other => panic!("unknown mode {other}"),
    }
}

#[test]
fn keys_valid() {
    let v = vectors();
    let list = arr(&v, "keys_valid");
    assert_eq!(list.len(), 10);
    for e in list {
        let text = s(e, "key");
        let key: ApiKey = text
            .parse()
            .unwrap_or_else(|err| panic!("{}: {err:?}", s(e, "name")));
        assert_eq!(key.mode(), mode_of(s(e, "mode")));
        assert_eq!(key.key_id(), u(e, "key_id"));
        let secret = hx(e, "secret_hex");
        if secret.is_empty() {
            assert_eq!(key.secret(), &[0u8; 32]);
        } else {
            assert_eq!(&key.secret()[..], &secret[..]);
        }
        let q = key.quotas();
        assert_eq!(
            q.rate_buckets_max,
            u(e, "rate_buckets_max"),
            "{}",
            s(e, "name")
        );
        assert_eq!(q.latency_services_max, u(e, "latency_services_max"));
        assert_eq!(q.metrics_labels_max, u(e, "metrics_labels_max"));
        assert_eq!(q.latency_buffer_size_max, u(e, "latency_buffer_size_max"));
        assert_eq!(u64::from(q.dedup_ttl_ms_max), u(e, "dedup_ttl_ms_max"));
        assert_eq!(
            u64::from(q.rate_window_size_ms_max),
            u(e, "rate_window_size_ms_max")
        );
        assert_eq!(
            key.default_domain(),
            format!("c-{}.p0.ratelimitly.com", u(e, "key_id"))
        );
        // All-upper is accepted by lowering.
        let upper: ApiKey = text.to_ascii_uppercase().parse().unwrap();
        assert_eq!(upper.key_id(), key.key_id());
        assert_eq!(upper.secret(), key.secret());
        assert_eq!(upper.mode(), key.mode());
    }
}

#[test]
fn keys_invalid() {
    let v = vectors();
    let list = arr(&v, "keys_invalid");
    assert_eq!(list.len(), 12);
    for e in list {
        let name = s(e, "name");
        let got = s(e, "key").parse::<ApiKey>().map(|_| ());
        let want = match name {
            "reserved_rate_exponent_25" => KeyError::ReservedRateExponent,
            "reserved_latency_exponent_31" => KeyError::ReservedLatencyExponent,
            "invalid_dedup_code_0" | "invalid_dedup_code_201" => KeyError::BadDedupCode,
            "format_version_0" => KeyError::BadVersion { found: 0 },
            "format_version_2" => KeyError::BadVersion { found: 2 },
            "secret_payload_too_short" => KeyError::BadLength {
                mode: AuthMode::Aes,
                expected: 45,
                actual: 44,
            },
            "secret_payload_too_long" => KeyError::BadLength {
                mode: AuthMode::Aes,
                expected: 45,
                actual: 46,
            },
            // Its checksum verifies under neither Bech32 nor Bech32m (polymod 0x29b232cf),
            // so the checksum rule fails before the (60-byte) length rule is reached.
            "legacy_unversioned_60_byte_aes" => KeyError::BadChecksum,
            "bad_checksum" => KeyError::BadChecksum,
            "mixed_case" => KeyError::MixedCase,
            "unknown_method" => KeyError::UnknownMethod,
            other => panic!("new invalid-key vector {other}: add its expected error here"),
        };
        assert_eq!(got, Err(want), "{name}");
    }
}

/// Neither the key string, its data part, nor the secret (hex, or as Rust formats a byte
/// array) appears in any Debug/Display output of keys, auth state, key errors or an
/// engine builder holding the key.
#[test]
fn credentials_never_formatted() {
    let v = vectors();
    let mut outputs: Vec<(String, String)> = Vec::new();
    for e in arr(&v, "keys_valid") {
        let text = s(e, "key");
        let key: ApiKey = text.parse().unwrap();
        let auth = Auth::new(&key);
        let cfg = ConfigError::Key(KeyError::BadChecksum);
        let builder = ratelimitly_engine::Engine::builder(key.clone());
        for out in [
            format!("{key:?}"),
            format!("{key:#?}"),
            format!("{key}"),
            format!("{auth:?}"),
            format!("{auth:#?}"),
            format!("{cfg} {cfg:?}"),
            format!("{builder:?}"),
        ] {
            assert!(out.contains(&key.key_id().to_string()) || out.contains("key"));
            outputs.push((text.to_string(), out));
        }
    }
    for e in arr(&v, "keys_invalid") {
        let text = s(e, "key");
        let err = text.parse::<ApiKey>().unwrap_err();
        let cfg = ConfigError::from(err);
        for out in [
            format!("{err:?}"),
            format!("{err}"),
            format!("{cfg:?} {cfg}"),
        ] {
            outputs.push((text.to_string(), out));
        }
    }
    for (text, out) in &outputs {
        let lower = out.to_ascii_lowercase();
        let data = &text[text.rfind('1').unwrap() + 1..];
        assert!(!lower.contains(&text.to_ascii_lowercase()), "{out}");
        assert!(!lower.contains(&data[..12].to_ascii_lowercase()), "{out}");
        if let Ok(key) = text.parse::<ApiKey>()
            && key.mode() != AuthMode::None
        {
            let secret = key.secret();
            assert!(!lower.contains(&hex::encode(secret)), "{out}");
            assert!(!out.contains(&format!("{secret:?}")), "{out}");
            assert!(!out.contains(&format!("{:?}", &secret[..4])[1..8]), "{out}");
            assert!(
                !out.contains(&format!("{:02X?}", &secret[..4])[1..8]),
                "{out}"
            );
        }
    }
}

fn key(e: &Value) -> ApiKey {
    s(e, "key").parse().unwrap()
}

fn datagram<'a>(v: &'a Value, prefix: &str) -> &'a Value {
    arr(v, "datagrams")
        .iter()
        .find(|d| s(d, "name").starts_with(prefix))
        .unwrap_or_else(|| panic!("no datagram vector named {prefix}…"))
}

const UNIQUE_ID: [u8; 16] = [
    0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x46, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff,
];
const TIMESTAMP: u64 = 1_767_225_600_000;

/// The inputs of the request vectors.
fn request_inputs() -> (u32, [GuardSpec; 1], [ResourceSpec; 1], &'static str) {
    let t = LatencyTracker::new("inventory-backend", Duration::from_secs(10), 100, 5).unwrap();
    let r = Resource::new("checkout", Duration::from_secs(1), 100).unwrap();
    (
        60,
        [GuardSpec {
            tracker_id: t.id(),
            ttl_ms: t.ttl_ms(),
            max_samples: t.max_samples(),
            min_samples: t.min_samples(),
            threshold_ms: 100,
            current_latency_ms: 0,
        }],
        [ResourceSpec {
            bucket_id: r.id(),
            window_ms: r.window_ms(),
            rate_limit: r.rate_limit(),
            tokens: 1,
        }],
        "api",
    )
}

fn check_request_view(pdu: &[u8]) {
    let (ttl, guards, resources, label) = request_inputs();
    let view = RateRequestView::parse(pdu).unwrap();
    assert_eq!(view.dedup_ttl_ms(), ttl);
    assert_eq!(view.guards().map(|g| g.spec()).collect::<Vec<_>>(), guards);
    assert_eq!(
        view.resources().map(|r| r.spec()).collect::<Vec<_>>(),
        resources
    );
    assert_eq!(view.label(), Some(label.as_bytes()));
    assert_eq!(view.label_str(), Some(label));
}

#[test]
fn request_pdu_plaintext() {
    let v = vectors();
    let d = datagram(&v, "rate request PDU alone");
    let want = hx(d, "hex");
    check_request_view(&want);
    let (ttl, guards, resources, label) = request_inputs();
    let mut buf = [0u8; 1200];
    let n = wire::encode_rate_request_pdu(&mut buf, ttl, &guards, &resources, label).unwrap();
    assert_eq!(&buf[..n], &want[..]);
    assert_eq!(
        wire::rate_request_pdu_len(1, 1, label.len()),
        Some(want.len())
    );
}

fn check_request_datagram(prefix: &str, mode: AuthMode, nonce: [u8; 12]) {
    let v = vectors();
    let d = datagram(&v, prefix);
    let k = key(d);
    assert_eq!(k.mode(), mode);
    let auth = Auth::new(&k);
    let want = hx(d, "hex");
    let plain = hx(datagram(&v, "rate request PDU alone"), "hex");

    // Decode.
    let mut rx = want.clone();
    let opened = wire::open(&auth, &mut rx).unwrap();
    let t = opened.tenant.fields();
    assert_eq!(
        t,
        TenantFields {
            id: k.key_id(),
            unique_id: UNIQUE_ID,
            timestamp_ms: TIMESTAMP,
            steering: 0
        }
    );
    assert_eq!(opened.pdu, &plain[..]);
    check_request_view(opened.pdu);

    // Encode from the inputs: exact bytes.
    let (ttl, guards, resources, label) = request_inputs();
    let mut buf = [0u8; 1200];
    let n =
        wire::encode_request(&auth, &t, nonce, &mut buf, ttl, &guards, &resources, label).unwrap();
    assert_eq!(hex::encode(&buf[..n]), hex::encode(&want));

    // Same through the two-step API.
    let mut buf2 = [0u8; 1200];
    let p = auth.pdu_offset();
    let pdu_len =
        wire::encode_rate_request_pdu(&mut buf2[p..], ttl, &guards, &resources, label).unwrap();
    let n2 = wire::seal(&auth, &t, nonce, &mut buf2, pdu_len).unwrap();
    assert_eq!(&buf2[..n2], &want[..]);
}

const REQ_NONCE: [u8; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11];

#[test]
fn request_datagram_aes() {
    check_request_datagram("the same request, aes mode", AuthMode::Aes, REQ_NONCE);
}

#[test]
fn request_datagram_cookie() {
    check_request_datagram("the same request, cookie mode", AuthMode::Cookie, [0; 12]);
}

/// Every datagram vector with a key: decodes to its decision and server id, or is dropped.
#[test]
fn every_datagram_decodes_or_drops() {
    let v = vectors();
    let mut checked = 0;
    for d in arr(&v, "datagrams") {
        let raw = hx(d, "hex");
        if d.get("key").is_none() {
            // Plaintext PDU vectors: parse as whatever their type says.
            match u16::from_le_bytes([raw[0], raw[1]]) {
                types::RATE_REQUEST => {
                    RateRequestView::parse(&raw).unwrap();
                }
                types::LATENCY_REPORT => {
                    ReportView::parse(&raw).unwrap();
                }
                other => panic!("unexpected plaintext PDU type {other:#x}"),
            }
            checked += 1;
            continue;
        }
        let k = key(d);
        let auth = Auth::new(&k);
        let mut rx = raw.clone();
        let tenant = TenantView::parse(&raw).unwrap().fields();
        let opened = wire::open(&auth, &mut rx);
        match d.get("decision").and_then(Value::as_str) {
            Some("drop") => {
                assert_eq!(
                    opened.err(),
                    Some(DropReason::AuthFailed),
                    "{}",
                    s(d, "name")
                );
                // When verification fails the PDU is wiped (no unauthenticated plaintext
                // is left; the decryption is in place) and the TLVs before it are as sent.
                let p = auth.pdu_offset();
                assert_eq!(rx[..p], raw[..p]);
                assert!(rx[p..].iter().all(|&b| b == 0), "{}", s(d, "name"));
            }
            Some(decision) => {
                let o = opened.unwrap();
                assert_eq!(o.tenant.id(), u(d, "server_id"));
                assert_eq!(o.tenant.fields(), tenant);
                let r = RateResponseView::parse(o.pdu).unwrap();
                assert_eq!(r.is_grant(), decision == "granted", "{}", s(d, "name"));
            }
            None => {
                let o = opened.unwrap();
                assert_eq!(o.tenant.id(), k.key_id());
                RateRequestView::parse(o.pdu).unwrap();
            }
        }
        checked += 1;
    }
    assert_eq!(checked, arr(&v, "datagrams").len());
}

/// Decodes a response vector, checks it, and re-encodes it from the decoded values with the
/// vector's nonce: the bytes must be identical.
fn response_roundtrip(prefix: &str) -> (TenantFields, Vec<GuardSpec>, Vec<ResourceResultSpec>) {
    let v = vectors();
    let d = datagram(&v, prefix);
    let k = key(d);
    let auth = Auth::new(&k);
    let want = hx(d, "hex");
    let mut rx = want.clone();
    let o = wire::open(&auth, &mut rx).unwrap();
    let t = o.tenant.fields();
    let r = RateResponseView::parse(o.pdu).unwrap();
    let guards: Vec<GuardSpec> = r.guards().map(|g| g.spec()).collect();
    let res: Vec<ResourceResultSpec> = r.resources().map(|x| x.spec()).collect();
    let pdu_len = o.pdu.len();

    let nonce: [u8; 12] = if k.mode() == AuthMode::Aes {
        want[44..56].try_into().unwrap()
    } else {
        [0; 12]
    };
    let mut buf = [0u8; 1200];
    let p = auth.pdu_offset();
    let n = wire::encode_rate_response_pdu(&mut buf[p..], &guards, &res).unwrap();
    if n == pdu_len {
        let total = wire::seal(&auth, &t, nonce, &mut buf, n).unwrap();
        assert_eq!(hex::encode(&buf[..total]), hex::encode(&want), "{prefix}");
    }
    (t, guards, res)
}

#[test]
fn aes_response_granted() {
    let (t, guards, res) = response_roundtrip("aes response: granted");
    assert_eq!(t.id, 0x0000_0018_1c80_0007);
    assert_eq!(t.id >> 23, 12345);
    assert_eq!(t.unique_id, UNIQUE_ID);
    assert_eq!(t.timestamp_ms, TIMESTAMP);
    assert_eq!(t.steering, 1);
    let (_, req_guards, req_res, _) = request_inputs();
    assert_eq!(guards.len(), 1);
    assert_eq!(guards[0].tracker_id, req_guards[0].tracker_id);
    assert_eq!(guards[0].threshold_ms, 100);
    assert_eq!(guards[0].current_latency_ms, 42);
    assert_eq!(res.len(), 1);
    assert_eq!(res[0].bucket_id, req_res[0].bucket_id);
    assert_eq!(res[0].actual_rate, 37);
    assert_eq!(res[0].deficit, 0);
}

#[test]
fn cookie_response_rejected() {
    let (t, guards, res) = response_roundtrip("cookie response: rejected");
    assert_eq!(t.id, 7);
    assert_eq!(t.steering, 0);
    assert_eq!(t.unique_id, UNIQUE_ID);
    assert!(guards.is_empty());
    assert_eq!(res.len(), 1);
    assert_eq!(res[0].deficit, 1);
    assert_eq!(res[0].window_ms, 1000);
    assert_eq!(res[0].actual_rate, 100);
}

#[test]
fn none_response_with_trailing_label_is_granted() {
    let v = vectors();
    let d = datagram(&v, "auth none response with a trailing label");
    let auth = Auth::new(&key(d));
    let mut rx = hx(d, "hex");
    let o = wire::open(&auth, &mut rx).unwrap();
    assert_eq!(o.tenant.id(), 42);
    assert_eq!(o.tenant.steering(), 1);
    let r = RateResponseView::parse(o.pdu).unwrap();
    assert_eq!((r.guard_count(), r.resource_count()), (0, 0));
    assert!(r.is_grant());
}

#[test]
fn report_pdu() {
    let v = vectors();
    let d = datagram(&v, "latency report PDU alone");
    let want = hx(d, "hex");
    let t = LatencyTracker::new("service", Duration::from_secs(1), 32, 4).unwrap();
    let entry = ReportEntry {
        tracker_id: t.id(),
        ttl_ms: 1000,
        max_samples: 32,
        min_samples: 4,
        observed_ms: 85,
    };
    let view = ReportView::parse(&want).unwrap();
    assert_eq!(view.entries().collect::<Vec<_>>(), vec![entry]);
    let mut buf = [0u8; 1200];
    let n = wire::encode_report_pdu(&mut buf, &[entry]).unwrap();
    assert_eq!(&buf[..n], &want[..]);
}

#[test]
fn must_drop_vectors() {
    let v = vectors();
    let drops: Vec<&Value> = arr(&v, "datagrams")
        .iter()
        .filter(|d| d.get("decision").and_then(Value::as_str) == Some("drop"))
        .collect();
    assert_eq!(drops.len(), 2);
    for d in drops {
        let auth = Auth::new(&key(d));
        let mut rx = hx(d, "hex");
        assert_eq!(
            wire::open(&auth, &mut rx).err(),
            Some(DropReason::AuthFailed),
            "{}",
            s(d, "name")
        );
    }
}

/// A new section in vectors.json must get a test here.
#[test]
fn every_section_is_covered() {
    let v = vectors();
    let mut sections: Vec<&str> = v
        .as_object()
        .expect("top-level object")
        .keys()
        .map(String::as_str)
        .collect();
    sections.sort_unstable();
    assert_eq!(
        sections,
        [
            "about",
            "bucket_ids",
            "datagrams",
            "keys_invalid",
            "keys_valid",
            "metrics_label_tlv",
            "tracker_ids"
        ]
    );
    // Every datagram vector is matched by a named test above or by
    // `every_datagram_decodes_or_drops`; count them so an addition is noticed.
    assert_eq!(arr(&v, "datagrams").len(), 9);
}
