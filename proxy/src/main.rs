//! The `rl-proxy` binary: parses the command line, starts logging and runs the mode it
//! names (the library, `rl_proxy`, does the rest). Exit status: 0 after SIGINT or
//! SIGTERM (or a `--check` that passed), 2 for bad arguments, files or key, 1 when
//! starting failed otherwise.

use std::process::ExitCode;

use clap::Parser;
use rl_proxy::{Cli, Mode, StartError};

/// mimalloc, as in the responder and loadgen: a proxied request allocates a few dozen
/// small blocks (hyper's buffers and futures, the upstream request). Under
/// `proxy/bench/run.sh`'s load, glibc's malloc and free took about 2.0 µs of CPU per
/// engine-admitted request and 0.6 with `--limit off` (`perf record -e cpu-clock`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = rl_proxy::logging::init(cli.log_format).and_then(|()| match cli.mode {
        Mode::Proxy => rl_proxy::proxy::run(cli),
        Mode::ForwardAuth => rl_proxy::forward_auth::run(cli),
        #[cfg(feature = "rls")]
        Mode::Rls => rl_proxy::rls::run(cli),
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
