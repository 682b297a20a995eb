//! `rl-responder` binary: runs the test/benchmark responder (not a production service).
//!
//! Owns: the command line, key loading from the environment / a key file / a keys file
//! (never from the command line; through `keys` and the engine's `key_source`), the
//! one-line JSON readiness report, and stopping on SIGINT/SIGTERM.
//! Must not touch: decision logic or sockets directly (it uses the embedded API).

// Every `unsafe` block states why it is sound (a `// SAFETY:` comment); CI's clippy run
// (`-D warnings`) enforces it, as in the engine crate.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ratelimitly_engine::udp::BackendChoice;
use rl_responder::{BrokenReply, Faults, FixedDecision, ResponderConfig, dns, keys, spawn};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Ratelimitly wire-v2 test and benchmark responder. The key comes from
/// RATELIMITLY_API_KEY or --key-file (and more from --keys-file), never from the command
/// line.
#[derive(Parser, Debug)]
#[command(name = "rl-responder", version)]
struct Cli {
    /// Listen address.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Read the API key from this file instead of RATELIMITLY_API_KEY.
    #[arg(long, value_name = "PATH")]
    key_file: Option<PathBuf>,
    /// Development: serve the public development key (NOT for production: it is
    /// printed here and in the repository) and, instead of the JSON ready line, print
    /// shell lines: `export RATELIMITLY_API_KEY=...` and `export RL_ENDPOINT=ID@IP:PORT`
    /// (this server's id and address, for rl-proxy's --endpoint). RATELIMITLY_API_KEY
    /// and --key-file are not read.
    #[arg(long, conflicts_with = "key_file")]
    dev: bool,
    /// More keys: a file with one key per line (# comments).
    #[arg(long)]
    keys_file: Option<PathBuf>,
    /// Server id (default: from the start time, docs/protocol.md §7).
    #[arg(long)]
    server_id: Option<u64>,
    /// Cores (one pinned thread and one SO_REUSEPORT socket each).
    #[arg(long, default_value_t = 1)]
    cores: usize,
    /// Dedup table capacity (entries).
    #[arg(long, default_value_t = 65_536)]
    dedup_capacity: usize,
    /// Drop inbound datagrams with this probability (0..=1).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    drop_in: f64,
    /// Drop responses with this probability (0..=1).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    drop_out: f64,
    /// Delay every response by this many ms.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Add a uniform random delay of up to this many ms.
    #[arg(long, default_value_t = 0)]
    jitter_ms: u64,
    /// Send a response twice with this probability (0..=1).
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    duplicate: f64,
    /// Ask for a source-port change (steering 0) every n-th response.
    #[arg(long, default_value_t = 0)]
    steer_every: u32,
    /// Fixed decision: grant, reject or guard-fail.
    #[arg(long)]
    fixed: Option<FixedDecision>,
    /// Broken replies: bad-auth, truncated, wrong-unique-id, wrong-server-id, fewer, more, zero.
    #[arg(long)]
    broken: Option<BrokenReply>,
    /// Seed of the fault random stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also serve discovery DNS for this domain (prints a dns_ready line).
    #[arg(long, hide = true)]
    dns_domain: Option<String>,
    /// Port of the DNS responder (with --dns-domain).
    #[arg(long, hide = true, default_value_t = 0)]
    dns_port: u16,
    /// Send each loop's replies to one client as UDP GSO batches: on or off.
    #[arg(long, default_value = "on", value_parser = on_off, action = clap::ArgAction::Set)]
    reply_batch: bool,
    /// I/O backend: auto (io_uring where allowed, else mmsg), uring or mmsg.
    #[arg(long, default_value = "auto")]
    io: BackendChoice,
    /// Log level on stderr: error, warn, info (adds the drop totals at exit) or debug
    /// (adds every dropped datagram with its source and why: unknown key id, failed
    /// authentication, malformed, stale timestamp, a fault).
    #[arg(long, value_name = "LEVEL", default_value = "warn")]
    log_level: tracing::Level,
}

/// The drop counters with a reason, for the exit summary (name, count).
fn drop_totals(c: &rl_responder::Counters) -> [(&'static str, u64); 9] {
    [
        ("unknown key id", c.drop_unknown_key),
        (
            "failed authentication",
            c.drop_auth_failed + c.drop_bad_cookie,
        ),
        ("auth mode not the key's", c.drop_wrong_mode),
        ("malformed", c.drop_malformed),
        ("longer than 1200 bytes", c.drop_too_long),
        ("stale timestamp", c.drop_stale),
        ("bucket table full", c.drop_bucket_table_full),
        ("fault: silent", c.fault_silent_drops),
        ("fault: inbound loss", c.fault_drop_in),
    ]
}

fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

/// A probability in [0, 1]; anything else is a usage error (never clamped).
fn probability(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{text:?} is not a probability in [0, 1]")),
    }
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data (all-zero bytes are a valid value, and
    // sigemptyset initialises it anyway); every call gets a pointer to this live local
    // set, and pthread_sigmask's old-set pointer may be null.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn wait_signal(set: &libc::sigset_t) {
    let mut sig = 0;
    // SAFETY: `set` is an initialised sigset_t (from `block_signals`) borrowed for the
    // call, and `sig` is a live local c_int that sigwait writes the signal number to.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_max_level(cli.log_level)
        .with_writer(std::io::stderr)
        .init();
    let loaded = if cli.dev {
        keys::dev(cli.keys_file.as_deref())
    } else {
        keys::load(cli.key_file.as_deref(), cli.keys_file.as_deref())
    };
    let keys = match loaded {
        Ok(k) => k,
        Err(e) => {
            eprintln!("rl-responder: {e}");
            return ExitCode::from(2);
        }
    };
    let faults = Faults {
        drop_in: cli.drop_in,
        drop_out: cli.drop_out,
        delay: Duration::from_millis(cli.delay_ms),
        jitter: Duration::from_millis(cli.jitter_ms),
        duplicate: cli.duplicate,
        steer_every: cli.steer_every,
        fixed: cli.fixed,
        broken: cli.broken,
        silent: false,
        seed: cli.seed,
    };
    // Block the signals before any thread starts, so every thread inherits the mask
    // and only sigwait below sees them.
    let set = block_signals();
    let mut cfg = ResponderConfig::new(keys);
    cfg.listen = cli.listen;
    cfg.server_id = cli.server_id;
    cfg.cores = cli.cores;
    cfg.faults = faults;
    cfg.dedup_capacity = cli.dedup_capacity;
    cfg.reply_batch = cli.reply_batch;
    cfg.io = cli.io;
    let handle = match spawn(cfg) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("rl-responder: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = handle.addr();
    if cli.dev {
        eprintln!("rl-responder: --dev: serving the public development key; NOT for production");
        // one write: a reader waiting for the RL_ENDPOINT line sees all of it
        print!(
            "# rl-responder --dev: a DEVELOPMENT key, public in this repository: NOT for production\n\
             export RATELIMITLY_API_KEY={}\n\
             export RL_ENDPOINT={}@{}\n",
            keys::DEV_KEY,
            handle.server_id(),
            addr
        );
    } else {
        // Fixed key order: event, address, port, server_id.
        println!(
            "{{\"event\":\"ready\",\"address\":{},\"port\":{},\"server_id\":{}}}",
            serde_json::Value::String(addr.ip().to_string()),
            addr.port(),
            handle.server_id()
        );
    }
    let dns = match &cli.dns_domain {
        Some(domain) => {
            let opts = dns::DnsOptions {
                listen: SocketAddr::new(addr.ip(), cli.dns_port),
                ..dns::DnsOptions::default()
            };
            match dns::spawn_with(domain, vec![(handle.server_id(), vec![addr])], opts) {
                Ok(d) => {
                    println!("{{\"event\":\"dns_ready\",\"port\":{}}}", d.addr().port());
                    Some(d)
                }
                Err(e) => {
                    eprintln!("rl-responder: cannot start DNS responder: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        None => None,
    };
    use std::io::Write;
    let _ = std::io::stdout().flush();
    wait_signal(&set);
    if let Some(d) = dns {
        d.stop();
    }
    let counters = handle.counters();
    handle.stop();
    let drops: Vec<String> = drop_totals(&counters)
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(why, n)| format!("{why} {n}"))
        .collect();
    tracing::info!(
        received = counters.received,
        answered = counters.answered,
        "stopped; dropped: {}",
        if drops.is_empty() {
            "none".to_owned()
        } else {
            drops.join(", ")
        }
    );
    ExitCode::SUCCESS
}
