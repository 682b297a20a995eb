//! One raw client thread (see `raw`): its `UdpIo` and socket, sealing requests,
//! the answers (the decider's opened, the others discarded after a look at their clear
//! tenant header), the completion resends, the one replay when the decider stays silent
//! (only under loss), the timeouts and the loop.
//!
//! Owns the thread's I/O layer and state. Must not touch the engine's request machine.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratelimitly_engine::proto::wire::{self, TenantView};
use ratelimitly_engine::udp::{IoConfig, IoEvent, SendQueue, SocketId, UdpIo};

use super::raw_config::RawConfig;
use super::raw_flight::{Flight, Random};
use crate::extra::{self, ExtraSlot};
use crate::stats::{Kind, Phase};

/// Per-thread load.
#[derive(Clone, Copy, Debug)]
pub enum RawLoad {
    Closed { in_flight: usize },
    Open { rate: f64, max_outstanding: usize },
}

/// Everything but the I/O layer (what its event callback works on).
struct State {
    cfg: Arc<RawConfig>,
    sock: SocketId,
    /// The first 9 bytes of every unique id of this thread (the rest is the sequence).
    prefix: [u8; 9],
    rng: Random,
    next_seq: u64,
    flight: Flight,
    timeouts: VecDeque<(u64, Instant)>,
    /// Requests due for their one replay if the decider has not answered by then.
    replays: VecDeque<(u64, Instant)>,
    /// Requests decided in the current receive batch (completion resends pending).
    completing: Vec<u64>,
}

impl State {
    /// Seals request `seq` and queues it to every server. False (nothing queued) when
    /// its slot is busy or the send queue lacks room for all servers.
    fn prepare(&mut self, q: &mut SendQueue, intended: Instant, now: Instant, ms: u64) -> bool {
        let seq = self.next_seq;
        let n = self.cfg.targets.len();
        if !self.flight.is_free(seq) || q.capacity() - q.len() < n {
            return false;
        }
        self.next_seq += 1;
        self.flight.phase.submit();
        let Ok(mut rnd) = self.rng.next() else {
            self.flight
                .phase
                .record(intended, now, Kind::Configuration, Some(0));
            return true;
        };
        rnd[..9].copy_from_slice(&self.prefix);
        rnd[9..16].copy_from_slice(&seq.to_le_bytes()[..7]);
        let (tenant, nonce) = wire::request_tenant(self.cfg.key_id, &rnd, ms);
        let tpl = &self.cfg.templates[(seq % self.cfg.templates.len() as u64) as usize];
        let off = self.cfg.auth.pdu_offset();
        let buf = self.flight.buffer(seq);
        buf[off..off + tpl.len()].copy_from_slice(tpl);
        match wire::seal(&self.cfg.auth, &tenant, nonce, buf, tpl.len()) {
            Ok(len) => {
                self.flight.start(seq, intended, now, len);
                let dg = self.flight.sealed(seq);
                for to in &self.cfg.targets {
                    q.push(self.sock, *to, dg, seq);
                }
                self.timeouts.push_back((seq, now + self.cfg.horizon));
                if self.cfg.io.replay {
                    self.replays.push_back((seq, now + self.cfg.io.fallback));
                }
            }
            Err(_) => self
                .flight
                .phase
                .record(intended, now, Kind::Configuration, Some(0)),
        }
        true
    }

    fn on_event(&mut self, ev: IoEvent<'_>) {
        match ev {
            IoEvent::Datagram { from, data, .. } => self.on_answer(from, data),
            IoEvent::SendFailed { tag, .. } => {
                self.flight
                    .complete(tag, Instant::now(), Kind::Communication)
            }
            IoEvent::Woken => {}
        }
    }

    /// One answer: the decider's (or, after the fallback wait, any server's) decides and
    /// is opened; any other is only noted as answered.
    fn on_answer(&mut self, from: SocketAddr, data: &mut [u8]) {
        let Ok(tv) = TenantView::parse(data) else {
            return;
        };
        let uid = tv.unique_id();
        if uid[..9] != self.prefix {
            return;
        }
        let mut b = [0u8; 8];
        b[..7].copy_from_slice(&uid[9..16]);
        let seq = u64::from_le_bytes(b);
        let (Some(slot), Some(server)) = (
            self.flight.get(seq),
            self.cfg.targets.iter().position(|a| *a == from),
        ) else {
            return;
        };
        let now = Instant::now();
        if slot.decided || (server != self.cfg.decider && now < slot.sent + self.cfg.io.fallback) {
            self.flight.mark_answered(seq, server);
            return;
        }
        let Some(grant) = decode(&self.cfg, data) else {
            return;
        };
        self.flight.mark_answered(seq, server);
        let kind = if grant { Kind::Granted } else { Kind::Rejected };
        self.flight.decide(seq, now, kind);
        self.completing.push(seq);
    }

    /// After a receive batch: the completion resends of the requests it decided, to each
    /// server that has not answered by now (as the engine does), then frees their slots.
    fn flush_completing(&mut self, q: &mut SendQueue) {
        for seq in self.completing.drain(..) {
            let Some(slot) = self.flight.get(seq) else {
                continue;
            };
            if self.cfg.io.completion_delivery {
                let dg = self.flight.sealed(seq);
                for (i, to) in self.cfg.targets.iter().enumerate() {
                    if slot.answered & (1 << i) == 0 {
                        q.push(self.sock, *to, dg, seq);
                    }
                }
            }
            self.flight.release(seq);
        }
    }

    /// Sends the requests whose decider stayed silent for the fallback wait once more to
    /// every server (queue permitting), then expires those past the horizon.
    fn expire(&mut self, q: &mut SendQueue, now: Instant) {
        while let Some(&(seq, due)) = self.replays.front() {
            let n = self.cfg.targets.len();
            if due > now || q.capacity() - q.len() < n {
                break;
            }
            self.replays.pop_front();
            if self.flight.get(seq).is_some() {
                let dg = self.flight.sealed(seq);
                for to in &self.cfg.targets {
                    q.push(self.sock, *to, dg, seq);
                }
            }
        }
        while let Some(&(seq, deadline)) = self.timeouts.front() {
            if deadline > now {
                break;
            }
            self.timeouts.pop_front();
            self.flight.complete(seq, now, Kind::Timeout);
        }
    }
}

/// Authenticates and decodes one answer: whether it is a grant.
fn decode(cfg: &RawConfig, dg: &mut [u8]) -> Option<bool> {
    let opened = wire::open(&cfg.auth, dg).ok()?;
    let view = wire::RateResponseView::parse(opened.pdu).ok()?;
    Some(view.is_grant())
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One raw client thread.
struct RawThread {
    io: UdpIo,
    st: State,
}

impl RawThread {
    fn new(cfg: Arc<RawConfig>, phase: Arc<Phase>, capacity: usize) -> std::io::Result<Self> {
        let bind: SocketAddr = match cfg.targets[0] {
            SocketAddr::V4(a) if a.ip().is_loopback() => "127.0.0.1:0".parse().expect("static"),
            SocketAddr::V4(_) => "0.0.0.0:0".parse().expect("static"),
            SocketAddr::V6(a) if a.ip().is_loopback() => "[::1]:0".parse().expect("static"),
            SocketAddr::V6(_) => "[::]:0".parse().expect("static"),
        };
        let io = IoConfig {
            backend: cfg.io.backend,
            gso: cfg.io.gso,
            gro: cfg.io.gso,
            recv_buf: cfg.io.socket_buffer,
            send_buf: cfg.io.socket_buffer,
            max_sockets: 1,
            batch: cfg.io.batch,
            ..IoConfig::default()
        };
        let mut io = UdpIo::new(&io)?;
        let sock = io.bind(bind)?;
        let r = wire::new_unique_id().map_err(|e| std::io::Error::other(format!("{e:?}")))?;
        let mut prefix = [0u8; 9];
        prefix.copy_from_slice(&r[..9]);
        let max_tpl = cfg.templates.iter().map(Vec::len).max().unwrap_or(0);
        let stride = (cfg.auth.pdu_offset() + max_tpl).min(wire::MAX_DATAGRAM);
        let st = State {
            sock,
            prefix,
            rng: Random::new(),
            next_seq: 0,
            flight: Flight::new(phase, capacity, stride, Instant::now()),
            timeouts: VecDeque::with_capacity(capacity.min(1 << 16)),
            replays: VecDeque::with_capacity(capacity.min(1 << 16)),
            completing: Vec::with_capacity(capacity),
            cfg,
        };
        Ok(RawThread { io, st })
    }

    /// Queues what `load` asks for at `now` (flushing when the queue is full); returns
    /// when the next open-loop request is due (closed loop: in a millisecond).
    fn offer(&mut self, load: RawLoad, start: Instant, opened: &mut u64, now: Instant) -> Instant {
        let ms = wall_ms();
        let stop_at = self.st.flight.phase.window_end;
        match load {
            RawLoad::Closed { in_flight } => {
                while self.st.flight.outstanding < in_flight {
                    if !self.prepare_one(now, now, ms) {
                        break;
                    }
                }
                now + Duration::from_millis(1)
            }
            RawLoad::Open { rate, .. } => loop {
                let intended = start + Duration::from_secs_f64(*opened as f64 / rate);
                if intended > now || intended >= stop_at {
                    return intended;
                }
                *opened += 1;
                if !self.prepare_one(intended, now, ms) {
                    // Too many outstanding: counted as overload, not sent.
                    let phase = &self.st.flight.phase;
                    phase.submit();
                    phase.record(intended, now, Kind::Overloaded, Some(0));
                }
            },
        }
    }

    /// Prepares one request, flushing the send queue first when it lacks room.
    fn prepare_one(&mut self, intended: Instant, now: Instant, ms: u64) -> bool {
        let need = self.st.cfg.targets.len();
        let q = self.io.send_queue();
        if q.capacity() - q.len() < need {
            let st = &mut self.st;
            let _ = self.io.flush(&mut |_, ev| st.on_event(ev));
        }
        let q = self.io.send_queue();
        self.st.prepare(q, intended, now, ms)
    }
}

/// Runs one raw client thread until the phase window ends and everything in flight
/// completed or timed out (bounded by `drain`); leaves its I/O counters in `extra`.
pub fn run_thread(
    cfg: Arc<RawConfig>,
    phase: Arc<Phase>,
    load: RawLoad,
    drain: Duration,
    extra: &ExtraSlot,
) -> std::io::Result<()> {
    let capacity = match load {
        // Slots are a ring indexed by sequence number: keep it much larger than the
        // window so a request waiting for its timeout never blocks the ring.
        RawLoad::Closed { in_flight } => (in_flight.max(1) * 16).max(4096),
        RawLoad::Open {
            max_outstanding, ..
        } => max_outstanding,
    };
    let mut t = RawThread::new(cfg, phase, capacity)?;
    let stop_at = t.st.flight.phase.window_end;
    let hard_stop = stop_at + drain;
    // Open loop never spins: at a fixed rate the ceiling waits until work is due.
    let spin = t.st.cfg.io.spin && matches!(load, RawLoad::Closed { .. });
    let start = Instant::now();
    let mut opened: u64 = 0;
    let mut result = Ok(());
    loop {
        let now = Instant::now();
        let stopping = now >= stop_at;
        if now >= hard_stop || (stopping && t.st.flight.outstanding == 0) {
            break;
        }
        let next_due = if stopping {
            now + Duration::from_millis(1)
        } else {
            t.offer(load, start, &mut opened, now)
        };
        let wait = if spin {
            Duration::ZERO
        } else {
            next_due
                .saturating_duration_since(now)
                .min(Duration::from_millis(1))
        };
        let RawThread { io, st } = &mut t;
        if let Err(e) = io.run_once(Some(wait), &mut |_, ev| st.on_event(ev)) {
            result = Err(e);
            break;
        }
        let RawThread { io, st } = &mut t;
        st.flush_completing(io.send_queue());
        st.expire(io.send_queue(), Instant::now());
    }
    // Anything still outstanding past the drain limit is a timeout.
    while let Some((seq, _)) = t.st.timeouts.pop_front() {
        t.st.flight.complete(seq, Instant::now(), Kind::Timeout);
    }
    extra::add_io(extra, t.io.stats());
    result
}
