//! rlctl's command line: the clap definitions of every command and option, and the help
//! texts (exit codes, JSON shapes, the key rule).
//!
//! Owns: option names, defaults, value grammars (through the engine's `FromStr` for
//! endpoints and schedules, and [`crate::args`] for bucket and tracker specs) and help.
//! Must not touch: keys, sockets, output; the commands under `cmd/` act on these values.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use ratelimitly_engine::proto::endpoint::Endpoint;
use ratelimitly_engine::proto::policy::Schedule;

use crate::args::{self, ResourceArg, TrackerArg};

const AFTER_HELP: &str = "\
API key:
  Read from the environment variable RATELIMITLY_API_KEY, or from the file given with
  --key-file PATH (surrounding whitespace ignored). Never on the command line; never printed.

JSON output:
  --json is a switch: the command prints one JSON object on one line on stdout instead of
  text. (loadgen's --json takes a FILE instead: its stdout carries the run's summary, and
  its JSON report is a document written beside it. rlctl answers one question per run, so
  its JSON answer is its stdout.)

Exit status:
  0  success (request: granted)
  1  request rejected (a resource had a deficit or a guard failed)
  2  usage or configuration error (invalid arguments, invalid key, policy over the key's
     limit, an engine that cannot start on this host: no sockets or file descriptors, ...):
     nothing was sent
  3  timeout: no valid response within the policy horizon
  4  discovery or communication failure";

/// Command-line tool for debugging a Ratelimitly deployment (wire protocol v2).
#[derive(Parser, Debug)]
#[command(name = "rlctl", version = rl_toolkit::build_info::VERSION, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Args, Debug)]
pub struct KeyOpts {
    /// Read the API key from this file instead of RATELIMITLY_API_KEY.
    #[arg(long, value_name = "PATH")]
    pub key_file: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DnsOpts {
    /// Discovery domain: SRV _ratelimitly._udp.<DOMAIN> is queried. Default: the key's
    /// domain, c-<key id>.p0.ratelimitly.com.
    #[arg(long, value_name = "DOMAIN")]
    pub domain: Option<String>,
    /// DNS server to query, IP:PORT (IPv6 as [::1]:53). Default: the first nameserver of
    /// /etc/resolv.conf.
    #[arg(long, value_name = "IP:PORT")]
    pub dns_server: Option<SocketAddr>,
    /// Timeout of each DNS query attempt, in ms, >= 1 (each query is tried twice).
    #[arg(long, value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub dns_timeout_ms: u64,
}

#[derive(Args, Debug)]
pub struct ServerOpts {
    /// A static server endpoint ID@IP:PORT (IPv6 as ID@[::1]:PORT), bypassing DNS.
    /// Repeatable; ID is the server id in canonical decimal (> 0, no sign, no leading
    /// zero; smallest = oldest server).
    #[arg(long, value_name = "ID@IP:PORT", conflicts_with_all = ["domain", "dns_server"])]
    pub endpoint: Vec<Endpoint>,
    #[command(flatten)]
    pub dns: DnsOpts,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Decode the API key: mode, key id, every quota, default discovery domain.
    #[command(
        after_help = "The key comes from RATELIMITLY_API_KEY or --key-file PATH; its secret is never printed.\n\
                            JSON output: {\"mode\", \"key_id\", \"quotas\": {...}, \"default_domain\"}\n\
                            Exit status: 0 valid key, 2 missing or invalid key."
    )]
    Key(KeyCmd),
    /// Print bucket ids and tracker ids (lowercase hex). No key needed.
    #[command(
        after_help = "Names may contain ':' (the numeric fields are taken from the right).\n\
                            Example: rlctl ids --resource checkout:1000:100 --tracker inventory:10000:100:5"
    )]
    Ids(IdsCmd),
    /// Discover the servers by DNS: SRV targets, server ids, start times, addresses, the
    /// oldest server, TTLs. The key is needed only when --domain is not given.
    #[command(
        after_help = "Targets count only when their first label is s-<server id>; the server id's upper 41 bits\n\
                            are its start time in seconds since 2025-01-01T00:00:00Z; the smallest id is the oldest.\n\
                            JSON output: {\"domain\", \"servers\": [{\"server_id\", \"target\", \"port\", \"addresses\",\n\
                            \"ttl_s\", \"start_time_unix_s\", \"start_time_utc\", \"oldest\"}], \"oldest_server_id\", \"min_ttl_s\", \"error\"}\n\
                            Exit status: 0 found, 2 no key and no --domain, 4 discovery failure."
    )]
    Discover(DiscoverCmd),
    /// Send one resource request and print its outcome.
    #[command(after_help = REQUEST_HELP)]
    Request(RequestCmd),
    /// Send latency reports once to every current endpoint (no answer is expected).
    #[command(after_help = "Example: rlctl report --endpoint 7@127.0.0.1:4000 \
                            --tracker db:10000:100:5 --observed 120 --tracker db:10000:100:5 --observed 95\n\
                            JSON output: {\"datagrams\": n, \"endpoints\": n, \"error\": null}\n\
                            Exit status: 0 sent, 2 configuration error (an engine that cannot start included),\n\
                            4 discovery or communication failure.\n\
                            Sent through the engine (reports flushed once all are queued).")]
    Report(ReportCmd),
}

#[derive(Args, Debug)]
pub struct KeyCmd {
    #[command(flatten)]
    pub key: KeyOpts,
    /// Print one JSON object on one line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct IdsCmd {
    /// A rate bucket NAME:WINDOW_MS:RATE (window in ms, rate = tokens per window).
    /// Repeatable.
    #[arg(long, value_name = "NAME:WINDOW_MS:RATE", value_parser = args::parse_resource)]
    pub resource: Vec<ResourceArg>,
    /// A latency tracker NAME:TTL_MS:MAX:MIN (sample max age in ms, max samples kept,
    /// warm-up sample count). Repeatable.
    #[arg(long, value_name = "NAME:TTL_MS:MAX:MIN", value_parser = args::parse_tracker)]
    pub tracker: Vec<TrackerArg>,
    /// Print one JSON object on one line on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct DiscoverCmd {
    #[command(flatten)]
    pub key: KeyOpts,
    #[command(flatten)]
    pub dns: DnsOpts,
    /// Print one JSON object on one line on stdout.
    #[arg(long)]
    pub json: bool,
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

Sent through the engine (one core, static endpoints or DNS). If the engine cannot start on
this host (no sockets or file descriptors, no thread), nothing is sent: the outcome is a
configuration failure (exit 2) whose error names the limit or the OS error.

After a timeout rlctl probes every endpoint once (a request with one latency guard on the
tracker rl-probe and no resource: nothing is consumed) from a socket that receives ICMP
errors, and the error says per endpoint what came back: 'port unreachable from IP:PORT'
(ICMP: nothing listens there), 'no answer from a reachable server' (the server drops
datagrams whose key id or authentication it does not know), a datagram from another
server id than the endpoint claims, or datagrams this key cannot read. loadgen uses the
same words.

--verbose sends the request itself from rlctl's own socket, through the engine's request
machine (the same datagrams, rounds and selection), and prints on stderr every transmit,
receive and ICMP error with its time and round; the timeout's error then says what the
request itself saw.

Environment: RATELIMITLY_API_KEY (the key, unless --key-file is given).";

#[derive(Args, Debug)]
pub struct RequestCmd {
    #[command(flatten)]
    pub key: KeyOpts,
    #[command(flatten)]
    pub servers: ServerOpts,
    /// Consume TOKENS (default 1, 1..=65535) from the bucket NAME:WINDOW_MS:RATE.
    /// Repeatable; all resources and guards are decided atomically.
    #[arg(long, value_name = "NAME:WINDOW_MS:RATE[:TOKENS]", value_parser = args::parse_consume)]
    pub consume: Vec<ResourceArg>,
    /// Latency guard: pass only while the tracker NAME:TTL_MS:MAX:MIN's current latency
    /// (p90 of recent reports) is below THRESHOLD_MS. Repeatable.
    #[arg(long, value_name = "NAME:TTL_MS:MAX:MIN:THRESHOLD_MS", value_parser = args::parse_guard)]
    pub guard: Vec<TrackerArg>,
    /// Metrics label (groups server-side metrics only).
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
    /// Time unit U in ms (>= 1).
    #[arg(long, value_name = "U", default_value_t = 20)]
    pub unit_ms: u32,
    /// Replay count N (replay rounds after round 0).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub replays: u16,
    /// Round lengths B(k) in units: fixed:B | linear:INIT,STEP,MAX | exp:INIT,FACTOR,MAX.
    #[arg(long, value_name = "SCHEDULE", default_value = "fixed:1")]
    pub schedule: Schedule,
    /// Final receive phase F in units (0 removes it).
    #[arg(long = "final", value_name = "F", default_value_t = 1)]
    pub final_units: u32,
    /// Do not send the completion delivery after a decision.
    #[arg(long)]
    pub no_completion_delivery: bool,
    /// Print one JSON object on one line on stdout (see below).
    #[arg(long)]
    pub json: bool,
    /// Trace the request: every transmit, receive and ICMP error with its round, on
    /// stderr (see below).
    #[arg(long, short)]
    pub verbose: bool,
}

#[derive(Args, Debug)]
pub struct ReportCmd {
    #[command(flatten)]
    pub key: KeyOpts,
    #[command(flatten)]
    pub servers: ServerOpts,
    /// Tracker NAME:TTL_MS:MAX:MIN of the next --observed value. Repeatable, paired in
    /// order with --observed.
    #[arg(long, value_name = "NAME:TTL_MS:MAX:MIN", value_parser = args::parse_tracker, required = true)]
    pub tracker: Vec<TrackerArg>,
    /// Observed latency in whole ms, for the --tracker at the same position. Repeatable.
    #[arg(long, value_name = "MS", required = true)]
    pub observed: Vec<u32>,
    /// Print one JSON object on one line on stdout.
    #[arg(long)]
    pub json: bool,
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
    fn endpoint_and_schedule_use_the_engine_grammar() {
        let c = Cli::try_parse_from([
            "rlctl",
            "request",
            "--endpoint",
            "7@127.0.0.1:4000",
            "--schedule",
            "exp:1,2,4",
        ])
        .unwrap();
        let Command::Request(r) = c.command else {
            panic!("not a request")
        };
        assert_eq!(r.servers.endpoint[0].to_string(), "7@127.0.0.1:4000");
        assert_eq!(r.schedule.to_string(), "exp:1,2,4");
        for bad in ["+7@127.0.0.1:4000", "0@127.0.0.1:4000", "7@127.0.0.1:0"] {
            assert!(Cli::try_parse_from(["rlctl", "request", "--endpoint", bad]).is_err());
        }
        assert!(Cli::try_parse_from(["rlctl", "discover", "--dns-timeout-ms", "0"]).is_err());
    }
}
