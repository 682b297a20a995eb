//! Measurement: per-thread latency recorders and outcome counters.
//!
//! Owns the HdrHistograms (nanoseconds), the per-second series and the outcome
//! taxonomy shared by every client; thread CPU time and pinning are `cpu.rs`.
//! Must not touch sockets or clients.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// Highest latency a histogram tracks (ns); larger values are clamped.
const MAX_NS: u64 = 120_000_000_000;

/// What one operation ended in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Granted,
    Rejected,
    Timeout,
    Communication,
    Discovery,
    Configuration,
    Overloaded,
    Shutdown,
    /// Official client: protocol or authentication error.
    Protocol,
    /// A latency report was handed to the client (no decision).
    Report,
    /// A latency report failed locally.
    ReportFailed,
}

pub const KINDS: [Kind; 11] = [
    Kind::Granted,
    Kind::Rejected,
    Kind::Timeout,
    Kind::Communication,
    Kind::Discovery,
    Kind::Configuration,
    Kind::Overloaded,
    Kind::Shutdown,
    Kind::Protocol,
    Kind::Report,
    Kind::ReportFailed,
];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Granted => "granted",
            Kind::Rejected => "rejected",
            Kind::Timeout => "timeout",
            Kind::Communication => "communication",
            Kind::Discovery => "discovery",
            Kind::Configuration => "configuration",
            Kind::Overloaded => "overloaded",
            Kind::Shutdown => "shutdown",
            Kind::Protocol => "protocol",
            Kind::Report => "reports",
            Kind::ReportFailed => "reports_failed",
        }
    }
    pub fn index(self) -> usize {
        KINDS.iter().position(|k| *k == self).unwrap_or(0)
    }
    pub fn is_decision(self) -> bool {
        matches!(self, Kind::Granted | Kind::Rejected)
    }
    /// A request that was sent, so its latency is recorded. Latency reports are not
    /// requests; an overloaded request was refused before it was sent (by the client, or
    /// by loadgen's open-loop bound) and only counts in the outcomes: its near-zero
    /// "latency" would otherwise pull the percentiles of a client that sheds load down.
    pub fn has_latency(self) -> bool {
        !matches!(self, Kind::Report | Kind::ReportFailed | Kind::Overloaded)
    }
    /// The kind of a latency report that was (`sent`) or was not accepted.
    pub fn report(sent: bool) -> Kind {
        if sent {
            Kind::Report
        } else {
            Kind::ReportFailed
        }
    }
}

/// One thread's measurements for one phase.
pub struct Recorder {
    /// Latency of requests sent and completed inside the measurement window (decisions
    /// and failures; not reports, not overloaded requests).
    pub total: Histogram<u64>,
    /// Per-second histograms of the measurement window (index = whole seconds since
    /// the window's start; the last one is partial when the window is not a whole number
    /// of seconds).
    pub seconds: Vec<Histogram<u64>>,
    /// Decisions (grants and rejections) per second of the window, indexed as `seconds`:
    /// they sum to the window's decisions.
    pub second_decisions: Vec<u64>,
    /// Outcome counts inside the measurement window.
    pub window_counts: [u64; KINDS.len()],
    /// Outcome counts over the whole phase (warm-up, window, drain).
    pub all_counts: [u64; KINDS.len()],
    /// Request datagrams reported by the client (engine: Response::sends), inside the window.
    pub sends: u64,
    pub sends_known: bool,
    /// Outcome counts of every completion by whole seconds since the phase start
    /// (warm-up, window and drain; `--chaos` tells which faults explain them).
    pub by_second: Vec<[u64; KINDS.len()]>,
}

fn hist(sigfig: u8) -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, sigfig).expect("static histogram bounds")
}

impl Recorder {
    /// A recorder for a phase of `seconds` whole seconds (warm-up, window, drain) whose
    /// window spans `window_seconds` seconds, the last one possibly partial.
    fn new(seconds: usize, window_seconds: usize) -> Self {
        Recorder {
            total: hist(3),
            seconds: (0..window_seconds).map(|_| hist(2)).collect(),
            second_decisions: vec![0; window_seconds],
            window_counts: [0; KINDS.len()],
            all_counts: [0; KINDS.len()],
            sends: 0,
            sends_known: false,
            by_second: vec![[0; KINDS.len()]; seconds],
        }
    }

    pub fn merge(&mut self, other: &Recorder) {
        let _ = self.total.add(&other.total);
        for (a, b) in self.seconds.iter_mut().zip(&other.seconds) {
            let _ = a.add(b);
        }
        for (a, b) in self
            .second_decisions
            .iter_mut()
            .zip(&other.second_decisions)
        {
            *a += b;
        }
        for i in 0..KINDS.len() {
            self.window_counts[i] += other.window_counts[i];
            self.all_counts[i] += other.all_counts[i];
        }
        self.sends += other.sends;
        self.sends_known |= other.sends_known;
        for (a, b) in self.by_second.iter_mut().zip(&other.by_second) {
            for i in 0..KINDS.len() {
                a[i] += b[i];
            }
        }
    }

    pub fn window(&self, k: Kind) -> u64 {
        self.window_counts[k.index()]
    }
    pub fn all(&self, k: Kind) -> u64 {
        self.all_counts[k.index()]
    }
}

/// Timing frame of one phase, shared by its threads.
pub struct Phase {
    pub id: u64,
    pub start: Instant,
    pub window_start: Instant,
    pub window_end: Instant,
    /// Whole seconds of the phase (warm-up, window, drain) its per-second outcome counts
    /// cover.
    pub seconds: usize,
    /// Seconds of the window's series: its length rounded up.
    pub window_seconds: usize,
    pub submitted: AtomicU64,
    pub completed: AtomicU64,
    pub decided: AtomicU64,
    recorders: Mutex<Vec<Arc<Mutex<Recorder>>>>,
}

static PHASE_IDS: AtomicU64 = AtomicU64::new(1);

/// Completions later than this after their start (ns) count as late (`--chaos` sets it;
/// by default nothing is late).
static LATE_BOUND_NS: AtomicU64 = AtomicU64::new(u64::MAX);
/// Completions over [`LATE_BOUND_NS`], and the largest latency seen (ns), every phase.
static LATE: AtomicU64 = AtomicU64::new(0);
static MAX_LATENCY_NS: AtomicU64 = AtomicU64::new(0);

/// Sets the bound past which a completion is late (see [`late_completions`]).
pub fn set_late_bound(bound: Duration) {
    LATE_BOUND_NS.store(bound.as_nanos() as u64, Ordering::Relaxed);
}

/// Completions so far later than the bound of [`set_late_bound`] after their start (or
/// intended start), and the largest latency of any completion (ns), all phases.
pub fn late_completions() -> (u64, u64) {
    (
        LATE.load(Ordering::Relaxed),
        MAX_LATENCY_NS.load(Ordering::Relaxed),
    )
}

thread_local! {
    static LOCAL: RefCell<Option<(u64, Arc<Mutex<Recorder>>)>> = const { RefCell::new(None) };
}

impl Phase {
    pub fn new(start: Instant, warmup: Duration, duration: Duration) -> Arc<Phase> {
        let window_start = start + warmup;
        let window_end = window_start + duration;
        let seconds = (warmup + duration).as_secs() as usize + 8;
        Arc::new(Phase {
            id: PHASE_IDS.fetch_add(1, Ordering::Relaxed),
            start,
            window_start,
            window_end,
            seconds,
            window_seconds: (duration.as_secs_f64().ceil() as usize).max(1),
            submitted: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            decided: AtomicU64::new(0),
            recorders: Mutex::new(Vec::new()),
        })
    }

    /// Counts one submitted operation.
    #[inline]
    pub fn submit(&self) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
    }

    /// Operations submitted and not yet completed.
    pub fn outstanding(&self) -> u64 {
        let done = self.completed.load(Ordering::Relaxed);
        self.submitted.load(Ordering::Relaxed).saturating_sub(done)
    }

    /// Records one completed operation in this thread's recorder.
    /// `intended` is the time the operation should have started (open loop) or
    /// started (closed loop); `sends` the request datagrams when the client knows.
    pub fn record(&self, intended: Instant, done: Instant, kind: Kind, sends: Option<u32>) {
        self.completed.fetch_add(1, Ordering::Relaxed);
        if kind.is_decision() {
            self.decided.fetch_add(1, Ordering::Relaxed);
        }
        if kind.has_latency() {
            let ns = done.saturating_duration_since(intended).as_nanos() as u64;
            MAX_LATENCY_NS.fetch_max(ns, Ordering::Relaxed);
            if ns > LATE_BOUND_NS.load(Ordering::Relaxed) {
                LATE.fetch_add(1, Ordering::Relaxed);
            }
        }
        LOCAL.with(|cell| {
            let mut slot = cell.borrow_mut();
            // This thread's recorder of this phase, borrowed (no reference count per record).
            let rec = match &mut *slot {
                Some((id, rec)) if *id == self.id => rec,
                other => {
                    let rec =
                        Arc::new(Mutex::new(Recorder::new(self.seconds, self.window_seconds)));
                    self.recorders
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Arc::clone(&rec));
                    &mut other.insert((self.id, rec)).1
                }
            };
            let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
            r.all_counts[kind.index()] += 1;
            let sec = done.saturating_duration_since(self.start).as_secs() as usize;
            if let Some(c) = r.by_second.get_mut(sec.min(self.seconds.saturating_sub(1))) {
                c[kind.index()] += 1;
            }
            if done < self.window_start || done >= self.window_end {
                return;
            }
            r.window_counts[kind.index()] += 1;
            if let Some(s) = sends {
                r.sends += u64::from(s);
                r.sends_known = true;
            }
            // the window's second: always within the series (done < window_end)
            let sec = (done.saturating_duration_since(self.window_start).as_secs() as usize)
                .min(self.window_seconds - 1);
            if kind.is_decision() {
                r.second_decisions[sec] += 1;
            }
            if kind.has_latency() {
                let ns =
                    (done.saturating_duration_since(intended).as_nanos() as u64).clamp(1, MAX_NS);
                r.total.saturating_record(ns);
                r.seconds[sec].saturating_record(ns);
            }
        });
    }

    /// Merges every thread's recorder.
    pub fn merged(&self) -> Recorder {
        let mut out = Recorder::new(self.seconds, self.window_seconds);
        for r in self
            .recorders
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            out.merge(&r.lock().unwrap_or_else(|e| e.into_inner()));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_inside_window() {
        let start = Instant::now();
        let p = Phase::new(start, Duration::from_millis(10), Duration::from_millis(100));
        p.submit();
        p.submit();
        p.record(
            start,
            start + Duration::from_millis(1),
            Kind::Granted,
            Some(2),
        );
        p.record(
            start,
            start + Duration::from_millis(20),
            Kind::Timeout,
            Some(3),
        );
        let r = p.merged();
        assert_eq!(r.all(Kind::Granted), 1);
        assert_eq!(r.window(Kind::Granted), 0);
        assert_eq!(r.window(Kind::Timeout), 1);
        assert_eq!(r.total.len(), 1);
        assert_eq!(r.sends, 3);
        assert_eq!(p.completed.load(Ordering::Relaxed), 2);
    }

    /// Seconds count from the window's start: a 2.5 s window after a 0.5 s warm-up has
    /// three points, the last one half a second long, and its decisions sum up.
    #[test]
    fn the_series_starts_at_the_window() {
        let start = Instant::now();
        let p = Phase::new(
            start,
            Duration::from_millis(500),
            Duration::from_millis(2500),
        );
        let at = |ms| start + Duration::from_millis(ms);
        for ms in [100, 499, 500, 1499, 1500, 2999, 2999, 2999, 3000] {
            p.submit();
            p.record(start, at(ms), Kind::Granted, None);
        }
        let r = p.merged();
        // the warm-up's two and the one at the window's end are outside it
        assert_eq!(r.second_decisions, vec![2, 1, 3]);
        assert_eq!(r.seconds.iter().map(|h| h.len()).sum::<u64>(), 6);
        assert_eq!(r.window(Kind::Granted), 6);
    }

    #[test]
    fn overloaded_requests_count_but_have_no_latency() {
        let start = Instant::now();
        let p = Phase::new(start, Duration::ZERO, Duration::from_secs(60));
        let done = start + Duration::from_millis(1);
        for kind in [Kind::Granted, Kind::Overloaded, Kind::Report, Kind::Timeout] {
            p.submit();
            p.record(start, done, kind, None);
        }
        let r = p.merged();
        assert_eq!(r.window(Kind::Overloaded), 1);
        assert_eq!(r.total.len(), 2, "granted and timeout only");
        assert_eq!(p.outstanding(), 0);
    }
}
