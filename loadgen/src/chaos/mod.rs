//! `loadgen --chaos`: the engine, closed loop, against the embedded responders while a
//! seeded schedule of faults ([`schedule`], from `--seed`) runs over the measured window
//! (`--duration`; the warm-up before it, at least [`MIN_WARMUP_S`], runs the fixed
//! [`rehearsal::rehearsal`] so that the window starts from the faults' steady state). The
//! engine discovers the servers
//! through the embedded DNS responder (1 s TTL), so membership changes reach it the way
//! they reach a deployment.
//!
//! Fault kinds, and what the engine does on each (docs/protocol.md; H = the horizon,
//! U = the unit, the retry interval):
//! - `server_restart`: a server stopped for 0.5–2 s, then restarted on the same address
//!   with the same id and fresh state. Requests keep going to it (it stays in the DNS
//!   zone); while it is down they are answered by the other server, or, when the stopped
//!   one is the oldest, after round 0 by the younger one (an oldest fallback). Requests
//!   it had taken when it stopped are replayed every U and time out at H at worst; once
//!   back, it answers from empty buckets (fresh state is not a fault the client sees).
//! - `steering_storm`: every server steers every 2–8 responses for 1–2 s; the engine
//!   moves the steered flow to a fresh socket (rebind) and loses nothing.
//! - `loss_burst`: 30–70 % of the responses dropped for 1–2 s; the engine replays after
//!   each unit and gives up at H (a timeout, explained by the burst).
//! - `delay_burst`: responses delayed by 2–5 U (+ up to U jitter) for 1–2 s, longer than
//!   the retry interval: the engine replays before the answer arrives, takes the first
//!   answer, drops the late duplicates; answers later than H end as timeouts.
//! - `duplicate_burst`: 30–80 % of the responses sent twice for 1–2 s; the engine
//!   completes each request once and drops the duplicate.
//! - `membership_add`: a new (youngest) server started and published in the DNS zone;
//!   the engine picks it up at its next refresh (TTL 1 s) and sends to it too.
//! - `membership_remove`: that server withdrawn from the zone and stopped 1.5 s later; the
//!   engine drops it at its next refresh; requests sent to it before are answered by the
//!   others (it is never the oldest).
//!
//! The verdict (exit 1 when it fails): submitted = completed; no completion later than
//! its start + H + [`SLACK`]; and every outcome explained by the schedule: grants always,
//! timeouts (and communication failures) only in a second that a fault which can cost a
//! request ([`FaultKind::explains_timeouts`]) overlaps, from its start to its end + H +
//! slack; shutdown failures only after the window; any other outcome (a rejection, a
//! discovery, configuration or overload failure) never. Also measured (bars the summary
//! and the CI test check; not exit conditions): resident memory after the warm-up (at
//! least [`MIN_WARMUP_S`]) and at the end of the window, and open descriptors before the
//! client starts and after it has shut down with every fault undone.
//!
//! Owns the chaos run and its report (`chaos` in the result). Must not touch the
//! responders directly (`control.rs`) or plan (`schedule.rs`, `rehearsal.rs`).

mod control;
mod rehearsal;
pub mod schedule;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cli::ClientKind;
use crate::clients::RunContext;
use crate::output::PhaseResult;
use crate::stats::{KINDS, Kind, Phase};
use control::{Controller, Event, round3};
use schedule::{FAULT_KINDS, FaultKind};

/// Slack over H before a completion counts as late: timer and scheduling delays of a
/// loaded two-core machine, where the engine, the responders and the load share cores.
pub const SLACK: Duration = Duration::from_millis(250);

/// What a chaos run did and its verdict (`chaos` in the result).
#[derive(Clone, Debug)]
pub struct ChaosReport {
    seed: u64,
    /// The warm-up's rehearsal (faults before the window; `at_s` negative).
    warmup_events: Vec<Event>,
    events: Vec<Event>,
    late: u64,
    late_bound_ms: u64,
    max_latency_ms: f64,
    rss_after_warmup_kib: u64,
    rss_end_kib: u64,
    fds: Fds,
    /// Outcomes the schedule explains / does not explain, by kind.
    explained: BTreeMap<&'static str, u64>,
    unexplained: BTreeMap<&'static str, u64>,
    /// Why the run fails (empty: it passes).
    failures: Vec<String>,
}

/// Shortest warm-up of a chaos run (s; a shorter `--warmup` is raised to it): long
/// enough for the whole [`rehearsal::rehearsal`] with the two default servers (both
/// restarted, then a duplicate, a delay and a steering burst) and 1.5 s of load after it.
/// Measured on 60 s soaks: a server restarted under load and then taken through the
/// bursts settles several MiB above its fresh start and stays flat after, so without the
/// rehearsal the memory bar compared the end with a state the window leaves at its first
/// faults (28–34 MiB after warm-up, a 41–42 MiB plateau from the first restart on).
pub const MIN_WARMUP_S: f64 = 7.5;

/// Descriptors around the whole client.
#[derive(Clone, Debug)]
struct Fds {
    start: u64,
    end: u64,
    /// Kinds with more descriptors at the end than at the start (`kind x n`), and fewer.
    opened: Vec<String>,
    closed: Vec<String>,
}

/// What the controller thread measured.
struct Measured {
    /// The warm-up's rehearsal (times since the window start: negative).
    warmup_events: Vec<Event>,
    events: Vec<Event>,
    failures: Vec<String>,
    rss: (u64, u64),
}

/// Resident memory of this process (KiB), from /proc/self/status.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Open descriptors of this process by kind (`socket`, `anon_inode:[eventfd]`, a path),
/// with how many of each; the listing's own descriptor is left out.
fn fd_kinds() -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return kinds;
    };
    for e in dir.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if t.starts_with("/proc/") && t.ends_with("/fd") {
            continue;
        }
        // `socket:[1234]` and `pipe:[1234]` by kind; a restarted server's socket is new
        let kind = match t.split_once(":[") {
            Some((k, _)) if k == "socket" || k == "pipe" => k.to_string(),
            _ => t.into_owned(),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

/// How many descriptors of each kind `a` has beyond `b` (`kind x n`).
fn fd_excess(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Vec<String> {
    a.iter()
        .filter_map(|(k, n)| {
            let extra = n.saturating_sub(b.get(k).copied().unwrap_or(0));
            (extra > 0).then(|| format!("{k} x {extra}"))
        })
        .collect()
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Runs the schedule over the phase it receives; measures memory and descriptors.
fn control(ctx: &RunContext<'_>, cores: &[usize], rx: mpsc::Receiver<Arc<Phase>>) -> Measured {
    let args = ctx.args;
    let unit = Duration::from_millis(u64::from(args.unit_ms));
    let duration = Duration::from_secs_f64(args.duration);
    let plan = schedule::plan(args.seed, duration, unit, ctx.servers.endpoints.len());
    let mut c = Controller::new(ctx.servers, args, cores);
    let Ok(phase) = rx.recv() else {
        return Measured {
            warmup_events: Vec::new(),
            events: Vec::new(),
            failures: vec!["the client did not start".into()],
            rss: (0, 0),
        };
    };
    let warmup = phase.window_start - phase.start;
    let warm_plan = rehearsal::rehearsal(c.base_servers(), warmup, unit);
    c.execute(&warm_plan, phase.start);
    let mut warmup_events = std::mem::take(&mut c.events);
    for e in &mut warmup_events {
        let shift = |t: f64| round3(t - warmup.as_secs_f64());
        e.at_s = shift(e.at_s);
        if let Some(until) = e.details["until_s"].as_f64() {
            e.details.insert("until_s".into(), json!(shift(until)));
        }
    }
    sleep_until(phase.window_start);
    let rss0 = rss_kib();
    c.execute(&plan, phase.window_start);
    // every fault is undone 0.3 s before the window ends
    sleep_until(phase.window_end - Duration::from_millis(100));
    let rss1 = rss_kib();
    let mut events = c.events;
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Measured {
        warmup_events,
        events,
        failures: c.failures,
        rss: (rss0, rss1),
    }
}

/// Runs the engine under the schedule; the result carries the report in `extra.chaos`.
pub fn run(ctx: &RunContext<'_>, responder_cores: &[usize]) -> Result<PhaseResult, String> {
    if !ctx.servers.embedded || ctx.args.client != ClientKind::Engine {
        return Err("--chaos drives the engine client against embedded responders".into());
    }
    crate::stats::set_late_bound(ctx.horizon + SLACK);
    crate::memory::purge_freed_memory();
    // Descriptors around the whole client: before it is built, and once it has shut down
    // (its cores, sockets, runtime and DNS discovery closed and joined) with every fault
    // undone and every added server stopped. While it runs the count moves by design (a
    // DNS refresh's sockets, a stopped or added server), so a sample then is no leak test.
    let fds_start = fd_kinds();
    let (tx, rx) = mpsc::channel();
    let (result, measured) = std::thread::scope(|s| {
        let controller = s.spawn(|| control(ctx, responder_cores, rx));
        let result = crate::phase::run_phase_with(ctx, ClientKind::Engine, move |p| {
            let _ = tx.send(Arc::clone(p));
        });
        (result, controller.join())
    });
    let fds_end = fd_kinds();
    let fds = Fds {
        opened: fd_excess(&fds_end, &fds_start),
        closed: fd_excess(&fds_start, &fds_end),
        start: fds_start.values().sum(),
        end: fds_end.values().sum(),
    };
    let mut result = result?;
    let measured = measured.map_err(|_| "the chaos controller panicked".to_string())?;
    let report = judge(ctx, &result, measured, fds);
    result.extra.chaos = Some(report);
    Ok(result)
}

/// Explaining windows of the schedule, in seconds since the phase start.
fn windows(ctx: &RunContext<'_>, events: &[Event]) -> Vec<(f64, f64)> {
    let after = (ctx.horizon + SLACK).as_secs_f64();
    events
        .iter()
        .filter(|e| e.kind.explains_timeouts())
        .map(|e| {
            let until = e.details["until_s"].as_f64().unwrap_or(e.at_s);
            (ctx.args.warmup + e.at_s, ctx.args.warmup + until + after)
        })
        .collect()
}

/// Sorts every outcome into explained and unexplained.
fn tally(
    ctx: &RunContext<'_>,
    r: &PhaseResult,
    events: &[Event],
) -> [BTreeMap<&'static str, u64>; 2] {
    let wins = windows(ctx, events);
    let window_end = ctx.args.warmup + ctx.args.duration;
    let mut out = [BTreeMap::new(), BTreeMap::new()];
    for (sec, counts) in r.rec.by_second.iter().enumerate() {
        let (lo, hi) = (sec as f64, sec as f64 + 1.0);
        let faulty = wins.iter().any(|(a, b)| *a < hi && *b > lo);
        for k in KINDS {
            let n = counts[k.index()];
            if n == 0 {
                continue;
            }
            let ok = match k {
                Kind::Granted | Kind::Report => true,
                Kind::Timeout | Kind::Communication => faulty,
                Kind::Shutdown => hi > window_end,
                _ => false,
            };
            *out[usize::from(!ok)].entry(k.name()).or_insert(0) += n;
        }
    }
    out
}

fn judge(ctx: &RunContext<'_>, r: &PhaseResult, m: Measured, fds: Fds) -> ChaosReport {
    let all: Vec<Event> = m.warmup_events.iter().chain(&m.events).cloned().collect();
    let [explained, unexplained] = tally(ctx, r, &all);
    let (late, max_ns) = crate::stats::late_completions();
    let mut failures = m.failures;
    if r.submitted != r.completed {
        failures.push(format!(
            "submitted {} != completed {}",
            r.submitted, r.completed
        ));
    }
    if late > 0 {
        failures.push(format!("{late} completions later than H + slack"));
    }
    if !unexplained.is_empty() {
        failures.push(format!(
            "outcomes the schedule cannot explain: {unexplained:?}"
        ));
    }
    ChaosReport {
        seed: ctx.args.seed,
        warmup_events: m.warmup_events,
        events: m.events,
        late,
        late_bound_ms: (ctx.horizon + SLACK).as_millis() as u64,
        max_latency_ms: round3(max_ns as f64 / 1e6),
        rss_after_warmup_kib: m.rss.0,
        rss_end_kib: m.rss.1,
        fds,
        explained,
        unexplained,
        failures,
    }
}

impl ChaosReport {
    /// True when the run passes (exit 0).
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    fn by_kind(&self) -> Vec<(FaultKind, usize)> {
        FAULT_KINDS
            .iter()
            .map(|k| (*k, self.events.iter().filter(|e| e.kind == *k).count()))
            .collect()
    }

    /// The memory bar: end ≤ 1.1 × after warm-up + 4 MiB.
    fn rss_bound_kib(&self) -> u64 {
        self.rss_after_warmup_kib * 11 / 10 + 4096
    }

    pub fn to_json(&self) -> Value {
        let events = |list: &[Event]| -> Vec<Value> {
            list.iter()
                .map(|e| {
                    let mut m = e.details.clone();
                    m.insert("at_s".into(), json!(e.at_s));
                    m.insert("kind".into(), json!(e.kind.name()));
                    Value::Object(m)
                })
                .collect()
        };
        let by_kind: serde_json::Map<String, Value> = self
            .by_kind()
            .into_iter()
            .map(|(k, n)| (k.name().to_string(), json!(n)))
            .collect();
        json!({
            "seed": self.seed,
            "warmup_events": events(&self.warmup_events),
            "events": events(&self.events),
            "events_by_kind": by_kind,
            "late_completions": self.late,
            "late_bound_ms": self.late_bound_ms,
            "slack_ms": SLACK.as_millis() as u64,
            "max_latency_ms": self.max_latency_ms,
            "rss_kib": {
                "after_warmup": self.rss_after_warmup_kib,
                "end": self.rss_end_kib,
                "bound": self.rss_bound_kib(),
            },
            "fds": {
                "start": self.fds.start,
                "end": self.fds.end,
                "opened": self.fds.opened,
                "closed": self.fds.closed,
            },
            "outcomes_explained": self.explained,
            "outcomes_unexplained": self.unexplained,
            "failures": self.failures,
            "passed": self.passed(),
        })
    }

    /// The human summary: what happened and the verdict.
    pub fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        write!(
            out,
            "  chaos (seed {}): {} events:",
            self.seed,
            self.events.len()
        )?;
        for (k, n) in self.by_kind() {
            write!(out, " {}={n}", k.name())?;
        }
        writeln!(
            out,
            "; and in the warm-up a rehearsal of {} events",
            self.warmup_events.len()
        )?;
        writeln!(
            out,
            "  chaos: late completions {} (bound H + {} ms = {} ms; slowest {:.1} ms); outcomes explained {:?}, unexplained {:?}",
            self.late,
            SLACK.as_millis(),
            self.late_bound_ms,
            self.max_latency_ms,
            self.explained,
            self.unexplained
        )?;
        writeln!(
            out,
            "  chaos: RSS {} KiB after warm-up, {} KiB at the end (bound {} KiB{}); fds {} at the start, {} at the end{}",
            self.rss_after_warmup_kib,
            self.rss_end_kib,
            self.rss_bound_kib(),
            if self.rss_end_kib <= self.rss_bound_kib() {
                ", ok"
            } else {
                ", OVER"
            },
            self.fds.start,
            self.fds.end,
            if self.fds.start == self.fds.end {
                " (ok)"
            } else {
                " (CHANGED)"
            }
        )?;
        if !self.fds.opened.is_empty() || !self.fds.closed.is_empty() {
            writeln!(
                out,
                "  chaos: descriptors left open {:?}, closed {:?}",
                self.fds.opened, self.fds.closed
            )?;
        }
        if self.passed() {
            writeln!(out, "  chaos: passed")
        } else {
            writeln!(out, "  chaos: FAILED: {}", self.failures.join("; "))
        }
    }
}
