//! Key loading for the `rl-responder` binary: the primary key (from
//! `RATELIMITLY_API_KEY` or `--key-file`, read by the engine's one key loader,
//! `ratelimitly_engine::key_source`) and an optional keys file with more keys (one key
//! per line, `#` comments, blank lines ignored). Keys never come from the command line.
//!
//! Owns: the keys-file format and merging it with the primary key. Must not touch:
//! sockets, the decision logic. Errors name the variable, the file and the line, never
//! the key text.

use std::path::{Path, PathBuf};

use ratelimitly_engine::key_source::{self, KeyLoadError};
use ratelimitly_engine::proto::key::{ApiKey, KeyError};

/// Why keys could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// Neither the primary key nor a keys file supplied a key.
    #[error("no API key: set RATELIMITLY_API_KEY, or pass --key-file PATH or --keys-file PATH")]
    NoKey,
    /// The primary key (`RATELIMITLY_API_KEY` or `--key-file`) could not be loaded.
    #[error("{0}")]
    Primary(#[source] KeyLoadError),
    /// The keys file could not be read.
    #[error("cannot read keys file {path}: {source}")]
    ReadFile {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line of the keys file holds an invalid key.
    #[error("keys file {path} line {line}: invalid API key: {source}")]
    BadFileKey {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What was wrong (never the key text).
        source: KeyError,
    },
}

/// The development key of `rl-responder --dev`: authentication mode none, key id
/// 72623859790382856, public in this repository (the test fixture `rust_none_fixture`).
/// For local tests and the quickstarts only: **never for production**, anyone can
/// read it here, and requests made with it are not authenticated.
pub const DEV_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";

/// `--dev`: [`DEV_KEY`] followed by the keys of `keys_file`, if any (neither
/// `RATELIMITLY_API_KEY` nor `--key-file` is read).
pub fn dev(keys_file: Option<&Path>) -> Result<Vec<ApiKey>, KeysError> {
    let mut keys: Vec<ApiKey> = vec![DEV_KEY.parse().expect("the development key is valid")];
    if let Some(path) = keys_file {
        add_keys_file(&mut keys, path)?;
    }
    Ok(keys)
}

/// Appends the keys of the file at `path` to `keys`; duplicates (same key id) keep the
/// first.
fn add_keys_file(keys: &mut Vec<ApiKey>, path: &Path) -> Result<(), KeysError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeysError::ReadFile {
        path: path.to_owned(),
        source,
    })?;
    for k in parse_keys_text(&text, path)? {
        if !keys.iter().any(|e| e.key_id() == k.key_id()) {
            keys.push(k);
        }
    }
    Ok(())
}

/// Parses a keys file's text (one key per line, `#` comments).
pub fn parse_keys_text(text: &str, path: &Path) -> Result<Vec<ApiKey>, KeysError> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let key = line.parse().map_err(|source| KeysError::BadFileKey {
            path: path.to_owned(),
            line: i + 1,
            source,
        })?;
        keys.push(key);
    }
    Ok(keys)
}

/// The primary key (from `key_file`, else `RATELIMITLY_API_KEY`, if either is set)
/// followed by the keys of `keys_file`; duplicates (same key id) keep the first.
pub fn load(key_file: Option<&Path>, keys_file: Option<&Path>) -> Result<Vec<ApiKey>, KeysError> {
    let mut keys: Vec<ApiKey> = Vec::new();
    if let Some(k) = key_source::load_optional_key(key_file).map_err(KeysError::Primary)? {
        keys.push(k);
    }
    if let Some(path) = keys_file {
        add_keys_file(&mut keys, path)?;
    }
    if keys.is_empty() {
        return Err(KeysError::NoKey);
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dev_key_is_the_public_none_fixture() {
        assert_eq!(DEV_KEY, rl_testkit::keys::NONE);
        let keys = dev(None).unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys[0].key_id(), 72623859790382856);
    }

    #[test]
    fn file_text_with_comments_and_errors_without_key_text() {
        let aes = rl_testkit::keys::AES;
        let text = format!("# keys\n\n{aes}  # key 3\n");
        let keys = parse_keys_text(&text, Path::new("k.txt")).unwrap();
        assert_eq!(keys[0].key_id(), 3);
        let bad = format!("{aes}\n{}x\n", &aes[..aes.len() - 1]);
        let err = parse_keys_text(&bad, Path::new("k.txt"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(!err.contains("qypsq"), "{err}");
    }
}
