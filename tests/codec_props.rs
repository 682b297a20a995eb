//! Property tests of the codec: no decoder panics on arbitrary bytes; valid requests,
//! responses and reports round-trip through encode / seal / open / view in all three auth
//! modes; any single-byte change of an aes datagram is rejected; labels and keys round-trip.

use proptest::prelude::*;

use ratelimitly_engine::proto::error::KeyError;
use ratelimitly_engine::proto::key::{ApiKey, AuthMode, Quotas};
use ratelimitly_engine::proto::outcome::{Decision, Phase, Response};
use ratelimitly_engine::proto::wire::{
    self, Auth, DropReason, EncodeError, GuardSpec, GuardView, MAX_DATAGRAM, RateRequestView,
    RateResponseView, ReportEntry, ReportView, ResourceResultSpec, ResourceSpec, TenantFields,
    TenantView,
};

/// None, cookie and aes fixtures (tests/data/vectors.json).
const KEYS: [&str; 3] = rl_testkit::keys::ALL_MODES;

fn auths() -> [Auth; 3] {
    KEYS.map(|k| Auth::new(&k.parse::<ApiKey>().unwrap()))
}

fn guard() -> impl Strategy<Value = GuardSpec> {
    (any::<[u8; 16]>(), any::<[u32; 5]>()).prop_map(|(id, f)| GuardSpec {
        tracker_id: id,
        ttl_ms: f[0],
        max_samples: f[1],
        min_samples: f[2],
        threshold_ms: f[3],
        current_latency_ms: f[4],
    })
}

fn resource() -> impl Strategy<Value = ResourceSpec> {
    (any::<[u8; 16]>(), any::<u32>(), any::<u32>(), any::<u16>()).prop_map(|(id, w, r, t)| {
        ResourceSpec {
            bucket_id: id,
            window_ms: w,
            rate_limit: r,
            tokens: t,
        }
    })
}

fn tenant() -> impl Strategy<Value = TenantFields> {
    (any::<u64>(), any::<[u8; 16]>(), any::<u64>(), any::<u8>()).prop_map(|(id, u, ts, st)| {
        TenantFields {
            id,
            unique_id: u,
            timestamp_ms: ts,
            steering: st,
        }
    })
}

/// Calls every accessor of a guard block view.
fn touch_guard(g: &GuardView<'_>) {
    let spec = g.spec();
    assert_eq!(spec.tracker_id, g.tracker_id());
    assert_eq!(
        (spec.ttl_ms, spec.max_samples, spec.min_samples),
        (g.ttl_ms(), g.max_samples(), g.min_samples())
    );
    assert_eq!(
        (spec.threshold_ms, spec.current_latency_ms),
        (g.threshold_ms(), g.current_latency_ms())
    );
    assert_eq!(
        g.passed(),
        wire::guard_passes(spec.threshold_ms, spec.current_latency_ms)
    );
}

/// Calls every accessor of a tenant view.
fn touch_tenant(t: &TenantView<'_>) {
    let f = t.fields();
    assert_eq!((f.id, f.unique_id), (t.id(), t.unique_id()));
    assert_eq!(
        (f.timestamp_ms, f.steering),
        (t.timestamp_ms(), t.steering())
    );
    assert!(t.size() >= wire::TENANT_LEN);
    assert_eq!(t.as_bytes().len(), t.size());
}

/// Calls every accessor of a request view.
fn touch_request(v: &RateRequestView<'_>) {
    let _ = v.dedup_ttl_ms();
    assert_eq!(v.guards().len(), v.guard_count());
    assert_eq!(v.resources().len(), v.resource_count());
    v.guards().for_each(|g| touch_guard(&g));
    for r in v.resources() {
        let spec = r.spec();
        assert_eq!(
            (spec.bucket_id, spec.window_ms),
            (r.bucket_id(), r.window_ms())
        );
        assert_eq!((spec.rate_limit, spec.tokens), (r.rate_limit(), r.tokens()));
    }
    assert_eq!(v.label(), v.label_str().map(str::as_bytes));
}

/// Calls every accessor of a response view.
fn touch_response(v: &RateResponseView<'_>) {
    assert_eq!(v.guards().len(), v.guard_count());
    assert_eq!(v.resources().len(), v.resource_count());
    v.guards().for_each(|g| touch_guard(&g));
    for r in v.resources() {
        let spec = r.spec();
        assert_eq!(
            (spec.bucket_id, spec.window_ms),
            (r.bucket_id(), r.window_ms())
        );
        assert_eq!(
            (spec.actual_rate, spec.deficit),
            (r.actual_rate(), r.deficit())
        );
    }
    assert_eq!(
        v.is_grant(),
        v.guards().all(|g| g.passed()) && v.resources().all(|r| r.deficit() == 0)
    );
}

/// Calls every accessor of a report view.
fn touch_report(v: &ReportView<'_>) {
    assert_eq!(v.entries().len(), v.len());
    assert_eq!(v.is_empty(), v.entries().next().is_none());
    let _ = v.entries().count();
}

/// Runs every datagram / PDU decoder over `bytes`, and every accessor of what they
/// accept; none may panic.
fn decode_everything(bytes: &[u8]) {
    if let Ok(t) = TenantView::parse(bytes) {
        touch_tenant(&t);
    }
    if let Ok(r) = RateRequestView::parse(bytes) {
        touch_request(&r);
    }
    if let Ok(r) = RateResponseView::parse(bytes) {
        let _ = r.is_grant();
        for g in r.guards() {
            let _ = g.spec();
        }
        for x in r.resources() {
            let _ = x.spec();
        }
        touch_response(&r);
    }
    if let Ok(r) = ReportView::parse(bytes) {
        let _ = r.entries().count();
        touch_report(&r);
    }
    let _ = wire::decode_label_tlv(bytes);
    for auth in auths() {
        let mut buf = bytes.to_vec();
        if let Ok(o) = wire::open(&auth, &mut buf) {
            let _ = o.tenant.fields();
            touch_tenant(&o.tenant);
            let _ = RateResponseView::parse(o.pdu);
            let _ = RateRequestView::parse(o.pdu);
            let _ = ReportView::parse(o.pdu);
            if let Ok(r) = RateRequestView::from_opened(&o) {
                touch_request(&r);
            }
            if let Ok(r) = RateResponseView::from_opened(&o) {
                touch_response(&r);
            }
            if let Ok(r) = ReportView::parse(o.pdu) {
                touch_report(&r);
            }
        }
    }
}

/// A PDU of type `ty` whose header size says `declared` (clamped to u16) over a body of
/// counts `g`, `r` and `rest` bytes: parsers get far enough to build views.
fn framed_pdu(ty: u16, g: u16, r: u16, rest: &[u8], size_delta: i32) -> Vec<u8> {
    let mut pdu = Vec::with_capacity(12 + rest.len());
    pdu.extend_from_slice(&ty.to_le_bytes());
    pdu.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    pdu.extend_from_slice(&g.to_le_bytes());
    pdu.extend_from_slice(&r.to_le_bytes());
    pdu.extend_from_slice(rest);
    let size = (pdu.len() as i32 + size_delta).clamp(0, i32::from(u16::MAX)) as u16;
    pdu[2..4].copy_from_slice(&size.to_le_bytes());
    pdu
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1400)) {
        decode_everything(&bytes);
    }

    /// Bytes behind plausible headers reach the deeper checks.
    #[test]
    fn decoders_never_panic_with_headers(
        mode in 0usize..3,
        tsize in prop_oneof![Just(40u16), 0u16..80],
        asize in prop_oneof![Just(4u16), Just(32u16), Just(36u16), any::<u16>()],
        pdu_type in prop_oneof![Just(0x5252u16), Just(0x5452u16), Just(0x524Cu16)],
        rest in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let atype = [0x414Eu16, 0x4143, 0x4541][mode];
        let mut d = vec![0u8; 40];
        d[0..2].copy_from_slice(&0x4C52u16.to_le_bytes());
        d[2..4].copy_from_slice(&tsize.to_le_bytes());
        d.extend_from_slice(&atype.to_le_bytes());
        d.extend_from_slice(&asize.to_le_bytes());
        d.extend_from_slice(&[0u8; 32][..usize::from(asize).min(32).saturating_sub(4)]);
        let pdu_at = d.len();
        d.extend_from_slice(&pdu_type.to_le_bytes());
        d.extend_from_slice(&rest);
        decode_everything(&d);
        decode_everything(&d[pdu_at..]);
    }

    #[test]
    fn key_parser_never_panics(s in "\\PC{0,120}") {
        let _ = s.parse::<ApiKey>();
    }

    #[test]
    fn key_parser_never_panics_on_near_keys(
        k in 0usize..3, pos in 0usize..100, c in "[a-zA-Z0-9 1]", truncate in any::<bool>()
    ) {
        let mut s: Vec<char> = KEYS[k].chars().collect();
        let pos = pos % s.len();
        if truncate { s.truncate(pos) } else { s[pos] = c.chars().next().unwrap() }
        let s: String = s.into_iter().collect();
        let _ = s.parse::<ApiKey>();
    }

    #[test]
    fn requests_round_trip(
        mode in 0usize..3,
        t in tenant(),
        nonce in any::<[u8; 12]>(),
        ttl in any::<u32>(),
        guards in proptest::collection::vec(guard(), 0..8),
        resources in proptest::collection::vec(resource(), 0..8),
        label in "\\PC{0,40}",
    ) {
        let auth = &auths()[mode];
        let mut buf = [0u8; 2048];
        let n = wire::encode_request(auth, &t, nonce, &mut buf, ttl, &guards, &resources, &label);
        let pdu_len = wire::rate_request_pdu_len(guards.len(), resources.len(), label.len()).unwrap();
        let needed = auth.pdu_offset() + pdu_len;
        if needed > MAX_DATAGRAM {
            prop_assert_eq!(n, Err(EncodeError::TooLarge { needed, max: MAX_DATAGRAM }));
            return Ok(());
        }
        let n = n.unwrap();
        prop_assert_eq!(n, needed);
        let sent = buf[..n].to_vec();
        let mut rx = sent.clone();
        let o = wire::open(auth, &mut rx).unwrap();
        prop_assert_eq!(o.tenant.fields(), t);
        prop_assert_eq!(o.pdu.len(), pdu_len);
        let v = RateRequestView::parse(o.pdu).unwrap();
        prop_assert_eq!(v.dedup_ttl_ms(), ttl);
        prop_assert_eq!(v.guards().map(|g| g.spec()).collect::<Vec<_>>(), guards.clone());
        prop_assert_eq!(v.resources().map(|r| r.spec()).collect::<Vec<_>>(), resources.clone());
        prop_assert_eq!(v.label_str(), if label.is_empty() { None } else { Some(label.as_str()) });
        // Encoding is deterministic: same inputs, same bytes (replays are identical).
        let mut again = [0u8; 2048];
        let n2 = wire::encode_request(auth, &t, nonce, &mut again, ttl, &guards, &resources, &label).unwrap();
        prop_assert_eq!(&again[..n2], &sent[..]);
    }

    #[test]
    fn responses_round_trip(
        mode in 0usize..3,
        t in tenant(),
        nonce in any::<[u8; 12]>(),
        guards in proptest::collection::vec(guard(), 0..6),
        resources in proptest::collection::vec(
            (any::<[u8; 16]>(), any::<u32>(), any::<u32>(), prop_oneof![Just(0u16), any::<u16>()]),
            0..6,
        ),
        trailing in proptest::collection::vec(any::<u8>(), 0..8),
    ) {
        let resources: Vec<ResourceResultSpec> = resources
            .into_iter()
            .map(|(id, w, a, d)| ResourceResultSpec { bucket_id: id, window_ms: w, actual_rate: a, deficit: d })
            .collect();
        let auth = &auths()[mode];
        let p = auth.pdu_offset();
        let mut buf = [0u8; 2048];
        let n = wire::encode_rate_response_pdu(&mut buf[p..], &guards, &resources).unwrap();
        prop_assert_eq!(n, wire::rate_response_pdu_len(guards.len(), resources.len()));
        // Bytes after the PDU size are ignored by the view.
        buf[p + n..p + n + trailing.len()].copy_from_slice(&trailing);
        let total = wire::seal(auth, &t, nonce, &mut buf, n + trailing.len()).unwrap();
        let o = wire::open(auth, &mut buf[..total]).unwrap();
        prop_assert_eq!(o.tenant.fields(), t);
        let v = RateResponseView::parse(o.pdu).unwrap();
        prop_assert_eq!(v.guards().map(|g| g.spec()).collect::<Vec<_>>(), guards.clone());
        prop_assert_eq!(v.resources().map(|r| r.spec()).collect::<Vec<_>>(), resources.clone());
        let grant = guards.iter().all(|g| g.current_latency_ms < g.threshold_ms)
            && resources.iter().all(|r| r.deficit == 0);
        prop_assert_eq!(v.is_grant(), grant);
    }

    #[test]
    fn reports_round_trip(
        mode in 0usize..3,
        t in tenant(),
        nonce in any::<[u8; 12]>(),
        entries in proptest::collection::vec(
            (any::<[u8; 16]>(), any::<[u32; 4]>()).prop_map(|(id, f)| ReportEntry {
                tracker_id: id, ttl_ms: f[0], max_samples: f[1], min_samples: f[2], observed_ms: f[3],
            }),
            0..40,
        ),
    ) {
        let auth = &auths()[mode];
        let mut buf = [0u8; 2048];
        let r = wire::encode_report(auth, &t, nonce, &mut buf, &entries);
        if entries.len() > wire::max_report_entries(auth.mode()) {
            let too_large = matches!(r, Err(EncodeError::TooLarge { .. }));
            prop_assert!(too_large);
            return Ok(());
        }
        let n = r.unwrap();
        let o = wire::open(auth, &mut buf[..n]).unwrap();
        let v = ReportView::parse(o.pdu).unwrap();
        prop_assert_eq!(v.entries().collect::<Vec<_>>(), entries);
    }

    /// Every byte of an aes datagram is covered by the AAD, the tag or the ciphertext.
    #[test]
    fn aes_rejects_any_single_byte_change(
        t in tenant(),
        nonce in any::<[u8; 12]>(),
        guards in proptest::collection::vec(guard(), 0..3),
        resources in proptest::collection::vec(resource(), 0..3),
        pos in any::<usize>(),
        xor in 1u8..=255,
    ) {
        let auth = &auths()[2];
        let mut buf = [0u8; 1200];
        let n = wire::encode_request(auth, &t, nonce, &mut buf, 60, &guards, &resources, "x").unwrap();
        let mut d = buf[..n].to_vec();
        d[pos % n] ^= xor;
        prop_assert!(wire::open(auth, &mut d).is_err());
    }

    /// Cookie and none modes: a single-byte change is either dropped or (outside the
    /// cookie) leaves a datagram whose decoders still do not panic.
    #[test]
    fn cookie_rejects_changed_cookie(pos in 0usize..32, xor in 1u8..=255, t in tenant()) {
        let auth = &auths()[1];
        let mut buf = [0u8; 1200];
        let n = wire::encode_request(auth, &t, [0; 12], &mut buf, 60, &[], &[], "").unwrap();
        buf[44 + pos] ^= xor;
        prop_assert_eq!(wire::open(auth, &mut buf[..n]).err(), Some(DropReason::CookieMismatch));
    }

    #[test]
    fn labels_round_trip(label in "\\PC{0,300}") {
        let mut buf = vec![0u8; 2048];
        let n = wire::encode_label_tlv(&mut buf, &label).unwrap();
        prop_assert_eq!(Some(n), wire::label_tlv_len(label.len()));
        prop_assert_eq!(n % 4, 0);
        if label.is_empty() {
            prop_assert_eq!(n, 0);
        } else {
            prop_assert_eq!(wire::decode_label_tlv(&buf[..n]), Ok(label.as_str()));
        }
    }

    #[test]
    fn keys_round_trip(
        mode in 0usize..3,
        key_id in any::<u64>(),
        secret in any::<[u8; 32]>(),
        word in any::<u32>(),
        upper in any::<bool>(),
    ) {
        let (mode, hrp) = [(AuthMode::None, "rl-none"), (AuthMode::Cookie, "rl-cookie"), (AuthMode::Aes, "rl-aes")][mode];
        let mut payload = vec![1u8];
        payload.extend_from_slice(&key_id.to_le_bytes());
        if mode != AuthMode::None {
            payload.extend_from_slice(&secret);
        }
        payload.extend_from_slice(&word.to_le_bytes());
        let mut text = bech32::encode::<bech32::Bech32>(bech32::Hrp::parse(hrp).unwrap(), &payload).unwrap();
        if upper {
            text = text.to_ascii_uppercase();
        }
        let parsed = text.parse::<ApiKey>();
        match Quotas::from_word(word) {
            Ok(q) => {
                let k = parsed.unwrap();
                prop_assert_eq!(k.mode(), mode);
                prop_assert_eq!(k.key_id(), key_id);
                prop_assert_eq!(k.quotas(), &q);
                prop_assert_eq!(k.secret(), &if mode == AuthMode::None { [0; 32] } else { secret });
                let dbg = format!("{k:?}{k}");
                prop_assert!(!dbg.contains(&text));
                let secret_dbg = format!("{secret:?}");
                prop_assert!(!dbg.contains(&secret_dbg));
                prop_assert!(!dbg.contains(&hex::encode(secret)));
            }
            Err(e) => prop_assert_eq!(parsed.err(), Some(e)),
        }
        // Bech32m is not accepted.
        let m = bech32::encode::<bech32::Bech32m>(bech32::Hrp::parse(hrp).unwrap(), &payload).unwrap();
        prop_assert_eq!(m.parse::<ApiKey>().err(), Some(KeyError::BadChecksum));
    }
}

// Parsers reached with well-framed input, so that views are built and every accessor runs
// (random bytes rarely pass the header checks), plus the helpers that own one rule each.
proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Request, response and report PDUs with right type, small counts, random blocks and
    /// a size near the bytes present: never a panic; an accepted view's counts match.
    #[test]
    fn framed_pdus_never_panic(
        ty in prop_oneof![Just(0x5452u16), Just(0x5252u16), Just(0x524Cu16), any::<u16>()],
        g in prop_oneof![0u16..4, any::<u16>()],
        r in prop_oneof![0u16..4, any::<u16>()],
        rest in proptest::collection::vec(any::<u8>(), 0..400),
        size_delta in prop_oneof![Just(0i32), -8i32..8, any::<i32>()],
        label in proptest::option::of("\\PC{0,20}"),
    ) {
        let mut body = rest;
        if let Some(label) = label {
            // a label TLV after the blocks the counts declare, when they fit
            let blocks = usize::from(g) * 36 + usize::from(r) * 28;
            if blocks <= body.len() {
                body.truncate(blocks);
                let mut tlv = vec![0u8; wire::label_tlv_len(label.len()).unwrap()];
                wire::encode_label_tlv(&mut tlv, &label).unwrap();
                body.extend_from_slice(&tlv);
            }
        }
        let pdu = framed_pdu(ty, g, r, &body, size_delta);
        decode_everything(&pdu);
        if let Ok(v) = RateRequestView::parse(&pdu) {
            prop_assert_eq!(v.guard_count(), usize::from(g));
            prop_assert_eq!(v.resource_count(), usize::from(r));
        }
        if let Ok(v) = RateResponseView::parse(&pdu) {
            prop_assert_eq!(v.guard_count(), usize::from(g));
            prop_assert_eq!(v.resource_count(), usize::from(r));
        }
        if let Ok(v) = ReportView::parse(&pdu) {
            prop_assert_eq!(v.len(), usize::from(g));
        }
    }

    /// Tenant TLVs of any declared size: accepted exactly when 40 <= size <= length.
    #[test]
    fn tenant_views_never_panic(
        size in prop_oneof![Just(40u16), 0u16..100, any::<u16>()],
        rest in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut d = vec![0x52, 0x4C];
        d.extend_from_slice(&size.to_le_bytes());
        d.extend_from_slice(&rest);
        let ok = d.len() >= 40 && usize::from(size) >= 40 && usize::from(size) <= d.len();
        match TenantView::parse(&d) {
            Ok(t) => {
                prop_assert!(ok);
                touch_tenant(&t);
                prop_assert_eq!(t.size(), usize::from(size));
            }
            Err(_) => prop_assert!(!ok),
        }
    }

    /// Label TLVs with the right type and size but any length field, padding and bytes.
    #[test]
    fn framed_label_tlvs_never_panic(
        len in prop_oneof![0u16..64, any::<u16>()],
        rest in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let mut tlv = vec![0x4D, 0x4C, 0, 0];
        tlv.extend_from_slice(&len.to_le_bytes());
        tlv.extend_from_slice(&rest);
        let n = tlv.len() as u16;
        tlv[2..4].copy_from_slice(&n.to_le_bytes());
        if let Ok(label) = wire::decode_label_tlv(&tlv) {
            prop_assert_eq!(label.len(), usize::from(len));
            prop_assert_eq!(tlv.len() % 4, 0);
        }
    }

    /// The quota word parser: any u32 decodes exactly when its exponents and dedup code
    /// are in range, to the values of docs/protocol.md §6.
    #[test]
    fn quota_words_decode_by_the_rules(word in any::<u32>()) {
        let field = |shift: u32, width: u32| (word >> shift) & ((1 << width) - 1);
        let (r, l, d, w) = (field(0, 5), field(5, 5), field(19, 8), field(27, 5));
        match Quotas::from_word(word) {
            Ok(q) => {
                prop_assert!(r <= 24 && l <= 24 && (1..=200).contains(&d));
                prop_assert_eq!(q.rate_buckets_max, 1u64 << r);
                prop_assert_eq!(q.latency_services_max, 1u64 << l);
                prop_assert_eq!(q.metrics_labels_max, 1u64 << field(10, 5));
                prop_assert_eq!(q.latency_buffer_size_max, 1u64 << field(15, 4));
                prop_assert_eq!(q.dedup_ttl_ms_max, 10 * d);
                prop_assert_eq!(q.rate_window_size_ms_max, if w == 31 { u32::MAX } else { 1 << w });
            }
            Err(KeyError::ReservedRateExponent) => prop_assert!(r > 24),
            Err(KeyError::ReservedLatencyExponent) => prop_assert!(r <= 24 && l > 24),
            Err(KeyError::BadDedupCode) => prop_assert!(r <= 24 && l <= 24 && !(1..=200).contains(&d)),
            Err(e) => prop_assert!(false, "unexpected {:?}", e),
        }
    }

    /// The one tenant / unique id / nonce setup of datagrams we send.
    #[test]
    fn request_tenants_are_shaped(
        key_id in any::<u64>(),
        random in any::<[u8; 28]>(),
        wall_ms in any::<u64>(),
    ) {
        let (t, nonce) = wire::request_tenant(key_id, &random, wall_ms);
        prop_assert_eq!((t.id, t.timestamp_ms, t.steering), (key_id, wall_ms, 0));
        prop_assert_eq!(&nonce[..], &random[16..]);
        prop_assert_eq!(t.unique_id[6] >> 4, 4);
        prop_assert_eq!(t.unique_id[8] >> 6, 2);
        for i in (0..16).filter(|&i| i != 6 && i != 8) {
            prop_assert_eq!(t.unique_id[i], random[i]);
        }
        prop_assert_eq!(t.unique_id[6] & 0x0F, random[6] & 0x0F);
        prop_assert_eq!(t.unique_id[8] & 0x3F, random[8] & 0x3F);
        prop_assert_eq!(wire::unique_id_and_nonce(&random), (t.unique_id, nonce));
    }

    /// A response view becomes a `Response` with the same results, in the server's order,
    /// and the view's decision.
    #[test]
    fn responses_from_views_keep_results_and_decision(
        server_id in any::<u64>(),
        steering in any::<u8>(),
        round in any::<u16>(),
        guards in proptest::collection::vec(guard(), 0..5),
        resources in proptest::collection::vec(
            (any::<[u8; 16]>(), any::<u32>(), any::<u32>(), prop_oneof![Just(0u16), any::<u16>()]),
            0..5,
        ),
    ) {
        let resources: Vec<ResourceResultSpec> = resources
            .into_iter()
            .map(|(id, w, a, d)| ResourceResultSpec { bucket_id: id, window_ms: w, actual_rate: a, deficit: d })
            .collect();
        let mut buf = [0u8; 1200];
        let n = wire::encode_rate_response_pdu(&mut buf, &guards, &resources).unwrap();
        let v = RateResponseView::parse(&buf[..n]).unwrap();
        let resp = Response::from_view(server_id, steering, Phase::Round(round), &v);
        prop_assert_eq!(resp.server_id, Some(server_id));
        prop_assert_eq!(resp.steering_keep, steering != 0);
        prop_assert_eq!(resp.phase, Phase::Round(round));
        prop_assert_eq!((resp.sends, resp.completion_sends), (0, 0));
        prop_assert_eq!(resp.is_granted(), v.is_grant());
        prop_assert_eq!(resp.decision == Decision::Granted, v.is_grant());
        prop_assert_eq!(resp.guards.len(), guards.len());
        for (got, want) in resp.guards.iter().zip(&guards) {
            prop_assert_eq!(got.tracker_id, want.tracker_id);
            prop_assert_eq!((got.threshold_ms, got.current_latency_ms), (want.threshold_ms, want.current_latency_ms));
            prop_assert_eq!(got.passed, want.current_latency_ms < want.threshold_ms);
        }
        prop_assert_eq!(resp.resources.len(), resources.len());
        for (got, want) in resp.resources.iter().zip(&resources) {
            prop_assert_eq!((got.bucket_id, got.actual_rate, got.deficit), (want.bucket_id, want.actual_rate, want.deficit));
        }
    }
}

// ---- one test per drop rule of `open` and the PDU views ----

fn sealed(mode: usize, pdu: &[u8]) -> Vec<u8> {
    let auth = &auths()[mode];
    let p = auth.pdu_offset();
    let mut buf = [0u8; 1200];
    buf[p..p + pdu.len()].copy_from_slice(pdu);
    let t = TenantFields {
        id: 9,
        unique_id: [7; 16],
        timestamp_ms: 1,
        steering: 1,
    };
    let n = wire::seal(auth, &t, [3; 12], &mut buf, pdu.len()).unwrap();
    buf[..n].to_vec()
}

fn response_pdu() -> Vec<u8> {
    let mut b = [0u8; 64];
    let r = ResourceResultSpec {
        bucket_id: [1; 16],
        window_ms: 1000,
        actual_rate: 1,
        deficit: 0,
    };
    let n = wire::encode_rate_response_pdu(&mut b, &[], &[r]).unwrap();
    b[..n].to_vec()
}

fn open_err(mode: usize, d: &[u8]) -> Option<DropReason> {
    let mut d = d.to_vec();
    wire::open(&auths()[mode], &mut d).err()
}

#[test]
fn open_drop_rules() {
    let pdu = response_pdu();
    for mode in 0..3 {
        let good = sealed(mode, &pdu);
        assert!(open_err(mode, &good).is_none());
        // Truncated inside the tenant TLV and inside the auth TLV.
        assert_eq!(open_err(mode, &good[..39]), Some(DropReason::Truncated));
        assert_eq!(open_err(mode, &good[..42]), Some(DropReason::Truncated));
        // Too long.
        let mut long = good.clone();
        long.resize(1201, 0);
        assert_eq!(open_err(mode, &long), Some(DropReason::TooLong));
        // Tenant type and size.
        let mut d = good.clone();
        d[0] = 0x4C;
        assert_eq!(open_err(mode, &d), Some(DropReason::BadTenantType));
        let mut d = good.clone();
        d[2] = 39;
        assert_eq!(open_err(mode, &d), Some(DropReason::BadTenantSize));
        let mut d = good.clone();
        d[2..4].copy_from_slice(&2000u16.to_le_bytes());
        assert_eq!(open_err(mode, &d), Some(DropReason::BadTenantSize));
        // Another mode's auth TLV.
        let other = sealed((mode + 1) % 3, &pdu);
        assert_eq!(open_err(mode, &other), Some(DropReason::WrongAuthMode));
        // Auth size off by 4, and the TLV cut short.
        let mut d = good.clone();
        d[42] = d[42].wrapping_add(4);
        assert_eq!(open_err(mode, &d), Some(DropReason::BadAuthSize));
        if mode != 0 {
            assert_eq!(open_err(mode, &good[..50]), Some(DropReason::BadAuthSize));
        }
    }
    // Cookie mismatch, GCM failure, empty ciphertext.
    let mut d = sealed(1, &pdu);
    d[75] ^= 1;
    assert_eq!(open_err(1, &d), Some(DropReason::CookieMismatch));
    let mut d = sealed(2, &pdu);
    d[72] ^= 1;
    assert_eq!(open_err(2, &d), Some(DropReason::AuthFailed));
    let d = sealed(2, &pdu);
    assert_eq!(open_err(2, &d[..72]), Some(DropReason::EmptyCiphertext));
}

#[test]
fn pdu_drop_rules() {
    let pdu = response_pdu();
    assert!(RateResponseView::parse(&pdu).is_ok());
    assert_eq!(
        RateResponseView::parse(&pdu[..7]).err(),
        Some(DropReason::Truncated)
    );
    assert_eq!(
        RateRequestView::parse(&pdu).err(),
        Some(DropReason::BadPduType)
    );
    assert_eq!(ReportView::parse(&pdu).err(), Some(DropReason::BadPduType));
    // Size beyond the bytes present; size below header + 4.
    assert_eq!(
        RateResponseView::parse(&pdu[..pdu.len() - 1]).err(),
        Some(DropReason::BadPduSize)
    );
    let mut d = pdu.clone();
    d[2] = 11;
    assert_eq!(
        RateResponseView::parse(&d).err(),
        Some(DropReason::BadPduSize)
    );
    // Declared blocks missing: R = 2 with one block present (size shrunk to the bytes).
    let mut d = pdu.clone();
    d[10] = 2;
    assert_eq!(
        RateResponseView::parse(&d).err(),
        Some(DropReason::MissingBlocks)
    );
    // Bytes after the PDU size are ignored.
    let mut d = pdu.clone();
    d.extend_from_slice(&[0xEE; 5]);
    assert!(RateResponseView::parse(&d).is_ok());

    // Request labels: must be one well-formed TLV ending the body.
    let mut b = [0u8; 200];
    let n = wire::encode_rate_request_pdu(&mut b, 60, &[], &[], "api").unwrap();
    assert!(RateRequestView::parse(&b[..n]).is_ok());
    let bad = |f: &dyn Fn(&mut Vec<u8>)| {
        let mut d = b[..n].to_vec();
        f(&mut d);
        RateRequestView::parse(&d).err()
    };
    // Padding not zero.
    assert_eq!(bad(&|d| d[n - 1] = 1), Some(DropReason::BadLabel));
    // Label length longer than the TLV.
    assert_eq!(bad(&|d| d[16] = 9), Some(DropReason::BadLabel));
    // Invalid UTF-8.
    assert_eq!(bad(&|d| d[18] = 0xFF), Some(DropReason::BadLabel));
    // Trailing bytes after the label TLV inside the body.
    assert_eq!(
        bad(&|d| {
            d.extend_from_slice(&[0; 4]);
            let size = d.len() as u16;
            d[2..4].copy_from_slice(&size.to_le_bytes());
        }),
        Some(DropReason::BadLabel)
    );
    // Report with missing entries.
    let mut r = [0u8; 100];
    let e = ReportEntry {
        tracker_id: [2; 16],
        ttl_ms: 1,
        max_samples: 1,
        min_samples: 1,
        observed_ms: 5,
    };
    let n = wire::encode_report_pdu(&mut r, &[e]).unwrap();
    r[8] = 2;
    assert_eq!(
        ReportView::parse(&r[..n]).err(),
        Some(DropReason::MissingBlocks)
    );
}

/// A response whose tenant TLV declares 48 bytes: the auth TLV is found at offset 48 and,
/// in aes mode, the AAD covers bytes 0..48+16.
#[test]
fn larger_tenant_tlv_is_accepted() {
    use aes_gcm::aead::AeadInPlace;
    use aes_gcm::{Aes256Gcm, KeyInit, Nonce};
    let pdu = response_pdu();
    for (mode, text) in KEYS.iter().enumerate() {
        let key: ApiKey = text.parse().unwrap();
        let std = sealed(mode, &pdu);
        let mut d = std[..40].to_vec();
        d[2] = 48;
        d.extend_from_slice(&[0xAB; 8]);
        d.extend_from_slice(&std[40..]);
        if mode == 2 {
            // Re-encrypt with the extended AAD.
            let cipher = Aes256Gcm::new(key.secret().into());
            let mut body = pdu.clone();
            let (head, _) = d.split_at(48 + 16);
            let tag = cipher
                .encrypt_in_place_detached(Nonce::from_slice(&head[52..64]), head, &mut body)
                .unwrap();
            d[64..80].copy_from_slice(&tag);
            d[80..].copy_from_slice(&body);
        }
        let mut rx = d.clone();
        let o = wire::open(&auths()[mode], &mut rx).unwrap();
        assert_eq!(o.tenant.size(), 48);
        assert_eq!(o.tenant.id(), 9);
        assert_eq!(o.pdu, &pdu[..]);
        assert!(RateResponseView::parse(o.pdu).unwrap().is_grant());
    }
}

#[test]
fn encoder_limits() {
    let auth = &auths()[2];
    let t = TenantFields {
        id: 1,
        unique_id: [0; 16],
        timestamp_ms: 0,
        steering: 0,
    };
    let mut buf = [0u8; 1200];
    // 34 report entries fit cookie and aes datagrams exactly; 35 do not.
    assert_eq!(wire::MAX_REPORT_ENTRIES, 34);
    assert_eq!(wire::max_report_entries(AuthMode::Aes), 34);
    assert_eq!(wire::max_report_entries(AuthMode::Cookie), 34);
    assert_eq!(wire::max_report_entries(AuthMode::None), 35);
    let e = ReportEntry {
        tracker_id: [0; 16],
        ttl_ms: 0,
        max_samples: 0,
        min_samples: 0,
        observed_ms: 0,
    };
    assert!(wire::encode_report(auth, &t, [0; 12], &mut buf, &[e; 34]).is_ok());
    assert_eq!(
        wire::encode_report(auth, &t, [0; 12], &mut buf, &[e; 35]),
        Err(EncodeError::TooLarge {
            needed: 72 + 12 + 35 * 32,
            max: 1200
        })
    );
    // Small buffers are refused, not overrun.
    assert_eq!(
        wire::encode_report_pdu(&mut buf[..20], &[e]),
        Err(EncodeError::BufferTooSmall {
            needed: 44,
            available: 20
        })
    );
    assert_eq!(
        wire::seal(auth, &t, [0; 12], &mut buf, 0),
        Err(EncodeError::EmptyPdu)
    );
    assert_eq!(
        wire::seal(auth, &t, [0; 12], &mut buf, 1129),
        Err(EncodeError::TooLarge {
            needed: 1201,
            max: 1200
        })
    );
    assert!(matches!(
        wire::encode_label_tlv(&mut [0u8; 10], &"x".repeat(70_000)),
        Err(EncodeError::LabelTooLong { len: 70_000 })
    ));
    // Unique ids are v4-shaped, and differ.
    let a = wire::new_unique_id().unwrap();
    let b = wire::new_unique_id().unwrap();
    assert_ne!(a, b);
    for id in [a, b] {
        assert_eq!(id[6] & 0xF0, 0x40);
        assert_eq!(id[8] & 0xC0, 0x80);
    }
    assert_ne!(wire::new_nonce().unwrap(), wire::new_nonce().unwrap());
    let (id, nonce) = wire::new_unique_id_and_nonce().unwrap();
    assert_eq!((id[6] & 0xF0, id[8] & 0xC0), (0x40, 0x80));
    assert_ne!(nonce, wire::new_unique_id_and_nonce().unwrap().1);
}

#[test]
fn drop_reasons_are_indexed_and_named() {
    let mut names = std::collections::HashSet::new();
    for (i, r) in DropReason::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
        assert!(names.insert(r.name()), "duplicate name {}", r.name());
        assert!(!r.to_string().is_empty());
    }
}
