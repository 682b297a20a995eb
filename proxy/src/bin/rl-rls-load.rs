//! `rl-rls-load`: a small gRPC load client for `rl-proxy --mode rls` (or any
//! `envoy.service.ratelimit.v3.RateLimitService`), in the manner of `ghz`: keeps
//! `--concurrency` `ShouldRateLimit` calls in flight over `--connections` HTTP/2
//! connections for `--duration` seconds and prints one JSON line.
//!
//! ```text
//! rl-rls-load --target 127.0.0.1:PORT [--domain edge] [--key remote_address]
//!     [--values 1000] [--connections 2] [--concurrency 64] [--duration 5] [--warmup 1]
//!     [--pid PID]
//! ```
//!
//! Each call carries one descriptor `KEY=v<i>`, `i` cycling over `--values` values. With
//! `--pid`, the CPU time of that process over the measured seconds (the sum of its
//! threads' `/proc/PID/task/*/schedstat` run times) is reported per call:
//! `{"calls":N,"decisions_per_s":R,"ok":N,"over_limit":N,"errors":N,"p50_us":X,"p99_us":Y,"cpu_us_per_decision":Z}`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic::transport::Channel;

#[derive(Parser, Debug)]
#[command(name = "rl-rls-load")]
struct Args {
    /// The service: HOST:PORT (h2c).
    #[arg(long)]
    target: String,
    /// The request's domain.
    #[arg(long, default_value = "edge")]
    domain: String,
    /// The descriptor's key.
    #[arg(long, default_value = "remote_address")]
    key: String,
    /// Distinct values cycled through (one bucket each).
    #[arg(long, default_value_t = 1000)]
    values: u32,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    connections: usize,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
    /// Unmeasured seconds first.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// A process whose CPU time per call to report (the service).
    #[arg(long)]
    pid: Option<u32>,
    /// Worker threads of the client's runtime.
    #[arg(long, default_value_t = 1)]
    threads: usize,
}

/// What one worker saw while measuring.
#[derive(Default)]
struct Tally {
    ok: u64,
    over: u64,
    errors: u64,
    latencies_us: Vec<u32>,
}

/// The CPU time of process `pid` so far: its threads' run times.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn request(args: &Args, i: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: args.key.clone(),
                value: format!("v{}", i % args.values.max(1)),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

async fn worker(
    args: Arc<Args>,
    mut client: RateLimitServiceClient<Channel>,
    first: u32,
    measuring: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Tally {
    let mut t = Tally::default();
    let mut i = first;
    while !stop.load(Ordering::Relaxed) {
        let req = request(&args, i);
        i = i.wrapping_add(args.concurrency as u32);
        let start = Instant::now();
        let r = client.should_rate_limit(req).await;
        if !measuring.load(Ordering::Relaxed) {
            continue;
        }
        t.latencies_us
            .push(start.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        match r {
            Ok(a) if a.get_ref().overall_code == Code::OverLimit as i32 => t.over += 1,
            Ok(_) => t.ok += 1,
            Err(_) => t.errors += 1,
        }
    }
    t
}

async fn run(args: Args) -> Result<String, String> {
    let args = Arc::new(args);
    let mut channels = Vec::with_capacity(args.connections.max(1));
    for _ in 0..args.connections.max(1) {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{}", args.target))
            .map_err(|e| format!("bad --target: {e}"))?
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", args.target))?;
        channels.push(ch);
    }
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..args.concurrency.max(1))
        .map(|w| {
            let client = RateLimitServiceClient::new(channels[w % channels.len()].clone());
            tokio::spawn(worker(
                args.clone(),
                client,
                w as u32,
                measuring.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let cpu0 = args.pid.map(cpu_ns);
    let t0 = Instant::now();
    measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
    measuring.store(false, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    let cpu = args
        .pid
        .map(cpu_ns)
        .zip(cpu0)
        .map(|(b, a)| b.saturating_sub(a));
    stop.store(true, Ordering::Relaxed);
    let mut all = Tally::default();
    for t in tasks {
        let t = t.await.map_err(|e| e.to_string())?;
        all.ok += t.ok;
        all.over += t.over;
        all.errors += t.errors;
        all.latencies_us.extend(t.latencies_us);
    }
    all.latencies_us.sort_unstable();
    let pct = |p: f64| {
        let n = all.latencies_us.len();
        if n == 0 {
            return 0;
        }
        all.latencies_us[((n as f64 * p) as usize).min(n - 1)]
    };
    let calls = all.ok + all.over + all.errors;
    let decided = (all.ok + all.over).max(1);
    let cpu_us = cpu.map_or("null".to_owned(), |ns| {
        format!("{:.2}", ns as f64 / 1e3 / decided as f64)
    });
    Ok(format!(
        "{{\"calls\":{calls},\"seconds\":{secs:.3},\"decisions_per_s\":{:.0},\"ok\":{},\"over_limit\":{},\"errors\":{},\"p50_us\":{},\"p99_us\":{},\"cpu_us_per_decision\":{cpu_us}}}",
        (all.ok + all.over) as f64 / secs,
        all.ok,
        all.over,
        all.errors,
        pct(0.5),
        pct(0.99),
    ))
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rl-rls-load: runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(line) => {
            println!("{line}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rl-rls-load: {e}");
            std::process::ExitCode::from(1)
        }
    }
}
