//! envoyproxy/ratelimit's environment variables, for the settings both have (`--mode rls`
//! only; a flag on the command line wins over its variable).
//!
//! | variable | here |
//! |---|---|
//! | `GRPC_HOST`, `GRPC_PORT` | `--listen` (either alone: the other from `--listen`'s default, port 8081 as the reference's) |
//! | `HOST`, `PORT` | `--admin-listen` (`/json`, `/healthcheck`, and `/metrics`, `/rlconfig`) |
//! | `LOG_LEVEL` | the log filter when `RUST_LOG` is unset (`debug`, `info`, `warn`, `error`, `trace`; `fatal`, `panic`: `error`) |
//! | `LOG_FORMAT` | `--log-format` (`text`, `json`) |
//! | `RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`, `RUNTIME_APPDIRECTORY` | the directory read without `--config` (`run`) |
//! | `RUNTIME_IGNOREDOTFILES`, `RUNTIME_WATCH_ROOT` | accepted: dot files are always ignored, the directory always watched |
//! | `LIMIT_RESPONSE_HEADERS_ENABLED` | `false`: no `RateLimit-Policy`/`RateLimit` headers in `response_headers_to_add` (unset: they are added) |
//! | `NEAR_LIMIT_RATIO` | the share of a limit above which hits count as `near_limit` in `rl_proxy_rls_descriptor_hits_total` (default 0.8) |
//! | `SHADOW_MODE` | `true`: never `OVER_LIMIT` overall (counted in `rl_proxy_rls_global_shadow_mode_total`) |
//!
//! Every other variable of the reference that is set ([`UNSUPPORTED`]: Redis, Memcache,
//! statsd, TLS, xDS, tracing, ...) is logged once at `warn` at the start: it takes no
//! effect here.
//!
//! Owns: reading the variables. Must not touch: what the settings do.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

use crate::cli::Cli;
use crate::logging::LogFormat;

/// The reference's variables that have no effect here (prefixes end with `_`).
pub const UNSUPPORTED: &[&str] = &[
    "PROTO",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_",
    "XDS_CLIENT_BACKOFF_",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_",
    "MEMCACHE_",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_",
];

/// The settings read from the variables that are not flags.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// `LOG_LEVEL`, as a log directive.
    pub log_level: Option<String>,
    /// `LIMIT_RESPONSE_HEADERS_ENABLED=false`: no RateLimit headers.
    pub no_headers: bool,
    /// `SHADOW_MODE=true`.
    pub shadow: bool,
    /// What to log at `warn` once logging is up: the unsupported variables set.
    pub warnings: Vec<String>,
}

fn boolean(name: &str, v: &str) -> Result<bool, String> {
    // Go's strconv.ParseBool, as the reference's envconfig reads them
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{name}={v:?} is not true or false")),
    }
}

/// Reads the variables from `var` into `cli` where `explicit(flag id)` says the flag was
/// not on the command line, and returns the other settings. A value that does not
/// parse is an error naming the variable.
pub fn apply(
    cli: &mut Cli,
    explicit: &dyn Fn(&str) -> bool,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, String> {
    let var = |k: &str| var(k).filter(|v| !v.trim().is_empty());
    let addr = |host: &str,
                port: &str,
                default: SocketAddr|
     -> Result<Option<SocketAddr>, String> {
        let (h, p) = (var(host), var(port));
        if h.is_none() && p.is_none() {
            return Ok(None);
        }
        let port = match p {
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| format!("{port}={p:?} is not a port"))?,
            None => default.port(),
        };
        let ip = match h.as_deref().map(str::trim) {
            None => default.ip(),
            Some(h) => match h.parse::<IpAddr>() {
                Ok(ip) => ip,
                // a name, as the reference's listen resolves it (`localhost`)
                Err(_) => (h, port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut a| a.next())
                    .map(|a| a.ip())
                    .ok_or_else(|| {
                        format!("{host}={h:?} is neither an IP address nor a name that resolves")
                    })?,
            },
        };
        Ok(Some(SocketAddr::new(ip, port)))
    };
    let any: SocketAddr = "0.0.0.0:0".parse().expect("an address");
    if !explicit("listen")
        && let Some(a) = addr("GRPC_HOST", "GRPC_PORT", SocketAddr::new(any.ip(), 8081))?
    {
        cli.listen = a;
    }
    if !explicit("admin_listen")
        && let Some(a) = addr("HOST", "PORT", SocketAddr::new(any.ip(), 8080))?
    {
        cli.admin_listen = a;
    }
    if !explicit("log_format")
        && let Some(f) = var("LOG_FORMAT")
    {
        cli.log_format = match f.trim().to_ascii_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err(format!("LOG_FORMAT={f:?} is not text or json")),
        };
    }
    let mut s = Settings::default();
    if let Some(l) = var("LOG_LEVEL") {
        let level = match l.trim().to_ascii_lowercase().as_str() {
            "trace" => "trace",
            "debug" => "debug",
            "info" => "info",
            "warn" | "warning" => "warn",
            "error" | "fatal" | "panic" => "error",
            _ => return Err(format!("LOG_LEVEL={l:?} is not a log level")),
        };
        s.log_level = Some(level.to_owned());
    }
    if let Some(v) = var("LIMIT_RESPONSE_HEADERS_ENABLED") {
        s.no_headers = !boolean("LIMIT_RESPONSE_HEADERS_ENABLED", v.trim())?;
    }
    if let Some(v) = var("NEAR_LIMIT_RATIO") {
        let r: f32 = v
            .trim()
            .parse()
            .ok()
            .filter(|r: &f32| (0.0..=1.0).contains(r))
            .ok_or_else(|| format!("NEAR_LIMIT_RATIO={v:?} is not a number from 0 to 1"))?;
        super::metrics::set_near_limit_ratio(r);
    }
    if let Some(v) = var("SHADOW_MODE") {
        s.shadow = boolean("SHADOW_MODE", v.trim())?;
    }
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let unsupported = UNSUPPORTED.iter().any(|u| {
            if u.ends_with('_') {
                k.starts_with(u)
            } else {
                k == *u
            }
        });
        if unsupported && var(k).is_some() {
            s.warnings.push(format!(
                "{k} is set: envoyproxy/ratelimit's setting, without effect in rl-proxy --mode rls (proxy/README.md, \"Coming from envoyproxy/ratelimit\")"
            ));
        }
    }
    s.warnings.sort();
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn cli() -> Cli {
        Cli::parse_from(["rl-proxy", "--mode", "rls"])
    }

    fn vars(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn variables_flags_and_refusals() {
        let mut c = cli();
        let s = apply(
            &mut c,
            &|_| false,
            &vars(&[
                ("GRPC_PORT", "9001"),
                ("HOST", "localhost"),
                ("LOG_LEVEL", "Debug"),
                ("SHADOW_MODE", "1"),
                ("LIMIT_RESPONSE_HEADERS_ENABLED", "false"),
            ]),
        )
        .unwrap();
        assert_eq!(c.listen, "0.0.0.0:9001".parse().unwrap());
        assert!(c.admin_listen.ip().is_loopback() && c.admin_listen.port() == 8080);
        assert_eq!(s.log_level.as_deref(), Some("debug"));
        assert!(s.shadow && s.no_headers);
        // a flag given wins
        let mut c = cli();
        let before = c.listen;
        apply(
            &mut c,
            &|id| id == "listen",
            &vars(&[("GRPC_PORT", "9001")]),
        )
        .unwrap();
        assert_eq!(c.listen, before);
        let bad: [&'static [(&'static str, &'static str)]; 6] = [
            &[("GRPC_PORT", "x")],
            &[("GRPC_HOST", "no such host.invalid")],
            &[("LOG_FORMAT", "xml")],
            &[("LOG_LEVEL", "loud")],
            &[("SHADOW_MODE", "yes")],
            &[("NEAR_LIMIT_RATIO", "1.5")],
        ];
        for b in bad {
            let e = apply(&mut cli(), &|_| false, &vars(b)).unwrap_err();
            assert!(e.contains(b[0].0), "{e}");
        }
    }
}
