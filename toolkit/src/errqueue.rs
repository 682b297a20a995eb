//! ICMP errors of a UDP socket, from its error queue: with `IP_RECVERR` (IPv4) or
//! `IPV6_RECVERR` (IPv6) set, the kernel queues every ICMP error that answers a datagram
//! the socket sent (port, host or network unreachable, ...) with the datagram's
//! destination, and `recvmsg(MSG_ERRQUEUE)` reads them. Without the option an unconnected
//! UDP socket never learns of them.
//!
//! Owns: the socket option and the parsing of `sock_extended_err`. Must not touch: what
//! the errors mean to a request (`trace.rs`, `words.rs`).

use std::io;
use std::mem::{MaybeUninit, size_of};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use ratelimitly_engine::udp::set_int_option;

/// What an ICMP error says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IcmpKind {
    /// Nothing listens on the port (ICMP port unreachable; `ECONNREFUSED`).
    PortUnreachable,
    /// The host cannot be reached (`EHOSTUNREACH`).
    HostUnreachable,
    /// The network cannot be reached (`ENETUNREACH`).
    NetUnreachable,
    /// Another error, by its OS error number.
    Other(i32),
}

impl IcmpKind {
    fn of_errno(errno: i32) -> IcmpKind {
        match errno {
            libc::ECONNREFUSED => IcmpKind::PortUnreachable,
            libc::EHOSTUNREACH => IcmpKind::HostUnreachable,
            libc::ENETUNREACH => IcmpKind::NetUnreachable,
            e => IcmpKind::Other(e),
        }
    }
}

/// One ICMP error taken from the error queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IcmpError {
    /// Where the datagram the error answers was sent.
    pub dest: Option<SocketAddr>,
    /// What it says.
    pub kind: IcmpKind,
    /// The host that sent the ICMP message (`SO_EE_OFFENDER`), when given.
    pub reporter: Option<IpAddr>,
}

/// Turns on the error queue of `sock` (`IP_RECVERR`, or `IPV6_RECVERR` for an IPv6 socket).
pub fn enable(sock: &UdpSocket) -> io::Result<()> {
    let (level, name) = if sock.local_addr()?.is_ipv6() {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
    } else {
        (libc::IPPROTO_IP, libc::IP_RECVERR)
    };
    set_int_option(sock, level, name, 1)
}

/// Takes the next error from the queue of `sock` without blocking; `Ok(None)` when it is
/// empty. Errors that are not ICMP (local ones) are returned with their errno as well.
pub fn take(sock: &UdpSocket) -> io::Result<Option<IcmpError>> {
    let mut name = MaybeUninit::<libc::sockaddr_storage>::zeroed();
    let mut data = [0u8; 64];
    let mut control = [0u64; 64]; // u64: aligned for cmsghdr
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data (integers and raw pointers), for which all zero
    // bytes are a valid value; every pointer set below refers to a live local buffer
    // whose length is the one given.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = name.as_mut_ptr().cast();
    msg.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<[u64; 64]>() as _;
    // SAFETY: msg points only to the local name, data and control buffers above, with
    // their exact lengths, and they outlive the call; the kernel writes within them.
    let n = unsafe {
        libc::recvmsg(
            sock.as_raw_fd(),
            &mut msg,
            libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: `name` is a zeroed (so initialised) sockaddr_storage that the kernel wrote
    // the source address into; `sockaddr` reads at most a sockaddr_in6 of it (checked
    // against msg_namelen), well within its 128 bytes.
    let dest = unsafe { sockaddr(name.as_ptr(), msg.msg_namelen) };
    // SAFETY: msg's control pointer and msg_controllen describe the live, u64-aligned
    // `control` buffer the kernel filled; CMSG_FIRSTHDR returns its first header or null
    // when msg_controllen cannot hold one.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: cmsg is non-null and came from CMSG_FIRSTHDR or CMSG_NXTHDR on this msg,
        // which hand out only aligned headers that lie wholly inside the control buffer.
        let (level, kind) = unsafe { ((*cmsg).cmsg_level, (*cmsg).cmsg_type) };
        let ours = (level == libc::SOL_IP && kind == libc::IP_RECVERR)
            || (level == libc::SOL_IPV6 && kind == libc::IPV6_RECVERR);
        if ours {
            // SAFETY: the kernel writes an IP(V6)_RECVERR message as one sock_extended_err
            // followed by the offender's address (SO_EE_OFFENDER: a sockaddr_in, or a
            // sockaddr_in6 for IPV6_RECVERR), 44 bytes at most, and the 512-byte control
            // buffer holds the whole message; `sockaddr` reads only the struct of the
            // family it finds there. Every read is an unaligned copy out of the buffer.
            let ee = unsafe {
                let p = libc::CMSG_DATA(cmsg);
                let ee = std::ptr::read_unaligned(p.cast::<libc::sock_extended_err>());
                let off = p.add(size_of::<libc::sock_extended_err>());
                let reporter = sockaddr(off.cast(), size_of::<libc::sockaddr_in6>() as _);
                (ee, reporter.map(|a| a.ip()))
            };
            return Ok(Some(IcmpError {
                dest,
                kind: IcmpKind::of_errno(ee.0.ee_errno as i32),
                reporter: ee.1.filter(|ip| !ip.is_unspecified()),
            }));
        }
        // SAFETY: cmsg is a header of this msg's control buffer (see CMSG_FIRSTHDR
        // above); CMSG_NXTHDR returns the next one inside msg_controllen, or null.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    Ok(None)
}

/// The socket address at `p` (IPv4 or IPv6), `None` for another family.
///
/// # Safety
/// `p` must point to at least `len` readable bytes of a socket address.
unsafe fn sockaddr(p: *const libc::sockaddr_storage, len: libc::socklen_t) -> Option<SocketAddr> {
    let len = len as usize;
    // SAFETY: the family field is the first of every socket address; the caller
    // guarantees `len` readable bytes, checked against each struct's size.
    unsafe {
        let family = std::ptr::read_unaligned(p.cast::<libc::sa_family_t>());
        match i32::from(family) {
            libc::AF_INET if len >= size_of::<libc::sockaddr_in>() => {
                let a = std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>());
                let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(
                    ip,
                    u16::from_be(a.sin_port),
                )))
            }
            libc::AF_INET6 if len >= size_of::<libc::sockaddr_in6>() => {
                let a = std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>());
                let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(a.sin6_port),
                    a.sin6_flowinfo,
                    a.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A datagram to a loopback port nothing listens on comes back as "port unreachable"
    /// for that address (bounded wait).
    #[test]
    fn a_closed_loopback_port_is_reported_unreachable() {
        let closed = UdpSocket::bind("127.0.0.1:0").unwrap();
        let dest = closed.local_addr().unwrap();
        drop(closed);
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        enable(&sock).unwrap();
        sock.send_to(b"x", dest).unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        let err = loop {
            if let Some(e) = take(&sock).unwrap() {
                break e;
            }
            assert!(Instant::now() < until, "no ICMP error within 5 s");
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(err.kind, IcmpKind::PortUnreachable);
        assert_eq!(err.dest, Some(dest));
        assert!(take(&sock).unwrap().is_none());
    }
}
