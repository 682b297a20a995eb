//! Codec benches: API-key parsing, bucket/tracker id derivation, for each auth mode
//! (none, cookie, aes) request encode + seal and response open + decode, and AES-256-GCM
//! seal / open at our datagram sizes in four implementations (aws-lc-rs, which the engine
//! uses; ring; RustCrypto's aes-gcm; graviola, x86-64 only), and the engine's own seal +
//! open of a PDU.
//!
//! Owns nothing but measurements (sans-IO: no socket, no clock). The keys are the
//! public synthetic fixtures of tests/data/vectors.json (via rl-testkit). Run:
//! `cargo bench --bench codec`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ratelimitly_engine::proto::ids::{bucket_id, tracker_id};
use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::wire::{
    self, Auth, GuardSpec, RateResponseView, ResourceResultSpec, ResourceSpec, TenantFields,
};

const KEYS: [(&str, &str); 3] = [
    ("aes", rl_testkit::keys::AES),
    ("cookie", rl_testkit::keys::COOKIE),
    ("none", rl_testkit::keys::NONE),
];

const SERVER_ID: u64 = 0x1234_5678 << 23;

fn keys(c: &mut Criterion) {
    let mut g = c.benchmark_group("key");
    g.throughput(Throughput::Elements(1));
    for (mode, text) in KEYS {
        g.bench_function(format!("parse_{mode}"), |b| {
            b.iter(|| black_box(black_box(text).parse::<ApiKey>()).is_ok())
        });
    }
    g.finish();
}

fn ids(c: &mut Criterion) {
    let mut g = c.benchmark_group("ids");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bucket_id", |b| {
        b.iter(|| bucket_id(black_box(b"checkout-api"), black_box(1000), black_box(100)))
    });
    g.bench_function("tracker_id", |b| {
        b.iter(|| tracker_id(black_box(b"inventory"), black_box(10_000), 100, 5))
    });
    g.finish();
}

fn resource_spec() -> ResourceSpec {
    ResourceSpec {
        bucket_id: bucket_id(b"checkout-api", 1000, 100),
        window_ms: 1000,
        rate_limit: 100,
        tokens: 1,
    }
}

fn guard_spec() -> GuardSpec {
    GuardSpec {
        tracker_id: tracker_id(b"inventory", 10_000, 100, 5),
        ttl_ms: 10_000,
        max_samples: 100,
        min_samples: 5,
        threshold_ms: 100,
        current_latency_ms: 0,
    }
}

fn tenant(id: u64) -> TenantFields {
    TenantFields {
        id,
        unique_id: [0x42; 16],
        timestamp_ms: 1_750_000_000_000,
        steering: 0,
    }
}

/// One sealed response datagram for `auth` (one guard result, one resource result).
fn response_datagram(auth: &Auth) -> ([u8; wire::MAX_DATAGRAM], usize) {
    let mut out = [0u8; wire::MAX_DATAGRAM];
    let off = auth.pdu_offset();
    let g = GuardSpec {
        current_latency_ms: 12,
        ..guard_spec()
    };
    let r = ResourceResultSpec {
        bucket_id: resource_spec().bucket_id,
        window_ms: 1000,
        actual_rate: 17,
        deficit: 0,
    };
    let n = wire::encode_rate_response_pdu(&mut out[off..], &[g], &[r]).expect("encode response");
    let mut t = tenant(SERVER_ID);
    t.steering = 1;
    let len = wire::seal(auth, &t, [9; 12], &mut out, n).expect("seal response");
    (out, len)
}

fn per_mode(c: &mut Criterion) {
    let resources = [resource_spec()];
    let guards = [guard_spec()];
    for (mode, text) in KEYS {
        let key: ApiKey = text.parse().expect("fixture key");
        let auth = Auth::new(&key);
        let mut g = c.benchmark_group(format!("wire_{mode}"));
        g.throughput(Throughput::Elements(1));
        g.bench_function("encode_seal_request_1r_1g_label", |b| {
            let mut out = [0u8; wire::MAX_DATAGRAM];
            let off = auth.pdu_offset();
            let t = tenant(key.key_id());
            b.iter(|| {
                let n =
                    wire::encode_rate_request_pdu(&mut out[off..], 60, &guards, &resources, "api")
                        .expect("encode");
                black_box(wire::seal(&auth, &t, [7; 12], &mut out, n).expect("seal"))
            })
        });
        let (dg, len) = response_datagram(&auth);
        g.bench_function("open_decode_response_1r_1g", |b| {
            b.iter_batched_ref(
                || dg,
                |buf| {
                    let opened = wire::open(&auth, &mut buf[..len]).expect("open");
                    let v = RateResponseView::parse(opened.pdu).expect("parse");
                    let mut acc = 0u64;
                    for r in v.resources() {
                        acc += u64::from(r.actual_rate());
                    }
                    for gv in v.guards() {
                        acc += u64::from(gv.current_latency_ms());
                    }
                    black_box((v.is_grant(), acc))
                },
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }
    let mut g = c.benchmark_group("rng");
    g.throughput(Throughput::Elements(1));
    g.bench_function("new_unique_id", |b| {
        b.iter(|| black_box(wire::new_unique_id()))
    });
    g.bench_function("new_nonce", |b| b.iter(|| black_box(wire::new_nonce())));
    g.finish();
}

/// AES-256-GCM at PDU sizes of our datagrams (a small response, a typical request, a
/// request with several resources), AAD = tenant TLV + auth TLV head (60 bytes): seal
/// with a detached tag, and verify + decrypt in place.
fn aead(c: &mut Criterion) {
    use aes_gcm::aead::AeadInPlace;
    use aes_gcm::{KeyInit, Nonce};
    let key = [7u8; 32];
    let aad = [1u8; 60];
    let nonce = [9u8; 12];
    let rc = aes_gcm::Aes256Gcm::new((&key).into());
    let rg = ring::aead::LessSafeKey::new(
        ring::aead::UnboundKey::new(&ring::aead::AES_256_GCM, &key).expect("key"),
    );
    let lc = aws_lc_rs::aead::LessSafeKey::new(
        aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, &key).expect("key"),
    );
    #[cfg(target_arch = "x86_64")]
    let gv = graviola::aead::AesGcm::new(&key);
    for len in [40usize, 150, 300] {
        let mut g = c.benchmark_group(format!("aead_{len}B"));
        g.throughput(Throughput::Elements(1));
        let mut buf = vec![3u8; len];
        g.bench_function("seal/aws_lc_rs", |b| {
            b.iter(|| {
                let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce);
                let aad = aws_lc_rs::aead::Aad::from(&aad);
                black_box(
                    lc.seal_in_place_separate_tag(n, aad, &mut buf)
                        .expect("seal"),
                )
            })
        });
        g.bench_function("seal/ring", |b| {
            b.iter(|| {
                let n = ring::aead::Nonce::assume_unique_for_key(nonce);
                let aad = ring::aead::Aad::from(&aad);
                black_box(
                    rg.seal_in_place_separate_tag(n, aad, &mut buf)
                        .expect("seal"),
                )
            })
        });
        #[cfg(target_arch = "x86_64")]
        g.bench_function("seal/graviola", |b| {
            b.iter(|| {
                let mut tag = [0u8; 16];
                gv.encrypt(&nonce, &aad, &mut buf, &mut tag);
                black_box(tag)
            })
        });
        g.bench_function("seal/aes_gcm", |b| {
            b.iter(|| {
                let n = Nonce::from_slice(&nonce);
                black_box(
                    rc.encrypt_in_place_detached(n, &aad, &mut buf)
                        .expect("seal"),
                )
            })
        });
        let plain = vec![3u8; len];
        let mut sealed = plain.clone();
        let tag = rc
            .encrypt_in_place_detached(Nonce::from_slice(&nonce), &aad, &mut sealed)
            .expect("seal");
        let tag: [u8; 16] = tag.into();
        g.bench_function("open/aws_lc_rs", |b| {
            b.iter_batched_ref(
                || sealed.clone(),
                |ct| {
                    let n = aws_lc_rs::aead::Nonce::assume_unique_for_key(nonce);
                    let aad = aws_lc_rs::aead::Aad::from(&aad);
                    black_box(lc.open_in_place_separate_tag(n, aad, &tag, ct).is_ok())
                },
                BatchSize::SmallInput,
            )
        });
        g.bench_function("open/ring", |b| {
            b.iter_batched_ref(
                || sealed.clone(),
                |ct| {
                    let n = ring::aead::Nonce::assume_unique_for_key(nonce);
                    let aad = ring::aead::Aad::from(&aad);
                    let tag = ring::aead::Tag::from(tag);
                    black_box(rg.open_in_place_separate_tag(n, aad, tag, ct, 0..).is_ok())
                },
                BatchSize::SmallInput,
            )
        });
        #[cfg(target_arch = "x86_64")]
        g.bench_function("open/graviola", |b| {
            b.iter_batched_ref(
                || sealed.clone(),
                |ct| black_box(gv.decrypt(&nonce, &aad, ct, &tag).is_ok()),
                BatchSize::SmallInput,
            )
        });
        // The engine's own seal and open of a `len`-byte PDU (tenant and auth TLVs written
        // and checked around it, AES-GCM in place).
        let key: ApiKey = rl_testkit::keys::AES.parse().expect("fixture key");
        let auth = Auth::new(&key);
        let t = tenant(key.key_id());
        let mut dg = [0u8; wire::MAX_DATAGRAM];
        g.bench_function("engine_seal_open", |b| {
            b.iter(|| {
                let n = wire::seal(&auth, &t, nonce, &mut dg, len).expect("seal");
                black_box(wire::open(&auth, &mut dg[..n]).map(|o| o.pdu.len()))
            })
        });
        g.bench_function("open/aes_gcm", |b| {
            b.iter_batched_ref(
                || sealed.clone(),
                |ct| {
                    let n = Nonce::from_slice(&nonce);
                    black_box(
                        rc.decrypt_in_place_detached(n, &aad, ct, (&tag).into())
                            .is_ok(),
                    )
                },
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }
}

criterion_group!(benches, keys, ids, per_mode, aead);
criterion_main!(benches);
