//! From a parsed command line to the mode it names: `--mode rls`'s environment variables
//! (envoyproxy/ratelimit's; a flag on the command line wins over its variable), logging,
//! then the mode's `run`.
//!
//! Owns: the order of those three. Must not touch: what a mode does (`proxy`,
//! `forward_auth`, `rls`), how the process exits (`main.rs`).

use clap::{ArgMatches, FromArgMatches};

use crate::cli::{Cli, Mode};
use crate::start::StartError;

/// Runs the mode `matches` names until it stops ([`StartError::Usage`] for arguments,
/// variables or files that are wrong, [`StartError::Runtime`] for a start that failed).
pub fn run(matches: &ArgMatches) -> Result<(), StartError> {
    #[allow(unused_mut)] // changed by --mode rls's environment variables only
    let mut cli = Cli::from_arg_matches(matches).map_err(|e| StartError::Usage(e.to_string()))?;
    #[cfg(feature = "rls")]
    let settings = if cli.mode == Mode::Rls {
        let explicit =
            |id: &str| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        crate::rls::env::apply(&mut cli, &explicit, &|k| std::env::var(k).ok())
            .map_err(StartError::Usage)?
    } else {
        crate::rls::env::Settings::default()
    };
    #[cfg(feature = "rls")]
    let level = settings.log_level.clone();
    #[cfg(not(feature = "rls"))]
    let level: Option<String> = None;
    crate::logging::init_with(cli.log_format, level.as_deref()).map_err(StartError::Usage)?;
    match cli.mode {
        Mode::Proxy => crate::proxy::run(cli),
        Mode::ForwardAuth => crate::forward_auth::run(cli),
        #[cfg(feature = "rls")]
        Mode::Rls => {
            for w in &settings.warnings {
                tracing::warn!("{w}");
            }
            crate::rls::run_with(cli, settings)
        }
    }
}
