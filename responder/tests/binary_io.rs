//! The `rl-responder` binary's I/O flags: `--io uring|mmsg|auto` and
//! `--reply-batch on|off` keep the readiness line and answer requests.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rl-responder"));
    c.env_remove("RATELIMITLY_API_KEY");
    c
}

const B: R = R {
    bucket: [9; 16],
    window: 60_000,
    rate: 100,
    tokens: 1,
};

#[test]
fn io_flags_serve_requests() {
    for (io, batch) in [("mmsg", "off"), ("uring", "on"), ("auto", "on")] {
        let mut child = bin()
            .env("RATELIMITLY_API_KEY", AES_KEY)
            .args(["--server-id", "777", "--io", io, "--reply-batch", batch])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if line.is_empty() && io == "uring" {
            // io_uring refused on this host: the binary exits 2 with a message
            let st = child.wait().unwrap();
            assert_eq!(st.code(), Some(2));
            continue;
        }
        assert!(
            line.starts_with(r#"{"event":"ready","address":"127.0.0.1","port":"#),
            "{io}: {line}"
        );
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let addr = SocketAddr::from(([127, 0, 0, 1], v["port"].as_u64().unwrap() as u16));
        let k = key(AES_KEY);
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        for i in 0..3 {
            s.send_to(
                &datagram_now(&k, uid(i), &request_pdu(5_000, &[], &[B])),
                addr,
            )
            .unwrap();
            let mut buf = [0u8; 2048];
            let n = s.recv(&mut buf).unwrap();
            let r = read_response(&k, &buf[..n]).unwrap();
            assert!(r.granted());
            assert_eq!(r.server_id, 777);
        }
        // SAFETY: signalling our own child by pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let mut stopped = false;
        for _ in 0..100 {
            if let Some(st) = child.try_wait().unwrap() {
                assert!(st.success(), "{st:?}");
                stopped = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if !stopped {
            let _ = child.kill();
            panic!("{io}: did not stop on SIGTERM within 2 s");
        }
    }
}

#[test]
fn bad_io_flags_exit_two() {
    for args in [["--io", "epoll"], ["--reply-batch", "maybe"]] {
        let out = bin()
            .env("RATELIMITLY_API_KEY", AES_KEY)
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}
