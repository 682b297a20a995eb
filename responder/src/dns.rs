//! Test DNS responder: serves Ratelimitly discovery records for one domain on loopback.
//!
//! Owns: one std `UdpSocket` and its background thread; DNS messages are decoded and
//! encoded with hickory-proto's `Message` types (no hand-written DNS codec). Serves
//! SRV `_ratelimitly._udp.<domain>` → `s-<id>.<domain>` with each server's port (A/AAAA
//! of the targets also as additional records), and A / AAAA for each `s-<id>.<domain>`.
//! Other names get NXDOMAIN; a known name without records of the asked type gets an
//! empty NOERROR answer. Must not touch: the wire-v2 responder, keys.
//!
//! The thread polls with a 50 ms read timeout, so [`DnsHandle::stop`] returns promptly.

use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SRV};
use hickory_proto::rr::{Name, RData, Record, RecordType};

/// Options of [`spawn_with`].
#[derive(Clone, Debug)]
pub struct DnsOptions {
    /// Listen address (default 127.0.0.1:0).
    pub listen: SocketAddr,
    /// TTL of every record, seconds (default 30).
    pub ttl_s: u32,
}

impl Default for DnsOptions {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            ttl_s: 30,
        }
    }
}

struct Zone {
    srv_name: Name,
    domain: Name,
    /// (target name, port, addresses)
    servers: Vec<(Name, u16, Vec<IpAddr>)>,
}

fn build_zone(domain: &str, servers: &[(u64, Vec<SocketAddr>)]) -> io::Result<Zone> {
    let bad = |_| io::Error::new(io::ErrorKind::InvalidInput, "invalid DNS domain");
    let domain = domain.trim_end_matches('.');
    let dom = Name::from_ascii(format!("{domain}.")).map_err(bad)?;
    let srv_name = Name::from_ascii(format!("_ratelimitly._udp.{domain}.")).map_err(bad)?;
    let mut out = Vec::with_capacity(servers.len());
    for (id, addrs) in servers {
        let target = Name::from_ascii(format!("s-{id}.{domain}.")).map_err(bad)?;
        let port = addrs.first().map_or(0, SocketAddr::port);
        out.push((target, port, addrs.iter().map(SocketAddr::ip).collect()));
    }
    Ok(Zone {
        srv_name,
        domain: dom,
        servers: out,
    })
}

/// A running DNS responder; stops on [`DnsHandle::stop`] or drop.
pub struct DnsHandle {
    addr: SocketAddr,
    domain: String,
    zone: Arc<Mutex<Zone>>,
    stop: Arc<AtomicBool>,
    queries: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// Starts a DNS responder on 127.0.0.1:0 with a 30 s TTL. `servers`: (server id, its
/// endpoint addresses, which share one port).
pub fn spawn(domain: &str, servers: Vec<(u64, Vec<SocketAddr>)>) -> io::Result<DnsHandle> {
    spawn_with(domain, servers, DnsOptions::default())
}

/// [`spawn`] with explicit options.
pub fn spawn_with(
    domain: &str,
    servers: Vec<(u64, Vec<SocketAddr>)>,
    opts: DnsOptions,
) -> io::Result<DnsHandle> {
    let zone = Arc::new(Mutex::new(build_zone(domain, &servers)?));
    let sock = UdpSocket::bind(opts.listen)?;
    sock.set_read_timeout(Some(Duration::from_millis(50)))?;
    let addr = sock.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let queries = Arc::new(AtomicU64::new(0));
    let thread = {
        let (zone, stop, queries) = (zone.clone(), stop.clone(), queries.clone());
        let ttl = opts.ttl_s;
        std::thread::Builder::new()
            .name("rl-dns".into())
            .spawn(move || serve(&sock, &zone, &stop, &queries, ttl))?
    };
    Ok(DnsHandle {
        addr,
        domain: domain.to_owned(),
        zone,
        stop,
        queries,
        thread: Some(thread),
    })
}

fn serve(sock: &UdpSocket, zone: &Mutex<Zone>, stop: &AtomicBool, queries: &AtomicU64, ttl: u32) {
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        let (n, peer) = match sock.recv_from(&mut buf) {
            Ok(v) => v,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(_) => continue,
        };
        let Ok(req) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        if req.metadata.message_type != MessageType::Query {
            continue;
        }
        queries.fetch_add(1, Ordering::Relaxed);
        let resp = {
            let z = zone.lock().unwrap_or_else(|p| p.into_inner());
            answer(&req, &z, ttl)
        };
        if let Ok(bytes) = resp.to_vec() {
            let _ = sock.send_to(&bytes, peer);
        }
    }
}

fn addr_record(name: &Name, ip: IpAddr, ttl: u32) -> Record {
    let data = match ip {
        IpAddr::V4(v4) => RData::A(A::from(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA::from(v6)),
    };
    Record::from_rdata(name.clone(), ttl, data)
}

fn answer(req: &Message, zone: &Zone, ttl: u32) -> Message {
    let mut resp = Message::response(req.metadata.id, OpCode::Query);
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    resp.metadata.authoritative = true;
    let Some(q) = req.queries.first() else {
        resp.metadata.response_code = ResponseCode::FormErr;
        return resp;
    };
    resp.add_query(q.clone());
    let name = q.name();
    let qtype = q.query_type();
    if *name == zone.srv_name {
        if matches!(qtype, RecordType::SRV | RecordType::ANY) {
            for (target, port, addrs) in &zone.servers {
                let srv = SRV::new(0, 0, *port, target.clone());
                resp.add_answer(Record::from_rdata(name.clone(), ttl, RData::SRV(srv)));
                for ip in addrs {
                    resp.add_additional(addr_record(target, *ip, ttl));
                }
            }
        }
        return resp;
    }
    if let Some((target, _, addrs)) = zone.servers.iter().find(|(t, _, _)| t == name) {
        for ip in addrs {
            let fits = match qtype {
                RecordType::A => ip.is_ipv4(),
                RecordType::AAAA => ip.is_ipv6(),
                RecordType::ANY => true,
                _ => false,
            };
            if fits {
                resp.add_answer(addr_record(target, *ip, ttl));
            }
        }
        return resp;
    }
    if *name != zone.domain {
        resp.metadata.response_code = ResponseCode::NXDomain;
    }
    resp
}

impl DnsHandle {
    /// Address the responder listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queries answered so far.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }

    /// Replaces the served servers (takes effect for the next query).
    pub fn set_servers(&self, servers: Vec<(u64, Vec<SocketAddr>)>) {
        if let Ok(z) = build_zone(&self.domain, &servers) {
            *self.zone.lock().unwrap_or_else(|p| p.into_inner()) = z;
        }
    }

    /// Stops the thread and waits for it (at most about 50 ms).
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DnsHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    fn ask(addr: SocketAddr, name: &str, t: RecordType) -> Message {
        let s = UdpSocket::bind("127.0.0.1:0").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut m = Message::query();
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        s.send_to(&m.to_vec().unwrap(), addr).unwrap();
        let mut buf = [0u8; 4096];
        let n = s.recv(&mut buf).unwrap();
        Message::from_vec(&buf[..n]).unwrap()
    }

    #[test]
    fn srv_a_aaaa_and_update() {
        let a: SocketAddr = "127.0.0.1:4000".parse().unwrap();
        let b: SocketAddr = "[::1]:4000".parse().unwrap();
        let h = spawn("example.test", vec![(77, vec![a, b])]).unwrap();
        let m = ask(h.addr(), "_ratelimitly._udp.example.test.", RecordType::SRV);
        assert_eq!(m.answers.len(), 1);
        let RData::SRV(srv) = &m.answers[0].data else {
            panic!("not srv")
        };
        assert_eq!(srv.port, 4000);
        assert_eq!(srv.target.to_ascii(), "s-77.example.test.");
        assert_eq!(m.additionals.len(), 2);
        let m = ask(h.addr(), "S-77.example.test.", RecordType::AAAA);
        assert_eq!(m.answers.len(), 1);
        let m = ask(h.addr(), "nope.example.test.", RecordType::A);
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        h.set_servers(vec![(1, vec![a]), (2, vec![a])]);
        let m = ask(h.addr(), "_ratelimitly._udp.example.test.", RecordType::SRV);
        assert_eq!(m.answers.len(), 2);
        assert!(h.queries() >= 4);
        h.stop();
    }
}
