//! Socket creation for the UDP driver (socket2): non-blocking, close-on-exec, IPv4 or
//! dual-stack IPv6, buffer sizes, `SO_REUSEPORT` on request, `UDP_GRO`, steering-range
//! rebinds, other `int` socket options ([`set_int_option`]); and the conversions between `SocketAddr` and the C socket addresses the
//! backends hand to the kernel.
//!
//! Owns: these system calls only. Must not touch: sending, receiving, waiting.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::IoConfig;

/// First port of the steering range (docs/protocol.md §14).
pub const STEER_PORT_FIRST: u16 = 49152;
/// Last port of the steering range.
pub const STEER_PORT_LAST: u16 = 65535;

/// Options of `UdpIo::bind_with`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BindOptions {
    /// Set `SO_REUSEPORT` (several sockets, e.g. one per core, share one port).
    pub reuse_port: bool,
}

/// A freshly bound socket.
pub(crate) struct Opened {
    pub(crate) sock: Socket,
    pub(crate) local: SocketAddr,
    /// `UDP_GRO` is on.
    pub(crate) gro: bool,
}

/// Binds a non-blocking UDP socket on `addr` (IPv6 also accepts IPv4: dual stack).
pub(crate) fn open(addr: SocketAddr, cfg: &IoConfig, opts: BindOptions) -> io::Result<Opened> {
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
    if opts.reuse_port {
        sock.set_reuse_port(true)?;
    }
    // Best effort: a limit below the request (rmem_max) is not an error.
    if cfg.recv_buf > 0 {
        let _ = sock.set_recv_buffer_size(cfg.recv_buf);
    }
    if cfg.send_buf > 0 {
        let _ = sock.set_send_buffer_size(cfg.send_buf);
    }
    sock.bind(&SockAddr::from(addr))?;
    let local = sock
        .local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidData))?;
    let gro = cfg.gro && set_gro(&sock).is_ok();
    Ok(Opened { sock, local, gro })
}

/// Turns `UDP_GRO` on.
fn set_gro(sock: &Socket) -> io::Result<()> {
    set_int_option(sock, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Sets the `int`-valued socket option `name` at `level` on `sock` to `value`
/// (`setsockopt(2)`); the error is the call's errno. The one `setsockopt` of the I/O layer
/// and of the tools beside it (rl-toolkit's ICMP error queue) for options that socket2
/// does not name.
pub fn set_int_option(
    sock: &impl AsFd,
    level: libc::c_int,
    name: libc::c_int,
    value: libc::c_int,
) -> io::Result<()> {
    // SAFETY: the fd is open for the borrow's duration (`AsFd`), and the option value
    // points to a live `c_int` whose exact size is passed, so the kernel reads only it.
    let r = unsafe {
        libc::setsockopt(
            sock.as_fd().as_raw_fd(),
            level,
            name,
            (&value as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The unspecified address of the family that reaches IPv6 remotes (dual stack) or
/// IPv4 ones only.
pub(crate) fn unspecified(v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    } else {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    }
}

/// Steering rebind: the next free port after `after` in the steering range, at most
/// `max_tries` ports tried.
pub(crate) fn bind_steering(
    v6: bool,
    after: u16,
    max_tries: u16,
    cfg: &IoConfig,
) -> io::Result<Opened> {
    let span = u32::from(STEER_PORT_LAST - STEER_PORT_FIRST) + 1;
    let start = if after >= STEER_PORT_FIRST {
        u32::from(after - STEER_PORT_FIRST) + 1
    } else {
        0
    };
    let mut last_err = io::Error::from(io::ErrorKind::AddrInUse);
    for i in 0..u32::from(max_tries).min(span) {
        let port = (u32::from(STEER_PORT_FIRST) + (start + i) % span) as u16;
        if port == after {
            continue;
        }
        match open(
            SocketAddr::new(unspecified(v6), port),
            cfg,
            BindOptions::default(),
        ) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = e,
            Err(e) => return Err(e),
        }
    }
    Err(last_err)
}

/// Writes `addr` as a C socket address for a socket of the given family (an IPv6
/// socket reaches IPv4 peers through v4-mapped addresses); returns its length.
pub(crate) fn to_c(addr: SocketAddr, v6_socket: bool, out: &mut libc::sockaddr_storage) -> u32 {
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

/// Reads a C socket address from raw bytes (as the kernel wrote them). A v4-mapped
/// IPv6 source comes back as IPv4, so replies and comparisons see one form.
pub(crate) fn from_c_bytes(b: &[u8]) -> Option<SocketAddr> {
    if b.len() < 2 {
        return None;
    }
    let family = u16::from_ne_bytes([b[0], b[1]]) as i32;
    match family {
        libc::AF_INET if b.len() >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: length checked; read_unaligned copes with any alignment.
            let a: libc::sockaddr_in = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if b.len() >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: length checked; read_unaligned copes with any alignment.
            let a: libc::sockaddr_in6 = unsafe { std::ptr::read_unaligned(b.as_ptr().cast()) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            let port = u16::from_be(a.sin6_port);
            Some(match ip.to_ipv4_mapped() {
                Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                None => SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    port,
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )),
            })
        }
        _ => None,
    }
}

/// [`from_c_bytes`] on a `sockaddr_storage`.
pub(crate) fn from_c(ss: &libc::sockaddr_storage, len: u32) -> Option<SocketAddr> {
    let len = (len as usize).min(size_of::<libc::sockaddr_storage>());
    // SAFETY: a sockaddr_storage is plain bytes of that size.
    let bytes = unsafe {
        std::slice::from_raw_parts((ss as *const libc::sockaddr_storage).cast::<u8>(), len)
    };
    from_c_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_address_roundtrip() {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut ss: libc::sockaddr_storage = unsafe { zeroed() };
        for (a, v6) in [
            ("127.0.0.1:4000", false),
            ("127.0.0.1:4000", true),
            ("[::1]:5000", true),
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let n = to_c(a, v6, &mut ss);
            assert_eq!(from_c(&ss, n), Some(a));
        }
        assert_eq!(from_c_bytes(&[0, 0, 1]), None);
    }

    #[test]
    fn steering_is_bounded_and_in_range() {
        let cfg = IoConfig::default();
        let s = bind_steering(false, 1234, 200, &cfg).unwrap();
        let p = s.local.port();
        assert!(p >= STEER_PORT_FIRST);
        let s2 = bind_steering(false, p, 200, &cfg).unwrap();
        assert_ne!(s2.local.port(), p);
        // zero tries: nothing is tried
        assert!(bind_steering(false, p, 0, &cfg).is_err());
    }
}
