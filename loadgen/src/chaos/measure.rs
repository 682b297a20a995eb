//! Resident memory and open descriptors of this process, as the chaos run samples them.
//!
//! Owns reading /proc/self. Must not judge (`verdict.rs`) or report (`report.rs`).

use std::collections::BTreeMap;

/// Descriptors around the whole client.
#[derive(Clone, Debug)]
pub(super) struct Fds {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Kinds with more descriptors at the end than at the start (`kind x n`), and fewer.
    pub(super) opened: Vec<String>,
    pub(super) closed: Vec<String>,
}

/// Resident memory of this process (KiB), from /proc/self/status.
pub(super) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Open descriptors of this process by kind (`socket`, `anon_inode:[eventfd]`, a path),
/// with how many of each; the listing's own descriptor is left out.
pub(super) fn fd_kinds() -> BTreeMap<String, u64> {
    let mut kinds = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return kinds;
    };
    for e in dir.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if t.starts_with("/proc/") && t.ends_with("/fd") {
            continue;
        }
        // `socket:[1234]` and `pipe:[1234]` by kind; a restarted server's socket is new
        let kind = match t.split_once(":[") {
            Some((k, _)) if k == "socket" || k == "pipe" => k.to_string(),
            _ => t.into_owned(),
        };
        *kinds.entry(kind).or_insert(0) += 1;
    }
    kinds
}

/// How many descriptors of each kind `a` has beyond `b` (`kind x n`).
pub(super) fn fd_excess(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Vec<String> {
    a.iter()
        .filter_map(|(k, n)| {
            let extra = n.saturating_sub(b.get(k).copied().unwrap_or(0));
            (extra > 0).then(|| format!("{k} x {extra}"))
        })
        .collect()
}
