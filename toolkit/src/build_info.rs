//! The commit the tools were built from, recorded by `build.rs` (git at build time).
//!
//! Owns: [`COMMIT`], [`DIRTY`] and the version line tools print (`-V`). Must not touch:
//! git at run time.

/// Full hash of the commit checked out at build time, or `unknown` without git.
pub const COMMIT: &str = env!("RL_BUILD_COMMIT");

/// `true` when tracked files differed from [`COMMIT`] at build time, `false`, or
/// `unknown` without git.
pub const DIRTY: &str = env!("RL_BUILD_DIRTY");

/// The version line of `-V`: the crate version, the commit and the dirty mark, e.g.
/// `0.1.0 (commit 0123abc…, dirty)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("RL_BUILD_COMMIT"),
    ", dirty: ",
    env!("RL_BUILD_DIRTY"),
    ")"
);

/// [`DIRTY`] as a JSON-friendly value: `Some(true|false)`, `None` when unknown.
pub fn dirty() -> Option<bool> {
    match DIRTY {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_commit_is_a_hash_or_unknown() {
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 40 && COMMIT.bytes().all(|b| b.is_ascii_hexdigit())),
            "{COMMIT}"
        );
        assert!(VERSION.starts_with(env!("CARGO_PKG_VERSION")));
        assert_eq!(dirty().is_none(), DIRTY == "unknown");
    }
}
