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

/// `--dev`: the development key, whatever RATELIMITLY_API_KEY says, and three shell
/// lines in place of the JSON ready line: a warning comment, the key, the endpoint with
/// this server's id and address.
#[test]
fn dev_prints_the_key_and_the_endpoint_for_a_shell() {
    let mut child = bin()
        .env("RATELIMITLY_API_KEY", AES_KEY)
        .args(["--dev", "--server-id", "4242"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        lines.push(line);
    }
    assert!(
        lines[0].starts_with("# ") && lines[0].contains("NOT for production"),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        format!("export RATELIMITLY_API_KEY={}\n", rl_testkit::keys::NONE)
    );
    let endpoint = lines[2]
        .strip_prefix("export RL_ENDPOINT=4242@127.0.0.1:")
        .unwrap_or_else(|| panic!("{lines:?}"));
    assert!(endpoint.trim_end().parse::<u16>().unwrap() > 0, "{lines:?}");
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("NOT for production"));
    // --dev and --key-file exclude each other
    let out = bin()
        .args(["--dev", "--key-file", "/dev/null"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
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

/// `--log-level debug` logs every dropped datagram with why (here: a request of a key id
/// the responder does not serve, and a datagram too short for a tenant TLV); at exit the
/// drop totals by reason.
#[test]
fn debug_log_names_why_datagrams_were_dropped() {
    let mut child = bin()
        .env("RATELIMITLY_API_KEY", AES_KEY)
        .args(["--log-level", "debug"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    let port = v["port"].as_u64().unwrap() as u16;
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // a tenant TLV (type 0x4C52, size 40) of key id 99, which this responder does not serve
    let mut unknown = vec![0u8; 64];
    unknown[..4].copy_from_slice(&[0x52, 0x4C, 40, 0]);
    unknown[4..12].copy_from_slice(&99u64.to_le_bytes());
    sock.send_to(&unknown, ("127.0.0.1", port)).unwrap();
    sock.send_to(&[1, 2, 3], ("127.0.0.1", port)).unwrap();
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // both drops logged (bounded wait), then stop
    let mut log = String::new();
    while !(log.contains("unknown key id") && log.contains("malformed tenant TLV")) {
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => log.push_str(&(line + "\n")),
            Err(_) => break,
        }
    }
    // SAFETY: signalling our own child by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    reader.join().unwrap();
    log.extend(rx.try_iter().map(|l| l + "\n"));
    assert!(status.success(), "{log}");
    assert!(
        log.contains("unknown key id") && log.contains("key_id=99"),
        "{log}"
    );
    assert!(log.contains("malformed tenant TLV"), "{log}");
    assert!(
        log.contains("dropped: unknown key id 1, malformed 1"),
        "{log}"
    );
}
