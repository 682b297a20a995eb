//! The configuration files watched: a change applies within about two seconds without
//! a signal ([`watch`]).
//!
//! A poll, not inotify (`notify`): every second the watched paths' state is read — for
//! each path named by `--config`, and for every entry of a directory (dot entries
//! included: a ConfigMap's `..data` link), its name, the target of a symbolic link, and
//! the modification time and size of what it resolves to — and compared with the last.
//! A ConfigMap update swaps the `..data` link atomically and changes no watched file's
//! inode: inotify sees it only through the directory's events, and editors that replace
//! a file by rename drop an inotify watch on it; a poll of a few `stat`s a second sees
//! both and needs no extra crate. A change reloads through [`Reload::reload`], which
//! keeps the running rules when the files do not check.
//!
//! Owns: noticing changes. Must not touch: loading (`config`), the rules' use.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::service::Reload;

/// How often the files are looked at.
pub const POLL: Duration = Duration::from_secs(1);

/// One entry's state: (path, link target, modification time, size).
type Entry = (PathBuf, Option<PathBuf>, Option<SystemTime>, Option<u64>);

fn entry(path: &Path) -> Entry {
    let target = std::fs::read_link(path).ok();
    // follows links: the file a ConfigMap's link resolves to
    let meta = std::fs::metadata(path).ok();
    (
        path.to_path_buf(),
        target,
        meta.as_ref().and_then(|m| m.modified().ok()),
        meta.map(|m| m.len()),
    )
}

/// The state of `paths`: every path, and every entry of a directory (sorted). An error
/// names a directory that cannot be read.
pub fn state(paths: &[PathBuf]) -> Result<Vec<Entry>, String> {
    let mut out = Vec::new();
    for path in paths {
        out.push(entry(path));
        if !path.is_dir() {
            continue;
        }
        let entries =
            std::fs::read_dir(path).map_err(|e| format!("cannot watch {}: {e}", path.display()))?;
        let mut found: Vec<Entry> = entries
            .filter_map(|e| e.ok())
            .map(|e| entry(&e.path()))
            .collect();
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Watches `reload`'s files from a task: a change in their state (a file edited, added
/// or removed, a link swapped) reloads them once it has been the same for one poll (a
/// file being written is read when it is whole). Errors at once, naming the directory,
/// when the state cannot be read at the start.
pub fn watch(reload: std::sync::Arc<Reload>) -> Result<tokio::task::JoinHandle<()>, String> {
    let mut seen = state(&reload.paths)?;
    Ok(tokio::spawn(async move {
        let mut pending: Option<Vec<Entry>> = None;
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let paths = reload.paths.clone();
            let now = match tokio::task::spawn_blocking(move || state(&paths)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!("{e}");
                    continue;
                }
                Err(_) => continue,
            };
            if now == seen {
                pending = None;
                continue;
            }
            // changed since the last poll: wait until it holds still for one poll
            if pending.as_ref() != Some(&now) {
                pending = Some(now);
                continue;
            }
            tracing::info!("rate limit configuration files changed, reloading");
            let r = reload.clone();
            let _ = tokio::task::spawn_blocking(move || r.reload()).await;
            seen = now;
            pending = None;
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_swap_changes_the_state() {
        let dir = std::env::temp_dir().join(format!("rl-proxy-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("..v1")).unwrap();
        std::fs::create_dir_all(dir.join("..v2")).unwrap();
        std::fs::write(dir.join("..v1/a.yaml"), "domain: a\n").unwrap();
        std::fs::write(dir.join("..v2/a.yaml"), "domain: a\n").unwrap();
        std::os::unix::fs::symlink("..v1", dir.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.yaml", dir.join("a.yaml")).unwrap();
        let before = state(std::slice::from_ref(&dir)).unwrap();
        assert_eq!(before, state(std::slice::from_ref(&dir)).unwrap());
        std::os::unix::fs::symlink("..v2", dir.join("..tmp")).unwrap();
        std::fs::rename(dir.join("..tmp"), dir.join("..data")).unwrap();
        assert_ne!(before, state(std::slice::from_ref(&dir)).unwrap());
        let missing = dir.join("nope");
        assert!(state(std::slice::from_ref(&missing)).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
