//! Thread-per-core runner: N glommio executors, each pinned to a CPU and owning one
//! SO_REUSEPORT UDP socket on the shared port, receiving and sending in batches with
//! `recvmmsg`/`sendmmsg` on the raw fd.
//!
//! Owns: sockets, executors, the per-core delayed-send queue, network-level faults
//! (drops both ways, delay + jitter, duplicates, silence), the embedded API
//! ([`spawn`] → [`ResponderHandle`]). Must not touch: decision logic (`decide`), which
//! it drives with `Instant::now()`.
//!
//! Waking: the socket is non-blocking; when `recvmmsg` finds nothing, the core awaits
//! readability by a 1-byte `MSG_PEEK` receive through glommio's `UdpSocket` on the same
//! fd (io_uring), with a read timeout of at most 20 ms (less when a delayed send is due)
//! so a stall of that path (glommio issue #672) can never last, and stop/fault changes
//! are seen promptly.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use glommio::{ExecutorJoinHandle, LocalExecutorBuilder, Placement};
use ratelimitly_engine::engine::io::{
    RECV_BUF, RecvBatch, SEND_BUF, SendBatch, recv_batch_on, send_batch_on,
};
use ratelimitly_engine::key::ApiKey;
use socket2::{Domain, Protocol, SockRef, Socket, Type};

use crate::decide::{
    Capacities, CounterSet, Counters, DecideError, Responder, Shared, default_server_id,
};
use crate::faults::{FaultRng, Faults};

/// Datagrams per `recvmmsg`/`sendmmsg` call.
pub const BATCH: usize = 32;
const MAX_DELAYED: usize = 65_536;

/// Configuration of [`spawn`].
#[derive(Clone, Debug)]
pub struct ResponderConfig {
    /// Keys served (at least one; distinct key ids).
    pub keys: Vec<ApiKey>,
    /// Listen address (default 127.0.0.1:0).
    pub listen: SocketAddr,
    /// Server id (default from the start time, docs/protocol.md §7).
    pub server_id: Option<u64>,
    /// Cores / sockets (default 1).
    pub cores: usize,
    /// Faults at start (default none).
    pub faults: Faults,
    /// Dedup table capacity in entries (default 65536).
    pub dedup_capacity: usize,
}

impl ResponderConfig {
    /// Defaults for everything but the keys.
    pub fn new(keys: Vec<ApiKey>) -> Self {
        Self {
            keys,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            server_id: None,
            cores: 1,
            faults: Faults::default(),
            dedup_capacity: Capacities::default().dedup,
        }
    }
}

/// Why [`spawn`] failed.
#[derive(Debug, thiserror::Error)]
pub enum ResponderError {
    /// The key set or server id is unusable.
    #[error("invalid responder configuration: {0}")]
    Config(#[from] DecideError),
    /// Creating or binding a socket failed.
    #[error("cannot bind UDP socket on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: io::Error,
    },
    /// Starting an executor thread failed.
    #[error("cannot start executor for core {core}: {source}")]
    Executor {
        /// Core index.
        core: usize,
        /// The error.
        source: io::Error,
    },
    /// The OS random source failed (nonce prefix, server id).
    #[error("OS random source failed")]
    Rng,
}

struct Control {
    stop: AtomicBool,
    faults: Mutex<Faults>,
    faults_gen: AtomicU64,
}

/// A running responder; stops on [`ResponderHandle::stop`] or drop.
pub struct ResponderHandle {
    addr: SocketAddr,
    server_id: u64,
    control: Arc<Control>,
    counters: Vec<Arc<CounterSet>>,
    shared: Arc<Shared>,
    threads: Vec<ExecutorJoinHandle<()>>,
}

fn bind_one(addr: SocketAddr) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_port(true)?;
    s.set_nonblocking(true)?;
    let _ = s.set_recv_buffer_size(4 << 20);
    let _ = s.set_send_buffer_size(4 << 20);
    s.bind(&addr.into())?;
    Ok(s)
}

fn random_u64() -> Result<u64, ResponderError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|_| ResponderError::Rng)?;
    Ok(u64::from_le_bytes(b))
}

/// Starts a responder: binds `cfg.cores` sockets on one port and one pinned glommio
/// executor per socket. Returns once every socket is bound.
pub fn spawn(cfg: ResponderConfig) -> Result<ResponderHandle, ResponderError> {
    let cores = cfg.cores.max(1);
    let rnd = random_u64()?;
    let server_id = match cfg.server_id {
        Some(id) => id,
        None => {
            let unix = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            default_server_id(unix, rnd)
        }
    };
    let first = bind_one(cfg.listen).map_err(|source| ResponderError::Bind {
        addr: cfg.listen,
        source,
    })?;
    let addr = first
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .ok_or(ResponderError::Bind {
            addr: cfg.listen,
            source: io::Error::other("no local address"),
        })?;
    let mut sockets = vec![first];
    for _ in 1..cores {
        sockets.push(bind_one(addr).map_err(|source| ResponderError::Bind { addr, source })?);
    }
    let shared = Shared::new(
        Capacities {
            dedup: cfg.dedup_capacity.max(1),
            ..Capacities::default()
        },
        Instant::now(),
    );
    let control = Arc::new(Control {
        stop: AtomicBool::new(false),
        faults: Mutex::new(cfg.faults.clone()),
        faults_gen: AtomicU64::new(1),
    });
    let cpus = core_affinity::get_core_ids().unwrap_or_default();
    let nonce_base = (rnd >> 32) as u32;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let mut counters = Vec::with_capacity(cores);
    let mut threads = Vec::with_capacity(cores);
    for (i, sock) in sockets.into_iter().enumerate() {
        let set = Arc::new(CounterSet::default());
        counters.push(set.clone());
        let responder = Responder::with_shared(
            &cfg.keys,
            server_id,
            shared.clone(),
            set,
            nonce_base.wrapping_add(i as u32),
        )?;
        let placement = if cores <= cpus.len() {
            Placement::Fixed(cpus[i].id)
        } else {
            Placement::Unbound
        };
        let control = control.clone();
        let ready = ready_tx.clone();
        let builder = LocalExecutorBuilder::new(placement)
            .name(&format!("rl-resp-{i}"))
            .io_memory(1 << 20)
            .ring_depth(128);
        let handle = builder
            .spawn(move || core_loop(i, sock, responder, control, ready))
            .map_err(|e| ResponderError::Executor {
                core: i,
                source: io::Error::other(e.to_string()),
            })?;
        threads.push(handle);
    }
    let handle = ResponderHandle {
        addr,
        server_id,
        control,
        counters,
        shared,
        threads,
    };
    // Return only once every core is in its receive loop (bounded wait).
    for _ in 0..cores {
        if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
            return Err(ResponderError::Executor {
                core: 0,
                source: io::Error::new(io::ErrorKind::TimedOut, "executor did not start"),
            });
        }
    }
    Ok(handle)
}

impl ResponderHandle {
    /// The bound address (all cores share its port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server id written into responses.
    pub fn server_id(&self) -> u64 {
        self.server_id
    }

    /// Sum of every core's counters, plus the dedup table's.
    pub fn counters(&self) -> Counters {
        let mut c = Counters::default();
        for s in &self.counters {
            c.merge(&s.snapshot());
        }
        let d = self.shared.dedup_stats();
        c.dedup_len = d.len as u64;
        c.dedup_overflow = d.overflow;
        c
    }

    /// Replaces the faults on every core (seen within about 20 ms).
    pub fn set_faults(&self, f: Faults) {
        *self
            .control
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = f;
        self.control.faults_gen.fetch_add(1, Ordering::Release);
    }

    /// Stops every core and joins them.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ResponderHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Queues `data` for `to` in `tx`, sending the batch first when it is full. A datagram
/// longer than the batch slots (only the "more entries" broken reply can be) goes out
/// on its own.
fn queue(fd: RawFd, tx: &mut SendBatch, data: &[u8], to: SocketAddr, c: &CounterSet) {
    if data.len() > SEND_BUF {
        // SAFETY: `fd` is the core's socket, open for the whole core loop.
        let sock = unsafe { BorrowedFd::borrow_raw(fd) };
        let sent = SockRef::from(&sock).send_to_with_flags(data, &to.into(), libc::MSG_DONTWAIT);
        if sent.is_err() {
            c.send_errors.fetch_add(1, Ordering::Relaxed);
        }
        return;
    }
    if tx.is_full() {
        flush(fd, tx, c);
    }
    tx.push(data, to, 0);
}

/// Sends everything queued in `tx`, counting the datagrams that could not be sent.
fn flush(fd: RawFd, tx: &mut SendBatch, c: &CounterSet) {
    let mut failed = 0;
    send_batch_on(fd, tx, |_| failed += 1);
    if failed > 0 {
        c.send_errors.fetch_add(failed, Ordering::Relaxed);
    }
}

struct Delayed {
    heap: BinaryHeap<Reverse<(Instant, u64, usize)>>,
    slots: Vec<(Vec<u8>, SocketAddr)>,
    free: Vec<usize>,
    seq: u64,
}

impl Delayed {
    fn new() -> Self {
        Self {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
        }
    }

    fn push(&mut self, due: Instant, data: &[u8], to: SocketAddr) -> bool {
        if self.heap.len() >= MAX_DELAYED {
            return false;
        }
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s].0.clear();
                self.slots[s].0.extend_from_slice(data);
                self.slots[s].1 = to;
                s
            }
            None => {
                self.slots.push((data.to_vec(), to));
                self.slots.len() - 1
            }
        };
        self.seq += 1;
        self.heap.push(Reverse((due, self.seq, slot)));
        true
    }

    fn next_due(&self) -> Option<Instant> {
        self.heap.peek().map(|r| r.0.0)
    }

    /// Hands every datagram due by `now` to `send`.
    fn take_due(&mut self, now: Instant, mut send: impl FnMut(&[u8], SocketAddr)) {
        while let Some(&Reverse((due, _, slot))) = self.heap.peek() {
            if due > now {
                break;
            }
            self.heap.pop();
            let (data, to) = &self.slots[slot];
            send(data, *to);
            self.free.push(slot);
        }
    }
}

async fn core_loop(
    core: usize,
    sock: Socket,
    mut responder: Responder,
    control: Arc<Control>,
    ready: std::sync::mpsc::Sender<()>,
) {
    let counters = responder.counter_set();
    let c = &*counters;
    let v6 = sock
        .local_addr()
        .ok()
        .and_then(|a| a.as_socket())
        .is_some_and(|a| a.is_ipv6());
    // SAFETY: the fd comes from a socket we own and hand over here.
    let gsock = unsafe { glommio::net::UdpSocket::from_raw_fd(sock.into_raw_fd()) };
    let fd = gsock.as_raw_fd();
    let mut rx = RecvBatch::new(BATCH);
    let mut tx = SendBatch::new(BATCH);
    tx.set_v6_socket(v6);
    let mut out = vec![0u8; RECV_BUF].into_boxed_slice();
    let mut delayed = Delayed::new();
    let mut faults_seen = 0u64;
    let mut faults = Faults::default();
    let mut rng = FaultRng::new(0);
    let mut peek = [0u8; 1];
    let _ = ready.send(());
    drop(ready);
    loop {
        if control.stop.load(Ordering::Acquire) {
            break;
        }
        let g = control.faults_gen.load(Ordering::Acquire);
        if g != faults_seen {
            faults_seen = g;
            faults = control
                .faults
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            responder.set_faults(&faults);
            rng = FaultRng::new(faults.seed.wrapping_add(core as u64));
        }
        let io_faults = faults.has_io_faults();
        let now = Instant::now();
        delayed.take_due(now, |data, to| queue(fd, &mut tx, data, to, c));
        // WouldBlock and Interrupted read as Ok(0)
        let n = recv_batch_on(fd, &mut rx).unwrap_or_else(|_| {
            c.recv_errors.fetch_add(1, Ordering::Relaxed);
            0
        });
        if n == 0 {
            if !tx.is_empty() {
                flush(fd, &mut tx, c);
            }
            let mut wait = Duration::from_millis(20);
            if let Some(due) = delayed.next_due() {
                wait = wait.min(due.saturating_duration_since(Instant::now()));
            }
            let wait = wait.max(Duration::from_micros(100));
            let _ = gsock.set_read_timeout(Some(wait));
            let _ = gsock.peek_from(&mut peek).await;
            continue;
        }
        for i in 0..n {
            let Some(from) = rx.source(i) else { continue };
            if io_faults {
                // `received` counts every datagram, also those dropped by faults here
                if faults.silent {
                    c.received.fetch_add(1, Ordering::Relaxed);
                    c.fault_silent_drops.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if rng.chance(faults.drop_in) {
                    c.received.fetch_add(1, Ordering::Relaxed);
                    c.fault_drop_in.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            }
            let Some(datagram) = rx.datagram(i) else {
                // truncated: longer than the receive buffer, so too long for the wire
                c.received.fetch_add(1, Ordering::Relaxed);
                c.drop_too_long.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            let Some(resp_len) = responder.handle(datagram, from, now, &mut out) else {
                continue;
            };
            let resp = &out[..resp_len];
            if io_faults {
                if rng.chance(faults.drop_out) {
                    c.fault_drop_out.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let copies = if rng.chance(faults.duplicate) {
                    c.fault_duplicated.fetch_add(1, Ordering::Relaxed);
                    2
                } else {
                    1
                };
                let delay = faults.delay + rng.up_to(faults.jitter);
                if !delay.is_zero() {
                    c.fault_delayed.fetch_add(1, Ordering::Relaxed);
                    for _ in 0..copies {
                        if !delayed.push(now + delay, resp, from) {
                            c.delay_queue_full.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    continue;
                }
                if copies == 2 {
                    queue(fd, &mut tx, resp, from, c);
                }
            }
            queue(fd, &mut tx, resp, from, c);
        }
        if !tx.is_empty() {
            flush(fd, &mut tx, c);
        }
    }
}
