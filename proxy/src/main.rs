//! The `rl-proxy` binary: parses the command line, starts logging and runs the mode it
//! names (the library, `rl_proxy`, does the rest). Exit status: 0 after SIGINT or
//! SIGTERM (or a `--check` that passed), 2 for bad arguments, files or key, 1 when
//! starting failed otherwise.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches};
use rl_proxy::{Cli, Mode, StartError};

/// mimalloc, as in the responder and loadgen: a proxied request allocates a few dozen
/// small blocks (hyper's buffers and futures, the upstream request). Under
/// `proxy/bench/run.sh`'s load, glibc's malloc and free took about 2.0 µs of CPU per
/// engine-admitted request and 0.6 with `--limit off` (`perf record -e cpu-clock`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    #[allow(unused_mut)] // changed by --mode rls's environment variables only
    let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    // --mode rls: envoyproxy/ratelimit's environment variables, a flag on the command
    // line winning over its variable
    #[cfg(feature = "rls")]
    let settings = if cli.mode == Mode::Rls {
        let explicit =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        match rl_proxy::rls::env::apply(&mut cli, &explicit, &|k| std::env::var(k).ok()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("rl-proxy: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        rl_proxy::rls::env::Settings::default()
    };
    #[cfg(feature = "rls")]
    let level = settings.log_level.clone();
    #[cfg(not(feature = "rls"))]
    let level: Option<String> = None;
    let logging = rl_proxy::logging::init_with(cli.log_format, level.as_deref());
    let result = logging
        .map_err(StartError::Usage)
        .and_then(|()| match cli.mode {
            Mode::Proxy => rl_proxy::proxy::run(cli),
            Mode::ForwardAuth => rl_proxy::forward_auth::run(cli),
            #[cfg(feature = "rls")]
            Mode::Rls => {
                for w in &settings.warnings {
                    tracing::warn!("{w}");
                }
                rl_proxy::rls::run_with(cli, settings)
            }
        });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(StartError::Usage(m)) => {
            eprintln!("rl-proxy: {m}");
            ExitCode::from(2)
        }
        Err(StartError::Runtime(m)) => {
            eprintln!("rl-proxy: {m}");
            ExitCode::from(1)
        }
    }
}
