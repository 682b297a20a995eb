//! rlctl's output conventions: the exit codes, one-line JSON on stdout, errors on stderr
//! (or as `{"error": ...}` with `--json`), and lowercase hex of ids.
//!
//! Owns: the exit-code table (documented in `--help`, see `cli.rs`) and how a simple
//! error is shown. Must not touch: keys (errors never carry key text), sockets.

use std::fmt::Write;

use serde_json::{Value, json};

/// Exit status: granted / success.
pub const EXIT_OK: u8 = 0;
/// Exit status: the request was rejected.
pub const EXIT_REJECTED: u8 = 1;
/// Exit status: usage or configuration error, including an engine that cannot start on
/// this host (no sockets or file descriptors, no thread); nothing was sent.
pub const EXIT_CONFIG: u8 = 2;
/// Exit status: no valid response within the horizon.
pub const EXIT_TIMEOUT: u8 = 3;
/// Exit status: discovery or communication failure.
pub const EXIT_COMM: u8 = 4;

/// Prints one JSON value on one line on stdout.
pub fn print_json(v: &Value) {
    println!("{v}");
}

/// Prints `{"error": text}` (JSON) or the text on stderr; returns `code`.
pub fn simple_error(json: bool, text: &str, code: u8) -> u8 {
    if json {
        print_json(&json!({ "error": text }));
    } else {
        eprintln!("rlctl: {text}");
    }
    code
}

/// Lowercase hex of 16 id bytes.
pub fn hex16(id: &[u8; 16]) -> String {
    let mut s = String::with_capacity(32);
    for b in id {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex() {
        assert_eq!(hex16(&[0xab; 16]), "ab".repeat(16));
    }
}
