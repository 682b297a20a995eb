//! The `machine` object of the JSON report: where and from what a run came, so that a
//! figure can be traced to a host and a build.
//!
//! Owns its keys: `cores`, `kernel` (kept from earlier reports), `cpu_model`, `commit`
//! and `dirty` (the build's, `rl_toolkit::build_info`), `time` (the run's start, RFC 3339
//! UTC), `tool_version` and `host_steal_ms`. Must not touch clients or measurements.

use serde_json::{Value, json};

use crate::output::PhaseResult;

/// The kernel release (`/proc/sys/kernel/osrelease`), or `unknown`.
fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The CPU's model name from `/proc/cpuinfo` (`model name` on x86, `Model` or `Hardware`
/// elsewhere), or `unknown`.
fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    model_of(&info).unwrap_or_else(|| "unknown".into())
}

fn model_of(cpuinfo: &str) -> Option<String> {
    ["model name", "Model", "Hardware", "cpu model"]
        .iter()
        .find_map(|key| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == *key && !v.trim().is_empty()).then(|| v.trim().to_owned())
            })
        })
}

/// The `machine` value: `ncores` CPUs, the run started at `started` (RFC 3339 UTC);
/// `host_steal_ms` is the CPU time the host took from this machine during the results'
/// measurement windows (their sum; null where the kernel does not report steal).
pub fn machine_json(ncores: usize, started: &str, results: &[PhaseResult]) -> Value {
    let steal: Option<f64> = results
        .iter()
        .map(|r| r.host_steal_ms)
        .sum::<Option<f64>>()
        .filter(|_| !results.is_empty());
    json!({
        "cores": ncores,
        "kernel": kernel(),
        "cpu_model": cpu_model(),
        "commit": rl_toolkit::build_info::COMMIT,
        "dirty": rl_toolkit::build_info::dirty(),
        "time": started,
        "tool_version": env!("CARGO_PKG_VERSION"),
        "host_steal_ms": steal,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_model_is_read_from_cpuinfo() {
        let x86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) \
                   Platinum 8375C CPU @ 2.90GHz\n";
        assert_eq!(
            model_of(x86).as_deref(),
            Some("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz")
        );
        assert_eq!(
            model_of("Hardware\t: BCM2835\n").as_deref(),
            Some("BCM2835")
        );
        assert_eq!(model_of("processor\t: 0\n"), None);
        let m = machine_json(2, "2026-01-01T00:00:00Z", &[]);
        for key in [
            "cores",
            "kernel",
            "cpu_model",
            "commit",
            "dirty",
            "time",
            "tool_version",
        ] {
            assert!(m.get(key).is_some(), "{key}");
        }
        assert!(m["host_steal_ms"].is_null());
    }
}
