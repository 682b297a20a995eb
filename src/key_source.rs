//! The one key loader of the workspace: the API key comes from the environment variable
//! [`KEY_ENV`] (`RATELIMITLY_API_KEY`) or from a file given with `--key-file PATH`, never
//! from the command line. rlctl, loadgen, rl-responder and the proxy all load their key
//! here, so they share one rule and one set of error messages.
//!
//! Rules:
//! * `--key-file PATH` wins over the environment when given; the file holds one key.
//! * Surrounding whitespace (a trailing newline, spaces) is ignored; nothing else is.
//! * The key text is never echoed: [`KeyLoadError`] names the rule that failed (missing,
//!   unreadable file, which key rule), never the text.
//! * The text read is wiped from memory ([`zeroize`]) once it is parsed; callers that must
//!   hand the text to another parser (the official client, in loadgen) get it as
//!   [`KeyText`], which wipes itself on drop and whose `Debug` shows nothing.
//!
//! Owns: reading the key text and turning it into an [`ApiKey`]. Must not touch: the key
//! format itself (that is [`crate::proto::key`]), sockets, output.

use std::fmt;
use std::io;
use std::path::Path;

use zeroize::Zeroizing;

use crate::proto::error::KeyError;
use crate::proto::key::ApiKey;

/// Environment variable holding the API key.
pub const KEY_ENV: &str = "RATELIMITLY_API_KEY";

/// Why no API key could be loaded. Never carries the key text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyLoadError {
    /// Neither `--key-file` nor [`KEY_ENV`] is set (or the variable is empty).
    #[error("no API key: set RATELIMITLY_API_KEY or pass --key-file PATH")]
    Missing,
    /// [`KEY_ENV`] is set but is not valid UTF-8.
    #[error("RATELIMITLY_API_KEY is not valid UTF-8")]
    EnvNotUnicode,
    /// The `--key-file` could not be read (or is not UTF-8).
    #[error("cannot read the key file: {0}")]
    FileRead(io::ErrorKind),
    /// The key text is invalid; the variant names the rule.
    #[error("invalid API key: {0}")]
    Invalid(KeyError),
}

/// Key text as read (trimmed), wiped from memory when dropped. `Debug` never shows it.
pub struct KeyText(Zeroizing<String>);

impl KeyText {
    /// The trimmed key text. Never print it.
    pub fn expose(&self) -> &str {
        self.0.trim()
    }

    /// Parses the text into a key.
    pub fn parse(&self) -> Result<ApiKey, KeyLoadError> {
        self.expose().parse().map_err(KeyLoadError::Invalid)
    }
}

impl fmt::Debug for KeyText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyText(..)")
    }
}

/// Reads the key text: from `key_file` when given, else from [`KEY_ENV`]. An unset or
/// empty (all-whitespace) variable is [`KeyLoadError::Missing`].
pub fn read_key_text(key_file: Option<&Path>) -> Result<KeyText, KeyLoadError> {
    let text = match key_file {
        Some(path) => Zeroizing::new(
            std::fs::read_to_string(path).map_err(|e| KeyLoadError::FileRead(e.kind()))?,
        ),
        None => match std::env::var(KEY_ENV) {
            Ok(v) => Zeroizing::new(v),
            Err(std::env::VarError::NotPresent) => return Err(KeyLoadError::Missing),
            Err(std::env::VarError::NotUnicode(_)) => return Err(KeyLoadError::EnvNotUnicode),
        },
    };
    if text.trim().is_empty() {
        return Err(KeyLoadError::Missing);
    }
    Ok(KeyText(text))
}

/// Loads the key (see the module rules); the text is wiped before this returns.
pub fn load_key(key_file: Option<&Path>) -> Result<ApiKey, KeyLoadError> {
    read_key_text(key_file)?.parse()
}

/// Like [`load_key`], but a missing key is `Ok(None)` (for a server that may get its keys
/// from elsewhere too, such as rl-responder's `--keys-file`).
pub fn load_optional_key(key_file: Option<&Path>) -> Result<Option<ApiKey>, KeyLoadError> {
    match load_key(key_file) {
        Ok(k) => Ok(Some(k)),
        Err(KeyLoadError::Missing) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key file in a fresh temporary directory.
    fn key_file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("rl-key-source-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn file_is_trimmed_and_errors_never_echo() {
        let none = rl_testkit::keys::NONE;
        let p = key_file("ok", &format!("  {none}\n\n"));
        assert_eq!(load_key(Some(&p)).unwrap().key_id(), 72_623_859_790_382_856);
        let bad = &none[..none.len() - 1];
        let p = key_file("bad", bad);
        let err = load_key(Some(&p)).unwrap_err();
        assert!(matches!(err, KeyLoadError::Invalid(_)), "{err:?}");
        assert!(!err.to_string().contains("qyyq"), "{err}");
        let p = key_file("empty", " \n");
        assert_eq!(load_key(Some(&p)), Err(KeyLoadError::Missing));
        let missing = p.with_file_name("does-not-exist");
        assert_eq!(
            load_key(Some(&missing)),
            Err(KeyLoadError::FileRead(io::ErrorKind::NotFound))
        );
        assert_eq!(load_optional_key(Some(&p)), Ok(None));
        let text = read_key_text(Some(&key_file("dbg", none))).unwrap();
        assert_eq!(format!("{text:?}"), "KeyText(..)");
        assert_eq!(text.expose(), none);
    }
}
