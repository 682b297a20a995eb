//! Test helpers: a minimal client-side request/report builder and response reader on top
//! of the responder's own framing (so these tests do not depend on the engine's codec).
#![allow(dead_code, unused_imports)]

use ratelimitly_engine::proto::key::ApiKey;
use rl_responder::frame::{KeyAuth, Tenant, tenant};

pub use rl_testkit::keys::{AES as AES_KEY, COOKIE as COOKIE_KEY, NONE as NONE_KEY, key};

#[derive(Clone, Copy)]
pub struct G {
    pub tracker: [u8; 16],
    pub ttl: u32,
    pub max: u32,
    pub min: u32,
    pub threshold: u32,
}

#[derive(Clone, Copy)]
pub struct R {
    pub bucket: [u8; 16],
    pub window: u32,
    pub rate: u32,
    pub tokens: u16,
}

pub fn request_pdu(ttl: u32, guards: &[G], res: &[R]) -> Vec<u8> {
    let mut p = vec![0x52, 0x54, 0, 0];
    p.extend_from_slice(&ttl.to_le_bytes());
    p.extend_from_slice(&(guards.len() as u16).to_le_bytes());
    p.extend_from_slice(&(res.len() as u16).to_le_bytes());
    for g in guards {
        p.extend_from_slice(&g.tracker);
        for v in [g.ttl, g.max, g.min, g.threshold, 0] {
            p.extend_from_slice(&v.to_le_bytes());
        }
    }
    for r in res {
        p.extend_from_slice(&r.bucket);
        p.extend_from_slice(&r.window.to_le_bytes());
        p.extend_from_slice(&r.rate.to_le_bytes());
        p.extend_from_slice(&r.tokens.to_le_bytes());
        p.extend_from_slice(&[0, 0]);
    }
    let n = p.len() as u16;
    p[2..4].copy_from_slice(&n.to_le_bytes());
    p
}

pub fn report_pdu(entries: &[(G, u32)]) -> Vec<u8> {
    let mut p = vec![0x4C, 0x52, 0, 0, 0, 0, 0, 0];
    p.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    p.extend_from_slice(&[0, 0]);
    for (g, obs) in entries {
        p.extend_from_slice(&g.tracker);
        for v in [g.ttl, g.max, g.min, *obs] {
            p.extend_from_slice(&v.to_le_bytes());
        }
    }
    let n = p.len() as u16;
    p[2..4].copy_from_slice(&n.to_le_bytes());
    p
}

/// The fixed timestamp of [`datagram`] (sans-IO tests echo it).
pub const FIXED_TS_MS: u64 = 1_767_225_600_000;

/// The wall clock in Unix ms.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Frames `pdu` as a client datagram of `key`, stamped with the fixed [`FIXED_TS_MS`].
pub fn datagram(key: &ApiKey, unique_id: [u8; 16], pdu: &[u8]) -> Vec<u8> {
    datagram_at(key, unique_id, pdu, FIXED_TS_MS)
}

/// Frames `pdu` as a client datagram of `key`, stamped now (what the runner accepts).
pub fn datagram_now(key: &ApiKey, unique_id: [u8; 16], pdu: &[u8]) -> Vec<u8> {
    datagram_at(key, unique_id, pdu, now_ms())
}

/// Frames `pdu` as a client datagram of `key` stamped `timestamp_ms`.
pub fn datagram_at(key: &ApiKey, unique_id: [u8; 16], pdu: &[u8], timestamp_ms: u64) -> Vec<u8> {
    let auth = KeyAuth::new(key);
    let mut out = vec![0u8; 1200];
    let off = auth.pdu_offset();
    out[off..off + pdu.len()].copy_from_slice(pdu);
    let t = Tenant {
        id: key.key_id(),
        unique_id,
        timestamp_ms,
        steering: 0,
    };
    let mut nonce = [0u8; 12];
    nonce[..8]
        .copy_from_slice(&u64::from_le_bytes(unique_id[..8].try_into().unwrap()).to_le_bytes());
    nonce[8] = 0xC1;
    let n = auth.seal(&t, nonce, &mut out, pdu.len()).unwrap();
    out.truncate(n);
    out
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resp {
    pub server_id: u64,
    pub unique_id: [u8; 16],
    pub timestamp_ms: u64,
    pub steering: u8,
    /// (threshold, current)
    pub guards: Vec<(u32, u32)>,
    /// (actual_rate, deficit)
    pub resources: Vec<(u32, u16)>,
}

impl Resp {
    pub fn granted(&self) -> bool {
        self.guards.iter().all(|&(t, c)| c < t) && self.resources.iter().all(|&(_, d)| d == 0)
    }
}

/// Opens and reads a response datagram; None if it does not verify or parse.
pub fn read_response(key: &ApiKey, dg: &[u8]) -> Option<Resp> {
    let auth = KeyAuth::new(key);
    let mut dg = dg.to_vec();
    let (t, off) = tenant(&dg).ok()?;
    let range = auth.open(&mut dg, off).ok()?;
    let p = &dg[range];
    if p.len() < 12 || p[0..2] != [0x52, 0x52] {
        return None;
    }
    let size = u16::from_le_bytes([p[2], p[3]]) as usize;
    if size > p.len() {
        return None;
    }
    let p = &p[..size];
    let g = u16::from_le_bytes([p[8], p[9]]) as usize;
    let r = u16::from_le_bytes([p[10], p[11]]) as usize;
    if p.len() < 12 + 36 * g + 28 * r {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes(p[o..o + 4].try_into().unwrap());
    let guards = (0..g)
        .map(|i| (u32_at(12 + 36 * i + 28), u32_at(12 + 36 * i + 32)))
        .collect();
    let base = 12 + 36 * g;
    let resources = (0..r)
        .map(|i| {
            let o = base + 28 * i;
            (u32_at(o + 20), u16::from_le_bytes([p[o + 24], p[o + 25]]))
        })
        .collect();
    Some(Resp {
        server_id: t.id,
        unique_id: t.unique_id,
        timestamp_ms: t.timestamp_ms,
        steering: t.steering,
        guards,
        resources,
    })
}

pub fn uid(n: u64) -> [u8; 16] {
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&n.to_le_bytes());
    u[6] = (u[6] & 0x0F) | 0x40;
    u[8] = 0x80 | (n >> 56) as u8 & 0x3F;
    u
}
