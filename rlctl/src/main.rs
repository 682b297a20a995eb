//! rlctl — command-line tool for debugging a Ratelimitly deployment (wire v2).
//!
//! Owns: the command-line interface (clap), key loading, validation before any send,
//! output (readable text or one-line JSON) and exit codes. Must not touch: the wire
//! format, request policy rules or selection (they live in the engine crate); requests go
//! through the one function [`driver::request`], reports through [`driver::report`].
//!
//! The API key is read from `RATELIMITLY_API_KEY` or `--key-file PATH`, never from the
//! command line, and is never printed (not even in errors).

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod args;
mod driver;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::{Value, json};

use ratelimitly_engine::discovery::{self, Discovery, DiscoveryError};
use ratelimitly_engine::error::{ConfigError, RequestError};
use ratelimitly_engine::ids::{LatencyTracker, Resource, bucket_id, tracker_id};
use ratelimitly_engine::key::{ApiKey, AuthMode};
use ratelimitly_engine::machine::Endpoint;
use ratelimitly_engine::outcome::{Decision, Failure, FailureCategory, Phase, Response};
use ratelimitly_engine::policy::{PolicyError, RequestPolicy, Schedule};

use args::{KeyLoadError, ResourceArg, TrackerArg, hex16};

/// Exit status: granted / success.
const EXIT_OK: u8 = 0;
/// Exit status: the request was rejected.
const EXIT_REJECTED: u8 = 1;
/// Exit status: usage or configuration error; nothing was sent.
const EXIT_CONFIG: u8 = 2;
/// Exit status: no valid response within the horizon.
const EXIT_TIMEOUT: u8 = 3;
/// Exit status: discovery or communication failure.
const EXIT_COMM: u8 = 4;

const AFTER_HELP: &str = "\
API key:
  Read from the environment variable RATELIMITLY_API_KEY, or from the file given with
  --key-file PATH (surrounding whitespace ignored). Never on the command line; never printed.

Exit status:
  0  success (request: granted)
  1  request rejected (a resource had a deficit or a guard failed)
  2  usage or configuration error (invalid arguments, invalid key, policy over the key's
     limit, ...): nothing was sent
  3  timeout: no valid response within the policy horizon
  4  discovery or communication failure";

/// Command-line tool for debugging a Ratelimitly deployment (wire protocol v2).
#[derive(Parser, Debug)]
#[command(name = "rlctl", version, about, long_about = None, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct KeyOpts {
    /// Read the API key from this file instead of RATELIMITLY_API_KEY.
    #[arg(long, value_name = "PATH")]
    key_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct DnsOpts {
    /// Discovery domain: SRV _ratelimitly._udp.<DOMAIN> is queried. Default: the key's
    /// domain, c-<key id>.p0.ratelimitly.com.
    #[arg(long, value_name = "DOMAIN")]
    domain: Option<String>,
    /// DNS server to query, IP:PORT (IPv6 as [::1]:53). Default: the first nameserver of
    /// /etc/resolv.conf.
    #[arg(long, value_name = "IP:PORT")]
    dns_server: Option<SocketAddr>,
    /// Timeout of each DNS query attempt, in ms (each query is tried twice).
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    dns_timeout_ms: u64,
}

#[derive(Args, Debug)]
struct ServerOpts {
    /// A static server endpoint ID@IP:PORT (IPv6 as ID@[::1]:PORT), bypassing DNS.
    /// Repeatable; ID is the server id (smallest = oldest server).
    #[arg(long, value_name = "ID@IP:PORT", value_parser = args::parse_endpoint,
          conflicts_with_all = ["domain", "dns_server"])]
    endpoint: Vec<Endpoint>,
    #[command(flatten)]
    dns: DnsOpts,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Decode the API key: mode, key id, every quota, default discovery domain.
    #[command(
        after_help = "The key comes from RATELIMITLY_API_KEY or --key-file PATH; its secret is never printed.\n\
                            JSON output: {\"mode\", \"key_id\", \"quotas\": {...}, \"default_domain\"}\n\
                            Exit status: 0 valid key, 2 missing or invalid key."
    )]
    Key {
        #[command(flatten)]
        key: KeyOpts,
        /// Print one JSON object on one line.
        #[arg(long)]
        json: bool,
    },
    /// Print bucket ids and tracker ids (lowercase hex). No key needed.
    #[command(
        after_help = "Names may contain ':' (the numeric fields are taken from the right).\n\
                            Example: rlctl ids --resource checkout:1000:100 --tracker inventory:10000:100:5"
    )]
    Ids {
        /// A rate bucket NAME:WINDOW_MS:RATE (window in ms, rate = tokens per window).
        /// Repeatable.
        #[arg(long, value_name = "NAME:WINDOW_MS:RATE", value_parser = args::parse_resource)]
        resource: Vec<ResourceArg>,
        /// A latency tracker NAME:TTL_MS:MAX:MIN (sample max age in ms, max samples kept,
        /// warm-up sample count). Repeatable.
        #[arg(long, value_name = "NAME:TTL_MS:MAX:MIN", value_parser = args::parse_tracker)]
        tracker: Vec<TrackerArg>,
        /// Print one JSON object on one line.
        #[arg(long)]
        json: bool,
    },
    /// Discover the servers by DNS: SRV targets, server ids, start times, addresses, the
    /// oldest server, TTLs. The key is needed only when --domain is not given.
    #[command(
        after_help = "Targets count only when their first label is s-<server id>; the server id's upper 41 bits\n\
                            are its start time in seconds since 2025-01-01T00:00:00Z; the smallest id is the oldest.\n\
                            JSON output: {\"domain\", \"servers\": [{\"server_id\", \"target\", \"port\", \"addresses\",\n\
                            \"ttl_s\", \"start_time_unix_s\", \"start_time_utc\", \"oldest\"}], \"oldest_server_id\", \"min_ttl_s\", \"error\"}\n\
                            Exit status: 0 found, 2 no key and no --domain, 4 discovery failure."
    )]
    Discover {
        #[command(flatten)]
        key: KeyOpts,
        #[command(flatten)]
        dns: DnsOpts,
        /// Print one JSON object on one line.
        #[arg(long)]
        json: bool,
    },
    /// Send one resource request and print its outcome.
    #[command(after_help = REQUEST_HELP)]
    Request(RequestCmd),
    /// Send latency reports once to every current endpoint (no answer is expected).
    #[command(after_help = "Example: rlctl report --endpoint 7@127.0.0.1:4000 \
                            --tracker db:10000:100:5 --observed 120 --tracker db:10000:100:5 --observed 95\n\
                            JSON output: {\"datagrams\": n, \"endpoints\": n, \"error\": null}\n\
                            Exit status: 0 sent, 2 configuration error, 4 discovery or communication failure.\n\
                            Sent through the engine (reports flushed once all are queued).")]
    Report(ReportCmd),
}

const REQUEST_HELP: &str = "\
Servers: --endpoint (repeatable), else DNS discovery of --domain (or of the key's default
domain) through --dns-server (or /etc/resolv.conf).

Policy: horizon H = U x (B(0) + ... + B(N) + F) ms, sent as the dedup TTL; it must not
exceed the key's dedup_ttl_ms_max. Round 0 goes to every endpoint; the oldest server's
answer wins at once, else the oldest answer seen by the end of round 0; replay rounds
1..=N resend to servers that have not answered; the final phase waits F units; completion
delivery sends the request once more to servers that did not answer.

A request with no --consume and no --guard is granted locally without sending.

JSON output (--json): one object on one line with keys outcome (granted|rejected|failed),
failure (null|configuration|discovery|communication|timeout), server_id, round (0..=N for
a transmission round, N+1 for the final phase, null), latency_us, horizon_ms, sends,
completion_sends, resources [{bucket_id, actual_rate, deficit}], guards [{tracker_id,
threshold_ms, current_latency_ms, passed}], error.

Exit status: 0 granted, 1 rejected, 2 usage/configuration error (nothing sent), 3 timeout,
4 discovery or communication failure.

Sent through the engine (one core, static endpoints or DNS). If the engine cannot start
(sockets, locked memory), the outcome is a communication failure naming the OS error.

Environment: RATELIMITLY_API_KEY (the key, unless --key-file is given).";

#[derive(Args, Debug)]
struct RequestCmd {
    #[command(flatten)]
    key: KeyOpts,
    #[command(flatten)]
    servers: ServerOpts,
    /// Consume TOKENS (default 1, 1..=65535) from the bucket NAME:WINDOW_MS:RATE.
    /// Repeatable; all resources and guards are decided atomically.
    #[arg(long, value_name = "NAME:WINDOW_MS:RATE[:TOKENS]", value_parser = args::parse_consume)]
    consume: Vec<ResourceArg>,
    /// Latency guard: pass only while the tracker NAME:TTL_MS:MAX:MIN's current latency
    /// (p90 of recent reports) is below THRESHOLD_MS. Repeatable.
    #[arg(long, value_name = "NAME:TTL_MS:MAX:MIN:THRESHOLD_MS", value_parser = args::parse_guard)]
    guard: Vec<TrackerArg>,
    /// Metrics label (groups server-side metrics only).
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// Time unit U in ms (>= 1).
    #[arg(long, value_name = "U", default_value_t = 20)]
    unit_ms: u32,
    /// Replay count N (replay rounds after round 0).
    #[arg(long, value_name = "N", default_value_t = 1)]
    replays: u16,
    /// Round lengths B(k) in units: fixed:B | linear:INIT,STEP,MAX | exp:INIT,FACTOR,MAX.
    #[arg(long, value_name = "SCHEDULE", default_value = "fixed:1", value_parser = args::parse_schedule)]
    schedule: Schedule,
    /// Final receive phase F in units (0 removes it).
    #[arg(long = "final", value_name = "F", default_value_t = 1)]
    final_units: u32,
    /// Do not send the completion delivery after a decision.
    #[arg(long)]
    no_completion_delivery: bool,
    /// Print one JSON object on one line (see below).
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ReportCmd {
    #[command(flatten)]
    key: KeyOpts,
    #[command(flatten)]
    servers: ServerOpts,
    /// Tracker NAME:TTL_MS:MAX:MIN of the next --observed value. Repeatable, paired in
    /// order with --observed.
    #[arg(long, value_name = "NAME:TTL_MS:MAX:MIN", value_parser = args::parse_tracker, required = true)]
    tracker: Vec<TrackerArg>,
    /// Observed latency in whole ms, for the --tracker at the same position. Repeatable.
    #[arg(long, value_name = "MS", required = true)]
    observed: Vec<u32>,
    /// Print one JSON object on one line.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let code = match cli.command {
        Command::Key { key, json } => cmd_key(&key, json),
        Command::Ids {
            resource,
            tracker,
            json,
        } => cmd_ids(&resource, &tracker, json),
        Command::Discover { key, dns, json } => cmd_discover(&key, &dns, json),
        Command::Request(r) => cmd_request(&r),
        Command::Report(r) => cmd_report(&r),
    };
    ExitCode::from(code)
}

fn print_json(v: &Value) {
    println!("{v}");
}

fn mode_name(m: AuthMode) -> &'static str {
    match m {
        AuthMode::None => "none",
        AuthMode::Cookie => "cookie",
        AuthMode::Aes => "aes",
    }
}

// ---------------------------------------------------------------- key

fn cmd_key(opts: &KeyOpts, json: bool) -> u8 {
    let key = match args::load_key(opts.key_file.as_deref()) {
        Ok(k) => k,
        Err(e) => return simple_error(json, &e.to_string(), EXIT_CONFIG),
    };
    let q = key.quotas();
    if json {
        print_json(&json!({
            "mode": mode_name(key.mode()),
            "key_id": key.key_id(),
            "quotas": {
                "rate_buckets_max": q.rate_buckets_max,
                "latency_services_max": q.latency_services_max,
                "metrics_labels_max": q.metrics_labels_max,
                "latency_buffer_size_max": q.latency_buffer_size_max,
                "dedup_ttl_ms_max": q.dedup_ttl_ms_max,
                "rate_window_size_ms_max": q.rate_window_size_ms_max,
            },
            "default_domain": key.default_domain(),
        }));
    } else {
        println!("mode:                     {}", mode_name(key.mode()));
        println!("key id:                   {}", key.key_id());
        println!("rate buckets max:         {}", q.rate_buckets_max);
        println!("latency trackers max:     {}", q.latency_services_max);
        println!("metrics labels max:       {}", q.metrics_labels_max);
        println!("latency buffer size max:  {}", q.latency_buffer_size_max);
        println!("dedup TTL max (ms):       {}", q.dedup_ttl_ms_max);
        println!("rate window max (ms):     {}", q.rate_window_size_ms_max);
        println!("default domain:           {}", key.default_domain());
    }
    EXIT_OK
}

/// Prints `{"error": text}` (JSON) or the text on stderr; returns `code`.
fn simple_error(json: bool, text: &str, code: u8) -> u8 {
    if json {
        print_json(&json!({ "error": text }));
    } else {
        eprintln!("rlctl: {text}");
    }
    code
}

// ---------------------------------------------------------------- ids

fn cmd_ids(resources: &[ResourceArg], trackers: &[TrackerArg], json: bool) -> u8 {
    if resources.is_empty() && trackers.is_empty() {
        return simple_error(
            json,
            "give at least one --resource or --tracker",
            EXIT_CONFIG,
        );
    }
    let rs: Vec<Value> = resources
        .iter()
        .map(|r| {
            json!({
                "name": r.name,
                "window_ms": r.window_ms,
                "rate_limit": r.rate_limit,
                "bucket_id": hex16(&bucket_id(r.name.as_bytes(), r.window_ms, r.rate_limit)),
            })
        })
        .collect();
    let ts: Vec<Value> = trackers
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "ttl_ms": t.ttl_ms,
                "max_samples": t.max_samples,
                "min_samples": t.min_samples,
                "tracker_id": hex16(&tracker_id(t.name.as_bytes(), t.ttl_ms, t.max_samples, t.min_samples)),
            })
        })
        .collect();
    if json {
        print_json(&json!({ "resources": rs, "trackers": ts }));
    } else {
        for r in resources {
            println!(
                "resource {}:{}:{}  bucket_id {}",
                r.name,
                r.window_ms,
                r.rate_limit,
                hex16(&bucket_id(r.name.as_bytes(), r.window_ms, r.rate_limit))
            );
        }
        for t in trackers {
            println!(
                "tracker {}:{}:{}:{}  tracker_id {}",
                t.name,
                t.ttl_ms,
                t.max_samples,
                t.min_samples,
                hex16(&tracker_id(
                    t.name.as_bytes(),
                    t.ttl_ms,
                    t.max_samples,
                    t.min_samples
                ))
            );
        }
    }
    EXIT_OK
}

// ---------------------------------------------------------------- discover

/// Why servers could not be determined.
#[derive(Debug)]
enum ServersError {
    /// No --domain and no usable key for the default domain.
    Key(KeyLoadError),
    /// DNS discovery failed.
    Discovery(DiscoveryError),
}

fn discover(dns: &DnsOpts, key: Option<&ApiKey>) -> Result<(String, Discovery), ServersError> {
    let domain = match (&dns.domain, key) {
        (Some(d), _) => d.clone(),
        (None, Some(k)) => k.default_domain(),
        (None, None) => return Err(ServersError::Key(KeyLoadError::Missing)),
    };
    let timeout = Duration::from_millis(dns.dns_timeout_ms.max(1));
    discovery::resolve(&domain, dns.dns_server, timeout)
        .map(|d| (domain, d))
        .map_err(ServersError::Discovery)
}

/// `YYYY-MM-DDTHH:MM:SSZ` of a Unix time (proleptic Gregorian, UTC).
fn utc_text(unix_s: u64) -> String {
    let days = unix_s / 86_400;
    let secs = unix_s % 86_400;
    // Civil-from-days (H. Hinnant), on days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

fn cmd_discover(key_opts: &KeyOpts, dns: &DnsOpts, json: bool) -> u8 {
    let key = if dns.domain.is_none() {
        match args::load_key(key_opts.key_file.as_deref()) {
            Ok(k) => Some(k),
            Err(e) => return simple_error(json, &e.to_string(), EXIT_CONFIG),
        }
    } else {
        None
    };
    let (domain, d) = match discover(dns, key.as_ref()) {
        Ok(x) => x,
        Err(ServersError::Key(e)) => return simple_error(json, &e.to_string(), EXIT_CONFIG),
        Err(ServersError::Discovery(e)) => {
            return simple_error(json, &format!("discovery failed: {e}"), EXIT_COMM);
        }
    };
    let oldest = d.oldest().map(|s| s.server_id);
    if json {
        let servers: Vec<Value> = d
            .servers
            .iter()
            .map(|s| {
                json!({
                    "server_id": s.server_id,
                    "target": s.target,
                    "port": s.port,
                    "addresses": s.addrs.iter().map(|ip| SocketAddr::new(*ip, s.port).to_string()).collect::<Vec<_>>(),
                    "ttl_s": s.ttl_s,
                    "start_time_unix_s": s.start_time_unix_s,
                    "start_time_utc": utc_text(s.start_time_unix_s),
                    "oldest": Some(s.server_id) == oldest,
                })
            })
            .collect();
        print_json(&json!({
            "domain": domain,
            "servers": servers,
            "oldest_server_id": oldest,
            "min_ttl_s": d.min_ttl_s,
            "error": null,
        }));
    } else {
        println!(
            "domain: {domain}  ({} servers, min TTL {} s)",
            d.servers.len(),
            d.min_ttl_s
        );
        for s in &d.servers {
            let addrs: Vec<String> = s
                .addrs
                .iter()
                .map(|ip| SocketAddr::new(*ip, s.port).to_string())
                .collect();
            println!(
                "server {}{}  target {}  started {} (unix {})  ttl {} s  addresses {}",
                s.server_id,
                if Some(s.server_id) == oldest {
                    " (oldest)"
                } else {
                    ""
                },
                s.target,
                utc_text(s.start_time_unix_s),
                s.start_time_unix_s,
                s.ttl_s,
                addrs.join(", ")
            );
        }
    }
    EXIT_OK
}

// ---------------------------------------------------------------- request

/// A failure found before anything was sent, in the request command.
#[derive(Debug)]
enum SetupError {
    /// The key could not be loaded or is invalid.
    Key(KeyLoadError),
    /// The policy is invalid or over the key's limit.
    Policy(PolicyError),
    /// A resource, tracker or request check failed.
    Config(ConfigError),
}

impl std::fmt::Display for SetupError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Key(e) => e.fmt(f),
            Self::Policy(e) => write!(f, "invalid policy: {e}"),
            Self::Config(e) => e.fmt(f),
        }
    }
}

/// Everything validated, ready to send.
struct Prepared {
    key: ApiKey,
    policy: RequestPolicy,
    resources: Vec<(Resource, u16)>,
    guards: Vec<(LatencyTracker, u32)>,
}

fn prepare(r: &RequestCmd) -> Result<Prepared, SetupError> {
    let key = args::load_key(r.key.key_file.as_deref()).map_err(SetupError::Key)?;
    let policy = RequestPolicy::builder()
        .unit(Duration::from_millis(u64::from(r.unit_ms)))
        .replays(r.replays)
        .schedule(r.schedule)
        .final_units(r.final_units)
        .completion_delivery(!r.no_completion_delivery)
        .build()
        .map_err(SetupError::Policy)?;
    policy.check_key(&key).map_err(SetupError::Policy)?;
    let window_max = key.quotas().rate_window_size_ms_max;
    let mut resources = Vec::with_capacity(r.consume.len());
    for c in &r.consume {
        let res = Resource::new(
            c.name.clone(),
            Duration::from_millis(u64::from(c.window_ms)),
            c.rate_limit,
        )
        .map_err(SetupError::Config)?;
        if res.window_ms() > window_max {
            return Err(SetupError::Config(ConfigError::Request(
                RequestError::WindowOverKeyLimit {
                    window_ms: res.window_ms(),
                    limit_ms: window_max,
                },
            )));
        }
        resources.push((res, c.tokens));
    }
    let mut guards = Vec::with_capacity(r.guard.len());
    for g in &r.guard {
        let t = tracker(g).map_err(SetupError::Config)?;
        guards.push((t, g.threshold_ms));
    }
    Ok(Prepared {
        key,
        policy,
        resources,
        guards,
    })
}

fn tracker(t: &TrackerArg) -> Result<LatencyTracker, ConfigError> {
    LatencyTracker::new(
        t.name.clone(),
        Duration::from_millis(u64::from(t.ttl_ms)),
        t.max_samples,
        t.min_samples,
    )
}

/// Endpoints from --endpoint, or from DNS.
fn endpoints_for(servers: &ServerOpts, key: &ApiKey) -> Result<Vec<Endpoint>, DiscoveryError> {
    if !servers.endpoint.is_empty() {
        return Ok(servers.endpoint.clone());
    }
    match discover(&servers.dns, Some(key)) {
        Ok((_, d)) => Ok(discovery::endpoints(&d)),
        Err(ServersError::Discovery(e)) => Err(e),
        Err(ServersError::Key(_)) => Err(DiscoveryError::NoServer),
    }
}

/// The fields of the request's result, ready to print.
struct Report {
    outcome: &'static str,
    failure: Option<&'static str>,
    response: Option<Response>,
    round: Option<u32>,
    latency_us: u64,
    horizon_ms: Option<u32>,
    sends: u32,
    completion_sends: u32,
    error: Option<String>,
    code: u8,
}

impl Report {
    fn failed(category: &'static str, error: String, code: u8, horizon_ms: Option<u32>) -> Self {
        Report {
            outcome: "failed",
            failure: Some(category),
            response: None,
            round: None,
            latency_us: 0,
            horizon_ms,
            sends: 0,
            completion_sends: 0,
            error: Some(error),
            code,
        }
    }

    fn to_json(&self) -> Value {
        let (server_id, resources, guards) = match &self.response {
            Some(r) => (
                r.server_id,
                r.resources
                    .iter()
                    .map(|x| {
                        json!({
                            "bucket_id": hex16(&x.bucket_id),
                            "actual_rate": x.actual_rate,
                            "deficit": x.deficit,
                        })
                    })
                    .collect::<Vec<_>>(),
                r.guards
                    .iter()
                    .map(|g| {
                        json!({
                            "tracker_id": hex16(&g.tracker_id),
                            "threshold_ms": g.threshold_ms,
                            "current_latency_ms": g.current_latency_ms,
                            "passed": g.passed,
                        })
                    })
                    .collect::<Vec<_>>(),
            ),
            None => (None, Vec::new(), Vec::new()),
        };
        json!({
            "outcome": self.outcome,
            "failure": self.failure,
            "server_id": server_id,
            "round": self.round,
            "latency_us": self.latency_us,
            "horizon_ms": self.horizon_ms,
            "sends": self.sends,
            "completion_sends": self.completion_sends,
            "resources": resources,
            "guards": guards,
            "error": self.error,
        })
    }

    fn print_text(&self, names: &[(String, [u8; 16])]) {
        let name_of = |id: &[u8; 16]| {
            names
                .iter()
                .find(|(_, i)| i == id)
                .map_or_else(|| hex16(id), |(n, i)| format!("{n} ({})", hex16(i)))
        };
        let mut line = format!("outcome: {}", self.outcome);
        if let Some(f) = self.failure {
            line.push_str(&format!(" ({f})"));
        }
        if let Some(r) = &self.response {
            match r.server_id {
                Some(id) => line.push_str(&format!("  server {id}")),
                None => line.push_str("  (local: nothing to send)"),
            }
        }
        if let Some(k) = self.round {
            line.push_str(&format!("  round {k}"));
        }
        println!("{line}");
        let horizon = self
            .horizon_ms
            .map_or_else(|| "-".to_owned(), |h| format!("{h} ms"));
        println!(
            "latency: {:.3} ms  horizon: {horizon}  sends: {} (completion: {})",
            self.latency_us as f64 / 1000.0,
            self.sends,
            self.completion_sends
        );
        if let Some(r) = &self.response {
            for x in &r.resources {
                println!(
                    "resource {}: actual_rate {} deficit {}",
                    name_of(&x.bucket_id),
                    x.actual_rate,
                    x.deficit
                );
            }
            for g in &r.guards {
                println!(
                    "guard {}: current latency {} ms, threshold {} ms: {}",
                    name_of(&g.tracker_id),
                    g.current_latency_ms,
                    g.threshold_ms,
                    if g.passed { "passed" } else { "FAILED" }
                );
            }
        }
        if let Some(e) = &self.error {
            println!("error: {e}");
        }
    }
}

fn failure_report(f: &Failure, horizon_ms: u32) -> Report {
    let (cat, code) = match f.category() {
        FailureCategory::Configuration => ("configuration", EXIT_CONFIG),
        FailureCategory::Discovery => ("discovery", EXIT_COMM),
        FailureCategory::Timeout => ("timeout", EXIT_TIMEOUT),
        FailureCategory::Communication
        | FailureCategory::Overloaded
        | FailureCategory::Shutdown => ("communication", EXIT_COMM),
    };
    Report::failed(cat, f.to_string(), code, Some(horizon_ms))
}

fn run_request(r: &RequestCmd) -> Report {
    let p = match prepare(r) {
        Ok(p) => p,
        Err(e) => return Report::failed("configuration", e.to_string(), EXIT_CONFIG, None),
    };
    let horizon_ms = p.policy.horizon_ms();
    let label = r.label.as_deref().unwrap_or("");
    let run = if p.resources.is_empty() && p.guards.is_empty() {
        driver::RequestRun {
            outcome: Ok(Response::local_grant()),
            sends: 0,
            completion_sends: 0,
            latency: Duration::ZERO,
        }
    } else {
        let endpoints = match endpoints_for(&r.servers, &p.key) {
            Ok(e) => e,
            Err(e) => return failure_report(&Failure::Discovery(e), horizon_ms),
        };
        let parts = driver::RequestParts {
            resources: &p.resources,
            guards: &p.guards,
            label,
        };
        driver::request(&p.key, &p.policy, endpoints, &parts)
    };
    let latency_us = u64::try_from(run.latency.as_micros()).unwrap_or(u64::MAX);
    match run.outcome {
        Ok(resp) => {
            let granted = resp.decision == Decision::Granted;
            let round = match resp.phase {
                Phase::Round(k) => Some(u32::from(k)),
                Phase::Final => Some(u32::from(p.policy.replays()) + 1),
                Phase::Local => None,
            };
            Report {
                outcome: if granted { "granted" } else { "rejected" },
                failure: None,
                round,
                latency_us,
                horizon_ms: Some(horizon_ms),
                sends: resp.sends,
                completion_sends: resp.completion_sends,
                error: None,
                code: if granted { EXIT_OK } else { EXIT_REJECTED },
                response: Some(resp),
            }
        }
        Err(f) => {
            let mut rep = failure_report(&f, horizon_ms);
            rep.latency_us = latency_us;
            rep.sends = run.sends;
            rep.completion_sends = run.completion_sends;
            rep
        }
    }
}

fn cmd_request(r: &RequestCmd) -> u8 {
    let rep = run_request(r);
    if r.json {
        print_json(&rep.to_json());
    } else {
        let mut names: Vec<(String, [u8; 16])> = r
            .consume
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    bucket_id(c.name.as_bytes(), c.window_ms, c.rate_limit),
                )
            })
            .collect();
        names.extend(r.guard.iter().map(|g| {
            (
                g.name.clone(),
                tracker_id(g.name.as_bytes(), g.ttl_ms, g.max_samples, g.min_samples),
            )
        }));
        rep.print_text(&names);
    }
    rep.code
}

// ---------------------------------------------------------------- report

fn cmd_report(r: &ReportCmd) -> u8 {
    let (datagrams, endpoints, error, code) = run_report(r);
    if r.json {
        print_json(&json!({ "datagrams": datagrams, "endpoints": endpoints, "error": error }));
    } else if let Some(e) = &error {
        eprintln!("rlctl: {e}");
    } else {
        println!("sent {datagrams} report datagrams to {endpoints} endpoints");
    }
    code
}

fn run_report(r: &ReportCmd) -> (u32, u32, Option<String>, u8) {
    let fail = |e: String, code| (0, 0, Some(e), code);
    if r.tracker.len() != r.observed.len() {
        return fail(
            format!(
                "{} --tracker but {} --observed: give them in pairs",
                r.tracker.len(),
                r.observed.len()
            ),
            EXIT_CONFIG,
        );
    }
    let key = match args::load_key(r.key.key_file.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e.to_string(), EXIT_CONFIG),
    };
    let mut entries = Vec::with_capacity(r.tracker.len());
    for (t, obs) in r.tracker.iter().zip(&r.observed) {
        match tracker(t) {
            Ok(tr) => entries.push((tr, *obs)),
            Err(e) => return fail(e.to_string(), EXIT_CONFIG),
        }
    }
    let endpoints = match endpoints_for(&r.servers, &key) {
        Ok(e) => e,
        Err(e) => return fail(format!("discovery failed: {e}"), EXIT_COMM),
    };
    match driver::report(&key, &endpoints, &entries) {
        Ok(run) => (run.datagrams, run.endpoints, None, EXIT_OK),
        Err(f) => {
            let code = if f.category() == FailureCategory::Configuration {
                EXIT_CONFIG
            } else {
                EXIT_COMM
            };
            fail(f.to_string(), code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(utc_text(1_735_689_600), "2025-01-01T00:00:00Z");
        assert_eq!(utc_text(1_767_225_600), "2026-01-01T00:00:00Z");
        assert_eq!(utc_text(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_text(86_399), "1970-01-01T23:59:59Z");
    }
}
