//! The `rl-responder` binary: readiness line, clean stop on SIGTERM, key errors.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use rl_testkit::keys::AES as AES_KEY;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rl-responder"));
    c.env_remove("RATELIMITLY_API_KEY");
    c
}

#[test]
fn ready_line_then_sigterm_exits_zero() {
    let mut child = bin()
        .env("RATELIMITLY_API_KEY", AES_KEY)
        .args(["--server-id", "12345", "--cores", "2"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert!(
        line.starts_with(r#"{"event":"ready","address":"127.0.0.1","port":"#),
        "{line}"
    );
    assert_eq!(v["server_id"], 12345);
    assert!(v["port"].as_u64().unwrap() > 0);
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    for _ in 0..100 {
        if let Some(st) = child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    panic!("did not stop on SIGTERM within 2 s");
}

#[test]
fn missing_or_bad_key_exits_two_without_echoing_it() {
    let out = bin().output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RATELIMITLY_API_KEY"));
    let bad = format!("{}x", &AES_KEY[..AES_KEY.len() - 1]);
    let out = bin().env("RATELIMITLY_API_KEY", &bad).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("qypsq"), "{err}");
}

#[test]
fn key_file_is_read_like_the_environment() {
    let dir = std::env::temp_dir().join(format!("rl-responder-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("key");
    std::fs::write(&path, format!("  {AES_KEY}\n")).unwrap();
    let mut child = bin()
        .arg("--key-file")
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.starts_with(r#"{"event":"ready""#), "{line}");
    let out = bin()
        .arg("--key-file")
        .arg(dir.join("missing"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("key file"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
