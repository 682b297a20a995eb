//! The `rl-proxy` binary: parses the command line and hands it to the library
//! (`rl_proxy::entry::run`: the environment of `--mode rls`, logging, the mode). Exit status: 0 after SIGINT or
//! SIGTERM (or a `--check` that passed), 2 for bad arguments, files or key, 1 when
//! starting failed otherwise.

use std::process::ExitCode;

use clap::CommandFactory;
use rl_proxy::{Cli, StartError};

/// mimalloc, as in the responder and loadgen: a proxied request allocates a few dozen
/// small blocks (hyper's buffers and futures, the upstream request). Under
/// `proxy/bench/run.sh`'s load, glibc's malloc and free took about 2.0 µs of CPU per
/// engine-admitted request and 0.6 with `--limit off` (`perf record -e cpu-clock`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    match rl_proxy::entry::run(&matches) {
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
