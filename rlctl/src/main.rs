//! rlctl — command-line tool for debugging a Ratelimitly deployment (wire v2).
//!
//! Layout (one responsibility per file): `cli.rs` (the clap definitions and help),
//! `cmd/` (one file per command), `args.rs` (bucket and tracker specs), `servers.rs`
//! (static endpoints or DNS), `send.rs` (the one-shot engine, and the traced request of
//! `--verbose`), `output.rs` (exit codes, JSON and error printing). What it shares with
//! loadgen (the wording of failures, the traced request, the probe after a timeout, UTC
//! text) is the `rl-toolkit` crate.
//!
//! Must not touch: the wire format, request policy rules or selection (they live in the
//! engine crate). The API key is read by `ratelimitly_engine::key_source` from
//! `RATELIMITLY_API_KEY` or `--key-file PATH`, never from the command line, and is never
//! printed (not even in errors).

// The doc comments of the clap structs in cli.rs are --help text written for a terminal
// (`<DOMAIN>`, `[::1]`), not rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod args;
mod cli;
mod cmd;
mod output;
mod send;
mod servers;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    ExitCode::from(cmd::run(&cli.command))
}
