//! Command-line options of the load generator.
//!
//! Owns the clap definition and the parsing of small option grammars (schedules,
//! endpoints, core lists). Must not touch sockets, responders or clients.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

/// Which client a run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ClientKind {
    /// Our thread-per-core engine (`ratelimitly_engine::engine`).
    Engine,
    /// The official `ratelimitly` 0.1.0 crate on a Tokio runtime.
    Official,
    /// Pre-encoded requests over batched UDP, no policy: the ceiling.
    Raw,
}

impl ClientKind {
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Engine => "engine",
            ClientKind::Official => "official",
            ClientKind::Raw => "raw",
        }
    }
}

/// Authentication mode of the embedded responders' synthetic key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthArg {
    Aes,
    Cookie,
    None,
}

/// Load generator for the Ratelimitly engine, the official client and a raw-UDP ceiling.
///
/// With no arguments: two embedded loopback responders, AES key, default policy,
/// the engine client on core 0, responders on core 1, 10 s.
#[derive(Parser, Debug, Clone)]
#[command(name = "loadgen", version)]
pub struct Args {
    /// Number of embedded responders (servers).
    #[arg(long, default_value_t = 2)]
    pub servers: usize,
    /// External endpoint `ID@IP:PORT` (repeatable); the key comes from RATELIMITLY_API_KEY.
    #[arg(long = "endpoint", value_parser = parse_endpoint)]
    pub endpoints: Vec<(u64, SocketAddr)>,
    /// External service domain (DNS discovery); the key comes from RATELIMITLY_API_KEY.
    #[arg(long)]
    pub domain: Option<String>,
    /// DNS server for --domain.
    #[arg(long)]
    pub dns_server: Option<SocketAddr>,
    /// Auth mode of the embedded synthetic key.
    #[arg(long, value_enum, default_value_t = AuthArg::Aes)]
    pub auth: AuthArg,

    /// Policy time unit U in ms.
    #[arg(long, default_value_t = 20)]
    pub unit_ms: u32,
    /// Replay count N.
    #[arg(long, default_value_t = 1)]
    pub replays: u16,
    /// Replay-gap schedule: fixed:B | linear:I,S,M | exp:I,F,M.
    #[arg(long, default_value = "fixed:1", value_parser = parse_schedule)]
    pub schedule: ScheduleArg,
    /// Final receive units F.
    #[arg(long = "final", default_value_t = 1)]
    pub final_units: u32,
    /// Disable completion delivery.
    #[arg(long)]
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
    /// Fraction of operations that are latency reports instead of requests (0..1).
    #[arg(long, default_value_t = 0.0)]
    pub report_share: f64,
    /// Number of distinct buckets the requests spread over.
    #[arg(long, default_value_t = 1024)]
    pub buckets: usize,
    /// Rate limit of every bucket (tokens per window).
    #[arg(long, default_value_t = 1_000_000_000)]
    pub rate_limit: u32,
    /// Bucket window in ms.
    #[arg(long, default_value_t = 1000)]
    pub window_ms: u32,

    /// Response loss probability injected at the embedded responders.
    #[arg(long, default_value_t = 0.0)]
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
    pub client_cores: Option<CoreList>,
    /// Responder cores (default: 1 where the machine has it).
    #[arg(long, value_parser = parse_cores)]
    pub responder_cores: Option<CoreList>,

    /// Measured duration in seconds (per client).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Warm-up before measuring, in seconds (per client).
    #[arg(long, default_value_t = 1.0)]
    pub warmup: f64,
    /// Closed loop: requests kept in flight.
    #[arg(long, default_value_t = 64)]
    pub in_flight: usize,
    /// Open loop at a fixed rate (requests/s); latency from intended send times.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Batch size of the raw client's sendmmsg/recvmmsg.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Raw client: sleep in ppoll between batches instead of busy-polling
    /// (the engine's executors busy-poll; by default the raw ceiling does too).
    #[arg(long)]
    pub raw_sleep: bool,
    /// Client socket buffer size in bytes (engine and raw; 0 = system default).
    #[arg(long, default_value_t = 4 << 20)]
    pub socket_buffer: usize,

    /// Client to drive.
    #[arg(long, value_enum, default_value_t = ClientKind::Engine)]
    pub client: ClientKind,
    /// Run engine, official and raw one after the other and print ratios.
    #[arg(long)]
    pub compare: bool,

    /// Write every figure as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write the HdrHistogram percentile spectrum (.hgrm).
    #[arg(long)]
    pub hgrm: Option<PathBuf>,
    /// Write an SVG plot of latency percentiles and throughput over time.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// No live progress line.
    #[arg(long)]
    pub quiet: bool,
}

/// Replay-gap schedule as given on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScheduleArg {
    Fixed(u32),
    Linear { initial: u32, step: u32, max: u32 },
    Exponential { initial: u32, factor: u32, max: u32 },
}

impl std::fmt::Display for ScheduleArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScheduleArg::Fixed(b) => write!(f, "fixed:{b}"),
            ScheduleArg::Linear { initial, step, max } => {
                write!(f, "linear:{initial},{step},{max}")
            }
            ScheduleArg::Exponential {
                initial,
                factor,
                max,
            } => write!(f, "exp:{initial},{factor},{max}"),
        }
    }
}

fn parse_schedule(s: &str) -> Result<ScheduleArg, String> {
    let (kind, rest) = s
        .split_once(':')
        .ok_or_else(|| "expected fixed:B, linear:I,S,M or exp:I,F,M".to_string())?;
    let nums: Vec<u32> = rest
        .split(',')
        .map(|n| n.trim().parse::<u32>().map_err(|e| format!("{n:?}: {e}")))
        .collect::<Result<_, _>>()?;
    match (kind, nums.as_slice()) {
        ("fixed", [b]) => Ok(ScheduleArg::Fixed(*b)),
        ("linear", [i, s, m]) => Ok(ScheduleArg::Linear {
            initial: *i,
            step: *s,
            max: *m,
        }),
        ("exp" | "exponential", [i, f, m]) => Ok(ScheduleArg::Exponential {
            initial: *i,
            factor: *f,
            max: *m,
        }),
        _ => Err("expected fixed:B, linear:I,S,M or exp:I,F,M".into()),
    }
}

fn parse_endpoint(s: &str) -> Result<(u64, SocketAddr), String> {
    let (id, addr) = s.split_once('@').ok_or("expected ID@IP:PORT")?;
    let id: u64 = id.parse().map_err(|e| format!("server id: {e}"))?;
    if id == 0 {
        return Err("server id 0 is never valid".into());
    }
    let addr: SocketAddr = addr.parse().map_err(|e| format!("address: {e}"))?;
    Ok((id, addr))
}

/// A list of CPU cores (`0,2-3`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CoreList(pub Vec<usize>);

fn parse_cores(s: &str) -> Result<CoreList, String> {
    let mut out = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: usize = a.parse().map_err(|e| format!("{a:?}: {e}"))?;
            let b: usize = b.parse().map_err(|e| format!("{b:?}: {e}"))?;
            if b < a || b - a > 1024 {
                return Err(format!("bad core range {part}"));
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().map_err(|e| format!("{part:?}: {e}"))?);
        }
    }
    if out.is_empty() {
        return Err("empty core list".into());
    }
    Ok(CoreList(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse() {
        assert_eq!(parse_schedule("fixed:1"), Ok(ScheduleArg::Fixed(1)));
        assert_eq!(
            parse_schedule("exp:1,2,4"),
            Ok(ScheduleArg::Exponential {
                initial: 1,
                factor: 2,
                max: 4
            })
        );
        assert!(parse_schedule("linear:1,2").is_err());
        assert!(parse_schedule("nope").is_err());
    }

    #[test]
    fn cores_and_endpoints_parse() {
        assert_eq!(parse_cores("0,2-4"), Ok(CoreList(vec![0, 2, 3, 4])));
        assert!(parse_cores("3-1").is_err());
        let (id, addr) = parse_endpoint("7@127.0.0.1:9000").unwrap();
        assert_eq!(id, 7);
        assert_eq!(addr.port(), 9000);
        assert!(parse_endpoint("0@127.0.0.1:1").is_err());
    }

    #[test]
    fn defaults_parse() {
        let a = Args::try_parse_from(["loadgen"]).unwrap();
        assert_eq!(a.servers, 2);
        assert_eq!(a.client, ClientKind::Engine);
        assert!(!a.compare);
    }
}
