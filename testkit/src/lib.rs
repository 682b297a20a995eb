//! Shared test fixtures of the workspace, used as a `dev-dependency` by the engine, the
//! responder, rlctl and loadgen test suites and benches (and as a plain dependency by
//! loadgen, whose embedded run uses the public fixture keys).
//!
//! Owns: the public fixture keys ([`keys`]), endpoint helpers ([`endpoints`]), a
//! responder harness ([`harness`], feature `harness`, on by default) and the location of
//! the test vectors ([`vectors_path`]). Must not hold test logic: each suite keeps its own
//! assertions.
//!
//! Every key here is a **public synthetic test fixture** from `tests/data/vectors.json`,
//! never a credential.

pub mod endpoints;
#[cfg(feature = "harness")]
pub mod harness;
pub mod keys;

use std::path::PathBuf;

/// `tests/data/vectors.json` of this repository (the protocol test vectors; see
/// `tests/data/README.md`).
pub fn vectors_path() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/data/vectors.json"
    ))
}
