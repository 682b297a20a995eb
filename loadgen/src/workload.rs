//! The workload: which buckets, trackers and label each operation uses, and
//! which operations are latency reports. Deterministic in the operation index.
//!
//! Owns naming of the synthetic buckets/trackers. Must not touch sockets.

use crate::cli::Args;

/// Latency-guard threshold used by every guard (high: guards pass on loopback).
pub const GUARD_THRESHOLD_MS: u32 = 1000;
/// Observed latency carried by every latency report.
pub const REPORT_MS: u32 = 5;
/// Tracker definition shared by guards and reports.
pub const TRACKER_TTL_MS: u32 = 10_000;
pub const TRACKER_MAX_SAMPLES: u32 = 100;
pub const TRACKER_MIN_SAMPLES: u32 = 5;

/// Shape of every operation of a run.
#[derive(Clone, Debug)]
pub struct Workload {
    pub buckets: usize,
    pub resources_per_request: usize,
    pub guards: usize,
    pub label: String,
    pub report_share: f64,
    pub window_ms: u32,
    pub rate_limit: u32,
}

impl Workload {
    pub fn from_args(a: &Args) -> Self {
        Workload {
            buckets: a.buckets,
            resources_per_request: a.resources,
            guards: a.guards,
            label: a.label.clone(),
            report_share: a.report_share,
            window_ms: a.window_ms,
            rate_limit: a.rate_limit,
        }
    }

    pub fn bucket_name(i: usize) -> String {
        format!("lg-bucket-{i}")
    }

    pub fn tracker_name(i: usize) -> String {
        format!("lg-tracker-{i}")
    }

    /// Bucket indices of request `j`.
    #[inline]
    pub fn buckets_of(&self, j: u64) -> impl Iterator<Item = usize> + '_ {
        let r = self.resources_per_request;
        let b = self.buckets as u64;
        (0..r).map(move |k| ((j.wrapping_mul(r as u64).wrapping_add(k as u64)) % b) as usize)
    }

    /// True when operation `j` is a latency report rather than a request.
    #[inline]
    pub fn is_report(&self, j: u64) -> bool {
        if self.report_share <= 0.0 {
            return false;
        }
        let s = self.report_share;
        ((j + 1) as f64 * s).floor() > (j as f64 * s).floor()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(share: f64) -> Workload {
        Workload {
            buckets: 10,
            resources_per_request: 2,
            guards: 0,
            label: String::new(),
            report_share: share,
            window_ms: 1000,
            rate_limit: 10,
        }
    }

    #[test]
    fn report_share_is_exact_over_many_ops() {
        let w = w(0.25);
        assert_eq!((0..1000).filter(|j| w.is_report(*j)).count(), 250);
        assert_eq!((0..1000).filter(|j| self::w(0.0).is_report(*j)).count(), 0);
    }

    #[test]
    fn buckets_spread_and_stay_in_range() {
        let w = w(0.0);
        let v: Vec<usize> = w.buckets_of(7).collect();
        assert_eq!(v, vec![4, 5]);
        assert!(
            (0..100)
                .flat_map(|j| w.buckets_of(j).collect::<Vec<_>>())
                .all(|b| b < 10)
        );
    }
}
