//! Echo benchmark of the UDP I/O layer (`ratelimitly_engine::udp`) on loopback:
//! a client thread pinned to CPU 0 keeps `WINDOW` 200-byte datagrams in flight to an
//! echo thread pinned to CPU 1; each row reports exchanges per second and the client
//! thread's own CPU time per exchange (CLOCK_THREAD_CPUTIME_ID), for io_uring and mmsg
//! with GSO/GRO on both sides, off on both sides, and on at the client only (the echo
//! receives with GRO but replies one datagram at a time).
//!
//! Run: `cargo bench --bench udp_echo` (env `UDP_ECHO_SECS`, default 2 s per row;
//! `UDP_ECHO_WINDOW`, default 256). Without `--bench` (as `cargo test --all-targets`
//! runs it) each row lasts 50 ms: a smoke test. Figures are noisy on a busy 2-core machine:
//! compare rows of one run.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratelimitly_engine::udp::{BackendChoice, IoConfig, IoEvent, IoStats, UdpIo};

const LEN: usize = 200;

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn pin(cpu: usize) {
    if let Some(ids) = core_affinity::get_core_ids()
        && let Some(id) = ids.get(cpu % ids.len().max(1))
    {
        core_affinity::set_for_current(*id);
    }
}

struct Row {
    exchanges: u64,
    secs: f64,
    client_cpu: Duration,
    client: IoStats,
    echo: IoStats,
}

fn run(backend: BackendChoice, client_gso: bool, echo_gso: bool, window: usize, secs: f64) -> Row {
    let cfg = move |gso: bool| IoConfig {
        backend,
        gso,
        gro: gso,
        ..IoConfig::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) =
        std::sync::mpsc::channel::<(SocketAddr, Arc<ratelimitly_engine::udp::Waker>)>();
    let echo_cfg = IoConfig {
        gro: true, // the echo always receives with GRO; `echo_gso` decides its replies
        ..cfg(echo_gso)
    };
    let stop2 = stop.clone();
    let echo = std::thread::spawn(move || {
        pin(1);
        let mut d = UdpIo::new(&echo_cfg).expect("echo driver");
        let s = d.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        addr_tx.send((d.local_addr(s).unwrap(), d.waker())).unwrap();
        while !stop2.load(Ordering::Relaxed) {
            d.run_once(Some(Duration::from_millis(10)), &mut |q, ev| {
                if let IoEvent::Datagram { sock, from, data } = ev {
                    q.push(sock, from, data, 0);
                }
            })
            .unwrap();
        }
        d.stats().clone()
    });
    let (to, echo_waker) = addr_rx.recv().unwrap();
    let client = std::thread::spawn(move || {
        pin(0);
        let mut d = UdpIo::new(&cfg(client_gso)).expect("client driver");
        let s = d.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let payload = [7u8; LEN];
        for i in 0..window {
            d.queue_send(s, to, &payload, i as u64);
        }
        let mut exchanges = 0u64;
        let cpu0 = thread_cpu();
        let t0 = Instant::now();
        let end = Duration::from_secs_f64(secs);
        let mut idle = 0;
        while t0.elapsed() < end {
            let mut got = 0;
            d.run_once(Some(Duration::from_millis(10)), &mut |q, ev| {
                if let IoEvent::Datagram { .. } = ev {
                    got += 1;
                    q.push(s, to, &payload, 0);
                }
            })
            .unwrap();
            exchanges += got;
            // losses (receive buffer overflow) shrink the window: refill after idle loops
            if got == 0 {
                idle += 1;
                if idle >= 2 {
                    for i in 0..window {
                        d.queue_send(s, to, &payload, i as u64);
                    }
                    idle = 0;
                }
            } else {
                idle = 0;
            }
        }
        let elapsed = t0.elapsed().as_secs_f64();
        let cpu = thread_cpu() - cpu0;
        (exchanges, elapsed, cpu, d.stats().clone())
    });
    let (exchanges, secs, client_cpu, client) = client.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    echo_waker.wake();
    let echo = echo.join().unwrap();
    Row {
        exchanges,
        secs,
        client_cpu,
        client,
        echo,
    }
}

fn main() {
    // `cargo test --all-targets` runs this without `--bench`: a 50 ms smoke run per row
    let bench = std::env::args().any(|a| a == "--bench");
    let secs: f64 = std::env::var("UDP_ECHO_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if bench { 2.0 } else { 0.05 });
    let window: usize = std::env::var("UDP_ECHO_WINDOW")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(256);
    println!(
        "udp_echo: {LEN}-byte datagrams, window {window}, {secs} s per row, client CPU 0, echo CPU 1"
    );
    println!(
        "| backend | client GSO/GRO | echo GSO replies | exchanges/s | client CPU µs/exchange | client dgrams/send | client dgrams/recv buffer | echo dgrams/send | echo dgrams/recv buffer |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for backend in [BackendChoice::Uring, BackendChoice::Mmsg] {
        if backend == BackendChoice::Uring
            && UdpIo::new(&IoConfig {
                backend,
                ..IoConfig::default()
            })
            .is_err()
        {
            println!("| uring | (refused on this host) | | | | | | | |");
            continue;
        }
        for (cg, eg) in [(true, true), (false, false), (true, false)] {
            let r = run(backend, cg, eg, window, secs);
            let per_s = r.exchanges as f64 / r.secs;
            let cpu_us = r.client_cpu.as_secs_f64() * 1e6 / r.exchanges.max(1) as f64;
            println!(
                "| {} | {} | {} | {:.0}k | {:.2} | {:.1} | {:.1} | {:.1} | {:.1} |",
                backend,
                if cg { "on" } else { "off" },
                if eg { "on" } else { "off" },
                per_s / 1e3,
                cpu_us,
                r.client.datagrams_per_send(),
                r.client.datagrams_per_recv(),
                r.echo.datagrams_per_send(),
                r.echo.datagrams_per_recv(),
            );
        }
    }
}
