//! Thread-per-core runner: N std threads, each pinned to a CPU (core_affinity) and
//! running one [`UdpIo`] of the engine's UDP I/O layer (`ratelimitly_engine::udp`)
//! with one `SO_REUSEPORT` socket on the shared port. Receives use UDP GRO; replies are
//! queued per datagram and sent once per loop, grouped per client address into UDP GSO
//! super-buffers when `reply_batch` is on (on loopback this stands in for the NIC's GRO
//! on a real client host: the client receives coalesced runs). The backend is io_uring
//! (multishot receive, one `io_uring_enter` per loop) or `sendmmsg`/`recvmmsg` + `poll`.
//!
//! Owns: sockets, core threads, the per-core delayed-send queue, network-level faults
//! (drops both ways, delay + jitter, duplicates, silence), the wall clock handed to the
//! decision logic (stale-timestamp check), the embedded API ([`spawn`] →
//! [`ResponderHandle`]). Must not touch: decision logic (`decide`), which it drives with
//! `Instant::now()` and the Unix time, read once per loop that received something.
//!
//! Waking: each core waits in its driver for at most 20 ms (less when a delayed send is
//! due); stopping and fault changes also wake every core through its driver's waker.
//!
//! Why not glommio (used here before): it refused to start where io_uring is blocked,
//! demanded locked memory, could not express multishot receive or GSO, is unmaintained
//! and pulls in a crate with a soundness advisory. Plain pinned threads do the same job.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::udp::{
    BackendChoice, BackendKind, BindOptions, IoConfig, IoEvent, IoStats, SendQueue, SocketId,
    UdpIo, Waker,
};

use crate::decide::{
    Capacities, CounterSet, Counters, DecideError, Responder, Shared, default_server_id,
};
use crate::faults::{FaultRng, Faults};

/// Datagrams handed to the decision logic per loop at most (the receive batch).
pub const BATCH: usize = 256;
const MAX_DELAYED: usize = 65_536;
/// Longest wait of a core without anything to do (fault and stop changes also wake).
const IDLE_WAIT: Duration = Duration::from_millis(20);
/// Loops between two publications of a core's I/O statistics.
const STATS_EVERY: u32 = 256;

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
    /// Send the replies of one loop to one client address as UDP GSO batches (default
    /// on); off: one datagram per send operation.
    pub reply_batch: bool,
    /// I/O backend (default auto: io_uring where the kernel allows it, else mmsg).
    pub io: BackendChoice,
    /// CPUs to pin the cores to: core i on `cpus[i % cpus.len()]`. Empty (default): core
    /// i on the i-th CPU when there are at least `cores` CPUs, else unpinned.
    pub cpus: Vec<usize>,
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
            reply_batch: true,
            io: BackendChoice::Auto,
            cpus: Vec::new(),
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
    /// The I/O backend could not start (e.g. io_uring forced where it is refused).
    #[error("cannot start the {backend} UDP driver: {source}")]
    Driver {
        /// The backend asked for.
        backend: BackendChoice,
        /// The OS error.
        source: io::Error,
    },
    /// Starting a core thread failed (or it did not report ready in time).
    #[error("cannot start core thread {core}: {source}")]
    Executor {
        /// Core index.
        core: usize,
        /// The error.
        source: io::Error,
    },
    /// The OS random source failed (server id).
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
    backend: BackendKind,
    control: Arc<Control>,
    counters: Vec<Arc<CounterSet>>,
    io_stats: Vec<Arc<Mutex<IoStats>>>,
    wakers: Vec<Arc<Waker>>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

fn random_u64() -> Result<u64, ResponderError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|_| ResponderError::Rng)?;
    Ok(u64::from_le_bytes(b))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The I/O configuration of every core.
fn io_config(cfg: &ResponderConfig) -> IoConfig {
    IoConfig {
        backend: cfg.io,
        gso: cfg.reply_batch,
        gro: true,
        recv_buf: 4 << 20,
        send_buf: 4 << 20,
        max_sockets: 1,
        batch: BATCH,
        send_capacity: 4 * BATCH,
        max_datagram: 2048,
        ..IoConfig::default()
    }
}

/// Starts a responder: binds `cfg.cores` sockets on one port, each in its own driver,
/// and one pinned thread per socket. Returns once every core runs.
pub fn spawn(cfg: ResponderConfig) -> Result<ResponderHandle, ResponderError> {
    let cores = cfg.cores.max(1);
    let rnd = random_u64()?;
    let server_id = match cfg.server_id {
        Some(id) => id,
        None => default_server_id(unix_ms() / 1000, rnd),
    };
    let io_cfg = io_config(&cfg);
    let reuse = BindOptions { reuse_port: true };
    let mut drivers = Vec::with_capacity(cores);
    let mut addr = cfg.listen;
    for i in 0..cores {
        let mut d = UdpIo::new(&io_cfg).map_err(|source| ResponderError::Driver {
            backend: cfg.io,
            source,
        })?;
        let sock = d
            .bind_with(addr, reuse)
            .map_err(|source| ResponderError::Bind { addr, source })?;
        if i == 0 {
            addr = d.local_addr(sock).ok_or(ResponderError::Bind {
                addr,
                source: io::Error::other("no local address"),
            })?;
        }
        drivers.push((d, sock));
    }
    let backend = drivers[0].0.kind();
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
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let mut handle = ResponderHandle {
        addr,
        server_id,
        backend,
        control: control.clone(),
        counters: Vec::with_capacity(cores),
        io_stats: Vec::with_capacity(cores),
        wakers: drivers.iter().map(|(d, _)| d.waker()).collect(),
        shared: shared.clone(),
        threads: Vec::with_capacity(cores),
    };
    for (i, (driver, sock)) in drivers.into_iter().enumerate() {
        let set = Arc::new(CounterSet::default());
        handle.counters.push(set.clone());
        let stats = Arc::new(Mutex::new(driver.stats().clone()));
        handle.io_stats.push(stats.clone());
        let responder = Responder::with_shared(&cfg.keys, server_id, shared.clone(), set)?;
        let pin = if !cfg.cpus.is_empty() {
            let want = cfg.cpus[i % cfg.cpus.len()];
            cpus.iter().copied().find(|c| c.id == want)
        } else if cores <= cpus.len() {
            Some(cpus[i])
        } else {
            None
        };
        let core = Core {
            index: i,
            driver,
            sock,
            responder,
            control: control.clone(),
            stats,
        };
        let ready = ready_tx.clone();
        let t = std::thread::Builder::new()
            .name(format!("rl-resp-{i}"))
            .spawn(move || {
                if let Some(p) = pin {
                    core_affinity::set_for_current(p);
                }
                core.run(ready)
            })
            .map_err(|source| ResponderError::Executor { core: i, source })?;
        handle.threads.push(t);
    }
    drop(ready_tx);
    // Return only once every core is in its loop (bounded wait).
    for i in 0..cores {
        if ready_rx.recv_timeout(Duration::from_secs(10)).is_err() {
            return Err(ResponderError::Executor {
                core: i,
                source: io::Error::new(io::ErrorKind::TimedOut, "core thread did not start"),
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

    /// The I/O backend the cores run on.
    pub fn io_backend(&self) -> BackendKind {
        self.backend
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

    /// Sum of every core's I/O statistics (published every few hundred loops and
    /// whenever a core is idle; exact after [`stop`](Self::stop) only).
    pub fn io_stats(&self) -> IoStats {
        // a handle always has at least one core
        let mut sum = self.io_stats[0]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for s in &self.io_stats[1..] {
            sum.merge(&s.lock().unwrap_or_else(|p| p.into_inner()));
        }
        sum
    }

    /// Replaces the faults on every core (seen at once: every core is woken).
    pub fn set_faults(&self, f: Faults) {
        *self
            .control
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = f;
        self.control.faults_gen.fetch_add(1, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
    }

    /// Stops every core and joins them; returns the final I/O statistics.
    pub fn stop(mut self) -> IoStats {
        self.shutdown();
        self.io_stats()
    }

    fn shutdown(&mut self) {
        self.control.stop.store(true, Ordering::Release);
        for w in &self.wakers {
            w.wake();
        }
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

/// One core: its driver and socket, decision logic and faults.
struct Core {
    index: usize,
    driver: UdpIo,
    sock: SocketId,
    responder: Responder,
    control: Arc<Control>,
    stats: Arc<Mutex<IoStats>>,
}

/// Queues `data` for `to`, flushing the driver's queue once when it is full.
fn queue_now(d: &mut UdpIo, sock: SocketId, data: &[u8], to: SocketAddr, c: &CounterSet) {
    if d.queue_send(sock, to, data, 0) {
        return;
    }
    let _ = d.flush(&mut |_, ev| {
        if let IoEvent::SendFailed { .. } = ev {
            c.send_errors.fetch_add(1, Ordering::Relaxed);
        }
    });
    if !d.queue_send(sock, to, data, 0) {
        c.send_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Queues a reply from inside the driver's callback (counted as lost when full).
fn queue_reply(q: &mut SendQueue, sock: SocketId, data: &[u8], to: SocketAddr, c: &CounterSet) {
    if !q.push(sock, to, data, 0) {
        c.send_errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// A received datagram: `(socket, source, bytes)`.
type Received<'a> = (SocketId, SocketAddr, &'a mut [u8]);

/// Answers one received datagram at `now` (monotonic, Unix ms): the inbound faults
/// (silence, random drops), the decision, then the outbound ones (random drops,
/// duplicates, delay) and the reply queued on `q`.
fn answer(
    responder: &mut Responder,
    st: &mut LoopState,
    q: &mut SendQueue,
    (sock, from, data): Received<'_>,
    (now, unix): (Instant, u64),
    c: &CounterSet,
) {
    let io_faults = st.faults.has_io_faults();
    if io_faults {
        // `received` counts every datagram, also those dropped by faults
        let fault = if st.faults.silent {
            Some((&c.fault_silent_drops, "fault: silent"))
        } else if st.rng.chance(st.faults.drop_in) {
            Some((&c.fault_drop_in, "fault: inbound loss"))
        } else {
            None
        };
        if let Some((counter, why)) = fault {
            c.received.fetch_add(1, Ordering::Relaxed);
            counter.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(source = %from, why, "datagram dropped");
            return;
        }
    }
    let Some(len) = responder.handle_at(data, from, now, unix, &mut st.out) else {
        return;
    };
    let resp = &st.out[..len];
    if !io_faults {
        queue_reply(q, sock, resp, from, c);
        return;
    }
    if st.rng.chance(st.faults.drop_out) {
        c.fault_drop_out.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let copies = if st.rng.chance(st.faults.duplicate) {
        c.fault_duplicated.fetch_add(1, Ordering::Relaxed);
        2
    } else {
        1
    };
    let delay = st.faults.delay + st.rng.up_to(st.faults.jitter);
    if !delay.is_zero() {
        c.fault_delayed.fetch_add(1, Ordering::Relaxed);
        for _ in 0..copies {
            if !st.delayed.push(now + delay, resp, from) {
                c.delay_queue_full.fetch_add(1, Ordering::Relaxed);
            }
        }
        return;
    }
    for _ in 0..copies {
        queue_reply(q, sock, resp, from, c);
    }
}

/// What a core's loop keeps from one turn to the next, besides its driver.
struct LoopState {
    /// The response being built.
    out: Box<[u8]>,
    /// Responses held back by a delay fault.
    delayed: Delayed,
    /// The fault generation last applied, the faults, their random stream.
    faults_seen: u64,
    faults: Faults,
    rng: FaultRng,
    /// Consecutive failed turns of the driver.
    errors: u32,
    /// Turns since the I/O statistics were last published.
    loops: u32,
}

impl LoopState {
    fn new() -> Self {
        LoopState {
            out: vec![0u8; 2048].into_boxed_slice(),
            delayed: Delayed::new(),
            faults_seen: 0,
            faults: Faults::default(),
            rng: FaultRng::new(0),
            errors: 0,
            loops: 0,
        }
    }
}

/// Consecutive failed driver turns after which a core gives up (the driver is broken
/// beyond retrying).
const MAX_DRIVER_ERRORS: u32 = 100;

impl Core {
    /// The core's loop: apply fault changes, send due delayed responses, receive and
    /// answer one batch; until stopped or the driver fails [`MAX_DRIVER_ERRORS`] times in
    /// a row. Replies still queued go out before it ends.
    fn run(mut self, ready: std::sync::mpsc::Sender<()>) {
        let counters = self.responder.counter_set();
        let mut st = LoopState::new();
        // enable the ring on this thread and arm the receive before reporting ready
        // (anything that arrives meanwhile is kept for the first loop)
        let _ = self.driver.flush(&mut |_, _| {});
        let _ = ready.send(());
        drop(ready);
        while !self.control.stop.load(Ordering::Acquire) {
            self.refresh_faults(&mut st);
            let wait = self.send_due(&mut st.delayed, &counters);
            let got = self.turn(&mut st, wait, &counters);
            if st.errors >= MAX_DRIVER_ERRORS {
                break;
            }
            st.loops += 1;
            if got == 0 || st.loops >= STATS_EVERY {
                st.loops = 0;
                self.publish_stats();
            }
        }
        let _ = self.driver.flush(&mut |_, _| {});
        self.publish_stats();
    }

    /// Takes the faults set since the last turn, if any.
    fn refresh_faults(&mut self, st: &mut LoopState) {
        let g = self.control.faults_gen.load(Ordering::Acquire);
        if g == st.faults_seen {
            return;
        }
        st.faults_seen = g;
        st.faults = self
            .control
            .faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        self.responder.set_faults(&st.faults);
        st.rng = FaultRng::new(st.faults.seed.wrapping_add(self.index as u64));
    }

    /// Queues the delayed responses now due; returns how long the next turn may wait.
    fn send_due(&mut self, delayed: &mut Delayed, c: &CounterSet) -> Duration {
        let mut wait = IDLE_WAIT;
        if delayed.next_due().is_some() {
            let now = Instant::now();
            let (d, sock) = (&mut self.driver, self.sock);
            delayed.take_due(now, |data, to| queue_now(d, sock, data, to, c));
            if let Some(next) = delayed.next_due() {
                wait = wait.min(next.saturating_duration_since(now));
            }
        }
        wait
    }

    /// One driver turn of at most `wait`: every datagram received is answered (or
    /// dropped, counted) through [`answer`]. Returns the datagrams received.
    fn turn(&mut self, st: &mut LoopState, wait: Duration, c: &CounterSet) -> usize {
        // the clock is read once per turn, when the first datagram arrives
        let mut clock: Option<(Instant, u64)> = None;
        let mut got = 0usize;
        let responder = &mut self.responder;
        let r = self.driver.run_once(Some(wait), &mut |q, ev| match ev {
            IoEvent::Datagram { sock, from, data } => {
                got += 1;
                let now = *clock.get_or_insert_with(|| (Instant::now(), unix_ms()));
                answer(responder, st, q, (sock, from, data), now, c);
            }
            IoEvent::SendFailed { .. } => {
                c.send_errors.fetch_add(1, Ordering::Relaxed);
            }
            IoEvent::Woken => {}
        });
        match r {
            Ok(()) => st.errors = 0,
            Err(_) => {
                c.recv_errors.fetch_add(1, Ordering::Relaxed);
                st.errors += 1;
            }
        }
        got
    }

    fn publish_stats(&self) {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = self.driver.stats().clone();
    }
}
