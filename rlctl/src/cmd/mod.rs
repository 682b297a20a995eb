//! One file per rlctl command: each takes its parsed options from `cli.rs`, does its
//! work and prints its result, and returns the exit status (`output.rs`).

pub mod discover;
pub mod ids;
pub mod key;
pub mod report;
pub mod request;
mod request_view;

use crate::cli::Command;

/// Runs one command; returns its exit status.
pub fn run(command: &Command) -> u8 {
    match command {
        Command::Key(c) => key::run(c),
        Command::Ids(c) => ids::run(c),
        Command::Discover(c) => discover::run(c),
        Command::Request(c) => request::run(c),
        Command::Report(c) => report::run(c),
    }
}
