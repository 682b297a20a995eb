//! `loadgen`: drives our engine, the official `ratelimitly` 0.1.0 client and a raw
//! UDP ceiling against loopback responders (or external servers) with the same
//! workload and core budget, and reports decisions/s, latency percentiles,
//! datagrams and client CPU per decision.
//!
//! Layout: `cli/` (options and their value parsers), `setup.rs` (servers and key),
//! `workload.rs` (what each operation is), `clients/` (the [`clients::Target`]s: engine,
//! official, raw), `phase.rs` (one measured phase), `stats.rs` (recording), `cpu.rs`
//! (thread CPU time, pinning), `chaos/` (the `--chaos` soak), `output.rs`, `extra.rs`,
//! `plot.rs`, `params.rs` and `machine.rs` (results), `health.rs` (whether the figures
//! can be trusted), `memory.rs` (allocator and page settings). This file owns the run:
//! cores, the phases in order, ratios, the output files and the exit status (its tests
//! are `smoke.rs`). The API key string is never printed.

// Every `unsafe` block states why it is sound (a `// SAFETY:` comment); CI's clippy run
// (`-D warnings`) enforces it, as in the engine crate.
#![deny(clippy::undocumented_unsafe_blocks)]

mod chaos;
mod cli;
mod clients;
mod cpu;
mod extra;
mod health;
mod machine;
mod memory;
mod output;
mod params;
mod phase;
mod plot;
mod setup;
mod stats;
mod workload;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;

use cli::{Args, ClientKind};
use clients::RunContext;
use health::Verdict;
use output::PhaseResult;
use workload::Workload;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    memory::settle();
    let args = Args::parse_checked().settled();
    match run(&args) {
        Ok(Verdict::Trusted) => ExitCode::SUCCESS,
        Ok(Verdict::Unbalanced) => {
            eprintln!(
                "loadgen: submitted != completed for at least one client (or --chaos failed)"
            );
            ExitCode::from(1)
        }
        Ok(Verdict::Untrusted(causes)) => {
            for c in causes {
                eprintln!("loadgen: {c}");
            }
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}

/// Client and responder cores: client core 0 and responders on core 1 where the
/// machine has two cores or more (by default not on a client or application core).
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
    let app = app_cores(args, ncores, &client);
    let responders: Vec<usize> = match &args.responder_cores {
        Some(r) => r.0.iter().copied().filter(|c| *c < ncores).collect(),
        None => (0..ncores)
            .filter(|c| !client.contains(c) && !app.contains(c))
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

/// The application's cores (`--app-cores` that exist), else the client cores.
fn app_cores(args: &Args, ncores: usize, client: &[usize]) -> Vec<usize> {
    let app: Vec<usize> = args
        .app_cores
        .as_ref()
        .map(|c| c.0.iter().copied().filter(|c| *c < ncores.max(1)).collect())
        .unwrap_or_default();
    if app.is_empty() { client.to_vec() } else { app }
}

/// The one-line description of the run on stderr.
fn announce(ctx: &RunContext<'_>, responder_cores: &[usize]) {
    let (servers, args) = (ctx.servers, ctx.args);
    eprintln!(
        "loadgen: {} servers{} ({}), key id {} ({:?}), client cores {:?}, application cores {:?}, responder cores {:?}, H = {} ms, {}",
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
        ctx.client_cores,
        ctx.app_cores,
        if servers.embedded {
            responder_cores.to_vec()
        } else {
            vec![]
        },
        ctx.horizon.as_millis(),
        match args.rate {
            Some(r) => format!("open loop {r} req/s"),
            None => format!("closed loop {} in flight", args.in_flight),
        }
    );
}

/// Runs the clients; the verdict says whether their figures can be trusted (every
/// submitted operation completed, decisions were made, few timeouts).
fn run(args: &Args) -> Result<Verdict, String> {
    let started = rl_toolkit::utc::now_text();
    let ncores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let (client_cores, responder_cores) = choose_cores(args, ncores);
    let app_cores = app_cores(args, ncores, &client_cores);
    let policy = args.policy().map_err(|e| format!("policy: {e}"))?;
    let servers = setup::start(args, &responder_cores).map_err(|e| e.to_string())?;
    if let Err(e) = policy.check_key(&servers.key) {
        servers.stop();
        return Err(format!("policy: {e}"));
    }
    let ctx = RunContext {
        args,
        servers: &servers,
        work: Workload::from_args(args),
        client_cores,
        app_cores,
        horizon: policy.horizon(),
    };
    if !args.quiet {
        announce(&ctx, &responder_cores);
    }
    let outcome = run_clients(&ctx, &responder_cores).and_then(|results| {
        let ratios = print_ratios(&results)?;
        let machine = machine::machine_json(ncores, &started, &results);
        write_files(&ctx, &responder_cores, machine, &results, ratios)?;
        Ok(health::verdict(&ctx, &results))
    });
    servers.stop();
    outcome
}

/// Runs every client of the run in order (or the chaos run), printing each summary.
fn run_clients(
    ctx: &RunContext<'_>,
    responder_cores: &[usize],
) -> Result<Vec<PhaseResult>, String> {
    if ctx.args.chaos {
        let r = chaos::run(ctx, responder_cores)?;
        output::print_summary(&mut std::io::stdout().lock(), &r).map_err(|e| e.to_string())?;
        return Ok(vec![r]);
    }
    let kinds: Vec<ClientKind> = if ctx.args.compare {
        vec![ClientKind::Engine, ClientKind::Official, ClientKind::Raw]
    } else {
        vec![ctx.args.client]
    };
    let mut results = Vec::new();
    for kind in kinds {
        match phase::run_phase(ctx, kind) {
            Ok(r) => {
                output::print_summary(&mut std::io::stdout().lock(), &r)
                    .map_err(|e| e.to_string())?;
                results.push(r);
            }
            // alone, the error is the run's (printed once, by main); in --compare the
            // other clients still run
            Err(e) if !ctx.args.compare => return Err(format!("{} client: {e}", kind.name())),
            Err(e) => eprintln!("loadgen: {} client failed: {e}", kind.name()),
        }
    }
    Ok(results)
}

/// Prints the engine's ratios to the other clients; returns them for the JSON report.
fn print_ratios(
    results: &[PhaseResult],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let find = |k: ClientKind| results.iter().find(|r| r.client == k);
    let mut ratios = serde_json::Map::new();
    let Some(e) = find(ClientKind::Engine) else {
        return Ok(ratios);
    };
    let mut stdout = std::io::stdout().lock();
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
    Ok(ratios)
}

/// Writes --json, --hgrm and --svg.
fn write_files(
    ctx: &RunContext<'_>,
    responder_cores: &[usize],
    machine: serde_json::Value,
    results: &[PhaseResult],
    ratios: serde_json::Map<String, serde_json::Value>,
) -> Result<(), String> {
    let args = ctx.args;
    if let Some(path) = &args.json {
        let doc = json!({
            "machine": machine,
            "parameters": params::params_json(ctx, responder_cores),
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
        for r in results {
            let p = if results.len() > 1 {
                suffixed(path, r.client.name())
            } else {
                path.clone()
            };
            output::write_hgrm(&p, &r.rec.total).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    if let Some(path) = &args.svg {
        plot::write_svg(path, results).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn suffixed(path: &Path, tag: &str) -> PathBuf {
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let ext = path
        .extension()
        .map(|s| format!(".{}", s.to_string_lossy()));
    path.with_file_name(format!("{stem}-{tag}{}", ext.unwrap_or_default()))
}

#[cfg(test)]
mod smoke;
