//! A Pingora reverse proxy that admits each request through Ratelimitly.
//!
//! ```text
//! RATELIMITLY_API_KEY=... proxy --listen ADDR --upstream ADDR --endpoint ID@IP:PORT \
//!     --limit N/WINDOW [--on-failure open|closed] [--trust-forwarded CIDR] \
//!     [--key-by ip|path|header:NAME] [--engine hosted|pinned] [--threads N] \
//!     [--grace-period SECS] [--limiter ratelimitly|local]
//! ```
//!
//! `--limit off` proxies without admission (plain Pingora, the benchmark's baseline).
//! `--limiter local` counts per process instead, with pingora-limits' `Rate` keyed by
//! the client's IP (429 once a client's count in the current window passes the limit;
//! no service, so `--endpoint` and the API key are not needed): the benchmark's local
//! baseline.
//! Prints `{"event":"ready","address":"IP","port":N}` on stdout once the listener
//! accepts connections (port 0 is refused: Pingora does not tell which port it got).
//! Bad input exits 2 naming the flag; SIGTERM shuts down gracefully (in-flight requests
//! finish within the grace period), SIGINT at once.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora::prelude::*;
use pingora::server::ExecutionPhase;
use pingora::server::configuration::ServerConf;
use ratelimitly_pingora::forwarded::TrustedProxies;
use ratelimitly_pingora::{
    ApiKey, BuildError, Engine, FailurePolicy, KeyBy, Limit, OnFailure, RateLimitCtx, RateLimiter,
    key_from_env, keyed, parse_endpoints,
};

const USAGE: &str = "usage: proxy --listen ADDR --upstream ADDR --endpoint ID@IP:PORT --limit N/WINDOW|off \
[--on-failure open|closed] [--trust-forwarded CIDR] [--key-by ip|path|header:NAME] \
[--engine hosted|pinned] [--threads N] [--grace-period SECS] [--limiter ratelimitly|local] \
(the API key from RATELIMITLY_API_KEY)";

struct Proxy {
    /// `None` with `--limit off`: plain Pingora, the benchmark's baseline.
    limiter: Option<RateLimiter>,
    /// `--limiter local`: pingora-limits' per-process `Rate` and the count per window.
    local: Option<(pingora_limits::rate::Rate, u32)>,
    upstream: SocketAddr,
}

#[async_trait]
impl ProxyHttp for Proxy {
    type CTX = RateLimitCtx;

    fn new_ctx(&self) -> RateLimitCtx {
        RateLimitCtx::default()
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut RateLimitCtx) -> Result<bool> {
        if let Some((rate, count)) = &self.local {
            let ip = session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip());
            if rate.observe(&ip, 1) > isize::try_from(*count).unwrap_or(isize::MAX) {
                session.respond_error(429).await?;
                return Ok(true);
            }
            return Ok(false);
        }
        match &self.limiter {
            Some(l) => l.request_filter(session, ctx).await,
            None => Ok(false),
        }
    }

    async fn upstream_peer(
        &self,
        _session: &mut Session,
        _ctx: &mut RateLimitCtx,
    ) -> Result<Box<HttpPeer>> {
        Ok(Box::new(HttpPeer::new(self.upstream, false, String::new())))
    }

    async fn response_filter(
        &self,
        _session: &mut Session,
        response: &mut ResponseHeader,
        ctx: &mut RateLimitCtx,
    ) -> Result<()> {
        match &self.limiter {
            Some(l) => l.response_filter(response, ctx),
            None => Ok(()),
        }
    }

    async fn logging(&self, _session: &mut Session, _e: Option<&Error>, ctx: &mut RateLimitCtx) {
        if let Some(l) = &self.limiter {
            l.logging(ctx);
        }
    }
}

/// Where the engine's cores run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Placement {
    Hosted,
    Pinned,
}

struct Args {
    listen: SocketAddr,
    upstream: SocketAddr,
    endpoints: String,
    /// `None`: `--limit off`.
    limit: Option<Limit>,
    on_failure: Option<OnFailure>,
    trusted: TrustedProxies,
    key_by: KeyBy,
    placement: Placement,
    threads: usize,
    grace: u64,
    /// `--limiter local`: pingora-limits' `Rate` instead of Ratelimitly.
    local: bool,
}

/// Exits 2 with `flag: message`.
fn bad(flag: &str, message: impl std::fmt::Display) -> ! {
    eprintln!("proxy: {flag}: {message}");
    eprintln!("{USAGE}");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut listen = None;
    let mut upstream = None;
    let mut endpoints = None;
    let mut limit = None;
    let mut on_failure = None;
    let mut trusted = TrustedProxies::none();
    let mut key_by = KeyBy::ClientIp;
    let mut placement = Placement::Hosted;
    let mut threads = 1;
    let mut grace = 5;
    let mut local = false;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let Some(value) = args.next() else {
            bad(&flag, "needs a value (or is unknown)");
        };
        match flag.as_str() {
            "--listen" => listen = Some(value.parse().unwrap_or_else(|e| bad(&flag, e))),
            "--upstream" => upstream = Some(value.parse().unwrap_or_else(|e| bad(&flag, e))),
            "--endpoint" => {
                if let Err(e) = parse_endpoints(&value) {
                    bad(&flag, format_args!("{e} (want ID@IP:PORT)"));
                }
                endpoints = Some(value);
            }
            "--limit" if value == "off" => limit = Some(None),
            "--limit" => limit = Some(Some(value.parse().unwrap_or_else(|e| bad(&flag, e)))),
            "--on-failure" => on_failure = Some(value.parse().unwrap_or_else(|e| bad(&flag, e))),
            "--trust-forwarded" => {
                let more: TrustedProxies = value.parse().unwrap_or_else(|e| bad(&flag, e));
                for net in more.nets() {
                    trusted = trusted.with(*net);
                }
            }
            "--key-by" => key_by = value.parse().unwrap_or_else(|e| bad(&flag, e)),
            "--engine" => {
                placement = match value.as_str() {
                    "hosted" => Placement::Hosted,
                    "pinned" => Placement::Pinned,
                    _ => bad(&flag, "must be hosted or pinned"),
                }
            }
            "--threads" => match value.parse() {
                Ok(n) if n > 0 => threads = n,
                _ => bad(&flag, "must be a whole number above 0"),
            },
            "--grace-period" => grace = value.parse().unwrap_or_else(|e| bad(&flag, e)),
            "--limiter" => {
                local = match value.as_str() {
                    "ratelimitly" => false,
                    "local" => true,
                    _ => bad(&flag, "must be ratelimitly or local"),
                }
            }
            _ => bad(&flag, "unknown flag"),
        }
    }
    let listen: SocketAddr = listen.unwrap_or_else(|| bad("--listen", "missing"));
    if listen.port() == 0 {
        bad("--listen", "port 0 is not supported (name the port)");
    }
    Args {
        listen,
        upstream: upstream.unwrap_or_else(|| bad("--upstream", "missing")),
        endpoints: match endpoints {
            Some(e) => e,
            None if local => String::new(),
            None => bad("--endpoint", "missing"),
        },
        limit: limit.unwrap_or_else(|| bad("--limit", "missing")),
        on_failure,
        trusted,
        key_by,
        placement,
        threads,
        grace,
        local,
    }
}

/// Prints the ready line once the server runs and `addr` accepts connections
/// (bounded: 10 s).
fn announce_ready(mut phases: tokio::sync::broadcast::Receiver<ExecutionPhase>, addr: SocketAddr) {
    std::thread::spawn(move || {
        loop {
            match phases.blocking_recv() {
                Ok(ExecutionPhase::Running) => break,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                println!(
                    r#"{{"event":"ready","address":"{}","port":{}}}"#,
                    addr.ip(),
                    addr.port()
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        eprintln!("proxy: {addr} did not accept connections within 10 s");
    });
}

/// The limiter of `--limit`: the engine hosted (built on the first request) or pinned
/// (built here).
fn limiter(args: &Args, limit: Limit, key: ApiKey) -> Result<RateLimiter, BuildError> {
    let classify = keyed(limit, args.key_by.clone())
        .prefix("pingora")
        .trusted_proxies(args.trusted.clone());
    let endpoints = parse_endpoints(&args.endpoints).unwrap_or_else(|e| bad("--endpoint", e));
    let builder = Engine::builder(key).endpoints(endpoints);
    let limiter = match args.placement {
        Placement::Hosted => RateLimiter::hosted(builder, classify),
        Placement::Pinned => RateLimiter::new(builder.build()?, classify),
    };
    Ok(match args.on_failure {
        Some(action) => limiter.failure_policy(FailurePolicy::all(action)),
        None => limiter,
    })
}

fn main() -> ExitCode {
    let args = parse_args();
    let local = match (args.local, args.limit) {
        (true, Some(limit)) => Some((
            pingora_limits::rate::Rate::new(limit.window()),
            limit.count(),
        )),
        _ => None,
    };
    let limit = if args.local { None } else { args.limit };
    // The local limiter talks to no service: no key to read.
    let key = match key_from_env() {
        Ok(k) => Some(k),
        Err(_) if args.local => None,
        Err(e) => bad(
            "RATELIMITLY_API_KEY",
            format_args!("{e} (keys come from the RATELIMITLY_API_KEY environment variable)"),
        ),
    };
    let limiter = limit
        .zip(key)
        .map(|(limit, key)| limiter(&args, limit, key));
    let limiter = match limiter.transpose() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("proxy: the engine did not start: {e}");
            return ExitCode::FAILURE;
        }
    };

    let conf = ServerConf {
        threads: args.threads,
        grace_period_seconds: Some(args.grace),
        graceful_shutdown_timeout_seconds: Some(args.grace),
        ..ServerConf::default()
    };
    let mut server = Server::new_with_opt_and_conf(None, conf);
    server.bootstrap();
    let mut service = http_proxy_service(
        &server.configuration,
        Proxy {
            limiter,
            local,
            upstream: args.upstream,
        },
    );
    service.add_tcp(&args.listen.to_string());
    server.add_service(service);
    announce_ready(server.watch_execution_phase(), args.listen);
    server.run(pingora::server::RunArgs::default());
    ExitCode::SUCCESS
}
