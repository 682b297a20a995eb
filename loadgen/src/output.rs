//! Results of a run: the per-client figures, the human summary (stdout), JSON,
//! and the HdrHistogram percentile spectrum (.hgrm); the SVG plot is `plot.rs`.
//!
//! Owns formatting only; takes finished measurements. Must not touch sockets,
//! clients or the API key.

use std::io::Write;
use std::path::Path;

use hdrhistogram::Histogram;
use serde_json::{Value, json};

use crate::cli::ClientKind;
use crate::extra::ClientExtra;
use crate::stats::{KINDS, Kind, Recorder};

/// Everything measured for one client.
pub struct PhaseResult {
    pub client: ClientKind,
    pub rec: Recorder,
    /// Length of the measurement window in seconds.
    pub window_s: f64,
    /// Client threads' CPU time inside the window (ns).
    pub cpu_ns: u64,
    pub client_threads: usize,
    /// Times the client threads were switched onto a CPU inside the window (their context
    /// switches, from schedstat).
    pub client_switches: u64,
    /// Embedded responders' (and DNS responder's) CPU inside the window (ns).
    pub server_cpu_ns: u64,
    pub submitted: u64,
    pub completed: u64,
    /// Datagrams the embedded responders received inside the window.
    pub responder_datagrams: Option<u64>,
    /// Time the host took from this machine's CPUs inside the window (ms, all CPUs):
    /// on a virtual machine, latency spikes line up with it.
    pub host_steal_ms: Option<f64>,
    /// What only some clients report (I/O counters, latency breakdown).
    pub extra: ClientExtra,
}

impl PhaseResult {
    pub fn decisions(&self) -> u64 {
        self.rec.window(Kind::Granted) + self.rec.window(Kind::Rejected)
    }
    pub fn decisions_per_s(&self) -> f64 {
        self.decisions() as f64 / self.window_s.max(1e-9)
    }
    pub fn datagrams_per_decision(&self) -> Option<f64> {
        let d = self.decisions();
        if d == 0 {
            return None;
        }
        match self.responder_datagrams {
            Some(n) => Some(n as f64 / d as f64),
            None if self.rec.sends_known => Some(self.rec.sends as f64 / d as f64),
            None => None,
        }
    }
    pub fn cpu_us_per_decision(&self) -> Option<f64> {
        let d = self.decisions();
        (d > 0).then(|| self.cpu_ns as f64 / 1000.0 / d as f64)
    }
    /// Client cores fully used on average.
    pub fn cores_used(&self) -> f64 {
        self.cpu_ns as f64 / 1e9 / self.window_s.max(1e-9)
    }
    /// Decisions per second per fully used client core.
    pub fn per_core_decisions_per_s(&self) -> Option<f64> {
        (self.cpu_ns > 0).then(|| self.decisions() as f64 / (self.cpu_ns as f64 / 1e9))
    }
    pub fn balanced(&self) -> bool {
        self.submitted == self.completed
    }
    fn us(&self, q: f64) -> f64 {
        if self.rec.total.is_empty() {
            return 0.0;
        }
        self.rec.total.value_at_quantile(q) as f64 / 1000.0
    }
    pub fn percentiles_us(&self) -> [(&'static str, f64); 6] {
        [
            ("p50", self.us(0.50)),
            ("p90", self.us(0.90)),
            ("p99", self.us(0.99)),
            ("p99.9", self.us(0.999)),
            ("p99.99", self.us(0.9999)),
            ("max", self.rec.total.max() as f64 / 1000.0),
        ]
    }

    pub fn to_json(&self) -> Value {
        let mut outcomes = serde_json::Map::new();
        let mut outcomes_all = serde_json::Map::new();
        for k in KINDS {
            outcomes.insert(k.name().into(), json!(self.rec.window(k)));
            outcomes_all.insert(k.name().into(), json!(self.rec.all(k)));
        }
        let mut lat = serde_json::Map::new();
        for (n, v) in self.percentiles_us() {
            lat.insert(n.into(), json!(v));
        }
        lat.insert("mean".into(), json!(self.rec.total.mean() / 1000.0));
        lat.insert("count".into(), json!(self.rec.total.len()));
        let mut v = json!({
            "client": self.client.name(),
            "window_s": self.window_s,
            "decisions": self.decisions(),
            "decisions_per_s": self.decisions_per_s(),
            "latency_us": lat,
            "datagrams_per_decision": self.datagrams_per_decision(),
            "responder_datagrams": self.responder_datagrams,
            "client_cpu_s": self.cpu_ns as f64 / 1e9,
            "client_cpu_us_per_decision": self.cpu_us_per_decision(),
            "client_cores_used": self.cores_used(),
            "client_threads": self.client_threads,
            "client_switches": self.client_switches,
            "client_switches_per_decision": self.client_switches as f64 / self.decisions().max(1) as f64,
            "responder_cores_used": self.server_cpu_ns as f64 / 1e9 / self.window_s.max(1e-9),
            "decisions_per_s_per_core": self.per_core_decisions_per_s(),
            "outcomes_window": outcomes,
            "outcomes_total": outcomes_all,
            "submitted": self.submitted,
            "completed": self.completed,
            "balanced": self.balanced(),
            "host_steal_ms": self.host_steal_ms,
            "series": self.series().iter().map(|s| json!({
                "t_s": s.t_s, "length_s": s.length_s, "decisions": s.decisions,
                "completions": s.completions, "p50_us": s.p50_us, "p99_us": s.p99_us,
                "max_us": s.max_us,
            })).collect::<Vec<_>>(),
        });
        if let Value::Object(m) = &mut v {
            self.extra.add_json(m);
        }
        v
    }

    /// The window second by second, from its start: the last point is shorter when the
    /// window is not a whole number of seconds (its `length_s` says so), and the points'
    /// decisions sum to [`PhaseResult::decisions`].
    pub fn series(&self) -> Vec<SecondPoint> {
        let us = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        self.rec
            .seconds
            .iter()
            .zip(&self.rec.second_decisions)
            .enumerate()
            .map(|(i, (h, decisions))| SecondPoint {
                t_s: i as f64,
                length_s: (self.window_s - i as f64).clamp(0.0, 1.0),
                decisions: *decisions,
                completions: h.len(),
                p50_us: us(h, 0.5),
                p99_us: us(h, 0.99),
                max_us: h.max() as f64 / 1000.0,
            })
            .collect()
    }
}

/// One second of a client's window (`series` in the JSON).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SecondPoint {
    /// Start, in seconds since the window's start.
    pub t_s: f64,
    /// Length: 1 s, less for the last point of a window that is not a whole number of
    /// seconds.
    pub length_s: f64,
    /// Grants and rejections completed in it.
    pub decisions: u64,
    /// Requests with a latency completed in it (sent ones: decisions and failures; not
    /// reports, not overloaded requests).
    pub completions: u64,
    /// Latency of those (0 when there were none).
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl SecondPoint {
    /// Decisions per second over the point's length.
    pub fn decisions_per_s(&self) -> f64 {
        self.decisions as f64 / self.length_s.max(1e-9)
    }
}

/// Human summary of one client.
pub fn print_summary(out: &mut impl Write, r: &PhaseResult) -> std::io::Result<()> {
    writeln!(out, "== {} ==", r.client.name())?;
    writeln!(
        out,
        "  decisions/s {:>12.0}   ({} decisions in {:.2} s)",
        r.decisions_per_s(),
        r.decisions(),
        r.window_s
    )?;
    let p = r.percentiles_us();
    writeln!(
        out,
        "  latency µs  p50 {:.1}  p90 {:.1}  p99 {:.1}  p99.9 {:.1}  p99.99 {:.1}  max {:.1}",
        p[0].1, p[1].1, p[2].1, p[3].1, p[4].1, p[5].1
    )?;
    writeln!(
        out,
        "  datagrams/decision {}   client CPU µs/decision {}   client cores used {:.2} ({} threads)   responder cores used {:.2}",
        fmt_opt(r.datagrams_per_decision(), 2),
        fmt_opt(r.cpu_us_per_decision(), 2),
        r.cores_used(),
        r.client_threads,
        r.server_cpu_ns as f64 / 1e9 / r.window_s.max(1e-9)
    )?;
    if let Some(ms) = r.host_steal_ms.filter(|ms| *ms > 0.0) {
        writeln!(
            out,
            "  host steal {ms:.0} ms in the window (CPU time the host took from this machine)"
        )?;
    }
    write!(out, "  outcomes (window):")?;
    for k in KINDS {
        let n = r.rec.window(k);
        if n > 0 || matches!(k, Kind::Granted | Kind::Rejected | Kind::Timeout) {
            write!(out, " {}={}", k.name(), n)?;
        }
    }
    writeln!(out)?;
    r.extra.print(out)?;
    writeln!(
        out,
        "  submitted {} completed {} {}",
        r.submitted,
        r.completed,
        if r.balanced() { "(ok)" } else { "(MISMATCH)" }
    )
}

pub fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(v) => format!("{v:.prec$}"),
        None => "n/a".into(),
    }
}

/// Ratio of per-core throughput a / b.
pub fn per_core_ratio(a: &PhaseResult, b: &PhaseResult) -> Option<f64> {
    match (a.per_core_decisions_per_s(), b.per_core_decisions_per_s()) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    }
}

/// Ratio of raw throughput a / b.
pub fn throughput_ratio(a: &PhaseResult, b: &PhaseResult) -> Option<f64> {
    let y = b.decisions_per_s();
    (y > 0.0).then(|| a.decisions_per_s() / y)
}

/// HdrHistogram percentile distribution in the .hgrm text format (values in ms).
pub fn write_hgrm(path: &Path, h: &Histogram<u64>) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let scale = 1_000_000.0; // ns -> ms
    writeln!(
        f,
        "{:>12} {:>14} {:>10} {:>14}\n",
        "Value", "Percentile", "TotalCount", "1/(1-Percentile)"
    )?;
    let mut total = 0u64;
    if !h.is_empty() {
        for v in h.iter_quantiles(5) {
            total += v.count_since_last_iteration();
            let q = v.quantile_iterated_to();
            let value = v.value_iterated_to() as f64 / scale;
            if q < 1.0 {
                writeln!(
                    f,
                    "{:>12.3} {:>2.12} {:>10} {:>14.2}",
                    value,
                    q,
                    total,
                    1.0 / (1.0 - q)
                )?;
            } else {
                writeln!(f, "{:>12.3} {:>2.12} {:>10}", value, q, total)?;
            }
        }
    }
    writeln!(
        f,
        "#[Mean    = {:>12.3}, StdDeviation   = {:>12.3}]",
        h.mean() / scale,
        h.stdev() / scale
    )?;
    writeln!(
        f,
        "#[Max     = {:>12.3}, Total count    = {:>12}]",
        h.max() as f64 / scale,
        h.len()
    )?;
    writeln!(
        f,
        "#[Buckets = {:>12}, SubBuckets     = {:>12}]",
        h.buckets(),
        sub_buckets(h.sigfig())
    )?;
    f.flush()
}

/// HdrHistogram's sub-bucket count for a precision (2^ceil(log2(2·10^sigfig))).
fn sub_buckets(sigfig: u8) -> u64 {
    (2 * 10u64.pow(u32::from(sigfig))).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hgrm_has_the_footer_and_monotone_percentiles() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 120_000_000_000, 3).unwrap();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let p = std::env::temp_dir().join(format!("lg-test-{}.hgrm", std::process::id()));
        write_hgrm(&p, &h).unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        let _ = std::fs::remove_file(&p);
        assert!(s.contains("#[Max     ="));
        assert!(s.contains("Total count    =         1000"));
        let qs: Vec<f64> = s
            .lines()
            .skip(2)
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
            .collect();
        assert!(qs.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(*qs.last().unwrap(), 1.0);
    }
}
