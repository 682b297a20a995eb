//! Client connections: the header and idle timeouts of each connection (a watchdog
//! beside hyper's connection future, fed by the socket's reads and writes and by the
//! requests in service), the connection cap and the proxy's
//! own counters.
//!
//! The timeouts, per connection:
//! - **header**: from the moment a request head is awaited with nothing of it yet
//!   counted (accept, for the first request: a silent connection is covered) or from the
//!   first byte of a later request, the whole head must arrive within `--header-timeout`;
//!   otherwise the connection is closed.
//! - **idle**: between requests on a keep-alive connection (the last response sent, no
//!   byte of the next request read), no reads or writes for `--idle-timeout` close it.
//! - While a request is in service (head received, response head not yet produced)
//!   neither runs; the upstream has its own `--upstream-timeout` (see `upstream`).
//!
//! Owns: the accept loop's limits and the per-connection watchdog. Must not touch:
//! admission, forwarding.

use std::fmt::Write as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ratelimitly_tower::forwarded::UnvouchedLog;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The per-connection limits (`--header-timeout`, `--idle-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// A whole request head within this.
    pub header: Duration,
    /// Keep-alive: no traffic between requests for this closes the connection.
    pub idle: Duration,
}

impl Timeouts {
    /// How often a connection's watchdog looks: a quarter of the shorter timeout,
    /// between 10 ms and 1 s (a connection closes at most this late).
    pub fn tick(&self) -> Duration {
        (self.header.min(self.idle) / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

const NONE: u64 = u64::MAX;

/// Why a watchdog closed a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// No whole request head within the header timeout.
    Header,
    /// Idle between requests for the idle timeout.
    Idle,
}

/// One connection's timestamps (milliseconds since accept) and requests in service.
#[derive(Debug)]
pub struct Clock {
    start: Instant,
    last_io: AtomicU64,
    /// When the awaited head started (accept, or its first byte); NONE while no head is
    /// awaited with bytes of it pending (idle) or a request is in service.
    head_since: AtomicU64,
    busy: AtomicUsize,
}

impl Clock {
    /// A clock started now, awaiting the first request head.
    pub fn new() -> Arc<Self> {
        Arc::new(Clock {
            start: Instant::now(),
            last_io: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            busy: AtomicUsize::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(NONE - 1)
    }

    fn on_write(&self) {
        self.last_io.store(self.now_ms(), Relaxed);
    }

    fn on_read(&self) {
        let now = self.now_ms();
        self.last_io.store(now, Relaxed);
        if self.busy.load(Relaxed) == 0 {
            // the first byte of the next head starts its timer
            let _ = self
                .head_since
                .compare_exchange(NONE, now, Relaxed, Relaxed);
        }
    }

    /// A whole head arrived: the request is in service.
    pub fn request_started(&self) {
        self.busy.fetch_add(1, Relaxed);
        self.head_since.store(NONE, Relaxed);
    }

    /// Its response head is ready: idle from now unless more traffic comes.
    pub fn request_done(&self) {
        self.busy.fetch_sub(1, Relaxed);
        self.on_write();
    }

    /// Whether a timeout has run out.
    pub fn expired(&self, t: Timeouts) -> Option<Expiry> {
        if self.busy.load(Relaxed) > 0 {
            return None;
        }
        let now = self.now_ms();
        let head = self.head_since.load(Relaxed);
        if head != NONE {
            (now.saturating_sub(head) >= ms(t.header)).then_some(Expiry::Header)
        } else {
            (now.saturating_sub(self.last_io.load(Relaxed)) >= ms(t.idle)).then_some(Expiry::Idle)
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(NONE - 1)
}

/// A socket whose reads and writes are reported to its [`Clock`].
#[derive(Debug)]
pub struct Watched<T> {
    inner: T,
    clock: Arc<Clock>,
}

impl<T> Watched<T> {
    /// `inner`, reporting to `clock`.
    pub fn new(inner: T, clock: Arc<Clock>) -> Self {
        Watched { inner, clock }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r
            && buf.filled().len() > before
        {
            self.clock.on_read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            self.clock.on_write();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            self.clock.on_write();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The proxy's own counters, exported beside the layer's on the admin listener.
#[derive(Debug, Default)]
pub struct ProxyMetrics {
    /// Client connections open now.
    pub open: AtomicU64,
    /// Connections accepted and closed at once because `--max-connections` were open.
    pub refused: AtomicU64,
    /// Connections closed by the header timeout.
    pub header_timeouts: AtomicU64,
    /// Connections closed by the idle timeout.
    pub idle_timeouts: AtomicU64,
    /// Requests answered `504` by the upstream timeout.
    pub upstream_timeouts: AtomicU64,
    /// Requests keyed by their trusted peer because it named no client in the header
    /// the source reads (`ratelimitly_tower::forwarded::ClientIp::Unvouched`).
    pub unvouched: UnvouchedLog,
}

impl ProxyMetrics {
    /// Fresh counters.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Appends the counters in the Prometheus text format (before an OpenMetrics
    /// `# EOF` line, when `out` ends with one).
    pub fn encode(&self, out: &mut String) {
        let eof = out.ends_with("# EOF\n");
        if eof {
            out.truncate(out.len() - "# EOF\n".len());
        }
        let _ = writeln!(
            out,
            "# HELP rl_proxy_connections_open Client connections open.\n\
             # TYPE rl_proxy_connections_open gauge\n\
             rl_proxy_connections_open {}",
            self.open.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP rl_proxy_connections_refused_total Connections closed at once: --max-connections were open.\n\
             # TYPE rl_proxy_connections_refused_total counter\n\
             rl_proxy_connections_refused_total {}",
            self.refused.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP rl_proxy_connections_timed_out_total Connections closed by a timeout.\n\
             # TYPE rl_proxy_connections_timed_out_total counter\n\
             rl_proxy_connections_timed_out_total{{timeout=\"header\"}} {}\n\
             rl_proxy_connections_timed_out_total{{timeout=\"idle\"}} {}",
            self.header_timeouts.load(Relaxed),
            self.idle_timeouts.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP rl_proxy_upstream_timeouts_total Requests answered 504: no response head within --upstream-timeout.\n\
             # TYPE rl_proxy_upstream_timeouts_total counter\n\
             rl_proxy_upstream_timeouts_total {}",
            self.upstream_timeouts.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP rl_proxy_client_ip_unvouched_total Requests keyed by their trusted peer, the proxy in front, which named no client: no single X-Real-IP address (--client-ip-from real-ip), or X-Real-IP without X-Forwarded-For (xff).\n\
             # TYPE rl_proxy_client_ip_unvouched_total counter\n\
             rl_proxy_client_ip_unvouched_total {}",
            self.unvouched.count()
        );
        if eof {
            out.push_str("# EOF\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timeouts = Timeouts {
        header: Duration::from_millis(100),
        idle: Duration::from_millis(1000),
    };

    #[test]
    fn silent_connection_expires_by_the_header_timeout() {
        let c = Clock::new();
        assert_eq!(c.expired(T), None);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(c.expired(T), Some(Expiry::Header));
    }

    #[test]
    fn in_service_never_expires_and_idle_uses_the_idle_timeout() {
        let c = Clock::new();
        c.on_read();
        c.request_started();
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(c.expired(T), None, "in service");
        c.request_done();
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(c.expired(T), None, "idle, within the idle timeout");
        std::thread::sleep(Duration::from_millis(1000));
        assert_eq!(c.expired(T), Some(Expiry::Idle));
        // a byte of the next head: the header timeout runs from it
        let c = Clock::new();
        c.request_started();
        c.request_done();
        c.on_read();
        assert_eq!(c.expired(T), None);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(c.expired(T), Some(Expiry::Header));
    }

    #[test]
    fn encodes_before_eof() {
        let m = ProxyMetrics::default();
        m.refused.store(3, Relaxed);
        let mut s = String::from("x 1\n# EOF\n");
        m.encode(&mut s);
        assert!(s.ends_with("# EOF\n"));
        assert!(
            s.contains("\nrl_proxy_connections_refused_total 3\n"),
            "{s}"
        );
        assert_eq!(s.matches("# EOF").count(), 1);
    }
}
