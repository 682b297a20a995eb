//! `--mode proxy` (the default): a reverse proxy that admits each request through the
//! layer and forwards the granted ones to one upstream (`--upstream`, or the route
//! file's `upstream`), with `X-Forwarded-For` appended.
//!
//! Owns: the mode's start (which upstream). Must not touch: the accept loop, the layers,
//! forwarding (`crate::http_modes`).

use crate::cli::Cli;
use crate::http_modes::{self, Target};
use crate::start::StartError;

/// Runs `--mode proxy` until SIGINT or SIGTERM (or, with `--check`, checks the route
/// file).
pub fn run(cli: Cli) -> Result<(), StartError> {
    http_modes::run(cli, Target::Upstream)
}
