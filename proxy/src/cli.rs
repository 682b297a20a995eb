//! The command line: the flags, their parsers and defaults (the one place a flag is
//! declared).
//!
//! Owns: [`Cli`] and the value parsers. Must not touch: what the flags start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use ratelimitly_engine::Endpoint;
use ratelimitly_tower::{ClientIpFrom, ClientIpRule, KeyBy, Limit, OnFailure, TrustedProxies};

use crate::config;
pub use crate::logging::LogFormat;

/// What `--help` ends with: examples, exit codes, the environment variables read.
pub const AFTER_HELP: &str = "\
Examples:
  # a reverse proxy: 100 requests a second per client IP (a quickstart with a local
  # test server: proxy/README.md)
  RATELIMITLY_API_KEY=... rl-proxy --upstream http://127.0.0.1:8080 \\
      --endpoint ID@IP:PORT --listen 0.0.0.0:8000 --limit 100/1s
  # routes from a file; check it first
  rl-proxy --config routes.toml --check
  RATELIMITLY_API_KEY=... rl-proxy --config routes.toml --domain example.net
  # a decision service behind nginx auth_request (which needs 403)
  RATELIMITLY_API_KEY=... rl-proxy --mode forward-auth --deny-status 403 \\
      --endpoint ID@IP:PORT --trust-forwarded 127.0.0.1 --client-ip-from real-ip
  # Envoy's rate limit service, rules in envoyproxy/ratelimit's YAML
  RATELIMITLY_API_KEY=... rl-proxy --mode rls --config ratelimit.yaml --endpoint ID@IP:PORT

--on-failure and the route file: in proxy and forward-auth modes with --config, the
file's on_failure (top level, and per route) says what a request without a decision
gets, so --on-failure is refused there (exit 2). --mode rls takes --on-failure with its
YAML files.

Exit codes:
  0  stopped by SIGINT or SIGTERM, or --check passed
  2  bad arguments, a bad file (--config) or a bad or missing API key
  1  starting failed otherwise (a listener, the runtime, the engine)

Environment:
  RATELIMITLY_API_KEY  the API key (or --key-file); never on the command line
  RUST_LOG             what is logged on standard error, as directives
                       (rl_proxy=debug,ratelimitly_engine=info; default warn)
  --mode rls also reads envoyproxy/ratelimit's variables (a flag given wins):
  GRPC_HOST, GRPC_PORT   --listen
  HOST, PORT             --admin-listen (/json, /healthcheck, /metrics, /rlconfig)
  LOG_LEVEL              the log level when RUST_LOG is unset
  LOG_FORMAT             --log-format (text, json)
  RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY
                         without --config: the YAML files in
                         $RUNTIME_ROOT/$RUNTIME_SUBDIRECTORY/$RUNTIME_APPDIRECTORY
  LIMIT_RESPONSE_HEADERS_ENABLED=false  no RateLimit headers in the answers
  NEAR_LIMIT_RATIO       near_limit in rl_proxy_rls_descriptor_hits_total (0.8)
  SHADOW_MODE=true       never OVER_LIMIT overall (counted)
  The reference's other variables (REDIS_*, USE_STATSD, BACKEND_TYPE, ...) have no
  effect; each one set is logged at warn at the start.
";

/// Where the engine's core runs (`--engine-core`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EngineCore {
    /// A task on the proxy's own Tokio runtime.
    Hosted,
    /// A thread of its own on the last CPU.
    Pinned,
}

/// What the listener is (`--mode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// A reverse proxy to --upstream.
    Proxy,
    /// A decision service: 200, the deny status, or the failure policy's answer.
    ForwardAuth,
    /// Envoy's rate limit service (gRPC ShouldRateLimit over h2c); rules from
    /// envoyproxy/ratelimit YAML files (--config, repeatable).
    #[cfg(feature = "rls")]
    Rls,
}

/// Which client admits requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AdmissionKind {
    /// The thread-per-core engine of this repository.
    Engine,
    /// The official `ratelimitly` crate (needs --domain).
    Official,
}

/// HTTP/1.1 reverse proxy admitting requests through Ratelimitly. The API key comes from
/// RATELIMITLY_API_KEY or --key-file, never from the command line.
#[derive(Parser, Debug)]
#[command(name = "rl-proxy", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Upstream to forward granted requests to: http://HOST:PORT (required in proxy
    /// mode without --config).
    #[arg(long, conflicts_with = "config")]
    pub upstream: Option<String>,
    /// proxy: forward granted requests to the upstream. forward-auth: a decision
    /// service for nginx auth_request, Traefik ForwardAuth, Caddy forward_auth, HAProxy
    /// (Lua), Envoy ext_authz: 200 when granted, --deny-status with Retry-After when rejected, the
    /// failure policy otherwise; the original request from X-Original-URI /
    /// X-Forwarded-Uri and X-Original-Method / X-Forwarded-Method. No --upstream.
    #[arg(long, value_enum, default_value = "proxy")]
    pub mode: Mode,
    /// --mode forward-auth: the status of a rejection (nginx auth_request needs 403).
    #[arg(long, default_value_t = 429, value_parser = clap::value_parser!(u16).range(400..=599))]
    pub deny_status: u16,
    /// Routes from a TOML file (upstream, limit, key_by, on_failure, route tables);
    /// conflicts with --upstream, --limit, --key-by and --on-failure. With --mode rls:
    /// envoyproxy/ratelimit YAML files, one domain each (repeatable; a directory: its
    /// *.yaml files, as a Kubernetes ConfigMap volume has them). SIGHUP reloads.
    #[arg(long, conflicts_with_all = ["limit", "key_by"])]
    pub config: Vec<PathBuf>,
    /// With --config: check the files and exit 0, or 2 with a message naming the line.
    #[arg(long, requires = "config")]
    pub check: bool,
    /// A service endpoint ID@IP:PORT (repeatable); bypasses DNS.
    #[arg(long = "endpoint", value_parser = parse_endpoint, conflicts_with = "domain")]
    pub endpoints: Vec<Endpoint>,
    /// Service domain discovered through DNS.
    #[arg(long)]
    pub domain: Option<String>,
    /// DNS server for --domain (default: the system resolver).
    #[arg(long, requires = "domain")]
    pub dns_server: Option<SocketAddr>,
    /// Proxy listener.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Admin listener (GET /metrics, GET /healthz).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub admin_listen: SocketAddr,
    /// COUNT/WINDOW (e.g. 10/60s, 1000/1s) per key, or `off` (no admission: the baseline).
    #[arg(long, default_value = "100/1s", value_parser = parse_limit)]
    pub limit: LimitArg,
    /// What a bucket is keyed by: ip, path or header:NAME.
    #[arg(long, default_value = "ip", value_parser = |s: &str| s.parse::<KeyBy>())]
    pub key_by: KeyBy,
    /// When the service gives no decision: open (forward) or closed (503; --mode rls:
    /// OVER_LIMIT). Default: open; with --mode rls, gRPC UNAVAILABLE (Envoy's
    /// failure_mode_deny decides). Proxy and forward-auth modes with --config: refused,
    /// the file's on_failure says it.
    #[arg(long, value_parser = |s: &str| s.parse::<OnFailure>())]
    pub on_failure: Option<OnFailure>,
    /// Which client admits requests.
    #[arg(long, value_enum, default_value = "engine")]
    pub admission: AdmissionKind,
    /// Where the engine's core runs: hosted (a task on the proxy's own Tokio runtime,
    /// no thread hand-off per request) or pinned (a thread of its own on the last CPU).
    #[arg(long, value_enum, default_value = "hosted")]
    pub engine_core: EngineCore,
    /// Read the API key from this file instead of RATELIMITLY_API_KEY.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Close a connection that has not sent a whole request head within DURATION
    /// (500ms, 10s, 1m): from accept for the first request, a silent connection too,
    /// and from the first byte of each later request.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub header_timeout: Duration,
    /// Close a keep-alive connection idle between requests for DURATION.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Answer 504 when the upstream sends no response head within DURATION.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub upstream_timeout: Duration,
    /// Client connections open at once; beyond it a new connection is accepted and
    /// closed at once (counted in rl_proxy_connections_refused_total, logged as a
    /// warning at most once a second).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Peers in CIDR (repeatable; an address alone is one host) are proxies whose word
    /// about the client is believed, read from --client-ip-from. From any other peer the
    /// client is the peer and no header is read, in every mode.
    #[arg(long = "trust-forwarded", value_name = "CIDR", value_parser = parse_trusted)]
    pub trust_forwarded: Vec<TrustedProxies>,
    /// What a trusted peer names the client in; the header the proxy in front writes
    /// itself: xff (default: the rightmost X-Forwarded-For address not itself trusted),
    /// forwarded (the same in RFC 7239 Forwarded), real-ip (X-Real-IP, as nginx's realip
    /// module reads it: for nginx's `proxy_set_header X-Real-IP $remote_addr;`; choose it
    /// only when that proxy overwrites the header; absent, the peer) or peer (no
    /// header). Wins over the config file's client_ip_from.
    #[arg(long, value_name = "SOURCE", value_parser = |s: &str| s.parse::<ClientIpFrom>())]
    pub client_ip_from: Option<ClientIpFrom>,
    /// Log lines on standard error: text, or json (one object a line: timestamp, level,
    /// target, message and fields). What is logged: RUST_LOG (directives such as
    /// `rl_proxy=debug,ratelimitly_engine=info`; default warn).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

pub(crate) fn parse_trusted(s: &str) -> Result<TrustedProxies, String> {
    s.parse::<TrustedProxies>().map_err(|e| e.to_string())
}

/// The client-address flags (`--trust-forwarded`, `--client-ip-from`), kept for the
/// reloads of the config file.
#[derive(Clone, Debug)]
pub struct ClientFlags {
    trusted: Vec<TrustedProxies>,
    source: Option<ClientIpFrom>,
}

impl ClientFlags {
    /// The flags of `cli`.
    pub fn of(cli: &Cli) -> Self {
        ClientFlags {
            trusted: cli.trust_forwarded.clone(),
            source: cli.client_ip_from,
        }
    }

    /// The rule for who the client is: the trusted networks of the flags and of the
    /// file, and the source of `--client-ip-from`, else the file's `client_ip_from`,
    /// else the default (`xff`). The one place they are combined, at start and on
    /// reload.
    pub fn rule(&self, file: Option<&config::Table>) -> ClientIpRule {
        let mut trusted = TrustedProxies::none();
        let lists = self.trusted.iter().chain(file.map(|t| &t.trusted));
        for net in lists.flat_map(|t| t.nets()) {
            trusted = trusted.with(*net);
        }
        let source = self.source.or(file.and_then(|t| t.client_ip_from));
        if let Some(s) = source
            && trusted.is_empty()
            && s != ClientIpFrom::Peer
        {
            tracing::warn!(
                "client IP source {s} is never read: no peer is trusted (--trust-forwarded, \
                 trust_forwarded), so every client is its TCP peer"
            );
        }
        ClientIpRule::new(trusted, source.unwrap_or_default())
    }
}

/// DURATION as in `--limit`'s WINDOW (one parser: `config::parse_duration`).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    config::parse_duration(s)
}

#[derive(Clone, Copy, Debug)]
/// `--limit`: a limit, or `off`.
pub enum LimitArg {
    /// No admission: the baseline.
    Off,
    /// COUNT/WINDOW per key.
    On(Limit),
}

pub(crate) fn parse_limit(s: &str) -> Result<LimitArg, String> {
    if s == "off" {
        return Ok(LimitArg::Off);
    }
    s.parse::<Limit>()
        .map(LimitArg::On)
        .map_err(|e| e.to_string())
}

pub(crate) fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    s.parse()
        .map_err(|e: ratelimitly_engine::EndpointParseError| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_over_the_file_and_the_lists_add_up() {
        let text = "client_ip_from = \"forwarded\"\ntrust_forwarded = [\"10.0.0.0/8\"]\n";
        let file = config::parse(text).unwrap();
        let cli = |args: &[&str]| {
            let mut all = vec!["rl-proxy", "--trust-forwarded", "127.0.0.1"];
            all.extend(args);
            Cli::parse_from(all)
        };
        let rule = ClientFlags::of(&cli(&[])).rule(Some(&file));
        assert_eq!(rule.source(), ClientIpFrom::Forwarded);
        assert!(rule.trusted().contains("127.0.0.1".parse().unwrap()));
        assert!(rule.trusted().contains("10.1.1.1".parse().unwrap()));
        assert_eq!(
            ClientFlags::of(&cli(&[])).rule(None).source(),
            ClientIpFrom::Xff
        );
        let flags = ClientFlags::of(&cli(&["--client-ip-from", "real-ip"]));
        assert_eq!(flags.rule(Some(&file)).source(), ClientIpFrom::RealIp);
        assert_eq!(flags.rule(None).source(), ClientIpFrom::RealIp);
        let bad = ["rl-proxy", "--client-ip-from", "x-real-ip"];
        assert!(Cli::try_parse_from(bad).is_err());
    }
}
