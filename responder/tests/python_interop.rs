//! Runs `tests/python/interop.py` (the official Python client `ratelimitly==2.0.0` against the
//! `rl-responder` binary) when Python and that package are present; `.ci/run` installs the
//! package. Without them the test says so and passes: the Rust interop tests still run.

use std::process::Command;

#[test]
fn official_python_client_interop() {
    let python_ready = Command::new("python3")
        .args(["-c", "import ratelimitly"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !python_ready {
        eprintln!("skipped: python3 with `ratelimitly==2.0.0` not available");
        return;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/python/interop.py");
    let output = Command::new("python3")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_rl-responder"))
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "python interop failed\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(
        stdout.contains(" passed, 0 failed"),
        "unexpected output: {stdout}"
    );
}
