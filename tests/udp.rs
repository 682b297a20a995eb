//! The UDP I/O layer on loopback, on both backends (each forced), with GSO and GRO on
//! and off: echo round trips, a GSO group ending in a shorter datagram, mixed
//! destinations, closing a socket (and sending on a closed one), a tiny send buffer,
//! wake-ups from another thread, the socket limit, dual stack, and the GSO fallback.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimitly_engine::udp::{BackendChoice, BackendKind, IoConfig, IoEvent, SocketId, UdpIo};

const BACKENDS: [BackendChoice; 2] = [BackendChoice::Uring, BackendChoice::Mmsg];

fn cfg(backend: BackendChoice, gso: bool, gro: bool) -> IoConfig {
    IoConfig {
        backend,
        gso,
        gro,
        ..IoConfig::default()
    }
}

/// A driver, or None where io_uring is refused on this host (then the test skips it).
fn driver(c: &IoConfig) -> Option<UdpIo> {
    match UdpIo::new(c) {
        Ok(d) => {
            if c.backend == BackendChoice::Uring {
                assert_eq!(d.kind(), BackendKind::Uring);
            }
            if c.backend == BackendChoice::Mmsg {
                assert_eq!(d.kind(), BackendKind::Mmsg);
            }
            Some(d)
        }
        Err(e) if c.backend == BackendChoice::Uring => {
            eprintln!("io_uring refused here ({e}); skipping");
            None
        }
        Err(e) => panic!("driver: {e}"),
    }
}

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

type Got = Vec<(SocketId, SocketAddr, Vec<u8>)>;

/// Runs `d` until `want` datagrams arrived or about 2 s passed; echoes nothing.
fn collect(d: &mut UdpIo, want: usize) -> Got {
    let mut got = Vec::new();
    let t0 = Instant::now();
    while got.len() < want && t0.elapsed() < Duration::from_secs(2) {
        d.run_once(Some(Duration::from_millis(20)), &mut |_, ev| {
            if let IoEvent::Datagram { sock, from, data } = ev {
                got.push((sock, from, data.to_vec()));
            }
        })
        .unwrap();
    }
    got
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    let mut v = vec![(i % 251) as u8; len];
    v[..4].copy_from_slice(&(i as u32).to_le_bytes());
    v
}

#[test]
fn echo_roundtrip_on_every_backend_with_gso_and_gro_on_and_off() {
    for backend in BACKENDS {
        for gso in [true, false] {
            for gro in [true, false] {
                let c = cfg(backend, gso, gro);
                let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
                    continue;
                };
                let sa = a.bind(lo()).unwrap();
                let sb = b.bind(lo()).unwrap();
                let b_addr = b.local_addr(sb).unwrap();
                let a_addr = a.local_addr(sa).unwrap();
                const N: usize = 300;
                for i in 0..N {
                    assert!(a.queue_send(sa, b_addr, &payload(i, 200), i as u64));
                }
                a.run_once(Some(Duration::ZERO), &mut |_, ev| {
                    panic!("unexpected {ev:?}")
                })
                .unwrap();
                // echo everything back
                let mut echoed = 0;
                let t0 = Instant::now();
                while echoed < N && t0.elapsed() < Duration::from_secs(2) {
                    b.run_once(Some(Duration::from_millis(20)), &mut |q, ev| {
                        if let IoEvent::Datagram { sock, from, data } = ev {
                            assert_eq!(from, a_addr);
                            assert!(q.push(sock, from, data, 0));
                            echoed += 1;
                        }
                    })
                    .unwrap();
                }
                b.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap();
                let got = collect(&mut a, N);
                let label = format!("{backend:?} gso={gso} gro={gro}");
                assert_eq!(echoed, N, "{label}");
                assert_eq!(got.len(), N, "{label}");
                let mut seen = vec![false; N];
                for (sock, from, data) in &got {
                    assert_eq!(*sock, sa);
                    assert_eq!(*from, b_addr);
                    let i = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
                    assert_eq!(data, &payload(i, 200), "{label}");
                    seen[i] = true;
                }
                assert!(seen.iter().all(|s| *s), "{label}");
                let st = a.stats();
                assert_eq!(st.datagrams_sent, N as u64);
                assert_eq!(st.datagrams_received, N as u64);
                if gso {
                    assert!(st.gso_sends > 0, "{label}: {st:?}");
                    assert!(st.datagrams_per_send() > 1.0, "{label}");
                } else {
                    assert_eq!(st.gso_sends, 0, "{label}");
                    assert_eq!(st.send_ops, N as u64, "{label}");
                }
                assert_eq!(a.gso_active(sa), gso);
                assert_eq!(a.gro_active(sa), gro);
                if gso && gro {
                    // replies were GSO batches: the client saw coalesced buffers
                    assert!(st.gro_buffers > 0, "{label}: {st:?}");
                }
            }
        }
    }
}

#[test]
fn gso_group_ending_in_a_shorter_datagram_and_mixed_destinations() {
    for backend in BACKENDS {
        for gro in [true, false] {
            let c = cfg(backend, true, gro);
            let (Some(mut a), Some(mut b), Some(mut c2)) = (driver(&c), driver(&c), driver(&c))
            else {
                continue;
            };
            let sa = a.bind(lo()).unwrap();
            let sb = b.bind(lo()).unwrap();
            let sc = c2.bind(lo()).unwrap();
            let (to_b, to_c) = (b.local_addr(sb).unwrap(), c2.local_addr(sc).unwrap());
            // interleaved: 10 x 300 B + one 100 B to b, 7 x 500 B to c
            let mut k = 0;
            for i in 0..10 {
                a.queue_send(sa, to_b, &payload(i, 300), k);
                k += 1;
                if i < 7 {
                    a.queue_send(sa, to_c, &payload(100 + i, 500), k);
                    k += 1;
                }
            }
            a.queue_send(sa, to_b, &payload(10, 100), k);
            a.run_once(Some(Duration::ZERO), &mut |_, ev| {
                panic!("unexpected {ev:?}")
            })
            .unwrap();
            let st = a.stats();
            assert_eq!(st.datagrams_sent, 18);
            assert_eq!(
                st.send_ops, 2,
                "{backend:?}: one group per destination: {st:?}"
            );
            let got_b = collect(&mut b, 11);
            let got_c = collect(&mut c2, 7);
            let mut lens_b: Vec<usize> = got_b.iter().map(|g| g.2.len()).collect();
            lens_b.sort();
            assert_eq!(
                lens_b,
                [vec![100], vec![300; 10]].concat(),
                "{backend:?} gro={gro}"
            );
            for (_, _, d) in &got_b {
                let i = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
                assert_eq!(d, &payload(i, d.len()));
            }
            assert_eq!(got_c.len(), 7);
            for (_, _, d) in &got_c {
                let i = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
                assert!((100..107).contains(&i));
                assert_eq!(d, &payload(i, 500));
            }
            if gro {
                assert_eq!(b.stats().recv_ops, 1, "{backend:?}: one coalesced buffer");
            }
        }
    }
}

#[test]
fn closed_socket_fails_its_queued_sends_and_frees_its_slot() {
    for backend in BACKENDS {
        let mut c = cfg(backend, true, true);
        c.max_sockets = 2;
        let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
            continue;
        };
        let s1 = a.bind(lo()).unwrap();
        let _s2 = a.bind(lo()).unwrap();
        assert!(a.bind(lo()).is_err(), "limit of 2 sockets");
        let sb = b.bind(lo()).unwrap();
        let to = b.local_addr(sb).unwrap();
        for t in 0..5 {
            assert!(a.queue_send(s1, to, b"x", t));
        }
        a.close(s1);
        assert_eq!(a.local_addr(s1), None);
        // a send on the stale id fails too
        assert!(a.queue_send(s1, to, b"y", 99));
        let mut failed = Vec::new();
        a.run_once(Some(Duration::ZERO), &mut |_, ev| match ev {
            IoEvent::SendFailed { tag, error } => {
                assert_eq!(error, io::ErrorKind::NotConnected);
                failed.push(tag);
            }
            other => panic!("unexpected {other:?}"),
        })
        .unwrap();
        failed.sort();
        assert_eq!(failed, vec![0, 1, 2, 3, 4, 99], "{backend:?}");
        assert_eq!(a.stats().send_errors.closed, 6);
        // the slot is free again and the new socket works
        let s3 = a.bind(lo()).unwrap();
        assert_ne!(s3, s1);
        assert!(a.queue_send(s3, to, b"after", 7));
        a.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap();
        let got = collect(&mut b, 1);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].2, b"after");
        a.close(s3);
        a.close(s3); // twice: ignored
    }
}

/// How each entry point hands queued sends to the kernel.
#[derive(Clone, Copy, Debug)]
enum Pass {
    RunOnce,
    Flush,
    RunNowait,
}

/// Runs one send pass of `d` and returns the tags of the sends it reported failed
/// (each with `NotConnected`); any other event fails the test.
fn failed_sends(d: &mut UdpIo, pass: Pass) -> Vec<u64> {
    let mut failed = Vec::new();
    let mut on_event = |_: &mut _, ev: IoEvent<'_>| match ev {
        IoEvent::SendFailed { tag, error } => {
            assert_eq!(error, io::ErrorKind::NotConnected, "{pass:?}");
            failed.push(tag);
        }
        other => panic!("{pass:?}: unexpected {other:?}"),
    };
    match pass {
        Pass::RunOnce => d.run_once(Some(Duration::ZERO), &mut on_event),
        Pass::Flush => d.flush(&mut on_event),
        Pass::RunNowait => d.run_nowait(&|_| true, &mut on_event),
    }
    .unwrap();
    failed.sort();
    failed
}

/// A send on a closed socket (queued before the close, or queued afterwards on the
/// stale id while a new socket holds its slot) is reported alike on both backends and
/// through every entry point: `SendFailed` with `NotConnected`, and nothing reaches
/// the kernel (no send call, no send operation, nothing arrives).
#[test]
fn send_on_a_closed_socket_is_never_submitted_on_either_backend() {
    for backend in BACKENDS {
        for pass in [Pass::RunOnce, Pass::Flush, Pass::RunNowait] {
            let mut c = cfg(backend, true, true);
            c.max_sockets = 1;
            let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
                continue;
            };
            let sb = b.bind(lo()).unwrap();
            let to = b.local_addr(sb).unwrap();
            b.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap(); // arms receives
            let s1 = a.bind(lo()).unwrap();
            for t in 0..3 {
                assert!(a.queue_send(s1, to, b"before", t));
            }
            a.close(s1);
            // the one slot is taken again: the stale id must not reach the new socket
            let s2 = a.bind(lo()).unwrap();
            assert_eq!(s2.index(), s1.index());
            assert_ne!(s2, s1);
            for t in 10..13 {
                assert!(a.queue_send(s1, to, b"after", t));
            }
            let failed = failed_sends(&mut a, pass);
            assert_eq!(failed, vec![0, 1, 2, 10, 11, 12], "{backend:?} {pass:?}");
            let st = a.stats();
            assert_eq!(st.send_errors.closed, 6, "{backend:?} {pass:?}");
            assert_eq!(
                (st.send_calls, st.send_ops, st.datagrams_sent),
                (0, 0, 0),
                "{backend:?} {pass:?}: nothing submitted"
            );
            assert!(a.send_queue().is_empty());
            // the socket in that slot still sends, and its datagram is the first to
            // arrive (a stale send that had gone out on it would have come before)
            assert!(a.queue_send(s2, to, b"new", 20));
            assert!(failed_sends(&mut a, pass).is_empty());
            let got = collect(&mut b, 1);
            assert_eq!(got.len(), 1, "{backend:?} {pass:?}");
            assert_eq!(got[0].2, b"new", "{backend:?} {pass:?}");
        }
    }
}

#[test]
fn tiny_send_buffer_never_blocks_and_accounts_for_every_datagram() {
    for backend in BACKENDS {
        for gso in [true, false] {
            let mut c = cfg(backend, gso, false);
            c.send_buf = 4096;
            c.recv_buf = 4096;
            c.send_capacity = 4096;
            let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
                continue;
            };
            let sa = a.bind(lo()).unwrap();
            let sb = b.bind(lo()).unwrap();
            let to = b.local_addr(sb).unwrap();
            let mut queued = 0u64;
            let mut failed = 0u64;
            let t0 = Instant::now();
            for round in 0..20 {
                for i in 0..200 {
                    if a.queue_send(sa, to, &payload(i, 1200), round * 1000 + i as u64) {
                        queued += 1;
                    }
                }
                a.run_once(Some(Duration::ZERO), &mut |_, ev| {
                    if let IoEvent::SendFailed { .. } = ev {
                        failed += 1;
                    }
                })
                .unwrap();
            }
            for _ in 0..200 {
                if a.send_queue().is_empty() {
                    break;
                }
                a.run_once(Some(Duration::from_millis(1)), &mut |_, ev| {
                    if let IoEvent::SendFailed { .. } = ev {
                        failed += 1;
                    }
                })
                .unwrap();
            }
            // the receiver is never read: its tiny buffer drops most; nothing blocks
            assert!(t0.elapsed() < Duration::from_secs(5));
            let left = a.send_queue().len() as u64;
            let st = a.stats();
            assert_eq!(
                st.datagrams_sent + failed + left,
                queued,
                "{backend:?} gso={gso}: {st:?}"
            );
            eprintln!(
                "{backend:?} gso={gso} eagain={} sent={} failed={failed} {:?}",
                st.eagain_waits, st.datagrams_sent, st.send_errors
            );
            drop(b);
        }
    }
}

#[test]
fn wake_from_another_thread_ends_the_wait() {
    for backend in BACKENDS {
        let c = cfg(backend, true, true);
        let Some(mut d) = driver(&c) else { continue };
        let _s = d.bind(lo()).unwrap();
        let w = d.waker();
        // a wake before the wait is reported at once, only once
        w.wake();
        w.wake();
        assert!(w.is_pending());
        let mut woken = 0;
        d.run_once(Some(Duration::from_secs(5)), &mut |_, ev| {
            assert!(matches!(ev, IoEvent::Woken));
            woken += 1;
        })
        .unwrap();
        assert_eq!(woken, 1, "{backend:?}");
        assert!(!w.is_pending());
        d.run_once(Some(Duration::ZERO), &mut |_, ev| {
            panic!("unexpected {ev:?}")
        })
        .unwrap();
        // a wake from another thread during an unbounded wait
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w2.wake();
        });
        let mut woken = 0;
        let t0 = Instant::now();
        while woken == 0 && t0.elapsed() < Duration::from_secs(5) {
            d.run_once(None, &mut |_, ev| {
                if matches!(ev, IoEvent::Woken) {
                    woken += 1;
                }
            })
            .unwrap();
        }
        t.join().unwrap();
        assert_eq!(woken, 1, "{backend:?}");
        assert_eq!(d.stats().wakes, 2);
    }
}

#[test]
fn timeout_is_honoured_without_events() {
    for backend in BACKENDS {
        let Some(mut d) = driver(&cfg(backend, true, true)) else {
            continue;
        };
        let _s = d.bind(lo()).unwrap();
        let t0 = Instant::now();
        d.run_once(Some(Duration::from_millis(30)), &mut |_, ev| {
            panic!("unexpected {ev:?}")
        })
        .unwrap();
        let el = t0.elapsed();
        assert!(el >= Duration::from_millis(29), "{backend:?}: {el:?}");
    }
}

#[test]
fn more_than_sixteen_sockets_all_receive() {
    for backend in BACKENDS {
        let mut c = cfg(backend, true, true);
        c.max_sockets = 24;
        let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
            continue;
        };
        let sa = a.bind(lo()).unwrap();
        let socks: Vec<SocketId> = (0..24).map(|_| b.bind(lo()).unwrap()).collect();
        assert!(b.bind(lo()).is_err());
        assert_eq!(b.socket_count(), 24);
        for (i, s) in socks.iter().enumerate() {
            a.queue_send(sa, b.local_addr(*s).unwrap(), &payload(i, 64), i as u64);
        }
        a.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap();
        let got = collect(&mut b, 24);
        let mut by_sock: HashMap<SocketId, usize> = HashMap::new();
        for (s, _, d) in &got {
            let i = u32::from_le_bytes(d[..4].try_into().unwrap()) as usize;
            assert_eq!(*s, socks[i]);
            *by_sock.entry(*s).or_default() += 1;
        }
        assert_eq!(by_sock.len(), 24, "{backend:?}");
    }
}

#[test]
fn dual_stack_socket_talks_to_ipv4() {
    for backend in BACKENDS {
        let c = cfg(backend, true, true);
        let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
            continue;
        };
        let Ok(sa) = a.bind("[::]:0".parse().unwrap()) else {
            return; // no IPv6 on this host
        };
        let sb = b.bind(lo()).unwrap();
        let to = b.local_addr(sb).unwrap();
        for i in 0..3 {
            a.queue_send(sa, to, &payload(i, 100), 0);
        }
        a.run_once(Some(Duration::ZERO), &mut |_, ev| {
            panic!("unexpected {ev:?}")
        })
        .unwrap();
        let got = collect(&mut b, 3);
        assert_eq!(got.len(), 3, "{backend:?}");
        // the reply path: b answers the (IPv4) source, a receives it
        let from = got[0].1;
        assert!(from.is_ipv4());
        b.queue_send(sb, from, b"pong", 0);
        b.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap();
        let back = collect(&mut a, 1);
        assert_eq!(back.len(), 1);
        assert_eq!(back[0].1, to, "v4-mapped sources come back as IPv4");
    }
}

#[test]
fn steering_rebind_moves_into_the_range() {
    for backend in BACKENDS {
        let Some(mut d) = driver(&cfg(backend, true, true)) else {
            continue;
        };
        let s = d.bind_steering(false, 1234, 100).unwrap();
        let p = d.local_addr(s).unwrap().port();
        assert!(p >= 49152);
        let s2 = d.bind_steering(false, p, 100).unwrap();
        assert_ne!(d.local_addr(s2).unwrap().port(), p);
    }
}

/// SO_NO_CHECK makes the kernel refuse GSO sends with EINVAL: the socket falls back to
/// per-datagram sends, counted, and nothing is lost.
#[test]
fn gso_refused_by_the_kernel_falls_back_per_socket() {
    for backend in BACKENDS {
        let c = cfg(backend, true, false);
        let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
            continue;
        };
        let sa = a.bind(lo()).unwrap();
        let one: libc::c_int = 1;
        let fd = a.socket(sa).unwrap().as_raw_fd();
        // SAFETY: setsockopt with a valid int on an open socket.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_NO_CHECK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        let sb = b.bind(lo()).unwrap();
        let to = b.local_addr(sb).unwrap();
        for i in 0..20 {
            a.queue_send(sa, to, &payload(i, 200), i as u64);
        }
        let mut failed = 0;
        for _ in 0..5 {
            a.run_once(Some(Duration::ZERO), &mut |_, ev| {
                if let IoEvent::SendFailed { .. } = ev {
                    failed += 1;
                }
            })
            .unwrap();
        }
        assert_eq!(failed, 0, "{backend:?}");
        let got = collect(&mut b, 20);
        assert_eq!(got.len(), 20, "{backend:?}");
        let st = a.stats();
        assert_eq!(st.gso_fallbacks, 1, "{backend:?}: {st:?}");
        assert!(!a.gso_active(sa));
        assert_eq!(st.datagrams_sent, 20);
    }
}

#[test]
fn auto_prefers_io_uring_and_mmsg_can_be_forced() {
    let d = UdpIo::new(&cfg(BackendChoice::Auto, true, true)).unwrap();
    let forced = UdpIo::new(&cfg(BackendChoice::Mmsg, true, true)).unwrap();
    assert_eq!(forced.kind(), BackendKind::Mmsg);
    if UdpIo::new(&cfg(BackendChoice::Uring, true, true)).is_ok() {
        assert_eq!(d.kind(), BackendKind::Uring);
    } else {
        assert_eq!(d.kind(), BackendKind::Mmsg);
    }
}

/// `flush` sends without waiting and hands out send failures only: datagrams and
/// wake-ups that arrived meanwhile wait for the next `run_once`.
#[test]
fn flush_sends_and_keeps_arrivals_for_run_once() {
    for backend in BACKENDS {
        let c = cfg(backend, true, true);
        let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
            continue;
        };
        let sa = a.bind(lo()).unwrap();
        let sb = b.bind(lo()).unwrap();
        let (to_a, to_b) = (a.local_addr(sa).unwrap(), b.local_addr(sb).unwrap());
        b.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap(); // arms receives
        for i in 0..10 {
            a.queue_send(sa, to_b, &payload(i, 100), 0);
        }
        a.flush(&mut |_, ev| panic!("unexpected {ev:?}")).unwrap();
        assert!(a.send_queue().is_empty());
        std::thread::sleep(Duration::from_millis(20));
        b.waker().wake();
        b.queue_send(sb, to_a, b"reply", 0);
        b.flush(&mut |_, ev| panic!("{backend:?}: flush delivered {ev:?}"))
            .unwrap();
        let mut got = 0;
        let mut woken = 0;
        for _ in 0..20 {
            b.run_once(Some(Duration::from_millis(10)), &mut |_, ev| match ev {
                IoEvent::Datagram { .. } => got += 1,
                IoEvent::Woken => woken += 1,
                other => panic!("{other:?}"),
            })
            .unwrap();
            if got == 10 && woken == 1 {
                break;
            }
        }
        assert_eq!((got, woken), (10, 1), "{backend:?}");
        assert_eq!(collect(&mut a, 1).len(), 1);
    }
}

/// io_uring with few receive buffers: bursts larger than the buffer ring end the
/// multishot receive (ENOBUFS); it is re-armed and every datagram still arrives.
#[test]
fn uring_rearms_after_running_out_of_buffers() {
    for gro in [false, true] {
        let mut c = cfg(BackendChoice::Uring, false, gro);
        c.batch = 8; // 16 receive buffers
        let (Some(mut a), Some(mut b)) = (driver(&c), driver(&c)) else {
            return;
        };
        let sa = a.bind(lo()).unwrap();
        let sb = b.bind(lo()).unwrap();
        let to = b.local_addr(sb).unwrap();
        b.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap();
        let mut got = 0usize;
        for burst in 0..10 {
            for i in 0..100 {
                assert!(a.queue_send(sa, to, &payload(burst * 100 + i, 300), 0));
            }
            a.run_once(Some(Duration::ZERO), &mut |_, ev| {
                panic!("unexpected {ev:?}")
            })
            .unwrap();
            let want = (burst + 1) * 100;
            let t0 = Instant::now();
            while got < want && t0.elapsed() < Duration::from_secs(2) {
                b.run_once(Some(Duration::from_millis(20)), &mut |_, ev| {
                    if let IoEvent::Datagram { data, .. } = ev {
                        assert_eq!(data.len(), 300);
                        got += 1;
                    }
                })
                .unwrap();
            }
        }
        assert_eq!(got, 1000, "gro={gro}: {:?}", b.stats());
        assert!(b.stats().recv_rearms > 0, "gro={gro}: {:?}", b.stats());
    }
}

/// A receiving driver on `c` with `n` datagrams of 100 bytes waiting in its socket, or
/// None where io_uring is refused.
fn burst(c: &IoConfig, n: usize) -> Option<UdpIo> {
    let (Some(mut a), Some(mut b)) = (driver(c), driver(c)) else {
        return None;
    };
    let sa = a.bind(lo()).unwrap();
    let sb = b.bind(lo()).unwrap();
    let to = b.local_addr(sb).unwrap();
    b.run_once(Some(Duration::ZERO), &mut |_, _| {}).unwrap();
    for i in 0..n {
        assert!(a.queue_send(sa, to, &payload(i, 100), 0));
    }
    a.run_once(Some(Duration::ZERO), &mut |_, ev| {
        panic!("unexpected {ev:?}")
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    Some(b)
}

/// Runs `b` (at most 100 passes) until `n` datagrams arrived; returns how many did and
/// the most one pass handed out.
fn drain(b: &mut UdpIo, n: usize) -> (usize, usize) {
    let (mut total, mut most) = (0, 0);
    for _ in 0..100 {
        let mut got = 0;
        b.run_once(Some(Duration::from_millis(10)), &mut |_, ev| {
            if let IoEvent::Datagram { .. } = ev {
                got += 1;
            }
        })
        .unwrap();
        most = most.max(got);
        total += got;
        if total == n {
            break;
        }
    }
    (total, most)
}

/// One `run_once` hands out about one batch at most (a GRO buffer is never split), the
/// rest follows on the next calls: a caller that replies to each datagram never
/// overflows its send queue.
#[test]
fn run_once_hands_out_one_batch_at_most() {
    for backend in BACKENDS {
        let mut c = cfg(backend, true, true);
        c.batch = 64;
        let Some(mut b) = burst(&c, 640) else {
            continue;
        };
        let (total, most) = drain(&mut b, 640);
        assert_eq!(total, 640, "{backend:?}");
        assert!(most <= 64 + 63, "{backend:?}: {most} in one call");
    }
}

/// `may_have_more` speaks of the last pass only: once a pass has drained the socket it is
/// false again on both backends and with either kind of pass. (mmsg cleared it only in
/// `run_nowait`, so after one `recvmmsg` that filled every header a pinned engine core,
/// whose passes are `run_once`, saw it true for ever and never waited again: 15 turns
/// per decision and a full CPU with one reply per datagram.)
#[test]
fn may_have_more_clears_once_a_pass_drained_the_socket() {
    for backend in BACKENDS {
        // no GRO: every datagram takes a header of its own, as one reply per datagram does
        let mut c = cfg(backend, false, false);
        c.batch = 16;
        let Some(mut b) = burst(&c, 100) else {
            continue;
        };
        assert_eq!(drain(&mut b, 100).0, 100, "{backend:?}");
        // one more pass finds nothing: it drained everything there was
        b.run_once(Some(Duration::ZERO), &mut |_, ev| {
            panic!("unexpected {ev:?}")
        })
        .unwrap();
        assert!(
            !b.may_have_more(),
            "{backend:?}: still true after a pass that drained the socket"
        );
    }
}

/// Wake-ups from another thread racing the driver's waits are never lost: the waker
/// writes the eventfd only while the driver is parked, and the driver checks the
/// pending flag before it parks.
#[test]
fn racing_wakes_are_never_lost() {
    use std::sync::atomic::{AtomicU64, Ordering};
    for backend in BACKENDS {
        let Some(mut d) = driver(&cfg(backend, true, true)) else {
            continue;
        };
        let _s = d.bind(lo()).unwrap();
        let w = d.waker();
        let work = Arc::new(AtomicU64::new(0));
        const N: u64 = 3000;
        let (w2, work2) = (w.clone(), work.clone());
        let t = std::thread::spawn(move || {
            for i in 1..=N {
                work2.store(i, Ordering::SeqCst);
                w2.wake();
                if i % 300 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        let mut seen = 0;
        let mut empty_returns = 0;
        let mut woken = 0u64;
        while seen < N {
            let mut any = false;
            d.run_once(Some(Duration::from_secs(2)), &mut |_, ev| {
                if matches!(ev, IoEvent::Woken) {
                    any = true;
                    woken += 1;
                }
            })
            .unwrap();
            if any {
                seen = work.load(Ordering::SeqCst);
            } else {
                empty_returns += 1;
                assert!(
                    empty_returns < 3,
                    "{backend:?}: a wake-up was lost at {seen}"
                );
            }
        }
        t.join().unwrap();
        assert!(woken <= N);
        assert!(!w.is_pending() || woken > 0);
    }
}
