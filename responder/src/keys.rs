//! Key loading for the `rl-responder` binary: the `RATELIMITLY_API_KEY` environment
//! variable and an optional keys file (one key per line, `#` comments, blank lines
//! ignored). Keys never come from the command line.
//!
//! Owns: reading and parsing key text. Must not touch: sockets, the decision logic.
//! Errors name the variable, the file and the line, never the key text.

use std::path::{Path, PathBuf};

use ratelimitly_engine::key::{ApiKey, KeyError};

/// The environment variable holding the default key.
pub const KEY_ENV: &str = "RATELIMITLY_API_KEY";

/// Why keys could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeysError {
    /// Neither the environment variable nor a keys file supplied a key.
    #[error("no API key: set {KEY_ENV} (or pass --keys-file PATH)")]
    NoKey,
    /// The environment variable is not valid Unicode.
    #[error("{KEY_ENV} is not valid UTF-8")]
    EnvNotUnicode,
    /// The environment variable holds an invalid key.
    #[error("{KEY_ENV} holds an invalid API key: {0}")]
    BadEnvKey(#[source] KeyError),
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

/// The key from [`KEY_ENV`] (if set and non-empty) followed by the keys of `file`;
/// duplicates (same key id) keep the first.
pub fn load(file: Option<&Path>) -> Result<Vec<ApiKey>, KeysError> {
    let mut keys: Vec<ApiKey> = Vec::new();
    match std::env::var(KEY_ENV) {
        Ok(v) if !v.trim().is_empty() => keys.push(v.trim().parse().map_err(KeysError::BadEnvKey)?),
        Ok(_) | Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(_)) => return Err(KeysError::EnvNotUnicode),
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).map_err(|source| KeysError::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        for k in parse_keys_text(&text, path)? {
            if !keys.iter().any(|e| e.key_id() == k.key_id()) {
                keys.push(k);
            }
        }
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
