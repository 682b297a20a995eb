//! The chaos run: the engine's phase on this thread, the schedule on a controller thread,
//! memory and descriptors sampled around them.
//!
//! Owns the run's order (warm-up rehearsal, window, samples). Must not judge outcomes
//! (`verdict.rs`) or touch responders directly (`control.rs`).

use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde_json::json;

use super::control::{Controller, round3};
use super::measure::{Fds, fd_sample, open_process_wide, rss_floor_kib};
use super::report::ChaosReport;
use super::verdict::{Measured, SLACK, judge};
use super::{rehearsal, schedule};
use crate::cli::ClientKind;
use crate::clients::RunContext;
use crate::output::PhaseResult;
use crate::stats::Phase;

/// Shortest warm-up of a chaos run (s; a shorter `--warmup` is raised to it): long
/// enough for the whole [`rehearsal::rehearsal`] with the two default servers (both
/// restarted, then a duplicate, a delay and a steering burst) and 1.5 s of load after it.
/// Measured on 60 s soaks: a server restarted under load and then taken through the
/// bursts settles several MiB above its fresh start and stays flat after, so without the
/// rehearsal the memory bar compared the end with a state the window leaves at its first
/// faults (28–34 MiB after warm-up, a 41–42 MiB plateau from the first restart on).
pub const MIN_WARMUP_S: f64 = 7.5;

/// How long each memory figure is sampled ([`rss_floor_kib`]).
const RSS_SPAN: Duration = Duration::from_millis(250);

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
    // Both memory figures are floors over the last quarter second before the window and
    // before its end: fault-free stretches (the rehearsal ends 1.5 s before the window;
    // every fault of the window is undone 0.3 s before it ends).
    sleep_until(phase.window_start - RSS_SPAN);
    let rss0 = rss_floor_kib(RSS_SPAN);
    c.execute(&plan, phase.window_start);
    sleep_until(phase.window_end - Duration::from_millis(50) - RSS_SPAN);
    let rss1 = rss_floor_kib(RSS_SPAN);
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
    // What Tokio opens once for the whole process is opened before the first sample.
    open_process_wide();
    let fds_start = fd_sample();
    let (tx, rx) = mpsc::channel();
    let (result, measured) = std::thread::scope(|s| {
        let controller = s.spawn(|| control(ctx, responder_cores, rx));
        let result = crate::phase::run_phase_with(ctx, ClientKind::Engine, move |p| {
            let _ = tx.send(Arc::clone(p));
        });
        (result, controller.join())
    });
    let fds = Fds::between(&fds_start, &fd_sample());
    let mut result = result?;
    let measured = measured.map_err(|_| "the chaos controller panicked".to_string())?;
    let verdict = judge(ctx, &result, &measured);
    let report = ChaosReport::new(ctx, measured, verdict, fds);
    result.extra.chaos = Some(report);
    Ok(result)
}
