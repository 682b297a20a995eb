//! `loadgen`: drives our engine, the official `ratelimitly` 0.1.0 client and a raw
//! UDP ceiling against loopback responders (or external servers) with the same
//! workload and core budget, and reports decisions/s, latency percentiles,
//! datagrams and client CPU per decision.
//!
//! This file owns orchestration (phases, timing, CPU snapshots, progress line,
//! exit status). The API key string is never printed.

mod adapt;
mod cli;
mod driver;
mod engine_client;
mod output;
mod raw;
mod setup;
mod stats;
mod workload;

use std::collections::HashSet;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::json;

use cli::{Args, ClientKind, ScheduleArg};
use output::PhaseResult;
use stats::Phase;
use workload::Workload;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("loadgen: submitted != completed for at least one client");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

/// Client and responder cores: client core 0 and responders on core 1 where the
/// machine has two cores or more.
fn choose_cores(args: &Args, ncores: usize) -> (Vec<usize>, Vec<usize>) {
    let ncores = ncores.max(1);
    let client = args
        .client_cores
        .clone()
        .map_or_else(|| vec![0], |c| c.0)
        .into_iter()
        .filter(|c| *c < ncores)
        .collect::<Vec<_>>();
    let client = if client.is_empty() { vec![0] } else { client };
    let responders: Vec<usize> = match &args.responder_cores {
        Some(r) => r.0.iter().copied().filter(|c| *c < ncores).collect(),
        None => (0..ncores)
            .filter(|c| !client.contains(c))
            .take(1)
            .collect(),
    };
    let responders = if responders.is_empty() {
        vec![ncores - 1]
    } else {
        responders
    };
    (client, responders)
}

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Everything a phase needs.
struct Ctx<'a> {
    args: &'a Args,
    servers: &'a setup::Servers,
    work: Workload,
    client_cores: Vec<usize>,
    horizon: Duration,
}

fn run(args: &Args) -> Result<bool, String> {
    let ncores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (client_cores, responder_cores) = choose_cores(args, ncores);
    let policy = adapt::engine_policy(args).map_err(|e| format!("policy: {e}"))?;
    let horizon = policy.horizon();
    let servers = setup::start(args, &responder_cores).map_err(|e| e.to_string())?;
    policy
        .check_key(&servers.key)
        .map_err(|e| format!("policy: {e}"))?;
    let ctx = Ctx {
        args,
        servers: &servers,
        work: Workload::from_args(args),
        client_cores: client_cores.clone(),
        horizon,
    };
    let kinds: Vec<ClientKind> = if args.compare {
        vec![ClientKind::Engine, ClientKind::Official, ClientKind::Raw]
    } else {
        vec![args.client]
    };
    eprintln!(
        "loadgen: {} servers{} ({}), key id {} ({:?}), client cores {:?}, responder cores {:?}, H = {} ms, {}",
        servers.endpoints.len(),
        if servers.dead.is_empty() {
            ""
        } else {
            ", oldest dead"
        },
        if servers.embedded {
            "embedded"
        } else {
            "external"
        },
        servers.key.key_id(),
        servers.key.mode(),
        client_cores,
        if servers.embedded {
            responder_cores.clone()
        } else {
            vec![]
        },
        horizon.as_millis(),
        match args.rate {
            Some(r) => format!("open loop {r} req/s"),
            None => format!("closed loop {} in flight", args.in_flight),
        }
    );
    let mut results = Vec::new();
    let mut stdout = std::io::stdout().lock();
    for kind in kinds {
        match run_phase(&ctx, kind) {
            Ok(r) => {
                output::print_summary(&mut stdout, &r).map_err(|e| e.to_string())?;
                results.push(r);
            }
            Err(e) => {
                eprintln!("loadgen: {} client failed: {e}", kind.name());
                if !args.compare {
                    servers.stop();
                    return Err(e);
                }
            }
        }
    }
    let find = |k: ClientKind| results.iter().find(|r| r.client == k);
    let mut ratios = serde_json::Map::new();
    if let Some(e) = find(ClientKind::Engine) {
        for (name, other) in [
            ("engine_vs_official", find(ClientKind::Official)),
            ("engine_vs_raw", find(ClientKind::Raw)),
        ] {
            if let Some(o) = other {
                let per_core = output::per_core_ratio(e, o);
                let thr = output::throughput_ratio(e, o);
                ratios.insert(name.into(), json!(per_core));
                ratios.insert(format!("{name}_throughput"), json!(thr));
                writeln!(
                    stdout,
                    "ratio {name}: per fully used client core {}, raw decisions/s {}",
                    output::fmt_opt(per_core, 3),
                    output::fmt_opt(thr, 3)
                )
                .map_err(|e| e.to_string())?;
            }
        }
    }
    drop(stdout);

    if let Some(path) = &args.json {
        let doc = json!({
            "machine": { "cores": ncores, "kernel": kernel() },
            "parameters": params_json(args, &ctx, &responder_cores),
            "results": results.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
            "ratios": ratios,
        });
        std::fs::write(
            path,
            serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?,
        )
        .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.hgrm {
        for r in &results {
            let p = if results.len() > 1 {
                suffixed(path, r.client.name())
            } else {
                path.clone()
            };
            output::write_hgrm(&p, &r.rec.total).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    if let Some(path) = &args.svg {
        output::write_svg(path, &results).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    servers.stop();
    Ok(!results.is_empty() && results.iter().all(|r| r.balanced()))
}

fn suffixed(path: &std::path::Path, tag: &str) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|s| format!(".{}", s.to_string_lossy()))
        .unwrap_or_default();
    path.with_file_name(format!("{stem}-{tag}{ext}"))
}

fn params_json(args: &Args, ctx: &Ctx<'_>, responder_cores: &[usize]) -> serde_json::Value {
    json!({
        "servers": ctx.servers.endpoints.len(),
        "embedded": ctx.servers.embedded,
        "auth": format!("{:?}", ctx.servers.key.mode()),
        "key_id": ctx.servers.key.key_id(),
        "unit_ms": args.unit_ms,
        "replays": args.replays,
        "schedule": args.schedule.to_string(),
        "final_units": args.final_units,
        "completion_delivery": !args.no_completion_delivery,
        "horizon_ms": ctx.horizon.as_millis() as u64,
        "resources": args.resources,
        "guards": args.guards,
        "label": args.label,
        "report_share": args.report_share,
        "buckets": args.buckets,
        "rate_limit": args.rate_limit,
        "window_ms": args.window_ms,
        "loss": args.loss,
        "delay_ms": args.delay_ms,
        "jitter_ms": args.jitter_ms,
        "dead_oldest": args.dead_oldest,
        "client_cores": ctx.client_cores,
        "responder_cores": responder_cores,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "in_flight": args.in_flight,
        "rate": args.rate,
        "batch": args.batch,
        "socket_buffer": args.socket_buffer,
        "raw_sleep": args.raw_sleep,
        "compare": args.compare,
        "client": args.client.name(),
    })
}

/// Live progress on stderr, once per second.
fn progress(
    kind: ClientKind,
    slot: Arc<OnceLock<Arc<Phase>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let tty = std::io::stderr().is_terminal();
        let mut last = (Instant::now(), 0u64);
        let mut printed = false;
        while !stop.load(Ordering::Relaxed) {
            // Sleep ~1 s in small steps so the phase end is not delayed.
            for _ in 0..20 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let Some(p) = slot.get() else { continue };
            let now = Instant::now();
            let done = p.completed.load(Ordering::Relaxed);
            let sub = p.submitted.load(Ordering::Relaxed);
            let dec = p.decided.load(Ordering::Relaxed);
            let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-3);
            last = (now, done);
            let t = now.saturating_duration_since(p.start).as_secs_f64();
            let stage = if now < p.window_start {
                "warm-up"
            } else {
                "measure"
            };
            let line = format!(
                "[{}] {t:5.1}s {stage}  {rate:>10.0} ops/s  in flight {:>6}  decided {dec}  other {}",
                kind.name(),
                sub.saturating_sub(done),
                done - dec
            );
            if tty {
                eprint!("\r{line}\x1b[K");
            } else {
                eprintln!("{line}");
            }
            printed = true;
        }
        if tty && printed {
            eprintln!();
        }
    })
}

fn run_phase(ctx: &Ctx<'_>, kind: ClientKind) -> Result<PhaseResult, String> {
    let args = ctx.args;
    let slot: Arc<OnceLock<Arc<Phase>>> = Arc::new(OnceLock::new());
    let stop = Arc::new(AtomicBool::new(false));
    let prog = (!args.quiet).then(|| progress(kind, Arc::clone(&slot), Arc::clone(&stop)));
    let infra: HashSet<u32> = stats::thread_ids();
    let warmup = Duration::from_secs_f64(args.warmup.max(0.0));
    let duration = Duration::from_secs_f64(args.duration.max(0.1));
    let drain = ctx.horizon + Duration::from_secs(2);
    let (ptx, prx) = mpsc::channel::<Result<Arc<Phase>, String>>();
    let (dtx, drx) = mpsc::channel::<()>();
    let cores = ctx.client_cores.clone();
    let mut raw_threads = Vec::new();
    // Client threads stay alive until the end-of-window CPU snapshot is taken, so a
    // late snapshot never misses the CPU time of threads that already exited.
    let gate = Arc::new(AtomicBool::new(false));

    match kind {
        ClientKind::Engine | ClientKind::Official => {
            let load = match args.rate {
                Some(r) => driver::Load::Open { rate: r },
                None => driver::Load::Closed {
                    in_flight: args.in_flight.max(1),
                },
            };
            let built: Box<dyn FnOnce() -> Result<driver::Target, String> + Send> = match kind {
                ClientKind::Engine => {
                    let t = adapt::EngineTarget::build(ctx.servers, args, &ctx.work, &cores)?;
                    Box::new(move || Ok(driver::Target::Engine(t)))
                }
                _ => Box::new(|| Err(String::new())),
            };
            let official = (kind == ClientKind::Official).then(|| {
                (
                    ctx.servers.key_text().to_string(),
                    ctx.servers.domain.clone(),
                    ctx.servers.dns_server,
                    adapt::official_policy(args),
                    ctx.work.clone(),
                )
            });
            let first = cores[0];
            let gate2 = Arc::clone(&gate);
            std::thread::spawn(move || {
                stats::pin(first);
                let rt = match driver::runtime(&cores) {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ptx.send(Err(format!("runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    let target = match official {
                        Some((key, domain, dns, policy, work)) => {
                            match adapt::official_target(&key, &domain, dns, policy, &work).await {
                                Ok(t) => t,
                                Err(e) => {
                                    let _ = ptx.send(Err(e));
                                    return;
                                }
                            }
                        }
                        None => match built() {
                            Ok(t) => t,
                            Err(e) => {
                                let _ = ptx.send(Err(e));
                                return;
                            }
                        },
                    };
                    let target = Arc::new(target);
                    let phase = Phase::new(Instant::now(), warmup, duration);
                    let _ = ptx.send(Ok(Arc::clone(&phase)));
                    driver::drive(Arc::clone(&target), phase, load, drain).await;
                    wait_gate(&gate2);
                    match Arc::try_unwrap(target) {
                        Ok(t) => adapt::shutdown(t),
                        Err(t) => drop(t),
                    }
                });
                rt.shutdown_timeout(Duration::from_secs(2));
                let _ = dtx.send(());
            });
        }
        ClientKind::Raw => {
            let live: Vec<std::net::SocketAddr> = ctx
                .servers
                .endpoints
                .iter()
                .filter(|e| !ctx.servers.dead.contains(&e.server_id))
                .map(|e| e.addr)
                .collect();
            let cfg = Arc::new(
                raw::RawConfig::new(
                    &ctx.servers.key,
                    &ctx.work,
                    live,
                    ctx.horizon,
                    args.batch,
                    args.socket_buffer,
                    !args.raw_sleep,
                )
                .map_err(|e| format!("raw client: {e}"))?,
            );
            let phase = Phase::new(Instant::now(), warmup, duration);
            let n = cores.len();
            for (i, core) in cores.iter().copied().enumerate() {
                let load = match args.rate {
                    Some(r) => raw::RawLoad::Open { rate: r / n as f64 },
                    None => raw::RawLoad::Closed {
                        in_flight: (args.in_flight / n + usize::from(i < args.in_flight % n))
                            .max(1),
                    },
                };
                let (cfg, phase, gate) = (Arc::clone(&cfg), Arc::clone(&phase), Arc::clone(&gate));
                raw_threads.push(std::thread::spawn(move || {
                    stats::pin(core);
                    let r = raw::run_thread(cfg, phase, load, drain);
                    wait_gate(&gate);
                    r
                }));
            }
            let _ = ptx.send(Ok(phase));
            let dtx2 = dtx.clone();
            let handles = std::mem::take(&mut raw_threads);
            std::thread::spawn(move || {
                for h in handles {
                    match h.join() {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => eprintln!("loadgen: raw thread: {e}"),
                        Err(_) => eprintln!("loadgen: raw thread panicked"),
                    }
                }
                let _ = dtx2.send(());
            });
            drop(dtx);
        }
    }

    let phase = match prx.recv_timeout(Duration::from_secs(30)) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => {
            stop.store(true, Ordering::Relaxed);
            gate.store(true, Ordering::Release);
            return Err(e);
        }
        Err(_) => {
            stop.store(true, Ordering::Relaxed);
            gate.store(true, Ordering::Release);
            return Err("client did not start within 30 s".into());
        }
    };
    let _ = slot.set(Arc::clone(&phase));
    sleep_until(phase.window_start);
    let cpu0 = stats::cpu_snapshot(&infra);
    let srv0 = stats::cpu_of(&ctx.servers.server_threads);
    let dg0 = ctx.servers.received_datagrams();
    let t0 = Instant::now();
    sleep_until(phase.window_end);
    let cpu1 = stats::cpu_snapshot(&infra);
    let srv1 = stats::cpu_of(&ctx.servers.server_threads);
    gate.store(true, Ordering::Release);
    let dg1 = ctx.servers.received_datagrams();
    let t1 = Instant::now();
    let threads = cpu1.len();
    let finished = drx.recv_timeout(drain + Duration::from_secs(5)).is_ok();
    stop.store(true, Ordering::Relaxed);
    if let Some(p) = prog {
        let _ = p.join();
    }
    if !finished {
        eprintln!("loadgen: {} client did not finish draining", kind.name());
    }
    let window_s = phase
        .window_end
        .duration_since(phase.window_start)
        .as_secs_f64();
    let _ = (t0, t1);
    Ok(PhaseResult {
        client: kind,
        rec: phase.merged(),
        window_s,
        cpu_ns: stats::cpu_delta(&cpu0, &cpu1),
        server_cpu_ns: srv1.saturating_sub(srv0),
        client_threads: threads,
        submitted: phase.submitted.load(Ordering::Relaxed),
        completed: phase.completed.load(Ordering::Relaxed),
        responder_datagrams: match (dg0, dg1) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        },
        window_first_second: warmup.as_secs() as usize,
        window_seconds: duration.as_secs_f64().ceil() as usize,
    })
}

/// Waits (at most 30 s) until the main thread has taken its end-of-window snapshot.
fn wait_gate(gate: &AtomicBool) {
    let until = Instant::now() + Duration::from_secs(30);
    while !gate.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn sleep_until(t: Instant) {
    let now = Instant::now();
    if t > now {
        std::thread::sleep(t - now);
    }
}

/// Converts the CLI schedule to the engine's.
pub fn engine_schedule(s: ScheduleArg) -> ratelimitly_engine::policy::Schedule {
    use ratelimitly_engine::policy::Schedule;
    match s {
        ScheduleArg::Fixed(b) => Schedule::Fixed(b),
        ScheduleArg::Linear { initial, step, max } => Schedule::Linear { initial, step, max },
        ScheduleArg::Exponential {
            initial,
            factor,
            max,
        } => Schedule::Exponential {
            initial,
            factor,
            max,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_default_to_client_0_responders_1() {
        let a = Args::try_parse_from(["loadgen"]).unwrap();
        assert_eq!(choose_cores(&a, 2), (vec![0], vec![1]));
        assert_eq!(choose_cores(&a, 1), (vec![0], vec![0]));
        let a = Args::try_parse_from(["loadgen", "--client-cores", "0-2"]).unwrap();
        assert_eq!(choose_cores(&a, 8), (vec![0, 1, 2], vec![3]));
    }

    /// End to end on loopback: every client for a fraction of a second, with guards,
    /// a label and latency reports; every submitted operation must complete.
    #[test]
    fn compare_smoke_on_loopback() {
        let dir = std::env::temp_dir().join(format!("loadgen-smoke-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = dir.join("r.json");
        let a = Args::try_parse_from([
            "loadgen",
            "--compare",
            "--duration",
            "0.4",
            "--warmup",
            "0.2",
            "--quiet",
            "--in-flight",
            "8",
            "--guards",
            "1",
            "--label",
            "api",
            "--report-share",
            "0.1",
            "--json",
            json.to_str().unwrap(),
            "--hgrm",
            dir.join("h.hgrm").to_str().unwrap(),
            "--svg",
            dir.join("p.svg").to_str().unwrap(),
        ])
        .unwrap();
        assert_eq!(run(&a), Ok(true));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        let results = doc["results"].as_array().unwrap();
        let names: Vec<&str> = results
            .iter()
            .filter_map(|r| r["client"].as_str())
            .collect();
        assert_eq!(names, ["engine", "official", "raw"]);
        assert!(doc["ratios"]["engine_vs_official"].as_f64().is_some());
        assert!(doc["ratios"]["engine_vs_raw"].as_f64().is_some());
        for r in results {
            assert_eq!(r["balanced"], true);
            assert!(r["decisions"].as_u64().unwrap() > 0, "{}", r["client"]);
        }
        assert!(doc["machine"]["cores"].as_u64().unwrap() >= 1);
        assert!(dir.join("p.svg").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hgrm_suffix() {
        let p = suffixed(std::path::Path::new("/tmp/x.hgrm"), "raw");
        assert_eq!(p, std::path::PathBuf::from("/tmp/x-raw.hgrm"));
    }
}
