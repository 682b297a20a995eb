//! Command-line options of the load generator.
//!
//! Owns the clap definition, the engine policy the options describe, and which options are
//! recorded in the JSON report's `parameters` (derived with serde: every field not marked
//! `skip`). Endpoints (`ID@IP:PORT`) and schedules are parsed by the engine's `FromStr`
//! implementations; the range checks of numeric options (out-of-range values are rejected
//! with the usage text, never clamped) and core lists are `values.rs`, the checks across
//! options (the policy, the datagram size) `checks.rs`, the enumerated choices `kinds.rs`,
//! what the parsed options mean (placement, the raw client's wait, the policy, the checked
//! parse) `settle.rs`.
//! Must not touch sockets, responders or clients.
//!
//! The doc comments of [`Args`]' fields are its `--help` text: plain text for a terminal
//! (no rustdoc links or markup).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use serde::Serialize;

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::policy::Schedule;
use ratelimitly_engine::udp::BackendChoice;

mod checks;
mod kinds;
mod settle;
mod values;

pub use kinds::{AuthArg, ClientKind, EngineCore, RawWait};
pub use values::CoreList;
use values::{
    as_text, duration_seconds, negated, on_off, parse_cores, positive_rate, probability, ranged,
    warmup_seconds,
};

/// Most embedded responders (servers) of a run: the most endpoints one request takes.
pub const MAX_SERVERS: u64 = ratelimitly_engine::proto::machine::MAX_ENDPOINTS as u64;
/// Most requests in flight (closed loop): the open loop's outstanding bound too.
pub const MAX_IN_FLIGHT: u64 = 1 << 18;

const AFTER_HELP: &str = "\
API key (only with --endpoint or --domain; embedded runs use a public test fixture):
  read from RATELIMITLY_API_KEY, or from the file given with --key-file PATH (surrounding
  whitespace ignored). Never on the command line; never printed.

JSON output:
  --json FILE writes the whole report (machine, parameters, every figure, per-second
  series, ratios) as a JSON document to FILE; the human summary stays on stdout and the
  progress on stderr. (rlctl's --json is a switch instead: rlctl answers one question per
  run, so its JSON answer replaces its text on stdout.)

Per-second series (JSON series, SVG): one point per second of the measurement window,
from its start (after --warmup); a last point shorter than a second says so (length_s),
and the points' decisions sum to the run's.

Exit status: 0 every client completed what it submitted and its figures can be trusted,
1 submitted != completed for a client (with --chaos also: a late completion, or an outcome
the schedule cannot explain), 2 usage or setup error, 3 a client made no decision in its
window, or more than --max-timeout-share of its requests timed out (the message names the
cause; against --endpoint/--domain servers it probes them: port unreachable, no answer
from a reachable server, another server id). The JSON report is written either way.";

/// Load generator for the Ratelimitly engine, the official client and a raw-UDP ceiling.
///
/// With no arguments: two embedded loopback responders, AES key, default policy,
/// the engine client on core 0, responders on core 1, 10 s.
// The field docs are --help text for a terminal: `ID@[::1]:PORT` is not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Parser, Debug, Clone, Serialize)]
#[command(name = "loadgen", version = rl_toolkit::build_info::VERSION, after_help = AFTER_HELP)]
pub struct Args {
    /// Number of embedded responders (servers), 1..=64.
    #[arg(long, default_value_t = 2, value_parser = ranged::<usize>(1, MAX_SERVERS))]
    #[serde(skip)]
    pub servers: usize,
    /// External endpoint ID@IP:PORT (repeatable; ID canonical decimal > 0, IPv6 as
    /// ID@[::1]:PORT); the key comes from RATELIMITLY_API_KEY or --key-file.
    #[arg(long = "endpoint", value_name = "ID@IP:PORT")]
    #[serde(skip)]
    pub endpoints: Vec<Endpoint>,
    /// External service domain (DNS discovery); the key comes from RATELIMITLY_API_KEY or
    /// --key-file.
    #[arg(long)]
    #[serde(skip)]
    pub domain: Option<String>,
    /// DNS server for --domain.
    #[arg(long)]
    #[serde(skip)]
    pub dns_server: Option<SocketAddr>,
    /// Read the API key for --endpoint/--domain from this file instead of
    /// RATELIMITLY_API_KEY.
    #[arg(long, value_name = "PATH")]
    #[serde(skip)]
    pub key_file: Option<PathBuf>,
    /// Auth mode of the embedded synthetic key.
    #[arg(long, value_enum, default_value_t = AuthArg::Aes)]
    #[serde(skip)]
    pub auth: AuthArg,

    /// Policy time unit U in ms (>= 1; the horizon U x (B(0) + ... + B(N) + F) must fit
    /// the key's dedup limit, 300 ms for the embedded keys).
    #[arg(long, default_value_t = 20)]
    pub unit_ms: u32,
    /// Replay count N (0..=65535, within the horizon limit).
    #[arg(long, default_value_t = 1)]
    pub replays: u16,
    /// Replay-gap schedule: fixed:B | linear:INIT,STEP,MAX | exp:INIT,FACTOR,MAX.
    #[arg(long, default_value = "fixed:1")]
    #[serde(serialize_with = "as_text")]
    pub schedule: Schedule,
    /// Final receive units F.
    #[arg(long = "final", default_value_t = 1)]
    pub final_units: u32,
    /// Disable completion delivery.
    #[arg(long)]
    #[serde(rename = "completion_delivery", serialize_with = "negated")]
    pub no_completion_delivery: bool,

    /// Resources consumed per request (0..=64, and the request must fit one 1200-byte
    /// datagram with the guards and the label).
    #[arg(long, default_value_t = 1, value_parser = ranged::<usize>(0, 64))]
    pub resources: usize,
    /// Latency guards per request (0..=64, see --resources).
    #[arg(long, default_value_t = 0, value_parser = ranged::<usize>(0, 64))]
    pub guards: usize,
    /// Metrics label of each request (empty: none).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Fraction of operations that are latency reports instead of requests (0..=1).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub report_share: f64,
    /// Number of distinct buckets the requests spread over (1..=1048576).
    #[arg(long, default_value_t = 1024, value_parser = ranged::<usize>(1, 1 << 20))]
    pub buckets: usize,
    /// Rate limit of every bucket (tokens per window, >= 1).
    #[arg(long, default_value_t = 1_000_000_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_limit: u32,
    /// Bucket window in ms (>= 1).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub window_ms: u32,

    /// Response loss probability injected at the embedded responders (0..=1).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub loss: f64,
    /// Fixed response delay (ms, 0..=60000) at the embedded responders.
    #[arg(long, default_value_t = 0, value_parser = ranged::<u64>(0, 60_000))]
    pub delay_ms: u64,
    /// Response delay jitter (ms, 0..=60000) at the embedded responders.
    #[arg(long, default_value_t = 0, value_parser = ranged::<u64>(0, 60_000))]
    pub jitter_ms: u64,
    /// Make the oldest embedded responder silent.
    #[arg(long)]
    pub dead_oldest: bool,

    /// Client cores, e.g. 0 or 0,2-3 (default: 0). The engine runs one core per client
    /// core (a pinned thread, or with --engine-core hosted a Tokio worker each).
    #[arg(long, value_parser = parse_cores)]
    #[serde(skip)]
    pub client_cores: Option<CoreList>,
    /// Responder cores, e.g. 1 or 4-7 (default: the first core that is not a client core).
    #[arg(long, value_parser = parse_cores)]
    #[serde(skip)]
    pub responder_cores: Option<CoreList>,
    /// Cores of the application's threads: the Tokio workers of the engine and official
    /// clients (the tasks that submit requests and await answers; with --engine-core
    /// hosted also the engine's cores), one worker per core (default: the client cores).
    /// With --engine-core pinned and cores apart from --client-cores, every engine core
    /// has a CPU of its own (tuning/scaling.py).
    #[arg(long, value_parser = parse_cores)]
    #[serde(skip)]
    pub app_cores: Option<CoreList>,
    /// Threads (SO_REUSEPORT sockets) of each embedded responder, 1..=64, pinned in turn
    /// to the responder cores (default 1).
    #[arg(long, default_value_t = 1, value_parser = ranged::<usize>(1, 64))]
    #[serde(skip)]
    pub responder_threads: usize,

    /// Measured duration in seconds (per client, > 0, at most 86400).
    #[arg(long, default_value_t = 10.0, value_parser = duration_seconds)]
    #[serde(rename = "duration_s")]
    pub duration: f64,
    /// Warm-up before measuring, in seconds (per client, 0..=3600; with --chaos at least
    /// 7.5).
    #[arg(long, default_value_t = 1.0, value_parser = warmup_seconds)]
    #[serde(rename = "warmup_s")]
    pub warmup: f64,
    /// Closed loop: requests kept in flight (1..=262144).
    #[arg(long, default_value_t = 64, value_parser = ranged::<usize>(1, MAX_IN_FLIGHT))]
    pub in_flight: usize,
    /// Open loop at a fixed rate (requests/s, > 0, at most 10000000); latency from intended
    /// send times.
    #[arg(long, value_parser = positive_rate)]
    pub rate: Option<f64>,
    /// Receive batch of the raw client's I/O layer (1..=1024).
    #[arg(long, default_value_t = 32,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub batch: usize,
    /// Raw client: wait in its I/O layer until an answer arrives or work is due. The
    /// default (kept for older command lines); the JSON parameters raw_sleep and raw_wait
    /// say the mode that ran.
    #[arg(long)]
    #[serde(skip)]
    pub raw_sleep: bool,
    /// Raw client, closed loop: busy-poll its I/O layer instead of waiting (the CPU per
    /// decision then measures the polling; open loop it always waits until work is due).
    #[arg(long, conflicts_with = "raw_sleep")]
    #[serde(skip)]
    pub raw_busy_poll: bool,
    /// Client socket buffer size in bytes (engine and raw; 0 = system default; at most
    /// 1 GiB, and the kernel caps it at net.core.rmem_max / wmem_max).
    #[arg(long, default_value_t = 4 << 20, value_parser = ranged::<usize>(0, 1 << 30))]
    pub socket_buffer: usize,
    /// UDP I/O backend of the engine, raw client and responders: mmsg (the engine's
    /// default, faster here), auto (io_uring where allowed, else mmsg) or uring.
    #[arg(long, default_value = "mmsg")]
    #[serde(serialize_with = "as_text")]
    pub io: BackendChoice,
    /// UDP GSO sends and GRO receives in the engine and the raw client (on|off).
    #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub gso: bool,
    /// Embedded responders reply in GSO batches per client address (on|off).
    #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    pub reply_batch: bool,
    /// Where the engine's core runs: hosted (a task on the same Tokio runtime as the
    /// callers, which share the client core with it), pinned (a thread of its own on
    /// the client core) or auto: the cheaper placement of the backend, hosted with mmsg,
    /// pinned with --io uring or auto (docs/benchmarks.md, "Backends"). The JSON
    /// parameters give the placement used (engine_core).
    #[arg(long, value_enum, default_value_t = EngineCore::Auto)]
    #[serde(skip)]
    pub engine_core: EngineCore,

    /// Client to drive.
    #[arg(long, value_enum, default_value_t = ClientKind::Engine)]
    pub client: ClientKind,
    /// Run engine, official and raw one after the other and print ratios.
    #[arg(long)]
    pub compare: bool,
    /// Chaos soak: the engine, closed loop, against the embedded responders while a
    /// seeded schedule of faults (restarts, steering storms, loss and delay bursts,
    /// duplicates, membership changes by DNS) runs for --duration; the result gains
    /// chaos (events, late completions, memory, descriptors). Exit 1 also when a
    /// completion is late or an outcome is one the schedule cannot explain.
    #[arg(long, conflicts_with_all = ["compare", "rate", "endpoints", "domain", "dead_oldest"])]
    #[serde(skip)]
    pub chaos: bool,
    /// Seed of the --chaos schedule (the same seed gives the same schedule).
    #[arg(long, default_value_t = 1)]
    #[serde(skip)]
    pub seed: u64,

    /// Write the whole report as a JSON document to FILE (see below).
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub json: Option<PathBuf>,
    /// Write the HdrHistogram percentile spectrum (.hgrm).
    #[arg(long)]
    #[serde(skip)]
    pub hgrm: Option<PathBuf>,
    /// Write an SVG plot of latency percentiles and throughput over time.
    #[arg(long)]
    #[serde(skip)]
    pub svg: Option<PathBuf>,
    /// Nothing on stderr but warnings and errors: no run description, progress line or
    /// engine statistics (the summary stays on stdout).
    #[arg(long)]
    #[serde(skip)]
    pub quiet: bool,
    /// Fail the run (exit 3) when more than this share of a client's requests in the
    /// window timed out (0..=1; 1 accepts any; not with --chaos, which judges its outcomes
    /// itself). A client that made no decision at all always fails the run. The default,
    /// 5%, passes the runs with --loss 0.3 (0.3^4 of the requests lose both rounds' four
    /// answers).
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    #[serde(skip)]
    pub max_timeout_share: f64,
}
