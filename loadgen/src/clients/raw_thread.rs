//! One raw client thread (see `raw`): its socket, the ring of requests in flight, the
//! batched send and receive loop and the timeouts.
//!
//! Owns the thread's socket and state. Must not touch the engine's request machine.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimitly_engine::engine::io::{RecvBatch, SendBatch, UdpIo};
use ratelimitly_engine::proto::wire::{self, TenantFields};

use super::raw_config::RawConfig;
use crate::stats::{Kind, Phase};

/// Per-thread load.
#[derive(Clone, Copy, Debug)]
pub enum RawLoad {
    Closed { in_flight: usize },
    Open { rate: f64 },
}

#[derive(Clone, Copy)]
struct Slot {
    seq: u64,
    intended: Instant,
    live: bool,
}

/// The ring of requests in flight, indexed by sequence number.
struct InFlight {
    phase: Arc<Phase>,
    slots: Vec<Slot>,
    mask: u64,
    outstanding: usize,
}

impl InFlight {
    /// Completes request `seq` with `kind` if it is still in flight.
    fn complete(&mut self, seq: u64, now: Instant, kind: Kind) {
        let idx = (seq & self.mask) as usize;
        let s = self.slots[idx];
        if s.live && s.seq == seq {
            self.slots[idx].live = false;
            self.outstanding -= 1;
            self.phase.record(s.intended, now, kind, Some(1));
        }
    }
}

/// One raw client thread's state.
struct RawThread {
    cfg: Arc<RawConfig>,
    sock: UdpIo,
    prefix: [u8; 9],
    nonce_prefix: [u8; 4],
    next_seq: u64,
    flight: InFlight,
    timeouts: VecDeque<(u64, Instant)>,
    /// Where one request is sealed before it is queued.
    scratch: [u8; wire::MAX_DATAGRAM],
    /// Queued requests, tagged with their sequence number.
    send: SendBatch,
    recv: RecvBatch,
}

impl RawThread {
    fn new(cfg: Arc<RawConfig>, phase: Arc<Phase>, capacity: usize) -> std::io::Result<Self> {
        let bind: SocketAddr = match cfg.targets[0] {
            SocketAddr::V4(a) if a.ip().is_loopback() => "127.0.0.1:0".parse().expect("static"),
            SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("static"),
            SocketAddr::V6(a) if a.ip().is_loopback() => "[::1]:0".parse().expect("static"),
            SocketAddr::V6(_) => "[::]:0".parse().expect("static"),
        };
        let sock = UdpIo::bind(bind, cfg.socket_buffer, cfg.socket_buffer)?;
        let r = wire::new_unique_id().map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        let mut prefix = [0u8; 9];
        prefix.copy_from_slice(&r[..9]);
        prefix[6] = (prefix[6] & 0x0F) | 0x40;
        prefix[8] = (prefix[8] & 0x3F) | 0x80;
        let n = wire::new_nonce().map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        let cap = capacity.next_power_of_two().max(64);
        let now = Instant::now();
        let mut send = SendBatch::new(cfg.batch);
        send.set_v6_socket(bind.is_ipv6());
        Ok(RawThread {
            sock,
            prefix,
            nonce_prefix: [n[0], n[1], n[2], n[3]],
            next_seq: 0,
            flight: InFlight {
                phase,
                slots: vec![
                    Slot {
                        seq: u64::MAX,
                        intended: now,
                        live: false
                    };
                    cap
                ],
                mask: cap as u64 - 1,
                outstanding: 0,
            },
            timeouts: VecDeque::with_capacity(cap),
            scratch: [0u8; wire::MAX_DATAGRAM],
            send,
            recv: RecvBatch::new(cfg.batch),
            cfg,
        })
    }

    /// Seals one request into the send batch. False when its slot is still busy.
    /// The caller flushes when the batch is full.
    fn prepare(&mut self, intended: Instant, now: Instant, wall_ms: u64) -> bool {
        let seq = self.next_seq;
        let idx = (seq & self.flight.mask) as usize;
        if self.flight.slots[idx].live {
            return false;
        }
        self.next_seq += 1;
        let mut uid = [0u8; 16];
        uid[..9].copy_from_slice(&self.prefix);
        uid[9..].copy_from_slice(&seq.to_le_bytes()[..7]);
        let mut nonce = [0u8; 12];
        nonce[..4].copy_from_slice(&self.nonce_prefix);
        nonce[4..].copy_from_slice(&seq.to_le_bytes());
        let tpl = &self.cfg.templates[(seq % self.cfg.templates.len() as u64) as usize];
        let off = self.cfg.auth.pdu_offset();
        let buf = &mut self.scratch;
        buf[off..off + tpl.len()].copy_from_slice(tpl);
        let tenant = TenantFields {
            id: self.cfg.key_id,
            unique_id: uid,
            timestamp_ms: wall_ms,
            steering: 0,
        };
        self.flight.phase.submit();
        let to = self.cfg.targets[(seq % self.cfg.targets.len() as u64) as usize];
        match wire::seal(&self.cfg.auth, &tenant, nonce, &mut buf[..], tpl.len()) {
            Ok(n) if self.send.push(&buf[..n], to, seq) => {
                self.flight.slots[idx] = Slot {
                    seq,
                    intended,
                    live: true,
                };
                self.flight.outstanding += 1;
                self.timeouts.push_back((seq, now + self.cfg.horizon));
            }
            _ => self
                .flight
                .phase
                .record(intended, now, Kind::Configuration, Some(0)),
        }
        true
    }

    /// Queues (and sends full batches of) what `load` asks for at `now`; returns when the
    /// next open-loop request is due (closed loop: in a millisecond).
    fn offer(&mut self, load: RawLoad, start: Instant, opened: &mut u64, now: Instant) -> Instant {
        let ms = wall_ms();
        let stop_at = self.flight.phase.window_end;
        match load {
            RawLoad::Closed { in_flight } => {
                while self.flight.outstanding + self.send.len() < in_flight {
                    if !self.prepare(now, now, ms) {
                        break;
                    }
                    if self.send.is_full() {
                        self.flush();
                    }
                }
                now + Duration::from_millis(1)
            }
            RawLoad::Open { rate } => loop {
                let intended = start + Duration::from_secs_f64(*opened as f64 / rate);
                if intended > now || intended >= stop_at {
                    return intended;
                }
                *opened += 1;
                if !self.prepare(intended, now, ms) {
                    // Too many outstanding: counted as overload, not sent.
                    self.flight.phase.submit();
                    self.flight
                        .phase
                        .record(intended, now, Kind::Overloaded, Some(0));
                }
                if self.send.is_full() {
                    self.flush();
                }
            },
        }
    }

    /// Sends the queued batch; a datagram that cannot be sent is a communication failure.
    fn flush(&mut self) {
        let flight = &mut self.flight;
        self.sock.send_batch(&mut self.send, |seq| {
            flight.complete(seq, Instant::now(), Kind::Communication)
        });
    }

    /// Drains the socket, completing every request whose response authenticates.
    fn receive(&mut self) {
        loop {
            let n = match self.sock.recv_batch(&mut self.recv) {
                Ok(n) if n > 0 => n,
                _ => return,
            };
            let now = Instant::now();
            for i in 0..n {
                if let Some(dg) = self.recv.datagram(i)
                    && let Some((seq, grant)) = decode(&self.cfg, &self.prefix, dg)
                {
                    let kind = if grant { Kind::Granted } else { Kind::Rejected };
                    self.flight.complete(seq, now, kind);
                }
            }
            if n < self.cfg.batch {
                return;
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some(&(seq, deadline)) = self.timeouts.front() {
            if deadline > now {
                break;
            }
            self.timeouts.pop_front();
            self.flight.complete(seq, Instant::now(), Kind::Timeout);
        }
    }

    /// Sleeps until a response is readable or `timeout` passes (`ppoll`: sub-millisecond
    /// waits, which the engine's millisecond `wait_fds` would round up).
    fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, valid timespec, no signal mask.
        unsafe {
            libc::ppoll(&mut pfd, 1, &ts, std::ptr::null());
        }
    }
}

/// Authenticates and decodes one response of ours: its sequence number and whether
/// it is a grant. `None` for anything else (foreign, forged or malformed).
fn decode(cfg: &RawConfig, prefix: &[u8; 9], dg: &mut [u8]) -> Option<(u64, bool)> {
    let opened = wire::open(&cfg.auth, dg).ok()?;
    let uid = opened.tenant.unique_id();
    let uid: &[u8] = uid.as_ref();
    if uid.len() != 16 || uid[..9] != prefix[..] {
        return None;
    }
    let mut b = [0u8; 8];
    b[..7].copy_from_slice(&uid[9..16]);
    let view = wire::RateResponseView::parse(opened.pdu).ok()?;
    Some((u64::from_le_bytes(b), view.is_grant()))
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs one raw client thread until the phase window ends and everything in
/// flight completed or timed out (bounded by `drain`).
pub fn run_thread(
    cfg: Arc<RawConfig>,
    phase: Arc<Phase>,
    load: RawLoad,
    drain: Duration,
) -> std::io::Result<()> {
    let capacity = match load {
        // Slots are a ring indexed by sequence number: keep it much larger than the
        // window so a request waiting for its timeout never blocks the ring.
        RawLoad::Closed { in_flight } => (in_flight.max(1) * 16).max(4096),
        RawLoad::Open { rate } => {
            ((rate * (cfg.horizon.as_secs_f64() + 0.5)) as usize + 1024).min(1 << 22)
        }
    };
    let mut t = RawThread::new(cfg, phase, capacity)?;
    let stop_at = t.flight.phase.window_end;
    let hard_stop = stop_at + drain;
    let start = Instant::now();
    let mut opened: u64 = 0;
    loop {
        let now = Instant::now();
        let stopping = now >= stop_at;
        if now >= hard_stop {
            break;
        }
        let next_due = if stopping {
            now + Duration::from_millis(1)
        } else {
            t.offer(load, start, &mut opened, now)
        };
        t.flush();
        if stopping && t.flight.outstanding == 0 {
            break;
        }
        t.receive();
        t.expire(Instant::now());
        let now = Instant::now();
        let wait = next_due
            .saturating_duration_since(now)
            .min(Duration::from_millis(1));
        if t.cfg.spin {
            std::hint::spin_loop();
        } else if !wait.is_zero() || matches!(load, RawLoad::Closed { .. }) {
            t.wait(wait.max(Duration::from_micros(50)));
        }
    }
    // Anything still outstanding past the drain limit is a timeout.
    while let Some((seq, _)) = t.timeouts.pop_front() {
        t.flight.complete(seq, Instant::now(), Kind::Timeout);
    }
    Ok(())
}
