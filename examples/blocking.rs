//! Plain threads, no async runtime: each thread submits its requests and blocks on the
//! outcome ([`Completion::wait_timeout`]; `wait` blocks without a bound).
//!
//! `cargo run --example blocking` starts an `rl-responder` on loopback in this process,
//! with the public test key, and checks the counts: 4 threads × 10 requests against one
//! resource of 25 per minute give 25 grants and 15 rejections. Against a service of your
//! own: `RATELIMITLY_API_KEY=... cargo run --example blocking -- ID@IP:PORT` (the counts
//! are then printed, not checked: the bucket may hold earlier consumption).

use std::process::ExitCode;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::Duration;

use ratelimitly_engine::{
    ApiKey, Completion, Cores, Decision, Endpoint, Engine, Resource, key_source,
};
use rl_responder::ResponderConfig;

/// The public key of the test fixtures (auth mode none), accepted by the local responder.
const TEST_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";
const THREADS: u32 = 4;
const PER_THREAD: u32 = 10;
const LIMIT: u32 = 25;

fn main() -> Result<ExitCode, Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // No endpoint given: a responder in this process, on a fresh loopback port.
    let (key, endpoints, local) = if args.is_empty() {
        let key: ApiKey = TEST_KEY.parse()?;
        let responder = rl_responder::spawn(ResponderConfig::new(vec![key.clone()]))?;
        let ep = Endpoint {
            server_id: responder.server_id(), // the endpoint's id is the server's id
            addr: responder.addr(),
        };
        (key, vec![ep], Some(responder))
    } else {
        let eps = args
            .iter()
            .map(|a| a.parse())
            .collect::<Result<Vec<Endpoint>, _>>()?;
        (key_source::load_key(None)?, eps, None)
    };

    // `build` blocks until the engine runs (here: one pinned core thread).
    let engine = Engine::builder(key)
        .cores(Cores::Count(1))
        .endpoints(endpoints)
        .build()?;
    let api = Resource::new("blocking-example", Duration::from_secs(60), LIMIT)?;
    let (granted, rejected, failed) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0));

    thread::scope(|s| {
        for _ in 0..THREADS {
            let handle = engine.handle(); // Clone + Send + Sync: one per thread
            let (api, granted, rejected, failed) = (&api, &granted, &rejected, &failed);
            s.spawn(move || {
                for _ in 0..PER_THREAD {
                    let completion: Completion = handle.request().consume(api, 1).send();
                    // Bounded: the engine answers within its horizon; 5 s is a safety net.
                    let counter = match completion.wait_timeout(Duration::from_secs(5)) {
                        Ok(Ok(r)) if r.decision() == Decision::Granted => granted,
                        Ok(Ok(_)) => rejected, // answer 429, Retry-After: r.retry_after()
                        Ok(Err(_)) | Err(_) => failed, // no decision: your failure policy
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });

    let (g, r, f) = (
        granted.into_inner(),
        rejected.into_inner(),
        failed.into_inner(),
    );
    println!("granted {g}, rejected {r}, no decision {f}");
    engine.shutdown(); // completes what is in flight, joins the core thread
    if let Some(responder) = local {
        responder.stop();
        if (g, r, f) != (LIMIT, THREADS * PER_THREAD - LIMIT, 0) {
            eprintln!("expected {LIMIT} granted and the rest rejected");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
