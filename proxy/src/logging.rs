//! The log: what is logged (`RUST_LOG`: tracing-subscriber's directives, such as
//! `rl_proxy=debug,ratelimitly_engine=info` or a bare level; `warn` when unset) and how
//! (`--log-format text|json`), on standard error. Standard output carries the readiness
//! line only.
//!
//! What an operator sees at the default level (`warn`): each failure cause once per
//! change, the breaker's transitions both ways, a refused reload; a successful reload is
//! logged at `info`.
//!
//! Owns: the subscriber. Must not touch: what the modes log.

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// The environment variable of the log's directives.
pub const LOG_ENV: &str = "RUST_LOG";

/// How log lines are written (`--log-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object a line: `timestamp`, `level`, `target`, `message` and the event's
    /// fields.
    Json,
}

/// The filter of `directives` (`None` or blank: `warn`). A directive that does not
/// parse is refused, naming it: a log that silently shows less than asked for is worse
/// than a start that fails.
pub fn filter(directives: Option<&str>) -> Result<EnvFilter, String> {
    match directives.map(str::trim) {
        None | Some("") => Ok(EnvFilter::new("warn")),
        Some(d) => EnvFilter::builder()
            .with_regex(false)
            .parse(d)
            .map_err(|e| format!("{LOG_ENV}={d:?} is not a valid log directive list: {e}")),
    }
}

/// Installs the subscriber: `RUST_LOG`'s directives (`fallback` when it is unset or
/// blank: `--mode rls`'s envoyproxy/ratelimit `LOG_LEVEL`), lines in `format` on
/// standard error. `Err`: a bad directive, named (a usage error: exit 2).
pub fn init_with(format: LogFormat, fallback: Option<&str>) -> Result<(), String> {
    let directives = std::env::var(LOG_ENV)
        .ok()
        .filter(|d| !d.trim().is_empty())
        .or_else(|| fallback.map(str::to_owned));
    let filter = filter(directives.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_parse_or_are_refused() {
        assert!(filter(None).is_ok());
        assert!(filter(Some(" ")).is_ok());
        assert!(filter(Some("debug")).is_ok());
        assert!(filter(Some("rl_proxy=debug,ratelimitly_engine=info")).is_ok());
        let e = filter(Some("rl_proxy=loud")).unwrap_err();
        assert!(e.contains("rl_proxy=loud"), "{e}");
    }
}
