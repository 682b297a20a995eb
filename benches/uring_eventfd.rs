//! How soon a `DEFER_TASKRUN` io_uring's registered eventfd tells an `epoll` waiter that a
//! datagram arrived: the lever a hosted engine core on a current-thread runtime would
//! need (it waits in the runtime's reactor, and such a ring never wakes a poller of its
//! own fd for the work it defers). Each round arms one receive on a UDP socket (the
//! kernel arms a poll: no datagram yet), sends one datagram to it from a plain socket,
//! and times `epoll_wait` on the eventfd; the same with a `COOP_TASKRUN` ring's own fd
//! (what hosted cores watch) as the reference. Prints each round and the medians
//! (`src/udp/ring.rs` cites them).
//!
//! Run: `cargo bench --bench uring_eventfd` (env `URING_EVENTFD_ROUNDS`, default 9).
//! Without `--bench` (as `cargo test --all-targets` runs it) 3 rounds: a smoke test. Where
//! the kernel refuses io_uring it says so and measures nothing.

use std::net::UdpSocket;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use io_uring::{IoUring, opcode, types};

/// One setup's rounds: ms from the send until `epoll_wait` reported the watched fd
/// (`None`: not within 500 ms).
fn rounds(ring: &mut IoUring, watched: RawFd, n: usize) -> std::io::Result<Vec<Option<f64>>> {
    let rx = UdpSocket::bind("127.0.0.1:0")?;
    let tx = UdpSocket::bind("127.0.0.1:0")?;
    let to = rx.local_addr()?;
    // SAFETY: epoll_create1 takes a flag and no pointers; the result is checked.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLET) as u32,
        u64: 1,
    };
    // SAFETY: `ev` is a valid event for the call's duration; both fds are open.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, watched, &mut ev) };
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
    let mut buf = [0u8; 64];
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let sqe = opcode::Recv::new(
            types::Fd(rx.as_raw_fd()),
            buf.as_mut_ptr(),
            buf.len() as u32,
        )
        .build()
        .user_data(1);
        // SAFETY: `buf` outlives the receive: this loop reaps its completion below before
        // the next round reuses it, and the ring is dropped (cancelling) before `buf`.
        unsafe { ring.submission().push(&sqe) }.map_err(|_| std::io::Error::other("SQ full"))?;
        ring.submit()?;
        // what arming signalled is not the datagram's
        // SAFETY: `evs` is valid for its length.
        unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, 0) };
        let t0 = Instant::now();
        tx.send_to(b"x", to)?;
        // SAFETY: as above.
        let got = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, 500) };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        out.push((got > 0).then_some(ms));
        ring.submit_and_wait(1)?;
        ring.completion().for_each(drop);
    }
    // SAFETY: `ep` is ours and closed once.
    unsafe { libc::close(ep) };
    Ok(out)
}

fn median(v: &[Option<f64>]) -> String {
    let mut ms: Vec<f64> = v.iter().flatten().copied().collect();
    if ms.is_empty() {
        return "never".into();
    }
    ms.sort_by(f64::total_cmp);
    format!(
        "{:.3} ms ({} of {} reported)",
        ms[ms.len() / 2],
        ms.len(),
        v.len()
    )
}

fn main() -> std::io::Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let n = if bench {
        std::env::var("URING_EVENTFD_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(9)
    } else {
        3
    };
    let mut deferred = match IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(8)
    {
        Ok(r) => r,
        Err(e) => {
            println!("io_uring refused here ({e}): nothing measured");
            return Ok(());
        }
    };
    // SAFETY: eventfd takes integers and no pointers; the result is checked.
    let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    if efd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    deferred.submitter().register_eventfd(efd)?;
    let a = rounds(&mut deferred, efd, n)?;
    drop(deferred);
    // SAFETY: `efd` is ours, the ring that used it is gone, and it is closed once.
    unsafe { libc::close(efd) };
    let mut coop = IoUring::builder()
        .setup_coop_taskrun()
        .setup_taskrun_flag()
        .build(8)?;
    let fd = coop.as_raw_fd();
    let b = rounds(&mut coop, fd, n)?;
    let show = |v: &[Option<f64>]| {
        v.iter()
            .map(|x| x.map_or("-".into(), |ms| format!("{ms:.3}")))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "DEFER_TASKRUN, registered eventfd: median {}; rounds (ms) {}",
        median(&a),
        show(&a)
    );
    println!(
        "COOP_TASKRUN, the ring's fd:       median {}; rounds (ms) {}",
        median(&b),
        show(&b)
    );
    Ok(())
}
