//! Records the commit the tools are built from: `RL_BUILD_COMMIT` (full hash, or
//! `unknown` without git) and `RL_BUILD_DIRTY` (`true` when tracked files differ from
//! that commit at build time, `false`, or `unknown`), read by `src/build_info.rs`.
//!
//! The script runs again when HEAD, the branch it points to or the index move, or when a
//! source file of the crates the tools are built from changes, so the dirty flag follows
//! edits too.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) => (!s.is_empty()).to_string(),
        None => "unknown".into(),
    };
    println!("cargo:rustc-env=RL_BUILD_COMMIT={commit}");
    println!("cargo:rustc-env=RL_BUILD_DIRTY={dirty}");
    let mut watch = Vec::new();
    for what in ["HEAD", "index", "packed-refs"] {
        watch.extend(git(&["rev-parse", "--git-path", what]));
    }
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watch.extend(git(&["rev-parse", "--git-path", &branch]));
    }
    for dir in [
        "../src",
        "../Cargo.toml",
        "../Cargo.lock",
        "src",
        "../loadgen/src",
        "../rlctl/src",
        "../responder/src",
        "../testkit/src",
    ] {
        watch.push(dir.into());
    }
    for path in watch {
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
