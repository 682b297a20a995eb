//! What every mode does to start: the runtime, the API key, the engine, the listeners
//! and the readiness line, the shutdown signals (`Shutdown`), and why a start failed
//! ([`StartError`]).
//!
//! Owns: key loading (environment or `--key-file`, never the command line, never
//! echoed), engine building, listener binding, the readiness line. Must not touch: what
//! a mode serves.

use std::net::SocketAddr;
use std::time::Duration;

use ratelimitly_engine::key_source::KeyText;
use ratelimitly_engine::{ApiKey, DnsConfig, Engine};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;

use crate::cli::{Cli, EngineCore};

/// Why the proxy could not start. Never carries the key.
#[derive(Debug)]
pub enum StartError {
    /// Bad arguments, files or key: exit 2.
    Usage(String),
    /// Anything else (bind, engine start): exit 1.
    Runtime(String),
}

/// The multi-threaded runtime every mode runs on.
pub(crate) fn runtime() -> Result<Runtime, StartError> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| StartError::Runtime(format!("runtime: {e}")))
}

/// The API key's text (environment or `--key-file`), after checking that a service is
/// named (`--endpoint` or `--domain`).
pub(crate) fn key_text(cli: &Cli) -> Result<KeyText, StartError> {
    if cli.endpoints.is_empty() && cli.domain.is_none() {
        return Err(StartError::Usage(
            "one of --endpoint or --domain is required".into(),
        ));
    }
    ratelimitly_engine::key_source::read_key_text(cli.key_file.as_deref())
        .map_err(|e| StartError::Usage(e.to_string()))
}

/// The engine: endpoints or DNS from the flags, its core hosted on `rt` unless
/// `--engine-core pinned`. Built outside the runtime: a pinned core's build blocks until
/// its thread has bound its socket.
pub(crate) fn engine(cli: &Cli, key: ApiKey, rt: &Runtime) -> Result<Engine, StartError> {
    let mut b = Engine::builder(key);
    b = if cli.endpoints.is_empty() {
        b.dns(DnsConfig {
            domain: cli.domain.clone(),
            server: cli.dns_server,
        })
    } else {
        b.endpoints(cli.endpoints.clone())
    };
    if cli.engine_core == EngineCore::Hosted {
        b = b.runtime(rt.handle().clone());
    }
    b.build().map_err(|e| match e {
        ratelimitly_engine::BuildError::Config(_) | ratelimitly_engine::BuildError::Option(_) => {
            StartError::Usage(e.to_string())
        }
        other => StartError::Runtime(other.to_string()),
    })
}

/// Stops the engine (hosted cores stop on the runtime, decisions in flight finish: at
/// most the horizon), then the runtime.
pub(crate) fn stop(rt: Runtime, engine: Option<Engine>) {
    if let Some(e) = engine {
        rt.block_on(e.shutdown_graceful());
    }
    rt.shutdown_timeout(Duration::from_secs(1));
}

/// The listener on `addr` and the address it got.
pub(crate) async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), StartError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|e| StartError::Runtime(format!("cannot listen on {addr}: {e}")))?;
    let local = l
        .local_addr()
        .map_err(|e| StartError::Runtime(e.to_string()))?;
    Ok((l, local))
}

/// The readiness line on standard output, flushed:
/// `{"event":"ready","address":"IP","port":N,"admin_port":M}`.
pub(crate) fn print_ready(local: SocketAddr, admin: SocketAddr) {
    use std::io::Write;
    println!(
        "{{\"event\":\"ready\",\"address\":\"{}\",\"port\":{},\"admin_port\":{}}}",
        local.ip(),
        local.port(),
        admin.port()
    );
    let _ = std::io::stdout().flush();
}

/// SIGTERM and SIGINT, registered when made (before the readiness line: a signal
/// sent as soon as it is read is handled, never the default action).
pub(crate) struct Shutdown {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Shutdown {
    pub(crate) fn register() -> std::io::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Shutdown {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    pub(crate) async fn wait(mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
