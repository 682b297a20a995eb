//! The enumerated choices of the command line: the client, where the engine's core runs,
//! the embedded key's auth mode, and how the raw client waits.
//!
//! Owns these choices' names (on the command line and in the JSON). Must not touch
//! sockets, responders or clients.

use clap::ValueEnum;
use serde::Serialize;

/// Which client a run drives (the variants' doc comments are `--client`'s help text).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientKind {
    /// Our thread-per-core engine (the ratelimitly-engine crate).
    Engine,
    /// The official ratelimitly 0.1.0 crate on a Tokio runtime.
    Official,
    /// Pre-encoded requests over batched UDP, no policy: the ceiling.
    Raw,
}

impl ClientKind {
    pub fn name(self) -> &'static str {
        match self {
            ClientKind::Engine => "engine",
            ClientKind::Official => "official",
            ClientKind::Raw => "raw",
        }
    }
}

/// How the raw client waits for answers (`raw_wait` in the JSON parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RawWait {
    /// In its I/O layer until an answer arrives or work is due: CPU per decision is work.
    Sleep,
    /// Busy-polls (closed loop with `--raw-busy-poll`): CPU per decision is the polling.
    BusyPoll,
}

impl RawWait {
    pub fn name(self) -> &'static str {
        match self {
            RawWait::Sleep => "sleep",
            RawWait::BusyPoll => "busy-poll",
        }
    }
}

/// Where the engine's core runs (`--engine-core`; the variants' doc comments are its
/// `--help` text). `Auto` is settled by [`super::Args::placement`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineCore {
    /// The cheaper placement of the backend: hosted with mmsg, pinned with --io uring or
    /// auto.
    Auto,
    /// A pinned thread of its own on the first client core (the engine's default).
    Pinned,
    /// A task on loadgen's Tokio runtime (the engine builder's runtime option).
    Hosted,
}

/// Authentication mode of the embedded responders' synthetic key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthArg {
    Aes,
    Cookie,
    None,
}

impl AuthArg {
    /// The public fixture key of this mode (`rl-testkit`), which embedded runs use.
    pub fn fixture(self) -> &'static str {
        match self {
            AuthArg::Aes => rl_testkit::keys::AES,
            AuthArg::Cookie => rl_testkit::keys::COOKIE,
            AuthArg::None => rl_testkit::keys::NONE,
        }
    }
}
