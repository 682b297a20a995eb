//! Command-line options of the load generator.
//!
//! Owns the clap definition, the engine policy the options describe, and which options are recorded in the JSON report's `parameters` (derived
//! with serde: every field not marked `skip`). Endpoints (`ID@IP:PORT`) and schedules are
//! parsed by the engine's `FromStr` implementations; the range checks of numeric options
//! (out-of-range values are rejected with the usage text, never clamped) and core lists
//! are `values.rs`, the enumerated choices `kinds.rs`. Must not touch sockets, responders
//! or clients.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use serde::Serialize;

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::policy::{PolicyError, RequestPolicy, Schedule};
use ratelimitly_engine::udp::BackendChoice;

mod kinds;
mod values;

pub use kinds::{AuthArg, ClientKind, EngineCore, RawWait};
pub use values::CoreList;
use values::{
    as_text, at_least_one, negated, on_off, parse_cores, positive_rate, positive_seconds,
    probability, seconds,
};

const AFTER_HELP: &str = "\
API key (only with --endpoint or --domain; embedded runs use a public test fixture):
  read from RATELIMITLY_API_KEY, or from the file given with --key-file PATH (surrounding
  whitespace ignored). Never on the command line; never printed.

JSON output:
  --json FILE writes the whole report (machine, parameters, every figure, per-second
  series, ratios) as a JSON document to FILE; the human summary stays on stdout and the
  progress on stderr. (rlctl's --json is a switch instead: rlctl answers one question per
  run, so its JSON answer replaces its text on stdout.)

Exit status: 0 every client completed what it submitted, 1 submitted != completed for a
client (with --chaos also: a late completion, or an outcome the schedule cannot explain),
2 usage or setup error.";

/// Load generator for the Ratelimitly engine, the official client and a raw-UDP ceiling.
///
/// With no arguments: two embedded loopback responders, AES key, default policy,
/// the engine client on core 0, responders on core 1, 10 s.
#[derive(Parser, Debug, Clone, Serialize)]
#[command(name = "loadgen", version, after_help = AFTER_HELP)]
pub struct Args {
    /// Number of embedded responders (servers), >= 1.
    #[arg(long, default_value_t = 2, value_parser = at_least_one())]
    #[serde(skip)]
    pub servers: usize,
    /// External endpoint `ID@IP:PORT` (repeatable; ID canonical decimal > 0, IPv6 as
    /// `ID@[::1]:PORT`); the key comes from RATELIMITLY_API_KEY or --key-file.
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

    /// Policy time unit U in ms.
    #[arg(long, default_value_t = 20)]
    pub unit_ms: u32,
    /// Replay count N.
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

    /// Resources consumed per request.
    #[arg(long, default_value_t = 1)]
    pub resources: usize,
    /// Latency guards per request.
    #[arg(long, default_value_t = 0)]
    pub guards: usize,
    /// Metrics label of each request (empty: none).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Fraction of operations that are latency reports instead of requests (0..=1).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    pub report_share: f64,
    /// Number of distinct buckets the requests spread over (>= 1).
    #[arg(long, default_value_t = 1024, value_parser = at_least_one())]
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
    /// Fixed response delay (ms) at the embedded responders.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Response delay jitter (ms) at the embedded responders.
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    /// Make the oldest embedded responder silent.
    #[arg(long)]
    pub dead_oldest: bool,

    /// Client cores, e.g. `0` or `0,2-3` (default: 0; or all cores but the responders').
    #[arg(long, value_parser = parse_cores)]
    #[serde(skip)]
    pub client_cores: Option<CoreList>,
    /// Responder cores (default: 1 where the machine has it).
    #[arg(long, value_parser = parse_cores)]
    #[serde(skip)]
    pub responder_cores: Option<CoreList>,

    /// Measured duration in seconds (per client, > 0).
    #[arg(long, default_value_t = 10.0, value_parser = positive_seconds)]
    #[serde(rename = "duration_s")]
    pub duration: f64,
    /// Warm-up before measuring, in seconds (per client, >= 0; with --chaos at least 7.5).
    #[arg(long, default_value_t = 1.0, value_parser = seconds)]
    #[serde(rename = "warmup_s")]
    pub warmup: f64,
    /// Closed loop: requests kept in flight (>= 1).
    #[arg(long, default_value_t = 64, value_parser = at_least_one())]
    pub in_flight: usize,
    /// Open loop at a fixed rate (requests/s, > 0); latency from intended send times.
    #[arg(long, value_parser = positive_rate)]
    pub rate: Option<f64>,
    /// Receive batch of the raw client's I/O layer (1..=1024).
    #[arg(long, default_value_t = 32,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=1024))]
    pub batch: usize,
    /// Raw client: wait in its I/O layer until an answer arrives or work is due. The
    /// default (kept for older command lines); the JSON's `raw_sleep`/`raw_wait` say the
    /// mode that ran ([`Args::raw_wait`]).
    #[arg(long)]
    #[serde(skip)]
    pub raw_sleep: bool,
    /// Raw client, closed loop: busy-poll its I/O layer instead of waiting (the CPU per
    /// decision then measures the polling; open loop it always waits until work is due).
    #[arg(long, conflicts_with = "raw_sleep")]
    #[serde(skip)]
    pub raw_busy_poll: bool,
    /// Client socket buffer size in bytes (engine and raw; 0 = system default).
    #[arg(long, default_value_t = 4 << 20)]
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
    /// pinned with io_uring (`--io uring|auto`; docs/benchmarks.md, "Backends"). The
    /// JSON parameters give the placement used.
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
    /// `chaos` (events, late completions, memory, descriptors). Exit 1 also when a
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
    /// No live progress line.
    #[arg(long)]
    #[serde(skip)]
    pub quiet: bool,
}

impl Args {
    /// Where the engine's core runs, `--engine-core auto` settled.
    pub fn placement(&self) -> EngineCore {
        match (self.engine_core, self.io) {
            (EngineCore::Auto, BackendChoice::Mmsg) => EngineCore::Hosted,
            (EngineCore::Auto, _) => EngineCore::Pinned,
            (chosen, _) => chosen,
        }
    }

    /// The options as the run uses them: `--chaos` raises a warm-up shorter than
    /// [`crate::chaos::MIN_WARMUP_S`] to it (the JSON's `warmup_s` is the one used).
    pub fn settled(mut self) -> Self {
        if self.chaos && self.warmup < crate::chaos::MIN_WARMUP_S {
            self.warmup = crate::chaos::MIN_WARMUP_S;
        }
        self
    }

    /// How the raw client waits: busy-polls only closed loop with `--raw-busy-poll`; it
    /// waits otherwise (alone and in `--compare`, so that `ratios.engine_vs_raw` compares
    /// work with work).
    pub fn raw_wait(&self) -> RawWait {
        if self.raw_busy_poll && self.rate.is_none() {
            RawWait::BusyPoll
        } else {
            RawWait::Sleep
        }
    }

    /// The engine's request policy these options describe.
    pub fn policy(&self) -> Result<RequestPolicy, PolicyError> {
        RequestPolicy::builder()
            .unit(Duration::from_millis(u64::from(self.unit_ms)))
            .replays(self.replays)
            .schedule(self.schedule)
            .final_units(self.final_units)
            .completion_delivery(!self.no_completion_delivery)
            .build()
    }

    /// True when the servers are external (--endpoint or --domain).
    pub fn external(&self) -> bool {
        !self.endpoints.is_empty() || self.domain.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cores_and_endpoints_parse() {
        assert_eq!(parse_cores("0,2-4"), Ok(CoreList(vec![0, 2, 3, 4])));
        assert!(parse_cores("3-1").is_err());
        let a = Args::try_parse_from(["loadgen", "--endpoint", "7@127.0.0.1:9000"]).unwrap();
        assert_eq!(a.endpoints[0].to_string(), "7@127.0.0.1:9000");
        for bad in ["0@127.0.0.1:1", "+5@127.0.0.1:1"] {
            assert!(Args::try_parse_from(["loadgen", "--endpoint", bad]).is_err());
        }
    }

    #[test]
    fn auto_placement_is_the_cheaper_one_of_each_backend() {
        let core = |args: &[&str]| {
            let argv = std::iter::once("loadgen").chain(args.iter().copied());
            Args::try_parse_from(argv).unwrap().placement()
        };
        assert_eq!(core(&[]), EngineCore::Hosted);
        assert_eq!(core(&["--io", "uring"]), EngineCore::Pinned);
        assert_eq!(core(&["--io", "auto"]), EngineCore::Pinned);
        assert_eq!(core(&["--engine-core", "pinned"]), EngineCore::Pinned);
        assert_eq!(
            core(&["--io", "uring", "--engine-core", "hosted"]),
            EngineCore::Hosted
        );
    }

    #[test]
    fn the_raw_client_waits_unless_busy_polling_is_asked_for_closed_loop() {
        let wait = |args: &[&str]| {
            let argv = std::iter::once("loadgen").chain(args.iter().copied());
            Args::try_parse_from(argv).map(|a| a.raw_wait())
        };
        assert_eq!(wait(&[]).unwrap(), RawWait::Sleep);
        assert_eq!(wait(&["--raw-sleep"]).unwrap(), RawWait::Sleep);
        assert_eq!(wait(&["--raw-busy-poll"]).unwrap(), RawWait::BusyPoll);
        let open = ["--raw-busy-poll", "--rate", "100"];
        assert_eq!(wait(&open).unwrap(), RawWait::Sleep);
        assert!(wait(&["--raw-sleep", "--raw-busy-poll"]).is_err());
    }

    #[test]
    fn defaults_parse() {
        let a = Args::try_parse_from(["loadgen"]).unwrap();
        assert_eq!(a.servers, 2);
        assert_eq!(a.client, ClientKind::Engine);
        assert!(!a.compare);
        assert_eq!(a.schedule, Schedule::Fixed(1));
        assert_eq!(
            (a.io, a.gso, a.reply_batch),
            (BackendChoice::Mmsg, true, true)
        );
        let a = Args::try_parse_from(["loadgen", "--io", "uring", "--gso", "off"]).unwrap();
        assert_eq!((a.io, a.gso), (BackendChoice::Uring, false));
        assert!(Args::try_parse_from(["loadgen", "--gso", "yes"]).is_err());
        assert!(Args::try_parse_from(["loadgen", "--io", "epoll"]).is_err());
    }

    #[test]
    fn out_of_range_values_are_rejected_not_clamped() {
        for args in [
            ["--loss", "1.5"],
            ["--loss", "-0.1"],
            ["--loss", "NaN"],
            ["--report-share", "2"],
            ["--duration", "0"],
            ["--warmup", "-1"],
            ["--in-flight", "0"],
            ["--servers", "0"],
            ["--buckets", "0"],
            ["--window-ms", "0"],
            ["--rate-limit", "0"],
            ["--rate", "0"],
            ["--batch", "0"],
            ["--batch", "1025"],
            ["--schedule", "fixed:+1"],
        ] {
            let r = Args::try_parse_from(["loadgen", args[0], args[1]]);
            assert!(r.is_err(), "{args:?} accepted");
        }
        let a =
            Args::try_parse_from(["loadgen", "--loss", "1", "--schedule", "exp:1,2,4"]).unwrap();
        assert_eq!(a.loss, 1.0);
        assert_eq!(a.schedule.to_string(), "exp:1,2,4");
    }
}
