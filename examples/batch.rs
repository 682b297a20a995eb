//! Batches: many requests built first ([`RequestBuilder::build`]), then submitted at once
//! ([`EngineHandle::submit_batch`]: one wake of the engine's core for all of them); the
//! [`Batch`] gives the outcomes in submission order, blocking ([`Batch::wait_timeout`])
//! or as a future (`.await`).
//!
//! `cargo run --example batch` starts an `rl-responder` on loopback in this process,
//! with the public test key, and checks the counts: 3 users of 3 requests per minute
//! each; a batch of 4 requests per user gives each user 3 grants and 1 rejection, and a
//! second batch (awaited) of one more request per user is all rejections. Against a
//! service of your own: `RATELIMITLY_API_KEY=... cargo run --example batch -- ID@IP:PORT`
//! (the counts are then printed, not checked).
//!
//! [`RequestBuilder::build`]: ratelimitly_engine::RequestBuilder::build
//! [`EngineHandle::submit_batch`]: ratelimitly_engine::EngineHandle::submit_batch

use std::process::ExitCode;
use std::time::Duration;

use ratelimitly_engine::{
    ApiKey, Batch, Cores, Decision, Endpoint, Engine, EngineHandle, Outcome, Resource, key_source,
};
use rl_responder::ResponderConfig;

/// The public key of the test fixtures (auth mode none), accepted by the local responder.
const TEST_KEY: &str = "rl-none1qyyqwps9qspsyq2sk8e0sfdp3ys";
const USERS: usize = 3;
const LIMIT: u32 = 3;
const FIRST_PER_USER: usize = 4;

/// One request per (user, round), users interleaved: user 0, 1, 2, 0, 1, 2, ...
fn batch(handle: &EngineHandle, users: &[Resource], rounds: usize) -> Batch {
    let requests = (0..rounds)
        .flat_map(|_| users.iter())
        .map(|user| handle.request().consume(user, 1).build())
        .collect();
    handle.submit_batch(requests)
}

/// (granted, rejected) per user; `None` if any request got no decision.
fn tally(outcomes: &[Outcome]) -> Option<Vec<(u32, u32)>> {
    let mut per_user = vec![(0, 0); USERS];
    for (i, outcome) in outcomes.iter().enumerate() {
        let entry = &mut per_user[i % USERS];
        match outcome {
            Ok(r) if r.decision() == Decision::Granted => entry.0 += 1,
            Ok(_) => entry.1 += 1,
            Err(failure) => {
                println!("request {i}: no decision ({failure})");
                return None;
            }
        }
    }
    Some(per_user)
}

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

    let engine = Engine::builder(key)
        .cores(Cores::Count(1))
        .endpoints(endpoints)
        .build()?;
    let handle = engine.handle();
    let users = (0..USERS)
        .map(|u| {
            Resource::new(
                format!("batch-example:user-{u}"),
                Duration::from_secs(60),
                LIMIT,
            )
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Blocking: a plain thread waits for the whole batch (bounded).
    let first = match batch(&handle, &users, FIRST_PER_USER).wait_timeout(Duration::from_secs(5)) {
        Ok(outcomes) => tally(&outcomes),
        Err(_unfinished) => None, // dropping the batch abandons what is still pending
    };
    println!("first batch (granted, rejected) per user: {first:?}");

    // Async: a Batch is a future too.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let second = rt.block_on(async {
        let outcomes = tokio::time::timeout(Duration::from_secs(5), batch(&handle, &users, 1));
        outcomes.await.ok().and_then(|o| tally(&o))
    });
    println!("second batch (granted, rejected) per user: {second:?}");

    engine.shutdown();
    if let Some(responder) = local {
        responder.stop();
        let want_first = vec![(LIMIT, FIRST_PER_USER as u32 - LIMIT); USERS];
        if first != Some(want_first) || second != Some(vec![(0, 1); USERS]) {
            eprintln!("expected {LIMIT} grants per user, then rejections");
            return Ok(ExitCode::FAILURE);
        }
    }
    Ok(ExitCode::SUCCESS)
}
