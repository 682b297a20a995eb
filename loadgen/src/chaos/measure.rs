//! Resident memory and open descriptors of this process, as the chaos run samples them.
//!
//! Owns reading /proc/self, and opening before the first sample the descriptors a
//! library keeps for the whole process once it is first used. Must not judge
//! (`verdict.rs`) or report (`report.rs`).

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// Descriptors around the whole client.
#[derive(Clone, Debug)]
pub(super) struct Fds {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Kinds with more descriptors at the end than at the start (`kind x n`), and fewer.
    pub(super) opened: Vec<String>,
    pub(super) closed: Vec<String>,
    /// Descriptors open at the end that were not at the start, each with what it is
    /// (`fd 23 socket:[4711] udp6 [::]:40123 -> [::]:0`): a socket's protocol and
    /// addresses from /proc/self/net tell who opened it.
    pub(super) leaked: Vec<String>,
}

impl Fds {
    /// The change between two samples.
    pub(super) fn between(start: &Sample, end: &Sample) -> Fds {
        let count = |s: &Sample, f: fn(&Fd) -> String| {
            let mut k: BTreeMap<String, u64> = BTreeMap::new();
            for d in s.values() {
                *k.entry(f(d)).or_insert(0) += 1;
            }
            k
        };
        let (k0, k1) = (
            count(start, |d| kind(&d.target)),
            count(end, |d| kind(&d.target)),
        );
        // More descriptors of one description at the end than at the start: the newest
        // of them are the ones left open (a restarted server's socket has the address
        // its predecessor had, so it is no leak)
        let (w0, mut w1) = (
            count(start, |d| d.what.clone()),
            count(end, |d| d.what.clone()),
        );
        for (what, n) in &w0 {
            if let Some(m) = w1.get_mut(what) {
                *m = m.saturating_sub(*n);
            }
        }
        let mut leaked = Vec::new();
        for (fd, d) in end.iter().rev() {
            if let Some(n) = w1.get_mut(&d.what)
                && *n > 0
            {
                *n -= 1;
                leaked.push(format!("fd {fd} {} {}", d.target, d.what));
            }
        }
        leaked.reverse();
        Fds {
            start: start.len() as u64,
            end: end.len() as u64,
            opened: fd_excess(&k1, &k0),
            closed: fd_excess(&k0, &k1),
            leaked,
        }
    }
}

/// One open descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Fd {
    /// What /proc/self/fd links it to (`socket:[1234]`, `anon_inode:[eventfd]`, a path).
    target: String,
    /// A socket's protocol and addresses (`udp 127.0.0.1:5000 -> 0.0.0.0:0`), `unix` or
    /// `netlink`; a pipe's `pipe`; anything else's target.
    what: String,
}

/// Open descriptors of this process by number; the listing's own descriptor is left out.
pub(super) type Sample = BTreeMap<i32, Fd>;

/// Opens the descriptors that Tokio opens on first use and keeps for the life of the
/// process, so that both samples hold them: built with Tokio's `signal` feature (which
/// the workspace's features unify into loadgen's Tokio whenever it is built together with
/// rl-proxy, as `cargo test --workspace` does), the first runtime with I/O opens the
/// signal driver's global socket pair (`socket x 2`, both `unix`), which is never closed.
/// Sampled before it, a chaos run read those two as a leak of the client. A runtime
/// that cannot be built opens nothing (the client's own then fails the run).
pub(super) fn open_process_wide() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build();
    drop(rt);
}

/// Resident memory of this process (KiB), from /proc/self/status.
pub(super) fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
            l.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// The floor of resident memory (KiB) over `span`: the least of samples every 10 ms.
/// Resident memory swings by several MiB within a second under the load (pages freed and
/// handed back after mimalloc's 10 ms purge delay, then touched again), so one sample
/// compares a trough with a crest by chance: a 12 s CI soak once read 42.8 MiB after
/// warm-up and 53.6 MiB at the end while its events' own samples ranged 32 to 48 MiB.
/// Memory that leaks raises every sample, the floor included; churn does not.
pub(super) fn rss_floor_kib(span: std::time::Duration) -> u64 {
    let step = std::time::Duration::from_millis(10);
    let until = std::time::Instant::now() + span;
    let mut floor = rss_kib();
    while std::time::Instant::now() < until {
        std::thread::sleep(step);
        floor = floor.min(rss_kib());
    }
    floor
}

/// Samples the open descriptors ([`Sample`]).
pub(super) fn fd_sample() -> Sample {
    let mut fds = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Sample::new();
    };
    for e in dir.flatten() {
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if t.starts_with("/proc/") && t.ends_with("/fd") {
            continue;
        }
        fds.insert(fd, t.into_owned());
    }
    let sockets = socket_table();
    fds.into_iter()
        .map(|(fd, target)| {
            let inode = target
                .strip_prefix("socket:[")
                .and_then(|r| r.strip_suffix(']'))
                .and_then(|i| i.parse::<u64>().ok());
            let what = match inode {
                Some(i) => sockets
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| "socket".to_string()),
                None => kind(&target),
            };
            (fd, Fd { target, what })
        })
        .collect()
}

/// A descriptor's kind: `socket:[1234]` and `pipe:[1234]` by kind (a restarted server's
/// socket is new), anything else by its target.
fn kind(target: &str) -> String {
    match target.split_once(":[") {
        Some((k, _)) if k == "socket" || k == "pipe" => k.to_string(),
        _ => target.to_string(),
    }
}

/// How many descriptors of each kind `a` has beyond `b` (`kind x n`).
fn fd_excess(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Vec<String> {
    a.iter()
        .filter_map(|(k, n)| {
            let extra = n.saturating_sub(b.get(k).copied().unwrap_or(0));
            (extra > 0).then(|| format!("{k} x {extra}"))
        })
        .collect()
}

/// The sockets of this network namespace by inode, each as `proto local -> remote`
/// (/proc/self/net/{udp,udp6,tcp,tcp6}; `unix` and `netlink` by protocol only).
fn socket_table() -> HashMap<u64, String> {
    let mut out = HashMap::new();
    for proto in ["udp", "udp6", "tcp", "tcp6"] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/self/net/{proto}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(remote), Some(inode)) = (f.get(1), f.get(2), f.get(9)) else {
                continue;
            };
            let (Some(l), Some(r), Ok(i)) = (addr(local), addr(remote), inode.parse::<u64>())
            else {
                continue;
            };
            out.insert(i, format!("{proto} {l} -> {r}"));
        }
    }
    for (proto, column) in [("unix", 6), ("netlink", 9)] {
        let Ok(text) = std::fs::read_to_string(format!("/proc/self/net/{proto}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            if let Some(Ok(i)) = line.split_whitespace().nth(column).map(str::parse::<u64>) {
                out.insert(i, proto.to_string());
            }
        }
    }
    out
}

/// An address of /proc/net/{udp,udp6,tcp,tcp6}: `0100007F:0035` (the address as the kernel's
/// 32-bit words in host order, in hex; the port in hex).
fn addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        let w = u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok()?;
        Some(w.to_ne_bytes())
    };
    let ip: std::net::IpAddr = match ip.len() {
        8 => Ipv4Addr::from(word(0)?).into(),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Ipv6Addr::from(b).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_addresses_parse() {
        if cfg!(target_endian = "little") {
            assert_eq!(addr("0100007F:0035"), Some("127.0.0.1:53".parse().unwrap()));
            assert_eq!(
                addr("00000000000000000000000001000000:1F90"),
                Some("[::1]:8080".parse().unwrap())
            );
        }
        assert_eq!(
            addr("00000000000000000000000000000000:0000"),
            Some("[::]:0".parse().unwrap())
        );
        assert_eq!(addr("zz:1"), None);
        assert_eq!(addr("0100007F"), None);
    }

    #[test]
    fn a_socket_opened_between_samples_is_listed_with_its_address() {
        let start = fd_sample();
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = s.local_addr().unwrap().port();
        let end = fd_sample();
        let fds = Fds::between(&start, &end);
        // other tests of this binary may open descriptors meanwhile: look for this one
        let want = format!(" udp 127.0.0.1:{port} -> 0.0.0.0:0");
        assert!(
            fds.leaked
                .iter()
                .any(|l| l.starts_with("fd ") && l.ends_with(&want)),
            "{:?}",
            fds.leaked
        );
        assert!(fds.end > fds.start, "{fds:?}");
        drop(s);
    }

    #[test]
    fn a_restarted_servers_socket_is_no_leak() {
        let fd = |target: &str, what: &str| Fd {
            target: target.into(),
            what: what.into(),
        };
        let start = Sample::from([
            (3, fd("socket:[10]", "udp 127.0.0.1:5000 -> 0.0.0.0:0")),
            (4, fd("anon_inode:[eventfd]", "anon_inode:[eventfd]")),
        ]);
        let end = Sample::from([
            (4, fd("anon_inode:[eventfd]", "anon_inode:[eventfd]")),
            (7, fd("socket:[11]", "udp 127.0.0.1:5000 -> 0.0.0.0:0")),
            (8, fd("socket:[12]", "udp6 [::]:4000 -> [::]:0")),
        ]);
        let fds = Fds::between(&start, &end);
        assert_eq!((fds.start, fds.end), (2, 3));
        assert_eq!(fds.opened, ["socket x 1"]);
        assert!(fds.closed.is_empty());
        assert_eq!(fds.leaked, ["fd 8 socket:[12] udp6 [::]:4000 -> [::]:0"]);
    }
}
