//! Threads and CPU time from /proc: the thread ids of this process, each thread's CPU
//! time, the host's steal time, and pinning threads to cores.
//!
//! Owns the reading of /proc and the affinity calls. Must not touch sockets, clients or
//! recorders (`stats.rs`).

use std::collections::{HashMap, HashSet};

/// Thread ids of this process.
pub fn thread_ids() -> HashSet<u32> {
    let mut out = HashSet::new();
    if let Ok(rd) = std::fs::read_dir("/proc/self/task") {
        for e in rd.flatten() {
            if let Some(id) = e.file_name().to_str().and_then(|s| s.parse().ok()) {
                out.insert(id);
            }
        }
    }
    out
}

/// CPU time (ns) of one thread of this process, from schedstat (falls back to stat ticks).
pub fn thread_cpu_ns(tid: u32) -> Option<u64> {
    thread_sample(tid).map(|s| s.cpu_ns)
}

/// One thread's CPU time (ns) and the times it was switched onto a CPU (its context
/// switches in, voluntary or not), from one read of schedstat; where the kernel keeps no
/// schedstat, the time from stat ticks and no switches.
fn thread_sample(tid: u32) -> Option<Sample> {
    if let Ok(s) = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")) {
        let mut f = s.split_whitespace().map(|v| v.parse::<u64>().ok());
        if let (Some(Some(cpu_ns)), Some(_), Some(Some(switches))) = (f.next(), f.next(), f.next())
        {
            return Some(Sample { cpu_ns, switches });
        }
    }
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(Sample {
        cpu_ns: ticks * 1_000_000_000 / clock_ticks_per_s(),
        switches: 0,
    })
}

/// What [`cpu_snapshot`] reads of a thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub cpu_ns: u64,
    pub switches: u64,
}

/// The kernel's `USER_HZ`, the unit of `/proc` CPU times.
fn clock_ticks_per_s() -> u64 {
    // SAFETY: sysconf takes an integer name and no pointers; it has no preconditions.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64
}

/// Time (ms) the host has taken from this machine's CPUs so far (`steal` in
/// `/proc/stat`, all CPUs): on a virtual machine, time its CPUs were descheduled. `None`
/// where the kernel does not report it.
pub fn host_steal_ms() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().next()?.strip_prefix("cpu ")?;
    let ticks: u64 = line.split_whitespace().nth(7)?.parse().ok()?;
    Some(ticks as f64 * 1000.0 / clock_ticks_per_s() as f64)
}

/// CPU time and switches of every thread not in `exclude`.
pub fn cpu_snapshot(exclude: &HashSet<u32>) -> HashMap<u32, Sample> {
    thread_ids()
        .into_iter()
        .filter(|t| !exclude.contains(t))
        .filter_map(|t| thread_sample(t).map(|c| (t, c)))
        .collect()
}

/// Total CPU time (ns) of the given threads.
pub fn cpu_of(tids: &HashSet<u32>) -> u64 {
    tids.iter().filter_map(|t| thread_cpu_ns(*t)).sum()
}

/// CPU used and switches made between two snapshots (threads born in between count from
/// zero).
pub fn cpu_delta(before: &HashMap<u32, Sample>, after: &HashMap<u32, Sample>) -> Sample {
    let mut d = Sample::default();
    for (t, a) in after {
        let b = before.get(t).copied().unwrap_or_default();
        d.cpu_ns += a.cpu_ns.saturating_sub(b.cpu_ns);
        d.switches += a.switches.saturating_sub(b.switches);
    }
    d
}

/// This thread's kernel id.
#[cfg(test)]
pub fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail; it has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// Pins the current thread to one core; false when the core does not exist.
pub fn pin(core: usize) -> bool {
    core_affinity::set_for_current(core_affinity::CoreId { id: core })
}

/// Pins another thread of this process to one core (best effort).
pub fn pin_thread(tid: u32, core: usize) -> bool {
    if core >= libc::CPU_SETSIZE as usize {
        return false;
    }
    // SAFETY: cpu_set_t is plain old data (all-zero bytes: the empty set); CPU_SET writes
    // the bit of `core` < CPU_SETSIZE (checked above), inside the set; sched_setaffinity
    // reads exactly size_of::<cpu_set_t>() bytes of this live local set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_steal_only_grows() {
        if let (Some(a), Some(b)) = (host_steal_ms(), host_steal_ms()) {
            assert!(b >= a);
        }
    }

    #[test]
    fn cpu_of_this_thread_is_readable() {
        assert!(thread_cpu_ns(gettid()).is_some());
        assert!(thread_ids().contains(&gettid()));
    }
}
