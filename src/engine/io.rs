//! Batched UDP I/O for one engine core: a raw non-blocking socket (socket2) driven with
//! `recvmmsg`/`sendmmsg`, plus the readiness wait used when the core has nothing to do.
//!
//! Owns: socket creation (buffer sizes, port choice for steering rebinds), the receive
//! and send batches (fixed arrays allocated once per core, so no per-datagram heap
//! allocation), and the blocking `poll(2)` over the core's sockets and wake fd.
//!
//! Must not touch: request state, timers, the wire format. It moves opaque bytes and
//! reports per-datagram send failures through a caller-supplied tag.
//!
//! The engine cores and the responder run on `crate::udp` (io_uring or mmsg, GSO/GRO);
//! these plain batches remain for callers that want simple non-blocking mmsg I/O.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

/// Size of each receive buffer: larger than any valid datagram (1200 B).
pub const RECV_BUF: usize = 2048;
/// Largest datagram the engine sends.
pub const SEND_BUF: usize = 1200;

/// First and last port of the steering range (docs/protocol.md §14).
pub const STEER_PORT_FIRST: u16 = 49152;
pub const STEER_PORT_LAST: u16 = 65535;

/// One bound UDP socket of a core.
pub struct UdpIo {
    sock: Socket,
    local: SocketAddr,
}

fn unspecified_for(remote_v6: bool) -> IpAddr {
    if remote_v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

impl UdpIo {
    /// Binds a non-blocking UDP socket on `addr` with the given buffer sizes (0 keeps
    /// the system default). An IPv6 socket also accepts IPv4 (dual stack).
    pub fn bind(addr: SocketAddr, recv_buf: usize, send_buf: usize) -> io::Result<UdpIo> {
        let domain = if addr.is_ipv6() {
            Domain::IPV6
        } else {
            Domain::IPV4
        };
        let sock = Socket::new(
            domain,
            Type::DGRAM.nonblocking().cloexec(),
            Some(Protocol::UDP),
        )?;
        if addr.is_ipv6() {
            sock.set_only_v6(false)?;
        }
        if recv_buf > 0 {
            sock.set_recv_buffer_size(recv_buf)?;
        }
        if send_buf > 0 {
            sock.set_send_buffer_size(send_buf)?;
        }
        sock.bind(&SockAddr::from(addr))?;
        let local = sock
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?;
        Ok(UdpIo { sock, local })
    }

    /// Binds the "any" address of the family that can reach all of `remotes`
    /// (IPv6 dual stack when any remote is IPv6), on `port` (0 = ephemeral).
    pub fn bind_for(
        any_v6: bool,
        port: u16,
        recv_buf: usize,
        send_buf: usize,
    ) -> io::Result<UdpIo> {
        UdpIo::bind(
            SocketAddr::new(unspecified_for(any_v6), port),
            recv_buf,
            send_buf,
        )
    }

    /// Steering rebind: binds the next free port after `current` in 49152..=65535
    /// (or from 49152 when `current` is outside the range), trying at most `tries`
    /// ports (each a bind(2): never an unbounded scan on a core) and skipping ports in
    /// use. Returns the new socket; the caller keeps the old one until drained.
    pub fn rebind_next(
        any_v6: bool,
        current: u16,
        tries: u16,
        recv_buf: usize,
        send_buf: usize,
    ) -> io::Result<UdpIo> {
        let span = (STEER_PORT_LAST - STEER_PORT_FIRST) as u32 + 1;
        let start = if current >= STEER_PORT_FIRST {
            (current - STEER_PORT_FIRST) as u32 + 1
        } else {
            0
        };
        let mut last_err = io::Error::from(io::ErrorKind::AddrInUse);
        for i in 0..u32::from(tries).min(span) {
            let port = STEER_PORT_FIRST as u32 + (start + i) % span;
            let port = port as u16;
            if port == current {
                continue;
            }
            match UdpIo::bind_for(any_v6, port, recv_buf, send_buf) {
                Ok(s) => return Ok(s),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = e,
                Err(e) => return Err(e),
            }
        }
        Err(last_err)
    }

    /// The bound local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Receives up to one batch of datagrams without blocking. Returns how many
    /// arrived (0 when none is queued).
    pub fn recv_batch(&self, batch: &mut RecvBatch) -> io::Result<usize> {
        recv_batch_on(self.sock.as_raw_fd(), batch)
    }

    /// Sends the queued datagrams of `batch` (one `sendmmsg` per run of successes),
    /// calling `failed(tag)` for each datagram that could not be sent. When the send
    /// buffer is full the unsent datagrams stay queued (never a wait). Returns the
    /// number sent.
    pub fn send_batch(&self, batch: &mut SendBatch, failed: impl FnMut(u64)) -> usize {
        send_batch_on(self.sock.as_raw_fd(), batch, failed)
    }
}

/// [`UdpIo::recv_batch`] on any non-blocking UDP socket `fd` (the responder and the
/// load generator's raw client share these batches with the engine).
pub fn recv_batch_on(fd: RawFd, batch: &mut RecvBatch) -> io::Result<usize> {
    batch.prepare();
    // SAFETY: the mmsghdr array points into buffers owned by `batch`, all valid for
    // the lengths given; the kernel writes at most those lengths.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            batch.hdrs.as_mut_ptr(),
            batch.hdrs.len() as u32,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(0),
            // ICMP errors (port unreachable) surface here on Linux; not fatal.
            io::ErrorKind::ConnectionRefused => Ok(0),
            _ => Err(e),
        };
    }
    batch.len = n as usize;
    Ok(n as usize)
}

/// [`UdpIo::send_batch`] on any non-blocking UDP socket `fd`.
pub fn send_batch_on(fd: RawFd, batch: &mut SendBatch, mut failed: impl FnMut(u64)) -> usize {
    let mut sent = 0;
    let mut at = 0;
    while at < batch.len {
        batch.prepare(at);
        // SAFETY: headers at..len point into buffers and addresses owned by `batch`.
        let n = unsafe {
            libc::sendmmsg(
                fd,
                batch.hdrs.as_mut_ptr().add(at),
                (batch.len - at) as u32,
                libc::MSG_DONTWAIT,
            )
        };
        if n > 0 {
            sent += n as usize;
            at += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {
                // Send buffer full: never wait; the unsent datagrams stay queued at the
                // front of the batch for the next flush.
                batch.keep_from(at);
                return sent;
            }
            _ => {
                failed(batch.tags[at]);
                at += 1;
            }
        }
    }
    batch.len = 0;
    sent
}

impl AsRawFd for UdpIo {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// Fixed receive batch: `n` buffers of [`RECV_BUF`] bytes with their source addresses.
pub struct RecvBatch {
    bufs: Box<[[u8; RECV_BUF]]>,
    addrs: Box<[libc::sockaddr_storage]>,
    iovs: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    len: usize,
}

impl RecvBatch {
    pub fn new(n: usize) -> RecvBatch {
        let n = n.max(1);
        let bufs = vec![[0u8; RECV_BUF]; n].into_boxed_slice();
        // SAFETY: all-zero is a valid value for these plain C structs.
        let addrs = (0..n).map(|_| unsafe { zeroed() }).collect();
        let iovs = (0..n)
            .map(|_| libc::iovec {
                iov_base: std::ptr::null_mut(),
                iov_len: 0,
            })
            .collect();
        let hdrs = (0..n).map(|_| unsafe { zeroed() }).collect();
        RecvBatch {
            bufs,
            addrs,
            iovs,
            hdrs,
            len: 0,
        }
    }

    fn prepare(&mut self) {
        for i in 0..self.hdrs.len() {
            self.iovs[i].iov_base = self.bufs[i].as_mut_ptr().cast();
            self.iovs[i].iov_len = RECV_BUF;
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as u32;
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        self.len = 0;
    }

    /// Number of datagrams received by the last `recv_batch`.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Datagram `i` of the last receive, mutable (AES decrypts in place), or `None`
    /// when it was truncated (longer than the buffer).
    pub fn datagram(&mut self, i: usize) -> Option<&mut [u8]> {
        let h = &self.hdrs[i];
        if h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0 {
            return None;
        }
        let n = (h.msg_len as usize).min(RECV_BUF);
        Some(&mut self.bufs[i][..n])
    }

    /// Source address of datagram `i` (informational: responses are not checked by
    /// source address).
    pub fn source(&self, i: usize) -> Option<SocketAddr> {
        sockaddr_to_std(&self.addrs[i])
    }
}

fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family says sockaddr_in, which fits in sockaddr_storage.
            let a: &libc::sockaddr_in = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family says sockaddr_in6, which fits in sockaddr_storage.
            let a: &libc::sockaddr_in6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn std_to_sockaddr(addr: SocketAddr, v6_socket: bool, out: &mut libc::sockaddr_storage) -> u32 {
    // SAFETY: writing plain C structs into storage large enough for either.
    unsafe {
        match addr {
            SocketAddr::V4(a) if !v6_socket => {
                let p = out as *mut _ as *mut libc::sockaddr_in;
                *p = zeroed();
                (*p).sin_family = libc::AF_INET as libc::sa_family_t;
                (*p).sin_port = a.port().to_be();
                (*p).sin_addr.s_addr = u32::from(*a.ip()).to_be();
                size_of::<libc::sockaddr_in>() as u32
            }
            _ => {
                let a = match addr {
                    SocketAddr::V6(a) => a,
                    // IPv4 remote from a dual-stack IPv6 socket: v4-mapped address.
                    SocketAddr::V4(a) => SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0),
                };
                let p = out as *mut _ as *mut libc::sockaddr_in6;
                *p = zeroed();
                (*p).sin6_family = libc::AF_INET6 as libc::sa_family_t;
                (*p).sin6_port = a.port().to_be();
                (*p).sin6_flowinfo = a.flowinfo();
                (*p).sin6_addr.s6_addr = a.ip().octets();
                (*p).sin6_scope_id = a.scope_id();
                size_of::<libc::sockaddr_in6>() as u32
            }
        }
    }
}

/// Fixed send batch: up to `n` datagrams copied in (at most [`SEND_BUF`] bytes each),
/// each with its destination and a caller tag for failure reports.
pub struct SendBatch {
    bufs: Box<[[u8; SEND_BUF]]>,
    lens: Box<[usize]>,
    addrs: Box<[libc::sockaddr_storage]>,
    addr_lens: Box<[u32]>,
    tags: Box<[u64]>,
    iovs: Box<[libc::iovec]>,
    hdrs: Box<[libc::mmsghdr]>,
    len: usize,
    v6_socket: bool,
}

impl SendBatch {
    pub fn new(n: usize) -> SendBatch {
        let n = n.max(1);
        SendBatch {
            bufs: vec![[0u8; SEND_BUF]; n].into_boxed_slice(),
            lens: vec![0; n].into_boxed_slice(),
            // SAFETY: all-zero is valid for these plain C structs.
            addrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            addr_lens: vec![0; n].into_boxed_slice(),
            tags: vec![0; n].into_boxed_slice(),
            iovs: (0..n)
                .map(|_| libc::iovec {
                    iov_base: std::ptr::null_mut(),
                    iov_len: 0,
                })
                .collect(),
            hdrs: (0..n).map(|_| unsafe { zeroed() }).collect(),
            len: 0,
            v6_socket: false,
        }
    }

    /// Number of queued datagrams.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when no more datagrams fit: flush first.
    pub fn is_full(&self) -> bool {
        self.len == self.bufs.len()
    }

    /// Moves the datagrams `from..len` to the front (the rest were sent).
    fn keep_from(&mut self, from: usize) {
        let n = self.len - from;
        for i in 0..n {
            self.bufs.swap(i, from + i);
            self.lens[i] = self.lens[from + i];
            self.addrs[i] = self.addrs[from + i];
            self.addr_lens[i] = self.addr_lens[from + i];
            self.tags[i] = self.tags[from + i];
        }
        self.len = n;
    }

    /// Empties the batch, handing every queued tag to `f` (nothing is sent).
    pub fn drain_tags(&mut self, mut f: impl FnMut(u64)) {
        for i in 0..self.len {
            f(self.tags[i]);
        }
        self.len = 0;
    }

    /// Sets the address family of the socket the batch will be sent on (an IPv6 socket
    /// sends to IPv4 peers through v4-mapped addresses). Only while empty.
    pub fn set_v6_socket(&mut self, v6: bool) {
        debug_assert!(self.len == 0);
        self.v6_socket = v6;
    }

    /// Queues one datagram. The caller flushes when [`is_full`](Self::is_full).
    /// Returns false (nothing queued) when full or the datagram is too long.
    pub fn push(&mut self, datagram: &[u8], to: SocketAddr, tag: u64) -> bool {
        if self.is_full() || datagram.len() > SEND_BUF {
            return false;
        }
        let i = self.len;
        self.bufs[i][..datagram.len()].copy_from_slice(datagram);
        self.lens[i] = datagram.len();
        self.addr_lens[i] = std_to_sockaddr(to, self.v6_socket, &mut self.addrs[i]);
        self.tags[i] = tag;
        self.len += 1;
        true
    }

    fn prepare(&mut self, from: usize) {
        for i in from..self.len {
            self.iovs[i].iov_base = self.bufs[i].as_mut_ptr().cast();
            self.iovs[i].iov_len = self.lens[i];
            let h = &mut self.hdrs[i];
            h.msg_hdr.msg_name = (&mut self.addrs[i] as *mut libc::sockaddr_storage).cast();
            h.msg_hdr.msg_namelen = self.addr_lens[i];
            h.msg_hdr.msg_iov = &mut self.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = std::ptr::null_mut();
            h.msg_hdr.msg_controllen = 0;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
    }
}

/// Most file descriptors [`wait_fds`] waits on (more is an error, never a silent cut).
pub const MAX_WAIT_FDS: usize = 64;

/// Blocks until one of `fds` has `events` or `timeout` passes (`None` = forever).
/// Returns the number of ready fds (0 on timeout or interruption).
pub fn wait_fds(fds: &[RawFd], events: i16, timeout: Option<Duration>) -> io::Result<usize> {
    let mut pfds = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX_WAIT_FDS];
    if fds.len() > MAX_WAIT_FDS {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let n = fds.len();
    for (p, fd) in pfds.iter_mut().zip(fds.iter()) {
        p.fd = *fd;
        p.events = events;
    }
    let ms = match timeout {
        None => -1,
        Some(d) => {
            // round up so the wait never ends before the deadline
            let us = d.as_micros();
            us.div_ceil(1000).min(i32::MAX as u128) as i32
        }
    };
    // SAFETY: pfds is a valid array of n pollfd entries.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), n as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

/// A cross-thread wake fd (eventfd): any thread may `wake()`, the core `drain()`s it.
pub struct WakeFd {
    fd: RawFd,
}

impl WakeFd {
    pub fn new() -> io::Result<WakeFd> {
        // SAFETY: plain syscall; the fd is owned by the returned value.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WakeFd { fd })
    }

    /// Wakes the core (one syscall).
    pub fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Clears pending wakes.
    pub fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64 from our non-blocking eventfd.
        unsafe { libc::read(self.fd, (&mut v as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for WakeFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl Drop for WakeFd {
    fn drop(&mut self) {
        // SAFETY: we own the fd.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_roundtrip_on_loopback() {
        let a = UdpIo::bind("127.0.0.1:0".parse().unwrap(), 1 << 20, 1 << 20).unwrap();
        let b = UdpIo::bind("127.0.0.1:0".parse().unwrap(), 1 << 20, 1 << 20).unwrap();
        let mut sb = SendBatch::new(8);
        for i in 0..8u8 {
            assert!(sb.push(&[i; 100], b.local_addr(), i as u64));
        }
        assert!(sb.is_full());
        let mut fails = 0;
        assert_eq!(a.send_batch(&mut sb, |_| fails += 1), 8);
        assert_eq!(fails, 0);
        let mut rb = RecvBatch::new(4);
        let mut got = Vec::new();
        for _ in 0..100 {
            wait_fds(
                &[b.as_raw_fd()],
                libc::POLLIN,
                Some(Duration::from_millis(100)),
            )
            .unwrap();
            let n = b.recv_batch(&mut rb).unwrap();
            for i in 0..n {
                assert_eq!(rb.source(i), Some(a.local_addr()));
                got.push(rb.datagram(i).unwrap()[0]);
            }
            if got.len() == 8 {
                break;
            }
        }
        assert_eq!(got, (0..8).collect::<Vec<u8>>());
        assert_eq!(b.recv_batch(&mut rb).unwrap(), 0);
    }

    #[test]
    fn dual_stack_sends_to_v4() {
        let Ok(a) = UdpIo::bind_for(true, 0, 0, 0) else {
            return; // no IPv6 on this host
        };
        let b = UdpIo::bind("127.0.0.1:0".parse().unwrap(), 0, 0).unwrap();
        let mut sb = SendBatch::new(2);
        sb.set_v6_socket(true);
        sb.push(b"hi", b.local_addr(), 0);
        assert_eq!(a.send_batch(&mut sb, |_| {}), 1);
        let mut rb = RecvBatch::new(2);
        wait_fds(
            &[b.as_raw_fd()],
            libc::POLLIN,
            Some(Duration::from_millis(500)),
        )
        .unwrap();
        assert_eq!(b.recv_batch(&mut rb).unwrap(), 1);
        assert_eq!(rb.datagram(0).unwrap(), b"hi");
    }

    #[test]
    fn rebind_moves_to_steering_range_and_wakefd_works() {
        let s = UdpIo::rebind_next(false, 1234, 32, 0, 0).unwrap();
        let p = s.local_addr().port();
        assert!(p >= STEER_PORT_FIRST);
        let s2 = UdpIo::rebind_next(false, p, 32, 0, 0).unwrap();
        assert_ne!(s2.local_addr().port(), p);
        let w = WakeFd::new().unwrap();
        assert_eq!(
            wait_fds(&[w.as_raw_fd()], libc::POLLIN, Some(Duration::ZERO)).unwrap(),
            0
        );
        w.wake();
        assert_eq!(
            wait_fds(&[w.as_raw_fd()], libc::POLLIN, Some(Duration::ZERO)).unwrap(),
            1
        );
        w.drain();
        assert_eq!(
            wait_fds(&[w.as_raw_fd()], libc::POLLIN, Some(Duration::ZERO)).unwrap(),
            0
        );
    }
}
